//! `slate top`: the locks under a prefix, refreshed each second (a terminal view), or one
//! snapshot (`--once`, `--json`).
//!
//! It shows the single locks, the read-write locks and the semaphores (`kind`).
//!
//! What it costs the server, per refresh and per master: the lock names come from `SCAN
//! MATCH <prefix>{*} COUNT 1000`, at most `--scan-limit` keys examined (10,000 by default: ten
//! `SCAN` calls), or from the names given (no `SCAN` at all); then one pipeline with, per
//! single lock, `HGETALL`, `PTTL` and `ZCARD`, and per read-write lock or semaphore `HGETALL`
//! of its holders, `ZRANGE` of their leases, `ZCARD` and `GET` (its capacity). A server with
//! millions of lock keys is therefore never walked whole; the view says when the cap cut the
//! walk short. On a cluster each master answers for the names of its slots (the others'
//! `MOVED` answers are skipped). On ZooKeeper only the names given are read (one listing and
//! one read per contender each).

use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use serde::Serialize;

use slate_core::LockName;
use slate_redis::node::NodeKeys;

use crate::exit;
use crate::probe::{BUDGET, cluster_masters, connect, redact, sentinel_master};
use crate::target::Servers;

/// What `slate top` was asked.
pub struct TopSpec {
    /// The deployment (Redis only).
    pub servers: Servers,
    /// The lock keys' prefix.
    pub prefix: String,
    /// Only these names (no `SCAN`); empty: every lock found under the prefix.
    pub names: Vec<String>,
    /// Keys examined per master and refresh, at most.
    pub scan_limit: u64,
    /// Locks shown, at most.
    pub limit: usize,
    /// One snapshot, as a table.
    pub once: bool,
    /// One snapshot, as JSON.
    pub json: bool,
    /// A Prometheus endpoint of a process using the locks (`slate run --metrics-addr`, or an
    /// application's exporter), read for its wait times.
    pub metrics: Option<String>,
    /// Refresh period of the terminal view.
    pub interval: Duration,
}

/// What kind of lock a row shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A single lock (and a multi-lock's names, a combination lock's nodes).
    Lock,
    /// A read-write lock.
    Rwlock,
    /// A semaphore.
    Semaphore,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::Lock, Kind::Rwlock, Kind::Semaphore];

    /// What follows `<prefix>{<name>}` in its main key (`slate_redis`'s key layout).
    fn suffix(self) -> &'static str {
        match self {
            Kind::Lock => "",
            Kind::Rwlock => ":rw",
            Kind::Semaphore => ":sem",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::Rwlock => "rwlock",
            Kind::Semaphore => "semaphore",
        }
    }
}

/// One lock in a snapshot (`slate top --json`; the field names are stable).
#[derive(Clone, Debug, Serialize)]
pub struct LockRow {
    /// The lock's name.
    pub name: String,
    /// `lock`, `rwlock` or `semaphore`.
    pub kind: Kind,
    /// The holder (the one most nodes agree on), `null` when free. A read-write lock's
    /// writer or only reader, a semaphore's only holder; `null` when several share it (see
    /// `holders`).
    pub holder: Option<String>,
    /// The holder's re-entry count (a read-write lock's writer: its write levels; a reader:
    /// its read levels).
    pub depth: u32,
    /// The holder's fencing token (several sharing it: the highest of theirs).
    pub token: Option<u64>,
    /// What is left of the lease, in ms (the least over the nodes that hold it, or over the
    /// holders that share it).
    pub ttl_ms: Option<u64>,
    /// Processes waiting in the lock's line (the most over the nodes).
    pub waiting: u64,
    /// Nodes the holder holds (1 for a single lock; a read-write lock or a semaphore: 1 while
    /// anyone holds it).
    pub nodes_held: usize,
    /// How many hold it (a single lock: 0 or 1; a read-write lock: its writer or readers; a
    /// semaphore: its permit holders).
    pub holders: u64,
    /// A read-write lock's mode when held: `read` or `write` (`null` otherwise).
    pub mode: Option<&'static str>,
    /// A semaphore's permits in use (`null` for the other kinds).
    pub permits: Option<u64>,
    /// A semaphore's capacity, as its users set it (`null` for the other kinds, or when not
    /// known).
    pub capacity: Option<u64>,
}

/// The wait figures of one series of a process's metrics.
#[derive(Clone, Debug, Serialize)]
pub struct WaitRow {
    /// The series' labels (`primitive`, `backend`, and `lock` when the process labels names).
    pub labels: String,
    /// Acquisitions.
    pub acquisitions: f64,
    /// Busy answers.
    pub busy: f64,
    /// Timeouts.
    pub timeouts: f64,
    /// Median wait, in ms (from the exporter's summary), when reported.
    pub wait_p50_ms: Option<f64>,
    /// 99th percentile wait, in ms, when reported.
    pub wait_p99_ms: Option<f64>,
}

/// One refresh.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    /// The prefix looked under.
    pub prefix: String,
    /// The locks, most waited-for first, then held, then by name.
    pub locks: Vec<LockRow>,
    /// Keys `SCAN` was asked to examine over the masters: 1,000 per call (`COUNT 1000`), an
    /// upper bound of the keys it walked (0 when the names were given).
    pub scanned: u64,
    /// Whether a master's walk stopped at `--scan-limit` before the end.
    pub truncated: bool,
    /// Locks found beyond `--limit` (not shown).
    pub hidden: usize,
    /// Masters that could not be read, with the error.
    pub errors: Vec<String>,
    /// Keys under the prefix that look like a lock's but could not be read as one (another
    /// program's key of another type, or damaged data), with the server's answer: left out.
    pub unreadable: Vec<String>,
    /// The wait figures of `--metrics`, when given.
    pub waits: Option<Vec<WaitRow>>,
    /// Why `--metrics` could not be read, when it could not.
    pub metrics_error: Option<String>,
}

/// Runs `slate top`; answers the exit code.
pub async fn top(spec: TopSpec) -> u8 {
    if let Err(msg) = check(&spec) {
        eprintln!("slate: {msg}");
        return exit::USAGE;
    }
    let source = match source(&spec).await {
        Ok(s) => s,
        Err((code, msg)) => {
            eprintln!("slate: {msg}");
            return code;
        }
    };
    if spec.once || spec.json {
        let snap = snapshot(&source, &spec).await;
        if spec.json {
            match serde_json::to_string_pretty(&snap) {
                Ok(s) => println!("{s}"),
                Err(e) => {
                    eprintln!("slate: cannot encode the snapshot: {e}");
                    return exit::INTERNAL;
                }
            }
        } else {
            print!("{}", render(&snap));
        }
        return if snap.locks.is_empty() && !snap.errors.is_empty() && source.all_failed(&snap) {
            exit::REDIS
        } else {
            exit::OK
        };
    }
    if !std::io::stdout().is_terminal() {
        eprintln!("slate: slate top needs a terminal; use --once (a table) or --json");
        return exit::USAGE;
    }
    interactive(&source, &spec).await
}

/// Refuses what no server could answer: a prefix the locks refuse, a name that is no lock
/// name, a Redis URL that does not parse.
fn check(spec: &TopSpec) -> Result<(), String> {
    slate_core::LockOptionsBuilder::default()
        .key_prefix(spec.prefix.clone())
        .build()
        .map_err(|e| e.to_string())?;
    for name in &spec.names {
        LockName::new(name).map_err(|e| {
            let shown: String = name.chars().take(60).collect();
            let more = if shown.len() < name.len() { "..." } else { "" };
            format!("{shown:?}{more}: {e}")
        })?;
    }
    let urls: &[String] = match &spec.servers {
        Servers::Masters(urls) | Servers::Cluster(urls) => urls,
        Servers::Sentinel { sentinels, .. } => sentinels,
        Servers::ZooKeeper(_) => &[],
    };
    for url in urls {
        redis::Client::open(url.as_str()).map_err(|e| {
            format!(
                "{}: not a Redis URL ({e}); use redis://HOST:PORT or rediss://HOST:PORT",
                redact(url)
            )
        })?;
    }
    Ok(())
}

/// Where the locks are read.
enum Source {
    /// Redis masters (each `--redis`, a cluster's masters, a Sentinel group's master).
    Redis(Vec<String>),
    /// A ZooKeeper ensemble: only the names given.
    Zk(slate_zookeeper::ZkClient),
}

impl Source {
    /// Whether no server at all could be read.
    fn all_failed(&self, snap: &Snapshot) -> bool {
        match self {
            Source::Redis(masters) => snap.errors.len() >= masters.len(),
            Source::Zk(_) => snap.errors.len() >= snap.locks.len().max(1),
        }
    }
}

async fn source(spec: &TopSpec) -> Result<Source, (u8, String)> {
    match &spec.servers {
        Servers::ZooKeeper(servers) => {
            if spec.names.is_empty() {
                return Err((
                    exit::USAGE,
                    "on ZooKeeper slate top reads the locks it is given: name them \
                     (slate top NAME... --zookeeper SERVERS)"
                        .to_owned(),
                ));
            }
            crate::target::zk_client(servers, Duration::from_secs(10))
                .await
                .map(Source::Zk)
                .map_err(|e| (crate::exit::of_error(&e), e.to_string()))
        }
        servers => masters(servers).await.map(Source::Redis),
    }
}

/// The named ZooKeeper locks' rows: holder, token and waiting contenders.
async fn zk_rows(
    client: &slate_zookeeper::ZkClient,
    spec: &TopSpec,
) -> (Vec<LockRow>, Vec<String>) {
    let root = crate::target::zk_root(&spec.prefix);
    let (mut rows, mut errors) = (Vec::new(), Vec::new());
    for name in &spec.names {
        let status = match slate_zookeeper::ZkLock::builder(client, name.as_str())
            .root(root)
            .build()
        {
            Ok(lock) => tokio::time::timeout(BUDGET, lock.status()).await,
            Err(e) => {
                errors.push(format!("{name}: {e}"));
                continue;
            }
        };
        match status {
            Ok(Ok(s)) => rows.push(LockRow {
                name: name.clone(),
                depth: u32::from(s.holder.is_some()),
                token: s.holder.as_ref().map(|h| h.token.get()),
                ttl_ms: None,
                waiting: s.waiters.len() as u64,
                nodes_held: usize::from(s.holder.is_some()),
                holders: u64::from(s.holder.is_some()),
                kind: Kind::Lock,
                mode: None,
                permits: None,
                capacity: None,
                holder: s.holder.map(|h| {
                    h.holder
                        .map_or_else(|| h.znode.clone(), |id| id.to_string())
                }),
            }),
            Ok(Err(e)) => errors.push(format!("{name}: {e}")),
            Err(_) => errors.push(format!("{name}: no answer within {BUDGET:?}")),
        }
    }
    (rows, errors)
}

/// The masters to read: each `--redis`, a cluster's masters, or a Sentinel group's master.
async fn masters(servers: &Servers) -> Result<Vec<String>, (u8, String)> {
    match servers {
        Servers::Masters(urls) => Ok(urls.clone()),
        Servers::Cluster(seeds) => {
            let mut last = String::new();
            for seed in seeds {
                let found = match connect(seed).await {
                    Ok(mut c) => cluster_masters(&mut c, seed).await,
                    Err(e) => Err(e),
                };
                match found {
                    Ok(masters) => return Ok(masters),
                    Err(e) => last = format!("{}: {e}", redact(seed)),
                }
            }
            Err((
                exit::REDIS,
                format!("no cluster seed node gives the cluster's masters (last: {last})"),
            ))
        }
        Servers::Sentinel { sentinels, master } => {
            for url in sentinels {
                if let Ok(mut c) = connect(url).await
                    && let Ok(Some(at)) = sentinel_master(&mut c, url, master).await
                {
                    return Ok(vec![at]);
                }
            }
            Err((
                exit::REDIS,
                format!("no Sentinel names a master {master:?}"),
            ))
        }
        Servers::ZooKeeper(_) => Err((exit::USAGE, "not a Redis deployment".to_owned())),
    }
}

/// The locks under `prefix` on one master, by kind: at most `limit` keys examined.
async fn scan(
    conn: &mut MultiplexedConnection,
    prefix: &str,
    limit: u64,
) -> Result<(Vec<Lock>, u64, bool), String> {
    let pattern = format!("{}{{*", glob_escape(prefix));
    let (mut cursor, mut seen, mut names) = (0u64, 0u64, Vec::new());
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .map_err(|e| e.to_string())?;
        seen += 1000;
        for key in keys {
            if let Some(found) = lock_of_key(prefix, &key) {
                names.push(found);
            }
        }
        cursor = next;
        if cursor == 0 {
            return Ok((names, seen, false));
        }
        if seen >= limit {
            return Ok((names, seen, true));
        }
    }
}

/// A lock: its kind and its name's bytes (a name need not be UTF-8).
type Lock = (Kind, Vec<u8>);

/// The lock whose main key `key` is: a single lock's hash is exactly its lock key
/// (`<prefix>{<name>}`, `NodeKeys::lock_key`), a read-write lock's holders that key and
/// `:rw`, a semaphore's that key and `:sem`. Their queues, turns, leases and records add more
/// after those, and are not main keys; nor is a key whose name no lock could have.
fn lock_of_key(prefix: &str, key: &[u8]) -> Option<Lock> {
    Kind::ALL.into_iter().find_map(|kind| {
        let base = key.strip_suffix(kind.suffix().as_bytes())?;
        NodeKeys::name_of_lock_key(prefix, base)
            .filter(|name| LockName::new(name).is_ok())
            .map(|name| (kind, name.to_vec()))
    })
}

/// The main key of the lock `name` of `kind` (see [`lock_of_key`]).
fn main_key(prefix: &str, kind: Kind, name: &[u8]) -> Result<Vec<u8>, String> {
    let name = LockName::new(name).map_err(|e| e.to_string())?;
    let mut key = NodeKeys::new(prefix, &name).lock_key().to_vec();
    key.extend_from_slice(kind.suffix().as_bytes());
    Ok(key)
}

fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// One lock on one node.
#[derive(Default)]
struct Entry {
    holder: Option<(String, u32)>,
    token: Option<u64>,
    ttl_ms: Option<u64>,
    waiting: u64,
    /// (read-write lock, semaphore) How many share it.
    holders: u64,
    /// (read-write lock) `read` or `write` while held.
    mode: Option<&'static str>,
    /// (semaphore) Permits in use and the capacity.
    permits: Option<u64>,
    capacity: Option<u64>,
    /// The server's answer when the lock's keys could not be read (another type).
    unreadable: Option<String>,
}

/// Whether a reply in a pipeline sent to every master is a cluster's redirection: the name
/// lives on another master, which answers for it.
fn elsewhere(v: &redis::Value) -> bool {
    matches!(v, redis::Value::ServerError(e) if matches!(e.code(), "MOVED" | "ASK"))
}

/// The first error among `replies` that is not a redirection, as text.
fn first_error(replies: &[redis::Value]) -> Option<String> {
    replies.iter().find_map(|v| match v {
        redis::Value::ServerError(e) if !elsewhere(v) => Some(match e.details() {
            Some(d) => format!("{} {d}", e.code()),
            None => e.code().to_owned(),
        }),
        _ => None,
    })
}

/// The entries of `locks` on one master, in order. A name another master of a cluster
/// serves reads as an empty entry; one whose keys answer an error (another type) as an
/// unreadable one.
async fn read_locks(
    conn: &mut MultiplexedConnection,
    prefix: &str,
    locks: &[Lock],
) -> Result<Vec<Entry>, String> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.cmd("TIME");
    for (kind, name) in locks {
        let key = main_key(prefix, *kind, name)?;
        let with = |suffix: &str| [&key[..], suffix.as_bytes()].concat();
        match kind {
            Kind::Lock => {
                pipe.cmd("HGETALL").arg(&key);
                pipe.cmd("PTTL").arg(&key);
                pipe.cmd("ZCARD").arg(with(":queue"));
            }
            Kind::Rwlock | Kind::Semaphore => {
                pipe.cmd("HGETALL").arg(&key);
                pipe.cmd("ZRANGE")
                    .arg(with(":leases"))
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES");
                pipe.cmd("ZCARD").arg(with(":queue"));
                pipe.cmd("GET").arg(with(":permits"));
            }
        }
    }
    let replies: Vec<redis::Value> = pipe.query_async(conn).await.map_err(|e| e.to_string())?;
    let Some((time, replies)) = replies.split_first() else {
        return Err("an empty reply to the pipeline".to_owned());
    };
    let (secs, micros): (u64, u64) =
        redis::from_redis_value_ref(time).map_err(|e| format!("TIME: {e}"))?;
    let now_ms = secs * 1000 + micros / 1000;
    let mut out = Vec::with_capacity(locks.len());
    let mut rest = replies;
    for (kind, _) in locks {
        let n = if *kind == Kind::Lock { 3 } else { 4 };
        let Some((chunk, after)) = rest.split_at_checked(n) else {
            return Err("fewer replies than commands in the pipeline".to_owned());
        };
        rest = after;
        let failed = first_error(chunk);
        out.push(match kind {
            _ if chunk.iter().any(elsewhere) => Entry::default(),
            _ if failed.is_some() => Entry {
                unreadable: failed,
                ..Entry::default()
            },
            Kind::Lock => lock_entry(chunk),
            Kind::Rwlock | Kind::Semaphore => shared_entry(chunk, now_ms, *kind),
        });
    }
    Ok(out)
}

/// A single lock's entry from its `HGETALL`, `PTTL` and `ZCARD`.
fn lock_entry(chunk: &[redis::Value]) -> Entry {
    let fields: HashMap<String, String> =
        redis::from_redis_value_ref(&chunk[0]).unwrap_or_default();
    let ttl: i64 = redis::from_redis_value_ref(&chunk[1]).unwrap_or(-2);
    let waiting: u64 = redis::from_redis_value_ref(&chunk[2]).unwrap_or(0);
    // Holder ids always contain ':' (the lock's own fields never do).
    let holder = fields
        .iter()
        .find(|(k, _)| k.contains(':'))
        .map(|(k, v)| (k.clone(), v.parse().unwrap_or(1)));
    Entry {
        token: fields.get("t").and_then(|t| t.parse().ok()),
        ttl_ms: u64::try_from(ttl).ok().filter(|_| holder.is_some()),
        holders: u64::from(holder.is_some()),
        holder,
        waiting,
        ..Entry::default()
    }
}

/// A read-write lock's or a semaphore's entry from its holders (`HGETALL`: `p:<holder>` its
/// permits, `r:` its read levels, `w:` its write levels, `t:` its token), their leases
/// (`ZRANGE ... WITHSCORES`: the server ms each ends at), its line (`ZCARD`) and its capacity
/// (`GET`). A holder whose lease has ended is left out, as the next script would remove it.
fn shared_entry(chunk: &[redis::Value], now_ms: u64, kind: Kind) -> Entry {
    let fields: HashMap<String, String> =
        redis::from_redis_value_ref(&chunk[0]).unwrap_or_default();
    let leases: Vec<(String, f64)> = redis::from_redis_value_ref(&chunk[1]).unwrap_or_default();
    let waiting: u64 = redis::from_redis_value_ref(&chunk[2]).unwrap_or(0);
    let capacity: Option<u64> = redis::from_redis_value_ref(&chunk[3]).ok().flatten();
    let field = |f: &str, h: &str| -> u64 {
        fields
            .get(&format!("{f}:{h}"))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "server ms"
    )]
    let alive: Vec<(&str, u64)> = leases
        .iter()
        .filter(|(_, end)| *end as u64 > now_ms)
        .map(|(h, end)| (h.as_str(), *end as u64 - now_ms))
        .collect();
    // A writer's levels are its write levels (it may read under its write too); a reader's
    // its read levels.
    let levels = |h: &str| {
        let w = field("w", h);
        u32::try_from(if w > 0 { w } else { field("r", h) }).unwrap_or(u32::MAX)
    };
    let shown = alive
        .iter()
        .find(|(h, _)| field("w", h) > 0)
        .or_else(|| (alive.len() == 1).then(|| &alive[0]))
        .map(|(h, _)| ((*h).to_owned(), levels(h)));
    let writer = alive.iter().any(|(h, _)| field("w", h) > 0);
    let mode = (kind == Kind::Rwlock && !alive.is_empty()).then_some(if writer {
        "write"
    } else {
        "read"
    });
    let token = match &shown {
        Some((h, _)) => Some(field("t", h)),
        None => alive.iter().map(|(h, _)| field("t", h)).max(),
    };
    Entry {
        token: token.filter(|t| *t > 0),
        ttl_ms: alive.iter().map(|(_, left)| *left).min(),
        holders: alive.len() as u64,
        holder: shown,
        waiting,
        mode,
        permits: (kind == Kind::Semaphore).then(|| {
            alive
                .iter()
                .fold(0u64, |sum, (h, _)| sum.saturating_add(field("p", h)))
        }),
        capacity: capacity.filter(|_| kind == Kind::Semaphore),
        unreadable: None,
    }
}

/// Reads every server once.
async fn snapshot(source: &Source, spec: &TopSpec) -> Snapshot {
    let masters = match source {
        Source::Redis(masters) => masters,
        Source::Zk(client) => {
            let (locks, errors) = zk_rows(client, spec).await;
            let (waits, metrics_error) = read_waits(spec).await;
            return Snapshot {
                prefix: crate::target::zk_root(&spec.prefix).to_owned(),
                locks,
                scanned: 0,
                truncated: false,
                hidden: 0,
                errors,
                unreadable: Vec::new(),
                waits,
                metrics_error,
            };
        }
    };
    let mut conns = Vec::new();
    let mut errors = Vec::new();
    for url in masters {
        match connect(url).await {
            Ok(c) => conns.push(c),
            Err(e) => errors.push(format!("{}: {e}", redact(url))),
        }
    }
    let (mut scanned, mut truncated) = (0, false);
    // Names given (checked by `check`, each once): every kind is read.
    let given: std::collections::BTreeSet<&[u8]> =
        spec.names.iter().map(|n| n.as_bytes()).collect();
    let mut names: Vec<Lock> = given
        .iter()
        .flat_map(|n| Kind::ALL.map(|k| (k, n.to_vec())))
        .collect();
    if spec.names.is_empty() {
        let mut found = std::collections::BTreeSet::new();
        for (i, c) in conns.iter_mut().enumerate() {
            match tokio::time::timeout(BUDGET * 4, scan(c, &spec.prefix, spec.scan_limit)).await {
                Ok(Ok((n, seen, cut))) => {
                    found.extend(n);
                    scanned += seen;
                    truncated |= cut;
                }
                Ok(Err(e)) => errors.push(format!("master {i}: SCAN: {e}")),
                Err(_) => errors.push(format!("master {i}: SCAN took too long")),
            }
        }
        names = found.into_iter().collect();
    }
    // Per lock, each node's entry (a name lives on one master of a cluster: the others
    // answer an empty entry).
    let mut per_name: BTreeMap<Lock, Vec<Entry>> = BTreeMap::new();
    for c in &mut conns {
        for chunk in names.chunks(500) {
            match read_locks(c, &spec.prefix, chunk).await {
                Ok(entries) => {
                    for (n, e) in chunk.iter().zip(entries) {
                        per_name.entry(n.clone()).or_default().push(e);
                    }
                }
                Err(e) => errors.push(format!("reading locks: {e}")),
            }
        }
    }
    let mut unreadable = Vec::new();
    for ((kind, name), entries) in &per_name {
        for e in entries.iter().filter_map(|e| e.unreadable.as_ref()) {
            let key = main_key(&spec.prefix, *kind, name).unwrap_or_default();
            unreadable.push(format!("{}: {e}", String::from_utf8_lossy(&key)));
        }
    }
    let busy = |r: &LockRow| r.holders > 0 || r.waiting > 0;
    let mut locks: Vec<LockRow> = per_name
        .into_iter()
        .map(|((kind, name), entries)| combine(kind, &name, &entries))
        .collect();
    // A name given is listed even when nothing holds it: as its single lock, unless a lock of
    // another kind of that name is listed.
    let shown_names: std::collections::HashSet<String> = locks
        .iter()
        .filter(|r| busy(r))
        .map(|r| r.name.clone())
        .collect();
    locks.retain(|r| {
        busy(r) || (r.kind == Kind::Lock && !given.is_empty() && !shown_names.contains(&r.name))
    });
    locks.sort_by(|a, b| {
        b.waiting
            .cmp(&a.waiting)
            .then((b.holders > 0).cmp(&(a.holders > 0)))
            .then(a.name.cmp(&b.name))
            .then(a.kind.cmp(&b.kind))
    });
    let hidden = locks.len().saturating_sub(spec.limit);
    locks.truncate(spec.limit);
    let (waits, metrics_error) = read_waits(spec).await;
    Snapshot {
        prefix: spec.prefix.clone(),
        locks,
        scanned,
        truncated,
        hidden,
        errors,
        unreadable,
        waits,
        metrics_error,
    }
}

/// The wait figures of `--metrics`, or why they could not be read.
async fn read_waits(spec: &TopSpec) -> (Option<Vec<WaitRow>>, Option<String>) {
    match &spec.metrics {
        None => (None, None),
        Some(url) => match scrape(url).await {
            Ok(w) => (Some(w), None),
            Err(e) => (None, Some(e)),
        },
    }
}

/// One row from the nodes' entries: the holder most nodes name. A read-write lock or a
/// semaphore lives on one server: its row is the entry with the most holders.
fn combine(kind: Kind, name: &[u8], entries: &[Entry]) -> LockRow {
    let name = String::from_utf8_lossy(name).into_owned();
    if kind != Kind::Lock {
        let none = Entry::default();
        let e = entries
            .iter()
            .max_by_key(|e| (e.holders, e.waiting))
            .unwrap_or(&none);
        return LockRow {
            name,
            kind,
            holder: e.holder.as_ref().map(|(h, _)| h.clone()),
            depth: e.holder.as_ref().map_or(0, |(_, d)| *d),
            token: e.token,
            ttl_ms: e.ttl_ms,
            waiting: e.waiting,
            nodes_held: usize::from(e.holders > 0),
            holders: e.holders,
            mode: e.mode,
            permits: e.permits,
            capacity: e.capacity,
        };
    }
    let mut votes: HashMap<&str, usize> = HashMap::new();
    for e in entries {
        if let Some((h, _)) = &e.holder {
            *votes.entry(h).or_default() += 1;
        }
    }
    let holder = votes
        .iter()
        .max_by_key(|(h, n)| (**n, std::cmp::Reverse(**h)))
        .map(|(h, n)| ((*h).to_owned(), *n));
    let of_holder = |e: &&Entry| {
        holder
            .as_ref()
            .is_some_and(|(h, _)| e.holder.as_ref().is_some_and(|(x, _)| x == h))
    };
    LockRow {
        depth: entries
            .iter()
            .filter(of_holder)
            .filter_map(|e| e.holder.as_ref().map(|(_, d)| *d))
            .max()
            .unwrap_or(0),
        token: entries
            .iter()
            .filter(of_holder)
            .filter_map(|e| e.token)
            .max(),
        ttl_ms: entries
            .iter()
            .filter(of_holder)
            .filter_map(|e| e.ttl_ms)
            .min(),
        waiting: entries.iter().map(|e| e.waiting).max().unwrap_or(0),
        nodes_held: holder.as_ref().map_or(0, |(_, n)| *n),
        holders: u64::from(holder.is_some()),
        holder: holder.map(|(h, _)| h),
        mode: None,
        permits: None,
        capacity: None,
        name,
        kind,
    }
}

/// Reads a Prometheus text page over plain HTTP and picks out the wait figures.
async fn scrape(url: &str) -> Result<Vec<WaitRow>, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("--metrics {url}: only http:// URLs are read"))?;
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/metrics"),
    };
    if !host.contains(':') {
        return Err(format!(
            "--metrics {url}: no port; use http://HOST:PORT/metrics (slate run \
             --metrics-addr's, or the exporter's)"
        ));
    }
    let page = tokio::time::timeout(BUDGET, async {
        let mut s = tokio::net::TcpStream::connect(host)
            .await
            .map_err(|e| format!("--metrics {url}: {e}"))?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut body = Vec::new();
        s.take(16 << 20)
            .read_to_end(&mut body)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(String::from_utf8_lossy(&body).into_owned())
    })
    .await
    .map_err(|_| format!("--metrics {url}: no answer within {BUDGET:?}"))??;
    let status = page.lines().next().unwrap_or_default();
    let ok = status.starts_with("HTTP/") && status.split_whitespace().nth(1) == Some("200");
    if !ok {
        let shown: String = status.chars().take(80).collect();
        return Err(format!(
            "--metrics {url}: not a metrics page (the answer began {shown:?}); use the \
             Prometheus endpoint, http://HOST:PORT/metrics"
        ));
    }
    Ok(parse_metrics(&page))
}

/// The wait rows of a Prometheus text page: per label set, the counters summed and the
/// wait summary's median and 99th percentile.
fn parse_metrics(page: &str) -> Vec<WaitRow> {
    let mut rows: BTreeMap<String, WaitRow> = BTreeMap::new();
    for line in page.lines().filter(|l| l.starts_with("slate_")) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (series, ""),
        };
        let mut quantile = None;
        let kept: Vec<&str> = labels
            .split(',')
            .filter(|l| !l.is_empty())
            .filter(|l| {
                if let Some(q) = l.strip_prefix("quantile=") {
                    quantile = Some(q.trim_matches('"').to_owned());
                    false
                } else {
                    !l.starts_with("how=") && !l.starts_with("outcome=")
                }
            })
            .collect();
        let key = kept.join(",");
        let row = || WaitRow {
            labels: key.clone(),
            acquisitions: 0.0,
            busy: 0.0,
            timeouts: 0.0,
            wait_p50_ms: None,
            wait_p99_ms: None,
        };
        match (name, quantile.as_deref()) {
            ("slate_acquisitions_total", _) => {
                rows.entry(key.clone()).or_insert_with(row).acquisitions += value;
            }
            ("slate_acquire_busy_total", _) => {
                rows.entry(key.clone()).or_insert_with(row).busy += value;
            }
            ("slate_acquire_timeouts_total", _) => {
                rows.entry(key.clone()).or_insert_with(row).timeouts += value;
            }
            ("slate_acquire_wait_seconds", Some("0.5")) => {
                rows.entry(key.clone()).or_insert_with(row).wait_p50_ms = Some(value * 1000.0);
            }
            ("slate_acquire_wait_seconds", Some("0.99")) => {
                rows.entry(key.clone()).or_insert_with(row).wait_p99_ms = Some(value * 1000.0);
            }
            _ => {}
        }
    }
    rows.into_values().collect()
}

fn ms(v: Option<u64>) -> String {
    v.map_or_else(
        || "-".to_owned(),
        |ms| crate::duration::human(Duration::from_millis(ms)),
    )
}

/// A row's holder cell: the holder (with its levels above one), or how many share it; a
/// read-write lock's mode; a semaphore's permits.
fn holder_cell(l: &LockRow) -> String {
    let mut cell = match &l.holder {
        Some(h) if l.depth > 1 => format!("{h} x{}", l.depth),
        Some(h) => h.clone(),
        None if l.holders > 1 && l.kind == Kind::Rwlock => format!("{} readers", l.holders),
        None if l.holders > 1 => format!("{} holders", l.holders),
        None => "(free)".to_owned(),
    };
    if let Some(mode) = l.mode {
        cell.push_str(&format!(" ({mode})"));
    }
    if let Some(p) = l.permits {
        let of = l.capacity.map_or_else(String::new, |c| format!(" of {c}"));
        cell.push_str(&format!(", {p}{of} permits"));
    }
    cell
}

/// The snapshot's rows as table cells.
fn lock_cells(snap: &Snapshot) -> Vec<[String; 7]> {
    snap.locks
        .iter()
        .map(|l| {
            [
                l.name.clone(),
                l.kind.label().to_owned(),
                holder_cell(l),
                l.token.map_or_else(|| "-".to_owned(), |t| t.to_string()),
                ms(l.ttl_ms),
                l.waiting.to_string(),
                l.nodes_held.to_string(),
            ]
        })
        .collect()
}

const HEADER: [&str; 7] = [
    "LOCK",
    "KIND",
    "HOLDER",
    "TOKEN",
    "LEASE LEFT",
    "WAITING",
    "NODES",
];

fn footer(snap: &Snapshot) -> Vec<String> {
    let mut lines = Vec::new();
    let busy = snap
        .locks
        .iter()
        .filter(|r| r.holders > 0 || r.waiting > 0)
        .count();
    let walk = if snap.scanned == 0 {
        "no SCAN".to_owned()
    } else {
        format!("{} SCAN call(s) of COUNT 1000", snap.scanned / 1000)
    };
    lines.push(format!(
        "{} lock(s) held or waited for under {:?}{}; {walk}{}",
        busy + snap.hidden,
        snap.prefix,
        if snap.hidden > 0 {
            format!(" ({} not shown: --limit)", snap.hidden)
        } else {
            String::new()
        },
        if snap.truncated {
            " (cut short at --scan-limit: name the locks, or raise it)"
        } else {
            ""
        }
    ));
    for e in &snap.errors {
        lines.push(format!("error: {e}"));
    }
    const SHOWN: usize = 5;
    for u in snap.unreadable.iter().take(SHOWN) {
        lines.push(format!("not a lock's data (left out): {u}"));
    }
    if snap.unreadable.len() > SHOWN {
        lines.push(format!(
            "... and {} more such key(s) (--json lists them)",
            snap.unreadable.len() - SHOWN
        ));
    }
    if let Some(e) = &snap.metrics_error {
        lines.push(format!("metrics: {e}"));
    }
    lines
}

fn wait_cells(w: &WaitRow) -> [String; 6] {
    let f = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1}ms"));
    [
        w.labels.clone(),
        format!("{}", w.acquisitions),
        format!("{}", w.busy),
        format!("{}", w.timeouts),
        f(w.wait_p50_ms),
        f(w.wait_p99_ms),
    ]
}

const WAIT_HEADER: [&str; 6] = [
    "SERIES", "ACQUIRED", "BUSY", "TIMEOUTS", "WAIT P50", "WAIT P99",
];

/// The snapshot as plain text (`--once`).
fn render(snap: &Snapshot) -> String {
    let header = HEADER.map(str::to_owned);
    let mut out = crate::status::table(&header, &lock_cells(snap));
    for l in footer(snap) {
        out.push_str(&l);
        out.push('\n');
    }
    if let Some(waits) = &snap.waits {
        out.push('\n');
        let rows: Vec<[String; 6]> = waits.iter().map(wait_cells).collect();
        out.push_str(&crate::status::table(
            &WAIT_HEADER.map(str::to_owned),
            &rows,
        ));
    }
    out
}

/// The terminal view: redrawn each `--interval`; q, Esc or Ctrl-C quits.
async fn interactive(source: &Source, spec: &TopSpec) -> u8 {
    use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
    use ratatui::layout::{Constraint, Layout};
    use ratatui::style::{Modifier, Style};
    use ratatui::widgets::{Block, Paragraph, Row, Table};

    let mut terminal = match ratatui::try_init() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("slate: cannot use the terminal: {e}");
            return exit::INTERNAL;
        }
    };
    let widths = [
        Constraint::Fill(3),
        Constraint::Length(9),
        Constraint::Fill(4),
        Constraint::Length(8),
        Constraint::Length(11),
        Constraint::Length(8),
        Constraint::Length(6),
    ];
    let code = loop {
        let started = Instant::now();
        let snap = snapshot(source, spec).await;
        let drawn = terminal.draw(|frame| {
            let waits = snap.waits.as_ref().map_or(0, Vec::len);
            let [top, bottom, wait_area] = Layout::vertical([
                Constraint::Min(3),
                Constraint::Length(u16::try_from(footer(&snap).len()).unwrap_or(1)),
                Constraint::Length(if snap.waits.is_some() {
                    u16::try_from(waits + 3).unwrap_or(3)
                } else {
                    0
                }),
            ])
            .areas(frame.area());
            let bold = Style::default().add_modifier(Modifier::BOLD);
            let rows = lock_cells(&snap).into_iter().map(Row::new);
            let title = format!(
                " slate top: {} (every {}; q quits) ",
                spec.servers.describe(),
                crate::duration::human(spec.interval)
            );
            frame.render_widget(
                Table::new(rows, widths)
                    .header(Row::new(HEADER).style(bold))
                    .block(Block::bordered().title(title)),
                top,
            );
            frame.render_widget(Paragraph::new(footer(&snap).join("\n")), bottom);
            if let Some(w) = &snap.waits {
                let rows = w.iter().map(wait_cells).map(Row::new);
                frame.render_widget(
                    Table::new(
                        rows,
                        [
                            Constraint::Fill(4),
                            Constraint::Length(9),
                            Constraint::Length(8),
                            Constraint::Length(9),
                            Constraint::Length(9),
                            Constraint::Length(9),
                        ],
                    )
                    .header(Row::new(WAIT_HEADER).style(bold))
                    .block(Block::bordered().title(" waits (--metrics) ")),
                    wait_area,
                );
            }
        });
        if let Err(e) = drawn {
            ratatui::restore();
            eprintln!("slate: cannot draw: {e}");
            return exit::INTERNAL;
        }
        // Keys until the next refresh (polled off the runtime's threads).
        let wait = spec.interval.saturating_sub(started.elapsed());
        let quit = tokio::task::spawn_blocking(move || {
            let until = Instant::now() + wait;
            loop {
                let left = until.saturating_duration_since(Instant::now());
                match event::poll(left) {
                    Ok(true) => match event::read() {
                        Ok(Event::Key(k)) if k.kind == KeyEventKind::Press => {
                            let ctrl_c = k.code == KeyCode::Char('c')
                                && k.modifiers.contains(KeyModifiers::CONTROL);
                            if ctrl_c || matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) {
                                return true;
                            }
                        }
                        Ok(_) => {}
                        Err(_) => return true,
                    },
                    Ok(false) => return false,
                    Err(_) => return true,
                }
            }
        })
        .await
        .unwrap_or(true);
        if quit {
            break exit::OK;
        }
    };
    ratatui::restore();
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prometheus_page_gives_the_wait_rows() {
        let page = "\
# HELP slate_acquisitions_total x
slate_acquisitions_total{primitive=\"lock\",backend=\"redis-standalone\",how=\"remote\"} 10
slate_acquisitions_total{primitive=\"lock\",backend=\"redis-standalone\",how=\"pass\"} 5
slate_acquire_busy_total{primitive=\"lock\",backend=\"redis-standalone\"} 2
slate_acquire_wait_seconds{primitive=\"lock\",backend=\"redis-standalone\",quantile=\"0.5\"} 0.002
slate_acquire_wait_seconds{primitive=\"lock\",backend=\"redis-standalone\",quantile=\"0.99\"} 0.25
slate_acquire_wait_seconds_count{primitive=\"lock\",backend=\"redis-standalone\"} 15
";
        let rows = parse_metrics(page);
        assert_eq!(rows.len(), 1, "{rows:?}");
        let r = &rows[0];
        assert_eq!(r.labels, "primitive=\"lock\",backend=\"redis-standalone\"");
        assert!((r.acquisitions - 15.0).abs() < 1e-9);
        assert!((r.busy - 2.0).abs() < 1e-9);
        assert_eq!(r.wait_p50_ms.map(|v| (v * 10.0).round()), Some(20.0));
        assert_eq!(r.wait_p99_ms.map(|v| v.round()), Some(250.0));
    }

    #[test]
    fn main_keys_name_their_lock_and_kind() {
        let of = |k: &[u8]| lock_of_key("slate:", k);
        let lock = |kind, name: &[u8]| Some((kind, name.to_vec()));
        assert_eq!(of(b"slate:{a}"), lock(Kind::Lock, b"a"));
        assert_eq!(of(b"slate:{a}:rw"), lock(Kind::Rwlock, b"a"));
        assert_eq!(of(b"slate:{a}:sem"), lock(Kind::Semaphore, b"a"));
        // A single lock whose name ends like a suffix keeps its closing brace last.
        assert_eq!(of(b"slate:{a}:rw}"), lock(Kind::Lock, b"a}:rw"));
        // A name that begins with `}` has a `{` added in its key (a non-empty hash tag).
        assert_eq!(of(b"slate:{{}x}:sem"), lock(Kind::Semaphore, b"}x"));
        // Names need not be UTF-8.
        assert_eq!(of(b"slate:{\xff}"), lock(Kind::Lock, b"\xff"));
        // No lock has an empty name.
        assert_eq!(of(b"slate:{}"), None);
        for (kind, name) in [
            (Kind::Lock, &b"}x"[..]),
            (Kind::Rwlock, b"a"),
            (Kind::Semaphore, b"{}"),
            (Kind::Lock, b"\xfe\xff"),
        ] {
            let key = main_key("slate:", kind, name).unwrap();
            assert_eq!(of(&key), lock(kind, name));
        }
        for other in [
            "slate:{a}:queue",
            "slate:{a}:rw:leases",
            "slate:{a}:sem:permits",
            "slate:{a}:latch",
            "slate:fence:{x}",
            "other:{a}",
        ] {
            assert_eq!(of(other.as_bytes()), None, "{other}");
        }
    }

    #[test]
    fn prefixes_are_escaped_for_scan() {
        assert_eq!(glob_escape("slate:"), "slate:");
        assert_eq!(glob_escape("a*b?[c]"), "a\\*b\\?\\[c\\]");
    }
}
