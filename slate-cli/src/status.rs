//! `slate status` (one lock's state on every node) and `slate unlock --force`.

use std::time::Duration;

use serde::Serialize;
use slate_core::Error;
use slate_redis::LockStatus;
use slate_redis::RedisClient;
use slate_redis::node::NodeKeys;

use crate::duration::human;
use crate::exit;
use crate::target::{Servers, Target, check_name};

/// Budget of one node's inspection.
const INSPECT_BUDGET: Duration = Duration::from_secs(3);

/// `slate status --json` output. Field names are stable (scripts rely on them).
#[derive(Debug, Serialize)]
pub struct StatusReport {
    /// Lock name.
    pub lock: String,
    /// Key prefix.
    pub prefix: String,
    /// `"single"` (one node) or `"combination"`.
    pub kind: &'static str,
    /// Nodes that must agree for the lock to be held (1 for a single lock).
    pub quorum: usize,
    /// Whether at least `quorum` nodes show the same holder.
    pub held: bool,
    /// That holder, when held.
    pub holder: Option<String>,
    /// Who holds the lock now: `holder`, or the local holder its hold was passed to inside its
    /// process (lock cohorting; as of the hold's last renewal).
    pub current_holder: Option<String>,
    /// Per node, in the order given.
    pub nodes: Vec<NodeStatus>,
    /// The name's read-write lock (`slate run --read`, and the readers a writer waits for);
    /// `null` for a combination lock or when the read could not be made.
    pub read_write: Option<SharedReport>,
    /// The name's semaphore (`slate run --permits`); `null` when it was never used (or for
    /// a combination lock).
    pub semaphore: Option<SharedReport>,
}

/// The holders of a read-write lock or a semaphore (`slate status --json`).
#[derive(Debug, Serialize)]
pub struct SharedReport {
    /// `"free"`, `"read"` (readers, or permit holders) or `"write"`.
    pub mode: &'static str,
    /// Permits in use (a read-write lock: one per reader, 2^30 for a writer).
    pub in_use: u64,
    /// A semaphore's permits.
    pub capacity: Option<u64>,
    /// Every holder, soonest lease end first.
    pub holders: Vec<SharedHolderReport>,
}

/// One holder in a [`SharedReport`].
#[derive(Debug, Serialize)]
pub struct SharedHolderReport {
    /// Holder id.
    pub holder: String,
    /// Permits it holds.
    pub permits: u64,
    /// Read levels (1 for a permit holder).
    pub reads: u32,
    /// Write levels.
    pub writes: u32,
    /// Its fencing token.
    pub token: u64,
    /// What is left of its lease, in ms.
    pub ttl_ms: u64,
}

impl From<slate_redis::SharedStatus> for SharedReport {
    fn from(s: slate_redis::SharedStatus) -> Self {
        SharedReport {
            mode: match s.mode() {
                slate_redis::SharedMode::Free => "free",
                slate_redis::SharedMode::Read => "read",
                slate_redis::SharedMode::Write => "write",
            },
            in_use: s.in_use,
            capacity: s.capacity,
            holders: s
                .holders
                .into_iter()
                .map(|h| SharedHolderReport {
                    holder: h.holder,
                    permits: h.permits,
                    reads: h.reads,
                    writes: h.writes,
                    token: h.token,
                    ttl_ms: u64::try_from(h.lease_left.as_millis()).unwrap_or(u64::MAX),
                })
                .collect(),
        }
    }
}

/// The read-write lock's and the semaphore's holders of `name`, read through `client`
/// (each `None` when its read failed; the semaphore also when it was never used).
async fn shared_status(
    client: &RedisClient,
    name: &str,
    prefix: &str,
) -> (Option<SharedReport>, Option<SharedReport>) {
    let rw = slate_redis::RwLock::builder(client, name)
        .key_prefix(prefix)
        .build();
    let sem = slate_redis::Semaphore::builder(client, name, 1)
        .key_prefix(prefix)
        .build();
    // Both at once: a server that does not answer costs one budget, not two.
    let read_write = async {
        match rw {
            Ok(l) => tokio::time::timeout(INSPECT_BUDGET, l.status())
                .await
                .ok()
                .and_then(Result::ok),
            Err(_) => None,
        }
    };
    let semaphore = async {
        match sem {
            Ok(s) => tokio::time::timeout(INSPECT_BUDGET, s.status())
                .await
                .ok()
                .and_then(Result::ok)
                .filter(|s| s.capacity.is_some() || !s.holders.is_empty()),
            Err(_) => None,
        }
    };
    let (read_write, semaphore) = tokio::join!(read_write, semaphore);
    (read_write.map(Into::into), semaphore.map(Into::into))
}

/// One node of a [`StatusReport`].
#[derive(Debug, Serialize)]
pub struct NodeStatus {
    /// Position in the order given.
    pub index: usize,
    /// Address without credentials.
    pub address: String,
    /// Whether the node answered.
    pub ok: bool,
    /// The error, when it did not.
    pub error: Option<String>,
    /// Holders and their reentry counts (normally zero or one).
    pub holders: Vec<HolderStatus>,
    /// Remaining time to live of the lock entry in ms; `null` when there is none.
    pub ttl_ms: Option<u64>,
    /// The fencing counter on this node (0 when it was never used).
    pub fence: u64,
    /// On a cluster: the lock's hash slot.
    pub slot: Option<u16>,
    /// On a cluster: the master serving that slot (`host:port`).
    pub owner: Option<String>,
    /// The server's `maxmemory-policy` when it can evict lock keys (anything but
    /// `noeviction`: every lock key has a TTL, so a held lock can vanish); `null` otherwise,
    /// or when it could not be read.
    pub eviction_policy: Option<String>,
}

/// One holder on one node.
#[derive(Debug, Serialize)]
pub struct HolderStatus {
    /// Holder id.
    pub holder: String,
    /// Reentry count.
    pub count: u32,
    /// The local holder this hold was passed to inside its process (lock cohorting), as of
    /// the hold's last renewal; `null` when it was not passed. The holder id of a hold that
    /// may be passed is minted for it, so this is who holds the lock now.
    pub passed_to: Option<String>,
}

/// The majority quorum of the combination lock (`max(2, N/2 + 1)`), 1 for one node.
fn quorum(n: usize) -> usize {
    if n <= 1 { 1 } else { (n / 2 + 1).max(2) }
}

/// What one node answered: its address, its entries, and (cluster) the slot and its owner.
/// A node's address, its entries, its cluster location, and its eviction policy when that
/// can evict lock keys.
type Answer = (
    String,
    Result<LockStatus, Error>,
    Option<(u16, String)>,
    Option<String>,
);

async fn inspect(url: &str, keys: &NodeKeys) -> Answer {
    match RedisClient::open(url) {
        Ok(client) => inspect_client(&client, keys).await,
        Err(e) => (crate::target::display_address(url), Err(e), None, None),
    }
}

async fn inspect_client(client: &RedisClient, keys: &NodeKeys) -> Answer {
    let address = client.address().to_owned();
    let location = match tokio::time::timeout(
        INSPECT_BUDGET,
        client.cluster_location(keys.lock_key()),
    )
    .await
    {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => return (address, Err(e), None, None),
        Err(_) => None,
    };
    // Issue 35, defect 14: a policy that evicts keys can drop held locks (they all have a TTL).
    let evicting = tokio::time::timeout(INSPECT_BUDGET, client.eviction_policy())
        .await
        .ok()
        .and_then(Result::ok)
        .flatten()
        .filter(|p| !p.eq_ignore_ascii_case("noeviction"));
    let result = match tokio::time::timeout(INSPECT_BUDGET, client.node().inspect(keys)).await {
        Ok(r) => r,
        Err(_) => Err(Error::backend(
            slate_core::BackendKind::Timeout,
            Some(address.clone()),
            format!("no answer within {}", human(INSPECT_BUDGET)),
            None,
        )),
    };
    (address, result, location, evicting)
}

/// Reads the lock's state on every node (concurrently).
///
/// # Errors
///
/// [`Error::InvalidInput`] for a bad name or prefix.
pub async fn collect(servers: &Servers, name: &str, prefix: &str) -> Result<StatusReport, Error> {
    let lock_name = check_name(name)?;
    slate_core::LockOptions::builder()
        .key_prefix(prefix)
        .build()?;
    let keys = NodeKeys::new(prefix, &lock_name);
    let one = match servers {
        Servers::Masters(_) => None,
        Servers::ZooKeeper(_) => {
            return Err(Error::invalid_input(
                "servers",
                "this report reads Redis servers, and --zookeeper names a ZooKeeper ensemble",
                "read a ZooKeeper lock's status with slate status NAME --zookeeper SERVERS",
            ));
        }
        Servers::Cluster(seeds) => Some(RedisClient::open_cluster(
            seeds,
            slate_redis::ClientOptions::default(),
        )?),
        Servers::Sentinel { sentinels, master } => Some(RedisClient::open_sentinel(
            sentinels,
            master,
            slate_redis::ClientOptions::default(),
        )?),
    };
    let urls: Vec<String> = match servers {
        Servers::Masters(urls) => urls.clone(),
        other => vec![other.describe()],
    };
    if let Servers::Masters(urls) = servers {
        // As `run` and `unlock` take them: each a Redis URL, each server once (one server
        // listed twice is not two nodes of a combination lock).
        let mut seen: Vec<String> = Vec::with_capacity(urls.len());
        for url in urls {
            let address = RedisClient::open(url)?.address().to_owned();
            if seen.contains(&address) {
                return Err(Error::invalid_input(
                    "servers",
                    format!("{address} is listed twice"),
                    "list each server once (--redis URL per node)",
                ));
            }
            seen.push(address);
        }
    }
    let mut tasks = tokio::task::JoinSet::new();
    let shared_client = match (&one, urls.as_slice()) {
        (Some(c), _) => Some(c.clone()),
        (None, [url]) => RedisClient::open(url).ok(),
        (None, _) => None,
    };
    // The nodes' reads are spawned first, so that they run while the shared locks are read.
    match one {
        // A cluster or a Sentinel group is one node: the client finds the lock's master.
        Some(client) => {
            let keys = keys.clone();
            tasks.spawn(async move { (0, inspect_client(&client, &keys).await) });
        }
        None => {
            for (i, url) in urls.iter().enumerate() {
                let (url, keys) = (url.clone(), keys.clone());
                tasks.spawn(async move { (i, inspect(&url, &keys).await) });
            }
        }
    }
    let (read_write, semaphore) = match &shared_client {
        Some(c) => shared_status(c, name, prefix).await,
        None => (None, None),
    };
    let mut answers: Vec<Option<Answer>> = (0..urls.len()).map(|_| None).collect();
    while let Some(joined) = tasks.join_next().await {
        if let Ok((i, answer)) = joined
            && let Some(slot) = answers.get_mut(i)
        {
            *slot = Some(answer);
        }
    }
    let nodes: Vec<NodeStatus> = answers
        .into_iter()
        .enumerate()
        .map(|(index, answer)| match answer {
            Some((address, Ok(e), location, evicting)) => NodeStatus {
                index,
                address,
                ok: true,
                error: None,
                eviction_policy: evicting,
                slot: location.as_ref().map(|l| l.0),
                owner: location.map(|l| l.1),
                holders: e
                    .holders
                    .into_iter()
                    .map(|(holder, count)| HolderStatus {
                        passed_to: e
                            .passed
                            .as_ref()
                            .filter(|(h, _)| *h == holder)
                            .map(|(_, to)| to.clone()),
                        holder,
                        count,
                    })
                    .collect(),
                ttl_ms: e
                    .remaining
                    .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                fence: e.fence,
            },
            Some((address, Err(e), _, _)) => NodeStatus {
                index,
                address,
                ok: false,
                error: Some(e.to_string()),
                eviction_policy: None,
                holders: Vec::new(),
                ttl_ms: None,
                fence: 0,
                slot: None,
                owner: None,
            },
            None => NodeStatus {
                index,
                address: crate::target::display_address(&urls[index]),
                ok: false,
                error: Some("the inspection task failed".to_owned()),
                eviction_policy: None,
                holders: Vec::new(),
                ttl_ms: None,
                fence: 0,
                slot: None,
                owner: None,
            },
        })
        .collect();
    let quorum = quorum(urls.len());
    let mut tally: Vec<(&str, usize)> = Vec::new();
    for h in nodes.iter().flat_map(|n| n.holders.iter()) {
        match tally.iter_mut().find(|(name, _)| *name == h.holder) {
            Some((_, c)) => *c += 1,
            None => tally.push((&h.holder, 1)),
        }
    }
    let holder = tally
        .iter()
        .filter(|(_, c)| *c >= quorum)
        .max_by_key(|(_, c)| *c)
        .map(|(h, _)| (*h).to_owned());
    let current_holder = holder.as_ref().map(|h| {
        nodes
            .iter()
            .flat_map(|n| n.holders.iter())
            .find(|x| &x.holder == h)
            .and_then(|x| x.passed_to.clone())
            .unwrap_or_else(|| h.clone())
    });
    Ok(StatusReport {
        lock: name.to_owned(),
        prefix: prefix.to_owned(),
        kind: if urls.len() == 1 {
            "single"
        } else {
            "combination"
        },
        quorum,
        held: holder.is_some(),
        holder,
        current_holder,
        nodes,
        read_write,
        semaphore,
    })
}

/// Renders the human table.
#[must_use]
pub fn render(report: &StatusReport) -> String {
    let mut out = String::new();
    let n = report.nodes.len();
    let answered = report.nodes.iter().filter(|n| n.ok).count();
    let head = match (&report.holder, report.kind) {
        (Some(h), "single") => match &report.current_holder {
            Some(now) if now != h => format!(
                "held by {now} (the hold of {h}, passed to it inside its process; as of the \
                 hold's last renewal)"
            ),
            _ => format!("held by {h}"),
        },
        (Some(h), _) => format!(
            "held by {h} on {} of {n} nodes (quorum {})",
            report
                .nodes
                .iter()
                .filter(|x| x.holders.iter().any(|y| &y.holder == h))
                .count(),
            report.quorum
        ),
        (None, _) if answered < report.quorum => {
            format!("unknown: only {answered} of {n} nodes could be read")
        }
        (None, _) => {
            // The name's read-write lock or semaphore may be held while its single lock is
            // free (`slate run --read` takes the read-write lock): say so, not just "free".
            let shared = [
                ("read-write lock", &report.read_write),
                ("semaphore", &report.semaphore),
            ]
            .into_iter()
            .filter_map(|(what, r)| {
                r.as_ref()
                    .filter(|r| !r.holders.is_empty())
                    .map(|r| format!("its {what} is held ({}, below)", r.mode))
            })
            .collect::<Vec<_>>();
            if shared.is_empty() {
                "free".to_owned()
            } else {
                format!("free as a single lock; {}", shared.join("; "))
            }
        }
    };
    out.push_str(&format!(
        "lock {:?} ({} lock, prefix {:?}): {head}\n",
        report.lock, report.kind, report.prefix
    ));
    for node in &report.nodes {
        if let (Some(slot), Some(owner)) = (node.slot, &node.owner) {
            out.push_str(&format!(
                "cluster slot {slot}, served by the master at {owner}\n"
            ));
        }
    }
    let rows: Vec<[String; 6]> = report
        .nodes
        .iter()
        .map(|node| {
            if let Some(e) = &node.error {
                return [
                    node.index.to_string(),
                    node.address.clone(),
                    format!("error: {e}"),
                    String::new(),
                    String::new(),
                    String::new(),
                ];
            }
            let (holder, count) = match node.holders.as_slice() {
                [] => ("-".to_owned(), "-".to_owned()),
                [one] => (one.holder.clone(), one.count.to_string()),
                many => (
                    many.iter()
                        .map(|h| h.holder.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    many.iter()
                        .map(|h| h.count.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                ),
            };
            let ttl = node
                .ttl_ms
                .map_or_else(|| "-".to_owned(), |ms| human(Duration::from_millis(ms)));
            [
                node.index.to_string(),
                node.address.clone(),
                holder,
                count,
                ttl,
                node.fence.to_string(),
            ]
        })
        .collect();
    let header = ["node", "address", "holder", "count", "ttl", "fence"].map(str::to_owned);
    out.push_str(&table(&header, &rows));
    for node in &report.nodes {
        if let Some(policy) = &node.eviction_policy {
            out.push_str(&format!(
                "warning: node {} ({}) has maxmemory-policy {policy}: at maxmemory it evicts \
                 keys, and every lock key has a TTL, so a held lock can vanish and be granted \
                 again. Fix: CONFIG SET maxmemory-policy noeviction (and in its configuration)\n",
                node.index, node.address
            ));
        }
    }
    if let Some(rw) = report.read_write.as_ref().filter(|r| !r.holders.is_empty()) {
        let who = match rw.mode {
            "write" => "written by".to_owned(),
            _ => format!("read by {} holder(s):", rw.holders.len()),
        };
        out.push_str(&format!("read-write lock: {who}\n"));
        out.push_str(&shared_table(rw));
    }
    if let Some(sem) = &report.semaphore {
        out.push_str(&format!(
            "semaphore: {} of {} permits in use\n",
            sem.in_use,
            sem.capacity
                .map_or_else(|| "?".to_owned(), |c| c.to_string())
        ));
        if !sem.holders.is_empty() {
            out.push_str(&shared_table(sem));
        }
    }
    out
}

/// The holders of a read-write lock or a semaphore, as a table.
fn shared_table(r: &SharedReport) -> String {
    let rows: Vec<[String; 4]> = r
        .holders
        .iter()
        .map(|h| {
            let what = if h.writes > 0 {
                format!("write x{}", h.writes)
            } else if r.capacity.is_some() {
                format!("{} permit(s)", h.permits)
            } else {
                format!("read x{}", h.reads)
            };
            [
                format!("  {}", h.holder),
                what,
                h.token.to_string(),
                human(Duration::from_millis(h.ttl_ms)),
            ]
        })
        .collect();
    let header = ["  holder", "holds", "token", "ttl"].map(str::to_owned);
    table(&header, &rows)
}

/// A plain left-aligned text table (the last column is not padded).
#[must_use]
pub fn table<const N: usize>(header: &[String; N], rows: &[[String; N]]) -> String {
    let mut widths = header.each_ref().map(|h| h.chars().count());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == N {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `slate status`: prints the report; exit 0 when every node answered, 69 otherwise.
pub async fn status(servers: &Servers, names: &[String], prefix: &str, json: bool) -> u8 {
    if let Some(code) = wrong_topology(servers).await {
        return code;
    }
    // Every name at once: a server that does not answer costs one budget, not one per name.
    let collected =
        futures::future::join_all(names.iter().map(|name| collect(servers, name, prefix))).await;
    let mut reports = Vec::with_capacity(names.len());
    for r in collected {
        match r {
            Ok(r) => reports.push(r),
            Err(e) => {
                eprintln!("slate: {e}");
                return exit::USAGE;
            }
        }
    }
    if json {
        // One name: its object; several (`slate status a b`): an array of them.
        let encoded = match reports.as_slice() {
            [one] => serde_json::to_string_pretty(one),
            all => serde_json::to_string_pretty(all),
        };
        match encoded {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("slate: cannot encode the status: {e}");
                return exit::INTERNAL;
            }
        }
    } else {
        for (i, report) in reports.iter().enumerate() {
            if i > 0 {
                println!();
            }
            print!("{}", render(report));
        }
    }
    if reports.iter().all(|r| r.nodes.iter().all(|n| n.ok)) {
        exit::OK
    } else {
        exit::REDIS
    }
}

/// One `--redis` URL that is a cluster node or a Sentinel: says which flag to use instead and
/// returns the usage exit code. (An unreachable server is left to the command's own report.)
async fn wrong_topology(servers: &Servers) -> Option<u8> {
    let Servers::Masters(urls) = servers else {
        return None;
    };
    let [url] = urls.as_slice() else {
        return None;
    };
    let client = RedisClient::open(url).ok()?;
    match tokio::time::timeout(INSPECT_BUDGET, client.check_topology()).await {
        Ok(Err(e)) if e.is_invalid_input() => {
            eprintln!("slate: {e}");
            Some(exit::USAGE)
        }
        _ => None,
    }
}

/// What `unlock` without `--force` says.
pub fn refuse_message(name: &str) -> String {
    format!(
        "slate: refusing to unlock {name:?} without --force.\n\
         Force-unlocking deletes the lock whoever holds it. Its holder is not told: if it is \
         still running, it goes on while the next holder takes the lock, and the two overlap.\n\
         Use it only when the holder is known to be dead and you cannot wait for its lease to \
         run out (it expires by itself). To go ahead: slate unlock --force {name}"
    )
}

/// `slate unlock --force`: deletes the lock on every node.
pub async fn unlock(servers: &Servers, name: &str, prefix: &str) -> u8 {
    if let Some(code) = wrong_topology(servers).await {
        return code;
    }
    let before = collect(servers, name, prefix).await;
    let lock = match Target::build(
        servers,
        name,
        prefix,
        slate_core::LockOptions::default().lease(),
    )
    .await
    {
        Ok(t) => t,
        Err(e) => {
            return exit::of_error(&e);
        }
    };
    let result = match &lock {
        Target::Single(l) => l.force_unlock().await,
        Target::Combination(l) => l.force_unlock().await,
        Target::ZooKeeper(l) => l.force_unlock().await,
    };
    // On one deployment, the name's readers (`slate run --read`) and permit holders
    // (`--permits`) are dropped too.
    let shared = match &lock {
        Target::Single(l) => force_shared(l.client(), name, prefix).await,
        Target::Combination(_) | Target::ZooKeeper(_) => Ok(0),
    };
    let result = match (result, shared) {
        (Ok(deleted), Ok(n)) => Ok(deleted + n > 0),
        (Err(e), _) | (_, Err(e)) => Err(e),
    };
    let holders: Vec<String> = before
        .map(|r| {
            let mut hs: Vec<String> = r
                .nodes
                .into_iter()
                .flat_map(|n| n.holders.into_iter().map(|h| h.holder))
                .collect();
            hs.sort();
            hs.dedup();
            hs
        })
        .unwrap_or_default();
    match result {
        Ok(true) => {
            let by = if holders.is_empty() {
                String::new()
            } else {
                format!(" (held by {})", holders.join(", "))
            };
            println!("deleted lock {name:?}{by}; its holder was not told and may still be running");
            exit::OK
        }
        Ok(false) => {
            println!("lock {name:?} was not held; nothing deleted");
            exit::OK
        }
        Err(e) => {
            eprintln!("slate: force unlock of {name:?} failed: {e}");
            exit::REDIS
        }
    }
}

/// Drops the holders of the name's read-write lock and semaphore; answers how many there
/// were.
async fn force_shared(client: &RedisClient, name: &str, prefix: &str) -> Result<u64, Error> {
    let rw = slate_redis::RwLock::builder(client, name)
        .key_prefix(prefix)
        .build()?;
    let sem = slate_redis::Semaphore::builder(client, name, 1)
        .key_prefix(prefix)
        .build()?;
    Ok(rw.force_unlock().await? + sem.force_unlock().await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorums() {
        assert_eq!(quorum(1), 1);
        assert_eq!(quorum(2), 2);
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(5), 3);
    }

    #[test]
    fn table_aligns() {
        let t = table(
            &["a".to_owned(), "bb".to_owned()],
            &[["ccc".to_owned(), "d".to_owned()]],
        );
        assert_eq!(t, "a    bb\nccc  d\n");
    }

    /// A hold passed inside its process is shown under the holder it serves now.
    #[test]
    fn a_passed_hold_is_shown_under_its_current_holder() {
        let node = |passed_to: Option<&str>| NodeStatus {
            index: 0,
            address: "127.0.0.1:6379".to_owned(),
            ok: true,
            error: None,
            holders: vec![HolderStatus {
                holder: "minted:1".to_owned(),
                count: 1,
                passed_to: passed_to.map(str::to_owned),
            }],
            ttl_ms: Some(900),
            fence: 9,
            slot: None,
            owner: None,
            eviction_policy: None,
        };
        let report = |passed_to: Option<&str>| StatusReport {
            lock: "a".to_owned(),
            prefix: "slate:".to_owned(),
            kind: "single",
            quorum: 1,
            held: true,
            holder: Some("minted:1".to_owned()),
            current_holder: Some(passed_to.unwrap_or("minted:1").to_owned()),
            nodes: vec![node(passed_to)],
            read_write: None,
            semaphore: None,
        };
        let passed = render(&report(Some("task:7")));
        assert!(
            passed.contains("held by task:7 (the hold of minted:1, passed to it"),
            "{passed}"
        );
        let plain = render(&report(None));
        assert!(plain.contains("): held by minted:1\n"), "{plain}");
    }
}
