//! Scenario X3, names (issue #7, reliability.md §6.5 and §4 "injection safety", "lock-name
//! validation"): hostile lock names.
//!
//! Names: empty, 1 MB, 1025 bytes (refused); the longest allowed (1024 bytes), CR/LF, spaces,
//! tabs, quotes, backslashes, Lua metacharacters and would-be script injections, glob
//! characters, braces (the hash tag: `{}`, `}{`, `a}b`), names that spell another lock's
//! derived keys (`a}:fence`, `a}:queue`, `a}:turn`, `a}:holder`, `a}:released`, `a}:req:<holder>`, and
//! `slate:{a}:fence` itself), a NUL byte, non-UTF-8 bytes (the API takes bytes).
//!
//! Expected: each name is either refused by a clear validation error (`InvalidInput` naming
//! the limit) or used verbatim, only inside the braces of its keys (`slate:{<name>}`, or
//! `slate:{{<name>}` for a name that is `{`* then `}`, whose tag would otherwise be empty; and its
//! suffixed side keys), with no script error; the keys of distinct names never coincide; and
//! locks never interfere:
//! - pairs of look-alike names contend at the same time, from worker processes (names that fit
//!   a command line) and from in-process clients (NUL, non-UTF-8), each name with its own
//!   history and counter: the checker decides I1 (exclusion), I3 (tokens), I5/I6 and the
//!   counter per name;
//! - one lock's release and force unlock leave its look-alike's entry, lease, fencing counter
//!   and guard untouched;
//! - the read-write lock and the semaphore (issue 16) refuse the same names and use the
//!   accepted ones verbatim under their own suffixes (`:rw`, `:sem` and their side keys),
//!   which never coincide with any name's single-lock keys; a writer on one name never
//!   blocks its look-alike.
//!
//! The holder-id half of X3 is `ecosphere/fork-probe/tests/holder_ids.rs` (fork needs `unsafe`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ecosphere::clock::to_mono_ns;
use ecosphere::history::{
    CheckConfig, CheckId, CounterCheck, CounterExpectation, EventKind, OP_INCR, OUTCOME_OK,
    Recorder, Status,
};
use ecosphere::server::RedisServer;
use ecosphere::workers::WorkerSet;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use scenario::{Worker, check, finish_ok, go, server, wait_line_all};
use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
use slate_core::{LossReason, MAX_NAME_LEN};
use slate_redis::{ClientOptions, RedisClient, RwLock, Semaphore, SingleLock, SingleLockGuard};

/// The lock key of `name` under the default prefix: the name's exact bytes in braces, with one
/// more `{` in front of a name that is `{`* then `}` (whose tag would otherwise be empty: issue
/// 19, defect 7).
fn lock_key(name: &[u8]) -> Vec<u8> {
    let mut key = b"slate:{".to_vec();
    let braces = name.iter().take_while(|&&b| b == b'{').count();
    if name.get(braces) == Some(&b'}') {
        key.push(b'{');
    }
    key.extend_from_slice(name);
    key.push(b'}');
    key
}

/// Names that fit a command line (no NUL, valid UTF-8), in look-alike pairs.
fn argv_names() -> Vec<String> {
    vec![
        "a".into(),
        "a}:fence".into(),
        "{}".into(),
        "}{".into(),
        "line1\r\nline2 \"dq\" 'sq' \\ \ttab".into(),
        "]]..redis.call('FLUSHALL')..[[ -- %s %d".into(),
        format!("{{{}}}", "z".repeat(MAX_NAME_LEN - 2)),
        format!("{{{}}}", "z".repeat(MAX_NAME_LEN - 3)),
    ]
}

/// Every hostile name that must be accepted, as bytes.
fn accepted_names() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = argv_names().into_iter().map(String::into_bytes).collect();
    for n in [
        &b" "[..],
        b"a b c",
        b"\r\n",
        b"'); redis.call('DEL', KEYS[1]); --",
        b"\" .. redis.call('FLUSHALL') .. \"",
        b"*",
        b"?[a-z]",
        b"{a}",
        b"a}b",
        b"a}:queue",
        b"a}:turn",
        b"a}:holder",
        b"a}:released",
        b"a}:req:00000000000000000000000000000001:1",
        b"slate:{a}:fence",
        b"a\0b",
        b"\0",
        b"\xff\xfe\x80",
        b"caf\xe9",
        b"\xff\xfe\x80}",
    ] {
        v.push(n.to_vec());
    }
    let mut long: Vec<u8> = (0..MAX_NAME_LEN).map(|i| (i % 256) as u8).collect();
    long[0] = b'}';
    v.push(long);
    v
}

/// The keys Slate derives from a lock key (see `slate-redis/src/scripts/keys.rs`).
fn derived(lock_key: &[u8]) -> Vec<Vec<u8>> {
    let mut out = vec![lock_key.to_vec()];
    for suffix in [
        &b":fence"[..],
        b":queue",
        b":turn",
        b":holder",
        b":released",
        b":req:",
    ] {
        let mut k = lock_key.to_vec();
        k.extend_from_slice(suffix);
        out.push(k);
    }
    out
}

/// `KEYS *` as raw bytes.
fn raw_keys(server: &RedisServer) -> BTreeSet<Vec<u8>> {
    let mut con = server.connection().expect("admin connection");
    redis::cmd("KEYS")
        .arg("*")
        .query::<Vec<Vec<u8>>>(&mut con)
        .expect("KEYS")
        .into_iter()
        .collect()
}

/// `HGETALL` of a raw lock key as holder → count (the hash's own fields `t`, `r` and `w` left
/// out).
fn raw_hgetall(server: &RedisServer, key: &[u8]) -> BTreeMap<String, u64> {
    let mut con = server.connection().expect("admin connection");
    let all: BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(key)
        .query(&mut con)
        .expect("HGETALL");
    all.into_iter()
        .filter(|(f, _)| !matches!(f.as_str(), "t" | "r" | "w"))
        .map(|(f, v)| (f, v.parse().expect("a count")))
        .collect()
}

/// `GET` of a raw key as a number (0 when absent).
fn raw_get(server: &RedisServer, key: &[u8]) -> u64 {
    let mut con = server.connection().expect("admin connection");
    redis::cmd("GET")
        .arg(key)
        .query::<Option<u64>>(&mut con)
        .expect("GET")
        .unwrap_or(0)
}

fn lock_of(client: &RedisClient, name: &[u8], lease: Duration) -> SingleLock {
    SingleLock::builder(client, name)
        .lease(lease)
        .renewal_period(lease / 3)
        .spin_wait(Duration::from_millis(50))
        .build()
        .unwrap_or_else(|e| panic!("{:?} must be accepted: {e}", String::from_utf8_lossy(name)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x3_names_are_refused_clearly_or_used_verbatim_as_keys() {
    let server = server();
    let second = scenario::server(); // one server listed twice is refused
    let client = RedisClient::open(server.url()).expect("client");
    let nodes = NodeSet::connect(
        [server.url(), second.url()],
        NodeSetOptions::builder()
            .quarantine(Duration::from_secs(30))
            .build()
            .unwrap(),
    )
    .expect("node set");

    // Refused before anything is sent, naming the limit.
    let cases: [(&str, Vec<u8>, &str); 3] = [
        ("empty", vec![], "empty"),
        ("1 MB", vec![b'x'; 1 << 20], "1048576 bytes"),
        ("1025 bytes", vec![b'x'; MAX_NAME_LEN + 1], "1025 bytes"),
    ];
    for (what, name, says) in &cases {
        let e = SingleLock::builder(&client, name)
            .build()
            .expect_err("refused");
        assert!(e.is_invalid_input(), "{what}: {e}");
        assert!(e.to_string().contains(says), "{what}: {e}");
        assert!(e.to_string().contains("lock name"), "{what}: {e}");
        let e = CombinationLock::builder(&nodes, name)
            .build()
            .expect_err("refused");
        assert!(e.is_invalid_input(), "{what} (combination): {e}");
        assert!(e.to_string().contains(says), "{what} (combination): {e}");
    }
    assert!(raw_keys(&server).is_empty(), "nothing was sent");

    // Accepted names: keys are the prefix and the name's exact bytes in braces, and no two
    // names (or a name and another's side key) share a key.
    let names = accepted_names();
    let mut all_keys: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let lease = Duration::from_secs(2);
    for name in &names {
        let lock = lock_of(&client, name, lease);
        let expected = lock_key(name);
        assert_eq!(lock.key(), expected.as_slice());
        for k in derived(lock.key()) {
            if let Some(other) = all_keys.insert(k.clone(), name.clone()) {
                panic!(
                    "names {:?} and {:?} share the key {:?}",
                    String::from_utf8_lossy(&other),
                    String::from_utf8_lossy(name),
                    String::from_utf8_lossy(&k)
                );
            }
        }
        // Used verbatim: acquire, re-enter, release; the server holds exactly these keys.
        let g = lock.lock().await.expect("lock");
        let g2 = g.reenter().await.expect("re-enter");
        let fields = raw_hgetall(&server, &expected);
        assert_eq!(
            fields,
            BTreeMap::from([(g.holder().to_string(), 2)]),
            "{:?}",
            String::from_utf8_lossy(name)
        );
        assert_eq!(lock.hold_count(g.holder()).await.expect("hold_count"), 2);
        let token = g.fencing_token().get();
        assert_eq!(g2.unlock().await.expect("unlock"), 1);
        assert_eq!(g.unlock().await.expect("unlock"), 0);
        assert!(
            raw_get(&server, &slot_fence(name)) >= token,
            "the token came from the name's slot counter"
        );
        let left: Vec<Vec<u8>> = raw_keys(&server)
            .into_iter()
            .filter(|k| k.starts_with(&expected))
            .collect();
        assert_eq!(left, Vec::<Vec<u8>>::new(), "nothing of the name is left");
    }
    // Nothing is left but slot counters, never a name's own key.
    let rest: Vec<Vec<u8>> = raw_keys(&server)
        .into_iter()
        .filter(|k| !k.starts_with(b"slate:fence:{"))
        .collect();
    assert_eq!(rest, Vec::<Vec<u8>>::new());
    assert_eq!(names.iter().collect::<BTreeSet<_>>().len(), names.len());
}

/// In-process contention on one lock by `clients` clients × `tasks` tasks, each recording a
/// history under `label` in `dir` (proc = the client's index + `proc_base`), incrementing a
/// GET/SET counter on the resource server per acquisition.
struct Contention {
    label: String,
    lock: SingleLock,
    rec: Recorder,
    resource: MultiplexedConnection,
    counter: String,
    attempts: AtomicU64,
}

impl Contention {
    fn record(&self, task: u64, kind: EventKind) {
        self.rec
            .record(task, &self.label, kind)
            .expect("record an event");
    }

    async fn run(self: Arc<Self>, task: u64, iterations: u64) -> u64 {
        let mut done = 0;
        for _ in 0..iterations {
            let attempt = self.attempts.fetch_add(1, Ordering::Relaxed);
            self.record(
                task,
                EventKind::AcqInvoke {
                    attempt,
                    budget_ms: Some(20_000),
                },
            );
            let g: SingleLockGuard = self
                .lock
                .try_lock_for(Duration::from_secs(20))
                .await
                .expect("lock within 20 s, without a script error");
            let holder = g.holder().to_string();
            let token = g.fencing_token().get();
            self.record(
                task,
                EventKind::AcqOk {
                    attempt,
                    holder: holder.clone(),
                    token,
                    depth: g.depth(),
                    deadline: to_mono_ns(g.lease_deadline()),
                    nodes: vec![],
                    permits: None,
                },
            );
            let mut con = self.resource.clone();
            let v: Option<u64> = con.get(&self.counter).await.expect("GET counter");
            let () = con
                .set(&self.counter, v.unwrap_or(0) + 1)
                .await
                .expect("SET counter");
            self.record(
                task,
                EventKind::ResOp {
                    holder: holder.clone(),
                    token,
                    op: OP_INCR.to_owned(),
                    outcome: OUTCOME_OK.to_owned(),
                    invoked: None,
                },
            );
            assert!(!g.is_lost(), "lease lost during a short critical section");
            self.record(
                task,
                EventKind::RelInvoke {
                    holder: holder.clone(),
                    depth_before: 1,
                },
            );
            let left = g.unlock().await.expect("unlock");
            self.record(
                task,
                EventKind::RelOk {
                    holder,
                    depth_after: left,
                },
            );
            done += 1;
        }
        done
    }
}

/// Checks one name's history: I1, I3, I5, I6, validity, its counter, and that each of its
/// `procs` processes made its share of the `expected` acquisitions; returns the highest
/// fencing token its holders got.
fn check_name(
    label: &str,
    dir: &Path,
    counter: u64,
    lease: Duration,
    procs: usize,
    expected: u64,
) -> u64 {
    let cfg = CheckConfig {
        counter: Some(CounterCheck {
            final_value: counter,
            expected: CounterExpectation::AckedIncrements,
        }),
        ..CheckConfig::new(lease)
    };
    let (history, report) = check(dir, &cfg);
    report.assert_ok();
    // Every task runs all its iterations (a failed lock or unlock fails the run).
    report.assert_contention(procs, (expected / procs as u64) as usize, 2);
    for id in [
        CheckId::Exclusion,
        CheckId::Tokens,
        CheckId::Ownership,
        CheckId::Validity,
        CheckId::Counter,
    ] {
        assert_eq!(report.status(id), &Status::Pass, "{label}: {}", id.label());
    }
    report.assert_pass_or_unchecked(CheckId::Reentry, "these workers never re-enter");
    assert_eq!(counter, expected, "{label}: counter = acquisitions");
    assert_eq!(
        report.stats.first_level_acquisitions as u64, expected,
        "{label}"
    );
    history
        .events()
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::AcqOk { token, .. } => Some(*token),
            _ => None,
        })
        .max()
        .expect("acquisitions")
}

/// The counter of `name`'s hash slot (`slate:fence:{<slot tag>}`), which every name of that
/// slot takes its tokens from (issue 30: no key per name outlives the name's lease).
fn slot_fence(name: &[u8]) -> Vec<u8> {
    let name = slate_core::LockName::new(name).expect("an accepted name");
    slate_redis::node::NodeKeys::new("slate:", &name)
        .fence_key()
        .to_vec()
}

/// A name's tokens came from its slot's counter: the counter is at or above the highest token
/// its holders got (each name's tokens strictly increasing is the history checker's I3; the
/// counter is shared with the names of the same slot, so it may be far above).
fn assert_slot_counter(label: &str, counter: u64, max_token: u64) {
    assert!(
        counter >= max_token,
        "{label}: slot counter {counter} below the highest token of the name's holders {max_token}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x3_nul_and_non_utf8_name_pairs_contend_independently() {
    const CLIENTS: usize = 2;
    const TASKS: u64 = 2;
    const ITERATIONS: u64 = 15;
    let lease = Duration::from_secs(2);
    let lock_server = server();
    let resource = server();
    let dir = tempfile::tempdir().expect("tempdir");
    let names: [&[u8]; 4] = [b"\xff\xfe\x80", b"\xff\xfe\x80}", b"a\0b", b"a"];
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(RedisClient::open(lock_server.url()).expect("client"));
    }
    let res_client = redis::Client::open(resource.url()).expect("resource client");
    let mut runs = tokio::task::JoinSet::new();
    for (n, name) in names.iter().enumerate() {
        let label = format!("name{n}");
        let hist = dir.path().join(&label);
        std::fs::create_dir(&hist).expect("history dir");
        for (c, client) in clients.iter().enumerate() {
            let ctx = Arc::new(Contention {
                label: label.clone(),
                lock: lock_of(client, name, lease),
                rec: Recorder::create(&hist, u32::try_from(c).expect("proc")).expect("recorder"),
                resource: res_client
                    .get_multiplexed_async_connection()
                    .await
                    .expect("resource connection"),
                counter: format!("counter:{label}"),
                attempts: AtomicU64::new(0),
            });
            for task in 0..TASKS {
                runs.spawn(ctx.clone().run(task, ITERATIONS));
            }
        }
    }
    let mut total = 0;
    while let Some(r) = runs.join_next().await {
        total += r.expect("contending task");
    }
    let per_name = CLIENTS as u64 * TASKS * ITERATIONS;
    assert_eq!(total, per_name * names.len() as u64);
    for (n, name) in names.iter().enumerate() {
        let label = format!("name{n}");
        let counter = scenario::get_u64(&resource, &format!("counter:{label}"));
        let max_token = check_name(
            &label,
            &dir.path().join(&label),
            counter,
            lease,
            CLIENTS,
            per_name,
        );
        assert_slot_counter(&label, raw_get(&lock_server, &slot_fence(name)), max_token);
    }
}

#[test]
fn x3_look_alike_name_pairs_contend_independently_across_processes() {
    look_alike_pairs(2, 2, 12, Duration::from_secs(55));
}

#[test]
#[cfg_attr(
    not(feature = "full-matrix"),
    ignore = "full matrix: cargo test -p ecosphere --features full-matrix"
)]
fn x3_look_alike_name_pairs_under_heavy_contention() {
    look_alike_pairs(4, 8, 50, Duration::from_secs(170));
}

/// Every name of [`argv_names`] contended by `procs` worker processes × `tasks` tasks ×
/// `iterations`, all names at once; one history, counter and check per name.
fn look_alike_pairs(procs: usize, tasks: u64, iterations: u64, within: Duration) {
    let lease = Duration::from_secs(2);
    let lock_server = server();
    let resource = server();
    let dir = tempfile::tempdir().expect("tempdir");
    let go_file = dir.path().join("go");
    let names = argv_names();
    let mut sets: Vec<WorkerSet> = Vec::new();
    for (n, name) in names.iter().enumerate() {
        let hist = dir.path().join(format!("name{n}"));
        std::fs::create_dir(&hist).expect("history dir");
        let mut w = Worker::new("contend", &lock_server, name, &hist);
        w.resource_url = Some(resource.url());
        w.tasks = tasks;
        w.iterations = iterations;
        w.lease = lease;
        w.spin_wait = Some(Duration::from_millis(100));
        w.max_duration = within - Duration::from_secs(5);
        w.go_file = Some(go_file.clone());
        w.counter_key = format!("counter:name{n}");
        sets.push(w.spawn(procs));
    }
    for set in &mut sets {
        wait_line_all(set, "READY", Duration::from_secs(30));
    }
    go(&go_file);
    for set in &mut sets {
        finish_ok(set, within);
    }
    let per_name = procs as u64 * tasks * iterations;
    for (n, name) in names.iter().enumerate() {
        let label = format!("name{n} {name:?}");
        let counter = scenario::get_u64(&resource, &format!("counter:name{n}"));
        let max_token = check_name(
            &label,
            &dir.path().join(format!("name{n}")),
            counter,
            lease,
            procs,
            per_name,
        );
        assert_slot_counter(
            &label,
            raw_get(&lock_server, &slot_fence(name.as_bytes())),
            max_token,
        );
    }
    let left: Vec<String> = raw_keys(&lock_server)
        .into_iter()
        .map(|k| String::from_utf8_lossy(&k).into_owned())
        .filter(|k| !k.starts_with("slate:fence:{") && !k.contains(":req:"))
        .collect();
    assert_eq!(left, Vec::<String>::new(), "no lock key left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x3_release_and_force_unlock_never_touch_a_look_alike() {
    let server = server();
    let a = RedisClient::open(server.url()).expect("client");
    let b = RedisClient::open_with(
        server.url(),
        ClientOptions::builder()
            .command_timeout(Duration::from_secs(2))
            .build()
            .unwrap(),
    )
    .expect("client");
    let lease = Duration::from_millis(1000);
    let pairs: [(&[u8], &[u8]); 10] = [
        (b"a", b"a}:fence"),
        (b"a", b"a}:queue"),
        (b"a", b"a}:turn"),
        (b"a", b"a}:holder"),
        (b"a", b"a}:released"),
        (b"a", b"slate:{a}:fence"),
        (b"{}", b"}{"),
        (b"a\0b", b"a"),
        (b"\xff\xfe\x80", b"\xff\xfe\x80}"),
        (b"*", b"?"),
    ];
    for (x, y) in pairs {
        let what = format!(
            "{:?} / {:?}",
            String::from_utf8_lossy(x),
            String::from_utf8_lossy(y)
        );
        let lx = lock_of(&a, x, lease);
        let ly = lock_of(&b, y, lease);
        // y's token, as its lock hash keeps it (field `t`, see `acquire.lua`).
        let y_token = |server: &RedisServer| -> Option<u64> {
            let mut con = server.connection().expect("admin connection");
            redis::cmd("HGET")
                .arg(ly.key())
                .arg("t")
                .query(&mut con)
                .expect("HGET")
        };
        // Force unlock of x while both are held: y keeps its entry, lease and guard.
        let gx = lx.lock().await.expect("lock x");
        let gy = ly.lock().await.expect("lock y");
        let token_before = y_token(&server);
        assert_eq!(token_before, Some(gy.fencing_token().get()), "{what}");
        assert_eq!(
            lx.force_unlock().await.expect("force unlock x"),
            1,
            "{what}"
        );
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(3), gx.lost()).await,
            Ok(LossReason::EntryGone),
            "{what}: x learns of the force unlock"
        );
        // y is renewed after x's force unlock (its deadline moves), still held, and its token
        // unmoved.
        let renewed_from = gy.lease_deadline();
        let until = std::time::Instant::now() + Duration::from_secs(3);
        while gy.lease_deadline() <= renewed_from && !gy.is_lost() {
            assert!(
                std::time::Instant::now() < until,
                "{what}: y not renewed within 3 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            !gy.is_lost(),
            "{what}: y lost: {:?}",
            gy.lease().loss_reason()
        );
        assert_eq!(
            ly.hold_count(gy.holder()).await.expect("hold_count"),
            1,
            "{what}"
        );
        assert_eq!(
            raw_hgetall(&server, ly.key()),
            BTreeMap::from([(gy.holder().to_string(), 1)]),
            "{what}"
        );
        assert_eq!(y_token(&server), token_before, "{what}");
        assert!(!lx.is_locked().await.expect("is_locked x"), "{what}");
        drop(gx);
        // Release of x (re-acquired) while y is held: y untouched.
        let gx = lx.lock().await.expect("lock x again");
        assert_eq!(gx.unlock().await.expect("unlock x"), 0, "{what}");
        assert_eq!(
            ly.hold_count(gy.holder()).await.expect("hold_count"),
            1,
            "{what}"
        );
        // And the other way round: y's force unlock leaves x alone.
        let gx = lx.lock().await.expect("lock x");
        assert_eq!(
            ly.force_unlock().await.expect("force unlock y"),
            1,
            "{what}"
        );
        assert_eq!(
            tokio::time::timeout(Duration::from_secs(3), gy.lost()).await,
            Ok(LossReason::EntryGone),
            "{what}: y learns of the force unlock"
        );
        assert_eq!(
            lx.hold_count(gx.holder()).await.expect("hold_count"),
            1,
            "{what}"
        );
        assert!(!gx.is_lost(), "{what}");
        assert_eq!(gx.unlock().await.expect("unlock x"), 0, "{what}");
        assert!(
            gy.unlock()
                .await
                .expect_err("y was force-unlocked")
                .is_not_held()
        );
    }
}

/// The keys the read-write lock (`:rw`) and the semaphore (`:sem`) derive from a lock key.
fn shared_derived(lock_key: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for kind in [&b":rw"[..], b":sem"] {
        let mut base = lock_key.to_vec();
        base.extend_from_slice(kind);
        out.push(base.clone());
        for suffix in [
            &b":leases"[..],
            b":queue",
            b":wants",
            b":fence",
            b":released",
            b":permits",
            b":req:",
        ] {
            let mut k = base.clone();
            k.extend_from_slice(suffix);
            out.push(k);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x3_read_write_locks_and_semaphores_take_hostile_names_verbatim() {
    let server = server();
    let client = RedisClient::open(server.url()).expect("client");
    let other = RedisClient::open(server.url()).expect("client");
    for (what, name, says) in [
        ("empty", vec![], "empty"),
        ("1025 bytes", vec![b'x'; MAX_NAME_LEN + 1], "1025 bytes"),
    ] {
        let e = RwLock::builder(&client, &name)
            .build()
            .expect_err("refused");
        assert!(
            e.is_invalid_input() && e.to_string().contains(says),
            "{what}: {e}"
        );
        let e = Semaphore::builder(&client, &name, 2)
            .build()
            .expect_err("refused");
        assert!(
            e.is_invalid_input() && e.to_string().contains(says),
            "{what}: {e}"
        );
    }
    let names = accepted_names();
    let mut all_keys: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for name in &names {
        for k in derived(&lock_key(name))
            .into_iter()
            .chain(shared_derived(&lock_key(name)))
        {
            if let Some(prev) = all_keys.insert(k.clone(), name.clone()) {
                panic!(
                    "names {:?} and {:?} share the key {:?}",
                    String::from_utf8_lossy(&prev),
                    String::from_utf8_lossy(name),
                    String::from_utf8_lossy(&k)
                );
            }
        }
    }
    let lease = Duration::from_secs(2);
    for pair in names.chunks(2) {
        for (i, name) in pair.iter().enumerate() {
            let label = String::from_utf8_lossy(name);
            let rw = RwLock::builder(&client, name)
                .lease(lease)
                .build()
                .expect("rw");
            let mut key = lock_key(name);
            key.extend_from_slice(b":rw");
            assert_eq!(rw.key(), key.as_slice(), "{label:?}");
            let w = rw.write().await.expect("write");
            let fields = raw_hgetall(&server, &key);
            assert_eq!(fields.get("n"), Some(&(1 << 30)), "{label:?}: {fields:?}");
            // The look-alike is free while this name is written.
            if let Some(twin) = pair.get(1 - i) {
                let twin_lock = RwLock::builder(&other, twin)
                    .lease(lease)
                    .build()
                    .expect("rw");
                let g = twin_lock.try_write().await.expect("try_write");
                assert!(g.is_some(), "{label:?} blocked its look-alike");
            }
            let r = w.downgrade().await.expect("downgrade");
            assert_eq!(r.unlock().await.expect("unlock"), 0);
            let sem = Semaphore::builder(&client, name, 2)
                .lease(lease)
                .build()
                .expect("sem");
            let p = sem.acquire(2).await.expect("permits");
            assert_eq!(sem.status().await.expect("status").in_use, 2, "{label:?}");
            assert_eq!(p.unlock().await.expect("unlock"), 0);
        }
    }
    // Nothing left but each name's persistent keys (fences, capacities) and request records.
    for k in raw_keys(&server) {
        let persistent =
            k.ends_with(b":fence") || k.starts_with(b"slate:fence:{") || k.ends_with(b":permits");
        let record = k.windows(5).any(|w| w == b":req:");
        assert!(
            persistent || record,
            "left behind: {:?}",
            String::from_utf8_lossy(&k)
        );
    }
}
