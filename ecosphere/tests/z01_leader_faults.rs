//! **Z1** contention (3 × 2 × 80 holds) on a 3-server ensemble while the harness kills the
//! leader, restarts it, then pauses the new leader: I1 exclusion, I3 tokens (creation zxids, strictly
//! increasing across the elections), I5 ownership, validity, and the unfenced counter
//! equal to the acquisitions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ecosphere::clock::now_ns;
use ecosphere::history::EventKind;
use ecosphere::zookeeper::ZkEnsemble;
use scenario::zookeeper::*;
use scenario::*;

#[test]
fn z01_contention_through_a_leader_kill_and_a_leader_pause() {
    let mut ensemble = ZkEnsemble::start(3).expect("ZooKeeper ensemble");
    let (run, mut workers, rec) = Contention::start(&ensemble.connect_string(), "z1", 3, 2, 80);
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let nemesis = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut faults = Vec::new();
            let pause = |d: Duration| {
                let until = Instant::now() + d;
                while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(10));
                }
            };
            pause(Duration::from_millis(400));
            let old = ensemble.leader().expect("a leader");
            ensemble.server_mut(old).kill();
            nemesis(&rec, now_ns(), "z1", "kill_server", &format!("zk:{old}"));
            faults.push("kill leader");
            let new = ensemble
                .wait_leader(Duration::from_secs(20))
                .expect("a new leader");
            ensemble
                .server_mut(old)
                .restart()
                .expect("restart the old leader");
            nemesis(&rec, now_ns(), "z1", "restart_server", &format!("zk:{old}"));
            pause(Duration::from_millis(300));
            if !stop.load(Ordering::SeqCst) {
                let leader = ensemble.leader().unwrap_or(new);
                ensemble.server_mut(leader).pause().unwrap();
                nemesis(
                    &rec,
                    now_ns(),
                    "z1",
                    "sigstop_server",
                    &format!("zk:{leader}"),
                );
                faults.push("pause leader");
                pause(Duration::from_millis(1500));
                ensemble.server_mut(leader).resume().unwrap();
                nemesis(&rec, now_ns(), "z1", "heal", &format!("zk:{leader}"));
            }
            (ensemble, faults)
        })
    };
    let outputs = workers.wait_all(Duration::from_secs(100));
    stop.store(true, Ordering::SeqCst);
    let (ensemble, faults) = nemesis.join().expect("nemesis");
    let outputs = outputs.expect("workers finish in time");
    let (h, incomplete) = run.check(&outputs, &ensemble.connect_string());
    println!(
        "{} acquisitions in {:?} through {faults:?}; {incomplete} releases finished in the \
         background",
        run.total,
        started.elapsed()
    );
    assert!(
        !faults.is_empty(),
        "the workers finished before the leader was killed"
    );
    // The tokens span the elections: their high half (the epoch) grew.
    let epochs: std::collections::BTreeSet<u64> = events(&h, "acq_ok")
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::AcqOk { token, .. } => Some(token >> 32),
            _ => None,
        })
        .collect();
    println!("epochs seen in the tokens: {epochs:?}");
    assert!(epochs.len() >= 2, "the kill made a new epoch: {epochs:?}");
}
