//! Shared by the combination lock's real-node tests: servers, proxies, process views, direct
//! reads of the servers, and condition waits with deadlines.
#![allow(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use slate_combination::{CombinationLock, NodeSet, NodeSetOptions, Order};
use slate_core::{HolderId, LockName};
use slate_harness::proxy::{FaultProxy, Mode};
use slate_harness::server::RedisServer;

/// `n` fresh servers.
pub fn servers(n: usize) -> Vec<RedisServer> {
    RedisServer::start_many(n).expect("redis-server (apt-get install -y redis-server)")
}

/// One proxy in front of each server.
pub fn proxies(servers: &[RedisServer]) -> Vec<FaultProxy> {
    servers
        .iter()
        .map(|s| FaultProxy::start(s.addr()).expect("proxy"))
        .collect()
}

/// Node-set options of a test view.
pub fn opts(op: Duration) -> NodeSetOptions {
    NodeSetOptions::builder()
        .node_operation_time(op)
        .reprobe_interval(Duration::from_secs(60))
        .quarantine(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// A process view of `urls` (no adoption: a second process, or one that starts later).
pub fn view_of(urls: Vec<String>, opts: NodeSetOptions) -> NodeSet {
    NodeSet::connect(urls, opts).expect("node set")
}

/// The URLs of the servers.
pub fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

/// The URLs of the proxies.
pub fn proxy_urls(proxies: &[FaultProxy]) -> Vec<String> {
    proxies.iter().map(FaultProxy::url).collect()
}

/// Adopts the servers as fresh (they were started moments ago), through `nodes`.
pub async fn adopt(nodes: &NodeSet) {
    assert_eq!(
        nodes.adopt_fresh_servers("slate:").await.unwrap(),
        nodes.len(),
        "every node adopted"
    );
}

/// A lock with a 2 s lease (unless `lease` says otherwise) and a short spin wait.
pub fn lock_on(nodes: &NodeSet, name: &str, order: Order) -> CombinationLock {
    CombinationLock::builder(nodes, name)
        .lease(Duration::from_secs(2))
        .spin_wait(Duration::from_millis(20))
        .order(order)
        .build()
        .expect("lock")
}

/// The fencing counter `name`'s tokens come from (default prefix): its hash slot's,
/// `slate:fence:{<slot tag>}`, shared with every name of that slot.
pub fn fence_key(name: &str) -> String {
    let keys = slate_redis::node::NodeKeys::new("slate:", &LockName::new(name).expect("name"));
    String::from_utf8(keys.fence_key().to_vec()).expect("utf-8")
}

/// What [`base_fence`] sets a slot counter to.
pub const FENCE_BASE: i64 = 1_000_000;

/// Starts `name`'s slot counter on `server` at [`FENCE_BASE`] unless it exists, so that
/// [`tokens_taken`] counts the acquisitions that ran there (a missing counter is seeded from
/// the server clock by the first acquisition instead).
pub fn base_fence(server: &RedisServer, name: &str) {
    server
        .command(&["SET", &fence_key(name), &FENCE_BASE.to_string(), "NX"])
        .expect("SET NX");
}

/// Tokens taken from `name`'s slot counter on `server` since [`base_fence`] (0: none; every
/// first acquisition takes one): whether, and how often, an acquire ran there.
pub fn tokens_taken(server: &RedisServer, name: &str) -> i64 {
    let v: Option<i64> =
        redis::from_redis_value(server.command(&["GET", &fence_key(name)]).expect("GET"))
            .expect("GET reply");
    v.map_or(0, |v| v - FENCE_BASE)
}

/// The lock hash key of `name` (default prefix).
pub fn key(name: &str) -> String {
    format!("slate:{{{name}}}")
}

/// `HGETALL` of the lock key on one server, as holder → count (empty when absent; the hash's
/// own fields `t`, `r` and `w`, see `acquire.lua`, are left out).
pub fn entries(server: &RedisServer, name: &str) -> BTreeMap<String, i64> {
    let all: BTreeMap<String, String> =
        redis::from_redis_value(server.command(&["HGETALL", &key(name)]).expect("HGETALL"))
            .expect("HGETALL reply");
    all.into_iter()
        .filter(|(f, _)| !matches!(f.as_str(), "t" | "r" | "w"))
        .map(|(f, v)| (f, v.parse().expect("a count")))
        .collect()
}

/// `holder`'s count on one server, if it has an entry there.
pub fn count_of(server: &RedisServer, name: &str, holder: HolderId) -> Option<i64> {
    entries(server, name).get(&holder.to_string()).copied()
}

/// `PTTL` of the lock key on one server (−2 when absent).
pub fn pttl(server: &RedisServer, name: &str) -> i64 {
    redis::from_redis_value(server.command(&["PTTL", &key(name)]).expect("PTTL")).expect("int")
}

/// Whether the lock key exists on one server.
pub fn exists(server: &RedisServer, name: &str) -> bool {
    let n: i64 = redis::from_redis_value(server.command(&["EXISTS", &key(name)]).expect("EXISTS"))
        .expect("int");
    n == 1
}

/// Makes another holder (not of this process) hold the lock on one server, directly.
pub fn hold_directly(server: &RedisServer, name: &str, other: &str, ms: u64) {
    server
        .command(&["HSET", &key(name), other, "1"])
        .expect("HSET");
    server
        .command(&["PEXPIRE", &key(name), &ms.to_string()])
        .expect("PEXPIRE");
}

/// Polls `f` every 10 ms (off the runtime's threads) until it returns `Some`; fails after
/// `within`.
pub async fn wait_for<T>(within: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = tokio::task::block_in_place(&mut f) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until some holder other than `except` has an entry on `server`, and returns it.
pub async fn wait_entry(server: &RedisServer, name: &str, within: Duration) -> String {
    wait_for(within, "an entry on the server", || {
        entries(server, name).into_keys().next()
    })
    .await
}

/// Sets a proxy's mode, panicking on failure.
pub fn set(proxy: &FaultProxy, mode: Mode) {
    proxy.set_mode(mode).expect("proxy mode");
}

/// A delay of requests (replies unaffected).
pub fn delay(d: Duration) -> Mode {
    Mode::Delay {
        to_server: d,
        to_client: Duration::ZERO,
    }
}

/// One attempt as `holder` (`try_lock` for a named holder): `Ok(None)` when busy.
pub async fn try_as(
    lock: &CombinationLock,
    holder: HolderId,
) -> slate_core::Result<Option<slate_combination::CombinationLockGuard>> {
    match lock.acquire(holder, slate_core::Wait::Immediate).await {
        Ok(g) => Ok(Some(g)),
        Err(e) if e.is_busy() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Subscribers of the lock's release channel on `server`.
pub fn subscribers(server: &RedisServer, name: &str) -> i64 {
    server
        .subscribers(&format!("slate:{{{name}}}:released"))
        .unwrap()
}

/// Takes `lock` again and again (every 50 ms, for at most `limit`) until a hold includes node
/// `node` (a quarantine ran its course), and returns that hold; every other hold is released
/// at once. An attempt that does not hold fails the test, unless `busy_ok`.
pub async fn hold_including(
    lock: &CombinationLock,
    node: usize,
    limit: Duration,
    busy_ok: bool,
) -> slate_combination::CombinationLockGuard {
    let start = Instant::now();
    loop {
        match lock.try_lock().await {
            Ok(Some(g)) if g.nodes().contains(&node) => return g,
            Ok(Some(g)) => drop(g.unlock().await.unwrap()),
            other if busy_ok => drop(other),
            other => panic!(
                "not held: {:?}",
                other.map(|g| g.map(|g| g.nodes().to_vec()))
            ),
        }
        assert!(
            start.elapsed() < limit,
            "node {node} is still not used {:?} after its quarantine began",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
