//! Slate's single lock on **ZooKeeper**: the lock Bedrock designed and never built, behind the
//! same [`DistributedLock`] / [`LockGuard`] contract as the Redis locks.
//!
//! - [`ZkClient`]: one session per process, for every lock (an ensemble connection string,
//!   an optional chroot, digest authentication with `creator_all` ACLs).
//! - [`ZkLock`]: the standard recipe (ephemeral sequential contenders, each watching only its
//!   predecessor) with `slate-aqs` in front, so only the head task of a process has a znode.
//! - [`ZkLockGuard`]: one level of a hold: holder, fencing token (the creation zxid of the
//!   holder's znode), lease (the session: the deadline is the last confirmed contact plus
//!   the session timeout, and the loss signal fires when the session ends or the znode is
//!   deleted).
//!
//! # How it differs from the Redis single lock
//!
//! | | Redis (`slate-redis`) | ZooKeeper (`slate-zookeeper`) |
//! | --- | --- | --- |
//! | lease | a TTL, renewed by the holder | the session, kept alive by the client's pings |
//! | server crash | a standalone master loses the lock (and its fence counter) | the quorum keeps it; tokens keep increasing |
//! | fencing token | a counter on the master | the zxid that created the holder's znode |
//! | wake-up | pub/sub to every waiter, a turn for the next | a watch on the predecessor only |
//! | re-entry across processes | one holder id may hold from several processes | a hold belongs to its session |
//!
//! # Examples
//!
//! ```no_run
//! use slate_zookeeper::{ZkClient, ZkLock};
//!
//! # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
//! let client = ZkClient::connect("127.0.0.1:2181,127.0.0.1:2182,127.0.0.1:2183").await?;
//! let lock = ZkLock::builder(&client, "nightly-report").build()?;
//! let guard = lock.lock().await?;
//! tokio::select! {
//!     () = run_report(guard.fencing_token().get()) => { guard.unlock().await?; }
//!     reason = guard.lost() => eprintln!("lost the lock ({reason}); stopping"),
//! }
//! # Ok(()) }
//! # async fn run_report(_: u64) {}
//! ```

#![forbid(unsafe_code)]

mod client;
mod error;
mod guard;
mod lock;
pub mod path;

pub use client::{DEFAULT_SESSION_TIMEOUT, MAX_SESSION_TIMEOUT, ZkClient, ZkClientBuilder};
pub use guard::ZkLockGuard;
pub use lock::{DEFAULT_SPIN_WAIT, ZkContender, ZkLock, ZkLockBuilder, ZkStatus};
pub use slate_core::{
    AnyGuard, AnyLock, BackendKind, DistributedLock, Error, FencingToken, Hold, HolderId,
    LeaseWatch, LockGuard, LockName, LossReason, Result, TimeoutKind, Wait,
};
