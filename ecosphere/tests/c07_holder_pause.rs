//! Combination lock, reliability.md C7: the holder is paused longer than its lease.
//!
//! Scenario: N = 3, lease L = 1 s. Worker A (`hold`, every 50 ms one write to the fenced
//! resource F and one GET-then-SET increment of the unfenced counter U, both on a separate
//! resource server) holds every node. Worker B waits for the lock (`hold`).
//!
//! Fault: the test SIGSTOPs A for 2.5 L.
//!
//! Expected: all of A's entries expire; B acquires every node after A's deadline, while A is
//! still stopped. On resume A reports the loss (`LOST`, `lost` event), its late write with the
//! lost token is rejected by F (B's token is greater), and its unlock (held back by the test
//! until B's entries were inspected) answers *not held* and deletes nothing of B's on any node
//! (each node's hash is exactly B's field, count 1, PTTL > 0, after A's unlock). Losing
//! increments of U to the pause is allowed (U is unfenced), but only with an operation of A
//! past its validity.
//!
//! Invariants: I1 exclusion, I3 tokens, I5 ownership, I6, validity accounting, I8 quiescence,
//! I2 fenced order (checker); I4(F) (F's log holds every accepted write); I9 (loss reported by
//! max(deadline, resume) + one renewal period).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ecosphere::history::{
    CheckConfig, CheckId, EventKind, FencedOutcome, OP_INCR, OUTCOME_OK, Recorder,
};
use ecosphere::server::RedisServer;
use scenario::*;

const LEASE: Duration = Duration::from_secs(1);
const RENEWAL: Duration = Duration::from_millis(333);
/// Slack on "the loss is reported by resume + one renewal period".
const SLACK: Duration = Duration::from_millis(500);
const NAME: &str = "c7";
const F: &str = "F";
const HARNESS: u32 = 99;

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).expect("ns")
}

fn nemesis(rec: &Recorder, t: u64, action: &str) {
    rec.record_at(
        t,
        0,
        NAME,
        EventKind::Nemesis {
            action: action.into(),
            target: "0".into(),
        },
    )
    .expect("record nemesis");
}

#[test]
fn c7_holder_paused_past_its_lease_loses_every_node_and_its_release_deletes_nothing() {
    let s = servers(3);
    let resource = RedisServer::start().expect("resource server");
    block_on(adopt(&urls(&s)));
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path().join("history");
    std::fs::create_dir(&history).expect("history dir");
    let unlock_file = dir.path().join("unlock-a");

    let mut a = Worker::nodes("hold", urls(&s), NAME, &history);
    a.renewal = Some(RENEWAL);
    a.node_op = Some(Duration::from_millis(250));
    a.hold = Duration::from_secs(30);
    a.resource_url = Some(resource.url());
    a.fenced_key = Some(F.to_owned());
    a.late_write = true;
    a.unlock_file = Some(unlock_file.clone());
    let mut holder = a.spawn(1);
    let a_holding = wait_line(&mut holder, 0, "HOLDING ", Duration::from_secs(20));
    let a_holder = a_holding.split(' ').nth(1).expect("holder").to_owned();
    for (i, x) in s.iter().enumerate() {
        assert!(entries(x, NAME).contains_key(&a_holder), "A holds node {i}");
    }

    let mut b = a.clone();
    b.proc_base = 1;
    b.hold = Duration::from_secs(4);
    b.spin_wait = Some(Duration::from_millis(200));
    b.late_write = false;
    b.unlock_file = None;
    let mut other = b.spawn(1);
    wait_line(&mut other, 0, "READY", Duration::from_secs(20));
    wait_for(Duration::from_secs(10), "B waiting", || {
        let h = ecosphere::history::History::load(&history).expect("history");
        h.events()
            .iter()
            .any(|e| e.proc == 1 && e.kind.name() == "acq_invoke")
            .then_some(())
    });

    let rec = Recorder::create(&history, HARNESS).expect("harness recorder");
    let stop_at = Instant::now();
    let t_stop = now();
    holder.pause(0).expect("SIGSTOP A");
    nemesis(&rec, t_stop, "sigstop_worker");

    let b_holding = wait_line(&mut other, 0, "HOLDING ", LEASE + Duration::from_secs(5));
    let b_holder = b_holding.split(' ').nth(1).expect("holder").to_owned();
    let only_b = BTreeMap::from([(b_holder.clone(), 1)]);
    for (i, x) in s.iter().enumerate() {
        assert_eq!(entries(x, NAME), only_b, "node {i} while A is stopped");
    }
    // The pause lasts 2.5 leases: a fault duration, not a wait for some condition.
    std::thread::sleep((stop_at + LEASE * 5 / 2).saturating_duration_since(Instant::now()));
    let t_cont = now();
    holder.resume(0).expect("SIGCONT A");
    nemesis(&rec, t_cont, "sigcont_worker");

    let lost = wait_line(&mut holder, 0, "LOST ", Duration::from_secs(5));
    let late = wait_line(&mut holder, 0, "LATE ", Duration::from_secs(5));
    wait_line(&mut holder, 0, "UNLOCK_WAIT", Duration::from_secs(5));
    assert_eq!(late, "LATE rejected", "F rejects A's late write");
    for (i, x) in s.iter().enumerate() {
        assert_eq!(entries(x, NAME), only_b, "node {i} before A's unlock");
    }
    std::fs::write(&unlock_file, b"unlock").expect("unlock file");
    let unlock = wait_line(&mut holder, 0, "UNLOCK ", Duration::from_secs(5));
    assert_eq!(unlock, "UNLOCK not_held", "A's unlock after the loss");
    // B is still inside its 4 s hold: A's reverse-order release deleted nothing of B's.
    for (i, x) in s.iter().enumerate() {
        assert_eq!(entries(x, NAME), only_b, "node {i} after A's unlock");
        assert!(pttl(x, NAME) > 0, "node {i}: B's entry has a lease");
    }

    finish_ok(&mut holder, Duration::from_secs(20)).remove(0);
    let b_out = finish_ok(&mut other, Duration::from_secs(20)).remove(0);
    assert!(
        b_out.stdout.contains("UNLOCK ok 0"),
        "B's release: {}",
        b_out.stdout
    );

    let left = wait_quiet(&s, LEASE);
    let counter: u64 = {
        let v: Option<u64> =
            redis::from_redis_value(resource.command(&["GET", "counter"]).expect("GET"))
                .expect("int");
        v.unwrap_or(0)
    };
    let cfg = CheckConfig {
        final_keys: Some(left),
        ..CheckConfig::new(LEASE)
    }
    .with_paused_holder(0, counter);
    let (h, report) = check(&history, &cfg);
    report.assert_ok();
    // A and B acquire once each; B is the only waiter (A held before it invoked).
    report.assert_contention(2, 1, 1);
    report.assert_pass(&[
        CheckId::Exclusion,
        CheckId::Tokens,
        CheckId::Ownership,
        CheckId::Validity,
        CheckId::Quiescence,
        CheckId::FencedOrder,
    ]);
    report.assert_pass_or_unchecked(CheckId::Reentry, "this scenario never re-enters");
    assert_fenced_kept_everything(&h, &resource, F);

    // U: lost increments only one for one with A's increments past its validity (the pause
    // hazard), which the checker's counter check enforces.
    let acked = h
        .events()
        .iter()
        .filter(|e| {
            matches!(&e.kind, EventKind::ResOp { op, outcome, .. }
                if op == OP_INCR && outcome == OUTCOME_OK)
        })
        .count() as u64;
    assert!(
        counter <= acked,
        "counter {counter} above {acked} increments"
    );

    let first = |proc: u32, kind: &str| {
        h.events()
            .iter()
            .find(|e| e.proc == proc && e.kind.name() == kind)
            .unwrap_or_else(|| panic!("no {kind} of proc {proc}"))
    };
    let (a_lost, b_ok) = (first(0, "lost"), first(1, "acq_ok"));
    let a_deadline = h
        .events()
        .iter()
        .filter(|e| e.proc == 0)
        .filter_map(|e| match &e.kind {
            EventKind::AcqOk { deadline, .. } | EventKind::RenewOk { deadline, .. } => {
                Some(*deadline)
            }
            _ => None,
        })
        .max()
        .expect("A's deadline");
    let (a_token, b_token, b_nodes) = match (&first(0, "acq_ok").kind, &b_ok.kind) {
        (
            EventKind::AcqOk { token: ta, .. },
            EventKind::AcqOk {
                token: tb, nodes, ..
            },
        ) => (*ta, *tb, nodes.clone()),
        _ => unreachable!("acq_ok events"),
    };
    assert_eq!(b_nodes, vec![0, 1, 2], "B acquired every node");
    assert!(b_token > a_token, "B's token {b_token} after A's {a_token}");
    assert!(b_ok.t >= a_deadline, "B acquired inside A's lease");
    assert!(b_ok.t < t_cont, "B acquired only after A resumed");
    // I9: the loss is reported by max(deadline, resume) + one renewal period (+ slack).
    assert!(
        a_lost.t <= a_deadline.max(t_cont) + ns(RENEWAL + SLACK),
        "A's loss logged {} ms after the resume",
        (a_lost.t.saturating_sub(t_cont)) / 1_000_000
    );
    // A's late write carried the lost token and F rejected it.
    let a_writes = fenced_writes(&h);
    let late_write = a_writes
        .iter()
        .rev()
        .find(|w| w.0 == 0)
        .expect("A's fenced writes");
    assert_eq!(late_write.1, a_token);
    assert!(
        matches!(late_write.2, FencedOutcome::Rejected { max } if max >= b_token),
        "A's late write: {:?}",
        late_write.2
    );
    assert!(
        h.events()
            .iter()
            .any(|e| e.proc == 0 && matches!(e.kind, EventKind::RelFail { not_held: true, .. })),
        "A's rel_fail{{not_held}}"
    );
    println!(
        "stop at +0: A's deadline {:+} ms, B acquired {:+} ms, resume {:+} ms, A {lost} at {:+} \
         ms; counter {counter} of {acked} increments; {} operations past validity",
        (a_deadline as i128 - t_stop as i128) / 1_000_000,
        (b_ok.t as i128 - t_stop as i128) / 1_000_000,
        (t_cont as i128 - t_stop as i128) / 1_000_000,
        (a_lost.t as i128 - t_stop as i128) / 1_000_000,
        report.stats.activity_past_validity
    );
}
