//! The history checker on hand-written histories: one violating history per check, and clean
//! histories that must pass (pauses, kills, ghosts, nesting).

use std::collections::BTreeMap;
use std::time::Duration;

use ecosphere::history::{
    CheckConfig, CheckId, CounterCheck, CounterExpectation, Event, EventKind, History, Report,
    Status,
};

const MS: u64 = 1_000_000;
/// Every history starts at this monotonic time, so relative times are readable.
const T0: u64 = 1_000_000 * MS;
const LEASE_MS: u64 = 1000;
const LOCK: &str = "L";

fn cfg() -> CheckConfig {
    CheckConfig::new(Duration::from_millis(LEASE_MS))
}

/// A history builder; times in ms from `T0`, default deadline = invoke + lease.
#[derive(Default)]
struct B {
    ev: Vec<Event>,
    attempt: u64,
}

impl B {
    fn push(&mut self, t_ms: u64, proc: u32, kind: EventKind) -> &mut Self {
        self.ev
            .push(Event::new(T0 + t_ms * MS, proc, 0, LOCK, kind));
        self
    }

    fn invoke(&mut self, t: u64, proc: u32, budget_ms: Option<u64>) -> u64 {
        self.attempt += 1;
        let attempt = self.attempt;
        self.push(t, proc, EventKind::AcqInvoke { attempt, budget_ms });
        attempt
    }

    #[allow(clippy::too_many_arguments)]
    fn ok(&mut self, t: u64, proc: u32, attempt: u64, h: &str, token: u64, depth: u32, dl: u64) {
        let kind = EventKind::AcqOk {
            attempt,
            holder: h.into(),
            token,
            depth,
            deadline: T0 + dl * MS,
            nodes: vec![],
            permits: None,
        };
        self.push(t, proc, kind);
    }

    /// Invoke at `t_inv`, acquired at `t_ok`, deadline `t_inv + lease`.
    fn acq(
        &mut self,
        t_inv: u64,
        t_ok: u64,
        proc: u32,
        h: &str,
        token: u64,
        depth: u32,
    ) -> &mut Self {
        let a = self.invoke(t_inv, proc, None);
        self.ok(t_ok, proc, a, h, token, depth, t_inv + LEASE_MS);
        self
    }

    fn rel(&mut self, t_inv: u64, t_ok: u64, proc: u32, h: &str, before: u32) -> &mut Self {
        self.push(
            t_inv,
            proc,
            EventKind::RelInvoke {
                holder: h.into(),
                depth_before: before,
            },
        );
        self.push(
            t_ok,
            proc,
            EventKind::RelOk {
                holder: h.into(),
                depth_after: before - 1,
            },
        )
    }

    fn renew(&mut self, t: u64, proc: u32, h: &str, deadline_ms: u64) -> &mut Self {
        let kind = EventKind::RenewOk {
            holder: h.into(),
            deadline: T0 + deadline_ms * MS,
        };
        self.push(t, proc, kind)
    }

    fn lost(&mut self, t: u64, proc: u32, h: &str) -> &mut Self {
        self.push(
            t,
            proc,
            EventKind::Lost {
                holder: h.into(),
                reason: "expired".into(),
            },
        )
    }

    fn op(&mut self, t: u64, proc: u32, h: &str, token: u64) -> &mut Self {
        let kind = EventKind::ResOp {
            holder: h.into(),
            token,
            op: "incr".into(),
            outcome: "ok".into(),
            invoked: None,
        };
        self.push(t, proc, kind)
    }

    fn observe(&mut self, t: u64, fields: &[(&str, u64)], pttl_ms: i64) -> &mut Self {
        let fields: BTreeMap<String, u64> =
            fields.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
        let kind = EventKind::Observe {
            node: 0,
            fields,
            pttl_ms,
            run_id: "r1".into(),
        };
        self.push(t, 99, kind)
    }

    fn check(&self, cfg: &CheckConfig) -> Report {
        History::from_events(self.ev.clone()).check(cfg)
    }
}

#[track_caller]
fn assert_fails(r: &Report, id: CheckId) {
    assert!(
        matches!(r.status(id), Status::Fail(_)),
        "expected {} to fail, report:\n{r}",
        id.label()
    );
    assert!(!r.is_ok());
    let text = r.to_string();
    assert!(text.contains("FAIL"), "{text}");
}

#[track_caller]
fn assert_only_fails(r: &Report, id: CheckId) {
    assert_fails(r, id);
    assert_eq!(
        r.failed(),
        vec![id],
        "only {} should fail:\n{r}",
        id.label()
    );
}

// ---------------------------------------------------------------- violations

#[test]
fn two_holders_overlapping() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1).acq(5, 10, 2, "b", 2, 1);
    b.rel(20, 21, 2, "b", 1).rel(30, 31, 1, "a", 1);
    let r = b.check(&cfg());
    assert_only_fails(&r, CheckId::Exclusion);
    let cx = r
        .status(CheckId::Exclusion)
        .counterexample()
        .cloned()
        .unwrap_or_default();
    assert!(
        cx.message.contains("\"a\"") && cx.message.contains("\"b\""),
        "{}",
        cx.message
    );
    // Both windows' opening events are among the conflicting events, and context is shown.
    let kinds: Vec<_> = cx.events.iter().map(|(_, e)| e.kind.name()).collect();
    assert!(
        kinds.iter().filter(|k| **k == "acq_ok").count() == 2,
        "{kinds:?}"
    );
    assert!(!cx.context.is_empty());
    let text = r.to_string();
    assert!(
        text.contains("conflicting events") && text.contains("surrounding events"),
        "{text}"
    );
}

#[test]
fn late_release_after_deadline_is_not_an_overlap() {
    // a's window closes at its deadline (1000 ms); b acquires at 1100; a's release comes late.
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1).acq(1050, 1100, 2, "b", 2, 1);
    b.rel(1200, 1201, 1, "a", 1).rel(1300, 1301, 2, "b", 1);
    let r = b.check(&cfg());
    assert!(r.status(CheckId::Exclusion).is_ok(), "{r}");
    // The late release succeeded although the server entry must have expired: only the
    // exclusion check is concerned here; report it all the same.
    assert_eq!(r.stats.windows_closed[2], 1, "{r}");
}

#[test]
fn late_release_with_renewed_lease_is_an_overlap() {
    // Same schedule, but a renewed at 500 ms (deadline 1500): the late release is real.
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1)
        .renew(500, 1, "a", 1499)
        .acq(1050, 1100, 2, "b", 2, 1);
    b.rel(1200, 1201, 1, "a", 1).rel(1300, 1301, 2, "b", 1);
    let r = b.check(&cfg());
    assert_only_fails(&r, CheckId::Exclusion);
}

#[test]
fn overlap_is_found_behind_a_long_earlier_window() {
    // a holds long; c and d come and go (sequentially to each other) inside a's window: every
    // window inside a's is reported, not only the first.
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1).renew(400, 1, "a", 1399);
    b.acq(100, 101, 2, "c", 2, 1).rel(110, 111, 2, "c", 1);
    b.acq(200, 201, 3, "d", 3, 1).rel(210, 211, 3, "d", 1);
    b.rel(900, 901, 1, "a", 1);
    let r = b.check(&cfg());
    assert_only_fails(&r, CheckId::Exclusion);
    assert_eq!(
        r.result(CheckId::Exclusion).map(|c| c.violations),
        Some(2),
        "{r}"
    );
}

#[test]
fn decreasing_token() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 5, 1).rel(10, 11, 1, "a", 1);
    b.acq(20, 21, 2, "b", 4, 1).rel(30, 31, 2, "b", 1);
    let r = b.check(&cfg());
    assert_only_fails(&r, CheckId::Tokens);
    // With resets allowed (single node with data loss) it is counted, not failed.
    let r = b.check(&CheckConfig {
        allow_token_reset: true,
        ..cfg()
    });
    r.assert_ok();
    assert_eq!(r.stats.token_resets, 1);
}

#[test]
fn equal_token_for_a_new_holder() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 5, 1).rel(10, 11, 1, "a", 1);
    b.acq(20, 21, 2, "b", 5, 1).rel(30, 31, 2, "b", 1);
    assert_only_fails(&b.check(&cfg()), CheckId::Tokens);
}

#[test]
fn token_changing_on_reentry() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 5, 1).acq(10, 11, 1, "a", 6, 2);
    b.rel(20, 21, 1, "a", 2).rel(30, 31, 1, "a", 1);
    assert_only_fails(&b.check(&cfg()), CheckId::Tokens);
}

#[test]
fn double_decrement() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1).acq(10, 11, 1, "a", 1, 2);
    b.push(
        20,
        1,
        EventKind::RelInvoke {
            holder: "a".into(),
            depth_before: 2,
        },
    );
    b.push(
        21,
        1,
        EventKind::RelOk {
            holder: "a".into(),
            depth_after: 0,
        },
    );
    assert_only_fails(&b.check(&cfg()), CheckId::Reentry);
}

#[test]
fn release_below_zero() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1).rel(10, 11, 1, "a", 1);
    b.push(
        20,
        1,
        EventKind::RelInvoke {
            holder: "a".into(),
            depth_before: 1,
        },
    );
    b.push(
        21,
        1,
        EventKind::RelOk {
            holder: "a".into(),
            depth_after: 0,
        },
    );
    assert_only_fails(&b.check(&cfg()), CheckId::Ownership);
}

#[test]
fn release_by_a_non_holder() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1);
    b.rel(10, 11, 2, "intruder", 1);
    b.rel(20, 21, 1, "a", 1);
    let r = b.check(&cfg());
    assert_only_fails(&r, CheckId::Ownership);
    let cx = r
        .status(CheckId::Ownership)
        .counterexample()
        .cloned()
        .unwrap_or_default();
    assert!(cx.message.contains("intruder"), "{}", cx.message);
}

#[test]
fn not_held_answer_inside_the_lease() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1);
    b.push(
        100,
        1,
        EventKind::RelInvoke {
            holder: "a".into(),
            depth_before: 1,
        },
    );
    let kind = EventKind::RelFail {
        holder: "a".into(),
        reason: "not held".into(),
        not_held: true,
    };
    b.push(101, 1, kind.clone());
    assert_only_fails(&b.check(&cfg()), CheckId::Ownership);
    // Expected in a data-loss scenario: a warning.
    let loss = CheckConfig {
        allow_token_reset: true,
        ..cfg()
    };
    let r = b.check(&loss);
    assert!(
        matches!(r.status(CheckId::Ownership), Status::Warn(_)),
        "{r}"
    );
    // The same answer after the deadline is legitimate (the lease ran out).
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1);
    b.push(
        1100,
        1,
        EventKind::RelInvoke {
            holder: "a".into(),
            depth_before: 1,
        },
    );
    b.push(1101, 1, kind);
    b.check(&cfg()).assert_ok();
}

#[test]
fn depth_jump_by_two() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1).acq(10, 11, 1, "a", 1, 3);
    assert_only_fails(&b.check(&cfg()), CheckId::Reentry);
}

#[test]
fn first_acquisition_with_depth_two() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 2);
    assert_only_fails(&b.check(&cfg()), CheckId::Reentry);
}

#[test]
fn release_depth_mismatch() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1);
    b.rel(10, 11, 1, "a", 2);
    assert_fails(&b.check(&cfg()), CheckId::Reentry);
}

#[test]
fn deadline_beyond_invoke_plus_lease() {
    // try_lock (one remote attempt): deadline must be <= invoke + lease (+1 ms tolerance).
    let mut b = B::default();
    let a = b.invoke(0, 1, Some(0));
    b.ok(5, 1, a, "a", 1, 1, 1004);
    b.rel(10, 11, 1, "a", 1);
    assert_only_fails(&b.check(&cfg()), CheckId::Validity);
    // A waiting call is bounded by acq_ok.t + lease = 1005 instead: passes...
    let mut w = B::default();
    let a = w.invoke(0, 1, None);
    w.ok(5, 1, a, "a", 1, 1, 1004);
    w.rel(10, 11, 1, "a", 1);
    w.check(&cfg()).assert_ok();
    // ...unless the strict bound is asked for.
    let strict = CheckConfig {
        strict_invoke_bound: true,
        ..cfg()
    };
    assert_only_fails(&w.check(&strict), CheckId::Validity);
    // Within the tolerance is fine.
    let mut t = B::default();
    let a = t.invoke(0, 1, Some(0));
    t.ok(5, 1, a, "a", 1, 1, 1000);
    t.check(&strict).assert_ok();
}

#[test]
fn renew_deadline_beyond_lease() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1)
        .renew(500, 1, "a", 1600)
        .rel(600, 601, 1, "a", 1);
    assert_only_fails(&b.check(&cfg()), CheckId::Validity);
}

#[test]
fn acquired_with_too_little_validity() {
    let mut b = B::default();
    let a = b.invoke(0, 1, None);
    b.ok(950, 1, a, "a", 1, 1, 1000);
    b.rel(960, 961, 1, "a", 1);
    let c = CheckConfig {
        min_validity: Duration::from_millis(100),
        ..cfg()
    };
    assert_only_fails(&b.check(&c), CheckId::Validity);
    b.check(&cfg()).assert_ok();
}

#[test]
fn counter_mismatch() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1)
        .op(2, 1, "a", 1)
        .rel(3, 4, 1, "a", 1);
    b.acq(5, 6, 2, "b", 2, 1)
        .op(7, 2, "b", 2)
        .rel(8, 9, 2, "b", 1);
    b.acq(10, 11, 1, "c", 3, 1)
        .op(12, 1, "c", 3)
        .rel(13, 14, 1, "c", 1);
    let c = |final_value, expected| CheckConfig {
        counter: Some(CounterCheck {
            final_value,
            expected,
        }),
        ..cfg()
    };
    assert_only_fails(
        &b.check(&c(2, CounterExpectation::AckedIncrements)),
        CheckId::Counter,
    );
    assert_only_fails(
        &b.check(&c(2, CounterExpectation::FirstLevelAcquisitions)),
        CheckId::Counter,
    );
    assert_only_fails(
        &b.check(&c(3, CounterExpectation::Exact(4))),
        CheckId::Counter,
    );
    b.check(&c(3, CounterExpectation::AckedIncrements))
        .assert_ok();
    b.check(&c(3, CounterExpectation::FirstLevelAcquisitions))
        .assert_ok();
}

#[test]
fn leftover_key_observed() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1).rel(10, 11, 1, "a", 1);
    b.observe(500, &[], -2).observe(2000, &[("a", 1)], 300);
    let c = CheckConfig {
        quiescent_after: Some(T0 + 1500 * MS),
        ..cfg()
    };
    assert_only_fails(&b.check(&c), CheckId::Quiescence);
    // A key without TTL (pttl -1) counts as present too.
    let mut k = B::default();
    k.observe(2000, &[], -1);
    assert_only_fails(&k.check(&c), CheckId::Quiescence);
    // Before quiescence began, a present key is fine.
    let c = CheckConfig {
        quiescent_after: Some(T0 + 2500 * MS),
        ..cfg()
    };
    assert!(b.check(&c).status(CheckId::Quiescence).is_ok());
}

#[test]
fn leftover_key_in_final_scan() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1).rel(10, 11, 1, "a", 1);
    let c = CheckConfig {
        final_keys: Some(vec!["slate:L".into()]),
        ..cfg()
    };
    assert_only_fails(&b.check(&c), CheckId::Quiescence);
    let c = CheckConfig {
        final_keys: Some(vec![]),
        ..cfg()
    };
    b.check(&c).assert_ok();
}

#[test]
fn zombie_renewal_after_release() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1)
        .acq(5, 6, 1, "a", 1, 2)
        .rel(50, 51, 1, "a", 2);
    b.lost(100, 1, "a");
    // The entry survived the loss (renewal timed out) and, more than a lease later, its TTL is
    // still being pushed up.
    b.observe(1200, &[("a", 1)], 700)
        .observe(1300, &[("a", 1)], 950);
    assert_only_fails(&b.check(&cfg()), CheckId::Quiescence);
    // Within the grace period (a renewal delayed in flight) it is not blamed.
    let mut g = B::default();
    g.acq(0, 1, 1, "a", 1, 1).lost(100, 1, "a");
    g.observe(200, &[("a", 1)], 700)
        .observe(300, &[("a", 1)], 950);
    g.check(&cfg()).assert_ok();
    let no_grace = CheckConfig {
        zombie_grace: Duration::ZERO,
        ..cfg()
    };
    assert_only_fails(&g.check(&no_grace), CheckId::Quiescence);
    // The TTL merely running down is fine.
    let mut d = B::default();
    d.acq(0, 1, 1, "a", 1, 1).lost(100, 1, "a");
    d.observe(200, &[("a", 1)], 700)
        .observe(300, &[("a", 1)], 600);
    assert!(d.check(&cfg()).status(CheckId::Quiescence).is_ok());
}

#[test]
fn activity_past_validity_fails_unless_expected_and_counted() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1)
        .op(500, 1, "a", 1)
        .op(1200, 1, "a", 1)
        .rel(1300, 1301, 1, "a", 1);
    // By default an operation past the window fails.
    let r = b.check(&cfg());
    assert_only_fails(&r, CheckId::Activity);
    assert_eq!(r.stats.activity_past_validity, 1);
    let expect = |procs: Vec<u32>, max_ops: usize| CheckConfig {
        expected_late: Some(ecosphere::history::ExpectedLate {
            procs,
            max_ops,
            reason: "a is paused across its deadline".into(),
        }),
        ..cfg()
    };
    // Expected of this process, within the count: a warning.
    let r = b.check(&expect(vec![1], 1));
    assert!(
        matches!(r.status(CheckId::Activity), Status::Warn(_)),
        "{r}"
    );
    assert!(r.is_ok());
    // More than expected, or of another process: a failure.
    assert_only_fails(&b.check(&expect(vec![1], 0)), CheckId::Activity);
    assert_only_fails(&b.check(&expect(vec![2], 5)), CheckId::Activity);
}

// ---------------------------------------------------------------- clean histories

#[test]
fn sequential_holders() {
    let mut b = B::default();
    let mut t = 0;
    for i in 0..20u32 {
        let h = format!("h{i}");
        b.acq(t, t + 1, i % 3, &h, u64::from(i) + 1, 1)
            .op(t + 2, i % 3, &h, u64::from(i) + 1);
        b.rel(t + 3, t + 4, i % 3, &h, 1);
        t += 5;
    }
    let c = CheckConfig {
        counter: Some(CounterCheck {
            final_value: 20,
            expected: CounterExpectation::AckedIncrements,
        }),
        quiescent_after: Some(T0 + 5000 * MS),
        final_keys: Some(vec![]),
        ..cfg()
    };
    b.observe(6000, &[], -2);
    let r = b.check(&c);
    r.assert_ok();
    for id in CheckId::ALL {
        if matches!(id, CheckId::Reentry | CheckId::FencedOrder) {
            // Nobody re-enters and nothing is fenced: nothing to judge, not a pass.
            assert!(matches!(r.status(id), Status::Unchecked(_)), "{r}");
        } else {
            assert_eq!(r.status(id), &Status::Pass, "{r}");
        }
    }
    assert_eq!(
        (r.stats.acquisitions, r.stats.holders, r.stats.windows),
        (20, 20, 20)
    );
}

#[test]
fn reentrant_nesting() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 7, 1)
        .acq(10, 11, 1, "a", 7, 2)
        .renew(400, 1, "a", 1399);
    b.acq(500, 501, 1, "a", 7, 3).op(600, 1, "a", 7);
    b.rel(700, 701, 1, "a", 3)
        .rel(800, 801, 1, "a", 2)
        .renew(1200, 1, "a", 2199);
    b.op(1300, 1, "a", 7).rel(1400, 1401, 1, "a", 1);
    b.acq(1405, 1410, 2, "b", 8, 1).rel(1500, 1501, 2, "b", 1);
    let r = b.check(&cfg());
    r.assert_ok();
    assert_eq!(r.stats.windows, 2, "{r}");
    assert_eq!(r.status(CheckId::Activity), &Status::Pass);
}

#[test]
fn paused_holder_reports_loss_after_successor_acquired() {
    // a is paused (SIGSTOP) from 100 ms to 2500 ms; its lease runs out at 1000; b acquires at
    // 1100; a resumes, learns of the loss and tries to release (not held).
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1).op(50, 1, "a", 1);
    b.push(
        100,
        0,
        EventKind::Nemesis {
            action: "sigstop_worker".into(),
            target: "1".into(),
        },
    );
    b.acq(1050, 1100, 2, "b", 2, 1).op(1150, 2, "b", 2);
    b.push(
        2500,
        0,
        EventKind::Nemesis {
            action: "sigcont_worker".into(),
            target: "1".into(),
        },
    );
    b.lost(2510, 1, "a");
    b.push(
        2520,
        1,
        EventKind::RelInvoke {
            holder: "a".into(),
            depth_before: 1,
        },
    );
    let nh = EventKind::RelFail {
        holder: "a".into(),
        reason: "not held".into(),
        not_held: true,
    };
    b.push(2521, 1, nh);
    b.rel(2600, 2601, 2, "b", 1);
    let r = b.check(&cfg());
    r.assert_ok();
    assert_eq!(r.stats.losses, 1);
}

#[test]
fn killed_holder_successor_after_deadline() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1).renew(500, 1, "a", 1499);
    b.push(600, 0, EventKind::kill_worker(1));
    b.acq(700, 1520, 2, "b", 2, 1).rel(1600, 1601, 2, "b", 1);
    let r = b.check(&cfg());
    r.assert_ok();
    assert_eq!(r.stats.windows_closed[3], 1, "{r}");
    // The same kill given through the config instead of a nemesis event.
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1).renew(500, 1, "a", 1499);
    b.acq(700, 1520, 2, "b", 2, 1).rel(1600, 1601, 2, "b", 1);
    let c = CheckConfig {
        killed: vec![(1, T0 + 600 * MS)],
        ..cfg()
    };
    b.check(&c).assert_ok();
}

#[test]
fn a_kill_leaves_the_window_open_until_the_deadline() {
    // Nobody released a's hold: killing its process at 600 ms does not hand the lock over, so
    // b acquiring at 700 ms, inside a's lease, is an early grant: an I1 violation.
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1)
        .push(600, 0, EventKind::kill_worker(1));
    b.acq(650, 700, 2, "b", 2, 1).rel(800, 801, 2, "b", 1);
    let r = b.check(&cfg());
    assert_only_fails(&r, CheckId::Exclusion);
    assert!(format!("{r}").contains("worker killed"), "{r}");
    // After a's deadline it is a legal handover.
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1)
        .push(600, 0, EventKind::kill_worker(1));
    b.acq(650, 1100, 2, "b", 2, 1).rel(1200, 1201, 2, "b", 1);
    b.check(&cfg()).assert_ok();
}

#[test]
fn ghost_acquisition_is_not_a_holder() {
    let mut b = B::default();
    let a = b.invoke(0, 1, None);
    b.push(
        30,
        1,
        EventKind::AcqInfo {
            attempt: a,
            reason: "timeout".into(),
        },
    );
    b.acq(40, 1001, 2, "b", 2, 1).rel(1100, 1101, 2, "b", 1);
    // The same task retries and the ghost entry makes its depth 2: excused once.
    let a = b.invoke(1200, 1, None);
    b.push(
        1210,
        1,
        EventKind::AcqInfo {
            attempt: a,
            reason: "timeout".into(),
        },
    );
    b.acq(1220, 1230, 1, "c", 3, 2)
        .rel(1300, 1301, 1, "c", 2)
        .rel(1302, 1303, 1, "c", 1);
    let r = b.check(&cfg());
    r.assert_ok();
    assert_eq!(r.stats.ghosts, 2);
}

#[test]
fn indeterminate_release_then_reacquire() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1);
    b.push(
        10,
        1,
        EventKind::RelInvoke {
            holder: "a".into(),
            depth_before: 1,
        },
    );
    b.push(
        20,
        1,
        EventKind::RelInfo {
            holder: "a".into(),
            reason: "io".into(),
        },
    );
    // The release may not have happened: the entry may block b until a's deadline.
    b.acq(30, 1010, 2, "b", 2, 1).rel(1020, 1021, 2, "b", 1);
    b.acq(1030, 1031, 1, "a", 3, 1).rel(1040, 1041, 1, "a", 1);
    b.check(&cfg()).assert_ok();
}

#[test]
fn interleaved_locks_are_independent() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1).rel(500, 501, 1, "a", 1);
    // Same times on another lock.
    let mut other = B::default();
    other.acq(0, 2, 2, "b", 1, 1).rel(400, 401, 2, "b", 1);
    for e in &mut other.ev {
        e.lock = "M".into();
    }
    b.ev.extend(other.ev);
    let r = b.check(&cfg());
    r.assert_ok();
    assert_eq!(r.stats.locks, 2);
}

#[test]
fn report_lists_every_check_and_statistics() {
    let mut b = B::default();
    b.acq(0, 3, 1, "a", 1, 1).rel(10, 11, 1, "a", 1);
    b.acq(12, 20, 2, "b", 2, 1).rel(30, 31, 2, "b", 1);
    let r = b.check(&cfg());
    let text = r.to_string();
    for id in CheckId::ALL {
        assert!(text.contains(id.label()), "{text}");
    }
    assert!(text.contains("UNCHECKED"), "{text}");
    assert_eq!(r.stats.acquire_latency.count, 2);
    assert_eq!(r.stats.acquire_latency.max, Duration::from_millis(8));
    assert_eq!(r.stats.acquire_latency.p50, Duration::from_millis(3));
}

#[test]
#[should_panic(expected = "I1 exclusion")]
fn assert_ok_panics_with_the_report() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1).acq(5, 10, 2, "b", 2, 1);
    b.check(&cfg()).assert_ok();
}

// ---------------------------------------------------------------- strictness

#[test]
fn one_holder_alone_leaves_exclusion_and_tokens_unchecked() {
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1).rel(100, 101, 1, "a", 1);
    b.acq(200, 201, 1, "a", 2, 1).rel(300, 301, 1, "a", 1);
    let r = b.check(&cfg());
    r.assert_ok();
    assert!(
        matches!(r.status(CheckId::Exclusion), Status::Unchecked(_)),
        "{r}"
    );
    assert!(std::panic::catch_unwind(|| r.assert_pass(&[CheckId::Exclusion])).is_err());
    r.assert_pass_or_unchecked(CheckId::Exclusion, "one holder: nobody to exclude");
    r.assert_pass(&[CheckId::Tokens, CheckId::Ownership]);
}

#[test]
fn a_renewal_extends_the_window_and_a_later_smaller_deadline_does_not_shorten_it() {
    // a's deadline moves to 1350 ms at 400 ms; a re-entrant acq_ok at 600 ms that reports the
    // original 1000 ms deadline does not undo that: b at 1200 ms overlaps.
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1).renew(400, 1, "a", 1350);
    let a = b.invoke(600, 1, None);
    b.ok(601, 1, a, "a", 1, 2, 1000);
    b.acq(1100, 1200, 2, "b", 2, 1).rel(1300, 1301, 2, "b", 1);
    assert_only_fails(&b.check(&cfg()), CheckId::Exclusion);
    // A deadline moved back (an aggregated lease that lost a node) counts from when the
    // holder was told: told at 900 ms that it ends at 800 ms, a's window ends at 900 ms.
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1).renew(900, 1, "a", 800);
    b.acq(850, 950, 2, "b", 2, 1).rel(1300, 1301, 2, "b", 1);
    b.check(&cfg()).assert_ok();
    let mut b = B::default();
    b.acq(0, 1, 1, "a", 1, 1).renew(900, 1, "a", 800);
    b.acq(850, 880, 2, "b", 2, 1).rel(1300, 1301, 2, "b", 1);
    assert_only_fails(&b.check(&cfg()), CheckId::Exclusion);
}

#[test]
fn a_known_reply_delay_catches_a_lease_counted_from_the_reply() {
    // Every reply takes at least 300 ms: an acquisition answered at 301 ms was applied by 1 ms,
    // so a deadline of 1301 ms (counted from the reply) is beyond the lease.
    let mut b = B::default();
    let a = b.invoke(0, 1, None);
    b.ok(301, 1, a, "a", 1, 1, 1301);
    b.renew(900, 1, "a", 1900);
    let delayed = CheckConfig {
        reply_delay: Duration::from_millis(300),
        ..cfg()
    };
    assert_only_fails(&b.check(&delayed), CheckId::Validity);
    let msg = format!("{}", b.check(&delayed));
    assert!(msg.contains("reply delay"), "{msg}");
    // Without the delay known, the same history passes.
    assert!(b.check(&cfg()).status(CheckId::Validity).is_ok());
}

#[test]
fn lost_increments_need_as_many_late_increments_of_the_paused_process() {
    // a (proc 1) increments once inside its window and once after it; b (proc 2) increments
    // twice. The counter lost one or two updates.
    let build = || {
        let mut b = B::default();
        b.acq(0, 1, 1, "a", 1, 1)
            .op(500, 1, "a", 1)
            .op(1500, 1, "a", 1);
        b.acq(1100, 1101, 2, "b", 2, 1)
            .op(1200, 2, "b", 2)
            .op(1300, 2, "b", 2)
            .rel(1400, 1401, 2, "b", 1);
        b
    };
    let cfg_with = |final_value: u64, procs: Vec<u32>| CheckConfig {
        counter: Some(CounterCheck {
            final_value,
            expected: CounterExpectation::AckedIncrementsLosingToLate { procs },
        }),
        expected_late: Some(ecosphere::history::ExpectedLate {
            procs: vec![1],
            max_ops: 1,
            reason: "a is paused across its deadline".into(),
        }),
        ..cfg()
    };
    // One lost, one late increment of proc 1: excused, as a warning.
    let r = build().check(&cfg_with(3, vec![1]));
    r.assert_ok();
    assert!(matches!(r.status(CheckId::Counter), Status::Warn(_)), "{r}");
    // Two lost for one late increment: a failure.
    assert_only_fails(&build().check(&cfg_with(2, vec![1])), CheckId::Counter);
    // The late increment is not of a process the scenario named: a failure.
    assert_only_fails(&build().check(&cfg_with(3, vec![2])), CheckId::Counter);
    // Nothing lost: a pass.
    let r = build().check(&cfg_with(4, vec![1]));
    assert_eq!(r.status(CheckId::Counter), &Status::Pass, "{r}");
}
