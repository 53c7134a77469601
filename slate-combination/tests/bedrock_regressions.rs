//! Regression tests for the Bedrock defects of `bedrock-spec.md` section 8 that apply to the
//! combination lock, each named after its defect id, on real nodes.
//!
//! Defects that cannot apply here, by construction:
//! - C2 (re-entry under a new identity): holders are explicit ids and a re-entry takes one more
//!   level on exactly the nodes held; depth bookkeeping is `basics.rs`
//!   (`tokens_increase_and_reentry_keeps_them`).
//! - C4, C5 (timed waits under local contention, the lock-free queue): the local queue is
//!   slate-aqs's synchronizer, tested there (proptest model, loom).
//! - M1 (`tryLock` without renewal): every grant goes through `after_acquire`, which starts the
//!   renewal of exactly the nodes held (`c10_...` holds a `try_lock` grant).
//! - M2, M3, M12 (interrupts, busy-spinning timed path, polling only): synchronizer matters of
//!   slate-aqs.
//! - M4 (failures after a successful acquire leak): a grant the caller never receives is
//!   released by `Competitor::abandon`; a guard's drop releases.
//! - M6 (command-timeout fix-up): the node operation time is the nodes' command timeout, set
//!   once in `NodeSetOptions`, never rewritten.
//! - M7 (wrong default re-probe interval): the default is a typed `Duration` of 15 min.
//! - M9 (no fault tolerance at start-up): `NodeSet::connect` sends nothing; an unreachable node
//!   is found by the first attempt and skipped (`nodes_down.rs`).
//! - M10, M11 (factory lifecycle, debug-logging races): no factory or singleton exists; tracing
//!   reads no shared state.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use common::*;
use slate_combination::{CombinationLock, NodeSet, NodeSetOptions, Order};
use slate_core::{Error, HolderId, LossReason, NodeState, TimeoutKind};
use slate_harness::proxy::Mode;
use slate_harness::server::RedisServer;

const OP: Duration = Duration::from_millis(300);
const LEASE: Duration = Duration::from_secs(3);

fn lock(nodes: &NodeSet, name: &str) -> CombinationLock {
    CombinationLock::builder(nodes, name)
        .lease(LEASE)
        .spin_wait(Duration::from_millis(20))
        .build()
        .expect("lock")
}

/// Servers, adopted, and a verified view of them.
async fn setup(n: usize) -> (Vec<RedisServer>, NodeSet) {
    let s = servers(n);
    let nodes = view_of(urls(&s), opts(OP));
    adopt(&nodes).await;
    lock(&nodes, "warm-up")
        .lock()
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    (s, nodes)
}

/// The fencing counter of `name` on a server.
fn fence(server: &RedisServer, name: &str) -> i64 {
    let v: Option<i64> =
        redis::from_redis_value(server.command(&["GET", &fence_key(name)]).unwrap()).unwrap();
    v.unwrap_or(0)
}

fn none_exist(s: &[RedisServer], name: &str) -> bool {
    s.iter().all(|x| !exists(x, name))
}

/// C1: a release by a holder that holds nothing (force-unlocked, or after another holder took
/// the lock) creates no entry and touches no other holder's entry or TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c1_release_by_non_holder_creates_nothing() {
    let (s, nodes) = setup(3).await;
    let name = "c1";
    let l = lock(&nodes, name);
    // Force-unlocked under the holder: its release finds nothing and writes nothing.
    let g = l.lock().await.unwrap();
    assert_eq!(l.force_unlock().await.unwrap(), 1);
    let err = g.unlock().await.unwrap_err();
    assert!(err.is_not_held(), "{err}");
    assert!(none_exist(&s, name), "a release created a key");
    // The entries vanish (as if expired) and B takes the lock: A's late release leaves B's
    // entries, counts and TTLs alone.
    let a = l.lock().await.unwrap();
    for x in &s {
        x.command(&["DEL", &key(name)]).unwrap();
    }
    let b = lock(&view_of(urls(&s), opts(OP)), name)
        .try_lock()
        .await
        .unwrap()
        .expect("B acquires");
    let before: Vec<i64> = s.iter().map(|x| pttl(x, name)).collect();
    drop(a.unlock().await.expect_err("A no longer holds"));
    for (i, x) in s.iter().enumerate() {
        let e = entries(x, name);
        assert_eq!(e.len(), 1, "node {i}: {e:?}");
        assert_eq!(count_of(x, name, b.holder()), Some(1), "node {i}");
        assert!(pttl(x, name) <= before[i], "node {i}: B's TTL was reset");
    }
    b.unlock().await.unwrap();
    assert!(none_exist(&s, name));
}

/// C3: a failed or cancelled acquisition leaves no identity behind that a later acquisition
/// could share: while one task holds, another task whose attempt failed and whose wait was
/// cancelled still cannot get (or re-enter) the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c3_failed_acquisitions_never_share_an_identity() {
    let (s, nodes) = setup(3).await;
    let name = "c3";
    let l = lock(&nodes, name);
    let other = lock(&view_of(urls(&s), opts(OP)), name);
    let g = other.lock().await.unwrap();
    let l2 = l.clone();
    let waiter = tokio::spawn(async move {
        assert!(l2.try_lock().await.unwrap().is_none(), "busy");
        // A wait cancelled by its caller.
        assert!(
            tokio::time::timeout(Duration::from_millis(200), l2.lock())
                .await
                .is_err()
        );
        let e = l2
            .try_lock_for(Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(e.is_timeout(), "{e}");
        // The same task, again: still no lock while the other holds.
        l2.try_lock().await.unwrap().map(|g| g.holder())
    });
    assert_eq!(
        waiter.await.unwrap(),
        None,
        "took the lock while it was held"
    );
    for x in &s {
        let e = entries(x, name);
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e.contains_key(&g.holder().to_string()));
    }
    let holder = g.holder();
    g.unlock().await.unwrap();
    let mine = l.lock().await.unwrap();
    assert_ne!(mine.holder(), holder);
    mine.unlock().await.unwrap();
    assert!(none_exist(&s, name));
}

/// C6: a node marked unavailable is not contacted (nor locked, renewed or "unlocked") until its
/// next probe is due (1 s after the failure, backing off to the re-probe interval); then the
/// next attempt verifies it and uses it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c6_unavailable_node_is_not_contacted_before_reprobe() {
    let s = servers(3);
    adopt(&view_of(urls(&s), opts(OP))).await;
    let p = proxies(&s);
    let reprobe = Duration::from_millis(1500);
    let nodes = view_of(
        proxy_urls(&p),
        NodeSetOptions::builder()
            .node_operation_time(OP)
            .reprobe_interval(reprobe)
            .quarantine(Duration::from_secs(5))
            .build()
            .unwrap(),
    );
    let name = "c6";
    let l = lock(&nodes, name);
    l.lock().await.unwrap().unlock().await.unwrap();
    set(&p[1], Mode::Refuse);
    let g = l.lock().await.unwrap();
    assert_eq!(g.nodes(), &[0, 2]);
    g.unlock().await.unwrap();
    let marked = Instant::now();
    // The node is back, but this view must not know it before its first probe (1 s after
    // the failure, which came before `marked`).
    set(&p[1], Mode::Pass);
    // Contacts for an acquisition show on the server: a verification is an INFO, an acquire
    // raises the fencing counter. (The release of the node skipped above may still be retried
    // in the background: releases are not acquisitions. Each new connection reads the
    // eviction policy with one INFO of its own, counted apart.)
    // Calls of `INFO` so far (the node verification uses `INFO server`), not counting the
    // one reading it (each reading is counted by the next).
    let probes = |x: &RedisServer| (x.command_calls(&["info"]).unwrap(), fence(x, name));
    let (infos_before, fence_before) = probes(&s[1]);
    let connections_before = p[1].connections_accepted();
    let mut skipped = 0;
    while marked.elapsed() < Duration::from_millis(700) {
        let g = l.lock().await.unwrap();
        assert_eq!(g.nodes(), &[0, 2], "used before the re-probe interval");
        g.unlock().await.unwrap();
        skipped += 1;
    }
    assert!(skipped > 0);
    let connected = p[1].connections_accepted() - connections_before;
    assert_eq!(
        probes(&s[1]),
        (infos_before + 1 + connected, fence_before),
        "node 1 probed or acquired"
    );
    assert!(!exists(&s[1], name), "phantom entry on node 1");
    // Once the interval has passed, the next attempt probes and uses the node.
    wait_for(
        reprobe * 2,
        "the re-probe interval to pass",
        || match nodes.report()[1].state {
            NodeState::Unavailable { since, .. } if since > reprobe => Some(()),
            NodeState::Unavailable { .. } => None,
            ref other => panic!("node 1 left unavailable early: {other:?}"),
        },
    )
    .await;
    let g = l.lock().await.unwrap();
    assert_eq!(g.nodes(), &[0, 1, 2], "a healthy probed node was skipped");
    assert_eq!(count_of(&s[1], name, g.holder()), Some(1));
    g.unlock().await.unwrap();
    assert!(none_exist(&s, name), "an entry left behind");
}

/// C7: one dead node (of 3) costs nothing more than a skip: every later acquisition succeeds,
/// with the node re-probed (and failing again) between attempts or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c7_one_dead_node_does_not_fail_every_later_acquisition() {
    let (mut s, nodes) = setup(3).await;
    s[1].kill().unwrap();
    let reprobing = view_of(
        urls(&s),
        NodeSetOptions::builder()
            .node_operation_time(OP)
            .reprobe_interval(Duration::from_millis(1))
            .quarantine(Duration::from_secs(5))
            .build()
            .unwrap(),
    );
    for view in [&nodes, &reprobing] {
        let l = lock(view, "c7");
        for i in 0..10 {
            let g = l
                .lock()
                .await
                .unwrap_or_else(|e| panic!("acquisition {i}: {e}"));
            assert_eq!(g.nodes(), &[0, 2], "acquisition {i}");
            g.unlock().await.unwrap();
        }
    }
}

/// C8: an attempt that meets another holder at node i releases every node it took before i,
/// at once; in the parallel round, an attempt that meets another holder at the lead (node 0)
/// releases every node it took in that round. Waiting at the head re-tries without piling up
/// counts; once the other holder is gone, one acquisition takes each node exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c8_busy_at_node_i_releases_the_prefix() {
    let (s, nodes) = setup(3).await;
    for (order, busy) in [(Order::Sequential, 1), (Order::Pipelined, 0)] {
        let name = format!("c8-{order:?}");
        hold_directly(&s[busy], &name, "another-holder", 30_000);
        let l = CombinationLock::builder(&nodes, &name)
            .lease(LEASE)
            .spin_wait(Duration::from_millis(20))
            .order(order)
            .build()
            .unwrap();
        assert!(l.try_lock().await.unwrap().is_none(), "{order:?}");
        for (i, x) in s.iter().enumerate().filter(|(i, _)| *i != busy) {
            assert!(!exists(x, &name), "{order:?}: node {i} kept");
        }
        // Waiting: the head retries; no node ever holds more than one level.
        let max = Arc::new(AtomicI64::new(0));
        let sampler = {
            let (max, urls, name) = (max.clone(), urls(&s), name.clone());
            tokio::task::spawn_blocking(move || {
                let clients: Vec<_> = urls
                    .iter()
                    .map(|u| redis::Client::open(u.as_str()).unwrap())
                    .collect();
                let end = Instant::now() + Duration::from_millis(600);
                while Instant::now() < end {
                    for c in &clients {
                        let mut con = c.get_connection().unwrap();
                        let all: std::collections::BTreeMap<String, String> = redis::cmd("HGETALL")
                            .arg(key(&name))
                            .query(&mut con)
                            .unwrap();
                        for (field, n) in all {
                            if !matches!(field.as_str(), "t" | "r" | "w") {
                                max.fetch_max(n.parse::<i64>().unwrap(), Ordering::SeqCst);
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        };
        let e = l
            .try_lock_for(Duration::from_millis(500))
            .await
            .unwrap_err();
        assert!(e.is_timeout(), "{order:?}: {e}");
        sampler.await.unwrap();
        assert_eq!(max.load(Ordering::SeqCst), 1, "{order:?}: counts piled up");
        for (i, x) in s.iter().enumerate().filter(|(i, _)| *i != busy) {
            assert!(!exists(x, &name), "{order:?}: node {i} kept");
        }
        s[busy].command(&["DEL", &key(&name)]).unwrap();
        let g = l.lock().await.unwrap();
        for x in &s {
            assert_eq!(count_of(x, &name, g.holder()), Some(1), "{order:?}");
        }
        g.unlock().await.unwrap();
        assert!(none_exist(&s, &name), "{order:?}");
    }
}

/// C9: after an acquisition fails on its budget, nothing is left held, and the next
/// acquisition is an ordinary one: its unlock releases every node and its renewal stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c9_a_budget_timeout_leaves_no_unreleasable_hold() {
    let s = servers(3);
    adopt(&view_of(urls(&s), opts(OP))).await;
    let p = proxies(&s);
    let nodes = view_of(proxy_urls(&p), opts(OP));
    let name = "c9";
    let budget = Duration::from_millis(250);
    let l = CombinationLock::builder(&nodes, name)
        .lease(LEASE)
        .renewal_period(Duration::from_millis(300))
        .acquire_budget(budget)
        .build()
        .unwrap();
    l.lock().await.unwrap().unlock().await.unwrap();
    set(&p[1], delay(Duration::from_millis(150)));
    set(&p[2], delay(Duration::from_millis(150)));
    match l.try_lock().await {
        Err(Error::Timeout {
            kind: TimeoutKind::AcquireBudget,
            budget: b,
            elapsed,
            ..
        }) => {
            assert_eq!(b, budget);
            assert!(elapsed > budget, "{elapsed:?}");
        }
        other => panic!("expected the budget timeout, got {other:?}"),
    }
    assert!(none_exist(&s, name), "the timed-out attempt left entries");
    assert!(l.local_owner().is_none());
    set(&p[1], Mode::Pass);
    set(&p[2], Mode::Pass);
    let g = l.lock().await.unwrap();
    assert_eq!(g.nodes(), &[0, 1, 2]);
    assert_eq!(g.unlock().await.unwrap(), 0);
    assert!(none_exist(&s, name));
    assert!(l.local_owner().is_none());
    // No renewal survives the unlock: a later holder's entries are not extended by it.
    let b = lock(&view_of(urls(&s), opts(OP)), name)
        .try_lock()
        .await
        .unwrap()
        .expect("free");
    b.unlock().await.unwrap();
    assert!(none_exist(&s, name));
}

/// C10: renewal goes on past a failing node (paused), never renews another holder's entry,
/// and reports the loss (quorum) once fewer than the quorum of nodes can be renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c10_renewal_survives_a_failing_node_and_reports_loss() {
    let (mut s, nodes) = setup(3).await;
    let name = "c10";
    let lease = Duration::from_millis(1500);
    let period = Duration::from_millis(300);
    let l = CombinationLock::builder(&nodes, name)
        .lease(lease)
        .renewal_period(period)
        .build()
        .unwrap();
    let g = l.try_lock().await.unwrap().expect("free");
    s[1].pause().unwrap();
    let paused = Instant::now();
    // Renewal of nodes 0 and 2 carries the lease well past what node 1 allows.
    let mut lease_watch = g.lease().clone();
    tokio::time::timeout(lease * 3, async {
        while lease_watch.deadline() < paused + lease * 2 {
            assert!(!lease_watch.is_lost(), "{:?}", lease_watch.loss_reason());
            lease_watch.changed().await;
        }
    })
    .await
    .expect("renewed past a failing node");
    assert!(!g.lease().is_lost());
    // Node 2's entry now belongs to another holder: it must not be renewed by us, and with
    // node 1 silent only node 0 is left, below the quorum.
    s[2].command(&["DEL", &key(name)]).unwrap();
    hold_directly(&s[2], name, "another-holder", 10_000);
    let swapped = Instant::now();
    let reason = tokio::time::timeout(lease, g.lease().lost())
        .await
        .expect("loss reported");
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
    println!("loss reported {:?} after the swap", swapped.elapsed());
    assert!(
        pttl(&s[2], name) > 10_000 - i64::try_from(swapped.elapsed().as_millis()).unwrap() - 100,
        "another holder's TTL was reset by our renewal"
    );
    s[1].resume().unwrap();
    drop(g.unlock().await);
    assert_eq!(entries(&s[2], name).get("another-holder"), Some(&1));
    assert!(!exists(&s[0], name));
}

/// C11: the quorum is a majority of the configured nodes, so two process views cut off from
/// different halves of 4 nodes can never both hold the lock (each needs 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c11_quorum_is_a_majority() {
    let s = servers(4);
    adopt(&view_of(urls(&s), opts(OP))).await;
    let nodes = view_of(urls(&s), opts(OP));
    assert_eq!(lock(&nodes, "q").required_nodes(), 3);
    let low = CombinationLock::builder(&nodes, "q")
        .lease(LEASE)
        .required_nodes(2)
        .build()
        .unwrap_err();
    assert!(low.is_invalid_input(), "{low}");
    let five = view_of(urls(&servers(5)), opts(OP));
    assert_eq!(lock(&five, "q").required_nodes(), 3);
    // Two views over their own proxies: A cut from {2, 3}, B cut from {0, 1}.
    let (pa, pb) = (proxies(&s), proxies(&s));
    let (a, b) = (
        view_of(proxy_urls(&pa), opts(OP)),
        view_of(proxy_urls(&pb), opts(OP)),
    );
    for v in [&a, &b] {
        lock(v, "warm-up")
            .lock()
            .await
            .unwrap()
            .unlock()
            .await
            .unwrap();
    }
    for i in [2, 3] {
        set(&pa[i], Mode::Refuse);
    }
    for i in [0, 1] {
        set(&pb[i], Mode::Refuse);
    }
    let name = "c11";
    let ea = lock(&a, name).try_lock().await.unwrap_err();
    let eb = lock(&b, name).try_lock().await.unwrap_err();
    assert!(ea.is_insufficient_nodes(), "{ea}");
    assert!(eb.is_insufficient_nodes(), "{eb}");
    assert!(none_exist(&s, name));
    // With one node of four cut off, A holds three; B, cut from two, still cannot.
    set(&pa[2], Mode::Pass);
    let a = view_of(proxy_urls(&pa), opts(OP));
    let g = lock(&a, name).try_lock().await.unwrap().expect("3 of 4");
    assert_eq!(g.nodes(), &[0, 1, 2]);
    let eb = lock(&b, name).try_lock().await.unwrap_err();
    assert!(eb.is_insufficient_nodes(), "{eb}");
    g.unlock().await.unwrap();
}

/// M5: the budget counts failed calls: a hung node's timeout plus a slow node exceed it, so
/// the attempt fails with `Timeout` and releases what it took; without the slow node the same
/// attempt (with the same hung node) succeeds within the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m5_budget_counts_failed_calls() {
    for slow in [true, false] {
        let s = servers(3);
        adopt(&view_of(urls(&s), opts(OP))).await;
        let p = proxies(&s);
        let nodes = view_of(proxy_urls(&p), opts(OP));
        let name = "m5";
        let budget = OP + Duration::from_millis(60);
        let l = CombinationLock::builder(&nodes, name)
            .lease(LEASE)
            .acquire_budget(budget)
            .build()
            .unwrap();
        l.lock().await.unwrap().unlock().await.unwrap();
        set(&p[1], Mode::Blackhole);
        if slow {
            set(&p[2], delay(Duration::from_millis(150)));
        }
        let h = HolderId::new();
        let started = Instant::now();
        let got = try_as(&l, h).await;
        if slow {
            match got {
                Err(Error::Timeout {
                    kind: TimeoutKind::AcquireBudget,
                    elapsed,
                    ..
                }) => assert!(elapsed > budget, "{elapsed:?}"),
                other => panic!("expected a budget timeout, got {other:?}"),
            }
            assert!(
                count_of(&s[0], name, h).is_none() && count_of(&s[2], name, h).is_none(),
                "not released"
            );
        } else {
            let g = got.unwrap().expect("acquired within the budget");
            assert_eq!(g.nodes(), &[0, 2]);
            assert!(started.elapsed() < budget + Duration::from_millis(200));
            g.unlock().await.unwrap();
        }
        set(&p[1], Mode::Pass);
        set(&p[2], Mode::Pass);
        wait_for(
            Duration::from_secs(2),
            "no entry of the holder left",
            || {
                s.iter()
                    .all(|x| count_of(x, name, h).is_none())
                    .then_some(())
            },
        )
        .await;
    }
}

/// M8: an unexpected reply (WRONGTYPE: the key is not a hash) is a failed node like any
/// other: the attempt goes on or releases everything it took, and a release goes on past such
/// a node to node 0, reporting which node failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn m8_unexpected_replies_release_the_prefix_and_release_goes_on() {
    let (s, nodes) = setup(3).await;
    let name = "m8";
    for i in [1, 2] {
        s[i].command(&["SET", &key(name), "not-a-hash"]).unwrap();
    }
    let h = HolderId::new();
    let err = try_as(&lock(&nodes, name), h).await.unwrap_err();
    assert!(err.is_insufficient_nodes(), "{err}");
    assert!(!exists(&s[0], name), "node 0 kept");
    // The release: hold all three, then node 1's key stops being a hash.
    let (s, nodes) = setup(3).await;
    let g = lock(&nodes, name).lock().await.unwrap();
    assert_eq!(g.nodes(), &[0, 1, 2]);
    s[1].command(&["DEL", &key(name)]).unwrap();
    s[1].command(&["SET", &key(name), "not-a-hash"]).unwrap();
    match g.unlock().await {
        Err(Error::ReleaseIncomplete { nodes, .. }) => {
            let failed: Vec<usize> = nodes
                .iter()
                .filter(|n| matches!(n.state, NodeState::Failed { .. }))
                .map(|n| n.index)
                .collect();
            assert_eq!(failed, vec![1], "{nodes:?}");
        }
        other => panic!("expected ReleaseIncomplete, got {other:?}"),
    }
    assert!(
        !exists(&s[0], name) && !exists(&s[2], name),
        "release stopped"
    );
}

/// The parallel round (issue 15): a node held by another holder that is not the lead does not
/// make the attempt busy when the lead and a quorum are ours; the other node is left as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_round_with_the_lead_and_a_quorum_acquires() {
    let (s, nodes) = setup(3).await;
    let name = "parallel-lead";
    hold_directly(&s[2], name, "another-holder", 30_000);
    let l = CombinationLock::builder(&nodes, name)
        .lease(LEASE)
        .order(Order::Pipelined)
        .build()
        .unwrap();
    let g = l
        .try_lock()
        .await
        .unwrap()
        .expect("the lead and a quorum are free");
    for x in &s[..2] {
        assert_eq!(count_of(x, name, g.holder()), Some(1));
    }
    assert_eq!(count_of(&s[2], name, g.holder()), None);
    assert!(exists(&s[2], name), "the other holder's entry is untouched");
    g.unlock().await.unwrap();
    assert!(!exists(&s[0], name) && !exists(&s[1], name));
}
