//! [`Detached`]: a future that finishes in the background when it is dropped early.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A future that, when dropped before completion, is finished by a task on a tokio runtime
/// instead of being cancelled.
///
/// Every guard's `unlock()` returns one: the [`LockGuard`](crate::LockGuard) contract says a
/// dropped `unlock` future still releases, exactly once (the caller stopped waiting for the
/// outcome; the lock must not stay held because of it, e.g. under
/// `tokio::time::timeout(d, guard.unlock())`). Nothing is spawned unless it is dropped early.
///
/// # Examples
///
/// ```
/// use slate_core::detach::Detached;
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicBool, Ordering};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let done = Arc::new(AtomicBool::new(false));
/// let flag = done.clone();
/// let release = Detached::new(
///     async move {
///         tokio::task::yield_now().await;
///         flag.store(true, Ordering::SeqCst);
///     },
///     tokio::runtime::Handle::current(),
/// );
/// // The caller gives up at once: the work still completes, in a task.
/// let _ = tokio::time::timeout(std::time::Duration::ZERO, release).await;
/// while !done.load(Ordering::SeqCst) {
///     tokio::task::yield_now().await;
/// }
/// # }
/// ```
///
/// # Cancel safety
///
/// This is what makes a future cancel safe in the sense above: dropping it never loses the
/// work, only its output.
#[must_use = "futures do nothing unless polled (a dropped Detached runs in the background)"]
pub struct Detached<T: Send + 'static> {
    fut: Option<BoxFuture<T>>,
    handle: tokio::runtime::Handle,
}

impl<T: Send + 'static> Detached<T> {
    /// Wraps `fut`; if the wrapper is dropped before `fut` completes, `fut` is finished by a
    /// task spawned on `handle`.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let release = slate_core::detach::Detached::new(async { 0_u32 }, tokio::runtime::Handle::current());
    /// assert_eq!(release.await, 0);
    /// # }
    /// ```
    pub fn new(
        fut: impl Future<Output = T> + Send + 'static,
        handle: tokio::runtime::Handle,
    ) -> Self {
        Detached {
            fut: Some(Box::pin(fut)),
            handle,
        }
    }
}

impl<T: Send + 'static> fmt::Debug for Detached<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Detached")
            .field("done", &self.fut.is_none())
            .finish_non_exhaustive()
    }
}

impl<T: Send + 'static> Future for Detached<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let Some(fut) = self.fut.as_mut() else {
            return Poll::Pending;
        };
        match fut.as_mut().poll(cx) {
            Poll::Ready(v) => {
                self.fut = None;
                Poll::Ready(v)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: Send + 'static> Drop for Detached<T> {
    fn drop(&mut self) {
        if let Some(fut) = self.fut.take() {
            drop(self.handle.spawn(async move {
                let _ = fut.await;
            }));
        }
    }
}

/// Runs `fut` on a client's runtime: directly when the caller is already inside a tokio
/// runtime, otherwise as a task on `handle`, awaited from wherever the caller is (a plain
/// thread's executor, a `block_on` of another runtime). Every backend client's calls go
/// through it, so that their timers and I/O always run on a runtime.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let handle = tokio::runtime::Handle::current();
/// let answer = slate_core::detach::on_runtime(handle, async { Ok(7) }).await;
/// assert_eq!(answer.ok(), Some(7));
/// # }
/// ```
///
/// # Errors
///
/// `fut`'s own errors; [`Error::Closed`](crate::Error::Closed) when the runtime shut down
/// before the task finished.
///
/// # Cancel safety
///
/// Dropping the returned future drops `fut` when it ran directly; a spawned task runs on.
pub fn on_runtime<T, F>(
    handle: tokio::runtime::Handle,
    fut: F,
) -> impl Future<Output = crate::Result<T>> + Send + 'static + use<T, F>
where
    T: Send + 'static,
    F: Future<Output = crate::Result<T>> + Send + 'static,
{
    // Boxed at once: a backend call's future holds its command futures (kilobytes), and a
    // future passed by value is stored again by each layer that awaits it (an argument and
    // the awaited copy). Every layer above this one then moves a pointer; unboxed, a lock's
    // acquire attempt was 18,896 bytes, copied several times per acquisition.
    let fut = Box::pin(fut);
    async move {
        if tokio::runtime::Handle::try_current().is_ok() {
            fut.await
        } else {
            match handle.spawn(fut).await {
                Ok(r) => r,
                Err(_) => Err(crate::Error::closed("the client's tokio runtime")),
            }
        }
    }
}
