//! The shared deadline timer: one tokio task per synchronizer (while timed waiters are queued)
//! wakes the waiters whose deadline passed, so a queued waiter with a deadline carries no
//! `Sleep` of its own.
//!
//! ## How it works
//!
//! - A waiter queued with a deadline on tokio's clock puts it on the queue's deadline heap
//!   (see `Queue`), as nanoseconds after `base` (the instant the heap last went from empty to
//!   non-empty: a `u64` instead of a 16-byte `Instant` keeps a heap entry at 16 bytes).
//! - Before it parks, such a waiter calls `Synchronizer::ensure_timer`: if no task runs, it
//!   creates the task's `Sleep` (panicking like any tokio sleep outside a runtime with time,
//!   before any state changed) and spawns the task; if one runs and sleeps past this deadline,
//!   it wakes the task to re-arm.
//! - The task, at each poll: takes every deadline at or before now off the heap, marks its
//!   waiter expired and wakes it (the waiter times out); arms its one `Sleep` for the next
//!   deadline; finishes when the heap is empty. A removal that empties the heap wakes it, so
//!   it never outlives the waiters it serves by more than a poll.
//! - A task dropped before it finished (its runtime shut down), even before its first poll,
//!   hands over: the state says no task runs, and every timed waiter is woken, re-parks
//!   through `ensure_timer`, and the first to do so starts a task on its own runtime.
//!
//! ## Invariants (under the synchronizer's mutex)
//!
//! | state | invariant |
//! | --- | --- |
//! | `running` | a task spawned with id `task` has not finished; no other task changes the state |
//! | `running`, heap non-empty | the task will poll by `armed` (it sleeps until then) or sooner (woken); `armed` ≤ the earliest deadline or `None` |
//! | a timed waiter parked | `running` (it parked after `ensure_timer`); else it is woken to re-park |
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
    /// A task is running.
    running: bool,
    /// The id of the last task spawned.
    task: u64,
    /// The deadline the running task sleeps until; `None`: it re-reads the heap when polled.
    armed: Option<u64>,
    /// The running task's waker.
    waker: Option<Waker>,
}

impl Timers {
    /// `deadline` in heap units; `empty` says the heap has no deadline now (the base then
    /// moves to `now`, keeping the numbers small).
    pub(crate) fn ticks(&mut self, deadline: Instant, now: Instant, empty: bool) -> u64 {
        if empty {
            self.base = Some(now);
            self.armed = None;
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

    pub(crate) fn running(&self) -> bool {
        self.running
    }

    /// Whether task `task` is the one that runs.
    fn is_current(&self, task: u64) -> bool {
        self.running && self.task == task
    }

    /// The running task is gone (finished, or dropped with its runtime).
    fn stop(&mut self) {
        self.running = false;
        self.armed = None;
        self.waker = None;
    }

    /// The task to wake because the heap emptied (it then finishes).
    pub(crate) fn drained(&mut self) -> Option<Waker> {
        self.armed = None;
        self.waker.take()
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Makes sure a task watches the heap's earliest deadline: spawns one if none runs, or wakes
/// the running one if it sleeps past that deadline. Called by a timed waiter before it parks.
///
/// # Panics
///
/// Outside a tokio runtime with time enabled, as any tokio sleep does, before anything
/// changed.
#[cfg(not(slate_loom))]
pub(crate) fn ensure(state: &Arc<Mutex<State>>) {
    let first = {
        let mut st = lock(state);
        let Some(next) = st.queue.next_deadline() else {
            return;
        };
        let timers = &mut st.timers;
        if timers.running {
            if timers.armed.is_none_or(|armed| next < armed) {
                timers.armed = Some(next);
                let waker = timers.waker.take();
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
    let handle = tokio::runtime::Handle::current();
    let task = {
        let mut st = lock(state);
        if st.timers.running {
            return;
        }
        st.timers.running = true;
        st.timers.task = st.timers.task.wrapping_add(1);
        st.timers.armed = None;
        st.timers.task
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
                if !st.timers.is_current(self.task) {
                    return Poll::Ready(());
                }
                let now = st.timers.since_base(tokio::time::Instant::now().into_std());
                st.queue.expire(now, &mut wakers);
                match st.queue.next_deadline() {
                    None => {
                        st.timers.stop();
                        None
                    }
                    Some(next) => {
                        st.timers.armed = Some(next);
                        match &st.timers.waker {
                            Some(w) if w.will_wake(cx.waker()) => {}
                            _ => st.timers.waker = Some(cx.waker().clone()),
                        }
                        Some(st.timers.instant(next))
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
            if !st.timers.is_current(self.task) {
                return; // finished normally, or a newer task took over
            }
            // Dropped unfinished (its runtime is shutting down): every timed waiter re-parks
            // and the first starts a new task.
            st.timers.stop();
            st.queue.timed_wakers(&mut wakers);
        }
        for waker in wakers {
            waker.wake();
        }
    }
}
