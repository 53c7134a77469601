//! The single lock on a Sentinel-managed master through a failover (issue 13, item 7).
//!
//! Replication is asynchronous. The scenario makes a grant miss every replica (each replica's
//! link to the master is cut and the replica kept busy, so it cannot resync), kills the master,
//! lets the Sentinels promote a replica, and starts a second process on the same lock:
//!
//! - without `synced_replicas`, the promoted master never saw the first grant and grants the
//!   lock again while the first holder still holds it: the history checker must report the
//!   overlap (an expected violation, built to be caught);
//! - with `synced_replicas(1, …)`, the first grant is not acknowledged, so it is given back
//!   and reported, and the checker finds no overlap; the second process acquires on the new
//!   master within a stated bound after the failover.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::path::Path;
use std::time::{Duration, Instant};

use ecosphere::history::{CheckConfig, CheckId};
use ecosphere::sentinel::SentinelGroup;
use scenario::*;

/// The first holder's lease and renewal period: long, so that it still believes it holds when
/// the second process is granted the lock on the promoted master (its first renewal, 30 s in,
/// would find the entry gone).
const LEASE: Duration = Duration::from_secs(60);
const RENEWAL: Duration = Duration::from_secs(30);
/// How long the first process holds before it unlocks. The failover (about 2-6 s here: the
/// Sentinels first find the replicas asleep and try again after twice the 2 s failover
/// timeout) and the second acquisition must fit in it for the overlap to exist; a CI run once
/// took 15 s with a 5 s failover timeout, and a run with the whole suite in parallel on 2
/// cores once took 20 s, so the hold goes as close to the first renewal (30 s, which would
/// find the entry gone) as it safely can.
const FIRST_HOLD: Duration = Duration::from_secs(27);
/// How long the replicas are kept from resyncing: past the master's kill.
const REPLICA_SLEEP: Duration = Duration::from_secs(4);
/// Stated bound: after the Sentinels name the new master, a new process acquires within this.
const AFTER_FAILOVER: Duration = Duration::from_secs(5);

/// Cuts replica `i`'s link to its master and keeps it from reconnecting for `REPLICA_SLEEP`:
/// `CLIENT KILL TYPE MASTER` and `DEBUG SLEEP` in one pipeline, so the replica runs no cron
/// (which would reconnect) between them. The reply is read on a thread.
fn isolate_replica(group: &SentinelGroup, i: usize) -> std::thread::JoinHandle<()> {
    let mut con = group.server(i).connection().expect("replica connection");
    std::thread::spawn(move || {
        let _: redis::RedisResult<redis::Value> = redis::pipe()
            .cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("MASTER")
            .cmd("DEBUG")
            .arg("SLEEP")
            .arg(REPLICA_SLEEP.as_secs_f64())
            .query(&mut con);
    })
}

fn worker(group: &SentinelGroup, mode: &'static str, history: &Path, proc: u32) -> Worker {
    let dummy = group.server(0);
    let mut w = Worker::new(mode, dummy, "failover", history);
    w.redis_url = group.sentinel_urls();
    w.sentinel_master = Some(group.master_name().to_owned());
    w.proc_base = proc;
    w.lease = LEASE;
    w.renewal = Some(RENEWAL);
    w.command_timeout = Some(Duration::from_secs(1));
    w.max_duration = Duration::from_secs(60);
    w
}

/// Whether `server` (a master) has a replica online (`INFO replication`).
fn has_online_replica(server: &ecosphere::server::RedisServer) -> bool {
    let text = match server.command(&["INFO", "replication"]) {
        Ok(redis::Value::BulkString(b)) => String::from_utf8_lossy(&b).into_owned(),
        Ok(redis::Value::VerbatimString { text, .. }) => text,
        _ => return false,
    };
    text.lines()
        .any(|l| l.starts_with("slave") && l.contains("state=online"))
}

/// Runs the scenario; returns the first process's output, the second's, the check report, and
/// how long after the kill the second process was done.
fn run(synced: bool) -> (String, String, ecosphere::history::Report, Duration) {
    let mut group = SentinelGroup::start(2, 3).expect("sentinel group");
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path();
    let sync = synced.then_some((1, Duration::from_millis(300)));

    let sleepers = [isolate_replica(&group, 1), isolate_replica(&group, 2)];
    let isolated = Instant::now();
    let mut a = worker(&group, "hold", history, 0);
    a.hold = FIRST_HOLD;
    a.set_synced(sync);
    let mut first = a.spawn(1);
    let outcome = first
        .wait_for_line(
            0,
            |l| l.starts_with("HOLDING") || l.starts_with("ACQUIRE"),
            Duration::from_secs(3),
        )
        .expect("the first process's outcome");
    assert!(
        isolated.elapsed() < REPLICA_SLEEP - Duration::from_millis(500),
        "the first acquisition must happen while the replicas are cut off"
    );
    // Kill the master before the replicas wake; the Sentinels promote one of them.
    let killed = Instant::now();
    group.kill_master().expect("failover");
    let failover = killed.elapsed();
    for s in sleepers {
        s.join().expect("replica sleeper");
    }
    let promoted = Instant::now();
    if synced {
        // `synced_replicas(1)` on the new master needs a replica attached to it: the other
        // replica re-syncs after the promotion, which under load can outlast the second
        // process's budget (its grant is then given back, unacknowledged, as promised).
        let master = group.master().expect("the new master");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !has_online_replica(group.server(master)) {
            assert!(
                Instant::now() < deadline,
                "no replica attached to the new master within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    let mut b = worker(&group, "wait", history, 1);
    b.hold = Duration::from_millis(200);
    b.budget = AFTER_FAILOVER;
    b.set_synced(sync);
    b.spin_wait = Some(Duration::from_millis(100));
    let mut second = b.spawn(1);
    let b_out = finish_ok(&mut second, Duration::from_secs(30)).remove(0);
    let b_took = promoted.elapsed();
    let b_done = killed.elapsed();
    let a_out = finish_ok(&mut first, Duration::from_secs(60)).remove(0);
    println!("first: {outcome}; failover {failover:?}; second done {b_took:?} after the promotion");
    let (_, report) = check(history, &CheckConfig::new(LEASE));
    (a_out.stdout, b_out.stdout, report, b_done)
}

#[test]
fn without_replica_acks_a_failover_regrants_and_the_checker_catches_it() {
    let (a, b, report, b_done) = run(false);
    assert!(
        b_done < FIRST_HOLD,
        "the failover and the second acquisition took {b_done:?}, longer than the first \
         hold: no overlap could be provoked (see FIRST_HOLD)"
    );
    assert!(a.contains("HOLDING"), "the first process held: {a}");
    assert!(
        b.contains("DONE acquired=1"),
        "the new master granted it again: {b}"
    );
    let failed = report.failed();
    assert!(
        failed.contains(&CheckId::Exclusion),
        "the overlap must be caught; failed: {failed:?}\n{report}"
    );
}

#[test]
fn with_replica_acks_the_unreplicated_grant_is_given_back_and_nothing_overlaps() {
    let (a, b, report, _) = run(true);
    assert!(
        a.contains("ACQUIRE error") && a.contains("0 of the 1 replicas"),
        "the unacknowledged grant was given back and reported: {a}"
    );
    assert!(
        b.contains("DONE acquired=1 failed=0 errors=0"),
        "the second process acquired on the new master within {AFTER_FAILOVER:?}: {b}"
    );
    report.assert_ok();
    assert_single_holder_checks(&report);
}
