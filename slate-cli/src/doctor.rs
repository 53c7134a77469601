//! `slate doctor`: checks a deployment for what breaks or weakens a lock's guarantees, and
//! prints a table of check, finding, consequence and fix (`--json` for scripts).
//!
//! Severities: `ok`; `advisory` (a guarantee holds, with a cost or a window worth knowing);
//! `unsafe` (something can break a guarantee: exclusion, fencing order, or the lock working
//! at all). Exit 0 without an `unsafe` finding, 1 with one, 2 on usage errors.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use serde::Serialize;

use crate::duration::human;
use crate::exit;
use crate::probe::{cluster_masters, connect, redact, sentinel_master};
use crate::target::Servers;

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Nothing to do.
    Ok,
    /// A guarantee holds, with a cost or a window worth knowing.
    Advisory,
    /// Something can break a guarantee.
    Unsafe,
}

impl Severity {
    fn word(self) -> &'static str {
        match self {
            Severity::Ok => "ok",
            Severity::Advisory => "advisory",
            Severity::Unsafe => "UNSAFE",
        }
    }
}

/// One finding (`slate doctor --json` prints an array of them; the field names are stable).
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// What was checked: `server`, `eviction`, `persistence`, `replication`, `cluster`,
    /// `sentinel`, `acl`, `latency`, `clock`, `nodes`, `zookeeper`.
    pub check: &'static str,
    /// The server (or deployment) it is about.
    pub server: String,
    /// `ok`, `advisory` or `unsafe`.
    pub severity: Severity,
    /// What was found.
    pub finding: String,
    /// What it does to the locks.
    pub consequence: String,
    /// How to fix it (empty when nothing is to be done).
    pub fix: String,
}

/// What `slate doctor` was asked.
pub struct DoctorSpec {
    /// The deployment.
    pub servers: Servers,
    /// The lock keys' prefix (the ACL probes use keys and channels under it).
    pub prefix: String,
    /// The lease the locks use (round trips and clocks are judged against it).
    pub lease: Duration,
    /// Print JSON.
    pub json: bool,
}

/// What the deployment is for: how a restart or a lagging replica matters depends on it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The one server of a single lock (or the master of a Sentinel group).
    Single,
    /// One node of a combination lock: a restart is covered by the quarantine.
    Node,
    /// A master of a Redis Cluster.
    ClusterMaster,
}

/// Runs `slate doctor`; answers the exit code.
pub async fn doctor(spec: DoctorSpec) -> u8 {
    // The lease is judged as the locks would take it: one they refuse is a usage error, not
    // something to rate.
    if let Err(e) = slate_core::LockOptions::builder().lease(spec.lease).build() {
        return crate::exit::of_error(&e);
    }
    let mut findings = Vec::new();
    match &spec.servers {
        Servers::Masters(urls) => {
            let role = if urls.len() > 1 {
                Role::Node
            } else {
                Role::Single
            };
            let mut ids = Vec::new();
            for url in urls {
                ids.push(check_server(url, role, &spec, &mut findings).await);
            }
            if urls.len() > 1 {
                check_distinct(urls, &ids, &mut findings);
            }
        }
        Servers::Sentinel { sentinels, master } => {
            check_sentinel(sentinels, master, &spec, &mut findings).await;
        }
        Servers::Cluster(seeds) => check_cluster(seeds, &spec, &mut findings).await,
        Servers::ZooKeeper(servers) => check_zookeeper(servers, &spec, &mut findings).await,
    }
    if spec.json {
        match serde_json::to_string_pretty(&findings) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("slate: cannot print the findings: {e}");
                return exit::INTERNAL;
            }
        }
    } else {
        print_table(&findings);
    }
    if findings.iter().any(|f| f.severity == Severity::Unsafe) {
        1
    } else {
        0
    }
}

fn print_table(findings: &[Finding]) {
    for f in findings {
        println!(
            "{:<8} {:<11} {}  {}",
            f.severity.word(),
            f.check,
            f.server,
            f.finding
        );
        if f.severity != Severity::Ok {
            println!("{:20} consequence: {}", "", f.consequence);
            if !f.fix.is_empty() {
                println!("{:20} fix: {}", "", f.fix);
            }
        }
    }
    let worst = findings.iter().map(|f| f.severity).max();
    let count = |s| findings.iter().filter(|f| f.severity == s).count();
    println!(
        "{}: {} unsafe, {} advisory, {} ok",
        match worst {
            Some(Severity::Unsafe) => "something can break a lock's guarantees",
            Some(Severity::Advisory) => "no finding breaks a guarantee (read the advisories)",
            _ => "nothing found that breaks or weakens a guarantee",
        },
        count(Severity::Unsafe),
        count(Severity::Advisory),
        count(Severity::Ok)
    );
}

fn finding(
    check: &'static str,
    server: &str,
    severity: Severity,
    finding: impl Into<String>,
    consequence: impl Into<String>,
    fix: impl Into<String>,
) -> Finding {
    Finding {
        check,
        server: server.to_owned(),
        severity,
        finding: finding.into(),
        consequence: consequence.into(),
        fix: fix.into(),
    }
}

async fn info(
    conn: &mut MultiplexedConnection,
    section: &str,
) -> Result<HashMap<String, String>, String> {
    let text: String = redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect())
}

/// What identifies a server, for the combination lock's distinctness check.
#[derive(Default)]
struct Identity {
    run_id: Option<String>,
    /// The replication id of its replica group (a master's own, a replica's master's).
    replid: Option<String>,
}

/// Checks one Redis server (connection, version, eviction, persistence, replication, ACL,
/// latency, clock); answers its identity.
async fn check_server(
    url: &str,
    role: Role,
    spec: &DoctorSpec,
    out: &mut Vec<Finding>,
) -> Identity {
    let name = redact(url);
    let mut conn = match connect(url).await {
        Ok(c) => c,
        Err(e) => {
            out.push(finding(
                "server",
                &name,
                Severity::Unsafe,
                format!("cannot connect: {e}"),
                "no lock can be taken or renewed here",
                "check the URL, that the server runs, and the credentials (user:password@ in the URL)",
            ));
            return Identity::default();
        }
    };
    let all = match info(&mut conn, "everything").await {
        Ok(i) => i,
        Err(e) => {
            out.push(finding(
                "server",
                &name,
                Severity::Unsafe,
                format!("INFO failed: {e}"),
                "the server cannot be checked (and Slate reads INFO to see restarts and eviction)",
                "grant the ACL user +info",
            ));
            HashMap::new()
        }
    };
    check_version(&all, role, &name, out);
    check_eviction(&all, &name, out);
    // The fsync policy is not in INFO: read where the user may (CONFIG is admin-only).
    let fsync = config_get(&mut conn, "appendfsync").await;
    // The snapshot rules decide what a restart without AOF brings back (not in INFO either).
    let save = config_get(&mut conn, "save").await;
    check_persistence(&all, fsync.as_deref(), save.as_deref(), role, &name, out);
    check_replication(&all, role, &name, out);
    check_acl(&mut conn, spec, role, &name, out).await;
    check_latency(&mut conn, spec, &name, out).await;
    Identity {
        run_id: all.get("run_id").cloned(),
        replid: all.get("master_replid").cloned(),
    }
}

fn check_version(info: &HashMap<String, String>, role: Role, name: &str, out: &mut Vec<Finding>) {
    let (kind, version) = match (info.get("valkey_version"), info.get("redis_version")) {
        (Some(v), _) => ("Valkey", v.clone()),
        (None, Some(v)) => ("Redis", v.clone()),
        (None, None) => return,
    };
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    let sharded = kind == "Valkey" || major >= 7;
    if role == Role::ClusterMaster && !sharded {
        out.push(finding(
            "server",
            name,
            Severity::Advisory,
            format!("{kind} {version}: no sharded pub/sub (SSUBSCRIBE, Redis 7)"),
            "releases are published to every node and waiters poll at the spin wait instead of \
             being woken by the release",
            "upgrade to Redis 7 or Valkey",
        ));
    } else {
        out.push(finding(
            "server",
            name,
            Severity::Ok,
            format!(
                "{kind} {version}, {} mode; WAIT{}",
                info.get("redis_mode").map_or("standalone", String::as_str),
                if sharded { ", sharded pub/sub" } else { "" }
            ),
            "",
            "",
        ));
    }
}

fn check_eviction(info: &HashMap<String, String>, name: &str, out: &mut Vec<Finding>) {
    let Some(policy) = info.get("maxmemory_policy") else {
        return;
    };
    let limit: u64 = info
        .get("maxmemory")
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if policy.eq_ignore_ascii_case("noeviction") {
        out.push(finding(
            "eviction",
            name,
            Severity::Ok,
            "maxmemory-policy noeviction",
            "",
            "",
        ));
        return;
    }
    let which = if policy.starts_with("volatile") {
        "keys with a TTL first"
    } else {
        "any key"
    };
    let fix = "CONFIG SET maxmemory-policy noeviction (and set it in the server's \
               configuration file)";
    if limit == 0 {
        out.push(finding(
            "eviction",
            name,
            Severity::Advisory,
            format!("maxmemory-policy {policy} with no maxmemory set"),
            format!(
                "nothing is evicted while there is no limit; once one is set it evicts {which}, \
                 and every lock key has a TTL"
            ),
            fix,
        ));
    } else {
        out.push(finding(
            "eviction",
            name,
            Severity::Unsafe,
            format!("maxmemory-policy {policy} (maxmemory {limit} bytes)"),
            format!(
                "at maxmemory the server evicts {which}: every lock key has a TTL, so a held \
                 lock can vanish and be granted to another holder while the first still works"
            ),
            fix,
        ));
    }
}

/// One server setting by `CONFIG GET` (`None` when this user may not run it: CONFIG is
/// admin-only).
async fn config_get(conn: &mut MultiplexedConnection, setting: &str) -> Option<String> {
    redis::cmd("CONFIG")
        .arg("GET")
        .arg(setting)
        .query_async::<Vec<String>>(conn)
        .await
        .ok()
        .and_then(|v| v.into_iter().nth(1))
}

/// `save`: the RDB snapshot rules (`""`: none), `None` when unknown.
fn check_persistence(
    info: &HashMap<String, String>,
    fsync: Option<&str>,
    save: Option<&str>,
    role: Role,
    name: &str,
    out: &mut Vec<Finding>,
) {
    if info.get("role").is_some_and(|r| r == "slave") {
        return;
    }
    let aof = info.get("aof_enabled").is_some_and(|v| v == "1");
    if role == Role::Node {
        // The combination lock quarantines a node that restarted without its data.
        out.push(finding(
            "persistence",
            name,
            Severity::Ok,
            format!(
                "{}; a restart that loses data is quarantined by the combination lock",
                if aof { "AOF on" } else { "no AOF" }
            ),
            "",
            "",
        ));
        return;
    }
    if aof && fsync == Some("always") {
        out.push(finding(
            "persistence",
            name,
            Severity::Ok,
            "AOF on, appendfsync always: a restart loses no lock",
            "",
            "",
        ));
    } else if aof {
        out.push(finding(
            "persistence",
            name,
            Severity::Advisory,
            match fsync {
                Some(policy) => format!("AOF on, appendfsync {policy}"),
                None => "AOF on (the fsync policy needs CONFIG GET, which this user may not run)"
                    .to_owned(),
            },
            "with appendfsync everysec (or no) a crash, not a clean shutdown, loses the last \
             second (or more) of writes: a lock granted then can be granted again after the \
             restart (fencing tokens keep increasing: clients raise the counters past the lost \
             second's tokens when they see the restart); with always, nothing is lost",
            "CONFIG SET appendfsync always where a crash must not reopen a lock",
        ));
    } else {
        let lost = "a held lock can be granted to another holder while the first still works, \
                    until its next renewal sees the entry gone";
        let (what, consequence) = match save.map(str::trim) {
            Some("") => (
                "no AOF, no RDB snapshots".to_owned(),
                format!(
                    "a restart loses every lock: {lost}; the fencing counters are lost with \
                     them and start again from the server clock, so tokens keep increasing \
                     (unless the clock stepped back)"
                ),
            ),
            Some(rules) => (
                format!("no AOF; RDB snapshots (save {rules})"),
                format!(
                    "a restart (other than a clean shutdown, which saves) brings back the last \
                     snapshot: the locks taken since are lost ({lost}); the fencing counters \
                     come back older too, and clients raise each to the server clock at their \
                     next grant there, so tokens keep increasing (unless the clock stepped \
                     back)"
                ),
            ),
            None => (
                "no AOF (the snapshot rules need CONFIG GET, which this user may not run)"
                    .to_owned(),
                format!(
                    "a restart loses the locks taken since the last RDB snapshot, if snapshots \
                     are configured, and otherwise every lock: {lost} (fencing tokens keep \
                     increasing: clients raise older or lost counters to the server clock)"
                ),
            ),
        };
        out.push(finding(
            "persistence",
            name,
            Severity::Unsafe,
            what,
            consequence,
            "CONFIG SET appendonly yes and appendfsync always (and in the configuration file), \
             or use a combination lock over independent servers (--redis A --redis B --redis C), \
             which quarantines a server that restarted",
        ));
    }
}

fn check_replication(
    info: &HashMap<String, String>,
    role: Role,
    name: &str,
    out: &mut Vec<Finding>,
) {
    if info.get("role").is_some_and(|r| r == "slave") {
        out.push(finding(
            "replication",
            name,
            Severity::Unsafe,
            "this server is a replica",
            "a lock taken here is refused (READONLY) or, on a writable replica, lost at the next \
             sync",
            "point Slate at the master (or at the Sentinels with --sentinel)",
        ));
        return;
    }
    let replicas: usize = info
        .get("connected_slaves")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    let failover = role != Role::Node;
    let mut worst: Option<(String, u64)> = None;
    for i in 0..replicas {
        let Some(line) = info.get(&format!("slave{i}")) else {
            continue;
        };
        let fields: HashMap<&str, &str> = line
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .collect();
        let lag: u64 = fields.get("lag").and_then(|l| l.parse().ok()).unwrap_or(0);
        let state = fields.get("state").copied().unwrap_or("?");
        let at = format!(
            "{}:{}",
            fields.get("ip").unwrap_or(&"?"),
            fields.get("port").unwrap_or(&"?")
        );
        if state != "online" || lag >= 2 {
            let lag = if state == "online" { lag } else { u64::MAX };
            if worst.as_ref().is_none_or(|(_, l)| lag > *l) {
                worst = Some((
                    format!("{at} ({state}, lag {lag} s)")
                        .replace(&format!("lag {} s", u64::MAX), "not in sync"),
                    lag,
                ));
            }
        }
    }
    match worst {
        Some((which, _)) if failover => out.push(finding(
            "replication",
            name,
            Severity::Unsafe,
            format!("replica {which} behind the master"),
            "a failover to it loses the grants it has not received: a held lock can be granted \
             again (unless the client waits for replicas: ClientOptionsBuilder::synced_replicas)",
            "find why the replica lags (a paused or overloaded host, the network); use \
             synced_replicas so that grants wait for a replica",
        )),
        Some((which, _)) => out.push(finding(
            "replication",
            name,
            Severity::Advisory,
            format!("replica {which} behind the master"),
            "no effect on this node's locks (a combination lock does not fail over)",
            "",
        )),
        None if replicas == 0 && role == Role::Single => out.push(finding(
            "replication",
            name,
            Severity::Advisory,
            "no replica",
            "the server is the lock's only copy: while it is down no lock can be taken",
            "a Sentinel group (--sentinel) or a combination lock over independent servers",
        )),
        None => out.push(finding(
            "replication",
            name,
            Severity::Ok,
            format!("{replicas} replica(s) in sync"),
            "",
            "",
        )),
    }
}

/// The commands Slate sends (outside and inside its scripts, where ACLs apply as well),
/// probed one by one on keys and a channel under the prefix.
async fn check_acl(
    conn: &mut MultiplexedConnection,
    spec: &DoctorSpec,
    role: Role,
    name: &str,
    out: &mut Vec<Finding>,
) {
    let key = format!("{}doctor:{}", spec.prefix, std::process::id());
    let z = format!("{key}:z");
    let channel = format!("{}doctor", spec.prefix);
    let mut probes: Vec<(&str, Vec<String>)> = vec![
        ("PING", vec![]),
        (
            "EVALSHA",
            vec![
                "0000000000000000000000000000000000000000".into(),
                "0".into(),
            ],
        ),
        (
            "SCRIPT",
            vec![
                "EXISTS".into(),
                "0000000000000000000000000000000000000000".into(),
            ],
        ),
        ("TIME", vec![]),
        (
            "SET",
            vec![key.clone(), "1".into(), "PX".into(), "10000".into()],
        ),
        ("GET", vec![key.clone()]),
        ("PEXPIRE", vec![key.clone(), "10000".into()]),
        ("PTTL", vec![key.clone()]),
        ("EXISTS", vec![key.clone()]),
        // Every key gets a TTL at once: a user that may not DEL leaves nothing for long.
        (
            "SET",
            vec![format!("{key}:n"), "0".into(), "PX".into(), "10000".into()],
        ),
        ("INCR", vec![format!("{key}:n")]),
        ("INCRBY", vec![format!("{key}:n"), "1".into()]),
        ("HSET", vec![format!("{key}:h"), "f".into(), "1".into()]),
        ("PEXPIRE", vec![format!("{key}:h"), "10000".into()]),
        ("HGET", vec![format!("{key}:h"), "f".into()]),
        ("HMGET", vec![format!("{key}:h"), "f".into()]),
        ("HGETALL", vec![format!("{key}:h")]),
        ("HINCRBY", vec![format!("{key}:h"), "f".into(), "1".into()]),
        ("HDEL", vec![format!("{key}:h"), "f".into()]),
        ("ZADD", vec![z.clone(), "1".into(), "m".into()]),
        ("PEXPIRE", vec![z.clone(), "10000".into()]),
        ("ZSCORE", vec![z.clone(), "m".into()]),
        ("ZCARD", vec![z.clone()]),
        ("ZRANGE", vec![z.clone(), "0".into(), "-1".into()]),
        ("ZRANGEBYSCORE", vec![z.clone(), "0".into(), "1".into()]),
        ("ZREMRANGEBYSCORE", vec![z.clone(), "2".into(), "3".into()]),
        ("ZREM", vec![z.clone(), "m".into()]),
        ("PUBLISH", vec![channel.clone(), "doctor".into()]),
    ];
    if role == Role::ClusterMaster {
        probes.push(("SPUBLISH", vec![channel.clone(), "doctor".into()]));
    }
    probes.push((
        "DEL",
        vec![
            key.clone(),
            format!("{key}:n"),
            format!("{key}:h"),
            z.clone(),
        ],
    ));
    let mut missing = Vec::new();
    for (cmd, args) in &probes {
        let mut c = redis::cmd(cmd);
        for a in args {
            c.arg(a);
        }
        let r: redis::RedisResult<redis::Value> = c.query_async(conn).await;
        if let Err(e) = r
            && (e.code() == Some("NOPERM") || e.to_string().contains("NOPERM"))
            && !missing.contains(cmd)
        {
            missing.push(*cmd);
        }
    }
    if missing.is_empty() {
        out.push(finding(
            "acl",
            name,
            Severity::Ok,
            format!(
                "the user may run every command Slate sends, on {}*",
                spec.prefix
            ),
            "",
            "",
        ));
    } else {
        out.push(finding(
            "acl",
            name,
            Severity::Unsafe,
            format!("the user may not run {}", missing.join(", ")),
            "the lock scripts fail with NOPERM (acquire, release or renewal: a renewal that \
             cannot run loses every lease)",
            format!(
                "ACL SETUSER <user> +{} (on ~{p}* and &{p}*; README: ACL)",
                missing.join(" +").to_lowercase(),
                p = spec.prefix
            ),
        ));
    }
}

async fn check_latency(
    conn: &mut MultiplexedConnection,
    spec: &DoctorSpec,
    name: &str,
    out: &mut Vec<Finding>,
) {
    // The server clock: `TIME` against this machine's clock at the round trip's middle.
    let wall = SystemTime::now();
    let sent = Instant::now();
    let time: redis::RedisResult<(u64, u64)> = redis::cmd("TIME").query_async(conn).await;
    let offset = time.ok().map(|(secs, micros)| {
        let mid = wall
            .checked_add(sent.elapsed() / 2)
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        let server = secs.saturating_mul(1_000_000).saturating_add(micros);
        #[allow(clippy::cast_possible_wrap)]
        let off = server as i64 - mid as i64;
        off
    });
    // The round trip: nine PINGs.
    let mut rtts = Vec::new();
    for _ in 0..9 {
        let sent = Instant::now();
        if redis::cmd("PING").query_async::<String>(conn).await.is_ok() {
            rtts.push(sent.elapsed());
        }
    }
    rtts.sort();
    if let Some(worst) = rtts.last() {
        let median = rtts[rtts.len() / 2];
        let share = worst.as_secs_f64() / spec.lease.as_secs_f64();
        out.push(finding(
            "latency",
            name,
            if share > 0.1 {
                Severity::Advisory
            } else {
                Severity::Ok
            },
            format!(
                "round trip median {}, worst {} of 9 (lease {})",
                human(median),
                human(*worst),
                human(spec.lease)
            ),
            "a round trip above a tenth of the lease eats the holder's safety margin: the \
             lease is counted from the send",
            "a longer lease (--lease), or a server closer to the clients",
        ));
    }
    if let Some(off) = offset {
        let abs = Duration::from_micros(off.unsigned_abs());
        out.push(finding(
            "clock",
            name,
            if abs > Duration::from_secs(1) {
                Severity::Advisory
            } else {
                Severity::Ok
            },
            format!(
                "server clock {} {} this machine's",
                human(abs),
                if off >= 0 { "ahead of" } else { "behind" }
            ),
            "leases run on the server's monotonic expiry and Slate's own clock, not on the wall \
             clock; a fencing counter lost in a restart restarts from the server's clock, so a \
             server clock stepped back by more than the time since the last token can repeat \
             tokens",
            "keep the server's clock synchronised (NTP) and never step it back",
        ));
    }
}

/// A combination lock's nodes must be independent servers: the same server (run id) or the
/// same replica group (replication id) listed twice makes one failure count twice.
fn check_distinct(urls: &[String], ids: &[Identity], out: &mut Vec<Finding>) {
    let mut same = Vec::new();
    for i in 0..ids.len() {
        for j in i + 1..ids.len() {
            let eq = |a: &Option<String>, b: &Option<String>| a.is_some() && a == b;
            if eq(&ids[i].run_id, &ids[j].run_id) {
                same.push(format!(
                    "{} and {} are one server",
                    redact(&urls[i]),
                    redact(&urls[j])
                ));
            } else if eq(&ids[i].replid, &ids[j].replid) {
                same.push(format!(
                    "{} and {} are one replica group",
                    redact(&urls[i]),
                    redact(&urls[j])
                ));
            }
        }
    }
    let all = urls
        .iter()
        .map(|u| redact(u))
        .collect::<Vec<_>>()
        .join(", ");
    if same.is_empty() {
        out.push(finding(
            "nodes",
            &all,
            Severity::Ok,
            format!("{} independent servers", urls.len()),
            "",
            "",
        ));
    } else {
        out.push(finding(
            "nodes",
            &all,
            Severity::Unsafe,
            same.join("; "),
            "the quorum counts one server's (or one group's) answer more than once: its failure \
             or data loss is several nodes' at once",
            "list independent servers, each once (not a master and its replica)",
        ));
    }
}

async fn check_sentinel(
    sentinels: &[String],
    master: &str,
    spec: &DoctorSpec,
    out: &mut Vec<Finding>,
) {
    let mut addr = None;
    let mut known = 0usize;
    for url in sentinels {
        let mut conn = match connect(url).await {
            Ok(c) => c,
            Err(e) => {
                out.push(finding(
                    "sentinel",
                    &redact(url),
                    Severity::Advisory,
                    format!("cannot connect: {e}"),
                    "one Sentinel fewer to find the master and to agree on a failover",
                    "check the URL and that the Sentinel runs",
                ));
                continue;
            }
        };
        match sentinel_master(&mut conn, url, master).await {
            Ok(Some(at)) => {
                addr.get_or_insert(at);
                let peers: redis::RedisResult<Vec<redis::Value>> = redis::cmd("SENTINEL")
                    .arg("sentinels")
                    .arg(master)
                    .query_async(&mut conn)
                    .await;
                known = known.max(peers.map_or(0, |p| p.len()) + 1);
            }
            Ok(None) | Err(_) => out.push(finding(
                "sentinel",
                &redact(url),
                Severity::Unsafe,
                format!("does not know a master named {master:?}"),
                "the lock cannot find its master through this Sentinel",
                "check --master-name against `sentinel monitor <name>` in the Sentinels' configuration",
            )),
        }
    }
    let Some(url) = addr else {
        out.push(finding(
            "sentinel",
            &sentinels.join(","),
            Severity::Unsafe,
            format!("no Sentinel names the master {master:?}"),
            "no lock can be taken",
            "check the Sentinels' URLs and --master-name",
        ));
        return;
    };
    out.push(finding(
        "sentinel",
        &format!("{master} via {} Sentinel(s)", sentinels.len()),
        if known >= 3 {
            Severity::Ok
        } else {
            Severity::Advisory
        },
        format!("master at {}; {known} Sentinel(s) monitor it", redact(&url)),
        "fewer than three Sentinels cannot outvote a partitioned one: a failover may not \
         happen, or may happen on a minority's word",
        "run three or more Sentinels on separate hosts",
    ));
    check_server(&url, Role::Single, spec, out).await;
}

async fn check_cluster(seeds: &[String], spec: &DoctorSpec, out: &mut Vec<Finding>) {
    let mut reached = None;
    for url in seeds {
        if let Ok(c) = connect(url).await {
            reached = Some((url.clone(), c));
            break;
        }
    }
    let Some((seed, mut conn)) = reached else {
        out.push(finding(
            "cluster",
            &seeds.join(","),
            Severity::Unsafe,
            "no seed node answers",
            "no lock can be taken",
            "check the --cluster URLs and that the nodes run",
        ));
        return;
    };
    let state: redis::RedisResult<String> = redis::cmd("CLUSTER")
        .arg("INFO")
        .query_async(&mut conn)
        .await;
    let state: HashMap<String, String> = state
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let ok = state.get("cluster_state").is_some_and(|s| s == "ok");
    let assigned = state.get("cluster_slots_ok").cloned().unwrap_or_default();
    out.push(finding(
        "cluster",
        &redact(&seed),
        if ok { Severity::Ok } else { Severity::Unsafe },
        format!(
            "cluster_state {}, {} of 16384 slots served",
            state.get("cluster_state").map_or("?", String::as_str),
            if assigned.is_empty() { "?" } else { &assigned }
        ),
        "locks whose slot is not served cannot be taken or renewed",
        "fix the cluster (redis-cli --cluster check / fix)",
    ));
    for master in cluster_masters(&mut conn, &seed).await.unwrap_or_default() {
        check_server(&master, Role::ClusterMaster, spec, out).await;
    }
}

async fn check_zookeeper(servers: &str, spec: &DoctorSpec, out: &mut Vec<Finding>) {
    let count = servers
        .split('/')
        .next()
        .unwrap_or(servers)
        .split(',')
        .count();
    match slate_zookeeper::ZkClient::builder(servers).connect().await {
        Ok(client) => {
            let timeout = client.session_timeout();
            out.push(finding(
                "zookeeper",
                servers,
                if timeout > spec.lease {
                    Severity::Advisory
                } else {
                    Severity::Ok
                },
                format!(
                    "session established; negotiated session timeout {}",
                    human(timeout)
                ),
                "the session is the ZooKeeper lock's lease: a holder cut off learns of its loss \
                 only when the session times out",
                "a shorter session timeout (ZkClientBuilder::session_timeout, within the \
                 server's minSessionTimeout..maxSessionTimeout)",
            ));
        }
        Err(e) => out.push(finding(
            "zookeeper",
            servers,
            Severity::Unsafe,
            format!("cannot open a session: {e}"),
            "no lock can be taken",
            "check the connection string and that the ensemble runs",
        )),
    }
    out.push(finding(
        "zookeeper",
        servers,
        if count >= 3 {
            Severity::Ok
        } else {
            Severity::Advisory
        },
        format!("{count} server(s) in the connection string"),
        "fewer than three servers cannot survive one failure: the locks stop while it is down",
        "an ensemble of three or five servers",
    ));
}
