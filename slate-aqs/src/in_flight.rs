//! A remote attempt in flight, and what happens to it when its acquire future is dropped.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use std::time::{Duration, Instant};

use slate_core::metrics::Outcome;
use slate_core::{HolderId, Result};

use crate::Synchronizer;
use crate::competitor::{Attempt, Competitor};

/// An attempt, boxed with the remote holder it is for (which it answers with) and timed: the
/// holder and the send's time live in the box the attempt needs anyway, not in every acquire
/// future.
type BoxAttempt<G> =
    Pin<Box<dyn Future<Output = (HolderId, Result<Attempt<G>>, Duration)> + Send + 'static>>;

/// Boxes `attempt` with the remote holder it is for, and times it (`slate_attempt_seconds`).
fn tagged<G, F>(holder: HolderId, attempt: F) -> BoxAttempt<G>
where
    F: Future<Output = Result<Attempt<G>>> + Send + 'static,
{
    Box::pin(async move {
        let sent = Instant::now();
        let answer = attempt.await;
        (holder, answer, sent.elapsed())
    })
}

/// Owns one boxed attempt until it completes.
///
/// If it is dropped first (its acquire future was cancelled), the attempt moves to a
/// background task that finishes it and hands any grant to [`Competitor::abandon`], so a
/// grant is never leaked. Where that task runs, in order of preference: the tokio runtime
/// of the dropping thread, the runtime captured when the synchronizer was built, a new
/// detached thread.
pub(crate) struct InFlight<'a, C: Competitor> {
    /// The `Mutex` is never locked: `get_mut` gives access through `&mut self`. It is there
    /// only to make this type (and so every acquire future) `Sync` although attempt futures
    /// are only required to be `Send`.
    attempt: Mutex<Option<BoxAttempt<C::Grant>>>,
    sync: &'a Synchronizer<C>,
}

impl<'a, C: Competitor> InFlight<'a, C> {
    /// Starts an attempt for the remote holder `holder`: in shared mode when `shared`
    /// ([`Competitor::reenter_shared`] when `reentrant`, else
    /// [`Competitor::attempt_shared`]); otherwise [`Competitor::reenter`] when `reentrant`,
    /// else [`Competitor::attempt_passable`] when `passable`, else [`Competitor::attempt`].
    pub(crate) fn start(
        sync: &'a Synchronizer<C>,
        holder: HolderId,
        reentrant: bool,
        passable: bool,
        shared: bool,
    ) -> Self {
        let competitor = sync.competitor_arc();
        let attempt = match (shared, reentrant, passable) {
            (true, true, _) => tagged(holder, competitor.reenter_shared(holder)),
            (true, false, _) => tagged(holder, competitor.attempt_shared(holder)),
            (false, true, _) => tagged(holder, competitor.reenter(holder)),
            (false, false, true) => tagged(holder, competitor.attempt_passable(holder)),
            (false, false, false) => tagged(holder, competitor.attempt(holder)),
        };
        InFlight {
            attempt: Mutex::new(Some(attempt)),
            sync,
        }
    }
}

impl<C: Competitor> Future for InFlight<'_, C> {
    /// The remote holder the attempt was for, and its answer.
    type Output = (HolderId, Result<Attempt<C::Grant>>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // `InFlight` is `Unpin` (its attempt is boxed), so this is a plain `&mut`.
        let this = self.get_mut();
        let slot = this
            .attempt
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(attempt) = slot.as_mut() else {
            unreachable!("InFlight polled after completion")
        };
        let (holder, answer, took) = std::task::ready!(attempt.as_mut().poll(cx));
        *slot = None;
        let outcome = match &answer {
            Ok(Attempt::Acquired(_)) => Outcome::Acquired,
            Ok(Attempt::Busy { .. }) => Outcome::Busy,
            Err(_) => Outcome::Error,
        };
        this.sync.meter().attempt(outcome, took);
        Poll::Ready((holder, answer))
    }
}

impl<C: Competitor> Drop for InFlight<'_, C> {
    fn drop(&mut self) {
        let slot = self
            .attempt
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        let Some(attempt) = slot.take() else { return };
        let competitor = Arc::clone(self.sync.competitor_arc());
        tracing::debug!(
            "acquire dropped with an attempt in flight; finishing it in the background"
        );
        let finish = async move {
            let (holder, out, _) = attempt.await;
            match out {
                Ok(Attempt::Acquired(grant)) => {
                    tracing::debug!(%holder, "abandoning a grant nobody will receive");
                    competitor.abandon(holder, grant);
                }
                // The answer may have given the process a place in the backend's queue that
                // nobody will claim: the hook gives it up if nobody waits by now.
                Ok(Attempt::Busy { .. }) => competitor.queue_drained(),
                Err(e) => {
                    tracing::debug!(%holder, error = %e, "abandoned attempt failed");
                    competitor.queue_drained();
                }
            }
        };
        spawn_background(finish, self.sync.captured_handle());
    }
}

#[cfg(not(slate_loom))]
fn spawn_background<F>(fut: F, captured: Option<&tokio::runtime::Handle>)
where
    F: Future<Output = ()> + Send + 'static,
{
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        drop(handle.spawn(fut));
    } else if let Some(handle) = captured {
        drop(handle.spawn(fut));
    } else {
        crate::blocking::spawn_thread(fut);
    }
}

/// Loom models only drop attempts that already completed; anything else is a model bug.
#[cfg(slate_loom)]
fn spawn_background<F>(_fut: F, _captured: Option<&tokio::runtime::Handle>)
where
    F: Future<Output = ()> + Send + 'static,
{
    panic!("loom models must not abandon an attempt in flight");
}
