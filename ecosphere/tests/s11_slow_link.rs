//! Scenario S11 (c)/(d) (reliability.md §6.3, issue 7): a slow link between the client and the
//! lock server, made with [`ecosphere::proxy::FaultProxy`] in `Delay` mode (every chunk
//! delayed by the given time in its direction).
//!
//! Lease L = 1 s, renewal L/5, command timeout 2 s (above every delay, so that the delay, not
//! the timeout, decides). Worker A (`hold`, uncontended: one remote attempt) talks to the lock
//! server only through the proxy; the delay is switched on after A has connected.
//!
//! - **Acquire under delay** — (c) per-command delay of the requests of 0.3 L, 0.6 L and
//!   1.2 L, (d) delay of the replies only, 0.6 L: the acquisition succeeds only with enough
//!   validity left (the checker's `min_validity` = L/10 at `acq_ok`); its deadline is at most
//!   the send time of the first command + L (`strict_invoke_bound`: `acq_ok.deadline ≤
//!   acq_invoke.t + L`). 0.3 L and both 0.6 L variants run in the smoke subset, 1.2 L in the
//!   full matrix.
//!   - 0.3 L: validity ≈ 0.7 L at the grant; a renewal (round trip 0.3 L) sent a renewal
//!     period later still completes in time, so renewals keep the lock through a hold of
//!     1.5 L and the release answers `ok 0`;
//!   - 0.6 L (requests or replies): validity ≈ 0.4 L at the grant, shorter than any renewal's
//!     round trip: the renewal is slower than the remaining validity, so A reports the loss
//!     (`deadline_expired`) by its deadline + slack (I9);
//!   - 0.2 L of the replies only: renewals get through, and the checker is told the delay
//!     (`CheckConfig::reply_delay`), so each renewed deadline must be at most `renew_ok.t −
//!     0.2 L + L`, its send time + L: a lease counted from the reply fails validity;
//!   - 1.2 L: no usable grant exists: A must not be handed the lock with less than the
//!     minimum validity; its `lock()` fails (`ACQUIRE error`, an `acq_info`) and nothing is
//!     left behind. (Before slate-redis 9c5aee7 it returned a guard with −215 ms of validity.)
//! - **Renewal slower than the remaining validity** (smoke): A holds over a fast link, then
//!   the requests are delayed by 1.2 L: no renewal can complete before the deadline, so A
//!   reports the loss (`deadline_expired`) by its deadline + slack (I9).
//!
//! Invariants: validity accounting (§7.5), I1, I5, I9.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::time::Duration;

use ecosphere::clock::now_ns;
use ecosphere::history::{CheckConfig, CheckId, EventKind, Recorder, Status};
use ecosphere::proxy::{FaultProxy, Mode};
use scenario::*;

const LEASE: Duration = Duration::from_secs(1);
const RENEWAL: Duration = Duration::from_millis(200);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// Slack on the loss-report bound.
const SLACK: Duration = Duration::from_millis(300);
const HARNESS: u32 = 99;

fn delay(to_server: Duration, to_client: Duration) -> Mode {
    Mode::Delay {
        to_server,
        to_client,
    }
}

fn worker(
    lock_server: &ecosphere::server::RedisServer,
    proxy: &FaultProxy,
    lock: &str,
    dir: &std::path::Path,
) -> Worker {
    let mut a = Worker::new("hold", lock_server, lock, dir);
    a.redis_url = vec![proxy.url()];
    a.lease = LEASE;
    a.renewal = Some(RENEWAL);
    a.command_timeout = Some(COMMAND_TIMEOUT);
    a.max_duration = Duration::from_secs(40);
    a
}

/// The checker's configuration; `reply_delay` is the proxy's delay on every reply, so that
/// each renewal's deadline is bounded from `renew_ok.t − reply_delay` (its send at the latest).
fn cfg(lock_server: &ecosphere::server::RedisServer, reply_delay: Duration) -> CheckConfig {
    CheckConfig {
        min_validity: LEASE / 10,
        strict_invoke_bound: true,
        reply_delay,
        final_keys: Some(lock_keys(lock_server)),
        ..CheckConfig::new(LEASE)
    }
}

/// Acquire and hold 1.5 L with every request and/or reply delayed as `mode` says.
fn acquire_through(mode: Mode) {
    let lock_server = server();
    let proxy = FaultProxy::start(lock_server.addr()).expect("proxy");
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path();
    let mut a = worker(&lock_server, &proxy, "slow", history);
    a.hold = LEASE * 3 / 2;
    let go_file = history.join("go");
    a.go_file = Some(go_file.clone());
    let mut holder = a.spawn(1);
    wait_line(&mut holder, 0, "READY", Duration::from_secs(20));
    proxy.set_mode(mode).expect("delay");
    go(&go_file);
    let out = holder
        .wait_all(Duration::from_secs(30))
        .expect("A finishes")
        .remove(0);
    println!("{}", out.stdout);
    assert!(
        out.status.success(),
        "A failed: {}\n{}",
        out.stdout,
        out.stderr
    );
    // I8 holds after L + ε: a give-back may still be in flight through the slow proxy.
    wait_for(LEASE * 2, "the lock keys to go", || {
        lock_keys(&lock_server).is_empty().then_some(())
    });
    let Mode::Delay {
        to_server,
        to_client,
    } = mode
    else {
        unreachable!("a delay mode")
    };
    let (h, report) = check(history, &cfg(&lock_server, to_client));
    report.assert_ok();
    assert_eq!(report.status(CheckId::Quiescence), &Status::Pass);
    let acq = h.events().iter().find_map(|e| match &e.kind {
        EventKind::AcqOk { deadline, .. } => Some((e.t, *deadline)),
        _ => None,
    });
    if acq.is_some() {
        report.assert_pass(&[CheckId::Validity]);
        report.assert_pass_or_unchecked(
            CheckId::Exclusion,
            "a single holder in this scenario: nobody to overlap with",
        );
    }
    let invoke = first_of(&h, 0, "acq_invoke").expect("acq_invoke").t;
    let rtt = to_server + to_client;
    if rtt * 10 >= LEASE * 9 {
        // No grant (the checker would also fail one with validity below L/10).
        assert!(
            acq.is_none(),
            "handed the lock over a link slower than the lease: {acq:?}"
        );
        assert!(out.stdout.contains("ACQUIRE error "), "{}", out.stdout);
        println!(
            "{mode:?}: not acquired ({})",
            out.stdout.replace('\n', " | ")
        );
        return;
    }
    let (t, deadline) = acq.expect("acquired with enough validity");
    let validity = Duration::from_nanos(deadline.saturating_sub(t));
    let renewals = h
        .events()
        .iter()
        .filter(|e| e.kind.name() == "renew_ok")
        .count();
    if rtt + RENEWAL < validity {
        assert!(out.stdout.contains("UNLOCK ok 0"), "{}", out.stdout);
        assert!(!out.stdout.contains("LOST"), "{}", out.stdout);
        assert!(renewals > 0, "no renewal got through a delay of {rtt:?}");
    } else {
        // A renewal cannot come back before the deadline.
        assert!(
            out.stdout.contains("\nLOST deadline_expired\n"),
            "{}",
            out.stdout
        );
        let a_lost = first_of(&h, 0, "lost").expect("A's loss logged");
        assert!(
            a_lost.t <= deadline + ns(SLACK),
            "loss reported {:.1} ms after the deadline",
            ms_between(deadline, a_lost.t)
        );
    }
    println!(
        "{mode:?}: acquired after {:.1} ms with {:.1} ms of validity (deadline {:.1} ms after \
         the invoke); {renewals} renewals; {}",
        ms_between(invoke, t),
        ms_between(t, deadline),
        ms_between(invoke, deadline),
        out.stdout
            .lines()
            .filter(|l| l.starts_with("LOST") || l.starts_with("UNLOCK"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

#[test]
fn s11c_request_delay_of_0_3_lease_acquires_with_enough_validity() {
    acquire_through(delay(LEASE * 3 / 10, Duration::ZERO));
}

#[test]
fn s11c_request_delay_of_0_6_lease_acquires_then_loses_the_renewal_race() {
    acquire_through(delay(LEASE * 6 / 10, Duration::ZERO));
}

#[test]
#[cfg_attr(
    not(feature = "full-matrix"),
    ignore = "full matrix: cargo test -p ecosphere --features full-matrix"
)]
fn s11c_request_delay_of_1_2_lease_is_never_a_usable_grant() {
    acquire_through(delay(LEASE * 12 / 10, Duration::ZERO));
}

/// Renewals get through a reply delay of 0.2 L, and the checker bounds each renewed deadline
/// by `renew_ok.t − 0.2 L + L`: a lease counted from the reply (the `lease-from-reply`
/// mutant) fails validity here through the renewals alone.
#[test]
fn s11d_reply_delay_of_0_2_lease_renews_with_deadlines_from_the_send() {
    acquire_through(delay(Duration::ZERO, LEASE / 5));
}

#[test]
fn s11d_reply_delay_of_0_6_lease_acquires_then_loses_the_renewal_race() {
    acquire_through(delay(Duration::ZERO, LEASE * 6 / 10));
}

#[test]
fn s11c_renewal_slower_than_the_validity_is_reported_as_loss() {
    let lock_server = server();
    let proxy = FaultProxy::start(lock_server.addr()).expect("proxy");
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path();
    let rec = Recorder::create(history, HARNESS).expect("harness recorder");
    let mut a = worker(&lock_server, &proxy, "slow-renewal", history);
    a.hold = Duration::from_secs(30);
    let mut holder = a.spawn(1);
    let holding = wait_line(&mut holder, 0, "HOLDING ", Duration::from_secs(20));
    let a_holder = holding.split(' ').nth(1).expect("holder").to_owned();
    wait_history(history, Duration::from_secs(5), "a renewal by A", |h| {
        h.events().iter().any(|e| e.kind.name() == "renew_ok")
    });
    let t_slow = now_ns();
    proxy
        .set_mode(delay(LEASE * 12 / 10, Duration::ZERO))
        .expect("slow requests");
    nemesis(
        &rec,
        t_slow,
        "slow-renewal",
        "delay_requests_1.2L",
        "node:0",
    );
    let lost = wait_line(&mut holder, 0, "LOST ", LEASE * 2);
    assert_eq!(lost, "LOST deadline_expired");
    let unlock = wait_line(&mut holder, 0, "UNLOCK ", COMMAND_TIMEOUT * 2);
    assert!(
        unlock == "UNLOCK not_held" || unlock.starts_with("UNLOCK error "),
        "A's release after the loss: {unlock}"
    );
    finish_ok(&mut holder, Duration::from_secs(20));
    let (h, report) = check(history, &cfg(&lock_server, Duration::ZERO));
    report.assert_ok();
    report.assert_pass(&[CheckId::Ownership, CheckId::Validity, CheckId::Quiescence]);
    report.assert_pass_or_unchecked(
        CheckId::Exclusion,
        "a single holder in this scenario: nobody to overlap with",
    );
    let deadline = last_deadline(&h, &a_holder);
    let a_lost = first_of(&h, 0, "lost").expect("A's loss logged");
    assert!(
        a_lost.t <= deadline + ns(SLACK),
        "loss reported {:.1} ms after the deadline",
        ms_between(deadline, a_lost.t)
    );
    println!(
        "slow from +0: A's deadline {:+.1} ms, loss {:+.1} ms, {unlock}",
        ms_between(t_slow, deadline),
        ms_between(t_slow, a_lost.t)
    );
}
