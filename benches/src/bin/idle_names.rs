//! What an idle lock name costs the lock server: many distinct names, each locked and released
//! once, then the leases left to run out; the server's `used_memory` and key count before and
//! after, per name. The per-entity workload of issue 30 (a lock per `order:1234`) leaves this
//! behind for every entity ever locked.
//!
//! ```sh
//! cargo run --release -p benches --bin idle_names -- --names 200000 --impls slate,rslock,spin
//! ```
//!
//! Each implementation gets a fresh `redis-server` (started by the harness, loopback only).
//! `--concurrency` tasks take the names in turn; every name is locked and released exactly
//! once, by one task, so nothing waits. The lease is `--lease-ms`; after the run the tool
//! waits until no key with a TTL is left (active expiry reclaims expired keys a sample at a
//! time), at most `--settle-s`, then reads `INFO memory` and `DBSIZE` and prints a sample of
//! what stayed, by key suffix.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use ecosphere::server::RedisServer;
use redis::aio::MultiplexedConnection;
use slate_redis::{RedisClient, SingleLock};

/// The implementations measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Which {
    /// Slate's single lock, default settings.
    Slate,
    /// The `rslock` crate on one node.
    Rslock,
    /// `SET NX PX`, compare-and-delete release.
    Spin,
}

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "idle_names",
    about = "What an idle lock name costs the lock server"
)]
struct Args {
    /// Distinct names, each locked and released once.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..=5_000_000))]
    names: u64,
    /// Implementations, in this order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "slate,rslock,spin"
    )]
    impls: Vec<Which>,
    /// Tasks taking names concurrently.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    concurrency: u64,
    /// Lease of every lock, in milliseconds.
    #[arg(long, default_value_t = 1_000)]
    lease_ms: u64,
    /// Upper bound of the load phase of one implementation, in seconds.
    #[arg(long, default_value_t = 600)]
    max_s: u64,
    /// Upper bound of the wait for expired keys to be reclaimed, in seconds.
    #[arg(long, default_value_t = 60)]
    settle_s: u64,
}

/// One implementation's figures.
struct Measured {
    which: Which,
    names: u64,
    seconds: f64,
    memory_before: u64,
    memory_after: u64,
    keys_after: u64,
}

fn main() -> Result<(), String> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let mut rows = Vec::new();
    for &which in &args.impls {
        let server = RedisServer::start().map_err(|e| format!("redis-server: {e}"))?;
        let row = rt.block_on(measure(&args, which, &server))?;
        eprintln!(
            "{which:?}: {} names in {:.1} s; {} keys left",
            row.names, row.seconds, row.keys_after
        );
        rows.push(row);
    }
    println!(
        "| impl | names | acq/s | used_memory before | after (leases passed) | bytes per idle name | keys left per name |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for r in rows {
        let grown = r.memory_after.saturating_sub(r.memory_before);
        println!(
            "| {} | {} | {:.0} | {} | {} | {:.1} | {:.3} |",
            format!("{:?}", r.which).to_lowercase(),
            r.names,
            r.names as f64 / r.seconds,
            r.memory_before,
            r.memory_after,
            grown as f64 / r.names as f64,
            r.keys_after as f64 / r.names as f64
        );
    }
    Ok(())
}

/// `used_memory` and `DBSIZE` of `server`.
fn memory_and_keys(server: &RedisServer) -> Result<(u64, u64), String> {
    let used = server
        .info_field("memory", "used_memory")
        .map_err(|e| e.to_string())?
        .and_then(|v| v.parse().ok())
        .ok_or("no used_memory in INFO memory")?;
    let keys: u64 =
        redis::from_redis_value(server.command(&["DBSIZE"]).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    Ok((used, keys))
}

/// Keys with a TTL on `server` (`expires=` of `INFO keyspace`'s `db0`).
fn volatile_keys(server: &RedisServer) -> Result<u64, String> {
    let db0 = server
        .info_field("keyspace", "db0")
        .map_err(|e| e.to_string())?
        .unwrap_or_default();
    Ok(db0
        .split(',')
        .find_map(|f| f.strip_prefix("expires="))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0))
}

async fn measure(args: &Args, which: Which, server: &RedisServer) -> Result<Measured, String> {
    let lease = Duration::from_millis(args.lease_ms);
    let url = server.url();
    // Connect (and load scripts) before the first reading, so that it holds the clients.
    let client = RedisClient::open(&url).map_err(|e| e.to_string())?;
    client.ping().await.map_err(|e| e.to_string())?;
    let conn = redis::Client::open(url.as_str())
        .map_err(|e| e.to_string())?
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    let manager = rslock::LockManager::new(vec![url.clone()]);
    let (memory_before, _) = memory_and_keys(server)?;
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.max_s);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency {
        let (next, client, conn, manager) =
            (next.clone(), client.clone(), conn.clone(), manager.clone());
        let names = args.names;
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= names {
                    return Ok::<(), String>(());
                }
                if Instant::now() >= deadline {
                    return Err(format!("the load phase ran past its bound at name {i}"));
                }
                let name = format!("entity:{i}");
                once(which, &name, lease, &client, &conn, &manager).await?;
            }
        });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.map_err(|e| format!("task: {e}"))??;
    }
    let seconds = started.elapsed().as_secs_f64();
    drop(client);
    // The leases and request records run out, then active expiry reclaims the keys a sample
    // at a time: wait until no key with a TTL is left (bounded), so that what remains is
    // what stays for ever.
    let settle_until = Instant::now() + Duration::from_secs(args.settle_s);
    while volatile_keys(server)? > 0 && Instant::now() < settle_until {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let (memory_after, keys_after) = memory_and_keys(server)?;
    if keys_after > 0 {
        // What is left, by kind: the key's last `:`-separated part (`fence`, `holder`, ...).
        let sample: Vec<String> = redis::from_redis_value(
            server
                .command(&["SCAN", "0", "COUNT", "1000"])
                .map_err(|e| e.to_string())?,
        )
        .map(|(_, keys): (String, Vec<String>)| keys)
        .map_err(|e| e.to_string())?;
        let mut kinds = std::collections::BTreeMap::<String, usize>::new();
        for k in &sample {
            // `<prefix>{<name>}<suffix>`: the suffix names the kind (`:fence`, `:req:<holder>`).
            let suffix = k.rsplit('}').next().unwrap_or(k);
            let kind = suffix.split(':').take(2).collect::<Vec<_>>().join(":");
            *kinds.entry(kind).or_default() += 1;
        }
        eprintln!("{which:?}: a sample of what is left, by the key's suffix: {kinds:?}");
    }
    Ok(Measured {
        which,
        names: args.names,
        seconds,
        memory_before,
        memory_after,
        keys_after,
    })
}

/// Locks and releases `name` once with `which`.
async fn once(
    which: Which,
    name: &str,
    lease: Duration,
    client: &RedisClient,
    conn: &MultiplexedConnection,
    manager: &rslock::LockManager,
) -> Result<(), String> {
    match which {
        Which::Slate => {
            let lock = SingleLock::builder(client, name)
                .lease(lease)
                .build()
                .map_err(|e| e.to_string())?;
            let guard = lock.lock().await.map_err(|e| e.to_string())?;
            guard.unlock().await.map(drop).map_err(|e| e.to_string())
        }
        Which::Rslock => {
            let lock = manager
                .lock(name.as_bytes(), lease)
                .await
                .map_err(|e| format!("rslock: {e:?}"))?;
            manager.unlock(&lock).await;
            Ok(())
        }
        Which::Spin => {
            let mut conn = conn.clone();
            let value = format!("{name}:{}", std::process::id());
            let ok: Option<String> = redis::cmd("SET")
                .arg(name)
                .arg(&value)
                .arg("NX")
                .arg("PX")
                .arg(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX))
                .query_async(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            if ok.is_none() {
                return Err(format!("{name} was busy"));
            }
            redis::Script::new(
                "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
            )
            .key(name)
            .arg(&value)
            .invoke_async::<i64>(&mut conn)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
        }
    }
}
