//! **Z3** a holder paused (SIGSTOP) past its session timeout: the waiter acquires; after the
//! resume the holder reports the loss, its late fenced write is rejected (I2), its unlock
//! answers not held.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::time::Duration;

use ecosphere::clock::now_ns;
use ecosphere::history::{CheckConfig, CheckId, EventKind, OP_FENCED_WRITE};
use ecosphere::zookeeper::ZkEnsemble;
use scenario::zookeeper::*;
use scenario::*;

#[test]
fn z03_a_holder_paused_past_its_session_is_fenced_off() {
    let ensemble = ZkEnsemble::start(3).expect("ZooKeeper ensemble");
    let servers = ensemble.connect_string();
    let resource = server();
    let root = tempfile::tempdir().unwrap();
    // the holder is paused past its session timeout; fenced writes.
    let z = Phase::new(root.path(), "z3", &resource, &servers);
    let mut a = z.first("hold", &servers);
    a.fenced_key = Some("fenced".into());
    a.late_write = true;
    let mut holder = a.spawn(1);
    wait_line(&mut holder, 0, "HOLDING ", Duration::from_secs(20));
    let mut b = z.waiter(Duration::from_millis(300));
    b.fenced_key = Some("fenced".into());
    let mut waiter = b.spawn(1);
    z.wait_event(1, "acq_invoke");
    holder.pause(0).unwrap();
    let rec = z.nemesis("sigstop_worker");
    wait_line(&mut waiter, 0, "HOLDING ", Duration::from_secs(15));
    // B's token reached F before A wakes up with its old one.
    wait_history(
        &z.history,
        Duration::from_secs(10),
        "a fenced write by B",
        |h| {
            h.events().iter().any(|e| {
                e.proc == 1
                    && matches!(&e.kind, EventKind::ResOp { op, .. } if op == OP_FENCED_WRITE)
            })
        },
    );
    holder.resume(0).unwrap();
    nemesis(&rec, now_ns(), z.name, "heal", "proc:0");
    let a_out = finish_ok(&mut holder, Duration::from_secs(30)).remove(0);
    let b_out = finish_ok(&mut waiter, Duration::from_secs(30)).remove(0);
    assert!(a_out.stdout.contains("LOST "), "{}", a_out.stdout);
    assert!(
        a_out.stdout.contains("LATE rejected"),
        "the late write is fenced off: {}",
        a_out.stdout
    );
    assert!(a_out.stdout.contains("UNLOCK not_held"), "{}", a_out.stdout);
    assert!(b_out.stdout.contains("UNLOCK ok 0"), "{}", b_out.stdout);
    let cfg = CheckConfig {
        expected_late: Some(ecosphere::history::ExpectedLate {
            procs: vec![0],
            max_ops: 1,
            reason: "A writes once after its loss, on purpose (the LATE line): F rejects it".into(),
        }),
        ..CheckConfig::new(SESSION)
    };
    let (_h, report) = check(&z.history, &cfg);
    report.assert_ok();
    report.assert_contention(2, 1, 1);
    assert_eq!(report.stats.activity_past_validity, 1, "{report}");
    report.assert_pass(&[
        CheckId::Exclusion,
        CheckId::FencedOrder,
        CheckId::Tokens,
        CheckId::Ownership,
    ]);
}
