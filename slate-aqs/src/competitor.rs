//! The strategy a [`Synchronizer`](crate::Synchronizer) drives: one remote attempt and hooks.

use std::future::Future;
use std::time::{Duration, Instant};

use slate_core::{HolderId, Result};

/// The answer of one remote attempt.
#[derive(Debug)]
pub enum Attempt<G> {
    /// The lock was granted (first level or re-entry); the grant carries what the backend
    /// needs to build a guard (fencing token, lease deadline, ...).
    Acquired(G),
    /// Another holder has the lock. `retry_after` is its remaining lease when known: the
    /// earliest time at which the lock can free without a release.
    Busy {
        /// The holder's remaining lease, if the backend reported it.
        retry_after: Option<Duration>,
    },
}

/// Whether release notifications reach the synchronizer (see [`Competitor::prepare_wait`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notifications {
    /// Notifications were just switched on by this call. A release may have happened between
    /// the busy answer and the switch, so the head retries once at once before parking.
    Started,
    /// Notifications were already on before the last attempt was sent: park until one arrives
    /// (or the retry timer fires: the spin wait, or with [`Competitor::live_park_cap`] the busy
    /// answer's `retry_after` up to the cap).
    Live,
    /// No notifications (the backend has none, or its channel is down): park on the spin-wait
    /// timer only.
    Off,
}

/// A party competing for a remote lock: the strategy under a [`Synchronizer`].
///
/// The synchronizer decides **when** to attempt (only the head of the local queue, only while
/// no local task holds the lock); the competitor decides **how** (one script call on one node,
/// or a walk over N nodes).
///
/// ## Hook contract
///
/// - Hooks are called synchronously from inside the synchronizer's driver, never under its
///   internal lock. They must not block, must not panic, and must not call back into the same
///   synchronizer (no re-entry): a hook that needs I/O spawns it.
/// - [`after_acquire`](Competitor::after_acquire) runs exactly once per grant that reaches a
///   caller; [`abandon`](Competitor::abandon) runs exactly once per grant that does not (its
///   acquire future was dropped while the attempt was in flight).
/// - [`after_release`](Competitor::after_release) runs once each time a remote hold ends
///   locally: its holder's local hold count returned to zero (and the hold was not passed on),
///   or its holder was displaced by a newer grant: its remote hold had already ended
///   (released remotely with the local release still to come, or lost) when the remote
///   granted someone else. Its late `release` is then ignored.
/// - Every hook and remote call names the **remote holder**: the holder whose remote hold it
///   is. That is the local holder, except after a local pass (below), where the receivers
///   keep using the remote hold of the holder that acquired it.
///
/// ## Local passes (lock cohorting)
///
/// A backend may let one remote hold serve several local holders in a row, without a round
/// trip between them (Dice, Marathe and Shavit, *Lock Cohorting*, PPoPP 2012). It opts in by
/// answering a non-zero [`pass_budget`](Competitor::pass_budget) for the grants of
/// [`attempt_passable`](Competitor::attempt_passable), which waiters of
/// [`Synchronizer::acquire_passable`](crate::Synchronizer::acquire_passable) use. When such a
/// holder releases its last level, the backend first calls
/// [`Synchronizer::try_pass`](crate::Synchronizer::try_pass): if the head of the queue is
/// passable, it is handed the hold, builds its grant with
/// [`take_pass`](Competitor::take_pass), and nothing is sent to the backend. A pass the
/// receiver cannot use (it was cancelled with nobody passable behind it, or `take_pass`
/// refused) goes to [`drop_pass`](Competitor::drop_pass), which must release it remotely.
/// Only holders that nobody else can name may be passable: another process re-entering the
/// remote holder's hold while a receiver holds it would break exclusion.
///
/// [`Synchronizer`]: crate::Synchronizer
pub trait Competitor: Send + Sync + 'static {
    /// What a successful attempt yields.
    type Grant: Send + 'static;

    /// One remote attempt for `holder`: *acquired* or *busy*.
    ///
    /// The future is `'static` so that the synchronizer can finish it in the background when
    /// the caller's acquire future is dropped while it is in flight; a grant obtained that way
    /// is handed to [`abandon`](Competitor::abandon).
    ///
    /// # Errors
    ///
    /// Backend failures; the synchronizer returns them to the caller (and the caller's waiter
    /// leaves the queue, waking the next one).
    fn attempt(
        &self,
        holder: HolderId,
    ) -> impl Future<Output = Result<Attempt<Self::Grant>>> + Send + 'static;

    /// One remote **re-entry** attempt for `holder`, which is the synchronizer's local owner:
    /// one more level of a hold that the caller believes still exists.
    ///
    /// It must never start a new hold: if `holder`'s hold no longer exists remotely (its
    /// lease ran out, it was force-unlocked), it answers [`Error::LeaseLost`] (or
    /// [`Attempt::Busy`] if another holder has the lock; the synchronizer turns that into
    /// `LeaseLost` too) and changes nothing remotely. Otherwise the local depth would count a
    /// level that the remote does not: releasing the stale outer level would then delete the
    /// fresh hold while the inner guard still believes it holds the lock.
    ///
    /// The default calls [`attempt`](Competitor::attempt), which is right only for backends
    /// whose attempt never creates a hold for a holder that already had one.
    ///
    /// [`Error::LeaseLost`]: slate_core::Error::LeaseLost
    ///
    /// # Errors
    ///
    /// As [`attempt`](Competitor::attempt), plus `LeaseLost` as above.
    fn reenter(
        &self,
        holder: HolderId,
    ) -> impl Future<Output = Result<Attempt<Self::Grant>>> + Send + 'static {
        self.attempt(holder)
    }

    /// One remote attempt for `holder`, a waiter that may later pass its hold to other local
    /// holders (see *Local passes* above): the backend may prepare the hold for passes (e.g.
    /// reserve a block of fencing tokens) and answer the number of passes it allows through
    /// [`pass_budget`](Competitor::pass_budget).
    ///
    /// The default calls [`attempt`](Competitor::attempt): no passes.
    ///
    /// # Errors
    ///
    /// As [`attempt`](Competitor::attempt).
    fn attempt_passable(
        &self,
        holder: HolderId,
    ) -> impl Future<Output = Result<Attempt<Self::Grant>>> + Send + 'static {
        self.attempt(holder)
    }

    /// One remote attempt for `holder` in **shared** mode (a read lock, permits of a
    /// semaphore): *acquired* when the remote admits it beside the other shared holders,
    /// *busy* otherwise. Waiters of [`Synchronizer::acquire_shared`](crate::Synchronizer::acquire_shared)
    /// use it; the grant goes through the same hooks as an exclusive one
    /// ([`after_acquire`](Competitor::after_acquire), [`abandon`](Competitor::abandon)), so
    /// a backend with both modes records the mode in its grant.
    ///
    /// The default answers [`Error::InvalidInput`]: the backend has no shared mode.
    ///
    /// [`Error::InvalidInput`]: slate_core::Error::InvalidInput
    ///
    /// # Errors
    ///
    /// As [`attempt`](Competitor::attempt).
    fn attempt_shared(
        &self,
        holder: HolderId,
    ) -> impl Future<Output = Result<Attempt<Self::Grant>>> + Send + 'static {
        let _ = holder;
        std::future::ready(Err(slate_core::Error::invalid_input(
            "shared mode",
            "this lock has no shared (read or permit) mode",
            "use the exclusive acquire, or a backend that implements attempt_shared",
        )))
    }

    /// One remote **shared re-entry** for `holder`: it already holds the lock shared in
    /// this process, or exclusively (a writer taking the read lock its write lock covers).
    /// Like [`reenter`](Competitor::reenter), it must never start a new hold: if `holder`'s
    /// hold is gone remotely it answers [`Error::LeaseLost`] (or busy) and changes nothing.
    ///
    /// The default calls [`attempt_shared`](Competitor::attempt_shared).
    ///
    /// [`Error::LeaseLost`]: slate_core::Error::LeaseLost
    ///
    /// # Errors
    ///
    /// As [`attempt_shared`](Competitor::attempt_shared), plus `LeaseLost` as above.
    fn reenter_shared(
        &self,
        holder: HolderId,
    ) -> impl Future<Output = Result<Attempt<Self::Grant>>> + Send + 'static {
        self.attempt_shared(holder)
    }

    /// When `grant`'s lease runs out, if it has one: the backend's own conservative deadline,
    /// never after the remote's expiry of the hold.
    ///
    /// A grant that would displace another local holder is recorded only while this is in
    /// the future (checked under the synchronizer's lock, as it records). A grant processed
    /// after its lease ran out (its answer stuck behind a task starved for longer than a
    /// lease) holds nothing, and recording it would displace whoever the remote granted
    /// since, a live hold. It goes to [`abandon`](Competitor::abandon)
    /// instead, and the caller goes on as after a busy answer. A grant that displaces nobody
    /// (a re-entry, a grant on a free lock) is recorded as it is; its guard reports its own
    /// loss.
    ///
    /// Why a recorded grant may displace a local owner: the remote holds one exclusive grant
    /// at a time, and a grant whose conservative deadline has not passed is still held
    /// there, so any other local owner's remote hold has ended (released remotely before its
    /// local release, or lost).
    ///
    /// The deadline is compared with the waiting caller's clock: tokio's for an async caller
    /// (the system clock, unless paused in a test), the system clock for a blocking one.
    ///
    /// The default, `None`, is a grant without a lease (always recorded).
    fn grant_deadline(&self, grant: &Self::Grant) -> Option<Instant> {
        let _ = grant;
        None
    }

    /// How many local passes the fresh remote hold `grant` may serve after its own holder
    /// (0, the default: none). Called once per first-level grant of a passable waiter.
    fn pass_budget(&self, grant: &Self::Grant) -> u32 {
        let _ = grant;
        0
    }

    /// Builds the grant of `to`, which was just passed the remote hold of `remote` (at one
    /// level) by a local release, without a remote call. `None` if the hold cannot be used
    /// (e.g. its lease is known lost, or too short to be worth holding): the synchronizer
    /// then gives it to [`drop_pass`](Competitor::drop_pass) and `to` attempts remotely.
    ///
    /// The default refuses every pass.
    fn take_pass(&self, remote: HolderId, to: HolderId) -> Option<Self::Grant> {
        let _ = (remote, to);
        None
    }

    /// A passed hold of `remote` that no local holder will take: release it remotely (one
    /// level) and end whatever `after_acquire` started for it. Must not block: spawn the
    /// remote release, and call [`Synchronizer::notify_released`](crate::Synchronizer::notify_released)
    /// when it is done so that the head retries at once.
    fn drop_pass(&self, remote: HolderId) {
        let _ = remote;
    }

    /// Called after `holder` won `grant`, before the grant is returned to the caller
    /// (e.g. register the hold with a renewal service). For a passed grant it runs after
    /// [`take_pass`](Competitor::take_pass).
    fn after_acquire(&self, holder: HolderId, grant: &Self::Grant) {
        let _ = (holder, grant);
    }

    /// Called when `holder`'s local hold count returned to zero.
    fn after_release(&self, holder: HolderId) {
        let _ = holder;
    }

    /// Called when `holder`'s local **shared** hold count returned to zero (its shared
    /// hold ended locally, or it was displaced by an exclusive grant: the remote had already
    /// ended its shared hold).
    fn after_release_shared(&self, holder: HolderId) {
        let _ = holder;
    }

    /// Gives back a grant that no caller will receive. Must not block: spawn the remote
    /// release.
    fn abandon(&self, holder: HolderId, grant: Self::Grant);

    /// How long a head parks at most after a busy answer while its notifications are
    /// [`Notifications::Live`]. `None` (the default): the spin wait, as without notifications
    /// (the notifications only wake it sooner). `Some(cap)`: the backend's notifications are
    /// trusted to announce every release, so the head parks until the busy answer's
    /// `retry_after` (when the holder's lease or a reservation ends by itself, which nothing
    /// announces), at most `cap` (and at least until the spin wait when `retry_after` is
    /// unknown): a waiter then costs the backend one attempt per `cap` instead of one per spin
    /// wait. Backends whose notifications can be missed without the competitor learning it
    /// keep the default.
    fn live_park_cap(&self) -> Option<Duration> {
        None
    }

    /// Called by the head after a busy answer, before it parks, so the backend can switch on
    /// release notifications (e.g. subscribe to the lock's channel) and report whether they
    /// are on.
    ///
    /// # Cancel safety
    ///
    /// Must be cancel safe: the head may be dropped while it runs.
    fn prepare_wait(&self) -> impl Future<Output = Notifications> + Send {
        std::future::ready(Notifications::Off)
    }

    /// Called when the local queue became empty: no task of this process waits any more, so
    /// notifications may be switched off (e.g. unsubscribe), and a place the backend keeps
    /// for this process among its waiters may be given up. Also called after a
    /// [`Wait::Immediate`](slate_core::Wait::Immediate) attempt answered busy while nobody
    /// is queued (that answer may have given the process such a place).
    ///
    /// Also called when an attempt ends without a grant for a caller that was never queued (a
    /// fast-path attempt busy past its deadline, or failed) while nobody is queued, and when
    /// an attempt whose caller was dropped ends busy or failed in the background. The latter
    /// runs whatever the queue holds by then: a backend that gives up a place here must check
    /// that no local task waits (as `slate-zookeeper` does under its place's lock).
    ///
    /// Hooks run outside the synchronizer's lock, so this call may reach the backend after a
    /// newly arrived head's `prepare_wait` switched notifications back on. That head then
    /// waits at most its spin wait, and its next `prepare_wait` switches them on again.
    fn queue_drained(&self) {}
}
