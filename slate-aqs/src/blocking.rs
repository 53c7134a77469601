//! Driving futures on a parked thread (crossbeam's `Parker`), for blocking callers and for
//! abandoned attempts that have no runtime to run on.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use crossbeam_utils::sync::{Parker, Unparker};

use crate::timer::ThreadTimer;

/// A waker that unparks one thread.
struct ThreadWaker(Unparker);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `fut` to completion on this thread, parking between polls until woken or until the
/// earliest instant a [`ThreadTimer`] sleep asked for.
pub(crate) fn block_on<F: Future>(fut: F, timer: &ThreadTimer) -> F::Output {
    let parker = Parker::new();
    let waker = Waker::from(Arc::new(ThreadWaker(parker.unparker().clone())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    loop {
        let _ = timer.take_wake_at();
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        match timer.take_wake_at() {
            Some(at) => parker.park_deadline(at),
            None => parker.park(),
        }
    }
}

/// Drives `fut` to completion on a new detached thread (the last resort for an abandoned
/// attempt when no tokio runtime is available).
#[cfg_attr(slate_loom, allow(dead_code))] // loom models never abandon an attempt in flight
pub(crate) fn spawn_thread<F>(fut: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let spawned = std::thread::Builder::new()
        .name("slate-aqs-abandon".to_owned())
        .spawn(move || block_on(fut, &ThreadTimer::default()));
    if let Err(e) = spawned {
        // Nothing else can run the attempt; its grant, if any, lapses with its lease.
        tracing::warn!(error = %e, "could not start a thread to finish an abandoned attempt");
    }
}
