//! A node restarts empty (SIGKILL, restart without persistence) while the lock is held
//! (reliability.md C4 (a) and (b); (c) is in `basics.rs`). Competitors, both a process view
//! that knew the server before the restart and one that meets it afterwards, never report
//! success; the holder keeps the lock while a quorum of its nodes remains, and reports
//! `QuorumLost` when it does not.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use slate_combination::{CombinationLock, CombinationLockGuard, NodeSet, Order};
use slate_core::{LossReason, NodeState};
use slate_harness::server::{Data, RedisServer};

const OP: Duration = Duration::from_millis(200);
const LEASE: Duration = Duration::from_secs(2);
const PERIOD: Duration = Duration::from_millis(300);

fn lock(nodes: &NodeSet, name: &str) -> CombinationLock {
    CombinationLock::builder(nodes, name)
        .lease(LEASE)
        .renewal_period(PERIOD)
        .build()
        .expect("lock")
}

/// A process view verified before any fault.
async fn warm_view(s: &[RedisServer]) -> NodeSet {
    let nodes = view_of(urls(s), opts(OP));
    lock(&nodes, "warm-up")
        .lock()
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    nodes
}

/// Holder A on {0, 1, 2}; `before` is a competitor's view verified before the restart.
async fn setup(name: &str) -> (Vec<RedisServer>, CombinationLockGuard, NodeSet) {
    let s = servers(3);
    adopt(&view_of(urls(&s), opts(OP))).await;
    let a = warm_view(&s).await;
    let before = warm_view(&s).await;
    let g = lock(&a, name).lock().await.unwrap();
    assert_eq!(g.nodes(), &[0, 1, 2]);
    (s, g, before)
}

/// Competitors try again and again until `until`: none may succeed.
async fn competitors_never_win(views: &[&NodeSet], name: &str, until: Instant) -> usize {
    let mut tries = 0;
    while Instant::now() < until {
        for v in views {
            match lock(v, name).try_lock().await {
                Ok(None) => {}
                Ok(Some(g)) => panic!("a competitor got the lock on {:?}", g.nodes()),
                Err(e) => assert!(e.is_insufficient_nodes(), "{e}"),
            }
            tries += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tries
}

/// C4(a): node 1 (not the leftmost) restarts empty. Competitors stay blocked at node 0; the
/// holder keeps {0, 2} (2 of 3, a quorum), is renewed, and is not lost; node 1 is never
/// re-populated by the holder's renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c4a_middle_node_restarts_empty_holder_keeps_the_quorum() {
    let name = "c4a";
    let (mut s, g, before) = setup(name).await;
    let first_deadline = g.lease().deadline();
    s[1].restart(Data::Wipe).unwrap();
    let after = view_of(urls(&s), opts(OP));
    let tries = competitors_never_win(&[&before, &after], name, Instant::now() + LEASE).await;
    assert!(tries > 0);
    assert!(
        matches!(after.report()[1].state, NodeState::Quarantined { .. }),
        "{:?}",
        after.report()[1]
    );
    assert!(!g.lease().is_lost(), "{:?}", g.lease().loss_reason());
    assert!(
        g.lease().deadline() > first_deadline,
        "renewed past its first deadline"
    );
    assert!(!exists(&s[1], name), "node 1 re-populated");
    assert_eq!(count_of(&s[0], name, g.holder()), Some(1));
    assert_eq!(count_of(&s[2], name, g.holder()), Some(1));
    assert_eq!(g.unlock().await.unwrap(), 0);
    for x in &s {
        assert!(!exists(x, name));
    }
}

/// C4(b): node 0 (the leftmost) restarts empty. A competitor that knew the server sends an
/// acquire there, which finds the node marker gone and touches nothing; one that meets the
/// server afterwards quarantines it. Both then meet the holder at node 1 and never report
/// success; node 0 stays empty; the holder keeps {1, 2} and releases without touching
/// anything of anyone else on node 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c4b_leftmost_node_restarts_empty_competitor_never_succeeds() {
    let name = "c4b";
    let (mut s, g, before) = setup(name).await;
    s[0].restart(Data::Wipe).unwrap();
    let after = view_of(urls(&s), opts(OP));
    competitors_never_win(&[&before, &after], name, Instant::now() + LEASE).await;
    assert!(!exists(&s[0], name), "a competitor took node 0");
    assert!(
        matches!(after.report()[0].state, NodeState::Quarantined { .. }),
        "{:?}",
        after.report()[0]
    );
    assert!(!g.lease().is_lost(), "{:?}", g.lease().loss_reason());
    assert_eq!(g.unlock().await.unwrap(), 0);
    for x in &s {
        assert!(!exists(x, name));
    }
}

/// Two of three nodes restart empty: the holder is left with one node, below the quorum, and
/// reports `QuorumLost` within a renewal period or so, before its deadline; competitors still
/// cannot get the lock (quarantine, data-loss answers), and the holder's release reports that
/// it no longer held the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_three_restart_empty_holder_reports_quorum_lost() {
    let name = "c4-two";
    let (mut s, g, before) = setup(name).await;
    s[0].restart(Data::Wipe).unwrap();
    s[1].restart(Data::Wipe).unwrap();
    let restarted = Instant::now();
    let deadline = g.lease().deadline();
    let reason = tokio::time::timeout(
        deadline.saturating_duration_since(Instant::now()),
        g.lease().lost(),
    )
    .await
    .expect("loss reported by the deadline");
    assert!(
        matches!(
            reason,
            LossReason::QuorumLost {
                renewed: 1,
                required: 2
            }
        ),
        "{reason:?}"
    );
    println!("loss reported {:?} after the restarts", restarted.elapsed());
    let after = view_of(urls(&s), opts(OP));
    competitors_never_win(&[&before, &after], name, Instant::now() + LEASE / 2).await;
    let err = g.unlock().await.unwrap_err();
    assert!(err.is_not_held(), "{err}");
    for x in &s {
        assert!(!exists(x, name));
    }
}

/// C4(c) in pipelined order (basics.rs has it in sequential order): nodes 0 and 2 restart
/// empty and node 1 hangs. A competitor that knew the servers gets "data lost" from 0 and 2;
/// one that meets them afterwards quarantines them; neither may hold {0, 2}.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c4c_pipelined_competitor_cannot_take_the_restarted_nodes() {
    let name = "c4c-pipelined";
    let (mut s, g, before) = setup(name).await;
    s[0].restart(Data::Wipe).unwrap();
    s[2].restart(Data::Wipe).unwrap();
    s[1].pause().unwrap();
    for v in [&before, &view_of(urls(&s), opts(OP))] {
        let l = CombinationLock::builder(v, name)
            .lease(LEASE)
            .order(Order::Pipelined)
            .build()
            .unwrap();
        match l.try_lock().await {
            Ok(None) => {}
            Ok(Some(g2)) => panic!("competitor got {:?}", g2.nodes()),
            Err(e) => assert!(e.is_insufficient_nodes(), "{e}"),
        }
        assert!(!exists(&s[0], name) && !exists(&s[2], name));
    }
    s[1].resume().unwrap();
    drop(g.unlock().await);
}
