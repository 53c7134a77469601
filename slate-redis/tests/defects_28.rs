//! Issue 28 (correctness III), the single lock's part: failing-first tests, named after the
//! item they reproduce.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use slate_harness::undriven::Undriven;
use slate_redis::SingleLock;

/// Item 12: an attempt whose caller was dropped finishes in the background and, answered
/// busy, runs the `queue_drained` hook, which switched the lock's notifications off although a
/// task had queued meanwhile: that task then waited out its whole spin wait after the release.
/// The hook now does nothing while local tasks wait.
///
/// The window (the dropped attempt's answer handled after the task parked) is made
/// deterministic by dropping the attempt under a runtime that is not driven
/// ([`Undriven`]): its background task runs only when the test drives that runtime, after
/// the task parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i12_a_dropped_attempts_busy_answer_keeps_the_queued_tasks_notifications() {
    let server = server();
    let other = client(&server);
    let lease = Duration::from_secs(60);
    let held = lock(&other, "i12", lease).lock().await.unwrap();
    let ours = client(&server);
    let spin = Duration::from_secs(60);
    let lock = SingleLock::builder(&ours, "i12")
        .lease(lease)
        .spin_wait(spin)
        .build()
        .unwrap();
    // The client's connections (and their driver tasks) live on this runtime.
    assert!(lock.try_lock().await.unwrap().is_none());

    // An attempt starts, and is dropped in flight under a runtime that is not driven: its
    // background task waits there.
    let idle = Undriven::new();
    assert!(
        idle.drop_in_flight(lock.try_lock_for(Duration::from_secs(30)))
            .await,
        "the attempt was in flight"
    );

    // A task queues and parks, notifications on.
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.lock().await }
    });
    eventually(Duration::from_secs(5), "the waiter subscribed", || {
        server.subscribers("slate:{i12}:released").unwrap() == 1 && lock.local_waiters() == 1
    })
    .await;

    // Now the dropped attempt's busy answer is handled.
    idle.drive_until_idle(Duration::from_secs(5)).await;
    // An unsubscription would take effect after the notifier's linger (1 s).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        server.subscribers("slate:{i12}:released").unwrap(),
        1,
        "the dropped attempt's busy answer switched the queued task's notifications off"
    );

    let g = woken_by_the_release(held, waiter, Duration::from_secs(10), spin / 4).await;
    g.unlock().await.unwrap();
}
