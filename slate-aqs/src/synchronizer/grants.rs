//! Grants, releases and passes: what a won attempt does to the local state, how a release
//! hands the lock on (to the queue, or to a passable waiter without a remote call), and the
//! notification that wakes the head.

use super::*;

impl<C: Competitor> Synchronizer<C> {
    /// Records a grant for `holder` (unlinking its waiter, if queued) and runs the hooks;
    /// `None` (the grant given back) if its lease had run out (see
    /// [`Competitor::grant_deadline`]) by `now`, the waiter's clock (tokio's, which honours
    /// paused time, or the thread's).
    pub(super) fn grant(
        &self,
        holder: HolderId,
        remote: HolderId,
        passable: bool,
        slot: &mut QueueSlot<'_, C>,
        grant: C::Grant,
        now: &dyn Fn() -> Instant,
    ) -> Result<Option<C::Grant>> {
        // Asked outside the lock (hooks never run under it); used for a fresh hold only.
        let budget = if passable {
            self.competitor.pass_budget(&grant)
        } else {
            0
        };
        let lease_end = self.competitor.grant_deadline(&grant);
        let (new_owner, displaced, readers, drained, unpassed) = {
            let mut st = self.lock();
            // Only a grant that would displace another holder is checked: a re-entry or a
            // grant on a free lock displaces nobody (and its guard reports its own loss).
            let displaces = match st.owner {
                Some(o) => !o.is(holder),
                None => !st.readers.is_empty(),
            };
            if displaces
                && lease_end.is_some_and(|end| now() >= end)
                && !mutant::active(Mutant::LateGrantDisplaces)
            {
                drop(st);
                return Ok(self.outlived(holder, remote, grant));
            }
            let fresh = Owner {
                holder: Some(holder),
                depth: 1,
                remote,
                passes_left: budget,
            };
            let new_owner = match st.owner {
                Some(o) if o.is(holder) => o.depth.checked_add(1).map(|depth| Owner { depth, ..o }),
                _ => Some(fresh),
            };
            let Some(new_owner) = new_owner else {
                let remote = st.owner.map_or(remote, |o| o.remote);
                drop(st);
                slot.leave();
                self.competitor.abandon(remote, grant);
                return Err(Error::invalid_input(
                    "re-entry depth",
                    format!("{holder} re-entered lock {} u32::MAX times", self.label),
                    "release some levels before acquiring again",
                ));
            };
            // The head leaves on a grant without waking its successor: the lock is now held
            // locally, and the successor is woken by the release.
            let (drained, timer) = match slot.key.take() {
                Some(key) => {
                    let (was_head, timer) = self.unlink(&mut st, key);
                    debug_assert!(was_head, "only the head attempts from the queue");
                    (st.queue.is_empty(), timer)
                }
                None => (false, Drained::default()),
            };
            // A different owner can only be recorded here if its remote hold already ended
            // (released remotely, local release not yet called; or lease lost): the remote
            // granted us. Its local hold is over: displace it. A hold that was being passed
            // is taken back from the head it was passed to, which is woken to see it.
            let displaced = match st.owner {
                Some(o) if !o.is(holder) => Some(o.remote),
                _ => None,
            };
            // Likewise shared holders beside a fresh exclusive grant: the remote ended their
            // holds before it granted this one (an exclusive attempt starts only with none).
            let readers = if st.owner.is_some_and(|o| o.is(holder)) {
                Vec::new()
            } else {
                st.readers.take_all()
            };
            let mut unpassed = None;
            if st.owner.is_some_and(|o| o.holder.is_none())
                && let Some(head) = st.queue.head()
            {
                let node = st.queue.node_mut(head);
                node.passed = false;
                unpassed = node.waker.take();
            }
            st.owner = Some(new_owner);
            st.debug_check();
            (
                new_owner,
                displaced,
                readers,
                drained,
                unpassed.into_iter().chain(timer),
            )
        };
        let (depth, remote) = (new_owner.depth, new_owner.remote);
        if let Some(old) = displaced {
            tracing::debug!(lock = %self.label, %holder, displaced = %old, "grant displaced a local owner whose remote hold had ended");
            self.competitor.after_release(old);
        }
        for (old, _) in readers {
            tracing::debug!(lock = %self.label, %holder, displaced = %old, "grant displaced a shared holder whose remote hold had ended");
            self.competitor.after_release_shared(old);
        }
        unpassed.for_each(Waker::wake);
        if drained {
            self.competitor.queue_drained();
        }
        self.competitor.after_acquire(remote, &grant);
        tracing::debug!(lock = %self.label, %holder, depth, "granted");
        Ok(Some(grant))
    }

    /// A grant processed after its lease ran out holds nothing: it is given back unrecorded
    /// (recording it would displace whoever the remote granted since).
    pub(super) fn outlived(
        &self,
        holder: HolderId,
        remote: HolderId,
        grant: C::Grant,
    ) -> Option<C::Grant> {
        tracing::debug!(lock = %self.label, %holder, "a grant was processed after its lease ran out; giving it back");
        self.competitor.abandon(remote, grant);
        None
    }

    /// Records a shared grant for `holder` (unlinking its waiter, if queued, and waking the
    /// next head so that shared waiters at the head are admitted one after the other) and
    /// runs the hooks; `None` (the grant given back) if its lease had run out by `now` (as
    /// [`grant`](Self::grant)).
    pub(super) fn grant_shared(
        &self,
        holder: HolderId,
        remote: HolderId,
        slot: &mut QueueSlot<'_, C>,
        grant: C::Grant,
        now: &dyn Fn() -> Instant,
    ) -> Result<Option<C::Grant>> {
        let lease_end = self.competitor.grant_deadline(&grant);
        let (displaced, drained, wakers) = {
            let mut st = self.lock();
            let displaces = st.owner.is_some_and(|o| !o.is(holder));
            if displaces
                && lease_end.is_some_and(|end| now() >= end)
                && !mutant::active(Mutant::LateGrantDisplaces)
            {
                drop(st);
                return Ok(self.outlived(holder, remote, grant));
            }
            if st.readers.add(holder).is_none() {
                drop(st);
                slot.leave();
                self.competitor.abandon(remote, grant);
                return Err(Error::invalid_input(
                    "re-entry depth",
                    format!("{holder} took lock {} shared u32::MAX times", self.label),
                    "release some levels before acquiring again",
                ));
            }
            let mut wakers = Vec::new();
            let drained = match slot.key.take() {
                Some(key) => {
                    let (was_head, timer) = self.unlink(&mut st, key);
                    debug_assert!(was_head, "only the head attempts from the queue");
                    wakers.extend(timer);
                    // The next head may be shared too: it attempts now rather than at the
                    // next release (an exclusive one finds the lock held and parks again).
                    wakers.extend(st.queue.take_head_waker());
                    st.queue.is_empty()
                }
                None => false,
            };
            // An exclusive owner other than `holder` beside a shared grant: its remote hold
            // ended before the remote admitted this one (displaced, as in `grant`); a hold
            // being passed is taken back from the head it was passed to.
            let displaced = match st.owner {
                Some(o) if !o.is(holder) => {
                    if o.holder.is_none()
                        && let Some(head) = st.queue.head()
                    {
                        let node = st.queue.node_mut(head);
                        node.passed = false;
                        wakers.extend(node.waker.take());
                    }
                    st.owner = None;
                    Some(o.remote)
                }
                _ => None,
            };
            st.debug_check();
            (displaced, drained, wakers)
        };
        if let Some(old) = displaced {
            tracing::debug!(lock = %self.label, %holder, displaced = %old, "shared grant displaced a local owner whose remote hold had ended");
            self.competitor.after_release(old);
        }
        wakers.into_iter().for_each(Waker::wake);
        if drained {
            self.competitor.queue_drained();
        }
        self.competitor.after_acquire(remote, &grant);
        tracing::debug!(lock = %self.label, %holder, "granted shared");
        Ok(Some(grant))
    }

    /// Records that `holder`, the head, took the hold of `passed` it was passed, and runs the
    /// hooks. `None` when the pass was taken back between the head's decision and now (the
    /// competitor's `take_pass` runs outside the lock): an attempt in flight from before was
    /// granted and displaced the passing owner (this was a panic). The
    /// pass's grant then goes back to the competitor (`abandon`), and the head, still queued,
    /// waits on.
    pub(super) fn take_pass(
        &self,
        holder: HolderId,
        passed: HolderId,
        slot: &mut QueueSlot<'_, C>,
        grant: C::Grant,
    ) -> Option<C::Grant> {
        let (drained, remote, timer) = {
            let mut st = self.lock();
            let key = slot.key.filter(|&key| {
                st.queue.node_mut(key).passed
                    && st
                        .owner
                        .is_some_and(|o| o.holder.is_none() && o.remote == passed)
            });
            let (Some(key), Some(owner)) = (key, st.owner.as_mut()) else {
                drop(st);
                tracing::debug!(lock = %self.label, %holder, "a pass was taken back before it was recorded; giving it back");
                self.competitor.abandon(passed, grant);
                return None;
            };
            owner.holder = Some(holder);
            let remote = owner.remote;
            slot.key = None;
            let (was_head, timer) = self.unlink(&mut st, key);
            debug_assert!(was_head, "only the head is passed the hold");
            st.debug_check();
            (st.queue.is_empty(), remote, timer)
        };
        timer.wake();
        if drained {
            self.competitor.queue_drained();
        }
        self.competitor.after_acquire(remote, &grant);
        tracing::debug!(lock = %self.label, %holder, "took a passed hold");
        Some(grant)
    }

    /// The competitor refused the hold the head was passed: it goes to `drop_pass`, the lock
    /// is free locally, and the head (still queued) attempts remotely.
    pub(super) fn refuse_pass(&self, slot: &mut QueueSlot<'_, C>, remote: HolderId) {
        {
            let mut st = self.lock();
            // Only the pass that was refused: another owner may have displaced it and
            // passed its own hold to this head meanwhile (review of issue 28, item 11).
            if st
                .owner
                .is_some_and(|o| o.holder.is_none() && o.remote == remote)
            {
                if let Some(key) = slot.key {
                    st.queue.node_mut(key).passed = false;
                }
                st.owner = None;
                st.bump_epoch();
            }
            st.debug_check();
        }
        tracing::debug!(lock = %self.label, %remote, "a passed hold was refused; releasing it");
        self.competitor.drop_pass(remote);
    }

    /// Releases one local level of `holder`'s hold and returns the levels `holder` still holds
    /// locally (0 once released, and for a holder that is not the local owner).
    ///
    /// The backend calls this **after** its remote release, whatever that release's outcome.
    /// At depth 0 the owner is cleared, [`Competitor::after_release`] runs and the head of the
    /// queue is woken. A call for a holder that is not the local owner does nothing (its hold
    /// was already displaced by a newer grant, see `after_release`'s contract).
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
    /// sync.blocking_acquire(me, Wait::Forever)?;
    /// assert_eq!(sync.release(me), 1);
    /// assert_eq!(sync.owner(), Some((me, 1)));
    /// assert_eq!(sync.release(me), 0);
    /// assert_eq!(sync.owner(), None);
    /// # Ok::<(), slate_aqs::Error>(())
    /// ```
    pub fn release(&self, holder: HolderId) -> u32 {
        let (waker, remote) = {
            let mut st = self.lock();
            match &mut st.owner {
                Some(o) if o.is(holder) => {
                    debug_assert!(o.depth >= 1, "owner depth is at least 1");
                    if o.depth > 1 {
                        o.depth -= 1;
                        tracing::trace!(lock = %self.label, %holder, depth = o.depth, "released one level");
                        return o.depth;
                    }
                    let remote = o.remote;
                    st.owner = None;
                    st.bump_epoch();
                    st.debug_check();
                    (st.queue.take_head_waker(), remote)
                }
                _ => {
                    tracing::debug!(lock = %self.label, %holder, "release by a holder that is not the local owner; ignored");
                    return 0;
                }
            }
        };
        tracing::debug!(lock = %self.label, %holder, "released");
        self.competitor.after_release(remote);
        if let Some(waker) = waker {
            tracing::trace!(lock = %self.label, "waking the head after a local release");
            waker.wake();
        }
        0
    }

    /// Releases one local level of `holder`'s **shared** hold and returns the shared levels
    /// `holder` still holds locally (0 once released, and for a holder that holds none).
    ///
    /// The backend calls this after its remote release, whatever that release's outcome. At
    /// depth 0, [`Competitor::after_release_shared`] runs and the head of the queue is woken
    /// (an exclusive head waits for the last reader; a shared head may find the remote has
    /// room again).
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
    /// assert_eq!(sync.release_shared(me), 0);
    /// assert!(sync.shared_holders().is_empty());
    /// # Ok::<(), slate_aqs::Error>(())
    /// ```
    pub fn release_shared(&self, holder: HolderId) -> u32 {
        let waker = {
            let mut st = self.lock();
            match st.readers.release(holder) {
                None => {
                    tracing::debug!(lock = %self.label, %holder, "shared release by a holder that holds none; ignored");
                    return 0;
                }
                Some(left) if left > 0 => return left,
                Some(_) => {
                    st.bump_epoch();
                    st.debug_check();
                    st.queue.take_head_waker()
                }
            }
        };
        tracing::debug!(lock = %self.label, %holder, "released shared");
        self.competitor.after_release_shared(holder);
        if let Some(waker) = waker {
            waker.wake();
        }
        0
    }

    /// Passes `holder`'s hold to the head of the queue instead of releasing it (lock
    /// cohorting): `true` if it did, and then the backend must **not** release remotely:
    /// the head takes over the remote hold as it is, through [`Competitor::take_pass`].
    ///
    /// A backend calls this before the remote release of `holder`'s **last** level. It passes
    /// when `holder` is the local owner at depth 1, its remote hold has passes left (its
    /// [`pass_budget`](Competitor::pass_budget), counted down across the receivers), and the
    /// head of the queue is a passable waiter (see
    /// [`acquire_passable`](Synchronizer::acquire_passable)) with no attempt in flight.
    /// Otherwise it changes nothing and answers `false`: release remotely, then call
    /// [`release`](Synchronizer::release).
    ///
    /// After a pass, [`owner`](Synchronizer::owner) is `None` until the receiver runs and
    /// takes the hold (it is then the owner at depth 1); meanwhile no other waiter starts an
    /// attempt and [`Wait::Immediate`] callers are told busy.
    /// [`Competitor::after_release`] is not called: the remote hold goes on.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use slate_aqs::{HolderId, Wait};
    /// # use std::time::Duration;
    /// let competitor = MemoryCompetitor::new(MemoryRemote::new());
    /// competitor.set_pass_budget(8);
    /// let sync = Synchronizer::new("a", competitor, Duration::from_millis(50));
    /// let me = HolderId::new();
    /// sync.blocking_acquire_passable(me, Wait::Forever)?;
    /// assert!(!sync.try_pass(me)); // acquired alone, and nobody waits: release remotely
    /// # Ok::<(), slate_aqs::Error>(())
    /// ```
    pub fn try_pass(&self, holder: HolderId) -> bool {
        let waker = {
            let mut st = self.lock();
            let State {
                owner,
                queue,
                readers,
                ..
            } = &mut *st;
            let Some(o) = owner.as_mut() else {
                return false;
            };
            if !o.is(holder) || o.depth != 1 || o.passes_left == 0 || !readers.is_empty() {
                return false;
            }
            let Some(head) = queue.head() else {
                return false;
            };
            let node = queue.node_mut(head);
            if !node.passable || node.in_flight || node.passed {
                return false;
            }
            node.passed = true;
            o.holder = None;
            o.passes_left -= 1;
            st.debug_check();
            st.queue.node_mut(head).waker.take()
        };
        tracing::debug!(lock = %self.label, %holder, "passed the hold to the head of the queue");
        if let Some(waker) = waker {
            waker.wake();
        }
        true
    }

    /// The holder whose remote hold `holder` uses: `holder` itself, unless it is the local
    /// owner by a pass (see [`try_pass`](Synchronizer::try_pass)), in which case it is the
    /// holder that acquired the hold remotely. Backends name this holder in their remote
    /// calls (re-entry, release, queries).
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use slate_aqs::HolderId;
    /// # use std::time::Duration;
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// let me = HolderId::new();
    /// assert_eq!(sync.remote_holder(me), me);
    /// ```
    pub fn remote_holder(&self, holder: HolderId) -> HolderId {
        match self.lock().owner {
            Some(o) if o.is(holder) => o.remote,
            _ => holder,
        }
    }

    /// Reports that the remote lock was released (e.g. a pub/sub unlock message): the head
    /// retries now instead of waiting for its timer.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_aqs::{Synchronizer, testing::{MemoryCompetitor, MemoryRemote}};
    /// # use std::time::Duration;
    /// let sync = Synchronizer::new("a", MemoryCompetitor::new(MemoryRemote::new()), Duration::from_millis(50));
    /// sync.notify_released(); // nobody waits: nothing happens
    /// assert_eq!(sync.waiters(), 0);
    /// ```
    pub fn notify_released(&self) {
        let waker = {
            let mut st = self.lock();
            st.bump_epoch();
            st.queue.take_head_waker()
        };
        if let Some(waker) = waker {
            tracing::trace!(lock = %self.label, "waking the head after a release notification");
            waker.wake();
        }
    }
}
