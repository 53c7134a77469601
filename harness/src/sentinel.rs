//! A Sentinel-managed master with replicas on loopback, and its failovers.
//!
//! [`SentinelGroup::start`] starts one master, `replicas` replicas (`replicaof` the master)
//! and `sentinels` Sentinels (`redis-server --sentinel`, quorum = majority), waits until the
//! replicas are in sync and every Sentinel knows every replica and the other Sentinels.
//!
//! Settings chosen for tests: `down-after-milliseconds` 1 s, `failover-timeout` 2 s: a killed
//! master is replaced in about 2-3 s, and a failover that found no eligible replica (all of
//! them unresponsive for a moment) is tried again about 4 s later, not 10 s.
//!
//! Faults: [`SentinelGroup::kill_master`] (and wait until the Sentinels name a new master),
//! [`SentinelGroup::failover`] (`SENTINEL FAILOVER`), and everything [`RedisServer`] offers on
//! one server ([`SentinelGroup::server_mut`]: pause a replica to partition it away, kill,
//! restart).

use std::time::{Duration, Instant};

use crate::server::{HarnessError, RedisServer, ServerBuilder, value_text as text};

/// The master name the group's Sentinels monitor.
pub const MASTER_NAME: &str = "slate-master";
/// How long a start or failover may take.
const SETTLE: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(50);

/// A master, its replicas and the Sentinels watching them; killed when dropped.
///
/// # Examples
///
/// ```no_run
/// use slate_harness::sentinel::SentinelGroup;
///
/// let mut group = SentinelGroup::start(2, 3)?;
/// let old = group.master()?;
/// let new = group.kill_master()?;
/// assert_ne!(old, new);
/// # Ok::<(), slate_harness::server::HarnessError>(())
/// ```
#[derive(Debug)]
pub struct SentinelGroup {
    servers: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
}

impl SentinelGroup {
    /// Starts the group and waits until it is whole.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let group = slate_harness::sentinel::SentinelGroup::start(2, 3)?;
    /// assert_eq!(group.sentinel_urls().len(), 3);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// Start errors of any process; [`HarnessError::Config`] for no Sentinel;
    /// [`HarnessError::StartFailed`] when the group does not settle within 30 s.
    pub fn start(replicas: usize, sentinels: usize) -> Result<Self, HarnessError> {
        Self::start_with(replicas, sentinels, &RedisServer::builder())
    }

    /// As [`start`](Self::start), every data server configured by `builder`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let builder = slate_harness::server::RedisServer::builder();
    /// let group = slate_harness::sentinel::SentinelGroup::start_with(2, 3, &builder)?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_with(
        replicas: usize,
        sentinels: usize,
        builder: &ServerBuilder,
    ) -> Result<Self, HarnessError> {
        if sentinels == 0 {
            return Err(HarnessError::Config(
                "a sentinel group needs a Sentinel".into(),
            ));
        }
        let builder = builder.clone().arg("repl-diskless-sync-delay", "0");
        let master = builder.clone().start()?;
        let mut servers = vec![master];
        let port = servers[0].port();
        for _ in 0..replicas {
            servers.push(
                builder
                    .clone()
                    .arg("replicaof", format!("127.0.0.1 {port}"))
                    .start()?,
            );
        }
        let quorum = sentinels / 2 + 1;
        let mut group = SentinelGroup {
            servers,
            sentinels: Vec::new(),
        };
        group.wait_replicas_in_sync(port)?;
        for _ in 0..sentinels {
            group.sentinels.push(
                RedisServer::builder()
                    .sentinel_mode(true)
                    .arg(
                        "sentinel",
                        format!("monitor {MASTER_NAME} 127.0.0.1 {port} {quorum}"),
                    )
                    .arg(
                        "sentinel",
                        format!("down-after-milliseconds {MASTER_NAME} 1000"),
                    )
                    .arg("sentinel", format!("failover-timeout {MASTER_NAME} 2000"))
                    .arg("sentinel", format!("parallel-syncs {MASTER_NAME} 2"))
                    .start()?,
            );
        }
        group.wait_known(replicas, sentinels)?;
        Ok(group)
    }

    fn wait_replicas_in_sync(&mut self, master_port: u16) -> Result<(), HarnessError> {
        let deadline = Instant::now() + SETTLE;
        loop {
            let mut behind = None;
            for s in &self.servers {
                if s.port() == master_port {
                    continue;
                }
                let info = s.command(&["INFO", "replication"]).and_then(|v| text(&v));
                let synced = info.as_ref().is_ok_and(|i| {
                    i.contains("master_link_status:up")
                        && i.contains(&format!("master_port:{master_port}"))
                });
                if !synced {
                    behind = Some(s.port());
                }
            }
            match behind {
                None => return Ok(()),
                Some(p) if Instant::now() >= deadline => {
                    return Err(HarnessError::StartFailed {
                        port: p,
                        reason: format!("replica {p} not in sync with {master_port}"),
                        log_tail: String::new(),
                    });
                }
                Some(_) => std::thread::sleep(POLL),
            }
        }
    }

    fn wait_known(&self, replicas: usize, sentinels: usize) -> Result<(), HarnessError> {
        let deadline = Instant::now() + SETTLE;
        loop {
            let whole = self.sentinels.iter().all(|s| {
                let known = s
                    .command(&["SENTINEL", "MASTER", MASTER_NAME])
                    .ok()
                    .and_then(|v| match v {
                        redis::Value::Array(a) => Some(a),
                        _ => None,
                    })
                    .map(|fields| {
                        let get = |name: &str| {
                            fields
                                .chunks(2)
                                .find(|p| text(&p[0]).is_ok_and(|t| t == name))
                                .and_then(|p| text(&p[1]).ok())
                                .and_then(|t| t.parse::<usize>().ok())
                        };
                        (get("num-slaves"), get("num-other-sentinels"))
                    });
                known == Some((Some(replicas), Some(sentinels - 1)))
            });
            if whole {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::StartFailed {
                    port: self.sentinels[0].port(),
                    reason: "the Sentinels did not discover every replica and each other".into(),
                    log_tail: self.sentinels[0].log_tail(20),
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// `redis://` URLs of the Sentinels.
    #[must_use]
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The monitored master's name ([`MASTER_NAME`]).
    #[must_use]
    pub fn master_name(&self) -> &'static str {
        MASTER_NAME
    }

    /// Data server `i` (0 is the first master).
    #[must_use]
    pub fn server(&self, i: usize) -> &RedisServer {
        &self.servers[i]
    }

    /// Data server `i`, for faults.
    pub fn server_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.servers[i]
    }

    /// Sentinel `i`, for faults.
    pub fn sentinel_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.sentinels[i]
    }

    /// The number of data servers (master and replicas).
    #[must_use]
    pub fn servers(&self) -> usize {
        self.servers.len()
    }

    /// The index of the data server the Sentinels name as master (first answering Sentinel).
    ///
    /// # Errors
    ///
    /// No Sentinel answers, or it names an unknown server.
    pub fn master(&self) -> Result<usize, HarnessError> {
        let mut last = None;
        for sentinel in &self.sentinels {
            match sentinel.command(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME]) {
                Ok(redis::Value::Array(a)) if a.len() == 2 => {
                    let port: u16 = text(&a[1])?
                        .parse()
                        .map_err(|_| HarnessError::Config("bad master port".into()))?;
                    return self
                        .servers
                        .iter()
                        .position(|s| s.port() == port)
                        .ok_or_else(|| HarnessError::Config(format!("unknown master {port}")));
                }
                Ok(other) => last = Some(HarnessError::Config(format!("{other:?}"))),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| HarnessError::Config("no live Sentinel".into())))
    }

    /// Kills the current master and waits until every live Sentinel names the same new one,
    /// with no failover in progress, that server reports `role:master`, and every other live
    /// server replicates it, in sync; returns its index.
    ///
    /// # Errors
    ///
    /// No failover within 30 s.
    pub fn kill_master(&mut self) -> Result<usize, HarnessError> {
        let old = self.master()?;
        self.servers[old].kill()?;
        self.wait_new_master(old)
    }

    /// `SENTINEL FAILOVER` (a handover without waiting for a failure); waits as
    /// [`kill_master`](Self::kill_master) and returns the new master's index.
    ///
    /// # Errors
    ///
    /// The command is refused; no failover within 30 s.
    pub fn failover(&mut self) -> Result<usize, HarnessError> {
        let old = self.master()?;
        self.sentinels[0].command(&["SENTINEL", "FAILOVER", MASTER_NAME])?;
        self.wait_new_master(old)
    }

    /// Whether every live Sentinel names the master on `port` with its flags plain `master`
    /// (no failover in progress, not down): what a client asking any of them then sees.
    fn all_agree(&mut self, port: u16) -> bool {
        let port = port.to_string();
        self.sentinels.iter_mut().all(|s| {
            if !s.is_running() {
                return true;
            }
            let Ok(redis::Value::Array(fields)) = s.command(&["SENTINEL", "MASTER", MASTER_NAME])
            else {
                return false;
            };
            let get = |name: &str| {
                fields
                    .chunks(2)
                    .find(|p| text(&p[0]).is_ok_and(|t| t == name))
                    .and_then(|p| text(&p[1]).ok())
            };
            get("port").as_deref() == Some(port.as_str())
                && get("flags").as_deref() == Some("master")
        })
    }

    fn wait_new_master(&mut self, old: usize) -> Result<usize, HarnessError> {
        let deadline = Instant::now() + SETTLE;
        loop {
            // Every live server other than the new master must replicate it, in sync: the
            // Sentinels reconfigure the other replicas as part of the failover.
            let live = self
                .servers
                .iter_mut()
                .map(RedisServer::is_running)
                .filter(|up| *up)
                .count();
            if let Ok(new) = self.master()
                && new != old
                && self.servers[new]
                    .command(&["INFO", "replication"])
                    .and_then(|v| text(&v))
                    .is_ok_and(|i| {
                        i.contains("role:master")
                            && i.contains(&format!("connected_slaves:{}", live.saturating_sub(1)))
                            && !i.lines().any(|l| {
                                l.starts_with("slave")
                                    && l.contains("state=")
                                    && !l.contains("state=online")
                            })
                    })
                && self.all_agree(self.servers[new].port())
            {
                return Ok(new);
            }
            if Instant::now() >= deadline {
                return Err(HarnessError::StartFailed {
                    port: self.servers[old].port(),
                    reason: format!("no new master within {SETTLE:?}"),
                    log_tail: self.sentinels[0].log_tail(30),
                });
            }
            std::thread::sleep(POLL);
        }
    }
}
