//! Shared by the `single_*` scenario tests: the worker's command line, servers, condition
//! waits with deadlines, and history helpers.
#![allow(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ecosphere::history::{
    CheckConfig, Event, EventKind, FencedOutcome, History, OP_FENCED_WRITE, Recorder, Report,
};
use ecosphere::server::RedisServer;
use ecosphere::workers::{WorkerOutput, WorkerSet};

/// The worker binary built with this package.
pub const WORKER: &str = env!("CARGO_BIN_EXE_slate-worker");

/// One `slate-worker` configuration; `args(proc)` renders its command line.
#[derive(Clone, Debug)]
pub struct Worker {
    pub redis_url: String,
    pub resource_url: Option<String>,
    pub lock: String,
    pub history_dir: PathBuf,
    pub mode: &'static str,
    pub tasks: u64,
    pub iterations: u64,
    pub max_duration: Duration,
    pub lease: Duration,
    pub renewal: Option<Duration>,
    pub spin_wait: Option<Duration>,
    pub command_timeout: Option<Duration>,
    pub hold: Duration,
    pub step: Duration,
    pub budget: Duration,
    pub linger: Duration,
    pub go_file: Option<PathBuf>,
    pub unsafe_skip_lock: bool,
    /// `--named-holders`: every acquisition names a fresh holder (no local passes).
    pub named_holders: bool,
    /// `--implicit-holders` (mode `wait`): the tasks' holds may be passed between them.
    pub implicit_holders: bool,
    /// Added to the worker index to form `--proc`.
    pub proc_base: u32,
    /// `--fenced-key`: the fenced resource F on the resource server.
    pub fenced_key: Option<String>,
    /// `--late-write`: one fenced write with the lost token after a loss.
    pub late_write: bool,
    /// `--unlock-file`: hold waits for this file before unlocking.
    pub unlock_file: Option<PathBuf>,
    /// `--reenter-file`: reenter waits for this file at depth 1 before re-entering.
    pub reenter_file: Option<PathBuf>,
    /// `--burn-threads`.
    pub burn_threads: u64,
    /// Run through `ip <exec_prefix...> slate-worker ...` (a network namespace).
    pub exec_prefix: Option<Vec<String>>,
    /// Cluster seed URLs (`--cluster`), or Sentinel URLs (with `sentinel_master`), replacing
    /// `redis_url`.
    pub topology_urls: Vec<String>,
    /// `--cluster`.
    pub cluster: bool,
    /// `--sentinel-master`.
    pub sentinel_master: Option<String>,
    /// `--synced-replicas` and `--synced-within-ms`.
    pub synced_replicas: Option<(usize, Duration)>,
    /// `--tolerate-errors` (contend).
    pub tolerate_errors: bool,
    /// Further arguments, appended as they are (e.g. `--shared rw`).
    pub extra: Vec<String>,
}

impl Worker {
    pub fn new(mode: &'static str, lock_server: &RedisServer, lock: &str, dir: &Path) -> Self {
        Worker {
            redis_url: lock_server.url(),
            resource_url: None,
            lock: lock.to_owned(),
            history_dir: dir.to_owned(),
            mode,
            tasks: 1,
            iterations: 1,
            max_duration: Duration::from_secs(50),
            lease: Duration::from_secs(1),
            renewal: None,
            spin_wait: None,
            command_timeout: None,
            hold: Duration::from_secs(1),
            step: Duration::from_millis(200),
            budget: Duration::from_secs(5),
            linger: Duration::ZERO,
            go_file: None,
            unsafe_skip_lock: false,
            named_holders: false,
            implicit_holders: false,
            proc_base: 0,
            fenced_key: None,
            late_write: false,
            unlock_file: None,
            reenter_file: None,
            burn_threads: 0,
            exec_prefix: None,
            topology_urls: Vec::new(),
            cluster: false,
            sentinel_master: None,
            synced_replicas: None,
            tolerate_errors: false,
            extra: Vec::new(),
        }
    }

    pub fn args(&self, index: usize) -> Vec<String> {
        let ms = |d: Duration| d.as_millis().to_string();
        let mut a: Vec<String> = Vec::new();
        if self.topology_urls.is_empty() {
            a.extend(["--redis-url".to_owned(), self.redis_url.clone()]);
        }
        for u in &self.topology_urls {
            a.extend(["--redis-url".to_owned(), u.clone()]);
        }
        if self.cluster {
            a.push("--cluster".into());
        }
        if let Some(m) = &self.sentinel_master {
            a.extend(["--sentinel-master".to_owned(), m.clone()]);
        }
        if let Some((n, within)) = self.synced_replicas {
            a.extend([
                "--synced-replicas".to_owned(),
                n.to_string(),
                "--synced-within-ms".to_owned(),
                ms(within),
            ]);
        }
        a.extend(vec![
            "--lock".into(),
            self.lock.clone(),
            "--proc".into(),
            (self.proc_base + u32::try_from(index).unwrap()).to_string(),
            "--history-dir".into(),
            self.history_dir.display().to_string(),
            "--mode".into(),
            self.mode.into(),
            "--tasks".into(),
            self.tasks.to_string(),
            "--iterations".into(),
            self.iterations.to_string(),
            "--max-duration-ms".into(),
            ms(self.max_duration),
            "--lease-ms".into(),
            ms(self.lease),
            "--hold-ms".into(),
            ms(self.hold),
            "--step-ms".into(),
            ms(self.step),
            "--budget-ms".into(),
            ms(self.budget),
            "--linger-ms".into(),
            ms(self.linger),
        ]);
        let mut opt = |flag: &str, v: Option<String>| {
            if let Some(v) = v {
                a.push(flag.into());
                a.push(v);
            }
        };
        opt("--resource-url", self.resource_url.clone());
        opt("--renewal-ms", self.renewal.map(ms));
        opt("--spin-wait-ms", self.spin_wait.map(ms));
        opt("--command-timeout-ms", self.command_timeout.map(ms));
        opt(
            "--go-file",
            self.go_file.as_ref().map(|p| p.display().to_string()),
        );
        opt("--fenced-key", self.fenced_key.clone());
        opt(
            "--unlock-file",
            self.unlock_file.as_ref().map(|p| p.display().to_string()),
        );
        opt(
            "--reenter-file",
            self.reenter_file.as_ref().map(|p| p.display().to_string()),
        );
        if self.burn_threads > 0 {
            a.push("--burn-threads".into());
            a.push(self.burn_threads.to_string());
        }
        if self.late_write {
            a.push("--late-write".into());
        }
        if self.tolerate_errors {
            a.push("--tolerate-errors".into());
        }
        if self.named_holders {
            a.push("--named-holders".to_owned());
        }
        if self.implicit_holders {
            a.push("--implicit-holders".to_owned());
        }
        if self.unsafe_skip_lock {
            a.push("--unsafe-skip-lock".into());
        }
        a.extend(self.extra.iter().cloned());
        a
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

/// `HGETALL key` as field → count.
pub fn hgetall(server: &RedisServer, key: &str) -> BTreeMap<String, u64> {
    redis::from_redis_value(server.command(&["HGETALL", key]).expect("HGETALL"))
        .expect("HGETALL reply")
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
    let (fields, pttl_ms): (BTreeMap<String, u64>, i64) = redis::pipe()
        .atomic()
        .cmd("HGETALL")
        .arg(key)
        .cmd("PTTL")
        .arg(key)
        .query(&mut con)
        .expect("HGETALL + PTTL");
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
        .filter(|k| !k.ends_with(":fence"))
        .filter(|k| {
            let ttl = int(server, &["PTTL", k]);
            ttl != -2 && !(k.contains(":req:") && ttl >= 0)
        })
        .collect()
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
