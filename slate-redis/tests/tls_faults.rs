//! Scenario X2 (issue #7, reliability.md §6.5 and §4 "TLS"): TLS faults, with the test CA the
//! harness generates (`RedisServer::builder().tls(true)`: TLS-only port, server certificate for
//! `IP:127.0.0.1` and `DNS:localhost`). Run with `cargo test -p slate-redis --features tls
//! --test tls_faults` (the `tls` feature lives here; ecosphere's tests build slate-redis
//! without it).
//!
//! Faults and expected behaviour, each bounded in time:
//! - wrong CA (the client trusts another test CA): the handshake fails, the call is an error,
//!   and nothing reaches the server (no plaintext fallback: no command counted, no key);
//! - a `rediss://` URL to a plaintext server: an error, nothing executed;
//! - a `redis://` URL to the TLS port: an error within the command timeout, nothing executed;
//! - hostname mismatch (the same server reached as `127.0.0.2`, which its certificate does not
//!   name): an error; the same client setup with `127.0.0.1` works;
//! - server restart: the client reconnects over TLS and the lock works again; a hold across
//!   the restart reports its loss;
//! - S2 over TLS: a holder whose runtime dies (renewal and connections gone, no release) is
//!   replaced after its lease and within lease + slack;
//! - S5 over TLS: a holder whose lease ran out releases late: *not held*, and the successor's
//!   entry is untouched.
//!
//! Invariants: I7-L3 (every failure within its bound), no plaintext fallback, I1 and I5 for
//! the S-subset.

#![cfg(feature = "tls")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use slate_harness::server::{Data, RedisServer};
use slate_redis::{ClientOptions, LossReason, RedisClient, SingleLock};

/// Command timeout of the clients of these tests.
const TIMEOUT: Duration = Duration::from_secs(1);
/// Slack on every bound (a loaded 2-core machine).
const SLACK: Duration = Duration::from_millis(1500);

fn tls_server() -> RedisServer {
    RedisServer::builder()
        .tls(true)
        .start()
        .expect("TLS redis-server (needs the openssl CLI)")
}

fn ca_of(server: &RedisServer) -> Vec<u8> {
    std::fs::read(server.ca_cert_path().expect("a TLS server")).expect("read the CA")
}

fn opts(ca: Vec<u8>) -> ClientOptions {
    ClientOptions::builder()
        .command_timeout(TIMEOUT)
        .connect_timeout(TIMEOUT)
        .tls_root_certificate(ca)
        .build()
        .unwrap()
}

/// Commands the server executed, from `INFO commandstats` (the harness's own `PING` and
/// `INFO` over its Unix socket count too).
fn commands(server: &RedisServer) -> BTreeMap<String, u64> {
    let v = server
        .command(&["INFO", "commandstats"])
        .expect("INFO commandstats");
    let text: String = redis::from_redis_value(v).expect("INFO reply");
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("cmdstat_")?;
            let (name, fields) = rest.split_once(':')?;
            let calls = fields.split(',').find_map(|f| f.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// Asserts that no lock command reached `server`: no script was loaded or run, no key exists.
fn nothing_executed(server: &RedisServer, what: &str) {
    let stats = commands(server);
    for cmd in [
        "evalsha",
        "eval",
        "script|load",
        "script",
        "hget",
        "exists",
        "pttl",
    ] {
        assert!(
            !stats.contains_key(cmd),
            "{what}: the server executed {cmd} ({stats:?})"
        );
    }
    assert_eq!(
        keys(server),
        Vec::<String>::new(),
        "{what}: keys were written"
    );
}

/// One failing call: it must be a backend error within `bound`.
async fn fails_within<T: std::fmt::Debug>(
    what: &str,
    bound: Duration,
    fut: impl std::future::Future<Output = slate_core::Result<T>>,
) -> slate_core::Error {
    let start = Instant::now();
    let r = tokio::time::timeout(bound + SLACK, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {:?}", bound + SLACK));
    let elapsed = start.elapsed();
    let err = r.expect_err(what);
    println!("{what}: {err} ({:?}) after {elapsed:?}", err.backend_kind());
    assert!(err.is_backend(), "{what}: {err}");
    assert!(elapsed < bound + SLACK, "{what}: took {elapsed:?}");
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x2_wrong_ca_fails_the_handshake_with_no_plaintext_fallback() {
    let server = tls_server();
    let other = tls_server();
    assert_ne!(ca_of(&server), ca_of(&other), "two test CAs");
    let client = RedisClient::open_with(server.url(), opts(ca_of(&other))).expect("client");
    fails_within("PING trusting another CA", TIMEOUT, client.ping()).await;
    let lock = lock(&client, "x2-ca", Duration::from_secs(2));
    fails_within("try_lock trusting another CA", TIMEOUT, lock.try_lock()).await;
    fails_within(
        "try_lock_for(3 s) trusting another CA",
        Duration::from_secs(3),
        lock.try_lock_for(Duration::from_secs(3)),
    )
    .await;
    // The server saw TLS handshakes the client aborted with an alert (it refused the
    // certificate), e.g. "Error accepting a client connection: ...SSL routines::tlsv1 alert
    // decrypt error".
    eventually(
        Duration::from_secs(3),
        "the server logs the failed handshake",
        || {
            server
                .log_tail(200)
                .lines()
                .any(|l| l.contains("Error accepting a client connection") && l.contains("alert"))
        },
    )
    .await;
    nothing_executed(&server, "wrong CA");
    // The platform roots do not know the test CA either.
    let platform = RedisClient::open_with(
        server.url(),
        ClientOptions::builder()
            .command_timeout(TIMEOUT)
            .build()
            .unwrap(),
    )
    .expect("client");
    fails_within("PING with the platform roots", TIMEOUT, platform.ping()).await;
    nothing_executed(&server, "platform roots");
    // The right CA works on the same server.
    let good = RedisClient::open_with(server.url(), opts(ca_of(&server))).expect("client");
    good.ping().await.expect("the right CA");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x2_rediss_to_a_plaintext_server_is_an_error() {
    let plain = server();
    let tls = tls_server();
    let url = format!("rediss://127.0.0.1:{}", plain.port());
    let client = RedisClient::open_with(&url, opts(ca_of(&tls))).expect("client");
    fails_within("PING over TLS to a plaintext port", TIMEOUT, client.ping()).await;
    let lock = lock(&client, "x2-plain", Duration::from_secs(2));
    fails_within(
        "try_lock over TLS to a plaintext port",
        TIMEOUT,
        lock.try_lock(),
    )
    .await;
    nothing_executed(&plain, "rediss:// to a plaintext server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x2_redis_url_to_the_tls_port_fails_within_the_timeout() {
    let server = tls_server();
    let url = format!("redis://127.0.0.1:{}", server.port());
    // A CA given with a plaintext URL is refused when the client is built: it neither turns
    // TLS on behind the user's back nor is ignored while the connection stays plaintext.
    let err = RedisClient::open_with(&url, opts(ca_of(&server))).expect_err("a CA with redis://");
    assert!(err.is_invalid_input(), "{err}");
    let client = RedisClient::open_with(
        &url,
        ClientOptions::builder()
            .command_timeout(TIMEOUT)
            .connect_timeout(TIMEOUT)
            .build()
            .unwrap(),
    )
    .expect("client");
    fails_within("PING in plaintext to the TLS port", TIMEOUT, client.ping()).await;
    let lock = lock(&client, "x2-plain-to-tls", Duration::from_secs(2));
    fails_within(
        "try_lock in plaintext to the TLS port",
        TIMEOUT,
        lock.try_lock(),
    )
    .await;
    nothing_executed(&server, "redis:// to the TLS port");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x2_hostname_mismatch_fails_the_handshake() {
    // Listening on a second loopback address that the certificate does not name.
    let server = RedisServer::builder()
        .tls(true)
        .arg("bind", "127.0.0.1 127.0.0.2")
        .start()
        .expect("TLS redis-server");
    let ca = ca_of(&server);
    let mismatch = RedisClient::open_with(
        format!("rediss://127.0.0.2:{}", server.port()),
        opts(ca.clone()),
    )
    .expect("client");
    let err = fails_within("PING to 127.0.0.2", TIMEOUT, mismatch.ping()).await;
    let text = format!("{err} {err:?}");
    assert!(
        text.contains("NotValidForName") || text.to_lowercase().contains("not valid for"),
        "the error names the certificate problem: {text}"
    );
    let lock = lock(&mismatch, "x2-name", Duration::from_secs(2));
    fails_within("try_lock to 127.0.0.2", TIMEOUT, lock.try_lock()).await;
    nothing_executed(&server, "hostname mismatch");
    // The same server, CA and options through 127.0.0.1, which the certificate names, work:
    // the only difference is the name.
    let good = RedisClient::open_with(format!("rediss://127.0.0.1:{}", server.port()), opts(ca))
        .expect("client");
    good.ping().await.expect("127.0.0.1 is in the certificate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x2_after_a_restart_the_client_reconnects_over_tls() {
    let mut server = tls_server();
    let client = RedisClient::open_with(server.url(), opts(ca_of(&server))).expect("client");
    let lease = Duration::from_millis(800);
    let lock = lock(&client, "x2-restart", lease);
    let g = lock.lock().await.expect("lock");
    let first = g.fencing_token().get();
    assert!(
        first > 1_700_000_000_000_000,
        "a clock-seeded token: {first}"
    );
    server.restart(Data::Wipe).expect("restart");
    // The hold did not survive (no persistence): its renewal reports the loss.
    let reason = within(lease + SLACK, "the hold's loss", g.lost()).await;
    assert!(
        matches!(reason, LossReason::EntryGone | LossReason::DeadlineExpired),
        "{reason:?}"
    );
    drop(g);
    // The same client reconnects over TLS, reloads its scripts and works.
    let g = within(
        Duration::from_secs(5),
        "the first lock after the restart",
        lock.lock(),
    )
    .await
    .expect("lock after the restart");
    assert!(
        g.fencing_token().get() > first,
        "the lost counter was seeded again from the server's clock: {} after {first}",
        g.fencing_token().get()
    );
    tokio::time::sleep(lease * 2).await;
    assert!(!g.is_lost(), "renewed over the new connection");
    assert_eq!(g.unlock().await.expect("unlock"), 0);
    assert_eq!(
        keys_but_records(&server, TIMEOUT * 2),
        [fence_key("x2-restart")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x2_s2_a_crashed_holder_is_replaced_after_its_lease_over_tls() {
    let server = tls_server();
    let (url, ca) = (server.url(), ca_of(&server));
    let lease = Duration::from_millis(1000);
    // Holder A in a runtime of its own, on its own thread: the "process" that dies.
    let (held_tx, held_rx) = std::sync::mpsc::channel::<Instant>();
    let (crash_tx, crash_rx) = std::sync::mpsc::channel::<()>();
    let a = std::thread::spawn({
        let (url, ca) = (url.clone(), ca.clone());
        move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("runtime");
            let (client, guard) = rt.block_on(async {
                let client = RedisClient::open_with(&url, opts(ca)).expect("client");
                let lock = lock(&client, "x2-crash", lease);
                let guard = lock.lock().await.expect("A locks");
                (client, guard)
            });
            // Renewing until the crash.
            let _ = crash_rx.recv_timeout(Duration::from_secs(20));
            let deadline = guard.lease_deadline();
            // The crash: renewal, connections and every task of A stop; nothing is released.
            std::mem::forget(guard);
            std::mem::forget(client);
            rt.shutdown_background();
            held_tx.send(deadline).expect("report A's deadline");
        }
    });
    let b_client = RedisClient::open_with(&url, opts(ca)).expect("client");
    let b_lock = lock(&b_client, "x2-crash", lease);
    eventually_async(Duration::from_secs(5), "A holds", || async {
        b_lock.is_locked().await.unwrap_or(false)
    })
    .await;
    // A renewed at least once before the crash (its entry outlived one lease).
    tokio::time::sleep(lease + lease / 2).await;
    assert!(b_lock.is_locked().await.expect("is_locked"), "A renewed");
    let waiter = tokio::spawn(async move {
        let g = b_lock.try_lock_for(Duration::from_secs(10)).await;
        (g, Instant::now())
    });
    let crashed_at = Instant::now();
    crash_tx.send(()).expect("crash A");
    let a_deadline = held_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("A crashed");
    a.join().expect("A's thread");
    let (g, acquired_at) = waiter.await.expect("waiter");
    let g = g.expect("B acquires after A's lease");
    println!(
        "A crashed at +0; its last deadline at {:?}; B acquired at {:?}",
        a_deadline.saturating_duration_since(crashed_at),
        acquired_at.saturating_duration_since(crashed_at)
    );
    assert!(
        acquired_at >= a_deadline,
        "B acquired {:?} before A's lease ran out",
        a_deadline.saturating_duration_since(acquired_at)
    );
    assert!(
        acquired_at <= crashed_at + lease + SLACK,
        "B acquired {:?} after the crash, beyond lease + slack",
        acquired_at.saturating_duration_since(crashed_at)
    );
    assert_eq!(g.unlock().await.expect("unlock"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x2_s5_a_stale_holder_releases_nothing_of_its_successor_over_tls() {
    let server = tls_server();
    let ca = ca_of(&server);
    let a_client = RedisClient::open_with(server.url(), opts(ca.clone())).expect("client");
    let b_client = RedisClient::open_with(server.url(), opts(ca)).expect("client");
    let lease = Duration::from_millis(600);
    // A stops renewing after 300 ms (max hold): its lease runs out while it still has its
    // guard.
    let a_lock = SingleLock::builder(&a_client, "x2-stale")
        .lease(lease)
        .renewal_period(lease / 3)
        .max_hold(Duration::from_millis(300))
        .build()
        .expect("lock");
    let b_lock = lock(&b_client, "x2-stale", lease);
    let a = a_lock.lock().await.expect("A locks");
    let reason = within(lease * 2 + SLACK, "A's loss", a.lost()).await;
    assert_eq!(reason, LossReason::MaxHoldReached);
    let b = within(
        lease + SLACK,
        "B acquires",
        b_lock.try_lock_for(Duration::from_secs(5)),
    )
    .await
    .expect("B acquires after A's lease");
    assert!(b.fencing_token() > a.fencing_token());
    // A's late release: not held, and B's entry is untouched.
    let err = a.unlock().await.expect_err("A no longer holds");
    assert!(err.is_not_held(), "{err}");
    assert_eq!(b_lock.hold_count(b.holder()).await.expect("hold_count"), 1);
    assert!(!b.is_lost());
    assert_eq!(b.unlock().await.expect("unlock"), 0);
    assert!(!b_lock.is_locked().await.expect("is_locked"));
}
