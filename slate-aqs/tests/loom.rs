//! loom models of the synchronizer's races (its state mutex is loom's under this cfg).
//!
//! ```text
//! RUSTFLAGS="--cfg slate_loom" LOOM_MAX_PREEMPTIONS=2 \
//!     CARGO_TARGET_DIR=target/loom cargo test -p slate-aqs --release --test loom
//! ```
//!
//! Under loom there is no timer (sleeps never fire), so every waiter must be woken by an
//! event: a lost wake-up is a deadlock, which loom reports. The remote is the in-memory one;
//! its attempts complete within their first poll.

#![cfg(slate_loom)]
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;
use slate_aqs::Synchronizer;
use slate_aqs::testing::{self, MemoryCompetitor, MemoryGrant, MemoryRemote};
use slate_core::{HolderId, Result, Wait};

type Sync = Synchronizer<MemoryCompetitor>;
type Acquire = Pin<Box<dyn Future<Output = Result<MemoryGrant>> + Send>>;

fn new_sync() -> (Arc<MemoryRemote>, Arc<Sync>) {
    let remote = MemoryRemote::new();
    let sync = Arc::new(Synchronizer::new(
        "loom",
        MemoryCompetitor::new(remote.clone()),
        Duration::from_millis(50),
    ));
    (remote, sync)
}

/// An acquire future that owns its synchronizer (loom threads need `'static`).
fn acquire(sync: &Arc<Sync>, holder: HolderId) -> Acquire {
    let sync = Arc::clone(sync);
    Box::pin(async move { sync.acquire(holder, Wait::Forever).await })
}

/// A waker that records, in a loom atomic, that it was woken.
struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Polls `fut` once with `waker`; a grant obtained that way is released at once.
fn poll_once(sync: &Sync, fut: &mut Acquire, holder: HolderId, waker: &Waker) -> bool {
    match fut.as_mut().poll(&mut Context::from_waker(waker)) {
        Poll::Ready(Ok(_)) => {
            testing::release(sync, holder).unwrap();
            true
        }
        Poll::Ready(Err(e)) => panic!("{e}"),
        Poll::Pending => false,
    }
}

/// Acquires to completion on this loom thread, then releases.
fn acquire_and_release(sync: &Arc<Sync>) {
    let me = HolderId::new();
    loom::future::block_on(acquire(sync, me)).unwrap();
    testing::release(sync, me).unwrap();
}

fn assert_clean(sync: &Sync, remote: &MemoryRemote) {
    assert_eq!(sync.owner(), None);
    assert_eq!(sync.waiters(), 0);
    assert_eq!(remote.holder(), None);
    sync.check_invariants().unwrap();
    let s = sync.competitor().stats();
    assert_eq!(s.acquired, s.after_acquire + s.abandoned);
    assert_eq!(s.after_acquire, s.after_release);
}

#[test]
fn two_waiters_and_a_cancel() {
    loom::model(|| {
        let (remote, sync) = new_sync();
        let holder = HolderId::new();
        loom::future::block_on(sync.acquire(holder, Wait::Forever)).unwrap();

        // A waiter that joins (or finds the lock free), then is cancelled: if it was woken
        // as head, its turn must reach the other waiter.
        let s = sync.clone();
        let cancelled = thread::spawn(move || {
            let me = HolderId::new();
            let mut fut = acquire(&s, me);
            poll_once(&s, &mut fut, me, Waker::noop());
            drop(fut);
        });
        let s = sync.clone();
        let patient = thread::spawn(move || acquire_and_release(&s));

        testing::release(&sync, holder).unwrap();
        cancelled.join().unwrap();
        patient.join().unwrap();
        assert_clean(&sync, &remote);
    });
}

#[test]
fn a_release_racing_a_cancel() {
    loom::model(|| {
        let (remote, sync) = new_sync();
        let holder = HolderId::new();
        loom::future::block_on(sync.acquire(holder, Wait::Forever)).unwrap();

        // The head-to-be is queued first, on this thread.
        let doomed = HolderId::new();
        let mut head = acquire(&sync, doomed);
        assert!(!poll_once(&sync, &mut head, doomed, Waker::noop()));
        assert_eq!(sync.waiters(), 1);

        let s = sync.clone();
        let second = thread::spawn(move || acquire_and_release(&s));
        let s = sync.clone();
        let releaser = thread::spawn(move || testing::release(&s, holder).unwrap());
        let canceller = thread::spawn(move || drop(head));

        releaser.join().unwrap();
        canceller.join().unwrap();
        second.join().unwrap();
        assert_clean(&sync, &remote);
    });
}

#[test]
fn a_woken_waiter_dropped_before_it_runs() {
    loom::model(|| {
        let (remote, sync) = new_sync();
        let holder = HolderId::new();
        loom::future::block_on(sync.acquire(holder, Wait::Forever)).unwrap();

        let doomed = HolderId::new();
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag.clone());
        let mut head = acquire(&sync, doomed);
        assert!(!poll_once(&sync, &mut head, doomed, &waker));

        let s = sync.clone();
        let second = thread::spawn(move || acquire_and_release(&s));
        let s = sync.clone();
        let releaser = thread::spawn(move || testing::release(&s, holder).unwrap());

        // Wait for the wake-up, then drop the head without running it.
        while !flag.0.load(Ordering::SeqCst) {
            thread::yield_now();
        }
        drop(head);

        releaser.join().unwrap();
        second.join().unwrap();
        assert_clean(&sync, &remote);
    });
}

/// A passable acquire future (lock cohorting) that owns its synchronizer.
fn acquire_passable(sync: &Arc<Sync>, holder: HolderId) -> Acquire {
    let sync = Arc::clone(sync);
    Box::pin(async move { sync.acquire_passable(holder, Wait::Forever).await })
}

/// A synchronizer whose fresh passable holds allow two local passes.
fn new_cohort_sync() -> (Arc<MemoryRemote>, Arc<Sync>) {
    let (remote, sync) = new_sync();
    sync.competitor().set_pass_budget(2);
    (remote, sync)
}

/// Makes a holder the owner with a hold it may pass: it wins the hold from the queue, behind
/// a first holder (alone, it would acquire as itself, without passes).
fn passable_owner(sync: &Arc<Sync>) -> HolderId {
    let first = HolderId::new();
    loom::future::block_on(sync.acquire(first, Wait::Forever)).unwrap();
    let holder = HolderId::new();
    let mut fut = acquire_passable(sync, holder);
    let waker = Waker::noop();
    let pending = |fut: &mut Acquire| {
        fut.as_mut()
            .poll(&mut Context::from_waker(waker))
            .is_pending()
    };
    assert!(pending(&mut fut));
    // A companion behind it makes the hold worth passing; it leaves before the model runs.
    let mut companion = acquire_passable(sync, HolderId::new());
    assert!(pending(&mut companion));
    testing::release(sync, first).unwrap();
    match fut.as_mut().poll(&mut Context::from_waker(waker)) {
        Poll::Ready(Ok(grant)) => assert_ne!(grant.holder, holder, "a minted remote holder"),
        other => panic!("the queued passable waiter did not win the hold: {other:?}"),
    }
    drop(companion);
    holder
}

/// Nothing held, nothing queued, nothing leaked, whichever way the passes went.
fn assert_clean_after_passes(sync: &Sync, remote: &MemoryRemote) {
    assert_eq!(sync.owner(), None);
    assert_eq!(sync.waiters(), 0);
    assert_eq!(remote.holder(), None);
    sync.check_invariants().unwrap();
    let s = sync.competitor().stats();
    // Every grant reached a caller (remote or passed) or was given back.
    assert_eq!(s.acquired + s.passes_taken, s.after_acquire + s.abandoned);
}

#[test]
fn a_pass_racing_the_receivers_cancel() {
    loom::model(|| {
        let (remote, sync) = new_cohort_sync();
        let holder = passable_owner(&sync);

        // The receiver-to-be is queued first, on this thread, then dropped on another thread
        // while the owner's release passes it the hold (or not yet).
        let doomed = HolderId::new();
        let mut head = acquire_passable(&sync, doomed);
        assert!(!poll_once(&sync, &mut head, doomed, Waker::noop()));

        let s = sync.clone();
        let second = thread::spawn(move || {
            let me = HolderId::new();
            loom::future::block_on(acquire_passable(&s, me)).unwrap();
            testing::release(&s, me).unwrap();
        });
        let s = sync.clone();
        let releaser = thread::spawn(move || testing::release(&s, holder).unwrap());
        let canceller = thread::spawn(move || drop(head));

        releaser.join().unwrap();
        canceller.join().unwrap();
        second.join().unwrap();
        assert_clean_after_passes(&sync, &remote);
    });
}

#[test]
fn a_passed_receiver_dropped_before_it_runs() {
    loom::model(|| {
        let (remote, sync) = new_cohort_sync();
        let holder = passable_owner(&sync);

        let doomed = HolderId::new();
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag.clone());
        let mut head = acquire_passable(&sync, doomed);
        assert!(!poll_once(&sync, &mut head, doomed, &waker));

        // A second waiter, not passable: a dropped receiver must free the hold for it.
        let s = sync.clone();
        let second = thread::spawn(move || acquire_and_release(&s));
        let s = sync.clone();
        let releaser = thread::spawn(move || testing::release(&s, holder).unwrap());

        // Wait for the wake-up (the pass), then drop the receiver without running it.
        while !flag.0.load(Ordering::SeqCst) {
            thread::yield_now();
        }
        drop(head);

        releaser.join().unwrap();
        second.join().unwrap();
        // The owner's hold was passed to the receiver, which dropped it.
        assert_eq!(sync.competitor().stats().passes_dropped, 1);
        assert_clean_after_passes(&sync, &remote);
    });
}

/// A shared acquire future that owns its synchronizer.
fn acquire_shared(sync: &Arc<Sync>, holder: HolderId) -> Acquire {
    let sync = Arc::clone(sync);
    Box::pin(async move { sync.acquire_shared(holder, Wait::Forever).await })
}

/// Reads to completion on this loom thread, then releases.
fn read_and_release(sync: &Arc<Sync>) {
    let me = HolderId::new();
    loom::future::block_on(acquire_shared(sync, me)).unwrap();
    testing::release_shared(sync, me).unwrap();
}

/// Nothing held, nothing queued, nothing leaked, in either mode.
fn assert_clean_shared(sync: &Sync, remote: &MemoryRemote) {
    assert!(sync.shared_holders().is_empty());
    assert!(remote.shared_holders().is_empty());
    assert_eq!(sync.owner(), None);
    assert_eq!(sync.waiters(), 0);
    assert_eq!(remote.holder(), None);
    sync.check_invariants().unwrap();
    let s = sync.competitor().stats();
    assert_eq!(s.acquired, s.after_acquire + s.abandoned);
    assert_eq!(s.after_acquire, s.after_release + s.after_release_shared);
}

#[test]
fn readers_and_a_writer_race_a_release() {
    loom::model(|| {
        let (remote, sync) = new_sync();
        let holder = HolderId::new();
        loom::future::block_on(sync.acquire(holder, Wait::Forever)).unwrap();

        // Two readers and a writer arrive while a writer holds; whichever order they queue
        // in, the release must reach them all (readers admitted one after the other, the
        // writer after the readers before it have gone).
        let s = sync.clone();
        let reader = thread::spawn(move || read_and_release(&s));
        let s = sync.clone();
        let writer = thread::spawn(move || acquire_and_release(&s));
        let s = sync.clone();
        let releaser = thread::spawn(move || testing::release(&s, holder).unwrap());
        read_and_release(&sync);

        releaser.join().unwrap();
        reader.join().unwrap();
        writer.join().unwrap();
        assert_clean_shared(&sync, &remote);
    });
}

#[test]
fn a_last_reader_leaving_races_the_queued_writers_cancel() {
    loom::model(|| {
        let (remote, sync) = new_sync();
        let r = HolderId::new();
        loom::future::block_on(sync.acquire_shared(r, Wait::Forever)).unwrap();

        // A writer queues behind the reader; a second reader queues behind the writer (FIFO
        // between modes). The first reader leaves while the writer is dropped: either way
        // the second reader must get in.
        let doomed = HolderId::new();
        let mut writer = acquire(&sync, doomed);
        assert!(!poll_once(&sync, &mut writer, doomed, Waker::noop()));
        let later = HolderId::new();
        let mut reader = acquire_shared(&sync, later);
        let pending = reader
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending();
        assert!(pending, "a reader queues behind a queued writer");
        drop(reader);

        let s = sync.clone();
        let second = thread::spawn(move || read_and_release(&s));
        let s = sync.clone();
        let releaser = thread::spawn(move || testing::release_shared(&s, r).unwrap());
        let canceller = thread::spawn(move || drop(writer));

        releaser.join().unwrap();
        canceller.join().unwrap();
        second.join().unwrap();
        assert_clean_shared(&sync, &remote);
    });
}
