//! `slate status` and `slate unlock --force` on the ZooKeeper lock (`--zookeeper`).

use std::time::Duration;

use serde::Serialize;
use slate_core::Error;
use slate_zookeeper::{ZkContender, ZkLock, ZkStatus};

use crate::exit;
use crate::target::{zk_client, zk_root};

/// `slate status --zookeeper … --json` output. Field names are stable (scripts rely on them).
#[derive(Debug, Serialize)]
pub struct ZkReport {
    /// Lock name.
    pub lock: String,
    /// The lock's directory (`<root>/<encoded name>`).
    pub path: String,
    /// Always `"zookeeper"`.
    pub kind: &'static str,
    /// Whether a contender holds it.
    pub held: bool,
    /// The holder: the lowest contender.
    pub holder: Option<ContenderReport>,
    /// The waiting processes, in the order they will hold it.
    pub waiters: Vec<ContenderReport>,
}

/// One contender znode.
#[derive(Debug, Serialize)]
pub struct ContenderReport {
    /// Holder id (the record in the znode).
    pub holder: Option<String>,
    /// Its fencing token (the znode's creation zxid).
    pub token: u64,
    /// Its process id and host.
    pub pid: Option<u32>,
    /// Host of that process.
    pub host: Option<String>,
    /// The owning session (hex).
    pub session: String,
    /// That session's timeout in ms: the longest the znode outlives its process.
    pub session_timeout_ms: Option<u64>,
    /// The znode's path.
    pub znode: String,
}

impl From<ZkContender> for ContenderReport {
    fn from(c: ZkContender) -> Self {
        ContenderReport {
            holder: c.holder.map(|h| h.to_string()),
            token: c.token.get(),
            pid: c.pid,
            host: c.host,
            session: format!("{:#x}", c.session),
            session_timeout_ms: c
                .session_timeout
                .map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            znode: c.znode,
        }
    }
}

async fn lock(servers: &str, name: &str, prefix: &str) -> Result<ZkLock, Error> {
    let client = zk_client(servers, Duration::from_secs(10)).await?;
    ZkLock::builder(&client, name).root(zk_root(prefix)).build()
}

fn report(name: &str, lock: &ZkLock, s: ZkStatus) -> ZkReport {
    ZkReport {
        lock: name.to_owned(),
        path: lock.path().to_owned(),
        kind: "zookeeper",
        held: s.holder.is_some(),
        holder: s.holder.map(Into::into),
        waiters: s.waiters.into_iter().map(Into::into).collect(),
    }
}

/// Renders the report as a table.
#[must_use]
pub fn render(r: &ZkReport) -> String {
    let mut out = format!("lock {:?} (ZooKeeper {})\n", r.lock, r.path);
    let row = |role: &str, c: &ContenderReport| {
        [
            role.to_owned(),
            c.holder.clone().unwrap_or_else(|| "?".into()),
            c.token.to_string(),
            match (&c.host, c.pid) {
                (Some(h), Some(p)) => format!("{h}:{p}"),
                _ => "?".into(),
            },
            c.session.clone(),
            c.session_timeout_ms
                .map_or_else(|| "?".into(), |t| format!("{t} ms")),
        ]
    };
    let mut rows = Vec::new();
    if let Some(h) = &r.holder {
        rows.push(row("holder", h));
    }
    for (i, w) in r.waiters.iter().enumerate() {
        rows.push(row(&format!("waiter {}", i + 1), w));
    }
    if rows.is_empty() {
        out.push_str("free: no holder, nobody waiting\n");
        return out;
    }
    let header = [
        "role",
        "holder",
        "token",
        "process",
        "session",
        "session timeout",
    ]
    .map(str::to_owned);
    out.push_str(&crate::status::table(&header, &rows));
    out
}

/// `slate status NAME --zookeeper …`: exit 0 when the ensemble answered, 69 otherwise.
pub async fn status(servers: &str, name: &str, prefix: &str, json: bool) -> u8 {
    let lock = match lock(servers, name, prefix).await {
        Ok(l) => l,
        Err(e) => return fail(&e),
    };
    let s = match lock.status().await {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    let r = report(name, &lock, s);
    if json {
        match serde_json::to_string_pretty(&r) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("slate: cannot encode the status: {e}");
                return exit::INTERNAL;
            }
        }
    } else {
        print!("{}", render(&r));
    }
    exit::OK
}

/// `slate unlock --force NAME --zookeeper …`: deletes the holder's znode.
pub async fn unlock(servers: &str, name: &str, prefix: &str) -> u8 {
    let lock = match lock(servers, name, prefix).await {
        Ok(l) => l,
        Err(e) => return fail(&e),
    };
    let holder = lock
        .status()
        .await
        .ok()
        .and_then(|s| s.holder)
        .and_then(|h| h.holder);
    match lock.force_unlock().await {
        Ok(n) if n > 0 => {
            let by = holder.map_or_else(String::new, |h| format!(" (held by {h})"));
            println!("deleted lock {name:?}{by}; its holder was not told and may still be running");
            exit::OK
        }
        Ok(_) => {
            println!("lock {name:?} was not held; nothing deleted");
            exit::OK
        }
        Err(e) => {
            eprintln!("slate: force unlock of {name:?} failed: {e}");
            exit::REDIS
        }
    }
}

fn fail(e: &Error) -> u8 {
    exit::of_error(e)
}
