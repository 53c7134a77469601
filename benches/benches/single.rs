//! Uncontended lock + unlock of `SingleLock` next to the raw cost of the same two script calls.
//!
//! Both run against one harness-started `redis-server` on loopback:
//! - `raw_evalsha`: the acquire and release scripts invoked directly (EVALSHA) on one
//!   multiplexed connection, with a fixed holder: the floor any Redis lock pays;
//! - `single_lock`: `lock().await` + `unlock().await` (local queue, renewal registration,
//!   guard, lease watch, tracing spans on top of the same two round trips).
//!
//! `cargo bench -p benches --bench single -- --warm-up-time 1 --measurement-time 5`

#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use ecosphere::server::RedisServer;
use slate_redis::{RedisClient, SingleLock};

fn single(c: &mut Criterion) {
    let server = RedisServer::start().expect("start redis-server");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();

    let mut group = c.benchmark_group("single_uncontended");

    let (acquire, release) = (
        redis::Script::new(slate_redis::lua_script("acquire").unwrap().source),
        redis::Script::new(slate_redis::lua_script("release").unwrap().source),
    );
    let conn = rt.block_on(async {
        let client = redis::Client::open(server.url()).unwrap();
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
    let holder = slate_redis::HolderId::new().to_string();
    let queue = slate_redis::HolderId::new().to_string();
    let record = format!("raw:{{bench}}:req:{holder}");
    let requests = std::sync::atomic::AtomicU64::new(1);
    // The two script calls exactly as the lock sends them uncontended (the keys and arguments
    // of `slate-redis/src/primitives/lock/mod.rs`: request records, no token block, no undo).
    group.bench_function("raw_evalsha", |b| {
        b.to_async(&rt).iter(|| {
            let mut conn = conn.clone();
            let (acquire, release, holder, queue, record) =
                (&acquire, &release, &holder, &queue, &record);
            let request = requests.fetch_add(2, std::sync::atomic::Ordering::Relaxed);
            async move {
                let got: Vec<i64> = acquire
                    .key("raw:{bench}")
                    .key("raw:{bench}:fence")
                    .key("raw:{bench}:queue")
                    .key("raw:{bench}:turn")
                    .key(record.as_str())
                    .arg(holder.as_str())
                    .arg(30_000)
                    .arg(queue.as_str())
                    .arg(8)
                    .arg(request)
                    .arg(4_000)
                    .arg("")
                    .arg("")
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                assert_eq!(got[0], 1);
                let left: i64 = release
                    .key("raw:{bench}")
                    .key("raw:{bench}:released")
                    .key("raw:{bench}:queue")
                    .key("raw:{bench}:turn")
                    .key(record.as_str())
                    .arg(holder.as_str())
                    .arg(30_000)
                    .arg(queue.as_str())
                    .arg(8)
                    .arg(0)
                    .arg(100)
                    .arg(request + 1)
                    .arg(4_000)
                    .arg("")
                    .arg("PUBLISH")
                    .arg(1)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                black_box(left)
            }
        });
    });

    let lock = rt.block_on(async {
        let client = RedisClient::open(server.url()).unwrap();
        client.ping().await.unwrap();
        SingleLock::builder(&client, "bench").build().unwrap()
    });
    group.bench_function("single_lock", |b| {
        b.to_async(&rt).iter(|| async {
            let guard = lock.lock().await.unwrap();
            black_box(guard.fencing_token());
            black_box(guard.unlock().await.unwrap())
        });
    });
    group.finish();
    drop(server);
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(5));
    targets = single
}
criterion_main!(benches);
