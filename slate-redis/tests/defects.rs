//! Regression tests for the defects of issue 19 that the single lock reaches, each named after
//! its defect and each failing on the code before its fix (commit ec39e02).

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use common::*;
use slate_harness::proxy::{FaultProxy, Mode};
use slate_harness::server::RedisServer;
use slate_redis::{LossReason, SingleLock};

/// Defect 3: the turn key got its TTL only at acquisition. A hold longer than the lease let
/// it expire; the release then read a tenure of 0 and kept the turn, so a process with two
/// local tasks that each hold longer than the lease starved every other process for ever.
/// Now renewal refreshes the turn with the lease, and the other process gets the lock after
/// at most a tenure (8) of the first process's acquisitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_holds_keep_the_tenure() {
    const LEASE: Duration = Duration::from_millis(200);
    const HOLD: Duration = Duration::from_millis(300); // longer than the lease: renewed
    const ROUNDS: u32 = 24; // three tenures
    let server = server();
    let (a, b) = (client(&server), client(&server)); // two "processes"
    let la = lock(&a, "tenure", LEASE);
    let lb = lock(&b, "tenure", LEASE);
    let acquisitions = Arc::new(AtomicU32::new(0));
    let b_won = Arc::new(AtomicBool::new(false));
    // Process A: two tasks, so that a release always leaves a local waiter behind.
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            let (la, n, b_won) = (la.clone(), acquisitions.clone(), b_won.clone());
            tokio::spawn(async move {
                while n.load(Ordering::SeqCst) < ROUNDS && !b_won.load(Ordering::SeqCst) {
                    let guard = la.lock().await.unwrap();
                    n.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(HOLD).await;
                    assert!(!guard.is_lost(), "renewal keeps a long hold");
                    guard.unlock().await.unwrap();
                }
            })
        })
        .collect();
    eventually(Duration::from_secs(5), "A holds", || {
        acquisitions.load(Ordering::SeqCst) >= 1
    })
    .await;
    // Process B asks while A holds; it must not wait for more than a tenure of A's holds.
    let asked_at = acquisitions.load(Ordering::SeqCst);
    let got = lb.try_lock_for(HOLD * (ROUNDS + 2)).await;
    let waited = acquisitions.load(Ordering::SeqCst) - asked_at;
    b_won.store(true, Ordering::SeqCst);
    let guard = got.unwrap_or_else(|e| {
        panic!("process B starved through {waited} acquisitions of process A: {e}")
    });
    guard.unlock().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        waited <= 8 + 1,
        "process B waited {waited} acquisitions of process A (tenure 8)"
    );
}

/// Defect 4: after the hold was lost, a re-entry was a fresh acquisition counted as one more
/// level; unlocking the stale outer guard then deleted the fresh entry while the inner guard
/// still believed it held the lock. A re-entry now fails with `LeaseLost` and creates
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_after_lost_lease_fails() {
    let server = server();
    let (a, b) = (client(&server), client(&server));
    let la = lock(&a, "lost", Duration::from_secs(5));
    let lb = lock(&b, "lost", Duration::from_secs(5));
    let outer = la.lock().await.unwrap();
    let holder = outer.holder();
    // The lease is lost: the entry is gone (as when it expired during a pause).
    assert_eq!(int(&server, &["DEL", "slate:{lost}"]), 1);
    let err = match outer.reenter().await {
        Ok(inner) => panic!(
            "a re-entry whose hold was lost got a fresh hold counted as a level ({} levels)",
            inner.depth()
        ),
        Err(e) => e,
    };
    assert!(
        matches!(
            err,
            slate_core::Error::LeaseLost {
                reason: LossReason::EntryGone,
                ..
            }
        ),
        "{err:?}"
    );
    // Nothing was created, and the local hold still has its one level.
    assert!(!la.is_locked().await.unwrap());
    assert_eq!(la.local_owner(), Some((holder, 1)));
    // Another process can take the lock; the stale guard's release does not touch it.
    let other = lb.try_lock().await.unwrap().expect("the lock is free");
    assert!(outer.unlock().await.unwrap_err().is_not_held());
    assert!(lb.is_locked().await.unwrap());
    assert_eq!(la.local_owner(), None);
    other.unlock().await.unwrap();
}

/// The same through `lock_as` with an inner guard alive: the outer guard's holder re-enters
/// while its entry is gone and another process holds the lock: `LeaseLost` (unchanged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_while_another_process_holds_fails() {
    let server = server();
    let (a, b) = (client(&server), client(&server));
    let la = lock(&a, "lost2", Duration::from_secs(5));
    let lb = lock(&b, "lost2", Duration::from_secs(5));
    let outer = la.lock().await.unwrap();
    assert_eq!(int(&server, &["DEL", "slate:{lost2}"]), 1);
    let other = lb.try_lock().await.unwrap().expect("the lock is free");
    let err = la.lock_as(outer.holder()).await.unwrap_err();
    assert!(err.is_lease_lost(), "{err:?}");
    assert_eq!(lb.hold_count(other.holder()).await.unwrap(), 1);
    other.unlock().await.unwrap();
    drop(outer);
}

/// A one-node Redis Cluster owning every slot: a script whose keys span two slots fails with
/// CROSSSLOT there, as on any cluster.
fn cluster_node() -> RedisServer {
    let server = RedisServer::builder()
        .arg("cluster-enabled", "yes")
        .start()
        .expect("start redis-server in cluster mode");
    server
        .command(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"])
        .expect("CLUSTER ADDSLOTSRANGE");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let info: String =
            redis::from_redis_value(server.command(&["CLUSTER", "INFO"]).unwrap()).unwrap();
        if info.contains("cluster_state:ok") {
            return server;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "cluster state: {info}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Defect 7: a name beginning with `}` gave the keys an empty hash tag (`p:{}x}`), so each key
/// hashed whole and every script failed with CROSSSLOT on a cluster. Every script of the
/// single lock runs here on a cluster node for hostile names: acquire, re-entry, busy answer,
/// renewal (with the turn key), release with a waiter queued (queue, turn, channel), force
/// unlock and the queries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_beginning_with_a_brace_stay_in_one_slot() {
    let server = cluster_node();
    let (a, b) = (client(&server), client(&server));
    for name in ["}x", "}", "{}", "{{}}", "a}b", "{a", "}{", "x{y}z"] {
        let lease = Duration::from_millis(300);
        let la = lock(&a, name, lease);
        let lb = SingleLock::builder(&b, name).lease(lease).build().unwrap();
        let outer = la.lock().await.unwrap();
        let inner = outer.reenter().await.unwrap();
        assert!(lb.try_lock().await.unwrap().is_none(), "{name}: busy");
        let waiter = {
            let lb = lb.clone();
            tokio::spawn(async move { lb.lock().await })
        };
        eventually(Duration::from_secs(5), "the waiter queued", || {
            lb.local_waiters() == 1
        })
        .await;
        // Renewed (with the turn key, in one script) at least twice: the deadline moved past
        // a whole lease beyond the first one; a CROSSSLOT renewal would lose the lease.
        let first = outer.lease_deadline();
        eventually(Duration::from_secs(5), "two renewals", || {
            outer.is_lost() || outer.lease_deadline() > first + lease
        })
        .await;
        assert!(
            !outer.is_lost(),
            "{name}: renewal failed: {:?}",
            outer.lease().loss_reason()
        );
        assert_eq!(la.hold_count(outer.holder()).await.unwrap(), 2, "{name}");
        assert!(la.remaining_lease().await.unwrap().is_some(), "{name}");
        assert_eq!(inner.unlock().await.unwrap(), 1, "{name}");
        assert_eq!(outer.unlock().await.unwrap(), 0, "{name}");
        let guard = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap_or_else(|e| panic!("{name}: waiter: {e}"));
        assert_eq!(lb.force_unlock().await.unwrap(), 1, "{name}: force unlock");
        assert!(guard.unlock().await.unwrap_err().is_not_held(), "{name}");
        assert!(!la.is_locked().await.unwrap(), "{name}");
    }
}

/// Issue 19, "also": can a timed-out acquire whose undo runs after the request record's
/// window (a server that resumes long after) leave an orphan entry? No: the undo is written
/// on the acquire's own connection right after the timeout, so the server runs the two in
/// order whenever it resumes, and the record is written by the acquire itself, at that time.
/// Here the server is frozen for five record windows with both in its socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undo_of_an_acquire_held_past_the_record_window_leaves_no_entry() {
    const TIMEOUT: Duration = Duration::from_millis(200); // record window: 400 ms
    let mut server = server();
    let client = client_with(
        &server,
        slate_redis::ClientOptions::builder()
            .command_timeout(TIMEOUT)
            .build()
            .unwrap(),
    );
    let lock = lock(&client, "held-up", Duration::from_secs(10));
    // Connection and scripts ready before the freeze.
    lock.lock().await.unwrap().unlock().await.unwrap();
    server.pause().unwrap();
    let err = lock.try_lock().await.unwrap_err();
    assert!(
        err.backend_kind() == Some(slate_core::BackendKind::Timeout),
        "{err}"
    );
    // The fault's length, not a wait for a condition: five record windows.
    tokio::time::sleep(TIMEOUT * 10).await;
    server.resume().unwrap();
    // Both ran once the holder's request record (written by each of them) is there.
    eventually(
        Duration::from_secs(5),
        "the acquire and its undo to run",
        || keys(&server).iter().any(|k| k.contains(":req:")),
    )
    .await;
    assert!(
        !keys(&server).contains(&"slate:{held-up}".to_owned()),
        "orphan entry: {:?}",
        keys(&server)
    );
}

/// A client whose commands go straight to `server` and whose pub/sub connection goes through
/// `proxy`.
fn client_with_pubsub_via(server: &RedisServer, proxy: &FaultProxy) -> slate_redis::RedisClient {
    let pool = deadpool_redis::Config::from_url(server.url())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    slate_redis::RedisClient::from_pool(pool, redis::Client::open(proxy.url()).unwrap()).unwrap()
}

/// Issue 19, "also": the pub/sub listener awaited each `SUBSCRIBE` inline and dispatched no
/// message meanwhile, so with many contended names a waiter could wait seconds for a release
/// message that had already arrived. Here lock B's `SUBSCRIBE` is held up 3 s on its way to
/// the server (only the pub/sub connection goes through the proxy); lock A is released
/// meanwhile, and its waiter (spin wait 30 s: only the message can wake it) must get the lock
/// before B's subscription could possibly have been confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_messages_are_dispatched_while_a_subscription_is_on_its_way() {
    const HELD_UP: Duration = Duration::from_secs(3);
    let server = server();
    let proxy = FaultProxy::start(server.addr()).unwrap();
    let waiter_client = client_with_pubsub_via(&server, &proxy);
    let holder_client = client(&server);
    let build = |c: &slate_redis::RedisClient, name: &str| {
        SingleLock::builder(c, name)
            .lease(Duration::from_secs(30))
            .spin_wait(Duration::from_secs(30))
            .build()
            .unwrap()
    };
    let (held_a, held_b) = (
        build(&holder_client, "a").lock().await.unwrap(),
        build(&holder_client, "b").lock().await.unwrap(),
    );
    let (wa, wb) = (build(&waiter_client, "a"), build(&waiter_client, "b"));
    let task_a = {
        let wa = wa.clone();
        tokio::spawn(async move { wa.lock().await })
    };
    // A's waiter is parked with its subscription confirmed (the first parked wait).
    eventually(Duration::from_secs(5), "A's waiter subscribed", || {
        let stats = waiter_client.stats();
        stats.subscriptions == 1 && stats.pubsub_up && wa.local_waiters() == 1
    })
    .await;
    proxy
        .set_mode(Mode::Delay {
            to_server: HELD_UP,
            to_client: Duration::ZERO,
        })
        .unwrap();
    let task_b = {
        let wb = wb.clone();
        tokio::spawn(async move { wb.lock().await })
    };
    eventually(Duration::from_secs(5), "B's subscription requested", || {
        waiter_client.stats().subscriptions == 2
    })
    .await;
    let released = std::time::Instant::now();
    held_a.unlock().await.unwrap();
    let guard_a = tokio::time::timeout(HELD_UP * 3, task_a)
        .await
        .expect("A's waiter acquires")
        .unwrap()
        .unwrap();
    let woke_after = released.elapsed();
    assert!(
        woke_after < HELD_UP,
        "A's waiter woke {woke_after:?} after the release: its message waited for B's SUBSCRIBE"
    );
    guard_a.unlock().await.unwrap();
    proxy.set_mode(Mode::Pass).unwrap();
    held_b.unlock().await.unwrap();
    let guard_b = tokio::time::timeout(Duration::from_secs(10), task_b)
        .await
        .expect("B's waiter acquires")
        .unwrap()
        .unwrap();
    guard_b.unlock().await.unwrap();
}

/// Issue 19, "also": a name contended on and off (a waiter parks, the lock frees, the queue
/// drains, again) cost a `SUBSCRIBE` and an `UNSUBSCRIBE` per wait. A drained channel now
/// lingers: 20 such waits in a row cost one subscription.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_contended_on_and_off_subscribes_once_per_linger() {
    let server = server();
    let (a, b) = (client(&server), client(&server));
    let la = lock(&a, "churn", Duration::from_secs(5));
    let lb = lock(&b, "churn", Duration::from_secs(5));
    let subscribes = || {
        let text: String =
            redis::from_redis_value(server.command(&["INFO", "commandstats"]).unwrap()).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("cmdstat_subscribe:"))
            .and_then(|f| f.split(',').find_map(|x| x.strip_prefix("calls=")))
            .map_or(0, |n| n.parse::<u64>().unwrap())
    };
    for _ in 0..20 {
        let held = la.lock().await.unwrap();
        let waiter = {
            let lb = lb.clone();
            tokio::spawn(async move { lb.lock().await })
        };
        eventually(Duration::from_secs(5), "the waiter subscribed", || {
            b.stats().subscriptions == 1 && lb.local_waiters() == 1
        })
        .await;
        held.unlock().await.unwrap();
        let g = waiter.await.unwrap().unwrap();
        g.unlock().await.unwrap();
    }
    let n = subscribes();
    assert!(n <= 3, "{n} SUBSCRIBE commands for 20 waits on one name");
}

/// Issue 19, "also", and issue 30: fencing counters never expired, so per-entity lock names
/// grew Redis memory without bound (a persistent counter per name). The single lock counts
/// tokens on its hash slot's counter: a name whose lease ended leaves no key at all, tokens of
/// one lock still increase strictly (across holders, across names of the slot, re-entry keeps
/// the token), and a server that lost its data seeds a new counter from its clock, above every
/// earlier token, where a persistent per-name counter restarted at 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_name_leaves_no_key_and_tokens_still_increase() {
    const LEASE: Duration = Duration::from_millis(300);
    let mut server = server();
    let (a, b) = (client(&server), client(&server));
    let build = |c: &slate_redis::RedisClient, name: &str| {
        SingleLock::builder(c, name).lease(LEASE).build().unwrap()
    };
    let (la, lb) = (build(&a, "idle"), build(&b, "idle"));
    // A hold three times the lease: renewal keeps it, re-entry keeps the token.
    let g = la.lock().await.unwrap();
    let first = g.fencing_token().get();
    assert!(
        first > 1_700_000_000_000_000,
        "seeded from the clock: {first}"
    );
    tokio::time::sleep(LEASE * 3).await;
    assert!(!g.is_lost());
    let inner = g.reenter().await.unwrap();
    assert_eq!(inner.fencing_token().get(), first);
    inner.unlock().await.unwrap();
    g.unlock().await.unwrap();
    // Another holder: strictly greater.
    let g = lb.lock().await.unwrap();
    let second = g.fencing_token().get();
    assert!(second > first);
    g.unlock().await.unwrap();
    // Nothing of the name is left: only slot counters, whatever the name.
    let names: Vec<String> = (0..50).map(|i| format!("entity:{i}")).collect();
    for name in &names {
        let g = build(&a, name).lock().await.unwrap();
        assert!(g.fencing_token().get() > first);
        g.unlock().await.unwrap();
    }
    let left = keys(&server);
    assert!(
        left.iter().all(|k| k.starts_with("slate:fence:{")),
        "idle names left keys behind: {left:?}"
    );
    assert!(left.len() <= 51, "one counter per slot used: {left:?}");
    let g = la.lock().await.unwrap();
    let third = g.fencing_token().get();
    assert!(third > second, "{third} after {second}");
    g.unlock().await.unwrap();
    // A server that loses its data: a persistent per-name counter would restart at 1.
    server
        .restart(slate_harness::server::Data::Wipe)
        .expect("restart empty");
    let g = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match lb.lock().await {
                Ok(g) => return g,
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .expect("the lock after the restart");
    assert!(g.fencing_token().get() > third);
    g.unlock().await.unwrap();
}

/// The fair turn, deterministically (issue 33: the `grant-ignores-turn` mutant must fail a
/// test every time, not when the timing happens to starve a process): process Q waits
/// behind P through a link that stalls just before P releases, so the turn P hands to Q
/// stays unclaimed for its reservation (1 s: twice P's spin wait). Meanwhile a third
/// process's `try_lock` must be told busy: the free lock is Q's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_handed_to_a_stalled_process_is_kept_for_it() {
    let server = server();
    let proxy = FaultProxy::start(server.addr()).expect("proxy");
    let (p, r) = (client(&server), client(&server));
    // Q's replies may take the proxy's 2 s delay and more: its calls must not time out first
    // (with the default 2 s command timeout this test raced its own timeout).
    let q = slate_redis::RedisClient::open_with(
        proxy.url(),
        slate_redis::ClientOptions::builder()
            .command_timeout(Duration::from_secs(5))
            .build()
            .unwrap(),
    )
    .unwrap();
    let build = |c: &slate_redis::RedisClient| {
        SingleLock::builder(c, "turn")
            .lease(Duration::from_secs(10))
            .spin_wait(Duration::from_millis(500))
            .build()
            .unwrap()
    };
    let (lp, lq, lr) = (build(&p), build(&q), build(&r));
    let held = lp.lock().await.unwrap();
    let waiter = tokio::spawn(async move { lq.lock().await.unwrap().unlock().await });
    eventually(Duration::from_secs(5), "Q queued", || {
        int(&server, &["ZCARD", "slate:{turn}:queue"]) == 1
    })
    .await;
    proxy
        .set_mode(Mode::Delay {
            to_server: Duration::from_secs(2),
            to_client: Duration::ZERO,
        })
        .unwrap();
    held.unlock().await.unwrap();
    let barged = lr.try_lock().await.unwrap();
    let barged = barged.map(|g| g.holder());
    proxy.set_mode(Mode::Pass).unwrap();
    assert_eq!(
        barged, None,
        "a third process took the free lock reserved for Q's turn"
    );
    within(Duration::from_secs(10), "Q's turn", waiter)
        .await
        .unwrap()
        .unwrap();
}

/// `.ci/mutants` runs mutants against this file's tests: they must be built with the switches
/// (the `mutants` feature of the dev-dependency on slate-core), or every mutant here would go
/// uncaught without a word.
#[test]
#[allow(
    clippy::assertions_on_constants,
    reason = "the constant is what this build's features made it"
)]
fn the_mutant_switches_are_built_into_these_tests() {
    assert!(
        slate_core::mutant::BUILT_IN,
        "slate-redis's tests lack the mutant switches: its dev-dependency on slate-core needs \
         features = [\"mutants\"]"
    );
}
