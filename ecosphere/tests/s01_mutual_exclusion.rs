//! Scenario 1 (issue 4, reliability.md S1): mutual exclusion under contention.
//!
//! 4 worker processes × 8 tasks × 40 iterations of lock / GET counter / SET counter+1 / unlock
//! on one lock; the counter lives on a second, never-faulted Redis. The checker decides: no two
//! holders' validity windows overlap (I1), tokens strictly increase (I3), depth bookkeeping
//! (I5/I6), deadlines within the lease (validity), every increment inside its holder's window,
//! and the final counter equals the number of first-level acquisitions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::time::{Duration, Instant};

use ecosphere::history::{CheckConfig, CheckId, CounterCheck, CounterExpectation};
use scenario::*;

const PROCS: usize = 4;
const TASKS: u64 = 8;
const ITERATIONS: u64 = 40;
const LEASE: Duration = Duration::from_secs(2);

#[test]
fn four_processes_keep_mutual_exclusion_and_count_every_increment() {
    let lock_server = server();
    let resource = server();
    let dir = tempfile::tempdir().expect("tempdir");
    let go_file = dir.path().join("go");
    let history = dir.path().join("history");
    std::fs::create_dir(&history).expect("history dir");

    let mut w = Worker::new("contend", &lock_server, "mutex", &history);
    w.resource_url = Some(resource.url());
    w.tasks = TASKS;
    w.iterations = ITERATIONS;
    w.lease = LEASE;
    w.renewal = Some(Duration::from_millis(600));
    w.spin_wait = Some(Duration::from_millis(100));
    w.max_duration = Duration::from_secs(50);
    w.go_file = Some(go_file.clone());
    let mut workers = w.spawn(PROCS);
    wait_line_all(&mut workers, "READY", Duration::from_secs(20));
    let start = Instant::now();
    go(&go_file);
    let outputs = finish_ok(&mut workers, Duration::from_secs(55));
    let elapsed = start.elapsed();
    let total = PROCS as u64 * TASKS * ITERATIONS;
    for out in &outputs {
        assert!(
            out.stdout_lines()
                .any(|l| l.starts_with(&format!("DONE acquisitions={} ", TASKS * ITERATIONS))),
            "worker {}: {}",
            out.index,
            out.stdout
        );
    }

    let counter = get_u64(&resource, "counter");
    let cfg = CheckConfig {
        counter: Some(CounterCheck {
            final_value: counter,
            expected: CounterExpectation::FirstLevelAcquisitions,
        }),
        min_validity: LEASE / 2,
        final_keys: Some(lock_keys(&lock_server)),
        ..CheckConfig::new(LEASE)
    };
    let (_, report) = check(&history, &cfg);
    println!(
        "{total} acquisitions by {PROCS} processes x {TASKS} tasks in {elapsed:?}; counter {counter}"
    );
    report.assert_ok();
    report.assert_contention(PROCS, (TASKS * ITERATIONS) as usize, 2);
    assert_eq!(counter, total, "counter = acquisitions");
    assert_eq!(report.stats.first_level_acquisitions, total as usize);
    assert_eq!(report.stats.windows, total as usize);
    report.assert_pass(&[
        CheckId::Exclusion,
        CheckId::Tokens,
        CheckId::Ownership,
        CheckId::Validity,
        CheckId::Activity,
        CheckId::Counter,
        CheckId::Quiescence,
    ]);
    report.assert_pass_or_unchecked(CheckId::Reentry, "this scenario never re-enters");
}
