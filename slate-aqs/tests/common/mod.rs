//! Helpers shared by the integration tests.
#![allow(dead_code)] // each test file uses a different subset

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use slate_aqs::Synchronizer;
use slate_aqs::testing::{MemoryCompetitor, MemoryGrant, MemoryRemote};
use slate_core::{HolderId, Result, Wait};
use tokio::task::JoinHandle;

pub type Sync = Synchronizer<MemoryCompetitor>;

/// A synchronizer over a fresh in-memory remote.
pub fn new_sync(spin_wait: Duration) -> (Arc<MemoryRemote>, Arc<Sync>) {
    let remote = MemoryRemote::new();
    let sync = Arc::new(Synchronizer::new(
        "test-lock",
        MemoryCompetitor::new(remote.clone()),
        spin_wait,
    ));
    (remote, sync)
}

/// Spawns `acquire(holder, wait)` on the current runtime.
pub fn spawn_acquire(
    sync: &Arc<Sync>,
    holder: HolderId,
    wait: Wait,
) -> JoinHandle<Result<MemoryGrant>> {
    let sync = Arc::clone(sync);
    tokio::spawn(async move { sync.acquire(holder, wait).await })
}

/// Waits until `cond` holds: yields first, then sleeps 1 ms at a time (which auto-advances
/// paused time). Panics after `limit` (of the runtime's clock).
pub async fn until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = tokio::time::Instant::now();
    let mut i = 0u32;
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        i += 1;
        if i < 100 {
            tokio::task::yield_now().await;
        } else {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// Awaits `fut` on tokio's paused clock, failing if it does not complete within a day of
/// it. An idle paused runtime jumps straight to the next timer, so a future that nothing will
/// ever wake (a lost wake-up) fails at once instead of hanging the suite.
pub async fn within<F: Future>(fut: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(86_400), fut)
        .await
        .expect("stuck: nothing will ever wake this future (a lost wake-up?)")
}

/// A waker that records that it was woken.
#[derive(Default)]
pub struct Flag(AtomicBool);

impl Flag {
    pub fn take(&self) -> bool {
        self.0.swap(false, Ordering::SeqCst)
    }
}

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A future polled by hand with a [`Flag`] waker.
pub struct Manual<F> {
    pub fut: std::pin::Pin<Box<F>>,
    pub flag: Arc<Flag>,
}

impl<F: Future> Manual<F> {
    pub fn new(fut: F) -> Self {
        Manual {
            fut: Box::pin(fut),
            flag: Arc::default(),
        }
    }

    pub fn poll(&mut self) -> Poll<F::Output> {
        let waker = Waker::from(Arc::clone(&self.flag));
        self.fut.as_mut().poll(&mut Context::from_waker(&waker))
    }

    pub fn woken(&self) -> bool {
        self.flag.take()
    }
}

/// Runs an async test body on a fresh current-thread runtime with tokio's clock paused,
/// under [`with_watchdog`]: a future that spins inside one poll (which no tokio timer can
/// interrupt) fails the test instead of hanging the suite.
pub fn paused<F, Fut>(body: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    with_watchdog(Duration::from_secs(30), move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(body());
    });
}

/// Runs `f` on a thread and fails the test if it has not finished within `limit` (real
/// time): turns a hang (a lost wake-up, a deadlock) into a failure.
pub fn with_watchdog<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("did not finish within {limit:?} (hang or deadlock)")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("the test body panicked"),
    }
}

/// `PROPTEST_CASES` if set, else `default`.
pub fn proptest_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// As [`with_watchdog`], for proptest bodies: a hang exits the test process (after printing
/// `what`) instead of panicking, because proptest would retry a panicking case while
/// shrinking, hanging once per attempt.
pub fn with_watchdog_or_exit<T: Send + 'static>(
    limit: Duration,
    what: String,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            eprintln!("did not finish within {limit:?} (hang or deadlock): {what}");
            std::process::exit(101);
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("the test body panicked"),
    }
}

/// A current-thread runtime with tokio's clock paused (the schedule a case draws is the one
/// run).
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// Polls `waiter` once on `rt` (which is then left undriven); it must park.
pub fn park_once<F: Future + ?Sized>(
    rt: &tokio::runtime::Runtime,
    mut waiter: std::pin::Pin<&mut F>,
) {
    let first = rt.block_on(std::future::poll_fn(|cx| {
        std::task::Poll::Ready(waiter.as_mut().poll(cx))
    }));
    assert!(first.is_pending(), "the waiter parked");
}
