//! A proptest state machine for the synchronizer's **shared mode**: random readers
//! (`acquire_shared`) and writers (`acquire`) of one process, against a reference model, with
//! another process holding the remote lock exclusively or shared now and then.
//!
//! Futures are polled by hand and only woken futures are polled again, as in `model.rs`, so a
//! lost wake-up leaves a waiter parked and the liveness check catches it. Checked after every
//! operation:
//! - exclusion: a writer is granted only while nobody else holds (locally or remotely), a
//!   reader only while no other writer holds; the remote's holders match the model's;
//! - FIFO between modes: a queued waiter is granted only as the model's oldest live waiter
//!   (so once a writer queues, later readers wait behind it);
//! - re-entry: a reader's re-entry and a writer's covered read are granted at once, even
//!   with waiters queued; a reader asking to write is refused (no upgrade);
//! - downgrade: a writer that takes the read its write covers and then releases the write
//!   keeps reading, and the readers at the head of the queue join it;
//! - no wasted round trip: with no other process holding, no attempt comes back busy;
//! - liveness: no waiter stays parked while the lock is free for its mode and it is the head
//!   (unless the remote was freed without a notification and the retry timer has not run);
//! - deadlines, each waiter ending once, and the synchronizer's own invariant walk.
//!
//! At the end everything is released and every waiter must end.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use common::{Manual, new_sync};
use proptest::prelude::*;
use slate_aqs::testing::{self, MemoryGrant, MemoryRemote};
use slate_core::{Error, HolderId, Result, Wait};
use tokio::time::Instant;

const SPIN: Duration = Duration::from_millis(10);

#[derive(Clone, Debug)]
enum Op {
    /// A new waiter with a fresh holder: shared (`true`) or exclusive, with a deadline
    /// `Some(ms)` ahead.
    Enqueue(bool, Option<u64>),
    /// `Wait::Immediate` by a fresh holder, shared or not.
    Immediate(bool),
    /// The n-th local reader re-enters.
    ReenterRead(usize),
    /// The local writer takes the read its write covers.
    CoverRead,
    /// The local writer at depth 1 downgrades: takes the covered read, releases the write.
    Downgrade,
    /// The n-th local reader asks for the write lock (refused).
    Upgrade(usize),
    /// Releases one level: the writer's (`None`, or when there are no readers) or the n-th
    /// reader's.
    Release(Option<usize>),
    /// Drop the n-th live waiter.
    Cancel(usize),
    /// Poll the n-th live waiter although nobody woke it.
    SpuriousPoll(usize),
    /// Another process takes the remote lock, exclusively or shared, if it can.
    External(bool),
    /// Another process releases everything it holds, announcing it (or not).
    ExternalUnlock { notify: bool },
    /// Move the paused clock.
    Advance(u64),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<bool>(), prop::option::weighted(0.3, 1u64..60))
            .prop_map(|(shared, ms)| Op::Enqueue(shared, ms)),
        1 => any::<bool>().prop_map(Op::Immediate),
        1 => any::<usize>().prop_map(Op::ReenterRead),
        1 => Just(Op::CoverRead),
        1 => Just(Op::Downgrade),
        1 => any::<usize>().prop_map(Op::Upgrade),
        6 => prop::option::weighted(0.7, any::<usize>()).prop_map(Op::Release),
        2 => any::<usize>().prop_map(Op::Cancel),
        1 => any::<usize>().prop_map(Op::SpuriousPoll),
        2 => any::<bool>().prop_map(Op::External),
        2 => any::<bool>().prop_map(|notify| Op::ExternalUnlock { notify }),
        3 => (1u64..25).prop_map(Op::Advance),
    ]
}

type Acquire<'a> = Manual<Pin<Box<dyn Future<Output = Result<MemoryGrant>> + 'a>>>;

struct Waiter<'a> {
    id: usize,
    holder: HolderId,
    shared: bool,
    deadline: Option<Instant>,
    fut: Acquire<'a>,
}

#[derive(Debug, Default)]
struct Model {
    writer: Option<(HolderId, u32)>,
    /// Local readers and their depths (the writer itself when it took a covered read).
    readers: Vec<(HolderId, u32)>,
    /// The other process holds exclusively.
    ext_writer: bool,
    /// The other process holds shared.
    ext_reader: bool,
    /// Live queued waiters, oldest first.
    queue: VecDeque<usize>,
    /// The remote was freed without a notification and the head may not know yet.
    stale: bool,
    ended: Vec<Option<&'static str>>,
}

impl Model {
    fn free_for(&self, shared: bool) -> bool {
        self.writer.is_none()
            && !self.ext_writer
            && (shared || (self.readers.is_empty() && !self.ext_reader))
    }
}

struct Harness<'a> {
    sync: &'a common::Sync,
    remote: &'a MemoryRemote,
    rt: &'a tokio::runtime::Runtime,
    outsider: HolderId,
    waiters: Vec<Waiter<'a>>,
    model: Model,
    next_id: usize,
}

fn add(levels: &mut Vec<(HolderId, u32)>, holder: HolderId) {
    match levels.iter_mut().find(|(h, _)| *h == holder) {
        Some((_, d)) => *d += 1,
        None => levels.push((holder, 1)),
    }
}

fn sorted(mut v: Vec<(HolderId, u32)>) -> Vec<(HolderId, u32)> {
    v.sort_by_key(|(h, _)| h.to_string());
    v
}

impl<'a> Harness<'a> {
    fn new_waiter(&mut self, holder: HolderId, shared: bool, wait: Wait) -> (usize, Acquire<'a>) {
        let fut: Pin<Box<dyn Future<Output = Result<MemoryGrant>> + 'a>> = if shared {
            Box::pin(self.sync.acquire_shared(holder, wait))
        } else {
            Box::pin(self.sync.acquire(holder, wait))
        };
        let id = self.next_id;
        self.next_id += 1;
        self.model.ended.push(None);
        (id, Manual::new(fut))
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

    /// Records a completed acquire of a fresh waiter.
    fn completed(
        &mut self,
        w: &Waiter<'_>,
        queued: bool,
        out: Result<MemoryGrant>,
    ) -> std::result::Result<(), String> {
        let id = w.id;
        match out {
            Ok(grant) => {
                if grant.holder != w.holder || grant.shared != w.shared || grant.count != 1 {
                    return Err(format!("waiter {id} got {grant:?}"));
                }
                if queued && self.model.queue.front() != Some(&id) {
                    return Err(format!(
                        "waiter {id} granted out of FIFO order; queue {:?}",
                        self.model.queue
                    ));
                }
                if !self.model.free_for(w.shared) {
                    return Err(format!(
                        "waiter {id} (shared {}) granted while held: {:?}",
                        w.shared, self.model
                    ));
                }
                if w.shared {
                    self.model.readers.push((w.holder, 1));
                } else {
                    self.model.writer = Some((w.holder, 1));
                }
                self.end(id, "granted")?;
            }
            Err(Error::Timeout { .. }) => {
                if w.deadline.is_none_or(|d| Instant::now() < d) {
                    return Err(format!("waiter {id} timed out before its deadline"));
                }
                self.end(id, "timed out")?;
            }
            Err(e) => return Err(format!("waiter {id}: unexpected error {e}")),
        }
        if queued {
            let was_head = self.model.queue.front() == Some(&id);
            self.model.queue.retain(|q| *q != id);
            if was_head {
                self.model.stale = false;
            }
        }
        Ok(())
    }

    fn settle(&mut self) -> std::result::Result<(), String> {
        for _round in 0..10_000 {
            let pos = match self.waiters.iter().position(|w| w.fut.woken()) {
                Some(pos) => pos,
                None => {
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
            self.completed(&w, true, out)?;
        }
        Ok(())
    }

    /// An acquire that must complete within its first poll (re-entry, covered read, upgrade).
    fn at_once(
        &self,
        holder: HolderId,
        shared: bool,
    ) -> std::result::Result<Result<MemoryGrant>, String> {
        let mut fut = if shared {
            Manual::new(Box::pin(self.sync.acquire_shared(holder, Wait::Forever))
                as Pin<Box<dyn Future<Output = Result<MemoryGrant>>>>)
        } else {
            Manual::new(Box::pin(self.sync.acquire(holder, Wait::Forever))
                as Pin<Box<dyn Future<Output = Result<MemoryGrant>>>>)
        };
        match fut.poll() {
            Poll::Ready(out) => Ok(out),
            Poll::Pending => Err(format!("{holder} (shared {shared}) was queued")),
        }
    }

    fn apply(&mut self, op: &Op) -> std::result::Result<(), String> {
        let outsider = self.model.ext_writer || self.model.ext_reader;
        let busy = self.sync.competitor().stats().busy;
        self.step(op)?;
        // Local holders are known without asking: with nobody else holding remotely, no
        // attempt ever comes back busy (a writer waits for the local readers to leave before
        // it asks, a reader for the local writer).
        let outsider = outsider || self.model.ext_writer || self.model.ext_reader;
        if !outsider && self.sync.competitor().stats().busy != busy {
            return Err("an attempt was sent while local holders kept it from winning".to_owned());
        }
        Ok(())
    }

    fn step(&mut self, op: &Op) -> std::result::Result<(), String> {
        match *op {
            Op::Enqueue(shared, ms) => {
                let deadline = ms.map(|ms| Instant::now() + Duration::from_millis(ms));
                let wait = deadline.map_or(Wait::Forever, |d| Wait::Until(d.into_std()));
                let holder = HolderId::new();
                let (id, mut fut) = self.new_waiter(holder, shared, wait);
                let first_in = self.model.queue.is_empty();
                let poll = fut.poll();
                let w = Waiter {
                    id,
                    holder,
                    shared,
                    deadline,
                    fut,
                };
                match poll {
                    Poll::Ready(out) => {
                        if !first_in {
                            return Err(format!("waiter {id} overtook the queue"));
                        }
                        self.completed(&w, false, out)?;
                    }
                    Poll::Pending => {
                        self.model.queue.push_back(id);
                        if first_in {
                            self.model.stale = false;
                        }
                        self.waiters.push(w);
                    }
                }
            }
            Op::Immediate(shared) => {
                let holder = HolderId::new();
                let (id, mut fut) = self.new_waiter(holder, shared, Wait::Immediate);
                let Poll::Ready(out) = fut.poll() else {
                    return Err("an immediate acquire did not complete at once".to_owned());
                };
                // A shared try is busy while anyone waits here (it never passes them).
                let free = self.model.free_for(shared) && (!shared || self.model.queue.is_empty());
                match out {
                    Ok(_) if free => {
                        if shared {
                            self.model.readers.push((holder, 1));
                        } else {
                            self.model.writer = Some((holder, 1));
                        }
                        self.end(id, "granted")?;
                    }
                    Err(e) if e.is_busy() && !free => self.end(id, "busy")?,
                    other => {
                        return Err(format!(
                            "immediate (shared {shared}): {other:?}, free: {free}"
                        ));
                    }
                }
            }
            Op::ReenterRead(n) => {
                let Some(&(reader, depth)) = self.nth_reader(n) else {
                    return Ok(());
                };
                match self.at_once(reader, true)? {
                    Ok(g) if g.shared && g.count == depth + 1 => {
                        add(&mut self.model.readers, reader)
                    }
                    other => return Err(format!("read re-entry of {reader}: {other:?}")),
                }
            }
            Op::CoverRead => {
                let Some((writer, _)) = self.model.writer else {
                    return Ok(());
                };
                match self.at_once(writer, true)? {
                    Ok(g) if g.shared => add(&mut self.model.readers, writer),
                    other => return Err(format!("covered read of {writer}: {other:?}")),
                }
            }
            Op::Downgrade => {
                let Some((writer, 1)) = self.model.writer else {
                    return Ok(());
                };
                match self.at_once(writer, true)? {
                    Ok(g) if g.shared => add(&mut self.model.readers, writer),
                    other => return Err(format!("downgrade of {writer}: {other:?}")),
                }
                testing::release(self.sync, writer).map_err(|e| e.to_string())?;
                self.model.writer = None;
            }
            Op::Upgrade(n) => {
                let Some(&(reader, _)) = self.nth_reader(n) else {
                    return Ok(());
                };
                if self.model.writer.is_some_and(|(w, _)| w == reader) {
                    return Ok(()); // the writer's covered read: a write re-entry, not an upgrade
                }
                match self.at_once(reader, false)? {
                    Err(Error::InvalidInput { .. }) => {}
                    other => return Err(format!("upgrade of {reader}: {other:?}")),
                }
            }
            Op::Release(n) => self.release(n)?,
            Op::Cancel(n) => {
                if !self.waiters.is_empty() {
                    let w = self.waiters.remove(n % self.waiters.len());
                    let was_head = self.model.queue.front() == Some(&w.id);
                    self.model.queue.retain(|q| *q != w.id);
                    if was_head {
                        self.model.stale = false;
                    }
                    self.end(w.id, "cancelled")?;
                }
            }
            Op::SpuriousPoll(n) => {
                if !self.waiters.is_empty() {
                    self.poll_at(n % self.waiters.len())?;
                }
            }
            Op::External(shared) => {
                if self.model.ext_writer || self.model.ext_reader {
                    return Ok(());
                }
                if shared && self.remote.try_acquire_shared(self.outsider).is_some() {
                    self.model.ext_reader = true;
                } else if !shared && self.remote.try_acquire(self.outsider).is_some() {
                    self.model.ext_writer = true;
                }
            }
            Op::ExternalUnlock { notify } => self.external_unlock(notify),
            Op::Advance(ms) => {
                let d = Duration::from_millis(ms);
                self.rt.block_on(tokio::time::advance(d));
                if d >= SPIN {
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

    fn nth_reader(&self, n: usize) -> Option<&(HolderId, u32)> {
        let r = &self.model.readers;
        (!r.is_empty()).then(|| &r[n % r.len()])
    }

    fn external_unlock(&mut self, notify: bool) {
        let (o, r) = (self.outsider, self.remote);
        let released = if self.model.ext_writer {
            Some(if notify {
                r.release(o)
            } else {
                r.release_silently(o)
            })
        } else if self.model.ext_reader {
            Some(if notify {
                r.release_shared(o)
            } else {
                r.release_shared_silently(o)
            })
        } else {
            None
        };
        if let Some(out) = released {
            out.unwrap();
            self.model.ext_writer = false;
            self.model.ext_reader = false;
            self.model.stale |= !notify;
        }
    }

    fn release(&mut self, n: Option<usize>) -> std::result::Result<(), String> {
        match (n, self.model.writer) {
            (Some(n), _) if !self.model.readers.is_empty() => {
                let i = n % self.model.readers.len();
                let (reader, depth) = self.model.readers[i];
                testing::release_shared(self.sync, reader).map_err(|e| e.to_string())?;
                if depth == 1 {
                    self.model.readers.remove(i);
                } else {
                    self.model.readers[i].1 -= 1;
                }
            }
            (_, Some((writer, depth))) => {
                testing::release(self.sync, writer).map_err(|e| e.to_string())?;
                self.model.writer = (depth > 1).then_some((writer, depth - 1));
            }
            _ => {}
        }
        Ok(())
    }

    fn check(&self) -> std::result::Result<(), String> {
        self.sync.check_invariants()?;
        if self.sync.owner() != self.model.writer {
            return Err(format!(
                "owner {:?}, model {:?}",
                self.sync.owner(),
                self.model.writer
            ));
        }
        if sorted(self.sync.shared_holders()) != sorted(self.model.readers.clone()) {
            return Err(format!(
                "shared holders {:?}, model {:?}",
                self.sync.shared_holders(),
                self.model.readers
            ));
        }
        if self.sync.waiters() != self.model.queue.len() {
            return Err(format!(
                "{} waiters, model {:?}",
                self.sync.waiters(),
                self.model.queue
            ));
        }
        let writer = if self.model.ext_writer {
            Some((self.outsider, 1))
        } else {
            self.model.writer
        };
        if self.remote.holder() != writer {
            return Err(format!(
                "remote writer {:?}, expected {writer:?}",
                self.remote.holder()
            ));
        }
        let mut readers = self.model.readers.clone();
        if self.model.ext_reader {
            readers.push((self.outsider, 1));
        }
        if sorted(self.remote.shared_holders()) != sorted(readers.clone()) {
            return Err(format!(
                "remote readers {:?}, expected {readers:?}",
                self.remote.shared_holders()
            ));
        }
        if let Some(head) = self.model.queue.front()
            && !self.model.stale
        {
            let shared = self
                .waiters
                .iter()
                .find(|w| w.id == *head)
                .map(|w| w.shared);
            if shared.is_some_and(|s| self.model.free_for(s)) {
                return Err(format!(
                    "the lock is free for the head {head} (shared {shared:?}) and it stays parked"
                ));
            }
        }
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

    fn drain(&mut self) -> std::result::Result<(), String> {
        for _ in 0..1_000 {
            while self.model.writer.is_some() || !self.model.readers.is_empty() {
                self.release(Some(0))?;
                self.settle()?;
                self.check()?;
            }
            self.external_unlock(true);
            self.settle()?;
            self.check()?;
            self.rt.block_on(tokio::time::advance(SPIN));
            self.model.stale = false;
            self.settle()?;
            self.check()?;
            let idle = self.model.writer.is_none() && self.model.readers.is_empty();
            if self.waiters.is_empty() && idle {
                break;
            }
        }
        if !self.waiters.is_empty() {
            return Err(format!("{} waiters never ended", self.waiters.len()));
        }
        if let Some(id) = self.model.ended.iter().position(Option::is_none) {
            return Err(format!("waiter {id} never ended"));
        }
        if self.sync.waiters() != 0
            || self.remote.holder().is_some()
            || !self.remote.shared_holders().is_empty()
        {
            return Err("not clean after the drain".to_owned());
        }
        Ok(())
    }
}

fn harness<'a>(
    sync: &'a common::Sync,
    remote: &'a MemoryRemote,
    rt: &'a tokio::runtime::Runtime,
) -> Harness<'a> {
    Harness {
        sync,
        remote,
        rt,
        outsider: HolderId::new(),
        waiters: Vec::new(),
        model: Model::default(),
        next_id: 0,
    }
}

fn paused() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

fn run(ops: &[Op]) -> std::result::Result<(), String> {
    let rt = paused();
    let _enter = rt.enter();
    let (remote, sync) = new_sync(SPIN);
    testing::subscribe(&sync);
    let mut h = harness(&sync, &remote, &rt);
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
    fn shared_mode_behaves_like_its_model(ops in prop::collection::vec(op_strategy(), 1..60)) {
        let what = format!("{ops:?}");
        let outcome = common::with_watchdog_or_exit(Duration::from_secs(20), what, move || run(&ops));
        prop_assert_eq!(outcome, Ok(()));
    }
}

#[test]
fn readers_at_the_head_are_admitted_together_and_a_queued_writer_holds_later_readers_back() {
    let rt = paused();
    let _enter = rt.enter();
    let (remote, sync) = new_sync(SPIN);
    testing::subscribe(&sync);
    let mut h = harness(&sync, &remote, &rt);
    h.apply(&Op::Enqueue(false, None)).unwrap(); // a writer holds
    for shared in [true, true, false, true] {
        h.apply(&Op::Enqueue(shared, None)).unwrap(); // r1 r2 w r3 queue
    }
    assert_eq!(sync.waiters(), 4);
    h.apply(&Op::Release(None)).unwrap();
    // Both readers at the head got in; the writer waits for them, and r3 behind the writer.
    assert_eq!(sync.shared_holders().len(), 2);
    assert_eq!(sync.waiters(), 2);
    h.apply(&Op::Release(Some(0))).unwrap();
    h.apply(&Op::Release(Some(0))).unwrap();
    assert!(
        sync.owner().is_some(),
        "the writer got in after the readers"
    );
    assert_eq!(sync.waiters(), 1);
    h.drain().unwrap();
}

#[test]
fn the_model_catches_a_reader_left_parked_behind_a_granted_reader() {
    // The checker must be able to fail: the wake-up that admits the second reader is
    // swallowed (its flag cleared by hand), and it stays parked while readers may enter.
    let rt = paused();
    let _enter = rt.enter();
    let (remote, sync) = new_sync(SPIN);
    testing::subscribe(&sync);
    let mut h = harness(&sync, &remote, &rt);
    h.apply(&Op::Enqueue(false, None)).unwrap();
    h.apply(&Op::Enqueue(true, None)).unwrap();
    h.apply(&Op::Enqueue(true, None)).unwrap();
    testing::release(&sync, h.model.writer.unwrap().0).unwrap();
    h.model.writer = None;
    assert!(h.waiters[0].fut.woken(), "the release woke the head");
    h.poll_at(0).unwrap(); // the first reader is granted and wakes the second
    assert!(h.waiters[0].fut.woken(), "the grant woke the next reader");
    let err = h.check().unwrap_err();
    assert!(err.contains("stays parked"), "{err}");
}
