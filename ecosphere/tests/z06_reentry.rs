//! **Z6** re-entry to depth 3 and back (`hold_count` 3) while another process waits: I6, and
//! the waiter holds only after the last level is released, and within 2 s of it although
//! its spin wait is 25 s (L1: the watch on its predecessor wakes it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::time::Duration;

use ecosphere::history::{CheckConfig, CheckId, EventKind};
use ecosphere::zookeeper::ZkEnsemble;
use scenario::zookeeper::*;
use scenario::*;

#[test]
fn z06_reentry_to_depth_three_and_back_while_another_process_waits() {
    let ensemble = ZkEnsemble::start(3).expect("ZooKeeper ensemble");
    let servers = ensemble.connect_string();
    let resource = server();
    let root = tempfile::tempdir().unwrap();
    // re-entry to depth 3 and back while another process waits.
    let z = Phase::new(root.path(), "z6", &resource, &servers);
    let mut a = z.first("reenter", &servers);
    a.hold = Duration::from_millis(300);
    a.step = Duration::from_millis(100);
    let mut reentrant = a.spawn(1);
    wait_line(&mut reentrant, 0, "DEPTH 3", Duration::from_secs(20));
    // A spin wait longer than the run: B can only be woken by its watch on A's znode.
    let mut b = z.waiter(Duration::from_millis(100));
    b.spin_wait = Some(Duration::from_secs(25));
    let mut waiter = b.spawn(1);
    let a_out = finish_ok(&mut reentrant, Duration::from_secs(30)).remove(0);
    let b_out = finish_ok(&mut waiter, Duration::from_secs(30)).remove(0);
    for line in ["HOLD_COUNT 3", "RELEASED 2", "RELEASED 1", "RELEASED 0"] {
        assert!(a_out.stdout.contains(line), "{line}: {}", a_out.stdout);
    }
    assert!(b_out.stdout.contains("UNLOCK ok 0"), "{}", b_out.stdout);
    let (h, report) = check(&z.history, &CheckConfig::new(SESSION));
    report.assert_ok();
    // A (three levels) and B acquire; B is the only waiter.
    report.assert_contention(2, 1, 1);
    report.assert_pass(&[
        CheckId::Exclusion,
        CheckId::Tokens,
        CheckId::Ownership,
        CheckId::Reentry,
    ]);
    // A's last level's release was invoked before B held (its `rel_ok` is logged when the
    // answer is back, which may be after B's grant: the delete is what lets B in).
    let a_last = h
        .events()
        .iter()
        .filter(|e| {
            e.proc == 0
                && matches!(
                    e.kind,
                    EventKind::RelInvoke {
                        depth_before: 1,
                        ..
                    }
                )
        })
        .map(|e| e.t)
        .max()
        .expect("A released its last level");
    let b_ok = first_of(&h, 1, "acq_ok").expect("B acquired").t;
    assert!(b_ok >= a_last, "B held before A's last level was released");
    // L1: the watch on the predecessor wakes B, not its 25 s spin wait.
    println!(
        "Z6: B acquired {:.0} ms after A's last release",
        ms_between(a_last, b_ok)
    );
    assert!(
        b_ok <= a_last + ns(Duration::from_secs(2)),
        "B acquired {:.0} ms after A's last release (bound 2000 ms): no watch woke it",
        ms_between(a_last, b_ok)
    );
}
