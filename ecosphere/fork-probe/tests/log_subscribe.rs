//! Scenario X1, a user without `SUBSCRIBE` (issue #7, reliability.md §6.5 "clear permission
//! errors"): the lock still works (a waiter falls back to the spin wait), but nothing tells the
//! operator why waiters are no longer woken by releases. Expected: at least one log event at
//! WARN or above naming the refused subscription as a permission problem.
//!
//! (`ecosphere/tests/x01_security_acl.rs` shows the run itself: no error, the wake-up comes from
//! the spin wait, only `ACL LOG` names `subscribe`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ecosphere::server::RedisServer;
use slate_redis::{RedisClient, SingleLock};
use tracing_subscriber::fmt::MakeWriter;

/// The captured log.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Capture {
    type Writer = Capture;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x1_a_refused_subscribe_is_reported() {
    let capture = Capture::default();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(capture.clone())
        .try_init()
        .expect("the only subscriber of this test binary");
    let server = RedisServer::builder()
        .acl_user("nosub", "n0sub", "~slate:* &slate:* +@all -subscribe")
        .start()
        .expect("redis-server");
    let url = server.url_for_user("nosub", "n0sub");
    let (a, b) = (
        RedisClient::open(&url).expect("client"),
        RedisClient::open(&url).expect("client"),
    );
    let build = |c: &RedisClient| {
        SingleLock::builder(c, "nosub")
            .lease(Duration::from_secs(2))
            .spin_wait(Duration::from_millis(500))
            .build()
            .expect("lock")
    };
    let (la, lb) = (build(&a), build(&b));
    let g = la.lock().await.expect("lock");
    let waiter = tokio::spawn(async move { lb.try_lock_for(Duration::from_secs(10)).await });
    // Release once the waiter is parked (its SUBSCRIBE is then sent, and refused).
    let parked = Instant::now() + Duration::from_secs(3);
    while b.stats().local_waiters == 0 {
        assert!(Instant::now() < parked, "the waiter never parked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    g.unlock().await.expect("unlock");
    let gb = waiter
        .await
        .expect("waiter")
        .expect("the waiter acquires by the spin wait");
    gb.unlock().await.expect("unlock");
    // The listener has tried (and been refused) by now; give a warning a moment to be written.
    let until = Instant::now() + Duration::from_secs(2);
    let reported = loop {
        let text = String::from_utf8_lossy(&capture.0.lock().unwrap_or_else(|p| p.into_inner()))
            .to_lowercase();
        if text.contains("subscribe") && (text.contains("permission") || text.contains("noperm")) {
            break true;
        }
        if Instant::now() >= until {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        reported,
        "no warning names the refused SUBSCRIBE; captured:\n{}",
        String::from_utf8_lossy(&capture.0.lock().unwrap_or_else(|p| p.into_inner()))
    );
}
