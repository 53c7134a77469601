//! The combination lock on real nodes: acquisition, exclusion, re-entry, tokens, node loss.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use slate_combination::{CombinationLock, NodeSet, NodeSetOptions, Order};
use slate_core::HolderId;
use slate_harness::server::RedisServer;

fn servers(n: usize) -> Vec<RedisServer> {
    RedisServer::start_many(n).expect("redis-server (apt-get install -y redis-server)")
}

/// This process's view of the servers, adopted as fresh (they were started moments ago).
async fn node_set(servers: &[RedisServer]) -> NodeSet {
    let nodes = view(servers);
    assert_eq!(
        nodes.adopt_fresh_servers("slate:").await.unwrap(),
        servers.len()
    );
    nodes
}

/// Another process's view of the same servers (no adoption).
fn view(servers: &[RedisServer]) -> NodeSet {
    let opts = NodeSetOptions::builder()
        .node_operation_time(Duration::from_millis(200))
        .reprobe_interval(Duration::from_millis(300))
        .quarantine(Duration::from_secs(2))
        .build()
        .unwrap();
    NodeSet::connect(servers.iter().map(RedisServer::url), opts).expect("node set")
}

fn lock(nodes: &NodeSet, name: &str) -> CombinationLock {
    CombinationLock::builder(nodes, name)
        .lease(Duration::from_secs(2))
        .spin_wait(Duration::from_millis(20))
        .build()
        .expect("lock")
}

fn field_on(server: &RedisServer, key: &str, holder: HolderId) -> Option<i64> {
    let v = server
        .command(&["HGET", key, &holder.to_string()])
        .expect("HGET");
    redis::from_redis_value(v).expect("int")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_release_on_every_node_in_both_orders() {
    let s = servers(3);
    let nodes = node_set(&s).await;
    for order in [Order::Sequential, Order::Pipelined] {
        let name = format!("basic-{order:?}");
        let l = CombinationLock::builder(&nodes, &name)
            .lease(Duration::from_secs(2))
            .order(order)
            .build()
            .unwrap();
        let g = l.lock().await.unwrap();
        assert_eq!(g.nodes(), &[0, 1, 2]);
        let key = format!("slate:{{{name}}}");
        for server in &s {
            assert_eq!(field_on(server, &key, g.holder()), Some(1));
        }
        assert!(l.is_locked().await.unwrap());
        assert!(
            l.try_lock().await.unwrap().is_none(),
            "a second holder is refused"
        );
        assert_eq!(g.unlock().await.unwrap(), 0);
        for server in &s {
            let exists: i64 =
                redis::from_redis_value(server.command(&["EXISTS", &key]).unwrap()).unwrap();
            assert_eq!(exists, 0, "released everywhere");
        }
        assert!(!l.is_locked().await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_and_reentry_keeps_them() {
    let s = servers(3);
    let nodes = node_set(&s).await;
    let l = lock(&nodes, "tokens");
    let mut last = 0;
    for _ in 0..5 {
        let g = l.lock().await.unwrap();
        let t = g.fencing_token().get();
        assert!(t > last, "token {t} after {last}");
        last = t;
        let inner = g.reenter().await.unwrap();
        assert_eq!(inner.fencing_token().get(), t);
        assert_eq!(l.hold_count(g.holder()).await.unwrap(), 2);
        assert_eq!(inner.unlock().await.unwrap(), 1);
        assert!(l.is_locked().await.unwrap(), "still held at depth 1");
        assert_eq!(g.unlock().await.unwrap(), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_is_skipped_and_two_are_insufficient() {
    let mut s = servers(3);
    let nodes = node_set(&s).await;
    let l = lock(&nodes, "skip");
    // Warm up so the nodes are verified.
    l.lock().await.unwrap().unlock().await.unwrap();
    s[1].kill().unwrap();
    let g = l.lock().await.unwrap();
    assert_eq!(g.nodes(), &[0, 2]);
    // A competitor is blocked while we hold {0, 2}.
    let other = lock(&nodes, "skip");
    assert!(other.try_lock().await.unwrap().is_none());
    g.unlock().await.unwrap();
    s[2].kill().unwrap();
    let started = Instant::now();
    let err = l.lock().await.unwrap_err();
    assert!(err.is_insufficient_nodes(), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "fails at once: {:?}",
        started.elapsed()
    );
    // What was taken on node 0 is released at once, not left to expire.
    let exists: i64 =
        redis::from_redis_value(s[0].command(&["EXISTS", "slate:{skip}"]).unwrap()).unwrap();
    assert_eq!(exists, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_node_is_skipped_within_the_node_time() {
    let mut s = servers(3);
    let nodes = node_set(&s).await;
    let l = lock(&nodes, "hung");
    l.lock().await.unwrap().unlock().await.unwrap();
    s[1].pause().unwrap();
    let started = Instant::now();
    let g = l.lock().await.unwrap();
    assert_eq!(g.nodes(), &[0, 2]);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
    g.unlock().await.unwrap();
    s[1].resume().unwrap();
}

/// reliability.md C4(c): nodes 0 and 2 restart empty while A holds {0, 1, 2}, and B cannot
/// reach node 1. Without quarantine B would get {0, 2} while A still holds the lock.
async fn restarted_nodes_scenario(quarantine: bool) -> Option<Vec<usize>> {
    let mut s = servers(3);
    let nodes = node_set(&s).await;
    let holder_lock = lock(&nodes, "quarantine");
    let g = holder_lock.lock().await.unwrap();
    s[0].restart(slate_harness::server::Data::Wipe).unwrap();
    s[2].restart(slate_harness::server::Data::Wipe).unwrap();
    s[1].pause().unwrap();
    let mut opts = NodeSetOptions::builder()
        .node_operation_time(Duration::from_millis(200))
        .quarantine(Duration::from_secs(2));
    if !quarantine {
        opts = opts.disable_quarantine_unsafe();
    }
    let other_nodes =
        NodeSet::connect(s.iter().map(RedisServer::url), opts.build().unwrap()).unwrap();
    let other = CombinationLock::builder(&other_nodes, "quarantine")
        .lease(Duration::from_secs(2))
        .build()
        .unwrap();
    let got = match other.try_lock().await {
        Ok(Some(g2)) => {
            let nodes = g2.nodes().to_vec();
            drop(g2);
            Some(nodes)
        }
        Ok(None) => None,
        Err(e) => {
            assert!(e.is_insufficient_nodes(), "{e}");
            None
        }
    };
    s[1].resume().unwrap();
    drop(g);
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_empty_is_quarantined() {
    assert_eq!(
        restarted_nodes_scenario(true).await,
        None,
        "a competitor got the lock"
    );
}

/// The expected violation: proves the scenario above can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quarantine_the_restart_breaks_exclusion() {
    assert_eq!(restarted_nodes_scenario(false).await, Some(vec![0, 2]));
}

/// The thread twins (issue 20, item 4): lock, re-entry, try, timeout and unlock from plain
/// threads, with the lock's I/O on its runtime.
/// Issue 20, item 3: a node set and lock built from a plain thread (no runtime anywhere) work
/// through the blocking twins, on the node clients' own runtimes.
#[test]
fn built_outside_a_runtime_serves_threads() {
    let s = servers(3);
    // Adopt the fresh servers once, from a short-lived runtime (the markers stay on them).
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async { drop(node_set(&s).await) });
    let nodes = view(&s);
    let l = lock(&nodes, "no-runtime");
    let g = l.blocking_lock().unwrap();
    assert_eq!(g.nodes(), &[0, 1, 2]);
    let busy = std::thread::spawn({
        let l = l.clone();
        move || l.blocking_try_lock().unwrap().is_none()
    })
    .join()
    .unwrap();
    assert!(busy, "held by the first thread");
    assert_eq!(g.blocking_unlock().unwrap(), 0);
    drop(l);
    drop(nodes);
}

#[test]
fn blocking_twins_work_on_threads() {
    let s = servers(3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let l = rt.block_on(async {
        let nodes = node_set(&s).await;
        lock(&nodes, "blocking")
    });
    let g = l.blocking_lock().unwrap();
    assert_eq!(g.nodes(), &[0, 1, 2]);
    let inner = l.blocking_lock_as(g.holder()).unwrap();
    assert_eq!(inner.fencing_token(), g.fencing_token());
    let (busy, timed_out) = std::thread::spawn({
        let l = l.clone();
        move || {
            let busy = l.blocking_try_lock().unwrap().is_none();
            let e = l
                .blocking_try_lock_for(Duration::from_millis(200))
                .unwrap_err();
            (busy, e.is_timeout())
        }
    })
    .join()
    .unwrap();
    assert!(busy && timed_out);
    assert_eq!(inner.blocking_unlock().unwrap(), 1);
    assert_eq!(g.blocking_unlock().unwrap(), 0);
    let g = l.blocking_try_lock().unwrap().expect("free now");
    assert_eq!(g.blocking_unlock().unwrap(), 0);
    // Released on every node.
    for server in &s {
        let exists: i64 =
            redis::from_redis_value(server.command(&["EXISTS", "slate:{blocking}"]).unwrap())
                .unwrap();
        assert_eq!(exists, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[should_panic(expected = "inside a tokio runtime")]
async fn blocking_lock_panics_inside_a_runtime() {
    let s = servers(3);
    let nodes = node_set(&s).await;
    let _ = lock(&nodes, "in-runtime").blocking_lock();
}

/// `unlock()` answers the holder's remaining hold count whatever order its re-entrant guards are
/// released in. Before issue 20 the combination lock answered the guard's own level minus one
/// (0 for the outer guard while the inner one still held every node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unlock_returns_the_remaining_count_in_any_order() {
    let s = servers(3);
    let nodes = node_set(&s).await;
    let l = lock(&nodes, "unlock-order");
    let outer = l.lock().await.unwrap();
    let inner = outer.reenter().await.unwrap();
    assert_eq!(outer.unlock().await.unwrap(), 1);
    assert!(l.is_locked().await.unwrap());
    assert_eq!(inner.unlock().await.unwrap(), 0);
    assert!(!l.is_locked().await.unwrap());
}

/// Locks of both backends in one collection through the object-safe layer, with no trait in
/// scope: `AnyLock`'s inherent methods, and generic code over `DistributedLock` taking it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_lock_keeps_both_backends_side_by_side() {
    let s = servers(3);
    let nodes = node_set(&s).await;
    let single_client = slate_redis::RedisClient::open(s[0].url()).unwrap();
    let single = slate_redis::SingleLock::builder(&single_client, "any-single")
        .build()
        .unwrap();
    let locks = vec![
        slate_combination::AnyLock::new(lock(&nodes, "any-combination")),
        slate_combination::AnyLock::new(single.clone()),
    ];
    let mut tokens = Vec::new();
    for l in &locks {
        let g = l.try_lock().await.unwrap().expect("free");
        assert!(!g.is_lost());
        assert!(l.is_locked().await.unwrap());
        assert!(l.is_held_by(g.holder()).await.unwrap());
        assert!(l.remaining_lease().await.unwrap().is_some());
        // Held: another holder's attempt through the erased type is refused.
        let other = l
            .acquire(HolderId::new(), slate_combination::Wait::Immediate)
            .await
            .unwrap_err();
        assert!(other.is_busy(), "{other}");
        tokens.push(g.fencing_token());
        assert_eq!(g.unlock().await.unwrap(), 0);
        assert!(!l.is_locked().await.unwrap());
    }
    assert_eq!(locks[1].name().as_bytes(), b"any-single");

    async fn hold_count_of<L: slate_combination::DistributedLock>(l: &L) -> u32 {
        let g = l.lock().await.unwrap();
        let n = l.hold_count(g.holder()).await.unwrap();
        slate_combination::LockGuard::unlock(g).await.unwrap();
        n
    }
    for l in &locks {
        assert_eq!(hold_count_of(l).await, 1);
    }
    // The dyn layer keeps the fencing guarantee: a second hold gets a larger token.
    let again = locks[1].lock().await.unwrap();
    assert!(again.fencing_token() > tokens[1]);
    // The operator's call through the erased type.
    assert_eq!(locks[1].force_unlock().await.unwrap(), 1);
    assert!(!locks[1].is_locked().await.unwrap());
    drop(again);
}

/// Every handle built for one lock on one node set shares one state: one local queue, so the
/// process's tasks wait in FIFO order behind one head instead of racing each other as two
/// processes would. A handle with other settings is refused. Before the primitives shared one
/// registry (issue 29), the combination lock had none: each handle had a queue of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_of_one_name_share_one_local_queue() {
    let s = servers(3);
    let nodes = node_set(&s).await;
    let a = lock(&nodes, "one-queue");
    let b = lock(&nodes, "one-queue");
    let held = a.lock().await.unwrap();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock().await })
    };
    let start = Instant::now();
    while a.local_waiters() != 1 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "b's waiter is not in a's local queue (a: {}, b: {})",
            a.local_waiters(),
            b.local_waiters()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    held.unlock().await.unwrap();
    waiter.await.unwrap().unwrap().unlock().await.unwrap();
    let other = CombinationLock::builder(&nodes, "one-queue")
        .lease(Duration::from_secs(3))
        .spin_wait(Duration::from_millis(20))
        .build();
    assert!(other.unwrap_err().is_invalid_input());
}

/// The shared state of a lock binds the node set's runtime, not the runtime of whichever
/// handle was built first: found by a review of the registry (issue 29). A handle built on a
/// runtime that then ended gave its state that runtime, so another handle's dropped guard was
/// released on a dead runtime: never, and the next `lock()` waited for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_built_on_a_runtime_that_ended_does_not_strand_the_others() {
    let s = servers(3);
    let nodes = node_set(&s).await;
    let first = {
        let nodes = nodes.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async { lock(&nodes, "runtimes") })
        })
        .join()
        .unwrap()
    };
    let other = lock(&nodes, "runtimes");
    drop(first);
    drop(other.lock().await.unwrap());
    let again = tokio::time::timeout(Duration::from_secs(5), other.lock())
        .await
        .expect("the dropped guard was released")
        .unwrap();
    again.unlock().await.unwrap();
}

/// The registry tells locks apart by their key, not by prefix and name run together: prefix
/// `slate:` with name `a:b` and prefix `slate:a:` with name `b` are two locks
/// (`slate:{a:b}` and `slate:a:{b}`), and both build (found by the same review).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_and_name_are_not_run_together() {
    let s = servers(3);
    let nodes = node_set(&s).await;
    let one = CombinationLock::builder(&nodes, "a:b")
        .lease(Duration::from_secs(2))
        .key_prefix("slate:")
        .build()
        .unwrap();
    let two = CombinationLock::builder(&nodes, "b")
        .lease(Duration::from_secs(2))
        .key_prefix("slate:a:")
        .build()
        .expect("another lock");
    drop((one, two));
}
