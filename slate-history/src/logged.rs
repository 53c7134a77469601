//! Lock calls recorded as history events, the same way by every worker process (`slate
//! demo`'s and the scenario suite's): `acq_invoke` and `rel_invoke` stamped before the call,
//! the outcome after the reply, the holder as the lock stores it, deadlines on the shared
//! clock ([`crate::clock::to_mono_ns`]).
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use slate_history::history::Recorder;
//! use slate_history::logged::Log;
//! use slate_redis::{DistributedLock, RedisClient, SingleLock};
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let rec = Recorder::create("history", 0)?;
//! let client = RedisClient::open("redis://127.0.0.1:6379")?;
//! let lock = SingleLock::builder(&client, "orders").build()?;
//! let log = Log::new(&rec, "orders", 0);
//! if let Ok((guard, mut held)) = log.acquire(0, lock.lock()).await? {
//!     // ... the critical section ...
//!     log.note_renewal(&mut held, &guard)?;
//!     log.release(&mut held, guard, Duration::from_secs(5)).await?;
//! }
//! # Ok(()) }
//! ```

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use slate_core::{Error, LockGuard};

use crate::clock::to_mono_ns;
use crate::history::{EventKind, HistoryError, Recorder};

/// What the history logged of one hold.
#[derive(Clone, Debug)]
pub struct Held {
    /// The holder id, as the lock stores it.
    pub holder: String,
    /// The fencing token.
    pub token: u64,
    /// The level the history believes the holder has.
    pub depth: u32,
    /// The latest lease deadline logged (monotonic ns).
    pub deadline: u64,
    /// The nodes held (empty for a single lock).
    pub nodes: Vec<usize>,
    /// Logs every move of the hold's deadline as it happens (see [`RenewalLog`]); `None` for
    /// a hold made up by the caller or recorded outside a tokio runtime.
    pub renewals: Option<Arc<RenewalLog>>,
}

/// Logs `renew_ok` each time a hold's lease deadline moves, from a task of its own, so that
/// the history's window is as long as the holder believed, whatever the worker is doing
/// (waiting, paused between operations, releasing). It stops when the release is invoked
/// (under the same lock as the `rel_invoke` record, so no renewal is logged after it), when
/// the lease is lost, and when the last [`Held`] clone holding it is dropped.
#[derive(Debug)]
pub struct RenewalLog {
    stopped: Arc<Mutex<bool>>,
    task: tokio::task::JoinHandle<()>,
}

impl RenewalLog {
    /// Starts logging the moves of `lease` for `holder`, from `logged` (the deadline already
    /// recorded), or `None` outside a tokio runtime.
    fn start(
        rec: &Recorder,
        lock: &str,
        task: u64,
        holder: &str,
        mut lease: slate_core::LeaseWatch,
        logged: u64,
    ) -> Option<Self> {
        let rt = tokio::runtime::Handle::try_current().ok()?;
        let stopped = Arc::new(Mutex::new(false));
        let (rec, lock, holder) = (rec.clone(), lock.to_owned(), holder.to_owned());
        let stop = Arc::clone(&stopped);
        let task = rt.spawn(async move {
            let mut last = logged;
            loop {
                lease.changed().await;
                let stopped = stop.lock().unwrap_or_else(PoisonError::into_inner);
                if *stopped || lease.is_lost() {
                    return;
                }
                let d = to_mono_ns(lease.deadline());
                if d != last {
                    last = d;
                    let kind = EventKind::RenewOk {
                        holder: holder.clone(),
                        deadline: d,
                    };
                    if rec.record(task, &lock, kind).is_err() {
                        return;
                    }
                }
                if lease.is_closed() {
                    return;
                }
            }
        });
        Some(RenewalLog { stopped, task })
    }

    /// Stops logging; `then` runs under the same lock (the `rel_invoke` record).
    fn stop<T>(&self, then: impl FnOnce() -> T) -> T {
        let mut stopped = self.stopped.lock().unwrap_or_else(PoisonError::into_inner);
        *stopped = true;
        self.task.abort();
        then()
    }
}

impl Drop for RenewalLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How a logged release ended.
#[derive(Debug)]
pub enum Released {
    /// Released; the level left (0: the lock is free of this holder).
    Done(u32),
    /// The lock said the holder held nothing (the lease was lost).
    NotHeld,
    /// Any other error (recorded as `rel_info`: the entry may be left to its lease).
    Failed(Error),
    /// No answer within the budget (recorded as `rel_info`).
    TimedOut,
}

/// One task's view of a recorder, for one lock.
#[derive(Clone, Copy, Debug)]
pub struct Log<'a> {
    rec: &'a Recorder,
    lock: &'a str,
    task: u64,
}

impl<'a> Log<'a> {
    /// Records for task `task` of the recorder's process, on lock `lock`.
    #[must_use]
    pub fn new(rec: &'a Recorder, lock: &'a str, task: u64) -> Self {
        Log { rec, lock, task }
    }

    /// Records one event.
    ///
    /// # Errors
    ///
    /// The history file could not be written.
    pub fn record(&self, kind: EventKind) -> Result<u64, HistoryError> {
        self.rec.record(self.task, self.lock, kind)
    }

    /// `acq_invoke`, then the call, then `acq_ok` with the guard's holder, token, level,
    /// deadline and nodes; or, for an error, `acq_fail` when nothing can be held (busy, a
    /// timeout, too few nodes: what was taken was released) and `acq_info` otherwise (an
    /// entry may have been left behind).
    ///
    /// # Errors
    ///
    /// The history could not be written (the call's own error is the inner `Err`).
    pub async fn acquire<G: LockGuard>(
        &self,
        attempt: u64,
        call: impl Future<Output = slate_core::Result<G>>,
    ) -> Result<Result<(G, Held), Error>, HistoryError> {
        self.record(EventKind::AcqInvoke {
            attempt,
            budget_ms: None,
        })?;
        match call.await {
            Ok(guard) => {
                let held = self.acquired(attempt, &guard)?;
                Ok(Ok((guard, held)))
            }
            Err(e) => {
                let reason = e.to_string();
                let nothing_held = e.is_busy() || e.is_timeout() || e.is_insufficient_nodes();
                self.record(if nothing_held {
                    EventKind::AcqFail { attempt, reason }
                } else {
                    EventKind::AcqInfo { attempt, reason }
                })?;
                Ok(Err(e))
            }
        }
    }

    /// `acq_ok` for a guard just received (for a caller that logged the invocation itself),
    /// and the state logged.
    ///
    /// # Errors
    ///
    /// The history could not be written.
    pub fn acquired<G: LockGuard>(&self, attempt: u64, guard: &G) -> Result<Held, HistoryError> {
        let deadline = to_mono_ns(guard.lease_deadline());
        let holder = guard.holder().to_string();
        let renewals = RenewalLog::start(
            self.rec,
            self.lock,
            self.task,
            &holder,
            guard.lease().clone(),
            deadline,
        )
        .map(Arc::new);
        let held = Held {
            holder,
            token: guard.fencing_token().get(),
            depth: guard.depth(),
            deadline,
            nodes: guard.nodes().to_vec(),
            renewals,
        };
        self.record(EventKind::AcqOk {
            attempt,
            holder: held.holder.clone(),
            token: held.token,
            depth: held.depth,
            deadline: held.deadline,
            nodes: held.nodes.clone(),
            permits: guard.permits(),
        })?;
        Ok(held)
    }

    /// `renew_ok` when the guard's deadline moved past the one logged, for a hold without a
    /// running [`RenewalLog`] (which logs every move itself).
    ///
    /// # Errors
    ///
    /// The history could not be written.
    pub fn note_renewal<G: LockGuard>(
        &self,
        held: &mut Held,
        guard: &G,
    ) -> Result<(), HistoryError> {
        if held.renewals.is_some() {
            // The renewal log records every move as it happens already.
            return Ok(());
        }
        let d = to_mono_ns(guard.lease_deadline());
        if d > held.deadline {
            held.deadline = d;
            self.record(EventKind::RenewOk {
                holder: held.holder.clone(),
                deadline: d,
            })?;
        }
        Ok(())
    }

    /// `lost` with the reason, when the guard's lease was lost.
    ///
    /// # Errors
    ///
    /// The history could not be written.
    pub fn note_loss<G: LockGuard>(&self, held: &Held, guard: &G) -> Result<(), HistoryError> {
        if let Some(reason) = guard.lease().loss_reason() {
            self.record(EventKind::Lost {
                holder: held.holder.clone(),
                reason: reason.to_string(),
            })?;
        }
        Ok(())
    }

    /// `rel_invoke`, `unlock()` within `budget`, then `rel_ok` / `rel_fail` (not held) /
    /// `rel_info`; `held.depth` follows.
    ///
    /// # Errors
    ///
    /// The history could not be written.
    pub async fn release<G: LockGuard>(
        &self,
        held: &mut Held,
        guard: G,
        budget: Duration,
    ) -> Result<Released, HistoryError> {
        self.release_invoked(held)?;
        match tokio::time::timeout(budget, guard.unlock()).await {
            Ok(outcome) => self.release_answered(held, outcome),
            Err(_) => {
                self.record(EventKind::RelInfo {
                    holder: held.holder.clone(),
                    reason: format!("release gave no answer within {budget:?}"),
                })?;
                Ok(Released::TimedOut)
            }
        }
    }

    /// `rel_invoke`, for a caller that runs the `unlock()` itself (then
    /// [`release_answered`](Self::release_answered)).
    ///
    /// # Errors
    ///
    /// The history could not be written.
    pub fn release_invoked(&self, held: &Held) -> Result<u64, HistoryError> {
        let record = || {
            self.record(EventKind::RelInvoke {
                holder: held.holder.clone(),
                depth_before: held.depth,
            })
        };
        match &held.renewals {
            Some(r) if held.depth <= 1 => r.stop(record),
            _ => record(),
        }
    }

    /// Records what `unlock()` answered: `rel_ok`, `rel_fail` (not held) or `rel_info`;
    /// `held.depth` follows.
    ///
    /// # Errors
    ///
    /// The history could not be written.
    pub fn release_answered(
        &self,
        held: &mut Held,
        outcome: slate_core::Result<u32>,
    ) -> Result<Released, HistoryError> {
        let holder = held.holder.clone();
        let (kind, released) = match outcome {
            Ok(n) => {
                held.depth = n;
                (
                    EventKind::RelOk {
                        holder,
                        depth_after: n,
                    },
                    Released::Done(n),
                )
            }
            Err(e) if e.is_not_held() => {
                held.depth = 0;
                (
                    EventKind::RelFail {
                        holder,
                        reason: e.to_string(),
                        not_held: true,
                    },
                    Released::NotHeld,
                )
            }
            Err(e) => (
                EventKind::RelInfo {
                    holder,
                    reason: e.to_string(),
                },
                Released::Failed(e),
            ),
        };
        self.record(kind)?;
        Ok(released)
    }
}
