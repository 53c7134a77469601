//! `slate demo`: three local Redis masters, worker processes contending on a single lock and
//! then on a combination lock (one node is killed and restarted empty meanwhile), live
//! progress, and a final table checked by the history checker.
//!
//! The two locks run one after the other (phase 1: single lock, phase 2: combination lock) so
//! that `INFO commandstats` deltas of the nodes belong to one lock each: the single lock lives
//! on node 0, which the combination lock also uses, and Redis counts commands per server only.

pub mod worker;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use slate_history::clock::now_ns;
use slate_history::history::{CheckConfig, CheckId, Event, EventKind, History, Recorder, Report};

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use slate_cli::local::{LocalError, LocalServer, Workers};
use slate_combination::{NodeSet, NodeSetOptions};

use crate::duration::human;
use crate::exit;
use crate::status::table;

/// Lease of both demo locks. Short, so that the quarantine of a restarted node (which must be
/// at least the lease) fits in a short demo.
const LEASE: Duration = Duration::from_secs(2);
/// Quarantine of a node that restarted empty (= the lease, the shortest safe value).
const QUARANTINE: Duration = LEASE;
/// How soon an unavailable node is probed again.
const REPROBE: Duration = Duration::from_millis(500);
/// Budget of one command on one node of the combination lock.
const NODE_OP: Duration = Duration::from_millis(100);
/// Time each acquisition holds the lock.
const HOLD: Duration = Duration::from_millis(1);
/// The node killed and restarted in phase 2.
const VICTIM: usize = 1;
/// Parent loop tick.
const TICK: Duration = Duration::from_millis(100);
/// Longest wait for a worker's `READY`.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// Extra time the workers get after the phase's duration before they are killed.
const FINISH_GRACE: Duration = Duration::from_secs(15);
/// `proc` of the demo's own history file (nemesis events).
const PARENT_PROC: u32 = 9_999;

/// Arguments of `slate demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Total run time (both phases), e.g. 20s, 1m.
    #[arg(long, default_value = "20s", value_parser = crate::duration::parse)]
    pub duration: Duration,
    /// Worker processes per lock.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub workers: u64,
    /// Concurrent tasks per worker process.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub tasks: u64,
}

/// What happened during a phase.
struct PhaseResult {
    acquisitions: u64,
    errors: u64,
    lock_commands: u64,
    report: Report,
    history: History,
    start_ns: u64,
    kill_ns: Option<u64>,
    restart_ns: Option<u64>,
    back_ns: Option<u64>,
}

enum Stop {
    Interrupted,
    Failed(String),
}

impl From<LocalError> for Stop {
    fn from(e: LocalError) -> Self {
        Stop::Failed(e.to_string())
    }
}

/// One phase's parameters.
struct Phase<'a> {
    label: &'static str,
    lock: &'static str,
    kind: worker::Kind,
    nodes: Vec<usize>,
    duration: Duration,
    dir: PathBuf,
    bar: &'a ProgressBar,
    /// Kill the victim at this offset and restart it at that one.
    fault: Option<(Duration, Duration)>,
}

struct Demo {
    args: DemoArgs,
    servers: Vec<LocalServer>,
    urls: Vec<String>,
    stop: Arc<AtomicBool>,
    multi: MultiProgress,
    exe: PathBuf,
    parent_rec: Recorder,
    /// Commands counted on each node so far in the current phase, and each node's baseline.
    counted: Vec<BTreeMap<String, u64>>,
    baseline: Vec<BTreeMap<String, u64>>,
}

/// Runs `slate demo`; returns the exit code.
pub fn demo(args: DemoArgs, rt: &tokio::runtime::Runtime) -> u8 {
    if args.duration < Duration::from_secs(2) || args.duration > Duration::from_secs(3600) {
        eprintln!(
            "slate: --duration {} is out of range; use 2s to 1h (e.g. --duration 20s)",
            human(args.duration)
        );
        return exit::USAGE;
    }
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        rt.spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut int), Ok(mut term)) = (
                signal(SignalKind::interrupt()),
                signal(SignalKind::terminate()),
            ) else {
                return;
            };
            tokio::select! {
                _ = int.recv() => {},
                _ = term.recv() => {},
            }
            stop.store(true, Ordering::SeqCst);
        });
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("slate: cannot find my own executable to start the workers: {e}");
            return exit::INTERNAL;
        }
    };
    println!(
        "slate demo: starting 3 local Redis masters (redis-server, temporary, no persistence)"
    );
    let servers = match LocalServer::start_many(3) {
        Ok(s) => s,
        Err(LocalError::NotFound(detail)) => {
            eprintln!(
                "slate: redis-server not found ({detail}).\n\
                 The demo starts its own local Redis servers and needs `redis-server` on PATH:\n\
                 \x20 Debian/Ubuntu:  sudo apt-get install -y redis-server\n\
                 \x20 macOS:          brew install redis\n\
                 (or set SLATE_REDIS_SERVER to its path).\n\
                 Without it, start three Redis masters in containers and use `slate run` and \
                 `slate status` against them:\n\
                 \x20 docker compose -f docker/compose.yml up -d     # ports 7001-7003\n\
                 \x20 slate run --lock demo --redis redis://127.0.0.1:7001 -- echo hello\n\
                 \x20 slate status demo --redis redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003"
            );
            return exit::REDIS;
        }
        Err(e) => {
            eprintln!("slate: cannot start the Redis servers: {e}");
            return exit::REDIS;
        }
    };
    let urls: Vec<String> = servers.iter().map(LocalServer::url).collect();
    // Brand-new servers cannot be told apart from servers that restarted without their data,
    // so a node set quarantines both until they have been up for the quarantine period. These
    // servers were started a moment ago and no lock on them can be held yet, so they are
    // declared fresh (their node marker is written) once, here, before any worker starts.
    // Node 1's restart later is *not* adopted: it must go through quarantine.
    let adopted = rt.block_on(async {
        let nodes = NodeSet::connect(&urls, NodeSetOptions::default())?;
        nodes.adopt_fresh_servers("slate:").await
    });
    match adopted {
        Ok(3) => {}
        Ok(n) => {
            eprintln!("slate: only {n} of 3 fresh Redis servers could be adopted");
            return exit::REDIS;
        }
        Err(e) => {
            eprintln!("slate: adopting the fresh Redis servers failed: {e}");
            return exit::REDIS;
        }
    }
    let dir = match tempfile::Builder::new().prefix("slate-demo-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("slate: cannot create a temporary directory: {e}");
            return exit::INTERNAL;
        }
    };
    let parent_rec = match Recorder::create(dir.path(), PARENT_PROC) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("slate: {e}");
            return exit::INTERNAL;
        }
    };
    let mut demo = Demo {
        args,
        servers,
        urls,
        stop,
        multi: MultiProgress::new(),
        exe,
        parent_rec,
        counted: vec![BTreeMap::new(); 3],
        baseline: vec![BTreeMap::new(); 3],
    };
    let code = demo.run(dir.path());
    if code == exit::FAILED {
        let kept = dir.keep();
        println!("histories kept for inspection in {}", kept.display());
    }
    // Dropping `demo` kills any worker left and every server (the harness's Drop).
    drop(demo);
    code
}

impl Demo {
    fn say(&self, line: &str) {
        self.multi.suspend(|| println!("{line}"));
    }

    fn interrupted(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn addrs(&self, nodes: &[usize]) -> String {
        nodes
            .iter()
            .map(|&i| format!("{i} ({})", self.servers[i].addr()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn run(&mut self, dir: &Path) -> u8 {
        let total = self.args.duration;
        let p1 = total.mul_f64(0.4);
        let p2 = total.saturating_sub(p1);
        let (w, t) = (self.args.workers, self.args.tasks);
        println!(
            "nodes: {}\nworkers: {w} processes x {t} tasks per lock; lease {}; each acquisition \
             holds the lock {}; histories in {}",
            self.addrs(&[0, 1, 2]),
            human(LEASE),
            human(HOLD),
            dir.display()
        );
        let style = ProgressStyle::with_template("{prefix:<21} [{bar:24.cyan/blue}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        let bar1 = self.multi.add(ProgressBar::new(millis(p1)));
        let bar2 = self.multi.add(ProgressBar::new(millis(p2)));
        for (bar, prefix) in [
            (&bar1, "single lock (node 0)"),
            (&bar2, "combination (0, 1, 2)"),
        ] {
            bar.set_style(style.clone());
            bar.set_prefix(prefix);
            bar.set_message("waiting");
        }
        let single = Phase {
            label: "single lock",
            lock: "demo-single",
            kind: worker::Kind::Single,
            nodes: vec![0],
            duration: p1,
            dir: dir.join("single"),
            bar: &bar1,
            fault: None,
        };
        let kill_at = p2.mul_f64(0.25);
        let restart_at = p2.mul_f64(0.5);
        let comb = Phase {
            label: "combination lock",
            lock: "demo-combination",
            kind: worker::Kind::Combination,
            nodes: vec![0, 1, 2],
            duration: p2,
            dir: dir.join("combination"),
            bar: &bar2,
            fault: Some((kill_at, restart_at)),
        };
        self.say(&format!(
            "\nphase 1 ({}): {w} workers contend on the single lock {:?} on node 0",
            human(p1),
            single.lock
        ));
        let r1 = match self.phase(&single) {
            Ok(r) => r,
            Err(stop) => return self.stopped(stop),
        };
        self.say(&format!(
            "\nphase 2 ({}): {w} workers contend on the combination lock {:?} on nodes 0, 1, 2 \
             (quorum 2 of 3);\n  node {VICTIM} will be killed at {} and restarted empty at {}",
            human(p2),
            comb.lock,
            human(kill_at),
            human(restart_at)
        ));
        let r2 = match self.phase(&comb) {
            Ok(r) => r,
            Err(stop) => return self.stopped(stop),
        };
        self.multi.clear().ok();
        self.summary(&[(&single, &r1), (&comb, &r2)])
    }

    fn stopped(&self, stop: Stop) -> u8 {
        self.multi.clear().ok();
        match stop {
            Stop::Interrupted => {
                println!("\ninterrupted: stopping the workers and the Redis servers");
                exit::SIGNAL_BASE + 2
            }
            Stop::Failed(msg) => {
                eprintln!("slate: demo failed: {msg}");
                exit::INTERNAL
            }
        }
    }

    fn commandstats(&self, i: usize) -> Result<BTreeMap<String, u64>, Stop> {
        let v = self.servers[i].command(&["INFO", "commandstats"])?;
        let text: String = redis::from_redis_value(v)
            .map_err(|e| Stop::Failed(format!("INFO commandstats of node {i}: {e}")))?;
        Ok(slate_history::commandstats::parse(&text))
    }

    /// Adds node `i`'s commands since its baseline to the phase's count.
    fn count_node(&mut self, i: usize) -> Result<(), Stop> {
        let now = self.commandstats(i)?;
        let d = slate_history::commandstats::delta(&self.baseline[i], &now);
        slate_history::commandstats::add(&mut self.counted[i], &d);
        self.baseline[i] = now;
        Ok(())
    }

    fn nemesis(&self, action: &str) {
        // The checker ignores these; they document the run in the history.
        let _ = self.parent_rec.record(
            0,
            "demo",
            EventKind::Nemesis {
                action: action.to_owned(),
                target: format!("node:{VICTIM}"),
            },
        );
    }

    fn phase(&mut self, p: &Phase<'_>) -> Result<PhaseResult, Stop> {
        std::fs::create_dir_all(&p.dir)
            .map_err(|e| Stop::Failed(format!("creating {}: {e}", p.dir.display())))?;
        for &i in &p.nodes {
            self.counted[i].clear();
            self.baseline[i] = self.commandstats(i)?;
        }
        let go = p.dir.join("go");
        let urls: Vec<String> = p.nodes.iter().map(|&i| self.urls[i].clone()).collect();
        let (lock, kind, dir, go_arg) = (
            p.lock.to_owned(),
            match p.kind {
                worker::Kind::Single => "single",
                worker::Kind::Combination => "combination",
            },
            p.dir.display().to_string(),
            go.display().to_string(),
        );
        let (tasks, duration_ms) = (self.args.tasks, millis(p.duration));
        let count = usize::try_from(self.args.workers).unwrap_or(1);
        let mut workers = Workers::spawn(&self.exe, count, move |i| {
            let mut a: Vec<String> = vec![
                "demo-worker".into(),
                "--kind".into(),
                kind.into(),
                "--lock".into(),
                lock.clone(),
                "--proc".into(),
                i.to_string(),
                "--history-dir".into(),
                dir.clone(),
                "--go-file".into(),
                go_arg.clone(),
                "--tasks".into(),
                tasks.to_string(),
                "--duration-ms".into(),
                duration_ms.to_string(),
                "--lease-ms".into(),
                millis(LEASE).to_string(),
                "--quarantine-ms".into(),
                millis(QUARANTINE).to_string(),
                "--reprobe-ms".into(),
                millis(REPROBE).to_string(),
                "--node-op-ms".into(),
                millis(NODE_OP).to_string(),
                "--hold-us".into(),
                HOLD.as_micros().to_string(),
            ];
            for u in &urls {
                a.push("--redis".into());
                a.push(u.clone());
            }
            a
        })?;
        for i in 0..workers.len() {
            if self.interrupted() {
                return Err(Stop::Interrupted);
            }
            workers.wait_for_line(i, |l| l == "READY", READY_TIMEOUT)?;
        }
        std::fs::write(&go, b"go")
            .map_err(|e| Stop::Failed(format!("writing the go file: {e}")))?;
        let start = Instant::now();
        let start_ns = now_ns();
        let (mut kill_ns, mut restart_ns, mut back_ns) = (None, None, None);
        let mut victim_at_restart = 0u64;
        let n_nodes = p.nodes.len();
        loop {
            if self.interrupted() {
                return Err(Stop::Interrupted);
            }
            let elapsed = start.elapsed();
            let (acq, errors, per_node) = &progress(&workers, n_nodes);
            let secs = elapsed.as_secs_f64().max(0.001);
            let mut msg = format!("{acq} acquisitions, {:.0}/s", *acq as f64 / secs);
            if *errors > 0 {
                msg.push_str(&format!(", {errors} failed"));
            }
            p.bar.set_message(msg);
            p.bar.set_position(millis(elapsed.min(p.duration)));
            if let Some((kill_at, restart_at)) = p.fault {
                if kill_ns.is_none() && elapsed >= kill_at {
                    self.count_node(VICTIM)?;
                    self.nemesis("kill_server");
                    self.servers[VICTIM].kill()?;
                    kill_ns = Some(now_ns());
                    self.say(&format!(
                        "  {:>6}  node {VICTIM} killed (SIGKILL); the combination lock goes on \
                         with nodes 0 and 2 (2 of 3 is a quorum)",
                        human(elapsed)
                    ));
                }
                if kill_ns.is_some() && restart_ns.is_none() && elapsed >= restart_at {
                    self.servers[VICTIM].restart_empty()?;
                    self.baseline[VICTIM] = self.commandstats(VICTIM)?;
                    self.nemesis("restart_server_wiped");
                    restart_ns = Some(now_ns());
                    victim_at_restart = per_node.get(VICTIM).copied().unwrap_or(0);
                    self.say(&format!(
                        "  {:>6}  node {VICTIM} restarted with no data (its lock entries are \
                         gone); quarantined for {} before the lock uses it again",
                        human(start.elapsed()),
                        human(QUARANTINE)
                    ));
                }
                if restart_ns.is_some()
                    && back_ns.is_none()
                    && per_node.get(VICTIM).copied().unwrap_or(0) > victim_at_restart
                {
                    back_ns = Some(now_ns());
                    self.say(&format!(
                        "  {:>6}  node {VICTIM} back in use by the combination lock",
                        human(start.elapsed())
                    ));
                }
            }
            if workers.exited() == workers.len() {
                break;
            }
            if elapsed > p.duration + FINISH_GRACE {
                return Err(Stop::Failed(format!(
                    "the {} workers did not finish within {} after the phase",
                    p.label,
                    human(FINISH_GRACE)
                )));
            }
            std::thread::sleep(TICK);
        }
        let outputs = workers.wait_all(Duration::from_secs(5))?;
        for out in &outputs {
            if !out.status.success() {
                return Err(Stop::Failed(format!(
                    "{} worker {} ended with {}: {}",
                    p.label,
                    out.index,
                    out.status,
                    out.stderr.trim()
                )));
            }
        }
        let (acquisitions, errors, _) = progress(&workers, n_nodes);
        p.bar.set_position(millis(p.duration));
        p.bar.finish();
        for &i in &p.nodes {
            self.count_node(i)?;
        }
        let lock_commands = p
            .nodes
            .iter()
            .map(|&i| slate_history::commandstats::slate_lock_commands(&self.counted[i]))
            .sum();
        let history = History::load(&p.dir)
            .map_err(|e| Stop::Failed(format!("loading the {} history: {e}", p.label)))?;
        let report = history.check(&CheckConfig::new(LEASE));
        self.say(&format!(
            "{}: {acquisitions} acquisitions in {}",
            p.label,
            human(p.duration)
        ));
        Ok(PhaseResult {
            acquisitions,
            errors,
            lock_commands,
            report,
            history,
            start_ns,
            kill_ns,
            restart_ns,
            back_ns,
        })
    }

    fn summary(&self, phases: &[(&Phase<'_>, &PhaseResult)]) -> u8 {
        let header = [
            "lock",
            "nodes",
            "acquisitions",
            "overlaps",
            "wait p50",
            "wait p99",
            "cmds/acq",
            "failed attempts",
        ]
        .map(str::to_owned);
        let rows: Vec<[String; 8]> = phases
            .iter()
            .map(|(p, r)| {
                let lat = r.report.stats.acquire_latency;
                let overlaps = r
                    .report
                    .result(CheckId::Exclusion)
                    .map_or("?".to_owned(), |c| c.violations.to_string());
                let per = if r.acquisitions == 0 {
                    "-".to_owned()
                } else {
                    format!("{:.1}", r.lock_commands as f64 / r.acquisitions as f64)
                };
                [
                    p.label.to_owned(),
                    p.nodes
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                    r.acquisitions.to_string(),
                    overlaps,
                    human(lat.p50),
                    human(lat.p99),
                    per,
                    r.errors.to_string(),
                ]
            })
            .collect();
        println!("\n{}", table(&header, &rows));
        println!("what happened to the nodes:");
        for (p, r) in phases {
            println!("  {:<17} {}", format!("{}:", p.label), node_story(p, r));
        }
        let mut ok = true;
        for (p, r) in phases {
            let failed = r.report.failed();
            if failed.is_empty() {
                let checked: Vec<&str> = r
                    .report
                    .checks
                    .iter()
                    .filter(|c| matches!(c.status, slate_history::history::Status::Pass))
                    .map(|c| c.id.label())
                    .collect();
                println!(
                    "history checker, {}: PASS ({} events; {})",
                    p.label,
                    r.history.len(),
                    checked.join(", ")
                );
            } else {
                ok = false;
                println!("history checker, {}: FAIL\n{}", p.label, r.report);
            }
            if r.acquisitions == 0 {
                ok = false;
                println!("{}: no acquisition at all", p.label);
            }
        }
        if ok {
            println!(
                "\nzero overlaps: no two holders ever held the same lock at the same time.\n\
                 next: `slate run --help` (flock across machines), README.md (library quickstart)"
            );
            exit::OK
        } else {
            exit::FAILED
        }
    }
}

/// The latest progress of every worker: (acquisitions, errors, per-node holds).
fn progress(workers: &Workers, nodes: usize) -> (u64, u64, Vec<u64>) {
    let mut acq = 0;
    let mut errors = 0;
    let mut per = vec![0u64; nodes];
    for i in 0..workers.len() {
        let lines = workers.stdout_lines(i);
        let Some(last) = lines.iter().rev().find(|l| l.starts_with("P ")) else {
            continue;
        };
        let nums: Vec<u64> = last
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        if let [a, e, rest @ ..] = nums.as_slice() {
            acq += a;
            errors += e;
            for (p, r) in per.iter_mut().zip(rest) {
                *p += r;
            }
        }
    }
    (acq, errors, per)
}

/// A sentence on what happened to the phase's nodes, from its history.
fn node_story(p: &Phase<'_>, r: &PhaseResult) -> String {
    let at = |t: u64| human(Duration::from_nanos(t.saturating_sub(r.start_ns)));
    let Some(kill) = r.kill_ns else {
        return format!(
            "node {} up throughout; nothing was done to it",
            p.nodes
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    let acq: Vec<(u64, &Vec<usize>)> = r
        .history
        .events()
        .iter()
        .filter_map(|e: &Event| match &e.kind {
            EventKind::AcqOk {
                depth: 1, nodes, ..
            } => Some((e.t, nodes)),
            _ => None,
        })
        .collect();
    let restart = r.restart_ns.unwrap_or(u64::MAX);
    let down = acq
        .iter()
        .filter(|(t, _)| *t >= kill && *t < restart)
        .count();
    let mut s = format!(
        "node {VICTIM} killed at {}; {down} acquisitions on nodes 0 and 2 while it was down",
        at(kill)
    );
    if let Some(restart) = r.restart_ns {
        let first_back = acq
            .iter()
            .filter(|(t, n)| *t >= restart && n.contains(&VICTIM))
            .map(|(t, _)| *t)
            .min()
            .or(r.back_ns);
        let quarantined = acq
            .iter()
            .filter(|(t, n)| {
                *t >= restart && !n.contains(&VICTIM) && first_back.is_none_or(|b| *t < b)
            })
            .count();
        s.push_str(&format!(
            "; restarted empty at {}, quarantined ({quarantined} acquisitions without it)",
            at(restart)
        ));
        match first_back {
            Some(b) => s.push_str(&format!("; held again from {}", at(b))),
            None => s.push_str("; still in quarantine when the run ended"),
        }
    }
    s
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
