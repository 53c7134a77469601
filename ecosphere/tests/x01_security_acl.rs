//! Scenario X1 (issue #7, reliability.md §6.5 and §4): AUTH, ACL and the script cache.
//!
//! Setup: real `redis-server` processes with ACL users. The lock user is limited to the key
//! prefix and the channels of the locks (`resetkeys resetchannels ~slate:* &slate:*`) and to
//! exactly the commands of [`NEEDED`] (everything else `-@all`). An "other app" user
//! (`~app:* +@all`) exists next to it.
//!
//! Faults and expected behaviour:
//! - least-privilege user: the single lock (acquire, re-enter, queries, renewal across several
//!   leases, a waiter in another client woken by the release notification, release, force
//!   unlock, the idle-connection `PING`) and the combination lock over three nodes (adoption,
//!   acquisition with a lagging fencing counter that must be raised, re-entry, renewal,
//!   inspection, release, a waiter, force unlock) work end to end, and then again after a
//!   restart that empties the script cache (NOSCRIPT handled transparently) and after a
//!   `SCRIPT FLUSH` while held (the renewal pipeline reloads). `ACL LOG` stays empty.
//! - the same with worker processes (`slate-worker` over the ACL user's URL): the history
//!   checker decides I1/I3/I5/I6 and the counter; `ACL LOG` stays empty.
//! - one command fewer: for every command of [`NEEDED`], a user without just that command
//!   fails somewhere in the same run (an error, or an `ACL LOG` entry naming the command), so
//!   the list is minimal; every missing command but `SUBSCRIBE`/`UNSUBSCRIBE` ends in a
//!   `BackendKind::Permission` error whose text names it (Redis's `NOPERM` for top-level
//!   commands; for commands refused inside a script, which Redis 7.0 does not name, Slate's
//!   hint listing every command); a user granted exactly what that hint lists runs both locks.
//! - wrong password: `BackendKind::Auth` at once (no retry loop), for `lock()` without a
//!   deadline too, and for the combination lock.
//! - a lock name outside the prefix (`key_prefix("other:")`): refused by Redis, `Permission`.
//! - credentials never appear in `Debug`/`Display` of clients, options, locks, node sets,
//!   guards or errors (the tracing-log scan is `ecosphere/fork-probe/tests/log_scan.rs`, where
//!   a subscriber can be installed).
//!
//! Invariants checked: I7-L3 (every failure bounded), `ACL LOG` empty in normal runs, I1, I3,
//! I5, I6 and the counter for the worker run, no secret in any rendering.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ecosphere::history::{CheckConfig, CheckId, CounterCheck, CounterExpectation};
use ecosphere::server::{Data, RedisServer, ServerBuilder};
use scenario::{Worker, check, finish_ok, get_u64, go, lock_keys, wait_line_all};
use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
use slate_core::{BackendKind, Error, LockGuard, LossReason};
use slate_redis::{ClientOptions, RedisClient, RwLock, Semaphore, SingleLock};

/// The lock user's password; no rendering may ever contain it.
const PASSWORD: &str = "Acl-S3cret-7f3c91e2";
/// The lock user.
const USER: &str = "slate";

/// Every command the locks send, top level or from their scripts, as ACL rule names.
///
/// Top level: `EVALSHA` and `SCRIPT LOAD` (the scripts; never `EVAL`), `PING` (idle
/// connection check, pool recycling, pub/sub keepalive), `SUBSCRIBE`/`UNSUBSCRIBE` (release
/// notifications), `EXISTS`/`HGET`/`PTTL` (the queries `is_locked`, `hold_count`,
/// `remaining_lease`), and for the combination lock `INFO` (run id, uptime) and `SET`/`EXISTS`
/// on the node marker. Inside the scripts: the rest.
const NEEDED: &[&str] = &[
    // top level
    "evalsha",
    "script|load",
    "ping",
    "subscribe",
    "unsubscribe",
    "exists",
    "hget",
    "pttl",
    "info",
    "set",
    // inside the scripts only
    "hset",
    "hincrby",
    "hmget",
    "hgetall",
    "del",
    "pexpire",
    "get",
    "incr",
    "incrby",
    "publish",
    "time",
    "zadd",
    "zrem",
    "zrange",
    // the read-write lock and the semaphore (their scripts; HDEL and ZREM also at top level,
    // where a waiting process gives up its place)
    "hdel",
    "zscore",
    "zcard",
    "zrangebyscore",
    "zremrangebyscore",
];

/// What the client's connection handshake sends on servers that have it: redis-rs names its
/// library with `CLIENT SETINFO` (Redis 7.2+, Valkey). Refused, the handshake goes on, but
/// `ACL LOG` records it, so the README's grants add it for those servers; it is not in
/// [`NEEDED`] because nothing the user sees breaks without it.
fn handshake() -> &'static [&'static str] {
    let v = ecosphere::server::chosen_version().expect("server binary");
    if v.knows_client_setinfo() {
        &["client|setinfo"]
    } else {
        &[]
    }
}

/// ACL rules granting `allowed` (and the handshake's command) on the lock prefix and channels
/// only.
fn rules(allowed: &[&str]) -> String {
    let grants: Vec<String> = allowed
        .iter()
        .chain(handshake())
        .map(|c| format!("+{c}"))
        .collect();
    format!(
        "resetkeys resetchannels ~slate:* &slate:* -@all {}",
        grants.join(" ")
    )
}

/// The ACL user name that lacks `missing` (ACL user names cannot contain `|`).
fn minus_user(missing: &str) -> String {
    format!("minus-{}", missing.replace('|', "-"))
}

/// A server builder with the lock user and the "other app" user.
fn acl_builder() -> ServerBuilder {
    RedisServer::builder()
        .acl_user(USER, PASSWORD, rules(NEEDED))
        .acl_user("other-app", "0ther-app-pw", "~app:* &app:* +@all")
        .arg("acllog-max-len", "1024")
}

/// One `ACL LOG` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
struct AclEntry {
    /// How many refusals this entry stands for (Redis groups equal ones).
    count: u64,
    username: String,
    reason: String,
    context: String,
    object: String,
}

fn text(v: &redis::Value) -> String {
    match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        redis::Value::Int(i) => i.to_string(),
        redis::Value::Double(d) => d.to_string(),
        other => format!("{other:?}"),
    }
}

/// `ACL LOG` of a server (as the admin over the Unix socket).
fn acl_log(server: &RedisServer) -> Vec<AclEntry> {
    let v = server.command(&["ACL", "LOG", "1024"]).expect("ACL LOG");
    let redis::Value::Array(entries) = v else {
        panic!("ACL LOG answered {v:?}");
    };
    entries
        .iter()
        .map(|e| {
            let fields: BTreeMap<String, String> = match e {
                redis::Value::Array(kv) => kv
                    .chunks(2)
                    .map(|p| (text(&p[0]), p.get(1).map(text).unwrap_or_default()))
                    .collect(),
                redis::Value::Map(kv) => kv.iter().map(|(k, v)| (text(k), text(v))).collect(),
                other => panic!("ACL LOG entry {other:?}"),
            };
            let f = |k: &str| fields.get(k).cloned().unwrap_or_default();
            AclEntry {
                count: f("count").parse().unwrap_or(0),
                username: f("username"),
                reason: f("reason"),
                context: f("context"),
                object: f("object"),
            }
        })
        .collect()
}

/// Where a run failed: the step and the error.
type Step<T> = Result<T, (&'static str, Error)>;

fn at<T>(step: &'static str, r: slate_core::Result<T>) -> Step<T> {
    r.map_err(|e| (step, e))
}

/// Bounds one step; a step that does not finish in `within` fails the run as a timeout.
async fn bounded<T>(
    step: &'static str,
    within: Duration,
    f: impl std::future::Future<Output = slate_core::Result<T>>,
) -> Step<T> {
    match tokio::time::timeout(within, f).await {
        Ok(r) => at(step, r),
        Err(_) => Err((
            step,
            Error::backend(
                BackendKind::Timeout,
                None,
                format!("test bound of {within:?} passed"),
                None,
            ),
        )),
    }
}

/// Fails the run with a made-up error when a condition does not hold (something the lock did
/// wrong without returning an error, e.g. a lost lease).
fn ensure(step: &'static str, ok: bool, what: impl Into<String>) -> Step<()> {
    if ok {
        Ok(())
    } else {
        Err((
            step,
            Error::backend(BackendKind::Other, None, what.into(), None),
        ))
    }
}

/// Release to the waiter's acquisition, when the release notification wakes it.
const WAKE_BOUND: Duration = Duration::from_millis(1500);

/// What a single-lock run measured.
#[derive(Debug)]
struct SingleRun {
    /// Release to the waiter's acquisition (the notification's latency).
    woke_after: Duration,
    /// Whether the waiter's client had its pub/sub connection up while it waited.
    pubsub_was_up: bool,
}

/// Holds `guard` for `span`, checking every 20 ms that the lease was not lost.
async fn hold_for(step: &'static str, guard: &impl LockGuard, span: Duration) -> Step<()> {
    let until = Instant::now() + span;
    while Instant::now() < until {
        ensure(
            step,
            !guard.is_lost(),
            format!("lease lost while held: {:?}", guard.lease().loss_reason()),
        )?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The whole single-lock path as the user of `url`, on locks `<prefix>{<name>...}`.
///
/// Two clients stand for two processes (separate local queues, so the waiter depends on the
/// Redis-side turn and the release notification).
async fn single_run(url: &str, prefix: &str, name: &str) -> Step<SingleRun> {
    let opts = ClientOptions::builder()
        .command_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let a = at("open client", RedisClient::open_with(url, opts.clone()))?;
    let b = at("open client", RedisClient::open_with(url, opts))?;
    bounded("PING", Duration::from_secs(3), a.ping()).await?;

    // Renewal across several leases, re-entry and the queries.
    let lease = Duration::from_millis(900);
    let build = |c: &RedisClient, n: &str, lease: Duration| {
        SingleLock::builder(c, n)
            .lease(lease)
            .renewal_period(lease / 3)
            .spin_wait(Duration::from_secs(5))
            .key_prefix(prefix)
            .build()
    };
    let renewed = at("build lock", build(&a, &format!("{name}-renew"), lease))?;
    let g1 = bounded("acquire", Duration::from_secs(3), renewed.lock()).await?;
    let g2 = bounded("re-enter", Duration::from_secs(3), g1.reenter()).await?;
    ensure(
        "re-enter",
        g2.depth() == 2 && g2.fencing_token() == g1.fencing_token(),
        "re-entry keeps the token at depth 2",
    )?;
    let locked = bounded("is_locked", Duration::from_secs(3), renewed.is_locked()).await?;
    let count = bounded(
        "hold_count",
        Duration::from_secs(3),
        renewed.hold_count(g1.holder()),
    )
    .await?;
    let left = bounded(
        "remaining_lease",
        Duration::from_secs(3),
        renewed.remaining_lease(),
    )
    .await?;
    ensure(
        "queries",
        locked && count == 2 && left.is_some_and(|d| d <= lease),
        format!("queries answered {locked} {count} {left:?}"),
    )?;
    hold_for("renewal", &g1, lease * 3).await?;
    ensure(
        "release",
        bounded("release", Duration::from_secs(3), g2.unlock()).await? == 1,
        "one level left",
    )?;
    ensure(
        "release",
        bounded("release", Duration::from_secs(3), g1.unlock()).await? == 0,
        "released",
    )?;

    // Notification: a waiter in the other client; the holder's lease (5 s) and the spin wait
    // (5 s) are far longer than the wake-up bound, so only the release message wakes it.
    let long = Duration::from_secs(5);
    let la = at("build lock", build(&a, &format!("{name}-notify"), long))?;
    let lb = at("build lock", build(&b, &format!("{name}-notify"), long))?;
    let held = bounded("acquire", Duration::from_secs(3), la.lock()).await?;
    let waiter = tokio::spawn(async move {
        let g = lb.try_lock_for(Duration::from_secs(15)).await;
        (g, Instant::now(), lb)
    });
    // Parked and subscribed (or the subscription failed: then the wake-up bound fails below).
    // `subscriptions` counts a channel still being subscribed too, and a refused one goes
    // within a round trip or two (asked again alone first): the state must hold for 300 ms,
    // or a release right then could meet the waiter's fallback attempt (a flake seen once).
    let parked = Instant::now() + Duration::from_secs(3);
    let mut pubsub_was_up = false;
    let mut since: Option<Instant> = None;
    while Instant::now() < parked {
        let s = b.stats();
        if s.local_waiters == 1 && s.subscriptions == 1 && s.pubsub_up {
            let t = *since.get_or_insert_with(Instant::now);
            if t.elapsed() >= Duration::from_millis(300) {
                pubsub_was_up = true;
                break;
            }
        } else {
            since = None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let released_at = Instant::now();
    bounded("release", Duration::from_secs(3), held.unlock()).await?;
    let (gb, acquired_at, lb) = waiter.await.expect("waiter task");
    let gb = at("waiter acquire", gb)?;
    let woke_after = acquired_at.saturating_duration_since(released_at);
    ensure(
        "notification",
        pubsub_was_up && woke_after < WAKE_BOUND,
        format!(
            "the waiter woke {woke_after:?} after the release (pub/sub up: {pubsub_was_up}); \
             without the notification the 5 s lease or spin wait would"
        ),
    )?;

    // Force unlock of the waiter's hold from the first client.
    let deleted = bounded("force unlock", Duration::from_secs(3), la.force_unlock()).await?;
    ensure("force unlock", deleted == 1, "force unlock found the entry")?;
    let reason = tokio::time::timeout(Duration::from_secs(6), gb.lost()).await;
    ensure(
        "force unlock",
        reason == Ok(LossReason::EntryGone),
        format!("the holder learned {reason:?}"),
    )?;
    let after = gb.unlock().await;
    ensure(
        "force unlock",
        after.as_ref().is_err_and(Error::is_not_held),
        format!("unlock after force unlock answered {after:?}"),
    )?;

    // A query once the waiter queue drained (UNSUBSCRIBE).
    bounded("query", Duration::from_secs(3), lb.is_locked()).await?;
    let drained = Instant::now() + Duration::from_secs(3);
    while b.stats().subscriptions > 0 && Instant::now() < drained {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(SingleRun {
        woke_after,
        pubsub_was_up,
    })
}

/// The read-write lock and the semaphore as the user of `url`, on `<prefix>{<name>}:rw` and
/// `:sem`: a holder whose lease ended (written by `admin`) purged by the next script, a
/// reader, a writer of another client turned away (`try_write`: it gives up its place) then
/// woken by the release message, renewal across leases, the status read, a semaphore's
/// permits, a capacity change and an operator's clear.
async fn shared_run(url: &str, admin: &RedisServer, prefix: &str, name: &str) -> Step<()> {
    let opts = ClientOptions::builder()
        .command_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let a = at("open client", RedisClient::open_with(url, opts.clone()))?;
    let b = at("open client", RedisClient::open_with(url, opts))?;
    let lease = Duration::from_millis(900);
    let build = |c: &RedisClient| {
        RwLock::builder(c, name)
            .lease(lease)
            .spin_wait(Duration::from_secs(5))
            .key_prefix(prefix)
            .build()
    };
    let (la, lb) = (
        at("build rwlock", build(&a))?,
        at("build rwlock", build(&b))?,
    );
    let key = format!("{prefix}{{{name}}}:rw");
    let ghost = "ghost";
    admin
        .command(&[
            "HSET", &key, "n", "1", "p:ghost", "1", "r:ghost", "1", "t:ghost", "1",
        ])
        .expect("HSET ghost");
    admin
        .command(&["ZADD", &format!("{key}:leases"), "1", ghost])
        .expect("ZADD ghost");
    let r = bounded("read", Duration::from_secs(3), la.read()).await?;
    let busy = bounded("try_write", Duration::from_secs(3), lb.try_write()).await?;
    ensure(
        "try_write",
        busy.is_none(),
        "a writer got in beside a reader",
    )?;
    let writer = tokio::spawn(async move {
        let w = lb.try_write_for(Duration::from_secs(15)).await;
        (w, Instant::now())
    });
    hold_for("shared renewal", &r, lease * 3).await?;
    let status = bounded("status", Duration::from_secs(3), la.status()).await?;
    ensure(
        "status",
        status.readers() == 1 && status.in_use == 1,
        format!("the ended lease was purged: {status:?}"),
    )?;
    let released = Instant::now();
    bounded("release read", Duration::from_secs(3), r.unlock()).await?;
    let (w, at_) = writer.await.expect("writer task");
    let w = at("writer", w)?;
    ensure(
        "shared notification",
        at_.saturating_duration_since(released) < WAKE_BOUND,
        "the writer was woken by the release message",
    )?;
    bounded("release write", Duration::from_secs(3), w.unlock()).await?;
    let sem = at(
        "build semaphore",
        Semaphore::builder(&a, name, 3)
            .lease(lease)
            .key_prefix(prefix)
            .build(),
    )?;
    let p = bounded("permits", Duration::from_secs(3), sem.acquire(2)).await?;
    bounded("set_permits", Duration::from_secs(3), sem.set_permits(4)).await?;
    let s = bounded("semaphore status", Duration::from_secs(3), sem.status()).await?;
    ensure(
        "semaphore status",
        s.in_use == 2 && s.capacity == Some(4),
        format!("{s:?}"),
    )?;
    let cleared = bounded("clear", Duration::from_secs(3), sem.force_unlock()).await?;
    ensure("clear", cleared == 1, "one holder dropped")?;
    let after = p.unlock().await;
    ensure(
        "clear",
        after.as_ref().is_err_and(Error::is_not_held),
        format!("unlock after the clear answered {after:?}"),
    )
}

/// Node-set options for the tests (adoption instead of quarantine; loaded machine margins).
fn node_opts() -> NodeSetOptions {
    NodeSetOptions::builder()
        .node_operation_time(Duration::from_millis(300))
        .reprobe_interval(Duration::from_millis(500))
        .quarantine(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// The whole combination-lock path as the users of `urls`.
///
/// Node 0's fencing counter is set ahead first (`admin`), so the acquisition must raise the
/// other nodes' counters (`raise_fence.lua`).
async fn combination_run(
    urls: Vec<String>,
    servers: &[RedisServer],
    prefix: &str,
    name: &str,
) -> Step<()> {
    // The counter of the name's slot (`NodeKeys::fence_key`), far ahead of the clock-seeded
    // counters the other nodes start.
    const AHEAD: u64 = 4_000_000_000_000_000;
    let keys =
        slate_redis::node::NodeKeys::new(prefix, &slate_redis::LockName::new(name).expect("name"));
    let fence = String::from_utf8(keys.fence_key().to_vec()).expect("utf-8");
    servers[0]
        .command(&["SET", &fence, &AHEAD.to_string()])
        .expect("admin SET fence");
    let nodes = at("connect", NodeSet::connect(urls.clone(), node_opts()))?;
    let adopted = bounded(
        "adopt (SET marker)",
        Duration::from_secs(5),
        nodes.adopt_fresh_servers(prefix),
    )
    .await?;
    ensure(
        "adopt (SET marker)",
        adopted == urls.len(),
        "every node adopted",
    )?;
    let lease = Duration::from_millis(1200);
    let build = |n: &NodeSet| {
        CombinationLock::builder(n, name)
            .lease(lease)
            .acquire_budget(Duration::from_millis(900))
            .renewal_period(lease / 3)
            .spin_wait(Duration::from_millis(50))
            .key_prefix(prefix)
            .build()
    };
    let lock = at("build", build(&nodes))?;
    let g = bounded(
        "acquire",
        Duration::from_secs(8),
        lock.try_lock_for(Duration::from_secs(5)),
    )
    .await?;
    ensure(
        "raise fence",
        g.fencing_token().get() == AHEAD + 1,
        format!("token {} (node 0 was ahead at {AHEAD})", g.fencing_token()),
    )?;
    let g2 = bounded("re-enter", Duration::from_secs(3), g.reenter()).await?;
    hold_for("renewal", &g, lease * 3).await?;
    for (i, r) in lock.status().await.into_iter().enumerate() {
        let entries = at("inspect", r)?;
        if g.nodes().contains(&i) {
            ensure(
                "inspect",
                entries.holders == [(g.holder().to_string(), 2)] && entries.fence == AHEAD + 1,
                format!("node {i}: {entries:?}"),
            )?;
        }
    }
    // A second process view waits (no cross-node notification: the spin wait wakes it).
    let other = at("connect", NodeSet::connect(urls, node_opts()))?;
    let lock2 = at("build", build(&other))?;
    let waiting = lock2.clone();
    let waiter = tokio::spawn(async move {
        let g = lock2.try_lock_for(Duration::from_secs(10)).await;
        (g, lock2)
    });
    // Release only once the waiter is parked.
    let parked = Instant::now() + Duration::from_secs(3);
    while waiting.local_waiters() == 0 && Instant::now() < parked {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    ensure(
        "waiter parked",
        waiting.local_waiters() == 1,
        "the second view's waiter never parked",
    )?;
    bounded("release", Duration::from_secs(3), g2.unlock()).await?;
    bounded("release", Duration::from_secs(3), g.unlock()).await?;
    let (g3, _lock2) = waiter.await.expect("waiter task");
    let g3 = at("waiter acquire", g3)?;
    ensure(
        "waiter acquire",
        g3.fencing_token().get() == AHEAD + 2,
        format!("waiter token {}", g3.fencing_token()),
    )?;
    let deleted = bounded("force unlock", Duration::from_secs(3), lock.force_unlock()).await?;
    ensure("force unlock", deleted == 1, "force unlock found entries")?;
    let reason = tokio::time::timeout(Duration::from_secs(5), g3.lost()).await;
    ensure(
        "force unlock",
        reason.is_ok(),
        "the holder learns of the force unlock",
    )?;
    drop(g3);
    Ok(())
}

/// One line for a run's outcome.
fn show<T>(s: &Step<T>) -> String {
    match s {
        Ok(_) => "ok".to_owned(),
        Err((step, e)) => format!("{step}: {:?} {e}", e.backend_kind()),
    }
}

fn fail(what: &str, (step, e): (&'static str, Error)) -> ! {
    panic!("{what}: failed at {step}: {e} ({e:?})")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x1_least_privilege_user_runs_both_locks_with_an_empty_acl_log() {
    let mut servers = RedisServer::start_many_with(3, &acl_builder()).expect("redis-server");
    let urls: Vec<String> = servers
        .iter()
        .map(|s| s.url_for_user(USER, PASSWORD))
        .collect();

    let single = single_run(&urls[0], "slate:", "x1")
        .await
        .unwrap_or_else(|e| fail("single lock", e));
    println!(
        "single lock as the ACL user: the waiter woke {:?} after the release (pub/sub up: {})",
        single.woke_after, single.pubsub_was_up
    );
    combination_run(urls.clone(), &servers, "slate:", "x1-comb")
        .await
        .unwrap_or_else(|e| fail("combination lock", e));
    shared_run(&urls[0], &servers[0], "slate:", "x1-shared")
        .await
        .unwrap_or_else(|e| fail("read-write lock and semaphore", e));
    for (i, s) in servers.iter().enumerate() {
        assert_eq!(acl_log(s), [], "ACL LOG of node {i}");
    }

    // The other application's user cannot touch the locks (ACL is the real boundary).
    let other =
        redis::Client::open(servers[0].url_for_user("other-app", "0ther-app-pw")).expect("client");
    let mut con = other.get_connection().expect("other app connects");
    let err = redis::cmd("DEL")
        .arg("slate:{x1-renew}:fence")
        .query::<i64>(&mut con)
        .expect_err("other app may not delete a lock key");
    assert_eq!(err.code(), Some("NOPERM"), "{err:?}");
    assert_eq!(
        acl_log(&servers[0]).len(),
        1,
        "exactly that refusal is logged"
    );
    servers[0]
        .command(&["ACL", "LOG", "RESET"])
        .expect("ACL LOG RESET");

    // A restart empties the script cache (and the data): the existing client's connection
    // broke; the next call reconnects, loads the scripts and works.
    let client = RedisClient::open_with(
        &urls[0],
        ClientOptions::builder()
            .command_timeout(Duration::from_secs(2))
            .build()
            .unwrap(),
    )
    .expect("client");
    let lease = Duration::from_millis(900);
    let lock = SingleLock::builder(&client, "x1-restart")
        .lease(lease)
        .renewal_period(lease / 3)
        .build()
        .expect("lock");
    let g = lock.lock().await.expect("lock before the restart");
    assert_eq!(g.unlock().await.expect("unlock"), 0);
    servers[0].restart(Data::Wipe).expect("restart");
    // The library's acquire script (to ask the server whether its cache holds it).
    let acquire_sha = slate_redis::lua_script("acquire").expect("acquire").sha1;
    let cached = servers[0]
        .command(&["SCRIPT", "EXISTS", acquire_sha])
        .expect("SCRIPT EXISTS");
    assert_eq!(
        cached,
        redis::Value::Array(vec![redis::Value::Int(0)]),
        "the restart emptied the script cache"
    );
    let g = tokio::time::timeout(Duration::from_secs(5), lock.lock())
        .await
        .expect("bounded")
        .expect("lock after the restart");
    assert!(
        g.fencing_token().get() > 1_700_000_000_000_000,
        "the slot counter was seeded again from the server's clock: {}",
        g.fencing_token()
    );
    // The cache emptied again while held: the renewal pipeline meets NOSCRIPT, loads the
    // script with SCRIPT LOAD and renews; the release reloads its own.
    servers[0]
        .command(&["SCRIPT", "FLUSH"])
        .expect("SCRIPT FLUSH");
    hold_for("renewal after SCRIPT FLUSH", &g, lease * 3)
        .await
        .unwrap_or_else(|e| fail("NOSCRIPT", e));
    assert_eq!(g.unlock().await.expect("unlock after SCRIPT FLUSH"), 0);
    assert_eq!(acl_log(&servers[0]), [], "ACL LOG after the restart");
}

#[test]
fn x1_worker_processes_as_the_acl_user_keep_exclusion_with_an_empty_acl_log() {
    const PROCS: usize = 3;
    const TASKS: u64 = 4;
    const ITERATIONS: u64 = 25;
    let lease = Duration::from_secs(1);
    let lock_server = acl_builder().start().expect("redis-server");
    let resource = scenario::server();
    let dir = tempfile::tempdir().expect("tempdir");
    let go_file = dir.path().join("go");
    let history = dir.path().join("history");
    std::fs::create_dir(&history).expect("history dir");

    let mut w = Worker::new("contend", &lock_server, "x1-workers", &history);
    w.redis_url = vec![lock_server.url_for_user(USER, PASSWORD)];
    w.resource_url = Some(resource.url());
    w.tasks = TASKS;
    w.iterations = ITERATIONS;
    w.lease = lease;
    w.renewal = Some(Duration::from_millis(300));
    w.spin_wait = Some(Duration::from_millis(200));
    w.max_duration = Duration::from_secs(40);
    w.go_file = Some(go_file.clone());
    let mut workers = w.spawn(PROCS);
    wait_line_all(&mut workers, "READY", Duration::from_secs(20));
    go(&go_file);
    let outputs = finish_ok(&mut workers, Duration::from_secs(45));
    for out in &outputs {
        assert!(
            out.stderr.find(PASSWORD).is_none() && out.stdout.find(PASSWORD).is_none(),
            "worker {} printed the password",
            out.index
        );
    }
    let counter = get_u64(&resource, "counter");
    let cfg = CheckConfig {
        counter: Some(CounterCheck {
            final_value: counter,
            expected: CounterExpectation::FirstLevelAcquisitions,
        }),
        final_keys: Some(lock_keys(&lock_server)),
        ..CheckConfig::new(lease)
    };
    let (_, report) = check(&history, &cfg);
    report.assert_ok();
    // A worker exits 0 only after all its iterations (finish_ok).
    report.assert_contention(PROCS, (TASKS * ITERATIONS) as usize, 2);
    report.assert_pass(&[
        CheckId::Exclusion,
        CheckId::Tokens,
        CheckId::Ownership,
        CheckId::Counter,
        CheckId::Quiescence,
    ]);
    report.assert_pass_or_unchecked(CheckId::Reentry, "this scenario never re-enters");
    assert_eq!(counter, PROCS as u64 * TASKS * ITERATIONS);
    assert_eq!(acl_log(&lock_server), [], "ACL LOG after the worker run");
}

/// What one user without one command saw.
#[derive(Debug)]
struct Minus {
    missing: &'static str,
    single: Step<SingleRun>,
    combination: Step<()>,
    shared: Step<()>,
    /// That user's `ACL LOG` entries on all three servers.
    log: Vec<AclEntry>,
}

impl Minus {
    /// The command's name as `ACL LOG` and `NOPERM` replies spell it (`script|load`: `script`).
    fn base(&self) -> &'static str {
        self.missing.split('|').next().unwrap_or(self.missing)
    }

    /// The errors both runs ended with.
    fn errors(&self) -> Vec<&Error> {
        let mut v = Vec::new();
        if let Err((_, e)) = &self.single {
            v.push(e);
        }
        if let Err((_, e)) = &self.combination {
            v.push(e);
        }
        if let Err((_, e)) = &self.shared {
            v.push(e);
        }
        v
    }
}

/// For each of `missing`, a user with every command of [`NEEDED`] but that one runs both
/// locks (all users at once, each under its own prefix, so that one user's node marker or
/// script load cannot serve another).
async fn minus_matrix(missing: &[&'static str]) -> Vec<Minus> {
    let mut builder = acl_builder();
    for m in missing {
        let allowed: Vec<&str> = NEEDED.iter().copied().filter(|c| c != m).collect();
        builder = builder.acl_user(minus_user(m), PASSWORD, rules(&allowed));
    }
    let servers =
        std::sync::Arc::new(RedisServer::start_many_with(3, &builder).expect("redis-server"));
    let mut runs = tokio::task::JoinSet::new();
    for &m in missing {
        let servers = servers.clone();
        runs.spawn(async move {
            let user = minus_user(m);
            let urls: Vec<String> = servers
                .iter()
                .map(|s| s.url_for_user(&user, PASSWORD))
                .collect();
            let prefix = format!("slate:{user}:");
            let single = single_run(&urls[0], &prefix, "m").await;
            let shared = shared_run(&urls[0], &servers[0], &prefix, "ms").await;
            let combination = combination_run(urls, &servers, &prefix, "mc").await;
            (m, single, combination, shared)
        });
    }
    let mut results = Vec::new();
    while let Some(r) = runs.join_next().await {
        let (missing, single, combination, shared) = r.expect("run task");
        let user = minus_user(missing);
        let log = servers
            .iter()
            .flat_map(acl_log)
            .filter(|e| e.username == user)
            .collect();
        results.push(Minus {
            missing,
            single,
            combination,
            shared,
            log,
        });
    }
    results.sort_by_key(|m| NEEDED.iter().position(|c| *c == m.missing));
    for m in &results {
        println!(
            "without {:<12} single: {}\n{:21}combination: {}\n{:21}shared: {}\n{:21}ACL LOG: {:?}",
            m.missing,
            show(&m.single),
            "",
            show(&m.combination),
            "",
            show(&m.shared),
            "",
            m.log
                .iter()
                .map(|e| format!("{}/{}/{}", e.reason, e.context, e.object))
                .collect::<Vec<_>>()
        );
    }
    results
}

/// Top-level commands whose absence ends in a `Permission` error carrying Redis's own
/// `NOPERM ... 'cmd'` text. The other top-level ones: `SUBSCRIBE` (no error: waiters silently
/// fall back to the spin wait), `UNSUBSCRIBE` (no error: the pub/sub connection is dropped and
/// reopened), `SET` (refused first inside a script, the request record's, in the single
/// lock's run; `adopt_fresh_servers` reports the marker's as a permission error too),
/// `EXISTS` (used inside the scripts only, since the node marker is read with `GET` for its
/// stamp).
const NAMED_AT_TOP_LEVEL: &[&str] = &[
    "evalsha",
    "script|load",
    "ping",
    "get",
    "hget",
    "pttl",
    "info",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x1_every_listed_command_is_needed_and_a_missing_one_is_reported() {
    let results = minus_matrix(NEEDED).await;
    for m in &results {
        // Needed: the lock sent it (the user's only refusals are that command).
        assert!(
            m.log
                .iter()
                .any(|e| e.reason == "command" && e.object.split('|').next() == Some(m.base())),
            "without {}: nothing was refused, so the command is not needed (or not exercised)",
            m.missing
        );
        for e in &m.log {
            assert_eq!(
                (e.reason.as_str(), e.object.split('|').next()),
                ("command", Some(m.base())),
                "without {}: unexpected ACL LOG entry {e:?}",
                m.missing
            );
        }
        // Every missing command but UNSUBSCRIBE breaks something the user can see.
        if m.missing != "unsubscribe" {
            assert!(
                m.single.is_err() || m.combination.is_err() || m.shared.is_err(),
                "without {}: both runs passed",
                m.missing
            );
        }
    }
    // A command refused at top level is a Permission error naming it.
    for m in results
        .iter()
        .filter(|m| NAMED_AT_TOP_LEVEL.contains(&m.missing))
    {
        let quoted = format!("'{}", m.base());
        assert!(
            m.errors().iter().any(|e| {
                let text = e.to_string();
                text.contains(&quoted)
                    && (e.backend_kind() == Some(BackendKind::Permission)
                        || e.is_insufficient_nodes() && text.contains("permission error"))
            }),
            "without {}: no permission error naming it: {:?}",
            m.missing,
            m.errors().iter().map(|e| e.to_string()).collect::<Vec<_>>()
        );
    }
    // Every other missing command ends in a Permission error whose text names it: refused at
    // top level, Redis names it ('cmd'); refused inside a script, Redis 7.0 does not say which
    // command, and Slate's hint lists every command the lock runs, the missing one included.
    let mut unclear = Vec::new();
    for m in results
        .iter()
        .filter(|m| !matches!(m.missing, "subscribe" | "unsubscribe"))
    {
        let named = m.errors().iter().any(|e| {
            let text = e.to_string();
            text.to_lowercase().contains(m.base())
                && (e.backend_kind() == Some(BackendKind::Permission)
                    || e.is_insufficient_nodes() && text.contains("permission error"))
        });
        if !named {
            unclear.push((m.missing, show(&m.single), show(&m.combination)));
        }
    }
    assert_eq!(
        unclear,
        Vec::<(&str, String, String)>::new(),
        "missing commands without a permission error naming them"
    );
    // Without SUBSCRIBE the waiter still acquires, by the spin wait: nothing but the missing
    // wake-up (and ACL LOG) shows it (no error, no warning: see
    // `ecosphere/fork-probe/tests/log_subscribe.rs`).
    let sub = results
        .iter()
        .find(|m| m.missing == "subscribe")
        .expect("subscribe row");
    assert!(
        matches!(&sub.single, Err(("notification", _))),
        "without SUBSCRIBE: {}",
        show(&sub.single)
    );
}

/// The grant list of the `Permission` hint, applied as it reads, is enough for both locks
/// (it once was not: found by this test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x1_a_user_granted_what_the_permission_hint_says_runs_the_lock() {
    let servers = RedisServer::start_many_with(3, &acl_builder()).expect("redis-server");
    // The hint, as a user without any command reads it.
    servers[0]
        .command(&[
            "ACL", "SETUSER", "nothing", "on", ">pw", "~slate:*", "&slate:*", "-@all",
        ])
        .expect("ACL SETUSER");
    let client = RedisClient::open(servers[0].url_for_user("nothing", "pw")).expect("client");
    let err = client.ping().await.expect_err("a user without commands");
    assert_eq!(err.backend_kind(), Some(BackendKind::Permission), "{err}");
    let text = err.to_string();
    let hint = text
        .split("grant the ACL user ")
        .nth(1)
        .and_then(|h| h.split(" on the lock keys").next())
        .unwrap_or_else(|| panic!("no grant list in {text}"));
    let mut setuser = vec![
        "ACL",
        "SETUSER",
        "hinted",
        "on",
        ">pw",
        "resetkeys",
        "resetchannels",
        "~slate:*",
        "&slate:*",
        "-@all",
    ];
    let grants: Vec<String> = hint
        .split(", ")
        .map(|c| format!("+{}", c.trim().to_lowercase().replace(' ', "|")))
        .collect();
    setuser.extend(grants.iter().map(String::as_str));
    for s in &servers {
        s.command(&setuser).expect("ACL SETUSER hinted");
    }
    let urls: Vec<String> = servers
        .iter()
        .map(|s| s.url_for_user("hinted", "pw"))
        .collect();
    single_run(&urls[0], "slate:", "hinted")
        .await
        .unwrap_or_else(|e| fail(&format!("single lock as a user granted {grants:?}"), e));
    combination_run(urls.clone(), &servers, "slate:", "hinted-comb")
        .await
        .unwrap_or_else(|e| fail(&format!("combination lock as a user granted {grants:?}"), e));
    shared_run(&urls[0], &servers[0], "slate:", "hinted-shared")
        .await
        .unwrap_or_else(|e| fail(&format!("shared locks as a user granted {grants:?}"), e));
}

/// A password with every character a URL must escape, for the rendering checks.
const ODD_PASSWORD: &str = "p@ss:w/rd%?#&=+ \"'{}";

/// Every way `secret` could appear in a rendering: as given and percent-encoded.
fn forms(secret: &str) -> Vec<String> {
    let encoded: String = secret
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    vec![secret.to_owned(), encoded]
}

/// Fails if any of `texts` contains a form of `secret`.
fn assert_no_secret(secret: &str, texts: &[(String, String)]) {
    for (what, text) in texts {
        for form in forms(secret) {
            assert!(
                !text.contains(&form),
                "{what} shows the password ({form:?}): {text}"
            );
        }
    }
}

/// `Display`, `Debug` and every `source()` of an error.
fn renderings(what: &str, e: &Error) -> Vec<(String, String)> {
    let mut out = vec![
        (format!("{what} (Display)"), e.to_string()),
        (format!("{what} (Debug)"), format!("{e:?}")),
        (format!("{what} (alternate Debug)"), format!("{e:#?}")),
    ];
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push((format!("{what} (source)"), format!("{s} / {s:?}")));
        source = s.source();
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x1_wrong_password_is_an_auth_error_at_once_for_both_locks() {
    let servers = RedisServer::start_many_with(3, &acl_builder()).expect("redis-server");
    let wrong = "Wr0ng-Battery-Staple-42";
    let urls: Vec<String> = servers
        .iter()
        .map(|s| s.url_for_user(USER, wrong))
        .collect();
    let timeout = Duration::from_secs(2);
    let client = RedisClient::open_with(
        &urls[0],
        ClientOptions::builder()
            .command_timeout(timeout)
            .build()
            .unwrap(),
    )
    .expect("client");
    let lock = SingleLock::builder(&client, "x1-auth")
        .build()
        .expect("lock");
    let mut texts = Vec::new();
    // lock() has no deadline: it must still give up at once on a refused login, and so must
    // a try_lock_for with a long budget (no retry loop on Auth).
    for (what, call) in [("lock()", 0), ("try_lock_for(10 s)", 1)] {
        let start = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(8), async {
            if call == 0 {
                lock.lock().await
            } else {
                lock.try_lock_for(Duration::from_secs(10)).await
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{what} kept retrying a wrong password for 8 s"));
        let elapsed = start.elapsed();
        let err = r.expect_err("a wrong password");
        println!("{what}: {err} after {elapsed:?}");
        assert_eq!(err.backend_kind(), Some(BackendKind::Auth), "{what}: {err}");
        assert!(err.to_string().contains("check the password"), "{err}");
        assert!(
            elapsed < timeout,
            "{what} took {elapsed:?}, beyond the command timeout"
        );
        texts.extend(renderings(what, &err));
    }

    // The combination lock: every node refuses the login; the acquisition ends within its
    // wait with InsufficientNodes whose node reports say why.
    let nodes = NodeSet::connect(urls, node_opts()).expect("node set");
    let comb = CombinationLock::builder(&nodes, "x1-auth-comb")
        .lease(Duration::from_millis(1200))
        .acquire_budget(Duration::from_millis(900))
        .spin_wait(Duration::from_millis(50))
        .build()
        .expect("lock");
    let start = Instant::now();
    let err = tokio::time::timeout(
        Duration::from_secs(8),
        comb.try_lock_for(Duration::from_secs(2)),
    )
    .await
    .expect("bounded by the wait")
    .expect_err("a wrong password on every node");
    let elapsed = start.elapsed();
    println!("combination: {err} after {elapsed:?}");
    assert!(
        err.is_insufficient_nodes() || err.backend_kind() == Some(BackendKind::Auth),
        "{err}"
    );
    assert!(
        err.to_string().contains("authentication")
            || err.to_string().contains("check the password"),
        "the reason is named: {err}"
    );
    assert!(elapsed < Duration::from_secs(4), "{elapsed:?}");
    texts.extend(renderings("combination", &err));
    texts.push(("node set".into(), format!("{nodes:?} {:?}", nodes.report())));
    texts.push(("client".into(), format!("{client:?} {lock:?}")));
    assert_no_secret(wrong, &texts);
    // Bounded retries: the refused logins on node 0, as Redis counted them.
    let auth: Vec<AclEntry> = acl_log(&servers[0])
        .into_iter()
        .filter(|e| e.reason == "auth")
        .collect();
    let refused: u64 = auth.iter().map(|e| e.count).sum();
    println!("refused logins on node 0: {refused} ({auth:?})");
    assert!(refused >= 1, "Redis saw the wrong password");
    assert!(
        refused <= 10,
        "{refused} logins refused on node 0 for three calls: a retry loop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x1_a_lock_outside_the_users_prefix_is_refused_by_redis() {
    let servers = RedisServer::start_many_with(3, &acl_builder()).expect("redis-server");
    let urls: Vec<String> = servers
        .iter()
        .map(|s| s.url_for_user(USER, PASSWORD))
        .collect();
    let client = RedisClient::open(&urls[0]).expect("client");
    let inside = SingleLock::builder(&client, "x1-prefix")
        .build()
        .expect("lock");
    let outside = SingleLock::builder(&client, "x1-prefix")
        .key_prefix("other:")
        .build()
        .expect("lock");
    let err = outside
        .try_lock()
        .await
        .expect_err("a key outside ~slate:*");
    println!("outside the prefix: {err}");
    assert_eq!(err.backend_kind(), Some(BackendKind::Permission), "{err}");
    assert!(err.to_string().contains("keys"), "{err}");
    let err = outside
        .is_locked()
        .await
        .expect_err("a read outside ~slate:*");
    assert_eq!(err.backend_kind(), Some(BackendKind::Permission), "{err}");
    let keys: Vec<String> =
        redis::from_redis_value(servers[0].command(&["KEYS", "other:*"]).expect("KEYS"))
            .expect("KEYS reply");
    assert_eq!(keys, Vec::<String>::new(), "nothing was written outside");
    // The same client and name inside the prefix still work.
    let g = inside.try_lock().await.expect("inside").expect("free");
    assert_eq!(g.unlock().await.expect("unlock"), 0);

    // The combination lock outside the prefix: nothing can be adopted or acquired.
    let nodes = NodeSet::connect(urls, node_opts()).expect("node set");
    let refused = nodes
        .adopt_fresh_servers("other:")
        .await
        .expect_err("no node marker outside the prefix");
    assert_eq!(
        refused.backend_kind(),
        Some(BackendKind::Permission),
        "{refused}"
    );
    let comb = CombinationLock::builder(&nodes, "x1-prefix")
        .key_prefix("other:")
        .lease(Duration::from_millis(1200))
        .acquire_budget(Duration::from_millis(900))
        .build()
        .expect("lock");
    let err = tokio::time::timeout(
        Duration::from_secs(8),
        comb.try_lock_for(Duration::from_secs(1)),
    )
    .await
    .expect("bounded")
    .expect_err("outside the prefix");
    println!("combination outside the prefix: {err}");
    assert!(err.to_string().contains("permission"), "{err}");
    let refused: Vec<AclEntry> = acl_log(&servers[0])
        .into_iter()
        .filter(|e| e.reason == "key")
        .collect();
    assert!(
        refused.iter().all(|e| e.object.starts_with("other:")),
        "{refused:?}"
    );
    assert!(!refused.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x1_credentials_never_appear_in_debug_or_display() {
    let start = || {
        acl_builder()
            .acl_user("odd", ODD_PASSWORD.replace(' ', "_"), rules(NEEDED))
            .start()
            .expect("redis-server")
    };
    // A second server for the node set's second node (one server listed twice is refused).
    let (server, second) = (start(), start());
    let odd = ODD_PASSWORD.replace(' ', "_");
    let mut texts: Vec<(String, String)> = Vec::new();

    // Options and clients built from a URL and from options.
    let opts = ClientOptions::builder()
        .username(USER)
        .password(PASSWORD)
        .build()
        .unwrap();
    texts.push(("ClientOptions".into(), format!("{opts:?} {opts:#?}")));
    let from_url = RedisClient::open(server.url_for_user(USER, PASSWORD)).expect("client");
    let from_opts =
        RedisClient::open_with(format!("redis://127.0.0.1:{}", server.port()), opts.clone())
            .expect("client");
    let odd_client = RedisClient::open(server.url_for_user("odd", &odd)).expect("client");
    odd_client.ping().await.expect("odd password logs in");
    for (what, c) in [("from url", &from_url), ("from options", &from_opts)] {
        c.ping().await.expect("login");
        texts.push((
            format!("RedisClient {what}"),
            format!("{c:?} {c:#?} {} {:?}", c.address(), c.options()),
        ));
    }
    texts.push(("RedisClient odd".into(), format!("{odd_client:?}")));

    // Locks, builders and guards.
    let builder = SingleLock::builder(&from_url, "x1-render");
    texts.push(("SingleLockBuilder".into(), format!("{builder:?}")));
    let lock = builder.build().expect("lock");
    let guard = lock.lock().await.expect("lock");
    texts.push(("SingleLock".into(), format!("{lock:?} {guard:?}")));
    guard.unlock().await.expect("unlock");
    let urls = vec![
        server.url_for_user(USER, PASSWORD),
        second.url_for_user("odd", &odd),
    ];
    let node_opts = slate_combination::NodeSetOptionsBuilder::from(node_opts())
        .client_options(opts.clone())
        .build()
        .unwrap();
    texts.push(("NodeSetOptions".into(), format!("{node_opts:?}")));
    let nodes = NodeSet::connect(urls, node_opts).expect("node set");
    let comb_builder = CombinationLock::builder(&nodes, "x1-render")
        .lease(Duration::from_millis(1200))
        .acquire_budget(Duration::from_millis(900));
    texts.push(("CombinationLockBuilder".into(), format!("{comb_builder:?}")));
    let comb = comb_builder.build().expect("lock");
    texts.push((
        "NodeSet".into(),
        format!("{nodes:?} {:?} {comb:?}", nodes.report()),
    ));

    // Errors: wrong password, refused command, malformed URL, unreachable server.
    let wrong =
        RedisClient::open(server.url_for_user(USER, &format!("{PASSWORD}x"))).expect("client");
    let e = wrong.ping().await.expect_err("wrong password");
    texts.extend(renderings("auth error", &e));
    texts.push(("client with a wrong password".into(), format!("{wrong:?}")));
    let e = SingleLock::builder(&from_url, "x")
        .key_prefix("other:")
        .build()
        .expect("lock")
        .try_lock()
        .await
        .expect_err("outside the prefix");
    texts.extend(renderings("permission error", &e));
    for url in [
        format!("redis://{USER}:{PASSWORD}@127.0.0.1:notaport"),
        format!("redis://{USER}:{PASSWORD}@[::1"),
        format!("rediss://{USER}:{PASSWORD}@127.0.0.1:1"),
    ] {
        if let Err(e) = RedisClient::open(&url) {
            texts.extend(renderings("URL error", &e));
        }
    }
    let closed = ecosphere::server::RedisServer::start_many(2).expect("redis-server");
    let (port, port2) = (closed[0].port(), closed[1].port());
    drop(closed);
    let unreachable = RedisClient::open_with(
        format!("redis://{USER}:{PASSWORD}@127.0.0.1:{port}"),
        ClientOptions::builder()
            .connect_timeout(Duration::from_millis(500))
            .build()
            .unwrap(),
    )
    .expect("client");
    let e = unreachable.ping().await.expect_err("nothing listens");
    texts.extend(renderings("I/O error", &e));
    let e = NodeSet::connect(
        vec![
            format!("redis://{USER}:{PASSWORD}@127.0.0.1:{port}"),
            format!("redis://{USER}:{PASSWORD}@127.0.0.1:{port2}"),
        ],
        self::node_opts(),
    )
    .expect("node set");
    let e = CombinationLock::builder(&e, "x1-render")
        .lease(Duration::from_millis(1200))
        .acquire_budget(Duration::from_millis(900))
        .build()
        .expect("lock")
        .try_lock()
        .await
        .expect_err("no node");
    texts.extend(renderings("insufficient nodes", &e));

    // The scan itself finds a password, raw or percent-encoded.
    for url in [
        server.url_for_user(USER, PASSWORD),
        server.url_for_user("odd", &odd),
    ] {
        let found = std::panic::catch_unwind(|| {
            assert_no_secret(PASSWORD, &[("url".into(), url.clone())]);
            assert_no_secret(&odd, &[("url".into(), url.clone())]);
        });
        assert!(found.is_err(), "the scan misses the password in {url}");
    }
    println!("checked {} renderings", texts.len());
    assert_no_secret(PASSWORD, &texts);
    assert_no_secret(&odd, &texts);
}
