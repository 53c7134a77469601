//! Nodes down before an attempt (reliability.md C2), extending `basics.rs`: a refused (killed)
//! or hung (paused) node, leftmost or not, in both orders, is skipped and the lock is held on
//! the rest while a competitor in another process view is blocked; with only one node left the
//! attempt fails with `InsufficientNodes` within its bound and node 0 is released at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use slate_combination::{CombinationLock, NodeSet, Order};
use slate_core::{Error, HolderId, NodeState};
use slate_harness::server::RedisServer;

const OP: Duration = Duration::from_millis(500);
const LEASE: Duration = Duration::from_secs(3);
const SLACK: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// SIGKILL: connections are refused.
    Killed,
    /// SIGSTOP: connections hang.
    Paused,
}

fn apply(server: &mut RedisServer, fault: Fault) {
    match fault {
        Fault::Killed => server.kill().unwrap(),
        Fault::Paused => server.pause().unwrap(),
    }
}

fn heal(server: &mut RedisServer, fault: Fault) {
    if fault == Fault::Paused {
        server.resume().unwrap();
    }
}

fn lock(nodes: &NodeSet, name: &str, order: Order) -> CombinationLock {
    CombinationLock::builder(nodes, name)
        .lease(LEASE)
        .order(order)
        .build()
        .expect("lock")
}

/// A process view, verified (its first attempt verifies the nodes) before any fault.
async fn warm_view(s: &[RedisServer]) -> NodeSet {
    let nodes = view_of(urls(s), opts(OP));
    let l = lock(&nodes, "warm-up", Order::Sequential);
    l.lock().await.unwrap().unlock().await.unwrap();
    nodes
}

fn fence(server: &RedisServer, name: &str) -> i64 {
    tokens_taken(server, name)
}

/// One node down (killed or paused; leftmost or middle), both orders: skipped, held on the
/// other two, a competitor of another process blocked, everything released at unlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_down_is_skipped_and_the_rest_excludes_a_competitor() {
    for fault in [Fault::Killed, Fault::Paused] {
        for down in [0, 1] {
            let mut s = servers(3);
            adopt(&view_of(urls(&s), opts(OP))).await;
            let mine = warm_view(&s).await;
            let theirs = warm_view(&s).await;
            apply(&mut s[down], fault);
            let up: Vec<usize> = (0..3).filter(|&i| i != down).collect();
            for order in [Order::Sequential, Order::Pipelined] {
                let case = format!("{fault:?} node {down} {order:?}");
                let name = format!("down-{down}-{order:?}");
                let h = HolderId::new();
                let started = Instant::now();
                let g = try_as(&lock(&mine, &name, order), h)
                    .await
                    .unwrap()
                    .unwrap_or_else(|| panic!("{case}: busy"));
                let took = started.elapsed();
                assert_eq!(g.nodes(), up.as_slice(), "{case}");
                // A refusal is immediate; a hang costs one node operation time, at most once
                // (the node is then marked unavailable for this view).
                let bound = match fault {
                    Fault::Killed => OP,
                    Fault::Paused => OP + SLACK,
                };
                assert!(took < bound, "{case}: took {took:?}");
                assert!(
                    matches!(mine.report()[down].state, NodeState::Unavailable { .. }),
                    "{case}: {:?}",
                    mine.report()[down]
                );
                for &i in &up {
                    assert_eq!(count_of(&s[i], &name, h), Some(1), "{case}: node {i}");
                }
                let other = lock(&theirs, &name, order);
                assert!(
                    other.try_lock().await.unwrap().is_none(),
                    "{case}: competitor got the lock"
                );
                g.unlock().await.unwrap();
                for &i in &up {
                    assert!(!exists(&s[i], &name), "{case}: node {i} not released");
                }
            }
            heal(&mut s[down], fault);
        }
    }
}

/// Nodes 1 and 2 down (killed/killed, paused/paused, killed/paused), both orders: the attempt
/// takes node 0, fails with `InsufficientNodes` listing every node's state within its bound,
/// and node 0 is already free when the call returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_node_left_is_insufficient_within_its_bound_and_node_0_is_released() {
    let combos = [
        (Fault::Killed, Fault::Killed),
        (Fault::Paused, Fault::Paused),
        (Fault::Killed, Fault::Paused),
    ];
    for (f1, f2) in combos {
        for order in [Order::Sequential, Order::Pipelined] {
            let case = format!("{f1:?}/{f2:?} {order:?}");
            let mut s = servers(3);
            adopt(&view_of(urls(&s), opts(OP))).await;
            let mine = warm_view(&s).await;
            apply(&mut s[1], f1);
            apply(&mut s[2], f2);
            let name = "one-left";
            base_fence(&s[0], name);
            let h = HolderId::new();
            let started = Instant::now();
            let err = try_as(&lock(&mine, name, order), h)
                .await
                .expect_err("must fail");
            let took = started.elapsed();
            // Each node may cost a timeout for its acquire and one for its release.
            assert!(took < OP * 4 + SLACK, "{case}: took {took:?}");
            assert!(!exists(&s[0], name), "{case}: node 0 left to expire");
            assert_eq!(fence(&s[0], name), 1, "{case}: node 0 was taken first");
            match &err {
                Error::InsufficientNodes {
                    required, nodes, ..
                } => {
                    assert_eq!(*required, 2, "{case}");
                    assert_eq!(nodes.len(), 3, "{case}: every node listed: {err}");
                    for n in &nodes[1..] {
                        assert!(
                            matches!(
                                n.state,
                                NodeState::Failed { .. } | NodeState::Unavailable { .. }
                            ),
                            "{case}: {n:?}"
                        );
                    }
                }
                other => panic!("{case}: {other}"),
            }
            // Known down now: the next attempt fails before sending anything.
            let started = Instant::now();
            let err = lock(&mine, name, order).try_lock().await.unwrap_err();
            assert!(err.is_insufficient_nodes(), "{case}: {err}");
            assert!(started.elapsed() < OP, "{case}: {:?}", started.elapsed());
            assert_eq!(fence(&s[0], name), 1, "{case}: node 0 contacted again");
            heal(&mut s[1], f1);
            heal(&mut s[2], f2);
        }
    }
}
