//! `Send`/`Sync` of every public type and future, checked at compile time. The generic
//! checks hold for every `Competitor`, so they cover backends too.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use slate_aqs::testing::{Behavior, MemoryCompetitor, MemoryGrant, MemoryRemote, Stats};
use slate_aqs::{Attempt, Competitor, Notifications, Synchronizer};
use slate_core::{HolderId, Wait};

fn send_sync<T: Send + Sync>(_: &T) {}
fn send_sync_static<T: Send + Sync + 'static>() {}

/// For any competitor: the synchronizer and its acquire future are `Send + Sync`.
fn generic<C: Competitor>(sync: &Synchronizer<C>) {
    send_sync(sync);
    send_sync(&sync.acquire(HolderId::new(), Wait::Forever));
    send_sync(&sync.acquire_shared(HolderId::new(), Wait::Forever));
}

#[test]
fn public_types_and_futures_are_send_and_sync() {
    let sync = Synchronizer::new(
        "a",
        MemoryCompetitor::new(MemoryRemote::new()),
        Duration::from_millis(5),
    );
    generic(&sync);
    send_sync(&sync.acquire(HolderId::new(), Wait::Immediate));
    send_sync_static::<Synchronizer<MemoryCompetitor>>();
    send_sync_static::<MemoryCompetitor>();
    send_sync_static::<MemoryRemote>();
    send_sync_static::<MemoryGrant>();
    send_sync_static::<Stats>();
    send_sync_static::<Behavior>();
    send_sync_static::<Notifications>();
    send_sync_static::<Attempt<MemoryGrant>>();
    send_sync(&sync.competitor().prepare_wait());
}

/// The memory budget of a parked waiter without a deadline: its acquire future plus its queue
/// slot stay within 256 bytes, passable or not (a waiter is what a lock keeps by the
/// thousand; `benches/benches/aqs.rs` reports the figures). A size, not a speed: it does not
/// depend on the machine, only on the code (it grew to 312 bytes once, when the remote
/// holder of an attempt was stored twice).
#[test]
fn a_parked_waiter_fits_in_256_bytes() {
    let sync = Synchronizer::new(
        "a",
        MemoryCompetitor::new(MemoryRemote::new()),
        Duration::from_millis(5),
    );
    let slot = Synchronizer::<MemoryCompetitor>::queue_slot_bytes();
    let plain = std::mem::size_of_val(&sync.acquire(HolderId::new(), Wait::Forever));
    let passable = std::mem::size_of_val(&sync.acquire_passable(HolderId::new(), Wait::Forever));
    let shared = std::mem::size_of_val(&sync.acquire_shared(HolderId::new(), Wait::Forever));
    assert!(
        shared + slot <= 256,
        "acquire_shared: {shared} B + slot {slot} B"
    );
    assert!(plain + slot <= 256, "acquire: {plain} B + slot {slot} B");
    assert!(
        passable + slot <= 256,
        "acquire_passable: {passable} B + slot {slot} B"
    );
}

/// The same budget for a parked waiter **with a deadline**: its deadline lives on the
/// synchronizer's shared timer (16 bytes on a heap), not in a `Sleep` of its own
/// (`tests/allocations.rs` checks that no per-waiter allocation comes with it).
#[test]
fn a_parked_waiter_with_a_deadline_fits_in_256_bytes() {
    let sync = Synchronizer::new(
        "a",
        MemoryCompetitor::new(MemoryRemote::new()),
        Duration::from_millis(5),
    );
    let slot = Synchronizer::<MemoryCompetitor>::queue_slot_bytes();
    let deadline = Synchronizer::<MemoryCompetitor>::deadline_bytes();
    let wait = Wait::for_duration(Duration::from_secs(1));
    let fut = std::mem::size_of_val(&sync.acquire(HolderId::new(), wait));
    assert!(
        fut + slot + deadline <= 256,
        "acquire with a deadline: {fut} B + slot {slot} B + deadline {deadline} B"
    );
}
