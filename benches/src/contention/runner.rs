//! The orchestrating side: servers, interleaved runs, the table and the JSON.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use ecosphere::server::RedisServer;
use ecosphere::workers::WorkerSet;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::stats::Spread;
use super::{Impl, RunResult, Shape, WorkerReport, parse_commandstats, summarise};

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
}

/// The servers of a session: three lock nodes and one resource server.
pub struct Servers {
    /// Lock nodes.
    pub nodes: Vec<RedisServer>,
    /// The resource server holding the counter.
    pub resource: RedisServer,
}

impl Servers {
    /// Starts them.
    ///
    /// # Errors
    ///
    /// Harness failures (e.g. no `redis-server`).
    pub fn start() -> Result<Servers, String> {
        let mut all = RedisServer::start_many(4).map_err(|e| e.to_string())?;
        let resource = all.pop().ok_or("no resource server")?;
        Ok(Servers {
            nodes: all,
            resource,
        })
    }

    fn reset(&self) -> Result<(), String> {
        for s in self.nodes.iter().chain([&self.resource]) {
            s.command(&["FLUSHALL"]).map_err(|e| e.to_string())?;
            s.command(&["CONFIG", "RESETSTAT"])
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    fn commandstats(&self, n: usize) -> Result<BTreeMap<String, u64>, String> {
        let mut total = BTreeMap::new();
        for s in &self.nodes[..n] {
            let v = s
                .command(&["INFO", "commandstats"])
                .map_err(|e| e.to_string())?;
            let text: String = redis::from_redis_value(v).map_err(|e| e.to_string())?;
            for (k, c) in parse_commandstats(&text) {
                *total.entry(k).or_insert(0) += c;
            }
        }
        Ok(total)
    }

    fn counter(&self) -> Result<i64, String> {
        let v = self
            .resource
            .command(&["GET", "bench:counter"])
            .map_err(|e| e.to_string())?;
        let n: Option<i64> = redis::from_redis_value(v).map_err(|e| e.to_string())?;
        Ok(n.unwrap_or(0))
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
    let nodes: Vec<String> = servers.nodes[..which.nodes()]
        .iter()
        .map(|s| s.url())
        .collect();
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
    let stats = servers.commandstats(which.nodes())?;
    let counter = servers.counter()?;
    Ok(summarise(
        which, shape, repeat, duration, &reports, stats, counter,
    ))
}

/// Runs the whole plan: for each repetition, for each shape, each implementation in turn.
///
/// # Errors
///
/// The first failing run.
pub fn run_plan(plan: &Plan) -> Result<Vec<RunResult>, String> {
    let servers = Servers::start()?;
    let total = (plan.repeat * plan.shapes.len() * plan.impls.len()) as u64;
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
            for &which in &plan.impls {
                bar.set_message(format!("{which} {shape} run {}", repeat + 1));
                let r = run_once(&servers, plan, which, shape, repeat)?;
                bar.println(format!(
                    "{which:>14} {shape:>5} run {}: {:>7.0} acq/s, {:.2} lock cmds/acq, p99 wait {:.1} ms, mutex {}",
                    repeat + 1,
                    r.acq_per_s,
                    r.lock_cmds_per_acq,
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
    /// Client CPU µs per acquisition.
    pub cpu_us_per_acq: Option<Spread>,
    /// Wait p50 (ms).
    pub wait_p50_ms: Option<Spread>,
    /// Wait p99 (ms).
    pub wait_p99_ms: Option<Spread>,
    /// Wait max (ms).
    pub wait_max_ms: Option<Spread>,
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
    let mut keys: Vec<(Shape, Impl)> = Vec::new();
    for r in results {
        if !keys.contains(&(r.shape, r.implementation)) {
            keys.push((r.shape, r.implementation));
        }
    }
    keys.sort_by_key(|(s, _)| *s);
    keys.into_iter()
        .map(|(shape, which)| {
            let runs: Vec<&RunResult> = results
                .iter()
                .filter(|r| r.shape == shape && r.implementation == which)
                .collect();
            let spread = |f: fn(&RunResult) -> f64| {
                Spread::of(&runs.iter().map(|r| f(r)).collect::<Vec<_>>())
            };
            let mut by_tp = runs.clone();
            by_tp.sort_by(|a, b| a.acq_per_s.total_cmp(&b.acq_per_s));
            let median = by_tp[by_tp.len() / 2];
            SummaryRow {
                implementation: which,
                shape,
                runs: runs.len(),
                acq_per_s: spread(|r| r.acq_per_s),
                lock_cmds_per_acq: spread(|r| r.lock_cmds_per_acq),
                cpu_us_per_acq: spread(|r| r.cpu_us_per_acq),
                wait_p50_ms: spread(|r| r.wait_p50_ms),
                wait_p99_ms: spread(|r| r.wait_p99_ms),
                wait_max_ms: spread(|r| r.wait_max_ms),
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
        "| impl | procs x tasks | runs | acq/s | lock cmds/acq | client CPU µs/acq | wait p50 ms | wait p99 ms | wait max ms | per-worker min..max (median run) | mutex ok | errors |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
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
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {}..{} | {}/{} | {} |",
            r.implementation,
            r.shape,
            r.runs,
            cell(&r.acq_per_s, 0),
            cell(&r.lock_cmds_per_acq, 2),
            cell(&r.cpu_us_per_acq, 0),
            cell(&r.wait_p50_ms, 2),
            cell(&r.wait_p99_ms, 1),
            cell(&r.wait_max_ms, 1),
            r.fairness.0,
            r.fairness.1,
            r.mutex_ok,
            r.runs,
            r.errors,
        );
    }
    out
}
