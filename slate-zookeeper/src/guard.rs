//! The guard of a [`ZkLock`] hold.

use std::future::Future;
use std::sync::Arc;

use slate_core::hold::{Held, Release};
use slate_core::{Error, Hold, HolderId, Result};
use tokio::runtime::Handle;
use tracing::Instrument;

use crate::lock::{ZkLock, delete_until_gone};

/// One level of a [`ZkLock`] hold. It dereferences to its [`Hold`]: holder, fencing token,
/// depth, lease and loss signal.
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
    held: Held<Releasing>,
}

/// How a [`ZkLockGuard`] ends: the lock handle and the znode of the hold it is a level of.
pub(crate) struct Releasing {
    lock: ZkLock,
    path: Arc<str>,
}

impl Release for Releasing {
    fn release(
        &mut self,
        hold: &Hold,
    ) -> impl Future<Output = Result<u32>> + Send + 'static + use<> {
        release(self.lock.clone(), hold.holder(), Arc::clone(&self.path))
    }

    fn runtime(&self) -> &Handle {
        self.lock.client().runtime()
    }

    fn label(&self) -> &str {
        &self.lock.shared.competitor().ctx.label
    }

    fn meter(&self) -> Option<&slate_core::metrics::Meter> {
        Some(&self.lock.shared.competitor().ctx.meter)
    }
}

impl ZkLockGuard {
    pub(crate) fn new(lock: ZkLock, path: Arc<str>, hold: Hold) -> Self {
        ZkLockGuard {
            held: Held::new(hold, Releasing { lock, path }),
        }
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
        &self.held.backend().lock
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
        self.lock()
            .acquire(self.holder(), slate_core::Wait::Forever)
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

slate_core::guard_surface!(
    ZkLockGuard,
    slate_zookeeper,
    setup = "# let lock = slate_zookeeper::ZkLock::builder(&slate_zookeeper::ZkClient::connect(\"127.0.0.1:2181\").await?, \"a\").build()?;\nlet guard = lock.lock().await?;",
    blocking_setup = "# let rt = tokio::runtime::Runtime::new()?;\n# let client = rt.block_on(slate_zookeeper::ZkClient::connect(\"127.0.0.1:2181\"))?;\n# let lock = slate_zookeeper::ZkLock::builder(&client, \"a\").build()?;\nlet guard = lock.blocking_lock()?;",
);
