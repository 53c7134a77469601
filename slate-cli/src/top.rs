//! `slate top`: the locks under a prefix, refreshed each second (a terminal view), or one
//! snapshot (`--once`, `--json`).
//!
//! What it costs the server, per refresh and per master: the lock names come from `SCAN
//! MATCH <prefix>{*} COUNT 1000`, at most `--scan-limit` keys examined (10,000 by default: ten
//! `SCAN` calls), or from the names given (no `SCAN` at all); then one pipeline of `HGETALL`,
//! `PTTL` and `ZCARD` per lock shown (`--limit`, 30 by default). A server with millions of lock
//! keys is therefore never walked whole; the view says when the cap cut the walk short. On
//! ZooKeeper only the names given are read (one listing and one read per contender each).

use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use serde::Serialize;

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

/// One lock in a snapshot (`slate top --json`; the field names are stable).
#[derive(Clone, Debug, Serialize)]
pub struct LockRow {
    /// The lock's name.
    pub name: String,
    /// The holder (the one most nodes agree on), `null` when free.
    pub holder: Option<String>,
    /// The holder's re-entry count.
    pub depth: u32,
    /// The holder's fencing token.
    pub token: Option<u64>,
    /// What is left of the lease, in ms (the least over the nodes that hold it).
    pub ttl_ms: Option<u64>,
    /// Processes waiting in the lock's line (the most over the nodes).
    pub waiting: u64,
    /// Nodes the holder holds (1 for a single lock).
    pub nodes_held: usize,
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
    /// Keys `SCAN` examined over the masters.
    pub scanned: u64,
    /// Whether a master's walk stopped at `--scan-limit` before the end.
    pub truncated: bool,
    /// Locks found beyond `--limit` (not shown).
    pub hidden: usize,
    /// Masters that could not be read, with the error.
    pub errors: Vec<String>,
    /// The wait figures of `--metrics`, when given.
    pub waits: Option<Vec<WaitRow>>,
    /// Why `--metrics` could not be read, when it could not.
    pub metrics_error: Option<String>,
}

/// Runs `slate top`; answers the exit code.
pub async fn top(spec: TopSpec) -> u8 {
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
            for seed in seeds {
                if let Ok(mut c) = connect(seed).await
                    && let Ok(masters) = cluster_masters(&mut c, seed).await
                {
                    return Ok(masters);
                }
            }
            Err((exit::REDIS, "no cluster seed node answers".to_owned()))
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

/// The names under `prefix` on one master: at most `limit` keys examined.
async fn scan(
    conn: &mut MultiplexedConnection,
    prefix: &str,
    limit: u64,
) -> Result<(Vec<String>, u64, bool), String> {
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
            // The lock hash is exactly `<prefix>{<name>}`; its queue, turn and records add a
            // suffix after the brace.
            if let Some(name) = key
                .strip_prefix(prefix.as_bytes())
                .and_then(|k| k.strip_prefix(b"{"))
                .and_then(|k| k.strip_suffix(b"}"))
            {
                names.push(String::from_utf8_lossy(name).into_owned());
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
}

async fn read_locks(
    conn: &mut MultiplexedConnection,
    prefix: &str,
    names: &[String],
) -> Result<Vec<Entry>, String> {
    let mut pipe = redis::pipe();
    for name in names {
        let key = format!("{prefix}{{{name}}}");
        pipe.cmd("HGETALL").arg(&key);
        pipe.cmd("PTTL").arg(&key);
        pipe.cmd("ZCARD").arg(format!("{key}:queue"));
    }
    let replies: Vec<redis::Value> = pipe.query_async(conn).await.map_err(|e| e.to_string())?;
    let mut out = Vec::with_capacity(names.len());
    for chunk in replies.chunks(3) {
        let fields: HashMap<String, String> =
            redis::from_redis_value_ref(&chunk[0]).unwrap_or_default();
        let ttl: i64 = redis::from_redis_value_ref(&chunk[1]).unwrap_or(-2);
        let waiting: u64 = redis::from_redis_value_ref(&chunk[2]).unwrap_or(0);
        // Holder ids always contain ':' (the lock's own fields never do).
        let holder = fields
            .iter()
            .find(|(k, _)| k.contains(':'))
            .map(|(k, v)| (k.clone(), v.parse().unwrap_or(1)));
        out.push(Entry {
            token: fields.get("t").and_then(|t| t.parse().ok()),
            ttl_ms: u64::try_from(ttl).ok().filter(|_| holder.is_some()),
            holder,
            waiting,
        });
    }
    Ok(out)
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
    let mut names: Vec<String> = spec.names.clone();
    if names.is_empty() {
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
    // Per name, each node's entry (a name lives on one master of a cluster: the others
    // answer an empty entry).
    let mut per_name: BTreeMap<String, Vec<Entry>> = BTreeMap::new();
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
    let mut locks: Vec<LockRow> = per_name
        .into_iter()
        .map(|(name, entries)| combine(name, &entries))
        .filter(|r| !spec.names.is_empty() || r.holder.is_some() || r.waiting > 0)
        .collect();
    locks.sort_by(|a, b| {
        b.waiting
            .cmp(&a.waiting)
            .then(b.holder.is_some().cmp(&a.holder.is_some()))
            .then(a.name.cmp(&b.name))
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

/// One row from the nodes' entries: the holder most nodes name.
fn combine(name: String, entries: &[Entry]) -> LockRow {
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
        holder: holder.map(|(h, _)| h),
        name,
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

/// The snapshot's rows as table cells.
fn lock_cells(snap: &Snapshot) -> Vec<[String; 6]> {
    snap.locks
        .iter()
        .map(|l| {
            [
                l.name.clone(),
                l.holder.clone().map_or_else(
                    || "(free)".to_owned(),
                    |h| {
                        if l.depth > 1 {
                            format!("{h} x{}", l.depth)
                        } else {
                            h
                        }
                    },
                ),
                l.token.map_or_else(|| "-".to_owned(), |t| t.to_string()),
                ms(l.ttl_ms),
                l.waiting.to_string(),
                l.nodes_held.to_string(),
            ]
        })
        .collect()
}

const HEADER: [&str; 6] = ["LOCK", "HOLDER", "TOKEN", "LEASE LEFT", "WAITING", "NODES"];

fn footer(snap: &Snapshot) -> Vec<String> {
    let mut lines = Vec::new();
    lines.push(format!(
        "{} lock(s) held or waited for under {:?}{}; {} key(s) scanned{}",
        snap.locks.len() + snap.hidden,
        snap.prefix,
        if snap.hidden > 0 {
            format!(" ({} not shown: --limit)", snap.hidden)
        } else {
            String::new()
        },
        snap.scanned,
        if snap.truncated {
            " (cut short at --scan-limit: name the locks, or raise it)"
        } else {
            ""
        }
    ));
    for e in &snap.errors {
        lines.push(format!("error: {e}"));
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
    fn prefixes_are_escaped_for_scan() {
        assert_eq!(glob_escape("slate:"), "slate:");
        assert_eq!(glob_escape("a*b?[c]"), "a\\*b\\?\\[c\\]");
    }
}
