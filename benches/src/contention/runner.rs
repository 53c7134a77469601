//! The orchestrating side: servers, interleaved runs, the table and the JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use ecosphere::cluster::RedisCluster;
use ecosphere::server::{RedisServer, ServerKind};
use ecosphere::workers::WorkerSet;
use ecosphere::zookeeper::{ZkServer, four_letter};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::stats::Spread;
use super::{
    Impl, RunResult, Shape, WorkerReport, parse_commandstats, parse_commandstats_usec, summarise,
};

/// What to run.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Implementations, interleaved in this order.
    pub impls: Vec<Impl>,
    /// Shapes.
    pub shapes: Vec<Shape>,
    /// Load per run.
    pub duration: Duration,
    /// Repetitions of the whole interleaved sequence.
    pub repeat: usize,
    /// The worker binary (this program, re-run with the `worker` subcommand).
    pub worker_exe: PathBuf,
    /// Show a progress bar.
    pub progress: bool,
    /// Lock names the tasks take in turn.
    pub locks: usize,
    /// The servers to run on (Redis, Valkey), interleaved like the implementations.
    pub servers: Vec<ServerKind>,
    /// Percent of the critical sections that only read (see `WorkerArgs::read_percent`).
    pub read_percent: u8,
    /// Names each acquisition takes together (see `WorkerArgs::set_size`).
    pub set_size: usize,
}

/// The servers of a session: three lock nodes, one resource server, and a 3-master Redis
/// Cluster when a plan includes `slate-cluster`.
pub struct Servers {
    /// What the nodes run (`Redis 7.0.15`).
    pub label: String,
    /// Lock nodes.
    pub nodes: Vec<RedisServer>,
    /// The resource server holding the counter.
    pub resource: RedisServer,
    /// The cluster (3 masters, no replicas).
    pub cluster: Option<RedisCluster>,
    /// A standalone ZooKeeper server, when a plan includes `slate-zk`.
    pub zookeeper: Option<ZkServer>,
}

impl Servers {
    /// Starts them.
    ///
    /// # Errors
    ///
    /// Harness failures (e.g. no `redis-server`).
    pub fn start(
        kind: ServerKind,
        with_cluster: bool,
        with_zookeeper: bool,
    ) -> Result<Servers, String> {
        let builder = RedisServer::builder().binary(kind.locate().map_err(|e| e.to_string())?);
        let mut all = RedisServer::start_many_with(4, &builder).map_err(|e| e.to_string())?;
        let resource = all.pop().ok_or("no resource server")?;
        let cluster = if with_cluster {
            Some(RedisCluster::start_with(3, 0, &builder).map_err(|e| e.to_string())?)
        } else {
            None
        };
        let zookeeper = if with_zookeeper {
            Some(ZkServer::start().map_err(|e| e.to_string())?)
        } else {
            None
        };
        Ok(Servers {
            label: resource.version().to_string(),
            nodes: all,
            resource,
            cluster,
            zookeeper,
        })
    }

    /// The lock nodes of `which`: the cluster's masters for `slate-cluster`.
    fn lock_nodes(&self, which: Impl) -> Vec<&RedisServer> {
        match (which, &self.cluster) {
            (Impl::SlateCluster, Some(c)) => (0..c.len()).map(|i| c.node(i)).collect(),
            (which, _) if which.on_zookeeper() => Vec::new(),
            _ => self.nodes[..which.nodes()].iter().collect(),
        }
    }

    fn reset(&self) -> Result<(), String> {
        let cluster = self
            .cluster
            .iter()
            .flat_map(|c| (0..c.len()).map(|i| c.node(i)));
        for s in self.nodes.iter().chain(cluster).chain([&self.resource]) {
            s.command(&["FLUSHALL"]).map_err(|e| e.to_string())?;
            s.command(&["CONFIG", "RESETSTAT"])
                .map_err(|e| e.to_string())?;
        }
        if let Some(zk) = &self.zookeeper {
            four_letter(zk.port(), "srst").map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// The ZooKeeper server's requests since the last reset (`mntr`), as a one-entry map.
    fn zk_requests(&self) -> Result<BTreeMap<String, u64>, String> {
        let zk = self.zookeeper.as_ref().ok_or("no ZooKeeper server")?;
        let mntr = four_letter(zk.port(), "mntr").map_err(|e| e.to_string())?;
        let received = mntr
            .lines()
            .find_map(|l| l.strip_prefix("zk_packets_received"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or("mntr has no zk_packets_received")?;
        Ok(BTreeMap::from([("zk_requests".to_owned(), received)]))
    }

    /// The ZooKeeper JVM's CPU so far (`/proc/<pid>/stat` utime + stime), µs.
    fn zk_cpu_us(&self) -> Result<f64, String> {
        let zk = self.zookeeper.as_ref().ok_or("no ZooKeeper server")?;
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", zk.pid()))
            .map_err(|e| e.to_string())?;
        let fields: Vec<&str> = stat
            .rsplit_once(") ")
            .map(|(_, rest)| rest.split(' ').collect())
            .unwrap_or_default();
        // After the command name: state is field 3, utime 14 and stime 15 (1-based).
        let ticks = |i: usize| fields.get(i - 3).and_then(|v| v.parse::<f64>().ok());
        let (Some(user), Some(sys)) = (ticks(14), ticks(15)) else {
            return Err("cannot read the ZooKeeper server's CPU".to_owned());
        };
        // `/proc` counts in USER_HZ clock ticks, 100 per second on Linux (every architecture
        // the harness runs on).
        Ok((user + sys) * 1e6 / 100.0)
    }

    fn commandstats(&self, which: Impl) -> Result<BTreeMap<String, u64>, String> {
        if which.on_zookeeper() {
            return self.zk_requests();
        }
        self.commandstats_summed(which, parse_commandstats)
    }

    /// Per-command microseconds, summed over the lock nodes (none on ZooKeeper).
    fn commandstats_usec(&self, which: Impl) -> Result<BTreeMap<String, u64>, String> {
        if which.on_zookeeper() {
            return Ok(BTreeMap::new());
        }
        self.commandstats_summed(which, parse_commandstats_usec)
    }

    fn commandstats_summed(
        &self,
        which: Impl,
        parse: fn(&str) -> BTreeMap<String, u64>,
    ) -> Result<BTreeMap<String, u64>, String> {
        let mut total = BTreeMap::new();
        for s in self.lock_nodes(which) {
            let v = s
                .command(&["INFO", "commandstats"])
                .map_err(|e| e.to_string())?;
            let text: String = redis::from_redis_value(v).map_err(|e| e.to_string())?;
            for (k, c) in parse(&text) {
                *total.entry(k).or_insert(0) += c;
            }
        }
        Ok(total)
    }

    /// The lock nodes' own CPU so far (`used_cpu_sys` + `used_cpu_user` of `INFO cpu`), µs.
    fn server_cpu_us(&self, which: Impl) -> Result<f64, String> {
        if which.on_zookeeper() {
            return self.zk_cpu_us();
        }
        let mut total = 0.0;
        for s in self.lock_nodes(which) {
            for field in ["used_cpu_sys", "used_cpu_user"] {
                let seconds = s
                    .info_field("cpu", field)
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| format!("INFO cpu has no {field}"))?;
                total += seconds.parse::<f64>().map_err(|e| e.to_string())? * 1e6;
            }
        }
        Ok(total)
    }

    /// `MOVED` + `ASK` errors the lock nodes answered (`INFO errorstats`).
    fn redirects(&self, which: Impl) -> Result<u64, String> {
        let mut total = 0;
        for s in self.lock_nodes(which) {
            let v = s
                .command(&["INFO", "errorstats"])
                .map_err(|e| e.to_string())?;
            let text: String = redis::from_redis_value(v).map_err(|e| e.to_string())?;
            for line in text.lines() {
                if let Some(rest) = line
                    .strip_prefix("errorstat_MOVED:count=")
                    .or_else(|| line.strip_prefix("errorstat_ASK:count="))
                {
                    total += rest.trim().parse::<u64>().unwrap_or(0);
                }
            }
        }
        Ok(total)
    }

    /// The sum of every counter (`bench:counter`, `bench:counter:<i>`).
    fn counter(&self, locks: usize) -> Result<i64, String> {
        let mut con = self.resource.connection().map_err(|e| e.to_string())?;
        let keys: Vec<String> = (0..locks.max(1))
            .map(|i| super::lock_and_counter(i, locks).1)
            .collect();
        let mut sum = 0;
        for chunk in keys.chunks(500) {
            let values: Vec<Option<i64>> = redis::cmd("MGET")
                .arg(chunk)
                .query(&mut con)
                .map_err(|e| e.to_string())?;
            sum += values.into_iter().flatten().sum::<i64>();
        }
        Ok(sum)
    }
}

/// Runs one implementation in one shape once.
///
/// # Errors
///
/// Harness or worker failures.
pub fn run_once(
    servers: &Servers,
    plan: &Plan,
    which: Impl,
    shape: Shape,
    repeat: usize,
) -> Result<RunResult, String> {
    servers.reset()?;
    let cpu_before = servers.server_cpu_us(which)?;
    let nodes: Vec<String> = match (which, &servers.zookeeper) {
        (which, Some(zk)) if which.on_zookeeper() => vec![zk.connect_string()],
        _ => servers.lock_nodes(which).iter().map(|s| s.url()).collect(),
    };
    let locks = plan.locks;
    let read_percent = plan.read_percent;
    let set_size = plan.set_size;
    let resource = servers.resource.url();
    // Everyone starts together, after every worker had time to connect.
    let start_at = ecosphere::clock::now_ns() + 1_500_000_000;
    let duration = plan.duration;
    let tasks = shape.tasks;
    let mut workers = WorkerSet::builder(&plan.worker_exe)
        .count(shape.procs)
        .args(move |_| {
            vec![
                "worker".into(),
                "--impl".into(),
                which.name().into(),
                "--nodes".into(),
                nodes.join(","),
                "--resource".into(),
                resource.clone(),
                "--tasks".into(),
                tasks.to_string(),
                "--duration-ms".into(),
                duration.as_millis().to_string(),
                "--start-at-ns".into(),
                start_at.to_string(),
                "--locks".into(),
                locks.to_string(),
                "--read-percent".into(),
                read_percent.to_string(),
                "--set-size".into(),
                set_size.to_string(),
            ]
        })
        .spawn()
        .map_err(|e| e.to_string())?;
    let budget = Duration::from_secs(10) + duration + super::GRACE;
    let outputs = workers.wait_all(budget).map_err(|e| e.to_string())?;
    let mut reports = Vec::with_capacity(outputs.len());
    for out in &outputs {
        let line = out
            .stdout_lines()
            .find_map(|l| l.strip_prefix("REPORT "))
            .ok_or_else(|| {
                format!(
                    "worker {} printed no report (status {:?}); stderr: {}",
                    out.index, out.status, out.stderr
                )
            })?;
        let r: WorkerReport = serde_json::from_str(line).map_err(|e| e.to_string())?;
        reports.push(r);
    }
    let cpu_after = servers.server_cpu_us(which)?;
    let stats = servers.commandstats(which)?;
    let usec = servers.commandstats_usec(which)?;
    let counter = servers.counter(plan.locks)?;
    let redirects = servers.redirects(which)?;
    let mut result = summarise(
        which, shape, repeat, duration, &reports, stats, counter, redirects,
    );
    result.server.clone_from(&servers.label);
    result.commandstats_usec = usec;
    // Includes the nodes' idle work over the run (a few ms per second), the same for every
    // implementation.
    result.server_cpu_us_per_acq = if result.acquisitions == 0 {
        f64::NAN
    } else {
        (cpu_after - cpu_before) / result.acquisitions as f64
    };
    Ok(result)
}

/// Runs the whole plan: for each repetition, for each shape, each implementation in turn.
///
/// # Errors
///
/// The first failing run.
pub fn run_plan(plan: &Plan) -> Result<Vec<RunResult>, String> {
    let with_cluster = plan.impls.contains(&Impl::SlateCluster);
    let with_zookeeper = plan.impls.iter().any(|i| i.on_zookeeper());
    let sessions = plan
        .servers
        .iter()
        .map(|&kind| Servers::start(kind, with_cluster, with_zookeeper))
        .collect::<Result<Vec<_>, _>>()?;
    let total = (plan.repeat * plan.shapes.len() * plan.impls.len() * sessions.len()) as u64;
    let bar = if plan.progress {
        ProgressBar::new(total)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    let mut results = Vec::new();
    for repeat in 0..plan.repeat {
        for &shape in &plan.shapes {
            for (servers, &which) in sessions
                .iter()
                .flat_map(|s| plan.impls.iter().map(move |w| (s, w)))
            {
                bar.set_message(format!("{which} {shape} run {}", repeat + 1));
                let r = run_once(servers, plan, which, shape, repeat)?;
                bar.println(format!(
                    "{:>13} {which:>14} {shape:>5} run {}: {:>7.0} acq/s, {:.2} lock cmds/acq, {:.2} server cmds/acq, {:.1} server CPU µs/acq, {} redirects, p99 wait {:.1} ms, mutex {}",
                    servers.label,
                    repeat + 1,
                    r.acq_per_s,
                    r.lock_cmds_per_acq,
                    r.server_cmds_per_acq,
                    r.server_cpu_us_per_acq,
                    r.redirects,
                    r.wait_p99_ms,
                    if r.mutex_ok { "ok" } else { "VIOLATED" }
                ));
                results.push(r);
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    Ok(results)
}

/// One row of the summary: min / median / max over the runs of one implementation and shape.
#[derive(Debug, Serialize)]
pub struct SummaryRow {
    /// The server.
    pub server: String,
    /// Implementation.
    pub implementation: Impl,
    /// Shape.
    pub shape: Shape,
    /// Runs summarised.
    pub runs: usize,
    /// Acquisitions per second.
    pub acq_per_s: Option<Spread>,
    /// Lock commands per acquisition.
    pub lock_cmds_per_acq: Option<Spread>,
    /// All server commands (scripts' inside included) per acquisition.
    pub server_cmds_per_acq: Option<Spread>,
    /// Total `MOVED`/`ASK` redirects.
    pub redirects: u64,
    /// Client CPU µs per acquisition.
    pub cpu_us_per_acq: Option<Spread>,
    /// The lock nodes' CPU µs per acquisition.
    pub server_cpu_us_per_acq: Option<Spread>,
    /// Wait p50 (ms).
    pub wait_p50_ms: Option<Spread>,
    /// Wait p99 (ms).
    pub wait_p99_ms: Option<Spread>,
    /// Wait max (ms).
    pub wait_max_ms: Option<Spread>,
    /// Wait p99 of the writes (ms; with `--read-percent`).
    pub write_wait_p99_ms: Option<Spread>,
    /// Per-worker min..max acquisitions of the median-throughput run.
    pub fairness: (u64, u64),
    /// Runs whose counter matched.
    pub mutex_ok: usize,
    /// Total backend errors.
    pub errors: u64,
}

/// Summarises results per (shape, implementation), in plan order.
#[must_use]
pub fn summary(results: &[RunResult]) -> Vec<SummaryRow> {
    let mut keys: Vec<(Shape, &str, Impl)> = Vec::new();
    for r in results {
        if !keys.contains(&(r.shape, r.server.as_str(), r.implementation)) {
            keys.push((r.shape, r.server.as_str(), r.implementation));
        }
    }
    keys.sort_by_key(|(s, _, _)| *s);
    keys.into_iter()
        .map(|(shape, server, which)| {
            let runs: Vec<&RunResult> = results
                .iter()
                .filter(|r| r.shape == shape && r.server == server && r.implementation == which)
                .collect();
            let spread = |f: fn(&RunResult) -> f64| {
                Spread::of(&runs.iter().map(|r| f(r)).collect::<Vec<_>>())
            };
            let mut by_tp = runs.clone();
            by_tp.sort_by(|a, b| a.acq_per_s.total_cmp(&b.acq_per_s));
            let median = by_tp[by_tp.len() / 2];
            SummaryRow {
                server: server.to_owned(),
                implementation: which,
                shape,
                runs: runs.len(),
                acq_per_s: spread(|r| r.acq_per_s),
                lock_cmds_per_acq: spread(|r| r.lock_cmds_per_acq),
                server_cmds_per_acq: spread(|r| r.server_cmds_per_acq),
                redirects: runs.iter().map(|r| r.redirects).sum(),
                cpu_us_per_acq: spread(|r| r.cpu_us_per_acq),
                server_cpu_us_per_acq: spread(|r| r.server_cpu_us_per_acq),
                wait_p50_ms: spread(|r| r.wait_p50_ms),
                wait_p99_ms: spread(|r| r.wait_p99_ms),
                wait_max_ms: spread(|r| r.wait_max_ms),
                write_wait_p99_ms: spread(|r| r.write_wait_p99_ms),
                fairness: (median.worker_min, median.worker_max),
                mutex_ok: runs.iter().filter(|r| r.mutex_ok).count(),
                errors: runs.iter().map(|r| r.errors).sum(),
            }
        })
        .collect()
}

/// Renders the summary as a Markdown table (min / **median** / max).
#[must_use]
pub fn markdown(rows: &[SummaryRow]) -> String {
    let mut out = String::from(
        "| server | impl | procs x tasks | runs | acq/s | lock cmds/acq | server cmds/acq | redirects | client CPU µs/acq | server CPU µs/acq | wait p50 ms | wait p99 ms | wait max ms | write wait p99 ms | per-worker min..max (median run) | mutex ok | errors |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    let cell = |s: &Option<Spread>, digits: usize| match s {
        Some(s) => format!(
            "{:.d$} / **{:.d$}** / {:.d$}",
            s.min,
            s.median,
            s.max,
            d = digits
        ),
        None => "n/a".to_owned(),
    };
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}..{} | {}/{} | {} |",
            r.server,
            r.implementation,
            r.shape,
            r.runs,
            cell(&r.acq_per_s, 0),
            cell(&r.lock_cmds_per_acq, 2),
            cell(&r.server_cmds_per_acq, 1),
            r.redirects,
            cell(&r.cpu_us_per_acq, 0),
            cell(&r.server_cpu_us_per_acq, 1),
            cell(&r.wait_p50_ms, 2),
            cell(&r.wait_p99_ms, 1),
            cell(&r.wait_max_ms, 1),
            cell(&r.write_wait_p99_ms, 1),
            r.fairness.0,
            r.fairness.1,
            r.mutex_ok,
            r.runs,
            r.errors,
        );
    }
    out
}
