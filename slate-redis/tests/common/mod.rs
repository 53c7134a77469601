//! Helpers shared by the integration tests: a harness server per test, a client, key
//! listings and condition waits with deadlines.
#![allow(dead_code)]
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::time::{Duration, Instant};

use ecosphere::server::RedisServer;
#[allow(unused_imports)]
pub use slate_redis::DEFAULT_COMMAND_TIMEOUT;
use slate_redis::{ClientOptions, RedisClient, SingleLock};

/// A fresh `redis-server` for one test.
pub fn server() -> RedisServer {
    RedisServer::start().expect("start redis-server (is it installed?)")
}

/// A client for `server` (call inside a runtime).
pub fn client(server: &RedisServer) -> RedisClient {
    RedisClient::open(server.url()).expect("client")
}

/// A client with options.
pub fn client_with(server: &RedisServer, options: ClientOptions) -> RedisClient {
    RedisClient::open_with(server.url(), options).expect("client")
}

/// A lock with a short lease and otherwise default options.
pub fn lock(client: &RedisClient, name: &str, lease: Duration) -> SingleLock {
    SingleLock::builder(client, name)
        .lease(lease)
        .build()
        .expect("build lock")
}

/// Every key on the server.
pub fn keys(server: &RedisServer) -> Vec<String> {
    let v = server.command(&["KEYS", "*"]).expect("KEYS");
    let mut keys: Vec<String> = redis::from_redis_value(v).expect("KEYS reply");
    keys.sort();
    keys
}

/// The keys left after a release: request records (`…:req:<holder>`, kept for the retry
/// window of two command timeouts so that a retried request is not applied twice) are checked
/// to expire within `window` and left out; the rest is returned, sorted.
pub fn keys_but_records(server: &RedisServer, window: std::time::Duration) -> Vec<String> {
    let window_ms = i64::try_from(window.as_millis()).expect("window");
    keys(server)
        .into_iter()
        .filter(|k| {
            if !k.contains(":req:") {
                return true;
            }
            let pttl = int(server, &["PTTL", k]);
            assert!(
                pttl > 0 && pttl <= window_ms,
                "request record {k} must expire within {window_ms} ms, PTTL {pttl}"
            );
            false
        })
        .collect()
}

/// One integer command.
pub fn int(server: &RedisServer, args: &[&str]) -> i64 {
    redis::from_redis_value(server.command(args).expect("command")).expect("integer reply")
}

/// Runs one of the lock's scripts directly (for wrong-owner tests): `script` is the file name.
pub fn run_script(server: &RedisServer, code: &str, keys: &[&str], args: &[&str]) -> i64 {
    let mut con = server.connection().expect("connection");
    let script = redis::Script::new(code);
    let mut inv = script.prepare_invoke();
    for k in keys {
        inv.key(*k);
    }
    for a in args {
        inv.arg(*a);
    }
    inv.invoke(&mut con).expect("script")
}

pub const RELEASE_LUA: &str = include_str!("../../src/scripts/release.lua");
pub const RENEW_LUA: &str = include_str!("../../src/scripts/renew.lua");

/// Polls `f` until it holds, failing the test after `within`.
pub async fn eventually(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    loop {
        if f() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls an async condition until it holds, failing the test after `within`.
pub async fn eventually_async<F, Fut>(within: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if f().await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs `fut`, failing the test if it takes longer than `within`.
pub async fn within<T>(within: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(within, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what} did not finish within {within:?}"),
    }
}
