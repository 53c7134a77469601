//! Local passes (lock cohorting, issue 14): a holder that won its hold from the queue and
//! releases while tasks of its own process wait hands them the Redis hold without a round
//! trip, up to the tenure, and every holder still gets what a remote acquisition gives: its
//! own strictly larger fencing token, its own lease watch and max hold, re-entry on the same
//! token, and exclusion against other processes, including one that names a passed holder's
//! id.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use slate_harness::server::RedisServer;
use slate_redis::{HolderId, LossReason, SingleLock, SingleLockGuard, Wait};

const LEASE: Duration = Duration::from_secs(5);

/// Script calls the server ran so far (`EVALSHA` and `EVAL`, from `INFO commandstats`).
fn script_calls(server: &RedisServer) -> u64 {
    server.command_calls(&["evalsha", "eval"]).unwrap()
}

/// `n` tasks of one process, all queued behind a first holder, each take the lock once and
/// check that nobody else is inside; returns their tokens in the order they held.
async fn queued_round(lock: &SingleLock, n: usize) -> Vec<u64> {
    let first = lock.lock().await.unwrap();
    let inside = Arc::new(AtomicBool::new(false));
    let tokens = Arc::new(std::sync::Mutex::new(vec![first.fencing_token().get()]));
    let mut tasks = Vec::new();
    for _ in 0..n {
        let (lock, inside, tokens) = (lock.clone(), inside.clone(), tokens.clone());
        tasks.push(tokio::spawn(async move {
            let g = lock.lock().await.unwrap();
            assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
            assert_eq!(lock.local_owner(), Some((g.holder(), 1)));
            assert_eq!(lock.hold_count(g.holder()).await.unwrap(), 1);
            // Re-entry inside a passed hold keeps the holder's own token.
            let again = g.reenter().await.unwrap();
            assert_eq!(again.fencing_token(), g.fencing_token());
            assert_eq!(lock.hold_count(g.holder()).await.unwrap(), 2);
            assert_eq!(again.unlock().await.unwrap(), 1);
            tokens.lock().unwrap().push(g.fencing_token().get());
            inside.store(false, Ordering::SeqCst);
            assert_eq!(g.unlock().await.unwrap(), 0);
        }));
    }
    let waiters = lock.clone();
    eventually(Duration::from_secs(5), "the tasks to queue", || {
        waiters.local_waiters() == n
    })
    .await;
    first.unlock().await.unwrap();
    for t in tasks {
        within(Duration::from_secs(10), "a queued task", t)
            .await
            .unwrap();
    }
    Arc::try_unwrap(tokens).unwrap().into_inner().unwrap()
}

async fn passes_keep_tokens_strictly_increasing(server: Deployment) {
    let client = server.client();
    let lock = lock(&client, "cohort-tokens", LEASE);
    let mut all = Vec::new();
    for _ in 0..3 {
        all.extend(queued_round(&lock, 11).await);
    }
    assert_eq!(all.len(), 36);
    assert!(
        all.windows(2).all(|w| w[0] < w[1]),
        "tokens must strictly increase across holders, passes included: {all:?}"
    );
    // A later remote acquisition (another process) is above every token of the blocks.
    let other = server.client();
    let g = lock_for(&other, "cohort-tokens").lock().await.unwrap();
    assert!(g.fencing_token().get() > *all.last().unwrap());
    g.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
}
crate::per_topology!(passes_keep_tokens_strictly_increasing);

/// A hold passed between two local holders: a first holder wins its hold from the queue
/// (behind a holder that found the lock free), holds for `hold`, and releases while a second
/// waits: the second is passed the hold. Returns the first holder's id and token, and the
/// second's guard.
async fn passed_hold(lock: &SingleLock, hold: Duration) -> (HolderId, u64, SingleLockGuard) {
    let alone = lock.lock().await.unwrap();
    let spawn = || {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock().await.unwrap() })
    };
    let queued = |n| {
        let lock = lock.clone();
        move || lock.local_waiters() == n
    };
    let first = spawn();
    eventually(Duration::from_secs(5), "the first to queue", queued(1)).await;
    let second = spawn();
    eventually(Duration::from_secs(5), "the second to queue", queued(2)).await;
    alone.unlock().await.unwrap();
    let g1 = within(Duration::from_secs(5), "the first", first)
        .await
        .unwrap();
    tokio::time::sleep(hold).await;
    let (h1, t1) = (g1.holder(), g1.fencing_token().get());
    g1.unlock().await.unwrap();
    let g2 = within(Duration::from_secs(5), "the second", second)
        .await
        .unwrap();
    // The next token of the first holder's block: it came by a pass.
    assert_eq!(g2.fencing_token().get(), t1 + 1);
    (h1, t1, g2)
}

fn lock_for(client: &slate_redis::RedisClient, name: &str) -> SingleLock {
    lock(client, name, LEASE)
}

/// One process's queued tasks cost two script calls per tenure (one acquire, one release)
/// instead of two per holder; a named holder (`lock_as`) is never passed the hold.
///
/// Fails without the passes: 16 holders would cost 32 calls instead of 6 (plus re-entries).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_local_tasks_share_one_remote_hold_per_tenure() {
    let server = server();
    let client = client(&server);
    let lock = lock(&client, "cohort-calls", LEASE);
    // Load the scripts first (a first call may be EVAL + EVALSHA).
    lock.lock().await.unwrap().unlock().await.unwrap();

    let before = script_calls(&server);
    let tokens = queued_round(&lock, 15).await;
    let calls = script_calls(&server) - before;
    assert_eq!(tokens.len(), 16);
    // The first holder found the lock free (its own remote hold); the 15 queued tasks share
    // two remote holds won from the queue (8 + 7 holders): 3 acquires and 3 releases, plus
    // one re-entry and its release per queued task (the test's own `reenter`, 15 x 2 calls).
    assert_eq!(
        calls,
        6 + 30,
        "script calls for 16 queued holders (re-entries included)"
    );

    // Named holders acquire remotely every time.
    let before = script_calls(&server);
    let first = lock.lock_as(HolderId::new()).await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let lock = lock.clone();
        tasks.push(tokio::spawn(async move {
            lock.lock_as(HolderId::new())
                .await
                .unwrap()
                .unlock()
                .await
                .unwrap();
        }));
    }
    let waiters = lock.clone();
    eventually(Duration::from_secs(5), "the tasks to queue", || {
        waiters.local_waiters() == 3
    })
    .await;
    first.unlock().await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        script_calls(&server) - before,
        8,
        "4 named holders, 4 x 2 calls"
    );
}

/// Generic code that takes the lock through the `DistributedLock` contract gets the local
/// passes the inherent calls get: the contract's `lock()` and `try_lock_for()` acquire for the
/// current holder, which may be passed a hold, not for a fresh named one (which never is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_contracts_lock_is_passed_like_the_inherent_one() {
    let server = server();
    let client = client(&server);
    let lock = lock(&client, "cohort-contract", LEASE);
    lock.lock().await.unwrap().unlock().await.unwrap();
    let waiters = {
        let lock = lock.clone();
        move || lock.local_waiters()
    };
    contract_round(&server, lock.clone(), &waiters).await;
    // Type-erased, the same.
    contract_round(&server, slate_core::AnyLock::new(lock), &waiters).await;
}

/// A call made inside a holder's scope acquires as that holder, even when its future is
/// awaited after the scope ended: the holder is read when the call is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_is_the_scope_s_when_the_call_is_made() {
    use slate_core::DistributedLock;
    let server = server();
    let client = client(&server);
    let lock = lock(&client, "cohort-scope", LEASE);
    let h = HolderId::new();
    let held = lock.lock_as(h).await.unwrap();
    let own = h.sync_scope(|| lock.try_lock());
    let inner = own.await.unwrap().expect("a re-entry, not busy");
    assert_eq!((inner.holder(), inner.depth()), (h, 2));
    let through_contract = h.sync_scope(|| DistributedLock::try_lock(&lock));
    let innermost = through_contract
        .await
        .unwrap()
        .expect("a re-entry, not busy");
    assert_eq!((innermost.holder(), innermost.depth()), (h, 3));
    innermost.unlock().await.unwrap();
    inner.unlock().await.unwrap();
    held.unlock().await.unwrap();
}

/// A first holder and four tasks queued behind it, all through the contract; asserts the
/// script calls of one passed round.
async fn contract_round<L>(server: &RedisServer, lock: L, waiters: &(dyn Fn() -> usize + Sync))
where
    L: slate_core::DistributedLock + Clone + Send + Sync + 'static,
{
    use slate_core::{DistributedLock, LockGuard};

    let before = script_calls(server);
    let first = DistributedLock::lock(&lock).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..4 {
        let lock = lock.clone();
        tasks.push(tokio::spawn(async move {
            let guard = if i % 2 == 0 {
                DistributedLock::lock(&lock).await
            } else {
                DistributedLock::try_lock_for(&lock, Duration::from_secs(10)).await
            };
            guard.unwrap().unlock().await.unwrap();
        }));
    }
    eventually(Duration::from_secs(5), "the tasks to queue", || {
        waiters() == 4
    })
    .await;
    first.unlock().await.unwrap();
    for t in tasks {
        within(Duration::from_secs(10), "a queued task", t)
            .await
            .unwrap();
    }
    // The first hold (its acquire and release), then one remote hold won from the queue and
    // passed among the four: 4 script calls (10 when each is a fresh named holder).
    assert_eq!(script_calls(server) - before, 4);
}

/// Another process cannot enter a hold that was passed, not even under the id of the holder
/// that acquired it or of the holder that has it now; it gets the lock once the hold ends.
async fn another_process_naming_a_passed_holder_waits(server: Deployment) {
    let (a, b) = (server.client(), server.client());
    let la = lock(&a, "cohort-names", LEASE);
    let lb = lock(&b, "cohort-names", LEASE);
    let (h1, _, g2) = passed_hold(&la, Duration::ZERO).await;
    let h2 = g2.holder();
    assert_ne!(h1, h2);
    assert_eq!(la.local_owner(), Some((h2, 1)));
    for name in [h1, h2] {
        let err = lb.acquire(name, Wait::Immediate).await.unwrap_err();
        assert!(err.is_busy(), "{name} from another process: {err}");
    }
    assert!(la.is_held_by(h2).await.unwrap());
    let t2 = g2.fencing_token();
    g2.unlock().await.unwrap();
    let g = lb
        .acquire(h1, Wait::for_duration(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(g.fencing_token() > t2);
    g.unlock().await.unwrap();
}
crate::per_topology!(another_process_naming_a_passed_holder_waits);

/// One max hold bounds one Redis hold, however many local holders it serves (issue 35,
/// defect 10): a holder passed the hold 700 ms into its 900 ms cap loses it with the cap
/// (the lease runs out after the last renewal before 900 ms, about 1.2 s from the start),
/// not a max hold after the pass (which would run to about 2.1 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d10_a_passed_hold_keeps_the_redis_holds_max_hold() {
    let server = server();
    let client = client(&server);
    let lease = Duration::from_millis(600);
    let max_hold = Duration::from_millis(900);
    let lock = SingleLock::builder(&client, "cohort-max-hold")
        .lease(lease)
        .max_hold(max_hold)
        .build()
        .unwrap();
    let start = Instant::now();
    // The first holder keeps the hold 700 ms of its 900 ms cap, then passes it.
    let (_, _, g2) = passed_hold(&lock, Duration::from_millis(700)).await;
    let reason = within(Duration::from_secs(5), "the hold's cap", g2.lost()).await;
    let at = start.elapsed();
    assert_eq!(reason, LossReason::MaxHoldReached);
    assert!(
        at <= max_hold + lease,
        "the pass restarted the max hold: lost {at:?} after the first acquisition"
    );
}

/// A passed hold that is force-unlocked is reported lost to the holder that has it.
async fn a_passed_hold_reports_its_loss_to_the_current_holder(server: Deployment) {
    let client = server.client();
    let lease = Duration::from_millis(900);
    let lock = lock(&client, "cohort-loss", lease);
    let (_, _, g2) = passed_hold(&lock, Duration::ZERO).await;
    assert_eq!(lock.force_unlock().await.unwrap(), 1);
    let reason = within(Duration::from_secs(5), "the loss signal", g2.lost()).await;
    assert_eq!(reason, LossReason::EntryGone);
    // Its release reports the loss; the lock is free for the next holder.
    assert!(g2.unlock().await.unwrap_err().is_not_held());
    lock.lock().await.unwrap().unlock().await.unwrap();
}
crate::per_topology!(a_passed_hold_reports_its_loss_to_the_current_holder);

/// An operator's status read (`slate status`, `node_inspect`) names the holder a hold was
/// passed to, not only the hold's minted id: the hold's renewals record it (no round trip at
/// the pass itself). Fails without that record: `passed` stays `None`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_read_names_the_holder_a_hold_was_passed_to() {
    let server = server();
    let client = client(&server);
    // A 600 ms lease renews every 200 ms.
    let lock = lock(&client, "cohort-status", Duration::from_millis(600));
    let (_, _, g2) = passed_hold(&lock, Duration::ZERO).await;
    let remote = lock.hold_count(g2.holder()).await.unwrap();
    assert_eq!(remote, 1);
    let keys = slate_redis::node::NodeKeys::new(
        lock.options().key_prefix(),
        &slate_redis::LockName::new("cohort-status").unwrap(),
    );
    let expected = g2.holder().to_string();
    let deadline = Instant::now() + Duration::from_secs(5);
    let entries = loop {
        let entries = client.node().inspect(&keys).await.unwrap();
        if entries
            .passed
            .as_ref()
            .is_some_and(|(_, to)| *to == expected)
        {
            break entries;
        }
        assert!(
            Instant::now() < deadline,
            "no renewal recorded the passed holder within 5 s: {entries:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // The record names the hold it belongs to, which is the hash's only holder.
    let (hold, _) = entries.passed.clone().unwrap();
    assert_eq!(entries.holders, vec![(hold, 1)]);
    assert_ne!(entries.holders[0].0, expected, "the hold's id is minted");
    g2.unlock().await.unwrap();
    // Once released, the record names no current hold and is not shown.
    let after = client.node().inspect(&keys).await.unwrap();
    assert_eq!(after.passed, None, "{after:?}");
}
