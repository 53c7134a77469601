//! The side-by-side contention runner: P processes × T tasks on one lock, the critical section
//! `GET counter; SET counter+1` on a separate resource server, for D seconds, each
//! implementation in turn, runs interleaved and repeated.
//!
//! What a run measures:
//! - **acquisitions/s**: acquisitions obtained before the deadline, per second. Acquisitions
//!   that complete after it ("late") still run the critical section and count in the
//!   mutual-exclusion check.
//! - **lock commands per acquisition**: the commands the clients sent to the lock nodes (from
//!   `INFO commandstats`, summed over the nodes; for `slate-zk`, the requests the ZooKeeper
//!   server received, `mntr`'s `zk_packets_received`, client pings included), without the commands that only ever run
//!   inside Lua scripts and without the runner's own `INFO`/`CONFIG`/`FLUSHALL` and connection
//!   setup (see `ecosphere::commandstats`). The workload's `GET`/`SET` go to the resource server, so none are on the lock
//!   nodes.
//! - **client CPU per acquisition**: user + system CPU of the worker processes
//!   (`getrusage(RUSAGE_SELF)` at their end), divided by the acquisitions.
//! - **wait**: from starting an acquire to holding the lock; p50, p99, max over all tasks.
//! - **fairness**: min..max acquisitions per worker process.
//! - **mutual exclusion**: the final counter equals the total acquisitions.

pub mod impls;
pub mod runner;
pub mod stats;

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// Commands the runner itself sends to the lock nodes.
pub const RUNNER_ONLY: &[&str] = ecosphere::commandstats::NOT_LOCK;

/// An implementation under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Impl {
    /// Slate's single lock.
    Slate,
    /// Slate's single lock with a Prometheus recorder installed in each worker (the metrics'
    /// cost, `docs/OPERATIONS.md`).
    SlateMetered,
    /// Slate's combination lock on three nodes, sequential order.
    SlateComb3,
    /// Slate's combination lock on three nodes, pipelined order.
    SlateComb3Pipelined,
    /// The `rslock` crate on one node, defaults.
    Rslock1,
    /// The `rslock` crate on three nodes, defaults.
    Rslock3,
    /// A naive `SET NX PX` spin lock with 1 ms sleeps.
    Spin,
    /// Slate's single lock on a 3-master Redis Cluster (each lock on the shard of its slot).
    SlateCluster,
    /// Slate's read-write lock on one node: with `--read-percent`, reads share it.
    SlateRw,
    /// Slate's ZooKeeper lock on one standalone ZooKeeper server (fsync on, as shipped).
    SlateZk,
    /// The peer on ZooKeeper: `zookeeper-client`'s own lock recipe (Apache Curator's
    /// `InterProcessMutex` layout), one contender znode per task, released by dropping it.
    ZkCurator,
    /// Slate's multi-lock over each set (`--set-size`).
    SlateMulti,
    /// Slate's single locks of a set taken by hand in canonical order (sorted), one holder.
    SlateOrdered,
    /// The `redis-lock` crate's `MultiResourceLock` (one server function call per attempt, its
    /// default 1 s sleep between attempts); needs `--features multi-peers`.
    RedisLock,
    /// The `redisson` crate's `AsyncRMultiLock` (each name's `try_lock` in the caller's order,
    /// all given back on a busy one), retried after 1 ms; needs `--features multi-peers`.
    Redisson,
}

impl Impl {
    /// Every implementation, in the default interleaving order.
    pub const ALL: &'static [Impl] = &[
        Impl::Slate,
        Impl::SlateMetered,
        Impl::SlateComb3,
        Impl::SlateComb3Pipelined,
        Impl::Rslock1,
        Impl::Rslock3,
        Impl::Spin,
        Impl::SlateCluster,
        Impl::SlateRw,
        Impl::SlateZk,
        Impl::ZkCurator,
        Impl::SlateMulti,
        Impl::SlateOrdered,
        Impl::RedisLock,
        Impl::Redisson,
    ];

    /// How many lock nodes it uses.
    #[must_use]
    pub fn nodes(self) -> usize {
        match self {
            Impl::Rslock3 | Impl::SlateComb3 | Impl::SlateComb3Pipelined | Impl::SlateCluster => 3,
            Impl::Slate
            | Impl::SlateMetered
            | Impl::Rslock1
            | Impl::Spin
            | Impl::SlateRw
            | Impl::SlateZk
            | Impl::ZkCurator
            | Impl::SlateMulti
            | Impl::SlateOrdered
            | Impl::RedisLock
            | Impl::Redisson => 1,
        }
    }

    /// Whether its lock lives on ZooKeeper (not on the Redis lock nodes).
    #[must_use]
    pub fn on_zookeeper(self) -> bool {
        matches!(self, Impl::SlateZk | Impl::ZkCurator)
    }

    /// The name used on the command line and in reports.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Impl::Slate => "slate",
            Impl::SlateMetered => "slate-metered",
            Impl::SlateComb3 => "slate-comb-3",
            Impl::SlateComb3Pipelined => "slate-comb-3p",
            Impl::Rslock1 => "rslock-1",
            Impl::Rslock3 => "rslock-3",
            Impl::Spin => "spin",
            Impl::SlateCluster => "slate-cluster",
            Impl::SlateRw => "slate-rw",
            Impl::SlateZk => "slate-zk",
            Impl::ZkCurator => "zk-curator",
            Impl::SlateMulti => "slate-multi",
            Impl::SlateOrdered => "slate-ordered",
            Impl::RedisLock => "redis-lock",
            Impl::Redisson => "redisson",
        }
    }
}

impl fmt::Display for Impl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Impl {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Impl::ALL
            .iter()
            .copied()
            .find(|i| i.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Impl::ALL.iter().map(|i| i.name()).collect();
                format!(
                    "unknown implementation {s:?}; use one of {}",
                    names.join(", ")
                )
            })
    }
}

/// Processes × tasks per process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Shape {
    /// Worker processes.
    pub procs: usize,
    /// Tasks per process.
    pub tasks: usize,
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.procs, self.tasks)
    }
}

impl FromStr for Shape {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("bad shape {s:?}; write PROCSxTASKS, e.g. 4x8 (1..=64 x 1..=1024)");
        let (p, t) = s.split_once('x').ok_or_else(bad)?;
        let procs: usize = p.parse().map_err(|_| bad())?;
        let tasks: usize = t.parse().map_err(|_| bad())?;
        if !(1..=64).contains(&procs) || !(1..=1024).contains(&tasks) {
            return Err(bad());
        }
        Ok(Shape { procs, tasks })
    }
}

/// What one worker process reports on stdout (one JSON line prefixed by `REPORT `).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WorkerReport {
    /// Acquisitions before the deadline.
    pub acquisitions: u64,
    /// Acquisitions completed after the deadline (still in the mutual-exclusion count).
    pub late: u64,
    /// Failed operations (backend errors).
    pub errors: u64,
    /// The first error, if any.
    pub first_error: Option<String>,
    /// Wait of every acquisition before the deadline, in µs.
    pub waits_us: Vec<u32>,
    /// User + system CPU of the whole process, µs.
    pub cpu_us: u64,
    /// Critical sections that wrote (incremented the counter), late ones included.
    #[serde(default)]
    pub writes: u64,
    /// Wait of every write acquisition before the deadline, in µs (with `--read-percent`).
    #[serde(default)]
    pub write_waits_us: Vec<u32>,
}

/// One measured run of one implementation in one shape.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    /// The server the lock nodes ran (`Redis 7.0.15`, `Valkey 8.1.8`; empty in unit tests).
    pub server: String,
    /// Implementation.
    pub implementation: Impl,
    /// Shape.
    pub shape: Shape,
    /// Repetition index.
    pub repeat: usize,
    /// Seconds of load.
    pub duration_s: f64,
    /// Acquisitions before the deadline, all workers.
    pub acquisitions: u64,
    /// Late acquisitions.
    pub late: u64,
    /// Backend errors.
    pub errors: u64,
    /// The first error, if any.
    pub first_error: Option<String>,
    /// Acquisitions per second.
    pub acq_per_s: f64,
    /// Client lock commands per acquisition.
    pub lock_cmds_per_acq: f64,
    /// All commands on the lock nodes (including those inside scripts) per acquisition.
    pub server_cmds_per_acq: f64,
    /// Client CPU per acquisition, µs.
    pub cpu_us_per_acq: f64,
    /// The lock nodes' CPU per acquisition, µs (`INFO cpu` deltas; NaN in unit tests).
    pub server_cpu_us_per_acq: f64,
    /// Wait p50, ms.
    pub wait_p50_ms: f64,
    /// Wait p99, ms.
    pub wait_p99_ms: f64,
    /// Wait max, ms.
    pub wait_max_ms: f64,
    /// Critical sections that wrote.
    pub writes: u64,
    /// Wait p99 of the write acquisitions, ms (NaN without writes).
    pub write_wait_p99_ms: f64,
    /// Fewest acquisitions of one worker.
    pub worker_min: u64,
    /// Most acquisitions of one worker.
    pub worker_max: u64,
    /// The counter read at the end.
    pub counter: i64,
    /// Whether the counter equals the writes (every acquisition when nothing reads).
    pub mutex_ok: bool,
    /// Per-command calls on the lock nodes during the run (client-visible and script-internal).
    pub commandstats: BTreeMap<String, u64>,
    /// Per-command microseconds on the lock nodes during the run (`INFO commandstats`'s
    /// `usec`; a script's entry includes the commands it ran, also counted under their own
    /// names), for where the server's time goes. Empty on ZooKeeper.
    pub commandstats_usec: BTreeMap<String, u64>,
    /// `MOVED` and `ASK` replies of the lock nodes during the run (`INFO errorstats`; a cluster
    /// only).
    pub redirects: u64,
}

/// Parses `INFO commandstats` into command → calls.
#[must_use]
pub fn parse_commandstats(info: &str) -> BTreeMap<String, u64> {
    ecosphere::commandstats::parse(info)
}

/// Parses `INFO commandstats` into command → microseconds.
pub fn parse_commandstats_usec(info: &str) -> BTreeMap<String, u64> {
    ecosphere::commandstats::parse_usec(info)
}

/// Client-sent lock commands in a commandstats delta of `implementation` (Slate's scripts
/// also run `SET`, for their request records, which the other implementations send).
#[must_use]
pub fn client_commands(implementation: Impl, stats: &BTreeMap<String, u64>) -> u64 {
    match implementation {
        Impl::Slate
        | Impl::SlateMetered
        | Impl::SlateComb3
        | Impl::SlateComb3Pipelined
        | Impl::SlateCluster
        | Impl::SlateRw
        | Impl::SlateMulti
        | Impl::SlateOrdered => ecosphere::commandstats::slate_lock_commands(stats),
        Impl::Rslock1 | Impl::Rslock3 | Impl::Spin | Impl::RedisLock | Impl::Redisson => {
            ecosphere::commandstats::lock_commands(stats)
        }
        // The ZooKeeper server's requests (`mntr`'s `zk_packets_received`, pings included).
        Impl::SlateZk | Impl::ZkCurator => stats.values().sum(),
    }
}

/// Summarises worker reports and server counters into a [`RunResult`].
#[allow(clippy::too_many_arguments)]
#[must_use]
pub fn summarise(
    implementation: Impl,
    shape: Shape,
    repeat: usize,
    duration: Duration,
    reports: &[WorkerReport],
    commandstats: BTreeMap<String, u64>,
    counter: i64,
    redirects: u64,
) -> RunResult {
    let acquisitions: u64 = reports.iter().map(|r| r.acquisitions).sum();
    let late: u64 = reports.iter().map(|r| r.late).sum();
    let errors: u64 = reports.iter().map(|r| r.errors).sum();
    let cpu: u64 = reports.iter().map(|r| r.cpu_us).sum();
    let mut waits: Vec<u32> = reports
        .iter()
        .flat_map(|r| r.waits_us.iter().copied())
        .collect();
    waits.sort_unstable();
    let per = |x: f64| {
        if acquisitions == 0 {
            f64::NAN
        } else {
            x / acquisitions as f64
        }
    };
    let ms = |q| stats::quantile(&waits, q).map_or(f64::NAN, |us| f64::from(us) / 1000.0);
    let mut write_waits: Vec<u32> = reports
        .iter()
        .flat_map(|r| r.write_waits_us.iter().copied())
        .collect();
    write_waits.sort_unstable();
    let writes: u64 = reports.iter().map(|r| r.writes).sum();
    // Reports without a write count (a unit test's) wrote at every acquisition.
    let expected = if writes == 0 {
        acquisitions + late
    } else {
        writes
    };
    let total_all: u64 = commandstats
        .iter()
        .filter(|(n, _)| !RUNNER_ONLY.contains(&n.split('|').next().unwrap_or(n)))
        .map(|(_, c)| c)
        .sum();
    RunResult {
        server: String::new(),
        implementation,
        shape,
        repeat,
        duration_s: duration.as_secs_f64(),
        acquisitions,
        late,
        errors,
        first_error: reports.iter().find_map(|r| r.first_error.clone()),
        acq_per_s: acquisitions as f64 / duration.as_secs_f64(),
        lock_cmds_per_acq: per(client_commands(implementation, &commandstats) as f64),
        server_cmds_per_acq: per(total_all as f64),
        cpu_us_per_acq: per(cpu as f64),
        server_cpu_us_per_acq: f64::NAN,
        wait_p50_ms: ms(0.5),
        wait_p99_ms: ms(0.99),
        wait_max_ms: ms(1.0),
        writes,
        write_wait_p99_ms: stats::quantile(&write_waits, 0.99)
            .map_or(f64::NAN, |us| f64::from(us) / 1000.0),
        worker_min: reports.iter().map(|r| r.acquisitions).min().unwrap_or(0),
        worker_max: reports.iter().map(|r| r.acquisitions).max().unwrap_or(0),
        counter,
        mutex_ok: u64::try_from(counter).is_ok_and(|c| c == expected),
        commandstats,
        commandstats_usec: BTreeMap::new(),
        redirects,
    }
}

/// Arguments of one worker process.
#[derive(Clone, Debug)]
pub struct WorkerArgs {
    /// Implementation.
    pub implementation: Impl,
    /// Lock node URLs.
    pub nodes: Vec<String>,
    /// Resource server URL (the counter).
    pub resource: String,
    /// Tasks in this process.
    pub tasks: usize,
    /// Load duration.
    pub duration: Duration,
    /// Start instant on the shared monotonic clock (ns).
    pub start_at_ns: u64,
    /// Lock names: `bench:lock` for one lock, `bench:lock:<i>` for several; each task takes
    /// them in turn, each protecting its own counter (`bench:counter[:<i>]`).
    pub locks: usize,
    /// Percent of the critical sections that only read (`GET`); the others write (`GET`,
    /// `SET`). Readers share `slate-rw`; every other implementation takes its lock for both.
    pub read_percent: u8,
    /// Names taken together by each acquisition: lock `i` and the `set_size - 1` after it
    /// (overlapping sets), each counter incremented in the critical section.
    pub set_size: usize,
}

/// The name of lock `i` of `n`, and the counter it protects.
#[must_use]
pub fn lock_and_counter(i: usize, n: usize) -> (String, String) {
    if n <= 1 {
        ("bench:lock".to_owned(), "bench:counter".to_owned())
    } else {
        (format!("bench:lock:{i}"), format!("bench:counter:{i}"))
    }
}

/// How long after the deadline an acquire in flight may still complete.
pub const GRACE: Duration = Duration::from_secs(3);

/// Runs one worker process's load and returns its report.
///
/// # Errors
///
/// Connection failures before the load starts.
pub async fn run_worker(args: WorkerArgs) -> Result<WorkerReport, String> {
    let locks = args.locks.max(1);
    let names: Vec<(String, String)> = (0..locks).map(|i| lock_and_counter(i, locks)).collect();
    let lock_names: Vec<String> = names.iter().map(|n| n.0.clone()).collect();
    let set_size = args.set_size.clamp(1, locks);
    let locker = std::sync::Arc::new(
        impls::Locker::connect(args.implementation, &args.nodes, &lock_names, set_size).await?,
    );
    let names = std::sync::Arc::new(names);
    let resource_client = redis::Client::open(args.resource.as_str()).map_err(|e| e.to_string())?;
    let resource = resource_client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| e.to_string())?;
    // Start together with the other workers.
    let now = ecosphere::clock::now_ns();
    if args.start_at_ns > now {
        tokio::time::sleep(Duration::from_nanos(args.start_at_ns - now)).await;
    }
    let deadline = Instant::now() + args.duration;
    let mut handles = Vec::with_capacity(args.tasks);
    // Tasks of different processes start on different locks (a process-dependent offset).
    let offset = usize::try_from(std::process::id()).unwrap_or(0);
    for task in 0..args.tasks {
        let locker = locker.clone();
        let mut resource = resource.clone();
        let names = names.clone();
        let read_percent = u64::from(args.read_percent);
        handles.push(tokio::spawn(async move {
            let mut r = WorkerReport::default();
            let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (offset as u64) << 20 ^ task as u64;
            let mut next = offset
                .wrapping_mul(31)
                .wrapping_add(task.wrapping_mul(7919));
            while Instant::now() < deadline {
                next = next.wrapping_add(1);
                let index = next % names.len();
                let (lock, counter) = (&names[index].0, &names[index].1);
                let set: Vec<usize> = (0..set_size).map(|k| (index + k) % names.len()).collect();
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let read = rng % 100 < read_percent;
                let t0 = Instant::now();
                let acquired = if set_size > 1 {
                    locker
                        .acquire_set(index, &set, &names, deadline + GRACE)
                        .await
                } else {
                    locker.acquire(index, lock, deadline + GRACE, read).await
                };
                let held = match acquired {
                    Ok(Some(h)) => h,
                    Ok(None) => break,
                    Err(e) => {
                        r.errors += 1;
                        r.first_error.get_or_insert(e);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let acquired = Instant::now();
                if acquired <= deadline {
                    r.acquisitions += 1;
                    let wait = acquired.duration_since(t0).as_micros();
                    let wait = u32::try_from(wait).unwrap_or(u32::MAX);
                    r.waits_us.push(wait);
                    if !read {
                        r.write_waits_us.push(wait);
                    }
                } else {
                    r.late += 1;
                }
                if !read {
                    r.writes += set.len() as u64;
                }
                for &i in &set {
                    let counter = if set_size > 1 { &names[i].1 } else { counter };
                    if let Err(e) = impls::critical_section(&mut resource, counter, read).await {
                        r.errors += 1;
                        r.first_error.get_or_insert(e);
                    }
                }
                if let Err(e) = locker.release(lock, held).await {
                    r.errors += 1;
                    r.first_error.get_or_insert(e);
                }
            }
            r
        }));
    }
    let mut total = WorkerReport::default();
    for h in handles {
        let r = h.await.map_err(|e| format!("task failed: {e}"))?;
        total.acquisitions += r.acquisitions;
        total.late += r.late;
        total.errors += r.errors;
        if total.first_error.is_none() {
            total.first_error = r.first_error;
        }
        total.waits_us.extend(r.waits_us);
        total.writes += r.writes;
        total.write_waits_us.extend(r.write_waits_us);
    }
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .map_err(|e| format!("getrusage: {e}"))?;
    let us = |tv: nix::sys::time::TimeVal| {
        u64::try_from(tv.tv_sec()).unwrap_or(0) * 1_000_000
            + u64::try_from(tv.tv_usec()).unwrap_or(0)
    };
    total.cpu_us = us(usage.user_time()) + us(usage.system_time());
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_parsing_and_client_count() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=5,usec_per_call=0.5,rejected_calls=0,failed_calls=0\r\ncmdstat_hincrby:calls=10,usec=1\r\ncmdstat_info:calls=2,usec=1\r\ncmdstat_set:calls=7,usec=1\r\ncmdstat_client|setinfo:calls=2,usec=1\r\n";
        let s = parse_commandstats(info);
        assert_eq!(s["evalsha"], 10);
        assert_eq!(s["client|setinfo"], 2);
        // Connection setup (`client|setinfo`) is not lock traffic.
        assert_eq!(client_commands(Impl::Spin, &s), 10 + 7);
        // Slate's scripts write request records with SET: not sent by the client.
        assert_eq!(client_commands(Impl::Slate, &s), 10);
    }

    #[test]
    fn shapes_parse_and_reject() {
        assert_eq!(
            "4x8".parse::<Shape>().unwrap(),
            Shape { procs: 4, tasks: 8 }
        );
        assert!("4".parse::<Shape>().is_err());
        assert!("0x8".parse::<Shape>().unwrap_err().contains("PROCSxTASKS"));
    }

    #[test]
    fn summary_checks_the_counter() {
        let reports = vec![
            WorkerReport {
                acquisitions: 3,
                late: 1,
                waits_us: vec![1, 2, 3],
                ..Default::default()
            },
            WorkerReport {
                acquisitions: 5,
                waits_us: vec![4, 5, 6, 7, 8],
                ..Default::default()
            },
        ];
        let shape = Shape { procs: 2, tasks: 1 };
        let d = Duration::from_secs(1);
        let ok = summarise(Impl::Spin, shape, 0, d, &reports, BTreeMap::new(), 9, 0);
        assert!(ok.mutex_ok);
        assert_eq!((ok.worker_min, ok.worker_max), (3, 5));
        assert_eq!(ok.wait_max_ms, 0.008);
        let lost = summarise(Impl::Spin, shape, 0, d, &reports, BTreeMap::new(), 8, 0);
        assert!(!lost.mutex_ok);
    }
}
