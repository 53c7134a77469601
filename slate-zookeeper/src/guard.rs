//! The guard of a [`ZkLock`] hold.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use slate_core::detach::Detached;
use slate_core::{Error, FencingToken, HolderId, LeaseWatch, LockGuard, LossReason, Result};
use tracing::Instrument;

use crate::lock::{ZkLock, delete_until_gone};

/// One level of a [`ZkLock`] hold: holder, fencing token, lease.
///
/// Release it with [`unlock`](Self::unlock) (async, reports the outcome) or
/// [`blocking_unlock`](Self::blocking_unlock) (threads). Dropping it without either hands the
/// release to a task on the client's runtime: nothing blocks, and the holder's znode is
/// deleted one round trip later (or goes with the session if ZooKeeper cannot be reached).
///
/// Re-entrant guards of one holder share one lease (the session, checked once per third of
/// its timeout) and one fencing token (the creation zxid of the holder's znode).
///
/// # Examples
///
/// ```no_run
/// ///
/// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
/// let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
/// let lock = slate_zookeeper::ZkLock::builder(&client, "orders").build()?;
/// let outer = lock.lock().await?;
/// let inner = outer.reenter().await?;
/// assert_eq!(inner.fencing_token(), outer.fencing_token());
/// assert_eq!(inner.unlock().await?, 1);
/// assert_eq!(outer.unlock().await?, 0);
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the lock in the background; call unlock().await to see the outcome"]
pub struct ZkLockGuard {
    lock: ZkLock,
    holder: HolderId,
    /// The znode of the hold this guard is a level of.
    path: Arc<str>,
    token: FencingToken,
    depth: u32,
    watch: LeaseWatch,
    released: bool,
}

impl ZkLockGuard {
    /// The holder this guard holds the lock for.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_zookeeper::Result<()> {
    /// # let lock = slate_zookeeper::ZkLock::builder(&slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?, "a").build()?;
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
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_zookeeper::Result<()> {
    /// # let lock = slate_zookeeper::ZkLock::builder(&slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?, "a").build()?;
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
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_zookeeper::Result<()> {
    /// # let lock = slate_zookeeper::ZkLock::builder(&slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?, "a").build()?;
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
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_zookeeper::Result<()> {
    /// # let lock = slate_zookeeper::ZkLock::builder(&slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?, "a").build()?;
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
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_zookeeper::Result<()> {
    /// # let lock = slate_zookeeper::ZkLock::builder(&slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?, "a").build()?;
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
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_zookeeper::Result<()> {
    /// # let lock = slate_zookeeper::ZkLock::builder(&slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?, "a").build()?;
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
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_zookeeper::Result<()> {
    /// # let lock = slate_zookeeper::ZkLock::builder(&slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?, "a").build()?;
    /// let outer = lock.lock().await?;
    /// let inner = outer.reenter().await?;
    /// assert_eq!(outer.unlock().await?, 1); // any order: the inner level still holds it
    /// assert_eq!(inner.unlock().await?, 0);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the hold's znode is gone (session expired, force-unlocked);
    /// [`Error::Backend`] when ZooKeeper failed: the delete is retried in the background until
    /// it succeeds or the session ends (which deletes the znode).
    ///
    /// # Cancel safety
    ///
    /// A dropped `unlock` future still completes its release in the background, exactly once.
    pub fn unlock(mut self) -> impl Future<Output = Result<u32>> + Send {
        self.released = true;
        let handle = self.lock.client().runtime().clone();
        Detached::new(
            self.lock.client().on_runtime(release(
                self.lock.clone(),
                self.holder,
                Arc::clone(&self.path),
            )),
            handle,
        )
    }

    pub(crate) fn new(
        lock: ZkLock,
        holder: HolderId,
        path: Arc<str>,
        token: FencingToken,
        depth: u32,
        watch: LeaseWatch,
    ) -> Self {
        ZkLockGuard {
            lock,
            holder,
            path,
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
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// # let lock = slate_zookeeper::ZkLock::builder(&slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?, "a").build()?;
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
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// # let lock = slate_zookeeper::ZkLock::builder(&slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?, "a").build()?;
    /// let guard = lock.lock().await?;
    /// assert_eq!(guard.lock().name(), lock.name());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn lock(&self) -> &ZkLock {
        &self.lock
    }

    /// Acquires the lock once more for this guard's holder (a re-entry: it does not wait for
    /// other holders, raises the hold count and keeps the fencing token).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// # let lock = slate_zookeeper::ZkLock::builder(&slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?, "a").build()?;
    /// let outer = lock.lock().await?;
    /// let inner = outer.reenter().await?;
    /// assert_eq!(inner.depth(), 2);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when the hold ended (session expired, force-unlocked): a
    /// re-entry never starts a new hold. Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`ZkLock::acquire`].
    pub fn reenter(&self) -> impl Future<Output = Result<ZkLockGuard>> + Send + '_ {
        self.lock.acquire(self.holder, slate_core::Wait::Forever)
    }

    /// Releases one level from a thread (the thread twin of [`unlock`](Self::unlock)).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let rt = tokio::runtime::Runtime::new()?;
    /// # let client = rt.block_on(slate_zookeeper::ZkClient::connect("127.0.0.1:2181"))?;
    /// # let lock = slate_zookeeper::ZkLock::builder(&client, "a").build()?;
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
                "ZkLockGuard::blocking_unlock was called inside a tokio runtime, where \
                 blocking would stall the runtime's threads; use unlock().await instead"
            );
        }
        self.released = true;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let release = release(self.lock.clone(), self.holder, Arc::clone(&self.path));
        self.lock.client().spawn(async move {
            let _ = tx.send(release.await);
        });
        rx.recv()
            .unwrap_or(Err(Error::closed("the client's tokio runtime")))
    }
}

/// Releases one level for `holder`: the last level deletes the holder's znode (which wakes
/// the next process's watch), then the local release lets the next local waiter in.
async fn release(lock: ZkLock, holder: HolderId, path: Arc<str>) -> Result<u32> {
    let c = lock.shared.competitor();
    let span = tracing::debug_span!("release", lock = %c.ctx.label, %holder);
    async {
        let result = match c.take_level(holder, &path) {
            Ok(level) => {
                let found = match level.delete {
                    None => Ok(true),
                    Some((znode, session)) => {
                        delete_until_gone(c.ctx.client.clone(), znode, session).await
                    }
                };
                match found {
                    Ok(true) if level.held => Ok(()),
                    Ok(_) => {
                        tracing::debug!("not held: this guard's hold had ended");
                        Err(Error::not_held(Arc::clone(&c.ctx.label), holder))
                    }
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        let remaining = lock.shared.sync.release(holder);
        tracing::debug!(remaining, ok = result.is_ok(), "released");
        result.map(|()| remaining)
    }
    .instrument(span)
    .await
}

impl LockGuard for ZkLockGuard {
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
        ZkLockGuard::unlock(self)
    }
}

impl Drop for ZkLockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        tracing::debug!(lock = %self.lock.shared.competitor().ctx.label, holder = %self.holder,
            "guard dropped without unlock; releasing in the background");
        let release = release(self.lock.clone(), self.holder, Arc::clone(&self.path));
        self.lock.client().spawn(async move {
            let _ = release.await;
        });
    }
}

impl fmt::Debug for ZkLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLockGuard")
            .field("lock", &self.lock.shared.competitor().ctx.label)
            .field("holder", &self.holder)
            .field("token", &self.token)
            .field("depth", &self.depth)
            .field("deadline", &self.watch.deadline())
            .finish()
    }
}
