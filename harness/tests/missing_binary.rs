//! `SLATE_REDIS_SERVER` pointing nowhere must fail loudly with the install hint, never skip.
//!
//! Environment variables are process-global (and `set_var` is `unsafe`), so the check runs in a
//! child process: this test binary re-executes itself, filtered to the inner test, with the
//! variable set.

use std::process::Command;

const INNER: &str = "inner_start_with_env_override";

#[test]
fn env_override_to_a_missing_binary_names_the_install_hint() {
    let exe = std::env::current_exe().expect("current test executable");
    let out = Command::new(exe)
        .args([
            INNER,
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SLATE_REDIS_SERVER", "/nonexistent/redis-server")
        .output()
        .expect("re-run this test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "inner test failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("1 passed"),
        "the inner test did not run:\n{stdout}\n{stderr}"
    );
}

/// Runs only when re-executed by the test above (it needs the variable set).
#[test]
#[ignore = "run by env_override_to_a_missing_binary_names_the_install_hint in a child process"]
fn inner_start_with_env_override() {
    if std::env::var("SLATE_REDIS_SERVER").as_deref() != Ok("/nonexistent/redis-server") {
        return; // Someone ran the ignored tests directly: the outer test is the real check.
    }
    let err = slate_harness::server::RedisServer::start().expect_err("the binary does not exist");
    let message = err.to_string();
    assert!(
        message.contains(r#"install it with "apt-get install -y redis-server""#),
        "{message}"
    );
    assert!(message.contains("/nonexistent/redis-server"), "{message}");
}
