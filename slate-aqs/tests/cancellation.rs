//! Cancellation matrix, in the style of deadpool's `tests/managed_cancellation.rs`: every
//! combination of what the competitor's attempts do (acquire, busy, fail, slow, slow-busy,
//! never answer), where the caller stands (fast path, behind a local holder, second in line,
//! behind a remote holder, in a slow `prepare_wait`) and when its acquire future is dropped.
//! Afterwards nothing may be left over: no owner, no waiter, no remote hold, every grant
//! either returned to a caller (and released) or abandoned, exactly once.
//!
//! The whole matrix runs three times: with plain waiters; with passable waiters over a
//! competitor that allows local passes (lock cohorting), where a release hands the hold to
//! the head and a drop can land at every step of a pass (before the pass, after it and
//! before the receiver ran, while the receiver holds); and with shared waiters (readers)
//! behind exclusive holders, local or remote.
//!
//! Then the same checks under random schedules (readers and writers mixed): paused time
//! (proptest), and real threads.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Manual, new_sync, paused_runtime};
use proptest::prelude::*;
use slate_aqs::testing::{self, Behavior, MemoryRemote, Stats};
use slate_aqs::{Competitor, Notifications};
use slate_core::{HolderId, Result, Wait};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout};

type Sync = common::Sync;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const BEHAVIORS: [Behavior; 6] = [
    Behavior::Remote,
    Behavior::Busy,
    Behavior::Fail,
    Behavior::Slow(Duration::from_millis(7)),
    Behavior::SlowBusy(Duration::from_millis(7)),
    Behavior::Never,
];

#[derive(Clone, Copy, Debug)]
enum Scenario {
    /// The lock is free: the victim takes the fast path.
    Free,
    /// A local holder has it and releases at 5 ms.
    LocallyHeld,
    /// A local holder has it, another waiter queued first; release at 5 ms.
    SecondInLine,
    /// Another process holds it and releases (with a notification) at 5 ms.
    RemoteHeld,
    /// As `RemoteHeld`, and `prepare_wait` takes 10 ms.
    SlowPrepare,
}

#[derive(Clone, Copy, Debug)]
enum Abort {
    /// Polled once, then dropped.
    FirstPoll,
    /// Dropped by a timeout after this long.
    After(Duration),
    /// Polled once, then dropped without another poll right after the lock is released at
    /// 5 ms (a waiter woken, or passed the hold, that never ran again).
    AfterRelease,
}

const ABORTS: [Abort; 7] = [
    Abort::FirstPoll,
    Abort::AfterRelease,
    Abort::After(Duration::from_millis(1)),
    Abort::After(Duration::from_millis(5)),
    Abort::After(Duration::from_millis(8)),
    Abort::After(Duration::from_millis(20)),
    Abort::After(Duration::from_millis(60)),
];

/// How a party ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Granted,
    Failed,
    Cancelled,
}

/// Shared by the parties of one run.
#[derive(Default)]
struct Tally {
    /// An exclusive holder is inside.
    inside: AtomicBool,
    /// Shared holders inside.
    readers: AtomicU64,
    granted: AtomicU64,
}

/// A hold, released on drop like a backend's guard (a task aborted while holding must not
/// leak the lock).
struct Held {
    sync: Arc<Sync>,
    me: HolderId,
    tally: Arc<Tally>,
    shared: bool,
}

impl Held {
    fn new(sync: &Arc<Sync>, me: HolderId, tally: &Arc<Tally>, shared: bool) -> Self {
        if shared {
            tally.readers.fetch_add(1, Ordering::SeqCst);
            assert!(
                !tally.inside.load(Ordering::SeqCst),
                "a reader beside a writer"
            );
        } else {
            assert!(
                !tally.inside.swap(true, Ordering::SeqCst),
                "two holders at once"
            );
            assert_eq!(
                tally.readers.load(Ordering::SeqCst),
                0,
                "a writer beside readers"
            );
        }
        tally.granted.fetch_add(1, Ordering::SeqCst);
        Held {
            sync: Arc::clone(sync),
            me,
            tally: Arc::clone(tally),
            shared,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.shared {
            self.tally.readers.fetch_sub(1, Ordering::SeqCst);
            testing::release_shared(&self.sync, self.me).unwrap();
        } else {
            self.tally.inside.store(false, Ordering::SeqCst);
            testing::release(&self.sync, self.me).unwrap();
        }
    }
}

/// A party that acquires (`shared` or not), holds `hold`, releases; its acquire is dropped
/// after `abort`, if given.
fn party(
    sync: &Arc<Sync>,
    abort: Option<Duration>,
    hold: Duration,
    tally: &Arc<Tally>,
    shared: bool,
) -> JoinHandle<Outcome> {
    let (sync, tally) = (Arc::clone(sync), Arc::clone(tally));
    tokio::spawn(async move {
        let me = HolderId::new();
        let acquire = acquire(&sync, me, shared);
        let acquired = match abort {
            Some(d) => timeout(d, acquire).await.ok(),
            None => Some(acquire.await),
        };
        match acquired {
            Some(Ok(grant)) => {
                // Passable callers hold under a remote holder minted for the hold; the
                // others under their own id.
                assert!(cohort(&sync) || grant.holder == me);
                assert_eq!(sync.remote_holder(me), grant.holder);
                let _held = Held::new(&sync, me, &tally, shared);
                sleep(hold).await;
                Outcome::Granted
            }
            Some(Err(_)) => Outcome::Failed,
            None => Outcome::Cancelled,
        }
    })
}

/// `acquire_shared` when `shared`, else `acquire_passable` when the competitor allows
/// passes, else `acquire`.
async fn acquire(sync: &Sync, me: HolderId, shared: bool) -> Result<testing::MemoryGrant> {
    if shared {
        sync.acquire_shared(me, Wait::Forever).await
    } else if cohort(sync) {
        sync.acquire_passable(me, Wait::Forever).await
    } else {
        sync.acquire(me, Wait::Forever).await
    }
}

/// Whether this run's competitor allows local passes.
fn cohort(sync: &Sync) -> bool {
    sync.competitor().pass_budget(&testing::MemoryGrant {
        holder: HolderId::new(),
        count: 1,
        passed: false,
        shared: false,
    }) > 0
}

/// The checks after every run: nothing leaked, every grant accounted for exactly once.
fn check_clean(
    sync: &Sync,
    remote: &MemoryRemote,
    granted: u64,
) -> std::result::Result<(), String> {
    let s = sync.competitor().stats();
    let problems = [
        (
            sync.waiters() != 0,
            format!("{} waiters left", sync.waiters()),
        ),
        (
            sync.owner().is_some(),
            format!("owner left: {:?}", sync.owner()),
        ),
        (
            remote.holder().is_some(),
            format!("remote hold leaked: {:?}", remote.holder()),
        ),
        (
            !sync.shared_holders().is_empty(),
            format!("shared holders left: {:?}", sync.shared_holders()),
        ),
        (
            !remote.shared_holders().is_empty(),
            format!("remote shared holds leaked: {:?}", remote.shared_holders()),
        ),
        (
            s.acquired + s.passes_taken != s.after_acquire + s.abandoned,
            format!(
                "grants {} + passes taken {} != after_acquire {} + abandoned {}",
                s.acquired, s.passes_taken, s.after_acquire, s.abandoned
            ),
        ),
        (
            s.after_acquire != granted,
            format!(
                "after_acquire {} != grants returned {granted}",
                s.after_acquire
            ),
        ),
        (
            // Every remote hold that reached a caller ends once: released, or a pass dropped.
            s.after_release + s.after_release_shared + s.passes_dropped != s.acquired - s.abandoned,
            format!(
                "after_release {} + after_release_shared {} + passes dropped {} != remote holds that reached a caller {}",
                s.after_release,
                s.after_release_shared,
                s.passes_dropped,
                s.acquired - s.abandoned
            ),
        ),
        (
            s.live_attempts != 0,
            format!("{} attempt futures still alive", s.live_attempts),
        ),
    ];
    for (bad, what) in problems {
        if bad {
            return Err(what);
        }
    }
    sync.check_invariants()
}

fn run_case(
    scenario: Scenario,
    behavior: Behavior,
    abort: Abort,
    cohort: bool,
    shared: bool,
) -> std::result::Result<Stats, String> {
    let rt = paused_runtime();
    let (remote, sync, granted) = rt.block_on(async {
        let (remote, sync) = new_sync(ms(4));
        if cohort {
            sync.competitor().set_pass_budget(2);
        }
        testing::subscribe(&sync);
        let tally = Arc::new(Tally::default());
        let outsider = HolderId::new();
        let local = HolderId::new();
        let mut others = Vec::new();
        match scenario {
            Scenario::Free => {}
            Scenario::LocallyHeld | Scenario::SecondInLine => {
                // With passes, the local holder wins its hold from the queue (behind a first
                // holder), as a hold that may be passed on; alone it would acquire as itself.
                let first = HolderId::new();
                if cohort {
                    sync.acquire(first, Wait::Forever).await.unwrap();
                }
                let queued = {
                    let sync = Arc::clone(&sync);
                    tokio::spawn(async move { acquire(&sync, local, false).await })
                };
                if cohort {
                    // A companion queued behind it makes its hold worth passing; it leaves
                    // once the local holder has the hold.
                    tokio::task::yield_now().await;
                    let companion = {
                        let sync = Arc::clone(&sync);
                        tokio::spawn(async move { acquire(&sync, HolderId::new(), false).await })
                    };
                    tokio::task::yield_now().await;
                    testing::release(&sync, first).unwrap();
                    queued.await.unwrap().unwrap();
                    companion.abort();
                    assert!(companion.await.unwrap_err().is_cancelled());
                } else {
                    queued.await.unwrap().unwrap();
                }
            }
            Scenario::RemoteHeld | Scenario::SlowPrepare => {
                remote.try_acquire(outsider);
                sync.competitor().set_notifications(Notifications::Live);
                if let Scenario::SlowPrepare = scenario {
                    sync.competitor().set_prepare_delay(Some(ms(10)));
                }
            }
        }
        sync.competitor().set_default(behavior);
        if let Scenario::SecondInLine = scenario {
            others.push(party(&sync, Some(ms(40)), ms(2), &tally, shared));
            tokio::task::yield_now().await;
        }
        // The victim.
        let mut parked = None;
        let victim = match abort {
            Abort::AfterRelease => {
                let me = HolderId::new();
                let mut fut = Box::pin(Manual::new(acquire(&sync, me, shared)));
                if let std::task::Poll::Ready(Ok(_)) = fut.poll() {
                    drop(Held::new(&sync, me, &tally, shared));
                } else {
                    parked = Some(fut);
                }
                None
            }
            Abort::FirstPoll => {
                let me = HolderId::new();
                let mut fut = Manual::new(acquire(&sync, me, shared));
                let got = fut.poll();
                drop(fut);
                if let std::task::Poll::Ready(Ok(_)) = got {
                    drop(Held::new(&sync, me, &tally, shared));
                }
                None
            }
            Abort::After(d) => Some(party(&sync, Some(d), ms(2), &tally, shared)),
        };
        sleep(ms(5)).await;
        match scenario {
            Scenario::LocallyHeld | Scenario::SecondInLine => {
                testing::release(&sync, local).unwrap();
            }
            Scenario::RemoteHeld | Scenario::SlowPrepare => {
                remote.release(outsider).unwrap();
            }
            Scenario::Free => {}
        }
        drop(parked);
        for task in victim.into_iter().chain(others) {
            task.await.unwrap();
        }
        let mut granted = tally.granted.load(Ordering::SeqCst);
        if matches!(scenario, Scenario::LocallyHeld | Scenario::SecondInLine) {
            granted += 1; // the local holder's own grant
            if cohort {
                granted += 1; // and the first holder's before it
            }
        }
        // Let abandoned attempts finish in the background.
        sleep(ms(100)).await;
        (remote, sync, granted)
    });
    // Dropping the runtime drops the background tasks still driving never-answering attempts.
    drop(rt);
    check_clean(&sync, &remote, granted)?;
    Ok(sync.competitor().stats())
}

#[test]
fn cancellation_matrix() {
    let scenarios = [
        Scenario::Free,
        Scenario::LocallyHeld,
        Scenario::SecondInLine,
        Scenario::RemoteHeld,
        Scenario::SlowPrepare,
    ];
    let mut failures = Vec::new();
    let mut cases = 0;
    let mut total = Stats::default();
    let modes = [(false, false), (true, false), (false, true)];
    for (scenario, (cohort, shared)) in scenarios.into_iter().flat_map(|s| modes.map(|m| (s, m))) {
        for behavior in BEHAVIORS {
            for abort in ABORTS {
                cases += 1;
                let case = move || run_case(scenario, behavior, abort, cohort, shared);
                match common::with_watchdog(Duration::from_secs(20), case) {
                    Ok(s) => {
                        total.passes_taken += s.passes_taken;
                        total.passes_dropped += s.passes_dropped;
                        total.abandoned += s.abandoned;
                        total.failed += s.failed;
                        total.busy += s.busy;
                        total.prepare_wait += s.prepare_wait;
                        total.after_acquire += s.after_acquire;
                        total.after_release_shared += s.after_release_shared;
                        total.queue_drained += s.queue_drained;
                    }
                    Err(e) => {
                        failures.push(format!(
                            "{scenario:?} / cohort {cohort} / shared {shared} / {behavior:?} / {abort:?}: {e}"
                        ));
                    }
                }
            }
        }
    }
    assert_eq!(cases, 630);
    // The matrix really goes through the paths it is about.
    for (what, n) in [
        ("grants abandoned after a drop", total.abandoned),
        ("failed attempts", total.failed),
        ("busy answers", total.busy),
        ("prepare_wait calls", total.prepare_wait),
        ("grants returned", total.after_acquire),
        ("shared holds released", total.after_release_shared),
        ("queues drained", total.queue_drained),
        ("holds taken by a pass", total.passes_taken),
        (
            "passed holds dropped by a cancelled receiver",
            total.passes_dropped,
        ),
    ] {
        assert!(n > 0, "no {what} in the whole matrix");
    }
    assert!(
        failures.is_empty(),
        "{} of {cases} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_checker_catches_a_leak() {
    // `check_clean` must be able to fail: a grant nobody released.
    let rt = paused_runtime();
    let (remote, sync) = rt.block_on(async {
        let (remote, sync) = new_sync(ms(4));
        sync.acquire(HolderId::new(), Wait::Forever).await.unwrap();
        (remote, sync)
    });
    assert!(check_clean(&sync, &remote, 1).is_err());
}

#[test]
fn a_grant_obtained_after_the_drop_is_abandoned_exactly_once() {
    let rt = paused_runtime();
    rt.block_on(async {
        let (remote, sync) = new_sync(ms(4));
        sync.competitor().script([Behavior::Slow(ms(10))]);
        assert!(
            timeout(ms(3), sync.acquire(HolderId::new(), Wait::Forever))
                .await
                .is_err()
        );
        assert_eq!(sync.waiters(), 0);
        sleep(ms(20)).await;
        let s = sync.competitor().stats();
        assert_eq!((s.acquired, s.abandoned, s.after_acquire), (1, 1, 0));
        assert_eq!(remote.holder(), None);
    });
}

/// A gate the test opens by hand; attempts wait on it without any runtime.
#[derive(Default)]
struct Gate {
    state: Mutex<(bool, Option<std::task::Waker>)>,
}

impl Gate {
    fn open(&self) {
        let waker = {
            let mut st = self.state.lock().unwrap();
            st.0 = true;
            st.1.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

struct GateWait(Arc<Gate>);

impl Future for GateWait {
    type Output = ();

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        let mut st = self.0.state.lock().unwrap();
        if st.0 {
            std::task::Poll::Ready(())
        } else {
            st.1 = Some(cx.waker().clone());
            std::task::Poll::Pending
        }
    }
}

/// Attempts acquire once the gate is open.
#[derive(Default)]
struct Gated {
    gate: Arc<Gate>,
    abandoned: std::sync::atomic::AtomicU64,
}

impl slate_aqs::Competitor for Gated {
    type Grant = HolderId;

    fn attempt(
        &self,
        holder: HolderId,
    ) -> impl Future<Output = Result<slate_aqs::Attempt<HolderId>>> + Send + 'static {
        let gate = GateWait(Arc::clone(&self.gate));
        async move {
            gate.await;
            Ok(slate_aqs::Attempt::Acquired(holder))
        }
    }

    fn abandon(&self, _holder: HolderId, _grant: HolderId) {
        self.abandoned.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn an_attempt_abandoned_outside_any_runtime_finishes_on_a_thread() {
    // Built and dropped outside any runtime, and no runtime captured: the background work
    // gets a thread of its own.
    let sync = Arc::new(slate_aqs::Synchronizer::new(
        "gated",
        Gated::default(),
        ms(4),
    ));
    let mut fut = Manual::new(sync.acquire(HolderId::new(), Wait::Forever));
    assert!(fut.poll().is_pending(), "the attempt waits at the gate");
    drop(fut);
    assert_eq!(sync.waiters(), 0);
    sync.competitor().gate.open();
    common::with_watchdog(Duration::from_secs(10), move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while sync.competitor().abandoned.load(Ordering::SeqCst) != 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "the abandoned grant was lost"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(sync.owner(), None);
    });
}

// ---- random schedules on paused time ----

#[derive(Clone, Debug)]
struct Party {
    start: u64,
    abort: Option<u64>,
    hold: u64,
    shared: bool,
}

fn party_strategy() -> impl Strategy<Value = Party> {
    (
        0u64..30,
        prop::option::weighted(0.6, 0u64..40),
        0u64..6,
        any::<bool>(),
    )
        .prop_map(|(start, abort, hold, shared)| Party {
            start,
            abort,
            hold,
            shared,
        })
}

fn behavior_strategy() -> impl Strategy<Value = Behavior> {
    prop_oneof![
        4 => Just(Behavior::Remote),
        1 => Just(Behavior::Busy),
        1 => Just(Behavior::Fail),
        1 => (1u64..10).prop_map(|d| Behavior::Slow(ms(d))),
        1 => (1u64..10).prop_map(|d| Behavior::SlowBusy(ms(d))),
        1 => Just(Behavior::Never),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        // `PROPTEST_CASES=N` runs a longer search.
        cases: common::proptest_cases(96),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_schedules_leave_nothing_behind(
        parties in prop::collection::vec(party_strategy(), 1..10),
        script in prop::collection::vec(behavior_strategy(), 0..20),
        outsider_until in prop::option::of(0u64..30),
        notifications in any::<bool>(),
    ) {
        let what = format!("{parties:?} {script:?} {outsider_until:?} {notifications}");
        let outcome = common::with_watchdog_or_exit(Duration::from_secs(20), what, move || {
        let rt = paused_runtime();
        let never = script.contains(&Behavior::Never);
        let (remote, sync, granted, unfinished) = rt.block_on(async {
            let (remote, sync) = new_sync(ms(3));
            testing::subscribe(&sync);
            if notifications {
                sync.competitor().set_notifications(Notifications::Live);
            }
            sync.competitor().script(script.iter().copied());
            let outsider = HolderId::new();
            if outsider_until.is_some() {
                remote.try_acquire(outsider);
            }
            let tally = Arc::new(Tally::default());
            let results = Arc::new(Mutex::new(Vec::new()));
            let mut tasks = Vec::new();
            for p in &parties {
                let (sync, tally, results) = (sync.clone(), tally.clone(), results.clone());
                let p = p.clone();
                tasks.push(tokio::spawn(async move {
                    sleep(ms(p.start)).await;
                    let got = party(&sync, p.abort.map(ms), ms(p.hold), &tally, p.shared).await.unwrap();
                    results.lock().unwrap().push((p.abort.is_none(), got));
                }));
            }
            if let Some(t) = outsider_until {
                sleep(ms(t)).await;
                remote.release(outsider).unwrap();
            }
            // Bounded: a head whose attempt never answers blocks the queue by design (the
            // attempt is not interrupted), so tasks may legitimately still wait here.
            sleep(Duration::from_secs(2)).await;
            let unfinished = tasks.iter().filter(|t| !t.is_finished()).count();
            for t in &tasks {
                t.abort();
            }
            for t in tasks {
                let _ = t.await;
            }
            sleep(ms(50)).await;
            let results = results.lock().unwrap().clone();
            let granted = tally.granted.load(Ordering::SeqCst);
            // Liveness: without never-answering attempts, every waiter without an abort ended
            // (granted, or failed by an injected failure).
            if !never {
                assert_eq!(unfinished, 0, "a waiter was stuck: {results:?}");
                let stuck = results
                    .iter()
                    .filter(|(patient, got)| *patient && *got == Outcome::Cancelled)
                    .count();
                assert_eq!(stuck, 0);
            }
            (remote, sync, granted, unfinished)
        });
        drop(rt);
        let _ = unfinished;
        check_clean(&sync, &remote, granted)
        });
        prop_assert_eq!(outcome, Ok(()));
    }
}

// ---- real threads ----

#[test]
fn aborts_at_random_points_on_a_multi_threaded_runtime() {
    common::with_watchdog(Duration::from_secs(60), || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        let (remote, sync, granted) = rt.block_on(async {
            let (remote, sync) = new_sync(ms(1));
            testing::subscribe(&sync);
            sync.competitor().set_notifications(Notifications::Live);
            let tally = Arc::new(Tally::default());
            // A small deterministic generator: the schedule differs per run only through the
            // threads' interleaving.
            let mut seed = 0x2545_f491_4f6c_dd1du64;
            let mut next = move |n: u64| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed % n
            };
            for _round in 0..40 {
                let behaviors: Vec<_> = (0..6)
                    .map(|_| match next(8) {
                        0 => Behavior::Fail,
                        1 => Behavior::Slow(Duration::from_micros(next(500) + 1)),
                        2 => Behavior::SlowBusy(Duration::from_micros(next(500) + 1)),
                        3 => Behavior::Busy,
                        _ => Behavior::Remote,
                    })
                    .collect();
                sync.competitor().script(behaviors);
                let tasks: Vec<_> = (0..6)
                    .map(|_| {
                        let abort = match next(3) {
                            0 => None,
                            _ => Some(Duration::from_micros(next(2000))),
                        };
                        let shared = next(2) == 0;
                        party(
                            &sync,
                            abort,
                            Duration::from_micros(next(300)),
                            &tally,
                            shared,
                        )
                    })
                    .collect();
                // Also abort some tasks from outside, at random points.
                let victim = next(6) as usize;
                tokio::time::sleep(Duration::from_micros(next(1000))).await;
                tasks[victim].abort();
                for t in tasks {
                    let _ = t.await;
                }
            }
            tokio::time::sleep(ms(20)).await;
            (remote, sync, tally.granted.load(Ordering::SeqCst))
        });
        drop(rt);
        assert_eq!(check_clean(&sync, &remote, granted), Ok(()));
    });
}
