//! Clocks and sleeps for the two ways the driver runs: on tokio (async callers) and on a
//! parked thread (blocking callers).
//!
//! The driver is one `async fn`, generic over [`Timer`]; only how it reads the clock and how a
//! park with a deadline sleeps differ.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Instant;

/// A clock plus a sleep future.
pub(crate) trait Timer {
    /// Completes at (or after) its instant.
    type Sleep: Future<Output = ()>;

    /// The current instant of this timer's clock.
    fn now(&self) -> Instant;

    /// A sleep that completes at `at`.
    fn sleep_until(&self, at: Instant) -> Self::Sleep;

    /// Moves `sleep` to complete at `at` instead.
    fn reset(&self, sleep: Pin<&mut Self::Sleep>, at: Instant);

    /// Queued waiters leave their deadlines to the synchronizer's shared timer (a tokio task)
    /// instead of sleeping on their own.
    const SHARED: bool = false;
}

/// tokio's timer: honours paused time (`tokio::time::pause`), needs a runtime with time
/// enabled when a sleep is polled.
#[cfg(not(slate_loom))]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TokioTimer;

#[cfg(not(slate_loom))]
impl Timer for TokioTimer {
    type Sleep = tokio::time::Sleep;

    const SHARED: bool = true;

    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn sleep_until(&self, at: Instant) -> Self::Sleep {
        tokio::time::sleep_until(tokio::time::Instant::from_std(at))
    }

    fn reset(&self, sleep: Pin<&mut Self::Sleep>, at: Instant) {
        sleep.reset(tokio::time::Instant::from_std(at));
    }
}

/// Under loom there is no timer: sleeps never fire, so the models exercise only the
/// notification paths (which is where the races are).
#[cfg(slate_loom)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TokioTimer;

#[cfg(slate_loom)]
impl Timer for TokioTimer {
    type Sleep = std::future::Pending<()>;

    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep_until(&self, _at: Instant) -> Self::Sleep {
        std::future::pending()
    }

    fn reset(&self, _sleep: Pin<&mut Self::Sleep>, _at: Instant) {}
}

/// The blocking driver's timer: a sleep that is not due records its instant in a cell the
/// driver reads after each poll, and the driver parks the thread until the earliest one.
#[derive(Clone, Debug, Default)]
pub(crate) struct ThreadTimer {
    wake_at: Rc<Cell<Option<Instant>>>,
}

impl ThreadTimer {
    /// Forgets the instants recorded by the previous poll (every pending sleep is polled
    /// again by the next one and records its instant again).
    pub(crate) fn take_wake_at(&self) -> Option<Instant> {
        self.wake_at.take()
    }
}

impl Timer for ThreadTimer {
    type Sleep = ThreadSleep;

    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep_until(&self, at: Instant) -> Self::Sleep {
        ThreadSleep {
            at,
            wake_at: Rc::clone(&self.wake_at),
        }
    }

    fn reset(&self, sleep: Pin<&mut Self::Sleep>, at: Instant) {
        sleep.get_mut().at = at;
    }
}

/// See [`ThreadTimer`].
#[derive(Debug)]
pub(crate) struct ThreadSleep {
    at: Instant,
    wake_at: Rc<Cell<Option<Instant>>>,
}

impl Future for ThreadSleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.at {
            return Poll::Ready(());
        }
        let earliest = match self.wake_at.get() {
            Some(t) => t.min(self.at),
            None => self.at,
        };
        self.wake_at.set(Some(earliest));
        Poll::Pending
    }
}
