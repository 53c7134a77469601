//! The Redis client every lock of a process shares: connections, renewal, notifications.

use slate_core::registry::Registry;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use deadpool_redis::{Manager, Pool, Runtime};
use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{AsyncConnectionConfig, IntoConnectionInfo, RedisResult};
use slate_core::metrics::{ClientMeter, Meter};
use slate_core::{BackendKind, Error, LockName, Result};
use tokio::runtime::Handle;

use crate::scripts;
use crate::services::notify::{Notifier, PubSubSource};
use crate::services::renewal::Renewal;
use conn::{Conn, Topology};

mod exec;
mod open;

pub(crate) mod conn;
pub(crate) mod error;
mod options;

pub use options::{ClientOptions, ClientOptionsBuilder, DEFAULT_COMMAND_TIMEOUT};

/// What a client is doing right now (for tests, metrics and debugging).
///
/// # Examples
///
/// ```
/// let s = slate_redis::ClientStats::default();
/// assert_eq!(s.renewals, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientStats {
    /// Held (lock, holder) pairs registered with the renewal service (re-entrant guards of one
    /// holder count once).
    pub renewals: usize,
    /// Lock channels the pub/sub connection is subscribed to or subscribing.
    pub subscriptions: usize,
    /// Tasks and threads waiting in the local queues of this client's locks.
    pub local_waiters: usize,
    /// Lock names with live shared state in this client.
    pub locks: usize,
    /// Whether the pub/sub connection is up.
    pub pubsub_up: bool,
}

/// A cheap-to-clone handle on one Redis server, shared by every lock built from it.
///
/// A client owns:
/// - a `deadpool_redis` pool, from which it borrows one multiplexed connection that carries
///   every command (it is replaced from the pool when it breaks);
/// - **one renewal service** (a task that renews every held lock of this client with one
///   pipeline per tick);
/// - **one pub/sub connection** (opened when a lock first has waiters) that wakes local
///   waiters when a lock is released anywhere;
/// - a registry name → lock state, so every [`SingleLock`](crate::SingleLock) built for the
///   same name from this client shares one local queue.
///
/// Build one client per server and process and clone it; locks from different clients do not
/// share queues (they stay correct, only less efficient).
///
/// # Examples
///
/// ```no_run
/// use slate_redis::RedisClient;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
/// let client = RedisClient::open("redis://127.0.0.1:6379")?;
/// client.ping().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisClient {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    backend: Backend,
    address: String,
    options: ClientOptions,
    runtime: Handle,
    /// The runtime the client started for itself when it was built outside any (dropped after
    /// the renewal and notification services were closed by `Drop for Inner`).
    _own_runtime: Option<OwnRuntime>,
    conn: Mutex<ConnSlot>,
    fill: tokio::sync::Mutex<()>,
    /// (Cluster) the slot map as last read, for grouping renewals by node.
    slots: Mutex<Option<Arc<SlotMap>>>,
    /// (Cluster) set when the servers lack sharded pub/sub (Redis < 7): releases then
    /// `PUBLISH` and waiters use the spin wait. Shared with the notifier.
    no_sharded_pubsub: Arc<AtomicBool>,
    /// The eviction policy warning was logged (once per client).
    eviction_warned: AtomicBool,
    /// The warning that the server's run id cannot be read was logged (once per client).
    run_id_warned: AtomicBool,
    /// (Sentinel) the master's address at the last connection, and how many times it changed.
    master: Mutex<Option<String>>,
    /// The run id of the server the last new connection (standalone or Sentinel) reached.
    run_id: Mutex<Option<String>>,
    failovers: AtomicU64,
    /// The hash slots whose fencing counter this client raised to the server's clock since it
    /// last saw a new server (see [`RedisClient::fence_floor_needed`]).
    fence_floors: Mutex<FenceFloors>,
    /// Reconnects, failovers, server errors and registered renewals (`slate_core::metrics`).
    pub(crate) meter: ClientMeter,
    pub(crate) renewal: Renewal,
    pub(crate) notifier: Notifier,
    pub(crate) locks: Registry<Arc<[u8]>>,
}

/// The slots whose fencing counter was raised, under one server generation (the
/// [`RedisClient::failovers`] count when they were).
pub(crate) struct FenceFloors {
    generation: u64,
    raised: Box<[u64]>,
}

impl FenceFloors {
    pub(crate) fn new() -> Self {
        FenceFloors {
            generation: 0,
            raised: vec![0; crate::scripts::keys::SLOTS / 64].into_boxed_slice(),
        }
    }

    /// `slot`'s word in `raised`, and its bit there.
    fn place(slot: u16) -> (usize, u64) {
        (usize::from(slot) / 64, 1 << (slot % 64))
    }
}

impl Backend {
    /// The deployment this backend talks to.
    fn topology(&self) -> Topology {
        match self {
            Backend::Standalone(_) => Topology::Standalone,
            Backend::Cluster(_) => Topology::Cluster,
            Backend::Sentinel { .. } => Topology::Sentinel,
        }
    }
}

/// The `backend` label of a topology's metrics.
pub(crate) fn backend_label(topology: Topology) -> &'static str {
    match topology {
        Topology::Standalone => "redis-standalone",
        Topology::Cluster => "redis-cluster",
        Topology::Sentinel => "redis-sentinel",
    }
}

/// A small tokio runtime (one worker thread, `slate-client`) owned by a client built outside
/// any runtime, so that `RedisClient::open` works from plain `main` and threads (with the
/// `blocking_*` methods). Shut down in the background with the client: dropping it never
/// blocks, even from inside another runtime.
struct OwnRuntime(Option<tokio::runtime::Runtime>);

impl OwnRuntime {
    /// Starts the runtime; returns it with its handle.
    fn start() -> Result<(Self, Handle)> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("slate-client")
            .enable_all()
            .build()
            .map(|rt| {
                let handle = rt.handle().clone();
                (OwnRuntime(Some(rt)), handle)
            })
            .map_err(|e| {
                Error::backend(
                    BackendKind::Other,
                    None,
                    format!(
                        "the client was built outside a tokio runtime and could not start one \
                         of its own ({e}); build it inside a runtime or pass \
                         ClientOptionsBuilder::runtime(handle)"
                    ),
                    Some(Box::new(e)),
                )
            })
    }
}

impl Drop for OwnRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Where the client's connection comes from.
enum Backend {
    /// A pool of connections to one server.
    Standalone(Pool),
    /// redis-rs's cluster client (its connection keeps one connection per node).
    Cluster(Box<redis::cluster::ClusterClient>),
    /// Sentinels that name the current master.
    Sentinel {
        sentinel: Arc<tokio::sync::Mutex<SentinelClient>>,
        config: Box<AsyncConnectionConfig>,
    },
}

/// The connection in use, as held by the client.
enum Held {
    /// Borrowed from the pool (returned to it, or discarded when broken).
    Pooled(deadpool_redis::Connection),
    /// Owned (cluster, sentinel).
    Owned(Conn),
}

impl Held {
    fn conn(&self) -> Conn {
        match self {
            Held::Pooled(c) => Conn::Server(MultiplexedConnection::clone(c)),
            Held::Owned(c) => c.clone(),
        }
    }
}

struct ConnSlot {
    generation: u64,
    conn: Option<Held>,
    /// When a command first timed out on this connection since it last answered.
    silent_since: Option<Instant>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.renewal.close();
        self.notifier.close();
    }
}

impl fmt::Debug for RedisClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisClient")
            .field("address", &self.inner.address)
            .field("options", &self.inner.options)
            .finish_non_exhaustive()
    }
}

/// Locks a std mutex, taking over a poisoned one: every value guarded here stays consistent
/// at each unlock, so a panic elsewhere cannot leave it half-updated.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RedisClient {
    /// Sends a `PING`: checks that the server answers and the credentials are accepted.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// slate_redis::RedisClient::open("redis://127.0.0.1:6379")?.ping().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] classified by kind: `Io` (unreachable), `Auth` (wrong password),
    /// `Timeout` (no reply within the command timeout).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn ping(&self) -> Result<()> {
        self.exec("PING", |mut c| async move {
            redis::cmd("PING").query_async::<()>(&mut c).await
        })
        .await
    }

    /// The server's `maxmemory-policy` (read with `INFO memory`; on a cluster, an evicting
    /// node's policy if any node evicts). Anything but `noeviction` can evict lock keys, which
    /// all carry a TTL, and so give a held lock to another holder.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// if let Some(policy) = client.eviction_policy().await? {
    ///     assert_eq!(policy, "noeviction", "this server may evict held locks");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures, classified by kind (`Permission` when the user lacks `INFO`).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub async fn eviction_policy(&self) -> Result<Option<String>> {
        self.exec("INFO memory", |mut c| async move {
            redis::cmd("INFO")
                .arg("memory")
                .query_async::<redis::Value>(&mut c)
                .await
        })
        .await
        .map(|v| eviction_policy_of(&v))
    }

    /// Checks that the deployment is the one this client was opened for, and names the fix
    /// when it is not: a standalone client pointed at a Redis Cluster node (it would only
    /// reach the keys of that node's slots) or at a Sentinel (which holds no data).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// client.check_topology().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the topology problem; backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub async fn check_topology(&self) -> Result<()> {
        if self.topology() != Topology::Standalone {
            // A cluster connection fails on a non-cluster server by itself; a Sentinel client
            // only ever talks to the master the Sentinels name.
            return self.ping().await;
        }
        // On a connection of its own: the shared one loads the lock scripts first, which a
        // Sentinel refuses.
        let Backend::Standalone(pool) = &self.inner.backend else {
            return Ok(());
        };
        let budget = self.inner.options.command_timeout;
        let address = &self.inner.address;
        let query = async {
            let mut conn = pool
                .get()
                .await
                .map_err(|e| error::from_pool(e, address, budget))?;
            redis::cmd("INFO")
                .arg("server")
                .arg("cluster")
                .query_async::<String>(&mut *conn)
                .await
                .map_err(|e| error::from_redis(e, "INFO server", address))
        };
        let info = tokio::time::timeout(budget, query)
            .await
            .map_err(|_| error::command_timeout("INFO server", address, budget))??;
        let field = |name: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        if field("cluster_enabled") == Some("1") {
            return Err(Error::invalid_input(
                "url",
                format!("{} is a Redis Cluster node", self.address()),
                "open the client with RedisClient::open_cluster (the slate command: --cluster \
                 URL instead of --redis)",
            ));
        }
        if field("redis_mode") == Some("sentinel") {
            return Err(Error::invalid_input(
                "url",
                format!(
                    "{} is a Redis Sentinel, which holds no data",
                    self.address()
                ),
                "open the client with RedisClient::open_sentinel and the master's name (the \
                 slate command: --sentinel URL --master-name NAME instead of --redis)",
            ));
        }
        Ok(())
    }

    /// On a cluster: the hash slot of `key` and the address of the master that serves it
    /// (from `CLUSTER SLOTS`); `None` on other topologies.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let client = slate_redis::RedisClient::open_cluster(
    ///     ["redis://127.0.0.1:7000"],
    ///     Default::default(),
    /// )?;
    /// if let Some((slot, owner)) = client.cluster_location(b"slate:{orders}").await? {
    ///     println!("slot {slot} on {owner}");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures; a slot no master serves.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub async fn cluster_location(&self, key: &[u8]) -> Result<Option<(u16, String)>> {
        if self.topology() != Topology::Cluster {
            return Ok(None);
        }
        // A fresh map: this is for people looking at the cluster now.
        self.forget_cluster_slots();
        let slot = crate::client::conn::slot_of(key);
        let map = self.cluster_slots().await?;
        match map.owner(slot) {
            Some((host, port)) => Ok(Some((slot, format!("{host}:{port}")))),
            None => Err(Error::backend(
                BackendKind::Unavailable,
                Some(self.address().to_owned()),
                format!("no master serves slot {slot} (the cluster is failing over or broken)"),
                None,
            )),
        }
    }

    /// What the client is doing right now: renewal registrations, subscriptions, local waiters.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// assert_eq!(client.stats().renewals, 0);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn stats(&self) -> ClientStats {
        let locks = self.inner.locks.live();
        let (subscriptions, pubsub_up) = self.inner.notifier.stats();
        ClientStats {
            renewals: self.inner.renewal.len(),
            subscriptions,
            local_waiters: locks.iter().map(|l| l.waiters()).sum(),
            locks: locks.len(),
            pubsub_up,
        }
    }

    /// The server's address (without credentials), as used in error messages.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let client = slate_redis::RedisClient::open("redis://:pw@127.0.0.1:6379")?;
    /// assert_eq!(client.address(), "127.0.0.1:6379");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn address(&self) -> &str {
        &self.inner.address
    }

    /// The options this client was built with.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// assert_eq!(client.options().command_timeout(), slate_redis::DEFAULT_COMMAND_TIMEOUT);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn options(&self) -> &ClientOptions {
        &self.inner.options
    }

    /// How many times the server behind this client changed: the Sentinels named a different
    /// master than the previous connection went to (a failover), or a new connection reached a
    /// server with another run id than the previous one (a restart, a failover behind a stable
    /// address). Always 0 on a cluster.
    ///
    /// A multi-node lock uses it to verify a node again before its answers count (the promoted
    /// replica may lack the newest grants; a server restarted from disk may have lost some).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// assert_eq!(client.failovers(), 0);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn failovers(&self) -> u64 {
        self.inner.failovers.load(Ordering::Relaxed)
    }

    /// Whether an acquisition in hash slot `slot` must first raise the slot's fencing counter
    /// to the server's clock (`scripts/acquire.lua` ARGV[10]): `Some(generation)` until this
    /// client has done so on the server it talks to now, `None` after.
    ///
    /// A server that comes back with older data (a restart from an RDB snapshot or from an AOF
    /// that lost its last second, or a promoted replica that had not received the last
    /// increments) brings the counters back older, and without the raise the tokens issued
    /// since would be issued again. Every client raises each slot's counter at its first grant
    /// there after it reached a new server (a new run id behind the address, or a new master
    /// named by the Sentinels: [`failovers`](Self::failovers)), and at its first grant there
    /// at all; the counter, which grows by one token per acquisition (a block of up to the
    /// tenure, 8, for a first acquisition with local waiters) and so stays behind the
    /// server's clock in µs unless a slot takes over 125,000 acquisitions a second, then
    /// stays above every token issued before. A client that cannot read the server's run id
    /// (`INFO` refused) sees no restart, and says so once in its log. A cluster's failovers
    /// are not seen (redis-rs's cluster client follows them silently): there only the first
    /// grant of each slot raises.
    pub(crate) fn fence_floor_needed(&self, slot: u16) -> Option<u64> {
        let generation = self.failovers();
        let mut floors = lock(&self.inner.fence_floors);
        if floors.generation != generation {
            floors.generation = generation;
            floors.raised.fill(0);
        }
        let (word, bit) = FenceFloors::place(slot);
        (floors.raised[word] & bit == 0).then_some(generation)
    }

    /// Notes that a grant raised `slot`'s counter (asked under `generation`).
    pub(crate) fn fence_floor_raised(&self, slot: u16, generation: u64) {
        let mut floors = lock(&self.inner.fence_floors);
        if floors.generation == generation && self.failovers() == generation {
            let (word, bit) = FenceFloors::place(slot);
            floors.raised[word] |= bit;
        }
    }

    /// The deployment this client talks to.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// assert_eq!(client.topology(), slate_redis::Topology::Standalone);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn topology(&self) -> Topology {
        self.inner.backend.topology()
    }

    pub(crate) fn runtime(&self) -> &Handle {
        &self.inner.runtime
    }

    /// The `backend` label of this client's metrics.
    pub(crate) fn backend_label(&self) -> &'static str {
        backend_label(self.topology())
    }

    /// The meter of the lock `name` of kind `primitive` on this client.
    pub(crate) fn lock_meter(&self, primitive: &'static str, name: &LockName) -> Meter {
        Meter::for_lock(primitive, self.backend_label(), name)
    }

    /// (Cluster) the slot map: read with `CLUSTER SLOTS` on first use and after
    /// [`forget_cluster_slots`](Self::forget_cluster_slots).
    pub(crate) async fn cluster_slots(&self) -> Result<Arc<SlotMap>> {
        if let Some(map) = lock(&self.inner.slots).clone() {
            return Ok(map);
        }
        let reply: redis::Value = self
            .exec("CLUSTER SLOTS", |mut c| async move {
                redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut c).await
            })
            .await?;
        let map = Arc::new(
            SlotMap::parse(&reply)
                .ok_or_else(|| unexpected_reply("CLUSTER SLOTS", self.address(), &reply))?,
        );
        *lock(&self.inner.slots) = Some(map.clone());
        Ok(map)
    }

    /// (Cluster) the slot map if it is known, without asking.
    pub(crate) fn cached_cluster_slots(&self) -> Option<Arc<SlotMap>> {
        lock(&self.inner.slots).clone()
    }

    /// (Cluster) drops the slot map: the next use reads it again.
    pub(crate) fn forget_cluster_slots(&self) {
        lock(&self.inner.slots).take();
    }

    /// The release scripts' publish command argument: `SPUBLISH` on a cluster (sharded
    /// pub/sub), `''` (`PUBLISH`) elsewhere.
    pub(crate) fn publish_arg(&self) -> &'static str {
        match self.inner.backend {
            Backend::Cluster(_) if !self.inner.no_sharded_pubsub.load(Ordering::Relaxed) => {
                "SPUBLISH"
            }
            _ => "",
        }
    }

    /// The synced-replicas setting.
    pub(crate) fn synced(&self) -> Option<(usize, Duration)> {
        self.inner.options.synced_replicas
    }

    /// The command timeout this client was built with.
    pub(crate) fn command_timeout(&self) -> Duration {
        self.inner.options.command_timeout
    }

    pub(crate) fn from_inner(inner: Arc<Inner>) -> Self {
        RedisClient { inner }
    }
}

/// Which master serves which slots, from `CLUSTER SLOTS`.
pub(crate) struct SlotMap {
    /// (first slot, last slot, host, port), sorted.
    ranges: Vec<(u16, u16, String, u16)>,
}

impl SlotMap {
    fn parse(reply: &redis::Value) -> Option<Self> {
        let redis::Value::Array(rows) = reply else {
            return None;
        };
        let mut ranges = Vec::with_capacity(rows.len());
        for row in rows {
            let redis::Value::Array(f) = row else {
                return None;
            };
            let (start, end, master) = (f.first()?, f.get(1)?, f.get(2)?);
            let start: u16 = redis::from_redis_value_ref(start).ok()?;
            let end: u16 = redis::from_redis_value_ref(end).ok()?;
            let redis::Value::Array(m) = master else {
                return None;
            };
            let host: String = redis::from_redis_value_ref(m.first()?).ok()?;
            let port: u16 = redis::from_redis_value_ref(m.get(1)?).ok()?;
            ranges.push((start, end, host, port));
        }
        ranges.sort_unstable();
        Some(SlotMap { ranges })
    }

    /// The (host, port) of the master serving `slot`, if any.
    pub(crate) fn owner(&self, slot: u16) -> Option<(String, u16)> {
        let i = self.ranges.partition_point(|r| r.1 < slot);
        self.ranges
            .get(i)
            .filter(|r| r.0 <= slot)
            .map(|r| (r.2.clone(), r.3))
    }
}

fn parse_url(url: &str) -> Result<redis::ConnectionInfo> {
    if url.starts_with("rediss://") && !cfg!(feature = "tls") {
        return Err(Error::invalid_input(
            "url",
            "a rediss:// (TLS) URL needs TLS support",
            "enable the `tls` feature of slate-redis",
        ));
    }
    url.into_connection_info().map_err(|e| bad_url(url, &e))
}

fn apply_credentials(
    info: redis::ConnectionInfo,
    options: &ClientOptions,
) -> redis::ConnectionInfo {
    let Some(password) = &options.password else {
        return info;
    };
    let mut settings = info.redis_settings().clone().set_password(password);
    if let Some(user) = &options.username {
        settings = settings.set_username(user);
    }
    info.set_redis_settings(settings)
}

fn bad_url(url: &str, e: &redis::RedisError) -> Error {
    let shown = redact(url);
    Error::invalid_input(
        "url",
        format!("{shown} is not a usable Redis URL ({})", e.category()),
        "use redis://[user:password@]host:port[/db] (or rediss:// with the `tls` feature)",
    )
}

/// The servers' addresses (without credentials), comma-separated, for messages.
fn addresses(infos: &[redis::ConnectionInfo]) -> String {
    infos
        .iter()
        .map(|i| i.addr().to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The URL with any password replaced, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}<credentials>{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// A backend error for a reply that does not have the shape the scripts promise.
pub(crate) fn unexpected_reply(what: &str, node: &str, reply: impl fmt::Debug) -> Error {
    Error::backend(
        BackendKind::Response,
        Some(node.to_owned()),
        format!("{what} answered {reply:?}, which is not one of the script's replies"),
        None,
    )
}

/// Appends every string in `v` (an `INFO` reply: one text, or one per node) to `out`.
fn collect_text(v: &redis::Value, out: &mut String) {
    match v {
        redis::Value::BulkString(b) => out.push_str(&String::from_utf8_lossy(b)),
        redis::Value::SimpleString(t) | redis::Value::VerbatimString { text: t, .. } => {
            out.push_str(t);
        }
        redis::Value::Array(items) | redis::Value::Set(items) => {
            items.iter().for_each(|i| collect_text(i, out));
        }
        redis::Value::Map(pairs) => pairs.iter().for_each(|(_, i)| collect_text(i, out)),
        _ => {}
    }
    out.push('\n');
}

/// The `maxmemory_policy` of an `INFO` reply (on a cluster, of several nodes: an evicting one
/// first).
fn eviction_policy_of(v: &redis::Value) -> Option<String> {
    let mut text = String::new();
    collect_text(v, &mut text);
    let mut policies = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("maxmemory_policy:"))
        .map(str::to_owned)
        .collect::<Vec<_>>();
    policies.sort_by_key(|p| p.eq_ignore_ascii_case("noeviction"));
    policies.into_iter().next()
}

#[cfg(test)]
mod tests;
