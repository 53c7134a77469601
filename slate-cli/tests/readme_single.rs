//! The README's single-lock quickstart, verbatim between the markers, run against a real
//! `redis-server`; the test fails if the README's copy differs.

mod readme;

use std::sync::atomic::{AtomicU64, Ordering};

// README:BEGIN
use std::time::Duration;

use slate_redis::{RedisClient, SingleLock};

async fn nightly_report(redis_url: &str) -> slate_redis::Result<()> {
    let client = RedisClient::open(redis_url)?; // one client per server and process
    let lock = SingleLock::builder(&client, "nightly-report")
        .lease(Duration::from_secs(30)) // renewed every 15 s while held
        .build()?;
    let guard = lock.lock().await?; // waits in a FIFO queue, woken by the release
    let token = guard.fencing_token(); // strictly increasing across holders:
    write_report(token.get()).await; // pass it to the storage you write to
    guard.unlock().await?;
    Ok(())
}
// README:END

static WRITTEN: AtomicU64 = AtomicU64::new(0);

async fn write_report(token: u64) {
    WRITTEN.store(token, Ordering::SeqCst);
}

#[test]
fn the_readme_shows_this_code() {
    readme::assert_shown(
        include_str!("readme_single.rs"),
        "readme_single.rs",
        "single-lock quickstart",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quickstart_runs() {
    let server = slate_cli::local::LocalServer::start().expect("redis-server");
    nightly_report(&server.url()).await.expect("quickstart");
    assert!(WRITTEN.load(Ordering::SeqCst) > 0);
}
