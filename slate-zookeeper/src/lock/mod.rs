//! [`ZkLock`]: the single lock on ZooKeeper.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use slate_aqs::{Attempt, Competitor, Notifications, Synchronizer};
use slate_core::lease::{self, LeaseKeeper, LeaseWatch};
use slate_core::metrics::Meter;
use slate_core::mutant::{self, Mutant};
use slate_core::registry::Registered;
use slate_core::{Error, FencingToken, HolderId, LockName, LossReason, Result, Wait};
use tracing::Instrument;
use zookeeper_client as zk;

use crate::client::{Session, ZkClient, heartbeat_period, lease_deadline, lock};
use crate::error::lost_connection;
use crate::guard::ZkLockGuard;
use crate::path::{DEFAULT_ROOT, contender_prefix, encode_name, parse_contender, validate_root};

mod competitor;

pub(crate) use competitor::*;

/// The spin wait when the builder names none: how long a waiter parks between attempts when
/// no watch wakes it first. Watches are reliable (ZooKeeper re-arms them after a reconnect
/// and fires them when the session ends), so this is only a safety net.
pub const DEFAULT_SPIN_WAIT: Duration = Duration::from_secs(1);

/// A reentrant, fenced, fair distributed lock on ZooKeeper: Bedrock's designed-but-never-built
/// ZooKeeper lock.
///
/// ## The recipe
///
/// Every lock is a directory `<root>/<encoded name>` (a container znode the server removes
/// once it is empty). A process that wants the lock creates an **ephemeral sequential**
/// contender znode in it; the contender with the lowest sequence number holds the lock. A
/// contender that is not the lowest watches **only its predecessor**, so a release wakes
/// exactly one process (no herd), and processes are served in the order they arrived.
///
/// Inside one process a [`slate_aqs::Synchronizer`] queues the tasks: only the head task of a
/// process has a contender znode, the others sleep; re-entry and local hand-over need no
/// znode of their own.
///
/// ## What it promises
///
/// - **Exclusion** while ZooKeeper's quorum stands: a contender is the lowest of a
///   linearizable directory listing, and its znode lives exactly as long as its session.
/// - **Lease = session.** A holder's znode disappears when its session ends (the process died,
///   or no server heard from it for the session timeout). The guard's lease deadline is *the
///   last renewal of the session the leader surely applied + session timeout* (proven by a
///   `sync` round every eighth of the timeout, see [`ZkClient`]), so it passes **before** the
///   ensemble can expire the session and give the lock to someone else, even when the
///   client's server is a follower cut off from its leader; the holder's znode is watched, so its deletion (session expired,
///   [`force_unlock`](Self::force_unlock)) fires the loss signal as soon as the client sees it,
///   and the heartbeat's check catches it otherwise.
/// - **Fencing tokens** are the contender znode's creation zxid: the holder's znode was the
///   lowest of its directory, so every later holder's znode was created later, with a
///   strictly greater zxid, across leader elections too (the epoch is the zxid's high half).
///   Unlike a Redis standalone counter, they survive a server crash.
/// - **Re-entry per holder**, counted in this process; a re-entry confirms that the hold's
///   znode still belongs to this session, and is refused ([`Error::LeaseLost`]) otherwise.
///   A hold belongs to a session: the same [`HolderId`] in two processes is two holders.
/// - **Fairness across processes**: the sequence numbers are a FIFO queue; a waiter keeps its
///   place while any of its tasks waits, and gives it up (deletes its znode) when none does.
///
/// # Examples
///
/// ```no_run
/// use slate_zookeeper::{ZkClient, ZkLock};
///
/// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
/// let client = ZkClient::connect("127.0.0.1:2181").await?;
/// let lock = ZkLock::builder(&client, "orders").build()?;
/// let guard = lock.lock().await?;
/// write_with_fence(guard.fencing_token().get()).await;
/// guard.unlock().await?;
/// # Ok(()) }
/// # async fn write_with_fence(_: u64) {}
/// ```
#[derive(Clone)]
pub struct ZkLock {
    pub(crate) shared: Arc<LockShared>,
}

pub(crate) struct LockShared {
    pub(crate) sync: Synchronizer<ZkCompetitor>,
}

impl Registered for LockShared {
    type Settings = Duration;

    fn settings(&self) -> Duration {
        self.sync.spin_wait()
    }

    fn waiters(&self) -> usize {
        self.sync.waiters()
    }
}

impl LockShared {
    pub(crate) fn competitor(&self) -> &ZkCompetitor {
        self.sync.competitor()
    }
}

/// Builds a [`ZkLock`].
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
/// # let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
/// let lock = slate_zookeeper::ZkLock::builder(&client, "orders")
///     .root("/apps/billing/locks")
///     .spin_wait(std::time::Duration::from_millis(500))
///     .build()?;
/// # Ok(()) }
/// ```
pub struct ZkLockBuilder {
    client: ZkClient,
    name: Result<LockName>,
    root: String,
    spin_wait: Duration,
}

impl fmt::Debug for ZkLockBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLockBuilder")
            .field("name", &self.name.as_ref().ok())
            .field("root", &self.root)
            .field("spin_wait", &self.spin_wait)
            .finish()
    }
}

impl ZkLockBuilder {
    /// The directory the lock lives under (default `/slate`): the namespace, like a Redis key
    /// prefix. Validated by [`build`](Self::build).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// # let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
    /// let lock = slate_zookeeper::ZkLock::builder(&client, "a").root("/team/locks").build()?;
    /// assert_eq!(lock.path(), "/team/locks/a");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// How long a waiting process parks between attempts when no watch wakes it first
    /// (default 1 s; watches normally wake it at once).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// # let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
    /// let lock = slate_zookeeper::ZkLock::builder(&client, "a")
    ///     .spin_wait(std::time::Duration::from_millis(200))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn spin_wait(mut self, spin_wait: Duration) -> Self {
        self.spin_wait = spin_wait;
        self
    }

    /// Builds the lock (no I/O: the directory is created by the first attempt). Handles of
    /// one name on one client share one local queue.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for an empty or oversize name, an invalid root, a zero spin
    /// wait, or a handle of the same name built with another spin wait.
    pub fn build(self) -> Result<ZkLock> {
        let name = self.name?;
        validate_root(&self.root)?;
        if self.spin_wait.is_zero() || self.spin_wait > Duration::from_secs(3600) {
            return Err(Error::invalid_input(
                "spin wait",
                format!("{:?} is outside 1 ns..=1 h", self.spin_wait),
                "give the spin wait a positive duration of at most an hour (default 1 s)",
            ));
        }
        let dir = format!("{}/{}", self.root, encode_name(&name));
        let client = self.client.clone();
        let key = dir.clone();
        let shared = self.client.inner.locks.get_or_create(
            key,
            &name,
            self.spin_wait,
            |spin_wait: Duration| {
                let label: Arc<str> = Arc::from(name.to_string());
                let meter = Meter::for_lock("lock", "zookeeper", &name);
                Arc::new_cyclic(|me: &Weak<LockShared>| LockShared {
                    sync: Synchronizer::new(
                        Arc::clone(&label),
                        ZkCompetitor {
                            ctx: Arc::new(Ctx {
                                client,
                                dir,
                                label,
                                meter: meter.clone(),
                                me: me.clone(),
                                places: tokio::sync::Mutex::default(),
                                watched: Mutex::default(),
                                dir_ready: AtomicBool::default(),
                            }),
                            name: name.clone(),
                            holds: Mutex::default(),
                        },
                        spin_wait,
                    )
                    .with_meter(meter),
                })
            },
        )?;
        Ok(ZkLock { shared })
    }
}

/// Who holds a ZooKeeper lock and who waits, as [`ZkLock::status`] reads it.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
/// # let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
/// # let lock = slate_zookeeper::ZkLock::builder(&client, "a").build()?;
/// let status = lock.status().await?;
/// if let Some(h) = &status.holder {
///     println!("held by {:?} (pid {:?}), token {}", h.holder, h.pid, h.token);
/// }
/// println!("{} waiting", status.waiters.len());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZkStatus {
    /// The holder: the lowest contender.
    pub holder: Option<ZkContender>,
    /// The other contenders, in the order they will hold the lock.
    pub waiters: Vec<ZkContender>,
}

/// One contender znode of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZkContender {
    /// The znode's path.
    pub znode: String,
    /// The holder it was made for (the record in its data).
    pub holder: Option<HolderId>,
    /// The process id of the contender's process.
    pub pid: Option<u32>,
    /// The host of the contender's process.
    pub host: Option<String>,
    /// The contender's fencing token (its creation zxid).
    pub token: FencingToken,
    /// The session owning it.
    pub session: i64,
    /// That session's timeout: how long after its process dies the znode goes.
    pub session_timeout: Option<Duration>,
}

impl ZkLock {
    /// Starts building a lock named `name` on `client`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
    /// let lock = slate_zookeeper::ZkLock::builder(&client, "orders").build()?;
    /// # Ok(()) }
    /// ```
    pub fn builder(client: &ZkClient, name: impl AsRef<[u8]>) -> ZkLockBuilder {
        ZkLockBuilder {
            client: client.clone(),
            name: LockName::new(name),
            root: DEFAULT_ROOT.to_owned(),
            spin_wait: DEFAULT_SPIN_WAIT,
        }
    }

    /// The lock's name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// # let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
    /// let lock = slate_zookeeper::ZkLock::builder(&client, "orders").build()?;
    /// assert_eq!(lock.name().as_bytes(), b"orders");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn name(&self) -> &LockName {
        &self.shared.competitor().name
    }

    /// The lock's directory: `<root>/<encoded name>`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// # let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
    /// let lock = slate_zookeeper::ZkLock::builder(&client, "a b").build()?;
    /// assert_eq!(lock.path(), "/slate/a%20b");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn path(&self) -> &str {
        &self.shared.competitor().ctx.dir
    }

    /// The client this lock uses.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// # let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
    /// let lock = slate_zookeeper::ZkLock::builder(&client, "a").build()?;
    /// assert_eq!(lock.client().servers(), client.servers());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn client(&self) -> &ZkClient {
        &self.shared.competitor().ctx.client
    }

    /// The local owner (holder, depth) of this process, if any.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// # let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
    /// # let lock = slate_zookeeper::ZkLock::builder(&client, "a").build()?;
    /// let guard = lock.lock().await?;
    /// assert_eq!(lock.local_owner(), Some((guard.holder(), 1)));
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn local_owner(&self) -> Option<(HolderId, u32)> {
        self.shared.sync.owner()
    }

    /// How many tasks of this process wait for the lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// # let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
    /// # let lock = slate_zookeeper::ZkLock::builder(&client, "a").build()?;
    /// assert_eq!(lock.local_waiters(), 0);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn local_waiters(&self) -> usize {
        self.shared.sync.waiters()
    }

    fn guard(&self, holder: HolderId, grant: &Grant) -> ZkLockGuard {
        let c = self.shared.competitor();
        let watch = c.watch(holder, &grant.path).unwrap_or_else(|| {
            // The hold ended between the grant and here (a re-entry that raced the hold's end,
            // now another znode or none): a lost lease says so.
            let (keeper, watch) = lease::channel(grant.touched);
            keeper.lose(LossReason::EntryGone);
            watch
        });
        ZkLockGuard::new(
            self.clone(),
            Arc::from(grant.path.as_str()),
            slate_core::Hold::new(holder, grant.token, c.local_depth(holder), watch),
        )
    }

    /// Acquires the lock for `holder`, waiting as `wait` allows.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use slate_zookeeper::{HolderId, Wait};
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// # let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
    /// # let lock = slate_zookeeper::ZkLock::builder(&client, "a").build()?;
    /// let guard = lock.acquire(HolderId::new(), Wait::for_duration(std::time::Duration::from_secs(1))).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] for a busy lock under [`Wait::Immediate`]; [`Error::Timeout`] when the
    /// deadline of [`Wait::Until`] passes; [`Error::LeaseLost`] for a re-entry of a hold that
    /// ended; backend errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future removes the caller from the local queue; a contender
    /// znode or grant made for a dropped future is deleted, never left in the session.
    pub fn acquire(
        &self,
        holder: HolderId,
        wait: Wait,
    ) -> impl Future<Output = Result<ZkLockGuard>> + Send + '_ {
        let span =
            tracing::debug_span!("acquire", lock = %self.shared.competitor().ctx.label, %holder);
        async move {
            let grant = self.shared.sync.acquire(holder, wait).await?;
            Ok(self.guard(holder, &grant))
        }
        .instrument(span)
    }

    /// Acquires for `holder`, or when it is `None` for [`HolderId::current`] (a ZooKeeper
    /// lock passes no holds: every holder has its own znode).
    fn acquire_for(
        &self,
        holder: Option<HolderId>,
        wait: Wait,
    ) -> impl Future<Output = Result<ZkLockGuard>> + Send + '_ {
        self.acquire(holder.unwrap_or_else(HolderId::current), wait)
    }

    slate_core::waiting_methods!(
        ZkLockGuard,
        setup = "# #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {\n\
                 # let client = slate_zookeeper::ZkClient::connect(\"127.0.0.1:2181\").await?;\n\
                 # let lock = slate_zookeeper::ZkLock::builder(&client, \"a\").build()?;",
        errors = "backend failures",
    );

    fn blocking(&self, holder: HolderId, wait: Wait, what: &str) -> Result<ZkLockGuard> {
        slate_core::blocking::assert_outside_runtime(what);
        let grant = self.shared.sync.blocking_acquire(holder, wait)?;
        Ok(self.guard(holder, &grant))
    }

    /// The blocking twins' acquisition for `holder`, or the current holder.
    fn blocking_acquire(
        &self,
        holder: Option<HolderId>,
        wait: Wait,
        what: &str,
    ) -> Result<ZkLockGuard> {
        self.blocking(holder.unwrap_or_else(HolderId::current), wait, what)
    }

    slate_core::blocking_waiting_methods!(
        "ZkLock",
        ZkLockGuard,
        setup = "# fn main() -> Result<(), Box<dyn std::error::Error>> {\n\
                 # let rt = tokio::runtime::Runtime::new()?;\n\
                 # let client = rt.block_on(slate_zookeeper::ZkClient::connect(\"127.0.0.1:2181\"))?;\n\
                 # let lock = slate_zookeeper::ZkLock::builder(&client, \"a\").build()?;",
        errors = "backend failures",
    );

    /// Who holds the lock and who waits, read from ZooKeeper (one listing and one read per
    /// contender).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// # let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
    /// # let lock = slate_zookeeper::ZkLock::builder(&client, "a").build()?;
    /// let guard = lock.lock().await?;
    /// let status = lock.status().await?;
    /// assert_eq!(status.holder.unwrap().holder, Some(guard.holder()));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads).
    pub fn status(&self) -> impl Future<Output = Result<ZkStatus>> + Send + 'static {
        let read = self.read_contenders(usize::MAX);
        async move {
            let mut all = read.await?.into_iter();
            Ok(ZkStatus {
                holder: all.next(),
                waiters: all.collect(),
            })
        }
    }

    /// The holder: the lowest contender (one listing and one read).
    async fn holder_contender(&self) -> Result<Option<ZkContender>> {
        Ok(self.read_contenders(1).await?.into_iter().next())
    }

    /// The first `limit` contenders, lowest first: one listing, then one read per contender
    /// until `limit` are found (a contender gone meanwhile is skipped).
    fn read_contenders(
        &self,
        limit: usize,
    ) -> impl Future<Output = Result<Vec<ZkContender>>> + Send + 'static {
        let c = &self.shared.competitor().ctx;
        let (client, dir) = (c.client.clone(), c.dir.clone());
        self.client().on_runtime(async move {
            let s = client.session().await?;
            let children = match client.read(&s, "list", || s.zk.list_children(&dir)).await? {
                Ok(c) => c,
                Err(zk::Error::NoNode) => Vec::new(),
                Err(e) => return Err(client.error(e, "listing contenders")),
            };
            let mut found = Vec::new();
            for (_, name) in contenders(&children) {
                if found.len() == limit {
                    break;
                }
                let znode = format!("{dir}/{name}");
                match client.read(&s, "get", || s.zk.get_data(&znode)).await? {
                    Ok((data, stat)) => {
                        let data = String::from_utf8_lossy(&data);
                        found.push(ZkContender {
                            holder: field(&data, "holder").and_then(|h| h.parse().ok()),
                            pid: field(&data, "pid").and_then(|p| p.parse().ok()),
                            host: field(&data, "host").map(str::to_owned),
                            session_timeout: field(&data, "session_timeout_ms")
                                .and_then(|t| t.parse().ok())
                                .map(Duration::from_millis),
                            token: FencingToken::new(u64::try_from(stat.czxid).unwrap_or(0)),
                            session: stat.ephemeral_owner,
                            znode,
                        });
                    }
                    Err(zk::Error::NoNode) => {}
                    Err(e) => return Err(client.error(e, "reading a contender")),
                }
            }
            Ok(found)
        })
    }

    /// Whether anyone holds the lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// # let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
    /// # let lock = slate_zookeeper::ZkLock::builder(&client, "a").build()?;
    /// assert!(!lock.is_locked().await?);
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
    pub async fn is_locked(&self) -> Result<bool> {
        Ok(self.holder_contender().await?.is_some())
    }

    /// How many levels `holder` holds: its depth when it holds the lock in this process; 1
    /// when another process holds it for `holder` (ZooKeeper keeps no depth); 0 otherwise.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// # let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
    /// # let lock = slate_zookeeper::ZkLock::builder(&client, "a").build()?;
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
    pub async fn hold_count(&self, holder: HolderId) -> Result<u32> {
        let Some(h) = self.holder_contender().await? else {
            return Ok(0);
        };
        if h.holder != Some(holder) {
            return Ok(0);
        }
        let c = self.shared.competitor();
        let local = lock(&c.holds)
            .get(&holder)
            .filter(|l| l.path == h.znode)
            .map(|l| l.depth);
        Ok(local.unwrap_or(1))
    }

    /// Whether `holder` holds the lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// # let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
    /// # let lock = slate_zookeeper::ZkLock::builder(&client, "a").build()?;
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

    /// The longest the current hold can outlive its holder: its session's timeout (a dead
    /// holder's znode goes when its session expires). `None` when the lock is free.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// # let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
    /// # let lock = slate_zookeeper::ZkLock::builder(&client, "a").build()?;
    /// assert_eq!(lock.remaining_lease().await?, None);
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
    pub async fn remaining_lease(&self) -> Result<Option<Duration>> {
        Ok(self.holder_contender().await?.map(|h| {
            h.session_timeout
                .unwrap_or_else(|| self.client().session_timeout())
        }))
    }

    /// Deletes the holder's znode whoever it is: the next contender holds the lock at once.
    /// **Unsafe for correctness**: the old holder's guard learns it within a third of its
    /// session timeout, but its critical section may still be running. For operators clearing
    /// a stuck lock. Returns the holds dropped (1 when there was a holder, else 0).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// # let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
    /// # let lock = slate_zookeeper::ZkLock::builder(&client, "a").build()?;
    /// let cleared = lock.force_unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures ([`BackendKind::Permission`](crate::BackendKind::Permission) when the holder's znode
    /// belongs to another digest user).
    ///
    /// # Cancel safety
    ///
    /// The deletion may or may not have happened when the future is dropped.
    pub async fn force_unlock(&self) -> Result<u64> {
        let Some(holder) = self.holder_contender().await? else {
            return Ok(0);
        };
        let client = self.client().clone();
        client
            .clone()
            .on_runtime(async move {
                let s = client.session().await?;
                match client
                    .op(&s, "delete", s.zk.delete(&holder.znode, None))
                    .await?
                {
                    Ok(()) => Ok(1),
                    Err(zk::Error::NoNode) => Ok(0),
                    Err(e) => Err(client.error(e, "deleting the holder's znode")),
                }
            })
            .await
    }
}

impl fmt::Debug for ZkLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLock")
            .field("path", &self.path())
            .field("local_owner", &self.local_owner())
            .field("local_waiters", &self.local_waiters())
            .finish()
    }
}

slate_core::delegate_distributed_lock!(ZkLock, ZkLockGuard);
