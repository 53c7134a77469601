//! Scenario S9 variants (reliability.md §6.3, issue 7): the lock server freezes while A holds
//! and B waits, by `CLIENT PAUSE <ms> ALL` (connections accepted, commands held) or by
//! `DEBUG SLEEP` (the whole event loop blocked), for 0.5 × lease and for 2 × lease. (The
//! `SIGSTOP` variant is `s09_hung_server.rs`.)
//!
//! Worker A holds with renewal (lease 1.5 s, renewal 500 ms, command timeout 500 ms). Worker B
//! waits in one `try_lock_for` whose budget outlasts the freeze. Expected:
//!
//! - every call returns within its own bound: B's acquire within its budget + one command
//!   timeout + slack, A's unlock within one command timeout + slack (I7-L3); B's attempt that
//!   times out in the freeze may end its call with an error (`acq_info`, its ghost cleaned up
//!   or expiring); if B acquires, then only after A's release;
//! - **0.5 × lease**: A keeps the lock (a renewal after the freeze succeeds before the
//!   deadline), no loss, its unlock answers `ok 0`;
//! - **2 × lease**: A's loss is signalled by its deadline (+ slack), reason
//!   `deadline_expired` (I9); the commands the server held run when it wakes, yet nothing
//!   re-creates A's entry (observer snapshots for a lease after the freeze; a field seen then
//!   can only be a ghost of B's timed-out acquire, named in B's `acq_info`);
//! - the checker passes: I1, I3, validity accounting, I8 (no key left).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::time::{Duration, Instant};

use ecosphere::clock::now_ns;
use ecosphere::history::{CheckConfig, CheckId, EventKind, Recorder};
use ecosphere::server::RedisServer;
use scenario::*;

const LEASE: Duration = Duration::from_millis(1500);
const RENEWAL: Duration = Duration::from_millis(500);
const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);
/// Slack on every time bound of this scenario.
const SLACK: Duration = Duration::from_millis(500);
const HARNESS: u32 = 99;

#[derive(Clone, Copy, Debug)]
enum Freeze {
    ClientPause,
    DebugSleep,
}

fn freeze(fault: Freeze, factor_tenths: u32) {
    let lock_server = RedisServer::builder()
        .enable_debug_command(true)
        .start()
        .expect("start redis-server");
    let resource = server();
    let lock = match fault {
        Freeze::ClientPause => "client-pause",
        Freeze::DebugSleep => "debug-sleep",
    };
    let key = format!("slate:{{{lock}}}");
    let pause = LEASE * factor_tenths / 10;
    let long = pause > LEASE;
    let budget = pause + LEASE * 3;
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path();
    let rec = Recorder::create(history, HARNESS).expect("harness recorder");

    let mut a = Worker::new("hold", &lock_server, lock, history);
    a.resource_url = Some(resource.url());
    a.lease = LEASE;
    a.renewal = Some(RENEWAL);
    a.command_timeout = Some(COMMAND_TIMEOUT);
    a.hold = if long {
        Duration::from_secs(30)
    } else {
        pause + LEASE * 2
    };
    a.linger = if long { LEASE * 2 } else { Duration::ZERO };
    a.max_duration = Duration::from_secs(40);
    let mut holder = a.spawn(1);
    let holding = wait_line(&mut holder, 0, "HOLDING ", Duration::from_secs(20));
    let a_holder = holding.split(' ').nth(1).expect("holder").to_owned();

    let mut b = Worker::new("wait", &lock_server, lock, history);
    b.lease = LEASE;
    b.renewal = Some(RENEWAL);
    b.command_timeout = Some(COMMAND_TIMEOUT);
    b.spin_wait = Some(Duration::from_millis(100));
    b.budget = budget;
    b.hold = Duration::from_millis(50);
    // B's client lives on across the wake-up (a compensating release could still run).
    b.linger = LEASE * 2;
    b.proc_base = 1;
    b.max_duration = Duration::from_secs(40);
    let mut waiter = b.spawn(1);
    wait_line(&mut waiter, 0, "INVOKED 1", Duration::from_secs(20));
    wait_history(history, Duration::from_secs(5), "a renewal by A", |h| {
        h.events()
            .iter()
            .any(|e| e.proc == 0 && e.kind.name() == "renew_ok")
    });

    let t_freeze = now_ns();
    let started = Instant::now();
    match fault {
        Freeze::ClientPause => lock_server.client_pause(pause).expect("CLIENT PAUSE"),
        Freeze::DebugSleep => lock_server.debug_sleep(pause).expect("DEBUG SLEEP"),
    }
    nemesis(
        &rec,
        t_freeze,
        lock,
        match fault {
            Freeze::ClientPause => "client_pause_all",
            Freeze::DebugSleep => "debug_sleep",
        },
        &format!("node:0 {pause:?}"),
    );
    // The harness's own commands would wait too: nothing is sent until the freeze ends (a
    // fault duration, not a wait for a condition).
    if long {
        let lost = wait_line(&mut holder, 0, "LOST ", LEASE + SLACK * 2);
        assert_eq!(lost, "LOST deadline_expired");
        let unlock = wait_line(&mut holder, 0, "UNLOCK ", COMMAND_TIMEOUT + SLACK * 2);
        assert!(unlock.starts_with("UNLOCK "), "{unlock}");
    }
    std::thread::sleep((started + pause).saturating_duration_since(Instant::now()));
    let t_wake = now_ns();
    nemesis(&rec, t_wake, lock, "freeze_over", "node:0");

    if long {
        // Nothing re-creates A's entry once the server runs again, A's client still alive.
        let until = Instant::now() + LEASE;
        let mut snapshots = 0;
        while Instant::now() < until {
            let snap = observe(&rec, &lock_server, lock, &key);
            if let EventKind::Observe { fields, .. } = &snap.kind {
                assert!(
                    !fields.contains_key(&a_holder),
                    "A's entry alive or resurrected after the freeze: {snap:?}"
                );
            }
            snapshots += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(snapshots > 5, "only {snapshots} snapshots in a lease");
    } else {
        let unlock = wait_line(&mut holder, 0, "UNLOCK ", LEASE * 4);
        assert_eq!(
            unlock, "UNLOCK ok 0",
            "A kept the lock through a short freeze"
        );
    }
    let a_out = finish_ok(&mut holder, Duration::from_secs(20)).remove(0);
    let b_out = finish_ok(&mut waiter, Duration::from_secs(20)).remove(0);
    if !long {
        assert!(!a_out.stdout.contains("LOST"), "{}", a_out.stdout);
    }

    let cfg = CheckConfig {
        final_keys: Some(lock_keys(&lock_server)),
        ..CheckConfig::new(LEASE)
    };
    let (h, report) = check(history, &cfg);
    report.assert_ok();
    report.assert_pass(&[CheckId::Validity, CheckId::Quiescence]);
    assert_single_holder_checks(&report);

    // Every acquire call within its budget + one command timeout + slack.
    let mut lines = Vec::new();
    for (proc, attempt, t0, outcome, t1) in attempts(&h) {
        let bound = if proc == 1 { budget } else { Duration::ZERO };
        let took = ms_between(t0, t1);
        lines.push(format!("acquire p{proc}#{attempt} {outcome} {took:.1} ms"));
        if proc == 1 {
            assert!(
                t1 - t0 <= ns(bound + COMMAND_TIMEOUT + SLACK),
                "B's acquire (budget {bound:?}) took {took:.1} ms"
            );
        }
    }
    let rel_invoke = first_of(&h, 0, "rel_invoke").expect("A's unlock");
    let rel_done = h
        .events()
        .iter()
        .find(|e| e.proc == 0 && matches!(e.kind.name(), "rel_ok" | "rel_fail" | "rel_info"))
        .expect("A's unlock outcome");
    let took = ms_between(rel_invoke.t, rel_done.t);
    lines.push(format!("unlock by A {} {took:.1} ms", rel_done.kind.name()));
    assert!(
        rel_done.t - rel_invoke.t <= ns(COMMAND_TIMEOUT + SLACK),
        "A's unlock took {took:.1} ms"
    );
    let b_ok = first_of(&h, 1, "acq_ok");
    if long {
        let a_deadline = last_deadline(&h, &a_holder);
        let a_lost = first_of(&h, 0, "lost").expect("A's loss logged");
        assert!(
            a_lost.t <= a_deadline + ns(SLACK),
            "loss signalled {:.1} ms after the deadline",
            ms_between(a_deadline, a_lost.t)
        );
        lines.push(format!(
            "A's deadline {:+.1} ms, loss {:+.1} ms",
            ms_between(t_freeze, a_deadline),
            ms_between(t_freeze, a_lost.t)
        ));
        // Fields seen after the wake-up belong to B (its grant, or a ghost of a timed-out
        // attempt named in its acq_info), never to A.
        for e in h.events().iter().filter(|e| e.t > t_wake) {
            if let EventKind::Observe { fields, .. } = &e.kind {
                for f in fields.keys() {
                    let b_field = h.events().iter().any(|x| {
                        x.proc == 1
                            && (x.kind.holder() == Some(f.as_str())
                                || matches!(&x.kind, EventKind::AcqInfo { reason, .. } if reason.contains(f.as_str())))
                    });
                    assert!(b_field, "field {f} after the freeze is not B's: {e:?}");
                }
            }
        }
    } else {
        // B's attempt that timed out in the freeze ends its call with an error (the library
        // reports it rather than waiting out the budget); if it did acquire, then after A.
        if let Some(b_ok) = b_ok {
            assert!(b_ok.t > rel_invoke.t, "B acquired before A released");
        }
        assert_eq!(report.stats.losses, 0);
    }
    println!(
        "{fault:?} for {pause:?} at +0: wake {:+.1} ms; {}; B: {}",
        ms_between(t_freeze, t_wake),
        lines.join("; "),
        b_out
            .stdout_lines()
            .find(|l| l.starts_with("DONE"))
            .unwrap_or("no DONE")
    );
}

#[test]
fn s9_client_pause_half_lease_keeps_the_lock() {
    freeze(Freeze::ClientPause, 5);
}

#[test]
#[cfg_attr(
    not(feature = "full-matrix"),
    ignore = "full matrix: cargo test -p ecosphere --features full-matrix"
)]
fn s9_client_pause_two_leases_loses_at_the_deadline() {
    freeze(Freeze::ClientPause, 20);
}

#[test]
#[cfg_attr(
    not(feature = "full-matrix"),
    ignore = "full matrix: cargo test -p ecosphere --features full-matrix"
)]
fn s9_debug_sleep_half_lease_keeps_the_lock() {
    freeze(Freeze::DebugSleep, 5);
}

#[test]
fn s9_debug_sleep_two_leases_loses_at_the_deadline() {
    freeze(Freeze::DebugSleep, 20);
}
