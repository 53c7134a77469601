//! The primitives, each a thin layer over the synchronizer (`slate-aqs`) with a competitor of
//! its own: the single lock (`lock`, with its guard), and the shared-mode core (`shared`)
//! under the read-write lock and the semaphore; the multi-lock (`multi`), single locks taken
//! in one canonical order; and the countdown latch (`latch`), which
//! waits on the client's notifications without a synchronizer.

pub(crate) mod latch;
pub(crate) mod lock;
pub(crate) mod multi;
pub(crate) mod rwlock;
pub(crate) mod semaphore;
pub(crate) mod shared;
