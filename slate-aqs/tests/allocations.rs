//! Parking waiters with deadlines allocates nothing per waiter: their deadlines go to the
//! synchronizer's shared timer (one task, one `Sleep`), not to a boxed `Sleep` each.
//!
//! `allocation-counter` replaces the global allocator, so this test has a binary of its own.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Waker};
use std::time::Duration;

use slate_aqs::Synchronizer;
use slate_aqs::testing::{MemoryCompetitor, MemoryRemote};
use slate_core::{HolderId, Wait};

const WAITERS: usize = 2_000;

#[test]
fn parking_timed_waiters_allocates_nothing_per_waiter() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let _enter = rt.enter();
    let sync = Synchronizer::new(
        "a",
        MemoryCompetitor::new(MemoryRemote::new()),
        Duration::from_millis(50),
    );
    let owner = HolderId::new();
    rt.block_on(sync.acquire(owner, Wait::Forever)).unwrap();
    let mut futures: Vec<Pin<Box<dyn Future<Output = _> + '_>>> = (0..WAITERS)
        .map(|i| {
            let wait = Wait::for_duration(Duration::from_secs(60 + i as u64));
            Box::pin(sync.acquire(HolderId::new(), wait)) as Pin<Box<dyn Future<Output = _>>>
        })
        .collect();
    let mut cx = Context::from_waker(Waker::noop());
    let allocations = allocation_counter::measure(|| {
        for fut in &mut futures {
            assert!(fut.as_mut().poll(&mut cx).is_pending());
        }
    })
    .count_total;
    assert_eq!(sync.waiters(), WAITERS);
    // The queue's slab and the deadline heap double as they grow (about 2 × log2(2,000) = 22
    // reallocations), and one task is spawned with its sleep; a boxed sleep per waiter would
    // be 2,000 more.
    assert!(
        allocations < 64,
        "{allocations} allocations to park {WAITERS} timed waiters"
    );
    assert!(sync.deadline_timer_running());
    drop(futures);
    assert_eq!(sync.waiters(), 0);
    sync.check_invariants().unwrap();
}
