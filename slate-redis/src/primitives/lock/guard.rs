//! The guard of a [`SingleLock`] hold.

use std::future::Future;
use std::sync::Arc;

use slate_core::hold::{Held, Release};
use slate_core::{Error, Hold, HolderId, Result};
use tokio::runtime::Handle;
use tracing::Instrument;

use crate::primitives::lock::SingleLock;

/// One level of a [`SingleLock`] hold. It dereferences to its [`Hold`]: holder, fencing
/// token, depth, lease and loss signal.
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
    held: Held<Releasing>,
}

/// How a [`SingleLockGuard`] ends: the lock handle.
pub(crate) struct Releasing(SingleLock);

impl Release for Releasing {
    fn release(
        &mut self,
        hold: &Hold,
    ) -> impl Future<Output = Result<u32>> + Send + 'static + use<> {
        release(self.0.clone(), hold.holder())
    }

    fn runtime(&self) -> &Handle {
        self.0.client().runtime()
    }

    fn label(&self) -> &str {
        &self.0.shared.competitor().label
    }

    fn meter(&self) -> Option<&slate_core::metrics::Meter> {
        Some(&self.0.shared.competitor().meter)
    }
}

impl SingleLockGuard {
    pub(crate) fn new(lock: SingleLock, hold: Hold) -> Self {
        SingleLockGuard {
            held: Held::new(hold, Releasing(lock)),
        }
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
        &self.held.backend().0
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
        self.lock().lock_as(self.holder())
    }

    /// Ends the guard with its release begun ([`RemoteRelease::begin`]) for a caller that
    /// runs the remote part itself (a multi-lock's one call for several names): `None` when
    /// the level was passed to a local waiter and nothing is left to do. The caller must
    /// finish what it gets, also when its own future is dropped.
    pub(crate) fn into_release(self) -> Option<RemoteRelease> {
        self.held
            .end_with(|r, hold| RemoteRelease::begin(r.0.clone(), hold.holder()))
    }
}

/// Releases one level for `holder`: the last level goes to the next local waiter if it can
/// be passed (lock cohorting, no round trip); otherwise the remote release (as the hold's
/// remote holder), then the local one whatever the outcome.
async fn release(lock: SingleLock, holder: HolderId) -> Result<u32> {
    let span = tracing::debug_span!("release", lock = %lock.shared.competitor().label, %holder);
    async {
        match RemoteRelease::begin(lock, holder) {
            None => Ok(0),
            Some(r) => r.run().await,
        }
    }
    .instrument(span)
    .await
}

/// One level's release whose local part is decided and whose remote release is to run: the
/// remote release's arguments, and what ends the level locally once it has answered
/// ([`finish`](Self::finish)). A multi-lock runs the remote releases of several names in one
/// script call between the two.
pub(crate) struct RemoteRelease {
    pub(crate) lock: SingleLock,
    holder: HolderId,
    /// The holder of the remote hold (the one that acquired it, if it was passed).
    pub(crate) remote: HolderId,
    /// Whether tasks of this process wait for the lock (the release keeps the turn).
    pub(crate) local_waiters: bool,
    generation: Option<u64>,
}

impl RemoteRelease {
    /// Begins releasing one level of `holder`'s: `None` when it was passed to the next local
    /// waiter (nothing is left to do), else the remote release to run.
    pub(crate) fn begin(lock: SingleLock, holder: HolderId) -> Option<Self> {
        let sync = &lock.shared.sync;
        if sync.try_pass(holder) {
            tracing::debug!(lock = %lock.shared.competitor().label, %holder, "passed to the next local holder");
            return None;
        }
        let c = lock.shared.competitor();
        let remote = sync.remote_holder(holder);
        let generation = c.client.inner.renewal.begin_release(&c.keys.lock, remote);
        let local_waiters = sync.waiters() > 0;
        Some(RemoteRelease {
            lock,
            holder,
            remote,
            local_waiters,
            generation,
        })
    }

    /// Runs the remote release alone (`release.lua`), then [`finish`](Self::finish)es.
    pub(crate) async fn run(self) -> Result<u32> {
        let c = self.lock.shared.competitor();
        let result = c.release_remote(self.remote, self.local_waiters).await;
        self.finish(result)
    }

    /// Ends the level locally with the remote release's `result` (`release.lua`'s reply),
    /// whatever it is, and answers the holder's remaining count.
    pub(crate) fn finish(self, result: Result<i64>) -> Result<u32> {
        let RemoteRelease {
            lock,
            holder,
            remote,
            local_waiters,
            generation,
        } = self;
        let c = lock.shared.competitor();
        let released = matches!(result, Ok(0));
        c.client
            .inner
            .renewal
            .end_release(&c.keys.lock, remote, generation, released);
        if local_waiters && released {
            // The release kept the turn for local waiters, who may have left meanwhile. Asked
            // before the local release wakes them: after it, a woken waiter may already have
            // used the turn and been served with the rest, and this would take the drained
            // queue for waiters that left and send a needless leave (seen under load).
            c.turn_kept();
        }
        let remaining = lock.shared.sync.release(holder);
        match result {
            Ok(-1) => {
                tracing::debug!(lock = %c.label, %holder, "not held");
                Err(Error::not_held(Arc::clone(&c.label), holder))
            }
            Ok(n) if n >= 0 => {
                // The local count and Redis's agree by construction (a re-entry after a lost
                // lease is refused, defect 4); the local one is what every backend returns.
                if i64::from(remaining) != n {
                    tracing::warn!(lock = %c.label, %holder, remaining, server = n, "local and server hold counts differ");
                }
                tracing::debug!(lock = %c.label, %holder, remaining, "released");
                Ok(remaining)
            }
            Ok(n) => Err(crate::client::unexpected_reply(
                "release script",
                c.client.address(),
                n,
            )),
            Err(e) => {
                tracing::warn!(lock = %c.label, %holder, error = %e, "release failed; the entry ends with its lease");
                Err(e)
            }
        }
    }
}

slate_core::guard_surface!(
    SingleLockGuard,
    slate_redis,
    setup = "# let lock = slate_redis::SingleLock::builder(slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\")?, \"a\").build()?;\nlet guard = lock.lock().await?;",
    blocking_setup = "# let rt = tokio::runtime::Runtime::new()?;\n# let client = rt.block_on(async { slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\") })?;\n# let lock = slate_redis::SingleLock::builder(&client, \"a\").build()?;\nlet guard = lock.blocking_lock()?;",
);

#[cfg(test)]
mod tests {
    use slate_aqs::Competitor;

    use super::*;
    use crate::RedisClient;

    /// The futures of an acquire attempt are pointers to their state (`on_runtime` boxes
    /// it), so the layers around them (the synchronizer's in-flight attempt) move a pointer.
    /// Unboxed, the attempt was 18,896 bytes, copied at each layer of every acquisition
    /// (`memmove` was 8 % of a per-entity run's samples).
    #[tokio::test]
    async fn the_attempt_futures_are_pointers_to_their_state() {
        let client = RedisClient::open("redis://127.0.0.1:1").unwrap();
        let lock = SingleLock::builder(&client, "sizes").build().unwrap();
        let holder = HolderId::new();
        let attempt = lock.shared.competitor().attempt(holder);
        let passable = lock.shared.competitor().attempt_passable(holder);
        let reentry = lock.shared.competitor().reenter(holder);
        for (what, size) in [
            ("attempt", std::mem::size_of_val(&attempt)),
            ("attempt_passable", std::mem::size_of_val(&passable)),
            ("reenter", std::mem::size_of_val(&reentry)),
        ] {
            assert!(size <= 128, "the {what} future is {size} bytes");
        }
    }
}
