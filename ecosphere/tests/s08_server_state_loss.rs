//! Scenario S8 (reliability.md §6.3, issue 7): the lock server loses the lock's state while A
//! holds it with renewal.
//!
//! Worker A holds (lease 1.5 s, renewal every 500 ms; every 50 ms one fenced write to F and one
//! counter increment on a separate resource server). Worker B is ready and starts its
//! `lock()` right after the fault.
//!
//! - **S8(a) restart without data** (persistence off, `SIGKILL` + restart empty): B acquires at
//!   once on the empty server while A still believes it holds. This is the documented
//!   single-node limit, so this is an **expected-violation run**: the checker must report the
//!   I1 overlap of A and B (asserted). The fencing counter goes with the data, but a lost slot
//!   counter is seeded again from the server's clock (issue 30), so B's token is still higher
//!   and F rejects A's writes once B has written. A must report the loss (`EntryGone`) within one renewal period of the
//!   restart, and must never re-create its entry (observer snapshots for a lease after the
//!   loss never show A's field; A's release answers *not held* and leaves B's entry).
//! - **S8(b) AOF, `appendfsync always`** (`SIGKILL` + restart with the data): the lock is kept.
//!   A renews after the restart (the script cache is empty: `NOSCRIPT` must be handled
//!   transparently), never reports a loss, releases with `ok 0`; B acquires only after A's
//!   release with a higher token. The checker passes everything.
//! - **S8(c) admin `DEL`** of the lock key (full matrix): as (a) for A (loss within one
//!   renewal period, no re-creation) and the expected I1 overlap, but the fencing counter
//!   survives, so B's token is higher, and F rejects A's writes once B has written.
//!
//! - **S8(d) eviction** (`maxmemory 3mb`, `maxmemory-policy volatile-lru`): the test writes
//!   volatile filler keys (64 KiB, TTL 60 s; bounded count and time) until the lock key is gone
//!   (watched with `EXISTS`, which does not touch the key's LRU clock), then deletes the fillers.
//!   As (c): the expected I1 overlap, A's loss within one renewal period, no re-creation; the
//!   fencing counter has no TTL, so `volatile-lru` must not evict it (asserted), B's token is
//!   higher and F rejects A's writes once B has written.
//! - **S8(e) `SHUTDOWN SAVE` + restart with the RDB** (no AOF, no save points: the RDB file is
//!   written by the shutdown itself): as (b), the lock is kept, the script cache is reloaded
//!   transparently, B acquires only after A's release.
//!
//! Invariants: I1 (expected to fail in (a)/(c)/(d), must pass in (b)/(e)), I2, I4(F), I3, I5,
//! I9, I8.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::path::Path;
use std::time::{Duration, Instant};

use ecosphere::clock::now_ns;
use ecosphere::history::{
    CheckConfig, CheckId, EventKind, FencedOutcome, History, Recorder, Status,
};
use ecosphere::server::{Data, Persistence, RedisServer};
use ecosphere::workers::WorkerSet;
use scenario::*;

const LEASE: Duration = Duration::from_millis(1500);
const RENEWAL: Duration = Duration::from_millis(500);
/// Slack on "within one renewal period".
const SLACK: Duration = Duration::from_millis(400);
const HARNESS: u32 = 99;
const FENCED: &str = "fenced";

/// A holding (`hold`, fenced writes), and B ready but gated on the go file.
struct Setup {
    dir: tempfile::TempDir,
    holder: WorkerSet,
    other: WorkerSet,
    a_holder: String,
    rec: Recorder,
}

impl Setup {
    fn history(&self) -> &Path {
        self.dir.path()
    }

    fn go(&self) -> std::path::PathBuf {
        self.dir.path().join("go")
    }
}

fn setup(lock_server: &RedisServer, resource: &RedisServer, lock: &str, a_hold: Duration) -> Setup {
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path();
    let mut a = Worker::new("hold", lock_server, lock, history);
    a.resource_url = Some(resource.url());
    a.fenced_key = Some(FENCED.into());
    a.lease = LEASE;
    a.renewal = Some(RENEWAL);
    a.command_timeout = Some(Duration::from_millis(300));
    a.hold = a_hold;
    // A's client (and renewal service) lives on after its release: nothing may re-create A's
    // entry meanwhile.
    a.linger = LEASE * 2;
    a.max_duration = Duration::from_secs(40);
    let mut holder = a.spawn(1);
    let holding = wait_line(&mut holder, 0, "HOLDING ", Duration::from_secs(20));
    let a_holder = holding.split(' ').nth(1).expect("holder").to_owned();

    let mut b = a.clone();
    b.hold = Duration::from_millis(1500);
    b.linger = Duration::ZERO;
    b.spin_wait = Some(Duration::from_millis(100));
    b.go_file = Some(dir.path().join("go"));
    b.proc_base = 1;
    let mut other = b.spawn(1);
    wait_line(&mut other, 0, "READY", Duration::from_secs(20));
    let rec = Recorder::create(history, HARNESS).expect("harness recorder");
    Setup {
        dir,
        holder,
        other,
        a_holder,
        rec,
    }
}

/// Waits until A logs a renewal after `after` (a fault right after it leaves almost a whole
/// renewal period before the next one).
fn fresh_renewal(history: &Path, after: u64) -> u64 {
    wait_for(Duration::from_secs(5), "a renewal by A", || {
        let h = History::load(history).expect("load history");
        h.events()
            .iter()
            .rev()
            .find(|e| e.proc == 0 && e.kind.name() == "renew_ok" && e.t > after)
            .map(|e| e.t)
    })
}

/// Snapshots of the lock key for `span`; A's field must never be in one.
fn watch_no_resurrection(
    rec: &Recorder,
    server: &RedisServer,
    lock: &str,
    key: &str,
    a: &str,
    span: Duration,
) {
    let until = Instant::now() + span;
    let mut n = 0;
    while Instant::now() < until {
        let snap = observe(rec, server, lock, key);
        if let EventKind::Observe { fields, .. } = &snap.kind {
            assert!(
                !fields.contains_key(a),
                "A's entry re-created after its loss: {snap:?}"
            );
        }
        n += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(n > 5, "only {n} snapshots");
}

/// How the state is lost.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Loss {
    RestartEmpty,
    AdminDel,
    Eviction,
}

/// S8(d): the lock server's memory limit, and the filler values.
const MAXMEMORY: &str = "3mb";
const FILLER_BYTES: usize = 64 * 1024;
/// Far more than 3 MiB / 64 KiB: the bound of the filler loop.
const MAX_FILLERS: usize = 5_000;
const FILL_WITHIN: Duration = Duration::from_secs(15);

/// Writes volatile filler keys until `key` is gone (evicted) and returns how many were written,
/// then deletes them. `EXISTS` does not update the key's LRU clock.
fn fill_until_evicted(server: &RedisServer, key: &str) -> usize {
    let mut con = server.connection().expect("filler connection");
    let value = vec![b'x'; FILLER_BYTES];
    let deadline = Instant::now() + FILL_WITHIN;
    let mut written = None;
    for n in 0..MAX_FILLERS {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(key)
            .query(&mut con)
            .expect("EXISTS lock key");
        if exists == 0 {
            written = Some(n);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the lock key survived {n} filler writes for {FILL_WITHIN:?}"
        );
        let () = redis::cmd("SET")
            .arg(format!("filler:{n}"))
            .arg(&value[..])
            .arg("PX")
            .arg(60_000)
            .query(&mut con)
            .expect("SET filler (volatile keys are evictable: no OOM error)");
    }
    let written =
        written.unwrap_or_else(|| panic!("the lock key survived {MAX_FILLERS} filler writes"));
    for chunk in (0..written).collect::<Vec<_>>().chunks(100) {
        let mut del = redis::cmd("DEL");
        for n in chunk {
            del.arg(format!("filler:{n}"));
        }
        let _: i64 = del.query(&mut con).expect("DEL fillers");
    }
    written
}

/// `INFO stats` field `evicted_keys`.
fn evicted_keys(server: &RedisServer) -> u64 {
    let v = server.command(&["INFO", "stats"]).expect("INFO stats");
    let text: String = redis::from_redis_value(v).expect("INFO reply");
    text.lines()
        .find_map(|l| l.strip_prefix("evicted_keys:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("evicted_keys in INFO stats")
}

fn state_lost(loss: Loss) {
    let mut lock_server = match loss {
        Loss::Eviction => RedisServer::builder()
            .arg("maxmemory", MAXMEMORY)
            .arg("maxmemory-policy", "volatile-lru")
            .start()
            .expect("start redis-server with maxmemory"),
        Loss::RestartEmpty | Loss::AdminDel => server(),
    };
    let resource = server();
    let lock = match loss {
        Loss::RestartEmpty => "lost-restart",
        Loss::AdminDel => "lost-del",
        Loss::Eviction => "lost-evicted",
    };
    let key = format!("slate:{{{lock}}}");
    let mut s = setup(&lock_server, &resource, lock, Duration::from_secs(30));
    let history = s.history().to_owned();
    let renewed = fresh_renewal(&history, 0);
    fresh_renewal(&history, renewed);

    let t_fault = now_ns();
    match loss {
        Loss::RestartEmpty => {
            lock_server.kill().expect("SIGKILL redis-server");
            nemesis(&s.rec, t_fault, lock, "kill_server", "node:0");
            lock_server.restart(Data::Wipe).expect("restart empty");
            nemesis(&s.rec, now_ns(), lock, "restart_server_empty", "node:0");
        }
        Loss::AdminDel => {
            assert_eq!(int(&lock_server, &["DEL", &key]), 1, "DEL of the lock key");
            nemesis(&s.rec, t_fault, lock, "admin_del", &key);
        }
        Loss::Eviction => {
            let fence = scenario::fence_key(lock);
            assert_eq!(int(&lock_server, &["EXISTS", &fence]), 1, "fence counter");
            let fillers = fill_until_evicted(&lock_server, &key);
            let t_gone = now_ns();
            nemesis(&s.rec, t_fault, lock, "fill_volatile", "node:0");
            nemesis(&s.rec, t_gone, lock, "lock_key_evicted", &key);
            let evicted = evicted_keys(&lock_server);
            println!(
                "lock key evicted after {fillers} filler writes ({:.1} ms), evicted_keys={evicted}",
                ms_between(t_fault, t_gone)
            );
            assert!(evicted >= 1, "the key went, yet Redis evicted nothing");
            assert_eq!(
                int(&lock_server, &["EXISTS", &fence]),
                1,
                "volatile-lru evicted the fencing counter (it has no TTL)"
            );
            assert_eq!(int(&lock_server, &["PTTL", &fence]), -1, "fence TTL");
        }
    }
    let t_ready = now_ns();
    go(&s.go());
    let b_holding = wait_line(&mut s.other, 0, "HOLDING ", Duration::from_secs(5));
    let b_holder = b_holding.split(' ').nth(1).expect("B's holder").to_owned();
    let lost = wait_line(&mut s.holder, 0, "LOST ", LEASE * 2);
    assert_eq!(lost, "LOST entry_gone", "A's loss reason");
    let unlock = wait_line(&mut s.holder, 0, "UNLOCK ", Duration::from_secs(5));
    assert_eq!(unlock, "UNLOCK not_held", "A's release after the loss");
    let fields = hgetall(&lock_server, &key);
    assert!(
        fields.contains_key(&b_holder) && !fields.contains_key(&s.a_holder),
        "B's entry after A's release: {fields:?}"
    );
    // A's client lingers: its entry must stay gone (B's may come and go).
    watch_no_resurrection(&s.rec, &lock_server, lock, &key, &s.a_holder, LEASE);
    finish_ok(&mut s.holder, Duration::from_secs(20));
    let b_out = finish_ok(&mut s.other, Duration::from_secs(20)).remove(0);
    assert!(b_out.stdout.contains("UNLOCK ok 0"), "{}", b_out.stdout);

    let cfg = CheckConfig {
        allow_token_reset: true,
        final_keys: Some(lock_keys(&lock_server)),
        ..CheckConfig::new(LEASE)
    };
    let (h, report) = check(&history, &cfg);
    // The expected violation: B's window overlaps A's.
    let Status::Fail(cx) = report.status(CheckId::Exclusion) else {
        panic!("the checker must report the I1 overlap of this single-node limit:\n{report}");
    };
    assert!(
        cx.message.contains(&s.a_holder) && cx.message.contains(&b_holder),
        "the overlap names A and B: {}",
        cx.message
    );
    // Only the overlap is expected, and I2 only as its consequence: a token reused (which the
    // clock-seeded counter prevents; asserted below), or a write of A's sent after B's grant
    // that reached F before B's first write did. F cannot refuse a token older than one it has
    // not seen yet; that it refused every write of A's after B's first is asserted below.
    let failed = report.failed();
    assert!(
        failed.contains(&CheckId::Exclusion)
            && failed
                .iter()
                .all(|c| matches!(c, CheckId::Exclusion | CheckId::FencedOrder)),
        "only I1 and I2 may fail:\n{report}"
    );
    if failed.contains(&CheckId::FencedOrder) {
        let (a_token, b_token) = (token_of(&h, 0), token_of(&h, 1));
        let cx = report.status(CheckId::FencedOrder).counterexample();
        assert!(
            cx.is_some_and(|c| c.message.contains("from two holders")
                || (c.message.contains(&format!("accepted token {a_token} "))
                    && c.message.contains(&format!("though token {b_token} ")))),
            "I2 may fail only on a reused token or on A's write ahead of B's first:\n{report}"
        );
    }
    report.assert_pass(&[CheckId::Validity]);
    report.assert_pass_or_unchecked(CheckId::Reentry, "this scenario never re-enters");
    let (accepted, rejected) = assert_fenced_kept_everything(&h, &resource, FENCED);
    let b_acq = first_of(&h, 1, "acq_ok").expect("B acquired");
    let a_lost = first_of(&h, 0, "lost").expect("A's loss logged");
    let (a_token, b_token) = (token_of(&h, 0), token_of(&h, 1));
    // The fencing counter survives a DEL and an eviction (it has no TTL), and an empty
    // restart too since issue 30: the lost slot counter is seeded again from the server's
    // clock in µs, far above every token it had counted.
    assert!(
        b_token > a_token,
        "{loss:?}: B's token {b_token} is not above A's {a_token}"
    );
    assert_eq!(report.stats.token_resets, 0, "{loss:?}: no token reset");
    // F: once B wrote, A's writes are rejected (none accepted after B's first).
    let writes = fenced_writes(&h);
    let b_first = writes.iter().position(|w| w.0 == 1).expect("B wrote to F");
    assert!(
        !writes[b_first..]
            .iter()
            .any(|w| w.0 == 0 && matches!(w.2, FencedOutcome::Accepted { .. })),
        "F accepted A's stale token after B's write"
    );
    // I9: the loss within one renewal period of the fault (the restart / DEL).
    assert!(
        a_lost.t <= t_ready + ns(RENEWAL + SLACK),
        "A reported the loss {:.1} ms after the fault",
        ms_between(t_ready, a_lost.t)
    );
    println!(
        "fault at +0: B acquired {:+.1} ms (token {b_token}, A's {a_token}), A lost {:+.1} ms; \
         overlap reported: {}; F accepted {accepted}, rejected {rejected}",
        ms_between(t_fault, b_acq.t),
        ms_between(t_fault, a_lost.t),
        cx.message
    );
}

/// The token of `proc`'s first acquisition.
fn token_of(h: &History, proc: u32) -> u64 {
    h.events()
        .iter()
        .find_map(|e| match &e.kind {
            EventKind::AcqOk { token, .. } if e.proc == proc => Some(*token),
            _ => None,
        })
        .expect("acquired")
}

#[test]
fn s8a_restart_without_data_is_the_expected_single_node_overlap() {
    state_lost(Loss::RestartEmpty);
}

#[test]
#[cfg_attr(
    not(feature = "full-matrix"),
    ignore = "full matrix: cargo test -p ecosphere --features full-matrix"
)]
fn s8c_admin_del_is_reported_as_loss_and_fenced() {
    state_lost(Loss::AdminDel);
}

#[test]
fn s8d_volatile_lru_eviction_is_reported_as_loss_and_fenced() {
    state_lost(Loss::Eviction);
}

/// How the server goes down and comes back with its data.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Keep {
    /// `SIGKILL`, restart with the AOF (`appendfsync always`).
    AofKill,
    /// `SHUTDOWN SAVE` (RDB written at shutdown), restart with the RDB.
    RdbShutdown,
}

#[test]
fn s8b_aof_always_keeps_the_lock_across_a_crash() {
    lock_kept(Keep::AofKill);
}

#[test]
fn s8e_shutdown_save_rdb_restart_keeps_the_lock() {
    lock_kept(Keep::RdbShutdown);
}

fn lock_kept(how: Keep) {
    let mut lock_server = match how {
        Keep::AofKill => RedisServer::builder()
            .persistence(Persistence::Aof)
            .start()
            .expect("start redis-server with AOF"),
        // No AOF and no save points: only the SHUTDOWN writes the RDB.
        Keep::RdbShutdown => server(),
    };
    let resource = server();
    let lock = match how {
        Keep::AofKill => "aof",
        Keep::RdbShutdown => "rdb",
    };
    let mut s = setup(&lock_server, &resource, lock, LEASE * 3);
    let history = s.history().to_owned();
    let renewed = fresh_renewal(&history, 0);

    let t_kill = now_ns();
    match how {
        Keep::AofKill => {
            lock_server.kill().expect("SIGKILL redis-server");
            nemesis(&s.rec, t_kill, lock, "kill_server", "node:0");
        }
        Keep::RdbShutdown => {
            let rdb = lock_server.data_dir().join("dump.rdb");
            assert!(!rdb.exists(), "an RDB file before the SHUTDOWN");
            // The server closes the connection instead of replying.
            let reply = lock_server.command(&["SHUTDOWN", "SAVE"]);
            nemesis(&s.rec, t_kill, lock, "shutdown_save", "node:0");
            wait_for(Duration::from_secs(10), "redis-server to exit", || {
                (!lock_server.is_running()).then_some(())
            });
            println!("SHUTDOWN SAVE answered {reply:?}");
            assert!(rdb.exists(), "SHUTDOWN SAVE wrote no {}", rdb.display());
        }
    }
    lock_server
        .restart(Data::Keep)
        .expect("restart with the data");
    let t_back = now_ns();
    nemesis(&s.rec, t_back, lock, "restart_server_keep", "node:0");
    go(&s.go());
    // A renews on the restarted server (its script cache is empty).
    fresh_renewal(&history, t_back);
    let unlock = wait_line(&mut s.holder, 0, "UNLOCK ", LEASE * 4);
    assert_eq!(unlock, "UNLOCK ok 0", "A kept the lock across the crash");
    let a_out = finish_ok(&mut s.holder, Duration::from_secs(20)).remove(0);
    assert!(!a_out.stdout.contains("LOST"), "{}", a_out.stdout);
    let b_out = finish_ok(&mut s.other, Duration::from_secs(20)).remove(0);
    assert!(b_out.stdout.contains("UNLOCK ok 0"), "{}", b_out.stdout);

    let counter = get_u64(&resource, "counter");
    let cfg = CheckConfig {
        final_keys: Some(lock_keys(&lock_server)),
        counter: Some(ecosphere::history::CounterCheck {
            final_value: counter,
            expected: ecosphere::history::CounterExpectation::AckedIncrements,
        }),
        ..CheckConfig::new(LEASE)
    };
    let (h, report) = check(&history, &cfg);
    report.assert_ok();
    // A and B acquire once each; B is the only waiter.
    report.assert_contention(2, 1, 1);
    for id in CheckId::ALL {
        if id == CheckId::Reentry {
            report.assert_pass_or_unchecked(id, "this scenario never re-enters");
            continue;
        }
        assert_eq!(report.status(id), &Status::Pass, "{}", id.label());
    }
    assert_eq!(report.stats.losses, 0);
    let (accepted, rejected) = assert_fenced_kept_everything(&h, &resource, FENCED);
    assert_eq!(rejected, 0);
    let a_rel = first_of(&h, 0, "rel_invoke").expect("A's release");
    let b_acq = first_of(&h, 1, "acq_ok").expect("B acquired");
    assert!(b_acq.t > a_rel.t, "B acquired before A released");
    assert!(
        token_of(&h, 1) > token_of(&h, 0),
        "the fencing counter survived"
    );
    let renewals_after = h
        .events()
        .iter()
        .filter(|e| e.proc == 0 && e.kind.name() == "renew_ok" && e.t > t_back)
        .count();
    println!(
        "{how:?} {:+.1} ms after a renewal, back after {:.1} ms; A renewed {renewals_after} times \
         after the restart, released {:+.1} ms; B acquired {:+.1} ms after A's release; F \
         accepted {accepted}",
        ms_between(renewed, t_kill),
        ms_between(t_kill, t_back),
        ms_between(t_back, a_rel.t),
        ms_between(a_rel.t, b_acq.t)
    );
}
