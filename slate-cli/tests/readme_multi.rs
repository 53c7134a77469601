//! The README's multi-lock quickstart, verbatim between the markers, run against a real
//! `redis-server`; the test fails if the README's copy differs.

mod readme;

// README:BEGIN
use slate_redis::{MultiLock, RedisClient};

async fn transfer(redis_url: &str, from: u64, to: u64) -> slate_redis::Result<()> {
    let client = RedisClient::open(redis_url)?;
    let (a, b) = (format!("account:{from}"), format!("account:{to}"));
    // Both or neither, in any order: no deadlock with a transfer the other way.
    let accounts = MultiLock::builder(&client, [&a, &b]).build()?;
    let guard = accounts.lock().await?;
    let debit = guard.fencing_token(&a).expect("a name of the set"); // one token per name
    let credit = guard.fencing_token(&b).expect("a name of the set");
    move_money(debit.get(), credit.get()).await;
    guard.unlock().await?;
    Ok(())
}
// README:END

async fn move_money(debit: u64, credit: u64) {
    assert!(debit > 0 && credit > 0);
}

#[test]
fn the_readme_shows_this_code() {
    readme::assert_shown(
        include_str!("readme_multi.rs"),
        "readme_multi.rs",
        "multi-lock quickstart",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quickstart_runs() {
    let server = slate_cli::local::LocalServer::start().expect("redis-server");
    let url = server.url();
    // Two transfers the other way round at once: both finish.
    let (x, y) = tokio::join!(transfer(&url, 7, 9), transfer(&url, 9, 7));
    x.expect("7 to 9");
    y.expect("9 to 7");
}
