//! Helpers shared by the integration tests: a harness server per test, a client, key
//! listings and condition waits with deadlines.
#![allow(dead_code)]
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::time::{Duration, Instant};

use slate_harness::cluster::RedisCluster;
use slate_harness::sentinel::SentinelGroup;
use slate_harness::server::RedisServer;
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

/// Where a test looks at the data: a server, or a whole deployment.
pub trait Inspect {
    /// The server that holds `key` (a cluster: its slot's master; Sentinel: the master).
    fn owner(&self, key: &str) -> &RedisServer;
    /// Every master (where keys live).
    fn masters(&self) -> Vec<&RedisServer>;
}

impl Inspect for RedisServer {
    fn owner(&self, _key: &str) -> &RedisServer {
        self
    }
    fn masters(&self) -> Vec<&RedisServer> {
        vec![self]
    }
}

/// One of the three deployments a behaviour test runs on.
#[allow(clippy::large_enum_variant)] // one per test
pub enum Deployment {
    /// One master.
    Standalone(RedisServer),
    /// A 3-master cluster without replicas.
    Cluster(RedisCluster),
    /// A master, one replica, one Sentinel.
    Sentinel(SentinelGroup),
}

impl Deployment {
    pub fn standalone() -> Self {
        Deployment::Standalone(server())
    }

    pub fn cluster() -> Self {
        Deployment::Cluster(RedisCluster::start(3, 0).expect("start a cluster"))
    }

    pub fn sentinel() -> Self {
        Deployment::Sentinel(SentinelGroup::start(1, 1).expect("start a Sentinel group"))
    }

    /// A client for this deployment (call inside a runtime).
    pub fn client(&self) -> RedisClient {
        self.client_with(ClientOptions::default())
    }

    /// A client with options.
    pub fn client_with(&self, options: ClientOptions) -> RedisClient {
        match self {
            Deployment::Standalone(s) => RedisClient::open_with(s.url(), options),
            Deployment::Cluster(c) => RedisClient::open_cluster(c.urls(), options),
            Deployment::Sentinel(g) => {
                RedisClient::open_sentinel(g.sentinel_urls(), g.master_name(), options)
            }
        }
        .expect("client")
    }

    /// One command on the server that holds its key (`args[1]`).
    pub fn command(
        &self,
        args: &[&str],
    ) -> Result<redis::Value, slate_harness::server::HarnessError> {
        self.owner(args.get(1).copied().unwrap_or("")).command(args)
    }
}

impl Inspect for Deployment {
    fn owner(&self, key: &str) -> &RedisServer {
        match self {
            Deployment::Standalone(s) => s,
            Deployment::Cluster(c) => {
                let slot = c.slot_of(key.as_bytes()).expect("CLUSTER KEYSLOT");
                c.node(c.master_of(slot).expect("the slot's master"))
            }
            Deployment::Sentinel(g) => g.server(g.master().expect("the master")),
        }
    }
    fn masters(&self) -> Vec<&RedisServer> {
        match self {
            Deployment::Standalone(s) => vec![s],
            Deployment::Cluster(c) => c
                .masters()
                .expect("the masters")
                .into_iter()
                .map(|i| c.node(i))
                .collect(),
            Deployment::Sentinel(g) => vec![g.server(g.master().expect("the master"))],
        }
    }
}

/// Runs an async behaviour test on each deployment: `name::standalone`, `name::cluster`,
/// `name::sentinel`.
#[macro_export]
macro_rules! per_topology {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn standalone() {
                super::$name(super::common::Deployment::standalone()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn cluster() {
                super::$name(super::common::Deployment::cluster()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sentinel() {
                super::$name(super::common::Deployment::sentinel()).await;
            }
        }
    };
}

/// Every key, on every master.
pub fn keys(at: &impl Inspect) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    for server in at.masters() {
        let v = server.command(&["KEYS", "*"]).expect("KEYS");
        let some: Vec<String> = redis::from_redis_value(v).expect("KEYS reply");
        keys.extend(some);
    }
    keys.sort();
    keys
}

/// The keys left after a release: request records (`…:req:<holder>`, kept for the retry
/// window of two command timeouts so that a retried request is not applied twice) are checked
/// to expire within `window` and left out; the rest is returned, sorted.
pub fn keys_but_records(server: &impl Inspect, window: std::time::Duration) -> Vec<String> {
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

/// One integer command, on the server that holds its key (`args[1]`).
pub fn int(at: &impl Inspect, args: &[&str]) -> i64 {
    let server = at.owner(args.get(1).copied().unwrap_or(""));
    redis::from_redis_value(server.command(args).expect("command")).expect("integer reply")
}

/// Runs one of the lock's scripts directly (for wrong-owner tests): `script` is the file name.
pub fn run_script(at: &impl Inspect, code: &str, keys: &[&str], args: &[&str]) -> i64 {
    let server = at.owner(keys.first().copied().unwrap_or(""));
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

/// The product's script `name` as this build sends it: a mutant build's (`.ci/mutants`) with
/// its defect switched on, so that the script-level tests can catch it.
pub fn product_lua(name: &str) -> &'static str {
    slate_redis::lua_script(name)
        .unwrap_or_else(|| panic!("no script {name:?}"))
        .source
}

/// `release.lua`, as this build sends it.
pub fn release_lua() -> &'static str {
    product_lua("release")
}

/// `renew.lua`, as this build sends it.
pub fn renew_lua() -> &'static str {
    product_lua("renew")
}

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

/// Releases `held` and waits (at most `limit`) for `waiter` to be granted: it must be woken by
/// the release's notification, sooner than `bound` (a spin wait would take longer). Returns
/// the waiter's guard.
pub async fn woken_by_the_release(
    held: slate_redis::SingleLockGuard,
    waiter: tokio::task::JoinHandle<slate_redis::Result<slate_redis::SingleLockGuard>>,
    limit: Duration,
    bound: Duration,
) -> slate_redis::SingleLockGuard {
    let released = Instant::now();
    held.unlock().await.unwrap();
    let g = within(limit, "the woken waiter", waiter)
        .await
        .unwrap()
        .unwrap();
    let woke = released.elapsed();
    assert!(
        woke < bound,
        "the waiter woke {woke:?} after the release: by its spin wait, not a notification"
    );
    g
}

/// The fencing counter key lock `name` counts its tokens on under the `slate:` prefix: its
/// hash slot's counter (`slate:fence:{<slot tag>}`), the only key a released lock leaves.
pub fn fence_key(name: &str) -> String {
    let keys =
        slate_redis::node::NodeKeys::new("slate:", &slate_redis::LockName::new(name).unwrap());
    String::from_utf8(keys.fence_key().to_vec()).unwrap()
}

/// The acquire script's source, for tests that run it directly.
/// `acquire.lua`, as this build sends it.
pub fn acquire_lua() -> &'static str {
    product_lua("acquire")
}

/// How a test calls a lock script directly (default prefix); [`Direct::default`] is the plain
/// call: no turn, a 10 s lease, records kept 5 s, a first send that is not a re-entry.
#[derive(Clone, Copy, Debug)]
pub struct Direct<'a> {
    /// The caller's queue id (`""`: no turn).
    pub queue: &'a str,
    /// Acquisitions in a row a queue may keep while others wait.
    pub tenure: u32,
    pub lease_ms: &'a str,
    /// How long a request record is kept.
    pub record_ms: &'a str,
    /// (Acquire) a re-entry only.
    pub reentry: bool,
    /// A send that may repeat an earlier one (`false`: a first send).
    pub resent: bool,
}

impl Default for Direct<'_> {
    fn default() -> Self {
        Direct {
            queue: "",
            tenure: 0,
            lease_ms: "10000",
            record_ms: "5000",
            reentry: false,
            resent: false,
        }
    }
}

impl Direct<'_> {
    /// The defaults, as a first send (`resent` `""`) or a send that may repeat an earlier one
    /// (`"1"`).
    pub fn sent(resent: &str) -> Self {
        Direct {
            resent: resent == "1",
            ..Direct::default()
        }
    }
}

fn flag(on: bool) -> &'static str {
    if on { "1" } else { "" }
}

/// Runs the acquire script directly for `holder` on lock `{name}` with request id `request`,
/// as `how` says.
pub fn acquire_direct(
    con: &mut redis::Connection,
    name: &str,
    holder: &str,
    request: &str,
    how: &Direct<'_>,
) -> Vec<i64> {
    let lock = format!("slate:{{{name}}}");
    let keys = [
        lock.clone(),
        fence_key(name),
        format!("{lock}:queue"),
        format!("{lock}:turn"),
        format!("{lock}:req:{holder}"),
    ];
    let script = redis::Script::new(acquire_lua());
    let mut inv = script.prepare_invoke();
    for k in &keys {
        inv.key(k);
    }
    inv.arg(holder)
        .arg(how.lease_ms)
        .arg(how.queue)
        .arg(how.tenure)
        .arg(request)
        .arg(how.record_ms)
        .arg(flag(how.reentry))
        .arg(flag(how.resent));
    inv.invoke(con).unwrap()
}

/// Runs `acquire_many.lua` (as the library sends it) directly for `holder` over the locks
/// `{name}` of `names` (in the order given), under request `request`; `resent` as for
/// [`acquire_script`]. Answers one reply per name taken or tried.
pub fn acquire_many_script(
    con: &mut redis::Connection,
    names: &[&str],
    holder: &str,
    request: &str,
    resent: &str,
) -> Vec<Vec<i64>> {
    let names: Vec<(&str, Direct<'_>)> = names
        .iter()
        .map(|name| {
            let how = Direct::sent(resent);
            (*name, how)
        })
        .collect();
    acquire_many_direct(con, &names, holder, request)
}

/// Runs `acquire_many.lua` (as the library sends it) directly for `holder` over `names` (in the
/// order given), each the lock `{name}` with how its caller calls it there (its queue id and
/// tenure: `acquire.lua` ARGV[3], ARGV[4]), under request `request`. The lease, the record's
/// window and `resent` are the batch's: every name's must agree, and none may be a re-entry
/// only (the batch has no such call). Answers one reply per name taken or tried.
pub fn acquire_many_direct(
    con: &mut redis::Connection,
    names: &[(&str, Direct<'_>)],
    holder: &str,
    request: &str,
) -> Vec<Vec<i64>> {
    let source = slate_redis::lua_script("acquire_many")
        .expect("the batch script")
        .source;
    acquire_many_with(con, source, names, holder, request)
}

/// [`acquire_many_direct`] with the script's text given: a test may run a mutant of it (the
/// library's text with a line changed) to see that it is caught.
pub fn acquire_many_with(
    con: &mut redis::Connection,
    source: &str,
    names: &[(&str, Direct<'_>)],
    holder: &str,
    request: &str,
) -> Vec<Vec<i64>> {
    let (_, how) = names.first().expect("a batch of at least one name");
    for (name, each) in names {
        assert!(
            (each.lease_ms, each.record_ms, each.resent)
                == (how.lease_ms, how.record_ms, how.resent)
                && !each.reentry,
            "name {name}: a batch has one lease, record window and resend flag, and no re-entry only"
        );
    }
    let script = redis::Script::new(source);
    let mut inv = script.prepare_invoke();
    for (name, _) in names {
        let lock = format!("slate:{{{name}}}");
        inv.key(&lock)
            .key(fence_key(name))
            .key(format!("{lock}:queue"))
            .key(format!("{lock}:turn"))
            .key(format!("{lock}:req:{holder}"));
    }
    inv.arg(holder)
        .arg(how.lease_ms)
        .arg(request)
        .arg(how.record_ms)
        .arg(flag(how.resent));
    for (_, each) in names {
        inv.arg(each.queue).arg(each.tenure);
    }
    inv.invoke(con).unwrap()
}

/// Runs `release_many.lua` (as the library sends it) directly for `holder` on the locks
/// `{name}` of `names` (in the order given), under request `request`, with [`Direct`]'s
/// defaults; `resent` as for [`acquire_script`]. Answers one reply per name.
pub fn release_many_script(
    con: &mut redis::Connection,
    names: &[&str],
    holder: &str,
    request: &str,
    resent: &str,
) -> Vec<i64> {
    let how = Direct::sent(resent);
    release_many_direct(con, names, holder, request, &how)
}

/// Runs `release_many.lua` (as the library sends it) directly for `holder` over the locks
/// `{name}` of `names` (in the order given), each called as `how` says and as
/// [`release_direct`] calls `release.lua` (no local waiters, a turn reserved 20 ms, one
/// hold), under request `request`. Answers one integer per name.
pub fn release_many_direct(
    con: &mut redis::Connection,
    names: &[impl AsRef<str>],
    holder: &str,
    request: &str,
    how: &Direct<'_>,
) -> Vec<i64> {
    release_many_try(con, names, holder, request, how).unwrap()
}

/// [`release_many_direct`], answering the call's error (a replica's `READONLY`...) instead of
/// panicking on it.
pub fn release_many_try<T: redis::FromRedisValue>(
    con: &mut redis::Connection,
    names: &[impl AsRef<str>],
    holder: &str,
    request: &str,
    how: &Direct<'_>,
) -> redis::RedisResult<T> {
    let source = slate_redis::lua_script("release_many")
        .expect("the batch release script")
        .source;
    let script = redis::Script::new(source);
    let mut inv = script.prepare_invoke();
    for name in names {
        let lock = format!("slate:{{{}}}", name.as_ref());
        inv.key(&lock)
            .key(format!("{lock}:released"))
            .key(format!("{lock}:queue"))
            .key(format!("{lock}:turn"))
            .key(format!("{lock}:req:{holder}"));
    }
    inv.arg(request)
        .arg(how.record_ms)
        .arg("")
        .arg(flag(how.resent));
    for _ in names {
        inv.arg(holder)
            .arg(how.lease_ms)
            .arg(how.queue)
            .arg(how.tenure)
            .arg(0)
            .arg(20)
            .arg(1);
    }
    inv.invoke(con)
}

/// Runs the release script directly for `holder` on lock `{name}`: request `request`, undoing
/// acquire `undo` (`""`: a plain release), as `how` says.
pub fn release_direct(
    at: &impl Inspect,
    name: &str,
    holder: &str,
    (request, undo): (&str, &str),
    how: &Direct<'_>,
) -> i64 {
    let lock = format!("slate:{{{name}}}");
    let keys = [
        lock.clone(),
        format!("{lock}:released"),
        format!("{lock}:queue"),
        format!("{lock}:turn"),
        format!("{lock}:req:{holder}"),
    ];
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let tenure = how.tenure.to_string();
    run_script(
        at,
        release_lua(),
        &keys,
        &[
            holder,
            how.lease_ms,
            how.queue,
            &tenure,
            "0",
            "20",
            request,
            how.record_ms,
            undo,
            "",
            "1",
            flag(how.resent),
        ],
    )
}

/// [`acquire_direct`] with the defaults; `resent`: `"1"` for a send that may repeat an
/// earlier one (`""`: a first send).
pub fn acquire_script(
    con: &mut redis::Connection,
    name: &str,
    holder: &str,
    request: &str,
    resent: &str,
) -> Vec<i64> {
    let how = Direct::sent(resent);
    acquire_direct(con, name, holder, request, &how)
}

/// [`release_direct`] with the defaults: request `request`, undoing acquire `undo` (`""`: a
/// plain release), its record kept `record_ms`; `resent` as for [`acquire_script`].
pub fn release_script(
    at: &impl Inspect,
    name: &str,
    holder: &str,
    (request, undo, record_ms): (&str, &str, &str),
    resent: &str,
) -> i64 {
    let how = Direct {
        record_ms,
        ..Direct::sent(resent)
    };
    release_direct(at, name, holder, (request, undo), &how)
}
