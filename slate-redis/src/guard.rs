//! The guard of a [`SingleLock`] hold.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use slate_core::detach::Detached;
use std::time::Instant;

use slate_core::{Error, FencingToken, HolderId, LeaseWatch, LockGuard, LossReason, Result};
use tracing::Instrument;

use crate::lock::SingleLock;

/// One level of a [`SingleLock`] hold: holder, fencing token, lease.
///
/// Release it with [`unlock`](Self::unlock) (async, reports the outcome) or
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
/// use slate_redis::{RedisClient, SingleLock};
///
/// # #[tokio::main] async fn main() -> slate_redis::Result<()> {
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
    /// The holder this guard holds the lock for.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let lock = slate_redis::SingleLock::builder(slate_redis::RedisClient::open("redis://127.0.0.1:6379")?, "a").build()?;
    /// let guard = lock.lock().await?;
    /// assert!(lock.is_held_by(guard.holder()).await?);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn holder(&self) -> HolderId {
        self.holder
    }

    /// The fencing token of this hold (the same for every re-entry of one holder): pass it to
    /// every store the critical section writes to.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let lock = slate_redis::SingleLock::builder(slate_redis::RedisClient::open("redis://127.0.0.1:6379")?, "a").build()?;
    /// let guard = lock.lock().await?;
    /// println!("writing with token {}", guard.fencing_token());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }

    /// The lease of this hold: deadline and loss signal.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let lock = slate_redis::SingleLock::builder(slate_redis::RedisClient::open("redis://127.0.0.1:6379")?, "a").build()?;
    /// let guard = lock.lock().await?;
    /// let watch = guard.lease().clone(); // hand it to the code that must stop on a loss
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn lease(&self) -> &LeaseWatch {
        &self.watch
    }

    /// The lease deadline on the monotonic clock (it moves with every renewal).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let lock = slate_redis::SingleLock::builder(slate_redis::RedisClient::open("redis://127.0.0.1:6379")?, "a").build()?;
    /// let guard = lock.lock().await?;
    /// assert!(guard.lease_deadline() > std::time::Instant::now());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn lease_deadline(&self) -> Instant {
        self.watch.deadline()
    }

    /// Whether the lease is lost (loss signalled, or the deadline passed).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let lock = slate_redis::SingleLock::builder(slate_redis::RedisClient::open("redis://127.0.0.1:6379")?, "a").build()?;
    /// let guard = lock.lock().await?;
    /// assert!(!guard.is_lost());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.watch.is_lost()
    }

    /// Completes when the lease is lost: race it against the critical section.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let lock = slate_redis::SingleLock::builder(slate_redis::RedisClient::open("redis://127.0.0.1:6379")?, "a").build()?;
    /// # async fn work() {}
    /// let guard = lock.lock().await?;
    /// tokio::select! {
    ///     () = work() => guard.unlock().await.map(drop)?,
    ///     reason = guard.lost() => eprintln!("lost the lock: {reason}"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub async fn lost(&self) -> LossReason {
        self.watch.lost().await
    }

    /// Releases one level and returns the holder's remaining hold count (0: this holder no
    /// longer holds the lock; see [`LockGuard::unlock`] for the one meaning every lock gives
    /// it).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let lock = slate_redis::SingleLock::builder(slate_redis::RedisClient::open("redis://127.0.0.1:6379")?, "a").build()?;
    /// let outer = lock.lock().await?;
    /// let inner = outer.reenter().await?;
    /// assert_eq!(outer.unlock().await?, 1); // any order: the inner level still holds it
    /// assert_eq!(inner.unlock().await?, 0);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the entry is gone (lease expired, force-unlocked);
    /// [`Error::Backend`] when Redis failed: the entry then ends with its lease.
    ///
    /// # Cancel safety
    ///
    /// A dropped `unlock` future still completes its release in the background, exactly once.
    pub fn unlock(mut self) -> impl Future<Output = Result<u32>> + Send {
        self.released = true;
        let handle = self.lock.client().runtime().clone();
        Detached::new(
            self.lock
                .client()
                .on_runtime(release(self.lock.clone(), self.holder)),
            handle,
        )
    }

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
    /// # use slate_redis::{RedisClient, SingleLock};
    /// # #[tokio::main] async fn main() -> slate_redis::Result<()> {
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
    /// # use slate_redis::{RedisClient, SingleLock};
    /// # #[tokio::main] async fn main() -> slate_redis::Result<()> {
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
    /// # use slate_redis::{RedisClient, SingleLock};
    /// # #[tokio::main] async fn main() -> slate_redis::Result<()> {
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
    /// Cancel safe, as [`SingleLock::acquire`].
    pub fn reenter(&self) -> impl Future<Output = Result<SingleLockGuard>> + Send + '_ {
        self.lock.lock_as(self.holder)
    }

    /// Releases one level from a thread (the thread twin of [`unlock`](Self::unlock)).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
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
    /// As [`unlock`](Self::unlock).
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
        rx.recv()
            .unwrap_or(Err(Error::closed("the client's tokio runtime")))
    }
}

/// Releases one level for `holder`: the last level goes to the next local waiter if it can
/// be passed (lock cohorting, no round trip); otherwise the remote release (as the hold's
/// remote holder), then the local one whatever the outcome.
async fn release(lock: SingleLock, holder: HolderId) -> Result<u32> {
    let c = lock.shared.competitor();
    let span = tracing::debug_span!("release", lock = %c.label, %holder);
    async {
        let sync = &lock.shared.sync;
        if sync.try_pass(holder) {
            tracing::debug!("passed to the next local holder");
            return Ok(0);
        }
        let remote = sync.remote_holder(holder);
        let renewal = &c.client.inner.renewal;
        let generation = renewal.begin_release(&c.keys.lock, remote);
        let result = c.release_remote(remote, sync.waiters() > 0).await;
        renewal.end_release(&c.keys.lock, remote, generation, matches!(result, Ok(0)));
        let remaining = lock.shared.sync.release(holder);
        match result {
            Ok(-1) => {
                tracing::debug!("not held");
                Err(Error::not_held(Arc::clone(&c.label), holder))
            }
            Ok(n) if n >= 0 => {
                // The local count and Redis's agree by construction (a re-entry after a lost
                // lease is refused, defect 4); the local one is what every backend returns.
                if i64::from(remaining) != n {
                    tracing::warn!(remaining, server = n, "local and server hold counts differ");
                }
                tracing::debug!(remaining, "released");
                Ok(remaining)
            }
            Ok(n) => Err(crate::client::unexpected_reply(
                "release script",
                c.client.address(),
                n,
            )),
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

    fn unlock(self) -> impl Future<Output = Result<u32>> + Send {
        SingleLockGuard::unlock(self)
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
