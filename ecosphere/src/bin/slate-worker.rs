//! `slate-worker`: one OS process of a multi-process scenario of Slate's single lock, or of the
//! combination lock when `--redis-url` is given more than once.
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
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use ecosphere::clock::now_ns;
use ecosphere::history::{
    EventKind, FencedOutcome, OP_FENCED_WRITE, OP_INCR, OUTCOME_OK, Recorder,
};
use ecosphere::worker::{CombOrder, HoldAs, Mode, SharedKind, WorkerArgs as Args};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use slate_history::logged::{Held, Log, Released as Logged};
use slate_redis::{ClientOptions, LossReason, RedisClient, SingleLock, SingleLockGuard};

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

type Res<T> = Result<T, String>;

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

/// Waits until `file` exists (if given), bounded by `deadline`; prints `UNLOCK_WAIT` first.
async fn wait_unlock_file(file: Option<&PathBuf>, deadline: Instant) -> Res<()> {
    wait_file("UNLOCK_WAIT", file, deadline).await
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

/// Short code of a loss reason (one word, for the `LOST` line).
fn reason_code(r: LossReason) -> String {
    match r {
        LossReason::EntryGone => "entry_gone".to_owned(),
        LossReason::DeadlineExpired => "deadline_expired".to_owned(),
        LossReason::MaxHoldReached => "max_hold".to_owned(),
        other => format!("{other:?}").replace(' ', "_"),
    }
}

/// Everything the modes share.
struct Ctx {
    args: Args,
    rec: Recorder,
    client: RedisClient,
    lock: SingleLock,
    resource: Option<MultiplexedConnection>,
    /// The fenced resource, with `--fenced-key`.
    fenced: Option<Fenced>,
    /// A plain connection to the lock server (the extra release of `reenter`).
    direct: MultiplexedConnection,
    deadline: Instant,
    attempts: AtomicU64,
}

impl Ctx {
    fn record(&self, task: u64, kind: EventKind) -> Res<u64> {
        self.log(task).record(kind).map_err(recording)
    }

    /// Records that `held`'s lease was lost, and why.
    fn record_lost(&self, task: u64, held: &Held, reason: LossReason) -> Res<()> {
        self.record(
            task,
            EventKind::Lost {
                holder: held.holder.clone(),
                reason: reason.to_string(),
            },
        )
        .map(drop)
    }

    /// Task `task`'s log of the lock's calls (shared with `slate demo`'s worker).
    fn log(&self, task: u64) -> Log<'_> {
        Log::new(&self.rec, &self.args.lock, task)
    }

    fn next_attempt(&self) -> u64 {
        self.attempts.fetch_add(1, Ordering::Relaxed)
    }

    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    fn resource(&self) -> Res<MultiplexedConnection> {
        self.resource
            .clone()
            .ok_or_else(|| "this mode needs --resource-url".to_owned())
    }

    /// Logs `renew_ok` if the guard's deadline moved since the last logged one.
    fn note_renewal(&self, task: u64, held: &mut Held, guard: &SingleLockGuard) -> Res<()> {
        self.log(task).note_renewal(held, guard).map_err(recording)
    }

    /// One resource operation: the fenced write (with `--fenced-key`), then GET and SET+1 of
    /// the counter (non-atomic on purpose); then `renew_ok` if the deadline moved, and the
    /// `res_op` events (`f_write`, `incr`). A failed increment is recorded (outcome
    /// `unknown:<error>`: the SET may have been applied) and returned as the error.
    async fn resource_op(
        &self,
        task: u64,
        held: &mut Held,
        guard: Option<&SingleLockGuard>,
    ) -> Res<()> {
        let fenced = match &self.fenced {
            Some(f) => Some(f.write(&held.holder, held.token).await),
            None => None,
        };
        let counted = counter_incr(self.resource()?, &self.args.counter_key).await;
        if let Some(g) = guard {
            self.note_renewal(task, held, g)?;
        }
        if let Some(f) = fenced {
            self.record(task, f)?;
        }
        self.record(
            task,
            EventKind::ResOp {
                holder: held.holder.clone(),
                token: held.token,
                op: OP_INCR.to_owned(),
                outcome: incr_outcome(&counted),
                invoked: None,
            },
        )?;
        counted
    }

    /// `rel_invoke`, `unlock()`, then `rel_ok` / `rel_fail{not_held}` / `rel_info`.
    async fn release(&self, task: u64, held: &mut Held, guard: SingleLockGuard) -> Res<Released> {
        let released = self
            .log(task)
            .release(held, guard, self.remaining())
            .await
            .map_err(recording)?;
        Ok(match released {
            Logged::Done(n) => Released::Ok(n),
            Logged::NotHeld => Released::NotHeld,
            Logged::Failed(e) => Released::Error(e.to_string()),
            Logged::TimedOut => Released::Error("max duration reached during unlock".to_owned()),
        })
    }

    /// `lock()` bounded by the run's deadline; logs `acq_invoke` and the outcome. A lock error
    /// fails the call.
    async fn lock_logged(
        &self,
        task: u64,
        as_holder: Option<slate_redis::HolderId>,
    ) -> Res<(SingleLockGuard, Held)> {
        self.lock_outcome(task, as_holder)
            .await?
            .map_err(|e| format!("lock() failed: {e}"))
    }

    /// As [`Ctx::lock_logged`], but a lock error (recorded as `acq_info`) is the inner `Err`.
    async fn lock_outcome(
        &self,
        task: u64,
        as_holder: Option<slate_redis::HolderId>,
    ) -> Res<Result<(SingleLockGuard, Held), String>> {
        let attempt = self.next_attempt();
        let remaining = self.remaining();
        let call = async {
            let call = async {
                match as_holder {
                    Some(h) => self.lock.lock_as(h).await,
                    None => self.lock.lock().await,
                }
            };
            tokio::time::timeout(remaining, call)
                .await
                .unwrap_or(Err(MAX_DURATION))
        };
        match self
            .log(task)
            .acquire(attempt, call)
            .await
            .map_err(recording)?
        {
            Ok(acquired) => Ok(Ok(acquired)),
            Err(_) if self.remaining().is_zero() => {
                Err("max duration reached while waiting for the lock".to_owned())
            }
            Err(e) => Ok(Err(e.to_string())),
        }
    }
}

/// Outcome of a logged release.
#[derive(Debug)]
enum Released {
    Ok(u32),
    NotHeld,
    Error(String),
}

impl Released {
    fn line(&self) -> String {
        match self {
            Released::Ok(n) => format!("ok {n}"),
            Released::NotHeld => "not_held".to_owned(),
            Released::Error(m) => format!("error {}", m.replace('\n', " ")),
        }
    }
}

async fn run(args: Args) -> Res<()> {
    let deadline = Instant::now() + args.max_duration;
    let rec = Recorder::create(&args.history_dir, args.proc)
        .map_err(|e| format!("opening the history: {e}"))?;
    let mut opts = ClientOptions::builder();
    if let Some(d) = args.command_timeout {
        opts = opts.command_timeout(d);
    }
    if args.synced_replicas > 0 {
        opts = opts.synced_replicas(args.synced_replicas, args.synced_within);
    }
    let opts = opts.build().map_err(|e| format!("client options: {e}"))?;
    if args.zookeeper.is_some() {
        return generic::zookeeper(args, deadline, rec).await;
    }
    let client = if args.cluster {
        RedisClient::open_cluster(&args.redis_url, opts)
    } else if let Some(master) = &args.sentinel_master {
        RedisClient::open_sentinel(&args.redis_url, master, opts)
    } else if args.redis_url.len() > 1 {
        return generic::combination(args, deadline, rec).await;
    } else if args.shared.is_some() {
        let client = RedisClient::open_with(&args.redis_url[0], opts)
            .map_err(|e| format!("opening the lock client: {e}"))?;
        return shared::run(args, deadline, rec, client).await;
    } else {
        RedisClient::open_with(&args.redis_url[0], opts)
    }
    .map_err(|e| format!("opening the lock client: {e}"))?;
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
    let resource = match &args.resource_url {
        Some(url) => Some(connect(url).await?),
        None => None,
    };
    let fenced = match (&args.fenced_key, &resource) {
        (Some(key), Some(conn)) => Some(Fenced::new(conn.clone(), key, args.proc)),
        _ => None,
    };
    let direct = connect(&args.redis_url[0]).await?;
    tokio::time::timeout(Duration::from_secs(5), client.ping())
        .await
        .map_err(|_| "PING of the lock server timed out".to_owned())?
        .map_err(|e| format!("PING of the lock server: {e}"))?;
    let ctx = Arc::new(Ctx {
        args,
        rec,
        client,
        lock,
        resource,
        fenced,
        direct,
        deadline,
        attempts: AtomicU64::new(0),
    });
    say("READY")?;
    if let Some(go) = &ctx.args.go_file {
        while !go.exists() {
            if Instant::now() >= deadline {
                return Err(format!("{} did not appear in time", go.display()));
            }
            tokio::time::sleep(GO_POLL).await;
        }
        say("GO")?;
    }
    let result = match ctx.args.mode {
        Mode::Contend => contend(&ctx).await,
        Mode::Hold => hold(&ctx).await,
        Mode::Reenter => reenter(&ctx).await,
        Mode::Wait => wait(&ctx).await,
    };
    if !ctx.args.linger.is_zero() {
        tokio::time::sleep(ctx.args.linger.min(ctx.remaining())).await;
    }
    if let Some(f) = &ctx.fenced {
        say(&f.line())?;
    }
    let s = ctx.client.stats();
    say(&format!(
        "STATS renewals={} subscriptions={} local_waiters={}",
        s.renewals, s.subscriptions, s.local_waiters
    ))?;
    ctx.rec.flush().map_err(|e| format!("flushing: {e}"))?;
    result
}

/// `contend`: tasks × iterations of lock / GET+SET / unlock.
async fn contend(ctx: &Arc<Ctx>) -> Res<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..ctx.args.tasks {
        let ctx = Arc::clone(ctx);
        tasks.spawn(async move { contend_task(&ctx, task).await });
    }
    let mut total = 0u64;
    let mut errors = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(n)) => total += n,
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(format!("task panicked: {e}")),
        }
    }
    say(&format!("DONE acquisitions={total}"))?;
    match errors.first() {
        None => Ok(()),
        Some(first) => Err(format!("{} task(s) failed; first: {first}", errors.len())),
    }
}

async fn contend_task(ctx: &Ctx, task: u64) -> Res<u64> {
    let mut done = 0;
    let mut i = 0;
    while done < ctx.args.iterations && !stop_requested(&ctx.args) {
        if Instant::now() >= ctx.deadline {
            return Err(format!("max duration reached after {done} iterations"));
        }
        if ctx.args.unsafe_skip_lock {
            unsafe_iteration(ctx, task, i).await?;
            i += 1;
            done += 1;
            continue;
        }
        let named = ctx.args.named_holders.then(slate_redis::HolderId::new);
        let (guard, mut held) = match ctx.lock_logged(task, named).await {
            Ok(acquired) => acquired,
            Err(e) if ctx.args.tolerate_errors => {
                eprintln!(
                    "slate-worker {}: acquisition failed, retrying: {e}",
                    ctx.args.proc
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let op = ctx.resource_op(task, &mut held, Some(&guard)).await;
        if let Some(reason) = guard.lease().loss_reason() {
            ctx.record_lost(task, &held, reason)?;
        }
        let released = ctx.release(task, &mut held, guard).await?;
        op?;
        match released {
            Released::Ok(0) => {}
            // The lease ended while held (a loss, recorded): the release finds nothing.
            Released::NotHeld if ctx.args.tolerate_errors => {}
            Released::Error(e) if ctx.args.tolerate_errors => {
                eprintln!(
                    "slate-worker {}: release failed (the lease ends it): {e}",
                    ctx.args.proc
                );
            }
            other => return Err(format!("unlock of a depth-1 guard answered {other:?}")),
        }
        i += 1;
        done += 1;
    }
    Ok(done)
}

/// Whether `--stop-file` exists (contend then starts no further iteration).
fn stop_requested(args: &Args) -> bool {
    args.stop_file.as_ref().is_some_and(|f| f.exists())
}

/// One iteration of the negative control: no lock at all, a made-up holder and token.
async fn unsafe_iteration(ctx: &Ctx, task: u64, i: u64) -> Res<()> {
    let attempt = ctx.next_attempt();
    ctx.record(
        task,
        EventKind::AcqInvoke {
            attempt,
            budget_ms: None,
        },
    )?;
    let mut conn = ctx.resource()?;
    let token: u64 = conn
        .incr("unsafe-token", 1)
        .await
        .map_err(|e| format!("INCR unsafe-token: {e}"))?;
    let mut held = Held {
        holder: format!("unsafe:{}:{task}:{i}", ctx.args.proc),
        token,
        depth: 1,
        deadline: now_ns() + u64::try_from(ctx.args.lease.as_nanos()).unwrap_or(u64::MAX),
        nodes: Vec::new(),
        renewals: None,
    };
    ctx.record(
        task,
        EventKind::AcqOk {
            attempt,
            holder: held.holder.clone(),
            token,
            depth: 1,
            deadline: held.deadline,
            nodes: vec![],
            permits: None,
        },
    )?;
    ctx.resource_op(task, &mut held, None).await?;
    ctx.record(
        task,
        EventKind::RelInvoke {
            holder: held.holder.clone(),
            depth_before: 1,
        },
    )?;
    ctx.record(
        task,
        EventKind::RelOk {
            holder: held.holder.clone(),
            depth_after: 0,
        },
    )?;
    Ok(())
}

/// `hold`: acquire, hold with resource operations until done or lost, unlock.
async fn hold(ctx: &Ctx) -> Res<()> {
    let (guard, mut held) = match ctx.lock_outcome(0, None).await? {
        Ok(acquired) => acquired,
        Err(e) => return say(&format!("ACQUIRE error {}", e.replace('\n', " "))),
    };
    say(&format!("HOLDING {} {}", held.holder, held.token))?;
    let end = (Instant::now() + ctx.args.hold).min(ctx.deadline);
    let burners = Burners::start(ctx.args.burn_threads, end);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let lost = loop {
        tokio::select! {
            biased;
            reason = guard.lost() => break Some(reason),
            () = tokio::time::sleep_until(end.into()) => break None,
            _ = tick.tick() => {
                if !may_operate(guard.lease()) {
                    // Lost (lost() completes at once), or too close to the deadline.
                } else if ctx.resource.is_some() {
                    // A failed increment is a recorded outcome here, not a worker failure.
                    let _ = ctx.resource_op(0, &mut held, Some(&guard)).await;
                } else {
                    ctx.note_renewal(0, &mut held, &guard)?;
                }
            }
        }
    };
    if let Some(reason) = lost {
        ctx.record_lost(0, &held, reason)?;
        say(&format!("LOST {}", reason_code(reason)))?;
        if ctx.args.late_write
            && let Some(f) = &ctx.fenced
        {
            let event = f.write(&held.holder, held.token).await;
            say(&format!("LATE {}", late_word(&event)))?;
            ctx.record(0, event)?;
        }
    }
    drop(burners);
    wait_unlock_file(ctx.args.unlock_file.as_ref(), ctx.deadline).await?;
    if ctx.args.unlock_file.is_some() {
        // A healed link may need a while (TCP retransmission backoff) to carry traffic again:
        // PING until it answers, bounded by the run's deadline.
        let mut pings = 0u32;
        loop {
            pings += 1;
            if let Ok(Ok(())) = tokio::time::timeout(ctx.remaining(), ctx.client.ping()).await {
                break;
            }
            if ctx.remaining().is_zero() {
                return Err("the lock server never answered PING after the unlock file".into());
            }
            tokio::time::sleep(Duration::from_millis(20).min(ctx.remaining())).await;
        }
        say(&format!("LINK_OK pings={pings}"))?;
    }
    let released = ctx.release(0, &mut held, guard).await?;
    say(&format!("UNLOCK {}", released.line()))?;
    Ok(())
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

/// Holds `guard` for `d`, incrementing the counter every tick; fails if the lease is lost.
async fn hold_for(ctx: &Ctx, held: &mut Held, guard: &SingleLockGuard, d: Duration) -> Res<()> {
    let end = (Instant::now() + d).min(ctx.deadline);
    while Instant::now() < end {
        if let Some(reason) = guard.lease().loss_reason() {
            ctx.record_lost(0, held, reason)?;
            return Err(format!("lease lost while holding: {reason}"));
        }
        if ctx.resource.is_some() {
            ctx.resource_op(0, held, Some(guard)).await?;
        } else {
            ctx.note_renewal(0, held, guard)?;
        }
        tokio::time::sleep(TICK.min(end.saturating_duration_since(Instant::now()))).await;
    }
    Ok(())
}

/// Releases one level and checks that exactly one level went.
async fn release_level(ctx: &Ctx, held: &mut Held, guard: SingleLockGuard) -> Res<()> {
    let expect = held.depth.saturating_sub(1);
    ctx.note_renewal(0, held, &guard)?;
    match ctx.release(0, held, guard).await? {
        Released::Ok(n) if n == expect => say(&format!("RELEASED {n}")),
        other => Err(format!("release to depth {expect} answered {other:?}")),
    }
}

/// `reenter`: depth 3 and back, with renewal running, then one release too many.
async fn reenter(ctx: &Ctx) -> Res<()> {
    let (g1, mut held) = ctx.lock_logged(0, None).await?;
    say(&format!("HOLDING {} {}", held.holder, held.token))?;
    say("DEPTH 1")?;
    let holder = g1.holder();
    wait_file("REENTER_WAIT", ctx.args.reenter_file.as_ref(), ctx.deadline).await?;
    let (g2, h2) = {
        let attempt = ctx.next_attempt();
        let call = async {
            tokio::time::timeout(ctx.remaining(), g1.reenter())
                .await
                .unwrap_or(Err(MAX_DURATION))
        };
        match ctx.log(0).acquire(attempt, call).await.map_err(recording)? {
            Ok(acquired) => acquired,
            Err(e) if ctx.args.reenter_file.is_some() && e.is_lease_lost() => {
                say("REENTER lease_lost")?;
                let released = ctx.release(0, &mut held, g1).await?;
                return say(&format!("RELEASED {}", released.line()));
            }
            Err(e) => return Err(format!("reenter() failed: {e}")),
        }
    };
    say("DEPTH 2")?;
    let (g3, h3) = ctx.lock_logged(0, Some(holder)).await?;
    say("DEPTH 3")?;
    for (d, h) in [(2, &h2), (3, &h3)] {
        if h.depth != d || h.token != held.token || h.holder != held.holder {
            return Err(format!(
                "re-entry {d}: depth {} token {} holder {} (first level: token {} holder {})",
                h.depth, h.token, h.holder, held.token, held.holder
            ));
        }
    }
    held.depth = 3;
    held.deadline = held.deadline.max(h2.deadline).max(h3.deadline);
    let count = ctx
        .lock
        .hold_count(holder)
        .await
        .map_err(|e| format!("hold_count: {e}"))?;
    say(&format!("HOLD_COUNT {count}"))?;
    if count != 3 {
        return Err(format!("hold_count is {count} at depth 3"));
    }
    hold_for(ctx, &mut held, &g3, ctx.args.hold).await?;
    let step = ctx.args.step;
    for inner in [g3, g2] {
        release_level(ctx, &mut held, inner).await?;
        hold_for(ctx, &mut held, &g1, step).await?;
    }
    release_level(ctx, &mut held, g1).await?;
    // One release too many: no guard is left, so send the library's release script directly.
    let key = ctx.lock.key().to_vec();
    let mut channel = key.clone();
    channel.extend_from_slice(b":released");
    ctx.record(
        0,
        EventKind::RelInvoke {
            holder: held.holder.clone(),
            depth_before: 0,
        },
    )?;
    let mut direct = ctx.direct.clone();
    // The library's release script, for the one release no guard can express (past depth 0).
    let release = slate_redis::lua_script("release").ok_or("no release script")?;
    let reply: i64 = redis::Script::new(release.source)
        .key(key)
        .key(channel)
        .arg(&held.holder)
        .arg(u64::try_from(ctx.args.lease.as_millis()).unwrap_or(u64::MAX))
        .invoke_async(&mut direct)
        .await
        .map_err(|e| format!("extra release: {e}"))?;
    if reply == -1 {
        ctx.record(
            0,
            EventKind::RelFail {
                holder: held.holder.clone(),
                reason: "not held (release past depth 0)".to_owned(),
                not_held: true,
            },
        )?;
        say("EXTRA not_held")?;
        Ok(())
    } else {
        let depth_after = u32::try_from(reply).unwrap_or(u32::MAX);
        ctx.record(
            0,
            EventKind::RelOk {
                holder: held.holder.clone(),
                depth_after,
            },
        )?;
        say(&format!("EXTRA unexpected {reply}"))?;
        Err(format!("a release past depth 0 answered {reply}, not -1"))
    }
}

/// `wait`: many waiters, one bounded acquire each.
async fn wait(ctx: &Arc<Ctx>) -> Res<()> {
    let invoked = Arc::new(AtomicUsize::new(0));
    let all_invoked = Arc::new(tokio::sync::Notify::new());
    let n = usize::try_from(ctx.args.tasks).map_err(|e| e.to_string())?;
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..ctx.args.tasks {
        let (ctx, invoked, all_invoked) = (
            Arc::clone(ctx),
            Arc::clone(&invoked),
            Arc::clone(&all_invoked),
        );
        tasks.spawn(async move {
            let attempt = ctx.next_attempt();
            let budget = u64::try_from(ctx.args.budget.as_millis()).unwrap_or(u64::MAX);
            ctx.record(
                task,
                EventKind::AcqInvoke {
                    attempt,
                    budget_ms: Some(budget),
                },
            )?;
            if invoked.fetch_add(1, Ordering::SeqCst) + 1 == n {
                all_invoked.notify_one();
            }
            wait_task(&ctx, task, attempt, budget).await
        });
    }
    let announce = async {
        all_invoked.notified().await;
        say(&format!("INVOKED {n}"))
    };
    tokio::select! {
        r = announce => r?,
        () = tokio::time::sleep(ctx.remaining()) => {},
    }
    let (mut acquired, mut failed, mut errors) = (0u64, 0u64, 0u64);
    let mut problems = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(WaitOutcome::Acquired)) => acquired += 1,
            Ok(Ok(WaitOutcome::Failed)) => failed += 1,
            Ok(Ok(WaitOutcome::Error)) => errors += 1,
            Ok(Err(e)) => problems.push(e),
            Err(e) => problems.push(format!("task panicked: {e}")),
        }
    }
    say(&format!(
        "DONE acquired={acquired} failed={failed} errors={errors}"
    ))?;
    match problems.first() {
        None => Ok(()),
        Some(first) => Err(format!(
            "{} waiter(s) failed; first: {first}",
            problems.len()
        )),
    }
}

enum WaitOutcome {
    Acquired,
    Failed,
    Error,
}

async fn wait_task(ctx: &Ctx, task: u64, attempt: u64, budget: u64) -> Res<WaitOutcome> {
    // An explicit holder scope, so that a failed attempt can name the holder it tried as (a
    // late grant after a timeout would leave that field behind as a ghost).
    let holder = slate_redis::HolderId::new();
    let call = async {
        if budget == 0 {
            ctx.lock.try_lock().await.map(|g| g.ok_or(()))
        } else {
            ctx.lock
                .try_lock_for(Duration::from_millis(budget))
                .await
                .map(Ok)
        }
    };
    let call: std::pin::Pin<Box<dyn Future<Output = _> + Send + '_>> = if ctx.args.implicit_holders
    {
        Box::pin(call)
    } else {
        Box::pin(holder.scope(call))
    };
    let as_holder = if ctx.args.implicit_holders {
        String::new()
    } else {
        format!(" (as holder {holder})")
    };
    let guard = match tokio::time::timeout(ctx.remaining(), call).await {
        Ok(Ok(Ok(guard))) => guard,
        Ok(Ok(Err(()))) => {
            ctx.record(
                task,
                EventKind::AcqFail {
                    attempt,
                    reason: format!("busy{as_holder}"),
                },
            )?;
            return Ok(WaitOutcome::Failed);
        }
        Ok(Err(e)) if e.is_timeout() || e.is_busy() => {
            ctx.record(
                task,
                EventKind::AcqFail {
                    attempt,
                    reason: format!("{e}{as_holder}"),
                },
            )?;
            return Ok(WaitOutcome::Failed);
        }
        Ok(Err(e)) => {
            ctx.record(
                task,
                EventKind::AcqInfo {
                    attempt,
                    reason: format!("{e}{as_holder}"),
                },
            )?;
            return Ok(WaitOutcome::Error);
        }
        Err(_) => {
            ctx.record(
                task,
                EventKind::AcqInfo {
                    attempt,
                    reason: "cancelled: worker max duration".to_owned(),
                },
            )?;
            return Err("max duration reached while waiting".to_owned());
        }
    };
    let mut held = ctx.log(task).acquired(attempt, &guard).map_err(recording)?;
    if ctx.resource.is_some() {
        ctx.resource_op(task, &mut held, Some(&guard)).await?;
    }
    // Hold until `--hold-ms` is up or the lease is lost, whichever comes first.
    let lost = if !ctx.args.hold.is_zero() {
        tokio::select! {
            reason = guard.lost() => Some(reason),
            () = tokio::time::sleep(ctx.args.hold) => None,
        }
    } else {
        guard.lease().loss_reason()
    };
    if let Some(reason) = lost {
        ctx.record_lost(task, &held, reason)?;
    }
    match ctx.release(task, &mut held, guard).await? {
        Released::Ok(0) => Ok(WaitOutcome::Acquired),
        // After a loss the entry may be gone or the link down: the release cannot succeed.
        Released::NotHeld | Released::Error(_) if lost.is_some() => Ok(WaitOutcome::Acquired),
        other => Err(format!("unlock of a depth-1 guard answered {other:?}")),
    }
}

/// The worker of every lock driven through the `DistributedLock` contract alone: the
/// combination lock (`--redis-url` repeated) and the ZooKeeper lock (`--zookeeper`), in
/// `contend` and `hold`.
mod generic {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::task::Poll;
    use std::time::{Duration, Instant};

    use ecosphere::history::{EventKind, OP_INCR, Recorder};
    use redis::aio::MultiplexedConnection;
    use slate_combination::{CombinationLock, NodeSet, NodeSetOptions, Order};
    use slate_core::{DistributedLock, LockGuard};
    use slate_zookeeper::{ZkClient, ZkLock};

    use super::{
        Args, CombOrder, Fenced, Held, Log, Logged, Mode, Res, connect, late_word, reason_code, say,
    };

    /// A lock this worker can drive: any lock whose guard the history can observe.
    trait Driven: DistributedLock {
        /// How many tasks of this process wait for the lock (the `STATS` line).
        fn local_waiters(&self) -> usize;
    }

    impl Driven for CombinationLock {
        fn local_waiters(&self) -> usize {
            CombinationLock::local_waiters(self)
        }
    }

    impl Driven for ZkLock {
        fn local_waiters(&self) -> usize {
            ZkLock::local_waiters(self)
        }
    }

    struct Comb<L> {
        args: Args,
        rec: Recorder,
        lock: L,
        resource: Option<MultiplexedConnection>,
        fenced: Option<Fenced>,
        deadline: Instant,
        attempts: AtomicU64,
        failed: AtomicU64,
        incomplete: AtomicU64,
    }

    impl<L> Comb<L> {
        fn record(&self, task: u64, kind: EventKind) -> Res<u64> {
            self.rec
                .record(task, &self.args.lock, kind)
                .map_err(|e| format!("recording: {e}"))
        }

        fn remaining(&self) -> Duration {
            self.deadline.saturating_duration_since(Instant::now())
        }

        /// Task `task`'s log of the lock's calls (shared with `slate demo`'s worker).
        fn log(&self, task: u64) -> Log<'_> {
            Log::new(&self.rec, &self.args.lock, task)
        }
    }

    fn check_mode(args: &Args, what: &str) -> Res<()> {
        if !matches!(args.mode, Mode::Contend | Mode::Hold | Mode::Reenter) || args.unsafe_skip_lock
        {
            return Err(format!(
                "the {what} supports --mode contend (without --unsafe-skip-lock), hold and \
                 reenter only"
            ));
        }
        Ok(())
    }

    /// The combination lock over the `--redis-url` nodes.
    pub(super) async fn combination(args: Args, deadline: Instant, rec: Recorder) -> Res<()> {
        check_mode(&args, "combination lock")?;
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
        let lock = builder
            .build()
            .map_err(|e| format!("building the lock: {e}"))?;
        drive(args, deadline, rec, lock).await
    }

    /// The ZooKeeper lock on the `--zookeeper` ensemble; `--lease-ms` is the session timeout
    /// (the session is the lease).
    pub(super) async fn zookeeper(args: Args, deadline: Instant, rec: Recorder) -> Res<()> {
        check_mode(&args, "ZooKeeper lock")?;
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
        let lock = builder
            .build()
            .map_err(|e| format!("building the lock: {e}"))?;
        drive(args, deadline, rec, lock).await
    }

    async fn drive<L: Driven>(args: Args, deadline: Instant, rec: Recorder, lock: L) -> Res<()> {
        let resource = match &args.resource_url {
            Some(url) => Some(connect(url).await?),
            None if args.mode == Mode::Contend => {
                return Err("contend needs --resource-url".to_owned());
            }
            None => None,
        };
        let fenced = match (&args.fenced_key, &resource) {
            (Some(key), Some(conn)) => Some(Fenced::new(conn.clone(), key, args.proc)),
            _ => None,
        };
        let ctx = Arc::new(Comb {
            args,
            rec,
            lock,
            resource,
            fenced,
            deadline,
            attempts: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            incomplete: AtomicU64::new(0),
        });
        say("READY")?;
        if let Some(go) = &ctx.args.go_file {
            while !go.exists() {
                if Instant::now() >= deadline {
                    return Err(format!("{} did not appear in time", go.display()));
                }
                tokio::time::sleep(super::GO_POLL).await;
            }
            say("GO")?;
        }
        let mut errors = Vec::new();
        if ctx.args.mode == Mode::Hold {
            if let Err(e) = hold(&ctx).await {
                errors.push(e);
            }
        } else if ctx.args.mode == Mode::Reenter {
            if let Err(e) = reenter(&ctx).await {
                errors.push(e);
            }
        } else {
            let mut tasks = tokio::task::JoinSet::new();
            for task in 0..ctx.args.tasks {
                let ctx = Arc::clone(&ctx);
                tasks.spawn(async move { contend_task(&ctx, task).await });
            }
            let mut total = 0u64;
            while let Some(joined) = tasks.join_next().await {
                match joined {
                    Ok(Ok(n)) => total += n,
                    Ok(Err(e)) => errors.push(e),
                    Err(e) => errors.push(format!("task panicked: {e}")),
                }
            }
            say(&format!(
                "DONE acquisitions={total} failed_attempts={} incomplete_releases={}",
                ctx.failed.load(Ordering::Relaxed),
                ctx.incomplete.load(Ordering::Relaxed)
            ))?;
        }
        if !ctx.args.linger.is_zero() {
            tokio::time::sleep(ctx.args.linger.min(ctx.remaining())).await;
        }
        if let Some(f) = &ctx.fenced {
            say(&f.line())?;
        }
        say(&format!(
            "STATS renewals=0 subscriptions=0 local_waiters={}",
            ctx.lock.local_waiters()
        ))?;
        ctx.rec.flush().map_err(|e| format!("flushing: {e}"))?;
        match errors.first() {
            None => Ok(()),
            Some(first) => Err(format!("{} task(s) failed; first: {first}", errors.len())),
        }
    }

    /// `lock()` until acquired (bounded by the run's deadline): `acq_invoke`, then `acq_ok`, or
    /// `acq_fail` and another attempt after the spin wait.
    async fn acquire<L: Driven>(ctx: &Comb<L>, task: u64) -> Res<(L::Guard, Held)> {
        let log = ctx.log(task);
        loop {
            let attempt = ctx.attempts.fetch_add(1, Ordering::Relaxed);
            let call = async {
                let lock = async {
                    if ctx.args.cancel_unlock {
                        ctx.lock.lock_as(slate_redis::HolderId::new()).await
                    } else {
                        ctx.lock.lock().await
                    }
                };
                tokio::time::timeout(ctx.remaining(), lock)
                    .await
                    .unwrap_or(Err(super::MAX_DURATION))
            };
            match log.acquire(attempt, call).await.map_err(super::recording)? {
                Ok(acquired) => return Ok(acquired),
                // Nothing held (what was taken was released): `acq_fail`, and again.
                Err(e)
                    if e.is_insufficient_nodes()
                        || e.is_timeout()
                        || (ctx.args.tolerate_errors && e.is_retryable()) =>
                {
                    ctx.failed.fetch_add(1, Ordering::Relaxed);
                    let pause = ctx.args.spin_wait.unwrap_or(Duration::from_millis(50));
                    tokio::time::sleep(pause.min(ctx.remaining())).await;
                }
                Err(_) if ctx.remaining().is_zero() => {
                    return Err("max duration reached while waiting for the lock".to_owned());
                }
                Err(e) => return Err(format!("lock() failed: {e}")),
            }
        }
    }

    async fn contend_task<L: Driven>(ctx: &Comb<L>, task: u64) -> Res<u64> {
        let mut done = 0;
        for _ in 0..ctx.args.iterations {
            if super::stop_requested(&ctx.args) {
                break;
            }
            if Instant::now() >= ctx.deadline {
                return Err(format!("max duration reached after {done} iterations"));
            }
            let (guard, mut held) = acquire(ctx, task).await?;
            resource_op(ctx, task, &guard, &mut held).await?;
            ctx.log(task)
                .note_loss(&held, &guard)
                .map_err(super::recording)?;
            match release(ctx, task, &mut held, guard).await? {
                Released::Ok(_) | Released::NotHeld | Released::Cancelled => {}
                Released::Incomplete(_) => {
                    ctx.incomplete.fetch_add(1, Ordering::Relaxed);
                }
                // A release that failed (a server going away) is finished in the background.
                Released::Error(_) if ctx.args.tolerate_errors => {
                    ctx.incomplete.fetch_add(1, Ordering::Relaxed);
                }
                Released::Error(e) => return Err(format!("unlock failed: {e}")),
            }
            done += 1;
        }
        Ok(done)
    }

    /// Outcome of a combination unlock.
    enum Released {
        Ok(u32),
        NotHeld,
        /// `ReleaseIncomplete`: some node could not be reached (its entry expires with the lease).
        Incomplete(String),
        Error(String),
        /// `--cancel-unlock`: the caller stopped waiting; the release goes on in the background.
        Cancelled,
    }

    /// `rel_invoke`, `unlock()`, then `rel_ok` / `rel_fail{not_held}` / `rel_info` (with
    /// `--cancel-unlock`, the unlock is given up after its first poll: `rel_info`).
    async fn release<L: Driven>(
        ctx: &Comb<L>,
        task: u64,
        held: &mut Held,
        guard: L::Guard,
    ) -> Res<Released> {
        let log = ctx.log(task);
        let released = if ctx.args.cancel_unlock {
            log.release_invoked(held).map_err(super::recording)?;
            let mut unlock = Box::pin(guard.unlock());
            match futures::poll!(unlock.as_mut()) {
                Poll::Pending => {
                    drop(unlock);
                    ctx.record(
                        task,
                        EventKind::RelInfo {
                            holder: held.holder.clone(),
                            reason: "cancelled: unlock dropped after its first poll".to_owned(),
                        },
                    )?;
                    return Ok(Released::Cancelled);
                }
                Poll::Ready(outcome) => log.release_answered(held, outcome),
            }
        } else {
            log.release(held, guard, ctx.remaining()).await
        };
        Ok(match released.map_err(super::recording)? {
            Logged::Done(n) => Released::Ok(n),
            Logged::NotHeld => Released::NotHeld,
            Logged::Failed(e) if e.is_release_incomplete() => Released::Incomplete(e.to_string()),
            Logged::Failed(e) => Released::Error(e.to_string()),
            Logged::TimedOut => Released::Error("max duration reached during unlock".to_owned()),
        })
    }

    /// One resource operation: the fenced write (with `--fenced-key`), GET then SET+1 of the
    /// counter (non-atomic on purpose), then `renew_ok` if the deadline moved past `logged`, and
    /// the `res_op` events; a failed increment is recorded (`unknown:<error>`) and returned.
    async fn resource_op<L: Driven>(
        ctx: &Comb<L>,
        task: u64,
        guard: &L::Guard,
        held: &mut Held,
    ) -> Res<()> {
        let token = held.token;
        let fenced = match &ctx.fenced {
            Some(f) => Some(f.write(&held.holder, token).await),
            None => None,
        };
        let counted = match &ctx.resource {
            Some(conn) => Some(super::counter_incr(conn.clone(), &ctx.args.counter_key).await),
            None => None,
        };
        ctx.log(task)
            .note_renewal(held, guard)
            .map_err(super::recording)?;
        if let Some(f) = fenced {
            ctx.record(task, f)?;
        }
        match counted {
            Some(counted) => {
                ctx.record(
                    task,
                    EventKind::ResOp {
                        holder: held.holder.clone(),
                        token,
                        op: OP_INCR.to_owned(),
                        outcome: super::incr_outcome(&counted),
                        invoked: None,
                    },
                )?;
                counted
            }
            None => Ok(()),
        }
    }

    /// `reenter`: acquire, re-enter twice as the same holder (`lock_as`), check the depth,
    /// the token and `hold_count`, hold `--hold-ms`, then release level by level
    /// (`RELEASED n`, `--step-ms` apart).
    async fn reenter<L: Driven>(ctx: &Comb<L>) -> Res<()> {
        let (g1, mut held) = acquire(ctx, 0).await?;
        say(&format!("HOLDING {} {}", held.holder, held.token))?;
        say("DEPTH 1")?;
        let holder = g1.holder();
        let mut guards = vec![g1];
        for depth in 2..=3u32 {
            let attempt = ctx.attempts.fetch_add(1, Ordering::Relaxed);
            let call = async {
                tokio::time::timeout(ctx.remaining(), ctx.lock.lock_as(holder))
                    .await
                    .unwrap_or(Err(super::MAX_DURATION))
            };
            let (g, h) = ctx
                .log(0)
                .acquire(attempt, call)
                .await
                .map_err(super::recording)?
                .map_err(|e| format!("re-entry to depth {depth} failed: {e}"))?;
            if h.depth != depth || h.token != held.token || h.holder != held.holder {
                return Err(format!(
                    "re-entry {depth}: depth {} token {} holder {} (first level: token {} \
                     holder {})",
                    h.depth, h.token, h.holder, held.token, held.holder
                ));
            }
            held.deadline = held.deadline.max(h.deadline);
            guards.push(g);
            say(&format!("DEPTH {depth}"))?;
        }
        held.depth = 3;
        let count = ctx
            .lock
            .hold_count(holder)
            .await
            .map_err(|e| format!("hold_count: {e}"))?;
        say(&format!("HOLD_COUNT {count}"))?;
        if count != 3 {
            return Err(format!("hold_count is {count} at depth 3"));
        }
        let step = ctx.args.step;
        let mut pause = ctx.args.hold;
        while let Some(guard) = guards.pop() {
            tokio::time::sleep(pause.min(ctx.remaining())).await;
            pause = step;
            ctx.log(0)
                .note_renewal(&mut held, &guard)
                .map_err(super::recording)?;
            let expect = held.depth - 1;
            match release(ctx, 0, &mut held, guard).await? {
                Released::Ok(n) if n == expect => say(&format!("RELEASED {n}"))?,
                Released::Ok(n) => return Err(format!("release to depth {expect} answered {n}")),
                Released::NotHeld => return Err(format!("release to depth {expect}: not held")),
                Released::Cancelled => return Err("a reentry release was cancelled".to_owned()),
                Released::Incomplete(e) | Released::Error(e) => {
                    return Err(format!("release to depth {expect}: {e}"));
                }
            }
        }
        Ok(())
    }

    /// `hold`: acquire (retrying failed attempts), hold with resource
    /// operations until done or lost, unlock.
    async fn hold<L: Driven>(ctx: &Comb<L>) -> Res<()> {
        let (guard, mut held) = acquire(ctx, 0).await?;
        let (holder, token) = (held.holder.clone(), held.token);
        say(&format!("HOLDING {holder} {token}"))?;
        let end = (Instant::now() + ctx.args.hold).min(ctx.deadline);
        let mut tick = tokio::time::interval(super::TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let lost = loop {
            tokio::select! {
                biased;
                reason = guard.lost() => break Some(reason),
                () = tokio::time::sleep_until(end.into()) => break None,
                _ = tick.tick() => {
                    if !super::may_operate(guard.lease()) {
                        // Lost (lost() completes at once), or too close to the deadline.
                    } else if ctx.resource.is_some() {
                        // A failed increment is a recorded outcome here, not a failure.
                        let _ = resource_op(ctx, 0, &guard, &mut held).await;
                    } else {
                        ctx.log(0)
                            .note_renewal(&mut held, &guard)
                            .map_err(super::recording)?;
                    }
                }
            }
        };
        if let Some(reason) = lost {
            ctx.record(
                0,
                EventKind::Lost {
                    holder: holder.clone(),
                    reason: reason.to_string(),
                },
            )?;
            say(&format!("LOST {}", reason_code(reason)))?;
            if ctx.args.late_write
                && let Some(f) = &ctx.fenced
            {
                let event = f.write(&holder, token).await;
                say(&format!("LATE {}", late_word(&event)))?;
                ctx.record(0, event)?;
            }
        }
        super::wait_unlock_file(ctx.args.unlock_file.as_ref(), ctx.deadline).await?;
        let line = match release(ctx, 0, &mut held, guard).await? {
            Released::Ok(n) => format!("ok {n}"),
            Released::NotHeld => "not_held".to_owned(),
            Released::Cancelled => "cancelled".to_owned(),
            Released::Incomplete(m) | Released::Error(m) => {
                format!("error {}", m.replace('\n', " "))
            }
        };
        say(&format!("UNLOCK {line}"))
    }
}

/// Shared mode (`--shared rw|sem`): a read-write lock or a semaphore of the library, in
/// `contend` and `hold`.
///
/// Every hold's `acq_ok` carries its permits (a read 1, a write 2^30, a semaphore's `k`), so
/// that the checker (run with the capacity) can tell overlapping readers from an overlap that
/// breaks exclusion. Independently of the history, every hold adds its permits to the
/// counter `<counter-key>:inside` on the resource server (`INCRBY` after the grant, `DECRBY`
/// before the release) and the worker reports the highest value it read: it can only
/// under-count an overlap, so a value above the capacity is a real violation.
///
/// - `contend`: `--tasks` × `--iterations` holds; on a read-write lock each one reads
///   (`--read-percent`, a GET of the counter) or writes (GET then SET+1 of the counter, as the
///   single lock's scenarios do); on a semaphore each takes `--permits`. Prints `DONE
///   acquisitions=N writes=W max_inside=M max_shared=S` (S: the most permits seen in use
///   by reads or permit holds at once).
/// - `hold`: takes the read or write lock (`--hold-as`) or `--permits` permits, prints
///   `HOLDING <holder> <token>`, notes renewals every 50 ms for `--hold-ms` or until the lease
///   is lost (`LOST <reason>`), then releases: `UNLOCK ok <n>`, `UNLOCK not_held` or `UNLOCK
///   error <message>`.
mod shared {
    use super::*;
    use slate_redis::{LockGuard, RwLock, Semaphore, WRITE_PERMITS};

    enum Prim {
        Rw(RwLock),
        Sem(Semaphore),
    }

    struct Sh {
        args: Args,
        rec: Recorder,
        prim: Prim,
        resource: Option<MultiplexedConnection>,
        deadline: Instant,
        attempts: AtomicU64,
        max_inside: AtomicU64,
        /// The highest value read below a write's permits: shared holds at once.
        max_shared: AtomicU64,
        writes: AtomicU64,
    }

    /// A held guard of any of the three kinds.
    enum Guard {
        Read(slate_redis::RwLockReadGuard),
        Write(slate_redis::RwLockWriteGuard),
        Permit(slate_redis::SemaphorePermit),
    }

    impl Guard {
        fn permits(&self) -> u64 {
            match self {
                Guard::Read(g) => LockGuard::permits(g),
                Guard::Write(g) => LockGuard::permits(g),
                Guard::Permit(g) => LockGuard::permits(g),
            }
            .unwrap_or(WRITE_PERMITS)
        }

        fn lease(&self) -> &slate_redis::LeaseWatch {
            match self {
                Guard::Read(g) => g.lease(),
                Guard::Write(g) => g.lease(),
                Guard::Permit(g) => g.lease(),
            }
        }
    }

    impl Sh {
        fn log(&self, task: u64) -> Log<'_> {
            Log::new(&self.rec, &self.args.lock, task)
        }

        fn remaining(&self) -> Duration {
            self.deadline.saturating_duration_since(Instant::now())
        }

        fn inside_key(&self) -> String {
            format!("{}:inside", self.args.counter_key)
        }

        /// Takes a hold (`write` on a read-write lock) bounded by the run's deadline, logged.
        async fn acquire(&self, task: u64, write: bool) -> Res<(Guard, Held)> {
            match &self.prim {
                Prim::Rw(l) if write => {
                    let (g, h) = self.logged(task, l.write()).await?;
                    Ok((Guard::Write(g), h))
                }
                Prim::Rw(l) => {
                    let (g, h) = self.logged(task, l.read()).await?;
                    Ok((Guard::Read(g), h))
                }
                Prim::Sem(s) => {
                    let (g, h) = self.logged(task, s.acquire(self.args.permits)).await?;
                    Ok((Guard::Permit(g), h))
                }
            }
        }

        async fn logged<G: LockGuard>(
            &self,
            task: u64,
            call: impl std::future::Future<Output = slate_redis::Result<G>>,
        ) -> Res<(G, Held)> {
            let attempt = self.attempts.fetch_add(1, Ordering::Relaxed);
            let remaining = self.remaining();
            let bounded = async {
                tokio::time::timeout(remaining, call)
                    .await
                    .unwrap_or(Err(MAX_DURATION))
            };
            self.log(task)
                .acquire(attempt, bounded)
                .await
                .map_err(recording)?
                .map_err(|e| format!("acquire failed: {e}"))
        }

        /// `INCRBY inside permits` (tracking the highest value), the resource operation, and
        /// `renew_ok` if the deadline moved.
        async fn inside(&self, task: u64, held: &mut Held, guard: &Guard, write: bool) -> Res<()> {
            let Some(mut conn) = self.resource.clone() else {
                return Ok(());
            };
            let p = guard.permits();
            let v: u64 = conn
                .incr(self.inside_key(), p)
                .await
                .map_err(|e| format!("INCRBY inside: {e}"))?;
            self.max_inside.fetch_max(v, Ordering::SeqCst);
            if v < WRITE_PERMITS {
                self.max_shared.fetch_max(v, Ordering::SeqCst);
            }
            let (op, outcome) = if write {
                let counted = counter_incr(conn.clone(), &self.args.counter_key).await;
                self.writes.fetch_add(1, Ordering::Relaxed);
                (OP_INCR.to_owned(), incr_outcome(&counted))
            } else {
                let v: Option<u64> = conn
                    .get(&self.args.counter_key)
                    .await
                    .map_err(|e| format!("GET counter: {e}"))?;
                ("u_read".to_owned(), v.unwrap_or(0).to_string())
            };
            self.note(task, held, guard)?;
            self.log(task)
                .record(EventKind::ResOp {
                    holder: held.holder.clone(),
                    token: held.token,
                    op,
                    outcome,
                    invoked: None,
                })
                .map_err(recording)?;
            let _: i64 = conn
                .decr(self.inside_key(), p)
                .await
                .map_err(|e| format!("DECRBY inside: {e}"))?;
            Ok(())
        }

        fn note(&self, task: u64, held: &mut Held, guard: &Guard) -> Res<()> {
            let log = self.log(task);
            match guard {
                Guard::Read(g) => log.note_renewal(held, g),
                Guard::Write(g) => log.note_renewal(held, g),
                Guard::Permit(g) => log.note_renewal(held, g),
            }
            .map_err(recording)
        }

        async fn release(&self, task: u64, held: &mut Held, guard: Guard) -> Res<Released> {
            let log = self.log(task);
            let budget = self.remaining();
            let released = match guard {
                Guard::Read(g) => log.release(held, g, budget).await,
                Guard::Write(g) => log.release(held, g, budget).await,
                Guard::Permit(g) => log.release(held, g, budget).await,
            }
            .map_err(recording)?;
            Ok(match released {
                Logged::Done(n) => Released::Ok(n),
                Logged::NotHeld => Released::NotHeld,
                Logged::Failed(e) => Released::Error(e.to_string()),
                Logged::TimedOut => {
                    Released::Error("max duration reached during unlock".to_owned())
                }
            })
        }

        /// Whether the next hold of `task` writes (a read-write lock's `--read-percent`).
        fn writes_next(&self, rng: &mut u64) -> bool {
            if !matches!(self.prim, Prim::Rw(_)) {
                return false;
            }
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            *rng % 100 >= self.args.read_percent
        }
    }

    pub(super) async fn run(
        args: Args,
        deadline: Instant,
        rec: Recorder,
        client: RedisClient,
    ) -> Res<()> {
        let lease = args.lease;
        let spin = args.spin_wait;
        let prim = match args.shared {
            Some(SharedKind::Sem) => {
                let mut b = Semaphore::builder(&client, &args.lock, args.capacity).lease(lease);
                if let Some(d) = spin {
                    b = b.spin_wait(d);
                }
                Prim::Sem(
                    b.build()
                        .map_err(|e| format!("building the semaphore: {e}"))?,
                )
            }
            _ => {
                let mut b = RwLock::builder(&client, &args.lock).lease(lease);
                if let Some(d) = spin {
                    b = b.spin_wait(d);
                }
                Prim::Rw(b.build().map_err(|e| format!("building the lock: {e}"))?)
            }
        };
        let resource = match &args.resource_url {
            Some(url) => Some(connect(url).await?),
            None => None,
        };
        tokio::time::timeout(Duration::from_secs(5), client.ping())
            .await
            .map_err(|_| "PING of the lock server timed out".to_owned())?
            .map_err(|e| format!("PING of the lock server: {e}"))?;
        let sh = Arc::new(Sh {
            args,
            rec,
            prim,
            resource,
            deadline,
            attempts: AtomicU64::new(0),
            max_inside: AtomicU64::new(0),
            max_shared: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        });
        say("READY")?;
        if let Some(go) = &sh.args.go_file {
            while !go.exists() {
                if Instant::now() >= deadline {
                    return Err(format!("{} did not appear in time", go.display()));
                }
                tokio::time::sleep(GO_POLL).await;
            }
            say("GO")?;
        }
        let result = match sh.args.mode {
            Mode::Contend => contend(&sh).await,
            Mode::Hold => hold(&sh).await,
            other => Err(format!(
                "shared mode supports --mode contend and hold, not {other:?}"
            )),
        };
        let s = client.stats();
        say(&format!(
            "STATS renewals={} subscriptions={} local_waiters={}",
            s.renewals, s.subscriptions, s.local_waiters
        ))?;
        sh.rec.flush().map_err(|e| format!("flushing: {e}"))?;
        result
    }

    async fn contend(sh: &Arc<Sh>) -> Res<()> {
        let mut tasks = tokio::task::JoinSet::new();
        for task in 0..sh.args.tasks {
            let sh = Arc::clone(sh);
            tasks.spawn(async move {
                let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (u64::from(sh.args.proc) << 32) ^ task;
                let mut done = 0;
                for _ in 0..sh.args.iterations {
                    if super::stop_requested(&sh.args) {
                        break;
                    }
                    let write = sh.writes_next(&mut rng);
                    let (guard, mut held) = match sh.acquire(task, write).await {
                        Ok(acquired) => acquired,
                        // A paused or unreachable server: the failure is in the history
                        // (`acq_info`); the next iteration tries again.
                        Err(e) if sh.args.tolerate_errors && sh.remaining() > TICK => {
                            eprintln!("slate-worker {}: {e}; going on", sh.args.proc);
                            tokio::time::sleep(TICK).await;
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    let op = sh.inside(task, &mut held, &guard, write).await;
                    let released = sh.release(task, &mut held, guard).await?;
                    op?;
                    done += 1;
                    match released {
                        Released::Ok(_) => {}
                        // The lease ended while held (a loss, recorded): nothing to release.
                        Released::NotHeld if sh.args.tolerate_errors => {}
                        Released::Error(e) if sh.args.tolerate_errors => {
                            eprintln!("slate-worker {}: release: {e}; going on", sh.args.proc);
                        }
                        other => return Err(format!("release: {}", other.line())),
                    }
                }
                Ok::<u64, String>(done)
            });
        }
        let mut total = 0u64;
        let mut errors = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Ok(n)) => total += n,
                Ok(Err(e)) => errors.push(e),
                Err(e) => errors.push(format!("task panicked: {e}")),
            }
        }
        say(&format!(
            "DONE acquisitions={total} writes={} max_inside={} max_shared={}",
            sh.writes.load(Ordering::Relaxed),
            sh.max_inside.load(Ordering::SeqCst),
            sh.max_shared.load(Ordering::SeqCst)
        ))?;
        match errors.first() {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    async fn hold(sh: &Arc<Sh>) -> Res<()> {
        let write = sh.args.hold_as == HoldAs::Write && matches!(sh.prim, Prim::Rw(_));
        let (guard, mut held) = match sh.acquire(0, write).await {
            Ok(acquired) => acquired,
            Err(e) => {
                say(&format!("ACQUIRE error {}", e.replace('\n', " ")))?;
                return Ok(());
            }
        };
        say(&format!("HOLDING {} {}", held.holder, held.token))?;
        let until = Instant::now() + sh.args.hold;
        while Instant::now() < until && sh.remaining() > TICK {
            if let Some(reason) = guard.lease().loss_reason() {
                sh.log(0)
                    .record(EventKind::Lost {
                        holder: held.holder.clone(),
                        reason: reason.to_string(),
                    })
                    .map_err(recording)?;
                say(&format!("LOST {}", reason_code(reason)))?;
                break;
            }
            sh.note(0, &mut held, &guard)?;
            tokio::time::sleep(TICK).await;
        }
        let released = sh.release(0, &mut held, guard).await?;
        say(&format!("UNLOCK {}", released.line()))
    }
}
