//! The guard of a [`SingleLock`] hold.

use std::fmt;
use std::future::Future;

use slate_core::detach::Detached;
use slate_core::{DistributedLock, Error, FencingToken, HolderId, LeaseWatch, LockGuard, Result};
use tracing::Instrument;

use crate::lock::SingleLock;

/// One level of a [`SingleLock`] hold: holder, fencing token, lease.
///
/// Release it with [`unlock`](LockGuard::unlock) (async, reports the outcome) or
/// [`blocking_unlock`](Self::blocking_unlock) (threads). Dropping it without either hands the
/// release to a task on the client's runtime: nothing blocks, and the entry is released one
/// round trip later (or ends with its lease if Redis cannot be reached).
///
/// Re-entrant guards of one holder share one lease (one renewal registration) and one fencing
/// token.
///
/// # Examples
///
/// ```no_run
/// use slate_redis::{DistributedLock, LockGuard, RedisClient, SingleLock};
///
/// # #[tokio::main] async fn main() -> slate_core::Result<()> {
/// let client = RedisClient::open("redis://127.0.0.1:6379")?;
/// let lock = SingleLock::builder(&client, "orders").build()?;
/// let outer = lock.lock().await?;
/// let inner = outer.reenter().await?;
/// assert_eq!(inner.fencing_token(), outer.fencing_token());
/// assert_eq!(inner.unlock().await?, 1);
/// assert_eq!(outer.unlock().await?, 0);
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the lock in the background; call unlock().await to see the outcome"]
pub struct SingleLockGuard {
    lock: SingleLock,
    holder: HolderId,
    token: FencingToken,
    depth: u32,
    watch: LeaseWatch,
    released: bool,
}

impl SingleLockGuard {
    pub(crate) fn new(
        lock: SingleLock,
        holder: HolderId,
        token: FencingToken,
        depth: u32,
        watch: LeaseWatch,
    ) -> Self {
        SingleLockGuard {
            lock,
            holder,
            token,
            depth,
            watch,
            released: false,
        }
    }

    /// The holder's hold count right after this acquisition (1 for a first acquisition).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_redis::{DistributedLock, RedisClient, SingleLock};
    /// # #[tokio::main] async fn main() -> slate_core::Result<()> {
    /// # let lock = SingleLock::builder(RedisClient::open("redis://127.0.0.1:6379")?, "a").build()?;
    /// let guard = lock.lock().await?;
    /// assert_eq!(guard.depth(), 1);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// The lock this guard holds.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_redis::{DistributedLock, RedisClient, SingleLock};
    /// # #[tokio::main] async fn main() -> slate_core::Result<()> {
    /// # let lock = SingleLock::builder(RedisClient::open("redis://127.0.0.1:6379")?, "a").build()?;
    /// let guard = lock.lock().await?;
    /// assert_eq!(guard.lock().name(), lock.name());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn lock(&self) -> &SingleLock {
        &self.lock
    }

    /// Acquires the lock once more for this guard's holder (a re-entry: it does not wait for
    /// other holders, raises the hold count and keeps the fencing token).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_redis::{DistributedLock, RedisClient, SingleLock};
    /// # #[tokio::main] async fn main() -> slate_core::Result<()> {
    /// # let lock = SingleLock::builder(RedisClient::open("redis://127.0.0.1:6379")?, "a").build()?;
    /// let outer = lock.lock().await?;
    /// let inner = outer.reenter().await?;
    /// assert_eq!(inner.depth(), 2);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures; if the lease was lost meanwhile, the re-entry may be a fresh
    /// acquisition that waits like any other.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`DistributedLock::acquire`].
    pub fn reenter(&self) -> impl Future<Output = Result<SingleLockGuard>> + Send + '_ {
        self.lock.lock_as(self.holder)
    }

    /// Releases one level from a thread (the thread twin of [`unlock`](LockGuard::unlock)).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # use slate_redis::LockGuard;
    /// # let rt = tokio::runtime::Runtime::new()?;
    /// # let client = rt.block_on(async { slate_redis::RedisClient::open("redis://127.0.0.1:6379") })?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "a").build()?;
    /// let guard = lock.blocking_lock()?;
    /// assert_eq!(guard.blocking_unlock()?, 0);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`unlock`](LockGuard::unlock).
    ///
    /// # Panics
    ///
    /// Inside a tokio runtime (use `unlock().await` there).
    pub fn blocking_unlock(mut self) -> Result<u32> {
        if tokio::runtime::Handle::try_current().is_ok() {
            panic!(
                "SingleLockGuard::blocking_unlock was called inside a tokio runtime, where \
                 blocking would stall the runtime's threads; use unlock().await instead"
            );
        }
        self.released = true;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let release = release(self.lock.clone(), self.holder);
        self.lock.client().spawn(async move {
            let _ = tx.send(release.await);
        });
        rx.recv().unwrap_or(Err(Error::closed("the client's tokio runtime")))
    }
}

/// Releases one level for `holder`: the remote release, then the local one whatever the
/// outcome.
async fn release(lock: SingleLock, holder: HolderId) -> Result<u32> {
    let c = lock.shared.competitor();
    let span = tracing::debug_span!("release", lock = %c.label, %holder);
    async {
        let renewal = &c.client.inner.renewal;
        renewal.begin_release(&c.keys.lock, holder);
        let result = c
            .release_remote(holder, lock.shared.sync.waiters() > 0)
            .await;
        renewal.end_release(&c.keys.lock, holder);
        lock.shared.sync.release(holder);
        match result {
            Ok(-1) => {
                tracing::debug!("not held");
                Err(Error::not_held(c.label.to_string(), holder))
            }
            Ok(n) => {
                tracing::debug!(remaining = n, "released");
                u32::try_from(n).map_err(|_| {
                    crate::client::unexpected_reply("release script", c.client.address(), n)
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "release failed; the entry ends with its lease");
                Err(e)
            }
        }
    }
    .instrument(span)
    .await
}

impl LockGuard for SingleLockGuard {
    fn holder(&self) -> HolderId {
        self.holder
    }

    fn fencing_token(&self) -> FencingToken {
        self.token
    }

    fn lease(&self) -> &LeaseWatch {
        &self.watch
    }

    /// Releases one level; see the trait. A dropped `unlock` future still completes its
    /// release in the background (exactly once).
    fn unlock(mut self) -> impl Future<Output = Result<u32>> + Send {
        self.released = true;
        let handle = self.lock.client().runtime().clone();
        Detached::new(
            self.lock
                .client()
                .on_runtime(release(self.lock.clone(), self.holder)),
            handle,
        )
    }
}

impl Drop for SingleLockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        tracing::debug!(lock = %self.lock.shared.competitor().label, holder = %self.holder,
            "guard dropped without unlock; releasing in the background");
        let release = release(self.lock.clone(), self.holder);
        self.lock.client().spawn(async move {
            let _ = release.await;
        });
    }
}

impl fmt::Debug for SingleLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SingleLockGuard")
            .field("lock", &self.lock.shared.competitor().label)
            .field("holder", &self.holder)
            .field("token", &self.token)
            .field("depth", &self.depth)
            .field("deadline", &self.watch.deadline())
            .finish()
    }
}
