//! The metrics (`slate_core::metrics`, issue 32) against a real server, read with the
//! `metrics-util` debugging recorder: each metric moves when its event happens, and not
//! otherwise. Every test's locks have a name of their own, labelled (`label_lock_names`), so
//! that a test reads its own series; the client-wide ones are read as totals over a test that
//! runs alone (the tests of this binary take turns).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::*;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use slate_harness::server::Data;
use slate_redis::{ClientOptions, LossReason};

/// The process's recorder (installed once, before any lock exists) and the turn the tests
/// take: a snapshot drains what it reads.
fn recorder() -> &'static (Snapshotter, tokio::sync::Mutex<()>) {
    static REC: OnceLock<(Snapshotter, tokio::sync::Mutex<()>)> = OnceLock::new();
    REC.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this process");
        slate_core::metrics::label_lock_names(|name| {
            String::from_utf8(name.as_bytes().to_vec()).ok()
        });
        (snapshotter, tokio::sync::Mutex::new(()))
    })
}

/// What was recorded since the tally started: counters and gauges summed, histograms by their
/// number of values, each under `name{k=v,...}` with the labels sorted.
#[derive(Default)]
struct Tally(Mutex<HashMap<String, f64>>);

impl Tally {
    /// Starts a tally (what was recorded before is dropped).
    fn start() -> Arc<Tally> {
        drop(recorder().0.snapshot());
        Arc::new(Tally::default())
    }

    /// Reads what was recorded since the last read into the tally.
    fn read(&self) {
        let mut sums = self.0.lock().unwrap();
        for (key, _, _, value) in recorder().0.snapshot().into_vec() {
            let key = key.key();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            #[allow(clippy::cast_precision_loss)]
            let v = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(xs) => xs.len() as f64,
            };
            *sums.entry(name).or_default() += v;
        }
    }

    /// The sum over the series of `name` whose labels include every pair of `labels`.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.read();
        let wanted: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| {
                let (n, rest) = k.split_once('{').unwrap();
                let have: Vec<&str> = rest.trim_end_matches('}').split(',').collect();
                n == name && wanted.iter().all(|w| have.contains(&w.as_str()))
            })
            .map(|(_, v)| *v)
            .sum()
    }

    /// [`get`](Self::get) for the lock `lock` of kind `primitive` on a standalone server, with
    /// the `extra` labels.
    fn of_lock(&self, name: &str, (lock, primitive): (&str, &str), extra: &[(&str, &str)]) -> f64 {
        let mut labels = vec![
            ("lock", lock),
            ("primitive", primitive),
            ("backend", "redis-standalone"),
        ];
        labels.extend_from_slice(extra);
        self.get(name, &labels)
    }

    /// Every series of the lock `lock` with a non-zero sum, for the failure messages.
    fn of(&self, lock: &str) -> Vec<String> {
        self.read();
        let mut v: Vec<String> = self
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, v)| k.contains(&format!("lock={lock}")) && **v != 0.0)
            .map(|(k, v)| format!("{k} = {v}"))
            .collect();
        v.sort();
        v
    }
}

const LEASE: Duration = Duration::from_secs(5);

/// One uncontended acquisition and release: one remote acquisition, one attempt answered
/// acquired, one wait, one hold, the held gauge up then down, one renewal registered then
/// deregistered; no busy answer, timeout, error or loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_hold_is_counted_once() {
    let _turn = recorder().1.lock().await;
    let server = server();
    let client = client(&server);
    let t = Tally::start();
    let l = lock(&client, "m-plain", LEASE);
    let me = [("lock", "m-plain")];
    let g = l.lock().await.unwrap();
    assert_eq!(t.get("slate_held", &me), 1.0, "{:?}", t.of("m-plain"));
    assert_eq!(
        t.get(
            "slate_renewals_registered",
            &[("backend", "redis-standalone")]
        ),
        1.0
    );
    assert_eq!(t.get("slate_hold_seconds", &me), 0.0, "not released yet");
    g.unlock().await.unwrap();
    let at = |name, extra: &[(&str, &str)]| t.of_lock(name, ("m-plain", "lock"), extra);
    assert_eq!(at("slate_acquisitions_total", &[("how", "remote")]), 1.0);
    assert_eq!(at("slate_acquisitions_total", &[]), 1.0);
    assert_eq!(at("slate_attempts_total", &[("outcome", "acquired")]), 1.0);
    assert_eq!(at("slate_attempts_total", &[]), 1.0);
    assert_eq!(at("slate_acquire_wait_seconds", &[]), 1.0);
    assert_eq!(at("slate_attempt_seconds", &[]), 1.0);
    assert_eq!(at("slate_hold_seconds", &[]), 1.0);
    assert_eq!(at("slate_held", &[]), 0.0);
    for quiet in [
        "slate_acquire_busy_total",
        "slate_acquire_timeouts_total",
        "slate_acquire_errors_total",
        "slate_lease_lost_total",
        "slate_waiters",
        "slate_renewal_failures_total",
    ] {
        assert_eq!(at(quiet, &[]), 0.0, "{quiet}: {:?}", t.of("m-plain"));
    }
    assert_eq!(
        t.get(
            "slate_renewals_registered",
            &[("backend", "redis-standalone")]
        ),
        0.0,
        "the release deregistered the renewal"
    );
    for quiet in [
        "slate_server_errors_total",
        "slate_reconnects_total",
        "slate_failovers_total",
    ] {
        assert_eq!(t.get(quiet, &[]), 0.0, "{quiet}");
    }
}

/// Contention from another client: a busy try-lock, a re-entry, a waiter in the queue (the
/// gauge while it waits) whose wait runs out, and passes between the tasks of one process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_is_counted_by_outcome() {
    let _turn = recorder().1.lock().await;
    let server = server();
    let (a, b) = (client(&server), client(&server));
    let t = Tally::start();
    let me = [("lock", "m-busy")];
    let la = lock(&a, "m-busy", LEASE);
    let lb = lock(&b, "m-busy", LEASE);
    let held = la.lock().await.unwrap();

    assert!(lb.try_lock().await.unwrap().is_none(), "busy");
    assert_eq!(t.get("slate_acquire_busy_total", &me), 1.0);
    assert_eq!(
        t.get("slate_attempts_total", &[me[0], ("outcome", "busy")]),
        1.0
    );
    assert_eq!(t.get("slate_acquisitions_total", &me), 1.0, "A's only");

    let again = held.reenter().await.unwrap();
    assert_eq!(
        t.get("slate_acquisitions_total", &[me[0], ("how", "reentry")]),
        1.0
    );
    assert_eq!(t.get("slate_held", &me), 2.0, "each level is a guard");
    again.unlock().await.unwrap();

    let waiting = {
        let lb = lb.clone();
        tokio::spawn(async move { lb.try_lock_for(Duration::from_millis(700)).await.map(drop) })
    };
    eventually(Duration::from_secs(5), "the waiter to be counted", || {
        t.get("slate_waiters", &me) == 1.0
    })
    .await;
    let timed_out = within(Duration::from_secs(5), "the waiter", waiting)
        .await
        .unwrap()
        .unwrap_err();
    assert!(timed_out.is_timeout(), "{timed_out}");
    assert_eq!(t.get("slate_acquire_timeouts_total", &me), 1.0);
    assert_eq!(t.get("slate_waiters", &me), 0.0, "it left the queue");
    assert_eq!(t.get("slate_acquire_errors_total", &me), 0.0);
    held.unlock().await.unwrap();

    // Passes: three tasks of one process queue behind a holder; the first wins its hold
    // from the queue and passes it on.
    let first = la.lock().await.unwrap();
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let la = la.clone();
            tokio::spawn(async move { la.lock().await.unwrap().unlock().await.unwrap() })
        })
        .collect();
    let queued = la.clone();
    eventually(Duration::from_secs(5), "the tasks to queue", || {
        queued.local_waiters() == 3
    })
    .await;
    first.unlock().await.unwrap();
    for task in tasks {
        within(Duration::from_secs(10), "a queued task", task)
            .await
            .unwrap();
    }
    let passes = t.get("slate_acquisitions_total", &[me[0], ("how", "pass")]);
    assert!(passes >= 1.0, "{:?}", t.of("m-busy"));
    assert_eq!(
        t.get("slate_acquisitions_total", &me),
        6.0,
        "A, the re-entry, the first and three tasks: {:?}",
        t.of("m-busy")
    );
    assert_eq!(t.get("slate_held", &me), 0.0);
    assert_eq!(t.get("slate_lease_lost_total", &me), 0.0);
}

/// Renewals move while a lock is held; the entry deleted behind the holder's back is one
/// loss, with its reason, and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_and_a_lost_lease_are_counted() {
    let _turn = recorder().1.lock().await;
    let server = server();
    let client = client(&server);
    let t = Tally::start();
    let me = [("lock", "m-lost")];
    let l = lock(&client, "m-lost", Duration::from_secs(1));
    let g = l.lock().await.unwrap();
    eventually(Duration::from_secs(5), "a renewal", || {
        t.get("slate_renewals_total", &me) >= 2.0
    })
    .await;
    assert_eq!(t.get("slate_lease_lost_total", &me), 0.0);
    server.command(&["FLUSHALL"]).unwrap();
    let reason = within(Duration::from_secs(5), "the loss", g.lost()).await;
    assert_eq!(reason, LossReason::EntryGone);
    assert_eq!(
        t.get("slate_lease_lost_total", &[me[0], ("reason", "entry_gone")]),
        1.0,
        "{:?}",
        t.of("m-lost")
    );
    assert_eq!(t.get("slate_lease_lost_total", &me), 1.0, "counted once");
    drop(g.unlock().await);
    assert_eq!(
        t.get("slate_lease_lost_total", &me),
        1.0,
        "the release adds none"
    );
}

/// A server that goes away: the failed calls are counted by kind, the failed acquisition as
/// an error; the server back, the client's new connection is a reconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_and_reconnects_are_counted() {
    let _turn = recorder().1.lock().await;
    let mut server = server();
    let client = client_with(
        &server,
        ClientOptions::builder()
            .command_timeout(Duration::from_millis(500))
            .build()
            .unwrap(),
    );
    let t = Tally::start();
    let me = [("lock", "m-down")];
    let l = lock(&client, "m-down", LEASE);
    l.lock().await.unwrap().unlock().await.unwrap();
    assert_eq!(t.get("slate_reconnects_total", &[]), 0.0);
    server.kill().unwrap();
    let e = l.try_lock().await.unwrap_err();
    assert!(e.is_backend(), "{e}");
    assert!(
        t.get(
            "slate_server_errors_total",
            &[("backend", "redis-standalone")]
        ) >= 1.0
    );
    assert_eq!(t.get("slate_acquire_errors_total", &me), 1.0);
    assert_eq!(
        t.get("slate_attempts_total", &[me[0], ("outcome", "error")]),
        1.0
    );
    server.restart(Data::Keep).unwrap();
    eventually_async(Duration::from_secs(10), "the lock again", || {
        let l = l.clone();
        async move {
            match l.try_lock().await {
                Ok(Some(g)) => g.unlock().await.is_ok(),
                _ => false,
            }
        }
    })
    .await;
    assert!(t.get("slate_reconnects_total", &[("backend", "redis-standalone")]) >= 1.0);
}

/// A countdown latch (`primitive = latch`): sets by outcome, count-downs, waits by how they
/// ended (the wait-time histogram takes only the waits that saw the latch open), and the
/// waiters gauge while a task waits; none of the locks' metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latch_is_counted_by_outcome() {
    let _turn = recorder().1.lock().await;
    let server = server();
    let client = client(&server);
    let t = Tally::start();
    let latch = slate_redis::CountDownLatch::builder(&client, "m-latch")
        .build()
        .unwrap();
    let at = |name, extra: &[(&str, &str)]| t.of_lock(name, ("m-latch", "latch"), extra);
    assert!(latch.try_set_count(2).await.unwrap());
    assert!(!latch.try_set_count(5).await.unwrap(), "a round is on");
    let early = latch.wait_for(Duration::from_millis(100)).await;
    assert!(early.is_err_and(|e| e.is_timeout()));
    let waiter = {
        let latch = latch.clone();
        tokio::spawn(async move { latch.wait().await })
    };
    eventually(Duration::from_secs(5), "the waiter to be counted", || {
        at("slate_waiters", &[]) == 1.0
    })
    .await;
    assert_eq!(latch.count_down().await.unwrap(), 1);
    assert_eq!(latch.count_down().await.unwrap(), 0);
    within(Duration::from_secs(5), "the waiter", waiter)
        .await
        .unwrap()
        .unwrap();
    let seen = t.of("m-latch");
    assert_eq!(
        at("slate_latch_sets_total", &[("outcome", "set")]),
        1.0,
        "{seen:?}"
    );
    assert_eq!(at("slate_latch_sets_total", &[("outcome", "refused")]), 1.0);
    assert_eq!(at("slate_latch_sets_total", &[]), 2.0);
    assert_eq!(
        at("slate_latch_count_downs_total", &[("outcome", "counted")]),
        2.0
    );
    assert_eq!(at("slate_latch_count_downs_total", &[]), 2.0);
    assert_eq!(at("slate_latch_waits_total", &[("outcome", "opened")]), 1.0);
    assert_eq!(
        at("slate_latch_waits_total", &[("outcome", "timed_out")]),
        1.0
    );
    assert_eq!(at("slate_latch_waits_total", &[]), 2.0);
    assert_eq!(
        at("slate_latch_wait_seconds", &[]),
        1.0,
        "only the opened wait"
    );
    assert_eq!(at("slate_waiters", &[]), 0.0, "both waits left");
    // None of the locks' series is registered for a latch (an exporter would list them).
    let registered: Vec<String> = recorder()
        .0
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, ..)| key.key().clone())
        .filter(|k| {
            k.labels()
                .any(|l| l.key() == "lock" && l.value() == "m-latch")
        })
        .map(|k| k.name().to_owned())
        .filter(|n| !n.starts_with("slate_latch_") && n != "slate_waiters")
        .collect();
    assert_eq!(registered, Vec::<String>::new(), "{seen:?}");
}
