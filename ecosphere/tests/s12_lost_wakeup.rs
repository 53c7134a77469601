//! S12(b) (reliability.md 6.3): the lost-wakeup race, against Redis.
//!
//! A holds; B (another client: another local queue, its own subscription) calls
//! `try_lock_for` and is told *busy*; A releases at a random moment around B's failed attempt
//! and its subscription. B's spin wait is 30 s, so B may only acquire in time by a release
//! notification (or by the retry that follows confirming a new subscription): a lost wake-up
//! shows as a wait of 30 s, far above the bound asserted here. Repeated for up to 1,000 rounds
//! or 25 s, whichever comes first, with seeded release delays from 0 to 3 ms. Checked to fail
//! (B not woken) when the listener ignores release messages.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ecosphere::seed::Seed;
use ecosphere::server::RedisServer;
use slate_redis::{RedisClient, SingleLock};

/// A wait above this would be the spin wait, not a notification.
const BOUND: Duration = Duration::from_secs(2);

fn lock(client: &RedisClient) -> SingleLock {
    SingleLock::builder(client, "wakeup")
        .lease(Duration::from_secs(10))
        .spin_wait(Duration::from_secs(30))
        .build()
        .expect("lock")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s12b_a_release_racing_a_failed_attempt_is_never_lost() {
    let mut seed = Seed::for_scenario("S12(b) lost wake-up");
    let server = RedisServer::start().expect("redis-server");
    let (a, b) = (
        RedisClient::open(server.url()).expect("client"),
        RedisClient::open(server.url()).expect("client"),
    );
    let (la, lb) = (lock(&a), lock(&b));
    let until = Instant::now() + Duration::from_secs(25);
    let (mut rounds, mut worst) = (0u32, Duration::ZERO);
    while rounds < 1_000 && Instant::now() < until {
        let ga = la.lock().await.expect("A acquires a free lock");
        let lb2 = lb.clone();
        let waiter = tokio::spawn(async move {
            let start = Instant::now();
            let g = lb2.try_lock_for(Duration::from_secs(40)).await;
            (start.elapsed(), g)
        });
        // Release somewhere around B's first (failed) attempt and its subscription.
        let delay = Duration::from_micros(seed.below(3_000));
        let spin_until = Instant::now() + delay;
        while Instant::now() < spin_until {
            tokio::task::yield_now().await;
        }
        assert_eq!(ga.unlock().await.expect("A releases"), 0);
        let (waited, gb) = tokio::time::timeout(BOUND * 2, waiter)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "round {rounds}: B was not woken within {:?} (release after {delay:?})",
                    BOUND * 2
                )
            })
            .expect("waiter task");
        let gb = gb.expect("B acquires");
        assert!(
            waited < BOUND,
            "round {rounds}: B waited {waited:?} after a release {delay:?} into its wait"
        );
        worst = worst.max(waited);
        assert_eq!(gb.unlock().await.expect("B releases"), 0);
        rounds += 1;
    }
    println!("{rounds} rounds, worst wait {worst:?}");
    assert!(rounds >= 100, "only {rounds} rounds in the time bound");
}
