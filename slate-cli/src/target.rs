//! Which Redis servers a command talks to, and the lock built on them: one `--redis` URL gives
//! a single lock, several give a combination lock (in the order given, which is the
//! acquisition order); `--cluster` seeds give a single lock on a Redis Cluster, `--sentinel`
//! URLs with `--master-name` a single lock on a Sentinel-managed master.

use std::time::Duration;

use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
use slate_core::{Error, LockName};
use slate_redis::{ClientOptions, RedisClient, SingleLock};
use slate_zookeeper::{ZkClient, ZkLock};

/// The environment variable read when no `--redis` is given (comma-separated URLs).
pub const REDIS_ENV: &str = "SLATE_REDIS_URL";

/// The default quarantine of a restarted node (the library's default).
const DEFAULT_QUARANTINE: Duration = Duration::from_secs(30);

/// Longest budget of one command on one node of a combination lock. More lenient than the
/// library's 50 ms: a command-line process opens every connection afresh (its first command
/// carries the TCP setup), its nodes may be across a WAN, and one acquisition per process
/// makes the latency cost irrelevant.
const MAX_NODE_OPERATION_TIME: Duration = Duration::from_millis(500);

/// How soon a node that failed is tried again. Short, because `slate run` retries within
/// `--wait` and a node marked unavailable is otherwise skipped for 15 minutes.
const REPROBE: Duration = Duration::from_secs(1);

/// The node operation time for `n` nodes: [`MAX_NODE_OPERATION_TIME`], reduced so that the
/// acquire budget (node operation time × n + 100 ms) stays shorter than the lease.
fn node_operation_time(lease: Duration, n: usize) -> Duration {
    let n = u32::try_from(n).unwrap_or(u32::MAX).saturating_add(1);
    let fit = lease.saturating_sub(Duration::from_millis(100)) / n;
    MAX_NODE_OPERATION_TIME
        .min(fit)
        .max(Duration::from_millis(1))
}

/// The URLs from `--redis` (each may hold several, comma-separated), or else from
/// `SLATE_REDIS_URL`.
///
/// # Errors
///
/// A message for the user when there is none.
pub fn resolve_urls(flags: &[String]) -> Result<Vec<String>, String> {
    let split = |s: &str| -> Vec<String> {
        s.split(',')
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let mut urls: Vec<String> = flags.iter().flat_map(|f| split(f)).collect();
    if urls.is_empty()
        && let Ok(env) = std::env::var(REDIS_ENV)
    {
        urls = split(&env);
    }
    if urls.is_empty() {
        return Err(format!(
            "no Redis server given: pass --redis URL (once per node; several make a combination \
             lock) or set {REDIS_ENV} (comma-separated), e.g. --redis redis://127.0.0.1:6379"
        ));
    }
    Ok(urls)
}

/// The deployment a command talks to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Servers {
    /// `--redis`: one master (a single lock) or several (a combination lock).
    Masters(Vec<String>),
    /// `--cluster`: seed nodes of one Redis Cluster.
    Cluster(Vec<String>),
    /// `--sentinel` and `--master-name`.
    Sentinel {
        /// The Sentinels' URLs.
        sentinels: Vec<String>,
        /// The monitored master's name.
        master: String,
    },
    /// `--zookeeper`: a ZooKeeper ensemble's connection string.
    ZooKeeper(String),
}

impl Servers {
    /// From the command line: `--cluster` or `--sentinel` (with `--master-name`) when given,
    /// else `--redis` / `SLATE_REDIS_URL` (see [`resolve_urls`]). Each flag may carry several
    /// comma-separated URLs.
    ///
    /// # Errors
    ///
    /// A message for the user: no server, or `--sentinel` and `--master-name` without each
    /// other.
    pub fn resolve(
        redis: &[String],
        cluster: &[String],
        sentinel: &[String],
        master: Option<&str>,
    ) -> Result<Self, String> {
        let cluster = split_all(cluster);
        let sentinels = split_all(sentinel);
        match (cluster.is_empty(), sentinels.is_empty(), master) {
            (false, _, _) => Ok(Servers::Cluster(cluster)),
            (true, false, Some(m)) if !m.is_empty() => Ok(Servers::Sentinel {
                sentinels,
                master: m.to_owned(),
            }),
            (true, false, _) => Err(
                "--sentinel needs --master-name NAME: the name the Sentinels monitor the master \
                 under (sentinel monitor <name> ...)"
                    .to_owned(),
            ),
            (true, true, Some(_)) => Err(
                "--master-name goes with --sentinel URL (the Sentinels to ask for that master)"
                    .to_owned(),
            ),
            (true, true, None) => resolve_urls(redis).map(Servers::Masters),
        }
    }

    /// Every URL, for messages (without credentials).
    #[must_use]
    pub fn describe(&self) -> String {
        let list = |urls: &[String]| {
            urls.iter()
                .map(|u| display_address(u))
                .collect::<Vec<_>>()
                .join(",")
        };
        match self {
            Servers::Masters(urls) => list(urls),
            Servers::Cluster(urls) => format!("cluster {}", list(urls)),
            Servers::Sentinel { sentinels, master } => {
                format!("sentinel {master} via {}", list(sentinels))
            }
            Servers::ZooKeeper(servers) => format!("zookeeper {servers}"),
        }
    }
}

fn split_all(flags: &[String]) -> Vec<String> {
    flags
        .iter()
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_owned)
        .collect()
}

impl Servers {
    /// A client for one Redis deployment (one `--redis`, `--cluster` or `--sentinel`), for the
    /// primitives that live on one deployment (the read-write lock, the semaphore, the latch).
    /// `what` names the command in the error.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for several `--redis` (a combination) or `--zookeeper`, or a
    /// bad URL.
    pub fn one_client(&self, what: &str) -> Result<RedisClient, Error> {
        match self {
            Servers::Masters(urls) if urls.len() == 1 => RedisClient::open(&urls[0]),
            Servers::Masters(_) => Err(Error::invalid_input(
                "servers",
                format!(
                    "{what} lives on one Redis deployment, and several --redis name a combination"
                ),
                "give one --redis URL (or --cluster / --sentinel)",
            )),
            Servers::Cluster(seeds) => RedisClient::open_cluster(seeds, ClientOptions::default()),
            Servers::Sentinel { sentinels, master } => {
                RedisClient::open_sentinel(sentinels, master, ClientOptions::default())
            }
            Servers::ZooKeeper(_) => Err(Error::invalid_input(
                "servers",
                format!("{what} lives on Redis, and --zookeeper names a ZooKeeper ensemble"),
                "give --redis URL (or --cluster / --sentinel)",
            )),
        }
    }
}

/// A lock on one server or across several.
#[derive(Clone, Debug)]
pub enum Target {
    /// One URL.
    Single(SingleLock),
    /// Several URLs.
    Combination(CombinationLock),
    /// A ZooKeeper ensemble.
    ZooKeeper(ZkLock),
}

/// The environment variable holding `user:password` for ZooKeeper's digest scheme.
pub const ZK_DIGEST_ENV: &str = "SLATE_ZOOKEEPER_DIGEST";

/// The ZooKeeper lock root for `--prefix`: the Redis default means the ZooKeeper default.
#[must_use]
pub fn zk_root(prefix: &str) -> &str {
    if prefix == "slate:" {
        slate_zookeeper::path::DEFAULT_ROOT
    } else {
        prefix
    }
}

/// Connects to a ZooKeeper ensemble with `lease` as the session timeout and the digest
/// credentials of [`ZK_DIGEST_ENV`], if set.
///
/// # Errors
///
/// [`Error::InvalidInput`] for a bad connection string or credentials; backend errors when no
/// server answers.
pub async fn zk_client(servers: &str, lease: Duration) -> Result<ZkClient, Error> {
    let mut builder = ZkClient::builder(servers).session_timeout(lease);
    if let Ok(digest) = std::env::var(ZK_DIGEST_ENV) {
        let Some((user, password)) = digest.split_once(':') else {
            return Err(Error::invalid_input(
                "ZooKeeper credentials",
                format!("{ZK_DIGEST_ENV} is not user:password"),
                format!("set {ZK_DIGEST_ENV}=user:password, or unset it"),
            ));
        };
        builder = builder.digest(user, password);
    }
    builder.connect().await
}

impl Target {
    /// Builds the lock `name` on `urls` (call inside a tokio runtime).
    ///
    /// For a combination lock, the node set's quarantine of restarted servers is the library
    /// default (30 s) or the lease if that is longer (the library requires quarantine ≥ lease).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad URL, name, lease or prefix.
    pub async fn build(
        servers: &Servers,
        name: &str,
        prefix: &str,
        lease: Duration,
    ) -> Result<Self, Error> {
        // The lease and prefix first, so that a bad one is reported as itself and not as the
        // node-set setting derived from it (the quarantine follows the lease). With ZooKeeper
        // the prefix is a root path, which the lock builder checks.
        let options = slate_core::LockOptions::builder().lease(lease);
        match servers {
            Servers::ZooKeeper(_) => options.build()?,
            _ => options.key_prefix(prefix).build()?,
        };
        let single = |client: RedisClient| -> Result<Self, Error> {
            let lock = SingleLock::builder(&client, name)
                .lease(lease)
                .key_prefix(prefix)
                .build()?;
            Ok(Target::Single(lock))
        };
        let urls = match servers {
            Servers::Masters(urls) => urls,
            Servers::ZooKeeper(servers) => {
                let client = zk_client(servers, lease).await?;
                let lock = ZkLock::builder(&client, name)
                    .root(zk_root(prefix))
                    .build()?;
                return Ok(Target::ZooKeeper(lock));
            }
            Servers::Cluster(seeds) => {
                return single(RedisClient::open_cluster(seeds, ClientOptions::default())?);
            }
            Servers::Sentinel { sentinels, master } => {
                return single(RedisClient::open_sentinel(
                    sentinels,
                    master,
                    ClientOptions::default(),
                )?);
            }
        };
        match urls.as_slice() {
            [url] => {
                let client = RedisClient::open(url)?;
                let lock = SingleLock::builder(&client, name)
                    .lease(lease)
                    .key_prefix(prefix)
                    .build()?;
                Ok(Target::Single(lock))
            }
            _ => {
                let options = NodeSetOptions::builder()
                    .quarantine(DEFAULT_QUARANTINE.max(lease))
                    .node_operation_time(node_operation_time(lease, urls.len()))
                    .reprobe_interval(REPROBE)
                    .build()?;
                let nodes = NodeSet::connect(urls, options)?;
                let lock = CombinationLock::builder(&nodes, name)
                    .lease(lease)
                    .key_prefix(prefix)
                    .build()?;
                Ok(Target::Combination(lock))
            }
        }
    }
}

/// Validates a lock name the way the locks do (so that `status` refuses what `run` would).
///
/// # Errors
///
/// [`Error::InvalidInput`].
pub fn check_name(name: &str) -> Result<LockName, Error> {
    LockName::new(name)
}

/// The address of a URL without credentials (for messages), as the client reports it.
#[must_use]
pub fn display_address(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    host.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_from_flags_split_on_commas() {
        let flags = vec![
            "redis://a:1,redis://b:2".to_owned(),
            "redis://c:3".to_owned(),
        ];
        assert_eq!(
            resolve_urls(&flags).expect("urls"),
            ["redis://a:1", "redis://b:2", "redis://c:3"]
        );
    }

    #[test]
    fn topology_flags_resolve() {
        let none: [String; 0] = [];
        let seeds = ["redis://a:1,redis://b:2".to_owned()];
        assert_eq!(
            Servers::resolve(&none, &seeds, &none, None).expect("cluster"),
            Servers::Cluster(vec!["redis://a:1".into(), "redis://b:2".into()])
        );
        let e = Servers::resolve(&none, &none, &seeds, None).unwrap_err();
        assert!(e.contains("--master-name"), "{e}");
        let e = Servers::resolve(&["redis://x:1".to_owned()], &none, &none, Some("m")).unwrap_err();
        assert!(e.contains("--sentinel"), "{e}");
        assert_eq!(
            Servers::resolve(&none, &none, &seeds, Some("m")).expect("sentinel"),
            Servers::Sentinel {
                sentinels: vec!["redis://a:1".into(), "redis://b:2".into()],
                master: "m".into()
            }
        );
    }

    #[test]
    fn node_operation_time_fits_the_lease() {
        assert_eq!(
            node_operation_time(Duration::from_secs(30), 3),
            MAX_NODE_OPERATION_TIME
        );
        let op = node_operation_time(Duration::from_secs(1), 3);
        assert!(op * 3 + Duration::from_millis(100) < Duration::from_secs(1));
    }

    #[test]
    fn credentials_are_not_displayed() {
        assert_eq!(display_address("redis://u:secret@host:1/0"), "host:1/0");
        assert_eq!(display_address("redis://host:1"), "host:1");
    }
}
