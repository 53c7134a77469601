//! Regression tests for the defects of issue 19 that the combination lock reaches, each named
//! after its defect and each failing on the code before its fix (commit ec39e02). Defect 6
//! (levels of a re-entry left behind when the hold ended meanwhile) is forced at its exact
//! spot by a unit test in `src/competitor.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use slate_combination::Order;
use slate_core::{DistributedLock, HolderId, LockGuard};

const OP: Duration = Duration::from_millis(500);

/// Defect 1: `unlock()` set `released` and returned the bare release future; dropped before
/// it completed (`timeout(d, guard.unlock())`), nothing released: the local owner stayed (local
/// waiters parked for ever) and the nodes kept the entry and its renewal, so other processes
/// lost at the leftmost node. The release now completes in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_unlock_still_releases() {
    for order in [Order::Sequential, Order::Pipelined] {
        let s = servers(3);
        let nodes = view_of(urls(&s), opts(OP));
        adopt(&nodes).await;
        let name = "cancelled-unlock";
        let lock = lock_on(&nodes, name, order);
        // Another process, for after.
        let other = lock_on(&view_of(urls(&s), opts(OP)), name, order);
        let guard = lock.lock().await.unwrap();
        let holder = guard.holder();
        let waiter = {
            let lock = lock.clone();
            tokio::spawn(async move { lock.lock().await })
        };
        wait_for(Duration::from_secs(5), "the local waiter", || {
            (lock.local_waiters() == 1).then_some(())
        })
        .await;
        // The caller gives up on the release after its first poll (as `timeout(d, unlock())`
        // does when `d` runs out first): the commands are sent, no reply has come.
        let mut release = Box::pin(guard.unlock());
        assert!(
            futures::poll!(release.as_mut()).is_pending(),
            "{order:?}: a release cannot complete without a round trip"
        );
        drop(release);
        // The local waiter gets the lock (the local owner was cleared)...
        let next = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap_or_else(|_| panic!("{order:?}: the local waiter parked for ever"))
            .unwrap()
            .unwrap();
        assert_ne!(next.holder(), holder);
        for server in &s {
            assert_eq!(
                count_of(server, name, holder),
                None,
                "{order:?}: entry left"
            );
        }
        next.unlock().await.unwrap();
        // ...and then another process, at once (no entry left to expire).
        let g = tokio::time::timeout(Duration::from_secs(1), other.lock())
            .await
            .unwrap_or_else(|_| panic!("{order:?}: another process kept losing"))
            .unwrap();
        g.unlock().await.unwrap();
        assert!(s.iter().all(|x| !exists(x, name)));
        assert_eq!(lock.local_owner(), None);
    }
}

/// Defect 4, combination lock: a re-entry after the hold's entries vanished (their lease ran
/// out, or force unlock) created fresh entries on the nodes and counted them as one more
/// level. It now fails with `LeaseLost` and creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_after_lost_lease_fails() {
    let s = servers(3);
    let nodes = view_of(urls(&s), opts(OP));
    adopt(&nodes).await;
    let name = "lost-reentry";
    let lock = lock_on(&nodes, name, Order::Sequential);
    let outer = lock.lock().await.unwrap();
    let holder = outer.holder();
    for server in &s {
        server.command(&["DEL", &key(name)]).unwrap();
    }
    let err = outer.reenter().await.unwrap_err();
    assert!(err.is_lease_lost(), "{err:?}");
    for server in &s {
        assert_eq!(
            count_of(server, name, holder),
            None,
            "a fresh entry was created"
        );
    }
    assert_eq!(lock.local_owner(), Some((holder, 1)));
    assert!(outer.unlock().await.is_err());
    assert_eq!(lock.local_owner(), None);
    // A holder that is not the local owner still takes the lock afresh.
    let g = try_as(&lock, HolderId::new()).await.unwrap().expect("free");
    g.unlock().await.unwrap();
}
