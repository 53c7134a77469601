//! Serves Slate's lock metrics for Prometheus while a few tasks take turns on some locks.
//!
//! ```sh
//! redis-server --port 6379 &
//! cargo run -p slate-redis --example prometheus &
//! curl -s http://127.0.0.1:9464/metrics | grep '^slate_'
//! ```
//!
//! `REDIS_URL` selects the server (default `redis://127.0.0.1:6379`), `METRICS_ADDR` the
//! address served (default `127.0.0.1:9464`). It runs for `SECONDS` (default 60) and exits.
//! `docs/OPERATIONS.md` lists every metric and the alert it supports.

use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusBuilder;
use slate_redis::{RedisClient, SingleLock};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let addr: std::net::SocketAddr = std::env::var("METRICS_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:9464".into())
        .parse()?;
    let seconds: u64 = std::env::var("SECONDS").map_or(Ok(60), |s| s.parse())?;

    // The recorder first: locks resolve their metric handles at their first event.
    PrometheusBuilder::new()
        .with_http_listener(addr)
        // The wait and hold times as histograms (buckets in seconds) rather than summaries.
        .set_buckets(&[0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0])?
        .install()?;
    // A `lock` label for the few fixed names of this program (never for per-entity names).
    slate_redis::metrics::label_lock_names(|name| {
        let name = std::str::from_utf8(name.as_bytes()).ok()?;
        name.starts_with("report-").then(|| name.to_owned())
    });

    let client = RedisClient::open(&url)?;
    client.ping().await?;
    println!("serving http://{addr}/metrics for {seconds} s; locks on {url}");
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for task in 0..4_u64 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let lock = SingleLock::builder(&client, format!("report-{}", task % 2))
                .lease(Duration::from_secs(5))
                .build()?;
            while Instant::now() < end {
                let guard = lock.lock().await?;
                tokio::time::sleep(Duration::from_millis(20 + 10 * task)).await;
                guard.unlock().await?;
            }
            Ok::<(), slate_redis::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}
