//! M1-M4 (issue 31): the multi-lock across processes, judged name by name by the history
//! checker.
//!
//! Three processes take overlapping sets given in the orders that make a cycle ({a,b},
//! {b,c}, {c,a}), three tasks each: no name is ever held twice at once, tokens increase per
//! name, every hold is done (no deadlock) - also with a holder of {a,b,c} SIGKILLed while it
//! holds (the others go on after its leases end) and with the lock server paused for longer
//! than the command timeout. The negative control takes the same sets by hand, as single
//! locks in the caller's order with a moment between two names: the run must deadlock, and
//! the test sees it. M12 runs the cycle on a Redis Cluster, two of its names in one hash slot
//! (taken and released by one script call) and the third on another master.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::path::{Path, PathBuf};
use std::time::Duration;

use ecosphere::clock::now_ns;
use ecosphere::cluster::RedisCluster;
use ecosphere::history::{CheckConfig, CheckId, EventKind, History, Recorder};
use ecosphere::server::RedisServer;
use ecosphere::workers::WorkerSet;
use scenario::*;

const LEASE: Duration = Duration::from_secs(2);
const SETS: [&str; 3] = ["a,b", "b,c", "c,a"];
const TASKS: u64 = 3;
const ITERATIONS: u64 = 25;
/// The harness's own process number in the history.
const HARNESS: u32 = 99;

/// A `contend` worker on the multi-lock of `set` as process `proc`.
fn multi_worker(
    server: &RedisServer,
    set: &str,
    proc: u32,
    history: &Path,
    go_file: &Path,
) -> Worker {
    let mut w = Worker::new("contend", server, &format!("multi-{set}"), history);
    w.multi = Some(set.to_owned());
    w.tasks = TASKS;
    w.iterations = ITERATIONS;
    w.hold = Duration::from_millis(2);
    w.lease = LEASE;
    w.renewal = Some(Duration::from_millis(600));
    w.spin_wait = Some(Duration::from_millis(100));
    w.max_duration = Duration::from_secs(50);
    w.go_file = Some(go_file.to_path_buf());
    w.proc_base = proc;
    w
}

/// A lock server and a run's directory: its go file and its history directory.
struct Run {
    server: RedisServer,
    _dir: tempfile::TempDir,
    go_file: PathBuf,
    history: PathBuf,
}

impl Run {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let go_file = dir.path().join("go");
        let history = dir.path().join("history");
        std::fs::create_dir(&history).expect("history dir");
        Run {
            server: server(),
            _dir: dir,
            go_file,
            history,
        }
    }

    /// A worker for each of the three cycle-order sets, as `configure` makes it.
    fn workers(&self, configure: impl Fn(&mut Worker)) -> Vec<Worker> {
        SETS.iter()
            .enumerate()
            .map(|(i, set)| {
                let mut w = multi_worker(&self.server, set, i as u32, &self.history, &self.go_file);
                configure(&mut w);
                w
            })
            .collect()
    }
}

fn spawn_all(workers: &[Worker]) -> Vec<WorkerSet> {
    let mut sets: Vec<WorkerSet> = workers.iter().map(|w| w.spawn(1)).collect();
    for s in &mut sets {
        wait_line_all(s, "READY", Duration::from_secs(20));
    }
    sets
}

fn acq_oks(h: &History, proc: u32) -> usize {
    h.events()
        .iter()
        .filter(|e| e.proc == proc && e.kind.name() == "acq_ok")
        .count()
}

fn assert_done(sets: &mut [WorkerSet]) {
    for s in sets {
        let out = finish_ok(s, Duration::from_secs(55)).remove(0);
        assert!(
            out.stdout_lines()
                .any(|l| l == format!("DONE acquisitions={}", TASKS * ITERATIONS)),
            "{}",
            out.stdout
        );
    }
}

/// The checker's verdict, name by name, on the history; `final_keys`: the lock keys left on
/// the servers (none may be a hold).
fn assert_names_checked(history: &Path, final_keys: Vec<String>, killed: bool) {
    let cfg = CheckConfig {
        final_keys: Some(final_keys),
        ..CheckConfig::new(LEASE)
    };
    let (_, report) = if killed {
        check_killed(history, &cfg)
    } else {
        check(history, &cfg)
    };
    report.assert_ok();
    assert_eq!(
        report.stats.locks, 3,
        "every name judged as a lock of its own"
    );
    report.assert_pass(&[
        CheckId::Exclusion,
        CheckId::Tokens,
        CheckId::Ownership,
        CheckId::Validity,
    ]);
}

#[test]
fn m1_overlapping_sets_in_cycle_orders_neither_overlap_nor_deadlock() {
    let run = Run::new();
    let mut sets = spawn_all(&run.workers(|_| {}));
    go(&run.go_file);
    assert_done(&mut sets);
    assert_names_checked(&run.history, lock_keys(&run.server), false);
}

#[test]
fn m2_a_holder_killed_while_it_holds_every_name_is_outlived() {
    let run = Run::new();
    let mut workers = run.workers(|_| {});
    // Process 3 holds {a,b,c} for 30 s at a time: it is killed during its first hold.
    let mut big = multi_worker(&run.server, "c,b,a", 3, &run.history, &run.go_file);
    big.tasks = 1;
    big.hold = Duration::from_secs(30);
    workers.push(big);
    let mut sets = spawn_all(&workers);
    go(&run.go_file);
    wait_history(
        &run.history,
        Duration::from_secs(30),
        "process 3 holding",
        |h| acq_oks(h, 3) == 3,
    );
    let rec = Recorder::create(&run.history, HARNESS).expect("harness recorder");
    let t_kill = now_ns();
    sets[3].kill(0).expect("SIGKILL process 3");
    rec.record_at(t_kill, 0, "a", EventKind::kill_worker(3))
        .expect("record the kill");
    let mut survivors: Vec<WorkerSet> = sets.drain(..3).collect();
    assert_done(&mut survivors);
    assert_names_checked(&run.history, lock_keys(&run.server), true);
}

#[test]
fn m3_a_paused_lock_server_and_the_history_still_holds() {
    let mut run = Run::new();
    let mut sets = spawn_all(&run.workers(|w| {
        w.command_timeout = Some(Duration::from_millis(300));
        w.tolerate_errors = true;
    }));
    go(&run.go_file);
    wait_history(&run.history, Duration::from_secs(20), "some holds", |h| {
        (0..3).map(|p| acq_oks(h, p)).sum::<usize>() > 30
    });
    let rec = Recorder::create(&run.history, HARNESS).expect("harness recorder");
    nemesis(&rec, now_ns(), "a", "sigstop_server", "lock");
    run.server.pause().expect("SIGSTOP");
    std::thread::sleep(Duration::from_millis(900));
    run.server.resume().expect("SIGCONT");
    nemesis(&rec, now_ns(), "a", "heal", "lock");
    assert_done(&mut sets);
    let h = History::load(&run.history).expect("history");
    let cut = h
        .events()
        .iter()
        .filter(|e| matches!(e.kind.name(), "acq_info" | "rel_info"))
        .count();
    println!("calls without a reply during the pause: {cut}");
    assert!(cut > 0, "the pause cut some calls short");
    assert_names_checked(&run.history, lock_keys(&run.server), false);
}

/// The negative control: each process takes its two names by hand in the order given, with
/// 200 ms between them. All three take their first name, then wait for the next one's first
/// name for ever: the run makes no progress until each worker's max duration ends it.
#[test]
fn m4_the_caller_order_deadlocks_and_the_run_sees_it() {
    let run = Run::new();
    let mut sets = spawn_all(&run.workers(|w| {
        w.caller_order = true;
        w.gap = Duration::from_millis(200);
        w.tasks = 1;
        w.iterations = 3;
        w.max_duration = Duration::from_secs(6);
    }));
    go(&run.go_file);
    for (i, s) in sets.iter_mut().enumerate() {
        let out = s
            .wait_all(Duration::from_secs(20))
            .expect("workers end")
            .remove(0);
        assert!(
            !out.status.success() && out.stderr.contains("max duration"),
            "process {i} was expected to be stuck in the cycle:\n{}\n{}",
            out.stdout,
            out.stderr
        );
    }
    // Nobody finished: the holds recorded are far fewer than three rounds of every set.
    let h = History::load(&run.history).expect("history");
    let held: usize = (0..3).map(|p| acq_oks(&h, p)).sum();
    assert!(held < 3 * 3 * 2, "{held} names taken: the run went on");
}

/// Lock names on a fresh 3-master cluster: `{m}` and `{m13819}` share hash slot 15627 (the
/// third master), `{b}` is in slot 3300 (the first).
const CLUSTER_SETS: [&str; 3] = ["m,m13819", "m13819,b", "b,m"];

/// M12: the cycle on a Redis Cluster. The set {m, m13819} is one slot's, taken and released
/// in one script call each; the two others span two masters, a name per slot. Judged name by
/// name as M1.
#[test]
fn m12_the_cycle_on_a_cluster_with_one_slot_s_names_batched() {
    let cluster = RedisCluster::start(3, 0).expect("cluster");
    let slot = |n: &str| {
        cluster
            .slot_of(format!("slate:{{{n}}}").as_bytes())
            .unwrap()
    };
    assert_eq!(slot("m"), slot("m13819"), "one slot's two names");
    assert_ne!(
        cluster.master_of(slot("m")).unwrap(),
        cluster.master_of(slot("b")).unwrap(),
        "the third name on another master"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let go_file = dir.path().join("go");
    let history = dir.path().join("history");
    std::fs::create_dir(&history).expect("history dir");
    let workers: Vec<Worker> = CLUSTER_SETS
        .iter()
        .enumerate()
        .map(|(i, set)| {
            let mut w = multi_worker(cluster.node(0), set, i as u32, &history, &go_file);
            w.redis_url = cluster.urls();
            w.cluster = true;
            w
        })
        .collect();
    let mut sets = spawn_all(&workers);
    go(&go_file);
    assert_done(&mut sets);
    let final_keys: Vec<String> = cluster
        .masters()
        .unwrap()
        .into_iter()
        .flat_map(|i| lock_keys(cluster.node(i)))
        .collect();
    assert_names_checked(&history, final_keys, false);
}
