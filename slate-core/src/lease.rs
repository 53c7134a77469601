//! Lease state and the loss signal shared by a lock's renewal machinery and its guard.

use std::fmt;
use std::time::Instant;

use tokio::sync::watch;

use crate::metrics::Meter;
use crate::mutant::{self, Mutant};

/// Why a lease was lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// Renewal found the holder's entry gone (expired, deleted, or the server lost its data).
    EntryGone,
    /// No renewal succeeded before the lease deadline (server hung, network down, process
    /// paused).
    DeadlineExpired,
    /// The optional max hold time was reached; renewal stopped and the lease ran out.
    MaxHoldReached,
    /// Fewer nodes than the quorum could be renewed (combination lock).
    QuorumLost {
        /// Nodes renewed successfully.
        renewed: usize,
        /// Nodes required.
        required: usize,
    },
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::EntryGone => f.write_str("the lock entry is gone"),
            LossReason::DeadlineExpired => f.write_str("no renewal succeeded before the deadline"),
            LossReason::MaxHoldReached => f.write_str("the max hold time was reached"),
            LossReason::QuorumLost { renewed, required } => {
                write!(
                    f,
                    "only {renewed} of the {required} required nodes could be renewed"
                )
            }
        }
    }
}

/// The monotonic clock, read through tokio so that paused-time tests see the same clock as
/// the timers.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Whether `deadline` has passed (never, under the `lease-ignores-deadline` mutant).
fn passed(deadline: Instant) -> bool {
    !mutant::active(Mutant::LeaseIgnoresDeadline) && now() >= deadline
}

/// When a watcher looks at `deadline` again (a day later under the `lease-ignores-deadline`
/// mutant).
fn wake_at(deadline: Instant) -> Instant {
    if mutant::active(Mutant::LeaseIgnoresDeadline) {
        deadline
            .checked_add(std::time::Duration::from_secs(86_400))
            .unwrap_or(deadline)
    } else {
        deadline
    }
}

#[derive(Clone, Copy, Debug)]
struct State {
    deadline: Instant,
    lost: Option<LossReason>,
}

/// Creates the two ends of a lease: the [`LeaseKeeper`] for the renewal machinery and the
/// [`LeaseWatch`] for the guard.
///
/// # Examples
///
/// ```
/// use slate_core::lease::{self, LossReason};
/// use std::time::{Duration, Instant};
///
/// let (keeper, watch) = lease::channel(Instant::now() + Duration::from_secs(30));
/// assert!(!watch.is_lost());
/// keeper.lose(LossReason::EntryGone);
/// assert_eq!(watch.loss_reason(), Some(LossReason::EntryGone));
/// ```
#[must_use]
pub fn channel(deadline: Instant) -> (LeaseKeeper, LeaseWatch) {
    let (tx, rx) = watch::channel(State {
        deadline,
        lost: None,
    });
    (LeaseKeeper { tx, meter: None }, LeaseWatch { rx })
}

/// The writing end of a lease: moves the deadline on renewal and signals loss.
///
/// Loss is final: once [`lose`](LeaseKeeper::lose) was called, the deadline no longer moves.
#[derive(Debug)]
pub struct LeaseKeeper {
    tx: watch::Sender<State>,
    /// Where a loss is counted (`slate_lease_lost_total`), if anywhere.
    meter: Option<Meter>,
}

impl LeaseKeeper {
    /// Counts this lease's loss, once, on `meter` (`slate_lease_lost_total`): for the keeper
    /// of a lock's own lease (not of one node's entry within a lock, whose loss the lock may
    /// survive).
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_core::{lease, metrics::Meter};
    /// let (keeper, _watch) = lease::channel(std::time::Instant::now());
    /// let keeper = keeper.with_meter(Meter::custom());
    /// ```
    #[must_use]
    pub fn with_meter(mut self, meter: Meter) -> Self {
        self.meter = Some(meter);
        self
    }

    /// Moves the deadline after a successful renewal. Ignored once the lease is lost, and never
    /// moves the deadline backwards.
    ///
    /// Loss is final, and a deadline that has passed is a loss: a renewal whose answer comes
    /// after the deadline does not bring the lease back (a guard may already have told its
    /// holder to stop); it signals [`LossReason::DeadlineExpired`] instead.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use slate_core::lease::{self, LossReason};
    /// let now = Instant::now();
    /// let (keeper, watch) = lease::channel(now + Duration::from_secs(1));
    /// keeper.extend(now + Duration::from_secs(2));
    /// assert_eq!(watch.deadline(), now + Duration::from_secs(2));
    ///
    /// // Too late: the deadline had passed.
    /// let (keeper, watch) = lease::channel(now);
    /// keeper.extend(now + Duration::from_secs(60));
    /// assert_eq!(watch.deadline(), now);
    /// assert_eq!(watch.loss_reason(), Some(LossReason::DeadlineExpired));
    /// assert!(keeper.is_lost());
    /// ```
    pub fn extend(&self, deadline: Instant) {
        self.tx.send_if_modified(|s| {
            if s.lost.is_some() {
                false
            } else if passed(s.deadline) {
                s.lost = Some(LossReason::DeadlineExpired);
                // Counted before the watchers can see it.
                self.count_loss(&LossReason::DeadlineExpired);
                true
            } else if deadline > s.deadline {
                s.deadline = deadline;
                true
            } else {
                false
            }
        });
    }

    /// Sets the deadline, earlier or later: for a lease aggregated from others (a multi-node
    /// hold whose quorum-th latest node deadline moved back when a node was lost). Ignored once
    /// the lease is lost; once the current deadline has passed it signals
    /// [`LossReason::DeadlineExpired`] instead (loss is final).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// let now = Instant::now();
    /// let (keeper, watch) = slate_core::lease::channel(now + Duration::from_secs(2));
    /// keeper.set_deadline(now + Duration::from_secs(1));
    /// assert_eq!(watch.deadline(), now + Duration::from_secs(1));
    /// ```
    pub fn set_deadline(&self, deadline: Instant) {
        self.tx.send_if_modified(|s| {
            if s.lost.is_some() {
                false
            } else if passed(s.deadline) {
                // As in `extend`: a deadline that has passed is a loss, and loss is final.
                s.lost = Some(LossReason::DeadlineExpired);
                // Counted before the watchers can see it.
                self.count_loss(&LossReason::DeadlineExpired);
                true
            } else if deadline != s.deadline {
                s.deadline = deadline;
                true
            } else {
                false
            }
        });
    }

    fn count_loss(&self, reason: &LossReason) {
        if let Some(m) = &self.meter {
            m.lease_lost(reason);
        }
    }

    /// Signals that the lease is lost. The first reason wins.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_core::lease::{self, LossReason};
    /// let (keeper, watch) = lease::channel(std::time::Instant::now());
    /// keeper.lose(LossReason::MaxHoldReached);
    /// keeper.lose(LossReason::EntryGone);
    /// assert_eq!(watch.loss_reason(), Some(LossReason::MaxHoldReached));
    /// ```
    pub fn lose(&self, reason: LossReason) {
        self.tx.send_if_modified(|s| {
            if s.lost.is_none() {
                s.lost = Some(reason);
                // Counted before the watchers can see it.
                self.count_loss(&reason);
                true
            } else {
                false
            }
        });
    }

    /// The current deadline.
    ///
    /// # Examples
    ///
    /// ```
    /// let t = std::time::Instant::now();
    /// assert_eq!(slate_core::lease::channel(t).0.deadline(), t);
    /// ```
    #[must_use]
    pub fn deadline(&self) -> Instant {
        self.tx.borrow().deadline
    }

    /// Whether loss was signalled (the deadline passing alone does not count here).
    ///
    /// # Examples
    ///
    /// ```
    /// let (keeper, _watch) = slate_core::lease::channel(std::time::Instant::now());
    /// assert!(!keeper.is_lost());
    /// ```
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.tx.borrow().lost.is_some()
    }

    /// Whether every [`LeaseWatch`] was dropped (nobody is listening any more).
    ///
    /// # Examples
    ///
    /// ```
    /// let (keeper, watch) = slate_core::lease::channel(std::time::Instant::now());
    /// drop(watch);
    /// assert!(keeper.is_abandoned());
    /// ```
    #[must_use]
    pub fn is_abandoned(&self) -> bool {
        self.tx.is_closed()
    }

    /// A new watch on this lease.
    ///
    /// # Examples
    ///
    /// ```
    /// let (keeper, _) = slate_core::lease::channel(std::time::Instant::now());
    /// let _watch = keeper.watch();
    /// assert!(!keeper.is_abandoned());
    /// ```
    #[must_use]
    pub fn watch(&self) -> LeaseWatch {
        LeaseWatch {
            rx: self.tx.subscribe(),
        }
    }
}

/// The reading end of a lease, held by the guard: deadline and loss signal.
///
/// A lease counts as lost when loss was signalled **or** its deadline has passed: past the
/// deadline nobody can tell whether the entry still exists, so the holder must not act on it.
#[derive(Clone, Debug)]
pub struct LeaseWatch {
    rx: watch::Receiver<State>,
}

impl LeaseWatch {
    /// The lease deadline on the monotonic clock. It moves forward with every renewal.
    ///
    /// # Examples
    ///
    /// ```
    /// let t = std::time::Instant::now();
    /// assert_eq!(slate_core::lease::channel(t).1.deadline(), t);
    /// ```
    #[must_use]
    pub fn deadline(&self) -> Instant {
        self.rx.borrow().deadline
    }

    /// Whether the keeper is gone (the hold was released or dropped): the lease will not
    /// change any more, and [`changed`](Self::changed) completes at once.
    ///
    /// # Examples
    ///
    /// ```
    /// let (keeper, watch) = slate_core::lease::channel(std::time::Instant::now());
    /// assert!(!watch.is_closed());
    /// drop(keeper);
    /// assert!(watch.is_closed());
    /// ```
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.rx.has_changed().is_err()
    }

    /// Whether the lease is lost: loss signalled, or the deadline passed.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// let (_k, w) = slate_core::lease::channel(Instant::now() + Duration::from_secs(60));
    /// assert!(!w.is_lost());
    /// let (_k, w) = slate_core::lease::channel(Instant::now());
    /// assert!(w.is_lost());
    /// ```
    #[must_use]
    pub fn is_lost(&self) -> bool {
        let s = *self.rx.borrow();
        s.lost.is_some() || passed(s.deadline)
    }

    /// Why the lease was lost, if it was: the signalled reason, or
    /// [`LossReason::DeadlineExpired`] once the deadline passed.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_core::lease::{self, LossReason};
    /// let (_k, w) = lease::channel(std::time::Instant::now());
    /// assert_eq!(w.loss_reason(), Some(LossReason::DeadlineExpired));
    /// ```
    #[must_use]
    pub fn loss_reason(&self) -> Option<LossReason> {
        let s = *self.rx.borrow();
        s.lost
            .or_else(|| passed(s.deadline).then_some(LossReason::DeadlineExpired))
    }

    /// Completes when the deadline moved or loss was signalled since this watch last looked
    /// (or at once if the keeper is gone, which also ends every later call at once).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
    /// let now = Instant::now();
    /// let (keeper, mut watch) = slate_core::lease::channel(now + Duration::from_secs(1));
    /// keeper.extend(now + Duration::from_secs(2));
    /// watch.changed().await;
    /// assert_eq!(watch.deadline(), now + Duration::from_secs(2));
    /// # });
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a change seen by a dropped call is seen by the next one.
    pub async fn changed(&mut self) {
        // An error means the keeper is gone: nothing will change any more, and the caller
        // looks at the deadline.
        let _ = self.rx.changed().await;
        self.rx.borrow_and_update();
    }

    /// Completes when the lease is lost: at the signal, or when the (moving) deadline passes,
    /// whichever comes first. Needs a tokio runtime with the time driver.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_core::lease::{self, LossReason};
    /// use std::time::{Duration, Instant};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build()?.block_on(async {
    /// let (keeper, watch) = lease::channel(Instant::now() + Duration::from_secs(60));
    /// keeper.lose(LossReason::EntryGone);
    /// assert_eq!(watch.lost().await, LossReason::EntryGone);
    /// # });
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes; drop it and call again at any time.
    pub async fn lost(&self) -> LossReason {
        let mut rx = self.rx.clone();
        loop {
            let s = *rx.borrow_and_update();
            if let Some(reason) = s.lost {
                return reason;
            }
            tokio::select! {
                changed = rx.changed() => {
                    if changed.is_err() {
                        // The keeper is gone (the lock's machinery stopped): only the deadline
                        // remains meaningful.
                        let deadline = rx.borrow().deadline;
                        tokio::time::sleep_until(wake_at(deadline).into()).await;
                        return rx.borrow().lost.unwrap_or(LossReason::DeadlineExpired);
                    }
                }
                () = tokio::time::sleep_until(wake_at(s.deadline).into()) => {
                    let s = *rx.borrow();
                    if let Some(reason) = s.lost {
                        return reason;
                    }
                    if passed(s.deadline) {
                        return LossReason::DeadlineExpired;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn lost_follows_a_moving_deadline() {
        let start = now();
        let (keeper, watch) = channel(start + Duration::from_secs(1));
        let waiter = tokio::spawn({
            let watch = watch.clone();
            async move { (watch.lost().await, now()) }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        keeper.extend(start + Duration::from_secs(3));
        let (reason, at) = waiter.await.expect("join");
        assert_eq!(reason, LossReason::DeadlineExpired);
        assert!(
            at >= start + Duration::from_secs(3),
            "fired at {:?}",
            at - start
        );
    }

    #[tokio::test(start_paused = true)]
    async fn extend_after_loss_is_ignored() {
        let now = now();
        let (keeper, watch) = channel(now + Duration::from_secs(1));
        keeper.lose(LossReason::EntryGone);
        keeper.extend(now + Duration::from_secs(10));
        assert_eq!(watch.deadline(), now + Duration::from_secs(1));
        assert_eq!(watch.lost().await, LossReason::EntryGone);
    }

    /// a renewal answered after the deadline brought a lost lease back
    /// (`is_lost` true, then false again). Loss is final.
    #[tokio::test(start_paused = true)]
    async fn d18_a_passed_deadline_does_not_come_back() {
        let start = now();
        let (keeper, watch) = channel(start + Duration::from_secs(1));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(watch.is_lost());
        // The renewal sent at +0.9 s answers now: too late.
        keeper.extend(start + Duration::from_millis(900) + Duration::from_secs(1));
        assert!(watch.is_lost(), "the lease came back after its deadline");
        assert_eq!(watch.loss_reason(), Some(LossReason::DeadlineExpired));
        assert_eq!(watch.deadline(), start + Duration::from_secs(1));
        assert!(keeper.is_lost());
        keeper.set_deadline(start + Duration::from_secs(5));
        assert!(
            watch.is_lost(),
            "an aggregated deadline does not revive it either"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn dropped_keeper_still_ends_at_deadline() {
        let start = now();
        let (keeper, watch) = channel(start + Duration::from_secs(2));
        drop(keeper);
        assert_eq!(watch.lost().await, LossReason::DeadlineExpired);
        assert!(now() >= start + Duration::from_secs(2));
    }
}
