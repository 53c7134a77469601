//! `WorkerSet` against real processes (the `harness-echo` helper binary).

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal;
use nix::unistd::Pid;
use slate_harness::server::HarnessError;
use slate_harness::workers::WorkerSet;

const ECHO: &str = env!("CARGO_BIN_EXE_harness-echo");

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn pid_is_gone(pid: u32) -> bool {
    let pid = Pid::from_raw(i32::try_from(pid).expect("pid fits i32"));
    signal::kill(pid, None) == Err(Errno::ESRCH)
}

/// The state letter of a process in /proc (`T` = stopped).
fn proc_state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc stat");
    let after_name = stat.rsplit_once(')').expect("stat has (comm)").1;
    after_name
        .trim_start()
        .chars()
        .next()
        .expect("state letter")
}

/// Waits (bounded) until `pid` is in state `want`.
fn wait_for_state(pid: u32, want: char) -> char {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let state = proc_state(pid);
        if state == want || Instant::now() >= deadline {
            return state;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn three_workers_report_output_and_exit_codes() {
    let mut workers = WorkerSet::builder(ECHO)
        .count(3)
        .args(|i| {
            args(&[
                &format!("hello {i}"),
                "--stderr",
                &format!("warn {i}"),
                "--env",
                "SHARED",
                "--env",
                "INDEX",
                "--exit",
                &i.to_string(),
            ])
        })
        .env("SHARED", "all")
        .env_for(|i| vec![("INDEX".into(), format!("#{i}"))])
        .spawn()
        .expect("spawn");
    assert_eq!(workers.len(), 3);
    let outputs = workers.wait_all(Duration::from_secs(10)).expect("wait_all");
    assert_eq!(outputs.len(), 3);
    for (i, out) in outputs.iter().enumerate() {
        assert_eq!(out.index, i);
        assert_eq!(out.status.code(), Some(i32::try_from(i).expect("small")));
        let lines: Vec<&str> = out.stdout_lines().collect();
        assert_eq!(
            lines,
            [
                format!("hello {i}"),
                "SHARED=all".into(),
                format!("INDEX=#{i}")
            ]
        );
        assert_eq!(out.stderr, format!("warn {i}\n"));
    }
}

#[test]
fn kill_one_worker() {
    let mut workers = WorkerSet::spawn(ECHO, 2, |i| {
        args(&[&format!("up {i}"), "--sleep-ms", "20000"])
    })
    .expect("spawn");
    workers
        .wait_for_line(1, |line| line == "up 1", Duration::from_secs(5))
        .expect("worker 1 up");
    let pid = workers.pid(1);
    workers.kill(1).expect("kill");
    assert!(pid_is_gone(pid));
    assert!(!workers.is_running(1).expect("poll"));
    assert!(workers.is_running(0).expect("poll"));
    assert!(matches!(
        workers.pause(1),
        Err(HarnessError::NotRunning { .. })
    ));
    let exited = workers.exited().expect("exited");
    assert_eq!(exited.get(&1).and_then(|status| status.signal()), Some(9));
    assert!(!exited.contains_key(&0));
}

#[test]
fn pause_and_resume_one_worker() {
    let mut workers = WorkerSet::spawn(ECHO, 1, |_| args(&["ready", "--sleep-ms", "1000", "done"]))
        .expect("spawn");
    workers
        .wait_for_line(0, |line| line == "ready", Duration::from_secs(5))
        .expect("ready");
    let pid = workers.pid(0);
    workers.pause(0).expect("pause");
    assert_eq!(
        wait_for_state(pid, 'T'),
        'T',
        "SIGSTOP did not stop the worker"
    );
    // Stopped, it cannot finish its 1 s sleep and print "done".
    let err = workers
        .wait_for_line(0, |line| line == "done", Duration::from_millis(500))
        .expect_err("a paused worker prints nothing");
    assert!(err.is_timeout(), "{err}");
    workers.resume(0).expect("resume");
    workers
        .wait_for_line(0, |line| line == "done", Duration::from_secs(5))
        .expect("done after resume");
    let outputs = workers.wait_all(Duration::from_secs(5)).expect("wait_all");
    assert!(outputs[0].status.success());
}

#[test]
fn wait_for_line_consumes_lines_and_reports_early_exit() {
    let mut workers = WorkerSet::spawn(ECHO, 1, |_| {
        args(&["tick", "tock", "tick", "--stderr", "bye", "--exit", "3"])
    })
    .expect("spawn");
    let timeout = Duration::from_secs(5);
    assert_eq!(
        workers
            .wait_for_line(0, |l| l == "tick", timeout)
            .expect("1st"),
        "tick"
    );
    assert_eq!(
        workers
            .wait_for_line(0, |l| l == "tick", timeout)
            .expect("2nd"),
        "tick"
    );
    let err = workers
        .wait_for_line(0, |l| l == "tick", timeout)
        .expect_err("there is no third tick");
    match err {
        HarnessError::Worker { index, what } => {
            assert_eq!(index, 0);
            assert!(what.contains("bye"), "stderr tail missing: {what}");
        }
        other => panic!("expected a worker error, got {other}"),
    }
    assert_eq!(workers.stdout_lines(0), ["tick", "tock", "tick"]);
    assert_eq!(workers.stderr(0), "bye\n");
}

#[test]
fn wait_all_timeout_kills_the_stragglers() {
    let mut workers = WorkerSet::spawn(ECHO, 3, |i| {
        if i == 1 {
            args(&["--stderr", "straggling", "--sleep-ms", "30000"])
        } else {
            args(&["quick"])
        }
    })
    .expect("spawn");
    let straggler = workers.pid(1);
    let started = Instant::now();
    let err = workers
        .wait_all(Duration::from_millis(500))
        .expect_err("worker 1 sleeps 30 s");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(err.is_timeout(), "{err}");
    let message = err.to_string();
    assert!(message.contains("[1]"), "{message}");
    assert!(
        message.contains("straggling"),
        "stderr tail missing: {message}"
    );
    assert!(pid_is_gone(straggler), "the straggler was not killed");
    // Everything is reaped now: a second wait returns at once with every status.
    let outputs = workers
        .wait_all(Duration::from_millis(100))
        .expect("all reaped");
    assert_eq!(outputs[1].status.signal(), Some(9));
    assert!(outputs[0].status.success() && outputs[2].status.success());
}

#[test]
fn drop_kills_running_workers() {
    let workers = WorkerSet::spawn(ECHO, 2, |_| args(&["--sleep-ms", "30000"])).expect("spawn");
    let pids = [workers.pid(0), workers.pid(1)];
    drop(workers);
    for pid in pids {
        assert!(pid_is_gone(pid), "worker {pid} survived Drop");
    }
}

#[test]
fn a_missing_program_is_an_error() {
    let err = WorkerSet::spawn("/nonexistent/worker", 1, |_| Vec::new()).expect_err("no program");
    assert!(err.to_string().contains("/nonexistent/worker"), "{err}");
}
