//! The worker's command line as one typed struct, shared by the `slate-worker` binary (which
//! parses it) and the scenarios (which build it and render it with [`WorkerArgs::to_args`]).
//! A scenario never writes a flag by hand, and a flag the binary does not know cannot be
//! rendered: both sides are this struct.
//!
//! Durations are typed (`Duration`) and travel as whole milliseconds (`--lease-ms 1000`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, ValueEnum};

/// What the worker does (`--mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Loop lock / GET+SET counter / unlock.
    Contend,
    /// Acquire once and hold until done or lost.
    Hold,
    /// Re-enter to depth 3, release level by level, one extra release.
    Reenter,
    /// Many waiters, one `try_lock_for` each.
    Wait,
}

/// Which shared-mode primitive (`--shared`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum SharedKind {
    /// `RwLock`: each acquisition reads (`--read-percent` of them) or writes.
    Rw,
    /// `Semaphore` of `--capacity` permits: each acquisition takes `--permits`.
    Sem,
}

/// What a shared-mode `hold` takes (`--hold-as`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum HoldAs {
    /// The read lock (or, with `--shared sem`, `--permits` permits).
    Read,
    /// The write lock.
    Write,
}

/// Acquisition order of the combination lock (`--order`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CombOrder {
    /// One node after the other.
    Sequential,
    /// Node 0, then the others together.
    Pipelined,
}

/// Whole milliseconds as a `Duration`.
fn millis(s: &str) -> Result<Duration, String> {
    s.parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|e| format!("{s:?} is not a whole number of milliseconds: {e}"))
}

/// `--max-duration-ms`: 1 ms to 10 minutes.
fn run_bound(s: &str) -> Result<Duration, String> {
    let d = millis(s)?;
    if d.is_zero() || d > Duration::from_secs(600) {
        return Err(format!("{s} ms is not between 1 and 600000"));
    }
    Ok(d)
}

/// The command line of `slate-worker` (see the binary's documentation for the modes).
#[derive(Clone, Debug, PartialEq, Eq, Parser)]
#[command(name = "slate-worker", about = "One process of a Slate lock scenario")]
pub struct WorkerArgs {
    /// URL of the Redis server that holds the lock; repeated (in node order): the nodes of a
    /// combination lock.
    #[arg(long, required_unless_present = "zookeeper")]
    pub redis_url: Vec<String>,
    /// The ZooKeeper lock on this ensemble (`host:port[,host:port…]`) instead of a Redis lock
    /// (`--lease-ms` is the session timeout, `--command-timeout-ms` the operation timeout).
    #[arg(long, conflicts_with_all = ["cluster", "sentinel_master", "shared"])]
    pub zookeeper: Option<String>,
    /// The ZooKeeper lock's root (library default if absent). Workers given different roots
    /// do not exclude each other: the negative control of the ZooKeeper scenarios.
    #[arg(long, requires = "zookeeper")]
    pub zk_root: Option<String>,
    /// The `--redis-url`s are seed nodes of one Redis Cluster (a single lock on it).
    #[arg(long, conflicts_with = "sentinel_master")]
    pub cluster: bool,
    /// The `--redis-url`s are Sentinels monitoring the master of this name (a single lock).
    #[arg(long)]
    pub sentinel_master: Option<String>,
    /// Contend: an acquisition that fails with an error is retried (not counted) and a
    /// release that fails is counted (the lease ends the hold): for runs with failovers and
    /// slot migrations, where a command may time out or meet a master that is going away.
    #[arg(long)]
    pub tolerate_errors: bool,
    /// Replicas that must acknowledge every grant and renewal
    /// (`ClientOptionsBuilder::synced_replicas`).
    #[arg(long, default_value_t = 0)]
    pub synced_replicas: usize,
    /// How long a grant or renewal waits for the replicas' acknowledgement.
    #[arg(long = "synced-within-ms", value_name = "MS", default_value = "500", value_parser = millis)]
    pub synced_within: Duration,
    /// Combination lock: node operation time (library default if absent).
    #[arg(long = "node-op-ms", value_name = "MS", value_parser = millis)]
    pub node_op: Option<Duration>,
    /// Combination lock: re-probe interval of an unavailable node (library default if absent).
    #[arg(long = "reprobe-ms", value_name = "MS", value_parser = millis)]
    pub reprobe: Option<Duration>,
    /// Combination lock: quarantine of a restarted server (library default if absent; at
    /// least the lease).
    #[arg(long = "quarantine-ms", value_name = "MS", value_parser = millis)]
    pub quarantine: Option<Duration>,
    /// Combination lock: acquisition order.
    #[arg(long, value_enum, default_value_t = CombOrder::Sequential)]
    pub order: CombOrder,
    /// URL of the resource Redis (the shared counter); required by contend; without it, hold,
    /// reenter and wait do no resource operations.
    #[arg(long)]
    pub resource_url: Option<String>,
    /// Lock name.
    #[arg(long)]
    pub lock: String,
    /// Process number in the history (`proc`).
    #[arg(long)]
    pub proc: u32,
    /// Directory of the history files.
    #[arg(long)]
    pub history_dir: PathBuf,
    /// What to do.
    #[arg(long, value_enum)]
    pub mode: Mode,
    /// Concurrent tasks (contend, wait).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=2000))]
    pub tasks: u64,
    /// Iterations per task (contend).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub iterations: u64,
    /// Upper bound of the whole run; the worker stops (and fails) when it passes.
    #[arg(long = "max-duration-ms", value_name = "MS", default_value = "60000", value_parser = run_bound)]
    pub max_duration: Duration,
    /// Lease of the lock.
    #[arg(long = "lease-ms", value_name = "MS", default_value = "2000", value_parser = millis)]
    pub lease: Duration,
    /// Renewal period (library default if absent).
    #[arg(long = "renewal-ms", value_name = "MS", value_parser = millis)]
    pub renewal: Option<Duration>,
    /// Spin wait: retry interval when no release notification arrives (library default if
    /// absent).
    #[arg(long = "spin-wait-ms", value_name = "MS", value_parser = millis)]
    pub spin_wait: Option<Duration>,
    /// Command timeout of the client (library default if absent).
    #[arg(long = "command-timeout-ms", value_name = "MS", value_parser = millis)]
    pub command_timeout: Option<Duration>,
    /// How long to hold (hold: total; reenter: at depth 3; wait: critical section).
    #[arg(long = "hold-ms", value_name = "MS", default_value = "1000", value_parser = millis)]
    pub hold: Duration,
    /// Reenter: time held at each depth on the way down.
    #[arg(long = "step-ms", value_name = "MS", default_value = "200", value_parser = millis)]
    pub step: Duration,
    /// Wait: the budget of each `try_lock_for` (0 = `try_lock`).
    #[arg(long = "budget-ms", value_name = "MS", default_value = "5000", value_parser = millis)]
    pub budget: Duration,
    /// Keep the client (and its renewal service) alive this long after the mode ends.
    #[arg(long = "linger-ms", value_name = "MS", default_value = "0", value_parser = millis)]
    pub linger: Duration,
    /// After `READY`, wait until this file exists before starting.
    #[arg(long)]
    pub go_file: Option<PathBuf>,
    /// Key of the shared counter on the resource server.
    #[arg(long, default_value = "counter")]
    pub counter_key: String,
    /// Negative control (contend only): skip the lock entirely and log made-up holders.
    #[arg(long)]
    pub unsafe_skip_lock: bool,
    /// Fenced resource F on the resource server: a hash at this key (`max`, `accepted`,
    /// `rejected`) and the list `<KEY>:log` of accepted elements. Every resource operation
    /// then also sends one fenced write carrying the holder's token.
    #[arg(long, requires = "resource_url")]
    pub fenced_key: Option<String>,
    /// Hold: after a loss, send one more fenced write with the lost hold's token (a write
    /// issued before a pause and delivered after it); prints `LATE <outcome>`.
    #[arg(long, requires = "fenced_key")]
    pub late_write: bool,
    /// Hold: once the hold ends (done or lost), print `UNLOCK_WAIT` and wait, bounded by the
    /// run's deadline, until this file exists before unlocking (a release after a healed
    /// partition).
    #[arg(long)]
    pub unlock_file: Option<PathBuf>,
    /// Reenter: after `DEPTH 1`, print `REENTER_WAIT` and wait, bounded by the run's deadline,
    /// until this file exists before re-entering (the test makes the hold lose its entry
    /// meanwhile). A re-entry that fails with a lost lease is then an outcome: `REENTER
    /// lease_lost`, the first level is released (`RELEASED not_held`), and the mode ends.
    #[arg(long)]
    pub reenter_file: Option<PathBuf>,
    /// Combination lock: give up on every `unlock()` after its first poll (as
    /// `timeout(d, guard.unlock())` does when `d` runs out first); logged as `rel_info`. Each
    /// acquisition then names a fresh holder (`lock_as`), so that every unlock walks the
    /// nodes: a hold passed to the next local task (`lock()`) completes its unlock at once,
    /// leaving nothing to cancel.
    #[arg(long)]
    pub cancel_unlock: bool,
    /// `contend`: once this file exists, every task finishes the iteration it is in and
    /// starts no other (the run then lasts as long as the scenario's faults, not a count of
    /// iterations); `DONE` reports the acquisitions made.
    #[arg(long)]
    pub stop_file: Option<PathBuf>,
    /// Single lock, `contend`: every acquisition names a fresh holder (`lock_as`), so that
    /// every lock and unlock goes to Redis (no local passes between the tasks): for scenarios
    /// about what happens to the remote calls themselves.
    #[arg(long)]
    pub named_holders: bool,
    /// Single lock, `wait`: the calls run as the task's implicit holder (as plain `lock()`
    /// callers do), so a hold may be passed from one task to the next; a failed attempt then
    /// cannot name the holder it tried as. Without it each call runs in an explicit holder
    /// scope, which is never passed.
    #[arg(long)]
    pub implicit_holders: bool,
    /// Hold (single lock): this many OS threads spin on the CPU while holding (the application
    /// busy next to its renewal), stopped when the hold ends.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=8))]
    pub burn_threads: u64,
    /// `contend` on a multi-lock over these comma-separated names (`--lock` only labels the
    /// run); each name's calls are recorded under its own name.
    #[arg(long, conflicts_with_all = ["zookeeper", "shared"])]
    pub multi: Option<String>,
    /// With `--multi`: take the names by hand, as single locks in the order given, with
    /// `--gap-ms` between two (the negative control: overlapping sets given in cycle-making
    /// orders deadlock).
    #[arg(long, requires = "multi")]
    pub caller_order: bool,
    /// With `--caller-order`: the pause between taking two names.
    #[arg(long = "gap-ms", value_name = "MS", default_value = "0", value_parser = millis)]
    pub gap: Duration,
    /// Shared mode: a read-write lock (`rw`) or a semaphore (`sem`) instead of the single
    /// lock (modes `contend` and `hold`).
    #[arg(long, value_enum)]
    pub shared: Option<SharedKind>,
    /// Shared `contend` on a read-write lock: the share of acquisitions that read.
    #[arg(long, default_value_t = 80, value_parser = clap::value_parser!(u64).range(0..=100))]
    pub read_percent: u64,
    /// Shared mode on a semaphore: the permits each acquisition takes.
    #[arg(long, default_value_t = 1)]
    pub permits: u32,
    /// Shared mode on a semaphore: its capacity.
    #[arg(long, default_value_t = 3)]
    pub capacity: u32,
    /// Shared `hold`: take the read lock (or the permits) or the write lock.
    #[arg(long, value_enum, default_value_t = HoldAs::Read)]
    pub hold_as: HoldAs,
}

impl WorkerArgs {
    /// A worker in `mode` on `lock` as process `proc`, recording into `history_dir`, with
    /// every other setting at the binary's default (no lock server yet: set `redis_url` or
    /// `zookeeper`).
    ///
    /// # Panics
    ///
    /// Never for a valid path (the defaults are the binary's own).
    #[must_use]
    pub fn new(mode: Mode, lock: &str, proc: u32, history_dir: &Path) -> Self {
        WorkerArgs::try_parse_from([
            "slate-worker",
            "--redis-url",
            "redis://127.0.0.1:1",
            "--lock",
            lock,
            "--proc",
            &proc.to_string(),
            "--history-dir",
            &history_dir.display().to_string(),
            "--mode",
            &value_name(&mode),
        ])
        .map(|mut a| {
            a.redis_url.clear();
            a
        })
        .unwrap_or_else(|e| panic!("the worker's defaults do not parse: {e}"))
    }

    /// The command line that [`parse`](Parser::parse) turns back into `self` (without the
    /// program name).
    #[must_use]
    pub fn to_args(&self) -> Vec<String> {
        let mut a = Args::default();
        for url in &self.redis_url {
            a.value("--redis-url", url);
        }
        a.opt("--zookeeper", self.zookeeper.as_ref());
        a.opt("--zk-root", self.zk_root.as_ref());
        a.flag("--cluster", self.cluster);
        a.opt("--sentinel-master", self.sentinel_master.as_ref());
        a.flag("--tolerate-errors", self.tolerate_errors);
        a.value("--synced-replicas", self.synced_replicas);
        a.ms("--synced-within-ms", self.synced_within);
        a.opt_ms("--node-op-ms", self.node_op);
        a.opt_ms("--reprobe-ms", self.reprobe);
        a.opt_ms("--quarantine-ms", self.quarantine);
        a.value("--order", value_name(&self.order));
        a.opt("--resource-url", self.resource_url.as_ref());
        a.value("--lock", &self.lock);
        a.value("--proc", self.proc);
        a.value("--history-dir", self.history_dir.display());
        a.value("--mode", value_name(&self.mode));
        a.value("--tasks", self.tasks);
        a.value("--iterations", self.iterations);
        a.ms("--max-duration-ms", self.max_duration);
        a.ms("--lease-ms", self.lease);
        a.opt_ms("--renewal-ms", self.renewal);
        a.opt_ms("--spin-wait-ms", self.spin_wait);
        a.opt_ms("--command-timeout-ms", self.command_timeout);
        a.ms("--hold-ms", self.hold);
        a.ms("--step-ms", self.step);
        a.ms("--budget-ms", self.budget);
        a.ms("--linger-ms", self.linger);
        a.opt("--go-file", self.go_file.as_ref().map(|p| p.display()));
        a.value("--counter-key", &self.counter_key);
        a.flag("--unsafe-skip-lock", self.unsafe_skip_lock);
        a.opt("--fenced-key", self.fenced_key.as_ref());
        a.flag("--late-write", self.late_write);
        a.opt(
            "--unlock-file",
            self.unlock_file.as_ref().map(|p| p.display()),
        );
        a.opt(
            "--reenter-file",
            self.reenter_file.as_ref().map(|p| p.display()),
        );
        a.flag("--cancel-unlock", self.cancel_unlock);
        a.opt("--stop-file", self.stop_file.as_ref().map(|p| p.display()));
        a.flag("--named-holders", self.named_holders);
        a.flag("--implicit-holders", self.implicit_holders);
        a.value("--burn-threads", self.burn_threads);
        a.opt("--multi", self.multi.as_ref());
        a.flag("--caller-order", self.caller_order);
        a.ms("--gap-ms", self.gap);
        a.opt("--shared", self.shared.as_ref().map(value_name));
        a.value("--read-percent", self.read_percent);
        a.value("--permits", self.permits);
        a.value("--capacity", self.capacity);
        a.value("--hold-as", value_name(&self.hold_as));
        a.0
    }
}

/// A value enum's name on the command line.
fn value_name<E: ValueEnum>(v: &E) -> String {
    // Every variant of these enums has a name (none is skipped).
    v.to_possible_value()
        .map(|p| p.get_name().to_owned())
        .unwrap_or_default()
}

/// A command line being written.
#[derive(Default)]
struct Args(Vec<String>);

impl Args {
    fn value(&mut self, flag: &str, v: impl std::fmt::Display) {
        self.0.push(flag.to_owned());
        self.0.push(v.to_string());
    }

    fn opt(&mut self, flag: &str, v: Option<impl std::fmt::Display>) {
        if let Some(v) = v {
            self.value(flag, v);
        }
    }

    fn ms(&mut self, flag: &str, d: Duration) {
        self.value(flag, d.as_millis());
    }

    fn opt_ms(&mut self, flag: &str, d: Option<Duration>) {
        self.opt(flag, d.map(|d| d.as_millis()));
    }

    fn flag(&mut self, flag: &str, on: bool) {
        if on {
            self.0.push(flag.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(a: &WorkerArgs) -> WorkerArgs {
        let mut line = vec!["slate-worker".to_owned()];
        line.extend(a.to_args());
        WorkerArgs::try_parse_from(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }

    #[test]
    fn the_defaults_are_the_binarys() {
        let a = WorkerArgs::new(Mode::Hold, "l", 3, Path::new("/tmp/h"));
        assert_eq!(a.lease, Duration::from_secs(2));
        assert_eq!(a.iterations, 10);
        assert_eq!(a.max_duration, Duration::from_secs(60));
        assert!(a.redis_url.is_empty());
    }

    #[test]
    fn every_setting_survives_the_command_line() {
        let mut a = WorkerArgs::new(Mode::Contend, "name", 7, Path::new("/tmp/history"));
        a.redis_url = vec!["redis://a:1".into(), "redis://b:2".into()];
        a.cluster = true;
        a.tolerate_errors = true;
        a.synced_replicas = 2;
        a.synced_within = Duration::from_millis(321);
        a.node_op = Some(Duration::from_millis(11));
        a.reprobe = Some(Duration::from_millis(12));
        a.quarantine = Some(Duration::from_millis(13));
        a.order = CombOrder::Pipelined;
        a.resource_url = Some("redis://r:3".into());
        a.tasks = 5;
        a.iterations = 6;
        a.max_duration = Duration::from_millis(7_000);
        a.lease = Duration::from_millis(800);
        a.renewal = Some(Duration::from_millis(14));
        a.spin_wait = Some(Duration::from_millis(15));
        a.command_timeout = Some(Duration::from_millis(16));
        a.hold = Duration::from_millis(17);
        a.step = Duration::from_millis(18);
        a.budget = Duration::ZERO;
        a.linger = Duration::from_millis(19);
        a.go_file = Some("/tmp/go".into());
        a.counter_key = "c".into();
        a.unsafe_skip_lock = true;
        a.fenced_key = Some("f".into());
        a.late_write = true;
        a.unlock_file = Some("/tmp/u".into());
        a.reenter_file = Some("/tmp/r".into());
        a.cancel_unlock = true;
        a.stop_file = Some("/tmp/s".into());
        a.named_holders = true;
        a.implicit_holders = true;
        a.burn_threads = 2;
        a.shared = Some(SharedKind::Sem);
        a.read_percent = 70;
        a.permits = 2;
        a.capacity = 9;
        a.hold_as = HoldAs::Write;
        assert_eq!(round_trip(&a), a);
        // Sentinel and ZooKeeper exclude the cluster flag: each their own line.
        let mut s = WorkerArgs::new(Mode::Wait, "n", 0, Path::new("/h"));
        s.redis_url = vec!["redis://s:1".into()];
        s.sentinel_master = Some("m".into());
        assert_eq!(round_trip(&s), s);
        let mut z = WorkerArgs::new(Mode::Reenter, "n", 0, Path::new("/h"));
        z.zookeeper = Some("127.0.0.1:2181".into());
        z.zk_root = Some("/left".into());
        assert_eq!(round_trip(&z), z);
    }

    #[test]
    fn a_bad_duration_is_refused_with_its_unit() {
        let e = WorkerArgs::try_parse_from([
            "slate-worker",
            "--redis-url",
            "redis://x",
            "--lock",
            "l",
            "--proc",
            "0",
            "--history-dir",
            "/h",
            "--mode",
            "hold",
            "--lease-ms",
            "1s",
        ])
        .expect_err("1s is not milliseconds");
        assert!(e.to_string().contains("milliseconds"), "{e}");
    }
}
