//! A failing test gets the server log: `RedisServer`'s `Drop` prints the log tail to stderr
//! while the thread panics.
//!
//! The panicking test runs in a child process (this test binary re-executed, filtered to the
//! inner test), so its failure is observed rather than suffered.

use std::process::Command;

const INNER: &str = "inner_panics_with_a_live_server";

#[test]
fn a_panicking_test_prints_the_server_log_tail() {
    let exe = std::env::current_exe().expect("current test executable");
    let out = Command::new(exe)
        .args([
            INNER,
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("ECOSPHERE_PANIC_LOG_INNER", "1")
        .output()
        .expect("re-run this test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the inner test must fail:\n{stdout}\n{stderr}"
    );
    assert!(stderr.contains("intentional failure"), "{stderr}");
    assert!(
        stderr.contains("--- redis-server 127.0.0.1:"),
        "no log header:\n{stderr}"
    );
    assert!(
        stderr.contains("Ready to accept connections"),
        "no log lines:\n{stderr}"
    );
}

/// Runs only when re-executed by the test above; it fails on purpose.
#[test]
#[ignore = "run by a_panicking_test_prints_the_server_log_tail in a child process"]
fn inner_panics_with_a_live_server() {
    if std::env::var_os("ECOSPHERE_PANIC_LOG_INNER").is_none() {
        return; // Someone ran the ignored tests directly: nothing to demonstrate here.
    }
    let _server = slate_harness::server::RedisServer::start().expect("start");
    panic!("intentional failure");
}
