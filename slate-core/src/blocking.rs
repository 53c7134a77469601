//! The bridge for the blocking twins (`blocking_lock`, `blocking_unlock`...): calls from plain
//! threads, run on a client's runtime.

use std::future::Future;

use tokio::runtime::Handle;

use crate::error::{Error, Result};

/// Panics when called inside a tokio runtime, where a blocking call would stall the
/// runtime's threads (and, on a current-thread runtime, the very task it waits for). `what`
/// names the call, e.g. `"SingleLock::blocking_lock"`.
///
/// # Examples
///
/// ```
/// slate_core::blocking::assert_outside_runtime("MyLock::blocking_lock"); // a plain thread
/// ```
///
/// # Panics
///
/// Inside a tokio runtime: the message names `what` and the async method to use instead.
pub fn assert_outside_runtime(what: &str) {
    if Handle::try_current().is_ok() {
        panic!(
            "{what} was called inside a tokio runtime, where blocking would stall the \
             runtime's threads; use the async method instead"
        );
    }
}

/// Runs `fut` as a task on `runtime` and blocks this thread until it is done.
///
/// # Examples
///
/// ```
/// let rt = tokio::runtime::Runtime::new().unwrap();
/// let answer = slate_core::blocking::wait_on(rt.handle(), async { Ok(7) });
/// assert_eq!(answer.ok(), Some(7));
/// ```
///
/// # Errors
///
/// `fut`'s own; [`Error::Closed`] when the runtime shut down before the task finished.
///
/// # Panics
///
/// Never itself; call [`assert_outside_runtime`] first, since blocking inside a runtime would
/// stall it.
pub fn wait_on<T, F>(runtime: &Handle, fut: F) -> Result<T>
where
    T: Send + 'static,
    F: Future<Output = Result<T>> + Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    drop(runtime.spawn(async move {
        let _ = tx.send(fut.await);
    }));
    rx.recv()
        .unwrap_or(Err(Error::closed("the client's tokio runtime")))
}
