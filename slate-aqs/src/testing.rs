//! An in-memory remote lock and a scriptable competitor, for tests and benchmarks
//! (feature `test-util`).
//!
//! - [`MemoryRemote`] stands in for the Redis hash: one exclusive holder with a re-entry
//!   count, or shared holders with theirs (a read-write lock), and "pub/sub" listeners called
//!   when a count reaches zero.
//! - [`MemoryCompetitor`] attempts against a `MemoryRemote`. Each attempt follows the next
//!   [`Behavior`] of its script (then a default): try the remote, answer busy, fail, answer
//!   late, or never answer. [`Stats`] counts attempts, grants, abandons and hook calls.
//! - [`release`] (and [`release_shared`]) is what a backend's unlock does: remote release,
//!   then local release.
//!
//! Several synchronizers (several "processes") may share one remote.
//!
//! # Examples
//!
//! ```
//! use slate_aqs::Synchronizer;
//! use slate_aqs::testing::{self, Behavior, MemoryCompetitor, MemoryRemote};
//! use slate_aqs::{HolderId, Wait};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! let remote = MemoryRemote::new();
//! let competitor = MemoryCompetitor::new(remote.clone());
//! competitor.script([Behavior::Fail]);
//! let sync = Arc::new(Synchronizer::new("a", competitor, Duration::from_millis(5)));
//! testing::subscribe(&sync);
//! let me = HolderId::new();
//! assert!(sync.blocking_acquire(me, Wait::Forever).unwrap_err().is_backend());
//! sync.blocking_acquire(me, Wait::Forever)?;
//! assert_eq!(testing::release(&sync, me)?, 0);
//! assert_eq!(remote.holder(), None);
//! let stats = sync.competitor().stats();
//! assert_eq!((stats.attempts, stats.acquired, stats.after_release), (2, 1, 1));
//! # Ok::<(), slate_aqs::Error>(())
//! ```

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use slate_core::{BackendKind, Error, HolderId, LossReason, Result};

use crate::{Attempt, Competitor, Notifications, Synchronizer};

type Listener = Arc<dyn Fn() + Send + Sync>;

/// A shared "remote" lock: a holder with a re-entry count, like Slate's Redis hash.
///
/// # Examples
///
/// ```
/// use slate_aqs::testing::MemoryRemote;
/// use slate_aqs::HolderId;
///
/// let remote = MemoryRemote::new();
/// let (a, b) = (HolderId::new(), HolderId::new());
/// assert_eq!(remote.try_acquire(a), Some(1));
/// assert_eq!(remote.try_acquire(a), Some(2));
/// assert_eq!(remote.try_acquire(b), None);
/// assert!(remote.release(b).unwrap_err().is_not_held());
/// ```
#[derive(Default)]
pub struct MemoryRemote {
    holder: Mutex<Held>,
    listeners: Mutex<Vec<Listener>>,
}

/// The remote's holders: at most one exclusive holder, and shared holders, which beside an
/// exclusive holder can only be that holder (the read its write covers).
#[derive(Debug, Default)]
struct Held {
    exclusive: Option<(HolderId, u32)>,
    shared: Vec<(HolderId, u32)>,
}

impl std::fmt::Debug for MemoryRemote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRemote")
            .field("holder", &self.holder())
            .finish_non_exhaustive()
    }
}

impl MemoryRemote {
    /// A free remote lock.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_aqs::testing::MemoryRemote::new().holder(), None);
    /// ```
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The holder and its count, if held.
    ///
    /// # Examples
    ///
    /// ```
    /// let remote = slate_aqs::testing::MemoryRemote::new();
    /// let me = slate_aqs::HolderId::new();
    /// remote.try_acquire(me);
    /// assert_eq!(remote.holder(), Some((me, 1)));
    /// ```
    pub fn holder(&self) -> Option<(HolderId, u32)> {
        self.held().exclusive
    }

    /// The shared holders and their counts, in the order they first acquired.
    ///
    /// # Examples
    ///
    /// ```
    /// let remote = slate_aqs::testing::MemoryRemote::new();
    /// let me = slate_aqs::HolderId::new();
    /// remote.try_acquire_shared(me);
    /// assert_eq!(remote.shared_holders(), vec![(me, 1)]);
    /// ```
    pub fn shared_holders(&self) -> Vec<(HolderId, u32)> {
        self.held().shared.clone()
    }

    /// Acquires shared for `holder` unless another holder holds exclusively (a writer takes
    /// the read its write covers); returns `holder`'s new shared count.
    ///
    /// # Examples
    ///
    /// ```
    /// let remote = slate_aqs::testing::MemoryRemote::new();
    /// let (a, b) = (slate_aqs::HolderId::new(), slate_aqs::HolderId::new());
    /// assert_eq!(remote.try_acquire_shared(a), Some(1));
    /// assert_eq!(remote.try_acquire_shared(b), Some(1));
    /// assert_eq!(remote.try_acquire(a), None); // readers exclude writers
    /// ```
    pub fn try_acquire_shared(&self, holder: HolderId) -> Option<u32> {
        let mut held = self.held();
        if held.exclusive.is_some_and(|(h, _)| h != holder) {
            return None;
        }
        Some(add_level(&mut held.shared, holder))
    }

    /// Adds one shared level for `holder` if it holds shared or exclusively, and never
    /// creates a hold; returns its new shared count.
    ///
    /// # Examples
    ///
    /// ```
    /// let remote = slate_aqs::testing::MemoryRemote::new();
    /// let me = slate_aqs::HolderId::new();
    /// assert_eq!(remote.try_reenter_shared(me), None);
    /// remote.try_acquire(me);
    /// assert_eq!(remote.try_reenter_shared(me), Some(1)); // covered by the write
    /// ```
    pub fn try_reenter_shared(&self, holder: HolderId) -> Option<u32> {
        let mut held = self.held();
        let holds = held.exclusive.is_some_and(|(h, _)| h == holder)
            || held.shared.iter().any(|(h, _)| *h == holder);
        holds.then(|| add_level(&mut held.shared, holder))
    }

    /// Releases one shared level for `holder`; at zero every listener is told. Returns the
    /// remaining shared count.
    ///
    /// # Examples
    ///
    /// ```
    /// let remote = slate_aqs::testing::MemoryRemote::new();
    /// let me = slate_aqs::HolderId::new();
    /// remote.try_acquire_shared(me);
    /// assert_eq!(remote.release_shared(me)?, 0);
    /// # Ok::<(), slate_aqs::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if `holder` holds no shared level.
    pub fn release_shared(&self, holder: HolderId) -> Result<u32> {
        let remaining = self.release_shared_silently(holder)?;
        if remaining == 0 {
            self.tell();
        }
        Ok(remaining)
    }

    /// As [`release_shared`](MemoryRemote::release_shared), without telling the listeners.
    ///
    /// # Examples
    ///
    /// ```
    /// let remote = slate_aqs::testing::MemoryRemote::new();
    /// let me = slate_aqs::HolderId::new();
    /// remote.try_acquire_shared(me);
    /// assert_eq!(remote.release_shared_silently(me)?, 0);
    /// # Ok::<(), slate_aqs::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if `holder` holds no shared level.
    pub fn release_shared_silently(&self, holder: HolderId) -> Result<u32> {
        let mut held = self.held();
        let pos = held
            .shared
            .iter()
            .position(|(h, _)| *h == holder)
            .ok_or_else(|| Error::not_held("memory", holder))?;
        held.shared[pos].1 -= 1;
        let remaining = held.shared[pos].1;
        if remaining == 0 {
            held.shared.remove(pos);
        }
        Ok(remaining)
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.holder.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn tell(&self) {
        let listeners = self
            .listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for listener in listeners {
            listener();
        }
    }

    /// Acquires for `holder` if free or already held by it; returns the new count.
    ///
    /// # Examples
    ///
    /// ```
    /// let remote = slate_aqs::testing::MemoryRemote::new();
    /// assert_eq!(remote.try_acquire(slate_aqs::HolderId::new()), Some(1));
    /// ```
    pub fn try_acquire(&self, holder: HolderId) -> Option<u32> {
        let mut held = self.held();
        let free = held.shared.is_empty();
        match &mut held.exclusive {
            Some((h, count)) if *h == holder => {
                *count += 1;
                Some(*count)
            }
            None if free => {
                held.exclusive = Some((holder, 1));
                Some(1)
            }
            // Held by another holder, or shared (a reader does not upgrade).
            _ => None,
        }
    }

    /// Adds one level to `holder`'s hold if it holds the lock, and never creates a hold (a
    /// re-entry, see [`Competitor::reenter`]); returns the new count.
    ///
    /// # Examples
    ///
    /// ```
    /// let remote = slate_aqs::testing::MemoryRemote::new();
    /// let me = slate_aqs::HolderId::new();
    /// assert_eq!(remote.try_reenter(me), None);
    /// remote.try_acquire(me);
    /// assert_eq!(remote.try_reenter(me), Some(2));
    /// ```
    pub fn try_reenter(&self, holder: HolderId) -> Option<u32> {
        let mut held = self.held();
        match &mut held.exclusive {
            Some((h, count)) if *h == holder => {
                *count += 1;
                Some(*count)
            }
            _ => None,
        }
    }

    /// Releases one level for `holder`; at zero the lock is free and every listener is told
    /// (the "unlock message"). Returns the remaining count.
    ///
    /// # Examples
    ///
    /// ```
    /// let remote = slate_aqs::testing::MemoryRemote::new();
    /// let me = slate_aqs::HolderId::new();
    /// remote.try_acquire(me);
    /// assert_eq!(remote.release(me)?, 0);
    /// # Ok::<(), slate_aqs::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if `holder` does not hold the lock (nothing changes).
    pub fn release(&self, holder: HolderId) -> Result<u32> {
        let remaining = self.release_silently(holder)?;
        if remaining == 0 {
            self.tell();
        }
        Ok(remaining)
    }

    /// As [`release`](MemoryRemote::release), without telling the listeners (a lost unlock
    /// message).
    ///
    /// # Examples
    ///
    /// ```
    /// let remote = slate_aqs::testing::MemoryRemote::new();
    /// let me = slate_aqs::HolderId::new();
    /// remote.try_acquire(me);
    /// assert_eq!(remote.release_silently(me)?, 0);
    /// # Ok::<(), slate_aqs::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if `holder` does not hold the lock.
    pub fn release_silently(&self, holder: HolderId) -> Result<u32> {
        let mut held = self.held();
        match &mut held.exclusive {
            Some((h, count)) if *h == holder => {
                *count -= 1;
                let remaining = *count;
                if remaining == 0 {
                    held.exclusive = None;
                }
                Ok(remaining)
            }
            _ => Err(Error::not_held("memory", holder)),
        }
    }

    /// Calls `listener` every time the lock becomes free through [`release`](MemoryRemote::release).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::atomic::{AtomicBool, Ordering};
    /// use std::sync::Arc;
    ///
    /// let remote = slate_aqs::testing::MemoryRemote::new();
    /// let heard = Arc::new(AtomicBool::new(false));
    /// let h = heard.clone();
    /// remote.on_release(move || h.store(true, Ordering::SeqCst));
    /// let me = slate_aqs::HolderId::new();
    /// remote.try_acquire(me);
    /// remote.release(me)?;
    /// assert!(heard.load(Ordering::SeqCst));
    /// # Ok::<(), slate_aqs::Error>(())
    /// ```
    pub fn on_release(&self, listener: impl Fn() + Send + Sync + 'static) {
        self.listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::new(listener));
    }
}

/// One more level for `holder` in `levels`: its new count.
fn add_level(levels: &mut Vec<(HolderId, u32)>, holder: HolderId) -> u32 {
    match levels.iter_mut().find(|(h, _)| *h == holder) {
        Some((_, n)) => {
            *n += 1;
            *n
        }
        None => {
            levels.push((holder, 1));
            1
        }
    }
}

/// What one attempt of a [`MemoryCompetitor`] does.
///
/// # Examples
///
/// ```
/// use slate_aqs::testing::Behavior;
/// assert_eq!(Behavior::default(), Behavior::Remote);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Behavior {
    /// Try the remote lock: acquired if free or held by the same holder, busy otherwise.
    #[default]
    Remote,
    /// Answer busy without looking at the remote.
    Busy,
    /// Fail with a backend I/O error.
    Fail,
    /// Wait this long on tokio's timer, then behave as [`Behavior::Remote`].
    Slow(Duration),
    /// Wait this long on tokio's timer, then answer busy (a busy answer that was decided
    /// before a release happened, still on the wire).
    SlowBusy(Duration),
    /// Look at the remote at once (as [`Behavior::Remote`]), then hold the answer this long on
    /// tokio's timer: a grant decided long before it is processed (a reply stuck behind a
    /// starved task). With [`MemoryCompetitor::set_lease`], its lease counts from the
    /// decision.
    LateAnswer(Duration),
    /// Never answer.
    Never,
}

/// A grant of a [`MemoryCompetitor`].
///
/// # Examples
///
/// ```
/// let g = slate_aqs::testing::MemoryGrant { holder: slate_aqs::HolderId::new(), count: 1, passed: false, shared: false };
/// assert_eq!(g.count, 1);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryGrant {
    /// Who holds remotely (the remote holder: after a local pass, the holder that acquired).
    pub holder: HolderId,
    /// The remote count after this acquisition.
    pub count: u32,
    /// The hold came by a local pass, without a remote call.
    pub passed: bool,
    /// A shared hold (`count` is then the holder's shared count).
    pub shared: bool,
}

/// Counters of a [`MemoryCompetitor`] (a snapshot).
///
/// # Examples
///
/// ```
/// let s = slate_aqs::testing::Stats::default();
/// assert_eq!(s.attempts, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Attempts started.
    pub attempts: u64,
    /// Attempt futures alive (started, neither finished nor dropped).
    pub live_attempts: u64,
    /// Attempts that acquired.
    pub acquired: u64,
    /// Attempts that answered busy.
    pub busy: u64,
    /// Attempts that failed.
    pub failed: u64,
    /// Grants handed back through `abandon`.
    pub abandoned: u64,
    /// `after_acquire` calls.
    pub after_acquire: u64,
    /// `after_release` calls.
    pub after_release: u64,
    /// `after_release_shared` calls.
    pub after_release_shared: u64,
    /// `prepare_wait` calls.
    pub prepare_wait: u64,
    /// `queue_drained` calls.
    pub queue_drained: u64,
    /// Holds taken by a local pass (`take_pass` that answered a grant).
    pub passes_taken: u64,
    /// Passed holds given back through `drop_pass`.
    pub passes_dropped: u64,
}

#[derive(Debug, Default)]
struct Counters {
    attempts: AtomicU64,
    live_attempts: AtomicU64,
    acquired: AtomicU64,
    busy: AtomicU64,
    failed: AtomicU64,
    abandoned: AtomicU64,
    after_acquire: AtomicU64,
    after_release: AtomicU64,
    after_release_shared: AtomicU64,
    prepare_wait: AtomicU64,
    queue_drained: AtomicU64,
    passes_taken: AtomicU64,
    passes_dropped: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::SeqCst);
}

#[derive(Debug)]
struct Plan {
    script: VecDeque<Behavior>,
    default: Behavior,
    notifications: Notifications,
    prepare_delay: Option<Duration>,
    retry_after: Option<Duration>,
    pass_budget: u32,
    lease: Option<Duration>,
}

/// A [`Competitor`] against a [`MemoryRemote`], with scripted behaviour per attempt.
///
/// `prepare_wait` answers the configured [`Notifications`] (default `Off`), after the
/// configured delay (default none); busy answers carry the configured `retry_after` (default
/// `None`).
///
/// # Examples
///
/// ```
/// use slate_aqs::testing::{Behavior, MemoryCompetitor, MemoryRemote};
///
/// let c = MemoryCompetitor::new(MemoryRemote::new());
/// c.script([Behavior::Busy, Behavior::Remote]);
/// c.set_default(Behavior::Never);
/// ```
#[derive(Debug)]
pub struct MemoryCompetitor {
    remote: Arc<MemoryRemote>,
    plan: Mutex<Plan>,
    /// The lease deadline of each holder's last grant (with [`MemoryCompetitor::set_lease`]).
    deadlines: Arc<Mutex<HashMap<HolderId, Instant>>>,
    counters: Arc<Counters>,
    take_pass_hook: Mutex<Option<Hook>>,
}

/// A test's callback inside a competitor method.
#[derive(Clone)]
struct Hook(Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hook")
    }
}

impl MemoryCompetitor {
    /// A competitor whose attempts all try `remote` until scripted otherwise.
    ///
    /// # Examples
    ///
    /// ```
    /// let c = slate_aqs::testing::MemoryCompetitor::new(slate_aqs::testing::MemoryRemote::new());
    /// assert_eq!(c.remote().holder(), None);
    /// ```
    pub fn new(remote: Arc<MemoryRemote>) -> Self {
        MemoryCompetitor {
            remote,
            plan: Mutex::new(Plan {
                script: VecDeque::new(),
                default: Behavior::Remote,
                notifications: Notifications::Off,
                prepare_delay: None,
                retry_after: None,
                pass_budget: 0,
                lease: None,
            }),
            deadlines: Arc::default(),
            counters: Arc::default(),
            take_pass_hook: Mutex::new(None),
        }
    }

    /// Runs `hook` inside every [`take_pass`](Competitor::take_pass) that is about to succeed
    /// (after its check of the remote, before it answers), on the taker's thread: for tests
    /// of what may happen between the two (it may block, briefly).
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::testing::{MemoryCompetitor, MemoryRemote};
    /// MemoryCompetitor::new(MemoryRemote::new()).set_take_pass_hook(|| {});
    /// ```
    pub fn set_take_pass_hook(&self, hook: impl Fn() + Send + Sync + 'static) {
        *self
            .take_pass_hook
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Hook(Arc::new(hook)));
    }

    /// The remote lock this competitor attempts against.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_aqs::testing::{MemoryCompetitor, MemoryRemote};
    /// let remote = MemoryRemote::new();
    /// assert!(std::sync::Arc::ptr_eq(MemoryCompetitor::new(remote.clone()).remote(), &remote));
    /// ```
    pub fn remote(&self) -> &Arc<MemoryRemote> {
        &self.remote
    }

    /// Appends behaviours for the next attempts, in order.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::testing::{Behavior, MemoryCompetitor, MemoryRemote};
    /// MemoryCompetitor::new(MemoryRemote::new()).script([Behavior::Fail, Behavior::Busy]);
    /// ```
    pub fn script(&self, behaviors: impl IntoIterator<Item = Behavior>) {
        self.plan().script.extend(behaviors);
    }

    /// The behaviour of attempts once the script is used up.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::testing::{Behavior, MemoryCompetitor, MemoryRemote};
    /// MemoryCompetitor::new(MemoryRemote::new()).set_default(Behavior::Never);
    /// ```
    pub fn set_default(&self, behavior: Behavior) {
        self.plan().default = behavior;
    }

    /// What `prepare_wait` answers from now on.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Notifications, testing::{MemoryCompetitor, MemoryRemote}};
    /// MemoryCompetitor::new(MemoryRemote::new()).set_notifications(Notifications::Live);
    /// ```
    pub fn set_notifications(&self, notifications: Notifications) {
        self.plan().notifications = notifications;
    }

    /// Makes `prepare_wait` take this long (on tokio's timer) before answering; `None`
    /// answers at once.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::testing::{MemoryCompetitor, MemoryRemote};
    /// # use std::time::Duration;
    /// MemoryCompetitor::new(MemoryRemote::new()).set_prepare_delay(Some(Duration::from_millis(3)));
    /// ```
    pub fn set_prepare_delay(&self, delay: Option<Duration>) {
        self.plan().prepare_delay = delay;
    }

    /// The `retry_after` busy answers carry from now on.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::testing::{MemoryCompetitor, MemoryRemote};
    /// # use std::time::Duration;
    /// MemoryCompetitor::new(MemoryRemote::new()).set_retry_after(Some(Duration::from_millis(3)));
    /// ```
    pub fn set_retry_after(&self, retry_after: Option<Duration>) {
        self.plan().retry_after = retry_after;
    }

    /// Gives the grants decided from now on a lease of `lease` from the remote's decision
    /// ([`Competitor::grant_deadline`]; default `None`: no lease). The memory remote does not
    /// expire holds by itself: a test ends one with [`MemoryRemote::release_silently`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::testing::{MemoryCompetitor, MemoryRemote};
    /// # use std::time::Duration;
    /// MemoryCompetitor::new(MemoryRemote::new()).set_lease(Some(Duration::from_secs(1)));
    /// ```
    pub fn set_lease(&self, lease: Option<Duration>) {
        self.plan().lease = lease;
        if lease.is_none() {
            self.deadlines
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
        }
    }

    /// How many local passes a fresh hold of a passable waiter allows from now on (default
    /// 0: none). See [`Synchronizer::acquire_passable`].
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::testing::{MemoryCompetitor, MemoryRemote};
    /// MemoryCompetitor::new(MemoryRemote::new()).set_pass_budget(7);
    /// ```
    pub fn set_pass_budget(&self, budget: u32) {
        self.plan().pass_budget = budget;
    }

    /// A snapshot of the counters.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::testing::{MemoryCompetitor, MemoryRemote};
    /// assert_eq!(MemoryCompetitor::new(MemoryRemote::new()).stats().acquired, 0);
    /// ```
    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::SeqCst);
        Stats {
            attempts: get(&c.attempts),
            live_attempts: get(&c.live_attempts),
            acquired: get(&c.acquired),
            busy: get(&c.busy),
            failed: get(&c.failed),
            abandoned: get(&c.abandoned),
            after_acquire: get(&c.after_acquire),
            after_release: get(&c.after_release),
            after_release_shared: get(&c.after_release_shared),
            prepare_wait: get(&c.prepare_wait),
            queue_drained: get(&c.queue_drained),
            passes_taken: get(&c.passes_taken),
            passes_dropped: get(&c.passes_dropped),
        }
    }

    fn plan(&self) -> std::sync::MutexGuard<'_, Plan> {
        self.plan.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Decrements `live_attempts` when an attempt future finishes or is dropped.
struct Live(Arc<Counters>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.live_attempts.fetch_sub(1, Ordering::SeqCst);
    }
}

impl MemoryCompetitor {
    /// One attempt following the plan; `reentry`: a re-entry that never creates a hold;
    /// `shared`: in shared mode.
    fn attempt_as(
        &self,
        holder: HolderId,
        reentry: bool,
        shared: bool,
    ) -> impl Future<Output = Result<Attempt<MemoryGrant>>> + Send + 'static {
        let (behavior, retry_after, lease) = {
            let mut plan = self.plan();
            let next = plan.script.pop_front().unwrap_or(plan.default);
            (next, plan.retry_after, plan.lease)
        };
        let deadlines = Arc::clone(&self.deadlines);
        bump(&self.counters.attempts);
        bump(&self.counters.live_attempts);
        let live = Live(Arc::clone(&self.counters));
        let remote = Arc::clone(&self.remote);
        async move {
            let counters = &live.0;
            let mut late = None;
            let behavior = match behavior {
                Behavior::LateAnswer(d) => {
                    late = Some(d);
                    Behavior::Remote
                }
                Behavior::Slow(d) => {
                    tokio::time::sleep(d).await;
                    Behavior::Remote
                }
                Behavior::SlowBusy(d) => {
                    tokio::time::sleep(d).await;
                    Behavior::Busy
                }
                Behavior::Never => std::future::pending().await,
                b => b,
            };
            let busy = || {
                bump(&counters.busy);
                Ok(Attempt::Busy { retry_after })
            };
            let acquired = |count| {
                bump(&counters.acquired);
                if let Some(lease) = lease {
                    deadlines
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        // On tokio's clock, as the synchronizer's waiters (paused time moves it).
                        .insert(holder, tokio::time::Instant::now().into_std() + lease);
                }
                Ok(Attempt::Acquired(MemoryGrant {
                    holder,
                    count,
                    passed: false,
                    shared,
                }))
            };
            let answer = match behavior {
                Behavior::Remote if reentry => {
                    let count = if shared {
                        remote.try_reenter_shared(holder)
                    } else {
                        remote.try_reenter(holder)
                    };
                    match count {
                        Some(count) => acquired(count),
                        None => Err(Error::lease_lost("memory", holder, LossReason::EntryGone)),
                    }
                }
                Behavior::Remote => {
                    let count = if shared {
                        remote.try_acquire_shared(holder)
                    } else {
                        remote.try_acquire(holder)
                    };
                    match count {
                        Some(count) => acquired(count),
                        None => busy(),
                    }
                }
                Behavior::Busy => busy(),
                _ => {
                    bump(&counters.failed);
                    Err(Error::backend(
                        BackendKind::Io,
                        None,
                        "injected failure",
                        None,
                    ))
                }
            };
            if let Some(d) = late {
                tokio::time::sleep(d).await;
            }
            answer
        }
    }
}

impl Competitor for MemoryCompetitor {
    type Grant = MemoryGrant;

    fn attempt(
        &self,
        holder: HolderId,
    ) -> impl Future<Output = Result<Attempt<MemoryGrant>>> + Send + 'static {
        self.attempt_as(holder, false, false)
    }

    /// As `attempt`, but a holder whose remote hold is gone gets [`Error::LeaseLost`].
    fn reenter(
        &self,
        holder: HolderId,
    ) -> impl Future<Output = Result<Attempt<MemoryGrant>>> + Send + 'static {
        self.attempt_as(holder, true, false)
    }

    fn attempt_shared(
        &self,
        holder: HolderId,
    ) -> impl Future<Output = Result<Attempt<MemoryGrant>>> + Send + 'static {
        self.attempt_as(holder, false, true)
    }

    /// As `attempt_shared`, but a holder that holds neither shared nor exclusively gets
    /// [`Error::LeaseLost`].
    fn reenter_shared(
        &self,
        holder: HolderId,
    ) -> impl Future<Output = Result<Attempt<MemoryGrant>>> + Send + 'static {
        self.attempt_as(holder, true, true)
    }

    fn after_release_shared(&self, _holder: HolderId) {
        bump(&self.counters.after_release_shared);
    }

    fn after_acquire(&self, _holder: HolderId, _grant: &MemoryGrant) {
        bump(&self.counters.after_acquire);
    }

    fn after_release(&self, _holder: HolderId) {
        bump(&self.counters.after_release);
    }

    fn abandon(&self, holder: HolderId, grant: MemoryGrant) {
        bump(&self.counters.abandoned);
        // A grant nobody received: give its level back (and tell the listeners at zero).
        let _ = if grant.shared {
            self.remote.release_shared(holder)
        } else {
            self.remote.release(holder)
        };
    }

    fn grant_deadline(&self, grant: &MemoryGrant) -> Option<Instant> {
        self.deadlines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&grant.holder)
            .copied()
    }

    fn pass_budget(&self, grant: &MemoryGrant) -> u32 {
        if grant.count == 1 && !grant.shared {
            self.plan().pass_budget
        } else {
            0
        }
    }

    /// The remote hold of `remote` is taken as it is, if it still exists at one level.
    fn take_pass(&self, remote: HolderId, _to: HolderId) -> Option<MemoryGrant> {
        if self.remote.holder() != Some((remote, 1)) {
            return None;
        }
        let hook = self
            .take_pass_hook
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(Hook(hook)) = hook {
            hook();
        }
        bump(&self.counters.passes_taken);
        Some(MemoryGrant {
            holder: remote,
            count: 1,
            passed: true,
            shared: false,
        })
    }

    fn drop_pass(&self, remote: HolderId) {
        bump(&self.counters.passes_dropped);
        // Released remotely (the listeners, i.e. `notify_released`, are told at zero).
        let _ = self.remote.release(remote);
    }

    fn prepare_wait(&self) -> impl Future<Output = Notifications> + Send {
        bump(&self.counters.prepare_wait);
        let (notifications, delay) = {
            let plan = self.plan();
            (plan.notifications, plan.prepare_delay)
        };
        async move {
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
            notifications
        }
    }

    fn queue_drained(&self) {
        bump(&self.counters.queue_drained);
    }
}

/// Releases one level of `holder` the way a backend's unlock does: the last level is passed
/// to the head of the queue if [`Synchronizer::try_pass`] can; otherwise remotely first (as
/// its [remote holder](Synchronizer::remote_holder)), then locally (whatever the remote
/// outcome). Returns the remote's remaining count (0 after a pass).
///
/// # Examples
///
/// ```
/// # use slate_aqs::{Synchronizer, testing::{self, MemoryCompetitor, MemoryRemote}};
/// # use slate_aqs::{HolderId, Wait};
/// # use std::time::Duration;
/// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
/// let me = HolderId::new();
/// sync.blocking_acquire(me, Wait::Forever)?;
/// assert_eq!(testing::release(&sync, me)?, 0);
/// # Ok::<(), slate_aqs::Error>(())
/// ```
///
/// # Errors
///
/// [`Error::NotHeld`] from the remote (the local release happens anyway).
pub fn release(sync: &Synchronizer<MemoryCompetitor>, holder: HolderId) -> Result<u32> {
    // The last level of a passable hold goes to the head of the queue if it can.
    if sync.owner() == Some((holder, 1)) && sync.try_pass(holder) {
        return Ok(0);
    }
    let remote = sync
        .competitor()
        .remote()
        .release(sync.remote_holder(holder));
    sync.release(holder);
    remote
}

/// Releases one shared level of `holder` the way a backend's unlock does: remotely first,
/// then locally (whatever the remote outcome). Returns the remote's remaining shared count.
///
/// # Examples
///
/// ```
/// # use slate_aqs::{Synchronizer, testing::{self, MemoryCompetitor, MemoryRemote}};
/// # use slate_aqs::{HolderId, Wait};
/// # use std::time::Duration;
/// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
/// let me = HolderId::new();
/// sync.blocking_acquire_shared(me, Wait::Forever)?;
/// assert_eq!(testing::release_shared(&sync, me)?, 0);
/// # Ok::<(), slate_aqs::Error>(())
/// ```
///
/// # Errors
///
/// [`Error::NotHeld`] from the remote (the local release happens anyway).
pub fn release_shared(sync: &Synchronizer<MemoryCompetitor>, holder: HolderId) -> Result<u32> {
    let remote = sync.competitor().remote().release_shared(holder);
    sync.release_shared(holder);
    remote
}

/// Wires the remote's unlock messages to `sync.notify_released()` (the pub/sub listener of a
/// real backend). Holds the synchronizer weakly.
///
/// # Examples
///
/// ```
/// # use slate_aqs::{Synchronizer, testing::{self, MemoryCompetitor, MemoryRemote}};
/// # use std::{sync::Arc, time::Duration};
/// let sync = Arc::new(Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50)));
/// testing::subscribe(&sync);
/// ```
pub fn subscribe(sync: &Arc<Synchronizer<MemoryCompetitor>>) {
    let weak: Weak<Synchronizer<MemoryCompetitor>> = Arc::downgrade(sync);
    sync.competitor().remote().on_release(move || {
        if let Some(sync) = weak.upgrade() {
            sync.notify_released();
        }
    });
}
