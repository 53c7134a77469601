//! Negative control of scenario 1: the same workers with `--unsafe-skip-lock` (no lock at all)
//! must make the checker report lost increments (counter) and/or overlapping windows (I1).
//! Proves that scenario 1 can fail. A short run might not race; it is repeated, a bounded
//! number of times, until it does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::time::Duration;

use ecosphere::history::{CheckConfig, CheckId, CounterCheck, CounterExpectation};
use scenario::*;

const LEASE: Duration = Duration::from_secs(2);
const MAX_RUNS: usize = 5;

#[test]
fn without_the_lock_the_checker_reports_lost_increments_and_overlaps() {
    let lock_server = server();
    let resource = server();
    for run in 1..=MAX_RUNS {
        let dir = tempfile::tempdir().expect("tempdir");
        let go_file = dir.path().join("go");
        let history = dir.path().join("history");
        std::fs::create_dir(&history).expect("history dir");
        let counter_key = "counter";
        resource.command(&["DEL", counter_key]).expect("DEL");

        let mut w = Worker::new("contend", &lock_server, "unsafe", &history);
        w.resource_url = Some(resource.url());
        w.tasks = 8;
        w.iterations = 40;
        w.lease = LEASE;
        w.go_file = Some(go_file.clone());
        w.unsafe_skip_lock = true;
        let mut workers = w.spawn(4);
        wait_line_all(&mut workers, "READY", Duration::from_secs(20));
        go(&go_file);
        finish_ok(&mut workers, Duration::from_secs(55));

        let counter = get_u64(&resource, counter_key);
        let cfg = CheckConfig {
            counter: Some(CounterCheck {
                final_value: counter,
                expected: CounterExpectation::FirstLevelAcquisitions,
            }),
            ..CheckConfig::new(LEASE)
        };
        let (_, report) = check(&history, &cfg);
        let failed = report.failed();
        println!("negative control run {run}: counter {counter} of 1280; failed {failed:?}");
        if failed.is_empty() {
            // No race this time (possible in principle): try again, boundedly.
            continue;
        }
        assert!(
            failed.contains(&CheckId::Counter) || failed.contains(&CheckId::Exclusion),
            "expected a counter or exclusion failure, got {failed:?}"
        );
        // Lost increments always come with overlapping windows (the checker is sound), and
        // the overlap is what I1 must catch.
        if counter < 1280 {
            assert!(failed.contains(&CheckId::Counter));
            assert!(
                failed.contains(&CheckId::Exclusion),
                "lost updates without overlap?"
            );
        }
        return;
    }
    panic!("{MAX_RUNS} unlocked runs never raced: the scenario cannot detect a broken lock");
}
