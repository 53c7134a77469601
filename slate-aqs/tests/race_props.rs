//! Property tests for the paths the state-machine models (`model.rs`, `shared_model.rs`,
//! `loom.rs`) did not reach, each a family of races drawn at random (issue 28, "Also"):
//!
//! - **two attempts in flight with a lapsing lease**: an immediate attempt whose grant is
//!   decided at once and answered late, a lease that runs out at the remote meanwhile, and a
//!   second holder's attempt (immediate, timed or waiting), itself answered late. Whenever a
//!   holder is told it holds the lock, the remote must hold it for that holder or for nobody
//!   (a lapsed grant, whose loss the backend signals): never for another holder (item 14's
//!   second half: "the last grant processed wins" displaced a live hold);
//! - **waiters behind a head after a busy entry attempt**: several waiters enter at once, all
//!   find the queue empty and attempt, all are answered busy (after random delays) and queue
//!   in that order, so every waiter behind the head carries its own busy answer; the remote
//!   holder then releases, announced or silently, and timed waiters leave. Once the lock is
//!   free, it is granted within a notification's reach when the release was announced, and
//!   when it was silent, within moments of the first head that leaves (a new head attempts at
//!   once: item 13 had it wait out the 10 s spin wait);
//! - **timed waiters across runtimes**: waiters parked from current-thread runtimes that are
//!   then left undriven or dropped (their timer tasks, sometimes spawned and never polled, go
//!   with them), while waiters on a driven runtime must time out at their deadlines; at the
//!   end no timer task is left (items 9 and 10).
//!
//! The first two run on tokio's paused clock (deterministic: the schedule is the drawn one);
//! the third needs several runtimes and so real time, with deadlines of tens of milliseconds
//! and a generous bound (a lost deadline is a hang, not a late wake-up).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::future::Future;

use common::{park_once, paused_runtime};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use slate_aqs::testing::{self, Behavior, MemoryCompetitor, MemoryRemote};
use slate_aqs::{Competitor, Synchronizer};
use slate_core::{HolderId, Wait};

/// How the second holder waits.
#[derive(Clone, Copy, Debug)]
enum LiveWait {
    Immediate,
    For(u64),
    Forever,
}

impl LiveWait {
    fn wait(self) -> Wait {
        match self {
            LiveWait::Immediate => Wait::Immediate,
            // On the paused clock (`Wait::for_duration` counts from the system clock).
            LiveWait::For(ms) => {
                Wait::Until((tokio::time::Instant::now() + Duration::from_millis(ms)).into_std())
            }
            LiveWait::Forever => Wait::Forever,
        }
    }
}

#[derive(Clone, Debug)]
struct TwoAttempts {
    lease: u64,
    late_answer: u64,
    live_at: u64,
    live_answer: u64,
    live_wait: LiveWait,
    hold: u64,
}

fn two_attempts_strategy() -> impl Strategy<Value = TwoAttempts> {
    (
        20u64..200,
        0u64..400,
        0u64..400,
        0u64..200,
        prop_oneof![
            Just(LiveWait::Immediate),
            (1u64..500).prop_map(LiveWait::For),
            Just(LiveWait::Forever),
        ],
        1u64..100,
    )
        .prop_map(
            |(lease, late_answer, live_at, live_answer, live_wait, hold)| TwoAttempts {
                lease,
                late_answer,
                live_at,
                live_answer,
                live_wait,
                hold,
            },
        )
}

/// One case of "two attempts in flight with a lapsing lease"; `Err` names the violation.
fn two_attempts(case: &TwoAttempts) -> Result<(), String> {
    let rt = paused_runtime();
    rt.block_on(async {
        let remote = MemoryRemote::new();
        let competitor = MemoryCompetitor::new(remote.clone());
        let lease = Duration::from_millis(case.lease);
        competitor.set_lease(Some(lease));
        // LATE's attempt looks at the remote at once and answers late; LIVE's first attempt
        // too (later ones answer at once).
        competitor.script([
            Behavior::LateAnswer(Duration::from_millis(case.late_answer)),
            Behavior::LateAnswer(Duration::from_millis(case.live_answer)),
        ]);
        let sync = Arc::new(Synchronizer::new(
            "two-attempts",
            competitor,
            Duration::from_millis(5),
        ));
        let violations = Arc::new(Mutex::new(Vec::<String>::new()));
        let (late, live) = (HolderId::new(), HolderId::new());
        let t0 = tokio::time::Instant::now();
        // Told it holds: the remote holds it for this holder, or for nobody (lapsed).
        let name = move |h: HolderId| match h {
            h if h == late => "LATE".to_owned(),
            h if h == live => "LIVE".to_owned(),
            h => h.to_string(),
        };
        let hold = Duration::from_millis(case.hold);
        // A holder told it holds: its grant is live at the remote, or its lease has already
        // run out (recorded because it displaced nobody; its guard reports the loss). And
        // while its lease runs, it stays the local owner until it releases: a live hold is
        // never displaced.
        let task = |who: &'static str, holder: HolderId, wait: Wait, start: Duration| {
            let sync = sync.clone();
            let remote = remote.clone();
            let violations = violations.clone();
            tokio::spawn(async move {
                tokio::time::sleep(start).await;
                let Ok(grant) = sync.acquire(holder, wait).await else {
                    return;
                };
                let live_until = sync.competitor().grant_deadline(&grant);
                let live = || live_until.is_none_or(|d| tokio::time::Instant::now().into_std() < d);
                let report = |what: String| {
                    violations.lock().unwrap().push(format!(
                        "{who} {what} (at {:?})",
                        tokio::time::Instant::now() - t0
                    ));
                };
                if let Some((h, _)) = remote.holder()
                    && h != holder
                    && live()
                {
                    report(format!("was granted while the remote holds {}", name(h)));
                }
                let release_at = tokio::time::Instant::now() + hold;
                while tokio::time::Instant::now() < release_at {
                    if live() && sync.owner().is_none_or(|(o, _)| o != holder) {
                        report(format!(
                            "was displaced while its lease ran, by {:?}",
                            sync.owner().map(|(o, d)| (name(o), d))
                        ));
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                // A hold whose remote entry lapsed answers not held: fine.
                let _ = testing::release(&sync, holder);
            })
        };
        let t_late = task("LATE", late, Wait::Immediate, Duration::ZERO);
        // The remote forgets LATE's entry when its lease runs out (nobody renews here).
        let lapse = tokio::spawn({
            let remote = remote.clone();
            async move {
                tokio::time::sleep(lease).await;
                if remote.holder().is_some_and(|(h, _)| h == late) {
                    while remote.release_silently(late).is_ok_and(|n| n > 0) {}
                }
            }
        });
        let t_live = task(
            "LIVE",
            live,
            case.live_wait.wait(),
            Duration::from_millis(case.live_at),
        );
        for t in [t_late, t_live, lapse] {
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .map_err(|_| "a task did not finish within 30 s".to_owned())?
                .map_err(|e| format!("a task panicked: {e}"))?;
        }
        sync.check_invariants()?;
        if let Some(v) = violations.lock().unwrap().first() {
            return Err(v.clone());
        }
        if sync.owner().is_some() {
            return Err(format!("still owned: {:?}", sync.owner()));
        }
        Ok(())
    })
}

#[derive(Clone, Debug)]
struct Entrant {
    /// When it enters (ms), all within the first 10 ms.
    start: u64,
    /// How long its entry attempt takes to answer busy (ms, at least 10: everyone has entered
    /// by then, so every entrant finds the queue empty and attempts).
    answer: u64,
    /// Its deadline from its start (ms), or none.
    deadline: Option<u64>,
}

#[derive(Clone, Debug)]
struct Entrants {
    entrants: Vec<Entrant>,
    /// When the remote holder releases (ms, after every entry attempt was answered).
    release_at: u64,
    /// Whether the release is announced.
    notify: bool,
}

fn entrants_strategy() -> impl Strategy<Value = Entrants> {
    (
        prop::collection::vec(
            (0u64..10, 10u64..50, prop::option::weighted(0.6, 60u64..400)).prop_map(
                |(start, answer, deadline)| Entrant {
                    start,
                    answer,
                    deadline,
                },
            ),
            2..6,
        ),
        60u64..300,
        any::<bool>(),
    )
        .prop_map(|(entrants, release_at, notify)| Entrants {
            entrants,
            release_at,
            notify,
        })
        // Busy answers at distinct instants: the queue's order is then the order of the
        // answers (a tie is ordered by the timer, which the bound below cannot know).
        .prop_filter("busy answers at distinct instants", |c| {
            let mut at: Vec<u64> = c.entrants.iter().map(|e| e.start + e.answer).collect();
            at.sort_unstable();
            at.windows(2).all(|w| w[0] != w[1])
        })
}

/// The spin wait of the entrants' synchronizer: long, so that a head that waits it out is
/// told from one that attempts.
const LONG_SPIN: Duration = Duration::from_secs(10);

/// One case of "waiters behind a head after a busy entry attempt".
fn entrants(case: &Entrants) -> Result<(), String> {
    let rt = paused_runtime();
    rt.block_on(async {
        let remote = MemoryRemote::new();
        let competitor = MemoryCompetitor::new(remote.clone());
        let outsider = HolderId::new();
        remote.try_acquire(outsider).unwrap();
        let mut order: Vec<usize> = (0..case.entrants.len()).collect();
        order.sort_by_key(|&i| (case.entrants[i].start, i));
        // The entry attempts, in the order they are made: each answers busy after its delay
        // (decided then: the remote is still held, `release_at` comes later).
        competitor.script(
            order
                .iter()
                .map(|&i| Behavior::SlowBusy(Duration::from_millis(case.entrants[i].answer))),
        );
        let sync = Arc::new(Synchronizer::new("entrants", competitor, LONG_SPIN));
        testing::subscribe(&sync);
        let t0 = tokio::time::Instant::now();
        let granted_at = Arc::new(Mutex::new(Vec::<Duration>::new()));
        let mut tasks = Vec::new();
        for &i in &order {
            let e = case.entrants[i].clone();
            let sync = sync.clone();
            let granted_at = granted_at.clone();
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep_until(t0 + Duration::from_millis(e.start)).await;
                // On the paused clock (`Wait::for_duration` counts from the system clock).
                let wait = e.deadline.map_or(Wait::Forever, |ms| {
                    Wait::Until((t0 + Duration::from_millis(e.start + ms)).into_std())
                });
                let holder = HolderId::new();
                if sync.acquire(holder, wait).await.is_ok() {
                    granted_at.lock().unwrap().push(t0.elapsed());
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    testing::release(&sync, holder).unwrap();
                }
            }));
        }
        tokio::time::sleep_until(t0 + Duration::from_millis(case.release_at)).await;
        if case.notify {
            remote.release(outsider).unwrap();
        } else {
            remote.release_silently(outsider).unwrap();
        }
        for t in tasks {
            tokio::time::timeout(LONG_SPIN * 3, t)
                .await
                .map_err(|_| "an entrant did not finish within three spin waits".to_owned())?
                .map_err(|e| format!("an entrant panicked: {e}"))?;
        }
        sync.check_invariants()?;
        // The queue's order is the order the busy answers came in.
        let release_at = Duration::from_millis(case.release_at);
        let Some(first) = granted_at.lock().unwrap().first().copied() else {
            // Everyone left on a deadline before the lock was granted: only possible if every
            // entrant had a deadline.
            return if case.entrants.iter().all(|e| e.deadline.is_some()) {
                Ok(())
            } else {
                Err("a waiter without a deadline was never granted".to_owned())
            };
        };
        let slack = Duration::from_millis(50);
        let bound = if case.notify {
            release_at + slack
        } else {
            // The head at the release waits out its spin wait, unless it leaves first (on its
            // deadline): the waiter after it, which carries the busy answer of its own entry
            // attempt, must then attempt at once.
            let mut queued: Vec<&Entrant> = case
                .entrants
                .iter()
                .filter(|e| e.deadline.is_none_or(|d| d > e.answer))
                .collect();
            queued.sort_by_key(|e| e.start + e.answer);
            let head = queued.iter().find(|e| {
                e.deadline
                    .is_none_or(|d| Duration::from_millis(e.start + d) > release_at)
            });
            let head_leaves =
                head.and_then(|h| h.deadline.map(|d| Duration::from_millis(h.start + d)));
            match head_leaves {
                Some(t) => t.min(release_at + LONG_SPIN) + slack,
                None => release_at + LONG_SPIN + slack,
            }
        };
        if first > bound {
            return Err(format!(
                "first grant at {first:?}, expected by {bound:?} (release at {release_at:?}, \
                 announced: {})",
                case.notify
            ));
        }
        Ok(())
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: common::proptest_cases(256),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn two_attempts_in_flight_with_a_lapsing_lease(case in two_attempts_strategy()) {
        let what = format!("{case:?}");
        let outcome = common::with_watchdog_or_exit(Duration::from_secs(20), what, move || two_attempts(&case));
        prop_assert_eq!(outcome, Ok(()));
    }

    #[test]
    fn waiters_behind_a_head_after_a_busy_entry_attempt(case in entrants_strategy()) {
        let what = format!("{case:?}");
        let outcome = common::with_watchdog_or_exit(Duration::from_secs(20), what, move || entrants(&case));
        prop_assert_eq!(outcome, Ok(()));
    }
}

/// One step of the runtimes case.
#[derive(Clone, Debug)]
enum RtOp {
    /// A waiter with this deadline (ms) parks from side runtime `rt` (created if needed),
    /// which is then left undriven.
    Park { rt: usize, ms: u64 },
    /// Side runtime `rt` is dropped (its timer task, spawned and maybe never polled, with
    /// it); the waiters parked from it stay alive until the end.
    Drop { rt: usize },
    /// A waiter with this deadline (ms) waits on the driven runtime: it must time out then.
    Driven { ms: u64 },
}

fn rt_ops_strategy() -> impl Strategy<Value = Vec<RtOp>> {
    prop::collection::vec(
        prop_oneof![
            3 => (0usize..2, 50u64..2_000).prop_map(|(rt, ms)| RtOp::Park { rt, ms }),
            2 => (0usize..2).prop_map(|rt| RtOp::Drop { rt }),
            3 => (20u64..200).prop_map(|ms| RtOp::Driven { ms }),
        ],
        1..8,
    )
}

/// How late a driven waiter may time out (real time, a loaded machine): a deadline left to a
/// task that never runs is a hang, far beyond this.
const LATE: Duration = Duration::from_secs(2);

/// One case of "timed waiters across runtimes".
fn runtimes(ops: &[RtOp]) -> Result<(), String> {
    type Waiting =
        std::pin::Pin<Box<dyn Future<Output = slate_core::Result<testing::MemoryGrant>> + Send>>;
    let sync = Arc::new(Synchronizer::new(
        "runtimes",
        MemoryCompetitor::new(MemoryRemote::new()),
        Duration::from_millis(50),
    ));
    let driven = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let owner = HolderId::new();
    driven.block_on(sync.acquire(owner, Wait::Forever)).unwrap();
    let mut side: Vec<Option<tokio::runtime::Runtime>> = vec![None, None];
    let mut parked: Vec<Waiting> = Vec::new();
    let mut timed = Vec::new();
    for op in ops {
        match *op {
            RtOp::Park { rt, ms } => {
                let rt = side[rt].get_or_insert_with(|| {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap()
                });
                let sync = sync.clone();
                let mut fut: Waiting = Box::pin(async move {
                    sync.acquire(
                        HolderId::new(),
                        Wait::for_duration(Duration::from_millis(ms)),
                    )
                    .await
                });
                park_once(rt, fut.as_mut());
                parked.push(fut);
            }
            RtOp::Drop { rt } => drop(side[rt].take()),
            RtOp::Driven { ms } => {
                let sync = sync.clone();
                let d = Duration::from_millis(ms);
                let started = std::time::Instant::now();
                let task = driven.spawn(async move {
                    sync.acquire(HolderId::new(), Wait::for_duration(d)).await
                });
                timed.push((task, started, d));
            }
        }
    }
    for (task, started, d) in timed {
        let out = driven
            .block_on(async { tokio::time::timeout(d + LATE, task).await })
            .map_err(|_| {
                format!(
                    "a {d:?} wait on the driven runtime had not timed out after {:?}",
                    started.elapsed()
                )
            })?
            .map_err(|e| format!("a waiter panicked: {e}"))?;
        match out {
            Err(e) if e.is_timeout() => {}
            other => return Err(format!("a {d:?} wait ended with {other:?}")),
        }
        if started.elapsed() < d {
            return Err(format!(
                "a {d:?} wait timed out early, after {:?}",
                started.elapsed()
            ));
        }
    }
    // The side waiters go, then their runtimes: no timer task may be left.
    drop(parked);
    drop(side);
    testing::release(&sync, owner).map_err(|e| e.to_string())?;
    let started = std::time::Instant::now();
    while sync.deadline_timer_running() {
        if started.elapsed() > LATE {
            return Err("a timer task is still registered with no timed waiter left".to_owned());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    sync.check_invariants()
}

proptest! {
    #![proptest_config(ProptestConfig {
        // Real time: each case waits out its driven deadlines (at most 200 ms each).
        cases: common::proptest_cases(32),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn timed_waiters_across_runtimes(ops in rt_ops_strategy()) {
        let what = format!("{ops:?}");
        let outcome = common::with_watchdog_or_exit(Duration::from_secs(60), what, move || runtimes(&ops));
        prop_assert_eq!(outcome, Ok(()));
    }
}
