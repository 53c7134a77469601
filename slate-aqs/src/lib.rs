//! The local queued synchronizer under every Slate lock.
//!
//! Inside one process, tasks that want the same distributed lock queue up in FIFO order and
//! park; only the head of the queue, and only while no local task holds the lock, talks to the
//! backend through a [`Competitor`]. "Every waiter polls Redis" becomes "one waiter per process
//! asks, the others sleep".

#![forbid(unsafe_code)]

pub mod competitor;

pub use competitor::{Attempt, Competitor, Notifications};
