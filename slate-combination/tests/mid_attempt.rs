//! A node fails in the middle of an attempt, or its reply is lost (reliability.md C3). A fault
//! proxy sits in front of every node; `DropReplies` makes "the command ran, the reply was lost"
//! reproducible. Whatever happens, the attempt either completes with a legal skip or releases
//! every node it sent an acquire to, including the one whose reply was lost; the servers are
//! read directly to check that no entry of the holder is left behind (after healing, well
//! before the lease could have removed it) and that nothing is renewed there.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use slate_combination::{CombinationLock, NodeSet, Order};
use slate_core::{HolderId, NodeState};
use slate_harness::proxy::{FaultProxy, Mode};
use slate_harness::server::{Data, RedisServer};

const OP: Duration = Duration::from_millis(300);
const LEASE: Duration = Duration::from_secs(3);
/// Well under the lease: a leftover found after this was not removed by the library.
const CLEANUP: Duration = Duration::from_millis(1500);

struct Rig {
    servers: Vec<RedisServer>,
    proxies: Vec<FaultProxy>,
    nodes: NodeSet,
}

impl Rig {
    async fn new() -> Self {
        let servers = servers(3);
        adopt(&view_of(urls(&servers), opts(OP))).await;
        let proxies = proxies(&servers);
        let nodes = view_of(proxy_urls(&proxies), opts(OP));
        let warm = self::lock(&nodes, "warm-up", Order::Sequential);
        warm.lock().await.unwrap().unlock().await.unwrap();
        Rig {
            servers,
            proxies,
            nodes,
        }
    }

    fn lock(&self, name: &str, order: Order) -> CombinationLock {
        for s in &self.servers {
            base_fence(s, name);
        }
        self::lock(&self.nodes, name, order)
    }

    /// Tokens taken on server `i` for `name` since the lock was built (see
    /// `common::tokens_taken`): whether an acquire ran there.
    fn fence(&self, i: usize, name: &str) -> i64 {
        tokens_taken(&self.servers[i], name)
    }

    fn heal(&self) {
        for p in &self.proxies {
            set(p, Mode::Pass);
        }
    }

    /// Waits until no server has an entry of `holder` for `name`.
    async fn wait_clean(&self, name: &str, holder: HolderId) {
        let deadline = Instant::now() + CLEANUP;
        loop {
            let left: Vec<_> = self
                .servers
                .iter()
                .map(|s| (entries(s, name), pttl(s, name)))
                .collect();
            if left
                .iter()
                .all(|(e, _)| !e.contains_key(&holder.to_string()))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "entries of {holder} left after {CLEANUP:?} (entries, PTTL per node): {left:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until node `i`'s entry is renewed (its PTTL goes up).
    async fn wait_renewed(&self, i: usize, name: &str) {
        let mut last = pttl(&self.servers[i], name);
        wait_for(LEASE, "a renewal of a held node", || {
            let now = pttl(&self.servers[i], name);
            let renewed = now > last;
            last = now;
            renewed.then_some(())
        })
        .await;
    }
}

fn lock(nodes: &NodeSet, name: &str, order: Order) -> CombinationLock {
    CombinationLock::builder(nodes, name)
        .lease(LEASE)
        .spin_wait(Duration::from_millis(20))
        .order(order)
        .build()
        .expect("lock")
}

const ORDERS: [Order; 2] = [Order::Sequential, Order::Pipelined];

/// Node 1 runs the acquire but its reply is lost: the attempt skips it (a legal skip) and
/// holds {0, 2}; the entry the lost reply hid is released, and never renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_reply_at_one_node_is_skipped_and_its_entry_released() {
    for order in ORDERS {
        let rig = Rig::new().await;
        let name = "lost-one";
        let l = rig.lock(name, order);
        set(&rig.proxies[1], Mode::DropReplies);
        let h = HolderId::new();
        let g = try_as(&l, h).await.unwrap().expect("acquired on the rest");
        assert_eq!(g.nodes(), &[0, 2], "{order:?}");
        assert_eq!(rig.fence(1, name), 1, "the acquire ran on node 1");
        assert!(matches!(
            rig.nodes.report()[1].state,
            NodeState::Unavailable { .. }
        ));
        rig.heal();
        wait_for(CLEANUP, "node 1 free of the lost acquire", || {
            count_of(&rig.servers[1], name, h).is_none().then_some(())
        })
        .await;
        // While the hold is renewed, node 1 stays empty.
        rig.wait_renewed(0, name).await;
        assert!(
            !exists(&rig.servers[1], name),
            "{order:?}: renewed on node 1"
        );
        assert_eq!(count_of(&rig.servers[2], name, h), Some(1));
        g.unlock().await.unwrap();
        rig.wait_clean(name, h).await;
    }
}

/// Nodes 1 and 2 both run the acquire and lose the reply: the quorum is out of reach, the
/// attempt fails with `InsufficientNodes` within its bound and releases all three nodes,
/// including the two whose replies were lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_replies_at_two_nodes_release_every_node_sent_to() {
    for order in ORDERS {
        let rig = Rig::new().await;
        let name = "lost-two";
        let l = rig.lock(name, order);
        set(&rig.proxies[1], Mode::DropReplies);
        set(&rig.proxies[2], Mode::DropReplies);
        let h = HolderId::new();
        let started = Instant::now();
        let err = try_as(&l, h).await.expect_err("must fail");
        let took = started.elapsed();
        assert!(err.is_insufficient_nodes(), "{order:?}: {err}");
        // Two node timeouts (one in pipelined order) plus two release timeouts, and slack.
        assert!(took < OP * 4 + Duration::from_millis(500), "took {took:?}");
        assert_eq!(count_of(&rig.servers[0], name, h), None, "node 0 kept");
        assert_eq!(rig.fence(1, name), 1, "the acquire ran on node 1");
        assert_eq!(rig.fence(2, name), 1, "the acquire ran on node 2");
        rig.heal();
        rig.wait_clean(name, h).await;
        for s in &rig.servers {
            assert!(!exists(s, name), "{order:?}: a key is left");
        }
    }
}

/// Node 1 loses its reply, node 2 is held by another holder: the attempt is busy (leftmost
/// weight) and releases nodes 1 and 0; the other holder's entry is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_reply_then_busy_releases_the_node_whose_reply_was_lost() {
    for order in ORDERS {
        let rig = Rig::new().await;
        let name = "lost-busy";
        hold_directly(&rig.servers[2], name, "other-holder", 10_000);
        let l = rig.lock(name, order);
        set(&rig.proxies[1], Mode::DropReplies);
        let h = HolderId::new();
        assert!(try_as(&l, h).await.unwrap().is_none(), "{order:?}: busy");
        assert_eq!(count_of(&rig.servers[0], name, h), None, "node 0 kept");
        assert_eq!(rig.fence(1, name), 1, "the acquire ran on node 1");
        rig.heal();
        rig.wait_clean(name, h).await;
        let e = entries(&rig.servers[2], name);
        assert_eq!(e.len(), 1);
        assert_eq!(e.get("other-holder"), Some(&1), "{e:?}");
    }
}

/// Server 1 is killed while the acquire for it is in flight (after node 0 answered): the node
/// is skipped and marked unavailable, and the lock holds {0, 2}.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_killed_during_the_attempt_is_skipped() {
    for order in ORDERS {
        let mut rig = Rig::new().await;
        let name = "killed";
        let l = rig.lock(name, order);
        set(&rig.proxies[1], delay(Duration::from_millis(150)));
        let h = HolderId::new();
        let attempt = tokio::spawn({
            let l = l.clone();
            async move { try_as(&l, h).await }
        });
        wait_for(Duration::from_secs(1), "node 0 taken", || {
            count_of(&rig.servers[0], name, h)
        })
        .await;
        rig.servers[1].kill().unwrap();
        let g = attempt.await.unwrap().unwrap().expect("held on the rest");
        assert_eq!(g.nodes(), &[0, 2], "{order:?}");
        assert!(matches!(
            rig.nodes.report()[1].state,
            NodeState::Unavailable { .. }
        ));
        // A competitor in another process view is blocked.
        let other = lock(&view_of(urls(&rig.servers), opts(OP)), name, order);
        assert!(other.try_lock().await.unwrap().is_none());
        g.unlock().await.unwrap();
        rig.servers[1].restart(Data::Wipe).unwrap();
        rig.wait_clean(name, h).await;
    }
}

/// Server 2 is paused while its reply is pending: the node times out and is skipped, the
/// lock holds {0, 1}. When server 2 resumes, the acquire it still had runs; the library's
/// release of the skipped node runs after it, so no entry of the holder stays there, and
/// nothing renews one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_paused_with_its_reply_pending_is_skipped_and_cleaned_after_resume() {
    for order in ORDERS {
        let mut rig = Rig::new().await;
        let name = "paused";
        let l = rig.lock(name, order);
        set(&rig.proxies[2], delay(Duration::from_millis(150)));
        let h = HolderId::new();
        let attempt = tokio::spawn({
            let l = l.clone();
            async move { try_as(&l, h).await }
        });
        wait_for(Duration::from_secs(1), "node 1 taken", || {
            count_of(&rig.servers[1], name, h)
        })
        .await;
        rig.servers[2].pause().unwrap();
        let g = attempt.await.unwrap().unwrap().expect("held on the rest");
        assert_eq!(g.nodes(), &[0, 1], "{order:?}");
        rig.heal();
        rig.servers[2].resume().unwrap();
        wait_for(CLEANUP, "the late acquire on node 2 ran", || {
            (rig.fence(2, name) == 1).then_some(())
        })
        .await;
        wait_for(CLEANUP, "node 2 free of the late acquire", || {
            count_of(&rig.servers[2], name, h).is_none().then_some(())
        })
        .await;
        rig.wait_renewed(0, name).await;
        assert!(
            !exists(&rig.servers[2], name),
            "{order:?}: renewed on node 2"
        );
        g.unlock().await.unwrap();
        rig.wait_clean(name, h).await;
    }
}
