//! Local passes on the combination lock (lock cohorting, issue 14 item 3): queued tasks of one
//! process share one walk over the nodes per eight holders, no node is touched on a pass, and
//! the fencing tokens stay strictly increasing across holders, passes and later walks.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use slate_combination::{CombinationLock, HolderId, Order, Wait};
use slate_harness::server::RedisServer;

/// Script calls (`EVALSHA` + `EVAL`) a server ran so far.
fn script_calls(server: &RedisServer) -> u64 {
    server.command_calls(&["evalsha", "eval"]).unwrap()
}

/// A first holder, then `n` tasks queued behind it, each holding once; their tokens in the
/// order they held.
async fn queued_round(lock: &CombinationLock, n: usize) -> Vec<u64> {
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
            let again = g.reenter().await.unwrap();
            assert_eq!(again.fencing_token(), g.fencing_token());
            assert_eq!(again.unlock().await.unwrap(), 1);
            tokens.lock().unwrap().push(g.fencing_token().get());
            inside.store(false, Ordering::SeqCst);
            assert_eq!(g.unlock().await.unwrap(), 0);
        }));
    }
    wait_for(Duration::from_secs(5), "the tasks to queue", || {
        (lock.local_waiters() == n).then_some(())
    })
    .await;
    first.unlock().await.unwrap();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("a queued task finished")
            .unwrap();
    }
    Arc::try_unwrap(tokens).unwrap().into_inner().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_tasks_share_one_walk_per_eight_holders() {
    let servers = servers(3);
    let nodes = view_of(urls(&servers), opts(Duration::from_millis(500)));
    adopt(&nodes).await;
    for order in [Order::Sequential, Order::Pipelined] {
        let name = format!("cohort-{order:?}");
        let lock = lock_on(&nodes, &name, order);
        // Load the scripts on every node first.
        lock.lock().await.unwrap().unlock().await.unwrap();
        let before: Vec<u64> = servers.iter().map(script_calls).collect();
        let tokens = queued_round(&lock, 15).await;
        assert_eq!(tokens.len(), 16);
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "{order:?}: tokens strictly increase across holders and passes: {tokens:?}"
        );
        // The first holder walked alone; the 15 queued tasks took two walks (8 + 7 holders):
        // 3 acquires and 3 releases per node, plus the tasks' own re-entry and its release,
        // plus at most one fencing write-back per walk on a node whose counter lagged.
        // Without passes it would be 16 acquires and 16 releases per node.
        for (i, server) in servers.iter().enumerate() {
            let calls = script_calls(server) - before[i];
            assert!(
                (6 + 30..=6 + 30 + 3).contains(&calls),
                "{order:?}: {calls} script calls on node {i}"
            );
        }
        // A later walk by another process is above every token of the blocks.
        let other = view_of(urls(&servers), opts(Duration::from_millis(500)));
        let g = lock_on(&other, &name, order).lock().await.unwrap();
        assert!(g.fencing_token().get() > *tokens.last().unwrap());
        g.unlock().await.unwrap();
    }
}

/// Generic code that takes the lock through the `DistributedLock` contract gets the local
/// passes `lock()` gets (the contract acquires for the current holder, not a fresh named one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_contracts_lock_is_passed_like_the_inherent_one() {
    use slate_core::DistributedLock;
    let servers = servers(3);
    let nodes = view_of(urls(&servers), opts(Duration::from_millis(500)));
    adopt(&nodes).await;
    let lock = lock_on(&nodes, "cohort-contract", Order::Sequential);
    lock.lock().await.unwrap().unlock().await.unwrap();
    let before: Vec<u64> = servers.iter().map(script_calls).collect();
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
    wait_for(Duration::from_secs(5), "the tasks to queue", || {
        (lock.local_waiters() == 4).then_some(())
    })
    .await;
    first.unlock().await.unwrap();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(20), t)
            .await
            .expect("a queued task finished")
            .unwrap();
    }
    // The first walk (acquire and release on each node), then one walk won from the queue and
    // passed among the four, plus at most one fencing write-back per walk: 4 to 6 calls per
    // node (10 when each task is a fresh named holder that walks alone).
    for (i, server) in servers.iter().enumerate() {
        let calls = script_calls(server) - before[i];
        assert!((4..=6).contains(&calls), "{calls} script calls on node {i}");
    }
}

/// A call made inside a holder's scope acquires as that holder, even when its future is
/// awaited after the scope ended (the holder is read when the call is made, as on the single
/// lock): through the contract and through the lock's own `try_lock`, the call re-enters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_is_the_scope_s_when_the_call_is_made() {
    use slate_core::DistributedLock;
    let servers = servers(3);
    let nodes = view_of(urls(&servers), opts(Duration::from_millis(500)));
    adopt(&nodes).await;
    let lock = lock_on(&nodes, "cohort-scope", Order::Sequential);
    let h = HolderId::new();
    let held = lock.lock_as(h).await.unwrap();
    let through_contract = h.sync_scope(|| DistributedLock::try_lock(&lock));
    let inner = through_contract
        .await
        .unwrap()
        .expect("a re-entry, not busy");
    assert_eq!((inner.holder(), inner.depth()), (h, 2));
    let own = h.sync_scope(|| lock.try_lock());
    let innermost = own.await.unwrap().expect("a re-entry, not busy");
    assert_eq!((innermost.holder(), innermost.depth()), (h, 3));
    innermost.unlock().await.unwrap();
    inner.unlock().await.unwrap();
    held.unlock().await.unwrap();
}

/// Another process cannot enter a passed hold under the id of the holder that passed it or of
/// the one that has it; its walk gets the lock once the hold ends, with a greater token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_naming_a_passed_holder_is_busy() {
    let servers = servers(3);
    let a = view_of(urls(&servers), opts(Duration::from_millis(500)));
    adopt(&a).await;
    let b = view_of(urls(&servers), opts(Duration::from_millis(500)));
    let la = lock_on(&a, "cohort-names", Order::Pipelined);
    let lb = lock_on(&b, "cohort-names", Order::Pipelined);
    let alone = la.lock().await.unwrap();
    let spawn = || {
        let la = la.clone();
        tokio::spawn(async move { la.lock().await.unwrap() })
    };
    let first = spawn();
    wait_for(Duration::from_secs(5), "the first to queue", || {
        (la.local_waiters() == 1).then_some(())
    })
    .await;
    let second = spawn();
    wait_for(Duration::from_secs(5), "the second to queue", || {
        (la.local_waiters() == 2).then_some(())
    })
    .await;
    alone.unlock().await.unwrap();
    let g1 = first.await.unwrap();
    let (h1, t1) = (g1.holder(), g1.fencing_token().get());
    g1.unlock().await.unwrap();
    let g2 = second.await.unwrap();
    assert_eq!(
        g2.fencing_token().get(),
        t1 + 1,
        "the next token of the block"
    );
    assert_eq!(g2.nodes().len(), 3);
    for name in [h1, g2.holder()] {
        let err = lb.acquire(name, Wait::Immediate).await.unwrap_err();
        assert!(err.is_busy(), "{name} from another process: {err}");
    }
    assert!(la.is_held_by(g2.holder()).await.unwrap());
    assert!(!la.is_held_by(h1).await.unwrap());
    let t2 = g2.fencing_token();
    g2.unlock().await.unwrap();
    let g = lb
        .acquire(HolderId::new(), Wait::for_duration(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(g.fencing_token() > t2);
    g.unlock().await.unwrap();
}
