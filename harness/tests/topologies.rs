//! The cluster and sentinel harnesses start real topologies and fail them over.

use slate_harness::cluster::RedisCluster;
use slate_harness::sentinel::SentinelGroup;

#[test]
fn cluster_starts_migrates_and_fails_over() {
    let mut cluster = RedisCluster::start(3, 1).expect("cluster");
    assert_eq!(cluster.len(), 6);
    assert_eq!(cluster.masters().unwrap().len(), 3);
    let slot = cluster.slot_of(b"slate:{orders}").unwrap();
    let owner = cluster.master_of(slot).unwrap();
    cluster
        .node(owner)
        .command(&["SET", "slate:{orders}", "1"])
        .unwrap();
    // Move the slot (and its key) to another master.
    let to = *cluster
        .masters()
        .unwrap()
        .iter()
        .find(|&&m| m != owner)
        .unwrap();
    cluster.migrate_slot(slot, to).unwrap();
    assert_eq!(cluster.master_of(slot).unwrap(), to);
    assert_eq!(
        cluster
            .node(to)
            .command(&["GET", "slate:{orders}"])
            .unwrap(),
        redis::Value::BulkString(b"1".to_vec())
    );
    // A coordinated failover, then a crash.
    let replica = cluster.replicas_of(to).unwrap()[0];
    cluster.manual_failover(replica).unwrap();
    assert_eq!(cluster.master_of(slot).unwrap(), replica);
    let promoted = cluster.kill_master(replica).unwrap();
    assert_eq!(cluster.master_of(slot).unwrap(), promoted);
    assert_ne!(promoted, replica);
}

#[test]
fn sentinel_group_starts_and_fails_over() {
    let mut group = SentinelGroup::start(2, 3).expect("group");
    assert_eq!(group.master().unwrap(), 0);
    let handed = group.failover().unwrap();
    assert_ne!(handed, 0);
    let crashed = group.kill_master().unwrap();
    assert_ne!(crashed, handed);
}
