//! The acquisition driver: one loop per caller that decides under the lock (`decide`) and
//! awaits outside it (an attempt, `prepare_wait`, a park), with the queue slot, the timers and
//! the cancel paths.

use super::*;

impl<C: Competitor> Synchronizer<C> {
    /// The driver shared by `acquire` and `blocking_acquire`: one loop that decides under the
    /// lock (`decide`), then awaits outside it (an attempt, `prepare_wait`, or a park).
    ///
    /// A plain `fn` returning an `async move` block rather than an `async fn`: an `async fn`
    /// stores its arguments twice in its state (rust-lang/rust#62958), and parked waiters
    /// are what this crate keeps by the thousand.
    #[allow(clippy::manual_async_fn)] // on purpose, see above
    pub(super) fn run<'a, T: Timer + 'a>(
        &'a self,
        holder: HolderId,
        wait: Wait,
        mode: Mode,
        timer: T,
    ) -> impl Future<Output = Result<C::Grant>> + 'a {
        let (deadline, immediate) = (wait.deadline(), wait == Wait::Immediate);
        let (passable, shared) = (mode == Mode::Passable, mode == Mode::Shared);
        async move {
            // The waiter's clock (tokio's, which honours paused time, or the thread's), read
            // once per call: the wait's start, for its deadline's error and for the wait
            // histogram (`slate_acquire_wait_seconds`). Each attempt times itself in its
            // boxed future (`InFlight`), so that a parked waiter's future does not grow.
            let start = timer.now();
            let mut slot = QueueSlot {
                sync: self,
                key: None,
            };
            let mut retry = Retry::Now;
            // Allocated at the first timed park, then reset: parked waiters without a deadline
            // carry no timer at all.
            let mut sleep: Option<Pin<Box<T::Sleep>>> = None;
            let mut started_retried = false;
            loop {
                let now = (deadline.is_some() || matches!(retry, Retry::Parked { .. }))
                    .then(|| timer.now());
                let entry = Entry {
                    holder,
                    deadline,
                    immediate,
                    passable,
                    shared,
                    shared_timer: T::SHARED,
                };
                match self.decide(&mut slot, entry, now, retry) {
                    Step::LocallyBusy => {
                        self.meter.busy();
                        return Err(self.busy(None));
                    }
                    Step::Upgrade => {
                        self.meter.failed();
                        return Err(self.upgrade(holder));
                    }
                    Step::Timeout => {
                        slot.leave();
                        tracing::debug!(lock = %self.label, %holder, "wait timed out");
                        self.meter.timed_out();
                        return Err(self.timed_out(start, deadline, now));
                    }
                    Step::TakePass { remote } => match self.competitor.take_pass(remote, holder) {
                        Some(grant) => match self.take_pass(holder, remote, &mut slot, grant) {
                            Some(grant) => {
                                let waited = timer.now().saturating_duration_since(start);
                                self.meter.acquired(How::Pass, waited);
                                return Ok(grant);
                            }
                            // Taken back meanwhile: wait on as the head.
                            None => retry = Retry::Now,
                        },
                        None => {
                            self.refuse_pass(&mut slot, remote);
                            retry = Retry::Now;
                        }
                    },
                    Step::Attempt {
                        epoch,
                        reentrant,
                        remote,
                        passable,
                    } => {
                        let retry_after = match InFlight::start(
                            self, remote, reentrant, passable, shared,
                        )
                        .await
                        {
                            // The remote holder comes back with the answer: the future keeps
                            // one copy of it (in the attempt), not two.
                            (remote, Ok(Attempt::Acquired(grant))) => {
                                let now = || timer.now();
                                let recorded = if shared {
                                    self.grant_shared(holder, remote, &mut slot, grant, &now)
                                } else {
                                    self.grant(holder, remote, passable, &mut slot, grant, &now)
                                };
                                match recorded {
                                    Ok(Some(grant)) => {
                                        let how =
                                            if reentrant { How::Reentry } else { How::Remote };
                                        let waited = timer.now().saturating_duration_since(start);
                                        self.meter.acquired(how, waited);
                                        return Ok(grant);
                                    }
                                    // Its lease ran out before it was processed: given back,
                                    // and as good as a busy answer.
                                    Ok(None) => None,
                                    Err(e) => {
                                        self.meter.failed();
                                        return Err(e);
                                    }
                                }
                            }
                            (_, Ok(Attempt::Busy { retry_after })) => retry_after,
                            (_, Err(e)) => {
                                slot.leave_after_attempt();
                                tracing::debug!(lock = %self.label, %holder, error = %e, "attempt failed");
                                self.meter.failed();
                                return Err(e);
                            }
                        };
                        if immediate {
                            // The busy answer may have put this process in the backend's
                            // queue: with nobody queued here, nobody will claim that place.
                            if self.waiters() == 0 {
                                self.competitor.queue_drained();
                            }
                            self.meter.busy();
                            return Err(self.busy(retry_after));
                        }
                        if reentrant {
                            self.meter.failed();
                            return Err(self.lease_lost(holder));
                        }
                        let now = deadline.map(|_| timer.now());
                        if deadline.zip(now).is_some_and(|(d, now)| now >= d) {
                            slot.leave_after_attempt();
                            self.meter.timed_out();
                            return Err(self.timed_out(start, deadline, now));
                        }
                        tracing::trace!(lock = %self.label, %holder, ?retry_after, "busy");
                        retry = Retry::AfterBusy { epoch, retry_after };
                    }
                    Step::PrepareWait { epoch, retry_after } => {
                        let notifications = SyncFuture::new(self.competitor.prepare_wait()).await;
                        if notifications == Notifications::Started && !started_retried {
                            // A release may have slipped in before notifications were on.
                            started_retried = true;
                            retry = Retry::Now;
                        } else {
                            // With trusted live notifications, until the holder's lease
                            // or reservation ends by itself (at most the backend's cap);
                            // otherwise the spin wait.
                            let cap = match (notifications, self.competitor.live_park_cap()) {
                                (Notifications::Live, Some(cap)) => cap.max(self.spin_wait),
                                _ => self.spin_wait,
                            };
                            let delay = retry_after
                                .map_or(self.spin_wait, |r| r.min(cap))
                                .max(MIN_RETRY_DELAY);
                            retry = Retry::Parked {
                                epoch,
                                at: timer.now().checked_add(delay),
                            };
                        }
                    }
                    Step::Park {
                        key,
                        cond,
                        until,
                        on_timer,
                    } => {
                        if on_timer {
                            crate::deadlines::ensure(&self.state);
                        }
                        let timed = match until {
                            None => None,
                            Some(at) => match sleep.as_mut() {
                                Some(s) => {
                                    timer.reset(s.as_mut(), at);
                                    Some(s.as_mut())
                                }
                                None => {
                                    Some(sleep.insert(Box::pin(timer.sleep_until(at))).as_mut())
                                }
                            },
                        };
                        tracing::trace!(lock = %self.label, %holder, ?cond, "parked");
                        let sync = self;
                        Park {
                            sync,
                            key,
                            cond,
                            sleep: timed,
                        }
                        .await;
                        tracing::trace!(lock = %self.label, %holder, "woke");
                        match cond {
                            Cond::Epoch(_) => started_retried = false,
                            // Woken as the new head: the retry state of its own busy entry
                            // attempt, made before it waited behind another head, says nothing
                            // about the lock now; attempt rather than park a full spin wait
                            // from now (issue 28, item 13).
                            Cond::Head if !mutant::active(Mutant::NewHeadKeepsRetry) => {
                                retry = Retry::Now;
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
    }

    /// Decides the caller's next step, under the lock; joins the queue when the entry rules
    /// say so (in the same critical section as the check).
    pub(super) fn decide(
        &self,
        slot: &mut QueueSlot<'_, C>,
        entry: Entry,
        now: Option<Instant>,
        retry: Retry,
    ) -> Step {
        let Entry {
            holder,
            deadline,
            immediate,
            passable,
            shared,
            shared_timer,
        } = entry;
        let mut st = self.lock();
        let key = match slot.key {
            Some(key) => {
                let node = st.queue.node_mut(key);
                node.in_flight = false;
                if node.passed {
                    // Passed the hold (even past its deadline: a grant is never refused).
                    let Some(owner) = st.owner else {
                        unreachable!("a passed head implies a passing owner (check_invariants)")
                    };
                    return Step::TakePass {
                        remote: owner.remote,
                    };
                }
                if st.queue.is_expired(key) {
                    return Step::Timeout;
                }
                key
            }
            None => {
                // Entry rules (a busy entry attempt, `AfterBusy`, always queues).
                let reader = st.readers.depth(holder) > 0;
                let entry = match (st.owner, retry) {
                    (_, Retry::AfterBusy { .. }) => None,
                    // Exclusive re-entry, or the read an exclusive hold covers.
                    (Some(o), _) if o.is(holder) => Some((true, o.remote)),
                    _ if reader && shared => Some((true, holder)),
                    _ if reader => return Step::Upgrade,
                    _ if !st.locally_free(shared) && immediate => return Step::LocallyBusy,
                    // A shared try does not pass its own process's queued waiters: its grant
                    // would take the place they keep among the backend's waiters (a polling
                    // `try_read` starved its process's queued writer; issue 35, defect 11).
                    _ if immediate && shared && !st.queue.is_empty() => {
                        return Step::LocallyBusy;
                    }
                    _ if !st.locally_free(shared) => None,
                    _ if immediate || st.queue.is_empty() => Some((false, holder)),
                    _ => None,
                };
                if let Some((reentrant, remote)) = entry {
                    return Step::Attempt {
                        epoch: st.epoch,
                        reentrant,
                        remote,
                        passable: false,
                    };
                }
                debug_assert!(!immediate, "an immediate acquire never queues");
                let timer = match (deadline, now) {
                    (Some(deadline), Some(now)) if shared_timer => {
                        let empty = st.queue.no_deadlines();
                        Some(st.timers.ticks(deadline, now, empty))
                    }
                    _ => None,
                };
                let key = st.queue.push_back(passable, timer);
                self.meter.queued(true);
                slot.key = Some(key);
                tracing::trace!(lock = %self.label, %holder, waiters = st.queue.len(), "queued");
                key
            }
        };
        if deadline.zip(now).is_some_and(|(d, now)| now >= d) {
            return Step::Timeout;
        }
        // A deadline on the shared timer needs no sleep of the waiter's own.
        let on_timer = st.queue.on_timer(key);
        let deadline = if on_timer { None } else { deadline };
        if !st.queue.is_head(key) {
            return Step::Park {
                key,
                cond: Cond::Head,
                until: deadline,
                on_timer,
            };
        }
        // A hold is worth passing only if someone waits behind the head to take it.
        let passable = passable && st.queue.len() > 1;
        let step = match st.owner {
            Some(o) if o.is(holder) => Step::Attempt {
                epoch: st.epoch,
                reentrant: true,
                remote: o.remote,
                passable: false,
            },
            _ if !st.locally_free(shared) => Step::Park {
                key,
                cond: Cond::Free { shared },
                until: deadline,
                on_timer,
            },
            _ => match retry {
                Retry::Now => Step::Attempt {
                    epoch: st.epoch,
                    reentrant: false,
                    remote: remote_for(holder, passable),
                    passable,
                },
                Retry::AfterBusy { epoch, retry_after } => Step::PrepareWait { epoch, retry_after },
                Retry::Parked { epoch, at }
                    if st.epoch != epoch || at.zip(now).is_some_and(|(at, now)| now >= at) =>
                {
                    Step::Attempt {
                        epoch: st.epoch,
                        reentrant: false,
                        remote: remote_for(holder, passable),
                        passable,
                    }
                }
                Retry::Parked { epoch, at } => Step::Park {
                    key,
                    cond: Cond::Epoch(epoch),
                    until: match (at, deadline) {
                        (Some(at), Some(d)) => Some(at.min(d)),
                        (at, d) => at.or(d),
                    },
                    on_timer,
                },
            },
        };
        if let Step::Attempt { .. } = step {
            debug_assert!(
                st.queue.is_head(key),
                "only the head attempts from the queue"
            );
            st.queue.node_mut(key).in_flight = true;
        }
        step
    }

    pub(super) fn poll_cond(&self, key: usize, cond: Cond, cx: &mut Context<'_>) -> bool {
        let mut st = self.lock();
        // A timed waiter is also ready when its deadline expired, or when no timer task on the
        // runtime polling it will wake it in time (its task was dropped with its runtime, or
        // it was parked from another runtime): it re-parks through `deadlines::ensure`.
        let ready = st.queue.node_mut(key).passed
            || st.queue.is_expired(key)
            || st
                .queue
                .deadline_of(key)
                .is_some_and(|d| !st.timers.serves_here(d))
            || match cond {
                Cond::Head => st.queue.is_head(key),
                Cond::Free { shared } => st.locally_free(shared),
                Cond::Epoch(epoch) => st.epoch != epoch,
            };
        if !ready {
            let node = st.queue.node_mut(key);
            match &node.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => node.waker = Some(cx.waker().clone()),
            }
        }
        ready
    }

    /// The timeout error; `start` and `now` are read whenever a deadline is set.
    pub(super) fn timed_out(
        &self,
        start: Instant,
        deadline: Option<Instant>,
        now: Option<Instant>,
    ) -> Error {
        let since =
            |t: Option<Instant>| t.map_or(Duration::ZERO, |t| t.saturating_duration_since(start));
        Error::timeout(
            self.label.clone(),
            TimeoutKind::Wait,
            since(deadline),
            since(now),
        )
    }

    pub(super) fn upgrade(&self, holder: HolderId) -> Error {
        Error::invalid_input(
            "upgrade",
            format!(
                "{holder} holds lock {} shared and asked for it exclusively; an upgrade would deadlock against another shared holder doing the same",
                self.label
            ),
            "release the shared hold first, or take the exclusive hold first and then the shared one it covers",
        )
    }

    pub(super) fn lease_lost(&self, holder: HolderId) -> Error {
        tracing::debug!(lock = %self.label, %holder, "re-entrant attempt found the lock held by another holder");
        Error::lease_lost(self.label.clone(), holder, LossReason::EntryGone)
    }

    /// Unlinks a waiter that leaves without a grant and passes its turn on. A waiter that
    /// was passed the hold passes it on to the next waiter if that one is passable, and
    /// otherwise frees the lock locally and gives the hold to `drop_pass`.
    pub(super) fn leave(&self, key: usize) {
        let (waker, drained, dropped, timer) = {
            let mut st = self.lock();
            let passed = st.queue.node_mut(key).passed;
            let (was_head, timer) = self.unlink(&mut st, key);
            let mut dropped = None;
            if passed {
                debug_assert!(was_head, "only the head is passed the hold");
                let next = st.queue.head().filter(|&h| {
                    let n = st.queue.node_mut(h);
                    n.passable && !n.in_flight
                });
                match next {
                    Some(next) => st.queue.node_mut(next).passed = true,
                    None => {
                        dropped = st.owner.map(|o| o.remote);
                        st.owner = None;
                        st.bump_epoch();
                    }
                }
                st.debug_check();
            }
            let waker = if was_head {
                st.queue.take_head_waker()
            } else {
                None
            };
            (waker, st.queue.is_empty(), dropped, timer)
        };
        timer.wake();
        if let Some(remote) = dropped {
            tracing::debug!(lock = %self.label, %remote, "a waiter passed the hold left; releasing it");
            self.competitor.drop_pass(remote);
        }
        if let Some(waker) = waker {
            tracing::trace!(lock = %self.label, "head left; waking the next waiter");
            waker.wake();
        }
        if drained {
            self.competitor.queue_drained();
        }
    }

    pub(super) fn busy(&self, retry_after: Option<Duration>) -> Error {
        Error::busy(Arc::clone(&self.label), retry_after)
    }
}
