//! The nodes of a combination lock and what this process knows of their health, shared by
//! every combination lock built on the same [`NodeSet`].
//!
//! ## Node health
//!
//! | state | used by new attempts | leaves it when |
//! | --- | --- | --- |
//! | unverified (new, or data loss seen) | after a verification at the next attempt's start | verification: marker present with the server's own stamp → usable; marker missing, or stamped by another server → a full quarantine, run on the server (`pending`, then stamped again); pending → quarantined for what the server says is left; unreachable → unavailable |
//! | usable | yes | a command fails (→ unavailable), an acquire answers "data lost" or a renewal finds its entry gone (→ unverified) |
//! | unavailable (since, last error) | no | its next probe is due (1 s after the failure, then as long again as it has been down, at most the re-probe interval) and a verification succeeds |
//! | quarantined (until) | no | the time passes and a verification succeeds |
//!
//! A verification is `INFO server` plus the node marker check (see `slate_redis::node`): a
//! server whose marker is gone (a restart without its data, a `FLUSHALL`, maybe just now) or
//! was stamped by another server (a restart from disk, a promoted replica) is quarantined for
//! a full period, on the server (a `pending` marker on the server's clock, which every process
//! sees and a data loss erases), so that no entry it lost is still believed held anywhere when
//! it is used again. A brand-new server is declared fresh once with
//! [`NodeSet::adopt_fresh_servers`]. A run id that changed on a server up
//! for longer than that is another server behind the same node (a Sentinel group that failed
//! over to a replica, which may lack grants its old master never replicated): it is
//! quarantined for a full period. The marker carries the stamp of the server that wrote it (run
//! id and replication id), so the same holds at a first contact: a marker stamped by another
//! server came with a restart from disk (a snapshot may be older than the last grants and the
//! fencing counter) or a promotion, and the node is quarantined for a full period, then
//! stamped again. (A replication id also changes when a master frees its replication backlog,
//! an hour after its last replica left: one needless quarantine then.) A node whose Sentinel
//! client saw a failover
//! ([`RedisClient::failovers`]) is verified again before its next use, even when usable.
//! Verifications run at the start of an attempt, before the attempt fixes its usable nodes; a
//! node never joins an attempt under way.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use slate_core::metrics::ClientMeter;
use slate_core::mutant::{self, Mutant};
use slate_core::registry::Registry;
use slate_core::{Error, NodeReport, NodeState, Result};
use slate_redis::node::{Mark, NodeKeys, NodeMarker};
use slate_redis::{ClientOptions, ClientOptionsBuilder, RedisClient};

/// Options of a [`NodeSet`], built with [`NodeSetOptions::builder`] and read back with getters
/// named as the options.
///
/// | option | default | meaning |
/// | --- | --- | --- |
/// | node operation time | 50 ms | budget of one command on one node (its command timeout) |
/// | re-probe interval | 15 min | the longest an unavailable node is skipped before a probe may bring it back (probes back off from 1 s up to it) |
/// | quarantine | 30 s | how long a restarted server is not used (must be at least every lock's lease) |
///
/// # Examples
///
/// ```
/// use slate_combination::NodeSetOptions;
/// use std::time::Duration;
///
/// let o = NodeSetOptions::builder().node_operation_time(Duration::from_millis(100)).build()?;
/// assert_eq!(o.node_operation_time(), Duration::from_millis(100));
/// # Ok::<(), slate_combination::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct NodeSetOptions {
    node_op_time: Duration,
    reprobe: Duration,
    quarantine: Duration,
    quarantine_enabled: bool,
    client: ClientOptions,
}

impl Default for NodeSetOptions {
    fn default() -> Self {
        NodeSetOptions {
            node_op_time: Duration::from_millis(50),
            reprobe: Duration::from_secs(15 * 60),
            quarantine: Duration::from_secs(30),
            quarantine_enabled: true,
            client: ClientOptions::default(),
        }
    }
}

/// Builds [`NodeSetOptions`]: one setter per option, named as the option (tokio's and
/// redis-rs's builder style); [`build`](Self::build) checks every rule.
///
/// # Examples
///
/// ```
/// use slate_combination::NodeSetOptions;
/// use std::time::Duration;
///
/// let o = NodeSetOptions::builder()
///     .node_operation_time(Duration::from_millis(100))
///     .quarantine(Duration::from_secs(60))
///     .build()?;
/// assert_eq!(o.node_operation_time(), Duration::from_millis(100));
/// # Ok::<(), slate_combination::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
#[must_use = "a builder does nothing until build() is called"]
pub struct NodeSetOptionsBuilder(NodeSetOptions);

impl From<NodeSetOptions> for NodeSetOptionsBuilder {
    /// Starts from existing options (to change a few of them).
    fn from(options: NodeSetOptions) -> Self {
        NodeSetOptionsBuilder(options)
    }
}

impl NodeSetOptionsBuilder {
    /// Sets the budget of one command on one node (also each node client's command and
    /// connect timeout; default 50 ms).
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// let o = slate_combination::NodeSetOptions::builder().node_operation_time(Duration::from_millis(80)).build()?;
    /// assert_eq!(o.node_operation_time(), Duration::from_millis(80));
    /// # Ok::<(), slate_combination::Error>(())
    /// ```
    pub fn node_operation_time(mut self, d: Duration) -> Self {
        self.0.node_op_time = d;
        self
    }

    /// Sets the longest an unavailable node is skipped before a probe may bring it back
    /// (default 15 min). A node that fails is probed again after 1 s, then after as long again
    /// as it has been unavailable (1, 2, 4, 8 s...), up to this interval: a passing fault is
    /// over for this process within seconds, and a node that stays down costs one probe per
    /// interval.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// let o = slate_combination::NodeSetOptions::builder().reprobe_interval(Duration::from_secs(60)).build()?;
    /// assert_eq!(o.reprobe_interval(), Duration::from_secs(60));
    /// # Ok::<(), slate_combination::Error>(())
    /// ```
    pub fn reprobe_interval(mut self, d: Duration) -> Self {
        self.0.reprobe = d;
        self
    }

    /// Sets the quarantine of a restarted server (default 30 s; at least every lock's lease).
    ///
    /// Give every process of a deployment the same quarantine. The node set that adopts a
    /// server, or marks it first, records its quarantine in the server's node marker as the
    /// bound of every lease there: a longer lease is refused there with
    /// [`Error::InvalidInput`](crate::Error::InvalidInput), and a process configured shorter
    /// quarantines that server for the recorded time, so that no lease lost with the server's
    /// data outlives any process's quarantine of it.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// let o = slate_combination::NodeSetOptions::builder().quarantine(Duration::from_secs(60)).build()?;
    /// assert_eq!(o.quarantine(), Duration::from_secs(60));
    /// # Ok::<(), slate_combination::Error>(())
    /// ```
    pub fn quarantine(mut self, d: Duration) -> Self {
        self.0.quarantine = d;
        self
    }

    /// **Unsafe for correctness; for tests that show why quarantine exists.** Uses restarted
    /// servers at once, even when they lost the entries of a lock still held.
    ///
    /// # Examples
    ///
    /// ```
    /// let o = slate_combination::NodeSetOptions::builder().disable_quarantine_unsafe().build()?;
    /// assert!(!o.quarantine_enabled());
    /// # Ok::<(), slate_combination::Error>(())
    /// ```
    pub fn disable_quarantine_unsafe(mut self) -> Self {
        self.0.quarantine_enabled = false;
        self
    }

    /// Client options for every node (credentials, TLS, pool size). Their command and connect
    /// timeouts are replaced by the node operation time.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_combination::{ClientOptions, NodeSetOptions};
    /// let client = ClientOptions::builder().password("s3cret").build()?;
    /// let o = NodeSetOptions::builder().client_options(client).build()?;
    /// # Ok::<(), slate_combination::Error>(())
    /// ```
    pub fn client_options(mut self, options: ClientOptions) -> Self {
        self.0.client = options;
        self
    }

    /// Checks every option against its rule and returns the options.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the first invalid option and the fix.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// let e = slate_combination::NodeSetOptions::builder().node_operation_time(Duration::ZERO).build();
    /// assert!(e.unwrap_err().is_invalid_input());
    /// ```
    pub fn build(self) -> Result<NodeSetOptions> {
        self.0.validate()?;
        Ok(self.0)
    }
}

impl NodeSetOptions {
    /// Starts building options from the defaults.
    ///
    /// # Examples
    ///
    /// ```
    /// let o = slate_combination::NodeSetOptions::builder().build()?;
    /// # Ok::<(), slate_combination::Error>(())
    /// ```
    pub fn builder() -> NodeSetOptionsBuilder {
        NodeSetOptionsBuilder::default()
    }

    /// The budget of one command on one node.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert_eq!(slate_combination::NodeSetOptions::default().node_operation_time(), Duration::from_millis(50));
    /// ```
    #[must_use]
    pub fn node_operation_time(&self) -> Duration {
        self.node_op_time
    }

    /// The re-probe interval.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert_eq!(slate_combination::NodeSetOptions::default().reprobe_interval(), Duration::from_secs(900));
    /// ```
    #[must_use]
    pub fn reprobe_interval(&self) -> Duration {
        self.reprobe
    }

    /// The quarantine of a restarted server.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert_eq!(slate_combination::NodeSetOptions::default().quarantine(), Duration::from_secs(30));
    /// ```
    #[must_use]
    pub fn quarantine(&self) -> Duration {
        self.quarantine
    }

    /// Whether quarantine is on (it is unless disabled for a test).
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(slate_combination::NodeSetOptions::default().quarantine_enabled());
    /// ```
    #[must_use]
    pub fn quarantine_enabled(&self) -> bool {
        self.quarantine_enabled
    }

    /// The client options of every node.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_combination::NodeSetOptions::default().client_options().pool_size(), 8);
    /// ```
    #[must_use]
    pub fn client_options(&self) -> &ClientOptions {
        &self.client
    }

    fn validate(&self) -> Result<()> {
        if self.node_op_time < Duration::from_millis(1) {
            return Err(Error::invalid_input(
                "node operation time",
                format!("{:?} is too short for any round trip", self.node_op_time),
                "use at least 1ms (the default is 50ms)",
            ));
        }
        slate_core::options::check_max_duration("node operation time", self.node_op_time)?;
        slate_core::options::check_max_duration("re-probe interval", self.reprobe)?;
        slate_core::options::check_max_duration("quarantine", self.quarantine)?;
        if self.quarantine_enabled && self.quarantine < Duration::from_millis(1) {
            return Err(Error::invalid_input(
                "quarantine",
                format!(
                    "{:?} would use a server that lost its data at once, and bound every lease \
                     on servers adopted with it to nothing",
                    self.quarantine
                ),
                "use at least the longest lease of the locks (the default is 30s)",
            ));
        }
        if self.reprobe.is_zero() {
            return Err(Error::invalid_input(
                "re-probe interval",
                "zero would probe a failed node before every attempt",
                "use a positive interval (the default is 15min)",
            ));
        }
        Ok(())
    }
}

/// The error for nodes `j` < `i` that are one server.
fn same_server(j: usize, i: usize, a: &str, b: &str, run_id: Option<&str>) -> Error {
    let how = match run_id {
        Some(id) => format!("the same Redis server (run id {id})"),
        None => "the same address".to_owned(),
    };
    Error::invalid_input(
        "nodes",
        format!("node {j} ({a}) and node {i} ({b}) are {how}"),
        "list each Redis master once: two entries of one server are not independent nodes",
    )
}

/// How soon a node that just failed is probed again.
const FIRST_RETRY: Duration = Duration::from_secs(1);

/// How long a node unavailable for `down` so far is skipped before the next probe: 1 s, then
/// as long again as it has been down (1, 2, 4, 8 s...), up to `ceiling` (the re-probe
/// interval). A passing fault (one timeout) puts this process's view, and with it its lead
/// node, back in line with the other processes' within seconds; a node that stays down costs
/// a probe per interval (one timeout benched a node for 15 minutes in one
/// process, whose lead then differed from everyone else's).
fn reprobe_after(down: Duration, ceiling: Duration) -> Duration {
    down.max(FIRST_RETRY).min(ceiling)
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Health {
    Unverified,
    Usable,
    Unavailable {
        since: Instant,
        error: String,
        next_probe: Instant,
    },
    Quarantined {
        until: Instant,
    },
}

/// What a node's marker says of its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Marker {
    /// Missing: the server lost its data.
    Missing,
    /// Stamped by this very server (same run id and replication id).
    Own,
    /// Stamped by another server, or by this one under another replication history: the
    /// data came from a restart or from another server. Also a quarantine another server ran.
    Foreign,
    /// A quarantine this very server runs.
    Pending,
}

impl Marker {
    fn read(value: Option<&NodeMarker>, info: &slate_redis::node::ServerInfo) -> Marker {
        match value {
            None => Marker::Missing,
            Some(v) if v.stamp != info.marker_stamp() => Marker::Foreign,
            Some(v) if v.pending.is_some() => Marker::Pending,
            // Including `1`, from a Slate version before stamps, which is no server's stamp:
            // nothing says which server wrote it, so a node is quarantined once after an
            // upgrade (review finding; adopt the servers while no lock is held to skip it).
            Some(_) => Marker::Own,
        }
    }
}

#[derive(Debug)]
struct NodeHealth {
    health: Health,
    /// The client's failover count at the last verification (see
    /// [`RedisClient::failovers`]): a Sentinel group that has switched masters since is
    /// verified again before its next use.
    failovers: u64,
}

/// One node: its client and health.
pub(crate) struct Node {
    pub(crate) index: usize,
    pub(crate) client: RedisClient,
    health: Mutex<NodeHealth>,
}

impl Node {
    fn health(&self) -> MutexGuard<'_, NodeHealth> {
        // Every update leaves the health consistent, so a poisoned lock is still sound.
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn address(&self) -> &str {
        self.client.address()
    }
}

pub(crate) struct SetInner {
    pub(crate) nodes: Vec<Node>,
    pub(crate) options: NodeSetOptions,
    /// The largest quarantine bound read from any node's marker (the bound of every lease on
    /// these servers): a node that lost its data is quarantined at least
    /// this long, whatever this process's own setting.
    bound: Mutex<Option<Duration>>,
    /// Every combination lock on these nodes by key prefix and name: one state (one local
    /// queue) for all the handles of one lock.
    pub(crate) locks: Registry<Vec<u8>>,
}

/// The ordered nodes of combination locks, with their shared health. Cheap to clone; build one
/// per set of servers and share it among every lock on those servers.
///
/// # Examples
///
/// ```no_run
/// use slate_combination::{NodeSet, NodeSetOptions};
///
/// # #[tokio::main] async fn main() -> slate_combination::Result<()> {
/// let nodes = NodeSet::connect(
///     ["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"],
///     NodeSetOptions::default(),
/// )?;
/// assert_eq!(nodes.len(), 3);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct NodeSet {
    pub(crate) inner: Arc<SetInner>,
}

impl fmt::Debug for NodeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addrs: Vec<_> = self.inner.nodes.iter().map(Node::address).collect();
        f.debug_struct("NodeSet")
            .field("nodes", &addrs)
            .finish_non_exhaustive()
    }
}

impl NodeSet {
    /// Opens one client per URL, in this order (the acquisition order). Nothing is sent yet.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for fewer than 2 URLs, a malformed URL, bad options, or when
    /// called outside a tokio runtime.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// let nodes = NodeSet::connect(
    ///     ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"],
    ///     NodeSetOptions::default(),
    /// )?;
    /// # Ok(()) }
    /// ```
    pub fn connect<I, S>(urls: I, options: NodeSetOptions) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        options.validate()?;
        let client_opts = ClientOptionsBuilder::from(options.client.clone())
            .command_timeout(options.node_op_time)
            .connect_timeout(options.node_op_time)
            .build()?;
        let clients = urls
            .into_iter()
            .map(|u| RedisClient::open_with(u, client_opts.clone()))
            .collect::<Result<Vec<_>>>()?;
        Self::from_clients(clients, options)
    }

    /// Uses existing clients, in this order. Their own command timeouts apply; keep them at the
    /// node operation time.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for fewer than 2 clients, a cluster client (a node is one
    /// master: standalone or Sentinel-managed), or bad options.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// use slate_combination::RedisClient;
    /// let clients = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"]
    ///     .into_iter()
    ///     .map(RedisClient::open)
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// let nodes = NodeSet::from_clients(clients, NodeSetOptions::default())?;
    /// # Ok(()) }
    /// ```
    pub fn from_clients(clients: Vec<RedisClient>, options: NodeSetOptions) -> Result<Self> {
        options.validate()?;
        crate::decision::quorum(clients.len(), None)?;
        // The node marker is one key per server, outside every lock's slot, and a cluster's
        // shards fail together with its own quorum: a whole cluster is not one node.
        if let Some(i) = clients
            .iter()
            .position(|c| c.topology() == slate_redis::Topology::Cluster)
        {
            return Err(Error::invalid_input(
                "nodes",
                format!(
                    "node {i} ({}) is a Redis Cluster; a combination node is one master",
                    clients[i].address()
                ),
                "give standalone masters or Sentinel-managed groups \
                 (RedisClient::open / open_sentinel); on a cluster, use the single lock",
            ));
        }
        // Two entries of one server are not independent nodes: one failure would count twice.
        // (A client wrapping a bare pool has no address to compare: see
        // `check_distinct_servers` for the run-id check once connected.)
        for (i, a) in clients.iter().enumerate() {
            let same = clients[..i]
                .iter()
                .position(|b| b.address() == a.address() && a.address() != "redis");
            if let Some(j) = same {
                return Err(same_server(j, i, a.address(), a.address(), None));
            }
        }
        let nodes = clients
            .into_iter()
            .enumerate()
            .map(|(index, client)| Node {
                index,
                client,
                health: Mutex::new(NodeHealth {
                    health: Health::Unverified,
                    failovers: 0,
                }),
            })
            .collect();
        Ok(NodeSet {
            inner: Arc::new(SetInner {
                nodes,
                options,
                bound: Mutex::new(None),
                locks: Registry::default(),
            }),
        })
    }

    /// The number of nodes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// assert_eq!(nodes.len(), 3);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn len(&self) -> usize {
        self.inner.nodes.len()
    }

    /// Always false (a node set has at least 2 nodes).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// assert!(!nodes.is_empty());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.inner.nodes.is_empty()
    }

    /// The options.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// println!("{:?}", nodes.options().quarantine());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn options(&self) -> &NodeSetOptions {
        &self.inner.options
    }

    /// The client of node `i`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// let first = nodes.client(0).expect("three nodes");
    /// println!("{}", first.address());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn client(&self, i: usize) -> Option<&RedisClient> {
        self.inner.nodes.get(i).map(|n| &n.client)
    }

    /// The tokio runtime of the first node client's services (a set built outside any runtime
    /// uses it for its locks' background work).
    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        self.node(0).client.node().runtime()
    }

    /// What this process knows of every node, as reported in errors.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// for node in nodes.report() {
    ///     println!("{node}");
    /// }
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn report(&self) -> Vec<NodeReport> {
        let now = Instant::now();
        self.inner.nodes.iter().map(|n| n.report(now)).collect()
    }

    /// Asks every node for its server's run id and refuses two nodes that are one server
    /// reached under two addresses (`localhost` and `127.0.0.1`, a DNS alias, a proxy): they
    /// are not independent nodes. Nodes that do not answer within the node operation time
    /// are not compared. [`connect`](Self::connect) already refuses one address given twice.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming both nodes.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{NodeSet, NodeSetOptions};
    /// # #[tokio::main] async fn main() -> slate_combination::Result<()> {
    /// let nodes = NodeSet::connect(["redis://10.0.0.1:6379", "redis://10.0.0.2:6379", "redis://10.0.0.3:6379"], NodeSetOptions::default())?;
    /// nodes.check_distinct_servers().await?;
    /// # Ok(()) }
    /// ```
    pub async fn check_distinct_servers(&self) -> Result<()> {
        let op = self.inner.options.node_op_time;
        let ids: Vec<Option<String>> =
            futures::future::join_all(self.inner.nodes.iter().map(|n| async move {
                match tokio::time::timeout(op, n.client.node().server_info()).await {
                    Ok(Ok(info)) => Some(info.run_id),
                    _ => None,
                }
            }))
            .await;
        for (i, id) in ids.iter().enumerate() {
            let Some(id) = id else { continue };
            if let Some(j) = ids[..i].iter().position(|o| o.as_ref() == Some(id)) {
                return Err(same_server(
                    j,
                    i,
                    self.inner.nodes[j].address(),
                    self.inner.nodes[i].address(),
                    Some(id),
                ));
            }
        }
        Ok(())
    }

    /// Declares every server fresh: writes the node marker on each reachable node whatever its
    /// age, so that servers started moments ago are usable at once instead of after the
    /// quarantine. Returns how many nodes were marked.
    ///
    /// A brand-new server cannot be told apart from one that restarted without its data, so
    /// by default both are quarantined until they have been up for the quarantine period.
    /// Call this once when a deployment's servers are new (and in tests). **Never** call it
    /// while a lock on these servers may be held: a server that lost that lock's entries would
    /// be used at once.
    ///
    /// `prefix` is the key prefix of the locks that will use the nodes (`slate:` by default).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad prefix; the permission error of a node whose user may
    /// not read `INFO` or write the marker (`<prefix>node-marker`). A node out of reach is
    /// only not counted.
    ///
    /// # Cancel safety
    ///
    /// Idempotent.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// // A brand-new deployment, before any lock is taken:
    /// let marked = nodes.adopt_fresh_servers("slate:").await?;
    /// # Ok(()) }
    /// ```
    pub async fn adopt_fresh_servers(&self, prefix: &str) -> Result<usize> {
        slate_core::LockOptions::builder()
            .key_prefix(prefix)
            .build()?;
        let keys = NodeKeys::new(prefix, &slate_core::LockName::new("-")?);
        let options = &self.inner.options;
        let quarantine = options.quarantine_enabled.then_some(options.quarantine);
        let marked = futures::future::join_all(self.inner.nodes.iter().map(|n| {
            let keys = &keys;
            // An adoption is a one-off call, often a client's first (its connection is made
            // then, and the marker script loaded): bounded like any single command, not by the
            // node operation time a lock attempt spends per node (50 ms by default).
            let op = options
                .node_op_time
                .max(n.client.options().command_timeout());
            async move {
                let mark = async {
                    let info = n.client.node().server_info().await?;
                    n.client
                        .node()
                        .mark(keys, &info, Mark::Adopt(quarantine))
                        .await
                };
                let r = match tokio::time::timeout(op, mark).await {
                    Ok(r) => r,
                    Err(_) => Err(Error::backend(
                        slate_core::BackendKind::Timeout,
                        Some(n.address().to_owned()),
                        format!("adopting took longer than {op:?} (the command timeout, or the node operation time if longer)"),
                        None,
                    )),
                };
                if r.is_ok() {
                    n.health().health = Health::Unverified;
                }
                r
            }
        }))
        .await;
        // A user that may not read `INFO` or write the marker is a configuration error, said
        // as such; an unreachable node is only not counted.
        let count = marked.iter().filter(|r| r.is_ok()).count();
        if count > 0 {
            // The bound these servers now record (set exactly: an adoption may lower it).
            *self.bound() = quarantine;
        }
        if let Some(e) = marked
            .into_iter()
            .filter_map(Result::err)
            .find(|e| e.backend_kind() == Some(slate_core::BackendKind::Permission))
        {
            return Err(e);
        }
        Ok(count)
    }

    /// Brings the health of every node up to date where a verification is due, then returns
    /// which nodes a new attempt may use. Verifications run concurrently, each within the node
    /// operation time.
    pub(crate) async fn usable_for_attempt(&self, keys: &NodeKeys) -> Vec<bool> {
        let now = Instant::now();
        let due: Vec<&Node> = self
            .inner
            .nodes
            .iter()
            .filter(|n| {
                let h = n.health();
                match h.health {
                    Health::Unverified => true,
                    Health::Usable => n.client.failovers() != h.failovers,
                    Health::Unavailable { next_probe, .. } => now >= next_probe,
                    Health::Quarantined { until } => now >= until,
                }
            })
            .collect();
        if !due.is_empty() {
            let checks = due.iter().map(|n| self.verify(n, keys));
            futures::future::join_all(checks).await;
        }
        self.inner
            .nodes
            .iter()
            .map(|n| n.health().health == Health::Usable)
            .collect()
    }

    /// Verifies one node: reachable, same server as before (run id), data not lost (marker),
    /// and written by this server (the marker's stamp).
    async fn verify(&self, node: &Node, keys: &NodeKeys) {
        let opts = &self.inner.options;
        let failovers = node.client.failovers();
        let info = match node.client.node().server_info().await {
            Ok(i) => i,
            Err(e) => return self.mark_failed(node.index, &e),
        };
        let (marker, recorded) = match node.client.node().marker(keys).await {
            Ok(m) => (
                Marker::read(m.as_ref(), &info),
                m.and_then(|m| m.quarantine),
            ),
            Err(e) => return self.mark_failed(node.index, &e),
        };
        // The markers bound every new lease on these servers by the quarantine they record
        // (the acquire script refuses longer ones): a node whose marker is gone or another
        // server's is quarantined at least that long, whatever this process's setting. The
        // bound is read from the other nodes' markers too, so that a process that never read
        // this node's marker before it lost it learns the bound (review of issue 28, item 3).
        if let Some(q) = recorded {
            self.learn_bound(q);
        }
        if marker != Marker::Own && opts.quarantine_enabled {
            self.read_bounds(keys, node.index).await;
        }
        let known = *self.bound();
        let quarantine = opts.quarantine.max(known.unwrap_or_default());
        // The bound to record: this process's quarantine, or (quarantine disabled, unsafe)
        // the one known, so that the markers keep bounding the leases.
        let bound = opts.quarantine_enabled.then_some(quarantine).or(known);
        // What the marker says, and how long the node must wait before it is used. A marker
        // stamped by this very server (its run id and replication id) proves it was adopted,
        // or stamped after a quarantine of this server ran its course: usable. Otherwise:
        // - missing: the server restarted without its data, or lost it without a restart
        //   (`FLUSHALL`, `FLUSHDB`, an eviction of the marker), maybe just now: a full
        //   quarantine (issue 28, item 2; before, a server up for a while was used at once);
        // - another server's stamp: a restart from disk (a snapshot may be older than the
        //   last grants), a promoted replica (which may lack its old master's newest grants),
        //   a changed replication history: a full quarantine (issue 35, defect 8);
        // - pending: a quarantine this server runs (the time left comes from the server).
        // The quarantine runs on the server, where every process sees it and a data loss
        // erases it: a second loss is never taken for the first one's quarantine served
        // (issue 28, item 2, second review: each process used to keep its own, and one whose
        // quarantine had run its course used a node flushed again since).
        // A missing marker waits a full quarantine whatever the server's age: a young server
        // may have been adopted (or marked) and have granted leases since it started, which
        // a flush then lost (third review; before, a young server waited only what was left
        // of a quarantine counted from its start). A pending marker's own end is kept by the
        // server; the full quarantine asked with it counts only if the marker vanished
        // between the read and the call (third review: asked with no time, such a node was
        // stamped usable at once).
        let wait = match marker {
            Marker::Own => None,
            Marker::Missing if mutant::active(Mutant::QuarantineAdmitsYoung) => {
                Some(Duration::ZERO)
            }
            Marker::Missing | Marker::Foreign | Marker::Pending => Some(quarantine),
        };
        if let Some(wait) = wait.filter(|_| opts.quarantine_enabled) {
            let pend = Mark::Pend { bound, wait };
            let marked = match node.client.node().mark(keys, &info, pend).await {
                Ok(m) => m,
                Err(e) => return self.mark_failed(node.index, &e),
            };
            if let Some(q) = marked.bound {
                self.learn_bound(q);
            }
            if !marked.left.is_zero() {
                if marker == Marker::Pending {
                    tracing::debug!(node = node.address(), left = ?marked.left, "node still quarantined");
                } else {
                    tracing::warn!(
                        node = node.address(),
                        ?marker,
                        quarantine = ?marked.left,
                        "node quarantined after a restart, a failover or a data loss"
                    );
                }
                if marker != Marker::Pending {
                    ClientMeter::new("combination").quarantined();
                }
                let mut h = node.health();
                h.health = Health::Quarantined {
                    until: Instant::now() + marked.left,
                };
                h.failovers = failovers;
                return;
            }
        }
        // Stamped when its quarantine ran its course, and when it records no bound yet
        // (written by a version before bounds). With quarantine disabled (unsafe), whatever
        // the marker says.
        if marker != Marker::Own || (bound.is_some() && recorded.is_none()) {
            let mark = if opts.quarantine_enabled {
                Mark::Stamp(bound)
            } else {
                Mark::Adopt(bound)
            };
            match node.client.node().mark(keys, &info, mark).await {
                Ok(m) if m.written => {
                    if let Some(q) = m.bound {
                        self.learn_bound(q);
                    }
                }
                // The marker changed since it was read (a new loss, another quarantine):
                // looked at again at the next attempt.
                Ok(_) => {
                    node.health().health = Health::Unverified;
                    return;
                }
                Err(e) => return self.mark_failed(node.index, &e),
            }
        }
        let mut h = node.health();
        if h.health != Health::Usable {
            tracing::info!(node = node.address(), "node usable");
        }
        h.health = Health::Usable;
        h.failovers = failovers;
    }

    fn bound(&self) -> MutexGuard<'_, Option<Duration>> {
        self.inner
            .bound
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps `q` if it is the largest quarantine bound read so far.
    fn learn_bound(&self, q: Duration) {
        let mut bound = self.bound();
        if bound.is_none_or(|b| b < q) {
            *bound = Some(q);
        }
    }

    /// Reads the bound the markers of the nodes other than `except` record (each within the
    /// node operation time; a node out of reach is skipped).
    async fn read_bounds(&self, keys: &NodeKeys, except: usize) {
        let op = self.inner.options.node_op_time;
        let reads = self
            .inner
            .nodes
            .iter()
            .filter(|n| n.index != except)
            .map(|n| tokio::time::timeout(op, n.client.node().marker(keys)));
        for read in futures::future::join_all(reads).await {
            if let Ok(Ok(Some(NodeMarker {
                quarantine: Some(q),
                ..
            }))) = read
            {
                self.learn_bound(q);
            }
        }
    }

    /// Marks node `i` unavailable after a failed command, or after a failed re-check. Its next
    /// probe is due after [`reprobe_after`] (1 s, then as long again as it has been down, up
    /// to the re-probe interval), so a dead node is not re-checked at every attempt and a
    /// passing fault does not bench a healthy node for minutes.
    pub(crate) fn mark_failed(&self, i: usize, error: &Error) {
        if let Some(node) = self.inner.nodes.get(i) {
            let now = Instant::now();
            let mut h = node.health();
            let since = match &h.health {
                Health::Unavailable { since, .. } => *since,
                _ => {
                    tracing::warn!(node = node.address(), %error, "node marked unavailable");
                    now
                }
            };
            h.health = Health::Unavailable {
                since,
                error: error.to_string(),
                next_probe: now + reprobe_after(now - since, self.inner.options.reprobe),
            };
        }
    }

    /// Marks node `i` for verification (an acquire answered "data lost", or a renewal found its
    /// entry gone). A quarantined node stays quarantined.
    pub(crate) fn mark_data_lost(&self, i: usize) {
        if let Some(node) = self.inner.nodes.get(i) {
            let mut h = node.health();
            if !matches!(h.health, Health::Quarantined { .. }) {
                tracing::warn!(
                    node = node.address(),
                    "node may have lost its data; verifying it"
                );
                h.health = Health::Unverified;
            }
        }
    }

    pub(crate) fn node(&self, i: usize) -> &Node {
        &self.inner.nodes[i]
    }
}

impl Node {
    /// The client's failover count when the node was last verified: a reply counts only if
    /// the count is still that after it (a failover between the check and
    /// the call let a promoted replica's answer count).
    pub(crate) fn verified_failovers(&self) -> u64 {
        self.health().failovers
    }

    fn report(&self, now: Instant) -> NodeReport {
        let state = match &self.health().health {
            Health::Usable => NodeState::NotTried,
            Health::Unverified => NodeState::Failed {
                kind: slate_core::BackendKind::Unavailable,
                message: "not verified yet".into(),
            },
            Health::Unavailable { since, error, .. } => NodeState::Unavailable {
                since: now.saturating_duration_since(*since),
                last_error: error.clone(),
            },
            Health::Quarantined { until } => NodeState::Quarantined {
                remaining: until.saturating_duration_since(now),
            },
        };
        NodeReport {
            index: self.index,
            address: self.address().to_owned(),
            state,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `node_operation_time(Duration::MAX)` panicked when the acquire
    /// budget was computed from it; every duration of the node set is bounded.
    #[test]
    fn large_durations_are_refused() {
        let d = NodeSetOptions::builder;
        for (opts, what) in [
            (
                d().node_operation_time(Duration::MAX),
                "node operation time",
            ),
            (d().reprobe_interval(Duration::MAX), "re-probe interval"),
            (d().quarantine(Duration::MAX), "quarantine"),
        ] {
            match opts.build() {
                Err(Error::InvalidInput { what: w, .. }) => assert_eq!(w, what),
                other => panic!("{what}: expected invalid input, got {other:?}"),
            }
        }
        d().node_operation_time(slate_core::MAX_DURATION)
            .build()
            .unwrap();
    }
}
