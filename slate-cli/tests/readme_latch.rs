//! The README's countdown latch quickstart, verbatim between the markers, run against a real
//! `redis-server`; the test fails if the README's copy differs.

mod readme;

use std::sync::atomic::{AtomicU64, Ordering};

// README:BEGIN
use slate_redis::{CountDownLatch, RedisClient};

async fn report_when_loaded(redis_url: &str) -> slate_redis::Result<()> {
    let client = RedisClient::open(redis_url)?;
    let loaders = CountDownLatch::builder(&client, "loaders").build()?;
    loaders.try_set_count(3).await?; // only when open: one round at a time
    for part in 0..3 {
        let loaders = loaders.clone(); // in real life, three other processes
        tokio::spawn(async move {
            load(part).await;
            loaders.count_down().await // counted once, even when sent again
        });
    }
    loaders.wait().await?; // woken by the last count-down's message, no polling
    render_report().await;
    Ok(())
}
// README:END

static LOADED: AtomicU64 = AtomicU64::new(0);

async fn load(_part: u32) {
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    LOADED.fetch_add(1, Ordering::SeqCst);
}

async fn render_report() {
    assert_eq!(
        LOADED.load(Ordering::SeqCst),
        3,
        "the report waited for every loader"
    );
}

#[test]
fn the_readme_shows_this_code() {
    readme::assert_shown(
        include_str!("readme_latch.rs"),
        "readme_latch.rs",
        "latch quickstart",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quickstart_runs() {
    let server = slate_cli::local::LocalServer::start().expect("redis-server");
    report_when_loaded(&server.url()).await.expect("quickstart");
}
