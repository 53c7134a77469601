//! Cancelling a future in flight under a runtime that is not driven, to order what its
//! background clean-up does after what the test does next.
//!
//! Slate's acquire futures, dropped with an attempt in flight, finish that attempt in a task
//! spawned on the dropping thread's runtime. Dropping them inside an [`Undriven`] runtime's
//! context parks that task there until [`Undriven::drive_until_idle`] runs it: the window
//! between "the attempt was dropped" and "its answer was handled" stays open for as long as
//! the test needs.

use std::future::Future;
use std::task::Poll;
use std::time::{Duration, Instant};

/// A current-thread runtime that runs only when asked.
pub struct Undriven {
    rt: tokio::runtime::Runtime,
}

impl Undriven {
    /// A current-thread runtime with time and I/O, not driven.
    ///
    /// # Panics
    ///
    /// If tokio cannot build a runtime.
    pub fn new() -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime");
        Undriven { rt }
    }

    /// Polls `fut` once (on the caller's task: whatever it spawns or registers goes to the
    /// caller's runtime) and drops it inside this runtime's context, so anything its drop
    /// spawns waits here. Returns whether it was still pending (in flight) when dropped.
    pub async fn drop_in_flight<F: Future>(&self, fut: F) -> bool {
        let mut fut = Box::pin(fut);
        let pending =
            std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx).is_pending())).await;
        let _in = self.rt.enter();
        drop(fut);
        pending
    }

    /// Drives this runtime, from a blocking thread, until no task is left on it.
    ///
    /// # Panics
    ///
    /// If tasks are still alive after `within`.
    pub async fn drive_until_idle(self, within: Duration) {
        tokio::task::spawn_blocking(move || {
            self.rt.block_on(async {
                let until = Instant::now() + within;
                while tokio::runtime::Handle::current()
                    .metrics()
                    .num_alive_tasks()
                    > 0
                {
                    assert!(
                        Instant::now() < until,
                        "tasks still alive on the undriven runtime after {within:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
        })
        .await
        .expect("the driving thread");
    }
}

impl Default for Undriven {
    fn default() -> Self {
        Self::new()
    }
}
