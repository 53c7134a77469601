//! `slate demo-worker` (hidden): one worker process of the demo. It contends on one lock with
//! `--tasks` tasks until `--duration-ms` has passed, recording its history for the checker.
//!
//! Its lock calls are logged by `slate_history::logged::Log`, the same code as the scenario
//! suite's worker (`ecosphere/src/bin/slate-worker.rs`): `acq_invoke`/`rel_invoke` stamped
//! before the call, everything else after the reply, the holder as the lock stores it.
//!
//! Stdout protocol, one line each: `READY` once connected; `GO` once the go file exists;
//! `P <acquisitions> <errors> <held on node 0> <held on node 1> ...` every 100 ms;
//! `DONE <acquisitions> <errors>` at the end.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
use slate_core::{DistributedLock, HolderId, Wait};
use slate_history::history::Recorder;
use slate_history::logged::Log;
use slate_redis::{RedisClient, SingleLock};

use crate::exit;

/// How often progress is printed.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);
/// Longest wait for the go file.
const GO_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest wait for the connection check at start.
const PING_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause after a failed acquisition before the next one.
const ERROR_BACKOFF: Duration = Duration::from_millis(50);
/// Budget of one release.
const RELEASE_BUDGET: Duration = Duration::from_secs(5);

/// Which lock the worker contends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// A single lock on the first URL.
    Single,
    /// A combination lock on every URL.
    Combination,
}

/// Arguments of `slate demo-worker`.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Lock kind.
    #[arg(long, value_enum)]
    pub kind: Kind,
    /// Redis URLs (node order).
    #[arg(long = "redis", required = true)]
    pub redis: Vec<String>,
    /// Lock name.
    #[arg(long)]
    pub lock: String,
    /// Process number in the history.
    #[arg(long)]
    pub proc: u32,
    /// Directory of the history files.
    #[arg(long)]
    pub history_dir: PathBuf,
    /// Start when this file exists.
    #[arg(long)]
    pub go_file: PathBuf,
    /// Concurrent tasks.
    #[arg(long, default_value_t = 4)]
    pub tasks: u64,
    /// How long to contend after GO.
    #[arg(long)]
    pub duration_ms: u64,
    /// Lease.
    #[arg(long, default_value_t = 2_000)]
    pub lease_ms: u64,
    /// Quarantine of restarted nodes (combination).
    #[arg(long, default_value_t = 2_000)]
    pub quarantine_ms: u64,
    /// Re-probe interval of unavailable nodes (combination).
    #[arg(long, default_value_t = 500)]
    pub reprobe_ms: u64,
    /// Node operation time (combination).
    #[arg(long, default_value_t = 100)]
    pub node_op_ms: u64,
    /// Time spent holding the lock per acquisition, in microseconds.
    #[arg(long, default_value_t = 1_000)]
    pub hold_us: u64,
}

/// Counters shared by the tasks and the progress printer.
struct Counters {
    acquisitions: AtomicU64,
    errors: AtomicU64,
    per_node: Vec<AtomicU64>,
}

impl Counters {
    fn line(&self, tag: &str) -> String {
        let mut s = format!(
            "{tag} {} {}",
            self.acquisitions.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed)
        );
        for n in &self.per_node {
            s.push_str(&format!(" {}", n.load(Ordering::Relaxed)));
        }
        s
    }
}

struct Ctx {
    args: WorkerArgs,
    rec: Recorder,
    counters: Counters,
    attempts: AtomicU64,
    deadline: Instant,
}

type Res<T> = Result<T, String>;

fn say(line: &str) -> Res<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing stdout: {e}"))
}

/// Runs the worker; returns the exit code.
pub fn main(args: WorkerArgs) -> u8 {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("slate demo-worker: cannot build the runtime: {e}");
            return exit::INTERNAL;
        }
    };
    let proc = args.proc;
    let result = rt.block_on(run(args));
    rt.shutdown_timeout(Duration::from_millis(200));
    match result {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("slate demo-worker {proc}: {e}");
            exit::FAILED
        }
    }
}

async fn run(args: WorkerArgs) -> Res<()> {
    let rec = Recorder::create_buffered(&args.history_dir, args.proc)
        .map_err(|e| format!("opening the history: {e}"))?;
    let lease = Duration::from_millis(args.lease_ms);
    let n = args.redis.len();
    match args.kind {
        Kind::Single => {
            let url = args.redis.first().ok_or("no --redis")?.clone();
            let client = RedisClient::open(&url).map_err(|e| e.to_string())?;
            let lock = SingleLock::builder(&client, &args.lock)
                .lease(lease)
                .build()
                .map_err(|e| e.to_string())?;
            tokio::time::timeout(PING_TIMEOUT, client.ping())
                .await
                .map_err(|_| format!("PING {url} timed out"))?
                .map_err(|e| e.to_string())?;
            contend(args, rec, lock, n).await
        }
        Kind::Combination => {
            // The demo's parent adopted the fresh servers before starting any worker, so the
            // nodes carry their marker; a node that restarts empty later is quarantined.
            let options = NodeSetOptions::builder()
                .quarantine(Duration::from_millis(args.quarantine_ms))
                .reprobe_interval(Duration::from_millis(args.reprobe_ms))
                .node_operation_time(Duration::from_millis(args.node_op_ms))
                .build()
                .map_err(|e| e.to_string())?;
            let nodes = NodeSet::connect(&args.redis, options).map_err(|e| e.to_string())?;
            for i in 0..nodes.len() {
                if let Some(c) = nodes.client(i) {
                    tokio::time::timeout(PING_TIMEOUT, c.ping())
                        .await
                        .map_err(|_| format!("PING of node {i} timed out"))?
                        .map_err(|e| e.to_string())?;
                }
            }
            let lock = CombinationLock::builder(&nodes, &args.lock)
                .lease(lease)
                .build()
                .map_err(|e| e.to_string())?;
            contend(args, rec, lock, n).await
        }
    }
}

async fn contend<L>(args: WorkerArgs, rec: Recorder, lock: L, nodes: usize) -> Res<()>
where
    L: DistributedLock,
{
    say("READY")?;
    let waited = Instant::now();
    while !args.go_file.exists() {
        if waited.elapsed() > GO_TIMEOUT {
            return Err(format!("{} did not appear", args.go_file.display()));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    say("GO")?;
    let ctx = Arc::new(Ctx {
        deadline: Instant::now() + Duration::from_millis(args.duration_ms),
        args,
        rec,
        counters: Counters {
            acquisitions: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            per_node: (0..nodes).map(|_| AtomicU64::new(0)).collect(),
        },
        attempts: AtomicU64::new(0),
    });
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..ctx.args.tasks {
        let (ctx, lock) = (Arc::clone(&ctx), lock.clone());
        tasks.spawn(async move { contend_task(&ctx, &lock, task).await });
    }
    let mut ticker = tokio::time::interval(PROGRESS_EVERY);
    let mut problems = Vec::new();
    loop {
        tokio::select! {
            joined = tasks.join_next() => match joined {
                None => break,
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => problems.push(e),
                Some(Err(e)) => problems.push(format!("task failed: {e}")),
            },
            _ = ticker.tick() => say(&ctx.counters.line("P"))?,
        }
    }
    ctx.rec.flush().map_err(|e| format!("flushing: {e}"))?;
    say(&ctx.counters.line("P"))?;
    say(&ctx.counters.line("DONE"))?;
    match problems.first() {
        None => Ok(()),
        Some(first) => Err(format!("{} task(s) failed; first: {first}", problems.len())),
    }
}

async fn contend_task<L>(ctx: &Ctx, lock: &L, task: u64) -> Res<()>
where
    L: DistributedLock,
{
    let hold = Duration::from_micros(ctx.args.hold_us);
    let log = Log::new(&ctx.rec, &ctx.args.lock, task);
    let history = |e: slate_history::history::HistoryError| format!("recording: {e}");
    loop {
        let remaining = ctx.deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Ok(());
        }
        let attempt = ctx.attempts.fetch_add(1, Ordering::Relaxed);
        // Cut at the end of the run: not acquired (the lock releases a late grant), recorded
        // as `acq_info` since an entry may briefly exist.
        let call = async {
            tokio::time::timeout(remaining, lock.acquire(HolderId::new(), Wait::Forever))
                .await
                .unwrap_or(Err(slate_core::Error::closed(
                    "the demo's run (cancelled at its end)",
                )))
        };
        let (guard, mut held) = match log.acquire(attempt, call).await.map_err(history)? {
            Ok(acquired) => acquired,
            Err(_) if Instant::now() >= ctx.deadline => return Ok(()),
            Err(_) => {
                ctx.counters.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(ERROR_BACKOFF).await;
                continue;
            }
        };
        ctx.counters.acquisitions.fetch_add(1, Ordering::Relaxed);
        for &n in &held.nodes {
            if let Some(c) = ctx.counters.per_node.get(n) {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(hold).await;
        log.note_renewal(&mut held, &guard).map_err(history)?;
        log.note_loss(&held, &guard).map_err(history)?;
        log.release(&mut held, guard, RELEASE_BUDGET)
            .await
            .map_err(history)?;
    }
}
