//! The distributed read-write lock.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

#[cfg(doc)]
use slate_core::Error;
use slate_core::hold::Held;
use slate_core::{HolderId, LockName, LockOptions, LockOptionsBuilder, Result, Wait};
use tracing::Instrument;

use crate::RedisClient;
use crate::primitives::lock::ClientSource;
use crate::primitives::shared::{
    Kind, SharedCompetitor, SharedGrant, SharedRelease, SharedState, SharedStatus,
};

/// A distributed read-write lock on one Redis deployment: many readers or one writer.
///
/// Built once with [`RwLock::builder`] and cloned wherever it is needed. Every handle built for
/// the same name from one [`RedisClient`] shares one local queue, as the
/// [`SingleLock`](crate::SingleLock)'s do.
///
/// ## Behaviour
///
/// - **Readers share, writers exclude**: any number of holders read at once (across
///   processes); a writer holds alone. Redis keeps every holder's levels and permits in one
///   hash (`<prefix>{<name>}:rw`, Redisson's layout: a read takes one permit, a write all of
///   them) and each holder's lease in a sorted set beside it.
/// - **Fair between modes**: waiting processes are served in arrival order (a sorted set of
///   queue ids); a reader that arrives after a waiting writer waits behind it, so a stream of
///   readers never starves a writer. All readers at the head of the queue come in together.
///   Inside a process, the local queue keeps the same order (the synchronizer's shared mode).
/// - **Reentrancy per holder**, in both modes (keyed by [`HolderId`]; re-enter through the
///   guard or a [`HolderId::scope`]). A writer may take the read lock its write covers
///   ([`RwLockWriteGuard::read`]) and **downgrade** ([`RwLockWriteGuard::downgrade`]) without
///   letting another writer in between. A reader never upgrades: asking to write while
///   reading is refused, since two readers doing it would wait for each other for ever.
/// - **Fencing tokens**: each hold takes the next value of a persistent counter
///   (`<prefix>{<name>}:rw:fence`), so a writer's token is above every earlier reader's and
///   writer's; re-entries and covered reads keep the holder's token.
/// - **Leases** are renewed by the client's renewal service and end with a loss signal, as
///   the single lock's do (see [`Hold::lost`](crate::Hold::lost)); a crashed holder's hold ends with
///   its lease.
/// - **Release messages** wake exactly the waiting processes that now fit (the readers at the
///   head, or the writer at the head), on `<prefix>{<name>}:rw:released`.
///
/// # Examples
///
/// ```no_run
/// use slate_redis::{RedisClient, RwLock};
///
/// # #[tokio::main] async fn main() -> slate_redis::Result<()> {
/// let client = RedisClient::open("redis://127.0.0.1:6379")?;
/// let config = RwLock::builder(&client, "config").build()?;
/// let a = config.read().await?;
/// let b = config.read().await?; // readers share
/// assert!(config.try_write().await?.is_none());
/// a.unlock().await?;
/// b.unlock().await?;
/// let w = config.write().await?;
/// let r = w.downgrade().await?; // no writer can slip in between
/// r.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RwLock {
    state: Arc<SharedState>,
}

/// Builds a [`RwLock`] (see [`RwLock::builder`]).
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
/// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
/// let lock = slate_redis::RwLock::builder(&client, "config")
///     .lease(std::time::Duration::from_secs(10))
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until build() is called"]
pub struct RwLockBuilder {
    source: ClientSource,
    name: Result<LockName>,
    options: LockOptionsBuilder,
    exclude_single: bool,
}

crate::primitives::shared::shared_builder_setters!(
    RwLockBuilder,
    "slate_redis::RwLock::builder(&client, \"a\")"
);

impl RwLockBuilder {
    /// Builds the lock (nothing is sent to Redis).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad name or option, or a name this client already uses
    /// for another kind of lock or with other options.
    pub fn build(self) -> Result<RwLock> {
        let name = self.name?;
        let options = self.options.build()?;
        let state = SharedCompetitor::state(
            &self.source.0,
            name,
            options,
            Kind::RwLock,
            self.exclude_single,
        )?;
        Ok(RwLock { state })
    }

    /// Treats the [`SingleLock`](crate::SingleLock) of the same name and prefix as a writer:
    /// while it is held, no read or write hold is granted (a waiter asks again at its spin
    /// wait, or when that lock's lease would end: its release messages go to its own
    /// channel). This is how `slate run --read` waits for plain `slate run` jobs of the same
    /// name; the other direction (a single-lock holder waiting for the readers to leave) is
    /// the single lock's caller's to do, by holding it and waiting until
    /// [`RwLock::status`] shows no holder: readers cannot come in meanwhile. Default: off
    /// (the two locks of one name are independent).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::RwLock::builder(&client, "nightly")
    ///     .exclude_single_lock(true)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn exclude_single_lock(mut self, on: bool) -> Self {
        self.exclude_single = on;
        self
    }
}

crate::primitives::shared::shared_lock_accessors!(
    RwLock,
    "slate_redis::RwLock::builder(&client, \"config\").build()?",
    "config",
    "rw"
);

/// Writes one mode's family of methods (the read lock's or the write lock's): the plain,
/// `_as`, `try_`, `try_.._for` forms and their blocking twins, over the mode's `*_with`.
macro_rules! mode_methods {
    (
        mode = $mode:literal,
        guard = $guard:ident,
        with = $with:ident,
        blocking_acquire = $blocking_acquire:ident,
        [$plain:ident, $as_:ident, $try_:ident, $try_for:ident],
        [$blocking:ident, $blocking_try_for:ident, $blocking_until:ident],
        errors = $errors:literal,
        cancel = $cancel:literal,
        as_doc = $as_doc:literal,
        as_example = $as_example:literal,
        try_example = $try_example:literal $(,)?
    ) => {
        #[doc = concat!("Takes the ", $mode, " lock, waiting as long as it takes.")]
        ///
        /// The holder is the current [`HolderId::scope`]'s, else a fresh one.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
        /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
        /// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
        #[doc = concat!("let guard = lock.", stringify!($plain), "().await?;")]
        /// guard.unlock().await?;
        /// # Ok(()) }
        /// ```
        ///
        /// # Errors
        ///
        #[doc = $errors]
        ///
        /// # Cancel safety
        ///
        #[doc = $cancel]
        pub fn $plain(&self) -> impl Future<Output = Result<$guard>> + Send + '_ {
            self.$with(None, Wait::Forever)
        }

        #[doc = $as_doc]
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
        /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
        /// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
        /// let me = slate_redis::HolderId::new();
        #[doc = $as_example]
        /// # Ok(()) }
        /// ```
        ///
        /// # Errors
        ///
        #[doc = concat!("As [`", stringify!($plain), "`](Self::", stringify!($plain), "); [`Error::LeaseLost`] if `holder` held already and its hold is gone from Redis.")]
        ///
        /// # Cancel safety
        ///
        /// As [`read`](Self::read).
        pub fn $as_(&self, holder: HolderId) -> impl Future<Output = Result<$guard>> + Send + '_ {
            self.$with(Some(holder), Wait::Forever)
        }

        #[doc = concat!("Takes the ", $mode, " lock if it can without waiting (one round trip at most).")]
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
        /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
        /// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
        #[doc = $try_example]
        /// # Ok(()) }
        /// ```
        ///
        /// # Errors
        ///
        #[doc = concat!("As [`", stringify!($plain), "`](Self::", stringify!($plain), "); busy is `Ok(None)`.")]
        ///
        /// # Cancel safety
        ///
        /// As [`read`](Self::read).
        pub async fn $try_(&self) -> Result<Option<$guard>> {
            slate_core::lock::busy_to_none(self.$with(None, Wait::Immediate).await)
        }

        #[doc = concat!("Takes the ", $mode, " lock, waiting at most `d` in the queue.")]
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
        /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
        /// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
        #[doc = concat!("let guard = lock.", stringify!($try_for), "(std::time::Duration::from_secs(1)).await?;")]
        /// # Ok(()) }
        /// ```
        ///
        /// # Errors
        ///
        #[doc = concat!("As [`", stringify!($plain), "`](Self::", stringify!($plain), "); [`Error::Timeout`] when `d` passes first.")]
        ///
        /// # Cancel safety
        ///
        /// As [`read`](Self::read).
        pub fn $try_for(&self, d: Duration) -> impl Future<Output = Result<$guard>> + Send + '_ {
            self.$with(None, Wait::for_duration(d))
        }

        #[doc = concat!("The blocking twin of [`", stringify!($plain), "`](Self::", stringify!($plain), "), for threads.")]
        ///
        /// # Examples
        ///
        /// ```no_run
        /// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
        /// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
        #[doc = concat!("let guard = lock.", stringify!($blocking), "()?;")]
        /// guard.blocking_unlock()?;
        /// # Ok::<(), slate_redis::Error>(())
        /// ```
        ///
        /// # Errors
        ///
        #[doc = concat!("As [`", stringify!($plain), "`](Self::", stringify!($plain), ").")]
        ///
        /// # Panics
        ///
        #[doc = concat!("Inside a tokio runtime (use `", stringify!($plain), "().await` there).")]
        pub fn $blocking(&self) -> Result<$guard> {
            self.$blocking_until(None)
        }

        #[doc = concat!("The blocking twin of [`", stringify!($try_for), "`](Self::", stringify!($try_for), ").")]
        ///
        /// # Examples
        ///
        /// ```no_run
        /// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
        /// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
        #[doc = concat!("let guard = lock.", stringify!($blocking_try_for), "(std::time::Duration::from_secs(1))?;")]
        /// # Ok::<(), slate_redis::Error>(())
        /// ```
        ///
        /// # Errors
        ///
        #[doc = concat!("As [`", stringify!($try_for), "`](Self::", stringify!($try_for), ").")]
        ///
        /// # Panics
        ///
        /// Inside a tokio runtime.
        pub fn $blocking_try_for(&self, d: Duration) -> Result<$guard> {
            self.$blocking_until(Some(d))
        }

        fn $blocking_until(&self, d: Option<Duration>) -> Result<$guard> {
            slate_core::blocking::assert_outside_runtime(concat!(
                "RwLock::",
                stringify!($blocking)
            ));
            let holder = Self::holder(None);
            let wait = d.map_or(Wait::Forever, Wait::for_duration);
            let grant = self.state.sync.$blocking_acquire(holder, wait)?;
            Ok($guard::new(&self.state, holder, &grant))
        }
    };
}

impl RwLock {
    /// Starts building a read-write lock named `name` on `client` (a [`RedisClient`] or
    /// `&RedisClient`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
    /// # Ok(()) }
    /// ```
    pub fn builder(client: impl Into<ClientSource>, name: impl AsRef<[u8]>) -> RwLockBuilder {
        RwLockBuilder {
            source: client.into(),
            name: LockName::new(name),
            options: LockOptionsBuilder::default(),
            exclude_single: false,
        }
    }

    /// This process's local writer and its write depth, if one holds.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
    /// let w = lock.write().await?;
    /// assert_eq!(lock.local_writer(), Some((w.holder(), 1)));
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn local_writer(&self) -> Option<(HolderId, u32)> {
        self.state.sync.owner()
    }

    /// This process's local readers and their read depths.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
    /// let r = lock.read().await?;
    /// assert_eq!(lock.local_readers(), vec![(r.holder(), 1)]);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn local_readers(&self) -> Vec<(HolderId, u32)> {
        self.state.sync.shared_holders()
    }

    fn holder(holder: Option<HolderId>) -> HolderId {
        holder.or_else(HolderId::scoped).unwrap_or_default()
    }

    /// Takes the read lock for `holder`, waiting as `wait` allows: the general form behind
    /// [`read`](Self::read), [`try_read`](Self::try_read) and
    /// [`try_read_for`](Self::try_read_for), for callers that pick the holder and the wait
    /// at run time (as `slate run --read` does).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// use slate_redis::{HolderId, Wait};
    /// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
    /// let guard = lock.acquire_read(HolderId::new(), Wait::for_duration(std::time::Duration::from_secs(1))).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`read_as`](Self::read_as); [`Error::Busy`] under [`Wait::Immediate`],
    /// [`Error::Timeout`] when the wait runs out.
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    pub fn acquire_read(
        &self,
        holder: HolderId,
        wait: Wait,
    ) -> impl Future<Output = Result<RwLockReadGuard>> + Send + '_ {
        self.read_with(Some(holder), wait)
    }

    /// Takes the write lock for `holder`, waiting as `wait` allows (see
    /// [`acquire_read`](Self::acquire_read)).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// use slate_redis::{HolderId, Wait};
    /// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
    /// let guard = lock.acquire_write(HolderId::new(), Wait::Immediate).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`write_as`](Self::write_as); [`Error::Busy`] under [`Wait::Immediate`],
    /// [`Error::Timeout`] when the wait runs out.
    ///
    /// # Cancel safety
    ///
    /// As [`read`](Self::read).
    pub fn acquire_write(
        &self,
        holder: HolderId,
        wait: Wait,
    ) -> impl Future<Output = Result<RwLockWriteGuard>> + Send + '_ {
        self.write_with(Some(holder), wait)
    }

    fn read_with(
        &self,
        holder: Option<HolderId>,
        wait: Wait,
    ) -> impl Future<Output = Result<RwLockReadGuard>> + Send + '_ {
        let holder = Self::holder(holder);
        let span = tracing::debug_span!("read", lock = %self.state.competitor().label, %holder);
        take_read(&self.state, holder, wait).instrument(span)
    }

    fn write_with(
        &self,
        holder: Option<HolderId>,
        wait: Wait,
    ) -> impl Future<Output = Result<RwLockWriteGuard>> + Send + '_ {
        let holder = Self::holder(holder);
        let span = tracing::debug_span!("write", lock = %self.state.competitor().label, %holder);
        take_write(&self.state, holder, wait).instrument(span)
    }

    mode_methods!(
        mode = "read",
        guard = RwLockReadGuard,
        with = read_with,
        blocking_acquire = blocking_acquire_shared,
        [read, read_as, try_read, try_read_for],
        [
            blocking_read,
            blocking_try_read_for,
            blocking_try_read_until
        ],
        errors = "Backend failures ([`Error::Backend`]).",
        cancel = "Cancel safe: dropping the future leaves the local queue (passing a head's \
                  turn on), and a grant that arrives after the drop is released in the \
                  background.",
        as_doc = "Takes the read lock for `holder` (re-entrant: a holder that reads or writes \
                  already gets one more read level at once).",
        as_example = "let a = lock.read_as(me).await?;\nlet b = lock.read_as(me).await?;\n\
                      assert_eq!(b.depth(), 2);",
        try_example =
            "if let Some(guard) = lock.try_read().await? {\n    guard.unlock().await?;\n}",
    );

    mode_methods!(
        mode = "write",
        guard = RwLockWriteGuard,
        with = write_with,
        blocking_acquire = blocking_acquire,
        [write, write_as, try_write, try_write_for],
        [
            blocking_write,
            blocking_try_write_for,
            blocking_try_write_until
        ],
        errors = "Backend failures; [`Error::InvalidInput`] when the holder reads already (a \
                  read lock is never upgraded).",
        cancel = "As [`read`](Self::read).",
        as_doc = "Takes the write lock for `holder` (re-entrant).",
        as_example = "let w = lock.write_as(me).await?;\n\
                      let r = lock.read_as(me).await?; // the read its write covers",
        try_example = "assert!(lock.try_write().await?.is_some());",
    );

    /// Who holds the lock, as the server sees it (expired leases left out).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
    /// let _r = lock.read().await?;
    /// assert_eq!(lock.status().await?.readers(), 1);
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

    /// Drops every holder (an operator's action: their next renewal reports the loss) and
    /// wakes every waiter; answers how many holders there were.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
    /// let dropped = lock.force_unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: one script call, applied whole or not at all.
    pub async fn force_unlock(&self) -> Result<u64> {
        let dropped: u64 = self.state.competitor().admin("clear", 0).await?;
        tracing::warn!(lock = %self.state.competitor().label, dropped, "force unlock");
        Ok(dropped)
    }
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.state.competitor();
        f.debug_struct("RwLock")
            .field("name", &c.name)
            .field("options", &c.options)
            .field("address", &c.client.address())
            .finish()
    }
}

/// One read level of a [`RwLock`] hold.
///
/// Release it with [`unlock`](Self::unlock) (or [`blocking_unlock`](Self::blocking_unlock));
/// dropped without either, it is released by a task on the client's runtime.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
/// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
/// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
/// let guard = lock.read().await?;
/// let again = guard.reenter().await?;
/// again.unlock().await?;
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the lock in the background; call unlock().await to see the outcome"]
pub struct RwLockReadGuard {
    held: Held<SharedRelease>,
}

/// One write level of a [`RwLock`] hold.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
/// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
/// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
/// let guard = lock.write().await?;
/// let read = guard.downgrade().await?;
/// read.unlock().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the lock in the background; call unlock().await to see the outcome"]
pub struct RwLockWriteGuard {
    held: Held<SharedRelease>,
}

slate_core::guard_surface!(
    RwLockReadGuard,
    slate_redis,
    setup = "# let client = slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\")?;\nlet lock = slate_redis::RwLock::builder(&client, \"config\").build()?;\nlet guard = lock.read().await?;",
    blocking_setup = "# let client = slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\")?;\nlet lock = slate_redis::RwLock::builder(&client, \"config\").build()?;\nlet guard = lock.blocking_read()?;",
    permits = |_guard| Some(1),
);
slate_core::guard_surface!(
    RwLockWriteGuard,
    slate_redis,
    setup = "# let client = slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\")?;\nlet lock = slate_redis::RwLock::builder(&client, \"config\").build()?;\nlet guard = lock.write().await?;",
    blocking_setup = "# let client = slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\")?;\nlet lock = slate_redis::RwLock::builder(&client, \"config\").build()?;\nlet guard = lock.blocking_write()?;",
    permits = |_guard| Some(slate_core::WRITE_PERMITS),
);

/// A read level for `holder` (a fresh read, a re-entry, or the read a write covers).
async fn take_read(
    state: &Arc<SharedState>,
    holder: HolderId,
    wait: Wait,
) -> Result<RwLockReadGuard> {
    let grant = state.sync.acquire_shared(holder, wait).await?;
    Ok(RwLockReadGuard::new(state, holder, &grant))
}

/// A write level for `holder` (a fresh write or a re-entry).
async fn take_write(
    state: &Arc<SharedState>,
    holder: HolderId,
    wait: Wait,
) -> Result<RwLockWriteGuard> {
    let grant = state.sync.acquire(holder, wait).await?;
    Ok(RwLockWriteGuard::new(state, holder, &grant))
}

impl RwLockReadGuard {
    fn new(state: &Arc<SharedState>, holder: HolderId, grant: &SharedGrant) -> Self {
        RwLockReadGuard {
            held: SharedRelease::held(state, holder, grant),
        }
    }

    /// One more read level for this guard's holder, at once (re-entry never queues).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
    /// let guard = lock.read().await?;
    /// assert_eq!(guard.reenter().await?.depth(), 2);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the hold is gone from Redis; backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; a level granted after the drop is released in the background.
    pub fn reenter(&self) -> impl Future<Output = Result<RwLockReadGuard>> + Send + '_ {
        take_read(&self.held.backend().state, self.holder(), Wait::Forever)
    }
}

impl RwLockWriteGuard {
    fn new(state: &Arc<SharedState>, holder: HolderId, grant: &SharedGrant) -> Self {
        RwLockWriteGuard {
            held: SharedRelease::held(state, holder, grant),
        }
    }

    /// One more write level for this guard's holder, at once.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
    /// let guard = lock.write().await?;
    /// assert_eq!(guard.reenter().await?.depth(), 2);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the hold is gone from Redis; backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; a level granted after the drop is released in the background.
    pub fn reenter(&self) -> impl Future<Output = Result<RwLockWriteGuard>> + Send + '_ {
        take_write(&self.held.backend().state, self.holder(), Wait::Forever)
    }

    /// Takes the read lock this write lock covers, at once (the holder then reads and writes;
    /// releasing the write keeps the read: see [`downgrade`](Self::downgrade)).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
    /// let w = lock.write().await?;
    /// let r = w.read().await?;
    /// assert_eq!(r.fencing_token(), w.fencing_token());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the hold is gone from Redis; backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe; a level granted after the drop is released in the background.
    pub fn read(&self) -> impl Future<Output = Result<RwLockReadGuard>> + Send + '_ {
        take_read(&self.held.backend().state, self.holder(), Wait::Forever)
    }

    /// Turns this write level into a read level without a gap: the holder takes the read its
    /// write covers, then releases this write level. No writer gets in between; the readers
    /// waiting at the head of the queue come in as the holder's last write level ends (at
    /// once, unless it holds other write levels through other guards). Two round trips.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::RwLock::builder(&client, "config").build()?;
    /// let w = lock.write().await?;
    /// let r = w.downgrade().await?;
    /// assert!(lock.try_write().await?.is_none());
    /// r.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the hold is gone; backend failures. On an error, the levels
    /// this call held are released in the background.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe in one respect: dropped between its two steps, the holder keeps
    /// neither (both are released in the background), so the caller must take the lock again.
    pub async fn downgrade(self) -> Result<RwLockReadGuard> {
        let read = take_read(&self.held.backend().state, self.holder(), Wait::Forever).await?;
        self.unlock().await?;
        Ok(read)
    }
}
