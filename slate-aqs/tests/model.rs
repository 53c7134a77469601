//! A proptest state machine: random operations against the synchronizer, each outcome
//! checked against a reference model of the queue.
//!
//! Futures are polled by hand with wakers that record wake-ups, and only woken futures are
//! polled again ("settling"): a lost wake-up leaves a waiter parked, which the liveness check
//! catches. Time is tokio's paused clock, moved only by `Advance`.
//!
//! Checked after every operation:
//! - FIFO: a queued waiter is granted only when it is the model's oldest live waiter;
//! - at most one owner, and the synchronizer's owner and queue length match the model's;
//! - each waiter ends exactly once (granted, timed out or cancelled), a timeout never comes
//!   before its deadline, and no waiter is still queued well past its deadline;
//! - liveness: no waiter stays parked while the lock is free and it is the head (unless the
//!   remote was freed without a notification and the head's retry timer has not run yet);
//! - the synchronizer's own invariant walk passes;
//! - local passes (lock cohorting, `acquire_passable`): a release of the last level passes
//!   the remote hold to the head exactly when the model says so (head passable, budget
//!   left), the receiver's grant names the remote holder that acquired, the budget counts
//!   down across receivers, and a receiver cancelled before it took the hold passes it on
//!   (next waiter passable) or frees it (nothing leaks: the remote is checked after every
//!   operation). A pass of a lost hold is refused and the receiver attempts remotely.
//!
//! At the end the lock is freed for good and every waiter must end.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use common::{Manual, new_sync};
use proptest::prelude::*;
use slate_aqs::testing::{self, MemoryGrant};
use slate_core::{Error, HolderId, Result, Wait};
use tokio::time::Instant;

const SPIN: Duration = Duration::from_millis(10);

#[derive(Clone, Debug)]
enum Op {
    /// A new waiter with a fresh holder; `Some(ms)`: a deadline that far ahead; `true`: a
    /// passable waiter (`acquire_passable`).
    Enqueue(Option<u64>, bool),
    /// `Wait::Immediate` by a fresh holder.
    Immediate,
    /// The owner acquires again.
    Reenter,
    /// The owner releases one level (passed to the head, or remotely then locally).
    Release,
    /// The owner releases one level, and if that passed the hold to the head, the head is
    /// dropped before it could run (cancelled while being passed the lock).
    ReleaseCancelHead,
    /// The owner's remote hold vanishes (its lease ran out), silently: its local hold stays
    /// until it releases, and a re-entry meanwhile must fail with `LeaseLost`.
    LoseLease,
    /// Drop the n-th live waiter (mod their number).
    Cancel(usize),
    /// Poll the n-th live waiter although nobody woke it.
    SpuriousPoll(usize),
    /// Another process takes the remote lock, if free.
    ExternalLock,
    /// Another process releases it, announcing it (or not).
    ExternalUnlock { notify: bool },
    /// Move the paused clock.
    Advance(u64),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (prop::option::weighted(0.4, 1u64..60), prop::bool::weighted(0.7))
            .prop_map(|(ms, passable)| Op::Enqueue(ms, passable)),
        1 => Just(Op::Immediate),
        1 => Just(Op::Reenter),
        4 => Just(Op::Release),
        1 => Just(Op::ReleaseCancelHead),
        1 => Just(Op::LoseLease),
        2 => any::<usize>().prop_map(Op::Cancel),
        1 => any::<usize>().prop_map(Op::SpuriousPoll),
        2 => Just(Op::ExternalLock),
        2 => any::<bool>().prop_map(|notify| Op::ExternalUnlock { notify }),
        3 => (1u64..25).prop_map(Op::Advance),
    ]
}

type Acquire<'a> = Manual<Pin<Box<dyn Future<Output = Result<MemoryGrant>> + 'a>>>;

struct Waiter<'a> {
    id: usize,
    holder: HolderId,
    passable: bool,
    deadline: Option<Instant>,
    fut: Acquire<'a>,
}

/// The reference model.
#[derive(Debug, Default)]
struct Model {
    owner: Option<(HolderId, u32)>,
    /// The holder whose remote hold the owner uses (itself, unless it was passed the hold).
    remote: Option<HolderId>,
    /// Passes the owner's remote hold may still serve.
    passes_left: u32,
    /// The waiter the hold was passed to, which has not run yet.
    passing: Option<usize>,
    external: bool,
    /// Live queued waiters, oldest first.
    queue: VecDeque<usize>,
    /// The remote was freed without a notification and the head may not know yet.
    stale: bool,
    /// The owner's remote hold was lost (`LoseLease`) and it has not released to zero yet.
    lost: bool,
    /// How each waiter ended (index = waiter id).
    ended: Vec<Option<&'static str>>,
}

struct Harness<'a> {
    budget: u32,
    sync: &'a common::Sync,
    remote: &'a slate_aqs::testing::MemoryRemote,
    rt: &'a tokio::runtime::Runtime,
    outsider: HolderId,
    waiters: Vec<Waiter<'a>>,
    model: Model,
    next_id: usize,
}

impl<'a> Harness<'a> {
    fn new_waiter(&mut self, wait: Wait, passable: bool) -> (usize, HolderId, Acquire<'a>) {
        let holder = HolderId::new();
        let fut: Pin<Box<dyn Future<Output = Result<MemoryGrant>> + 'a>> = if passable {
            Box::pin(self.sync.acquire_passable(holder, wait))
        } else {
            Box::pin(self.sync.acquire(holder, wait))
        };
        let id = self.next_id;
        self.next_id += 1;
        self.model.ended.push(None);
        (id, holder, Manual::new(fut))
    }

    fn end(&mut self, id: usize, how: &'static str) -> std::result::Result<(), String> {
        match self.model.ended[id] {
            Some(prev) => Err(format!("waiter {id} ended twice: {prev}, then {how}")),
            None => {
                self.model.ended[id] = Some(how);
                Ok(())
            }
        }
    }

    /// Records a completed acquire of waiter `id` (queued or not).
    #[allow(clippy::too_many_arguments)]
    fn completed(
        &mut self,
        id: usize,
        holder: HolderId,
        passable: bool,
        deadline: Option<Instant>,
        queued: bool,
        out: Result<MemoryGrant>,
    ) -> std::result::Result<(), String> {
        // A passable waiter that attempts from the queue with others behind it names a fresh
        // remote holder (nobody can name its hold once passed); everyone else names itself.
        let minted = queued && passable && self.model.queue.len() > 1;
        match out {
            Ok(grant) if grant.passed => {
                if self.model.passing != Some(id) || self.model.lost {
                    return Err(format!(
                        "waiter {id} took a passed hold; passing to {:?}, lost {}",
                        self.model.passing, self.model.lost
                    ));
                }
                if Some(grant.holder) != self.model.remote || grant.count != 1 {
                    return Err(format!(
                        "waiter {id} was passed {grant:?}; the remote holder is {:?}",
                        self.model.remote
                    ));
                }
                self.model.passing = None;
                self.end(id, "granted by a pass")?;
            }
            Ok(grant) if self.model.passing == Some(id) => {
                // A pass of a lost hold is refused: the receiver acquires afresh, from the
                // queue, under a fresh remote holder.
                if !self.model.lost || minted == (grant.holder == holder) || grant.count != 1 {
                    return Err(format!(
                        "waiter {id} was passed the hold but got {grant:?} (lost {})",
                        self.model.lost
                    ));
                }
                self.model.passing = None;
                self.model.lost = false;
                self.model.remote = Some(grant.holder);
                self.model.passes_left = if minted { self.budget } else { 0 };
                self.end(id, "granted after a refused pass")?;
            }
            Ok(grant) => {
                if minted == (grant.holder == holder) {
                    return Err(format!(
                        "waiter {id} (queued {queued}, passable {passable}) got a grant for {}",
                        grant.holder
                    ));
                }
                if queued && self.model.queue.front() != Some(&id) {
                    return Err(format!(
                        "waiter {id} granted out of FIFO order; queue {:?}",
                        self.model.queue
                    ));
                }
                if self.model.owner.is_some() || self.model.external {
                    return Err(format!(
                        "waiter {id} granted while held (owner {:?}, external {})",
                        self.model.owner, self.model.external
                    ));
                }
                self.model.owner = Some((holder, 1));
                self.model.remote = Some(grant.holder);
                self.model.passes_left = if minted { self.budget } else { 0 };
                self.end(id, "granted")?;
            }
            Err(Error::Timeout { .. }) => {
                let now = Instant::now();
                if deadline.is_none_or(|d| now < d) {
                    return Err(format!("waiter {id} timed out before its deadline"));
                }
                self.end(id, "timed out")?;
            }
            Err(e) => return Err(format!("waiter {id}: unexpected error {e}")),
        }
        if queued {
            let was_head = self.model.queue.front() == Some(&id);
            self.model.queue.retain(|w| *w != id);
            if was_head {
                self.model.stale = false;
            }
        }
        Ok(())
    }

    /// Polls woken waiters until nobody is woken any more.
    fn settle(&mut self) -> std::result::Result<(), String> {
        for _round in 0..10_000 {
            let pos = match self.waiters.iter().position(|w| w.fut.woken()) {
                Some(pos) => pos,
                None => {
                    // Spawned tasks (the shared deadline timer) run on the runtime: let them
                    // run, and stop once they woke nobody.
                    self.rt.block_on(async {
                        for _ in 0..4 {
                            tokio::task::yield_now().await;
                        }
                    });
                    match self.waiters.iter().position(|w| w.fut.woken()) {
                        Some(pos) => pos,
                        None => return Ok(()),
                    }
                }
            };
            self.poll_at(pos)?;
        }
        Err("settling did not converge (a wake-up loop)".to_owned())
    }

    fn poll_at(&mut self, pos: usize) -> std::result::Result<(), String> {
        if let Poll::Ready(out) = self.waiters[pos].fut.poll() {
            let w = self.waiters.remove(pos);
            self.completed(w.id, w.holder, w.passable, w.deadline, true, out)?;
        }
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> std::result::Result<(), String> {
        match *op {
            Op::Enqueue(ms, passable) => {
                let deadline = ms.map(|ms| Instant::now() + Duration::from_millis(ms));
                let wait = deadline.map_or(Wait::Forever, |d| Wait::Until(d.into_std()));
                let (id, holder, mut fut) = self.new_waiter(wait, passable);
                // The first poll takes the fast path or joins the queue.
                let first_in = self.model.queue.is_empty();
                match fut.poll() {
                    Poll::Ready(out) => {
                        self.completed(id, holder, passable, deadline, false, out)?;
                    }
                    Poll::Pending => {
                        self.model.queue.push_back(id);
                        if first_in {
                            // A fresh head attempted just now: it knows the remote's state.
                            self.model.stale = false;
                        }
                        self.waiters.push(Waiter {
                            id,
                            holder,
                            passable,
                            deadline,
                            fut,
                        });
                    }
                }
            }
            Op::Immediate => {
                let (id, holder, mut fut) = self.new_waiter(Wait::Immediate, false);
                let Poll::Ready(out) = fut.poll() else {
                    return Err("an immediate acquire did not complete at once".to_owned());
                };
                let free = self.model.owner.is_none() && !self.model.external;
                match out {
                    Ok(_) if free => {
                        self.model.owner = Some((holder, 1));
                        self.model.remote = Some(holder);
                        self.model.passes_left = 0;
                        self.end(id, "granted")?;
                    }
                    Err(e) if e.is_busy() && !free => self.end(id, "busy")?,
                    other => {
                        return Err(format!("immediate: {other:?}, lock free: {free}"));
                    }
                }
            }
            Op::Reenter => {
                let Some((owner, depth)) = self.model.owner else {
                    return Ok(());
                };
                let mut fut = Manual::new(self.sync.acquire(owner, Wait::Forever));
                match fut.poll() {
                    Poll::Ready(Ok(grant))
                        if grant.count == depth + 1
                            && Some(grant.holder) == self.model.remote
                            && !self.model.lost =>
                    {
                        self.model.owner = Some((owner, depth + 1));
                    }
                    // Issue 19, defect 4: a re-entry after the hold was lost must not count
                    // a fresh remote hold as one more level.
                    Poll::Ready(Err(Error::LeaseLost { .. })) if self.model.lost => {}
                    other => {
                        return Err(format!("re-entry (lost: {}): {other:?}", self.model.lost));
                    }
                }
            }
            Op::LoseLease => {
                if let (Some(_), Some(remote)) = (self.model.owner, self.model.remote)
                    && !self.model.lost
                {
                    while self.remote.release_silently(remote).is_ok_and(|n| n > 0) {}
                    self.model.lost = true;
                }
            }
            Op::Release => self.release(false)?,
            Op::ReleaseCancelHead => self.release(true)?,
            Op::Cancel(n) => {
                if !self.waiters.is_empty() {
                    self.cancel(n % self.waiters.len())?;
                }
            }
            Op::SpuriousPoll(n) => {
                if !self.waiters.is_empty() {
                    let pos = n % self.waiters.len();
                    self.poll_at(pos)?;
                }
            }
            Op::ExternalLock => {
                if self.model.owner.is_none() && !self.model.external {
                    assert!(self.remote.try_acquire(self.outsider).is_some());
                    self.model.external = true;
                }
            }
            Op::ExternalUnlock { notify } => {
                if self.model.external {
                    self.model.external = false;
                    if notify {
                        self.remote.release(self.outsider).unwrap();
                    } else {
                        self.remote.release_silently(self.outsider).unwrap();
                        self.model.stale = true;
                    }
                }
            }
            Op::Advance(ms) => {
                let d = Duration::from_millis(ms);
                self.rt.block_on(tokio::time::advance(d));
                if d >= SPIN {
                    // Every parked head's retry timer (at most SPIN away) has fired.
                    self.model.stale = false;
                }
            }
        }
        self.settle()?;
        if self.model.queue.is_empty() {
            self.model.stale = false;
        }
        self.check()
    }

    /// The owner releases one level; `cancel_receiver`: a head passed the hold is dropped
    /// before it runs.
    fn release(&mut self, cancel_receiver: bool) -> std::result::Result<(), String> {
        let Some((owner, depth)) = self.model.owner else {
            return Ok(());
        };
        let head = self.model.queue.front().copied();
        let head_passable = head
            .and_then(|id| self.waiters.iter().find(|w| w.id == id))
            .is_some_and(|w| w.passable);
        let pass = depth == 1 && self.model.passes_left > 0 && head_passable;
        match testing::release(self.sync, owner) {
            Ok(0) if pass => {}
            Ok(_) if !pass && !self.model.lost => {}
            Err(Error::NotHeld { .. }) if !pass && self.model.lost => {}
            other => {
                return Err(format!(
                    "release (lost: {}, pass expected: {pass}): {other:?}",
                    self.model.lost
                ));
            }
        }
        if pass {
            let Some(receiver) = head else {
                unreachable!("a pass needs a head")
            };
            let holder = self
                .waiters
                .iter()
                .find(|w| w.id == receiver)
                .map(|w| w.holder);
            self.model.owner = holder.map(|h| (h, 1));
            self.model.passes_left -= 1;
            self.model.passing = Some(receiver);
            if cancel_receiver {
                let pos = self
                    .waiters
                    .iter()
                    .position(|w| w.id == receiver)
                    .ok_or("the receiver is not live")?;
                self.cancel(pos)?;
            }
            return Ok(());
        }
        self.model.owner = (depth > 1).then_some((owner, depth - 1));
        if depth == 1 {
            self.model.stale = false;
            self.model.lost = false;
            self.model.remote = None;
        }
        Ok(())
    }

    /// Drops the live waiter at `pos`.
    fn cancel(&mut self, pos: usize) -> std::result::Result<(), String> {
        let w = self.waiters.remove(pos);
        drop(w.fut);
        let was_head = self.model.queue.front() == Some(&w.id);
        self.model.queue.retain(|q| *q != w.id);
        if was_head {
            self.model.stale = false;
        }
        if self.model.passing == Some(w.id) {
            // Passed on to the next waiter if it is passable, else freed (released remotely).
            let next = self
                .model
                .queue
                .front()
                .and_then(|id| self.waiters.iter().find(|n| n.id == *id))
                .filter(|n| n.passable)
                .map(|n| (n.id, n.holder));
            match next {
                Some((id, holder)) => {
                    self.model.passing = Some(id);
                    self.model.owner = Some((holder, 1));
                }
                None => {
                    self.model.passing = None;
                    self.model.owner = None;
                    self.model.remote = None;
                    self.model.lost = false;
                }
            }
        }
        self.end(w.id, "cancelled")
    }

    fn check(&self) -> std::result::Result<(), String> {
        self.sync.check_invariants()?;
        if self.sync.owner() != self.model.owner {
            return Err(format!(
                "owner {:?}, model {:?}",
                self.sync.owner(),
                self.model.owner
            ));
        }
        if self.sync.waiters() != self.model.queue.len() {
            return Err(format!(
                "{} waiters, model {:?}",
                self.sync.waiters(),
                self.model.queue
            ));
        }
        let expected_remote = match (self.model.owner, self.model.external) {
            (Some(_), false) if self.model.lost => None,
            (Some((_, d)), false) => Some((self.model.remote.ok_or("model: no remote holder")?, d)),
            (None, true) => Some((self.outsider, 1)),
            (None, false) => None,
            (Some(_), true) => return Err("model: owner and outsider at once".to_owned()),
        };
        if self.remote.holder() != expected_remote {
            return Err(format!(
                "remote {:?}, expected {expected_remote:?}",
                self.remote.holder()
            ));
        }
        let free = self.model.owner.is_none() && !self.model.external;
        if free && !self.model.stale && !self.model.queue.is_empty() {
            return Err(format!(
                "the lock is free and the head {:?} stays parked",
                self.model.queue.front()
            ));
        }
        // tokio's timer rounds deadlines up to the next millisecond.
        let now = Instant::now();
        for w in &self.waiters {
            if w.deadline
                .is_some_and(|d| now >= d + Duration::from_millis(1))
            {
                return Err(format!("waiter {} still queued past its deadline", w.id));
            }
        }
        Ok(())
    }

    /// Frees the lock for good; every waiter must then end.
    fn drain(&mut self) -> std::result::Result<(), String> {
        for _ in 0..1_000 {
            while self.model.owner.is_some() {
                self.release(false)?;
                self.settle()?;
                self.check()?;
            }
            if self.model.external {
                self.remote.release(self.outsider).unwrap();
                self.model.external = false;
            }
            self.settle()?;
            self.check()?;
            // A head that missed a silent unlock finds out on its retry timer.
            self.rt.block_on(tokio::time::advance(SPIN));
            self.model.stale = false;
            self.settle()?;
            self.check()?;
            if self.waiters.is_empty() && self.model.owner.is_none() {
                break;
            }
        }
        if !self.waiters.is_empty() {
            return Err(format!("{} waiters never ended", self.waiters.len()));
        }
        if let Some(id) = self.model.ended.iter().position(Option::is_none) {
            return Err(format!("waiter {id} never ended"));
        }
        if self.sync.waiters() != 0 || self.remote.holder().is_some() {
            return Err("not clean after the drain".to_owned());
        }
        Ok(())
    }
}

fn run(ops: &[Op]) -> std::result::Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let _enter = rt.enter();
    let (remote, sync) = new_sync(SPIN);
    testing::subscribe(&sync);
    let budget = 2;
    sync.competitor().set_pass_budget(budget);
    let mut h = Harness {
        budget,
        sync: &sync,
        remote: &remote,
        rt: &rt,
        outsider: HolderId::new(),
        waiters: Vec::new(),
        model: Model::default(),
        next_id: 0,
    };
    for (i, op) in ops.iter().enumerate() {
        h.apply(op)
            .map_err(|e| format!("after op {i} {op:?}: {e}"))?;
    }
    h.drain()
}

proptest! {
    #![proptest_config(ProptestConfig {
        // `PROPTEST_CASES=N` runs a longer search.
        cases: common::proptest_cases(512),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn the_queue_behaves_like_its_model(ops in prop::collection::vec(op_strategy(), 1..60)) {
        let what = format!("{ops:?}");
        let outcome = common::with_watchdog_or_exit(Duration::from_secs(20), what, move || run(&ops));
        prop_assert_eq!(outcome, Ok(()));
    }
}

#[test]
fn the_model_catches_a_parked_head_while_the_lock_is_free() {
    // The checker must be able to fail: a waiter whose wake-up is swallowed (here, its waker
    // flag is cleared by hand and never acted on) stays parked while the lock is free.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let _enter = rt.enter();
    let (remote, sync) = new_sync(SPIN);
    let mut h = Harness {
        budget: 0,
        sync: &sync,
        remote: &remote,
        rt: &rt,
        outsider: HolderId::new(),
        waiters: Vec::new(),
        model: Model::default(),
        next_id: 0,
    };
    h.apply(&Op::Enqueue(None, false)).unwrap(); // granted at once
    h.apply(&Op::Enqueue(None, false)).unwrap(); // queued
    let (owner, _) = h.model.owner.unwrap();
    testing::release(&sync, owner).unwrap();
    h.model.owner = None;
    assert!(h.waiters[0].fut.woken(), "the release woke the head");
    // Swallow that wake-up instead of polling.
    assert!(h.settle().is_ok());
    let err = h.check().unwrap_err();
    assert!(err.contains("stays parked"), "{err}");
}
