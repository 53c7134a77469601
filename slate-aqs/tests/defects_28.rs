//! Correctness III (issue 28): the synchronizer's defects, each with a test named after its item
//! that fails on the code before the fix.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use slate_aqs::Synchronizer;
use slate_aqs::testing::{self, Behavior, MemoryCompetitor, MemoryRemote};
use slate_core::{HolderId, Wait};

/// Item 11: a head passed the hold checks the remote (`Competitor::take_pass`) outside the
/// lock, then records the pass under it. An immediate attempt still in flight from before can
/// be granted in between (the passing hold's remote lease ended, the remote granted it): it
/// displaces the passing owner and takes the pass back from the head. The head then recorded
/// a pass that no longer existed (`unreachable!`, a panic). It now re-checks under the lock,
/// gives the stale pass back (`abandon`) and goes on waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i11_a_displacing_grant_while_a_pass_is_taken_does_not_panic() {
    let remote = MemoryRemote::new();
    let competitor = MemoryCompetitor::new(remote.clone());
    competitor.set_pass_budget(2);
    let sync = Arc::new(Synchronizer::new(
        "i11",
        competitor,
        Duration::from_millis(5),
    ));
    testing::subscribe(&sync);
    let (t, o, h) = (HolderId::new(), HolderId::new(), HolderId::new());
    // T's immediate attempt looks at the remote only after 300 ms.
    sync.competitor()
        .script([Behavior::Slow(Duration::from_millis(300))]);
    let (done_tx, done_rx) = mpsc::channel();
    let try_t = tokio::spawn({
        let sync = sync.clone();
        async move {
            let r = sync.acquire(t, Wait::Immediate).await;
            let _ = done_tx.send(());
            r
        }
    });
    let started = Instant::now();
    while sync.competitor().stats().attempts < 1 {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "T's attempt started"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // X holds; O and H queue behind it. When X releases, O takes the lock as the head with H
    // behind it: a passable hold.
    let x = HolderId::new();
    sync.acquire(x, Wait::Forever).await.unwrap();
    let wait_o = tokio::spawn({
        let sync = sync.clone();
        async move { sync.acquire_passable(o, Wait::Forever).await }
    });
    while sync.waiters() < 1 {
        assert!(started.elapsed() < Duration::from_secs(2), "O queued");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let wait_h = tokio::spawn({
        let sync = sync.clone();
        async move { sync.acquire_passable(h, Wait::Forever).await }
    });
    while sync.waiters() < 2 {
        assert!(started.elapsed() < Duration::from_secs(2), "H queued");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(testing::release(&sync, x).unwrap(), 0);
    let go = tokio::time::timeout(Duration::from_secs(2), wait_o)
        .await
        .expect("O gets the lock")
        .unwrap()
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "set up before T's attempt lands"
    );
    // When H takes the pass, O's remote hold has just ended (its lease lapsed), and T's
    // attempt lands and is granted before H records the pass.
    let o_remote = go.holder;
    let remote_in_hook = remote.clone();
    let done_rx = std::sync::Mutex::new(done_rx);
    sync.competitor().set_take_pass_hook(move || {
        let _ = remote_in_hook.release_silently(o_remote);
        let _ = done_rx.lock().unwrap().recv_timeout(Duration::from_secs(2));
    });
    assert_eq!(testing::release(&sync, o).unwrap(), 0, "O passes its hold");
    let gt = tokio::time::timeout(Duration::from_secs(3), try_t)
        .await
        .expect("T's try ends")
        .unwrap()
        .expect("T was granted: the remote was free when its attempt landed");
    assert_eq!(remote.holder(), Some((gt.holder, 1)));
    while sync.competitor().stats().passes_taken < 1 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "H took the pass"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // H records the pass next (or, seeing it taken back, gives it back: `abandon`).
    while !wait_h.is_finished() && sync.competitor().stats().abandoned < 1 {
        assert!(started.elapsed() < Duration::from_secs(5), "H went on");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // H neither panicked nor holds: it waits for T.
    assert!(!wait_h.is_finished(), "H waits behind T");
    assert_eq!(testing::release(&sync, t).unwrap(), 0);
    let gh = tokio::time::timeout(Duration::from_secs(3), wait_h)
        .await
        .expect("H gets the lock after T")
        .expect("H did not panic")
        .unwrap();
    assert_eq!(remote.holder(), Some((gh.holder, 1)));
    testing::release(&sync, h).unwrap();
}

/// Item 13: a waiter kept the retry state of its own busy entry attempt while it waited
/// behind the head, and used it when it became head: it prepared to wait and parked a full
/// spin wait from then on, although nothing said the lock was still busy (the head it
/// replaced had left on its deadline, and the remote holder had released without a
/// notification reaching this process). Here the spin wait is 10 s: before, B waited it out;
/// a waiter that becomes head now attempts at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i13_a_new_head_does_not_inherit_a_stale_retry_state() {
    let remote = MemoryRemote::new();
    let competitor = MemoryCompetitor::new(remote.clone());
    let sync = Arc::new(Synchronizer::new(
        "i13",
        competitor,
        Duration::from_secs(10),
    ));
    let r = HolderId::new();
    remote.try_acquire(r).expect("R holds");
    // A and B both find the queue empty and attempt at once: both busy, both queue, A first.
    sync.competitor().script([
        Behavior::Slow(Duration::from_millis(50)),
        Behavior::Slow(Duration::from_millis(100)),
    ]);
    let wait_a = tokio::spawn({
        let sync = sync.clone();
        async move {
            sync.acquire(
                HolderId::new(),
                Wait::for_duration(Duration::from_millis(500)),
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let b = HolderId::new();
    let wait_b = tokio::spawn({
        let sync = sync.clone();
        async move { sync.acquire(b, Wait::Forever).await }
    });
    let started = Instant::now();
    while sync.waiters() < 2 {
        assert!(started.elapsed() < Duration::from_secs(2), "A and B queued");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The lock is free, and nobody here is told.
    remote.release_silently(r).unwrap();
    assert!(wait_a.await.unwrap().is_err(), "A's deadline ends its wait");
    let granted = tokio::time::timeout(Duration::from_secs(3), wait_b)
        .await
        .expect("B, the new head, attempts at once instead of a 10 s spin wait")
        .unwrap()
        .unwrap();
    assert_eq!(granted.holder, b);
}
