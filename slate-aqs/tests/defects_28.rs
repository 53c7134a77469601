//! Correctness III (issue 28): the synchronizer's defects, each with a test named after its item
//! that fails on the code before the fix.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::park_once;
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

/// Item 10: the shared deadline timer was one task per synchronizer, on the runtime of the
/// waiter that started it. That runtime can stay alive and undriven (a current-thread runtime
/// kept after its `block_on` returned): a waiter on another runtime with an earlier deadline
/// asked that task to re-arm, and it never ran, so the waiter did not time out. There is now a
/// task on each runtime that has timed waiters.
#[test]
fn i10_a_timer_on_an_undriven_runtime_does_not_hold_up_another_runtimes_deadline() {
    let sync = Arc::new(Synchronizer::new(
        "i10",
        MemoryCompetitor::new(MemoryRemote::new()),
        Duration::from_millis(50),
    ));
    let owner = HolderId::new();
    let driven = driven_runtime_holding(&sync, owner);

    // A waiter with a far deadline parks on a current-thread runtime, which then stops being
    // driven (the runtime stays alive; so does the parked waiter).
    let idle = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut far = Box::pin(sync.acquire(
        HolderId::new(),
        Wait::for_duration(Duration::from_secs(600)),
    ));
    park_once(&idle, far.as_mut());
    assert!(sync.deadline_timer_running());

    // A waiter with a near deadline on the driven runtime times out on time.
    near_wait_times_out(&driven, &sync, "the undriven runtime's timer");
    drop(far);
    sync.release(owner);
    sync.check_invariants().unwrap();
}

/// Item 14, first half: an immediate shared attempt (`try_read`, a semaphore's
/// `try_acquire`) went to the remote whenever no exclusive owner held locally, queue or not,
/// so a stream of them kept the read lock held beside the first reader and the process's own
/// queued writer never got in, against the promise that a queued writer is never starved by
/// readers. An immediate shared attempt now answers busy while waiters are queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i14_immediate_readers_do_not_pass_a_queued_writer() {
    let sync = Arc::new(Synchronizer::new(
        "i14",
        MemoryCompetitor::new(MemoryRemote::new()),
        Duration::from_millis(5),
    ));
    testing::subscribe(&sync);
    let (first, w) = (HolderId::new(), HolderId::new());
    sync.acquire_shared(first, Wait::Forever).await.unwrap();
    let writer = tokio::spawn({
        let sync = sync.clone();
        async move { sync.acquire(w, Wait::Forever).await }
    });
    let started = Instant::now();
    while sync.waiters() < 1 {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the writer queued"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for i in 0..20 {
        let e = sync
            .acquire_shared(HolderId::new(), Wait::Immediate)
            .await
            .map(|_| ())
            .expect_err(&format!("immediate reader {i} passed the queued writer"));
        assert!(e.is_busy(), "{e}");
    }
    testing::release_shared(&sync, first).unwrap();
    tokio::time::timeout(Duration::from_secs(2), writer)
        .await
        .expect("the writer holds once the reader left")
        .unwrap()
        .unwrap();
    testing::release(&sync, w).unwrap();
    sync.check_invariants().unwrap();
}

/// Item 14, second half: "the last grant processed wins". A grant recorded while another
/// local owner holds displaces it, on the ground that the remote granted it after that
/// owner's remote hold ended. A grant processed after its own lease ran out breaks that
/// ground: here LATE's immediate attempt is granted, its answer held 400 ms (a task starved
/// of CPU), its 100 ms lease runs out at the remote, and LIVE takes the lock. LATE's grant,
/// processed last, displaced LIVE, whose remote hold was live: the local owner was a holder
/// that held nothing. Now a grant whose lease ran out is given back unrecorded, as busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i14_a_grant_processed_after_its_lease_does_not_displace_a_live_hold() {
    let remote = MemoryRemote::new();
    let competitor = MemoryCompetitor::new(remote.clone());
    competitor.set_lease(Some(Duration::from_millis(100)));
    let sync = Arc::new(Synchronizer::new(
        "i14b",
        competitor,
        Duration::from_millis(5),
    ));
    let (late, live) = (HolderId::new(), HolderId::new());
    sync.competitor()
        .script([Behavior::LateAnswer(Duration::from_millis(400))]);
    let try_late = tokio::spawn({
        let sync = sync.clone();
        async move { sync.acquire(late, Wait::Immediate).await.map(|_| ()) }
    });
    let started = Instant::now();
    while remote.holder().map(|(h, _)| h) != Some(late) {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "LATE granted remotely"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // LATE's lease runs out at the remote; LIVE takes the lock there and here.
    remote.release_silently(late).unwrap();
    sync.acquire(live, Wait::Forever).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(2), try_late)
        .await
        .expect("LATE's answer arrives")
        .unwrap();
    let e = answer.expect_err("a grant whose lease ran out displaced the live holder");
    assert!(e.is_busy(), "{e}");
    assert_eq!(
        sync.competitor().stats().abandoned,
        1,
        "LATE's grant given back"
    );
    assert_eq!(remote.holder(), Some((live, 1)));
    assert_eq!(testing::release(&sync, live).unwrap(), 0);
    sync.check_invariants().unwrap();
}

/// Item 10, found by the review of its fix: with a timer task per runtime, a waiter parked
/// from one runtime (whose task alone was told its deadline) and then polled on another,
/// whose task sleeps until a later deadline, parked again without telling that task, and
/// timed out at the later deadline. A timed waiter now re-parks through `ensure` whenever the
/// task of the runtime polling it would not wake it in time.
#[test]
fn i10_a_waiter_polled_on_another_runtime_keeps_its_deadline() {
    let sync = Arc::new(Synchronizer::new(
        "i10b",
        MemoryCompetitor::new(MemoryRemote::new()),
        Duration::from_millis(50),
    ));
    let owner = HolderId::new();
    let driven = driven_runtime_holding(&sync, owner);
    // A far waiter parks on the driven runtime: its task sleeps until that far deadline.
    let far = driven.spawn({
        let sync = sync.clone();
        async move {
            sync.acquire(
                HolderId::new(),
                Wait::for_duration(Duration::from_secs(600)),
            )
            .await
            .map(|_| ())
        }
    });
    let started = Instant::now();
    while sync.waiters() < 1 {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the far waiter queued"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    // A near waiter parks from a current-thread runtime (whose own task is told its
    // deadline), which is then left undriven.
    let idle = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut near = Box::pin(sync.acquire(
        HolderId::new(),
        Wait::for_duration(Duration::from_millis(300)),
    ));
    park_once(&idle, near.as_mut());
    // The near waiter is polled on the driven runtime from now on.
    let started = Instant::now();
    let answer =
        driven.block_on(async { tokio::time::timeout(Duration::from_secs(5), near).await });
    let took = started.elapsed();
    let answer = answer.unwrap_or_else(|_| {
        panic!("a 300 ms wait had not timed out after {took:?}: the driven runtime's task slept until the far deadline")
    });
    assert!(
        answer
            .map(|_| ())
            .expect_err("the lock is held")
            .is_timeout()
    );
    assert!(took < Duration::from_secs(2), "timed out after {took:?}");
    far.abort();
    sync.release(owner);
}

/// Item 9: the timer task's hand-over guard was created inside the task, so a task dropped
/// before its first poll (its runtime shut down first) never handed over: the state said a
/// task ran for the synchronizer's life. On 9cb047c (one task per synchronizer) every later
/// timed waiter only asked that dead task to re-arm and never timed out; with a task per
/// runtime, the dead runtime's slot stayed for good. The guard now exists before the task is
/// spawned. The window (spawned, not yet polled) is made deterministic by parking the waiter
/// on a current-thread runtime's `block_on` that returns at its first poll, before the runtime
/// runs any spawned task, and dropping that runtime.
#[test]
fn i9_a_timer_task_dropped_before_its_first_poll_hands_over() {
    let sync = Arc::new(Synchronizer::new(
        "i9",
        MemoryCompetitor::new(MemoryRemote::new()),
        Duration::from_millis(50),
    ));
    let owner = HolderId::new();
    let driven = driven_runtime_holding(&sync, owner);
    let doomed = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut far = Box::pin(sync.acquire(
        HolderId::new(),
        Wait::for_duration(Duration::from_secs(600)),
    ));
    park_once(&doomed, far.as_mut());
    assert!(
        sync.deadline_timer_running(),
        "the far waiter started a task"
    );
    // The runtime shuts down with its timer task spawned and never polled.
    drop(doomed);
    assert!(
        !sync.deadline_timer_running(),
        "the task dropped unpolled left its slot: the state says a timer runs on a runtime that is gone"
    );
    // A near waiter on the driven runtime times out on time (the far one stays queued).
    near_wait_times_out(&driven, &sync, "a task that never ran");
    drop(far);
    sync.release(owner);
    sync.check_invariants().unwrap();
}

/// A 200 ms wait on `driven` (the lock held) times out within 2 s; otherwise its deadline was
/// left to `timer`.
fn near_wait_times_out(
    driven: &tokio::runtime::Runtime,
    sync: &Synchronizer<MemoryCompetitor>,
    timer: &str,
) {
    let started = Instant::now();
    let near = driven.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(5),
            sync.acquire(
                HolderId::new(),
                Wait::for_duration(Duration::from_millis(200)),
            ),
        )
        .await
    });
    let took = started.elapsed();
    let near = near.unwrap_or_else(|_| {
        panic!("a 200 ms wait had not timed out after {took:?}: its deadline was left to {timer}")
    });
    assert!(near.expect_err("the lock is held").is_timeout());
    assert!(took < Duration::from_secs(2), "timed out after {took:?}");
}

/// A one-worker multi-thread runtime, with `owner` holding `sync` (acquired on it).
fn driven_runtime_holding(
    sync: &Synchronizer<MemoryCompetitor>,
    owner: HolderId,
) -> tokio::runtime::Runtime {
    let driven = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    driven.block_on(sync.acquire(owner, Wait::Forever)).unwrap();
    driven
}
