//! `slate-worker`: one OS process of a multi-process scenario of one of Slate's locks: the
//! single lock (one `--redis-url`, or `--cluster`, or `--sentinel-master`), the combination lock
//! (`--redis-url` given more than once), the ZooKeeper lock (`--zookeeper`), the shared
//! mode's read-write lock and semaphore (`--shared`), or a multi-lock over several names
//! (`--multi`, `multi.rs`). Every exclusive lock is driven by one
//! driver over the `DistributedLock` contract (`driver.rs`; what a lock does differently is a
//! method of its `Driven` impl); the shared mode, whose holds carry permits, has its own
//! (`shared.rs`). The command line is `ecosphere::worker::WorkerArgs`, which the scenarios
//! build and render.
//!
//! Every worker records its event history (`<history-dir>/proc-<proc>.jsonl`, written through)
//! following the rules of `ecosphere::history`: `acq_invoke`/`rel_invoke` stamped before the
//! call, everything else after the reply; `holder` is the exact hash field
//! (`guard.holder().to_string()`); a `renew_ok` is logged whenever the guard's deadline moved,
//! checked before each resource operation. The lock calls are logged by
//! `slate_history::logged::Log`, the same code as `slate demo`'s worker.
//!
//! ```text
//! slate-worker --redis-url URL --lock NAME --proc N --history-dir DIR --mode MODE
//!     [--resource-url URL] [--tasks N] [--iterations N] [--max-duration-ms MS]
//!     [--lease-ms MS] [--renewal-ms MS] [--spin-wait-ms MS] [--command-timeout-ms MS]
//!     [--hold-ms MS] [--step-ms MS] [--budget-ms MS] [--linger-ms MS] [--go-file PATH]
//!     [--counter-key KEY] [--unsafe-skip-lock] [--fenced-key KEY [--late-write]]
//!     [--unlock-file PATH] [--burn-threads N]
//!     [--redis-url URL ...] [--node-op-ms MS] [--reprobe-ms MS] [--quarantine-ms MS]
//!     [--order sequential|pipelined] [--stop-file PATH] [--tolerate-errors]
//! ```
//!
//! A **resource operation** is GET then SET+1 of the counter `--counter-key` on the resource
//! server (non-atomic on purpose: the unfenced resource U), logged as `res_op incr ok`, or
//! `incr unknown:<error>` when it failed (the SET may have been applied); a failed increment
//! ends `contend`, `reenter` and `wait` with an error, while `hold` goes on. With
//! `--fenced-key KEY` (needs `--resource-url`) every resource operation first sends one write
//! to the **fenced resource F** (reliability.md §6.1) on the resource server: a Lua script that
//! rejects a token below the highest it has accepted and otherwise raises that maximum,
//! counts the write (hash `KEY`: `max`, `accepted`, `rejected`) and appends the element
//! `<proc>:<n>:<token>` to the list `KEY:log`. It is logged as `res_op f_write` with outcome
//! `accepted:<seq>` (accept order), `rejected:<max>` or `unknown:<error>` (no reply; not a
//! worker failure), which the checker's I2 reads. Such a worker prints `FENCED accepted=A
//! rejected=R unknown=U` just before `STATS`.
//!
//! Modes (all print `READY` after connecting; with `--go-file` they then wait, bounded, until
//! that file exists and print `GO`; all print `STATS renewals=R subscriptions=S
//! local_waiters=W` last):
//!
//! - `contend`: `--tasks` tasks, each `--iterations` times (or until `--stop-file PATH`
//!   exists): `lock()`, GET then SET+1 of the counter on the resource server, `unlock()`.
//!   Prints `DONE acquisitions=N`. With `--tolerate-errors`, a failed acquisition is retried
//!   and a release that fails, or finds the lease already lost, is not an error.
//!   `--unsafe-skip-lock` skips the lock (negative control) and logs made-up holders.
//! - `hold`: acquires once (a lock error ends the mode with `ACQUIRE error <message>`, logged
//!   as `acq_info`), prints `HOLDING <holder> <token>`, does a resource operation every
//!   50 ms (if `--resource-url` is given) for `--hold-ms` or until the lease is lost
//!   (`LOST <reason>`, logged as `lost`; with `--late-write`, one more fenced write with the
//!   lost hold's token follows, as a write issued before a pause and delivered after it would,
//!   and `LATE accepted|rejected|unknown` is printed), then unlocks and prints
//!   `UNLOCK ok <remaining>`, `UNLOCK not_held` or `UNLOCK error <message>`. With
//!   `--unlock-file PATH` it prints `UNLOCK_WAIT` before the unlock, waits until PATH exists,
//!   then (single lock) PINGs the lock server until it answers (a healed link may need a
//!   while to carry traffic again) and prints `LINK_OK pings=N`; with `--burn-threads N` (single lock), N threads spin on the CPU while it holds.
//! - `reenter`: acquires, re-enters to depth 3 (`reenter()`, then `lock_as(holder)`), prints
//!   `DEPTH n` per level and `HOLD_COUNT n`, holds `--hold-ms` (with resource operations if
//!   `--resource-url` is given),
//!   releases level by level (`RELEASED n`, `--step-ms` apart), then sends one extra release
//!   (the library's release script, as no guard is left) and prints `EXTRA not_held`. With
//!   `--reenter-file PATH` it prints `REENTER_WAIT` at depth 1 and re-enters once PATH exists;
//!   a re-entry that finds the lease lost prints `REENTER lease_lost`, releases the first
//!   level (`RELEASED not_held`) and ends the mode.
//! - `wait`: `--tasks` waiters each call `try_lock_for(--budget-ms)` once (`try_lock()` for a
//!   budget of 0); prints `INVOKED n` once all have invoked; winners hold `--hold-ms` (one
//!   counter increment if `--resource-url` is given) and unlock. Prints
//!   `DONE acquired=A failed=F errors=E`.
//!
//! **Combination lock** (`--redis-url` given N ≥ 2 times, in node order): `contend` and `hold`.
//! The worker opens its own node set (`--node-op-ms`, `--reprobe-ms`; it does not adopt the
//! servers: the scenario does that once) and a `CombinationLock` (`--order`). `acq_ok` records
//! the nodes held. A failed acquisition (`InsufficientNodes`, budget timeout: nothing held,
//! everything taken was released) is logged as `acq_fail` and retried after the spin wait (in
//! both modes); an unlock that could not reach every node (`ReleaseIncomplete`) is logged as
//! `rel_info` (the entries left expire with the lease), one that found the lock lost as
//! `rel_fail{not_held}`. `contend` prints `DONE acquisitions=N failed_attempts=F
//! incomplete_releases=R`; `hold` prints the same lines as for the single lock (`HOLDING`,
//! `LOST`, `LATE`, `UNLOCK`; an incomplete release is `UNLOCK error <message>`) and logs the
//! same events (`renew_ok` whenever the combined deadline moved, checked at each tick). The
//! resource server is optional in `hold`; `--fenced-key` works as above. Last: `STATS
//! renewals=0 subscriptions=0 local_waiters=W`. With `--cancel-unlock`, `contend` drops each
//! `unlock()` future after its first poll (logged as `rel_info`, the release finishing in the
//! background).
//!
//! **ZooKeeper lock** (`--zookeeper host:port[,host:port…]`, optionally `--zk-root PATH`):
//! `contend`, `hold` and `reenter` (depth 3 and back, without the extra release), driven exactly as the combination lock is (the same code, through the
//! `DistributedLock` contract); `--lease-ms` is the session timeout, `--command-timeout-ms` the
//! operation timeout. With `--tolerate-errors`, acquisitions that fail with a retryable error
//! (a leader election) are retried and failed releases counted (`incomplete_releases`).
//!
//! Exit code 0 on success; 1 with a message on stderr otherwise (bad arguments: 2). In `hold`
//! and `wait`, lock errors are outcomes (recorded), not worker failures.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use ecosphere::clock::now_ns;
use ecosphere::history::{EventKind, FencedOutcome, OP_FENCED_WRITE, OUTCOME_OK, Recorder};
use ecosphere::worker::{CombOrder, WorkerArgs as Args};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use slate_combination::{CombinationLock, NodeSet, NodeSetOptions, Order};
use slate_redis::{ClientOptions, LossReason, RedisClient, SingleLock};
use slate_zookeeper::{ZkClient, ZkLock};

mod driver;
mod multi;
mod shared;

/// What a step of the worker answers: a failure is a message for stderr.
type Res<T> = Result<T, String>;

/// The fenced resource F (reliability.md §6.1): rejects a token below the highest accepted so
/// far; an accepted operation raises that maximum, counts itself (its sequence number is the
/// accept order) and appends its element to the log list `KEYS[2]`. Replies `{1, seq}` or
/// `{0, max}`.
const FENCED_LUA: &str = r"
local max = tonumber(redis.call('HGET', KEYS[1], 'max') or '-1')
local token = tonumber(ARGV[1])
if token < max then
  redis.call('HINCRBY', KEYS[1], 'rejected', 1)
  return {0, max}
end
redis.call('HSET', KEYS[1], 'max', ARGV[1])
local seq = redis.call('HINCRBY', KEYS[1], 'accepted', 1)
redis.call('RPUSH', KEYS[2], ARGV[2])
return {1, seq}
";

/// The error a lock call gets when the worker's max duration cuts it (recorded as `acq_info`).
const MAX_DURATION: slate_core::Error =
    slate_core::Error::closed("the worker's max duration (cancelled)");

/// A history write failed.
fn recording(e: ecosphere::history::HistoryError) -> String {
    format!("recording: {e}")
}

/// Interval of the resource operations while holding (`hold`, `reenter`).
const TICK: Duration = Duration::from_millis(50);

/// How much of its lease a holder keeps clear of resource operations: an operation (a GET and
/// a SET) that starts this close to the deadline could end after it, which the checker counts
/// as activity past validity. The loss signal's own timer can fire a little after the
/// deadline, so `is_lost` alone leaves that window open.
const OP_MARGIN: Duration = Duration::from_millis(20);

/// Whether a holder whose lease is `lease` may start a resource operation now.
fn may_operate(lease: &slate_redis::LeaseWatch) -> bool {
    !lease.is_lost() && lease.deadline() > Instant::now() + OP_MARGIN
}

/// Poll interval of the go-file wait.
const GO_POLL: Duration = Duration::from_millis(5);

/// Threads spinning on the CPU until dropped (`--burn-threads`).
struct Burners {
    stop: Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Burners {
    fn start(n: u64, until: Instant) -> Self {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    // Bounded by the stop flag and by the run's deadline.
                    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                        for i in 0..10_000u64 {
                            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
                        }
                    }
                })
            })
            .collect();
        Burners { stop, threads }
    }
}

impl Drop for Burners {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Prints `line` and waits, bounded by `deadline`, until `file` exists (nothing without one).
async fn wait_file(line: &str, file: Option<&PathBuf>, deadline: Instant) -> Res<()> {
    let Some(file) = file else { return Ok(()) };
    say(line)?;
    while !file.exists() {
        if Instant::now() >= deadline {
            return Err(format!("{} did not appear in time", file.display()));
        }
        tokio::time::sleep(GO_POLL).await;
    }
    Ok(())
}

/// The fenced resource F of one worker, with its tallies.
struct Fenced {
    conn: MultiplexedConnection,
    key: String,
    log_key: String,
    script: redis::Script,
    proc: u32,
    seq: AtomicU64,
    accepted: AtomicU64,
    rejected: AtomicU64,
    unknown: AtomicU64,
}

impl Fenced {
    fn new(conn: MultiplexedConnection, key: &str, proc: u32) -> Self {
        Fenced {
            conn,
            key: key.to_owned(),
            log_key: format!("{key}:log"),
            script: redis::Script::new(FENCED_LUA),
            proc,
            seq: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            unknown: AtomicU64::new(0),
        }
    }

    /// One fenced write carrying `token`; the `res_op` event to record (`f_write`, outcome
    /// `accepted:<seq>`, `rejected:<max>` or `unknown:<error>`). Errors are outcomes.
    async fn write(&self, holder: &str, token: u64) -> EventKind {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        let element = format!("{}:{n}:{token}", self.proc);
        let invoked = now_ns();
        let mut conn = self.conn.clone();
        let reply: redis::RedisResult<(i64, u64)> = self
            .script
            .key(&self.key)
            .key(&self.log_key)
            .arg(token)
            .arg(element)
            .invoke_async(&mut conn)
            .await;
        let outcome = match reply {
            Ok((1, seq)) => {
                self.accepted.fetch_add(1, Ordering::Relaxed);
                FencedOutcome::Accepted { seq }
            }
            Ok((_, max)) => {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                FencedOutcome::Rejected { max }
            }
            Err(e) => {
                self.unknown.fetch_add(1, Ordering::Relaxed);
                FencedOutcome::Unknown {
                    error: e.to_string(),
                }
            }
        };
        EventKind::ResOp {
            holder: holder.to_owned(),
            token,
            op: OP_FENCED_WRITE.to_owned(),
            outcome: outcome.to_outcome(),
            invoked: Some(invoked),
        }
    }

    /// The `FENCED accepted=A rejected=R unknown=U` line.
    fn line(&self) -> String {
        format!(
            "FENCED accepted={} rejected={} unknown={}",
            self.accepted.load(Ordering::Relaxed),
            self.rejected.load(Ordering::Relaxed),
            self.unknown.load(Ordering::Relaxed)
        )
    }
}

/// GET then SET+1 of the counter `key` (non-atomic on purpose: the unfenced resource U).
async fn counter_incr(mut conn: MultiplexedConnection, key: &str) -> Res<()> {
    let value: Option<u64> = conn
        .get(key)
        .await
        .map_err(|e| format!("GET {key} on the resource server: {e}"))?;
    conn.set(key, value.unwrap_or(0) + 1)
        .await
        .map_err(|e| format!("SET {key} on the resource server: {e}"))
}

/// The `res_op incr` outcome: `ok`, or `unknown:<error>` (the SET may have been applied).
fn incr_outcome(counted: &Res<()>) -> String {
    match counted {
        Ok(()) => OUTCOME_OK.to_owned(),
        Err(e) => format!("unknown:{e}"),
    }
}

/// Opens a multiplexed connection, bounded by 5 s, whose replies may take 10 s: a worker
/// stopped (SIGSTOP) while a command is on its way must not find its own timer expired
/// before it reads the reply that came meanwhile (the resource server is never faulted).
async fn connect(url: &str) -> Res<MultiplexedConnection> {
    let c = redis::Client::open(url).map_err(|e| format!("{url}: {e}"))?;
    let config =
        redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(10)));
    tokio::time::timeout(
        Duration::from_secs(5),
        c.get_multiplexed_async_connection_with_config(&config),
    )
    .await
    .map_err(|_| format!("{url}: connect timed out"))?
    .map_err(|e| format!("{url}: {e}"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("slate-worker: cannot build the tokio runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let proc = args.proc;
    let result = rt.block_on(run(args));
    // Background tasks (renewal, pub/sub) must not keep the process alive.
    rt.shutdown_timeout(Duration::from_millis(200));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("slate-worker {proc}: {msg}");
            ExitCode::from(1)
        }
    }
}

/// Prints one stdout line and flushes it (the harness reads lines as they come).
fn say(line: &str) -> Res<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing stdout: {e}"))
}

/// Runs `tasks` to their end: the sum of their counts, and the mode's outcome (the first
/// failure and how many tasks failed).
async fn joined(mut tasks: tokio::task::JoinSet<Res<u64>>) -> (u64, Res<()>) {
    let mut total = 0u64;
    let mut errors = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(n)) => total += n,
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(format!("task panicked: {e}")),
        }
    }
    let outcome = match errors.first() {
        None => Ok(()),
        Some(first) => Err(format!("{} task(s) failed; first: {first}", errors.len())),
    };
    (total, outcome)
}

/// How every mode ends: the `STATS` line (renewals and subscriptions still registered, tasks
/// still waiting), then the history flushed.
fn finish(renewals: usize, subscriptions: usize, local_waiters: usize, rec: &Recorder) -> Res<()> {
    say(&format!(
        "STATS renewals={renewals} subscriptions={subscriptions} local_waiters={local_waiters}"
    ))?;
    rec.flush().map_err(|e| format!("flushing: {e}"))
}

/// Short code of a loss reason (one word, for the `LOST` line).
fn reason_code(r: LossReason) -> String {
    match r {
        LossReason::EntryGone => "entry_gone".to_owned(),
        LossReason::DeadlineExpired => "deadline_expired".to_owned(),
        LossReason::MaxHoldReached => "max_hold".to_owned(),
        other => format!("{other:?}").replace(' ', "_"),
    }
}

/// Opens the lock `args` names and runs its mode.
async fn run(args: Args) -> Res<()> {
    let deadline = Instant::now() + args.max_duration;
    let rec = Recorder::create(&args.history_dir, args.proc)
        .map_err(|e| format!("opening the history: {e}"))?;
    if args.zookeeper.is_some() {
        let lock = open_zookeeper(&args).await?;
        return driver::drive(args, deadline, rec, lock).await;
    }
    if args.redis_url.len() > 1 && !args.cluster && args.sentinel_master.is_none() {
        let lock = open_combination(&args)?;
        return driver::drive(args, deadline, rec, lock).await;
    }
    let mut opts = ClientOptions::builder();
    if let Some(d) = args.command_timeout {
        opts = opts.command_timeout(d);
    }
    if args.synced_replicas > 0 {
        opts = opts.synced_replicas(args.synced_replicas, args.synced_within);
    }
    let opts = opts.build().map_err(|e| format!("client options: {e}"))?;
    let first = args.redis_url.first().ok_or("no --redis-url")?;
    let client = if args.cluster {
        RedisClient::open_cluster(&args.redis_url, opts)
    } else if let Some(master) = &args.sentinel_master {
        RedisClient::open_sentinel(&args.redis_url, master, opts)
    } else {
        RedisClient::open_with(first, opts)
    }
    .map_err(|e| format!("opening the lock client: {e}"))?;
    if args.shared.is_some() {
        return shared::run(args, deadline, rec, client).await;
    }
    if args.multi.is_some() {
        return multi::run(args, deadline, rec, client).await;
    }
    let mut builder = SingleLock::builder(&client, &args.lock).lease(args.lease);
    if let Some(d) = args.renewal {
        builder = builder.renewal_period(d);
    }
    if let Some(d) = args.spin_wait {
        builder = builder.spin_wait(d);
    }
    let lock = builder
        .build()
        .map_err(|e| format!("building the lock: {e}"))?;
    let direct = connect(first).await?;
    tokio::time::timeout(Duration::from_secs(5), client.ping())
        .await
        .map_err(|_| "PING of the lock server timed out".to_owned())?
        .map_err(|e| format!("PING of the lock server: {e}"))?;
    let single = driver::Single {
        lock,
        client,
        direct,
    };
    driver::drive(args, deadline, rec, single).await
}

/// The combination lock over the `--redis-url` nodes.
fn open_combination(args: &Args) -> Res<CombinationLock> {
    let mut opts = NodeSetOptions::builder();
    if let Some(d) = args.node_op {
        opts = opts.node_operation_time(d);
    }
    if let Some(d) = args.reprobe {
        opts = opts.reprobe_interval(d);
    }
    if let Some(d) = args.quarantine {
        opts = opts.quarantine(d);
    }
    let nodes = opts
        .build()
        .and_then(|opts| NodeSet::connect(&args.redis_url, opts))
        .map_err(|e| format!("opening the node set: {e}"))?;
    let mut builder = CombinationLock::builder(&nodes, &args.lock)
        .lease(args.lease)
        .order(match args.order {
            CombOrder::Sequential => Order::Sequential,
            CombOrder::Pipelined => Order::Pipelined,
        });
    if let Some(d) = args.renewal {
        builder = builder.renewal_period(d);
    }
    if let Some(d) = args.spin_wait {
        builder = builder.spin_wait(d);
    }
    builder
        .build()
        .map_err(|e| format!("building the lock: {e}"))
}

/// The ZooKeeper lock on the `--zookeeper` ensemble; `--lease-ms` is the session timeout (the
/// session is the lease), `--command-timeout-ms` the operation timeout.
async fn open_zookeeper(args: &Args) -> Res<ZkLock> {
    let servers = args.zookeeper.clone().unwrap_or_default();
    let mut client = ZkClient::builder(servers).session_timeout(args.lease);
    if let Some(d) = args.command_timeout {
        client = client.operation_timeout(d);
    }
    let client = client
        .connect()
        .await
        .map_err(|e| format!("connecting to ZooKeeper: {e}"))?;
    let mut builder = ZkLock::builder(&client, &args.lock);
    if let Some(root) = &args.zk_root {
        builder = builder.root(root.clone());
    }
    if let Some(d) = args.spin_wait {
        builder = builder.spin_wait(d);
    }
    builder
        .build()
        .map_err(|e| format!("building the lock: {e}"))
}

/// After `READY`: with `--go-file`, waits (bounded by `deadline`) until it exists and prints
/// `GO`.
async fn wait_go(go: Option<&PathBuf>, deadline: Instant) -> Res<()> {
    let Some(go) = go else { return Ok(()) };
    while !go.exists() {
        if Instant::now() >= deadline {
            return Err(format!("{} did not appear in time", go.display()));
        }
        tokio::time::sleep(GO_POLL).await;
    }
    say("GO")
}

/// `accepted`, `rejected` or `unknown`: the first word of a fenced `res_op` outcome.
fn late_word(event: &EventKind) -> &'static str {
    match event {
        EventKind::ResOp { outcome, .. } => match FencedOutcome::parse(outcome) {
            Some(FencedOutcome::Accepted { .. }) => "accepted",
            Some(FencedOutcome::Rejected { .. }) => "rejected",
            _ => "unknown",
        },
        _ => "unknown",
    }
}

/// Whether `--stop-file` exists (contend then starts no further iteration).
fn stop_requested(args: &Args) -> bool {
    args.stop_file.as_ref().is_some_and(|f| f.exists())
}
