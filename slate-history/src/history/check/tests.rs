use super::*;

fn win(deadline: u64, close: Option<(u64, usize, Cause)>) -> Win {
    Win {
        permits: 1,
        lock: 0,
        holder: 0,
        start: 10,
        start_idx: 0,
        deadline,
        deadline_idx: 1,
        close,
    }
}

#[test]
fn window_end_is_the_earlier_of_close_and_deadline() {
    assert_eq!(win(100, None).end(), (100, 1, Cause::Deadline));
    assert_eq!(
        win(100, Some((50, 7, Cause::Release))).end(),
        (50, 7, Cause::Release)
    );
    assert_eq!(
        win(100, Some((150, 7, Cause::Lost))).end(),
        (100, 1, Cause::Deadline)
    );
    // A tie goes to the deadline.
    assert_eq!(
        win(100, Some((100, 7, Cause::Lost))).end(),
        (100, 1, Cause::Deadline)
    );
    // A killed holder's window runs to its deadline, however early the kill.
    assert_eq!(
        win(100, Some((50, 7, Cause::Kill))).end(),
        (100, 1, Cause::Kill)
    );
}

#[test]
fn tally_keeps_the_first_finding_and_counts_all() {
    let mut t = Tally::default();
    for n in 0..3 {
        t.add(|| Finding {
            message: format!("{n}"),
            events: vec![],
            anchor: n,
        });
    }
    assert_eq!(t.count, 3);
    assert_eq!(t.first.map(|f| f.message), Some("0".to_owned()));
}

#[test]
fn durations_format_as_milliseconds() {
    assert_eq!(ms(1_234_567), "1.234567ms");
    assert_eq!(ms(0), "0.000000ms");
    assert_eq!(dur_ns(Duration::from_millis(3)), 3_000_000);
    assert_eq!(dur_ns(Duration::MAX), u64::MAX);
}

fn fw(t: u64, lock: &str, holder: &str, token: u64, outcome: FencedOutcome) -> Event {
    Event::new(
        t,
        0,
        0,
        lock,
        EventKind::ResOp {
            holder: holder.into(),
            token,
            op: OP_FENCED_WRITE.into(),
            outcome: outcome.to_outcome(),
            invoked: None,
        },
    )
}

fn acc(seq: u64) -> FencedOutcome {
    FencedOutcome::Accepted { seq }
}

/// Checks fenced writes alone: they have no windows, which the activity check is told.
fn i2(events: Vec<Event>) -> Report {
    let cfg = CheckConfig {
        expected_late: Some(ExpectedLate {
            procs: vec![0, 1],
            max_ops: 100,
            reason: "I2 unit tests log writes without windows".into(),
        }),
        ..CheckConfig::default()
    };
    check(&History::from_events(events), &cfg)
}

#[test]
fn i2_passes_non_decreasing_tokens_in_accept_order() {
    // Equal tokens (one holder's several writes) are fine; a rejected lower token is too.
    let r = i2(vec![
        fw(10, "l", "a", 3, acc(1)),
        fw(20, "l", "a", 3, acc(2)),
        fw(30, "l", "b", 5, acc(3)),
        fw(40, "l", "a", 3, FencedOutcome::Rejected { max: 5 }),
        fw(
            45,
            "l",
            "a",
            3,
            FencedOutcome::Unknown { error: "x".into() },
        ),
        fw(50, "l", "b", 5, acc(4)),
    ]);
    assert_eq!(r.status(CheckId::FencedOrder), &Status::Pass, "{r}");
    assert_eq!((r.stats.fenced_accepted, r.stats.fenced_rejected), (4, 1));
}

#[test]
fn i2_fails_a_lower_token_accepted_after_a_higher_one() {
    let r = i2(vec![
        fw(10, "l", "a", 3, acc(1)),
        fw(20, "l", "b", 5, acc(2)),
        fw(30, "l", "a", 3, acc(3)),
        fw(40, "l", "a", 2, acc(4)),
    ]);
    assert!(!r.is_ok());
    assert_eq!(r.failed(), vec![CheckId::FencedOrder], "{r}");
    let res = r.result(CheckId::FencedOrder).expect("I2 present");
    assert_eq!(res.violations, 2, "{r}");
    let cx = r
        .status(CheckId::FencedOrder)
        .counterexample()
        .expect("counterexample");
    assert!(
        cx.message.contains("token 3") && cx.message.contains("token 5"),
        "{r}"
    );
    assert_eq!(cx.events.len(), 2);
}

#[test]
fn i2_uses_the_accept_order_not_the_reply_time() {
    // The replies arrive in the other order than F accepted them: still legal.
    let ok = i2(vec![
        fw(10, "l", "b", 5, acc(2)),
        fw(20, "l", "a", 3, acc(1)),
    ]);
    assert_eq!(ok.status(CheckId::FencedOrder), &Status::Pass, "{ok}");
    // Time order looks fine, accept order is not.
    let bad = i2(vec![
        fw(10, "l", "a", 3, acc(2)),
        fw(20, "l", "b", 5, acc(1)),
    ]);
    assert_eq!(bad.failed(), vec![CheckId::FencedOrder], "{bad}");
}

#[test]
fn i2_keeps_locks_apart_and_is_unchecked_without_fenced_writes() {
    let r = i2(vec![
        fw(10, "x", "a", 9, acc(1)),
        fw(20, "y", "b", 1, acc(1)),
    ]);
    assert_eq!(r.status(CheckId::FencedOrder), &Status::Pass, "{r}");
    let empty = i2(vec![]);
    assert!(
        matches!(empty.status(CheckId::FencedOrder), Status::Unchecked(_)),
        "{empty}"
    );
}

fn grant(t: u64, p: u32, holder: &str, token: u64) -> Event {
    Event::new(
        t,
        p,
        0,
        "l",
        EventKind::AcqOk {
            attempt: token,
            holder: holder.into(),
            token,
            depth: 1,
            deadline: t + 1_000,
            nodes: vec![],
            permits: None,
        },
    )
}

fn sent_at(mut e: Event, sent: u64) -> Event {
    if let EventKind::ResOp { invoked, .. } = &mut e.kind {
        *invoked = Some(sent);
    }
    e
}

#[test]
fn i2_fails_a_stale_token_sent_after_a_newer_grant_and_accepted() {
    // a (token 1) sends its write after b's grant of token 2 was acknowledged; the
    // resource accepts it because b has not written yet.
    let stale = i2(vec![
        grant(10, 0, "a", 1),
        grant(50, 1, "b", 2),
        sent_at(fw(60, "l", "a", 1, acc(1)), 55),
        sent_at(fw(70, "l", "b", 2, acc(2)), 65),
    ]);
    assert!(stale.failed().contains(&CheckId::FencedOrder), "{stale}");
    // Sent before the newer grant: the hazard fencing cannot see, not a violation.
    let early = i2(vec![
        grant(10, 0, "a", 1),
        grant(50, 1, "b", 2),
        sent_at(fw(60, "l", "a", 1, acc(1)), 45),
        sent_at(fw(70, "l", "b", 2, acc(2)), 65),
    ]);
    assert_eq!(early.status(CheckId::FencedOrder), &Status::Pass, "{early}");
    // One token accepted from two holders.
    let shared = i2(vec![
        fw(60, "l", "a", 3, acc(1)),
        fw(70, "l", "b", 3, acc(2)),
    ]);
    assert_eq!(shared.failed(), vec![CheckId::FencedOrder], "{shared}");
}

#[test]
fn moved_deadline_keeps_the_latest_belief() {
    // Later: taken.
    assert_eq!(moved_deadline(100, 150, 50), 150);
    // Earlier, learned at 60 while 100 was believed: counts from 60.
    assert_eq!(moved_deadline(100, 40, 60), 60);
    // Earlier, but above the time it was learned: the new deadline.
    assert_eq!(moved_deadline(100, 80, 60), 80);
    // Learned after the old deadline had passed: the old one stands.
    assert_eq!(moved_deadline(100, 40, 120), 100);
}

#[test]
fn config_defaults() {
    let c = CheckConfig::new(Duration::from_secs(2));
    assert_eq!(c.zombie_grace, Duration::from_secs(2));
    assert_eq!(c.deadline_tolerance, Duration::from_millis(1));
    assert_eq!(CheckConfig::default().lease, None);
}

/// One hold of `holder` (proc `p`) with `permits`, from `t` to `t + len` ms.
fn hold(p: u32, holder: &str, token: u64, permits: u64, t: u64, len: u64) -> Vec<Event> {
    let ms = 1_000_000;
    vec![
        Event::new(
            t * ms,
            p,
            0,
            "rw",
            EventKind::AcqInvoke {
                attempt: token,
                budget_ms: None,
            },
        ),
        Event::new(
            t * ms + 1,
            p,
            0,
            "rw",
            EventKind::AcqOk {
                attempt: token,
                holder: holder.into(),
                token,
                depth: 1,
                deadline: (t + 10_000) * ms,
                nodes: vec![],
                permits: Some(permits),
            },
        ),
        Event::new(
            (t + len) * ms,
            p,
            0,
            "rw",
            EventKind::RelInvoke {
                holder: holder.into(),
                depth_before: 1,
            },
        ),
        Event::new(
            (t + len) * ms + 1,
            p,
            0,
            "rw",
            EventKind::RelOk {
                holder: holder.into(),
                depth_after: 0,
            },
        ),
    ]
}

fn shared(mut events: Vec<Event>, capacity: u64) -> Report {
    events.sort_by_key(|e| e.t);
    let cfg = CheckConfig {
        capacity: Some(capacity),
        ..CheckConfig::default()
    };
    check(&History::from_events(events), &cfg)
}

const W: u64 = 1 << 30;

#[test]
fn shared_mode_lets_readers_overlap_and_catches_a_writer_among_them() {
    let readers = [hold(1, "r1", 1, 1, 0, 50), hold(2, "r2", 2, 1, 10, 50)].concat();
    let ok = shared(readers.clone(), W);
    assert_eq!(ok.status(CheckId::Exclusion), &Status::Pass, "{ok}");
    assert_eq!(ok.status(CheckId::Tokens), &Status::Pass, "{ok}");
    // A writer that starts while r2 still reads.
    let bad = shared([readers, hold(3, "w", 3, W, 40, 10)].concat(), W);
    assert_eq!(bad.failed(), vec![CheckId::Exclusion], "{bad}");
    assert!(format!("{bad}").contains("permits in use"), "{bad}");
    // The same writer after both readers left passes.
    let after = shared(
        [hold(1, "r1", 1, 1, 0, 50), hold(3, "w", 3, W, 60, 10)].concat(),
        W,
    );
    assert_eq!(after.status(CheckId::Exclusion), &Status::Pass, "{after}");
}

#[test]
fn shared_mode_counts_permits_against_the_capacity() {
    let three = [hold(1, "a", 1, 2, 0, 50), hold(2, "b", 2, 1, 5, 50)].concat();
    assert_eq!(
        shared(three.clone(), 3).status(CheckId::Exclusion),
        &Status::Pass
    );
    let four = shared([three, hold(3, "c", 3, 1, 10, 5)].concat(), 3);
    assert_eq!(four.failed(), vec![CheckId::Exclusion], "{four}");
}

#[test]
fn shared_mode_tokens_must_exceed_every_token_acknowledged_before_the_invoke() {
    // Two readers whose replies cross: token order differs from reply order, fine.
    let mut crossed = hold(1, "r1", 2, 1, 0, 50);
    crossed.extend(hold(2, "r2", 1, 1, 0, 50));
    assert_eq!(shared(crossed, W).status(CheckId::Tokens), &Status::Pass);
    // A writer invoked after a reader was acknowledged with a higher token.
    let bad = shared(
        [hold(1, "r1", 5, 1, 0, 10), hold(2, "w", 4, W, 20, 10)].concat(),
        W,
    );
    assert_eq!(bad.failed(), vec![CheckId::Tokens], "{bad}");
    // Readers sharing one Redis hold share its token: fine. A reader below an earlier
    // writer's token is not.
    let same = shared(
        [hold(1, "r1", 5, 1, 0, 10), hold(1, "r2", 5, 1, 20, 10)].concat(),
        W,
    );
    assert_eq!(same.status(CheckId::Tokens), &Status::Pass, "{same}");
    let stale = shared(
        [hold(1, "w", 5, W, 0, 10), hold(2, "r", 4, 1, 20, 10)].concat(),
        W,
    );
    assert_eq!(stale.failed(), vec![CheckId::Tokens], "{stale}");
}
