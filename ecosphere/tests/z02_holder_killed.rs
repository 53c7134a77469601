//! **Z2** a holder killed: its session expires, the waiter acquires after the holder's last
//! lease deadline and within session timeout + slack of the kill.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::time::Duration;

use ecosphere::clock::now_ns;
use ecosphere::history::{CheckConfig, CheckId, EventKind, Recorder};
use ecosphere::zookeeper::ZkEnsemble;
use scenario::zookeeper::*;
use scenario::*;

#[test]
fn z02_a_killed_holder_frees_the_lock_after_its_last_lease_deadline() {
    let ensemble = ZkEnsemble::start(3).expect("ZooKeeper ensemble");
    let servers = ensemble.connect_string();
    let resource = server();
    let root = tempfile::tempdir().unwrap();
    // the holder is killed.
    let z = Phase::new(root.path(), "z2", &resource, &servers);
    let mut holder = z.first("hold", &servers).spawn(1);
    let holding = wait_line(&mut holder, 0, "HOLDING ", Duration::from_secs(20));
    let a_holder = holding.split(' ').nth(1).unwrap().to_owned();
    let mut waiter = z.waiter(Duration::from_millis(100)).spawn(1);
    z.wait_event(1, "acq_invoke");
    z.wait_event(0, "renew_ok");
    let rec = Recorder::create(&z.history, HARNESS).unwrap();
    let t_kill = now_ns();
    holder.kill(0).unwrap();
    rec.record_at(t_kill, 0, z.name, EventKind::kill_worker(0))
        .unwrap();
    let out = finish_ok(&mut waiter, Duration::from_secs(30)).remove(0);
    assert!(out.stdout.contains("UNLOCK ok 0"), "{}", out.stdout);
    let (h, report) = check_killed(&z.history, &CheckConfig::new(SESSION));
    report.assert_ok();
    // A and B acquire once each; B is the only waiter.
    report.assert_contention(2, 1, 1);
    report.assert_pass(&[CheckId::Exclusion, CheckId::Tokens, CheckId::Validity]);
    let b_ok = first_of(&h, 1, "acq_ok").expect("B acquired").t;
    let a_deadline = last_deadline(&h, &a_holder);
    println!(
        "Z2: B acquired {:.0} ms after the kill; A's last deadline {:+.0} ms",
        ms_between(t_kill, b_ok),
        ms_between(t_kill, a_deadline)
    );
    assert!(b_ok >= a_deadline, "B acquired before A's lease ended");
    assert!(
        b_ok <= t_kill + ns(SESSION + Duration::from_secs(2)),
        "B waited past the session timeout + slack"
    );
}
