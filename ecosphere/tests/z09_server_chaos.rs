//! **Z9** (full matrix) chaos on a 5-server ensemble: for 15 s, a seeded schedule kills,
//! restarts, pauses and resumes servers (the leader included; never more than two down at
//! once, so a quorum of three stands) while 4 processes × 4 tasks contend; the checker and
//! the counter decide, and nothing may be left behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ecosphere::clock::now_ns;
use ecosphere::zookeeper::ZkEnsemble;
use scenario::zookeeper::*;
use scenario::*;

/// Z9 (full matrix): seeded chaos on a 5-server ensemble while 4 × 4 tasks contend.
#[test]
#[cfg_attr(not(feature = "full-matrix"), ignore)]
fn z09_seeded_server_chaos_on_a_five_server_ensemble() {
    let mut seed = ecosphere::seed::Seed::for_scenario("z9_zookeeper_chaos");
    let seed_value = seed.value();
    let mut ensemble = ZkEnsemble::start(5).expect("ZooKeeper ensemble");
    let (run, mut workers, rec) = Contention::start(&ensemble.connect_string(), "z9", 4, 4, 120);
    let stop = Arc::new(AtomicBool::new(false));
    let nemesis_thread = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let end = Instant::now() + Duration::from_secs(15);
            // Down (killed) or paused servers, at most two at a time.
            let mut broken: Vec<(usize, bool)> = Vec::new();
            let mut faults = 0;
            while Instant::now() < end && !stop.load(Ordering::SeqCst) {
                std::thread::sleep(seed.millis_between(200, 900));
                if broken.len() == 2 || (!broken.is_empty() && seed.below(2) == 0) {
                    let (i, killed) = broken.remove(seed.below(broken.len() as u64) as usize);
                    if killed {
                        ensemble.server_mut(i).restart().expect("restart");
                        nemesis(&rec, now_ns(), "z9", "restart_server", &format!("zk:{i}"));
                    } else {
                        ensemble.server_mut(i).resume().expect("resume");
                        nemesis(&rec, now_ns(), "z9", "heal", &format!("zk:{i}"));
                    }
                    continue;
                }
                // Prefer the leader half of the time.
                let up: Vec<usize> = (0..ensemble.len())
                    .filter(|i| !broken.iter().any(|(b, _)| b == i))
                    .collect();
                let target = match ensemble.leader() {
                    Some(l) if up.contains(&l) && seed.below(2) == 0 => l,
                    _ => up[seed.below(up.len() as u64) as usize],
                };
                let kill = seed.below(2) == 0;
                if kill {
                    ensemble.server_mut(target).kill();
                    nemesis(&rec, now_ns(), "z9", "kill_server", &format!("zk:{target}"));
                } else {
                    ensemble.server_mut(target).pause().expect("pause");
                    nemesis(
                        &rec,
                        now_ns(),
                        "z9",
                        "sigstop_server",
                        &format!("zk:{target}"),
                    );
                }
                broken.push((target, kill));
                faults += 1;
            }
            for (i, killed) in broken {
                if killed {
                    ensemble.server_mut(i).restart().expect("restart");
                } else {
                    ensemble.server_mut(i).resume().expect("resume");
                }
                nemesis(&rec, now_ns(), "z9", "heal", &format!("zk:{i}"));
            }
            (ensemble, faults)
        })
    };
    let outputs = workers.wait_all(Duration::from_secs(160));
    stop.store(true, Ordering::SeqCst);
    let (ensemble, faults) = nemesis_thread.join().expect("nemesis");
    let outputs = outputs.expect("workers finish in time");
    run.check(&outputs, &ensemble.connect_string());
    println!(
        "Z9: {} acquisitions through {faults} server faults (seed {seed_value})",
        run.total
    );
    assert!(
        faults >= 3,
        "the workers finished before the chaos did much ({faults} faults)"
    );
}
