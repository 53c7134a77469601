//! Shared by the `combination_*` scenario tests (reliability.md C5–C9): servers, per-client
//! views and proxies, in-process clients that record their history like `slate-worker` does,
//! an observer polling one node's lock hash, direct reads of the servers, and condition waits
//! with deadlines.
#![allow(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ecosphere::clock::{now_ns, to_mono_ns};
use ecosphere::history::{
    CheckConfig, EventKind, FencedOutcome, History, OP_FENCED_WRITE, OP_INCR, OUTCOME_OK, Recorder,
    Report,
};
use ecosphere::proxy::{FaultProxy, Mode};
use ecosphere::server::RedisServer;
use ecosphere::workers::{WorkerOutput, WorkerSet};
use slate_combination::{CombinationLock, CombinationLockGuard, NodeSet, NodeSetOptions};
use slate_core::{Error, HolderId, Wait};

/// The worker binary built with this package.
pub const WORKER: &str = env!("CARGO_BIN_EXE_slate-worker");

/// Key prefix of every lock here (the library default).
pub const PREFIX: &str = "slate:";

/// `n` fresh servers.
pub fn servers(n: usize) -> Vec<RedisServer> {
    RedisServer::start_many(n).expect("redis-server (apt-get install -y redis-server)")
}

/// The URLs of the servers.
pub fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

/// One proxy in front of each server.
pub fn proxies(servers: &[RedisServer]) -> Vec<FaultProxy> {
    servers
        .iter()
        .map(|s| FaultProxy::start(s.addr()).expect("proxy"))
        .collect()
}

/// The URLs of the proxies.
pub fn proxy_urls(proxies: &[FaultProxy]) -> Vec<String> {
    proxies.iter().map(FaultProxy::url).collect()
}

/// Sets a proxy's mode, panicking on failure.
pub fn set(proxy: &FaultProxy, mode: Mode) {
    proxy.set_mode(mode).expect("proxy mode");
}

/// A delay of requests (replies unaffected).
pub fn delay(d: Duration) -> Mode {
    Mode::Delay {
        to_server: d,
        to_client: Duration::ZERO,
    }
}

/// Node-set options of a client view: node operation time `op`, re-probe interval `reprobe`.
pub fn opts(op: Duration, reprobe: Duration) -> NodeSetOptions {
    NodeSetOptions::builder()
        .node_operation_time(op)
        .reprobe_interval(reprobe)
        .build()
        .unwrap()
}

/// A client's view of `urls` (its own clients and node health).
pub fn view(urls: Vec<String>, opts: NodeSetOptions) -> NodeSet {
    NodeSet::connect(urls, opts).expect("node set")
}

/// Runs `f` to completion on a new current-thread runtime (for synchronous tests).
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
        .block_on(f)
}

/// Adopts the servers as fresh (they were started moments ago) through a throwaway view.
pub async fn adopt(urls: &[String]) {
    // A generous node operation time: the machine may be loaded (parallel tests, builds).
    let nodes = view(
        urls.to_vec(),
        NodeSetOptions::builder()
            .node_operation_time(Duration::from_secs(1))
            .build()
            .unwrap(),
    );
    assert_eq!(
        nodes.adopt_fresh_servers(PREFIX).await.expect("adopt"),
        urls.len(),
        "every node adopted"
    );
}

/// Verifies every node of `nodes` (one acquisition and release of a warm-up lock), so that a
/// fault is met by the scenario's own attempts, with the node's run id known.
pub async fn warm(nodes: &NodeSet) {
    // A long lease, so that the default acquire budget (node operation time × N + 100 ms)
    // fits in it for slow views too; it stays within the default quarantine (30 s).
    let l = CombinationLock::builder(nodes, "warm-up")
        .lease(Duration::from_secs(30))
        .build()
        .expect("warm-up lock");
    let g = l.lock().await.expect("warm-up acquisition");
    assert_eq!(g.nodes().len(), nodes.len(), "warm-up held every node");
    g.unlock().await.expect("warm-up release");
}

/// The lock hash key of `name`.
pub fn key(name: &str) -> String {
    format!("{PREFIX}{{{name}}}")
}

/// `HGETALL` of the lock key on one server, as field → count (empty when absent).
pub fn entries(server: &RedisServer, name: &str) -> BTreeMap<String, u64> {
    redis::from_redis_value(server.command(&["HGETALL", &key(name)]).expect("HGETALL"))
        .expect("HGETALL reply")
}

/// `PTTL` of the lock key on one server (−2 when absent).
pub fn pttl(server: &RedisServer, name: &str) -> i64 {
    redis::from_redis_value(server.command(&["PTTL", &key(name)]).expect("PTTL")).expect("int")
}

/// Lock keys on the servers: everything but the persistent fencing counters and node markers,
/// and the request records (`…:req:…`) that expire on their own (a record without a TTL
/// counts).
pub fn lock_keys(servers: &[RedisServer]) -> Vec<String> {
    servers
        .iter()
        .enumerate()
        .flat_map(|(i, s)| {
            let keys: Vec<String> =
                redis::from_redis_value(s.command(&["KEYS", "*"]).expect("KEYS")).expect("KEYS");
            keys.into_iter()
                .filter(|k| !k.ends_with(":fence") && !k.ends_with("node-marker"))
                .filter(|k| {
                    let ttl: i64 = redis::from_redis_value(s.command(&["PTTL", k]).expect("PTTL"))
                        .expect("int");
                    // Gone meanwhile (-2) or an expiring request record.
                    ttl != -2 && !(k.contains(":req:") && ttl >= 0)
                })
                .map(move |k| format!("node {i}: {k}"))
        })
        .collect()
}

/// Polls `f` every 10 ms until it returns `Some`, failing the test after `within`.
pub fn wait_for<T>(within: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// As [`wait_for`], from async code (the polls run off the runtime's threads; needs the
/// multi-thread runtime).
pub async fn wait_async<T>(within: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = tokio::task::block_in_place(&mut f) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until no lock key is left on the servers; returns what is left at the deadline.
pub fn wait_quiet(servers: &[RedisServer], within: Duration) -> Vec<String> {
    let deadline = Instant::now() + within;
    loop {
        let left = lock_keys(servers);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Loads the history, checks it, prints the report; no line may be cut short.
pub fn check(dir: &Path, cfg: &CheckConfig) -> (History, Report) {
    let history = History::load(dir).expect("load history");
    assert_eq!(history.truncated_lines(), 0, "truncated history lines");
    let report = history.check(cfg);
    println!("{report}");
    (history, report)
}

/// What one recorded acquisition call ended with.
pub enum Outcome {
    /// Acquired (`acq_ok`).
    Acquired(Held),
    /// Definitely not acquired (`acq_fail`): busy, timed out waiting, insufficient nodes, or
    /// the acquire budget spent. The error (`None` for busy under [`Wait::Immediate`]).
    Failed(Option<Error>),
    /// Indeterminate (`acq_info`): any other error.
    Indeterminate(Error),
}

impl Outcome {
    /// The hold, panicking with `what` otherwise.
    pub fn held(self, what: &str) -> Held {
        match self {
            Outcome::Acquired(h) => h,
            Outcome::Failed(e) => panic!("{what}: not acquired: {e:?}"),
            Outcome::Indeterminate(e) => panic!("{what}: indeterminate: {e}"),
        }
    }
}

/// One in-process client of a scenario: its own view of the nodes (its own lock instance,
/// node set and connections), recording its history as `proc` with the rules of
/// `ecosphere::history` (invokes before the call, outcomes after, renewals when the deadline
/// moved, `lost` when the guard reports it).
#[derive(Clone)]
pub struct Client {
    /// The recorder (one file per client).
    pub rec: Recorder,
    /// The lock, on this client's view.
    pub lock: CombinationLock,
    name: String,
    attempts: Arc<AtomicU64>,
}

impl Client {
    /// A client of `lock` recording as `proc` in `dir`.
    pub fn new(dir: &Path, proc: u32, lock: CombinationLock) -> Self {
        Client {
            rec: Recorder::create(dir, proc).expect("recorder"),
            name: lock.name().to_string(),
            lock,
            attempts: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Records an event of this client; returns its stamp.
    pub fn record(&self, task: u64, kind: EventKind) -> u64 {
        self.rec.record(task, &self.name, kind).expect("record")
    }

    /// The client's node set.
    pub fn nodes(&self) -> &NodeSet {
        self.lock.nodes()
    }

    /// One recorded acquisition as `holder`, waiting as `wait` says (bounded by `cap` in any
    /// case: a call still waiting then is abandoned and recorded as `acq_fail`).
    pub async fn acquire(&self, task: u64, holder: HolderId, wait: Wait, cap: Duration) -> Outcome {
        let attempt = self.attempts.fetch_add(1, Ordering::Relaxed);
        let budget_ms = match wait {
            Wait::Immediate => Some(0),
            Wait::Until(t) => Some(
                u64::try_from(t.saturating_duration_since(Instant::now()).as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1),
            ),
            Wait::Forever => None,
        };
        let invoked = Instant::now();
        let t_invoke = self.record(task, EventKind::AcqInvoke { attempt, budget_ms });
        let fail = |reason: String| EventKind::AcqFail { attempt, reason };
        match tokio::time::timeout(cap, self.lock.acquire(holder, wait)).await {
            Ok(Ok(guard)) => {
                let deadline = to_mono_ns(guard.lease().deadline());
                let t = self.record(
                    task,
                    EventKind::AcqOk {
                        attempt,
                        holder: guard.holder().to_string(),
                        token: guard.fencing_token().get(),
                        depth: guard.depth(),
                        deadline,
                        nodes: guard.nodes().to_vec(),
                        permits: None,
                    },
                );
                Outcome::Acquired(Held {
                    client: self.clone(),
                    task,
                    holder: guard.holder().to_string(),
                    guard,
                    logged: deadline,
                    lost_logged: false,
                    invoked,
                    t_invoke,
                    t_acquired: t,
                })
            }
            Ok(Err(e)) if e.is_busy() => {
                self.record(task, fail("busy".to_owned()));
                Outcome::Failed(None)
            }
            Ok(Err(e)) if e.is_timeout() || e.is_insufficient_nodes() => {
                self.record(task, fail(e.to_string()));
                Outcome::Failed(Some(e))
            }
            Ok(Err(e)) => {
                self.record(
                    task,
                    EventKind::AcqInfo {
                        attempt,
                        reason: e.to_string(),
                    },
                );
                Outcome::Indeterminate(e)
            }
            Err(_) => {
                // Dropping the call removes it from the queue; a grant obtained meanwhile is
                // released by the library, never handed out.
                self.record(task, fail(format!("abandoned after {cap:?}")));
                Outcome::Failed(None)
            }
        }
    }
}

impl Client {
    /// Acquires as `holder`, waiting, and retrying (like `slate-worker`) after an attempt that
    /// failed on its nodes (`InsufficientNodes` or the acquire budget: a node too slow under
    /// load is marked unavailable until it is re-probed), each failure recorded as `acq_fail`;
    /// panics if not acquired within `cap`.
    pub async fn acquire_retrying(&self, task: u64, holder: HolderId, cap: Duration) -> Held {
        let end = Instant::now() + cap;
        let mut failures = 0;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.acquire(task, holder, Wait::Forever, left).await {
                Outcome::Acquired(h) => return h,
                Outcome::Failed(Some(e))
                    if (e.is_insufficient_nodes() || e.is_timeout()) && failures < 100 =>
                {
                    failures += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Outcome::Failed(e) => panic!("not acquired within {cap:?}: {e:?}"),
                Outcome::Indeterminate(e) => panic!("indeterminate acquisition: {e}"),
            }
        }
    }
}

/// One recorded hold (one level) of a [`Client`].
pub struct Held {
    client: Client,
    task: u64,
    holder: String,
    /// The guard.
    pub guard: CombinationLockGuard,
    /// Last deadline recorded (monotonic ns).
    logged: u64,
    lost_logged: bool,
    /// Just before the acquisition call (before its first command).
    pub invoked: Instant,
    /// Stamp of `acq_invoke`.
    pub t_invoke: u64,
    /// Stamp of `acq_ok`.
    pub t_acquired: u64,
}

impl Held {
    /// The holder id (the hash field).
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Records a `renew_ok` if the deadline moved and `lost` (once) if the lease is lost;
    /// returns whether the hold is still valid.
    pub fn note(&mut self) -> bool {
        let d = to_mono_ns(self.guard.lease().deadline());
        if d > self.logged {
            self.logged = d;
            self.client.record(
                self.task,
                EventKind::RenewOk {
                    holder: self.holder.clone(),
                    deadline: d,
                },
            );
        }
        if let Some(reason) = self.guard.lease().loss_reason() {
            if !self.lost_logged {
                self.lost_logged = true;
                self.client.record(
                    self.task,
                    EventKind::Lost {
                        holder: self.holder.clone(),
                        reason: reason.to_string(),
                    },
                );
            }
            return false;
        }
        true
    }

    /// Holds for `d`, noting renewals every 20 ms; returns whether the hold is still valid.
    pub async fn hold_for(&mut self, d: Duration) -> bool {
        let end = Instant::now() + d;
        while Instant::now() < end {
            if !self.note() {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20).min(end - Instant::now())).await;
        }
        self.note()
    }

    /// One GET-then-SET increment of `counter` on the resource server (non-atomic on purpose),
    /// recorded as a resource operation inside the hold.
    pub fn increment(&mut self, resource: &RedisServer, counter: &str) {
        let v: Option<u64> = tokio::task::block_in_place(|| {
            redis::from_redis_value(resource.command(&["GET", counter]).expect("GET")).expect("int")
        });
        tokio::task::block_in_place(|| {
            resource
                .command(&["SET", counter, &(v.unwrap_or(0) + 1).to_string()])
                .expect("SET")
        });
        self.note();
        self.client.record(
            self.task,
            EventKind::ResOp {
                holder: self.holder.clone(),
                token: self.guard.fencing_token().get(),
                op: OP_INCR.to_owned(),
                outcome: OUTCOME_OK.to_owned(),
                invoked: None,
            },
        );
    }

    /// One more level (re-entry on exactly the nodes held), recorded.
    pub async fn reenter(&self, cap: Duration) -> Held {
        let attempt = self.client.attempts.fetch_add(1, Ordering::Relaxed);
        let invoked = Instant::now();
        let t_invoke = self.client.record(
            self.task,
            EventKind::AcqInvoke {
                attempt,
                budget_ms: None,
            },
        );
        let guard = tokio::time::timeout(cap, self.guard.reenter())
            .await
            .expect("re-entry within its bound")
            .expect("re-entry");
        let deadline = to_mono_ns(guard.lease().deadline());
        let t = self.client.record(
            self.task,
            EventKind::AcqOk {
                attempt,
                holder: self.holder.clone(),
                token: guard.fencing_token().get(),
                depth: guard.depth(),
                deadline,
                nodes: guard.nodes().to_vec(),
                permits: None,
            },
        );
        Held {
            client: self.client.clone(),
            task: self.task,
            holder: self.holder.clone(),
            guard,
            logged: deadline,
            lost_logged: false,
            invoked,
            t_invoke,
            t_acquired: t,
        }
    }

    /// Releases this level, recorded: `rel_ok`, `rel_fail{not_held}` or `rel_info` (an
    /// incomplete release). Returns the library's answer.
    pub async fn release(mut self) -> Result<u32, Error> {
        self.note();
        self.client.record(
            self.task,
            EventKind::RelInvoke {
                holder: self.holder.clone(),
                depth_before: self.guard.depth(),
            },
        );
        let r = tokio::time::timeout(Duration::from_secs(20), self.guard.unlock())
            .await
            .expect("unlock within 20 s");
        let holder = self.holder.clone();
        let kind = match &r {
            Ok(n) => EventKind::RelOk {
                holder,
                depth_after: *n,
            },
            Err(e) if e.is_not_held() => EventKind::RelFail {
                holder,
                reason: e.to_string(),
                not_held: true,
            },
            Err(e) => EventKind::RelInfo {
                holder,
                reason: e.to_string(),
            },
        };
        self.client.record(self.task, kind);
        r
    }
}

/// One snapshot of a node's lock hash taken by an [`Observer`].
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Monotonic ns when the reply arrived.
    pub t: u64,
    /// Field → count.
    pub fields: BTreeMap<String, u64>,
    /// `PTTL` (−2 absent).
    pub pttl_ms: i64,
}

/// Polls one node's lock hash (`HGETALL` + `PTTL` in `MULTI`) every `every` on its own
/// thread, recording each snapshot as an `observe` event, until stopped (or 120 s).
pub struct Observer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Snapshot>>>,
}

impl Observer {
    /// Starts observing `name` on `server` (node `node`), recording into `rec`.
    pub fn start(
        server: &RedisServer,
        node: usize,
        name: &str,
        rec: Recorder,
        every: Duration,
    ) -> Self {
        let mut con = server.connection().expect("observer connection");
        let run_id = server.run_id().expect("run id");
        let (stop, key, name) = (Arc::new(AtomicBool::new(false)), key(name), name.to_owned());
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut snaps = Vec::new();
            let end = Instant::now() + Duration::from_secs(120);
            while !flag.load(Ordering::SeqCst) && Instant::now() < end {
                let (fields, pttl_ms): (BTreeMap<String, u64>, i64) = redis::pipe()
                    .atomic()
                    .cmd("HGETALL")
                    .arg(&key)
                    .cmd("PTTL")
                    .arg(&key)
                    .query(&mut con)
                    .expect("HGETALL + PTTL");
                let kind = EventKind::Observe {
                    node,
                    fields: fields.clone(),
                    pttl_ms,
                    run_id: run_id.clone(),
                };
                let t = rec.record(0, &name, kind).expect("record observe");
                snaps.push(Snapshot { t, fields, pttl_ms });
                std::thread::sleep(every);
            }
            snaps
        });
        Observer {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops and returns the snapshots, in time order.
    pub fn stop(mut self) -> Vec<Snapshot> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .take()
            .expect("observer thread")
            .join()
            .expect("observer thread panicked")
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Every continuous presence of `field` in the snapshots: (first snapshot showing it, first
/// later snapshot not showing it, or the last snapshot), in monotonic ns. The span is an upper
/// bound of one presence, up to one polling interval too long.
pub fn presences(snaps: &[Snapshot], field: &str) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut open: Option<u64> = None;
    for s in snaps {
        match (open, s.fields.contains_key(field)) {
            (None, true) => open = Some(s.t),
            (Some(start), false) => {
                out.push((start, s.t));
                open = None;
            }
            _ => {}
        }
    }
    if let (Some(start), Some(last)) = (open, snaps.last()) {
        out.push((start, last.t));
    }
    out
}

/// The longest of [`presences`], as a duration.
pub fn longest_presence(snaps: &[Snapshot], field: &str) -> Duration {
    presences(snaps, field)
        .into_iter()
        .map(|(a, b)| Duration::from_nanos(b - a))
        .max()
        .unwrap_or(Duration::ZERO)
}

/// Monotonic ns now (re-exported for the scenario files).
pub fn now() -> u64 {
    now_ns()
}

/// One `slate-worker` on the combination lock (`--redis-url` repeated); `args(i)` renders its
/// command line with `--proc proc + i`.
#[derive(Clone, Debug)]
pub struct CombWorker {
    /// Node URLs, in node order.
    pub urls: Vec<String>,
    /// Lock name.
    pub lock: String,
    /// History directory.
    pub history_dir: PathBuf,
    /// `contend` or `hold`.
    pub mode: &'static str,
    /// `--proc` of worker 0.
    pub proc: u32,
    /// Lease.
    pub lease: Duration,
    /// Renewal period.
    pub renewal: Option<Duration>,
    /// Spin wait.
    pub spin_wait: Option<Duration>,
    /// Node operation time.
    pub node_op: Option<Duration>,
    /// Re-probe interval.
    pub reprobe: Option<Duration>,
    /// `hold`: how long.
    pub hold: Duration,
    /// Upper bound of the worker's run.
    pub max_duration: Duration,
    /// Resource server (counter, fenced resource).
    pub resource_url: Option<String>,
    /// `--fenced-key`.
    pub fenced_key: Option<String>,
    /// `--late-write`.
    pub late_write: bool,
    /// `--unlock-file`.
    pub unlock_file: Option<PathBuf>,
}

impl CombWorker {
    /// A worker in `mode` on the servers at `urls`.
    pub fn new(mode: &'static str, urls: Vec<String>, lock: &str, dir: &Path) -> Self {
        CombWorker {
            urls,
            lock: lock.to_owned(),
            history_dir: dir.to_owned(),
            mode,
            proc: 0,
            lease: Duration::from_secs(1),
            renewal: None,
            spin_wait: None,
            node_op: None,
            reprobe: None,
            hold: Duration::from_secs(1),
            max_duration: Duration::from_secs(40),
            resource_url: None,
            fenced_key: None,
            late_write: false,
            unlock_file: None,
        }
    }

    /// The command line of worker `index`.
    pub fn args(&self, index: usize) -> Vec<String> {
        let ms = |d: Duration| d.as_millis().to_string();
        let mut a = Vec::new();
        for url in &self.urls {
            a.push("--redis-url".to_owned());
            a.push(url.clone());
        }
        let proc = self.proc + u32::try_from(index).expect("index");
        for (flag, value) in [
            ("--lock", self.lock.clone()),
            ("--proc", proc.to_string()),
            ("--history-dir", self.history_dir.display().to_string()),
            ("--mode", self.mode.to_owned()),
            ("--lease-ms", ms(self.lease)),
            ("--hold-ms", ms(self.hold)),
            ("--max-duration-ms", ms(self.max_duration)),
        ] {
            a.push(flag.to_owned());
            a.push(value);
        }
        let mut opt = |flag: &str, v: Option<String>| {
            if let Some(v) = v {
                a.push(flag.to_owned());
                a.push(v);
            }
        };
        opt("--renewal-ms", self.renewal.map(ms));
        opt("--spin-wait-ms", self.spin_wait.map(ms));
        opt("--node-op-ms", self.node_op.map(ms));
        opt("--reprobe-ms", self.reprobe.map(ms));
        opt("--resource-url", self.resource_url.clone());
        opt("--fenced-key", self.fenced_key.clone());
        opt(
            "--unlock-file",
            self.unlock_file.as_ref().map(|p| p.display().to_string()),
        );
        if self.late_write {
            a.push("--late-write".to_owned());
        }
        a
    }

    /// Spawns one worker.
    pub fn spawn(&self) -> WorkerSet {
        let me = self.clone();
        WorkerSet::builder(WORKER)
            .count(1)
            .args(move |i| me.args(i))
            .env("RUST_BACKTRACE", "1")
            .spawn()
            .expect("spawn slate-worker")
    }
}

/// Waits for a line of the (single) worker starting with `prefix` and returns it.
pub fn wait_line(workers: &mut WorkerSet, prefix: &str, within: Duration) -> String {
    workers
        .wait_for_line(0, |l| l.starts_with(prefix), within)
        .unwrap_or_else(|e| panic!("the worker never printed {prefix:?}...: {e}"))
}

/// Waits for the (single) worker and asserts it exited 0 and left no waiter behind.
pub fn finish_ok(workers: &mut WorkerSet, within: Duration) -> WorkerOutput {
    let out = workers
        .wait_all(within)
        .expect("the worker finishes in time")
        .remove(0);
    assert!(
        out.status.success(),
        "worker failed ({:?})\n--- stdout ---\n{}\n--- stderr ---\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    assert!(
        out.stdout_lines()
            .any(|l| l.starts_with("STATS ") && l.ends_with(" local_waiters=0")),
        "the worker left waiters: {}",
        out.stdout
    );
    out
}

/// Loads the history of a run in which a worker was killed (a last line may be cut short),
/// checks it and prints the report.
pub fn check_killed(dir: &Path, cfg: &CheckConfig) -> (History, Report) {
    let history = History::load(dir).expect("load history");
    let report = history.check(cfg);
    println!("{report}");
    (history, report)
}

/// The fenced writes of a history: (proc, token, outcome), in time order.
pub fn fenced_writes(h: &History) -> Vec<(u32, u64, FencedOutcome)> {
    h.events()
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ResOp {
                op, token, outcome, ..
            } if op == OP_FENCED_WRITE => Some((e.proc, *token, FencedOutcome::parse(outcome)?)),
            _ => None,
        })
        .collect()
}

/// I4(F): the fenced resource kept every write it acknowledged: its log (`<key>:log`) holds at
/// least the accepted writes of the history and at most those plus the unknown ones, and its
/// `accepted` count equals the log's length.
pub fn assert_fenced_kept_everything(h: &History, resource: &RedisServer, key: &str) {
    let writes = fenced_writes(h);
    let accepted = writes
        .iter()
        .filter(|w| matches!(w.2, FencedOutcome::Accepted { .. }))
        .count() as u64;
    let unknown = writes
        .iter()
        .filter(|w| matches!(w.2, FencedOutcome::Unknown { .. }))
        .count() as u64;
    let log_len: u64 = redis::from_redis_value(
        resource
            .command(&["LLEN", &format!("{key}:log")])
            .expect("LLEN"),
    )
    .expect("int");
    let f: BTreeMap<String, u64> =
        redis::from_redis_value(resource.command(&["HGETALL", key]).expect("HGETALL F"))
            .expect("F hash");
    assert!(
        log_len >= accepted && log_len <= accepted + unknown,
        "F's log has {log_len} elements, the history {accepted} accepted (+{unknown} unknown)"
    );
    assert_eq!(f.get("accepted").copied().unwrap_or(0), log_len, "F: {f:?}");
}

/// Spawns `n` worker processes with `args(i)` and waits until each printed `READY`.
pub fn spawn_ready(n: usize, args: impl Fn(usize) -> Vec<String> + 'static) -> WorkerSet {
    let mut workers = WorkerSet::builder(WORKER)
        .count(n)
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .spawn()
        .expect("spawn slate-worker");
    for i in 0..n {
        workers
            .wait_for_line(i, |l| l == "READY", Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("worker {i} not ready: {e}"));
    }
    workers
}

/// Asserts that every `contend` worker exited 0 after `expected` acquisitions; returns their
/// `DONE` lines.
pub fn assert_done(outputs: &[WorkerOutput], expected: u64) -> Vec<String> {
    outputs
        .iter()
        .map(|out| {
            assert!(
                out.status.success(),
                "worker {} failed ({:?})\n--- stdout ---\n{}\n--- stderr ---\n{}",
                out.index,
                out.status,
                out.stdout,
                out.stderr
            );
            let done = out
                .stdout_lines()
                .find(|l| l.starts_with("DONE "))
                .unwrap_or_else(|| panic!("worker {}: {}", out.index, out.stdout));
            assert!(
                done.starts_with(&format!("DONE acquisitions={expected} ")),
                "worker {}: {done}",
                out.index
            );
            done.to_owned()
        })
        .collect()
}
