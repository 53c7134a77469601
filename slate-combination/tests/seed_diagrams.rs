//! The four sequence diagrams of the seed (`000_*.txt`, sections 1.5.2.3 and 1.5.2.5) on real
//! nodes. "Threads" are separate lock instances over separate node-set views (as separate
//! processes would be), so they compete on the servers, not in a local queue. Server faults
//! are made by pausing servers; a request delay on one thread's proxy only orders the
//! interleaving the diagram draws (it is not a fault).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use slate_combination::{CombinationLock, NodeSet, Order};
use slate_core::{HolderId, LossReason, NodeState};
use slate_harness::proxy::{FaultProxy, Mode};

/// A thread's view through its own proxies (so its traffic per node can be counted).
struct Thread {
    proxies: Vec<FaultProxy>,
    nodes: NodeSet,
    lock: CombinationLock,
}

impl Thread {
    async fn new(
        servers: &[slate_harness::server::RedisServer],
        name: &str,
        op: Duration,
        lease: Duration,
    ) -> Self {
        let proxies = proxies(servers);
        let nodes = view_of(proxy_urls(&proxies), opts(op));
        let lock = CombinationLock::builder(&nodes, name)
            .lease(lease)
            .spin_wait(Duration::from_millis(20))
            .order(Order::Sequential)
            .build()
            .expect("lock");
        // Verify the view (its first attempt does) before any fault.
        let warm = CombinationLock::builder(&nodes, "warm-up")
            .lease(lease)
            .build()
            .expect("lock");
        warm.lock().await.unwrap().unlock().await.unwrap();
        Thread {
            proxies,
            nodes,
            lock,
        }
    }

    /// Bytes this thread sent to each node so far.
    fn sent(&self) -> Vec<u64> {
        self.proxies
            .iter()
            .map(FaultProxy::bytes_to_server)
            .collect()
    }

    /// One attempt as `holder`.
    async fn try_lock_as(
        &self,
        holder: HolderId,
    ) -> slate_core::Result<Option<slate_combination::CombinationLockGuard>> {
        try_as(&self.lock, holder).await
    }
}

const LONG_OP: Duration = Duration::from_millis(800);
const SHORT_OP: Duration = Duration::from_millis(150);
/// The request delay that keeps thread 01 between two nodes while the others act.
const GAP: Duration = Duration::from_millis(450);
const LEASE: Duration = Duration::from_secs(5);

/// Diagram 1 (1.5.2.3, "no server fails"): Thread 01 locks servers 01, 02, 03 in order; Thread
/// 02 (after 01's first node) and Thread 03 (after 01's second node) each fail at server 01,
/// held by Thread 01, and contact no later server; Thread 01 then holds all three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diagram_1_no_failure_leftmost_node_decides() {
    let s = servers(3);
    adopt(&view_of(urls(&s), opts(SHORT_OP))).await;
    let name = "d1";
    let t1 = Thread::new(&s, name, LONG_OP, LEASE).await;
    let t2 = Thread::new(&s, name, SHORT_OP, LEASE).await;
    let t3 = Thread::new(&s, name, SHORT_OP, LEASE).await;
    set(&t1.proxies[1], delay(GAP));
    set(&t1.proxies[2], delay(GAP));
    let h1 = HolderId::new();
    let first = tokio::spawn({
        let lock = t1.lock.clone();
        async move { try_as(&lock, h1).await }
    });
    wait_for(Duration::from_secs(2), "thread 01 on server 01", || {
        count_of(&s[0], name, h1)
    })
    .await;
    let before = t2.sent();
    let h2 = HolderId::new();
    assert!(
        t2.try_lock_as(h2).await.unwrap().is_none(),
        "thread 02 fails at server 01"
    );
    let after = t2.sent();
    assert_eq!(
        before[1..],
        after[1..],
        "thread 02 contacted a later server"
    );
    wait_for(Duration::from_secs(2), "thread 01 on server 02", || {
        count_of(&s[1], name, h1)
    })
    .await;
    let before = t3.sent();
    let h3 = HolderId::new();
    assert!(
        t3.try_lock_as(h3).await.unwrap().is_none(),
        "thread 03 fails at server 01"
    );
    assert_eq!(
        before[1..],
        t3.sent()[1..],
        "thread 03 contacted a later server"
    );
    let g1 = first.await.unwrap().unwrap().expect("thread 01 acquires");
    assert_eq!(g1.nodes(), &[0, 1, 2]);
    for server in &s {
        let e = entries(server, name);
        assert_eq!(e.len(), 1, "only thread 01 holds: {e:?}");
        assert_eq!(count_of(server, name, h1), Some(1));
    }
    g1.unlock().await.unwrap();
    for server in &s {
        assert!(!exists(server, name), "released everywhere");
    }
}

/// Diagram 2 (1.5.2.3, "the first server fails"): Thread 01 holds server 01, which then stops
/// answering; Thread 02 gets no answer from server 01, skips it, and locks server 02 ("Note
/// 01": the late-comer gains the right to go on); Thread 01 then finds server 02 held and
/// loses at once ("Note 02"); Thread 02 locks server 03 and holds {02, 03}. Thread 01's entry
/// on server 01 is released (when the server answers again), not left to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diagram_2_first_server_fails_late_comer_wins() {
    let mut s = servers(3);
    adopt(&view_of(urls(&s), opts(SHORT_OP))).await;
    let name = "d2";
    let t1 = Thread::new(&s, name, LONG_OP, LEASE).await;
    let t2 = Thread::new(&s, name, SHORT_OP, LEASE).await;
    set(&t1.proxies[1], delay(GAP));
    let h1 = HolderId::new();
    let first = tokio::spawn({
        let lock = t1.lock.clone();
        async move { try_as(&lock, h1).await }
    });
    wait_for(Duration::from_secs(2), "thread 01 on server 01", || {
        count_of(&s[0], name, h1)
    })
    .await;
    s[0].pause().unwrap();
    let h2 = HolderId::new();
    let g2 = t2
        .try_lock_as(h2)
        .await
        .unwrap()
        .expect("thread 02 skips server 01 and wins");
    assert_eq!(g2.nodes(), &[1, 2]);
    assert!(
        matches!(t2.nodes.report()[0].state, NodeState::Unavailable { .. }),
        "thread 02 marked server 01 unavailable: {:?}",
        t2.nodes.report()[0]
    );
    let lost = first.await.unwrap().unwrap();
    assert!(
        lost.is_none(),
        "thread 01 must lose at server 02 (leftmost weight)"
    );
    for i in [1, 2] {
        let e = entries(&s[i], name);
        assert_eq!(e.len(), 1, "server {i}: {e:?}");
        assert_eq!(count_of(&s[i], name, h2), Some(1));
    }
    s[0].resume().unwrap();
    wait_for(
        Duration::from_secs(2),
        "thread 01's entry on server 01 released after the resume",
        || count_of(&s[0], name, h1).is_none().then_some(()),
    )
    .await;
    g2.unlock().await.unwrap();
    wait_for(
        Duration::from_secs(2),
        "no entry left on any server",
        || s.iter().all(|x| !exists(x, name)).then_some(()),
    )
    .await;
}

/// Diagram 3 (1.5.2.3, "a server other than the first fails"): Thread 01 holds server 01;
/// server 02 times out, is marked unavailable and skipped; meanwhile Thread 02 fails at server
/// 01, held by Thread 01; Thread 01 locks server 03 and holds {01, 03}.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diagram_3_later_server_fails_and_is_skipped() {
    let mut s = servers(3);
    adopt(&view_of(urls(&s), opts(SHORT_OP))).await;
    let name = "d3";
    let t1 = Thread::new(&s, name, LONG_OP, LEASE).await;
    let t2 = Thread::new(&s, name, SHORT_OP, LEASE).await;
    s[1].pause().unwrap();
    let h1 = HolderId::new();
    let started = Instant::now();
    let first = tokio::spawn({
        let lock = t1.lock.clone();
        async move { try_as(&lock, h1).await }
    });
    wait_for(Duration::from_secs(2), "thread 01 on server 01", || {
        count_of(&s[0], name, h1)
    })
    .await;
    let before = t2.sent();
    assert!(
        t2.try_lock_as(HolderId::new()).await.unwrap().is_none(),
        "thread 02 fails at server 01"
    );
    assert_eq!(before[1..], t2.sent()[1..], "thread 02 went past server 01");
    assert!(
        !first.is_finished(),
        "thread 02 acted while thread 01 waited on server 02"
    );
    let g1 = first.await.unwrap().unwrap().expect("thread 01 acquires");
    assert_eq!(g1.nodes(), &[0, 2]);
    assert!(
        started.elapsed() < LONG_OP * 3 + Duration::from_millis(100),
        "within the acquire budget: {:?}",
        started.elapsed()
    );
    assert!(
        matches!(t1.nodes.report()[1].state, NodeState::Unavailable { .. }),
        "server 02 marked unavailable: {:?}",
        t1.nodes.report()[1]
    );
    assert_eq!(count_of(&s[2], name, h1), Some(1));
    s[1].resume().unwrap();
    g1.unlock().await.unwrap();
    // Thread 01's acquire on server 02 ran when it resumed: it must not outlive the hold.
    wait_for(
        Duration::from_secs(2),
        "no entry left on any server",
        || s.iter().all(|x| !exists(x, name)).then_some(()),
    )
    .await;
}

/// Diagram 4 (1.5.2.5, redundancy at the minimum): two servers, both required. Thread 01 holds
/// server 01, which then stops answering; Thread 02 times out there, marks it unavailable and,
/// with fewer usable nodes than required, fails at once without trying server 02; Thread 01
/// goes on, locks server 02 and holds {01, 02} ("the remaining nodes give off their last
/// heat"). Beyond the diagram: Slate's lease then applies, so with server 01 still silent the
/// hold is reported lost by its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diagram_4_minimum_nodes_holder_finishes_competitor_fails() {
    let mut s = servers(2);
    adopt(&view_of(urls(&s), opts(SHORT_OP))).await;
    let name = "d4";
    let lease = Duration::from_secs(3);
    let t1 = Thread::new(&s, name, LONG_OP, lease).await;
    let t2 = Thread::new(&s, name, SHORT_OP, lease).await;
    set(&t1.proxies[1], delay(GAP));
    let h1 = HolderId::new();
    let first = tokio::spawn({
        let lock = t1.lock.clone();
        async move { try_as(&lock, h1).await }
    });
    wait_for(Duration::from_secs(2), "thread 01 on server 01", || {
        count_of(&s[0], name, h1)
    })
    .await;
    s[0].pause().unwrap();
    let before = t2.sent();
    let started = Instant::now();
    let err = t2
        .try_lock_as(HolderId::new())
        .await
        .expect_err("thread 02 must fail");
    assert!(err.is_insufficient_nodes(), "{err}");
    // One node timeout, plus the release of what it may have taken there.
    assert!(
        started.elapsed() < SHORT_OP * 2 + Duration::from_millis(300),
        "thread 02 fails at once: {:?}",
        started.elapsed()
    );
    assert_eq!(before[1], t2.sent()[1], "thread 02 tried server 02");
    let g1 = first
        .await
        .unwrap()
        .unwrap()
        .expect("thread 01 finishes and acquires");
    assert_eq!(g1.nodes(), &[0, 1]);
    assert_eq!(count_of(&s[1], name, h1), Some(1));
    let deadline = g1.lease().deadline();
    let reason = tokio::time::timeout(
        deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(1),
        g1.lease().lost(),
    )
    .await
    .expect("loss reported by the deadline");
    // Server 01 never answers a renewal, so its lease and the combined one end together:
    // either reason is a correct report.
    assert!(
        matches!(
            reason,
            LossReason::QuorumLost { required: 2, .. } | LossReason::DeadlineExpired
        ),
        "{reason:?}"
    );
    s[0].resume().unwrap();
    drop(g1.unlock().await);
    wait_for(
        Duration::from_secs(2),
        "no entry left on any server",
        || s.iter().all(|x| !exists(x, name)).then_some(()),
    )
    .await;
    // Keep the proxies (and their mode) alive to the end.
    set(&t1.proxies[1], Mode::Pass);
}
