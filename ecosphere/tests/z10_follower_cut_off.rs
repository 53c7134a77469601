//! **Z10** a holder on a follower cut off from its leader (the proxies between the servers):
//! it knows it lost the lock before a waiter on the other servers gets it (issue 35, defect 5).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::time::Duration;

use ecosphere::clock::now_ns;
use ecosphere::zookeeper::ZkEnsemble;
use scenario::zookeeper::*;
use scenario::*;

/// Z10 (issue 35, defect 5): the holder's session lives on a follower that is then cut off from
/// the leader and the other follower, while the holder's client still reaches it. The follower
/// goes on answering its client's reads for up to `syncLimit` (5 s here), but the leader hears
/// nothing of the session, expires it after the session timeout and gives the lock to a waiter
/// connected to the other two servers. Before the fix the holder's heartbeat counted the
/// follower's stale answers as confirmations and kept extending its lease past the waiter's
/// grant; a confirmation now needs a `sync` answered through the leader. The holder's lease
/// must end before the waiter holds.
#[test]
fn z10_a_holder_on_a_follower_cut_off_from_its_leader() {
    let ensemble = ZkEnsemble::start_linked(3, 50).expect("ZooKeeper ensemble");
    let leader = ensemble.wait_leader(Duration::from_secs(20)).unwrap();
    let follower = (leader + 1) % ensemble.len();
    let others: Vec<String> = (0..ensemble.len())
        .filter(|&i| i != follower)
        .map(|i| ensemble.server(i).connect_string())
        .collect();
    let resource = server();
    let root = tempfile::tempdir().unwrap();
    let z = Phase::new(root.path(), "z10", &resource, &others.join(","));
    let unlock = root.path().join("z10-unlock");
    let mut a = z.first("hold", &ensemble.server(follower).connect_string());
    a.unlock_file = Some(unlock.clone());
    let mut holder = a.spawn(1);
    let holding = wait_line(&mut holder, 0, "HOLDING ", Duration::from_secs(20));
    let a_holder = holding.split(' ').nth(1).unwrap().to_owned();
    let mut waiter = z.waiter(Duration::from_millis(100)).spawn(1);
    z.wait_event(1, "acq_invoke");
    z.wait_event(0, "renew_ok");
    ensemble.cut_off(follower).unwrap();
    let rec = z.nemesis("partition");
    let b_out = finish_ok(&mut waiter, Duration::from_secs(30)).remove(0);
    assert!(b_out.stdout.contains("UNLOCK ok 0"), "{}", b_out.stdout);
    ensemble.heal().unwrap();
    nemesis(&rec, now_ns(), z.name, "heal", "proc:0");
    go_file(&unlock);
    let a_out = finish_ok(&mut holder, Duration::from_secs(30)).remove(0);
    assert!(a_out.stdout.contains("LOST "), "{}", a_out.stdout);
    lease_ran_out_before_the_waiter_held(&z, &a_holder);
}
