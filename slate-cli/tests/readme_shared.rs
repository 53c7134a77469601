//! The README's read-write lock and semaphore quickstart, verbatim between the markers, run
//! against a real `redis-server`; the test fails if the README's copy differs.

mod readme;

use std::sync::atomic::{AtomicU64, Ordering};

// README:BEGIN
use slate_redis::{RedisClient, RwLock, Semaphore};

async fn serve_and_render(redis_url: &str) -> slate_redis::Result<()> {
    let client = RedisClient::open(redis_url)?;
    let config = RwLock::builder(&client, "config").build()?;
    let reading = config.read().await?; // readers share, across processes
    serve(reading.fencing_token().get()).await;
    reading.unlock().await?;
    let writing = config.write().await?; // alone; later readers wait behind it
    let reading = writing.downgrade().await?; // no writer can slip in between
    reading.unlock().await?;

    let gpus = Semaphore::builder(&client, "gpus", 4).build()?; // 4 permits, everywhere
    let permit = gpus.acquire(1).await?; // leased: a crashed holder's permit comes back
    serve(permit.fencing_token().get()).await;
    permit.unlock().await?;
    Ok(())
}
// README:END

static SERVED: AtomicU64 = AtomicU64::new(0);

async fn serve(token: u64) {
    SERVED.fetch_add(token, Ordering::SeqCst);
}

#[test]
fn the_readme_shows_this_code() {
    readme::assert_shown(
        include_str!("readme_shared.rs"),
        "readme_shared.rs",
        "shared-mode quickstart",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quickstart_runs() {
    let server = slate_cli::local::LocalServer::start().expect("redis-server");
    serve_and_render(&server.url()).await.expect("quickstart");
    assert!(SERVED.load(Ordering::SeqCst) > 0);
}
