//! Scenario 5 (issue 4, reliability.md S9): the lock server hangs (SIGSTOP on redis-server).
//!
//! Worker A holds with renewal (command timeout 500 ms). The test SIGSTOPs the lock server and
//! then lets two waiter processes start against it (one `try_lock`, one `try_lock_for`). While
//! the server is stopped:
//! - every call returns within its own budget + the command timeout + slack (from the
//!   history: invoke → outcome of every acquire and of A's unlock);
//! - A's loss is signalled by its deadline (+ slack), reason `deadline_expired`.
//!
//! After SIGCONT (server time kept running, so the TTL has run out) the lock key disappears
//! within a lease and then stays absent for one more lease while A's client lives on:
//! nothing (renewal, a late acquire) re-creates it. Observer snapshots (`observe`) of that
//! period go into the history, and the checker's I8 covers them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::time::{Duration, Instant};

use ecosphere::clock::now_ns;
use ecosphere::history::{CheckConfig, CheckId, EventKind, Recorder};
use scenario::*;

const LEASE: Duration = Duration::from_millis(1500);
const RENEWAL: Duration = Duration::from_millis(500);
const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);
const BUDGET: Duration = Duration::from_millis(800);
/// Slack on every time bound of this scenario.
const SLACK: Duration = Duration::from_millis(500);
const HARNESS: u32 = 99;
const LOCK: &str = "hung";
const KEY: &str = "slate:{hung}";

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

#[test]
fn a_hung_server_bounds_every_call_and_resurrects_nothing() {
    let mut lock_server = server();
    let resource = server();
    let dir = tempfile::tempdir().expect("tempdir");
    let go_file = dir.path().join("go");
    let history = dir.path().join("history");
    std::fs::create_dir(&history).expect("history dir");
    let rec = Recorder::create(&history, HARNESS).expect("harness recorder");

    let mut a = Worker::new("hold", &lock_server, LOCK, &history);
    a.resource_url = Some(resource.url());
    a.lease = LEASE;
    a.renewal = Some(RENEWAL);
    a.command_timeout = Some(COMMAND_TIMEOUT);
    a.hold = Duration::from_secs(30);
    // A's client stays alive after its unlock, across the resume and the absence check.
    a.linger = Duration::from_secs(6);
    a.max_duration = Duration::from_secs(40);
    let mut holder = a.spawn(1);
    let holding = wait_line(&mut holder, 0, "HOLDING ", Duration::from_secs(20));
    let a_holder = holding.split(' ').nth(1).expect("holder").to_owned();

    let mut w = Worker::new("wait", &lock_server, LOCK, &history);
    w.lease = LEASE;
    w.renewal = Some(RENEWAL);
    w.command_timeout = Some(COMMAND_TIMEOUT);
    w.spin_wait = Some(Duration::from_millis(100));
    w.tasks = 2;
    w.hold = Duration::from_millis(10);
    // The waiters' clients stay alive across the resume too (a compensating release of a
    // timed-out acquire could still run).
    w.linger = Duration::from_secs(6);
    w.go_file = Some(go_file.clone());
    w.max_duration = Duration::from_secs(30);
    let mut w_try = w.clone();
    w_try.budget = Duration::ZERO;
    w_try.proc_base = 1;
    let mut w_for = w;
    w_for.budget = BUDGET;
    w_for.proc_base = 2;
    let mut try_waiters = w_try.spawn(1);
    let mut for_waiters = w_for.spawn(1);
    wait_line(&mut try_waiters, 0, "READY", Duration::from_secs(20));
    wait_line(&mut for_waiters, 0, "READY", Duration::from_secs(20));
    wait_history(&history, Duration::from_secs(10), "a renewal by A", |h| {
        h.events()
            .iter()
            .any(|e| e.proc == 0 && e.kind.name() == "renew_ok")
    });
    observe(&rec, &lock_server, LOCK, KEY);

    let t_stop = now_ns();
    lock_server.pause().expect("SIGSTOP redis-server");
    rec.record_at(
        t_stop,
        0,
        LOCK,
        EventKind::Nemesis {
            action: "sigstop_server".into(),
            target: "node:0".into(),
        },
    )
    .expect("record");
    go(&go_file);

    let lost = wait_line(&mut holder, 0, "LOST ", LEASE + Duration::from_secs(5));
    assert_eq!(lost, "LOST deadline_expired");
    let unlock = wait_line(&mut holder, 0, "UNLOCK ", Duration::from_secs(10));
    assert!(unlock.starts_with("UNLOCK error "), "{unlock}");
    for waiters in [&mut try_waiters, &mut for_waiters] {
        let done = wait_line(waiters, 0, "DONE ", Duration::from_secs(20));
        assert!(
            done.starts_with("DONE acquired=0 "),
            "acquired from a stopped server? {done}"
        );
    }

    let t_cont = now_ns();
    lock_server.resume().expect("SIGCONT redis-server");
    rec.record_at(
        t_cont,
        0,
        LOCK,
        EventKind::Nemesis {
            action: "sigcont_server".into(),
            target: "node:0".into(),
        },
    )
    .expect("record");
    // Gone within a lease of the resume (its TTL ran out while stopped; a late acquire that
    // ran after the resume leaves at most a lease-long ghost)...
    let gone = wait_for(
        LEASE + Duration::from_secs(3),
        "the lock key to vanish",
        || {
            let snap = observe(&rec, &lock_server, LOCK, KEY);
            match &snap.kind {
                EventKind::Observe {
                    pttl_ms: -2,
                    fields,
                    ..
                } if fields.is_empty() => Some(snap.t),
                _ => None,
            }
        },
    );
    // ...and nothing re-creates it for one more lease, A's client still running.
    let until = Instant::now() + LEASE;
    let mut snapshots = 0;
    while Instant::now() < until {
        let snap = observe(&rec, &lock_server, LOCK, KEY);
        snapshots += 1;
        assert!(
            matches!(&snap.kind, EventKind::Observe { pttl_ms: -2, fields, .. } if fields.is_empty()),
            "lock key re-created after the resume: {snap:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(snapshots > 5, "only {snapshots} snapshots in a lease");
    finish_ok(&mut holder, Duration::from_secs(20));
    finish_ok(&mut try_waiters, Duration::from_secs(20));
    finish_ok(&mut for_waiters, Duration::from_secs(20));

    let cfg = CheckConfig {
        quiescent_after: Some(gone),
        final_keys: Some(lock_keys(&lock_server)),
        ..CheckConfig::new(LEASE)
    };
    let (h, report) = check(&history, &cfg);
    report.assert_ok();
    report.assert_pass(&[CheckId::Validity, CheckId::Quiescence]);
    assert_single_holder_checks(&report);

    // Whatever the observer saw after the resume is a ghost of an acquire that timed out
    // client-side and ran when the server resumed (its holder named in the waiter's acq_info),
    // never A's entry brought back.
    let mut ghosts = std::collections::BTreeMap::new();
    for e in h.events().iter().filter(|e| e.t > t_cont) {
        if let EventKind::Observe { fields, .. } = &e.kind {
            for f in fields.keys() {
                assert_ne!(
                    f, &a_holder,
                    "A's entry resurrected after the resume: {e:?}"
                );
                ghosts.entry(f.clone()).or_insert(e.t);
            }
        }
    }
    for (field, seen) in &ghosts {
        let owner = h
            .events()
            .iter()
            .find(|e| matches!(&e.kind, EventKind::AcqInfo { reason, .. } if reason.contains(field.as_str())))
            .unwrap_or_else(|| panic!("field {field} after the resume belongs to no timed-out acquire"));
        println!(
            "ghost: {field} (proc {}'s timed-out acquire) seen {:+.1} ms after the resume",
            owner.proc,
            ms_between(t_cont, *seen)
        );
    }

    // Loss by the deadline (+ slack).
    let a_deadline = last_deadline(&h, &a_holder);
    let a_lost = h
        .events()
        .iter()
        .find(|e| e.proc == 0 && e.kind.name() == "lost")
        .expect("A logged its loss")
        .t;
    assert!(
        a_lost <= a_deadline + ns(SLACK),
        "loss signalled {:.1} ms after the deadline",
        ms_between(a_deadline, a_lost)
    );
    // Every call returned within its budget + one command timeout + slack.
    let mut report_lines = Vec::new();
    for (proc, attempt, t0, outcome, t1) in attempts(&h) {
        let budget = match proc {
            1 => Duration::ZERO,
            2 => BUDGET,
            _ => continue,
        };
        assert!(t0 >= t_stop, "waiter {proc} started before the stop");
        let took = ms_between(t0, t1);
        report_lines.push(format!("acquire p{proc}#{attempt} {outcome} {took:.1} ms"));
        assert!(
            t1 - t0 <= ns(budget + COMMAND_TIMEOUT + SLACK),
            "acquire by proc {proc} (budget {budget:?}) took {took:.1} ms"
        );
    }
    let rel_invoke = h
        .events()
        .iter()
        .find(|e| e.proc == 0 && e.kind.name() == "rel_invoke")
        .expect("A's unlock")
        .t;
    let rel_done = h
        .events()
        .iter()
        .find(|e| e.proc == 0 && matches!(e.kind.name(), "rel_ok" | "rel_fail" | "rel_info"))
        .expect("A's unlock outcome");
    assert_eq!(rel_done.kind.name(), "rel_info", "{:?}", rel_done.kind);
    let took = ms_between(rel_invoke, rel_done.t);
    report_lines.push(format!("unlock by A rel_info {took:.1} ms"));
    assert!(
        rel_done.t - rel_invoke <= ns(COMMAND_TIMEOUT + SLACK),
        "A's unlock took {took:.1} ms on the hung server"
    );
    println!(
        "stop at +0: A's deadline {:+.1} ms, loss {:+.1} ms, resume {:+.1} ms, key gone {:+.1} ms; \
         {}",
        ms_between(t_stop, a_deadline),
        ms_between(t_stop, a_lost),
        ms_between(t_stop, t_cont),
        ms_between(t_stop, gone),
        report_lines.join("; ")
    );
}
