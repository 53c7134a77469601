//! Scenario 6 (issue 4, reliability.md S12a): many waiters, no polling storm.
//!
//! 500 waiters over 4 processes each call `try_lock_for(budget)` once on one lock; winners
//! increment the shared counter and hold a few milliseconds. From the history: every waiter
//! either acquires or fails within its budget + slack, and the checker passes (I1, tokens,
//! counter = acquisitions). From `INFO commandstats` on the lock server: commands per
//! acquisition stay under a design bound that a polling implementation would break (with a
//! 50 ms spin wait, 500 waiters each polling would send thousands of commands per second).
//! The measured figure is printed, never compared with a speed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::time::Duration;

use ecosphere::history::{CheckConfig, CheckId, CounterCheck, CounterExpectation};
use scenario::*;

const PROCS: usize = 4;
const WAITERS_PER_PROC: u64 = 125;
const LEASE: Duration = Duration::from_secs(2);
const BUDGET: Duration = Duration::from_secs(20);
const SLACK: Duration = Duration::from_secs(1);
const SPIN_WAIT: Duration = Duration::from_millis(50);
/// Lock commands (scripts and PINGs) per acquisition that no notified, queued design needs:
/// one acquire and one release, plus a few retries and renewals.
const MAX_COMMANDS_PER_ACQUISITION: f64 = 10.0;

/// Commands a client sends itself (nested script calls are counted by Redis too; leave them
/// out).
const CLIENT_COMMANDS: [&str; 8] = [
    "evalsha",
    "eval",
    "ping",
    "script|load",
    "subscribe",
    "unsubscribe",
    "client|setinfo",
    "hello",
];

#[test]
fn five_hundred_waiters_finish_within_budget_without_a_polling_storm() {
    let lock_server = server();
    let resource = server();
    let dir = tempfile::tempdir().expect("tempdir");
    let go_file = dir.path().join("go");
    let history = dir.path().join("history");
    std::fs::create_dir(&history).expect("history dir");

    let mut w = Worker::new("wait", &lock_server, "crowd", &history);
    w.resource_url = Some(resource.url());
    w.tasks = WAITERS_PER_PROC;
    w.lease = LEASE;
    w.renewal = Some(LEASE / 3);
    w.spin_wait = Some(SPIN_WAIT);
    w.budget = BUDGET;
    w.hold = Duration::from_millis(2);
    w.go_file = Some(go_file.clone());
    w.max_duration = Duration::from_secs(50);
    let mut workers = w.spawn(PROCS);
    wait_line_all(&mut workers, "READY", Duration::from_secs(20));
    let before = commandstats(&lock_server);
    go(&go_file);
    let outputs = finish_ok(&mut workers, Duration::from_secs(55));
    let after = commandstats(&lock_server);

    let (acquired, failed) = wait_totals(&outputs);
    let waiters = PROCS as u64 * WAITERS_PER_PROC;
    assert_eq!(acquired + failed, waiters);
    assert!(acquired > 0, "nobody acquired");

    let counter = get_u64(&resource, "counter");
    let cfg = CheckConfig {
        counter: Some(CounterCheck {
            final_value: counter,
            expected: CounterExpectation::FirstLevelAcquisitions,
        }),
        final_keys: Some(lock_keys(&lock_server)),
        ..CheckConfig::new(LEASE)
    };
    let (h, report) = check(&history, &cfg);
    report.assert_ok();
    // One try_lock_for per waiter, and some may time out: at least one grant per process.
    report.assert_contention(PROCS, 1, 2);
    report.assert_pass(&[
        CheckId::Exclusion,
        CheckId::Tokens,
        CheckId::Ownership,
        CheckId::Validity,
        CheckId::Counter,
        CheckId::Quiescence,
    ]);
    report.assert_pass_or_unchecked(CheckId::Reentry, "this scenario never re-enters");
    assert_eq!(counter, acquired);

    // Every waiter came back within its budget + slack.
    let bound = u64::try_from((BUDGET + SLACK).as_nanos()).unwrap();
    let all = attempts(&h);
    assert_eq!(all.len() as u64, waiters);
    let mut longest = (0u64, "");
    for &(proc, attempt, t0, outcome, t1) in &all {
        assert!(
            matches!(outcome, "acq_ok" | "acq_fail"),
            "proc {proc} attempt {attempt}: {outcome}"
        );
        assert!(
            t1 - t0 <= bound,
            "proc {proc} attempt {attempt} ({outcome}) took {:.1} ms, budget {BUDGET:?}",
            ms_between(t0, t1)
        );
        if t1 - t0 > longest.0 {
            longest = (t1 - t0, outcome);
        }
    }

    // No polling storm: commands the clients sent per acquisition.
    let delta =
        |name: &str| after.get(name).copied().unwrap_or(0) - before.get(name).copied().unwrap_or(0);
    let sent: Vec<(&str, u64)> = CLIENT_COMMANDS
        .iter()
        .map(|&c| (c, delta(c)))
        .filter(|&(_, n)| n > 0)
        .collect();
    let total: u64 = sent.iter().map(|&(_, n)| n).sum();
    let per_acquisition = total as f64 / acquired as f64;
    println!(
        "{waiters} waiters: {acquired} acquired, {failed} timed out; longest call {:.1} ms \
         ({}); lock-server commands {sent:?} = {total}, {per_acquisition:.2} per acquisition \
         (bound {MAX_COMMANDS_PER_ACQUISITION}, spin wait {SPIN_WAIT:?})",
        longest.0 as f64 / 1e6,
        longest.1
    );
    assert!(
        per_acquisition < MAX_COMMANDS_PER_ACQUISITION,
        "{per_acquisition:.2} commands per acquisition: waiters are polling"
    );
}

/// The other outcome of a bounded wait: 50 waiters (one process) on a lock held for longer
/// than their budget all fail with a timeout, none before its budget and none later than
/// budget + slack.
#[test]
fn waiters_whose_budget_runs_out_time_out_within_budget() {
    const SHORT_BUDGET: Duration = Duration::from_millis(300);
    let lock_server = server();
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path();

    let mut holder = Worker::new("hold", &lock_server, "busy", history);
    holder.lease = LEASE;
    holder.renewal = Some(LEASE / 3);
    // Long enough for every waiter's budget (they start once it holds); no resource needed.
    holder.hold = Duration::from_secs(3);
    let mut hold = holder.spawn(1);
    wait_line(&mut hold, 0, "HOLDING ", Duration::from_secs(20));

    let mut w = Worker::new("wait", &lock_server, "busy", history);
    w.tasks = 50;
    w.lease = LEASE;
    w.spin_wait = Some(SPIN_WAIT);
    w.budget = SHORT_BUDGET;
    w.proc_base = 1;
    let mut waiters = w.spawn(1);
    let out = finish_ok(&mut waiters, Duration::from_secs(20)).remove(0);
    assert!(
        out.stdout.contains("DONE acquired=0 failed=50 errors=0"),
        "{}",
        out.stdout
    );
    finish_ok(&mut hold, Duration::from_secs(20));

    let (h, report) = check(history, &CheckConfig::new(LEASE));
    report.assert_ok();
    // Only the holder acquires; its 50 waiters all wait (and fail) while it holds.
    report.assert_contention(1, 1, 2);
    let budget = u64::try_from(SHORT_BUDGET.as_nanos()).unwrap();
    let slack = u64::try_from(SLACK.as_nanos()).unwrap();
    let (mut shortest, mut longest) = (u64::MAX, 0);
    for (proc, attempt, t0, outcome, t1) in attempts(&h).into_iter().filter(|a| a.0 == 1) {
        assert_eq!(outcome, "acq_fail", "waiter {attempt} of proc {proc}");
        assert!(
            t1 - t0 >= budget,
            "gave up after {:.1} ms",
            ms_between(t0, t1)
        );
        assert!(
            t1 - t0 <= budget + slack,
            "took {:.1} ms",
            ms_between(t0, t1)
        );
        shortest = shortest.min(t1 - t0);
        longest = longest.max(t1 - t0);
    }
    println!(
        "50 waiters with a {SHORT_BUDGET:?} budget timed out after {:.1}..{:.1} ms",
        shortest as f64 / 1e6,
        longest as f64 / 1e6
    );
}
