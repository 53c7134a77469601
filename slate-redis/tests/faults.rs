//! `SingleLock` against a server that restarts empty or hangs (SIGSTOP).

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use slate_core::BackendKind;
use slate_harness::server::Data;
use slate_redis::{ClientOptions, LossReason, SingleLock};

fn script_loaded(server: &slate_harness::server::RedisServer, code: &str) -> bool {
    let sha = redis::Script::new(code).get_hash().to_owned();
    let v = server.command(&["SCRIPT", "EXISTS", &sha]).unwrap();
    let flags: Vec<i64> = redis::from_redis_value(v).unwrap();
    flags == [1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_while_idle_reloads_scripts_for_acquire_and_pipelined_renewal() {
    let mut server = server();
    let client = client(&server);
    let lease = Duration::from_millis(400);
    let lock = lock(&client, "restart", lease);

    // Warm up: the connection is cached and every script is known to the server.
    let g = lock.lock().await.unwrap();
    tokio::time::sleep(lease).await;
    assert!(script_loaded(&server, renew_lua()));
    g.unlock().await.unwrap();

    // Idle (longer than the idle check), then the server comes back empty.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    server.restart(Data::Wipe).unwrap();
    assert!(!script_loaded(&server, renew_lua()));
    assert!(keys(&server).is_empty());

    let g = within(
        Duration::from_secs(5),
        "the first lock after a restart",
        lock.lock(),
    )
    .await
    .unwrap();
    assert!(
        g.fencing_token().get() > 1_700_000_000_000_000,
        "the counter was seeded again from the server's clock: {}",
        g.fencing_token().get()
    );
    // A new connection loads every script; empty the cache again so that renewal and release
    // meet NOSCRIPT on a connection that is already in use.
    server.command(&["SCRIPT", "FLUSH"]).unwrap();
    assert!(!script_loaded(&server, renew_lua()));
    // Held for three leases: the renewal pipeline met NOSCRIPT, loaded the script, renewed.
    let until = Instant::now() + lease * 3;
    while Instant::now() < until {
        assert!(!g.is_lost(), "{:?}", g.lease().loss_reason());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(script_loaded(&server, renew_lua()));
    assert!(lock.is_locked().await.unwrap());
    assert!(!script_loaded(&server, release_lua()));
    assert_eq!(g.unlock().await.unwrap(), 0, "release reloaded its script");
    assert_eq!(
        keys_but_records(&server, 2 * DEFAULT_COMMAND_TIMEOUT),
        [fence_key("restart")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_server_calls_time_out_loss_fires_by_the_deadline_nothing_resurrects() {
    let mut server = server();
    let timeout = Duration::from_millis(300);
    let opts = ClientOptions::builder()
        .command_timeout(timeout)
        .build()
        .unwrap();
    let (a, b) = (
        client_with(&server, opts.clone()),
        client_with(&server, opts),
    );
    let lease = Duration::from_millis(800);
    let lock_a = lock(&a, "hung", lease);
    let lock_b = SingleLock::builder(&b, "hung")
        .lease(lease)
        .build()
        .unwrap();
    let key = "slate:{hung}";

    let guard = lock_a.lock().await.unwrap();
    let inner = guard.reenter().await.unwrap();
    // Let one renewal happen so the deadline is a renewed one.
    tokio::time::sleep(lease / 2 + Duration::from_millis(100)).await;
    server.pause().unwrap();
    let paused_at = Instant::now();
    let watcher = tokio::spawn({
        let watch = guard.lease().clone();
        async move {
            let reason = watch.lost().await;
            (reason, Instant::now(), watch.deadline())
        }
    });

    // Every call returns within its timeout (plus scheduling slack).
    let bound = timeout + Duration::from_millis(400);
    let start = Instant::now();
    let err = lock_a.is_locked().await.unwrap_err();
    assert_eq!(err.backend_kind(), Some(BackendKind::Timeout), "{err}");
    assert!(start.elapsed() < bound, "{:?}", start.elapsed());
    let start = Instant::now();
    let err = lock_b.try_lock().await.unwrap_err();
    assert_eq!(err.backend_kind(), Some(BackendKind::Timeout), "{err}");
    assert!(start.elapsed() < bound, "{:?}", start.elapsed());
    let start = Instant::now();
    let err = inner.unlock().await.unwrap_err();
    assert_eq!(err.backend_kind(), Some(BackendKind::Timeout), "{err}");
    assert!(start.elapsed() < bound, "{:?}", start.elapsed());
    let start = Instant::now();
    let err = b.ping().await.unwrap_err();
    assert_eq!(err.backend_kind(), Some(BackendKind::Timeout), "{err}");
    assert!(start.elapsed() < bound, "{:?}", start.elapsed());

    // The holder learns by its deadline.
    let (reason, fired_at, deadline) = within(lease * 2, "loss", watcher).await.unwrap();
    assert!(
        deadline < paused_at + lease,
        "the deadline is inside the last lease"
    );
    let late = fired_at.saturating_duration_since(deadline);
    assert_eq!(reason, LossReason::DeadlineExpired);
    assert!(
        late < Duration::from_millis(150),
        "loss signalled {late:?} late"
    );
    assert!(guard.is_lost());

    server.resume().unwrap();
    // The key ends with its TTL; queued renewals and the timed-out acquire do not bring it back.
    eventually(lease * 3, "the key to expire", || {
        int(&server, &["EXISTS", key]) == 0
    })
    .await;
    let quiet_until = Instant::now() + lease * 2;
    while Instant::now() < quiet_until {
        assert_eq!(int(&server, &["EXISTS", key]), 0, "entry resurrected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let err = guard.unlock().await.unwrap_err();
    assert!(err.is_not_held(), "{err}");
    assert_eq!(a.stats().renewals, 0);
    // The lock works again.
    let g = lock_b.lock().await.unwrap();
    g.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_hold_stops_renewal_and_reports_at_the_deadline() {
    let server = server();
    let client = client(&server);
    let lease = Duration::from_millis(300);
    let lock = SingleLock::builder(&client, "max-hold")
        .lease(lease)
        .max_hold(Duration::from_millis(500))
        .build()
        .unwrap();
    let start = Instant::now();
    let guard = lock.lock().await.unwrap();
    let reason = within(Duration::from_secs(3), "loss", guard.lost()).await;
    assert_eq!(reason, LossReason::MaxHoldReached);
    let held = start.elapsed();
    assert!(held >= Duration::from_millis(500), "{held:?}");
    eventually(Duration::from_secs(2), "the key to expire", || {
        int(&server, &["EXISTS", "slate:{max-hold}"]) == 0
    })
    .await;
    assert!(guard.unlock().await.unwrap_err().is_not_held());
}

/// S11(c): a reply slower than the lease brings no grant: the level is given back and the
/// caller gets a timeout error that names the lease; a reply that leaves enough validity is
/// a grant whose first renewal comes before its (early) deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_that_arrives_after_its_lease_is_refused_and_given_back() {
    use slate_harness::proxy::{FaultProxy, Mode};
    let server = server();
    let proxy = FaultProxy::start(server.addr()).expect("proxy");
    let client = slate_redis::RedisClient::open_with(
        proxy.url(),
        ClientOptions::builder()
            .command_timeout(Duration::from_secs(3))
            .build()
            .unwrap(),
    )
    .unwrap();
    client.ping().await.unwrap();
    let lease = Duration::from_millis(500);
    let lock = SingleLock::builder(&client, "late")
        .lease(lease)
        .renewal_period(Duration::from_millis(200))
        .build()
        .unwrap();
    proxy
        .set_mode(Mode::Delay {
            to_server: Duration::ZERO,
            to_client: lease * 6 / 5,
        })
        .unwrap();
    let err = match lock.try_lock().await {
        Err(e) => e,
        Ok(g) => panic!(
            "a grant after its lease: {:?}",
            g.map(|g| g.lease_deadline())
        ),
    };
    assert_eq!(err.backend_kind(), Some(BackendKind::Timeout), "{err}");
    assert!(err.to_string().contains("raise the lease"), "{err}");
    proxy.set_mode(Mode::Pass).unwrap();
    // Given back (or expired): the lock is free for the next caller at once.
    eventually(Duration::from_secs(2), "the late grant to be gone", || {
        !keys(&server).contains(&"slate:{late}".to_owned())
    })
    .await;
    // 0.6 of the lease on the reply: a grant with ~0.4 L left, renewed in time over a fast
    // link (the first renewal is scheduled before the deadline, not a whole period later).
    proxy
        .set_mode(Mode::Delay {
            to_server: Duration::ZERO,
            to_client: lease * 3 / 5,
        })
        .unwrap();
    let g = lock.try_lock().await.unwrap().expect("free");
    proxy.set_mode(Mode::Pass).unwrap();
    let until = Instant::now() + lease * 3;
    while Instant::now() < until {
        assert!(!g.is_lost(), "{:?}", g.lease().loss_reason());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(g.unlock().await.unwrap(), 0);
}

/// The fencing counter of `name`'s slot, as the server has it now.
fn counter(server: &slate_harness::server::RedisServer, name: &str) -> u64 {
    let v = server.command(&["GET", &fence_key(name)]).unwrap();
    let text: String = redis::from_redis_value(v).unwrap();
    text.parse().unwrap()
}

/// Takes and releases `name` `n` times; the last token.
async fn take(lock: &SingleLock, n: usize) -> u64 {
    let mut last = 0;
    for _ in 0..n {
        let g = lock.lock().await.unwrap();
        assert!(g.fencing_token().get() > last);
        last = g.fencing_token().get();
        g.unlock().await.unwrap();
    }
    last
}

/// A server restarted from a snapshot older than its last grants (no AOF: a crash of a server
/// with RDB snapshots) comes back with older fencing counters. The tokens issued after the
/// restart are still above every token issued before it: by the client that used the server
/// before (a new run id behind the address) and by a client that never did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_across_a_restart_from_an_older_snapshot() {
    let mut server = server();
    let lease = Duration::from_secs(2);
    let a = client(&server);
    let lock_a = lock(&a, "rollback", lease);
    take(&lock_a, 1).await;
    server.command(&["SAVE"]).unwrap();
    let before = take(&lock_a, 5).await;
    server.restart(Data::Keep).unwrap();
    assert!(
        counter(&server, "rollback") < before,
        "the snapshot brought an older counter back"
    );
    // The client that used the server before: its new connection reaches another run id.
    let after = within(
        Duration::from_secs(5),
        "the first lock after the restart",
        take(&lock_a, 1),
    )
    .await;
    assert!(
        after > before,
        "token {after} after the restart, {before} before"
    );

    // Again, and the first grant after the restart is a new client's.
    server.command(&["SAVE"]).unwrap();
    let before = take(&lock_a, 5).await;
    server.restart(Data::Keep).unwrap();
    assert!(counter(&server, "rollback") < before);
    let c = client(&server);
    let lock_c = lock(&c, "rollback", lease);
    let after = take(&lock_c, 1).await;
    assert!(
        after > before,
        "token {after} from a new client, {before} before"
    );
    // The client that used the server before follows above it.
    assert!(take(&lock_a, 1).await > after);
}
