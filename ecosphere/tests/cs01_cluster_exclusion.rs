//! The single lock on a Redis Cluster (issue 13, item 7): multi-process mutual exclusion with
//! locks on all three shards, while one lock's slot migrates to another master and another
//! lock's master hands over to its replica (`CLUSTER FAILOVER`); and (full matrix) through a
//! master's crash with `synced_replicas`.
//!
//! Per lock: 3 worker processes × 4 tasks of lock / GET counter / SET counter+1 / unlock, the
//! counter on a standalone resource server. The checker decides per lock: no overlapping
//! validity windows (I1), strictly increasing tokens (I3), and the final counter equals the
//! number of first-level acquisitions (no lost increment).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ecosphere::cluster::RedisCluster;
use ecosphere::history::{CheckConfig, CheckId, CounterCheck, CounterExpectation};
use ecosphere::server::RedisServer;
use ecosphere::workers::WorkerSet;
use scenario::*;

const PROCS: usize = 3;
const TASKS: u64 = 4;
const LEASE: Duration = Duration::from_secs(2);
/// Lock names whose slots are on three different masters of a fresh 3-master cluster (slots
/// 0-5460, 5461-10922, 10923-16383): `{a}` 15495, `{b}` 3300, `{c}` 7365.
const NAMES: [&str; 3] = ["a", "b", "c"];

struct Run {
    history: PathBuf,
    resource: RedisServer,
    workers: WorkerSet,
}

fn start(
    cluster: &RedisCluster,
    dir: &std::path::Path,
    go_file: &std::path::Path,
    iterations: u64,
    synced: Option<(usize, Duration)>,
) -> Vec<Run> {
    NAMES
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let history = dir.join(format!("history-{name}"));
            std::fs::create_dir(&history).expect("history dir");
            let resource = server();
            let mut w = Worker::new("contend", cluster.node(0), name, &history);
            w.redis_url = cluster.urls();
            w.cluster = true;
            w.set_synced(synced);
            w.resource_url = Some(resource.url());
            w.tasks = TASKS;
            w.iterations = iterations;
            w.lease = LEASE;
            w.renewal = Some(Duration::from_millis(600));
            w.spin_wait = Some(Duration::from_millis(100));
            w.tolerate_errors = true;
            w.max_duration = Duration::from_secs(100);
            w.go_file = Some(go_file.to_owned());
            w.proc_base = u32::try_from(i * PROCS).unwrap();
            let workers = w.spawn(PROCS);
            Run {
                history,
                resource,
                workers,
            }
        })
        .collect()
}

fn finish_and_check(runs: &mut [Run], iterations: u64) -> u64 {
    let mut total = 0;
    for (run, name) in runs.iter_mut().zip(NAMES) {
        let outputs = finish_ok(&mut run.workers, Duration::from_secs(100));
        for out in &outputs {
            assert!(
                out.stdout_lines()
                    .any(|l| l.starts_with(&format!("DONE acquisitions={} ", TASKS * iterations))),
                "lock {name}, worker {}: {}",
                out.index,
                out.stdout
            );
        }
        let counter = get_u64(&run.resource, "counter");
        let cfg = CheckConfig {
            counter: Some(CounterCheck {
                final_value: counter,
                expected: CounterExpectation::FirstLevelAcquisitions,
            }),
            ..CheckConfig::new(LEASE)
        };
        let (_, report) = check(&run.history, &cfg);
        report.assert_ok();
        // Tolerated errors are retried: each worker still completes all (DONE above).
        report.assert_contention(PROCS, (TASKS * iterations) as usize, 2);
        report.assert_pass(&[CheckId::Exclusion, CheckId::Tokens, CheckId::Counter]);
        let expected = PROCS as u64 * TASKS * iterations;
        assert_eq!(counter, expected, "lock {name}: counter = acquisitions");
        total += counter;
    }
    total
}

#[test]
fn exclusion_on_every_shard_through_a_migration_and_a_handover() {
    let iterations = 60;
    let mut cluster = RedisCluster::start(3, 1).expect("cluster");
    let mut owners = Vec::new();
    for name in NAMES {
        let slot = cluster
            .slot_of(format!("slate:{{{name}}}").as_bytes())
            .unwrap();
        owners.push((slot, cluster.master_of(slot).unwrap()));
    }
    let distinct: std::collections::HashSet<usize> = owners.iter().map(|o| o.1).collect();
    assert_eq!(
        distinct.len(),
        3,
        "the locks live on three shards: {owners:?}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let go_file = dir.path().join("go");
    let mut runs = start(&cluster, dir.path(), &go_file, iterations, None);
    for run in &mut runs {
        wait_line_all(&mut run.workers, "READY", Duration::from_secs(20));
    }
    let started = Instant::now();
    go(&go_file);
    // Under load: lock a's slot moves to lock b's master, then lock c's master hands over to
    // its replica.
    std::thread::sleep(Duration::from_millis(300));
    cluster.migrate_slot(owners[0].0, owners[1].1).unwrap();
    let migrated = started.elapsed();
    let replica = cluster.replicas_of(owners[2].1).unwrap()[0];
    cluster.manual_failover(replica).unwrap();
    let handed_over = started.elapsed();
    let total = finish_and_check(&mut runs, iterations);
    println!(
        "{total} acquisitions on 3 shards in {:?}; migration done at {migrated:?}, handover at \
         {handed_over:?}",
        started.elapsed()
    );
}

#[test]
#[cfg_attr(not(feature = "full-matrix"), ignore)]
fn exclusion_through_a_master_crash_with_synced_replicas() {
    let iterations = 80;
    // Two replicas per master: after the crash the promoted master still has one to
    // acknowledge grants.
    let mut cluster = RedisCluster::start(3, 2).expect("cluster");
    let slot = cluster.slot_of(b"slate:{c}").unwrap();
    let victim = cluster.master_of(slot).unwrap();
    let dir = tempfile::tempdir().expect("tempdir");
    let go_file = dir.path().join("go");
    let mut runs = start(
        &cluster,
        dir.path(),
        &go_file,
        iterations,
        Some((1, Duration::from_millis(400))),
    );
    for run in &mut runs {
        wait_line_all(&mut run.workers, "READY", Duration::from_secs(20));
    }
    let started = Instant::now();
    go(&go_file);
    std::thread::sleep(Duration::from_millis(500));
    let promoted = cluster.kill_master(victim).unwrap();
    println!(
        "master {victim} killed; {promoted} promoted at {:?}",
        started.elapsed()
    );
    let total = finish_and_check(&mut runs, iterations);
    println!("{total} acquisitions in {:?}", started.elapsed());
}
