//! The scenario builder shared by every multi-process scenario (`s*`, `c*`, `cs*`, `r*`,
//! `x*`, `z*`): the worker's command line (one [`Worker`] for every lock it drives), servers,
//! per-client views and proxies, in-process combination clients that record their history
//! like `slate-worker` does, an observer polling one node's lock hash, condition waits with
//! deadlines, and history helpers.
#![allow(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod zookeeper;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use ecosphere::clock::{now_ns, to_mono_ns};
use ecosphere::history::{
    CheckConfig, Event, EventKind, FencedOutcome, History, OP_FENCED_WRITE, OP_INCR, OUTCOME_OK,
    Recorder, Report,
};
use ecosphere::proxy::{FaultProxy, Mode};
use ecosphere::server::RedisServer;
use ecosphere::worker::{self, WorkerArgs};
use ecosphere::workers::{WorkerOutput, WorkerSet};
use slate_combination::{CombinationLock, CombinationLockGuard, NodeSet, NodeSetOptions};
use slate_core::{Error, HolderId, Wait};

/// The worker binary built with this package.
pub const WORKER: &str = env!("CARGO_BIN_EXE_slate-worker");

/// One `slate-worker` configuration: the binary's own typed command line
/// ([`WorkerArgs`], which `Worker` dereferences to) plus how the scenario starts it. Worker
/// `i` of a [`spawn`](Worker::spawn) is process `proc_base + i`.
#[derive(Clone, Debug)]
pub struct Worker {
    /// The command line (its `proc` is replaced by `proc_base + i`).
    pub args: WorkerArgs,
    /// Added to the worker index to form `--proc`.
    pub proc_base: u32,
    /// Run through `ip <exec_prefix...> slate-worker ...` (a network namespace).
    pub exec_prefix: Option<Vec<String>>,
}

impl std::ops::Deref for Worker {
    type Target = WorkerArgs;
    fn deref(&self) -> &WorkerArgs {
        &self.args
    }
}

impl std::ops::DerefMut for Worker {
    fn deref_mut(&mut self) -> &mut WorkerArgs {
        &mut self.args
    }
}

impl Worker {
    /// A worker in `mode` on the single lock `lock` of `lock_server`.
    pub fn new(mode: &str, lock_server: &RedisServer, lock: &str, dir: &Path) -> Self {
        let mut w = Worker::on(mode, lock, dir);
        w.redis_url = vec![lock_server.url()];
        w
    }

    /// A worker in `mode` on the combination lock over the servers at `urls` (node order).
    pub fn nodes(mode: &str, urls: Vec<String>, lock: &str, dir: &Path) -> Self {
        let mut w = Worker::on(mode, lock, dir);
        w.redis_url = urls;
        w.max_duration = Duration::from_secs(40);
        w
    }

    /// A worker in `mode` with the scenarios' defaults (one task, one iteration, a 1 s lease,
    /// 50 s at most) and no lock server yet.
    pub fn on(mode: &str, lock: &str, dir: &Path) -> Self {
        let mode =
            worker::Mode::from_str(mode, false).unwrap_or_else(|e| panic!("mode {mode}: {e}"));
        let mut args = WorkerArgs::new(mode, lock, 0, dir);
        args.iterations = 1;
        args.max_duration = Duration::from_secs(50);
        args.lease = Duration::from_secs(1);
        Worker {
            args,
            proc_base: 0,
            exec_prefix: None,
        }
    }

    /// `--synced-replicas` and `--synced-within-ms` (none: 0 replicas).
    pub fn set_synced(&mut self, synced: Option<(usize, Duration)>) {
        let (n, within) = synced.unwrap_or((0, self.synced_within));
        self.synced_replicas = n;
        self.synced_within = within;
    }

    /// The command line of worker `index`.
    pub fn args(&self, index: usize) -> Vec<String> {
        let mut args = self.args.clone();
        args.proc = self.proc_base + u32::try_from(index).unwrap();
        args.to_args()
    }

    /// Spawns `n` copies (indices 0..n).
    pub fn spawn(&self, n: usize) -> WorkerSet {
        let me = self.clone();
        let program = if self.exec_prefix.is_some() {
            "ip"
        } else {
            WORKER
        };
        WorkerSet::builder(program)
            .count(n)
            .args(move |i| match &me.exec_prefix {
                Some(prefix) => {
                    let mut a = prefix.clone();
                    a.push(WORKER.to_owned());
                    a.extend(me.args(i));
                    a
                }
                None => me.args(i),
            })
            .env("RUST_BACKTRACE", "1")
            .spawn()
            .expect("spawn slate-worker")
    }
}

/// A fresh `redis-server`.
pub fn server() -> RedisServer {
    RedisServer::start().expect("start redis-server (is it installed?)")
}

/// One integer reply.
pub fn int(server: &RedisServer, args: &[&str]) -> i64 {
    redis::from_redis_value(server.command(args).expect("command")).expect("integer reply")
}

/// `GET key` as a number (0 when absent).
pub fn get_u64(server: &RedisServer, key: &str) -> u64 {
    let v: Option<u64> =
        redis::from_redis_value(server.command(&["GET", key]).expect("GET")).expect("GET reply");
    v.unwrap_or(0)
}

/// `HGETALL key` of a lock hash as holder → count.
pub fn hgetall(server: &RedisServer, key: &str) -> BTreeMap<String, u64> {
    holders(
        redis::from_redis_value(server.command(&["HGETALL", key]).expect("HGETALL"))
            .expect("HGETALL reply"),
    )
}

/// A single-lock hash's fields as holder → count: the hash's own fields `t` (token), `r`
/// (request record) and `w` (someone waits), see `acquire.lua`, are left out.
pub fn holders(fields: BTreeMap<String, String>) -> BTreeMap<String, u64> {
    fields
        .into_iter()
        .filter(|(f, _)| !matches!(f.as_str(), "t" | "r" | "w"))
        .map(|(f, v)| (f, v.parse().expect("a count")))
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

/// Waits until every worker printed a line equal to `line`.
pub fn wait_line_all(workers: &mut WorkerSet, line: &str, within: Duration) {
    for i in 0..workers.len() {
        workers
            .wait_for_line(i, |l| l == line, within)
            .unwrap_or_else(|e| panic!("worker {i} never printed {line:?}: {e}"));
    }
}

/// Waits for a line of worker `i` starting with `prefix` and returns it.
pub fn wait_line(workers: &mut WorkerSet, i: usize, prefix: &str, within: Duration) -> String {
    workers
        .wait_for_line(i, |l| l.starts_with(prefix), within)
        .unwrap_or_else(|e| panic!("worker {i} never printed {prefix:?}...: {e}"))
}

/// Creates the go file: every worker gated on it starts now.
pub fn go(path: &Path) {
    std::fs::write(path, b"go").expect("create the go file");
}

/// Waits for all workers and asserts each exited 0 with a `STATS renewals=0 ...
/// local_waiters=0` line (no renewal or waiter left behind).
pub fn finish_ok(workers: &mut WorkerSet, within: Duration) -> Vec<WorkerOutput> {
    let outputs = workers.wait_all(within).expect("workers finish in time");
    for out in &outputs {
        assert!(
            out.status.success(),
            "worker {} failed ({:?})\n--- stdout ---\n{}\n--- stderr ---\n{}",
            out.index,
            out.status,
            out.stdout,
            out.stderr
        );
        assert_quiet(out);
    }
    outputs
}

/// The worker's last line says no renewal is registered and no local waiter is left.
pub fn assert_quiet(out: &WorkerOutput) {
    let stats = out
        .stdout_lines()
        .find(|l| l.starts_with("STATS "))
        .unwrap_or_else(|| {
            panic!(
                "worker {} printed no STATS line:\n{}",
                out.index, out.stdout
            )
        });
    assert!(
        stats.contains(" renewals=0 ") && stats.ends_with(" local_waiters=0"),
        "worker {} left work behind: {stats}",
        out.index
    );
}

/// Loads the history, checks it, prints the report, and returns both. No line may be cut
/// short (only a killed worker could leave one; see [`check_killed`]).
pub fn check(dir: &Path, cfg: &CheckConfig) -> (History, Report) {
    let (history, report) = check_killed(dir, cfg);
    assert_eq!(history.truncated_lines(), 0, "truncated history lines");
    (history, report)
}

/// As [`check`], tolerating a last line cut short by a killed worker.
pub fn check_killed(dir: &Path, cfg: &CheckConfig) -> (History, Report) {
    let history = History::load(dir).expect("load history");
    let report = history.check(cfg);
    println!("{report}");
    (history, report)
}

/// Reloads the (growing) history every 20 ms until `pred` holds; fails after `within`.
pub fn wait_history(dir: &Path, within: Duration, what: &str, pred: impl Fn(&History) -> bool) {
    wait_for(within, what, || {
        let h = History::load(dir).expect("load history");
        pred(&h).then_some(())
    });
}

/// Logs an observer snapshot (`observe`) of a lock key: fields and PTTL read atomically
/// (MULTI/EXEC, so that an expiry cannot fall between them), then the run id.
pub fn observe(rec: &Recorder, server: &RedisServer, lock: &str, key: &str) -> Event {
    let mut con = server.connection().expect("observer connection");
    let (fields, pttl_ms): (BTreeMap<String, String>, i64) = redis::pipe()
        .atomic()
        .cmd("HGETALL")
        .arg(key)
        .cmd("PTTL")
        .arg(key)
        .query(&mut con)
        .expect("HGETALL + PTTL");
    let fields = holders(fields);
    let run_id = server.run_id().expect("run_id");
    let kind = EventKind::Observe {
        node: 0,
        fields,
        pttl_ms,
        run_id,
    };
    let t = rec.record(0, lock, kind.clone()).expect("record observe");
    Event::new(t, rec.proc(), 0, lock, kind)
}

/// The events of one kind (by name) in time order.
pub fn events<'a>(h: &'a History, kind: &str) -> Vec<&'a Event> {
    h.events()
        .iter()
        .filter(|e| e.kind.name() == kind)
        .collect()
}

/// Milliseconds between two monotonic stamps (`b − a`, may be negative).
pub fn ms_between(a: u64, b: u64) -> f64 {
    (i128::from(b) - i128::from(a)) as f64 / 1e6
}

/// For each acquire attempt (proc, attempt): invoke time, outcome kind and outcome time.
pub fn attempts(h: &History) -> Vec<(u32, u64, u64, &'static str, u64)> {
    let mut open: BTreeMap<(u32, u64), u64> = BTreeMap::new();
    let mut out = Vec::new();
    for e in h.events() {
        match &e.kind {
            EventKind::AcqInvoke { attempt, .. } => {
                open.insert((e.proc, *attempt), e.t);
            }
            EventKind::AcqOk { attempt, .. }
            | EventKind::AcqFail { attempt, .. }
            | EventKind::AcqInfo { attempt, .. } => {
                let t0 = open
                    .remove(&(e.proc, *attempt))
                    .unwrap_or_else(|| panic!("outcome without invoke: {e:?}"));
                out.push((e.proc, *attempt, t0, e.kind.name(), e.t));
            }
            _ => {}
        }
    }
    assert!(open.is_empty(), "attempts without outcome: {open:?}");
    out
}

/// The latest deadline a holder logged (from `acq_ok` / `renew_ok`).
pub fn last_deadline(h: &History, holder: &str) -> u64 {
    h.events()
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::AcqOk {
                holder: x,
                deadline,
                ..
            }
            | EventKind::RenewOk {
                holder: x,
                deadline,
            } if x == holder => Some(*deadline),
            _ => None,
        })
        .max()
        .unwrap_or_else(|| panic!("no deadline logged for {holder}"))
}

/// Lock keys left on the lock server, for [`CheckConfig::final_keys`]: every key but the
/// persistent fencing counters (`…:fence`) and the request records (`…:req:…`) that expire on
/// their own (a record without a TTL is reported). A key that expires between the listing
/// and its `PTTL` (-2) is gone, not left.
pub fn lock_keys(server: &RedisServer) -> Vec<String> {
    let v = server.command(&["KEYS", "*"]).expect("KEYS");
    let keys: Vec<String> = redis::from_redis_value(v).expect("KEYS reply");
    keys.into_iter()
        .filter(|k| !is_fence_counter(k))
        .filter(|k| {
            let ttl = int(server, &["PTTL", k]);
            ttl != -2 && !(k.contains(":req:") && ttl >= 0)
        })
        .collect()
}

/// The fencing counter lock `name` (default prefix) takes its tokens from: its hash slot's,
/// `slate:fence:{<slot tag>}` (`NodeKeys::fence_key`).
pub fn fence_key(name: &str) -> String {
    let name = slate_core::LockName::new(name).expect("a lock name");
    let keys = slate_redis::node::NodeKeys::new(PREFIX, &name);
    String::from_utf8(keys.fence_key().to_vec()).expect("utf-8")
}

/// Whether `key` is a persistent fencing counter: a hash slot's (`<prefix>fence:{<slot tag>}`,
/// the single and combination locks') or a name's (`...:fence`, the read-write lock's and the
/// semaphore's).
pub fn is_fence_counter(key: &str) -> bool {
    key.ends_with(":fence") || (key.contains("fence:{") && key.ends_with('}'))
}

/// `INFO commandstats` as command → calls.
pub fn commandstats(server: &RedisServer) -> BTreeMap<String, u64> {
    let v = server
        .command(&["INFO", "commandstats"])
        .expect("INFO commandstats");
    let text: String = redis::from_redis_value(v).expect("INFO reply");
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("cmdstat_")?;
            let (name, fields) = rest.split_once(':')?;
            let calls = fields.split(',').find_map(|f| f.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// The fenced writes of a history: (proc, token, outcome) in time order.
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

/// I4(F): the fenced resource kept every acknowledged write: its log list holds exactly the
/// accepted writes of the history (plus any with unknown outcome that were applied), and its
/// `accepted` count matches. Returns (accepted, rejected) from the history.
pub fn assert_fenced_kept_everything(h: &History, resource: &RedisServer, key: &str) -> (u64, u64) {
    let writes = fenced_writes(h);
    let count = |f: fn(&FencedOutcome) -> bool| writes.iter().filter(|w| f(&w.2)).count() as u64;
    let accepted = count(|o| matches!(o, FencedOutcome::Accepted { .. }));
    let rejected = count(|o| matches!(o, FencedOutcome::Rejected { .. }));
    let unknown = count(|o| matches!(o, FencedOutcome::Unknown { .. }));
    let log_len = u64::try_from(int(resource, &["LLEN", &format!("{key}:log")])).expect("LLEN");
    let f: BTreeMap<String, u64> =
        redis::from_redis_value(resource.command(&["HGETALL", key]).expect("HGETALL F"))
            .expect("F hash");
    let server_accepted = f.get("accepted").copied().unwrap_or(0);
    assert!(
        log_len >= accepted && log_len <= accepted + unknown,
        "F's log has {log_len} elements, the history {accepted} accepted (+{unknown} unknown)"
    );
    assert_eq!(
        server_accepted, log_len,
        "F's accepted count vs its log: {f:?}"
    );
    let mut seqs: Vec<u64> = writes
        .iter()
        .filter_map(|w| match w.2 {
            FencedOutcome::Accepted { seq } => Some(seq),
            _ => None,
        })
        .collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(
        seqs.len() as u64,
        accepted,
        "accept sequence numbers repeat"
    );
    (accepted, rejected)
}

/// Records a nemesis event at `t` by the harness recorder.
pub fn nemesis(rec: &Recorder, t: u64, lock: &str, action: &str, target: &str) {
    rec.record_at(
        t,
        0,
        lock,
        EventKind::Nemesis {
            action: action.into(),
            target: target.into(),
        },
    )
    .expect("record nemesis");
}

/// Nanoseconds of a duration.
pub fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

/// The first event of `proc` with kind name `kind`.
pub fn first_of<'a>(h: &'a History, proc: u32, kind: &str) -> Option<&'a Event> {
    h.events()
        .iter()
        .find(|e| e.proc == proc && e.kind.name() == kind)
}

/// The `acquired=` and `failed=` totals of the `DONE` lines of `wait`-mode workers, asserting
/// that none reported an error.
pub fn wait_totals(outputs: &[WorkerOutput]) -> (u64, u64) {
    let (mut acquired, mut failed) = (0u64, 0u64);
    for out in outputs {
        let done = out
            .stdout_lines()
            .find(|l| l.starts_with("DONE "))
            .unwrap_or_else(|| panic!("worker {}: no DONE line: {}", out.index, out.stdout));
        let n = |k: &str| -> u64 {
            done.split(' ')
                .find_map(|f| f.strip_prefix(k))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{done}"))
        };
        assert_eq!(n("errors="), 0, "worker {}: {done}", out.index);
        acquired += n("acquired=");
        failed += n("failed=");
    }
    (acquired, failed)
}

/// A scenario with one holder at a time (one worker, or a grant given back): I1 and I3 have
/// no pair to compare, so they may be unchecked, never warn or fail.
#[allow(dead_code)]
pub fn assert_single_holder_checks(report: &ecosphere::history::Report) {
    use ecosphere::history::CheckId;
    report.assert_pass_or_unchecked(
        CheckId::Tokens,
        "a single holder in this scenario: no second token to compare",
    );
    report.assert_pass_or_unchecked(
        CheckId::Exclusion,
        "a single holder in this scenario: nobody to overlap with",
    );
}

/// The contenders left under `/slate/<lock>`.
pub fn zk_contenders(servers: &str, lock: &str) -> Vec<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let c = slate_zookeeper::ZkClient::connect(servers).await.unwrap();
        let l = slate_zookeeper::ZkLock::builder(&c, lock).build().unwrap();
        let s = l.status().await.unwrap();
        s.holder
            .into_iter()
            .chain(s.waiters)
            .map(|c| c.znode)
            .collect()
    })
}

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

/// `HGETALL` of the lock key on one server, as holder → count (empty when absent).
pub fn entries(server: &RedisServer, name: &str) -> BTreeMap<String, u64> {
    hgetall(server, &key(name))
}

/// `PTTL` of the lock key on one server (−2 when absent).
pub fn pttl(server: &RedisServer, name: &str) -> i64 {
    redis::from_redis_value(server.command(&["PTTL", &key(name)]).expect("PTTL")).expect("int")
}

/// Lock keys on the servers: everything but the persistent fencing counters and node markers,
/// and the request records (`…:req:…`) that expire on their own (a record without a TTL
/// counts).
pub fn lock_keys_all(servers: &[RedisServer]) -> Vec<String> {
    servers
        .iter()
        .enumerate()
        .flat_map(|(i, s)| {
            let keys: Vec<String> =
                redis::from_redis_value(s.command(&["KEYS", "*"]).expect("KEYS")).expect("KEYS");
            keys.into_iter()
                .filter(|k| !is_fence_counter(k) && !k.ends_with("node-marker"))
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
        let left = lock_keys_all(servers);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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
                let (fields, pttl_ms): (BTreeMap<String, String>, i64) = redis::pipe()
                    .atomic()
                    .cmd("HGETALL")
                    .arg(&key)
                    .cmd("PTTL")
                    .arg(&key)
                    .query(&mut con)
                    .expect("HGETALL + PTTL");
                let fields = holders(fields);
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
    let lines = done_lines(outputs);
    for (out, done) in outputs.iter().zip(&lines) {
        assert!(
            done.starts_with(&format!("DONE acquisitions={expected} ")),
            "worker {}: {done}",
            out.index
        );
    }
    lines
}

/// Each worker's `DONE` line; every worker must have succeeded.
pub fn done_lines(outputs: &[WorkerOutput]) -> Vec<String> {
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
            out.stdout_lines()
                .find(|l| l.starts_with("DONE "))
                .unwrap_or_else(|| panic!("worker {}: {}", out.index, out.stdout))
                .to_owned()
        })
        .collect()
}
