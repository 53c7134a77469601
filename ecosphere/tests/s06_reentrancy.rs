//! Scenario 2 (issue 4, reliability.md S6): reentrancy with renewal and a waiter.
//!
//! Worker A goes to depth 3 (`lock`, `reenter`, `lock_as`), holds for three leases (renewal
//! must keep the whole hash alive), then releases level by level, holding one lease at each
//! depth on the way down, and finally sends one release too many, which must answer *not
//! held*. Worker B (another process) waits with `try_lock_for` meanwhile and must acquire only
//! after A's last level is released. The checker decides I1 (no overlap), I5/I6 (every level
//! up and down exactly once), tokens; the test adds the ordering facts from the history.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::time::Duration;

use ecosphere::history::{CheckConfig, CheckId, CounterCheck, CounterExpectation, EventKind};
use scenario::*;

const LEASE: Duration = Duration::from_millis(600);

#[test]
fn depth_three_and_back_frees_the_lock_only_at_zero() {
    let lock_server = server();
    let resource = server();
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path();

    let mut a = Worker::new("reenter", &lock_server, "reentrant", history);
    a.resource_url = Some(resource.url());
    a.lease = LEASE;
    a.renewal = Some(LEASE / 3);
    a.hold = LEASE * 3;
    a.step = LEASE;
    a.max_duration = Duration::from_secs(30);
    let mut holder = a.spawn(1);
    wait_line(&mut holder, 0, "DEPTH 3", Duration::from_secs(20));

    let mut b = Worker::new("wait", &lock_server, "reentrant", history);
    b.resource_url = Some(resource.url());
    b.lease = LEASE;
    b.renewal = Some(LEASE / 3);
    b.spin_wait = Some(Duration::from_millis(100));
    b.budget = Duration::from_secs(20);
    b.hold = Duration::from_millis(50);
    b.proc_base = 1;
    b.max_duration = Duration::from_secs(30);
    let mut waiter = b.spawn(1);
    wait_line(&mut waiter, 0, "INVOKED 1", Duration::from_secs(20));

    let a_out = finish_ok(&mut holder, Duration::from_secs(30)).remove(0);
    let b_out = finish_ok(&mut waiter, Duration::from_secs(30)).remove(0);
    let a_lines: Vec<&str> = a_out.stdout_lines().collect();
    for want in [
        "DEPTH 1",
        "DEPTH 2",
        "DEPTH 3",
        "HOLD_COUNT 3",
        "RELEASED 2",
        "RELEASED 1",
        "RELEASED 0",
        "EXTRA not_held",
    ] {
        assert!(
            a_lines.contains(&want),
            "A never printed {want:?}: {a_lines:?}"
        );
    }
    assert!(
        b_out.stdout.contains("DONE acquired=1 failed=0 errors=0"),
        "{}",
        b_out.stdout
    );

    let counter = get_u64(&resource, "counter");
    let cfg = CheckConfig {
        counter: Some(CounterCheck {
            final_value: counter,
            expected: CounterExpectation::AckedIncrements,
        }),
        final_keys: Some(lock_keys(&lock_server)),
        ..CheckConfig::new(LEASE)
    };
    let (h, report) = check(history, &cfg);
    report.assert_ok();
    // A (three levels) and B acquire; B is the only waiter.
    report.assert_contention(2, 1, 1);
    report.assert_pass(&[
        CheckId::Exclusion,
        CheckId::Tokens,
        CheckId::Ownership,
        CheckId::Reentry,
        CheckId::Validity,
        CheckId::Activity,
        CheckId::Counter,
        CheckId::Quiescence,
    ]);

    // A: depths 1, 2, 3 with one token; renewed while held; released 2, 1, 0; then not held.
    let a_events: Vec<_> = h.events().iter().filter(|e| e.proc == 0).collect();
    let acqs: Vec<(u32, u64)> = a_events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::AcqOk { depth, token, .. } => Some((*depth, *token)),
            _ => None,
        })
        .collect();
    let a_token = acqs[0].1;
    assert_eq!(acqs, vec![(1, a_token), (2, a_token), (3, a_token)]);
    let renewals = a_events
        .iter()
        .filter(|e| e.kind.name() == "renew_ok")
        .count();
    assert!(renewals >= 3, "only {renewals} renewals over 5 leases");
    let releases: Vec<(&str, u64)> = a_events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::RelOk { depth_after, .. } => {
                Some((["0", "1", "2"][*depth_after as usize], e.t))
            }
            EventKind::RelFail { not_held: true, .. } => Some(("not_held", e.t)),
            _ => None,
        })
        .collect();
    assert_eq!(
        releases.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec!["2", "1", "0", "not_held"]
    );
    let final_invoke = a_events
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::RelInvoke {
                depth_before: 1, ..
            } => Some(e.t),
            _ => None,
        })
        .expect("A's release at depth 1");
    let first_release = a_events
        .iter()
        .find(|e| e.kind.name() == "rel_invoke")
        .expect("A's first release")
        .t;

    // B: waiting before A released anything; acquired only after A's last level went.
    let b_invoke = events(&h, "acq_invoke")
        .into_iter()
        .find(|e| e.proc == 1)
        .expect("B invoked")
        .t;
    let (b_ok, b_token) = h
        .events()
        .iter()
        .find_map(|e| match (&e.kind, e.proc) {
            (EventKind::AcqOk { token, .. }, 1) => Some((e.t, *token)),
            _ => None,
        })
        .expect("B acquired");
    assert!(b_invoke < first_release, "B was not waiting while A held");
    assert!(
        b_ok > releases[1].1,
        "B acquired before A's release to depth 1 completed"
    );
    assert!(b_ok > final_invoke, "B acquired before A released depth 1");
    assert!(b_token > a_token, "token {b_token} after {a_token}");
    println!(
        "B waited {:.1} ms; acquired {:.3} ms after A's final rel_invoke and {:.3} ms after its \
         rel_ok(0); {renewals} renewals logged by A",
        ms_between(b_invoke, b_ok),
        ms_between(final_invoke, b_ok),
        ms_between(releases[2].1, b_ok),
    );
}
