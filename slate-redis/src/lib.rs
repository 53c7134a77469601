//! The single-node distributed lock of Slate: a reentrant, leased, fenced lock on one Redis
//! master, with automatic renewal and unlock notification.
//!
//! ```no_run
//! use slate_redis::{RedisClient, SingleLock};
//! use std::time::Duration;
//!
//! # #[tokio::main] async fn main() -> slate_redis::Result<()> {
//! let client = RedisClient::open("redis://127.0.0.1:6379")?;
//! let lock = SingleLock::builder(&client, "orders")
//!     .lease(Duration::from_secs(10))
//!     .build()?;
//!
//! let guard = lock.lock().await?;
//! // Pass the token to every store the critical section writes to.
//! let token = guard.fencing_token();
//! # let _ = token;
//! guard.unlock().await?;
//! # Ok(()) }
//! ```
//!
//! - [`RedisClient`]: one per server and process; owns the connection pool, the renewal
//!   service and the pub/sub connection, and shares them among its locks.
//! - [`SingleLock`]: the lock (see its `## Behaviour` list); [`SingleLockGuard`]: one held level.
//! - [`RwLock`]: a read-write lock (readers share, writers hold alone, fair between them;
//!   re-entry in both modes, the read a write covers, downgrade); [`RwLockReadGuard`],
//!   [`RwLockWriteGuard`].
//! - [`Semaphore`]: `n` permits across processes, each acquisition's permits leased and
//!   renewed (a crashed holder's come back); [`SemaphorePermit`].
//! - [`MultiLock`]: several named locks held as one, all or nothing, deadlock-free whatever
//!   sets other callers take (one canonical order: sorted keys); [`MultiLockGuard`] has each name's token.
//! - [`CountDownLatch`]: wait until `n` count-downs have happened, in any processes (woken by a
//!   message, each count-down counted once even when sent again).
//!
//! The read-write lock and the semaphore run on the synchronizer's shared mode and keep
//! their holders in `<prefix>{<name>}:rw` (or `:sem`): a hash of every holder's permits and
//! levels, a sorted set of their leases (`:leases`), the waiting processes in arrival order
//! (`:queue`, `:wants`), a persistent fencing counter (`:fence`), a semaphore's capacity
//! (`:permits`, persistent) and a release channel (`:released`); see
//! `src/scripts/shared_prelude.lua`.
//!
//! ## Redis data
//!
//! | key | type | content |
//! | --- | --- | --- |
//! | `<prefix>{<name>}` | hash | field = holder id, value = reentry count; fields `t` (the holder's token), `r` (its last request record), `w` (someone waits); TTL = lease |
//! | `<prefix>fence:{<slot tag>}` | string | the fencing counter of the name's cluster hash slot, shared by the names of that slot; persistent (a missing one is seeded from the server clock, so deleting it does not make tokens repeat unless the clock stepped back) |
//! | `<prefix>{<name>}:queue`, `:turn` | sorted set, hash | the processes waiting and the fair turn, only while processes contend; TTL = lease |
//! | `<prefix>{<name>}:req:<holder>` | string | a request record, only after a resend or an undo; TTL = twice the command timeout |
//! | `<prefix>{<name>}:released` | channel | a message per release to zero that someone waits for |
//!
//! The scripts (`src/scripts/*.lua`) are run by `EVALSHA` and reloaded after `NOSCRIPT`.
//!
//! ## Features
//!
//! - `tls`: `rediss://` URLs, through rustls (ring provider, platform root certificates).

#![forbid(unsafe_code)]

mod client;
#[doc(hidden)] // slate-combination's per-node calls: not part of the public API (docs/API.md)
pub mod node;
mod primitives;
mod scripts;
mod services;

pub use client::conn::Topology;
pub use client::{
    ClientOptions, ClientOptionsBuilder, ClientStats, DEFAULT_COMMAND_TIMEOUT, RedisClient,
};
pub use node::LockStatus;
pub use primitives::latch::{CountDownLatch, CountDownLatchBuilder};
pub use primitives::lock::guard::SingleLockGuard;
pub use primitives::lock::{ClientSource, SingleLock, SingleLockBuilder};
pub use primitives::multi::{MultiLock, MultiLockBuilder, MultiLockGuard};
pub use primitives::rwlock::{RwLock, RwLockBuilder, RwLockReadGuard, RwLockWriteGuard};
pub use primitives::semaphore::{MAX_PERMITS, Semaphore, SemaphoreBuilder, SemaphorePermit};
pub use primitives::shared::{SharedHolder, SharedMode, SharedStatus};
pub use scripts::{LuaScript, lua_script, lua_scripts};
// Everything the examples and a typical caller need, so that depending on `slate-redis` alone
// is enough (the traits are only needed for generic code).
pub use slate_core::metrics;
pub use slate_core::{
    AnyGuard, AnyLock, BackendKind, DistributedLock, Error, FencingToken, Hold, HolderId,
    LeaseWatch, LockGuard, LockName, LockOptions, LockOptionsBuilder, LossReason, Result,
    TimeoutKind, WRITE_PERMITS, Wait,
};
