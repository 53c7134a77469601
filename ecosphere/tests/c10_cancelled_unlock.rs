//! Issue 19, defect 1, as a multi-process scenario: three worker processes × three tasks
//! contend on a combination lock over three nodes, and every `unlock()` is given up after its
//! first poll (`--cancel-unlock`, as `timeout(d, guard.unlock())` does when `d` runs out
//! first). The release must still complete in the background: before the fix, the first
//! cancelled unlock left the local owner set (the process's other tasks parked for ever) and
//! the leftmost node's entry renewed (every other process lost there), so the workers ran
//! out of time.
//!
//! The history checker decides exclusion (I1), tokens (I3), ownership, validity, activity
//! inside the validity windows and the counter; afterwards no lock key is left on any node.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::path::Path;
use std::time::Duration;

use ecosphere::history::{CheckConfig, CheckId, CounterCheck, CounterExpectation};
use ecosphere::server::RedisServer;
use ecosphere::worker::{CombOrder, Mode, WorkerArgs};
use scenario::{adopt, assert_done, block_on, check, spawn_ready, wait_quiet};

const PROCS: usize = 3;
const TASKS: u64 = 3;
const ITERATIONS: u64 = 15;
const LEASE: Duration = Duration::from_secs(2);
const LOCK: &str = "cancelled-unlock";

fn args(i: usize, nodes: &[String], resource: &str, dir: &Path, go: &Path) -> Vec<String> {
    let mut a = WorkerArgs::new(Mode::Contend, LOCK, u32::try_from(i).unwrap(), dir);
    a.redis_url = nodes.to_vec();
    a.resource_url = Some(resource.to_owned());
    a.tasks = TASKS;
    a.iterations = ITERATIONS;
    // Far less than the run takes if a cancelled unlock wedged the lock.
    a.max_duration = Duration::from_secs(30);
    a.lease = LEASE;
    a.spin_wait = Some(Duration::from_millis(20));
    a.node_op = Some(Duration::from_millis(200));
    a.order = if i == 0 {
        CombOrder::Sequential
    } else {
        CombOrder::Pipelined
    };
    a.go_file = Some(go.to_owned());
    // The last cancelled release of a worker runs on its runtime: keep it up a moment (a
    // process that exits at once takes its background work with it).
    a.linger = Duration::from_millis(300);
    a.cancel_unlock = true;
    a.to_args()
}

#[test]
fn cancelled_unlocks_still_release_across_processes() {
    let nodes = RedisServer::start_many(3).expect("redis-server");
    let resource = RedisServer::start().expect("redis-server");
    let urls: Vec<String> = nodes.iter().map(RedisServer::url).collect();
    block_on(adopt(&urls));
    let dir = tempfile::tempdir().unwrap();
    let history = dir.path().join("history");
    std::fs::create_dir(&history).unwrap();
    let go = dir.path().join("go");
    let mut workers = {
        let (urls, res, h, g) = (urls.clone(), resource.url(), history.clone(), go.clone());
        spawn_ready(PROCS, move |i| args(i, &urls, &res, &h, &g))
    };
    std::fs::write(&go, b"go").unwrap();
    let outputs = workers
        .wait_all(Duration::from_secs(45))
        .expect("workers finish in time");
    assert_done(&outputs, TASKS * ITERATIONS);
    // The last releases finish in the background: their entries go within a round trip.
    let left = wait_quiet(&nodes, Duration::from_secs(1));
    let total = PROCS as u64 * TASKS * ITERATIONS;
    let counter: u64 = {
        let v: Option<u64> =
            redis::from_redis_value(resource.command(&["GET", "counter"]).unwrap()).unwrap();
        v.unwrap_or(0)
    };
    let cfg = CheckConfig {
        counter: Some(CounterCheck {
            final_value: counter,
            expected: CounterExpectation::FirstLevelAcquisitions,
        }),
        final_keys: Some(left),
        ..CheckConfig::new(LEASE)
    };
    let (h, report) = check(&history, &cfg);
    report.assert_ok();
    report.assert_contention(PROCS, (TASKS * ITERATIONS) as usize, 2);
    assert_eq!(counter, total, "counter = acquisitions");
    assert_eq!(report.stats.first_level_acquisitions, total as usize);
    let cancelled = h
        .events()
        .iter()
        .filter(|e| matches!(&e.kind, ecosphere::history::EventKind::RelInfo { reason, .. } if reason.starts_with("cancelled")))
        .count();
    assert!(
        cancelled * 2 >= total as usize,
        "only {cancelled} of {total} unlocks were cancelled"
    );
    report.assert_pass(&[
        CheckId::Exclusion,
        CheckId::Tokens,
        CheckId::Validity,
        CheckId::Activity,
        CheckId::Counter,
        CheckId::Quiescence,
    ]);
    report.assert_pass_or_unchecked(
        CheckId::Ownership,
        "every unlock here is cancelled: no release answer to judge",
    );
}
