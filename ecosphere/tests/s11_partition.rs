//! Scenario S11 (a)/(b) (reliability.md §6.3, issue 7): a partition between one client and the
//! lock server, made with a network namespace and a veth pair ([`ecosphere::netns`]).
//!
//! Worker A runs inside its own namespace and reaches the lock server (which also listens on
//! the host end of the veth) over that link only; worker B runs on the host over loopback.
//! A holds (lease 1 s, renewal 333 ms, command timeout 300 ms); B waits in `lock()`. The link
//! is cut for 2 × lease:
//!
//! - **(a) blackhole** (host end down: packets vanish) — smoke;
//! - **(b) `prohibit` route** inside the namespace (sends fail at once) — full matrix.
//!
//! Expected: A reports the loss by its deadline (+ slack; `deadline_expired`, I9); B acquires
//! after A's deadline; after the link is healed, A's release (held back until then with
//! `--unlock-file`, and sent once a PING over its connection answers again: a blackholed TCP
//! connection needs its retransmission backoff to pass) answers *not held* and leaves B's entry as it was (`HGETALL`: only B's
//! field, count 1; I5). The checker passes (I1, I3, I5, validity accounting, I8). If a
//! namespace cannot be created here the test prints the reason and returns (only then).
//!
//! - **(e) a local handoff, then a blackhole**: process A's three tasks reach the lock server
//!   through a [`FaultProxy`]; the first holds, passes the hold to the second inside the
//!   process (no round trip), and right after the pass the proxy drops everything. A passed
//!   hold keeps only what is left of the Redis lease: the second task must lose it by the
//!   Redis key's expiry, when process B (started after the cut, straight to the server) takes
//!   the lock. The checker decides (I1); the `pass-outlives-lease` mutant fails it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ecosphere::clock::now_ns;
use ecosphere::history::{CheckConfig, CheckId, Recorder};
use ecosphere::netns::NetNs;
use ecosphere::proxy::{FaultProxy, Mode};
use ecosphere::server::RedisServer;
use scenario::*;

const LEASE: Duration = Duration::from_secs(1);
const RENEWAL: Duration = Duration::from_millis(333);
const COMMAND_TIMEOUT: Duration = Duration::from_millis(300);
/// Slack on the loss-report bound.
const SLACK: Duration = Duration::from_millis(400);
const HARNESS: u32 = 99;

#[derive(Clone, Copy, Debug)]
enum Cut {
    Blackhole,
    Prohibit,
}

fn partition(cut: Cut) {
    // Declared first, dropped last: the workers inside are gone by then.
    let net = match NetNs::create() {
        Ok(n) => n,
        Err(e) => {
            println!("SKIPPED: {e}");
            return;
        }
    };
    let lock_server = RedisServer::builder()
        .arg("bind", format!("127.0.0.1 {}", net.host_addr()))
        .start()
        .expect("start redis-server on loopback and the veth");
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path().join("history");
    std::fs::create_dir(&history).expect("history dir");
    let unlock_file = dir.path().join("healed");
    let lock = "partition";
    let key = "slate:{partition}";
    let rec = Recorder::create(&history, HARNESS).expect("harness recorder");

    let mut a = Worker::new("hold", &lock_server, lock, &history);
    a.redis_url = vec![format!(
        "redis://{}:{}",
        net.host_addr(),
        lock_server.port()
    )];
    a.exec_prefix = Some(net.exec_args());
    a.lease = LEASE;
    a.renewal = Some(RENEWAL);
    a.command_timeout = Some(COMMAND_TIMEOUT);
    a.hold = Duration::from_secs(30);
    a.unlock_file = Some(unlock_file.clone());
    a.max_duration = Duration::from_secs(40);
    let mut holder = a.spawn(1);
    let holding = wait_line(&mut holder, 0, "HOLDING ", Duration::from_secs(20));
    let a_holder = holding.split(' ').nth(1).expect("holder").to_owned();

    let mut b = Worker::new("hold", &lock_server, lock, &history);
    b.lease = LEASE;
    b.renewal = Some(RENEWAL);
    b.command_timeout = Some(COMMAND_TIMEOUT);
    b.spin_wait = Some(Duration::from_millis(100));
    b.hold = LEASE * 4;
    b.proc_base = 1;
    b.max_duration = Duration::from_secs(40);
    let mut other = b.spawn(1);
    wait_history(
        &history,
        Duration::from_secs(10),
        "B waiting, A renewed",
        |h| {
            h.events()
                .iter()
                .any(|e| e.proc == 1 && e.kind.name() == "acq_invoke")
                && h.events()
                    .iter()
                    .any(|e| e.proc == 0 && e.kind.name() == "renew_ok")
        },
    );

    let started = Instant::now();
    let t_cut = now_ns();
    match cut {
        Cut::Blackhole => net.cut().expect("link down"),
        Cut::Prohibit => net.prohibit().expect("prohibit route"),
    }
    nemesis(&rec, t_cut, lock, &format!("{cut:?}").to_lowercase(), "0");
    let lost = wait_line(&mut holder, 0, "LOST ", LEASE + SLACK * 2);
    assert_eq!(lost, "LOST deadline_expired", "A's loss in the partition");
    wait_line(&mut holder, 0, "UNLOCK_WAIT", Duration::from_secs(2));
    let b_holding = wait_line(&mut other, 0, "HOLDING ", LEASE * 2);
    let b_holder = b_holding.split(' ').nth(1).expect("B's holder").to_owned();
    // The partition lasts 2 leases: a fault duration, not a wait for a condition.
    std::thread::sleep((started + LEASE * 2).saturating_duration_since(Instant::now()));
    net.heal().expect("heal the link");
    let t_heal = now_ns();
    nemesis(&rec, t_heal, lock, "heal", "0");
    go(&unlock_file);
    wait_line(&mut holder, 0, "LINK_OK ", Duration::from_secs(10));
    let unlock = wait_line(&mut holder, 0, "UNLOCK ", Duration::from_secs(10));
    assert_eq!(unlock, "UNLOCK not_held", "A's release after healing");
    let fields = hgetall(&lock_server, key);
    assert_eq!(
        fields,
        BTreeMap::from([(b_holder.clone(), 1)]),
        "B's entry after A's release"
    );
    finish_ok(&mut holder, Duration::from_secs(20));
    let b_out = finish_ok(&mut other, Duration::from_secs(20)).remove(0);
    assert!(b_out.stdout.contains("UNLOCK ok 0"), "{}", b_out.stdout);

    let cfg = CheckConfig {
        final_keys: Some(lock_keys(&lock_server)),
        ..CheckConfig::new(LEASE)
    };
    let (h, report) = check(&history, &cfg);
    report.assert_ok();
    // A and B acquire once each; B is the only waiter.
    report.assert_contention(2, 1, 1);
    report.assert_pass(&[
        CheckId::Exclusion,
        CheckId::Tokens,
        CheckId::Ownership,
        CheckId::Validity,
        CheckId::Quiescence,
    ]);
    report.assert_pass_or_unchecked(CheckId::Reentry, "this scenario never re-enters");
    let a_deadline = last_deadline(&h, &a_holder);
    let a_lost = first_of(&h, 0, "lost").expect("A's loss logged");
    let b_ok = first_of(&h, 1, "acq_ok").expect("B acquired");
    assert!(
        a_lost.t <= a_deadline + ns(SLACK),
        "A reported the loss {:.1} ms after its deadline",
        ms_between(a_deadline, a_lost.t)
    );
    assert!(b_ok.t >= a_deadline, "B acquired inside A's lease");
    let a_rel = first_of(&h, 0, "rel_invoke").expect("A's release");
    assert!(a_rel.t >= t_heal, "A released before the heal");
    println!(
        "{cut:?} at +0: A's deadline {:+.1} ms, loss {:+.1} ms, B acquired {:+.1} ms, heal \
         {:+.1} ms, A's release answered not held {:+.1} ms after the heal",
        ms_between(t_cut, a_deadline),
        ms_between(t_cut, a_lost.t),
        ms_between(t_cut, b_ok.t),
        ms_between(t_cut, t_heal),
        ms_between(t_heal, a_rel.t)
    );
}

#[test]
fn s11a_blackholed_client_loses_by_its_deadline_and_releases_nothing_after() {
    partition(Cut::Blackhole);
}

#[test]
#[cfg_attr(
    not(feature = "full-matrix"),
    ignore = "full matrix: cargo test -p ecosphere --features full-matrix"
)]
fn s11b_prohibited_route_fails_fast_and_loses_by_the_deadline() {
    partition(Cut::Prohibit);
}

/// (e): lease 4 s, renewal every 2 s, each of A's three tasks holds 3.4 s. Task 0's grant
/// is not passable (nobody waited when it was sent); task 1's is, since task 2 waits. Task 1
/// acquires at t1 and renews at t1 + 2 s (the Redis key now expires at t1 + 6 s); the pass to
/// task 2 comes at t1 + 3.4 s and the proxy drops everything right after, before the renewal
/// due at t1 + 4 s. Task 2's lease is what is left of the Redis hold (to t1 + 6 s): it loses
/// the lock then, and B acquires after the key expires. A pass that gave task 2 a fresh lease
/// (to t1 + 7.4 s) would have it hold until its release at t1 + 6.8 s, beside B.
#[test]
fn s11e_a_passed_hold_ends_with_the_redis_lease_in_a_partition() {
    const LEASE: Duration = Duration::from_secs(4);
    const HOLD: Duration = Duration::from_millis(3400);
    let lock_server = server();
    let proxy = FaultProxy::start(lock_server.addr()).expect("proxy");
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path().join("history");
    std::fs::create_dir(&history).expect("history dir");
    let lock = "passed";
    let rec = Recorder::create(&history, HARNESS).expect("harness recorder");

    let mut a = Worker::new("wait", &lock_server, lock, &history);
    a.redis_url = vec![proxy.url()];
    a.tasks = 3;
    a.implicit_holders = true;
    a.lease = LEASE;
    a.renewal = Some(LEASE / 2);
    a.command_timeout = Some(COMMAND_TIMEOUT);
    a.budget = Duration::from_secs(20);
    a.hold = HOLD;
    a.max_duration = Duration::from_secs(40);
    let mut passer = a.spawn(1);
    // The pass: A's third grant.
    wait_history(&history, Duration::from_secs(20), "A's third grant", |h| {
        h.events()
            .iter()
            .filter(|e| e.proc == 0 && e.kind.name() == "acq_ok")
            .count()
            == 3
    });
    proxy.set_mode(Mode::Blackhole).expect("blackhole");
    let t_cut = now_ns();
    nemesis(&rec, t_cut, lock, "blackhole", "proc:0");

    let mut b = Worker::new("wait", &lock_server, lock, &history);
    b.lease = LEASE;
    b.budget = Duration::from_secs(20);
    b.hold = Duration::from_millis(100);
    b.proc_base = 1;
    b.max_duration = Duration::from_secs(40);
    let mut other = b.spawn(1);
    let b_out = finish_ok(&mut other, Duration::from_secs(30)).remove(0);
    assert!(
        b_out.stdout.contains("DONE acquired=1 "),
        "B acquired: {}",
        b_out.stdout
    );
    // A's outcome is judged after the history: a mutant fails the checker first.
    let a_out = passer
        .wait_all(Duration::from_secs(30))
        .expect("A finishes")
        .remove(0);
    let (h, report) = check(&history, &CheckConfig::new(LEASE));
    report.assert_ok();
    // A (three grants) and B acquire; A's tasks 1 and 2 wait together while task 0 holds.
    report.assert_contention(2, 1, 2);
    report.assert_pass(&[CheckId::Exclusion, CheckId::Tokens, CheckId::Validity]);
    assert!(
        a_out.status.success(),
        "A failed\n{}\n{}",
        a_out.stdout,
        a_out.stderr
    );
    let grants: Vec<_> = h
        .events()
        .iter()
        .filter(|e| e.proc == 0 && e.kind.name() == "acq_ok")
        .collect();
    let deadline = |e: &ecosphere::history::Event| match &e.kind {
        ecosphere::history::EventKind::AcqOk {
            holder, deadline, ..
        } => (holder.clone(), *deadline),
        other => panic!("not an acq_ok: {other:?}"),
    };
    let (second, _) = deadline(grants[1]);
    let (_, passed_deadline) = deadline(grants[2]);
    assert_eq!(
        passed_deadline,
        last_deadline(&h, &second),
        "task 2's grant was a local pass of task 1's hold (same Redis lease)"
    );
    let lost = first_of(&h, 0, "lost").expect("the passed hold is lost in the partition");
    let b_ok = first_of(&h, 1, "acq_ok").expect("B acquired");
    assert!(lost.t <= b_ok.t + ns(SLACK), "task 2 lost the lock late");
    println!(
        "from task 1's grant: the pass {:+.0} ms, cut {:+.0} ms, task 2 lost {:+.0} ms, B \
         acquired {:+.0} ms",
        ms_between(grants[1].t, grants[2].t),
        ms_between(grants[1].t, t_cut),
        ms_between(grants[1].t, lost.t),
        ms_between(grants[1].t, b_ok.t)
    );
}
