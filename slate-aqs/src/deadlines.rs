//! The shared deadline timer: one tokio task per synchronizer and runtime (while timed waiters
//! are queued) wakes the waiters whose deadline passed, so a queued waiter with a deadline
//! carries no `Sleep` of its own.
//!
//! ## How it works
//!
//! - A waiter queued with a deadline on tokio's clock puts it on the queue's deadline heap
//!   (see `Queue`), as nanoseconds after `base` (the instant the heap last went from empty to
//!   non-empty: a `u64` instead of a 16-byte `Instant` keeps a heap entry at 16 bytes).
//! - Before it parks, such a waiter calls `deadlines::ensure`: if no task runs on the runtime
//!   that polls the waiter, it creates the task's `Sleep` (panicking like any tokio sleep
//!   outside a runtime with time, before any state changed) and spawns the task there; if one
//!   runs there and sleeps past the heap's earliest deadline, it wakes that task to re-arm.
//! - One task per runtime, not one per synchronizer: a task can only run while its runtime is
//!   driven, and a runtime can stay alive undriven (a current-thread runtime kept after its
//!   `block_on` returned). A single task left there would never wake the waiters of another
//!   runtime. A waiter's own runtime is driven whenever the waiter is
//!   polled, so its task is too.
//! - Each task, at each poll: takes every deadline at or before now off the heap (whichever
//!   runtime its waiter is on), marks its waiter expired and wakes it (the waiter times out);
//!   arms its one `Sleep` for the next deadline; finishes, with every other task, when the
//!   heap is empty. A removal that empties the heap wakes them all, so none outlives the
//!   waiters it serves by more than a poll.
//! - A task dropped before it finished (its runtime shut down), even before its first poll,
//!   hands over: the state says no task runs there, and every timed waiter is woken and
//!   re-parks through `ensure`, which starts a task on its own runtime if none runs there.
//!
//! ## Invariants (under the synchronizer's mutex)
//!
//! | state | invariant |
//! | --- | --- |
//! | a slot in `tasks` | its task (spawned on `runtime`) has not finished; at most one slot per runtime; a task without a slot changes nothing |
//! | a slot, heap non-empty | its task will poll by `armed` (it sleeps until then) or sooner (woken); `armed` ≤ the earliest deadline of the waiters parked from its runtime, or `None` (it re-reads the heap) |
//! | heap empty | no slot (the last removal woke every task, and each finishes at its next poll) or every slot's task is woken |
//! | a timed waiter parked | the slot of the runtime that last polled it will poll by its deadline (it parked after `ensure`, and `poll_cond` re-checks it on every poll); else it is woken to re-park |
//! | expired waiter | off the heap; its next decision is a timeout (unless it was passed the hold) |

// Under loom no waiter uses the shared timer (its sleeps never fire): the task is compiled out.
#![cfg_attr(slate_loom, allow(dead_code, unused_imports))]

#[cfg(not(slate_loom))]
use std::pin::Pin;
use std::sync::{Arc, PoisonError};
use std::task::Waker;
#[cfg(not(slate_loom))]
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::sync::{Mutex, MutexGuard};
use crate::synchronizer::State;

/// The shared timer's part of the synchronizer's state.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    /// The instant the heap's deadlines count from.
    base: Option<Instant>,
    /// The running tasks, at most one per runtime (one, nearly always).
    tasks: Vec<Slot>,
    /// The id of the last task spawned.
    last_task: u64,
}

/// One running task.
#[derive(Debug)]
struct Slot {
    task: u64,
    runtime: tokio::runtime::Id,
    /// The deadline the task sleeps until; `None`: it re-reads the heap when polled.
    armed: Option<u64>,
    /// The task's waker.
    waker: Option<Waker>,
}

/// The tasks to wake after the heap emptied (outside the synchronizer's mutex).
#[derive(Debug, Default)]
#[must_use]
pub(crate) struct Drained {
    first: Option<Waker>,
    more: Vec<Waker>,
}

impl Drained {
    pub(crate) fn wake(self) {
        for w in self {
            w.wake();
        }
    }
}

impl IntoIterator for Drained {
    type Item = Waker;
    type IntoIter = std::iter::Chain<std::option::IntoIter<Waker>, std::vec::IntoIter<Waker>>;

    fn into_iter(self) -> Self::IntoIter {
        self.first.into_iter().chain(self.more)
    }
}

impl Timers {
    /// `deadline` in heap units; `empty` says the heap has no deadline now (the base then
    /// moves to `now`, keeping the numbers small).
    pub(crate) fn ticks(&mut self, deadline: Instant, now: Instant, empty: bool) -> u64 {
        if empty {
            self.base = Some(now);
            for slot in &mut self.tasks {
                slot.armed = None;
            }
        }
        self.since_base(deadline)
    }

    /// Nanoseconds from the base to `t` (0 before it, or without a base). They fit in a u64
    /// for 584 years; a later deadline waits as good as forever.
    fn since_base(&self, t: Instant) -> u64 {
        self.base.map_or(0, |base| {
            u64::try_from(t.saturating_duration_since(base).as_nanos()).unwrap_or(u64::MAX)
        })
    }

    fn instant(&self, ticks: u64) -> Option<Instant> {
        self.base?.checked_add(Duration::from_nanos(ticks))
    }

    /// Whether any task runs (a testing aid).
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    pub(crate) fn running(&self) -> bool {
        !self.tasks.is_empty()
    }

    /// Whether a task on the runtime that polls the caller will poll by `deadline` (ticks):
    /// it runs there, and sleeps until no later than that, or re-reads the heap when polled.
    /// Otherwise the caller (a timed waiter) must re-park through `ensure`: it may have been
    /// parked from another runtime, whose task alone was told its deadline.
    pub(crate) fn serves_here(&self, deadline: u64) -> bool {
        tokio::runtime::Handle::try_current().is_ok_and(|h| {
            self.tasks
                .iter()
                .any(|t| t.runtime == h.id() && t.armed.is_none_or(|a| a <= deadline))
        })
    }

    fn slot(&mut self, task: u64) -> Option<&mut Slot> {
        self.tasks.iter_mut().find(|t| t.task == task)
    }

    /// Task `task` is gone (finished, or dropped with its runtime).
    fn stop(&mut self, task: u64) {
        self.tasks.retain(|t| t.task != task);
    }

    /// The tasks to wake because the heap emptied (they then finish).
    pub(crate) fn drained(&mut self) -> Drained {
        let mut drained = Drained::default();
        for slot in &mut self.tasks {
            slot.armed = None;
            if let Some(w) = slot.waker.take() {
                if drained.first.is_none() {
                    drained.first = Some(w);
                } else {
                    drained.more.push(w);
                }
            }
        }
        drained
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Makes sure a task on the caller's runtime watches the heap's earliest deadline: spawns one
/// if none runs there, or wakes it if it sleeps past that deadline. Called by a timed waiter
/// before it parks.
///
/// # Panics
///
/// Outside a tokio runtime with time enabled, as any tokio sleep does, before anything
/// changed.
#[cfg(not(slate_loom))]
pub(crate) fn ensure(state: &Arc<Mutex<State>>) {
    let handle = tokio::runtime::Handle::current();
    let runtime = handle.id();
    let first = {
        let mut st = lock(state);
        let Some(next) = st.queue.next_deadline() else {
            return;
        };
        let timers = &mut st.timers;
        if let Some(slot) = timers.tasks.iter_mut().find(|t| t.runtime == runtime) {
            if slot.armed.is_none_or(|armed| next < armed) {
                slot.armed = Some(next);
                let waker = slot.waker.take();
                drop(st);
                if let Some(waker) = waker {
                    waker.wake();
                }
            }
            return;
        }
        timers.instant(next)
    };
    // Far-future deadlines sleep "forever" (a year at a time; the task re-arms when woken).
    let at = first.map_or_else(far_future, tokio::time::Instant::from_std);
    let sleep = Box::pin(tokio::time::sleep_until(at));
    let task = {
        let mut st = lock(state);
        let timers = &mut st.timers;
        if timers.tasks.iter().any(|t| t.runtime == runtime) {
            return;
        }
        timers.last_task = timers.last_task.wrapping_add(1);
        let task = timers.last_task;
        timers.tasks.push(Slot {
            task,
            runtime,
            armed: None,
            waker: None,
        });
        task
    };
    // The guard exists before the task is first polled: a task dropped unpolled (its
    // runtime shut down first) hands over too (issue 28, item 9: created inside the task, it
    // did not exist then, and `running` stayed set for the synchronizer's life).
    let exit = Exit {
        state: Arc::clone(state),
        task,
    };
    handle.spawn(run(exit, sleep));
}

/// Under loom no waiter uses the shared timer (its sleeps never fire).
#[cfg(slate_loom)]
pub(crate) fn ensure(_state: &Arc<Mutex<State>>) {}

#[cfg(not(slate_loom))]
fn far_future() -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_secs(365 * 24 * 3600)
}

/// The task: expire, wake, re-arm, until the heap is empty.
#[cfg(not(slate_loom))]
async fn run(exit: Exit, mut sleep: Pin<Box<tokio::time::Sleep>>) {
    std::future::poll_fn(|cx| exit.poll(cx, sleep.as_mut())).await;
}

/// Runs the task's polls; on drop (finished, dropped by its runtime, or dropped before its
/// first poll) hands over.
struct Exit {
    state: Arc<Mutex<State>>,
    task: u64,
}

#[cfg(not(slate_loom))]
impl Exit {
    fn poll(&self, cx: &mut Context<'_>, mut sleep: Pin<&mut tokio::time::Sleep>) -> Poll<()> {
        let mut wakers = Vec::new();
        loop {
            let next = {
                let mut st = lock(&self.state);
                if st.timers.slot(self.task).is_none() {
                    return Poll::Ready(());
                }
                let now = st.timers.since_base(tokio::time::Instant::now().into_std());
                st.queue.expire(now, &mut wakers);
                match st.queue.next_deadline() {
                    None => {
                        // Every task finishes: the others when they are next polled.
                        wakers.extend(st.timers.tasks.drain(..).filter_map(|t| t.waker));
                        None
                    }
                    Some(next) => {
                        let at = st.timers.instant(next);
                        let slot = st.timers.slot(self.task).expect("checked above");
                        slot.armed = Some(next);
                        match &slot.waker {
                            Some(w) if w.will_wake(cx.waker()) => {}
                            _ => slot.waker = Some(cx.waker().clone()),
                        }
                        Some(at)
                    }
                }
            };
            for waker in wakers.drain(..) {
                waker.wake();
            }
            let Some(at) = next else {
                return Poll::Ready(());
            };
            sleep
                .as_mut()
                .reset(at.map_or_else(far_future, tokio::time::Instant::from_std));
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}

impl Drop for Exit {
    fn drop(&mut self) {
        let mut wakers = Vec::new();
        {
            let mut st = lock(&self.state);
            if st.timers.slot(self.task).is_none() {
                return; // finished normally
            }
            // Dropped unfinished (its runtime is shutting down): every timed waiter re-parks,
            // starting a task on its own runtime if none runs there.
            st.timers.stop(self.task);
            st.queue.timed_wakers(&mut wakers);
        }
        for waker in wakers {
            waker.wake();
        }
    }
}
