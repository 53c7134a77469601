//! The backend-agnostic contract of Slate's distributed locks.
//!
//! - [`DistributedLock`] and [`LockGuard`]: what every lock and guard offers.
//! - [`HolderId`]: who holds a lock (reentrancy is keyed by holder, never by thread).
//! - [`FencingToken`]: strictly increasing across holders of a lock.
//! - [`lease`]: deadline and loss signal shared by renewal and guard.
//! - [`LockOptions`], [`LockName`]: validated configuration.
//! - [`Error`]: the one error type, with `is_*` helpers.
//! - [`metrics`]: what the locks record through the `metrics` facade.
//! - [`AnyLock`], [`AnyGuard`] ([`DynLock`], [`DynGuard`]): the object-safe layer, for locks of
//!   several backends kept side by side.
//!
//! This crate has no Redis in it; see `slate-redis` (single node) and `slate-combination`
//! (N independent nodes) for the locks themselves.

#![forbid(unsafe_code)]

// `slate_core::` paths in the macros' docs resolve inside this crate too.
#[allow(
    unused_extern_crates,
    reason = "used by the doc links the macros write"
)]
extern crate self as slate_core;

pub mod any;
pub mod blocking;
pub mod detach;
pub mod error;
pub mod fencing;
pub mod hold;
pub mod holder;
pub mod lease;
pub mod lock;
pub mod metrics;
pub mod mutant;
pub mod name;
pub mod options;
pub mod registry;

pub use any::{AnyGuard, AnyLock, BoxFuture, DynGuard, DynLock};
pub use error::{BackendKind, Error, NodeReport, NodeState, Result, TimeoutKind};
pub use fencing::FencingToken;
pub use hold::{Held, Hold, Release};
pub use holder::HolderId;
pub use lease::{LeaseKeeper, LeaseWatch, LossReason};
pub use lock::{DistributedLock, LockGuard, WRITE_PERMITS, Wait};
pub use name::{LockName, MAX_NAME_LEN};
pub use options::{LockOptions, LockOptionsBuilder, MAX_DURATION};
