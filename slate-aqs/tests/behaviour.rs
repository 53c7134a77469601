//! The synchronizer's behaviour, scenario by scenario, on tokio's paused clock where time
//! matters (so counts and orders are exact, and no test sleeps and hopes).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use common::{Flag, Manual, new_sync, paused, spawn_acquire, until, with_watchdog, within};
use slate_aqs::testing::{self, Behavior, MemoryCompetitor, MemoryGrant, MemoryRemote};
use slate_aqs::{Attempt, Competitor, Notifications, Synchronizer};
use slate_core::{Error, HolderId, Result, TimeoutKind, Wait};
use tokio::time::{Instant, sleep, timeout};

const SPIN: Duration = Duration::from_millis(50);
const HOUR: Duration = Duration::from_secs(3600);
const LIMIT: Duration = Duration::from_secs(10);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn until_instant(d: Duration) -> Wait {
    Wait::Until((Instant::now() + d).into_std())
}

#[test]
fn fast_path_attempts_once_and_records_the_owner() {
    paused(|| async move {
        let (remote, sync) = new_sync(SPIN);
        let me = HolderId::new();
        let grant = within(sync.acquire(me, Wait::Forever)).await.unwrap();
        assert_eq!(
            grant,
            MemoryGrant {
                holder: me,
                count: 1,
                passed: false,
                shared: false,
            }
        );
        assert_eq!(sync.owner(), Some((me, 1)));
        assert_eq!(remote.holder(), Some((me, 1)));
        let s = sync.competitor().stats();
        assert_eq!((s.attempts, s.after_acquire, s.prepare_wait), (1, 1, 0));
        assert_eq!(sync.waiters(), 0);

        testing::release(&sync, me).unwrap();
        assert_eq!(sync.owner(), None);
        assert_eq!(remote.holder(), None);
        assert_eq!(sync.competitor().stats().after_release, 1);
    });
}

#[test]
fn reentry_does_not_queue_and_counts_depth() {
    paused(|| async move {
        let (_remote, sync) = new_sync(SPIN);
        let (a, b) = (HolderId::new(), HolderId::new());
        within(sync.acquire(a, Wait::Forever)).await.unwrap();
        let waiter = spawn_acquire(&sync, b, Wait::Forever);
        until("b queued", LIMIT, || sync.waiters() == 1).await;

        // Queueing behind `b` would deadlock: `b` waits for `a`.
        let again = timeout(ms(1), sync.acquire(a, Wait::Forever))
            .await
            .expect("a re-entry queued behind a waiter")
            .unwrap();
        assert_eq!(again.count, 2);
        assert_eq!(sync.owner(), Some((a, 2)));
        assert_eq!(sync.waiters(), 1);

        testing::release(&sync, a).unwrap();
        assert_eq!(sync.owner(), Some((a, 1)));
        assert_eq!(sync.competitor().stats().after_release, 0);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "woken while the outer level is held");

        testing::release(&sync, a).unwrap();
        let granted = timeout(ms(1), waiter).await.unwrap().unwrap().unwrap();
        assert_eq!(granted.holder, b);
        let s = sync.competitor().stats();
        assert_eq!((s.after_acquire, s.after_release), (3, 1));
    });
}

#[test]
fn grants_follow_arrival_order() {
    paused(|| async move {
        let (_remote, sync) = new_sync(SPIN);
        let first = HolderId::new();
        within(sync.acquire(first, Wait::Forever)).await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..20 {
            let (sync2, order2) = (Arc::clone(&sync), Arc::clone(&order));
            // Every third waiter has a (distant) deadline: timed waits queue like the others.
            let wait = if i % 3 == 0 {
                until_instant(HOUR)
            } else {
                Wait::Forever
            };
            tasks.push(tokio::spawn(async move {
                let me = HolderId::new();
                within(sync2.acquire(me, wait)).await.unwrap();
                order2.lock().unwrap().push(i);
                tokio::task::yield_now().await;
                testing::release(&sync2, me).unwrap();
            }));
            until("queued", LIMIT, || sync.waiters() == i + 1).await;
        }
        testing::release(&sync, first).unwrap();
        for t in tasks {
            within(t).await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), (0..20).collect::<Vec<_>>());
        assert_eq!((sync.waiters(), sync.owner()), (0, None));
        assert_eq!(sync.competitor().stats().queue_drained, 1);
        assert_eq!(sync.check_invariants(), Ok(()));
    });
}

#[test]
fn immediate_is_locally_busy_without_a_remote_call() {
    paused(|| async move {
        let (_remote, sync) = new_sync(SPIN);
        let (a, b) = (HolderId::new(), HolderId::new());
        within(sync.acquire(a, Wait::Forever)).await.unwrap();
        let err = within(sync.acquire(b, Wait::Immediate)).await.unwrap_err();
        match err {
            Error::Busy {
                lock, retry_after, ..
            } => {
                assert_eq!(&*lock, "test-lock");
                // The busy path shares the synchronizer's name instead of copying it.
                assert_eq!(lock.as_ptr(), sync.label().as_ptr(), "Busy copied the name");
                assert_eq!(retry_after, None);
            }
            other => panic!("expected Busy, got {other}"),
        }
        assert_eq!(sync.competitor().stats().attempts, 1, "no remote call");
        assert_eq!(sync.waiters(), 0);
    });
}

#[test]
fn immediate_reports_remote_busy_with_retry_after() {
    paused(|| async move {
        let (remote, sync) = new_sync(SPIN);
        remote.try_acquire(HolderId::new());
        sync.competitor()
            .set_retry_after(Some(Duration::from_secs(3)));
        let err = sync
            .acquire(HolderId::new(), Wait::Immediate)
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::Busy { retry_after: Some(d), .. } if d == Duration::from_secs(3)),
            "{err:?}"
        );
        let s = sync.competitor().stats();
        assert_eq!((s.attempts, s.prepare_wait), (1, 0), "one attempt, no wait");
        assert_eq!(sync.waiters(), 0);
    });
}

#[test]
fn immediate_barges_ahead_of_queued_waiters() {
    paused(|| async move {
        let (remote, sync) = new_sync(HOUR);
        let outsider = HolderId::new();
        remote.try_acquire(outsider);
        let head = spawn_acquire(&sync, HolderId::new(), Wait::Forever);
        until("head parked", LIMIT, || {
            sync.competitor().stats().prepare_wait == 1
        })
        .await;
        // The head parks on its one-hour timer and hears nothing of this release.
        remote.release_silently(outsider).unwrap();

        let barger = HolderId::new();
        within(sync.acquire(barger, Wait::Immediate)).await.unwrap();
        assert_eq!(sync.owner(), Some((barger, 1)));
        assert_eq!(sync.waiters(), 1);

        // The barger's local release wakes the head.
        testing::release(&sync, barger).unwrap();
        timeout(ms(1), head).await.unwrap().unwrap().unwrap();
    });
}

#[test]
fn timed_acquire_waits_in_the_queue() {
    paused(|| async move {
        // Bedrock C4: a timed tryLock behind another waiter gave up at once.
        let (_remote, sync) = new_sync(SPIN);
        let (a, b, c) = (HolderId::new(), HolderId::new(), HolderId::new());
        within(sync.acquire(a, Wait::Forever)).await.unwrap();
        let tb = spawn_acquire(&sync, b, Wait::Forever);
        until("b queued", LIMIT, || sync.waiters() == 1).await;
        let tc = spawn_acquire(&sync, c, until_instant(Duration::from_secs(1)));
        until("c queued", LIMIT, || sync.waiters() == 2).await;

        sleep(ms(100)).await;
        testing::release(&sync, a).unwrap();
        within(tb).await.unwrap().unwrap();
        sleep(ms(100)).await;
        testing::release(&sync, b).unwrap();
        let granted = within(tc).await.unwrap().unwrap();
        assert_eq!(granted.holder, c);
    });
}

#[test]
fn a_timed_out_waiter_leaves_the_queue_intact() {
    paused(|| async move {
        // Bedrock C4 again: the timed-out node poisoned the queue for everyone behind it.
        let (_remote, sync) = new_sync(SPIN);
        let (a, b, c) = (HolderId::new(), HolderId::new(), HolderId::new());
        within(sync.acquire(a, Wait::Forever)).await.unwrap();
        let tb = spawn_acquire(&sync, b, until_instant(ms(50)));
        until("b queued", LIMIT, || sync.waiters() == 1).await;
        let tc = spawn_acquire(&sync, c, Wait::Forever);
        until("c queued", LIMIT, || sync.waiters() == 2).await;

        match within(tb).await.unwrap().unwrap_err() {
            Error::Timeout {
                lock,
                kind,
                budget,
                elapsed,
                ..
            } => {
                assert_eq!(&*lock, "test-lock");
                assert_eq!(kind, TimeoutKind::Wait);
                assert_eq!(budget, ms(50));
                assert!(elapsed >= ms(50), "{elapsed:?}");
            }
            other => panic!("expected a timeout, got {other}"),
        }
        assert_eq!(sync.waiters(), 1);
        testing::release(&sync, a).unwrap();
        assert_eq!(within(tc).await.unwrap().unwrap().holder, c);
        assert_eq!(sync.check_invariants(), Ok(()));
    });
}

#[test]
fn a_parked_head_retries_at_the_spin_wait_not_in_a_busy_loop() {
    paused(|| async move {
        // Bedrock M3: the timed path polled every microsecond.
        let (remote, sync) = new_sync(SPIN);
        let outsider = HolderId::new();
        remote.try_acquire(outsider);
        let w = spawn_acquire(&sync, HolderId::new(), Wait::Forever);
        sleep(Duration::from_secs(1)).await;
        let attempts = sync.competitor().stats().attempts;
        // One at 0 ms, then one every 50 ms.
        assert!((20..=22).contains(&attempts), "{attempts} attempts in 1 s");

        remote.release_silently(outsider).unwrap();
        let t0 = Instant::now();
        within(w).await.unwrap().unwrap();
        assert!(t0.elapsed() <= SPIN, "took {:?}", t0.elapsed());
    });
}

#[test]
fn retry_after_shortens_the_park() {
    paused(|| async move {
        let (remote, sync) = new_sync(HOUR);
        sync.competitor().set_retry_after(Some(ms(5)));
        remote.try_acquire(HolderId::new());
        let _w = spawn_acquire(&sync, HolderId::new(), Wait::Forever);
        sleep(ms(100)).await;
        let attempts = sync.competitor().stats().attempts;
        assert!(
            (20..=22).contains(&attempts),
            "{attempts} attempts in 100 ms"
        );
    });
}

#[test]
fn a_zero_retry_after_is_floored_at_the_minimum_delay() {
    // Without the floor the head would retry without ever letting the clock move: the
    // watchdog turns that hang into a failure.
    with_watchdog(Duration::from_secs(20), || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let (remote, sync) = new_sync(HOUR);
            sync.competitor().set_retry_after(Some(Duration::ZERO));
            remote.try_acquire(HolderId::new());
            let _w = spawn_acquire(&sync, HolderId::new(), Wait::Forever);
            sleep(ms(100)).await;
            let attempts = sync.competitor().stats().attempts;
            assert!(
                (90..=102).contains(&attempts),
                "{attempts} attempts in 100 ms"
            );
        });
    });
}

#[test]
fn a_release_notification_wakes_the_parked_head() {
    paused(|| async move {
        let (remote, sync) = new_sync(HOUR);
        sync.competitor().set_notifications(Notifications::Live);
        testing::subscribe(&sync);
        let outsider = HolderId::new();
        remote.try_acquire(outsider);
        let w = spawn_acquire(&sync, HolderId::new(), Wait::Forever);
        until("head parked", LIMIT, || {
            sync.competitor().stats().prepare_wait == 1
        })
        .await;
        sleep(ms(10)).await;
        remote.release(outsider).unwrap(); // publishes
        timeout(ms(1), w)
            .await
            .expect("the head slept through the notification")
            .unwrap()
            .unwrap();
        assert_eq!(sync.competitor().stats().attempts, 2);
    });
}

#[test]
fn a_notification_while_the_attempt_is_in_flight_is_not_lost() {
    paused(|| async move {
        let (remote, sync) = new_sync(HOUR);
        sync.competitor().set_notifications(Notifications::Live);
        testing::subscribe(&sync);
        let outsider = HolderId::new();
        remote.try_acquire(outsider);
        // The first attempt is answered "busy" 10 ms after it was decided.
        sync.competitor().script([Behavior::SlowBusy(ms(10))]);
        let w = spawn_acquire(&sync, HolderId::new(), Wait::Forever);
        sleep(ms(5)).await;
        remote.release(outsider).unwrap(); // the notification arrives mid-attempt
        timeout(ms(20), w)
            .await
            .expect("the head parked although a release was announced during its attempt")
            .unwrap()
            .unwrap();
        let s = sync.competitor().stats();
        assert_eq!((s.attempts, s.prepare_wait), (2, 1));
    });
}

#[test]
fn started_notifications_retry_once_at_once() {
    paused(|| async move {
        let (remote, sync) = new_sync(HOUR);
        sync.competitor().set_notifications(Notifications::Started);
        remote.try_acquire(HolderId::new());
        let _w = spawn_acquire(&sync, HolderId::new(), Wait::Forever);
        until("the immediate retry", LIMIT, || {
            sync.competitor().stats().prepare_wait == 2
        })
        .await;
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        // busy → Started → retry at once → busy → Started again → park (no hot loop).
        let s = sync.competitor().stats();
        assert_eq!((s.attempts, s.prepare_wait), (2, 2));
    });
}

#[test]
fn a_local_release_wakes_the_head() {
    paused(|| async move {
        let (_remote, sync) = new_sync(HOUR);
        let (a, b) = (HolderId::new(), HolderId::new());
        within(sync.acquire(a, Wait::Forever)).await.unwrap();
        let w = spawn_acquire(&sync, b, Wait::Forever);
        until("b queued", LIMIT, || sync.waiters() == 1).await;
        sleep(ms(10)).await;
        testing::release(&sync, a).unwrap();
        timeout(ms(1), w).await.unwrap().unwrap().unwrap();
    });
}

#[test]
fn a_failed_attempt_passes_the_turn_on() {
    paused(|| async move {
        let (_remote, sync) = new_sync(SPIN);
        let a = HolderId::new();
        within(sync.acquire(a, Wait::Forever)).await.unwrap();
        let w1 = spawn_acquire(&sync, HolderId::new(), Wait::Forever);
        until("w1 queued", LIMIT, || sync.waiters() == 1).await;
        let w2 = spawn_acquire(&sync, HolderId::new(), Wait::Forever);
        until("w2 queued", LIMIT, || sync.waiters() == 2).await;
        sync.competitor().script([Behavior::Fail]);
        testing::release(&sync, a).unwrap();
        assert!(within(w1).await.unwrap().unwrap_err().is_backend());
        timeout(ms(1), w2).await.unwrap().unwrap().unwrap();
        assert_eq!(sync.waiters(), 0);
    });
}

#[test]
fn the_queue_drained_hook_runs_when_the_last_waiter_leaves() {
    paused(|| async move {
        let (_remote, sync) = new_sync(SPIN);
        let a = HolderId::new();
        within(sync.acquire(a, Wait::Forever)).await.unwrap();
        let w = spawn_acquire(&sync, HolderId::new(), Wait::Forever);
        until("queued", LIMIT, || sync.waiters() == 1).await;
        assert_eq!(sync.competitor().stats().queue_drained, 0);
        w.abort();
        until("cancelled", LIMIT, || sync.waiters() == 0).await;
        assert_eq!(sync.competitor().stats().queue_drained, 1);
    });
}

/// A caller that attempted on the fast path (nobody queued) and ends without a grant runs the
/// hook too: its busy answer may have given the process a place in the backend's queue (a
/// ZooKeeper contender) that nobody would claim. Before, only queued callers' exits did.
#[test]
fn a_fast_path_attempt_that_ends_without_a_grant_runs_the_queue_drained_hook() {
    paused(|| async move {
        let (_remote, sync) = new_sync(SPIN);
        // Busy past its deadline.
        sync.competitor().script([Behavior::SlowBusy(ms(20))]);
        let e = within(sync.acquire(HolderId::new(), until_instant(ms(5))))
            .await
            .unwrap_err();
        assert!(e.is_timeout(), "{e}");
        assert_eq!(sync.competitor().stats().queue_drained, 1);
        // Failed.
        sync.competitor().script([Behavior::Fail]);
        let e = within(sync.acquire(HolderId::new(), Wait::Forever))
            .await
            .unwrap_err();
        assert!(e.is_backend(), "{e}");
        assert_eq!(sync.competitor().stats().queue_drained, 2);
        assert_eq!(sync.waiters(), 0);
    });
}

/// An attempt finished in the background after its caller was dropped runs the hook when it
/// ends busy, whatever the queue holds (the backend checks).
#[test]
fn an_abandoned_attempt_that_ends_busy_runs_the_queue_drained_hook() {
    paused(|| async move {
        let (_remote, sync) = new_sync(SPIN);
        sync.competitor().script([Behavior::SlowBusy(ms(20))]);
        let w = spawn_acquire(&sync, HolderId::new(), Wait::Forever);
        tokio::time::sleep(ms(5)).await;
        w.abort();
        until("the background attempt answered", LIMIT, || {
            sync.competitor().stats().queue_drained >= 1
        })
        .await;
        assert_eq!(sync.waiters(), 0);
    });
}

#[test]
fn a_woken_head_that_is_dropped_passes_its_wake_up_on() {
    paused(|| async move {
        let (_remote, sync) = new_sync(HOUR);
        let a = HolderId::new();
        within(sync.acquire(a, Wait::Forever)).await.unwrap();
        let mut first = Manual::new(sync.acquire(HolderId::new(), Wait::Forever));
        let mut second = Manual::new(sync.acquire(HolderId::new(), Wait::Forever));
        assert!(first.poll().is_pending());
        assert!(second.poll().is_pending());
        assert_eq!(sync.waiters(), 2);

        testing::release(&sync, a).unwrap();
        assert!(first.woken(), "the release wakes the head");
        assert!(!second.woken());
        drop(first); // woken, never ran
        assert!(
            second.woken(),
            "the dropped head's wake-up was not passed on"
        );
        assert!(second.poll().is_ready());
        assert_eq!(sync.waiters(), 0);
    });
}

#[test]
fn a_grant_displaces_an_owner_whose_remote_hold_ended() {
    paused(|| async move {
        let (remote, sync) = new_sync(SPIN);
        let (a, b) = (HolderId::new(), HolderId::new());
        // b's fast-path attempt is on the wire for 10 ms.
        sync.competitor().script([Behavior::Slow(ms(10))]);
        let tb = spawn_acquire(&sync, b, Wait::Forever);
        tokio::task::yield_now().await;
        // a barges in meanwhile, then releases remotely; its local release is late.
        within(sync.acquire(a, Wait::Immediate)).await.unwrap();
        sleep(ms(5)).await;
        remote.release(a).unwrap();
        within(tb).await.unwrap().unwrap();
        assert_eq!(sync.owner(), Some((b, 1)));
        assert_eq!(sync.competitor().stats().after_release, 1, "a's hold ended");
        sync.release(a); // late, ignored
        assert_eq!(sync.owner(), Some((b, 1)));
        assert_eq!(sync.competitor().stats().after_release, 1);
    });
}

#[test]
fn a_release_by_a_non_owner_is_ignored() {
    paused(|| async move {
        let (_remote, sync) = new_sync(SPIN);
        let a = HolderId::new();
        within(sync.acquire(a, Wait::Forever)).await.unwrap();
        sync.release(HolderId::new());
        assert_eq!(sync.owner(), Some((a, 1)));
        assert_eq!(sync.competitor().stats().after_release, 0);
    });
}

#[test]
fn a_reentry_that_finds_another_holder_reports_the_lease_lost() {
    paused(|| async move {
        let (remote, sync) = new_sync(SPIN);
        let a = HolderId::new();
        within(sync.acquire(a, Wait::Forever)).await.unwrap();
        // a's lease ran out and someone else took the lock.
        remote.release_silently(a).unwrap();
        remote.try_acquire(HolderId::new());
        let err = within(sync.acquire(a, Wait::Forever)).await.unwrap_err();
        assert!(err.is_lease_lost(), "{err}");
        let err = within(sync.acquire(a, Wait::Immediate)).await.unwrap_err();
        assert!(err.is_lease_lost(), "{err}");
        assert_eq!(sync.owner(), Some((a, 1)), "local accounting untouched");
        assert_eq!(sync.waiters(), 0);
    });
}

/// Issue 19, defect 4: a re-entry after the remote hold vanished (nobody took the lock) was
/// granted as one more level; the competitor's `reenter` is now used for it and reports the
/// loss, and the local depth stays.
#[test]
fn a_reentry_after_the_hold_vanished_reports_the_lease_lost() {
    paused(|| async move {
        let (remote, sync) = new_sync(SPIN);
        let a = HolderId::new();
        within(sync.acquire(a, Wait::Forever)).await.unwrap();
        remote.release_silently(a).unwrap();
        let err = within(sync.acquire(a, Wait::Forever)).await.unwrap_err();
        assert!(err.is_lease_lost(), "{err}");
        assert_eq!(remote.holder(), None, "no hold was created");
        assert_eq!(sync.owner(), Some((a, 1)), "local accounting untouched");
        // A fresh holder still queues behind the local owner, and gets the lock once it
        // releases.
        assert!(testing::release(&sync, a).unwrap_err().is_not_held());
        within(sync.acquire(HolderId::new(), Wait::Forever))
            .await
            .unwrap();
    });
}

#[test]
fn an_attempt_in_flight_at_the_deadline_is_not_interrupted() {
    paused(|| async move {
        let (_remote, sync) = new_sync(SPIN);
        sync.competitor().script([Behavior::Slow(ms(50))]);
        let t0 = Instant::now();
        let me = HolderId::new();
        sync.acquire(me, until_instant(ms(10))).await.unwrap();
        assert!(t0.elapsed() >= ms(50));
        assert_eq!(sync.owner(), Some((me, 1)));
    });
}

#[test]
fn a_deadline_already_passed_still_makes_one_attempt() {
    paused(|| async move {
        let (remote, sync) = new_sync(SPIN);
        let now = Wait::Until(Instant::now().into_std());
        let me = HolderId::new();
        within(sync.acquire(me, now)).await.unwrap();
        testing::release(&sync, me).unwrap();

        remote.try_acquire(HolderId::new());
        let err = within(sync.acquire(me, now)).await.unwrap_err();
        assert!(err.is_timeout(), "{err}");
        let s = sync.competitor().stats();
        assert_eq!((s.attempts, s.prepare_wait), (2, 0));
        assert_eq!(sync.waiters(), 0);
    });
}

#[test]
fn a_deadline_while_parked_as_head_times_out() {
    paused(|| async move {
        let (remote, sync) = new_sync(SPIN);
        remote.try_acquire(HolderId::new());
        let t0 = Instant::now();
        let err = sync
            .acquire(HolderId::new(), until_instant(ms(120)))
            .await
            .unwrap_err();
        assert!(err.is_timeout(), "{err}");
        assert_eq!(t0.elapsed(), ms(120), "the deadline caps the spin timer");
        // At 0, 50 and 100 ms.
        assert_eq!(sync.competitor().stats().attempts, 3);
        assert_eq!(sync.waiters(), 0);
    });
}

#[test]
fn debug_shows_label_owner_and_waiters() {
    paused(|| async move {
        let (_remote, sync) = new_sync(SPIN);
        let text = format!("{sync:?}");
        assert!(
            text.contains("test-lock") && text.contains("waiters: 0"),
            "{text}"
        );
    });
}

// ---- blocking twins ----

#[test]
fn blocking_acquire_from_plain_threads_excludes_and_hands_over() {
    with_watchdog(Duration::from_secs(30), || {
        let (remote, sync) = new_sync(ms(5));
        let inside = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (sync, inside, count) = (sync.clone(), inside.clone(), count.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let me = HolderId::new();
                        sync.blocking_acquire(me, Wait::Forever).unwrap();
                        assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                        count.fetch_add(1, Ordering::SeqCst);
                        inside.store(false, Ordering::SeqCst);
                        testing::release(&sync, me).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(count.load(Ordering::SeqCst), 200);
        assert_eq!(
            (sync.owner(), sync.waiters(), remote.holder()),
            (None, 0, None)
        );
    });
}

#[test]
fn blocking_acquire_times_out_on_a_plain_thread() {
    with_watchdog(Duration::from_secs(10), || {
        let (remote, sync) = new_sync(ms(5));
        remote.try_acquire(HolderId::new());
        let err = sync
            .blocking_acquire(HolderId::new(), Wait::for_duration(ms(30)))
            .unwrap_err();
        assert!(err.is_timeout(), "{err}");
        assert!(
            sync.competitor().stats().attempts >= 2,
            "retried on its timer"
        );
        assert_eq!(sync.waiters(), 0);
    });
}

#[test]
fn a_blocked_thread_is_woken_by_a_release_on_another_thread() {
    with_watchdog(Duration::from_secs(10), || {
        // A one-hour spin wait: only the release's wake-up can end the wait in time.
        let (_remote, sync) = new_sync(HOUR);
        let a = HolderId::new();
        sync.blocking_acquire(a, Wait::Forever).unwrap();
        let sync2 = sync.clone();
        let t = std::thread::spawn(move || sync2.blocking_acquire(HolderId::new(), Wait::Forever));
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while sync.waiters() == 0 {
            assert!(std::time::Instant::now() < deadline, "never queued");
            std::thread::yield_now();
        }
        testing::release(&sync, a).unwrap();
        t.join().unwrap().unwrap();
    });
}

#[test]
fn blocking_acquire_enters_the_runtime_captured_at_new() {
    with_watchdog(Duration::from_secs(10), || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        // Built inside the runtime: the handle is captured.
        let (_remote, sync) = rt.block_on(async { new_sync(ms(5)) });
        // This attempt sleeps on tokio's timer: it needs the captured runtime.
        sync.competitor().script([Behavior::Slow(ms(5))]);
        let sync2 = sync.clone();
        std::thread::spawn(move || sync2.blocking_acquire(HolderId::new(), Wait::Forever))
            .join()
            .unwrap()
            .unwrap();
    });
}

#[tokio::test]
#[should_panic(expected = "blocking_acquire called from inside an async runtime")]
async fn blocking_acquire_panics_inside_a_runtime() {
    let (_remote, sync) = new_sync(SPIN);
    let _ = sync.blocking_acquire(HolderId::new(), Wait::Forever);
}

// ---- hooks never run under the internal lock ----

/// Delegates to a `MemoryCompetitor`, and in every hook reads the synchronizer (which locks
/// its state): a hook called under the state lock deadlocks, and the watchdog fails the test.
struct Probe {
    inner: MemoryCompetitor,
    sync: OnceLock<Weak<Synchronizer<Probe>>>,
    probes: AtomicU64,
}

impl Probe {
    fn probe(&self) {
        if let Some(sync) = self.sync.get().and_then(Weak::upgrade) {
            let _ = (sync.waiters(), sync.owner());
            self.probes.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Competitor for Probe {
    type Grant = MemoryGrant;

    fn attempt(
        &self,
        holder: HolderId,
    ) -> impl Future<Output = Result<Attempt<MemoryGrant>>> + Send + 'static {
        self.inner.attempt(holder)
    }

    fn after_acquire(&self, holder: HolderId, grant: &MemoryGrant) {
        self.probe();
        self.inner.after_acquire(holder, grant);
    }

    fn after_release(&self, holder: HolderId) {
        self.probe();
        self.inner.after_release(holder);
    }

    fn abandon(&self, holder: HolderId, grant: MemoryGrant) {
        self.probe();
        self.inner.abandon(holder, grant);
    }

    fn queue_drained(&self) {
        self.probe();
        self.inner.queue_drained();
    }
}

#[test]
fn hooks_never_run_under_the_internal_lock() {
    with_watchdog(Duration::from_secs(10), || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let remote = MemoryRemote::new();
            let sync = Arc::new(Synchronizer::new(
                "probe",
                Probe {
                    inner: MemoryCompetitor::new(remote.clone()),
                    sync: OnceLock::new(),
                    probes: AtomicU64::new(0),
                },
                SPIN,
            ));
            let _ = sync.competitor().sync.set(Arc::downgrade(&sync));
            let release = |h| {
                remote.release(h).unwrap();
                sync.release(h);
            };
            let (a, b) = (HolderId::new(), HolderId::new());
            within(sync.acquire(a, Wait::Forever)).await.unwrap(); // after_acquire
            let s2 = sync.clone();
            let tb = tokio::spawn(async move { s2.acquire(b, Wait::Forever).await });
            until("b queued", LIMIT, || sync.waiters() == 1).await;
            release(a); // after_release
            within(tb).await.unwrap().unwrap(); // after_acquire + queue_drained
            release(b); // after_release
            // abandon: a slow attempt whose acquire future is dropped mid-flight
            sync.competitor().inner.script([Behavior::Slow(ms(10))]);
            let c = HolderId::new();
            assert!(
                timeout(ms(1), sync.acquire(c, Wait::Forever))
                    .await
                    .is_err()
            );
            until("abandoned", LIMIT, || {
                sync.competitor().inner.stats().abandoned == 1
            })
            .await;
            assert_eq!(sync.competitor().probes.load(Ordering::SeqCst), 6);
            assert_eq!(remote.holder(), None);
        });
    });
}

#[test]
fn flag_waker_helper_records_wakes() {
    // The manual-poll helper the cancellation tests rely on must itself be able to fail.
    let flag = Arc::new(Flag::default());
    assert!(!flag.take());
    std::task::Waker::from(flag.clone()).wake();
    assert!(flag.take());
    assert!(!flag.take());
}

/// The shared deadline timer: waiters queued behind a holder with deadlines in any order time
/// out each at its own deadline (tokio's paused clock: exactly), in deadline order, while an
/// untimed waiter among them keeps its place; one task serves them all and finishes when the
/// last timed waiter has left.
#[test]
fn queued_deadlines_fire_in_order_from_one_shared_timer() {
    paused(|| async move {
        let (_remote, sync) = new_sync(SPIN);
        let owner = HolderId::new();
        within(sync.acquire(owner, Wait::Forever)).await.unwrap();
        let start = Instant::now();
        let mut timed = Vec::new();
        let mut plain = None;
        for (i, after) in [300u64, 100, 0, 200, 400].into_iter().enumerate() {
            let holder = HolderId::new();
            if after == 0 {
                plain = Some((holder, spawn_acquire(&sync, holder, Wait::Forever)));
            } else {
                let task = spawn_acquire(&sync, holder, until_instant(ms(after)));
                let sync = sync.clone();
                timed.push((
                    after,
                    tokio::spawn(async move {
                        let out = task.await.unwrap();
                        (out, Instant::now(), sync.waiters())
                    }),
                ));
            }
            until("queued", LIMIT, || sync.waiters() == i + 1).await;
        }
        assert!(sync.deadline_timer_running(), "timed waiters are queued");
        for (after, task) in timed {
            let (out, ended, _) = within(task).await.unwrap();
            assert!(out.unwrap_err().is_timeout());
            // tokio's timer rounds a deadline up to its next millisecond.
            let late = ended - start;
            assert!(
                late >= ms(after) && late <= ms(after + 1),
                "deadline {after} ms fired at {late:?}"
            );
        }
        sync.check_invariants().unwrap();
        until("the timer task finished", LIMIT, || {
            !sync.deadline_timer_running()
        })
        .await;
        assert_eq!(sync.waiters(), 1, "the untimed waiter is still queued");
        let (holder, task) = plain.unwrap();
        testing::release(&sync, owner).unwrap();
        assert_eq!(within(task).await.unwrap().unwrap().holder, holder);
    });
}

/// A timed waiter that leaves early (granted, or cancelled) takes its deadline off the shared
/// timer, and the task finishes as soon as no deadline is left rather than sleeping until the
/// last one it was armed for.
#[test]
fn the_timer_task_finishes_when_the_last_timed_waiter_leaves() {
    paused(|| async move {
        let (_remote, sync) = new_sync(SPIN);
        let (a, b, c) = (HolderId::new(), HolderId::new(), HolderId::new());
        within(sync.acquire(a, Wait::Forever)).await.unwrap();
        let tb = spawn_acquire(&sync, b, until_instant(HOUR));
        until("b queued", LIMIT, || sync.waiters() == 1).await;
        let tc = spawn_acquire(&sync, c, until_instant(2 * HOUR));
        until("c queued", LIMIT, || sync.waiters() == 2).await;
        assert!(sync.deadline_timer_running());
        tc.abort();
        until("c left", LIMIT, || sync.waiters() == 1).await;
        sync.check_invariants().unwrap();
        assert!(
            sync.deadline_timer_running(),
            "b's deadline is still watched"
        );
        let before = Instant::now();
        testing::release(&sync, a).unwrap();
        within(tb).await.unwrap().unwrap();
        until("the timer task finished", LIMIT, || {
            !sync.deadline_timer_running()
        })
        .await;
        // Paused clock: the task finished without the clock moving to its armed deadline.
        assert!(
            Instant::now() - before < ms(10),
            "the task waited for its deadline"
        );
        sync.check_invariants().unwrap();
    });
}

/// The timer task runs on the runtime of the waiter that started it. When that runtime shuts
/// down, the task is dropped with it; a timed waiter queued from another runtime must still
/// time out: it is woken, and starts a new task on its own runtime.
#[test]
fn a_timer_dropped_with_its_runtime_is_restarted_by_a_waiter_elsewhere() {
    with_watchdog(Duration::from_secs(30), || {
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let second = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        let sync = first.block_on(async { new_sync(SPIN).1 });
        let owner = HolderId::new();
        first.block_on(sync.acquire(owner, Wait::Forever)).unwrap();
        // An untimed head, so that the waiters below are never woken for being next.
        let head = {
            let sync = sync.clone();
            second.spawn(async move { sync.acquire(HolderId::new(), Wait::Forever).await })
        };
        second.block_on(until("head queued", LIMIT, || sync.waiters() == 1));
        // A waiter on the first runtime starts the timer task there.
        let early = {
            let sync = sync.clone();
            first.spawn(async move {
                sync.acquire(HolderId::new(), Wait::for_duration(HOUR))
                    .await
            })
        };
        first.block_on(until("early queued", LIMIT, || sync.waiters() == 2));
        assert!(sync.deadline_timer_running());
        // A waiter on the second runtime, with a short deadline, relies on that task.
        let late = {
            let sync = sync.clone();
            second.spawn(async move {
                let start = std::time::Instant::now();
                let out = sync
                    .acquire(HolderId::new(), Wait::for_duration(ms(200)))
                    .await;
                (out, start.elapsed())
            })
        };
        second.block_on(until("late queued", LIMIT, || sync.waiters() == 3));
        // Shutting the first runtime down drops the timer task and the early waiter.
        drop(early);
        first.shutdown_background();
        let (out, elapsed) = second
            .block_on(async { timeout(Duration::from_secs(10), late).await })
            .expect("the late waiter never timed out: nobody restarted the timer")
            .unwrap();
        assert!(out.unwrap_err().is_timeout());
        assert!(elapsed >= ms(200), "timed out early, after {elapsed:?}");
        sync.check_invariants().unwrap();
        head.abort();
        second.block_on(until("the head left", LIMIT, || sync.waiters() == 0));
    });
}
