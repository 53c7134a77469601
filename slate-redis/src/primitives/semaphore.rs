//! The distributed semaphore with leased permits.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use slate_core::hold::Held;
use slate_core::{Error, HolderId, LockName, LockOptions, LockOptionsBuilder, Result, Wait};
use tracing::Instrument;

use crate::RedisClient;
use crate::primitives::lock::ClientSource;
use crate::primitives::shared::{Kind, SharedCompetitor, SharedRelease, SharedState, SharedStatus};

/// A distributed semaphore: `n` permits shared by every process, each taken for a lease.
///
/// Redisson's *permit-expirable semaphore*: every acquisition's permits are held under a
/// lease that the client's renewal service renews while its [`SemaphorePermit`] lives, so
/// the permits of a crashed holder come back when its lease ends instead of being lost for
/// good (a plain counting semaphore on Redis leaks them).
///
/// ## Behaviour
///
/// - [`acquire(k)`](Self::acquire) takes `k` permits (at least 1, at most the capacity) and
///   returns a permit guard; its permits come back on [`SemaphorePermit::unlock`], on drop
///   (in the background), or when its lease ends.
/// - **First come, first served** between processes (and inside one, through the local
///   queue): a request for many permits is not overtaken by a stream of small ones; every
///   request behind it that fits together with it comes in with it.
/// - **Capacity**: stored in Redis (`<prefix>{<name>}:sem:permits`), set to the builder's
///   count by the first acquisition when absent; [`set_permits`](Self::set_permits) changes
///   it for everyone. Holders above a lowered capacity keep their permits until they release
///   them (nothing is revoked); nobody new comes in until the permits in use are below the
///   new capacity.
/// - Each acquisition gets its own fencing token (above every earlier one) and lease watch.
///
/// # Examples
///
/// ```no_run
/// use slate_redis::{RedisClient, Semaphore};
///
/// # #[tokio::main] async fn main() -> slate_redis::Result<()> {
/// let client = RedisClient::open("redis://127.0.0.1:6379")?;
/// let downloads = Semaphore::builder(&client, "downloads", 4).build()?;
/// let permit = downloads.acquire(1).await?;
/// // ... at most 4 downloads run at once, across every process ...
/// permit.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    state: Arc<SharedState>,
}

/// Builds a [`Semaphore`] (see [`Semaphore::builder`]).
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
/// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
/// let sem = slate_redis::Semaphore::builder(&client, "downloads", 4)
///     .lease(std::time::Duration::from_secs(10))
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until build() is called"]
pub struct SemaphoreBuilder {
    source: ClientSource,
    name: Result<LockName>,
    permits: u32,
    options: LockOptionsBuilder,
}

crate::primitives::shared::shared_builder_setters!(
    SemaphoreBuilder,
    "slate_redis::Semaphore::builder(&client, \"a\", 4)"
);

impl SemaphoreBuilder {
    /// Builds the semaphore (nothing is sent to Redis).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let sem = slate_redis::Semaphore::builder(&client, "downloads", 4).build()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad name or option, 0 permits or more than 2^30, or a
    /// name this client already uses for another kind of lock or with other options.
    pub fn build(self) -> Result<Semaphore> {
        let name = self.name?;
        check_permits("permits", self.permits)?;
        let options = self.options.build()?;
        let kind = Kind::Semaphore {
            permits: self.permits,
        };
        let state = SharedCompetitor::state(&self.source.0, name, options, kind, false)?;
        Ok(Semaphore { state })
    }
}

/// The most permits a semaphore may have (the scripts count in Lua numbers, exact to 2^53;
/// 2^30 leaves room for any sum of requests).
pub const MAX_PERMITS: u32 = 1 << 30;

fn check_permits(what: &'static str, n: u32) -> Result<()> {
    if n == 0 || n > MAX_PERMITS {
        return Err(Error::invalid_input(
            what,
            format!("{n} permits"),
            format!("use between 1 and {MAX_PERMITS} permits"),
        ));
    }
    Ok(())
}

crate::primitives::shared::shared_lock_accessors!(
    Semaphore,
    "slate_redis::Semaphore::builder(&client, \"downloads\", 4).build()?",
    "downloads",
    "sem"
);

impl Semaphore {
    /// Starts building a semaphore named `name` with `permits` permits on `client`.
    ///
    /// `permits` is the capacity the first acquisition stores when Redis has none for this
    /// name; an existing capacity (set earlier, or by [`set_permits`](Self::set_permits))
    /// wins.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let sem = slate_redis::Semaphore::builder(&client, "downloads", 4).build()?;
    /// # Ok(()) }
    /// ```
    pub fn builder(
        client: impl Into<ClientSource>,
        name: impl AsRef<[u8]>,
        permits: u32,
    ) -> SemaphoreBuilder {
        SemaphoreBuilder {
            source: client.into(),
            name: LockName::new(name),
            permits,
            options: LockOptionsBuilder::default(),
        }
    }

    /// Takes `permits` permits, waiting as `wait` allows: the general form behind
    /// [`acquire`](Self::acquire), [`try_acquire`](Self::try_acquire) and
    /// [`try_acquire_for`](Self::try_acquire_for), for callers that pick the wait at run time
    /// (as `slate run --permits` does).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let sem = slate_redis::Semaphore::builder(&client, "downloads", 4).build()?;
    /// let permit = sem.acquire_waiting(2, slate_redis::Wait::Forever).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire); [`Error::Busy`] under [`Wait::Immediate`],
    /// [`Error::Timeout`] when the wait runs out.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    pub fn acquire_waiting(
        &self,
        permits: u32,
        wait: Wait,
    ) -> impl Future<Output = Result<SemaphorePermit>> + Send + '_ {
        self.acquire_with(permits, wait)
    }

    fn acquire_with(
        &self,
        permits: u32,
        wait: Wait,
    ) -> impl Future<Output = Result<SemaphorePermit>> + Send + '_ {
        let holder = HolderId::new();
        let span = tracing::debug_span!("acquire", lock = %self.state.competitor().label, %holder, permits);
        async move {
            check_permits("permits asked", permits)?;
            let _wanting = self.state.competitor().want(holder, permits);
            let grant = self.state.sync.acquire_shared(holder, wait).await?;
            Ok(SemaphorePermit {
                held: SharedRelease::held(&self.state, holder, &grant),
                permits,
            })
        }
        .instrument(span)
    }

    /// Takes `permits` permits, waiting as long as it takes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let sem = slate_redis::Semaphore::builder(&client, "downloads", 4).build()?;
    /// let two = sem.acquire(2).await?;
    /// assert_eq!(two.permits(), 2);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for 0 permits or more than the capacity (it could never be
    /// granted); backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future leaves the queue (the next waiter takes its turn),
    /// and permits granted after the drop are given back in the background.
    pub fn acquire(
        &self,
        permits: u32,
    ) -> impl Future<Output = Result<SemaphorePermit>> + Send + '_ {
        self.acquire_with(permits, Wait::Forever)
    }

    /// Takes `permits` permits if they are free now and nobody waits before (one round trip
    /// at most).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let sem = slate_redis::Semaphore::builder(&client, "downloads", 4).build()?;
    /// if let Some(permit) = sem.try_acquire(1).await? {
    ///     permit.unlock().await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire); busy is `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire(&self, permits: u32) -> Result<Option<SemaphorePermit>> {
        slate_core::lock::busy_to_none(self.acquire_with(permits, Wait::Immediate).await)
    }

    /// Takes `permits` permits, waiting at most `d`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let sem = slate_redis::Semaphore::builder(&client, "downloads", 4).build()?;
    /// let permit = sem.try_acquire_for(1, std::time::Duration::from_secs(1)).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire); [`Error::Timeout`] when `d` passes first.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    pub fn try_acquire_for(
        &self,
        permits: u32,
        d: Duration,
    ) -> impl Future<Output = Result<SemaphorePermit>> + Send + '_ {
        self.acquire_with(permits, Wait::for_duration(d))
    }

    /// The blocking twin of [`acquire`](Self::acquire), for threads.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let sem = slate_redis::Semaphore::builder(&client, "downloads", 4).build()?;
    /// let permit = sem.blocking_acquire(1)?;
    /// permit.blocking_unlock()?;
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Panics
    ///
    /// Inside a tokio runtime (use `acquire().await` there).
    pub fn blocking_acquire(&self, permits: u32) -> Result<SemaphorePermit> {
        self.blocking_acquire_with(permits, Wait::Forever, "Semaphore::blocking_acquire")
    }

    /// The blocking twin of [`try_acquire_for`](Self::try_acquire_for), for threads.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let sem = slate_redis::Semaphore::builder(&client, "downloads", 4).build()?;
    /// let permit = sem.blocking_try_acquire_for(1, std::time::Duration::from_secs(1))?;
    /// permit.blocking_unlock()?;
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`try_acquire_for`](Self::try_acquire_for).
    ///
    /// # Panics
    ///
    /// Inside a tokio runtime (use `try_acquire_for().await` there).
    pub fn blocking_try_acquire_for(&self, permits: u32, d: Duration) -> Result<SemaphorePermit> {
        self.blocking_acquire_with(
            permits,
            Wait::for_duration(d),
            "Semaphore::blocking_try_acquire_for",
        )
    }

    fn blocking_acquire_with(
        &self,
        permits: u32,
        wait: Wait,
        what: &str,
    ) -> Result<SemaphorePermit> {
        slate_core::blocking::assert_outside_runtime(what);
        check_permits("permits asked", permits)?;
        let holder = HolderId::new();
        let _wanting = self.state.competitor().want(holder, permits);
        let grant = self.state.sync.blocking_acquire_shared(holder, wait)?;
        Ok(SemaphorePermit {
            held: SharedRelease::held(&self.state, holder, &grant),
            permits,
        })
    }

    /// Sets the capacity for every process, and answers the permits in use. Waiters are woken
    /// to try again. Holders above a lowered capacity keep their permits until they release
    /// them; nobody new comes in until the use is below it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let sem = slate_redis::Semaphore::builder(&client, "downloads", 4).build()?;
    /// let in_use = sem.set_permits(8).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for 0 or more than [`MAX_PERMITS`]; backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: one script call, applied whole or not at all.
    pub async fn set_permits(&self, permits: u32) -> Result<u64> {
        check_permits("permits", permits)?;
        let in_use: u64 = self.state.competitor().admin("permits", permits).await?;
        tracing::info!(lock = %self.state.competitor().label, permits, in_use, "capacity set");
        Ok(in_use)
    }

    /// Who holds permits, and the capacity, as the server sees them.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let sem = slate_redis::Semaphore::builder(&client, "downloads", 4).build()?;
    /// let _p = sem.acquire(3).await?;
    /// assert_eq!(sem.status().await?.in_use, 3);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub async fn status(&self) -> Result<SharedStatus> {
        self.state.competitor().inspect().await
    }

    /// Gives back every holder's permits (an operator's action: their renewals report the
    /// loss) and wakes every waiter; answers how many holders there were.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let sem = slate_redis::Semaphore::builder(&client, "downloads", 4).build()?;
    /// let dropped = sem.force_unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: one script call.
    pub async fn force_unlock(&self) -> Result<u64> {
        let dropped: u64 = self.state.competitor().admin("clear", 0).await?;
        tracing::warn!(lock = %self.state.competitor().label, dropped, "force unlock");
        Ok(dropped)
    }

    /// The name [`force_unlock`](Self::force_unlock) had before every primitive's forced
    /// release took one name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let sem = slate_redis::Semaphore::builder(&client, "downloads", 4).build()?;
    /// let dropped = sem.force_unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`force_unlock`](Self::force_unlock).
    ///
    /// # Cancel safety
    ///
    /// As [`force_unlock`](Self::force_unlock).
    #[deprecated(since = "0.1.0", note = "renamed force_unlock, as on every lock")]
    pub async fn force_release_all(&self) -> Result<u64> {
        self.force_unlock().await
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.state.competitor();
        f.debug_struct("Semaphore")
            .field("name", &c.name)
            .field("options", &c.options)
            .field("address", &c.client.address())
            .finish()
    }
}

/// Permits of a [`Semaphore`], held under a lease.
///
/// Give them back with [`unlock`](Self::unlock) (or [`blocking_unlock`](Self::blocking_unlock));
/// dropped without either, they are given back by a task on the client's runtime, and if
/// Redis cannot be reached they come back when the lease ends.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
/// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
/// let sem = slate_redis::Semaphore::builder(&client, "downloads", 4).build()?;
/// let permit = sem.acquire(2).await?;
/// permit.unlock().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the permit gives it back in the background; call unlock().await to see the outcome"]
pub struct SemaphorePermit {
    held: Held<SharedRelease>,
    permits: u32,
}

impl SemaphorePermit {
    /// How many permits this guard holds.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let sem = slate_redis::Semaphore::builder(&client, "downloads", 4).build()?;
    /// assert_eq!(sem.acquire(3).await?.permits(), 3);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn permits(&self) -> u32 {
        self.permits
    }
}

slate_core::guard_surface!(
    SemaphorePermit,
    slate_redis,
    setup = "# let client = slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\")?;\nlet sem = slate_redis::Semaphore::builder(&client, \"downloads\", 4).build()?;\nlet guard = sem.acquire(1).await?;",
    blocking_setup = "# let client = slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\")?;\nlet sem = slate_redis::Semaphore::builder(&client, \"downloads\", 4).build()?;\nlet guard = sem.blocking_acquire(1)?;",
    permits = |guard| Some(u64::from(guard.permits)),
);
