//! **Z4** a holder partitioned from every server (blackholing proxies): it knows it lost the
//! lock (its deadline) before the waiter gets it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::time::Duration;

use ecosphere::clock::now_ns;
use ecosphere::proxy::{FaultProxy, Mode};
use ecosphere::zookeeper::ZkEnsemble;
use scenario::zookeeper::*;
use scenario::*;

#[test]
fn z04_a_partitioned_holder_knows_it_lost_before_the_waiter_holds() {
    let ensemble = ZkEnsemble::start(3).expect("ZooKeeper ensemble");
    let servers = ensemble.connect_string();
    let resource = server();
    let root = tempfile::tempdir().unwrap();
    // the holder is partitioned from every server.
    let z = Phase::new(root.path(), "z4", &resource, &servers);
    let proxies: Vec<FaultProxy> = (0..ensemble.len())
        .map(|i| FaultProxy::start(ensemble.server(i).addr()).unwrap())
        .collect();
    let through: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    let unlock = root.path().join("z4-unlock");
    let mut a = z.first("hold", &through.join(","));
    a.unlock_file = Some(unlock.clone());
    let mut holder = a.spawn(1);
    let holding = wait_line(&mut holder, 0, "HOLDING ", Duration::from_secs(20));
    let a_holder = holding.split(' ').nth(1).unwrap().to_owned();
    let mut waiter = z.waiter(Duration::from_millis(100)).spawn(1);
    z.wait_event(1, "acq_invoke");
    for p in &proxies {
        p.set_mode(Mode::Blackhole).unwrap();
    }
    let rec = z.nemesis("partition");
    wait_line(&mut holder, 0, "LOST ", Duration::from_secs(15));
    let b_out = finish_ok(&mut waiter, Duration::from_secs(30)).remove(0);
    assert!(b_out.stdout.contains("UNLOCK ok 0"), "{}", b_out.stdout);
    for p in &proxies {
        p.set_mode(Mode::Pass).unwrap();
    }
    nemesis(&rec, now_ns(), z.name, "heal", "proc:0");
    go_file(&unlock);
    let a_out = finish_ok(&mut holder, Duration::from_secs(30)).remove(0);
    assert!(
        a_out.stdout.contains("UNLOCK not_held") || a_out.stdout.contains("UNLOCK error"),
        "{}",
        a_out.stdout
    );
    let h = lease_ran_out_before_the_waiter_held(&z, &a_holder);
    assert!(first_of(&h, 0, "lost").is_some(), "A logged the loss");
}
