//! The local queued synchronizer under every Slate lock.
//!
//! Inside one process, tasks that want the same distributed lock queue up in FIFO order and
//! park; only the head of the queue, and only while no local task holds the lock, talks to the
//! backend through a [`Competitor`]. "Every waiter polls Redis" becomes "one waiter per process
//! asks, the others sleep".
//!
//! - [`Synchronizer`]: the queue and its driver (`acquire`, `blocking_acquire`, `release`,
//!   `notify_released`). Its docs state the queue invariants and every cancel path. Like
//!   Java's AQS it has an exclusive and a **shared** mode (`acquire_shared`,
//!   `release_shared`): shared holders hold together, and both modes queue in one FIFO, so
//!   a queued writer is not starved by later readers. Read-write locks and semaphores are
//!   competitors on top of it.
//! - [`Competitor`]: the strategy a backend implements: one remote attempt, and hooks.
//! - `testing` (feature `test-util`): an in-memory remote lock and competitor for tests and
//!   benchmarks.
//!
//! No I/O, no `unsafe`. Model-checked with loom
//! (`RUSTFLAGS="--cfg slate_loom" LOOM_MAX_PREEMPTIONS=2 cargo test -p slate-aqs --release --test loom`).
//!
//! # Examples
//!
//! A backend wraps a synchronizer around its remote attempt:
//!
//! ```
//! use slate_aqs::{Attempt, Competitor, Synchronizer};
//! use slate_aqs::{HolderId, Result, Wait};
//! use std::sync::{Arc, Mutex};
//! use std::time::Duration;
//!
//! /// A "remote" lock that is just a shared slot.
//! struct Slot(Arc<Mutex<Option<HolderId>>>);
//!
//! impl Competitor for Slot {
//!     type Grant = HolderId;
//!
//!     fn attempt(&self, holder: HolderId) -> impl Future<Output = Result<Attempt<HolderId>>> + Send + 'static {
//!         let slot = Arc::clone(&self.0);
//!         async move {
//!             let mut held = slot.lock().unwrap();
//!             Ok(match *held {
//!                 Some(h) if h != holder => Attempt::Busy { retry_after: None },
//!                 _ => {
//!                     *held = Some(holder);
//!                     Attempt::Acquired(holder)
//!                 }
//!             })
//!         }
//!     }
//!
//!     fn abandon(&self, _holder: HolderId, _grant: HolderId) {
//!         *self.0.lock().unwrap() = None;
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<()> {
//! let remote = Arc::new(Mutex::new(None));
//! let sync = Synchronizer::new("orders", Slot(remote.clone()), Duration::from_millis(50));
//! let me = HolderId::new();
//! sync.acquire(me, Wait::Forever).await?;
//! // ... critical section ...
//! *remote.lock().unwrap() = None; // the remote release
//! sync.release(me);               // then the local one
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

mod blocking;
pub mod competitor;
mod deadlines;
mod in_flight;
mod queue;
mod sync;
mod synchronizer;
#[cfg(feature = "test-util")]
pub mod testing;
mod timer;

pub use competitor::{Attempt, Competitor, Notifications};
pub use synchronizer::{MIN_RETRY_DELAY, Synchronizer};
// The contract types every competitor and caller of the synchronizer uses, so that depending on
// `slate-aqs` alone is enough for its examples.
pub use slate_core::metrics;
pub use slate_core::{
    BackendKind, Error, HolderId, LockName, LossReason, Result, TimeoutKind, Wait,
};
