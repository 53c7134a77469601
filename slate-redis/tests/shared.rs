//! `RwLock` and `Semaphore` against a real Redis: sharing and exclusion, fairness between
//! processes (two clients stand for two processes), re-entry, the read a write covers,
//! downgrade, no upgrade, tokens, leases of crashed holders, loss signals, capacity changes,
//! cancellation and what is left in Redis afterwards.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::*;
use slate_redis::{Error, HolderId, LossReason, RedisClient, RwLock, Semaphore, SharedMode};

const LEASE: Duration = Duration::from_secs(5);

/// A read-write lock whose read holds take local readers for 200 ms (a tenth of the spin
/// wait): long enough for the tests that count on a read joining its process's hold on a
/// slow machine or a cluster.
fn rw(client: &RedisClient, name: &str) -> RwLock {
    RwLock::builder(client, name)
        .lease(LEASE)
        .spin_wait(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// Polls `cond` until it holds, failing after `limit`.
async fn eventually(what: &str, limit: Duration, mut cond: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !cond().await {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn readers_share_and_writers_exclude(server: Deployment) {
    let (a, b) = (server.client(), server.client());
    let (la, lb) = (rw(&a, "rw-basics"), rw(&b, "rw-basics"));
    assert_eq!(la.key(), b"slate:{rw-basics}:rw");
    let r1 = la.read().await.unwrap();
    let r2 = lb.read().await.unwrap();
    let r3 = la.read().await.unwrap();
    assert_ne!(r1.holder(), r3.holder());
    // Read cohorting: r3 joined the read hold r1's process took (no round trip): it carries
    // that hold's token, and Redis sees one reader per process.
    assert_eq!(r3.fencing_token(), r1.fencing_token());
    assert_ne!(r2.fencing_token(), r1.fencing_token());
    assert!(la.try_write().await.unwrap().is_none());
    assert!(lb.try_write().await.unwrap().is_none());
    let status = lb.status().await.unwrap();
    assert_eq!(status.mode(), SharedMode::Read);
    assert_eq!((status.readers(), status.in_use), (2, 2));
    let top = [&r1, &r2, &r3]
        .iter()
        .map(|g| g.fencing_token().get())
        .max()
        .unwrap();
    for g in [r1, r2, r3] {
        assert_eq!(g.unlock().await.unwrap(), 0);
    }
    let w = lb.write().await.unwrap();
    assert!(
        w.fencing_token().get() > top,
        "a writer's token is above every reader's"
    );
    assert!(la.try_read().await.unwrap().is_none());
    assert_eq!(la.status().await.unwrap().mode(), SharedMode::Write);
    w.unlock().await.unwrap();
    assert_eq!(la.status().await.unwrap().mode(), SharedMode::Free);
    // Only the persistent fencing counter is left (request records end with their window;
    // the busy answers' places in the queue are given up in the background).
    eventually(
        "only the fence to remain",
        Duration::from_secs(5),
        async || {
            keys_but_records(&server, 2 * DEFAULT_COMMAND_TIMEOUT)
                == vec!["slate:{rw-basics}:rw:fence".to_owned()]
        },
    )
    .await;
}
crate::per_topology!(readers_share_and_writers_exclude);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_writer_holds_later_readers_back_across_processes() {
    let server = Deployment::standalone();
    let (a, b, c) = (server.client(), server.client(), server.client());
    let (la, lb, lc) = (rw(&a, "rw-fair"), rw(&b, "rw-fair"), rw(&c, "rw-fair"));
    let r = la.read().await.unwrap();
    // B's writer waits for A's reader.
    let writer = tokio::spawn(async move {
        let w = lb.write().await.unwrap();
        let at = Instant::now();
        tokio::time::sleep(Duration::from_millis(50)).await;
        w.unlock().await.unwrap();
        at
    });
    let lc2 = lc.clone();
    eventually("the writer to queue", Duration::from_secs(5), async || {
        int(&server, &["ZCARD", "slate:{rw-fair}:rw:queue"]) == 1
    })
    .await;
    // C's reader arrives after the writer: it waits behind it although only readers hold.
    assert!(lc.try_read().await.unwrap().is_none());
    let reader = tokio::spawn(async move {
        let g = lc2.read().await.unwrap();
        let at = Instant::now();
        g.unlock().await.unwrap();
        at
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !reader.is_finished(),
        "a later reader overtook the waiting writer"
    );
    r.unlock().await.unwrap();
    let wrote = writer.await.unwrap();
    let read = reader.await.unwrap();
    assert!(read > wrote, "the reader came in after the writer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readers_at_the_head_come_in_together_after_a_writer() {
    let server = Deployment::standalone();
    let writer_client = server.client();
    let lw = rw(&writer_client, "rw-together");
    let w = lw.write().await.unwrap();
    let inside = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let mut readers = Vec::new();
    for _ in 0..4 {
        let client = server.client();
        let (inside, peak) = (inside.clone(), peak.clone());
        readers.push(tokio::spawn(async move {
            let l = rw(&client, "rw-together");
            let g = l.read().await.unwrap();
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(200)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            g.unlock().await.unwrap();
        }));
    }
    eventually(
        "four readers to queue",
        Duration::from_secs(5),
        async || int(&server, &["ZCARD", "slate:{rw-together}:rw:queue"]) == 4,
    )
    .await;
    let released = Instant::now();
    w.unlock().await.unwrap();
    for r in readers {
        r.await.unwrap();
    }
    assert_eq!(
        peak.load(Ordering::SeqCst),
        4,
        "the four readers overlapped"
    );
    // Woken by the release message, not by their spin waits or a lease.
    assert!(released.elapsed() < Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_covered_reads_downgrade_and_no_upgrade() {
    let server = Deployment::standalone();
    let (a, b) = (server.client(), server.client());
    let (la, lb) = (rw(&a, "rw-modes"), rw(&b, "rw-modes"));
    let me = HolderId::new();
    let r1 = la.read_as(me).await.unwrap();
    let r2 = r1.reenter().await.unwrap();
    assert_eq!(r2.depth(), 2);
    assert_eq!(r2.fencing_token(), r1.fencing_token());
    // No upgrade: refused at once, with the fix.
    match la.write_as(me).await {
        Err(Error::InvalidInput { what, fix, .. }) => {
            assert_eq!(what, "upgrade");
            assert!(fix.contains("release"), "{fix}");
        }
        other => panic!("upgrade: {other:?}"),
    }
    assert_eq!(r2.unlock().await.unwrap(), 1);
    assert_eq!(r1.unlock().await.unwrap(), 0);

    let w = la.write().await.unwrap();
    let w2 = w.reenter().await.unwrap();
    let covered = w.read().await.unwrap();
    assert_eq!(covered.fencing_token(), w.fencing_token());
    assert!(
        lb.try_read().await.unwrap().is_none(),
        "the write still excludes readers"
    );
    assert_eq!(covered.unlock().await.unwrap(), 0);
    // Downgrading one of two write levels: the holder still writes through the other.
    let r = w2.downgrade().await.unwrap();
    assert!(lb.try_read().await.unwrap().is_none());
    assert_eq!(w.unlock().await.unwrap(), 0);
    let other = lb
        .try_read()
        .await
        .unwrap()
        .expect("the write ended, the read goes on");
    other.unlock().await.unwrap();
    r.unlock().await.unwrap();
    let w = la.write().await.unwrap();
    let token = w.fencing_token();
    let r = w.downgrade().await.unwrap();
    assert_eq!(r.fencing_token(), token);
    // Other readers come in at once; no writer can.
    let other = lb
        .try_read()
        .await
        .unwrap()
        .expect("a reader beside the downgraded one");
    assert!(lb.try_write().await.unwrap().is_none());
    let status = la.status().await.unwrap();
    assert_eq!((status.mode(), status.in_use), (SharedMode::Read, 2));
    other.unlock().await.unwrap();
    assert_eq!(r.unlock().await.unwrap(), 0);
    assert_eq!(la.status().await.unwrap().mode(), SharedMode::Free);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_lease_ends_and_a_forced_unlock_fires_the_loss_signal() {
    let server = Deployment::standalone();
    let client = server.client();
    let lock = rw(&client, "rw-crash");
    // Another process wrote, then died: its hold is in Redis with 300 ms left, renewed by
    // nobody.
    let ghost = HolderId::new().to_string();
    let until = {
        let t: Vec<String> = redis::from_redis_value(server.command(&["TIME"]).unwrap()).unwrap();
        t[0].parse::<i64>().unwrap() * 1000 + t[1].parse::<i64>().unwrap() / 1000 + 300
    };
    server
        .command(&[
            "HSET",
            "slate:{rw-crash}:rw",
            "n",
            &(1u32 << 30).to_string(),
            &format!("p:{ghost}"),
            &(1u32 << 30).to_string(),
            &format!("w:{ghost}"),
            "1",
            &format!("t:{ghost}"),
            "1",
        ])
        .unwrap();
    server
        .command(&[
            "ZADD",
            "slate:{rw-crash}:rw:leases",
            &until.to_string(),
            &ghost,
        ])
        .unwrap();
    let start = Instant::now();
    let r = lock.read().await.unwrap();
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(200),
        "the dead writer's lease was honoured: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(2),
        "the reader asked again when the lease ended: {waited:?}"
    );
    // An operator drops every holder: the reader's next renewal reports the loss.
    assert_eq!(lock.force_unlock().await.unwrap(), 1);
    let reason = tokio::time::timeout(Duration::from_secs(10), r.lost())
        .await
        .expect("the loss is reported within a renewal period");
    assert_eq!(reason, LossReason::EntryGone);
    assert!(r.unlock().await.unwrap_err().is_not_held());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_renewed_past_the_lease() {
    let server = Deployment::standalone();
    let client = server.client();
    let lock = RwLock::builder(&client, "rw-renew")
        .lease(Duration::from_millis(300))
        .build()
        .unwrap();
    let other_client = server.client();
    let other = RwLock::builder(&other_client, "rw-renew")
        .lease(Duration::from_millis(300))
        .build()
        .unwrap();
    let w = lock.write().await.unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(!w.is_lost());
    assert!(
        other.try_read().await.unwrap().is_none(),
        "still held after three leases"
    );
    w.unlock().await.unwrap();
    assert!(other.try_read().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_waiter_leaves_nothing_behind() {
    let server = Deployment::standalone();
    let (a, b) = (server.client(), server.client());
    let (la, lb) = (rw(&a, "rw-cancel"), rw(&b, "rw-cancel"));
    let r = la.read().await.unwrap();
    let err = lb
        .try_write_for(Duration::from_millis(150))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    // The waiting process takes its entry out when its last waiter gives up.
    eventually("the queue to empty", Duration::from_secs(5), async || {
        int(&server, &["EXISTS", "slate:{rw-cancel}:rw:queue"]) == 0
    })
    .await;
    // So a reader of a third process is not held back by a writer that left.
    let c = server.client();
    assert!(rw(&c, "rw-cancel").try_read().await.unwrap().is_some());
    r.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_twins_work_on_threads() {
    let server = Deployment::standalone();
    let Deployment::Standalone(master) = &server else {
        unreachable!()
    };
    let url = master.url();
    std::thread::spawn(move || {
        let client = RedisClient::open(url).unwrap();
        let lock = RwLock::builder(&client, "rw-threads").build().unwrap();
        let r = lock.blocking_read().unwrap();
        let w = lock.blocking_try_write_for(Duration::from_millis(50));
        assert!(w.unwrap_err().is_timeout());
        assert_eq!(r.blocking_unlock().unwrap(), 0);
        let w = lock.blocking_write().unwrap();
        w.blocking_unlock().unwrap();
        let sem = Semaphore::builder(&client, "sem-threads", 2)
            .build()
            .unwrap();
        let p = sem.blocking_acquire(2).unwrap();
        assert!(
            sem.blocking_try_acquire_for(1, Duration::from_millis(50))
                .unwrap_err()
                .is_timeout()
        );
        p.blocking_unlock().unwrap();
    })
    .join()
    .unwrap();
}

async fn semaphore_permits_never_exceed_the_capacity(server: Deployment) {
    let inside = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for i in 0..6u32 {
        let client = server.client();
        let (inside, peak) = (inside.clone(), peak.clone());
        tasks.push(tokio::spawn(async move {
            let sem = Semaphore::builder(&client, "sem-cap", 3)
                .lease(LEASE)
                .build()
                .unwrap();
            let k = 1 + i % 2;
            for _ in 0..5 {
                let p = sem.acquire(k).await.unwrap();
                let now = inside.fetch_add(k, Ordering::SeqCst) + k;
                assert!(now <= 3, "{now} permits in use of 3");
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
                inside.fetch_sub(k, Ordering::SeqCst);
                p.unlock().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(peak.load(Ordering::SeqCst) >= 2, "permits were shared");
    let client = server.client();
    let sem = Semaphore::builder(&client, "sem-cap", 3).build().unwrap();
    let status = sem.status().await.unwrap();
    assert_eq!((status.in_use, status.capacity), (0, Some(3)));
}
crate::per_topology!(semaphore_permits_never_exceed_the_capacity);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_capacity_changes_and_bad_requests() {
    let server = Deployment::standalone();
    let (a, b) = (server.client(), server.client());
    let sa = Semaphore::builder(&a, "sem-admin", 4).build().unwrap();
    // The stored capacity wins over another builder's count.
    // A spin wait past the wake-up bound below: only the capacity change's message can
    // wake its waiter in time.
    let sb = Semaphore::builder(&b, "sem-admin", 100)
        .spin_wait(Duration::from_secs(5))
        .build()
        .unwrap();
    let three = sa.acquire(3).await.unwrap();
    assert_eq!(three.permits(), 3);
    assert!(sb.try_acquire(2).await.unwrap().is_none());
    // More than the capacity can never be granted: a clear error, not a wait.
    match sb.acquire(5).await {
        Err(Error::InvalidInput { what, fix, .. }) => {
            assert_eq!(what, "permits");
            assert!(fix.contains("set_permits"), "{fix}");
        }
        other => panic!("5 of 4: {other:?}"),
    }
    assert!(matches!(
        sb.acquire(0).await,
        Err(Error::InvalidInput { .. })
    ));
    assert!(Semaphore::builder(&a, "sem-zero", 0).build().is_err());
    // Lowered below the use: the holder keeps its permits, nobody new comes in.
    assert_eq!(sb.set_permits(2).await.unwrap(), 3);
    assert!(sb.try_acquire(1).await.unwrap().is_none());
    let waiter = {
        let sb = sb.clone();
        tokio::spawn(async move { sb.acquire(2).await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished());
    // Raised: the waiter is woken by the change and comes in.
    sb.set_permits(5).await.unwrap();
    let two = tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("woken by the capacity change")
        .unwrap();
    let status = sa.status().await.unwrap();
    assert_eq!(
        (status.in_use, status.capacity, status.holders.len()),
        (5, Some(5), 2)
    );
    assert!(
        status
            .holders
            .iter()
            .all(|h| h.permits == 3 || h.permits == 2)
    );
    three.unlock().await.unwrap();
    two.unlock().await.unwrap();
    assert_eq!(sa.status().await.unwrap().in_use, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_request_is_not_overtaken_by_small_ones() {
    let server = Deployment::standalone();
    let (a, b, c) = (server.client(), server.client(), server.client());
    let sa = Semaphore::builder(&a, "sem-fifo", 4).build().unwrap();
    let sb = Semaphore::builder(&b, "sem-fifo", 4).build().unwrap();
    let sc = Semaphore::builder(&c, "sem-fifo", 4).build().unwrap();
    let one = sa.acquire(1).await.unwrap();
    let big = {
        let sb = sb.clone();
        tokio::spawn(async move { sb.acquire(4).await.unwrap() })
    };
    eventually(
        "the big request to queue",
        Duration::from_secs(5),
        async || int(&server, &["ZCARD", "slate:{sem-fifo}:sem:queue"]) == 1,
    )
    .await;
    // Three permits are free, but a process waits for four: the small request waits too.
    assert!(sc.try_acquire(1).await.unwrap().is_none());
    one.unlock().await.unwrap();
    let all = tokio::time::timeout(Duration::from_secs(2), big)
        .await
        .expect("the big request is served first")
        .unwrap();
    all.unlock().await.unwrap();
    assert!(sc.try_acquire(1).await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_are_checked_and_kinds_do_not_mix() {
    let server = Deployment::standalone();
    let client = server.client();
    assert!(RwLock::builder(&client, "").build().is_err());
    let _single = slate_redis::SingleLock::builder(&client, "mixed")
        .build()
        .unwrap();
    // A read-write lock and a single lock of one name live under different keys.
    let rw = RwLock::builder(&client, "mixed").build().unwrap();
    assert_eq!(rw.key(), b"slate:{mixed}:rw");
    let sem = Semaphore::builder(&client, "mixed", 2).build().unwrap();
    assert_eq!(sem.key(), b"slate:{mixed}:sem");
    assert!(
        RwLock::builder(&client, "mixed")
            .lease(Duration::from_secs(7))
            .build()
            .is_err(),
        "one name, one set of options in a client"
    );
}

/// S10 for the shared scripts: a reply lost after the script ran is answered from the
/// request record on the retry (one level, not two; a last release answers 0, not *not
/// held*), and an acquire that got no reply at all is undone by its request id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_replies_are_answered_from_the_request_record() {
    use slate_harness::proxy::{FaultProxy, Mode};
    let server = common::server();
    let proxy = FaultProxy::start(server.addr()).expect("proxy");
    let client = RedisClient::open_with(
        proxy.url(),
        slate_redis::ClientOptions::builder()
            .command_timeout(Duration::from_secs(3))
            .build()
            .unwrap(),
    )
    .unwrap();
    client.ping().await.unwrap();
    let lock = rw(&client, "rw-s10");
    // The permits in use: one per read hold in Redis (the process's readers share one).
    let reads = |_: HolderId| -> i64 {
        let v = server.command(&["HGET", "slate:{rw-s10}:rw", "n"]).unwrap();
        redis::from_redis_value::<Option<i64>>(v)
            .unwrap()
            .unwrap_or(0)
    };
    let lose_once = async |what: &str, done: &dyn Fn() -> bool| {
        eventually(what, Duration::from_secs(5), async || done()).await;
        proxy.set_mode(Mode::Pass).unwrap();
        proxy.reset_all().unwrap();
    };
    let me = HolderId::new();
    proxy.set_mode(Mode::DropReplies).unwrap();
    let acquire = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.read_as(me).await })
    };
    lose_once("the read to run", &|| reads(me) == 1).await;
    let guard = acquire
        .await
        .unwrap()
        .expect("the retry answers the first run");
    assert_eq!((guard.depth(), reads(me)), (1, 1), "one read, not two");
    assert!(proxy.connections_accepted() >= 2);

    proxy.set_mode(Mode::DropReplies).unwrap();
    let release = tokio::spawn(async move { guard.unlock().await });
    lose_once("the release to run", &|| reads(me) == 0).await;
    assert_eq!(
        release
            .await
            .unwrap()
            .expect("no spurious not-held after a lost reply"),
        0
    );

    // No reply at all: the read is undone by its request id.
    let quick = RedisClient::open_with(
        proxy.url(),
        slate_redis::ClientOptions::builder()
            .command_timeout(Duration::from_millis(200))
            .build()
            .unwrap(),
    )
    .unwrap();
    quick.ping().await.unwrap();
    let quick_lock = rw(&quick, "rw-s10");
    proxy.set_mode(Mode::DropReplies).unwrap();
    let err = quick_lock.read().await.unwrap_err();
    assert_eq!(
        err.backend_kind(),
        Some(slate_redis::BackendKind::Timeout),
        "{err}"
    );
    proxy.set_mode(Mode::Pass).unwrap();
    proxy.reset_all().unwrap();
    eventually(
        "the timed-out read to be undone",
        Duration::from_secs(5),
        async || int(&server, &["EXISTS", "slate:{rw-s10}:rw:leases"]) == 0,
    )
    .await;
    assert!(
        lock.try_write().await.unwrap().is_some(),
        "nothing was left holding"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_write_lock_can_treat_the_single_lock_of_its_name_as_a_writer() {
    let server = Deployment::standalone();
    let (a, b) = (server.client(), server.client());
    let single = slate_redis::SingleLock::builder(&a, "mixed-modes")
        .build()
        .unwrap();
    let guarded = RwLock::builder(&b, "mixed-modes")
        .exclude_single_lock(true)
        .spin_wait(Duration::from_millis(20))
        .build()
        .unwrap();
    let independent = RwLock::builder(&b, "mixed-modes").build();
    assert!(independent.is_err(), "one name, one setting per client");
    let g = single.lock().await.unwrap();
    assert!(
        guarded.try_read().await.unwrap().is_none(),
        "the single lock holds"
    );
    assert!(guarded.try_write().await.unwrap().is_none());
    let waiting = {
        let guarded = guarded.clone();
        tokio::spawn(async move { guarded.read().await.unwrap() })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished());
    g.unlock().await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(2), waiting)
        .await
        .expect("in at the next spin wait")
        .unwrap();
    // The other way round is the single lock's caller's to check: readers hold.
    assert_eq!(guarded.status().await.unwrap().readers(), 1);
    r.unlock().await.unwrap();
}

/// Regression (found by the readers-heavy benchmark): a process that gets busy joins the
/// queue behind every entry it counted as ahead of it, even one whose score is in its future
/// (a score tie used to sort by queue id and put the newcomer first: two processes then
/// waited for each other until their spin waits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_newcomer_queues_behind_every_entry_it_counted() {
    let server = Deployment::standalone();
    let client = server.client();
    let lock = rw(&client, "rw-order");
    // Another process waits to write: an entry scored far in the future, with a long claim.
    let until = i64::MAX / 4;
    server
        .command(&[
            "ZADD",
            "slate:{rw-order}:rw:queue",
            "9000000000000000",
            "~writer",
        ])
        .unwrap();
    server
        .command(&[
            "HSET",
            "slate:{rw-order}:rw:wants",
            "~writer",
            &format!("{} {until} 0", 1u32 << 30),
        ])
        .unwrap();
    let waiting = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.try_read_for(Duration::from_millis(500)).await })
    };
    eventually("the reader to queue", Duration::from_secs(5), async || {
        int(&server, &["ZCARD", "slate:{rw-order}:rw:queue"]) == 2
    })
    .await;
    let v = server
        .command(&["ZRANGE", "slate:{rw-order}:rw:queue", "0", "-1"])
        .unwrap();
    let order: Vec<String> = redis::from_redis_value(v).unwrap();
    assert_eq!(
        order.first().map(String::as_str),
        Some("~writer"),
        "{order:?}"
    );
    assert!(
        waiting.await.unwrap().unwrap_err().is_timeout(),
        "behind the waiting writer"
    );
}

/// Regression: when a process gives up its place (its waiters left), the processes behind it
/// that now fit are told at once instead of finding out at their spin wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_giving_up_its_place_wakes_the_ones_behind() {
    let server = Deployment::standalone();
    let (a, b, c) = (server.client(), server.client(), server.client());
    let slow = |client: &RedisClient| {
        RwLock::builder(client, "rw-leave")
            .lease(LEASE)
            .spin_wait(Duration::from_secs(5))
            .build()
            .unwrap()
    };
    let (la, lb, lc) = (slow(&a), slow(&b), slow(&c));
    let r = la.read().await.unwrap();
    // B's writer queues (behind A's reader), then C's reader queues behind B's writer.
    let writer = tokio::spawn(async move { lb.try_write_for(Duration::from_millis(300)).await });
    eventually("B to queue", Duration::from_secs(5), async || {
        int(&server, &["ZCARD", "slate:{rw-leave}:rw:queue"]) == 1
    })
    .await;
    let reader = tokio::spawn(async move {
        let g = lc.read().await.unwrap();
        let at = Instant::now();
        g.unlock().await.unwrap();
        at
    });
    eventually("C to queue", Duration::from_secs(5), async || {
        int(&server, &["ZCARD", "slate:{rw-leave}:rw:queue"]) == 2
    })
    .await;
    // B gives up: its place goes, and C, a reader beside A's reader, is told at once (its
    // spin wait is 5 s).
    assert!(writer.await.unwrap().unwrap_err().is_timeout());
    let gave_up = Instant::now();
    let in_at = tokio::time::timeout(Duration::from_secs(3), reader)
        .await
        .expect("C was woken when B left")
        .unwrap();
    assert!(in_at.duration_since(gave_up) < Duration::from_secs(2));
    r.unlock().await.unwrap();
}

/// Regression (found reading the change): a covered read whose acquire future is dropped
/// while its attempt is in flight is given back in the background, and the writer it
/// belonged to keeps renewing (the abandon used to end the writer's own renewal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_covered_read_leaves_the_writer_renewing() {
    let server = Deployment::standalone();
    let client = server.client();
    let lease = Duration::from_millis(600);
    let lock = RwLock::builder(&client, "rw-abandon")
        .lease(lease)
        .build()
        .unwrap();
    let w = lock.write().await.unwrap();
    // Polled once (the attempt is on its way), then dropped: the grant is abandoned.
    let mut read = Box::pin(w.read());
    assert!(
        futures::poll!(read.as_mut()).is_pending(),
        "a covered read takes a round trip"
    );
    drop(read);
    eventually(
        "the abandoned read to be given back",
        Duration::from_secs(5),
        async || {
            let v = server
                .command(&[
                    "HGET",
                    "slate:{rw-abandon}:rw",
                    &format!("r:{}", w.holder()),
                ])
                .unwrap();
            redis::from_redis_value::<Option<i64>>(v).unwrap().is_none()
        },
    )
    .await;
    // Three leases later the write is still renewed and held.
    tokio::time::sleep(lease * 3).await;
    assert!(!w.is_lost(), "{:?}", w.lease().loss_reason());
    assert_eq!(lock.status().await.unwrap().mode(), SharedMode::Write);
    w.unlock().await.unwrap();
}

/// The `LockGuard` contract: a dropped `unlock` future still releases, exactly once, even one
/// dropped before its first poll (`tokio::time::timeout(ZERO, guard.unlock())` on a slow
/// task, a `select!` whose other branch was ready). Before the guards shared one hold type,
/// the shared guards' `unlock` returned the lazy release itself: dropped unpolled, it released
/// nothing, locally or in Redis, and the next local writer queued for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlock_future_dropped_before_its_first_poll_still_releases() {
    let server = Deployment::standalone();
    let client = server.client();
    let lock = rw(&client, "rw-unpolled-unlock");
    let limit = Duration::from_secs(5);
    drop(lock.read().await.unwrap().unlock());
    let w = within(limit, "a write after a read's dropped unlock", lock.write())
        .await
        .unwrap();
    drop(w.unlock());
    within(limit, "a read after a write's dropped unlock", lock.read())
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    let sem = Semaphore::builder(&client, "sem-unpolled-unlock", 1)
        .build()
        .unwrap();
    drop(sem.acquire(1).await.unwrap().unlock());
    within(limit, "a permit after a dropped unlock", sem.acquire(1))
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
}
