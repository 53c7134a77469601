//! Regression tests for the defects of issue 35 that the single lock's client reaches, each
//! named after its defect (`dN_…`) and each failing on the code before its fix (14afbf3).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use slate_harness::proxy::{FaultProxy, Mode};
use slate_harness::server::RedisServer;
use slate_redis::{ClientOptions, HolderId, RedisClient, RwLock, SingleLock};

/// A client of `group`'s master that waits for its one replica's acknowledgement `within`.
fn synced_sentinel_client(
    group: &slate_harness::sentinel::SentinelGroup,
    within: Duration,
) -> RedisClient {
    RedisClient::open_sentinel(
        group.sentinel_urls(),
        group.master_name(),
        ClientOptions::builder()
            .synced_replicas(1, within)
            .build()
            .unwrap(),
    )
    .unwrap()
}

/// A read-write lock `name` with a 10 s lease.
fn rw_lock(client: &RedisClient, name: &str) -> RwLock {
    RwLock::builder(client, name)
        .lease(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Defect 9: with `fence_expiry`, the acquire script wrote its request record by
/// concatenation, and a µs-scale token (the expiring fence starts from the server's clock)
/// came out as `1.7649e+15`; the record's pattern no longer matched, so a retried acquire
/// whose first reply was lost was applied again as a re-entry: count 2 in Redis, 1 locally,
/// the lock blocked for a lease. The retry must answer what the first run did, for a first
/// acquisition and for a re-entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d9_a_retried_acquire_with_a_clock_scale_token_is_not_an_extra_level() {
    const LEASE: Duration = Duration::from_secs(10);
    let server = server();
    let proxy = FaultProxy::start(server.addr()).expect("proxy");
    let client = RedisClient::open_with(
        proxy.url(),
        ClientOptions::builder()
            .command_timeout(Duration::from_secs(3))
            .build()
            .unwrap(),
    )
    .expect("client");
    client.ping().await.expect("ping through the proxy");
    // Tokens are µs-scale by default now (the slot counter is seeded from the clock); they
    // were with `fence_expiry` when the defect was found.
    let lock = SingleLock::builder(&client, "d9")
        .lease(LEASE)
        .build()
        .unwrap();
    let holder = HolderId::new();
    let depth = || {
        let v = server
            .command(&["HGET", "slate:{d9}", &holder.to_string()])
            .expect("HGET");
        redis::from_redis_value::<Option<i64>>(v)
            .expect("count")
            .unwrap_or(0)
    };
    // Drops replies until the server shows the script ran, then breaks the connection: the
    // client resends the same request on a new one.
    let lose_reply_once = |what: &'static str, want: i64| {
        let proxy = &proxy;
        let depth = &depth;
        async move {
            eventually(Duration::from_secs(5), what, || depth() == want).await;
            proxy.set_mode(Mode::Pass).expect("pass");
            proxy.reset_all().expect("reset");
        }
    };

    proxy.set_mode(Mode::DropReplies).unwrap();
    let acquire = tokio::spawn({
        let lock = lock.clone();
        async move { lock.lock_as(holder).await }
    });
    lose_reply_once("the first acquire to run", 1).await;
    let guard = within(Duration::from_secs(5), "the retried acquire", acquire)
        .await
        .unwrap()
        .expect("the retry answers the first run's grant");
    let token = guard.fencing_token().get();
    assert!(token > 1_000_000_000_000_000, "a µs-scale token: {token}");
    assert_eq!(guard.depth(), 1);
    assert_eq!(depth(), 1, "the retried acquire was applied as a re-entry");

    proxy.set_mode(Mode::DropReplies).unwrap();
    let reentry = tokio::spawn({
        let lock = lock.clone();
        async move { lock.lock_as(holder).await }
    });
    lose_reply_once("the re-entry to run", 2).await;
    let inner = within(Duration::from_secs(5), "the retried re-entry", reentry)
        .await
        .unwrap()
        .expect("re-entry");
    assert_eq!(inner.depth(), 2);
    assert_eq!(depth(), 2, "the retried re-entry was applied twice");
    assert_eq!(
        inner.fencing_token().get(),
        token,
        "a re-entry keeps the token"
    );

    assert_eq!(inner.unlock().await.unwrap(), 1);
    assert_eq!(guard.unlock().await.unwrap(), 0);
    assert_eq!(depth(), 0);
}

/// Defect 15: with `synced_replicas`, a renewal answered `NOSCRIPT` (a server that lost its
/// script cache: a promoted replica, exactly when replication lags) was sent again after
/// `SCRIPT LOAD` without `WAIT`, so it extended the deadline although no replica had the
/// renewal. The retry waits like the first send: with the only replica stopped, the holder's
/// lease is not extended and ends at the deadline of its grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d15_a_renewal_retried_after_noscript_waits_for_the_replicas() {
    const LEASE: Duration = Duration::from_secs(1);
    let mut group = slate_harness::sentinel::SentinelGroup::start(1, 1).unwrap();
    let client = synced_sentinel_client(&group, Duration::from_millis(100));
    let lock = SingleLock::builder(&client, "d15")
        .lease(LEASE)
        .build()
        .unwrap();
    // A just-started replica may miss the first acknowledgement window: retry the grant.
    let until = std::time::Instant::now() + Duration::from_secs(5);
    let guard = loop {
        if let Ok(Some(g)) = lock.try_lock().await {
            break g;
        }
        assert!(std::time::Instant::now() < until, "no first grant");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let granted = guard.lease_deadline();
    // The next renewal (half a lease after the grant) meets an empty script cache and a
    // replica that acknowledges nothing.
    group.server(0).command(&["SCRIPT", "FLUSH"]).unwrap();
    group.server_mut(1).pause().unwrap();
    tokio::time::sleep_until((granted + Duration::from_millis(200)).into()).await;
    let (lost, deadline) = (guard.is_lost(), guard.lease_deadline());
    group.server_mut(1).resume().unwrap();
    assert!(
        lost && deadline == granted,
        "the renewal retried after NOSCRIPT moved the deadline {:?} past the grant's without \
         the replica",
        deadline.saturating_duration_since(granted)
    );
    drop(guard);
}

/// Defect 1: releasing a reader that reads through its process's shared read hold checked
/// its depth, released a level and left the hold in three steps, each under its own lock.
/// A guard and its re-entry unlocked at once on two threads both saw depth 2, both released
/// a level, and neither left: the Redis read hold kept its member for ever (renewed, so
/// every writer anywhere stayed busy). Now one step decides which release is the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d1_a_reader_and_its_reentry_unlocked_at_once_leave_no_read_hold() {
    let server = server();
    let client = client(&server);
    let rw = rw_lock(&client, "d1");
    let started = std::time::Instant::now();
    let mut rounds = 0;
    while rounds < 3000 && started.elapsed() < Duration::from_secs(30) {
        rounds += 1;
        let outer = rw.read().await.unwrap();
        let inner = outer.reenter().await.unwrap();
        let answers = tokio::task::spawn_blocking(move || {
            let barrier = std::sync::Barrier::new(2);
            std::thread::scope(|s| {
                let a = s.spawn(|| {
                    barrier.wait();
                    outer.blocking_unlock()
                });
                let b = s.spawn(|| {
                    barrier.wait();
                    inner.blocking_unlock()
                });
                (a.join().unwrap(), b.join().unwrap())
            })
        })
        .await
        .unwrap();
        let (a, b) = (answers.0.unwrap(), answers.1.unwrap());
        assert_eq!(a.min(b), 0, "round {rounds}: levels left {a} and {b}");
        assert!(
            rw.local_readers().is_empty(),
            "round {rounds}: readers left {:?}",
            rw.local_readers()
        );
        assert_eq!(
            int(&server, &["EXISTS", "slate:{d1}:rw"]),
            0,
            "round {rounds}: the Redis read hold was left behind"
        );
    }
    println!("{rounds} rounds of concurrent unlocks");
}

/// Defect 10: a passable acquisition reserved a block of a whole tenure (8 tokens) whatever
/// was left of its process's row, so a process 7 acquisitions into its row took 8 more by
/// passing: 15 in a row while another process waited. Process A here first runs two tasks
/// with named holders (every release leaves a local waiter, so A keeps the turn, but named
/// holds are never passed); once its row reaches 6 they stop and two tasks of plain `lock()`
/// take over, whose next acquisition is passable. Process B, waiting since before, must get
/// the lock within a tenure of A's acquisitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d10_passes_do_not_stretch_the_tenure() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    const HOLD: Duration = Duration::from_millis(15);
    let server = server();
    let (a, b) = (client(&server), client(&server));
    let build = |c: &RedisClient| {
        SingleLock::builder(c, "d10")
            .lease(Duration::from_secs(5))
            .build()
            .unwrap()
    };
    let (la, lb) = (build(&a), build(&b));
    let acquisitions = Arc::new(AtomicU32::new(0));
    let (named_stop, stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let task = |named: Option<HolderId>, stop: &Arc<AtomicBool>| {
        let (la, n, stop) = (la.clone(), acquisitions.clone(), stop.clone());
        tokio::spawn(async move {
            let mut rounds = 0;
            while !stop.load(Ordering::SeqCst) && rounds < 200 {
                rounds += 1;
                let g = match named {
                    Some(h) => la.lock_as(h).await.unwrap(),
                    None => la.lock().await.unwrap(),
                };
                n.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(HOLD).await;
                g.unlock().await.unwrap();
            }
        })
    };
    let mut tasks = vec![
        task(Some(HolderId::new()), &named_stop),
        task(Some(HolderId::new()), &named_stop),
    ];
    eventually(Duration::from_secs(5), "A holds", || {
        acquisitions.load(Ordering::SeqCst) >= 1
    })
    .await;
    let asked_at = acquisitions.load(Ordering::SeqCst);
    let waiter = tokio::spawn(async move {
        let g = lb.lock().await.unwrap();
        g.unlock().await.unwrap();
    });
    // B is queued; A's row grows one acquisition at a time (`n` of the turn).
    eventually(Duration::from_secs(10), "A's row to reach 6", || {
        let n = server.command(&["HGET", "slate:{d10}:turn", "n"]).unwrap();
        redis::from_redis_value::<Option<i64>>(n)
            .unwrap()
            .is_some_and(|n| n >= 6)
    })
    .await;
    named_stop.store(true, Ordering::SeqCst);
    tasks.push(task(None, &stop));
    tasks.push(task(None, &stop));
    within(Duration::from_secs(20), "B's turn", waiter)
        .await
        .unwrap();
    let waited = acquisitions.load(Ordering::SeqCst) - asked_at;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    assert!(
        waited <= 8 + 1,
        "process B waited {waited} acquisitions of process A (tenure 8)"
    );
}

/// Defect 11: a `try_read` was sent to Redis while a writer of its own process waited there,
/// and its grant took the process's place among the waiting processes (the place the writer
/// waits in), so a polling `try_read` loop starved its own process's writer. A shared try now
/// answers busy while a task of its process waits, and sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d11_a_try_read_does_not_pass_its_own_processs_queued_writer() {
    let server = server();
    let (p, q) = (client(&server), client(&server));
    let build = |c: &RedisClient| rw_lock(c, "d11");
    let (lp, lq) = (build(&p), build(&q));
    let q_read = lq.read().await.unwrap();
    let writer = tokio::spawn({
        let lp = lp.clone();
        async move { lp.write().await.unwrap().unlock().await.unwrap() }
    });
    eventually(
        Duration::from_secs(5),
        "P's writer to queue in Redis",
        || int(&server, &["ZCARD", "slate:{d11}:rw:queue"]) == 1,
    )
    .await;
    for _ in 0..20 {
        if let Some(g) = lp.try_read().await.unwrap() {
            g.unlock().await.unwrap();
            panic!("a try_read passed its own process's queued writer");
        }
    }
    assert_eq!(
        int(&server, &["ZCARD", "slate:{d11}:rw:queue"]),
        1,
        "the writer's place among the waiting processes"
    );
    q_read.unlock().await.unwrap();
    within(Duration::from_secs(5), "P's writer", writer)
        .await
        .unwrap();
}

/// Defect 4: a `WAIT` that failed with anything but a timeout or a broken connection (here a
/// server that refuses `WAIT`) left the grant the script had just written in Redis,
/// unrenewed, blocking every other holder for a lease. Every failed acquire is now undone by
/// its request id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d4_an_acquire_whose_wait_fails_leaves_no_grant() {
    let server = slate_harness::server::RedisServer::builder()
        .arg("rename-command", "WAIT \"\"")
        .start()
        .expect("redis-server without WAIT");
    let client = RedisClient::open_with(
        server.url(),
        ClientOptions::builder()
            .synced_replicas(1, Duration::from_millis(100))
            .build()
            .unwrap(),
    )
    .unwrap();
    let lock = SingleLock::builder(&client, "d4")
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let e = match lock.try_lock().await {
        Err(e) => e,
        Ok(g) => panic!("granted without WAIT: {:?}", g.map(|g| g.depth())),
    };
    println!("try_lock: {e}");
    eventually(Duration::from_secs(5), "the grant to be undone", || {
        int(&server, &["EXISTS", "slate:{d4}"]) == 0
    })
    .await;
}

/// Defect 3: an acquire resent after its connection broke found its request record and
/// answered the first run's grant without writing anything, so the `WAIT` behind it on the
/// new connection had nothing to wait for and counted every replica at once: a grant that
/// may exist on no replica passed as replicated. A replayed answer now writes its record
/// again, so the `WAIT` covers it (and, replication being in order, the grant before it). Here
/// the replica is stopped before the replay: the `WAIT` must answer 0.
#[test]
fn d3_a_replayed_acquire_is_covered_by_the_wait_after_it() {
    let master = server();
    let replica = slate_harness::server::RedisServer::builder()
        .arg("replicaof", format!("127.0.0.1 {}", master.port()))
        .start()
        .expect("replica");
    let until = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let info = master.command(&["INFO", "replication"]).unwrap();
        let info: String = redis::from_redis_value(info).unwrap();
        if info.contains("state=online") {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "the replica never synced: {info}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // `wait_ms`: how long the WAIT may take (long while the replica is up: a loaded machine).
    let acquire = |request: &str, wait_ms: u64| -> (Vec<i64>, i64) {
        // A new connection each time, as a resend after a broken one.
        let mut con = master.connection().unwrap();
        let reply = acquire_script(&mut con, "d3", "h1", request, "1");
        let acked: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(wait_ms)
            .query(&mut con)
            .unwrap();
        (reply, acked)
    };
    let (first, acked) = acquire("41", 5000);
    assert_eq!(
        (first[0], first.len(), acked),
        (1, 2, 1),
        "the grant, replicated"
    );
    // Replayed with the replica up: acknowledged (on Redis 7.0 a WAIT with no write on its
    // connection answered 0, so the replay was taken for unreplicated and given back).
    let (again, acked) = acquire("41", 5000);
    assert_eq!(
        (again.as_slice(), acked),
        (first.as_slice(), 1),
        "a replay, replicated"
    );
    let mut replica = replica;
    replica.pause().unwrap();
    let (again, acked) = acquire("41", 300);
    replica.resume().unwrap();
    assert_eq!(again, first, "the replay answers the first run's grant");
    assert_eq!(
        acked, 0,
        "WAIT counted a stopped replica for a replayed grant that wrote nothing"
    );
}

/// Defect 14: every lock key has a TTL, so a server whose `maxmemory-policy` evicts keys
/// (`volatile-*` first of all) can drop a held lock and grant it again, and nothing said so.
/// A client now reads the policy on each new connection: with `refuse_evicting_server` it
/// refuses such a server with the policy and the fix named; without it, it works and warns
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d14_a_server_that_evicts_lock_keys_is_refused_when_asked() {
    let evicting = slate_harness::server::RedisServer::builder()
        .arg("maxmemory-policy", "volatile-lru")
        .start()
        .expect("redis-server");
    let strict = || {
        ClientOptions::builder()
            .refuse_evicting_server(true)
            .build()
            .unwrap()
    };
    let refusing = RedisClient::open_with(evicting.url(), strict()).unwrap();
    let e = refusing
        .ping()
        .await
        .expect_err("an evicting server was used");
    let text = e.to_string();
    assert!(
        text.contains("volatile-lru") && text.contains("noeviction"),
        "the error names the policy and the fix: {text}"
    );
    // Without the option the server is used (and a warning logged).
    let lenient = client(&evicting);
    let lock = SingleLock::builder(&lenient, "d14").build().unwrap();
    lock.lock().await.unwrap().unlock().await.unwrap();
    // A `noeviction` server is accepted by a strict client.
    let safe = server();
    let ok = RedisClient::open_with(safe.url(), strict()).unwrap();
    ok.ping().await.expect("a noeviction server is used");
}

/// Defect 2: `synced_replicas` covered the single lock's grants only: a read-write lock's
/// write grant or a semaphore's permits were granted without `WAIT`, so a failover could
/// lose them (two writers, an over-granted semaphore). With the only replica stopped, a
/// shared grant is now given back and reported, as the single lock's is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d2_shared_grants_wait_for_the_replicas() {
    let mut group = slate_harness::sentinel::SentinelGroup::start(1, 1).unwrap();
    let client = synced_sentinel_client(&group, Duration::from_millis(300));
    let rw = rw_lock(&client, "d2");
    let sem = slate_redis::Semaphore::builder(&client, "d2", 2)
        .lease(Duration::from_secs(10))
        .build()
        .unwrap();
    // A just-started replica may miss the first acknowledgement window: retry once in a while.
    let until = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(Some(g)) = rw.try_write().await {
            g.unlock().await.unwrap();
            break;
        }
        assert!(std::time::Instant::now() < until, "no first grant");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    group.server_mut(1).pause().unwrap();
    let write = rw.try_write().await;
    let permits = sem.try_acquire(1).await;
    let (holders, sem_holders) = (
        int(group.server(0), &["EXISTS", "slate:{d2}:rw"]),
        int(group.server(0), &["HLEN", "slate:{d2}:sem"]),
    );
    group.server_mut(1).resume().unwrap();
    let e = match write {
        Err(e) => e,
        Ok(g) => panic!(
            "a write granted without the replica: {:?}",
            g.map(|g| g.depth())
        ),
    };
    assert!(e.to_string().contains("0 of the 1 replicas"), "{e}");
    let e = match permits {
        Err(e) => e,
        Ok(g) => panic!(
            "permits granted without the replica: {:?}",
            g.map(|g| g.depth())
        ),
    };
    assert!(e.to_string().contains("0 of the 1 replicas"), "{e}");
    assert_eq!(holders, 0, "the write grant was given back");
    assert!(
        sem_holders <= 1,
        "the permits were given back: {sem_holders} fields"
    );
}

/// Defect 16: on a cluster, the renewal batch applied no answer until every node's pipeline
/// (and every resend) had finished, so one slow node made the holds on the healthy nodes
/// expire locally although their own node had renewed them in a millisecond. Here one
/// client holds a lock on each of two masters; one master is paused for longer than the
/// remaining validity. The hold on the other master must go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d16_a_paused_cluster_node_does_not_cost_another_nodes_hold() {
    let cluster = slate_harness::cluster::RedisCluster::start(3, 0).expect("cluster");
    let client = RedisClient::open_cluster(
        cluster.urls(),
        ClientOptions::builder()
            .command_timeout(Duration::from_millis(900))
            .build()
            .unwrap(),
    )
    .unwrap();
    let master_of = |name: &str| {
        let slot = cluster
            .slot_of(format!("slate:{{{name}}}").as_bytes())
            .expect("CLUSTER KEYSLOT");
        cluster.master_of(slot).expect("the slot's master")
    };
    // Two names on different masters.
    let a = "d16-a";
    let b = (0..1000)
        .map(|i| format!("d16-b{i}"))
        .find(|n| master_of(n) != master_of(a))
        .expect("a name on another master");
    let build = |name: &str| {
        SingleLock::builder(&client, name)
            .lease(Duration::from_millis(1200))
            .build()
            .unwrap()
    };
    let (la, lb) = (build(a), build(&b));
    let ga = la.lock().await.unwrap();
    let gb = lb.lock().await.unwrap();
    // B's master stops answering before the first renewal of the pair (0.6 s after them).
    cluster
        .node(master_of(&b))
        .command(&["CLIENT", "PAUSE", "2500", "ALL"])
        .unwrap();
    let until = std::time::Instant::now() + Duration::from_millis(2200);
    while std::time::Instant::now() < until {
        assert!(
            !ga.is_lost(),
            "the hold on the healthy master was lost: {:?}",
            ga.lease().loss_reason()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    ga.unlock().await.unwrap();
    drop(gb);
}

/// Defect 1, second form (found by the adversarial review of the fix): two first reads of one
/// holder in flight at once each got a Redis read hold of their own, and the second
/// overwrote the first in the process's bookkeeping: the first hold was never released (and
/// renewed for ever, so every writer stayed busy), and one of the unlocks answered *not
/// held*. A reader's levels are now kept per hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d1_two_first_reads_of_one_holder_leave_no_read_hold() {
    let server = server();
    let client = client(&server);
    let rw = rw_lock(&client, "d1b");
    let h = HolderId::new();
    for round in 1..=20 {
        let (a, b) = h.scope(async { tokio::join!(rw.read(), rw.read()) }).await;
        let (a, b) = (a.unwrap(), b.unwrap());
        let answers = (a.unlock().await, b.unlock().await);
        assert!(
            answers.0.is_ok() && answers.1.is_ok(),
            "round {round}: {answers:?}"
        );
        assert_eq!(
            int(&server, &["EXISTS", "slate:{d1b}:rw"]),
            0,
            "round {round}: a Redis read hold was left behind"
        );
    }
}

/// Defect 17, second form: one refused `SUBSCRIBE` (a lock whose release channel the ACL user
/// may not use) tore the shared pub/sub connection down, and every reconnection asked for all
/// wanted channels in one command, refused again: every other lock of the client lost its
/// release notifications and woke only on its spin wait. A refusal now fails only its own
/// channel; several refused together are asked again one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d17_a_refused_channel_does_not_silence_the_other_locks() {
    let server = RedisServer::builder()
        .acl_user("narrow", "n4rrow", "~slate:* &slate:{open}* +@all")
        .start()
        .expect("redis-server");
    let holder = client(&server);
    let ga = lock(&holder, "open", Duration::from_secs(30))
        .lock()
        .await
        .unwrap();
    let gb = lock(&holder, "closed", Duration::from_secs(30))
        .lock()
        .await
        .unwrap();
    let narrow = RedisClient::open(server.url_for_user("narrow", "n4rrow")).unwrap();
    let spin = Duration::from_secs(30);
    let build = |name: &str| {
        SingleLock::builder(&narrow, name)
            .lease(Duration::from_secs(30))
            .spin_wait(spin)
            .build()
            .unwrap()
    };
    let (open, closed) = (build("open"), build("closed"));
    // First the refused channel: its waiter asks for it and is refused.
    let wait_closed = tokio::spawn(async move { closed.lock().await });
    eventually(Duration::from_secs(5), "the refusal in the ACL log", || {
        let log: Vec<redis::Value> =
            redis::from_redis_value(server.command(&["ACL", "LOG"]).unwrap()).unwrap();
        !log.is_empty()
    })
    .await;
    // Then a lock whose channel is allowed: it must be subscribed, and woken by the release.
    let wait_open = tokio::spawn(async move { open.lock().await });
    eventually(
        Duration::from_secs(5),
        "the allowed channel subscribed",
        || server.subscribers("slate:{open}:released").unwrap() == 1,
    )
    .await;
    let g = woken_by_the_release(ga, wait_open, Duration::from_secs(5), spin / 2).await;
    g.unlock().await.unwrap();
    wait_closed.abort();
    drop(gb);
}

/// Defect 12: one request record per holder. An acquire stalls on a connection that has
/// been silent for a while (here a proxy delays requests by 1.5 s); it times out, the client
/// replaces the silent connection, and the undo goes out on the new one, ahead of the stalled
/// acquire: it marks the acquire cancelled. The same holder then takes the lock again (here
/// through a second client), and that grant's record replaced the cancellation, so the stalled
/// acquire, arriving last, was applied as a re-entry: Redis counted two levels where the
/// caller had one, and the lock stayed held after its unlock. Request ids grow in each
/// process, so a request older than the holder's record now does nothing, and an undo older
/// than the record leaves it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d12_a_stalled_acquire_arriving_after_a_newer_grant_is_not_a_level() {
    let server = server();
    let proxy = FaultProxy::start(server.addr()).expect("proxy");
    let timeout = Duration::from_millis(300);
    let client = RedisClient::open_with(
        proxy.url(),
        ClientOptions::builder()
            .command_timeout(timeout)
            .build()
            .unwrap(),
    )
    .expect("client");
    let lock = common::lock(&client, "d12", Duration::from_secs(30));
    let holder = HolderId::new();
    let depth = || {
        let v = server
            .command(&["HGET", "slate:{d12}", &holder.to_string()])
            .expect("HGET");
        redis::from_redis_value::<Option<i64>>(v)
            .expect("count")
            .unwrap_or(0)
    };
    // Scripts loaded, connection warm.
    lock.lock_as(holder).await.unwrap().unlock().await.unwrap();
    let delay = Duration::from_millis(1500);
    proxy
        .set_mode(Mode::Delay {
            to_server: delay,
            to_client: Duration::ZERO,
        })
        .unwrap();
    // The connection falls silent: a PING times out.
    let started = std::time::Instant::now();
    assert!(client.ping().await.is_err(), "the PING was held back");
    // Past two command timeouts of silence, the acquire's own timeout replaces the connection.
    tokio::time::sleep_until((started + timeout * 2 + Duration::from_millis(100)).into()).await;
    let stalled_at = std::time::Instant::now();
    let stalled = tokio::spawn(holder.scope({
        let lock = lock.clone();
        async move { lock.try_lock().await }
    }));
    // While it waits, the proxy passes again: what is sent from now on (the undo, on the new
    // connection) overtakes the held-back acquire.
    tokio::time::sleep(timeout / 2).await;
    proxy.set_mode(Mode::Pass).unwrap();
    let stalled = within(Duration::from_secs(5), "the stalled try", stalled)
        .await
        .unwrap();
    assert!(
        stalled.is_err(),
        "the delayed acquire timed out: {stalled:?}"
    );
    // The same holder takes the lock again, through another client of this process.
    let direct = RedisClient::open(server.url()).expect("client");
    let again = common::lock(&direct, "d12", Duration::from_secs(30));
    let guard = again.lock_as(holder).await.expect("a fresh grant");
    assert_eq!(guard.depth(), 1);
    // The held-back acquire reaches the server `delay` after it was sent.
    tokio::time::sleep_until((stalled_at + delay + Duration::from_millis(300)).into()).await;
    assert_eq!(
        depth(),
        1,
        "the stalled acquire was applied as a re-entry after a newer grant"
    );
    assert_eq!(guard.unlock().await.unwrap(), 0);
    assert_eq!(
        int(&server, &["EXISTS", "slate:{d12}"]),
        0,
        "the lock stayed held after its only unlock"
    );
}

/// Defect 4, second half: on a cluster whose lock slot is migrating, an acquire script can be
/// redirected (`ASK`) to the importing node and granted there, but the `WAIT` behind it was
/// routed by the slot's owner to the migrating node, which had nothing of this write to wait
/// for and counted its own replica: a grant that no replica of the node holding it had was
/// counted as replicated. The `WAIT` now rides in the script's pipeline, which redis-rs
/// redirects as a whole. Redis runs a multi-key command on an importing node only when every
/// key already exists there (else `TRYAGAIN`), so the test gives the lock every key: a holder
/// that holds it (its request record too) while another process waits for its turn. The
/// importing node's replica is paused: the holder's re-entry must be refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d4_a_grant_on_an_importing_node_waits_for_its_own_replicas() {
    let mut cluster = slate_harness::cluster::RedisCluster::start(3, 1).expect("cluster");
    let client = RedisClient::open_cluster(
        cluster.urls(),
        ClientOptions::builder()
            .synced_replicas(1, Duration::from_millis(300))
            .build()
            .unwrap(),
    )
    .unwrap();
    let lock = SingleLock::builder(&client, "d4m")
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let holder = HolderId::new();
    let h = holder.to_string();
    let slot = cluster.slot_of(b"slate:{d4m}").unwrap();
    let source = cluster.master_of(slot).unwrap();
    let on_source = |args: &[&str]| drop(cluster.node(source).command(args).unwrap());
    on_source(&[
        "HSET",
        "slate:{d4m}",
        &h,
        "1",
        "t",
        "7",
        "r",
        "1 a 7 1",
        "w",
        "1",
    ]);
    on_source(&["PEXPIRE", "slate:{d4m}", "30000"]);
    on_source(&["SET", &fence_key("d4m"), "7"]);
    on_source(&[
        "SET",
        &format!("slate:{{d4m}}:req:{h}"),
        "1 a 7 1",
        "PX",
        "30000",
    ]);
    on_source(&["ZADD", "slate:{d4m}:queue", "1", "another-process"]);
    on_source(&[
        "HSET",
        "slate:{d4m}:turn",
        "o",
        "another-process",
        "u",
        "0",
        "n",
        "1",
    ]);
    on_source(&["PEXPIRE", "slate:{d4m}:turn", "30000"]);
    let target = cluster
        .masters()
        .unwrap()
        .into_iter()
        .find(|&m| m != source)
        .unwrap();
    let replica = cluster.replicas_of(target).unwrap()[0];
    // Connected to every node (the replica too) before the replica stops answering; the
    // server sees the holder's level.
    assert_eq!(lock.hold_count(holder).await.unwrap(), 1);
    // The migration first: Valkey 8 replicates `CLUSTER SETSLOT` and waits for the replicas.
    cluster.start_slot_migration(slot, target).unwrap();
    cluster.node_mut(replica).pause().unwrap();
    let attempt = lock.acquire(holder, slate_redis::Wait::Immediate).await;
    // The importing node answers for the slot only after ASKING, on the same connection.
    let mut c = cluster.node(target).connection().unwrap();
    let (count,): (Option<i64>,) = redis::pipe()
        .cmd("ASKING")
        .ignore()
        .cmd("HGET")
        .arg("slate:{d4m}")
        .arg(&h)
        .query(&mut c)
        .unwrap();
    cluster.node_mut(replica).resume().unwrap();
    let e = match attempt {
        Err(e) => e,
        Ok(g) => panic!(
            "granted on the importing node without its replica: depth {}",
            g.depth()
        ),
    };
    assert!(e.to_string().contains("0 of the 1 replicas"), "{e}");
    // The level is given back by its request id when the release script can run; mid-migration
    // it cannot (its channel key never exists, so the importing node answers `TRYAGAIN`), and
    // the level then ends with its lease.
    assert!(matches!(count, Some(1 | 2)), "{count:?}");
}

/// Defect 13: a hold passed among a process's tasks went on being passed, without a round
/// trip, until a renewal failed or its deadline came, however long the server had been silent.
/// Here the process's link to Redis is blackholed while three tasks pass the hold among
/// themselves (400 ms each, a block of 8): before, passes went on until the block ran out
/// (the deadline was 1.7 s beyond the cut); now they stop one renewal period after the last
/// confirmed renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d13_passes_stop_a_renewal_period_after_the_last_confirmation() {
    let server = server();
    let proxy = FaultProxy::start(server.addr()).unwrap();
    let client = RedisClient::open_with(
        format!("redis://{}", proxy.addr()),
        ClientOptions::builder()
            .command_timeout(Duration::from_millis(500))
            .build()
            .unwrap(),
    )
    .unwrap();
    // Renewed every second.
    let lease = Duration::from_secs(3);
    let lock = SingleLock::builder(&client, "d13")
        .lease(lease)
        .build()
        .unwrap();
    let start = std::time::Instant::now();
    let stop = start + Duration::from_millis(4500);
    let grants = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let (lock, grants) = (lock.clone(), grants.clone());
            tokio::spawn(async move {
                while std::time::Instant::now() < stop {
                    if let Ok(g) = lock.try_lock_for(Duration::from_millis(600)).await {
                        grants.lock().unwrap().push(std::time::Instant::now());
                        tokio::time::sleep(Duration::from_millis(400)).await;
                        let _ = g.unlock().await;
                    }
                }
            })
        })
        .collect();
    // The first renewal (sent about 1 s after the first grant) is answered by 1.3 s.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    proxy.set_mode(Mode::Blackhole).unwrap();
    let cut = std::time::Instant::now();
    for t in tasks {
        t.await.unwrap();
    }
    proxy.set_mode(Mode::Pass).unwrap();
    let grants = grants.lock().unwrap().clone();
    let last = *grants.last().expect("grants");
    let after_cut: Vec<_> = grants
        .iter()
        .filter(|&&g| g > cut)
        .map(|g| g.duration_since(cut))
        .collect();
    println!("grants after the cut: {after_cut:?}");
    assert!(
        last <= cut + lease / 3 - Duration::from_millis(50),
        "a pass {:?} after the cut, more than a renewal period after the last confirmation",
        last.duration_since(cut)
    );
}

/// Subscribers of `channel` as the server counts them.
/// The ids of the server's pub/sub clients (`CLIENT LIST TYPE pubsub`).
fn pubsub_clients(server: &RedisServer) -> Vec<String> {
    let list: String = redis::from_redis_value(
        server
            .command(&["CLIENT", "LIST", "TYPE", "pubsub"])
            .unwrap(),
    )
    .unwrap();
    list.lines()
        .filter_map(|l| l.split(' ').next()?.strip_prefix("id=").map(str::to_owned))
        .collect()
}

/// Defect 17 (a): the pub/sub connection's keepalive restarted on every event the listener
/// handled, local requests included, so a lock whose waiters came and went kept a half-open
/// connection (here: the proxy holds the pub/sub connection's bytes, its socket open) from
/// ever being checked. Every release published meanwhile was lost and the waiters woke only
/// on their spin wait. The keepalive now runs from the server's last sign of life: the silent
/// connection is found out and replaced while the waiters keep coming and going.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d17_a_half_open_pubsub_connection_is_replaced_while_waiters_come_and_go() {
    let server = server();
    let proxy = FaultProxy::start(server.addr()).unwrap();
    // The first connection that subscribes is the proxied client's pub/sub connection.
    proxy.mark_next_sending(b"$9\r\nSUBSCRIBE\r\n").unwrap();
    let holder = client(&server);
    let lease = Duration::from_secs(60);
    let gq = lock(&holder, "quiet", lease).lock().await.unwrap();
    let gb = lock(&holder, "busy", lease).lock().await.unwrap();
    let proxied = RedisClient::open(proxy.url()).unwrap();
    let spin = Duration::from_secs(60);
    let build = |name: &str| {
        SingleLock::builder(&proxied, name)
            .lease(lease)
            .spin_wait(spin)
            .build()
            .unwrap()
    };
    let (quiet, busy) = (build("quiet"), build("busy"));
    // Waiters on `busy` come and go back to back (each gives up after 300 ms; the channel
    // stays subscribed through its linger), bounded in time.
    let churn = tokio::spawn(async move {
        let until = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < until {
            let _ = busy.try_lock_for(Duration::from_millis(300)).await;
        }
    });
    let waiter = tokio::spawn(async move { quiet.lock().await });
    eventually(Duration::from_secs(5), "both channels subscribed", || {
        proxy.marks_taken() == 1
            && server.subscribers("slate:{quiet}:released").unwrap() == 1
            && server.subscribers("slate:{busy}:released").unwrap() == 1
    })
    .await;

    // The pub/sub connection goes silent, its socket open; the command connection flows.
    let before = pubsub_clients(&server);
    proxy.set_marked_mode(Some(Mode::Blackhole)).unwrap();
    let silent = std::time::Instant::now();
    // Its replacement is a new pub/sub client subscribed to the channel (the keepalive is 5 s,
    // then the PING's timeout and the reconnection: about 7 s here, more under a loaded CI;
    // before the fix, never). Not counted as a second subscriber: whether the server still
    // sees the silent one depends on when the client closes it (a CI run saw the count stay
    // at one for 40 s).
    eventually(
        Duration::from_secs(40),
        "the silent pub/sub connection replaced",
        || {
            pubsub_clients(&server).iter().any(|c| !before.contains(c))
                && server.subscribers("slate:{quiet}:released").unwrap() >= 1
        },
    )
    .await;
    println!("replaced {:?} after it went silent", silent.elapsed());
    let g = woken_by_the_release(gq, waiter, Duration::from_secs(5), spin / 4).await;
    g.unlock().await.unwrap();
    churn.abort();
    drop(gb);
}

/// Defect 17 (c): on a cluster, a node's broken pub/sub connection moves its channels to
/// `lost` until redis-rs resubscribes them. A channel whose last waiter left meanwhile was
/// never unsubscribed (only confirmed channels were), and redis-rs's resubscription of it was
/// dropped on the floor: the server kept the subscription for the client's life, one more for
/// every such name. Here the node drops the connection and stops; the next subscription makes
/// redis-rs notice, the waiter's retry fails on the stopped node and it leaves; the node comes
/// back and a later subscription makes redis-rs reconnect and restore its subscriptions. The
/// channel nobody wants must be gone from the server after its linger.
///
/// The node stays stopped past the linger, so the unsubscription is tried while the node is
/// down and fails. It used to be forgotten then, while redis-rs kept the channel and restored
/// it on reconnection: the server kept it for the client's life (seen in a loaded CI run,
/// where the linger fired before the node came back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d17_c_a_channel_lost_with_its_node_and_then_unwanted_is_unsubscribed() {
    let mut cluster = slate_harness::cluster::RedisCluster::start(3, 0).expect("cluster");
    let client = RedisClient::open_cluster(
        cluster.urls(),
        ClientOptions::builder()
            .command_timeout(Duration::from_millis(500))
            .build()
            .unwrap(),
    )
    .unwrap();
    let holder = RedisClient::open_cluster(cluster.urls(), ClientOptions::default()).unwrap();
    let master_of = |name: &str| {
        let slot = cluster
            .slot_of(format!("slate:{{{name}}}").as_bytes())
            .expect("CLUSTER KEYSLOT");
        cluster.master_of(slot).expect("the slot's master")
    };
    let node = master_of("d17c-0");
    let names: Vec<String> = (0..1000)
        .map(|i| format!("d17c-{i}"))
        .filter(|n| master_of(n) == node)
        .take(3)
        .collect();
    let lease = Duration::from_secs(60);
    let mut held = Vec::new();
    for name in &names {
        held.push(lock(&holder, name, lease).lock().await.unwrap());
    }
    let build = |name: &str| {
        SingleLock::builder(&client, name)
            .lease(lease)
            .spin_wait(Duration::from_secs(60))
            .build()
            .unwrap()
    };
    let channel = format!("slate:{{{}}}:released", names[0]);
    let subscribers = |cluster: &slate_harness::cluster::RedisCluster| -> i64 {
        let v: Vec<redis::Value> = redis::from_redis_value(
            cluster
                .node(node)
                .command(&["PUBSUB", "SHARDNUMSUB", &channel])
                .unwrap(),
        )
        .unwrap();
        redis::from_redis_value(v[1].clone()).unwrap()
    };
    let first = build(&names[0]);
    let waiter = tokio::spawn(async move { first.try_lock_for(Duration::from_secs(60)).await });
    eventually(Duration::from_secs(5), "the channel subscribed", || {
        subscribers(&cluster) == 1
    })
    .await;

    // 1. The node drops the client's pub/sub connection, then stops.
    let list = match cluster.node(node).command(&["CLIENT", "LIST"]).unwrap() {
        redis::Value::BulkString(b) => String::from_utf8(b).unwrap(),
        redis::Value::VerbatimString { text, .. } => text,
        other => panic!("CLIENT LIST: {other:?}"),
    };
    let id = list
        .lines()
        .find(|l| l.contains(" ssub=1 "))
        .and_then(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .expect("the sharded subscriber in CLIENT LIST")
        .to_owned();
    cluster
        .node(node)
        .command(&["CLIENT", "KILL", "ID", &id])
        .unwrap();
    cluster.node_mut(node).pause().unwrap();

    // 2. A subscription for another name on that node makes redis-rs notice the broken
    //    connection; the first waiter, told its channel is lost, retries on the stopped node,
    //    fails and leaves.
    //    Under load redis-rs may instead notice the killed connection and restore it before
    //    the node stops: the waiter is then subscribed again and waits on; it leaves by being
    //    cancelled, which leaves its channel just as unwanted.
    let second = build(&names[1]);
    let other = tokio::spawn(async move { second.try_lock_for(Duration::from_secs(60)).await });
    let mut waiter = waiter;
    match tokio::time::timeout(Duration::from_secs(10), &mut waiter).await {
        Ok(left) => println!("the first waiter left: {:?}", left.unwrap().err()),
        Err(_) => {
            println!("the first waiter was subscribed again before the node stopped; cancelled");
            waiter.abort();
            let _ = waiter.await;
        }
    }
    other.abort();
    let _ = other.await;
    // The node stays stopped past the linger (1 s): the unsubscription is tried, and fails,
    // while it is down. (A fault's length, not a wait for a condition.)
    tokio::time::sleep(Duration::from_millis(2500)).await;

    // 3. The node is back; a later subscription on it makes redis-rs reconnect and restore
    //    what it had subscribed.
    cluster.node_mut(node).resume().unwrap();
    let third = build(&names[2]);
    let _ = third.try_lock_for(Duration::from_secs(2)).await;
    eventually(
        Duration::from_secs(15),
        "the unwanted channel unsubscribed on the server",
        || subscribers(&cluster) == 0,
    )
    .await;
    drop(held);
}
