//! Scenario 3 (issue 4, reliability.md S2): the holder crashes.
//!
//! Worker A holds (renewing, incrementing the counter every 50 ms); worker B waits with
//! `try_lock_for`. The test SIGKILLs A and logs the kill (`kill_worker` nemesis, its own
//! recorder in the same directory). B must acquire after A's lease ran out (after the last
//! deadline A logged) and within lease + slack of the kill. The checker closes A's window at
//! the kill and decides I1 / I3 / validity. No counter check: a worker killed between its SET
//! and its log line makes the counter legitimately one higher than the acknowledged count.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::time::Duration;

use ecosphere::clock::now_ns;
use ecosphere::history::{CheckConfig, CheckId, EventKind, Recorder};
use scenario::*;

const LEASE: Duration = Duration::from_secs(1);
/// Stated slack on "B acquires within the lease of the kill".
const SLACK: Duration = Duration::from_millis(1500);
/// The harness's own process number in the history.
const HARNESS: u32 = 99;

#[test]
fn a_killed_holder_is_replaced_after_its_lease_within_slack() {
    let lock_server = server();
    let resource = server();
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path();

    let mut a = Worker::new("hold", &lock_server, "crash", history);
    a.resource_url = Some(resource.url());
    a.lease = LEASE;
    a.renewal = Some(LEASE / 3);
    a.hold = Duration::from_secs(30);
    a.max_duration = Duration::from_secs(40);
    let mut holder = a.spawn(1);
    let holding = wait_line(&mut holder, 0, "HOLDING ", Duration::from_secs(20));
    let a_holder = holding.split(' ').nth(1).expect("holder").to_owned();

    let mut b = Worker::new("wait", &lock_server, "crash", history);
    b.resource_url = Some(resource.url());
    b.lease = LEASE;
    b.renewal = Some(LEASE / 3);
    b.spin_wait = Some(Duration::from_millis(200));
    b.budget = Duration::from_secs(15);
    b.hold = Duration::from_millis(50);
    b.proc_base = 1;
    b.max_duration = Duration::from_secs(30);
    let mut waiter = b.spawn(1);
    wait_line(&mut waiter, 0, "INVOKED 1", Duration::from_secs(20));
    // A has renewed at least once: the kill hits a renewing holder.
    wait_history(history, Duration::from_secs(10), "a renewal by A", |h| {
        h.events()
            .iter()
            .any(|e| e.proc == 0 && e.kind.name() == "renew_ok")
    });

    let rec = Recorder::create(history, HARNESS).expect("harness recorder");
    let t_kill = now_ns();
    holder.kill(0).expect("SIGKILL A");
    rec.record_at(t_kill, 0, "crash", EventKind::kill_worker(0))
        .expect("record the kill");

    let b_out = finish_ok(&mut waiter, Duration::from_secs(30)).remove(0);
    assert!(
        b_out.stdout.contains("DONE acquired=1 failed=0 errors=0"),
        "{}",
        b_out.stdout
    );

    let cfg = CheckConfig {
        final_keys: Some(lock_keys(&lock_server)),
        ..CheckConfig::new(LEASE)
    };
    let (h, report) = check_killed(history, &cfg);
    report.assert_ok();
    // A and B acquire once each; B is the only waiter.
    report.assert_contention(2, 1, 1);
    report.assert_pass(&[
        CheckId::Exclusion,
        CheckId::Tokens,
        CheckId::Validity,
        CheckId::Quiescence,
    ]);
    assert_eq!(
        report.stats.windows_closed[3], 1,
        "A's window closed by the kill"
    );

    let a_deadline = last_deadline(&h, &a_holder);
    let b_ok = h
        .events()
        .iter()
        .find(|e| e.proc == 1 && e.kind.name() == "acq_ok")
        .expect("B acquired")
        .t;
    println!(
        "kill at +0; A's last logged deadline at {:+.1} ms; B acquired at {:+.1} ms \
         (bound: lease {LEASE:?} + slack {SLACK:?})",
        ms_between(t_kill, a_deadline),
        ms_between(t_kill, b_ok)
    );
    assert!(
        b_ok >= a_deadline,
        "B acquired {:.1} ms before A's lease ran out",
        ms_between(b_ok, a_deadline)
    );
    let bound = u64::try_from((LEASE + SLACK).as_nanos()).unwrap();
    assert!(
        b_ok <= t_kill + bound,
        "B acquired {:.1} ms after the kill, beyond lease + slack",
        ms_between(t_kill, b_ok)
    );
}
