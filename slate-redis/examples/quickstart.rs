//! Several tasks (and, when run twice, two processes) take turns on one lock.
//!
//! ```sh
//! redis-server --port 6379 &            # or: docker compose -f docker/compose.yaml up -d
//! cargo run -p slate-redis --example quickstart &
//! cargo run -p slate-redis --example quickstart
//! ```
//!
//! `REDIS_URL` selects the server (default `redis://127.0.0.1:6379`).

use std::time::Duration;

use slate_redis::{RedisClient, SingleLock};

const TASKS: usize = 4;
const ROUNDS: usize = 5;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let client = RedisClient::open(&url)?;
    client.ping().await?;
    let lock = SingleLock::builder(&client, "quickstart")
        .lease(Duration::from_secs(5))
        .build()?;
    let pid = std::process::id();
    println!("process {pid}: {TASKS} tasks x {ROUNDS} rounds on {url}");

    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let lock = lock.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let guard = lock.lock().await?;
                println!(
                    "process {pid} task {task} round {round}: holds the lock (token {}, lease ends in {:?})",
                    guard.fencing_token(),
                    guard.lease_deadline().saturating_duration_since(std::time::Instant::now()),
                );
                // The critical section.
                tokio::time::sleep(Duration::from_millis(50)).await;
                guard.unlock().await?;
                // Give the others a turn.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Ok::<(), slate_redis::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    println!(
        "process {pid}: done; renewals still registered: {}",
        client.stats().renewals
    );
    Ok(())
}
