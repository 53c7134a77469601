//! Single-process behaviour of `SingleLock` against a real Redis: basics, reentrancy, tokens,
//! ownership, bad input, and the `Send`/`Sync` promises. The behaviour tests run on each
//! deployment (`<test>::standalone`, `<test>::cluster`, `<test>::sentinel`, see
//! `common::Deployment`); the ones about one server's setup (passwords, ACL users, bad input)
//! run on a standalone server.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use slate_core::BackendKind;
use slate_harness::server::RedisServer;
use slate_redis::{ClientOptions, HolderId, LossReason, RedisClient, SingleLock, SingleLockGuard};

const LEASE: Duration = Duration::from_secs(5);

async fn acquire_and_release(server: Deployment) {
    let client = server.client();
    let lock = lock(&client, "basics", LEASE);
    assert_eq!(lock.key(), b"slate:{basics}");

    let before = Instant::now();
    let guard = lock.lock().await.unwrap();
    assert_eq!(guard.depth(), 1);
    assert!(guard.fencing_token().get() >= 1);
    assert!(!guard.is_lost());
    // Deadline = send instant + lease - drift: inside (before, now + lease).
    assert!(guard.lease_deadline() > before + LEASE - Duration::from_millis(100));
    assert!(guard.lease_deadline() < Instant::now() + LEASE);
    assert!(lock.is_locked().await.unwrap());
    assert_eq!(lock.hold_count(guard.holder()).await.unwrap(), 1);
    assert_eq!(lock.hold_count(HolderId::new()).await.unwrap(), 0);
    let remaining = lock.remaining_lease().await.unwrap().unwrap();
    assert!(remaining <= LEASE && remaining > LEASE - Duration::from_secs(1));
    assert_eq!(client.stats().renewals, 1);
    assert_eq!(lock.local_owner(), Some((guard.holder(), 1)));
    // `status()`, as every primitive names its state read: the holder with its level, the
    // lease left, the fencing counter at the hold's token.
    let status = lock.status().await.unwrap();
    assert_eq!(status.holders, vec![(guard.holder().to_string(), 1)]);
    assert_eq!(status.fence, guard.fencing_token().get());
    assert!(status.remaining.is_some_and(|r| r <= LEASE));

    assert_eq!(guard.unlock().await.unwrap(), 0);
    let status = lock.status().await.unwrap();
    assert!(
        status.holders.is_empty() && status.remaining.is_none(),
        "{status:?}"
    );
    assert!(!lock.is_locked().await.unwrap());
    assert_eq!(lock.remaining_lease().await.unwrap(), None);
    assert_eq!(client.stats().renewals, 0);
    assert_eq!(lock.local_owner(), None);
    // Only the slot's fencing counter remains, shared with every name of the slot, and it has
    // no TTL: nothing of the name itself is left.
    let left = keys(&server);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].starts_with("slate:fence:{"), "{left:?}");
    assert_eq!(int(&server, &["TTL", &left[0]]), -1);
}
crate::per_topology!(acquire_and_release);

/// `unlock()` answers the holder's remaining hold count, whatever order its re-entrant guards
/// are released in (issue 20: one meaning on every lock).
async fn unlock_returns_the_remaining_count_in_any_order(server: Deployment) {
    let client = server.client();
    let lock = lock(&client, "unlock-order", LEASE);
    let outer = lock.lock().await.unwrap();
    let inner = outer.reenter().await.unwrap();
    let innermost = inner.reenter().await.unwrap();
    assert_eq!(outer.unlock().await.unwrap(), 2);
    assert_eq!(innermost.unlock().await.unwrap(), 1);
    assert!(lock.is_locked().await.unwrap());
    assert_eq!(inner.unlock().await.unwrap(), 0);
    assert!(!lock.is_locked().await.unwrap());
}
crate::per_topology!(unlock_returns_the_remaining_count_in_any_order);

async fn try_lock_on_a_busy_lock_is_none(server: Deployment) {
    let (a, b) = (server.client(), server.client());
    let lock_a = lock(&a, "busy", LEASE);
    let lock_b = lock(&b, "busy", LEASE);
    let guard = lock_a.lock().await.unwrap();
    // Same client, another holder: the local queue answers.
    assert!(lock_a.try_lock().await.unwrap().is_none());
    // Another client: Redis answers busy.
    assert!(lock_b.try_lock().await.unwrap().is_none());
    guard.unlock().await.unwrap();
    let g = lock_b.try_lock().await.unwrap().expect("free now");
    g.unlock().await.unwrap();
}
crate::per_topology!(try_lock_on_a_busy_lock_is_none);

async fn try_lock_for_times_out_in_the_queue(server: Deployment) {
    let client = server.client();
    let lock = lock(&client, "timeout", LEASE);
    let guard = lock.lock().await.unwrap();
    let start = Instant::now();
    let err = lock
        .try_lock_for(Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert!(start.elapsed() >= Duration::from_millis(290));
    assert_eq!(client.stats().local_waiters, 0);
    guard.unlock().await.unwrap();
}
crate::per_topology!(try_lock_for_times_out_in_the_queue);

async fn reentrancy_depth_three_with_renewal_and_a_waiter(server: Deployment) {
    let client = server.client();
    let lease = Duration::from_millis(300);
    let lock = lock(&client, "reentrant", lease);

    let g1 = lock.lock().await.unwrap();
    let g2 = g1.reenter().await.unwrap();
    let g3 = lock.lock_as(g1.holder()).await.unwrap();
    assert_eq!((g1.depth(), g2.depth(), g3.depth()), (1, 2, 3));
    assert_eq!(g2.fencing_token(), g1.fencing_token());
    assert_eq!(g3.fencing_token(), g1.fencing_token());
    assert_eq!(
        client.stats().renewals,
        1,
        "re-entrant guards share one registration"
    );

    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move {
            let g = lock.lock().await.unwrap();
            let token = g.fencing_token();
            (g, token)
        }
    });
    eventually(Duration::from_secs(2), "the waiter to queue", || {
        client.stats().local_waiters == 1
    })
    .await;

    // Hold for more than three leases: renewal keeps it, the waiter keeps waiting.
    let held_until = Instant::now() + lease * 4;
    while Instant::now() < held_until {
        assert!(
            !g1.is_lost(),
            "lease lost while held: {:?}",
            g1.lease().loss_reason()
        );
        assert!(!waiter.is_finished());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(lock.hold_count(g1.holder()).await.unwrap(), 3);

    let holder = g1.holder();
    let t1 = g1.fencing_token();
    assert_eq!(g3.unlock().await.unwrap(), 2);
    assert_eq!(g2.unlock().await.unwrap(), 1);
    tokio::time::sleep(lease).await;
    assert!(!waiter.is_finished(), "freed before depth 0");
    assert!(lock.is_locked().await.unwrap());
    assert_eq!(g1.unlock().await.unwrap(), 0);

    let (g, token) = within(Duration::from_secs(2), "the waiter", waiter)
        .await
        .unwrap();
    assert!(token > t1, "{token} after {t1}");
    // One more release by the first holder: not held, nothing touched.
    let key = "slate:{reentrant}";
    let before = server.command(&["HGETALL", key]).unwrap();
    assert_eq!(
        run_script(
            &server,
            release_lua(),
            &[key, "slate:{reentrant}:released"],
            &[&holder.to_string(), "300"]
        ),
        -1
    );
    assert_eq!(server.command(&["HGETALL", key]).unwrap(), before);
    g.unlock().await.unwrap();
}
crate::per_topology!(reentrancy_depth_three_with_renewal_and_a_waiter);

async fn tokens_increase_across_holders_and_stay_on_reentry(server: Deployment) {
    let (a, b) = (server.client(), server.client());
    let locks = [lock(&a, "tokens", LEASE), lock(&b, "tokens", LEASE)];
    let mut last = 0;
    for i in 0..20 {
        let l = &locks[i % 2];
        let g = l.lock().await.unwrap();
        let t = g.fencing_token().get();
        assert!(t > last, "token {t} after {last}");
        let again = g.reenter().await.unwrap();
        assert_eq!(again.fencing_token().get(), t);
        again.unlock().await.unwrap();
        g.unlock().await.unwrap();
        last = t;
    }
}
crate::per_topology!(tokens_increase_across_holders_and_stay_on_reentry);

async fn reentry_in_a_holder_scope_follows_the_task_across_threads(server: Deployment) {
    let client = server.client();
    let lock = lock(&client, "scope", LEASE);
    let holder = HolderId::new();
    let task = tokio::spawn({
        let lock = lock.clone();
        holder.scope(async move {
            let mut threads = std::collections::HashSet::new();
            let outer = lock.lock().await.unwrap();
            let mut guards = Vec::new();
            for _ in 0..20 {
                threads.insert(std::thread::current().id());
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(1)).await;
                let g = lock.lock().await.unwrap();
                assert_eq!(g.holder(), outer.holder());
                assert_eq!(g.fencing_token(), outer.fencing_token());
                guards.push(g);
            }
            assert_eq!(guards.last().unwrap().depth(), 21);
            for g in guards.into_iter().rev() {
                g.unlock().await.unwrap();
            }
            outer.unlock().await.unwrap();
            threads.len()
        })
    });
    let threads = within(Duration::from_secs(10), "the scoped task", task)
        .await
        .unwrap();
    println!("the scoped task ran on {threads} thread(s)");
    assert!(!lock.is_locked().await.unwrap());
}
crate::per_topology!(reentry_in_a_holder_scope_follows_the_task_across_threads);

async fn wrong_owner_cannot_release_or_renew(server: Deployment) {
    let client = server.client();
    let lock = lock(&client, "owner", LEASE);
    let key = "slate:{owner}";
    let channel = "slate:{owner}:released";
    let stranger = HolderId::new().to_string();

    // A release of a lock nobody ever held leaves no key at all (Bedrock created a -1 entry).
    assert_eq!(
        run_script(
            &server,
            release_lua(),
            &[key, channel],
            &[&stranger, "5000"]
        ),
        -1
    );
    assert_eq!(
        run_script(&server, renew_lua(), &[key], &[&stranger, "5000"]),
        0
    );
    assert!(keys(&server).is_empty(), "{:?}", keys(&server));

    let guard = lock.lock().await.unwrap();
    let before = server.command(&["HGETALL", key]).unwrap();
    let ttl_before = int(&server, &["PTTL", key]);
    // A shorter lease would show up as a lower TTL if renew touched the key.
    assert_eq!(
        run_script(&server, release_lua(), &[key, channel], &[&stranger, "100"]),
        -1
    );
    assert_eq!(
        run_script(&server, renew_lua(), &[key], &[&stranger, "100"]),
        0
    );
    assert_eq!(server.command(&["HGETALL", key]).unwrap(), before);
    let ttl_after = int(&server, &["PTTL", key]);
    assert!(
        ttl_after > 1000 && ttl_after <= ttl_before,
        "{ttl_after} vs {ttl_before}"
    );
    assert_eq!(guard.unlock().await.unwrap(), 0);
}
crate::per_topology!(wrong_owner_cannot_release_or_renew);

async fn force_unlock_wakes_waiters_and_the_holder_learns(server: Deployment) {
    let (a, b) = (server.client(), server.client());
    let lease = Duration::from_millis(600);
    let holder_lock = lock(&a, "force", lease);
    let other = SingleLock::builder(&b, "force")
        .lease(lease)
        .spin_wait(Duration::from_secs(5))
        .build()
        .unwrap();
    let guard = holder_lock.lock().await.unwrap();
    let waiter = tokio::spawn({
        let other = other.clone();
        async move { other.lock().await.unwrap() }
    });
    eventually(Duration::from_secs(2), "the waiter to subscribe", || {
        b.stats().subscriptions == 1
    })
    .await;
    assert_eq!(other.force_unlock().await.unwrap(), 1);
    let g = within(Duration::from_secs(2), "the woken waiter", waiter)
        .await
        .unwrap();
    // The first holder's renewal finds its entry gone.
    let reason = within(Duration::from_secs(2), "loss", guard.lost()).await;
    assert_eq!(reason, LossReason::EntryGone);
    let err = guard.unlock().await.unwrap_err();
    assert!(err.is_not_held(), "{err}");
    assert_eq!(a.stats().renewals, 0);
    assert_eq!(g.unlock().await.unwrap(), 0);
    assert_eq!(other.force_unlock().await.unwrap(), 0);
}
crate::per_topology!(force_unlock_wakes_waiters_and_the_holder_learns);

async fn dropped_guard_is_released_in_the_background(server: Deployment) {
    let client = server.client();
    let lock = lock(&client, "drop", LEASE);
    let guard = lock.lock().await.unwrap();
    drop(guard);
    eventually_async(Duration::from_secs(2), "the background release", || {
        let lock = lock.clone();
        async move { !lock.is_locked().await.unwrap() }
    })
    .await;
    eventually(Duration::from_secs(2), "deregistration", || {
        client.stats().renewals == 0
    })
    .await;
    assert!(lock.local_owner().is_none());
}
crate::per_topology!(dropped_guard_is_released_in_the_background);

#[test]
fn client_built_outside_a_runtime_serves_threads() {
    // Issue 20, item 3: no runtime anywhere in this test; the client starts a small one of
    // its own and the blocking twins use it.
    let server = server();
    let client = RedisClient::open(server.url()).unwrap();
    let lock = SingleLock::builder(&client, "no-runtime").build().unwrap();
    let g = lock.blocking_lock().unwrap();
    let other = std::thread::spawn({
        let lock = lock.clone();
        move || lock.blocking_try_lock().unwrap().is_none()
    })
    .join()
    .unwrap();
    assert!(other, "held by the first thread");
    assert_eq!(g.blocking_unlock().unwrap(), 0);
    // Dropped from a plain thread: the client's runtime shuts down without blocking or panic.
    drop(lock);
    drop(client);
}

#[test]
fn blocking_twins_work_on_threads() {
    let server = server();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(async { client(&server) });
    let lock = SingleLock::builder(&client, "blocking").build().unwrap();
    let g = lock.blocking_lock().unwrap();
    let inner = lock.blocking_lock_as(g.holder()).unwrap();
    assert_eq!(inner.depth(), 2);
    let other = std::thread::spawn({
        let lock = lock.clone();
        move || {
            lock.blocking_try_lock_for(Duration::from_millis(200))
                .unwrap_err()
        }
    })
    .join()
    .unwrap();
    assert!(other.is_timeout(), "{other}");
    // Another thread's try: busy, no wait.
    let busy = std::thread::spawn({
        let lock = lock.clone();
        move || lock.blocking_try_lock().unwrap().is_none()
    })
    .join()
    .unwrap();
    assert!(busy, "blocking_try_lock of a held lock is None");
    assert_eq!(inner.blocking_unlock().unwrap(), 1);
    assert_eq!(g.blocking_unlock().unwrap(), 0);
    let g = lock.blocking_try_lock().unwrap().expect("free now");
    assert_eq!(g.blocking_unlock().unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "inside a tokio runtime")]
async fn blocking_lock_panics_inside_a_runtime() {
    let server = server();
    let client = client(&server);
    let lock = SingleLock::builder(&client, "panics").build().unwrap();
    let _ = lock.blocking_lock();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_the_fix() {
    let server = server();
    let client = client(&server);
    let invalid = |r: slate_core::Result<SingleLock>| match r {
        Err(slate_core::Error::InvalidInput {
            what, problem, fix, ..
        }) => (what, problem, fix),
        other => panic!("expected invalid input, got {other:?}"),
    };

    let (what, _, fix) = invalid(SingleLock::builder(&client, "").build());
    assert_eq!(what, "lock name");
    assert!(fix.contains("non-empty"), "{fix}");
    let (what, problem, _) = invalid(SingleLock::builder(&client, vec![b'x'; 1025]).build());
    assert_eq!(what, "lock name");
    assert!(problem.contains("1025 bytes"), "{problem}");
    let (what, _, fix) = invalid(
        SingleLock::builder(&client, "a")
            .lease(Duration::ZERO)
            .build(),
    );
    assert_eq!(what, "lease");
    assert!(fix.contains("at least"), "{fix}");
    let (what, _, _) = invalid(
        SingleLock::builder(&client, "a")
            .lease(Duration::from_secs(1))
            .renewal_period(Duration::from_secs(1))
            .build(),
    );
    assert_eq!(what, "renewal period");
    // A second handle of one name with other options.
    let _first = SingleLock::builder(&client, "same").build().unwrap();
    let (what, _, _) = invalid(SingleLock::builder(&client, "same").lease(LEASE).build());
    assert_eq!(what, "options");

    // Unreachable server: a port nothing listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let nowhere = RedisClient::open_with(
        format!("redis://127.0.0.1:{port}"),
        ClientOptions::builder()
            .command_timeout(Duration::from_secs(1))
            .build()
            .unwrap(),
    )
    .unwrap();
    let start = Instant::now();
    let err = SingleLock::builder(&nowhere, "a")
        .build()
        .unwrap()
        .lock()
        .await
        .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(3));
    assert_eq!(err.backend_kind(), Some(BackendKind::Io), "{err}");
    assert!(
        err.to_string().contains(&format!("127.0.0.1:{port}")),
        "{err}"
    );
    assert!(err.to_string().contains("reachable"), "{err}");

    // Malformed URL.
    let err = RedisClient::open("not a url").unwrap_err();
    assert!(err.is_invalid_input(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_an_auth_error_without_the_password() {
    let server = RedisServer::builder()
        .password("right-horse")
        .start()
        .unwrap();
    let url = format!("redis://:wrong-battery@127.0.0.1:{}", server.port());
    let client = RedisClient::open(&url).unwrap();
    let err = client.ping().await.unwrap_err();
    assert_eq!(err.backend_kind(), Some(BackendKind::Auth), "{err}");
    let text = format!("{err} {err:?} {client:?}");
    assert!(text.contains("check the password"), "{text}");
    assert!(!text.contains("wrong-battery"), "{text}");
    let err = SingleLock::builder(&client, "a")
        .build()
        .unwrap()
        .try_lock()
        .await
        .unwrap_err();
    assert_eq!(err.backend_kind(), Some(BackendKind::Auth), "{err}");

    // The right password through the options works.
    let good = RedisClient::open_with(
        format!("redis://127.0.0.1:{}", server.port()),
        ClientOptions::builder()
            .password("right-horse")
            .build()
            .unwrap(),
    )
    .unwrap();
    good.ping().await.unwrap();
    assert!(!format!("{good:?}").contains("right-horse"));
}

#[test]
fn send_sync_and_static() {
    fn send_sync<T: Send + Sync + 'static>() {}
    fn send<T: Send>(_: &T) {}
    send_sync::<SingleLock>();
    send_sync::<SingleLockGuard>();
    send_sync::<RedisClient>();

    #[allow(dead_code, clippy::diverging_sub_expression)]
    fn futures_are_send(lock: SingleLock, guard: SingleLockGuard) {
        send(&lock.lock());
        send(&lock.try_lock());
        send(&lock.try_lock_for(Duration::from_secs(1)));
        send(&lock.is_locked());
        send(&guard.reenter());
        send(&guard.unlock());
    }
}

/// A re-entry after the entry was force-unlocked fails with `LeaseLost` and creates nothing
/// (issue 19, defect 4: it used to start a fresh hold counted as a second local level); the
/// old guard's loss signal fires, and its release finds nothing to release.
async fn reentry_after_the_entry_was_lost_fails(server: Deployment) {
    let client = server.client();
    let lock = lock(&client, "lost-reentry", LEASE);
    let outer = lock.lock().await.unwrap();
    assert_eq!(lock.force_unlock().await.unwrap(), 1);
    assert!(outer.reenter().await.unwrap_err().is_lease_lost());
    assert!(!lock.is_locked().await.unwrap());
    assert_eq!(
        within(Duration::from_secs(1), "the old lease to end", outer.lost()).await,
        LossReason::EntryGone
    );
    assert!(outer.unlock().await.unwrap_err().is_not_held());
    assert_eq!(client.stats().renewals, 0);
    assert_eq!(lock.local_owner(), None);
    // The lock is usable again.
    lock.lock().await.unwrap().unlock().await.unwrap();
}
crate::per_topology!(reentry_after_the_entry_was_lost_fails);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_users_log_in_and_missing_permissions_are_named() {
    let server = RedisServer::builder()
        .acl_user("worker", "w0rker", "~slate:* &slate:* +@all")
        .acl_user("reader", "r3ader", "~* +@read +@connection")
        .start()
        .unwrap();
    let worker = RedisClient::open(server.url_for_user("worker", "w0rker")).unwrap();
    let lock = SingleLock::builder(&worker, "acl").build().unwrap();
    let g = lock.lock().await.unwrap();
    assert_eq!(g.unlock().await.unwrap(), 0);

    // Credentials through the options, for a user who may not run scripts.
    let reader = RedisClient::open_with(
        format!("redis://127.0.0.1:{}", server.port()),
        ClientOptions::builder()
            .username("reader")
            .password("r3ader")
            .build()
            .unwrap(),
    )
    .unwrap();
    let err = SingleLock::builder(&reader, "acl")
        .build()
        .unwrap()
        .try_lock()
        .await
        .unwrap_err();
    assert_eq!(err.backend_kind(), Some(BackendKind::Permission), "{err}");
    assert!(err.to_string().contains("grant the ACL user"), "{err}");
    assert!(!format!("{err} {reader:?}").contains("r3ader"));
}

/// A waiter whose release notifications are live does not poll: while another client holds
/// the lock, the server sees a handful of attempts in a second of waiting, not one per spin
/// wait (50 ms); the release wakes it at once, and a holder that stops renewing is noticed
/// right when its lease ends (the busy answer said when).
async fn a_waiter_with_live_notifications_does_not_poll(server: Deployment) {
    let holder_client = server.client();
    let held = lock(&holder_client, "quiet", LEASE).lock().await.unwrap();
    let waiting_client = server.client();
    let waiter = tokio::spawn({
        let l = lock(&waiting_client, "quiet", LEASE);
        async move { l.lock().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let owner = server.owner("slate:{quiet}");
    let before = owner.command_calls(&["evalsha"]).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = owner.command_calls(&["evalsha"]).unwrap() - before;
    // The holder's renewal (one per lease/3) and at most two attempts of the waiter.
    assert!(
        during <= 4,
        "{during} script calls in a second of waiting: polling"
    );
    let g = woken_by_the_release(
        held,
        waiter,
        Duration::from_secs(5),
        Duration::from_millis(500),
    )
    .await;
    g.unlock().await.unwrap();

    // A holder that stops renewing (its entry written directly, as a crashed process leaves
    // it): the waiter takes the lock right after the entry expires.
    let key = "slate:{quiet}";
    server
        .command(&["HSET", key, "crashed-holder", "1", "t", "1"])
        .unwrap();
    server.command(&["PEXPIRE", key, "1500"]).unwrap();
    let started = Instant::now();
    let g = within(
        Duration::from_secs(5),
        "the waiter after the lease ended",
        lock(&waiting_client, "quiet", LEASE).lock(),
    )
    .await
    .unwrap();
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1_400) && took < Duration::from_millis(1_900),
        "taken {took:?} after a 1.5 s lease began"
    );
    g.unlock().await.unwrap();
}
crate::per_topology!(a_waiter_with_live_notifications_does_not_poll);

/// A process that tried the lock once (`try_lock`, busy) and left must not keep a place in the
/// line: at the release the turn would be reserved for it and nobody else told, and a waiter
/// whose notifications are live would sleep through the free lock (review finding on the
/// live park). It gives its place back when its local queue drains, so the release goes to
/// the waiter at once.
async fn a_process_that_gave_up_does_not_hold_up_the_next_waiter(server: Deployment) {
    let h = server.client();
    let held = lock(&h, "gave-up", LEASE).lock().await.unwrap();
    let t = server.client();
    assert!(
        lock(&t, "gave-up", LEASE)
            .try_lock()
            .await
            .unwrap()
            .is_none()
    );
    let w = server.client();
    let waiter = tokio::spawn({
        let l = lock(&w, "gave-up", LEASE);
        async move { l.lock().await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let g = woken_by_the_release(
        held,
        waiter,
        Duration::from_secs(5),
        Duration::from_millis(400),
    )
    .await;
    g.unlock().await.unwrap();
}
crate::per_topology!(a_process_that_gave_up_does_not_hold_up_the_next_waiter);

/// A release that keeps the turn for its process's local waiter, who leaves (times out) while
/// the release is on its way: the turn is handed on to the waiting process at once, not when
/// its reservation lapses and the other process's retry timer fires (second review of the
/// live park).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_kept_for_a_local_waiter_that_left_is_handed_on() {
    let server = server();
    let proxy = slate_harness::proxy::FaultProxy::start(server.addr()).expect("proxy");
    let p = RedisClient::open(proxy.url()).expect("client");
    let q = client(&server);
    let held = lock(&p, "kept", LEASE).lock().await.unwrap();
    let other = tokio::spawn({
        let l = lock(&q, "kept", LEASE);
        async move { l.lock().await.map(|g| (g, Instant::now())) }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // P's local waiter queues behind the holder (no remote attempt) and gives up in 50 ms.
    let local = tokio::spawn({
        let l = lock(&p, "kept", LEASE);
        async move { l.try_lock_for(Duration::from_millis(50)).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    proxy
        .set_mode(slate_harness::proxy::Mode::Delay {
            to_server: Duration::from_millis(100),
            to_client: Duration::ZERO,
        })
        .unwrap();
    let released = Instant::now();
    held.unlock().await.unwrap();
    assert!(local.await.unwrap().is_err_and(|e| e.is_timeout()));
    let (g, at) = within(Duration::from_secs(5), "the other process", other)
        .await
        .unwrap()
        .unwrap();
    let after = at.duration_since(released);
    assert!(
        after < Duration::from_millis(450),
        "the other process got the lock {after:?} after the release began"
    );
    g.unlock().await.unwrap();
}
