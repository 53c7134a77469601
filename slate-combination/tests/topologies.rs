//! Combination nodes on other topologies (issue 13): a node may be a Sentinel-managed group;
//! a whole cluster is refused.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use slate_combination::{CombinationLock, NodeSet};
use slate_harness::cluster::RedisCluster;
use slate_harness::sentinel::SentinelGroup;
use slate_redis::{ClientOptions, RedisClient};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_groups_are_combination_nodes() {
    let g1 = SentinelGroup::start(1, 1).unwrap();
    let g2 = SentinelGroup::start(1, 1).unwrap();
    let standalone = servers(1);
    let op = Duration::from_millis(500);
    let client_opts = ClientOptions::builder()
        .command_timeout(op)
        .connect_timeout(op)
        .build()
        .unwrap();
    let sentinel = |g: &SentinelGroup| {
        RedisClient::open_sentinel(g.sentinel_urls(), g.master_name(), client_opts.clone()).unwrap()
    };
    let clients = vec![
        sentinel(&g1),
        sentinel(&g2),
        RedisClient::open_with(standalone[0].url(), client_opts.clone()).unwrap(),
    ];
    let nodes = NodeSet::from_clients(clients, opts(op)).unwrap();
    adopt(&nodes).await;
    let lock = CombinationLock::builder(&nodes, "groups")
        .lease(Duration::from_secs(2))
        .build()
        .unwrap();
    let g = lock.lock().await.unwrap();
    assert_eq!(g.nodes(), &[0, 1, 2]);
    assert!(lock.try_lock().await.unwrap().is_none());
    g.unlock().await.unwrap();
    // The lock's entry lives on each group's master.
    assert!(lock.try_lock().await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_is_not_a_combination_node() {
    let cluster = RedisCluster::start(3, 0).unwrap();
    let s = servers(2);
    let clients = vec![
        RedisClient::open_cluster(cluster.urls(), ClientOptions::default()).unwrap(),
        RedisClient::open(s[0].url()).unwrap(),
        RedisClient::open(s[1].url()).unwrap(),
    ];
    let e = NodeSet::from_clients(clients, opts(Duration::from_millis(500))).unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    assert!(e.to_string().contains("Redis Cluster"), "{e}");
}

/// A node's Sentinel group fails over while the lock is held: the holder keeps its quorum,
/// and the node is verified again before its next use. The promoted replica has been up
/// longer than the quarantine, so only its new run id tells that another server answers now;
/// it is quarantined (a grant its old master made and never replicated has expired by the
/// end of the quarantine), and the next acquisition is held on the other two nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_group_failed_over_is_quarantined() {
    let quarantine = Duration::from_secs(2);
    let mut groups: Vec<SentinelGroup> = (0..3)
        .map(|_| SentinelGroup::start(1, 1).unwrap())
        .collect();
    let op = Duration::from_millis(500);
    let client_opts = ClientOptions::builder()
        .command_timeout(op)
        .connect_timeout(op)
        .build()
        .unwrap();
    let clients: Vec<RedisClient> = groups
        .iter()
        .map(|g| {
            RedisClient::open_sentinel(g.sentinel_urls(), g.master_name(), client_opts.clone())
                .unwrap()
        })
        .collect();
    let observer = clients[1].clone();
    assert_eq!(observer.failovers(), 0);
    let nodes = NodeSet::from_clients(
        clients,
        slate_combination::NodeSetOptionsBuilder::from(opts(op))
            .quarantine(quarantine)
            .reprobe_interval(Duration::from_millis(200))
            .build()
            .unwrap(),
    )
    .unwrap();
    adopt(&nodes).await;
    let lock = CombinationLock::builder(&nodes, "failover")
        .lease(quarantine)
        .build()
        .unwrap();
    let g = lock.lock().await.unwrap();
    assert_eq!(g.nodes(), &[0, 1, 2]);
    // The replica has been up for more than the quarantine when it is promoted.
    tokio::time::sleep(quarantine + Duration::from_millis(500)).await;
    groups[1].kill_master().unwrap();
    assert!(
        !g.is_lost(),
        "the holder keeps its quorum on nodes 0 and 2: {:?}",
        g.lease().loss_reason()
    );
    g.unlock().await.unwrap();
    // The next acquisition is the first command on node 1 since the failover (its renewal
    // stopped when its entry expired there): the client finds the new master then, and the
    // node does not count.
    let g = lock.lock().await.unwrap();
    assert_eq!(observer.failovers(), 1);
    assert_eq!(g.nodes(), &[0, 2], "the failed-over node does not count");
    g.unlock().await.unwrap();
    let g = lock.lock().await.unwrap();
    assert_eq!(g.nodes(), &[0, 2], "the failed-over node is quarantined");
    g.unlock().await.unwrap();
    // After the quarantine it is used again.
    tokio::time::sleep(quarantine + Duration::from_millis(300)).await;
    let g = lock.lock().await.unwrap();
    assert_eq!(g.nodes(), &[0, 1, 2]);
    g.unlock().await.unwrap();
}

/// Issue 35, defect 8: a failover that happened before a process first met the node escaped
/// the quarantine (the process had no run id or replication id to compare with), so the
/// promoted replica, which may lack grants its old master never replicated, counted at once.
/// The node marker now carries the stamp of the server that wrote it; the promoted replica
/// holds its old master's stamp and is quarantined, then used again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn d8_a_failover_before_the_first_contact_is_quarantined() {
    let quarantine = Duration::from_secs(2);
    let mut group = SentinelGroup::start(1, 1).unwrap();
    let standalone = servers(2);
    let op = Duration::from_millis(500);
    let (sentinels, name) = (group.sentinel_urls(), group.master_name());
    let view = || {
        let client_opts = ClientOptions::builder()
            .command_timeout(op)
            .connect_timeout(op)
            .build()
            .unwrap();
        let clients = vec![
            RedisClient::open_with(standalone[0].url(), client_opts.clone()).unwrap(),
            RedisClient::open_sentinel(sentinels.clone(), name, client_opts.clone()).unwrap(),
            RedisClient::open_with(standalone[1].url(), client_opts).unwrap(),
        ];
        let options = slate_combination::NodeSetOptionsBuilder::from(opts(op))
            .quarantine(quarantine)
            .build()
            .unwrap();
        NodeSet::from_clients(clients, options).unwrap()
    };
    adopt(&view()).await;
    let master = group.master().unwrap();
    let replica = 1 - master;
    // The replica has the marker, and has been up for longer than the quarantine.
    let marker = |i: usize| {
        group
            .server(i)
            .command(&["EXISTS", "slate:node-marker"])
            .unwrap()
    };
    wait_for(Duration::from_secs(5), "the marker on the replica", || {
        (marker(replica) == redis::Value::Int(1)).then_some(())
    })
    .await;
    tokio::time::sleep(quarantine + Duration::from_millis(300)).await;
    assert_eq!(group.kill_master().unwrap(), replica);
    // A process that starts after the failover.
    let nodes = view();
    let lock = CombinationLock::builder(&nodes, "d8")
        .lease(quarantine)
        .build()
        .unwrap();
    let g = lock.lock().await.unwrap();
    assert_eq!(
        g.nodes(),
        &[0, 2],
        "the promoted replica counts at the first contact"
    );
    // Left out because it is quarantined, not merely unreachable (review finding).
    let state = nodes.report()[1].state.clone();
    assert!(
        matches!(state, slate_core::NodeState::Quarantined { .. }),
        "{state:?}"
    );
    g.unlock().await.unwrap();
    tokio::time::sleep(quarantine + Duration::from_millis(300)).await;
    let g = lock.lock().await.unwrap();
    assert_eq!(g.nodes(), &[0, 1, 2], "used again after its quarantine");
    g.unlock().await.unwrap();
}
