//! A holder scope follows its task across threads; thread identity never leaks into it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use slate_core::HolderId;

/// Yields once, so that the test can move the future to another thread between polls.
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            Poll::Pending
        }
    }
}

#[test]
fn scope_survives_migration_between_threads() {
    let id = HolderId::new();
    type Seen = Vec<(HolderId, std::thread::ThreadId)>;
    let mut fut: Pin<Box<dyn Future<Output = Seen> + Send>> = Box::pin(id.scope(async move {
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push((HolderId::current(), std::thread::current().id()));
            YieldOnce(false).await;
        }
        seen
    }));
    // Poll the same future on four different threads in turn.
    let mut result = None;
    for _ in 0..5 {
        let handle = std::thread::spawn(move || {
            let mut cx = Context::from_waker(Waker::noop());
            let out = fut.as_mut().poll(&mut cx);
            (fut, out)
        });
        let (back, out) = handle.join().expect("poll thread panicked");
        fut = back;
        if let Poll::Ready(v) = out {
            result = Some(v);
            break;
        }
    }
    let seen = result.expect("the future completes after four yields");
    assert_eq!(seen.len(), 4);
    let threads: std::collections::HashSet<_> = seen.iter().map(|(_, t)| *t).collect();
    assert_eq!(threads.len(), 4, "each poll ran on its own thread");
    assert!(
        seen.iter().all(|(h, _)| *h == id),
        "holder changed across threads: {seen:?}"
    );
    // Outside the scope, no thread kept the holder.
    assert_ne!(HolderId::current(), id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scope_on_a_multi_thread_runtime() {
    let id = HolderId::new();
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let inner = HolderId::new();
            tokio::spawn(inner.scope(async move {
                for _ in 0..100 {
                    assert_eq!(HolderId::current(), inner);
                    tokio::task::yield_now().await;
                }
                inner
            }))
        })
        .collect();
    for h in handles {
        let inner = h.await.unwrap();
        assert_ne!(inner, id);
    }
}

#[test]
fn forked_child_draws_a_new_prefix() {
    // Without `fork()` (unsafe to call from a test harness), check the mechanism the fork
    // detection rests on: the prefix is tied to the process, so a separate process has another.
    let here = HolderId::new().prefix();
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "print_prefix",
            "--nocapture",
            "--include-ignored",
        ])
        .env("SLATE_PRINT_PREFIX", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("prefix="))
        .expect("child printed prefix");
    let child: u128 = u128::from_str_radix(&line["prefix=".len()..], 16).unwrap();
    assert_ne!(child, here);
}

#[test]
fn print_prefix() {
    if std::env::var_os("SLATE_PRINT_PREFIX").is_some() {
        println!("prefix={:032x}", HolderId::new().prefix());
    }
}
