//! The synchronizer: a local FIFO in front of a remote lock.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use slate_core::metrics::{How, Meter};
use slate_core::mutant::{self, Mutant};
use slate_core::{Error, HolderId, LossReason, Result, TimeoutKind, Wait};

use crate::competitor::{Attempt, Competitor, Notifications};
use crate::deadlines::{Drained, Timers};
use crate::in_flight::InFlight;
use crate::queue::Queue;
use crate::sync::{Mutex, MutexGuard};
use crate::timer::{ThreadTimer, Timer, TokioTimer};

mod driver;
mod grants;

/// The shortest time a head parks after a busy answer when no notification arrives: a
/// backend that answers "busy, retry in 0 s" forever must not turn the head into a busy loop
/// (Bedrock's M3).
pub const MIN_RETRY_DELAY: Duration = Duration::from_millis(1);

/// The local queued synchronizer of one distributed lock.
///
/// Inside one process, callers that want the lock queue up in FIFO order and park; only the
/// **head** of the queue, and only while **no local holder** has the lock, runs remote
/// attempts through the [`Competitor`]. Everybody else sleeps. Backends wrap one
/// synchronizer per lock in an `Arc` and call [`acquire`](Synchronizer::acquire) /
/// [`release`](Synchronizer::release) around their remote calls.
///
/// ## Behaviour
///
/// - **Fast path.** No local owner and an empty queue: the caller attempts at once.
/// - **Re-entry.** A caller whose holder is the local owner attempts at once without queueing
///   (the backend raises its remote count); the local depth goes up by one.
/// - **Queue.** Otherwise the caller joins the tail. The head attempts; on *busy* it calls
///   [`Competitor::prepare_wait`] and parks until the first of: a local release, a
///   [`notify_released`](Synchronizer::notify_released), the retry timer
///   `min(spin_wait, retry_after)` (at least [`MIN_RETRY_DELAY`]; `min(cap, retry_after)`
///   while notifications are live and the competitor trusts them with a
///   [`live_park_cap`](Competitor::live_park_cap)), its deadline, or its
///   cancellation. A release notification that arrives while the head's attempt is in
///   flight makes it retry at once instead of parking (the *epoch* below).
/// - **Timed waits** queue like everyone else (Bedrock's timed `tryLock` gave up at once
///   when others were waiting, C4) and time out at their deadline with
///   [`Error::Timeout`]. An attempt in flight at the deadline is not interrupted: a grant
///   that comes back is returned, slightly late. Queued async waiters leave their deadlines
///   to the synchronizer's **shared deadline timer** (a heap of deadlines in the queue and
///   one tokio task, running while such waiters are queued, that wakes each at its deadline),
///   so a timed waiter carries no `Sleep` of its own: 256 bytes parked, deadline included.
///   A task dropped with its runtime is restarted by the next timed waiter to park. Blocking
///   callers park their thread with the deadline instead.
/// - **[`Wait::Immediate`]** never queues: busy at once if another local holder holds the
///   lock, otherwise exactly one attempt, which **may barge ahead of the queue**.
/// - **Hooks** ([`Competitor::after_acquire`], [`after_release`](Competitor::after_release),
///   [`queue_drained`](Competitor::queue_drained), [`abandon`](Competitor::abandon)) are never
///   called while the internal mutex is held.
/// - **Cancel safety.** Dropping an acquire future at any await point unlinks its waiter; if
///   it was the head, the next waiter is woken to take its turn. An attempt in flight is
///   finished in the background and any grant goes to [`Competitor::abandon`].
/// - **Local passes (lock cohorting).** A holder that acquired through
///   [`acquire_passable`](Synchronizer::acquire_passable) may, at its last release, hand its
///   remote hold to a passable head without any remote call ([`try_pass`](Synchronizer::try_pass)),
///   up to the competitor's [`pass_budget`](Competitor::pass_budget) per remote hold; then a
///   real remote release lets other processes in.
/// - Bedrock's `destroy()` is `Drop`: dropping the synchronizer drops the competitor (once no
///   abandoned attempt still runs).
///
/// ## State and invariants
///
/// The state is one mutex-protected record: `owner: Option<(holder, depth, remote holder,
/// passes left)>` (the exclusive owner), `readers: [(holder, depth)]` (the shared holders, see
/// [`acquire_shared`](Synchronizer::acquire_shared)), the FIFO `queue`, and a notification
/// `epoch`.
///
/// | state | invariant |
/// | --- | --- |
/// | `owner = Some((h, d))` | `d ≥ 1`. No queued waiter starts an attempt, except a head whose holder is `h` (re-entry). Remote calls for the hold name its remote holder (`h`, or the holder that acquired it before passing it on). |
/// | owner passing (`h` unknown) | right after a pass: `d = 1`, and the head (only the head) is marked *passed*; it becomes the owner when it runs. Nobody else attempts; `Wait::Immediate` is busy |
/// | `readers` non-empty | every depth `≥ 1`, each holder once; beside an exclusive owner only the owner itself (the read its write covers), and none while a hold is being passed. No exclusive waiter attempts (except the owner's re-entry); shared waiters do while no exclusive owner holds |
/// | shared head granted | it leaves the queue **waking the next head**, so consecutive shared waiters at the head are admitted one after the other; a queued exclusive waiter stops the run (FIFO between modes) |
/// | `owner = None`, queue empty | idle: the next caller takes the fast path |
/// | `owner = None`, queue non-empty | the head is attempting, preparing to park, or parked with a retry timer; it was woken after the last event that freed the lock locally |
/// | head | changes only when the head's own future unlinks itself (grant, timeout, error, drop); on any exit but a grant the new head is woken |
/// | attempt in flight (`in_flight`) | only the head's node carries it: at most one queued attempt at a time |
/// | `epoch` | bumped by every local release to depth 0 (exclusive or shared) and every `notify_released`; a parked head waits for it to differ from the value it read before its last attempt |
/// | waker | a parked waiter stores its waker in the same critical section in which it found its condition false, so a later event cannot miss it |
/// | deadline heap | holds exactly the queued async waiters with a deadline that has not fired; a waiter parks only after making sure the timer task runs and is armed at or before the earliest deadline; a fired deadline is marked on the waiter, whose next decision is a timeout (unless it was passed the hold) |
///
/// The O(1) invariants are `debug_assert!`ed at every transition; with the `test-util`
/// feature, `check_invariants` walks the whole queue.
///
/// ## Cancel paths
///
/// An acquire future has three await points; dropping it at any of them is handled so:
///
/// | dropped while | what happens |
/// | --- | --- |
/// | an attempt is in flight (fast path, re-entry, immediate, or as head) | the boxed attempt moves to a background task (the dropping thread's tokio runtime, else the runtime captured at `new`, else a new thread) that finishes it; a grant goes to [`Competitor::abandon`], exactly once. If queued, the waiter is unlinked and the next one woken. The next head may attempt while the abandoned attempt is still out: at most one of them wins remotely. |
/// | in [`Competitor::prepare_wait`] | that future is dropped (it must be cancel safe); the waiter, the head, is unlinked and the next one woken |
/// | parked as head (woken or not) | unlinked under the lock; the next waiter is woken, so a wake-up this head received but never acted on is passed on |
/// | parked behind the head | unlinked under the lock in O(1); nobody else's state changes |
/// | passed the hold, before it ran | unlinked under the lock; the hold is passed on to the next waiter if it is passable, else the lock is freed locally, [`Competitor::drop_pass`] releases it remotely, and the next waiter is woken |
///
/// A runtime that is shutting down drops the background task with the attempt; a grant the
/// backend made for it then lapses with its lease. When the queue becomes empty by any of
/// these exits, [`Competitor::queue_drained`] runs; it runs too when an attempt finished in
/// the background ends busy or failed, and when a caller that attempted without queueing (the
/// fast path) ends without a grant while nobody is queued, since its attempt may have left the
/// process a place in the backend's queue.
///
/// # Examples
///
/// ```
/// use slate_aqs::Synchronizer;
/// use slate_aqs::testing::{MemoryCompetitor, MemoryRemote};
/// use slate_aqs::{HolderId, Wait};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> slate_aqs::Result<()> {
/// let remote = MemoryRemote::new();
/// let sync = Synchronizer::new("orders", MemoryCompetitor::new(remote.clone()), Duration::from_millis(50));
/// let me = HolderId::new();
/// let grant = sync.acquire(me, Wait::Forever).await?;
/// assert_eq!(sync.owner(), Some((me, 1)));
/// // A backend releases remotely first, then locally:
/// remote.release(grant.holder)?;
/// sync.release(me);
/// assert_eq!(sync.owner(), None);
/// # Ok(())
/// # }
/// ```
pub struct Synchronizer<C: Competitor> {
    label: Arc<str>,
    competitor: Arc<C>,
    spin_wait: Duration,
    /// The runtime current at `new()`, if any: where abandoned attempts run when the
    /// dropping thread has no runtime, and the context blocking callers enter.
    handle: Option<tokio::runtime::Handle>,
    /// Shared with the deadline timer's task (see `deadlines`).
    state: Arc<Mutex<State>>,
    /// Where acquisitions, attempts and the queue are counted (`slate_core::metrics`).
    meter: Meter,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    owner: Option<Owner>,
    /// The local shared holders (see [`Readers`]).
    readers: Readers,
    pub(crate) queue: Queue,
    epoch: u64,
    pub(crate) timers: Timers,
}

/// The local owner of the lock.
#[derive(Clone, Copy, Debug)]
struct Owner {
    /// The local holder; `None` while the hold is being passed to the head of the queue
    /// (whose node is `passed`), until that waiter takes it.
    holder: Option<HolderId>,
    /// Local levels (at least 1).
    depth: u32,
    /// The holder whose remote hold this is: `holder` itself, unless the hold came by a pass.
    remote: HolderId,
    /// Local passes this remote hold may still serve.
    passes_left: u32,
}

impl Owner {
    fn is(&self, holder: HolderId) -> bool {
        self.holder == Some(holder)
    }
}

/// The local holders of the lock in shared mode and their local depths. A handful at a time
/// (the tasks of one process that read at once): a `Vec` scanned linearly beats a map.
#[derive(Debug, Default)]
struct Readers(Vec<(HolderId, u32)>);

impl Readers {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn depth(&self, holder: HolderId) -> u32 {
        self.0
            .iter()
            .find(|(h, _)| *h == holder)
            .map_or(0, |(_, d)| *d)
    }

    /// One more level for `holder`: its new depth, `None` if it would overflow.
    fn add(&mut self, holder: HolderId) -> Option<u32> {
        match self.0.iter_mut().find(|(h, _)| *h == holder) {
            Some((_, d)) => {
                *d = d.checked_add(1)?;
                Some(*d)
            }
            None => {
                self.0.push((holder, 1));
                Some(1)
            }
        }
    }

    /// One level less for `holder`: the levels it still holds, `None` if it holds none.
    fn release(&mut self, holder: HolderId) -> Option<u32> {
        let pos = self.0.iter().position(|(h, _)| *h == holder)?;
        let depth = &mut self.0[pos].1;
        *depth -= 1;
        let left = *depth;
        if left == 0 {
            self.0.swap_remove(pos);
        }
        Some(left)
    }

    fn take_all(&mut self) -> Vec<(HolderId, u32)> {
        std::mem::take(&mut self.0)
    }
}

impl State {
    fn bump_epoch(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
    }

    /// Whether no local holder keeps a waiter of this mode from attempting: no exclusive
    /// owner, and for an exclusive waiter no shared holder either.
    fn locally_free(&self, shared: bool) -> bool {
        self.owner.is_none() && (shared || self.readers.is_empty())
    }

    /// Unlinks `key` from the queue: whether it was the head, and the shared timer's tasks to
    /// wake if this took the last deadline off the heap (so they finish now rather than
    /// at their next deadlines).
    fn unlink(&mut self, key: usize) -> (bool, Drained) {
        let timed = self.queue.on_timer(key);
        let was_head = self.queue.remove(key);
        let timer = if timed && self.queue.no_deadlines() {
            self.timers.drained()
        } else {
            Drained::default()
        };
        (was_head, timer)
    }

    /// The O(1) invariants of the table on [`Synchronizer`], checked after each transition
    /// in debug builds (the queue checks its own links as it changes them).
    fn debug_check(&self) {
        debug_assert!(
            self.owner.is_none_or(|o| o.depth >= 1),
            "an owner holds at least one level"
        );
        debug_assert!(
            self.owner
                .is_none_or(|o| o.holder.is_some() || o.depth == 1),
            "a hold is passed at one level"
        );
        debug_assert!(
            self.owner
                .is_none_or(|o| self.readers.0.iter().all(|(h, _)| o.is(*h))),
            "beside an exclusive owner, only the owner itself holds shared (the read its write covers)"
        );
    }
}

/// The holder an acquisition for `holder` (or the current one) runs as, and how: a named or
/// scoped holder as itself, else a fresh passable one.
fn current(holder: Option<HolderId>) -> (HolderId, Mode) {
    match holder.or_else(HolderId::scoped) {
        Some(h) => (h, Mode::Exclusive),
        None => (HolderId::new(), Mode::Passable),
    }
}

/// How an acquisition takes the lock (the three ways `run` is driven).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Exclusive, as the caller's holder.
    Exclusive,
    /// Exclusive, and the hold may be passed on (lock cohorting, `acquire_passable`).
    Passable,
    /// Shared (`acquire_shared`).
    Shared,
}

/// The remote holder of an attempt for `holder` that is not a re-entry: `holder` itself, or
/// for a passable waiter a fresh holder minted for the hold, which no caller ever sees, so
/// that nobody (in this process or another) can name the hold once it is passed on.
fn remote_for(holder: HolderId, passable: bool) -> HolderId {
    if passable { HolderId::new() } else { holder }
}

/// What the caller of one acquire asked for.
#[derive(Clone, Copy, Debug)]
struct Entry {
    holder: HolderId,
    deadline: Option<Instant>,
    immediate: bool,
    passable: bool,
    /// Shared mode (`acquire_shared`).
    shared: bool,
    /// A queued waiter leaves its deadline to the shared timer (`Timer::SHARED`).
    shared_timer: bool,
}

/// What a parked waiter waits for (besides its timer).
#[derive(Clone, Copy, Debug)]
enum Cond {
    /// To become the head.
    Head,
    /// The local holders that keep a waiter of this mode (`shared` or not) from attempting
    /// to release.
    Free { shared: bool },
    /// The epoch to move on from this value.
    Epoch(u64),
}

/// Where the head is in its retry cycle.
#[derive(Clone, Copy, Debug)]
enum Retry {
    /// Attempt as soon as it is head and the lock is free locally.
    Now,
    /// The attempt sent at `epoch` was busy; prepare the wait.
    AfterBusy {
        epoch: u64,
        retry_after: Option<Duration>,
    },
    /// Parked: attempt when the epoch moves or at `at` (`None`: the delay overflowed the
    /// clock, so only a notification or the deadline ends the wait).
    Parked { epoch: u64, at: Option<Instant> },
}

/// The decision taken under the lock at the top of each round.
#[derive(Debug)]
enum Step {
    /// `Wait::Immediate` and another local holder holds the lock: busy, no remote call.
    LocallyBusy,
    /// An exclusive acquire by a holder that holds the lock shared: refused (an upgrade
    /// would deadlock against another reader doing the same).
    Upgrade,
    /// The deadline passed.
    Timeout,
    /// Run one remote attempt (the epoch read before sending it; whether it is a re-entry;
    /// the remote holder it names: the caller, the owner's remote holder for a re-entry, or a
    /// fresh one for a passable hold; whether the hold it starts may be passed).
    Attempt {
        epoch: u64,
        reentrant: bool,
        remote: HolderId,
        passable: bool,
    },
    /// The caller, head of the queue, was passed the remote hold of `remote`: take it.
    TakePass { remote: HolderId },
    /// A busy answer came back: let the competitor switch notifications on.
    PrepareWait {
        epoch: u64,
        retry_after: Option<Duration>,
    },
    /// Park the queued waiter `key` until `cond` or `until` (or, when `on_timer`, its
    /// deadline on the shared timer).
    Park {
        key: usize,
        cond: Cond,
        until: Option<Instant>,
        on_timer: bool,
    },
}

impl<C: Competitor> Synchronizer<C> {
    /// Creates a synchronizer for the lock printed as `label`, driving `competitor`.
    ///
    /// `spin_wait` is the longest a parked head waits without a notification before it
    /// retries. If a tokio runtime is current, its handle is kept: abandoned attempts run on it
    /// when they are dropped outside any runtime, and blocking callers enter it so that the
    /// competitor's futures find their reactor (that runtime must then be multi-threaded, or
    /// driven by another thread, while a blocking caller waits).
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_aqs::Synchronizer;
    /// use slate_aqs::testing::{MemoryCompetitor, MemoryRemote};
    /// use std::time::Duration;
    ///
    /// let sync = Synchronizer::new("orders", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// assert_eq!(sync.label(), "orders");
    /// ```
    pub fn new(label: impl Into<Arc<str>>, competitor: C, spin_wait: Duration) -> Self {
        Synchronizer {
            label: label.into(),
            competitor: Arc::new(competitor),
            spin_wait,
            handle: current_handle(),
            state: Arc::new(Mutex::new(State::default())),
            meter: Meter::custom(),
        }
    }

    /// Counts this lock's acquisitions, attempts, waits and queue on `meter` (by default
    /// [`Meter::custom`]); see `slate_core::metrics`.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_aqs::Synchronizer;
    /// use slate_aqs::testing::{MemoryCompetitor, MemoryRemote};
    /// use slate_aqs::metrics::Meter;
    /// use std::time::Duration;
    ///
    /// let name = slate_aqs::LockName::new("orders").unwrap();
    /// let sync = Synchronizer::new("orders", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50))
    ///     .with_meter(Meter::for_lock("lock", "memory", &name));
    /// ```
    #[must_use]
    pub fn with_meter(mut self, meter: Meter) -> Self {
        self.meter = meter;
        self
    }

    /// The meter this lock counts on (see [`with_meter`](Synchronizer::with_meter)).
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use std::time::Duration;
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// sync.meter().busy();
    /// ```
    #[must_use]
    pub fn meter(&self) -> &Meter {
        &self.meter
    }

    /// [`State::unlink`], counted off the waiters gauge.
    fn unlink(&self, st: &mut State, key: usize) -> (bool, Drained) {
        self.meter.queued(false);
        st.unlink(key)
    }

    /// The competitor this synchronizer drives.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use std::time::Duration;
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// assert_eq!(sync.competitor().stats().attempts, 0);
    /// ```
    pub fn competitor(&self) -> &C {
        &self.competitor
    }

    /// The longest a queue head waits for a release message before it tries again (the spin
    /// wait it was built with).
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use std::time::Duration;
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// assert_eq!(sync.spin_wait(), Duration::from_millis(50));
    /// ```
    #[must_use]
    pub fn spin_wait(&self) -> Duration {
        self.spin_wait
    }

    /// The printable lock name used in errors and tracing.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use std::time::Duration;
    /// let sync = Synchronizer::new("orders", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// assert_eq!(sync.label(), "orders");
    /// ```
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Acquires the lock for `holder`, waiting as `wait` allows, and returns the competitor's
    /// grant.
    ///
    /// - No local owner and nobody queued: one attempt at once (fast path).
    /// - `holder` is the local owner: one attempt at once, never queued (re-entry); on success
    ///   the local depth goes up by one.
    /// - [`Wait::Immediate`]: [`Error::Busy`] without a remote call if another local holder
    ///   holds the lock; otherwise exactly one attempt, which may barge ahead of queued
    ///   waiters.
    /// - Otherwise the caller queues in FIFO order; see the type's docs for how the head waits.
    ///
    /// [`Competitor::after_acquire`] has run when this returns `Ok`.
    ///
    /// This is an `async fn` in all but syntax: it returns the future of an `async move` block
    /// so that the future stores its arguments once (an `async fn` stores them twice,
    /// rust-lang/rust#62958); a parked waiter costs its future plus a 40-byte queue slot.
    /// The future is `Send` and `Sync`.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use slate_aqs::{HolderId, Wait};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> slate_aqs::Result<()> {
    /// let remote = MemoryRemote::new();
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(remote.clone()), Duration::from_millis(50));
    /// let (a, b) = (HolderId::new(), HolderId::new());
    /// sync.acquire(a, Wait::Forever).await?;
    /// sync.acquire(a, Wait::Forever).await?; // re-entry
    /// assert_eq!(sync.owner(), Some((a, 2)));
    /// let err = sync.acquire(b, Wait::Immediate).await.unwrap_err();
    /// assert!(err.is_busy());
    /// let err = sync.acquire(b, Wait::for_duration(Duration::from_millis(10))).await.unwrap_err();
    /// assert!(err.is_timeout());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// - [`Error::Busy`] under [`Wait::Immediate`] when another holder has the lock (locally:
    ///   `retry_after` is `None`; remotely: the backend's remaining lease).
    /// - [`Error::Timeout`] with [`TimeoutKind::Wait`] when the deadline of [`Wait::Until`]
    ///   passes first.
    /// - [`Error::LeaseLost`] when a re-entrant attempt (with a waiting `wait`) finds the lock
    ///   held by someone else: the local hold no longer exists remotely.
    /// - [`Error::InvalidInput`] if the local re-entry depth would overflow `u32`.
    /// - Whatever the competitor's attempt returns; the caller's waiter leaves the queue and
    ///   the next one takes its turn.
    ///
    /// # Panics
    ///
    /// When it has to wait with a timer (a deadline, or the retry timer after a busy answer)
    /// outside a tokio runtime with time enabled, as every tokio timer does. Thread callers use
    /// [`blocking_acquire`](Synchronizer::blocking_acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. Dropping the future at any await point removes the caller from the queue;
    /// if it was the head (including a head that was just woken and had not run yet), the next
    /// waiter is woken in its place. An attempt in flight is finished by a background task
    /// (the current tokio runtime, else the one captured by [`new`](Synchronizer::new), else a
    /// new thread), and a grant it obtains goes to [`Competitor::abandon`]: never leaked.
    pub fn acquire(
        &self,
        holder: HolderId,
        wait: Wait,
    ) -> impl Future<Output = Result<C::Grant>> + '_ {
        self.run(holder, wait, Mode::Exclusive, TokioTimer)
    }

    /// As [`acquire`](Synchronizer::acquire), for a caller that may share a remote hold with
    /// other local callers in a row (lock cohorting): while it waits in the queue, a local
    /// holder that releases its last level may **pass** it the remote hold without a remote
    /// call (see [`try_pass`](Synchronizer::try_pass)); and when it wins a remote hold from
    /// the queue (others waited with it), that hold may be passed on in turn, within the
    /// competitor's [`pass_budget`](Competitor::pass_budget).
    ///
    /// Such a hold is acquired under a **fresh remote holder** minted for it
    /// ([`remote_holder`](Synchronizer::remote_holder) tells which), never under `holder`:
    /// nobody, in this process or another, can name the hold once it is passed on, so naming
    /// `holder` elsewhere never enters a hold that someone else now has. A caller that
    /// attempts with nobody queued behind it (the fast path, or a lone waiter) acquires as
    /// itself, as `acquire` does, without passes. The grant of a pass comes from
    /// [`Competitor::take_pass`].
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_aqs::testing::{MemoryCompetitor, MemoryRemote};
    /// use slate_aqs::{HolderId, Synchronizer, Wait};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> slate_aqs::Result<()> {
    /// let remote = MemoryRemote::new();
    /// let competitor = MemoryCompetitor::new(remote.clone());
    /// competitor.set_pass_budget(4);
    /// let sync = std::sync::Arc::new(Synchronizer::new("a", competitor, Duration::from_millis(50)));
    /// let spawn = |holder| {
    ///     let sync = sync.clone();
    ///     tokio::spawn(async move { sync.acquire_passable(holder, Wait::Forever).await })
    /// };
    /// let queued = |n| {
    ///     let sync = sync.clone();
    ///     async move {
    ///         while sync.waiters() < n {
    ///             tokio::task::yield_now().await;
    ///         }
    ///     }
    /// };
    /// let (x, a, b) = (HolderId::new(), HolderId::new(), HolderId::new());
    /// sync.acquire(x, Wait::Forever).await?;
    /// let (for_a, for_b) = (spawn(a), spawn(b));
    /// queued(2).await;
    /// slate_aqs::testing::release(&sync, x)?; // x acquired alone: a real release
    /// for_a.await.unwrap()?; // a won a hold from the queue, under a fresh remote holder
    /// let hold = sync.remote_holder(a);
    /// assert_ne!(hold, a);
    /// assert!(sync.try_pass(a)); // a's last level goes to b, nothing remote happens
    /// let grant = for_b.await.unwrap()?;
    /// assert!(grant.passed);
    /// assert_eq!(sync.owner(), Some((b, 1)));
    /// assert_eq!(sync.remote_holder(b), hold);
    /// assert_eq!(remote.holder(), Some((hold, 1)));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Synchronizer::acquire).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Synchronizer::acquire); in addition, a waiter dropped after it was
    /// passed the hold and before it took it passes the hold on to the next waiter if that
    /// one is passable, and otherwise gives it to [`Competitor::drop_pass`]: never leaked.
    pub fn acquire_passable(
        &self,
        holder: HolderId,
        wait: Wait,
    ) -> impl Future<Output = Result<C::Grant>> + '_ {
        self.run(holder, wait, Mode::Passable, TokioTimer)
    }

    /// Acquires for `holder`, or, when it is `None`, for the current holder: the scope's
    /// ([`HolderId::scoped`]), else a fresh holder that nobody else can name, which may then
    /// be passed the hold by a local release and pass it on in turn
    /// ([`acquire_passable`](Synchronizer::acquire_passable)). Answers the holder at once (for
    /// the caller's logs) with the acquisition: what every lock's `lock()` and
    /// `lock_as(holder)` do.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_aqs::testing::{MemoryCompetitor, MemoryRemote};
    /// use slate_aqs::{HolderId, Synchronizer, Wait};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> slate_aqs::Result<()> {
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// let (holder, acquisition) = sync.acquire_current(None, Wait::Forever);
    /// acquisition.await?;
    /// assert_eq!(sync.owner(), Some((holder, 1)));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Synchronizer::acquire).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_passable`](Synchronizer::acquire_passable).
    pub fn acquire_current(
        &self,
        holder: Option<HolderId>,
        wait: Wait,
    ) -> (HolderId, impl Future<Output = Result<C::Grant>> + '_) {
        let (holder, mode) = current(holder);
        (holder, self.run(holder, wait, mode, TokioTimer))
    }

    /// The blocking twin of [`acquire_current`](Synchronizer::acquire_current).
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use slate_aqs::{HolderId, Wait};
    /// # use std::time::Duration;
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// let me = HolderId::new();
    /// let (holder, _grant) = sync.blocking_acquire_current(Some(me), Wait::Forever)?;
    /// assert_eq!(holder, me);
    /// # Ok::<(), slate_aqs::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Synchronizer::acquire).
    ///
    /// # Panics
    ///
    /// As [`blocking_acquire`](Synchronizer::blocking_acquire).
    pub fn blocking_acquire_current(
        &self,
        holder: Option<HolderId>,
        wait: Wait,
    ) -> Result<(HolderId, C::Grant)> {
        let (holder, mode) = current(holder);
        Ok((holder, self.blocking_run(holder, wait, mode)?))
    }

    /// [`acquire_current`](Synchronizer::acquire_current), then `guard(holder, &grant)`: the
    /// acquisition every lock's `lock()` makes, ending in the lock's guard.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use slate_aqs::{HolderId, Wait};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_aqs::Result<()> {
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// let me = HolderId::new();
    /// let (_, acquired) = sync.acquire_current_with(Some(me), Wait::Forever, |h, _| h);
    /// assert_eq!(acquired.await?, me);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Synchronizer::acquire).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_passable`](Synchronizer::acquire_passable).
    pub fn acquire_current_with<'a, G>(
        &'a self,
        holder: Option<HolderId>,
        wait: Wait,
        guard: impl FnOnce(HolderId, &C::Grant) -> G + 'a,
    ) -> (HolderId, impl Future<Output = Result<G>> + 'a) {
        let (holder, acquisition) = self.acquire_current(holder, wait);
        (
            holder,
            async move { Ok(guard(holder, &acquisition.await?)) },
        )
    }

    /// The blocking twin of [`acquire_current_with`](Synchronizer::acquire_current_with), for
    /// threads: refuses to run inside a tokio runtime (`what` names the caller's method in
    /// the panic message, see [`slate_core::blocking::assert_outside_runtime`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use slate_aqs::{HolderId, Wait};
    /// # use std::time::Duration;
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// let me = HolderId::new();
    /// let holder = sync.blocking_acquire_current_with(Some(me), Wait::Forever, "Lock::blocking_lock", |h, _| h)?;
    /// assert_eq!(holder, me);
    /// # Ok::<(), slate_aqs::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Synchronizer::acquire).
    ///
    /// # Panics
    ///
    /// Inside a tokio runtime.
    pub fn blocking_acquire_current_with<G>(
        &self,
        holder: Option<HolderId>,
        wait: Wait,
        what: &str,
        guard: impl FnOnce(HolderId, &C::Grant) -> G,
    ) -> Result<G> {
        slate_core::blocking::assert_outside_runtime(what);
        let (holder, grant) = self.blocking_acquire_current(holder, wait)?;
        Ok(guard(holder, &grant))
    }

    /// Acquires the lock for `holder` in **shared** mode (a read lock, permits of a
    /// semaphore), waiting as `wait` allows, and returns the competitor's grant (from
    /// [`Competitor::attempt_shared`]).
    ///
    /// Shared holders of one process hold at once; exclusive and shared waiters queue in one
    /// FIFO:
    ///
    /// - **Fast path.** No local exclusive owner and an empty queue: one attempt at once,
    ///   beside any local shared holders.
    /// - **Re-entry.** `holder` already holds shared, or is the exclusive owner (a writer
    ///   taking the read lock its write lock covers): one attempt at once through
    ///   [`Competitor::reenter_shared`], never queued; its shared depth goes up by one.
    /// - **Queue.** Otherwise the caller queues behind everyone already waiting: once an
    ///   exclusive waiter is queued, later shared callers wait behind it, so a writer is
    ///   never starved by a stream of readers. A shared head attempts while no exclusive
    ///   owner holds locally; when it is granted it wakes the next head at once, so the
    ///   shared waiters at the head of the queue are admitted one after the other without
    ///   waiting for a release (Java's `setHeadAndPropagate`), up to the first exclusive one.
    /// - [`Wait::Immediate`]: [`Error::Busy`] without a remote call if a local exclusive
    ///   owner holds the lock; otherwise exactly one attempt.
    ///
    /// An exclusive [`acquire`](Synchronizer::acquire) by a holder that holds shared is
    /// refused ([`Error::InvalidInput`]): an upgrade would deadlock against a second reader
    /// upgrading. Take the exclusive mode first, then the shared mode it covers, and release
    /// the exclusive level to **downgrade** without a gap.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_aqs::testing::{MemoryCompetitor, MemoryRemote};
    /// use slate_aqs::{HolderId, Synchronizer, Wait};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> slate_aqs::Result<()> {
    /// let remote = MemoryRemote::new();
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(remote.clone()), Duration::from_millis(50));
    /// let (r1, r2, w) = (HolderId::new(), HolderId::new(), HolderId::new());
    /// sync.acquire_shared(r1, Wait::Forever).await?;
    /// sync.acquire_shared(r2, Wait::Forever).await?; // readers share
    /// assert_eq!(sync.shared_holders().len(), 2);
    /// let err = sync.acquire(w, Wait::Immediate).await.unwrap_err();
    /// assert!(err.is_busy()); // a writer waits for both
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Synchronizer::acquire); [`Error::InvalidInput`] from a competitor
    /// without a shared mode, or if `holder`'s shared depth would overflow `u32`.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Synchronizer::acquire): dropping the future removes the caller from the
    /// queue (waking the next head if it was the head), and a grant obtained by an attempt
    /// in flight goes to [`Competitor::abandon`].
    pub fn acquire_shared(
        &self,
        holder: HolderId,
        wait: Wait,
    ) -> impl Future<Output = Result<C::Grant>> + '_ {
        self.run(holder, wait, Mode::Shared, TokioTimer)
    }

    /// The blocking twin of [`acquire_shared`](Synchronizer::acquire_shared).
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use slate_aqs::{HolderId, Wait};
    /// # use std::time::Duration;
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// let me = HolderId::new();
    /// sync.blocking_acquire_shared(me, Wait::Forever)?;
    /// assert_eq!(sync.shared_depth(me), 1);
    /// # Ok::<(), slate_aqs::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire_shared`](Synchronizer::acquire_shared).
    ///
    /// # Panics
    ///
    /// As [`blocking_acquire`](Synchronizer::blocking_acquire).
    pub fn blocking_acquire_shared(&self, holder: HolderId, wait: Wait) -> Result<C::Grant> {
        self.blocking_run(holder, wait, Mode::Shared)
    }

    /// The blocking twin of [`acquire`](Synchronizer::acquire), for thread callers.
    ///
    /// It drives the same code path on this thread with a thread-parking waker; its own waits
    /// (retry timer, deadline) park the thread with a deadline, so it needs no runtime. If a
    /// runtime was current when the synchronizer was built, it is entered while waiting so the
    /// competitor's futures can use it (it must be multi-threaded or driven by another
    /// thread).
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use slate_aqs::{HolderId, Wait};
    /// # use std::time::Duration;
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// let me = HolderId::new();
    /// sync.blocking_acquire(me, Wait::Forever)?;
    /// assert_eq!(sync.owner(), Some((me, 1)));
    /// # Ok::<(), slate_aqs::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Synchronizer::acquire).
    ///
    /// # Panics
    ///
    /// When called from inside a tokio runtime context (including `spawn_blocking` threads,
    /// which carry the context: use `Handle::current().block_on(sync.acquire(..))` there).
    pub fn blocking_acquire(&self, holder: HolderId, wait: Wait) -> Result<C::Grant> {
        self.blocking_run(holder, wait, Mode::Exclusive)
    }

    /// The blocking twin of [`acquire_passable`](Synchronizer::acquire_passable).
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use slate_aqs::{HolderId, Wait};
    /// # use std::time::Duration;
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// let me = HolderId::new();
    /// sync.blocking_acquire_passable(me, Wait::Forever)?;
    /// assert_eq!(sync.remote_holder(me), me); // nobody queued: acquired as itself
    /// # Ok::<(), slate_aqs::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`acquire`](Synchronizer::acquire).
    ///
    /// # Panics
    ///
    /// As [`blocking_acquire`](Synchronizer::blocking_acquire).
    pub fn blocking_acquire_passable(&self, holder: HolderId, wait: Wait) -> Result<C::Grant> {
        self.blocking_run(holder, wait, Mode::Passable)
    }

    fn blocking_run(&self, holder: HolderId, wait: Wait, mode: Mode) -> Result<C::Grant> {
        assert!(
            tokio::runtime::Handle::try_current().is_err(),
            "blocking_acquire called from inside an async runtime; use `acquire().await`"
        );
        let _entered = self.handle.as_ref().map(tokio::runtime::Handle::enter);
        let timer = ThreadTimer::default();
        let run = self.run(holder, wait, mode, timer.clone());
        crate::blocking::block_on(run, &timer)
    }

    /// The local owner and its local depth.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use std::time::Duration;
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// assert_eq!(sync.owner(), None);
    /// ```
    pub fn owner(&self) -> Option<(HolderId, u32)> {
        self.lock()
            .owner
            .and_then(|o| o.holder.map(|h| (h, o.depth)))
    }

    /// The local shared holders and their local depths, in no particular order.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use std::time::Duration;
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// assert!(sync.shared_holders().is_empty());
    /// ```
    pub fn shared_holders(&self) -> Vec<(HolderId, u32)> {
        self.lock().readers.0.clone()
    }

    /// The local shared depth of `holder` (0 if it does not hold shared).
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use std::time::Duration;
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// assert_eq!(sync.shared_depth(slate_aqs::HolderId::new()), 0);
    /// ```
    pub fn shared_depth(&self, holder: HolderId) -> u32 {
        self.lock().readers.depth(holder)
    }

    /// How many callers wait in the queue (the head included).
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use std::time::Duration;
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// assert_eq!(sync.waiters(), 0);
    /// ```
    pub fn waiters(&self) -> usize {
        self.lock().queue.len()
    }

    /// Walks the queue and checks every invariant of the table on this type; returns the first
    /// violation. O(n): a testing aid.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use std::time::Duration;
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// assert_eq!(sync.check_invariants(), Ok(()));
    /// ```
    ///
    /// # Errors
    ///
    /// A description of the first broken invariant.
    #[cfg(feature = "test-util")]
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let st = self.lock();
        if let Some(o) = st.owner {
            if o.depth == 0 {
                return Err(format!("owner {:?} at depth 0", o.holder));
            }
            if o.holder.is_none() && o.depth != 1 {
                return Err(format!("a hold passed at depth {}", o.depth));
            }
        }
        for (i, (h, d)) in st.readers.0.iter().enumerate() {
            if *d == 0 {
                return Err(format!("shared holder {h} at depth 0"));
            }
            if st.readers.0[..i].iter().any(|(o, _)| o == h) {
                return Err(format!("shared holder {h} listed twice"));
            }
            if st.owner.is_some_and(|o| !o.is(*h)) {
                return Err(format!(
                    "shared holder {h} beside the exclusive owner {:?}",
                    st.owner.and_then(|o| o.holder)
                ));
            }
        }
        let passing = st.owner.is_some_and(|o| o.holder.is_none());
        let head_passed = st.queue.head().is_some_and(|h| st.queue.node(h).passed);
        if passing != head_passed {
            return Err(format!(
                "owner passing: {passing}, but the head was passed the hold: {head_passed}"
            ));
        }
        st.queue.check()
    }

    /// Bytes one parked waiter occupies in the queue itself (the acquire future and its task
    /// come on top). A measurement aid for benchmarks.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::MemoryCompetitor};
    /// assert!(Synchronizer::<MemoryCompetitor>::queue_slot_bytes() <= 64);
    /// ```
    #[cfg(feature = "test-util")]
    pub const fn queue_slot_bytes() -> usize {
        Queue::SLOT_BYTES
    }

    /// Bytes a queued waiter's deadline costs on the shared timer's heap, on top of its queue
    /// slot (an async waiter with a deadline has no `Sleep` of its own unless it is the head
    /// waiting out a retry delay). A measurement aid for benchmarks.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::MemoryCompetitor};
    /// assert!(Synchronizer::<MemoryCompetitor>::deadline_bytes() <= 16);
    /// ```
    #[cfg(feature = "test-util")]
    pub const fn deadline_bytes() -> usize {
        Queue::TIMER_BYTES
    }

    /// Whether the shared deadline timer's task is running (it runs while queued async
    /// waiters have deadlines, and finishes when the last of them leaves). A testing aid.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use std::time::Duration;
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// assert!(!sync.deadline_timer_running());
    /// ```
    #[cfg(feature = "test-util")]
    pub fn deadline_timer_running(&self) -> bool {
        self.lock().timers.running()
    }

    pub(crate) fn competitor_arc(&self) -> &Arc<C> {
        &self.competitor
    }

    pub(crate) fn captured_handle(&self) -> Option<&tokio::runtime::Handle> {
        self.handle.as_ref()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No critical section panics (short of a failed debug assertion), and the state stays
        // consistent at every line that could; a poisoned lock is safe to take over.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<C: Competitor> fmt::Debug for Synchronizer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.lock();
        f.debug_struct("Synchronizer")
            .field("label", &self.label)
            .field("owner", &st.owner)
            .field("shared", &st.readers.0)
            .field("waiters", &st.queue.len())
            .field("spin_wait", &self.spin_wait)
            .finish_non_exhaustive()
    }
}

/// Parks a queued waiter until its condition holds or its sleep fires. The condition is
/// checked, and the waker stored, in one critical section: an event after the check finds
/// the waker.
struct Park<'a, C: Competitor, S> {
    sync: &'a Synchronizer<C>,
    key: usize,
    cond: Cond,
    sleep: Option<Pin<&'a mut S>>,
}

impl<C: Competitor, S: Future<Output = ()>> Future for Park<'_, C, S> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // `Park` is `Unpin`: it holds the sleep by pinned reference.
        let this = self.get_mut();
        if this.sync.poll_cond(this.key, this.cond, cx) {
            return Poll::Ready(());
        }
        match this.sleep.as_mut() {
            Some(sleep) => sleep.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }
}

/// A caller's place in the queue. Dropping it (cancellation) leaves the queue and passes a
/// head's turn on.
struct QueueSlot<'a, C: Competitor> {
    sync: &'a Synchronizer<C>,
    key: Option<usize>,
}

impl<C: Competitor> QueueSlot<'_, C> {
    fn leave(&mut self) {
        if let Some(key) = self.key.take() {
            self.sync.leave(key);
        }
    }

    /// Leaves after an attempt that did not grant (busy past the deadline, an error). A
    /// queued caller's exit runs `queue_drained` when it empties the queue; a caller that
    /// attempted on the fast path was never queued, so with nobody queued the hook runs here:
    /// its busy answer may have given the process a place in the backend's queue.
    fn leave_after_attempt(&mut self) {
        if self.key.is_some() {
            self.leave();
        } else if self.sync.waiters() == 0 {
            self.sync.competitor.queue_drained();
        }
    }
}

impl<C: Competitor> Drop for QueueSlot<'_, C> {
    fn drop(&mut self) {
        self.leave();
    }
}

/// Polls a `Send` future through `&mut`. The never-locked `Mutex` makes the holder `Sync`,
/// so acquire futures are `Sync` although competitor futures need only be `Send`.
struct SyncFuture<F>(std::sync::Mutex<Pin<Box<F>>>);

impl<F: Future> SyncFuture<F> {
    fn new(fut: F) -> Self {
        SyncFuture(std::sync::Mutex::new(Box::pin(fut)))
    }
}

impl<F: Future> Future for SyncFuture<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.get_mut()
            .0
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
            .poll(cx)
    }
}

#[cfg(not(slate_loom))]
fn current_handle() -> Option<tokio::runtime::Handle> {
    tokio::runtime::Handle::try_current().ok()
}

#[cfg(slate_loom)]
fn current_handle() -> Option<tokio::runtime::Handle> {
    None
}
