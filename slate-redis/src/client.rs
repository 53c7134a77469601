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
use slate_core::{BackendKind, Error, Result};
use tokio::runtime::Handle;

use crate::conn::{Conn, Topology};
use crate::error;
use crate::notify::{Notifier, PubSubSource};
use crate::renewal::Renewal;
use crate::scripts;

/// The default command timeout.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// Options of a [`RedisClient`], built with [`ClientOptions::builder`] and read back with
/// getters named as the options.
///
/// | option | default | meaning |
/// | --- | --- | --- |
/// | command timeout | 2 s | budget of every command Slate sends (script calls, queries, renewal pipelines, subscriptions), enforced with a tokio timeout around the call; also the response timeout of connections the client creates |
/// | connect timeout | 2 s | budget for opening a connection |
/// | credentials | from the URL | ACL user and password; override the URL's |
/// | pool size | 8 | connections of the pool [`RedisClient::open`] builds (commands are multiplexed, so few are needed) |
/// | runtime | the current one | the tokio runtime that runs renewal, notifications and background releases |
/// | synced replicas | off | replicas that must acknowledge every grant and renewal (`WAIT`) before it counts; see [`synced_replicas`](Self::synced_replicas) |
///
/// TLS is chosen by the URL scheme, `rediss://`, and needs the `tls` cargo feature.
///
/// `Debug` never shows the password.
///
/// # Examples
///
/// ```
/// use slate_redis::ClientOptions;
/// use std::time::Duration;
///
/// let opts = ClientOptions::builder()
///     .command_timeout(Duration::from_millis(500))
///     .username("app")
///     .password("s3cret")
///     .build()?;
/// assert!(!format!("{opts:?}").contains("s3cret"));
/// # Ok::<(), slate_redis::Error>(())
/// ```
#[derive(Clone)]
pub struct ClientOptions {
    command_timeout: Duration,
    connect_timeout: Duration,
    username: Option<String>,
    password: Option<String>,
    pool_size: usize,
    runtime: Option<Handle>,
    synced_replicas: Option<(usize, Duration)>,
    refuse_evicting_server: bool,
    #[cfg(feature = "tls")]
    tls_root_certificate: Option<Vec<u8>>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: DEFAULT_COMMAND_TIMEOUT,
            username: None,
            password: None,
            pool_size: 8,
            runtime: None,
            synced_replicas: None,
            refuse_evicting_server: false,
            #[cfg(feature = "tls")]
            tls_root_certificate: None,
        }
    }
}

impl fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientOptions")
            .field("command_timeout", &self.command_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("pool_size", &self.pool_size)
            .field("runtime", &self.runtime.as_ref().map(|_| "<handle>"))
            .field("synced_replicas", &self.synced_replicas)
            .field("refuse_evicting_server", &self.refuse_evicting_server)
            .finish_non_exhaustive()
    }
}

/// Builds [`ClientOptions`]: one setter per option, named as the option (tokio's and
/// redis-rs's builder style); [`build`](Self::build) checks every rule.
///
/// # Examples
///
/// ```
/// use slate_redis::ClientOptions;
/// use std::time::Duration;
///
/// let opts = ClientOptions::builder()
///     .command_timeout(Duration::from_millis(500))
///     .username("app")
///     .password("s3cret")
///     .build()?;
/// assert_eq!(opts.command_timeout(), Duration::from_millis(500));
/// # Ok::<(), slate_redis::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
#[must_use = "a builder does nothing until build() is called"]
pub struct ClientOptionsBuilder(ClientOptions);

impl From<ClientOptions> for ClientOptionsBuilder {
    /// Starts from existing options (to change a few of them).
    fn from(options: ClientOptions) -> Self {
        ClientOptionsBuilder(options)
    }
}

impl ClientOptionsBuilder {
    /// Sets the budget of every command (default 2 s).
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// let o = slate_redis::ClientOptions::builder().command_timeout(Duration::from_secs(1)).build()?;
    /// assert_eq!(o.command_timeout(), Duration::from_secs(1));
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.0.command_timeout = timeout;
        self
    }

    /// Sets the budget for opening a connection (default 2 s).
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// let _ = slate_redis::ClientOptions::builder().connect_timeout(Duration::from_secs(1));
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.0.connect_timeout = timeout;
        self
    }

    /// Sets the ACL user, overriding the URL's (default: the URL's, or Redis's `default` user).
    ///
    /// # Examples
    ///
    /// ```
    /// let o = slate_redis::ClientOptions::builder().username("app").password("s3cret").build()?;
    /// assert_eq!(o.username(), Some("app"));
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.0.username = Some(username.into());
        self
    }

    /// Sets the password, overriding the URL's (never shown by `Debug`, errors or logs).
    ///
    /// # Examples
    ///
    /// ```
    /// let o = slate_redis::ClientOptions::builder().password("s3cret").build()?;
    /// assert!(!format!("{o:?}").contains("s3cret"));
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.0.password = Some(password.into());
        self
    }

    /// Sets the size of the pool that [`RedisClient::open`] builds (default 8).
    ///
    /// # Examples
    ///
    /// ```
    /// let _ = slate_redis::ClientOptions::builder().pool_size(4);
    /// ```
    pub fn pool_size(mut self, size: usize) -> Self {
        self.0.pool_size = size;
        self
    }

    /// Sets the tokio runtime that runs renewal, notifications and background releases
    /// (default: the runtime current when the client is built; outside any runtime, a small
    /// one the client starts for itself).
    ///
    /// # Examples
    ///
    /// ```
    /// let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    /// let _ = slate_redis::ClientOptions::builder().runtime(rt.handle().clone());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn runtime(mut self, handle: Handle) -> Self {
        self.0.runtime = Some(handle);
        self
    }

    /// Makes every grant and every renewal wait until `replicas` replicas of the lock's master
    /// have acknowledged it (`WAIT replicas within`, on the connection that wrote it), in the
    /// spirit of Redisson's synced-replicas check.
    ///
    /// Replication is asynchronous: without this, a master that fails right after a grant can
    /// lose it when a replica that never received it is promoted, and a second holder is then
    /// granted the same lock. With it:
    /// - a grant not acknowledged by `replicas` replicas within `within` is **given back** and
    ///   the attempt fails with a transient backend error naming the count (the lock call
    ///   retries as after any transient error);
    /// - a renewal counts (moves the lease deadline) only once acknowledged, so the holder's
    ///   deadline never runs past what the replicas know;
    /// - what it promises: a promoted replica that was among the acknowledging ones has every
    ///   grant and renewal the holder relies on. Choose `replicas` so that the replica the
    ///   failover promotes is one of them (e.g. all replicas, or a majority with Sentinel's or
    ///   the cluster's own election preferring the most up-to-date replica). `WAIT` does not
    ///   make Redis strongly consistent: a replica that acknowledged and then lost its data
    ///   (restarted without persistence) still loses grants.
    ///
    /// `within` must be shorter than the command timeout (it is part of each call's budget).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let o = slate_redis::ClientOptions::builder()
    ///     .synced_replicas(1, Duration::from_millis(500))
    ///     .build()?;
    /// assert_eq!(o.synced_replicas(), Some((1, Duration::from_millis(500))));
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    pub fn synced_replicas(mut self, replicas: usize, within: Duration) -> Self {
        self.0.synced_replicas = (replicas > 0).then_some((replicas, within));
        self
    }

    /// Refuses a server whose `maxmemory-policy` can evict lock keys (anything but
    /// `noeviction`: every lock key has a TTL, so `volatile-*` policies evict them first, and
    /// `allkeys-*` ones may): each connection then fails with a [`BackendKind::Other`] error
    /// naming the policy and the fix. Off by default: such a server is used, and the client
    /// logs one warning with the fix (issue 35, defect 14). A server that does not let the
    /// client read its configuration (`CONFIG GET` denied by an ACL) is used either way; with
    /// this option on, a warning says the policy could not be checked.
    ///
    /// On a Redis Cluster the node the client's connection asks is checked.
    ///
    /// # Examples
    ///
    /// ```
    /// let o = slate_redis::ClientOptions::builder().refuse_evicting_server(true).build()?;
    /// assert!(o.refuses_evicting_server());
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    pub fn refuse_evicting_server(mut self, refuse: bool) -> Self {
        self.0.refuse_evicting_server = refuse;
        self
    }

    /// Trusts this CA certificate (PEM) for `rediss://` connections instead of the platform's
    /// root store (feature `tls`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let pem = std::fs::read("ca.crt")?;
    /// let _ = slate_redis::ClientOptions::builder().tls_root_certificate(pem);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.0.tls_root_certificate = Some(pem.into());
        self
    }

    /// Checks every option against its rule and returns the options.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the first invalid option (a zero or over-long timeout, a
    /// pool of 0, a replica wait not below the command timeout) and the fix.
    ///
    /// # Examples
    ///
    /// ```
    /// let e = slate_redis::ClientOptions::builder().pool_size(0).build().unwrap_err();
    /// assert!(e.to_string().contains("pool size"));
    /// ```
    pub fn build(self) -> Result<ClientOptions> {
        self.0.validate()?;
        Ok(self.0)
    }
}

impl ClientOptions {
    /// Starts building options from the defaults.
    ///
    /// # Examples
    ///
    /// ```
    /// let o = slate_redis::ClientOptions::builder().pool_size(4).build()?;
    /// assert_eq!(o.pool_size(), 4);
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    pub fn builder() -> ClientOptionsBuilder {
        ClientOptionsBuilder::default()
    }

    /// Whether a server whose eviction policy can remove lock keys is refused (see
    /// [`ClientOptionsBuilder::refuse_evicting_server`]).
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(!slate_redis::ClientOptions::default().refuses_evicting_server());
    /// ```
    #[must_use]
    pub fn refuses_evicting_server(&self) -> bool {
        self.refuse_evicting_server
    }

    /// The budget of every command.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert_eq!(slate_redis::ClientOptions::default().command_timeout(), Duration::from_secs(2));
    /// ```
    #[must_use]
    pub fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// The budget for opening a connection.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert_eq!(slate_redis::ClientOptions::default().connect_timeout(), Duration::from_secs(2));
    /// ```
    #[must_use]
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The ACL user set in the options (`None`: the URL's).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_redis::ClientOptions::default().username(), None);
    /// ```
    #[must_use]
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// The size of the pool [`RedisClient::open`] builds.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_redis::ClientOptions::default().pool_size(), 8);
    /// ```
    #[must_use]
    pub fn pool_size(&self) -> usize {
        self.pool_size
    }

    /// The synced-replicas setting: replicas and their wait, `None` when off.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_redis::ClientOptions::default().synced_replicas(), None);
    /// ```
    #[must_use]
    pub fn synced_replicas(&self) -> Option<(usize, Duration)> {
        self.synced_replicas
    }

    fn validate(&self) -> Result<()> {
        if self.command_timeout.is_zero() {
            return Err(Error::invalid_input(
                "command timeout",
                "it is zero, so every command would time out",
                "use a command timeout of at least a few milliseconds (the default is 2s)",
            ));
        }
        if self.connect_timeout.is_zero() {
            return Err(Error::invalid_input(
                "connect timeout",
                "it is zero, so no connection could be opened",
                "use a connect timeout of at least a few milliseconds (the default is 2s)",
            ));
        }
        slate_core::options::check_max_duration("command timeout", self.command_timeout)?;
        slate_core::options::check_max_duration("connect timeout", self.connect_timeout)?;
        if let Some((_, within)) = self.synced_replicas
            && (within.is_zero() || within >= self.command_timeout)
        {
            return Err(Error::invalid_input(
                "synced replicas",
                format!(
                    "the acknowledgement wait {within:?} must be above zero and below the \
                     command timeout {:?}, which bounds each call",
                    self.command_timeout
                ),
                "wait at most about half the command timeout for replicas (or raise the \
                 command timeout)",
            ));
        }
        if self.pool_size == 0 {
            return Err(Error::invalid_input(
                "pool size",
                "it is zero",
                "use a pool size of at least 1 (the default is 8)",
            ));
        }
        Ok(())
    }
}

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
    /// (Sentinel) the master's address at the last connection, and how many times it changed.
    master: Mutex<Option<String>>,
    /// The run id of the server the last new connection (standalone or Sentinel) reached.
    run_id: Mutex<Option<String>>,
    failovers: AtomicU64,
    pub(crate) renewal: Renewal,
    pub(crate) notifier: Notifier,
    pub(crate) locks: Registry<Arc<[u8]>>,
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
    /// Opens a client for the server at `url` with default options.
    ///
    /// `redis://[user:password@]host:port[/db]`, or `rediss://...` for TLS (with the `tls`
    /// feature). Nothing is sent until the first command; call [`ping`](Self::ping) to check
    /// the server and credentials at once.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a malformed URL, a `rediss://` URL without the `tls`
    /// feature. Outside a tokio runtime (and without
    /// [`ClientOptionsBuilder::runtime`]) the client starts a small runtime of its own (one
    /// worker thread, shut down with the client), so it serves the `blocking_*` methods from
    /// plain threads.
    pub fn open(url: impl AsRef<str>) -> Result<Self> {
        Self::open_with(url, ClientOptions::default())
    }

    /// Opens a client for the server at `url` with `options`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use slate_redis::{ClientOptions, RedisClient};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let opts = ClientOptions::builder().command_timeout(Duration::from_millis(500)).build()?;
    /// let client = RedisClient::open_with("redis://127.0.0.1:6379", opts)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open), plus invalid options.
    pub fn open_with(url: impl AsRef<str>, options: ClientOptions) -> Result<Self> {
        options.validate()?;
        let url = url.as_ref();
        let info = parse_url(url)?;
        let info = apply_credentials(info, &options);
        #[cfg(feature = "tls")]
        let info = match &options.tls_root_certificate {
            Some(pem) => redis::Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.clone()),
                },
            )
            .map_err(|e| bad_url(url, &e))?
            .get_connection_info()
            .clone(),
            None => info,
        };
        let client = redis::Client::open(info.clone()).map_err(|e| bad_url(url, &e))?;
        let address = info.addr().to_string();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.command_timeout));
        let manager = Manager::new_with_config(info, config).map_err(|e| bad_url(url, &e))?;
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .wait_timeout(Some(options.command_timeout))
            .create_timeout(Some(options.connect_timeout))
            .recycle_timeout(Some(options.command_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| {
                Error::invalid_input(
                    "pool",
                    format!("the pool could not be built: {e}"),
                    "check the pool options",
                )
            })?;
        Self::build(
            Backend::Standalone(pool),
            Some(PubSubSource::Server(Box::new(client))),
            address,
            options,
        )
    }

    /// Wraps an existing pool; `pubsub` (a client for the same server) opens the pub/sub
    /// connection that wakes waiters on release.
    ///
    /// The pool's own connection settings apply (redis-rs's default response timeout is
    /// 500 ms); Slate's command timeout applies on top of them.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let url = "redis://127.0.0.1:6379";
    /// let pool = deadpool_redis::Config::from_url(url).create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
    /// let client = slate_redis::RedisClient::from_pool(pool, redis::Client::open(url)?)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// None today (the signature leaves room for checks); outside a tokio runtime the client
    /// starts one of its own, as [`open`](Self::open) does.
    pub fn from_pool(pool: Pool, pubsub: redis::Client) -> Result<Self> {
        Self::from_pool_with(pool, Some(pubsub), ClientOptions::default())
    }

    /// Wraps an existing pool with `options` (credentials in `options` only apply to the
    /// pub/sub client; the pool keeps its own). Without a `pubsub` client, waiters are woken by
    /// the spin-wait timer only.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:6379")
    ///     .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
    /// let client = slate_redis::RedisClient::from_pool_with(pool, None, Default::default())?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// None today beyond a malformed pub/sub client; outside a tokio runtime the client starts
    /// one of its own, as [`open`](Self::open) does.
    pub fn from_pool_with(
        pool: Pool,
        pubsub: Option<redis::Client>,
        options: ClientOptions,
    ) -> Result<Self> {
        options.validate()?;
        let pubsub = match pubsub {
            Some(c) if options.password.is_some() => {
                let info = apply_credentials(c.get_connection_info().clone(), &options);
                Some(redis::Client::open(info).map_err(|e| bad_url("<pubsub client>", &e))?)
            }
            other => other,
        };
        let address = pubsub.as_ref().map_or_else(
            || "redis".to_owned(),
            |c| c.get_connection_info().addr().to_string(),
        );
        Self::build(
            Backend::Standalone(pool),
            pubsub.map(|c| PubSubSource::Server(Box::new(c))),
            address,
            options,
        )
    }

    /// Opens a client for a Redis Cluster, discovered from `seeds` (any of its nodes; several
    /// in case some are down).
    ///
    /// Every key of one lock shares one hash slot (the `{…}` tag of its name), so each lock
    /// lives on the shard that owns that slot, and its scripts run there in one call. The
    /// client follows `MOVED`/`ASK` redirects and failovers; release notifications use sharded
    /// pub/sub (`SSUBSCRIBE`/`SPUBLISH`, Redis 7), delivered by the shard that owns the lock;
    /// renewals go as one pipeline per node per tick.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use slate_redis::{ClientOptions, RedisClient};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let client = RedisClient::open_cluster(
    ///     ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"],
    ///     ClientOptions::default(),
    /// )?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for no seed, a malformed URL, seeds that differ in TLS or
    /// credentials. Outside a tokio runtime the client starts one of its own, as
    /// [`open`](Self::open) does.
    pub fn open_cluster<I, S>(seeds: I, options: ClientOptions) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        options.validate()?;
        let seeds: Vec<String> = seeds.into_iter().map(|s| s.as_ref().to_owned()).collect();
        if seeds.is_empty() {
            return Err(Error::invalid_input(
                "cluster seeds",
                "no seed node was given",
                "give at least one node of the cluster (redis://host:port)",
            ));
        }
        let infos = seeds
            .iter()
            .map(|u| parse_url(u).map(|i| apply_credentials(i, &options)))
            .collect::<Result<Vec<_>>>()?;
        let address = format!("cluster {}", addresses(&infos));
        let build = {
            let infos = infos.clone();
            let options = options.clone();
            move |push: Option<tokio::sync::mpsc::UnboundedSender<redis::PushInfo>>| {
                let mut b = redis::cluster::ClusterClientBuilder::new(infos.clone())
                    .connection_timeout(options.connect_timeout)
                    .response_timeout(options.command_timeout);
                #[cfg(feature = "tls")]
                if let Some(pem) = &options.tls_root_certificate {
                    b = b.certs(redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(pem.clone()),
                    });
                }
                if let Some(push) = push {
                    b = b
                        .use_protocol(redis::ProtocolVersion::RESP3)
                        .push_sender(push);
                }
                b.build()
            }
        };
        let client = build(None).map_err(|e| bad_url(&seeds[0], &e))?;
        Self::build(
            Backend::Cluster(Box::new(client)),
            Some(PubSubSource::Cluster(Arc::new(build))),
            address,
            options,
        )
    }

    /// Opens a client for the master that the Sentinels at `sentinels` name `master_name`,
    /// following failovers: when the master changes (its connection breaks, or it answers
    /// `READONLY` after being demoted), the client asks the Sentinels again.
    ///
    /// The Sentinels' URLs carry the Sentinels' own credentials, if any;
    /// [`ClientOptionsBuilder::username`] and [`ClientOptionsBuilder::password`] are those of the data servers.
    ///
    /// Replication is asynchronous: a grant the master acknowledged but had not yet sent to a
    /// replica is lost if that replica is promoted. [`ClientOptionsBuilder::synced_replicas`] makes
    /// every grant (and renewal) wait for replicas first.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use slate_redis::{ClientOptions, RedisClient};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let client = RedisClient::open_sentinel(
    ///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///     "mymaster",
    ///     ClientOptions::default(),
    /// )?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for no Sentinel, an empty master name, a malformed URL, a
    /// `rediss://` Sentinel URL (TLS to Sentinels is not supported yet), invalid options, or
    /// (outside a tokio runtime the client starts one of its own, as [`open`](Self::open)
    /// does).
    pub fn open_sentinel<I, S>(
        sentinels: I,
        master_name: &str,
        options: ClientOptions,
    ) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        options.validate()?;
        let urls: Vec<String> = sentinels
            .into_iter()
            .map(|s| s.as_ref().to_owned())
            .collect();
        if urls.is_empty() {
            return Err(Error::invalid_input(
                "sentinels",
                "no Sentinel was given",
                "give the Sentinels' addresses (redis://host:26379)",
            ));
        }
        if master_name.is_empty() {
            return Err(Error::invalid_input(
                "master name",
                "it is empty",
                "give the name the Sentinels monitor the master under (sentinel monitor <name> ...)",
            ));
        }
        if let Some(u) = urls.iter().find(|u| u.starts_with("rediss://")) {
            return Err(Error::invalid_input(
                "sentinels",
                format!(
                    "{} asks for TLS, which Slate does not support with Sentinels yet",
                    redact(u)
                ),
                "reach the Sentinels over redis:// (or use a standalone or cluster URL)",
            ));
        }
        let infos = urls
            .iter()
            .map(|u| parse_url(u))
            .collect::<Result<Vec<_>>>()?;
        let mut node = redis::RedisConnectionInfo::default();
        if let Some(password) = &options.password {
            node = node.set_password(password);
            if let Some(user) = &options.username {
                node = node.set_username(user);
            }
        }
        let node_info = SentinelNodeConnectionInfo::default().set_redis_connection_info(node);
        // An owned name: redis-rs takes a `String` without TLS support and `impl AsRef<str>`
        // with it (both are built: the `tls` feature, and crates built alone).
        #[allow(clippy::unnecessary_to_owned)]
        let sentinel = SentinelClient::build(
            infos.clone(),
            master_name.to_owned(),
            Some(node_info),
            SentinelServerType::Master,
        )
        .map_err(|e| bad_url(&urls[0], &e))?;
        let address = format!("sentinel {master_name} via {}", addresses(&infos));
        let sentinel = Arc::new(tokio::sync::Mutex::new(sentinel));
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.command_timeout));
        Self::build(
            Backend::Sentinel {
                sentinel: sentinel.clone(),
                config: Box::new(config),
            },
            Some(PubSubSource::Sentinel(sentinel)),
            address,
            options,
        )
    }

    fn build(
        backend: Backend,
        pubsub: Option<PubSubSource>,
        address: String,
        options: ClientOptions,
    ) -> Result<Self> {
        let (runtime, own_runtime) = match options.runtime.clone() {
            Some(h) => (h, None),
            None => match Handle::try_current() {
                Ok(h) => (h, None),
                Err(_) => {
                    let (own, handle) = OwnRuntime::start()?;
                    (handle, Some(own))
                }
            },
        };
        let no_sharded_pubsub = Arc::new(AtomicBool::new(false));
        let inner = Arc::new_cyclic(|weak: &Weak<Inner>| Inner {
            renewal: Renewal::new(weak.clone()),
            notifier: Notifier::new(
                pubsub,
                options.command_timeout,
                options.connect_timeout,
                no_sharded_pubsub.clone(),
            ),
            no_sharded_pubsub,
            eviction_warned: AtomicBool::new(false),
            master: Mutex::new(None),
            run_id: Mutex::new(None),
            failovers: AtomicU64::new(0),
            backend,
            address,
            runtime,
            _own_runtime: own_runtime,
            options,
            conn: Mutex::new(ConnSlot {
                generation: 0,
                conn: None,
                silent_since: None,
            }),
            fill: tokio::sync::Mutex::new(()),
            slots: Mutex::new(None),
            locks: Registry::default(),
        });
        Ok(RedisClient { inner })
    }

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
    /// all carry a TTL, and so give a held lock to another holder (issue 35, defect 14).
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
        let slot = crate::conn::slot_of(key);
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
        match &self.inner.backend {
            Backend::Standalone(_) => Topology::Standalone,
            Backend::Cluster(_) => Topology::Cluster,
            Backend::Sentinel { .. } => Topology::Sentinel,
        }
    }

    pub(crate) fn runtime(&self) -> &Handle {
        &self.inner.runtime
    }

    /// The shared multiplexed connection (borrowed from the pool on first use and after a
    /// failure), with its generation for [`invalidate`](Self::invalidate).
    ///
    /// It is never checked before use (a check would cost a round trip inside the caller's
    /// command timeout): a connection a restarted server broke fails the command at once with
    /// an I/O error, and [`exec`](Self::exec) sends it again on a new one; every command Slate
    /// sends may be repeated (acquire and release carry request ids).
    async fn connection(&self) -> Result<(u64, Conn)> {
        {
            let slot = lock(&self.inner.conn);
            if let Some(c) = &slot.conn {
                return Ok((slot.generation, c.conn()));
            }
        }
        // One task fills the slot; the others wait for it instead of each taking (and
        // PING-recycling) a pool connection.
        let _filling = self.inner.fill.lock().await;
        {
            let slot = lock(&self.inner.conn);
            if let Some(c) = &slot.conn {
                return Ok((slot.generation, c.conn()));
            }
        }
        let budget = self.inner.options.connect_timeout;
        let address = &self.inner.address;
        let held = match &self.inner.backend {
            Backend::Standalone(pool) => Held::Pooled(
                pool.get()
                    .await
                    .map_err(|e| error::from_pool(e, address, budget))?,
            ),
            Backend::Cluster(client) => {
                let conn = tokio::time::timeout(budget, client.get_async_connection())
                    .await
                    .map_err(|_| {
                        error::command_timeout("connecting to the cluster", address, budget)
                    })?
                    .map_err(|e| error::from_redis(e, "connecting to the cluster", address))?;
                // Sharded pub/sub needs Redis 7: asked once per connection (the answer names
                // no command on older servers, or where SPUBLISH is renamed away).
                let mut probe = conn.clone();
                let spublish: redis::Value = redis::cmd("COMMAND")
                    .arg("INFO")
                    .arg("SPUBLISH")
                    .query_async(&mut probe)
                    .await
                    .map_err(|e| error::from_redis(e, "COMMAND INFO SPUBLISH", address))?;
                let missing = match &spublish {
                    redis::Value::Array(v) => v.iter().all(|x| matches!(x, redis::Value::Nil)),
                    _ => false,
                };
                if missing && !self.inner.no_sharded_pubsub.swap(true, Ordering::Relaxed) {
                    tracing::warn!(cluster = %address,
                        "the cluster has no sharded pub/sub (SPUBLISH/SSUBSCRIBE, Redis 7): \
                         releases are published with PUBLISH and waiters wait on the spin-wait \
                         timer instead of being woken by releases");
                }
                Held::Owned(Conn::Cluster(conn))
            }
            Backend::Sentinel { sentinel, config } => {
                let connect = async {
                    let master = sentinel.lock().await.async_get_client().await?;
                    let now = master.get_connection_info().addr().to_string();
                    let before = lock(&self.inner.master).replace(now.clone());
                    if before.as_ref().is_some_and(|b| *b != now) {
                        self.inner.failovers.fetch_add(1, Ordering::Relaxed);
                        // Counted once: the new master's run id is not another change.
                        lock(&self.inner.run_id).take();
                        tracing::warn!(sentinel = %address, master = %now,
                            "the Sentinels name a new master (a failover)");
                    }
                    master
                        .get_multiplexed_async_connection_with_config(config)
                        .await
                };
                let conn = tokio::time::timeout(budget, connect)
                    .await
                    .map_err(|_| {
                        error::command_timeout(
                            "asking the Sentinels for the master",
                            address,
                            budget,
                        )
                    })?
                    .map_err(|e| {
                        error::from_redis(e, "asking the Sentinels for the master", address)
                    })?;
                Held::Owned(Conn::Server(conn))
            }
        };
        let mut conn = held.conn();
        // Load every script once per connection, so that normal operation never meets NOSCRIPT
        // (after a restart or a failover it still can; the callers reload then).
        let loaded = match &mut conn {
            // SCRIPT LOAD goes to every master of a cluster; a pipeline cannot (no key).
            Conn::Cluster(_) => {
                let mut r = Ok(());
                for script in scripts::ALL {
                    r = script.load_cmd().query_async::<()>(&mut conn).await;
                    if r.is_err() {
                        break;
                    }
                }
                r
            }
            Conn::Server(_) => {
                let mut load = redis::pipe();
                for script in scripts::ALL {
                    load.add_command(script.load_cmd()).ignore();
                }
                load.query_async::<()>(&mut conn).await
            }
        };
        loaded.map_err(|e| error::from_redis(e, "loading the lock scripts", address))?;
        self.check_server(&mut conn).await?;
        let mut slot = lock(&self.inner.conn);
        slot.conn = Some(held);
        slot.silent_since = None;
        Ok((slot.generation, conn))
    }

    /// Reads `INFO` on a new connection. Its run id: a server other than the one the last
    /// connection reached (a restart behind the same address, whatever came back from disk)
    /// counts as a failover ([`failovers`](Self::failovers)), so that a multi-node lock
    /// verifies the node before its answers count again (issue 28, item 2, found by the
    /// review). Its `maxmemory-policy`: a policy that can evict lock keys is refused with
    /// [`ClientOptionsBuilder::refuse_evicting_server`], and otherwise warned about once per
    /// client (issue 35, defect 14).
    async fn check_server(&self, conn: &mut Conn) -> Result<()> {
        let address = &self.inner.address;
        let strict = self.inner.options.refuse_evicting_server;
        // `INFO` rather than `CONFIG GET`: the least-privilege user already has it (README).
        // The default sections hold both fields (one section per call before Redis 7). A
        // cluster connection may answer for several nodes: any evicting one counts.
        let reply: RedisResult<redis::Value> = redis::cmd("INFO").query_async(conn).await;
        if let (Ok(v), Conn::Server(_)) = (&reply, &*conn) {
            let mut text = String::new();
            collect_text(v, &mut text);
            let run_id = text
                .lines()
                .find_map(|l| l.trim().strip_prefix("run_id:"))
                .map(str::to_owned);
            if let Some(now) = run_id {
                let before = lock(&self.inner.run_id).replace(now.clone());
                if before.is_some_and(|b| b != now) {
                    self.inner.failovers.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(node = %address, run_id = %now,
                        "a new connection reached another server than the last one (a restart or a failover)");
                }
            }
        }
        let policy = match reply {
            Ok(v) => eviction_policy_of(&v),
            Err(e) => {
                if strict {
                    tracing::warn!(node = %address, error = %e,
                        "could not read the server's maxmemory-policy (grant +info to check \
                         it); a policy that evicts keys with a TTL would drop held locks");
                } else {
                    tracing::debug!(node = %address, error = %e, "INFO failed");
                }
                None
            }
        };
        let Some(policy) = policy.filter(|p| !p.eq_ignore_ascii_case("noeviction")) else {
            return Ok(());
        };
        let what = format!(
            "the server's maxmemory-policy is {policy}: once it reaches maxmemory it evicts \
             keys{}, and every lock key has a TTL, so a held lock can vanish and be granted to \
             another holder. Fix: `CONFIG SET maxmemory-policy noeviction` (and in the server's \
             configuration)",
            if policy.starts_with("volatile") {
                " with a TTL first"
            } else {
                ""
            }
        );
        if strict {
            return Err(Error::backend(
                BackendKind::Other,
                Some(address.to_owned()),
                format!("{what}; refused (ClientOptionsBuilder::refuse_evicting_server)"),
                None,
            ));
        }
        if !self.inner.eviction_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(node = %address, "{what}");
        }
        Ok(())
    }

    fn mark_ok(&self, generation: u64) {
        let mut slot = lock(&self.inner.conn);
        if slot.generation == generation {
            slot.silent_since = None;
        }
    }

    /// Notes a command that timed out on connection `generation`. The connection is replaced
    /// once it has given no reply for two command timeouts since its first late one: a
    /// connection whose peer is gone (half-open after a partition) never answers again. Late
    /// replies within that time keep it, so that what is sent right after a late command (an
    /// undo) stays on the same connection, ordered behind it.
    fn note_timeout(&self, generation: u64) {
        let replace = {
            let mut slot = lock(&self.inner.conn);
            if slot.generation != generation {
                false
            } else {
                let since = *slot.silent_since.get_or_insert_with(Instant::now);
                since.elapsed() >= self.inner.options.command_timeout * 2
            }
        };
        if replace {
            tracing::debug!(node = %self.inner.address, "the connection has not answered for two command timeouts; replacing it");
            self.invalidate(generation);
        }
    }

    fn invalidate(&self, generation: u64) {
        let mut slot = lock(&self.inner.conn);
        if slot.generation == generation {
            slot.generation += 1;
            if let Some(Held::Pooled(obj)) = slot.conn.take() {
                // A broken connection must not go back to the pool.
                drop(deadpool_redis::Connection::take(obj));
            }
        }
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

    /// Runs one command (or pipeline) on the shared connection within the command timeout.
    ///
    /// When the connection breaks before the reply arrives (a restarted server, a reset), the
    /// command may or may not have run; it is sent once more, on a new connection, within what
    /// is left of the command timeout. Every command Slate sends may be repeated: reads,
    /// `PEXPIRE`-style renewals, `SET NX`, a fence raised to a maximum, and the acquire and
    /// release scripts, which carry a request id so that the server answers a retry from the
    /// request's record instead of applying it twice (see `request.rs`).
    pub(crate) async fn exec<T, F, Fut>(&self, what: &'static str, f: F) -> Result<T>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let start = Instant::now();
        let budget = self.inner.options.command_timeout;
        match self.exec_within(what, budget, &f).await {
            Err(e) if e.backend_kind() == Some(BackendKind::Io) => {
                let left = budget.saturating_sub(start.elapsed());
                if left.is_zero() {
                    return Err(e);
                }
                tracing::debug!(node = %self.inner.address, error = %e, "{what}: the connection broke before the reply; sending the same request again");
                self.exec_within(what, left, f).await
            }
            r => r,
        }
    }

    async fn exec_within<T, F, Fut>(&self, what: &'static str, budget: Duration, f: F) -> Result<T>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        // The connection's generation, once taken (u64::MAX: none yet).
        let generation = std::sync::atomic::AtomicU64::new(u64::MAX);
        let run = async {
            let (gen_now, conn) = self.connection().await?;
            generation.store(gen_now, std::sync::atomic::Ordering::Relaxed);
            match f(conn).await {
                Ok(v) => {
                    self.mark_ok(gen_now);
                    Ok(v)
                }
                Err(e) => {
                    if e.is_timeout() {
                        self.note_timeout(gen_now);
                    } else if error::breaks_connection(&e) {
                        self.invalidate(gen_now);
                    }
                    Err(error::from_redis(e, what, &self.inner.address))
                }
            }
        };
        match tokio::time::timeout(budget, run).await {
            Ok(r) => r,
            Err(_) => {
                let g = generation.load(std::sync::atomic::Ordering::Relaxed);
                if g != u64::MAX {
                    self.note_timeout(g);
                }
                Err(error::command_timeout(what, &self.inner.address, budget))
            }
        }
    }

    /// Runs `fut` in the current runtime context when there is one, otherwise on the client's
    /// runtime (blocking callers poll from plain threads, where tokio timers and I/O need a
    /// runtime to be registered with).
    pub(crate) fn on_runtime<T, F>(
        &self,
        fut: F,
    ) -> impl Future<Output = Result<T>> + Send + 'static + use<T, F>
    where
        T: Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        slate_core::detach::on_runtime(self.inner.runtime.clone(), fut)
    }

    /// Spawns background work on the client's runtime.
    pub(crate) fn spawn<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        drop(self.inner.runtime.spawn(fut));
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
mod tests {
    use super::*;

    #[test]
    fn redact_hides_credentials() {
        assert_eq!(redact("redis://u:pw@h:1/0"), "redis://<credentials>@h:1/0");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }

    #[test]
    fn options_reject_zero() {
        let e = ClientOptions::builder()
            .command_timeout(Duration::ZERO)
            .build()
            .unwrap_err();
        assert!(e.is_invalid_input());
        assert!(ClientOptions::builder().pool_size(0).build().is_err());
    }

    /// Issue 19, defect 2: `command_timeout(Duration::MAX)` panicked on the clock in every
    /// call; it is refused when the client is opened.
    #[test]
    fn large_durations_are_refused() {
        for opts in [
            ClientOptions::builder().command_timeout(Duration::MAX),
            ClientOptions::builder().connect_timeout(Duration::MAX),
        ] {
            let e = opts.build().unwrap_err();
            assert!(
                e.is_invalid_input() && e.to_string().contains("365 days"),
                "{e}"
            );
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        // Options that skipped the builder's check (the default's fields set in place) are
        // checked again when the client is opened.
        let unchecked = ClientOptions {
            command_timeout: Duration::MAX,
            runtime: Some(rt.handle().clone()),
            ..ClientOptions::default()
        };
        let e = RedisClient::open_with("redis://127.0.0.1:1", unchecked).unwrap_err();
        assert!(e.is_invalid_input(), "{e}");
    }

    #[test]
    fn synced_replicas_wait_must_fit_the_command_timeout() {
        let e = ClientOptions::builder()
            .synced_replicas(1, DEFAULT_COMMAND_TIMEOUT)
            .build()
            .unwrap_err();
        assert!(e.to_string().contains("below the command timeout"), "{e}");
        assert!(
            ClientOptions::builder()
                .synced_replicas(1, Duration::ZERO)
                .build()
                .is_err()
        );
        let o = ClientOptions::builder()
            .synced_replicas(2, Duration::from_millis(500))
            .build()
            .unwrap();
        assert!(o.validate().is_ok());
        // Zero replicas is off.
        let o = ClientOptions::builder()
            .synced_replicas(0, Duration::ZERO)
            .build()
            .unwrap();
        assert_eq!(o.synced_replicas(), None);
        assert!(o.validate().is_ok());
    }

    #[test]
    fn open_outside_a_runtime_starts_a_runtime_of_its_own() {
        let client = RedisClient::open("redis://127.0.0.1:1").unwrap();
        let worker = client
            .runtime()
            .spawn(async { std::thread::current().name().map(str::to_owned) });
        let name = futures::executor::block_on(worker).unwrap();
        assert_eq!(name.as_deref(), Some("slate-client"));
        drop(client);
    }

    #[test]
    fn tls_without_feature_is_refused() {
        if cfg!(feature = "tls") {
            return;
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let e = RedisClient::open_with(
            "rediss://127.0.0.1:1",
            ClientOptions::builder()
                .runtime(rt.handle().clone())
                .build()
                .unwrap(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("`tls` feature"), "{e}");
    }
}
