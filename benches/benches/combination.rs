//! Uncontended acquire + release of the combination lock on 3 harness-started `redis-server`s
//! on loopback, next to the `rslock` crate (Redlock) on the same 3 nodes, in one group:
//!
//! - `raw_evalsha_1_node`: the baseline, the acquire and release scripts invoked directly
//!   (EVALSHA) on one node's multiplexed connection with a fixed holder, exactly as a node
//!   acquire and release send them (no fair turn): the floor one node costs;
//! - `combination_sequential` / `combination_pipelined`: `lock().await` + `unlock().await` of
//!   a `CombinationLock` over the 3 nodes (sequential: node after node, released 2, 1, 0;
//!   pipelined: every node at once, released at once: one round each, issue 15);
//! - `rslock_3_nodes`: `LockManager::lock` + `LockManager::unlock` (SET NX PX on all nodes at
//!   once, then a compare-and-delete on all nodes at once).
//!
//! Goals: pipelined ≤ 1.10 × rslock (issue 15); sequential ≤ 1.10 × N × the baseline (issue 5).
//!
//! `cargo bench -p benches --bench combination -- --warm-up-time 1 --measurement-time 5`

#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use ecosphere::server::RedisServer;
use slate_combination::{CombinationLock, NodeSet, NodeSetOptions, Order};

fn combination(c: &mut Criterion) {
    let servers = RedisServer::start_many(3).expect("start redis-server");
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    let mut group = c.benchmark_group("combination_uncontended_3_nodes");

    let (acquire, release) = (
        redis::Script::new(slate_redis::lua_script("acquire").unwrap().source),
        redis::Script::new(slate_redis::lua_script("release").unwrap().source),
    );
    let conn = rt.block_on(async {
        let client = redis::Client::open(urls[0].as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        acquire
            .prepare_invoke()
            .load_async(&mut conn)
            .await
            .unwrap();
        release
            .prepare_invoke()
            .load_async(&mut conn)
            .await
            .unwrap();
        conn
    });
    let holder = slate_core::HolderId::new().to_string();
    group.bench_function("raw_evalsha_1_node", |b| {
        b.to_async(&rt).iter(|| {
            let mut conn = conn.clone();
            let (acquire, release, holder) = (&acquire, &release, &holder);
            async move {
                // As `node_acquire` sends it: lock, fence, queue, turn (unused without a
                // process id), node marker absent here; holder, lease, no process, no tenure.
                let got: Vec<i64> = acquire
                    .key("raw:{bench}")
                    .key("raw:{bench}:fence")
                    .key("raw:{bench}:queue")
                    .key("raw:{bench}:turn")
                    .arg(holder.as_str())
                    .arg(30_000)
                    .arg("")
                    .arg(0)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                assert_eq!(got[0], 1);
                let left: i64 = release
                    .key("raw:{bench}")
                    .key("raw:{bench}:released")
                    .key("raw:{bench}:queue")
                    .key("raw:{bench}:turn")
                    .arg(holder.as_str())
                    .arg(30_000)
                    .arg("")
                    .arg(0)
                    .arg(0)
                    .arg(0)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                assert_eq!(left, 0);
                black_box(left)
            }
        });
    });

    let nodes = rt.block_on(async {
        let nodes = NodeSet::connect(&urls, NodeSetOptions::default()).unwrap();
        assert_eq!(nodes.adopt_fresh_servers("slate:").await.unwrap(), 3);
        nodes
    });
    for (label, order) in [
        ("combination_sequential", Order::Sequential),
        ("combination_pipelined", Order::Pipelined),
    ] {
        let lock = rt.block_on(async {
            let lock = CombinationLock::builder(&nodes, format!("bench-{label}"))
                .order(order)
                .build()
                .unwrap();
            // Verify the nodes before measuring.
            let g = lock.lock().await.unwrap();
            assert_eq!(g.nodes(), &[0, 1, 2]);
            g.unlock().await.unwrap();
            lock
        });
        group.bench_function(label, |b| {
            b.to_async(&rt).iter(|| async {
                let guard = lock.lock().await.unwrap();
                black_box(guard.fencing_token());
                black_box(guard.unlock().await.unwrap())
            });
        });
    }

    let manager = rslock::LockManager::new(urls.clone());
    group.bench_function("rslock_3_nodes", |b| {
        b.to_async(&rt).iter(|| async {
            let lock = manager
                .lock(b"bench-rslock".as_slice(), Duration::from_secs(30))
                .await
                .unwrap();
            black_box(lock.validity_time);
            manager.unlock(&lock).await;
        });
    });
    group.finish();
    drop(servers);
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(5));
    targets = combination
}
criterion_main!(benches);
