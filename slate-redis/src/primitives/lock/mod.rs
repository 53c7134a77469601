//! The single lock: one Redis master, reentrant, leased, renewed, notified.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, LazyLock, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use slate_aqs::{Attempt, Competitor, Notifications, Synchronizer};
use slate_core::metrics::Meter;
use slate_core::{
    BackendKind, Error, FencingToken, HolderId, LeaseWatch, LockName, LockOptions,
    LockOptionsBuilder, LossReason, Result, Wait,
};

use crate::client::conn;
use crate::client::{RedisClient, lock, unexpected_reply};
use crate::node::LockStatus;
use crate::primitives::lock::guard::SingleLockGuard;
use crate::scripts::keys::Keys;
use crate::scripts::request;
use crate::scripts::{self, ACQUIRE};
use crate::services::notify::ReleaseTarget;
use crate::services::renewal::{self, Renewable};
use slate_core::registry::Registered;

pub(crate) mod competitor;
pub(crate) mod guard;

pub(crate) use competitor::*;

/// A distributed, reentrant, leased lock on one Redis master.
///
/// Built once with [`SingleLock::builder`] and cloned wherever it is needed (cloning is an
/// `Arc` clone). Every handle built for the same name (and key prefix) from one
/// [`RedisClient`] shares one local queue: inside a process, waiters queue up in FIFO order and
/// only the head talks to Redis.
///
/// The operations are inherent methods (`lock`, `try_lock`, `try_lock_for`, `lock_as`, the
/// queries, and the blocking twins for threads); [`DistributedLock`](crate::DistributedLock) offers the same for
/// generic code, and [`AnyLock`](crate::AnyLock) for locks of several backends side by side.
///
/// ## Behaviour
///
/// - **Reentrancy** is keyed by [`HolderId`]: the same holder locking again raises the count
///   kept in Redis and gets the same fencing token. Re-enter with [`SingleLockGuard::reenter`],
///   [`DistributedLock::lock_as`](crate::DistributedLock::lock_as) or inside a [`HolderId::scope`].
/// - **Fencing tokens** strictly increase across holders and stay fixed across re-entry. They
///   come from one counter per cluster hash slot, `<prefix>fence:{<slot tag>}`, shared by the
///   locks whose keys hash to that slot (at most 16,384 keys, whatever the number of names),
///   and seeded from the server's clock in µs when it is created: so a lock name used once
///   leaves nothing behind once its lease ends, and tokens keep growing across a server that
///   lost its data, unless its clock stepped back by more than the time since the lock's last
///   token. A server that comes back with older data (an RDB snapshot, an `appendfsync
///   everysec` AOF that lost its last second in a crash, a promoted replica that missed the
///   last increments) brings an older counter back: each client raises a slot's counter to
///   the server's clock at its first grant there after it sees the server change (another run
///   id, another master named by the Sentinels; not a Redis Cluster's failover), so tokens
///   keep increasing. Tokens are large numbers (about 1.8 × 10¹⁵).
/// - **Local passes (lock cohorting)**: callers whose holder is minted by the call itself
///   (`lock()`, `try_lock_for()`, `try_lock_until()` and the blocking twins, outside a
///   [`HolderId::scope`]) that wait behind each other share Redis holds: the one that wins a
///   hold from the queue reserves a block of 8 fencing tokens (one `INCRBY`), and at its
///   release the next waiter of the process is handed the hold without a round trip, up to
///   the tenure (8 holders in a row); then a real release lets other processes take their
///   turn. Each holder gets its own token (the next of the block; a later acquisition is
///   above the whole block), its own lease watch and max hold, and re-enters on its own
///   token. Such a hold is kept in Redis under a holder id minted for it, which no caller is
///   ever given, so that no other process can enter it, whatever holder id it names; `slate
///   status` shows that id. A caller that finds the lock free acquires as itself, and named
///   holders (`lock_as`, `acquire`, a scope) always acquire and release in Redis under their
///   own id, so a holder id shared between processes keeps its meaning.
/// - **Renewal**: while held, the client's renewal service renews the lease every renewal
///   period (all locks of a client in one pipeline per tick). It never re-creates a missing
///   entry. The guard's lease deadline moves with every renewal; its loss signal fires with
///   `EntryGone` when the entry is gone, `DeadlineExpired` when no renewal succeeded before the
///   deadline, `MaxHoldReached` at the deadline after the optional max hold stopped renewal.
/// - **Lease deadline** = the instant taken *before* the command was sent + lease − a drift
///   allowance of 1% of the lease + 2 ms; the server's TTL ends no earlier than that.
/// - **Notification**: the release script publishes on `<prefix>{<name>}:released`; while the
///   lock has local waiters the client's pub/sub connection is subscribed and wakes the queue
///   head at once. While the subscription is live the head does not poll: it attempts again
///   only when woken, or when the busy answer said the holder's lease (or another process's
///   reserved turn) ends by itself, and at least once a second. Without it (pub/sub down or
///   not configured) the head retries after min(spin wait, holder's remaining lease).
/// - **Drop**: a guard dropped without `unlock()` is released by a task spawned on the
///   client's runtime; nothing blocks. If the release cannot reach Redis the entry ends with
///   its lease (renewal stops at once).
/// - **Failed release**: the local queue moves on whatever the outcome; a release that could
///   not reach Redis leaves the entry to expire with its lease.
///
/// # Examples
///
/// ```no_run
/// use slate_redis::{RedisClient, SingleLock};
/// use std::time::Duration;
///
/// # #[tokio::main] async fn main() -> slate_redis::Result<()> {
/// let client = RedisClient::open("redis://127.0.0.1:6379")?;
/// let lock = SingleLock::builder(&client, "orders")
///     .lease(Duration::from_secs(10))
///     .build()?;
/// let guard = lock.lock().await?;
/// println!("token {}", guard.fencing_token());
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SingleLock {
    pub(crate) shared: Arc<LockShared>,
}

/// What every handle of one lock (in one client) shares.
pub(crate) struct LockShared {
    pub(crate) sync: Synchronizer<RedisCompetitor>,
}

impl LockShared {
    pub(crate) fn competitor(&self) -> &RedisCompetitor {
        self.sync.competitor()
    }
}

impl Registered for LockShared {
    type Settings = LockOptions;

    fn settings(&self) -> LockOptions {
        self.competitor().options.clone()
    }

    fn waiters(&self) -> usize {
        self.sync.waiters()
    }
}

impl ReleaseTarget for LockShared {
    fn released(&self) {
        self.sync.notify_released();
    }

    fn queue_id(&self) -> &str {
        &self.sync.competitor().turn.queue_id
    }
}

/// What [`SingleLock::builder`] accepts as its client: a [`RedisClient`] or `&RedisClient`
/// (every lock of a client shares its queues, renewal and notifications). To start from an
/// existing `deadpool_redis` pool, build the client once with [`RedisClient::from_pool`] and
/// pass that: a lock never builds a private client of its own.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
/// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
/// let lock = slate_redis::SingleLock::builder(&client, "a").build()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ClientSource(pub(crate) RedisClient);

impl From<RedisClient> for ClientSource {
    fn from(c: RedisClient) -> Self {
        ClientSource(c)
    }
}

impl From<&RedisClient> for ClientSource {
    fn from(c: &RedisClient) -> Self {
        ClientSource(c.clone())
    }
}

/// Builds a [`SingleLock`]; see [`SingleLock::builder`].
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
/// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
/// let lock = slate_redis::SingleLock::builder(&client, "reports")
///     .lease(Duration::from_secs(5))
///     .renewal_period(Duration::from_secs(1))
///     .spin_wait(Duration::from_millis(100))
///     .max_hold(Duration::from_secs(600))
///     .key_prefix("billing:")
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until build() is called"]
pub struct SingleLockBuilder {
    source: ClientSource,
    name: Result<LockName>,
    options: LockOptionsBuilder,
}

slate_core::lock_options_setters!(
    SingleLockBuilder,
    slate_redis,
    setup = "# let client = slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\")?;",
    start = "slate_redis::SingleLock::builder(&client, \"a\")",
    [
        lease,
        renewal_period,
        spin_wait,
        max_hold,
        key_prefix,
        options
    ],
);

impl SingleLockBuilder {
    /// Validates the name and options and returns the lock (sharing the local state of an
    /// existing lock of the same name and prefix in the same client).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let a = slate_redis::SingleLock::builder(&client, "a").build()?;
    /// let b = slate_redis::SingleLock::builder(&client, "a").build()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for an empty or oversize name, an invalid option (zero lease,
    /// renewal period not below the lease, ...), a lock of the same name in this client built
    /// with other options, or a pool used outside a tokio runtime.
    pub fn build(self) -> Result<SingleLock> {
        let name = self.name?;
        let options = self.options.build()?;
        let client = self.source.0;
        let keys = Keys::new(options.key_prefix(), &name);
        let key = keys.lock.clone();
        let shared =
            client
                .inner
                .locks
                .get_or_create(key, &name, options, |options: LockOptions| {
                    let label: Arc<str> = Arc::from(name.to_string());
                    let spin_wait = options.spin_wait();
                    let turn = Turn::for_queue(&options);
                    let meter = client.lock_meter("lock", &name);
                    Arc::new_cyclic(|me: &Weak<LockShared>| LockShared {
                        sync: Synchronizer::new(
                            Arc::clone(&label),
                            RedisCompetitor {
                                client: client.clone(),
                                keys,
                                name: name.clone(),
                                label,
                                options,
                                meter: meter.clone(),
                                me: me.clone(),
                                last_attempt: Arc::new(Mutex::new(None)),
                                cohort: Mutex::new(None),
                                turn,
                                line: Arc::default(),
                                primed: Mutex::new(Vec::new()),
                            },
                            spin_wait,
                        )
                        .with_meter(meter),
                    })
                })?;
        Ok(SingleLock { shared })
    }
}

impl SingleLock {
    /// Starts building a lock named `name` on `client` (a [`RedisClient`] or `&RedisClient`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// # Ok(()) }
    /// ```
    pub fn builder(client: impl Into<ClientSource>, name: impl AsRef<[u8]>) -> SingleLockBuilder {
        SingleLockBuilder {
            source: client.into(),
            name: LockName::new(name),
            options: LockOptionsBuilder::default(),
        }
    }

    /// The options of this lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::SingleLock::builder(&client, "a").build()?;
    /// assert_eq!(lock.options().key_prefix(), "slate:");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn options(&self) -> &LockOptions {
        &self.shared.competitor().options
    }

    /// The client this lock uses.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::SingleLock::builder(&client, "a").build()?;
    /// let _stats = lock.client().stats();
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn client(&self) -> &RedisClient {
        &self.shared.competitor().client
    }

    /// The Redis key of the lock hash, `<prefix>{<name>}` (the fencing counter is this key
    /// followed by `:fence`, the release channel by `:released`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::SingleLock::builder(&client, "a").build()?;
    /// assert_eq!(lock.key(), b"slate:{a}");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn key(&self) -> &[u8] {
        &self.shared.competitor().keys.lock
    }

    /// The local owner and its local hold count, if a task of this process holds the lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::SingleLock::builder(&client, "a").build()?;
    /// assert!(lock.local_owner().is_none());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn local_owner(&self) -> Option<(HolderId, u32)> {
        self.shared.sync.owner()
    }

    /// Tasks and threads of this process waiting for this lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::SingleLock::builder(&client, "a").build()?;
    /// assert_eq!(lock.local_waiters(), 0);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn local_waiters(&self) -> usize {
        self.shared.sync.waiters()
    }

    fn guard(&self, holder: HolderId, grant: &Grant) -> SingleLockGuard {
        let watch = self.shared.competitor().watch(holder, grant);
        SingleLockGuard::new(
            self.clone(),
            slate_core::Hold::new(holder, grant.token, grant.count, watch),
        )
    }

    slate_core::blocking_waiting_methods!(
        "SingleLock",
        SingleLockGuard,
        setup = "# fn main() -> Result<(), Box<dyn std::error::Error>> {\n\
                 # let rt = tokio::runtime::Runtime::new()?;\n\
                 # let client = rt.block_on(async { slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\") })?;\n\
                 # let lock = slate_redis::SingleLock::builder(&client, \"a\").build()?;",
        errors = "backend failures",
    );
}

impl fmt::Debug for SingleLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.shared.competitor();
        f.debug_struct("SingleLock")
            .field("name", &c.name)
            .field("options", &c.options)
            .field("address", &c.client.address())
            .finish()
    }
}

/// The operations (also available through [`DistributedLock`](crate::DistributedLock) for generic code; no import is
/// needed to call them on a `SingleLock`).
impl SingleLock {
    /// The lock's name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// assert_eq!(lock.name().as_bytes(), b"orders");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn name(&self) -> &LockName {
        &self.shared.competitor().name
    }

    /// Acquires the lock for `holder`, waiting as `wait` allows (the one call the others are
    /// made of).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// use slate_redis::{HolderId, Wait};
    /// let guard = lock.acquire(HolderId::new(), Wait::Immediate).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] for a busy lock under [`Wait::Immediate`]; [`Error::Timeout`] when the
    /// deadline of [`Wait::Until`] passes; backend errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future removes the caller from the local queue and passes on
    /// any wake-up it had; a grant obtained for a dropped future is released, never leaked.
    pub fn acquire(
        &self,
        holder: HolderId,
        wait: Wait,
    ) -> impl Future<Output = Result<SingleLockGuard>> + Send + '_ {
        self.acquire_for(Some(holder), wait)
    }

    slate_core::waiting_methods!(
        sync = shared.sync,
        SingleLockGuard,
        setup = "# #[tokio::main(flavor = \"current_thread\")] async fn main() -> slate_redis::Result<()> {\n\
                 # let client = slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\")?;\n\
                 # let lock = slate_redis::SingleLock::builder(&client, \"orders\").build()?;",
        errors = "backend failures",
    );

    /// Whether any holder holds the lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// println!("locked: {}", lock.is_locked().await?);
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
    pub fn is_locked(&self) -> impl Future<Output = Result<bool>> + Send + '_ {
        let c = self.shared.competitor();
        async move {
            let key: &[u8] = &c.keys.lock;
            c.client
                .exec("EXISTS", |mut conn| async move {
                    redis::cmd("EXISTS").arg(&*key).query_async(&mut conn).await
                })
                .await
        }
    }

    /// How many times `holder` holds the lock (0 if not at all), as Redis counts it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// let guard = lock.lock().await?;
    /// assert_eq!(lock.hold_count(guard.holder()).await?, 1);
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
    pub fn hold_count(&self, holder: HolderId) -> impl Future<Output = Result<u32>> + Send + '_ {
        let c = self.shared.competitor();
        // A local holder that was passed the hold counts on its remote holder's field.
        let holder = self.shared.sync.remote_holder(holder);
        async move {
            let key: &[u8] = &c.keys.lock;
            let count: Option<i64> = c
                .client
                .exec("HGET", |mut conn| async move {
                    redis::cmd("HGET")
                        .arg(&*key)
                        .arg(holder.to_string())
                        .query_async(&mut conn)
                        .await
                })
                .await?;
            Ok(count.and_then(|n| u32::try_from(n).ok()).unwrap_or(0))
        }
    }

    /// Whether `holder` holds the lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// let guard = lock.lock().await?;
    /// assert!(lock.is_held_by(guard.holder()).await?);
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
    pub async fn is_held_by(&self, holder: HolderId) -> Result<bool> {
        Ok(self.hold_count(holder).await? > 0)
    }

    /// The remaining lease of whoever holds the lock, or `None` when it is free.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// if let Some(left) = lock.remaining_lease().await? {
    ///     println!("held for another {left:?}");
    /// }
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
    pub fn remaining_lease(&self) -> impl Future<Output = Result<Option<Duration>>> + Send + '_ {
        let c = self.shared.competitor();
        async move {
            let key: &[u8] = &c.keys.lock;
            let pttl: i64 = c
                .client
                .exec("PTTL", |mut conn| async move {
                    redis::cmd("PTTL").arg(&*key).query_async(&mut conn).await
                })
                .await?;
            Ok(match pttl {
                -2 => None,
                -1 => Some(Duration::MAX),
                ms => Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
            })
        }
    }

    /// The lock's state in Redis in one round trip: holders and their levels, the lease
    /// left, the fencing counter, and the local holder a hold was passed to.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// let status = lock.status().await?;
    /// println!("{} holder(s), {:?} left", status.holders.len(), status.remaining);
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
    pub async fn status(&self) -> Result<LockStatus> {
        let c = self.shared.competitor();
        c.client.status_of(&c.keys).await
    }

    /// Deletes the lock whoever holds it and publishes on its channel so that waiters retry at
    /// once; returns the holds dropped (1 when there was an entry, else 0). **Unsafe for correctness**: the holder keeps
    /// running its critical section (its renewal then finds the entry gone and signals
    /// `EntryGone`). The fencing counter is kept. Meant for operators clearing a stuck lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// let deleted = lock.force_unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// The deletion may or may not have happened when the future is dropped.
    pub fn force_unlock(&self) -> impl Future<Output = Result<u64>> + Send + '_ {
        let c = self.shared.competitor();
        async move {
            let deleted = c.client.force_unlock_of(&c.keys).await?;
            tracing::warn!(lock = %c.label, deleted, "force unlock");
            Ok(u64::from(deleted))
        }
    }
}

slate_core::delegate_distributed_lock!(SingleLock, SingleLockGuard);
