//! Scenario X1, log scan (issue #7, reliability.md §4 "credentials must never appear in
//! `Debug` output, errors or logs"): every `tracing` event and span of Slate (and every `log`
//! record of its dependencies, bridged) at TRACE level is captured while the single and the
//! combination lock run their succeeding and failing paths with passwords in their URLs and
//! options; the capture must not contain a password, raw or percent-encoded.
//!
//! (This lives in `fork-probe` because the ecosphere crate has no tracing dependency; the
//! other X1 checks are `ecosphere/tests/x01_security_acl.rs`.)
//!
//! Paths: acquire, re-enter, renewal over several leases, a waiter in another client woken by
//! the notification, release, force unlock, a guard dropped without unlock, a restart under a
//! subscribed waiter (pub/sub lost and reconnected, scripts reloaded), a holder whose server
//! dies (renewal failures, loss); the combination lock's adoption, acquisition, release,
//! force unlock and a dead node; wrong passwords (single and combination), a refused key
//! (outside the prefix), a refused command inside a script, a malformed URL and an
//! unreachable server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ecosphere::server::{Data, RedisServer};
use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
use slate_redis::{ClientOptions, RedisClient, SingleLock};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::format::FmtSpan;

const PASSWORD: &str = "Log-S3cret-d41d8c";
const ODD: &str = "p@ss:w/rd%?#&=+{}";
const WRONG: &str = "Wr0ng-Log-Secret-9";

/// The captured log, shared with the subscriber's writers.
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

impl Capture {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

fn forms(secret: &str) -> Vec<String> {
    let encoded: String = secret
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    vec![secret.to_owned(), encoded]
}

fn opts() -> ClientOptions {
    ClientOptions::builder()
        .command_timeout(Duration::from_millis(800))
        .connect_timeout(Duration::from_millis(800))
        .build()
        .unwrap()
}

fn node_opts() -> NodeSetOptions {
    NodeSetOptions::builder()
        .node_operation_time(Duration::from_millis(300))
        .reprobe_interval(Duration::from_millis(300))
        .quarantine(Duration::from_secs(5))
        .build()
        .unwrap()
}

fn builder() -> ecosphere::server::ServerBuilder {
    RedisServer::builder()
        .password(PASSWORD)
        .acl_user("slate", PASSWORD, "~slate:* &slate:* +@all")
        .acl_user("odd", ODD, "~slate:* &slate:* +@all")
        .acl_user("nohset", PASSWORD, "~slate:* &slate:* +@all -hset")
}

async fn single_paths(servers: &mut [RedisServer]) {
    let url = servers[0].url_for_user("slate", PASSWORD);
    let lease = Duration::from_millis(500);
    let a = RedisClient::open_with(&url, opts()).expect("client");
    let b = RedisClient::open_with(
        format!("redis://127.0.0.1:{}", servers[0].port()),
        slate_redis::ClientOptionsBuilder::from(opts())
            .username("odd")
            .password(ODD)
            .build()
            .unwrap(),
    )
    .expect("client");
    let build = |c: &RedisClient, name: &str| {
        SingleLock::builder(c, name)
            .lease(lease)
            .renewal_period(lease / 3)
            .spin_wait(Duration::from_secs(2))
            .build()
            .expect("lock")
    };
    let (la, lb) = (build(&a, "logs"), build(&b, "logs"));
    let g = la.lock().await.expect("lock");
    let g2 = g.reenter().await.expect("re-enter");
    let waiter = tokio::spawn(async move {
        let r = lb.try_lock_for(Duration::from_secs(10)).await;
        (r, lb)
    });
    tokio::time::sleep(lease * 3).await;
    assert!(!g.is_lost());
    g2.unlock().await.expect("unlock");
    g.unlock().await.expect("unlock");
    let (r, lb) = waiter.await.expect("waiter");
    let gb = r.expect("the waiter acquires");
    assert_eq!(la.force_unlock().await.expect("force unlock"), 1);
    let _ = tokio::time::timeout(Duration::from_secs(3), gb.lost()).await;
    drop(gb);
    // A guard dropped without unlock: released in the background.
    drop(la.lock().await.expect("lock"));
    let until = Instant::now() + Duration::from_secs(3);
    while la.is_locked().await.expect("is_locked") {
        assert!(Instant::now() < until, "the dropped guard was not released");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // A restart under a subscribed waiter: pub/sub lost and reconnected, scripts reloaded.
    let g = la.lock().await.expect("lock");
    // An attempt that meets the server between its kill and its start fails (connection
    // refused, a transient error): the waiter tries again within its 10 s.
    let waiter = tokio::spawn(async move {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            match lb
                .try_lock_for(until.saturating_duration_since(Instant::now()))
                .await
            {
                Err(e)
                    if e.backend_kind().is_some_and(|k| k.is_transient())
                        && Instant::now() < until =>
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => break other,
            }
        }
    });
    let until = Instant::now() + Duration::from_secs(3);
    while !(b.stats().local_waiters == 1 && b.stats().subscriptions == 1 && b.stats().pubsub_up) {
        assert!(Instant::now() < until, "the waiter never parked subscribed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    servers[0].restart(Data::Wipe).expect("restart");
    let _ = tokio::time::timeout(Duration::from_secs(3), g.lost()).await;
    drop(g);
    let gb = waiter
        .await
        .expect("waiter")
        .expect("acquires after the restart");
    gb.unlock().await.expect("unlock");

    // Refused: a key outside the user's prefix, a command inside a script.
    let outside = SingleLock::builder(&a, "logs")
        .key_prefix("other:")
        .build()
        .expect("lock");
    assert!(outside.try_lock().await.is_err());
    let nohset = RedisClient::open_with(servers[0].url_for_user("nohset", PASSWORD), opts())
        .expect("client");
    assert!(build(&nohset, "logs-nohset").try_lock().await.is_err());

    // Wrong password; malformed URL; unreachable server.
    let wrong =
        RedisClient::open_with(servers[0].url_for_user("slate", WRONG), opts()).expect("client");
    assert!(build(&wrong, "logs").try_lock().await.is_err());
    assert!(RedisClient::open(format!("redis://slate:{PASSWORD}@127.0.0.1:notaport")).is_err());

    // A holder whose server dies: renewal fails, the lease is lost.
    let g = la.lock().await.expect("lock");
    servers[0].kill().expect("kill");
    let _ = tokio::time::timeout(lease * 3, g.lost()).await;
    assert!(g.is_lost());
    assert!(g.unlock().await.is_err());
    assert!(a.ping().await.is_err());
}

async fn combination_paths(servers: &mut [RedisServer]) {
    let urls: Vec<String> = servers
        .iter()
        .map(|s| s.url_for_user("slate", PASSWORD))
        .collect();
    let nodes = NodeSet::connect(
        urls,
        slate_combination::NodeSetOptionsBuilder::from(node_opts())
            .client_options(opts())
            .build()
            .unwrap(),
    )
    .expect("node set");
    assert_eq!(nodes.adopt_fresh_servers("slate:").await.expect("adopt"), 3);
    let lock = CombinationLock::builder(&nodes, "logs-comb")
        .lease(Duration::from_millis(1200))
        .renewal_period(Duration::from_millis(400))
        .acquire_budget(Duration::from_millis(900))
        .build()
        .expect("lock");
    let g = lock
        .try_lock_for(Duration::from_secs(3))
        .await
        .expect("lock");
    tokio::time::sleep(Duration::from_millis(900)).await;
    g.unlock().await.expect("unlock");
    let g = lock
        .try_lock_for(Duration::from_secs(3))
        .await
        .expect("lock");
    assert_eq!(lock.force_unlock().await.expect("force unlock"), 1);
    let _ = tokio::time::timeout(Duration::from_secs(3), g.lost()).await;
    drop(g);
    // A dead node: the others carry on, the dead one is reported.
    servers[2].kill().expect("kill");
    let g = lock
        .try_lock_for(Duration::from_secs(3))
        .await
        .expect("lock on 2 of 3");
    g.unlock().await.expect("unlock");

    // Wrong password on every node.
    let urls: Vec<String> = servers
        .iter()
        .map(|s| s.url_for_user("slate", WRONG))
        .collect();
    let wrong = NodeSet::connect(urls, node_opts()).expect("node set");
    let lock = CombinationLock::builder(&wrong, "logs-comb")
        .lease(Duration::from_millis(1200))
        .acquire_budget(Duration::from_millis(900))
        .build()
        .expect("lock");
    assert!(lock.try_lock_for(Duration::from_secs(1)).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x1_no_password_in_captured_logs() {
    let capture = Capture::default();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_span_events(FmtSpan::FULL)
        .with_ansi(false)
        .with_writer(capture.clone())
        .try_init()
        .expect("the only subscriber of this test binary");

    let mut servers = RedisServer::start_many_with(3, &builder()).expect("redis-server");
    // The scan recognises the passwords in the forms a URL carries them.
    for (user, secret) in [("slate", PASSWORD), ("odd", ODD), ("slate", WRONG)] {
        let url = servers[0].url_for_user(user, secret);
        assert!(forms(secret).iter().any(|f| url.contains(f)), "{url}");
    }
    combination_paths(&mut servers).await;
    single_paths(&mut servers).await;

    let text = capture.text();
    let lines = text.lines().count();
    println!("captured {lines} log lines, {} bytes", text.len());
    // The capture saw the paths it must scan (so an empty capture cannot pass).
    for expected in [
        "acquired",
        "re-entered",
        "force unlock",
        "lease lost",
        "pub/sub connection lost",
        "authentication",
        "permission",
        "node marked unavailable",
    ] {
        assert!(
            text.to_lowercase().contains(&expected.to_lowercase()),
            "no {expected:?} in the captured log"
        );
    }
    for secret in [PASSWORD, ODD, WRONG] {
        for form in forms(secret) {
            let hits: Vec<&str> = text.lines().filter(|l| l.contains(&form)).take(3).collect();
            assert!(
                hits.is_empty(),
                "the log shows a password ({form:?}): {hits:#?}"
            );
        }
    }
}
