//! The README's combination-lock quickstart, verbatim between the markers, run against three
//! real `redis-server`s; the test fails if the README's copy differs.

mod readme;

use std::sync::atomic::{AtomicU64, Ordering};

// README:BEGIN
use std::time::Duration;

use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};

async fn rebalance(urls: &[&str]) -> slate_combination::Result<()> {
    // The order of the URLs is the acquisition order; 2 of 3 nodes must be held.
    let nodes = NodeSet::connect(urls.iter().copied(), NodeSetOptions::default())?;
    let lock = CombinationLock::builder(&nodes, "rebalance").build()?;
    let guard = lock.try_lock_for(Duration::from_secs(5)).await?; // Error::Timeout after 5 s
    tokio::select! {
        () = move_shards(guard.fencing_token().get()) => {}
        reason = guard.lost() => eprintln!("lease lost ({reason}): stop writing"),
    }
    guard.unlock().await?;
    Ok(())
}
// README:END

static MOVED: AtomicU64 = AtomicU64::new(0);

async fn move_shards(token: u64) {
    MOVED.store(token, Ordering::SeqCst);
}

#[test]
fn the_readme_shows_this_code() {
    readme::assert_shown(
        include_str!("readme_combination.rs"),
        "readme_combination.rs",
        "combination quickstart",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quickstart_runs() {
    let servers = slate_cli::local::LocalServer::start_many(3).expect("redis-servers");
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    // Fresh servers: declare them adopted, as the README says a new deployment does.
    let nodes = NodeSet::connect(urls.clone(), NodeSetOptions::default()).expect("nodes");
    assert_eq!(nodes.adopt_fresh_servers("slate:").await.expect("adopt"), 3);
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    rebalance(&refs).await.expect("quickstart");
    assert!(MOVED.load(Ordering::SeqCst) > 0);
}
