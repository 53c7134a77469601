//! The single lock on a Redis Cluster and on a Sentinel-managed master (issue 13): the same
//! behaviour as on a standalone master, plus what each topology adds (slots, redirects,
//! sharded pub/sub, failovers).
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{eventually, eventually_async, within};
use slate_harness::cluster::RedisCluster;
use slate_harness::sentinel::SentinelGroup;
use slate_redis::{ClientOptions, LossReason, RedisClient, SingleLock, Topology};

fn cluster_client(cluster: &RedisCluster) -> RedisClient {
    RedisClient::open_cluster(cluster.urls(), ClientOptions::default()).unwrap()
}

fn sentinel_client(group: &SentinelGroup) -> RedisClient {
    RedisClient::open_sentinel(
        group.sentinel_urls(),
        group.master_name(),
        ClientOptions::default(),
    )
    .unwrap()
}

/// What every topology must do the same: acquire, busy, re-entry, tokens, wake-up by a
/// release (the spin wait is 10 s, so only a notification can wake the waiter in time),
/// renewal past several leases, force unlock, the background release of a dropped guard.
async fn behaviour(a: &RedisClient, b: &RedisClient, name: &str) {
    let lease = Duration::from_millis(600);
    let build = |c: &RedisClient| {
        SingleLock::builder(c, name)
            .lease(lease)
            .spin_wait(Duration::from_secs(10))
            .build()
            .unwrap()
    };
    let (la, lb) = (build(a), build(b));

    let g = la.lock().await.unwrap();
    let t1 = g.fencing_token();
    assert!(lb.try_lock().await.unwrap().is_none(), "{name}: busy");
    let inner = g.reenter().await.unwrap();
    assert_eq!((inner.depth(), inner.fencing_token()), (2, t1));
    assert_eq!(inner.unlock().await.unwrap(), 1);
    // Held across several leases: renewal keeps it.
    tokio::time::sleep(lease * 3).await;
    assert!(!g.is_lost(), "{name}: renewal kept the lock");
    assert!(lb.try_lock().await.unwrap().is_none());

    assert_eq!(g.unlock().await.unwrap(), 0);

    // A waiter of the other client is woken by the release: the hold's lease and the waiter's
    // spin wait are 10 s, so neither its spin timer nor the lease's end can wake it in time.
    // (Another key prefix: handles of one lock in one client share its options.)
    let long = |c: &RedisClient| {
        SingleLock::builder(c, name)
            .key_prefix("slate:long:")
            .lease(Duration::from_secs(10))
            .spin_wait(Duration::from_secs(10))
            .build()
            .unwrap()
    };
    let (la_long, lb_long) = (long(a), long(b));
    let g = la_long.lock().await.unwrap();
    let waiter = tokio::spawn({
        let lb_long = lb_long.clone();
        async move { lb_long.lock().await.unwrap() }
    });
    eventually(Duration::from_secs(3), "the waiter to subscribe", || {
        b.stats().subscriptions == 1 && b.stats().pubsub_up
    })
    .await;
    // Past the waiter's first attempt and into its park.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = Instant::now();
    assert_eq!(g.unlock().await.unwrap(), 0);
    let g2 = within(Duration::from_secs(3), "the woken waiter", waiter)
        .await
        .unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(3),
        "{name}: woken by the release"
    );
    assert!(g2.fencing_token() > t1, "{name}: tokens increase");

    // Force unlock: the holder learns, the lock is free.
    assert_eq!(la_long.force_unlock().await.unwrap(), 1);
    // (Its 10 s lease is renewed every ~3.3 s: the renewal finds the entry gone.)
    let reason = within(Duration::from_secs(6), "loss", g2.lost()).await;
    assert_eq!(reason, LossReason::EntryGone);
    assert!(g2.unlock().await.unwrap_err().is_not_held());

    // The blocking twins, from a plain thread outside the runtime.
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn({
        let lb = lb.clone();
        move || {
            let g = lb.blocking_lock().unwrap();
            let inner = lb.blocking_lock_as(g.holder()).unwrap();
            assert_eq!(inner.blocking_unlock().unwrap(), 1);
            let t = g.fencing_token();
            assert_eq!(g.blocking_unlock().unwrap(), 0);
            let _ = tx.send(t);
        }
    });
    let t = within(Duration::from_secs(5), "the blocking twins", rx).await;
    assert!(
        t.expect("the blocking thread panicked") > t1,
        "{name}: blocking twins"
    );

    // A dropped guard is released in the background.
    let g3 = la.lock().await.unwrap();
    assert!(g3.fencing_token() > t1);
    drop(g3);
    eventually_async(Duration::from_secs(3), "the background release", || {
        let la = la.clone();
        async move { !la.is_locked().await.unwrap() }
    })
    .await;
}

/// Names that hash to every shard, and hostile ones whose braces must not split the lock's
/// keys over several slots (a CROSSSLOT error would fail the scripts).
const CLUSTER_NAMES: [&str; 8] = [
    "orders", "users", "payments", "}", "{}", "a}b", "{x}y", "}{",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_runs_the_single_lock_on_every_shard() {
    let cluster = RedisCluster::start(3, 1).unwrap();
    let (a, b) = (cluster_client(&cluster), cluster_client(&cluster));
    assert_eq!(a.topology(), Topology::Cluster);
    a.ping().await.unwrap();
    // The names cover all three masters.
    let mut owners = std::collections::HashSet::new();
    for name in CLUSTER_NAMES {
        let key = SingleLock::builder(&a, name)
            .build()
            .unwrap()
            .key()
            .to_vec();
        let slot = cluster.slot_of(&key).unwrap();
        owners.insert(cluster.master_of(slot).unwrap());
    }
    assert_eq!(owners.len(), 3, "the test names reach every shard");
    behaviour(&a, &b, "orders").await;
    // Every script on every name, hostile ones included: acquire, re-enter, release, renew,
    // inspect, force unlock (a CROSSSLOT or MOVED error would fail them).
    for name in CLUSTER_NAMES {
        let l = SingleLock::builder(&a, name)
            .key_prefix("scripts:")
            .lease(Duration::from_millis(300))
            .build()
            .unwrap();
        let g = l.lock().await.unwrap();
        let inner = g.reenter().await.unwrap();
        assert_eq!(l.hold_count(g.holder()).await.unwrap(), 2, "{name}");
        assert!(l.remaining_lease().await.unwrap().is_some(), "{name}");
        assert_eq!(inner.unlock().await.unwrap(), 1, "{name}");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(!g.is_lost(), "{name}: renewed");
        assert_eq!(g.unlock().await.unwrap(), 0, "{name}");
        let g = l.lock().await.unwrap();
        assert_eq!(l.force_unlock().await.unwrap(), 1, "{name}");
        drop(g);
        assert!(!l.is_locked().await.unwrap(), "{name}");
    }
    // Holds on every shard at once are renewed (one pipeline per node per tick).
    let lease = Duration::from_millis(500);
    let mut guards = Vec::new();
    for name in CLUSTER_NAMES {
        let l = SingleLock::builder(&a, name)
            .key_prefix("many:")
            .lease(lease)
            .build()
            .unwrap();
        guards.push(l.lock().await.unwrap());
    }
    tokio::time::sleep(lease * 4).await;
    for g in &guards {
        assert!(!g.is_lost());
    }
    for g in guards {
        assert_eq!(g.unlock().await.unwrap(), 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_hold_survives_a_slot_migration() {
    let mut cluster = RedisCluster::start(3, 1).unwrap();
    let (a, b) = (cluster_client(&cluster), cluster_client(&cluster));
    let lease = Duration::from_millis(800);
    let la = SingleLock::builder(&a, "migrating")
        .lease(lease)
        .build()
        .unwrap();
    let lb = SingleLock::builder(&b, "migrating")
        .lease(lease)
        .spin_wait(Duration::from_secs(10))
        .build()
        .unwrap();
    let g = la.lock().await.unwrap();
    // A second lock in the same slot (another key prefix, the same name: the same hash tag),
    // held with a 10 s lease, and a waiter for it in the other client, subscribed on the old
    // owner. Only a notification can wake it within a few seconds.
    let long = |c: &RedisClient| {
        SingleLock::builder(c, "migrating")
            .key_prefix("wake:")
            .lease(Duration::from_secs(10))
            .spin_wait(Duration::from_secs(10))
            .build()
            .unwrap()
    };
    let (wa, wb) = (long(&a), long(&b));
    let wg = wa.lock().await.unwrap();
    let token = wg.fencing_token();
    let waiter = tokio::spawn(async move { wb.lock().await.unwrap() });
    eventually(Duration::from_secs(3), "the waiter to subscribe", || {
        b.stats().subscriptions == 1
    })
    .await;
    let slot = cluster.slot_of(la.key()).unwrap();
    assert_eq!(cluster.slot_of(wa.key()).unwrap(), slot);
    let from = cluster.master_of(slot).unwrap();
    let to = *cluster
        .masters()
        .unwrap()
        .iter()
        .find(|&&m| m != from)
        .unwrap();
    cluster.migrate_slot(slot, to).unwrap();
    // Renewals follow the MOVED redirect: the short hold outlives several leases on the new
    // owner, and the other client still cannot take it.
    tokio::time::sleep(lease * 3).await;
    assert!(!g.is_lost(), "the hold survived the migration");
    assert!(lb.try_lock().await.unwrap().is_none());
    assert_eq!(g.unlock().await.unwrap(), 0);
    assert!(!waiter.is_finished(), "the waiter still waits");
    let released = Instant::now();
    assert_eq!(wg.unlock().await.unwrap(), 0);
    // The waiter is woken on the new owner (resubscribed after the server ended its
    // subscription), well before its 10 s spin wait and the 10 s lease.
    let g2 = within(Duration::from_secs(4), "the woken waiter", waiter)
        .await
        .unwrap();
    assert!(released.elapsed() < Duration::from_secs(4));
    assert!(g2.fencing_token() > token, "the fence moved with the slot");
    g2.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_node_given_as_a_standalone_url_is_named() {
    let cluster = RedisCluster::start(3, 0).unwrap();
    let client = RedisClient::open(cluster.node(0).url()).unwrap();
    let lock = SingleLock::builder(&client, "orders").build().unwrap();
    // Keys of other shards answer MOVED; the error names the fix.
    let mut seen = None;
    for name in CLUSTER_NAMES {
        let lock = SingleLock::builder(&client, name).build().unwrap();
        if let Err(e) = lock.try_lock().await {
            seen = Some(e);
            break;
        }
    }
    drop(lock);
    let e = seen.expect("some name lives on another shard");
    assert!(e.to_string().contains("open_cluster"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_runs_the_single_lock_and_follows_a_failover() {
    let mut group = SentinelGroup::start(2, 3).unwrap();
    let (a, b) = (sentinel_client(&group), sentinel_client(&group));
    assert_eq!(a.topology(), Topology::Sentinel);
    behaviour(&a, &b, "orders").await;

    // After the master dies and the Sentinels promote a replica, new acquisitions succeed on
    // the new master within the failover time plus a few command timeouts.
    let lock = SingleLock::builder(&a, "after-failover").build().unwrap();
    lock.lock().await.unwrap().unlock().await.unwrap();
    let killed = Instant::now();
    group.kill_master().unwrap();
    let failed_over = killed.elapsed();
    let g = within(
        Duration::from_secs(10),
        "an acquisition on the new master",
        async {
            loop {
                match lock.try_lock().await {
                    Ok(Some(g)) => break g,
                    Ok(None) => panic!("nobody holds the lock"),
                    Err(e) => {
                        assert!(e.backend_kind().is_some_and(|k| k.is_transient()), "{e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        },
    )
    .await;
    eprintln!(
        "failover took {failed_over:?}; acquired on the new master {:?} after the kill",
        killed.elapsed()
    );
    g.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_topology_input_is_refused_with_the_fix() {
    let rt_free = RedisClient::open_cluster(Vec::<String>::new(), ClientOptions::default());
    assert!(
        rt_free
            .unwrap_err()
            .to_string()
            .contains("at least one node")
    );
    let e = RedisClient::open_sentinel(["redis://127.0.0.1:1"], "", ClientOptions::default())
        .unwrap_err();
    assert!(e.to_string().contains("master name"), "{e}");
    let e = RedisClient::open_sentinel(Vec::<String>::new(), "m", ClientOptions::default())
        .unwrap_err();
    assert!(e.to_string().contains("Sentinel"), "{e}");
    let e = RedisClient::open_cluster(["not a url"], ClientOptions::default()).unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
}

/// The least-privilege grants of the README (the standalone list of
/// `ecosphere/tests/security_acl.rs`, plus what a cluster needs: sharded pub/sub and the slot
/// map): the lock works as that user on a cluster, and no node logs a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_runs_as_a_least_privilege_user() {
    const GRANTS: &str = "resetkeys resetchannels ~slate:* &slate:* -@all +evalsha \
        +script|load +ping +subscribe +unsubscribe +exists +hget +pttl +info +set +hset \
        +hincrby +hmget +hgetall +del +pexpire +get +incr +incrby +publish +time +zadd \
        +zrem +zrange +spublish +ssubscribe +sunsubscribe +cluster|slots +command|info +wait";
    // Redis 7.2+ and Valkey: the client's handshake names its library (README).
    let handshake = if slate_harness::server::chosen_version()
        .unwrap()
        .knows_client_setinfo()
    {
        " +client|setinfo"
    } else {
        ""
    };
    let builder = slate_harness::server::RedisServer::builder()
        .acl_user("slate-app", "Acl-Pw-1", format!("{GRANTS}{handshake}"))
        .arg("acllog-max-len", "1024");
    let cluster = RedisCluster::start_with(3, 1, &builder).unwrap();
    let options = || {
        ClientOptions::builder()
            .username("slate-app")
            .password("Acl-Pw-1")
            .synced_replicas(1, Duration::from_millis(500))
            .build()
            .unwrap()
    };
    let a = RedisClient::open_cluster(cluster.urls(), options()).unwrap();
    let b = RedisClient::open_cluster(cluster.urls(), options()).unwrap();
    behaviour(&a, &b, "acl").await;
    for i in 0..cluster.len() {
        let log = cluster.node(i).command(&["ACL", "LOG"]).unwrap();
        assert_eq!(log, redis::Value::Array(vec![]), "ACL LOG of node {i}");
    }
}

/// A cluster without sharded pub/sub (Redis < 7; here SPUBLISH and SSUBSCRIBE are renamed
/// away): the lock works, releases PUBLISH, waiters use the spin wait, nothing subscribes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_without_sharded_pubsub_falls_back_to_the_spin_wait() {
    let builder = slate_harness::server::RedisServer::builder()
        .arg("rename-command", "SPUBLISH \"\"")
        .arg("rename-command", "SSUBSCRIBE \"\"");
    let cluster = RedisCluster::start_with(3, 0, &builder).unwrap();
    let (a, b) = (cluster_client(&cluster), cluster_client(&cluster));
    let build = |c: &RedisClient, spin: Duration| {
        SingleLock::builder(c, "old-server")
            .lease(Duration::from_secs(10))
            .spin_wait(spin)
            .build()
            .unwrap()
    };
    let (la, lb) = (
        build(&a, Duration::from_secs(10)),
        build(&b, Duration::from_millis(200)),
    );
    let g = la.lock().await.unwrap();
    let waiter = tokio::spawn(async move { lb.lock().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(b.stats().subscriptions, 0, "nothing subscribes");
    assert_eq!(
        g.unlock().await.unwrap(),
        0,
        "the release publishes with PUBLISH"
    );
    // Woken by its 200 ms spin timer.
    let g2 = within(Duration::from_secs(2), "the spinning waiter", waiter)
        .await
        .unwrap();
    g2.unlock().await.unwrap();
}

/// A replica cut off (its process stopped: it acknowledges nothing) with `synced_replicas`:
/// grants are given back and reported, nothing is left held; once it is back, grants work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_with_synced_replicas_refuses_grants_while_the_replica_is_cut_off() {
    let mut group = SentinelGroup::start(1, 1).unwrap();
    let client = RedisClient::open_sentinel(
        group.sentinel_urls(),
        group.master_name(),
        ClientOptions::builder()
            .synced_replicas(1, Duration::from_millis(300))
            .build()
            .unwrap(),
    )
    .unwrap();
    let lock = SingleLock::builder(&client, "partitioned")
        .lease(Duration::from_secs(2))
        .build()
        .unwrap();
    // The first grant waits for the replica's acknowledgement within 300 ms; on a loaded
    // machine a just-started replica may miss that window once (a transient error), so the
    // first grant is awaited with a deadline instead of being required at once.
    let first_grant = || {
        let lock = lock.clone();
        async move {
            match lock.try_lock().await {
                Ok(Some(g)) => g.unlock().await.is_ok(),
                _ => false,
            }
        }
    };
    eventually_async(Duration::from_secs(5), "a first grant", first_grant).await;
    group.server_mut(1).pause().unwrap();
    let e = lock.try_lock().await.unwrap_err();
    assert!(e.to_string().contains("0 of the 1 replicas"), "{e}");
    assert!(e.backend_kind().is_some_and(|k| k.is_transient()), "{e}");
    assert!(!lock.is_locked().await.unwrap(), "the grant was given back");
    group.server_mut(1).resume().unwrap();
    eventually_async(
        Duration::from_secs(5),
        "a grant once the replica is back",
        first_grant,
    )
    .await;
}
