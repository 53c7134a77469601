//! The multi-lock: all or nothing, each name's token and lease, exclusion against single-lock
//! holders, waiting in the busy name's queue without polling and without starving, and no
//! deadlock between overlapping sets given in cycle-making orders, with a negative control
//! (the same sets taken in the caller's order) that the same check must catch deadlocking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use slate_redis::{MultiLock, MultiLockGuard, RedisClient, SingleLock, SingleLockGuard};

fn multi(client: &RedisClient, names: &[&str]) -> MultiLock {
    MultiLock::builder(client, names.iter().copied())
        .lease(Duration::from_secs(3))
        .build()
        .expect("multi-lock")
}

fn single(client: &RedisClient, name: &str) -> SingleLock {
    lock(client, name, Duration::from_secs(3))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_sets_are_refused_with_the_fix() {
    let server = server();
    let c = client(&server);
    let refused = |names: Vec<String>, what: &str| {
        let e = MultiLock::builder(&c, names).build().expect_err(what);
        assert!(e.is_invalid_input(), "{what}: {e}");
        e.to_string()
    };
    assert!(refused(vec![], "empty").contains("at least one"));
    assert!(refused(vec!["a".into(), "b".into(), "a".into()], "duplicate").contains("twice"));
    let many: Vec<String> = (0..=MultiLock::MAX_NAMES)
        .map(|i| format!("n{i}"))
        .collect();
    assert!(refused(many, "too many").contains("at most 64"));
    refused(vec!["a".into(), String::new()], "an empty name");
    // A name this client uses with other options.
    let _b = SingleLock::builder(&c, "b")
        .lease(Duration::from_secs(7))
        .build()
        .unwrap();
    refused(vec!["a".into(), "b".into()], "other options");
}

/// Held by a multi-lock, every name excludes single-lock holders (another client); a single
/// holder of one name makes `try_lock` fail and `try_lock_for` time out with nothing left
/// held; the waiter waits without polling and gets the set at the release; re-entry keeps the
/// tokens; a lost name fires the guard's loss signal.
async fn all_or_nothing(deployment: &Deployment) {
    let c1 = deployment.client();
    let c2 = deployment.client();
    let set = multi(&c1, &["b", "a", "c"]);
    let order: Vec<String> = set.locks().iter().map(|l| l.name().to_string()).collect();
    assert_eq!(order.len(), 3);
    let g = set.lock().await.unwrap();
    let tokens: HashMap<String, u64> = g
        .fencing_tokens()
        .map(|(n, t)| (n.to_string(), t.get()))
        .collect();
    assert_eq!(tokens.len(), 3);
    assert_eq!(g.fencing_token("a").unwrap().get(), tokens["a"]);
    assert!(g.fencing_token("zzz").is_none());
    for name in ["a", "b", "c"] {
        assert!(
            single(&c2, name).try_lock().await.unwrap().is_none(),
            "{name} is held by the multi-lock"
        );
    }
    let inner = g.reenter().await.unwrap();
    assert_eq!(inner.fencing_token("b"), g.fencing_token("b"));
    assert!(inner.guards().iter().all(|x| x.depth() == 2));
    assert_eq!(inner.unlock().await.unwrap(), 1);
    assert_eq!(g.unlock().await.unwrap(), 0);

    // The last name in canonical order is held by a single holder elsewhere.
    let last = order.last().unwrap().clone();
    let held = single(&c2, &last).lock().await.unwrap();
    assert!(set.try_lock().await.unwrap().is_none());
    let e = set
        .try_lock_for(Duration::from_millis(300))
        .await
        .expect_err("busy");
    assert!(e.is_timeout(), "{e}");
    for name in &order[..2] {
        assert!(
            !single(&c2, name).is_locked().await.unwrap(),
            "{name} is left held after a failed attempt"
        );
    }

    // A waiter takes the set at the release, having waited in the last name's queue: the
    // server sees a handful of script calls in a second, not a poll every spin wait.
    let waiter = tokio::spawn({
        let set = set.clone();
        async move { set.lock().await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let key = String::from_utf8(held.lock().key().to_vec()).unwrap();
    let owner = deployment.owner(&key);
    let before = owner.command_calls(&["evalsha"]).unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = owner.command_calls(&["evalsha"]).unwrap() - before;
    assert!(
        during <= 4,
        "{during} script calls on the busy name's server in a second of waiting: polling"
    );
    assert!(!waiter.is_finished());
    held.unlock().await.unwrap();
    let g = within(Duration::from_secs(5), "the multi-lock waiter", waiter)
        .await
        .unwrap()
        .unwrap();
    for (name, token) in g.fencing_tokens() {
        assert!(
            token.get() > tokens[&name.to_string()],
            "{name}'s token did not increase"
        );
    }

    // A name lost (deleted by an operator) fires the set's loss signal with its name.
    single(&c2, "b").force_unlock().await.unwrap();
    let (name, reason) = within(Duration::from_secs(10), "the loss signal", g.lost()).await;
    assert_eq!(name.to_string(), "b");
    assert_eq!(reason, slate_redis::LossReason::EntryGone);
    assert!(g.is_lost());
    // Unlocked, the lost name answers "not held" and the others are released all the same
    // (off a cluster, in the one call that found b gone).
    let err = g.unlock().await.unwrap_err();
    assert!(err.is_not_held(), "{err}");
    for name in ["a", "c"] {
        let free = single(&c2, name).try_lock().await.unwrap();
        assert!(free.is_some(), "{name} was released with the lost b");
        free.unwrap().unlock().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_multi_lock_is_all_or_nothing() {
    all_or_nothing(&Deployment::standalone()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_multi_lock_is_all_or_nothing() {
    all_or_nothing(&Deployment::cluster()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_multi_lock_is_all_or_nothing() {
    all_or_nothing(&Deployment::sentinel()).await;
}

/// A name whose release raises a server error (here a key of another type under its name,
/// met after its hold was deleted) does not keep the names after it in the same call from
/// being released; the call answers the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_failing_in_the_batched_release_does_not_keep_the_others_held() {
    let server = server();
    let (c1, c2) = (client(&server), client(&server));
    let set = MultiLock::builder(&c1, ["fa", "fb", "fc"])
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let g = set.lock().await.unwrap();
    // Another process is told busy on fb (its release then looks at the turn)...
    let busy = single(&c2, "fb")
        .try_lock_for(Duration::from_millis(100))
        .await;
    assert!(busy.is_err(), "fb is held");
    // ...and fb's turn key is not Slate's any more.
    server.command(&["SET", "slate:{fb}:turn", "x"]).unwrap();
    let err = g.unlock().await.unwrap_err();
    assert!(err.to_string().contains("WRONGTYPE"), "{err}");
    for name in ["fa", "fb", "fc"] {
        let key = format!("slate:{{{name}}}");
        let v = server.command(&["EXISTS", &key]).unwrap();
        assert_eq!(
            redis::from_redis_value::<i64>(v).unwrap(),
            0,
            "{name} released"
        );
    }
}

/// A batched release run on a replica (a master demoted by a failover) fails as a whole with
/// the replica's `READONLY`, code and all, as a single release does: the client then replaces
/// its connection. Only a name's own `WRONGTYPE` is answered name by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_release_on_a_replica_fails_whole_with_readonly() {
    let master = server();
    let replica = server();
    let mut con = master.connection().unwrap();
    for name in ["ra", "rb"] {
        assert_eq!(acquire_script(&mut con, name, "h1", "1", "")[0], 1);
    }
    let port = master.port().to_string();
    replica.command(&["REPLICAOF", "127.0.0.1", &port]).unwrap();
    eventually(
        Duration::from_secs(10),
        "the replica has both holds",
        || {
            ["ra", "rb"].iter().all(|n| {
                let v = replica
                    .command(&["EXISTS", &format!("slate:{{{n}}}")])
                    .unwrap();
                redis::from_redis_value::<i64>(v).unwrap() == 1
            })
        },
    )
    .await;
    let mut on_replica = replica.connection().unwrap();
    let how = Direct::default();
    let e = release_many_try::<Vec<redis::Value>>(&mut on_replica, &["ra", "rb"], "h1", "2", &how)
        .unwrap_err();
    assert_eq!(
        e.kind(),
        redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
        "{e}"
    );
}

/// On a cluster, names of one hash slot are taken in one script call and released in one;
/// with a name of another slot in the set, the slot's names are still released in one call
/// and the other name alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_slot_s_names_are_taken_and_released_in_one_call() {
    let cluster = Deployment::cluster();
    // A lock's key is `slate:{name}`: its slot is the name's.
    let slot = |n: &str| crc16::State::<crc16::XMODEM>::calculate(n.as_bytes()) % 16384;
    let mut same: Vec<String> = (0..100_000)
        .map(|i| format!("k{i}"))
        .filter(|n| slot(n) == slot("k0"))
        .take(3)
        .collect();
    assert_eq!(same.len(), 3, "three names of one slot");
    let other = (0..)
        .map(|i| format!("o{i}"))
        .find(|n| slot(n) != slot("k0"))
        .unwrap();
    let c = cluster.client();
    c.ping().await.unwrap();
    let calls = || -> u64 {
        cluster
            .masters()
            .iter()
            .map(|m| m.command_calls(&["evalsha"]).unwrap())
            .sum()
    };
    let exists = |name: &str| {
        let key = format!("slate:{{{name}}}");
        redis::from_redis_value::<i64>(cluster.command(&["EXISTS", &key]).unwrap()).unwrap() == 1
    };
    let set = MultiLock::builder(&c, &same).build().unwrap();
    let before = calls();
    let g = set.lock().await.unwrap();
    assert_eq!(calls() - before, 1, "one call takes the slot's three names");
    assert!(same.iter().all(|n| exists(n)));
    let before = calls();
    assert_eq!(g.unlock().await.unwrap(), 0);
    assert_eq!(calls() - before, 1, "one call releases them");
    assert!(!same.iter().any(|n| exists(n)));

    // A caller puts names in one slot by what comes before their first `}` (README).
    let tagged = ["acct}:7", "acct}:9"];
    let set = MultiLock::builder(&c, tagged).build().unwrap();
    let before = calls();
    let g = set.lock().await.unwrap();
    assert_eq!(calls() - before, 1, "one call takes acct}}:7 and acct}}:9");
    assert!(tagged.iter().all(|n| exists(n)));
    g.unlock().await.unwrap();

    same.push(other);
    let set = MultiLock::builder(&c, &same).build().unwrap();
    let g = set.lock().await.unwrap();
    assert!(same.iter().all(|n| exists(n)));
    let before = calls();
    assert_eq!(g.unlock().await.unwrap(), 0);
    assert_eq!(
        calls() - before,
        2,
        "the slot's names in one call, the other name alone"
    );
    assert!(!same.iter().any(|n| exists(n)));
}

/// One server holds the whole set: one script call (`acquire_many.lua`) takes every name, in
/// one server step. With a name busy, the call takes the names before it and queues on it, and
/// the names after it are not held while the caller waits; once the busy name is free, the
/// waiter gets it and then the rest, with each name's token above its last holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_on_one_server_is_taken_in_one_script_call() {
    let server = server();
    let c = client(&server);
    let names = ["m5", "m1", "m4", "m2", "m3"];
    let set = MultiLock::builder(&c, names)
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    c.ping().await.unwrap();
    let calls = || server.command_calls(&["evalsha"]).unwrap();
    let exists = |name: &str| {
        let v = server
            .command(&["EXISTS", &format!("slate:{{{name}}}")])
            .unwrap();
        redis::from_redis_value::<i64>(v).unwrap() == 1
    };
    let before = calls();
    let g = set.lock().await.unwrap();
    assert_eq!(calls() - before, 1, "one script call for five names");
    assert!(names.iter().all(|n| exists(n)));
    let first: HashMap<String, u64> = g
        .fencing_tokens()
        .map(|(n, t)| (n.to_string(), t.get()))
        .collect();
    let before = calls();
    assert_eq!(g.unlock().await.unwrap(), 0);
    assert_eq!(calls() - before, 1, "one script call releases five names");
    assert!(names.iter().all(|n| !exists(n)));

    // m3 is held elsewhere: the waiter holds m1 and m2 and waits in m3's queue.
    let other = client(&server);
    let m3 = single(&other, "m3").lock().await.unwrap();
    let waiter = tokio::spawn({
        let set = set.clone();
        async move { set.lock().await }
    });
    let queue = "slate:{m3}:queue";
    eventually(Duration::from_secs(5), "the waiter queued on m3", || {
        let v = server.command(&["ZCARD", queue]).unwrap();
        redis::from_redis_value::<i64>(v).unwrap() == 1
    })
    .await;
    assert!(exists("m1") && exists("m2"), "the names before m3 are held");
    assert!(!exists("m4") && !exists("m5"), "the names after m3 are not");
    assert!(!waiter.is_finished());
    m3.unlock().await.unwrap();
    let g = within(Duration::from_secs(5), "the waiter", waiter)
        .await
        .unwrap()
        .unwrap();
    for (name, token) in g.fencing_tokens() {
        assert!(token.get() > first[&name.to_string()], "{name}'s token");
    }
    assert!(names.iter().all(|n| exists(n)));
    assert_eq!(g.unlock().await.unwrap(), 0);
}

/// A multi-lock future dropped at any point (the batch in flight, its replies being taken, or
/// waiting on a busy name) leaves no name held: every grant it made is given back at once,
/// not at the end of its 30 s lease. A name a task of the same client holds is waited for in
/// that client's local queue, and the set is taken once it is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_multi_lock_leaves_nothing_held_and_local_holders_are_waited_for() {
    let server = server();
    let c = client(&server);
    let names = ["d1", "d2", "d3", "d4"];
    let set = MultiLock::builder(&c, names)
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let other = client(&server);
    let free = |what: String| {
        let server = &server;
        async move {
            eventually(Duration::from_secs(5), &what, || {
                names.iter().all(|n| {
                    let v = server
                        .command(&["EXISTS", &format!("slate:{{{n}}}")])
                        .unwrap();
                    redis::from_redis_value::<i64>(v).unwrap() == 0
                })
            })
            .await;
        }
    };
    for round in 0..24u32 {
        // Every third round, d3 is busy elsewhere, so that the drop may come while waiting.
        let busy = if round % 3 == 2 {
            Some(single(&other, "d3").lock().await.unwrap())
        } else {
            None
        };
        let taking = tokio::spawn({
            let set = set.clone();
            async move { set.lock().await.map(drop) }
        });
        for _ in 0..round {
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_micros(u64::from(round) * 150)).await;
        taking.abort();
        drop(taking.await);
        if let Some(b) = busy {
            b.unlock().await.unwrap();
        }
        free(format!("round {round}: every name free after the drop")).await;
    }

    // d2 held by a task of the same client: the set waits for it in the local queue.
    let d2_lock = set
        .locks()
        .iter()
        .find(|l| l.name().to_string() == "d2")
        .unwrap()
        .clone();
    let d2 = d2_lock.lock().await.unwrap();
    let waiter = tokio::spawn({
        let set = set.clone();
        async move { set.lock().await }
    });
    eventually(Duration::from_secs(5), "the set waits for d2", || {
        d2_lock.local_waiters() == 1
    })
    .await;
    d2.unlock().await.unwrap();
    let g = within(Duration::from_secs(5), "the set after d2", waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(g.guards().len(), 4);
    assert_eq!(g.unlock().await.unwrap(), 0);
    free("every name free at the end".to_owned()).await;
}

/// Review finding (issue 31): a batch that fails after it ran (here the replicas did not
/// acknowledge it: there are none) leaves the line of the name it was told busy on, instead
/// of keeping a place there (and a turn a release would reserve for it) for the queue's
/// 30 s life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_leaves_the_line_it_joined() {
    let server = server();
    let synced = RedisClient::open_with(
        server.url(),
        slate_redis::ClientOptions::builder()
            .synced_replicas(1, Duration::from_millis(100))
            .build()
            .unwrap(),
    )
    .unwrap();
    let other = client(&server);
    let b = lock(&other, "fb", Duration::from_secs(30))
        .lock()
        .await
        .unwrap();
    let set = MultiLock::builder(&synced, ["fa", "fb"])
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let e = set
        .lock()
        .await
        .expect_err("no replica acknowledges the grant of fa");
    assert!(e.to_string().contains("replicas"), "{e}");
    let queued = || {
        let v = server.command(&["ZCARD", "slate:{fb}:queue"]).unwrap();
        redis::from_redis_value::<i64>(v).unwrap()
    };
    eventually(Duration::from_secs(5), "the line of fb left", || {
        queued() == 0
    })
    .await;
    eventually(Duration::from_secs(5), "fa given back", || {
        let v = server.command(&["EXISTS", "slate:{fa}"]).unwrap();
        redis::from_redis_value::<i64>(v).unwrap() == 0
    })
    .await;
    b.unlock().await.unwrap();
}

/// Two other clients take `b` again as soon as they release it, for up to 8 s; a multi-lock
/// of `{a, b}` waits in `b`'s queue and gets its fair turn well within that, three times in
/// a row. Without the fair turn (the `grant-ignores-turn` mutant) the streams barge past it:
/// the test failed in 4 of 4 mutant runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_waiter_is_not_starved_by_single_holders_of_one_name() {
    let server = server();
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    // Two processes stream holds of b, each taking it again as soon as it let it go.
    let streams: Vec<_> = (0..2)
        .map(|_| {
            let streamer = client(&server);
            let (stop, rounds) = (stop.clone(), rounds.clone());
            tokio::spawn(async move {
                let b = single(&streamer, "b");
                let end = Instant::now() + Duration::from_secs(8);
                while !stop.load(Ordering::SeqCst) && Instant::now() < end {
                    let g = b.lock().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    g.unlock().await.unwrap();
                    rounds.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    eventually(Duration::from_secs(5), "the streams started", || {
        rounds.load(Ordering::SeqCst) >= 6
    })
    .await;
    // Three times in a row, each wait behind the streams.
    let c = client(&server);
    let set = multi(&c, &["a", "b"]);
    let mut waits = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let g = set
            .try_lock_for(Duration::from_secs(6))
            .await
            .expect("the multi-lock waiter got its turn");
        waits.push(started.elapsed());
        g.unlock().await.unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    for s in streams {
        s.await.unwrap();
    }
    assert!(
        waits.iter().all(|w| *w < Duration::from_secs(2)),
        "the multi-lock waited {waits:?} behind a stream of b's holders"
    );
}

/// How one worker takes its set.
#[derive(Clone)]
enum Taker {
    /// A multi-lock.
    Multi(MultiLock),
    /// The caller's order, by hand: each single lock in turn, with `gap` between two.
    CallerOrder(Vec<SingleLock>, Duration),
}

enum Held {
    Multi(MultiLockGuard),
    Singles(Vec<SingleLockGuard>),
}

impl Taker {
    fn names(&self) -> Vec<String> {
        match self {
            Taker::Multi(m) => m.locks().iter().map(|l| l.name().to_string()).collect(),
            Taker::CallerOrder(l, _) => l.iter().map(|l| l.name().to_string()).collect(),
        }
    }

    async fn take(&self) -> Held {
        match self {
            Taker::Multi(m) => Held::Multi(m.lock().await.unwrap()),
            Taker::CallerOrder(locks, gap) => {
                let mut held = Vec::new();
                for (i, l) in locks.iter().enumerate() {
                    if i > 0 {
                        tokio::time::sleep(*gap).await;
                    }
                    held.push(l.lock().await.unwrap());
                }
                Held::Singles(held)
            }
        }
    }

    fn tokens(held: &Held) -> Vec<(String, u64)> {
        match held {
            Held::Multi(g) => g
                .fencing_tokens()
                .map(|(n, t)| (n.to_string(), t.get()))
                .collect(),
            Held::Singles(gs) => gs
                .iter()
                .map(|g| (g.lock().name().to_string(), g.fencing_token().get()))
                .collect(),
        }
    }

    async fn release(held: Held) {
        match held {
            Held::Multi(g) => {
                g.unlock().await.unwrap();
            }
            Held::Singles(gs) => {
                for g in gs {
                    g.unlock().await.unwrap();
                }
            }
        }
    }
}

/// Each taker runs `rounds` holds; inside each hold it marks its names busy (an overlap is a
/// violation) and checks each name's token is above every earlier holder's. Err when a
/// violation is seen, or when the whole run is not done within `limit` (a deadlock).
async fn run_rounds(takers: Vec<Taker>, rounds: usize, limit: Duration) -> Result<usize, String> {
    let busy: Arc<Mutex<HashMap<String, bool>>> = Arc::default();
    let last_token: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let done = Arc::new(AtomicU64::new(0));
    let start = Arc::new(tokio::sync::Barrier::new(takers.len()));
    let mut tasks = Vec::new();
    for (w, taker) in takers.into_iter().enumerate() {
        let (busy, last_token, violations, done, start) = (
            busy.clone(),
            last_token.clone(),
            violations.clone(),
            done.clone(),
            start.clone(),
        );
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            for r in 0..rounds {
                let held = taker.take().await;
                {
                    let mut b = busy.lock().unwrap();
                    let mut t = last_token.lock().unwrap();
                    for (name, token) in Taker::tokens(&held) {
                        if std::mem::replace(b.entry(name.clone()).or_default(), true) {
                            violations
                                .lock()
                                .unwrap()
                                .push(format!("worker {w} round {r}: {name} held twice"));
                        }
                        let before = t.insert(name.clone(), token).unwrap_or(0);
                        if token <= before {
                            violations.lock().unwrap().push(format!(
                                "worker {w} round {r}: {name} token {token} after {before}"
                            ));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(2 + (w as u64 + r as u64) % 4)).await;
                {
                    let mut b = busy.lock().unwrap();
                    for name in taker.names() {
                        b.insert(name, false);
                    }
                }
                Taker::release(held).await;
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let all = futures::future::join_all(tasks);
    let finished = tokio::time::timeout(limit, all).await;
    let v = violations.lock().unwrap().clone();
    if !v.is_empty() {
        return Err(format!("violations: {v:?}"));
    }
    match finished {
        Ok(results) => {
            for r in results {
                r.map_err(|e| format!("a worker failed: {e}"))?;
            }
            Ok(done.load(Ordering::SeqCst) as usize)
        }
        Err(_) => Err(format!(
            "deadlock: {} holds done, nothing moved for the rest of {limit:?}",
            done.load(Ordering::SeqCst)
        )),
    }
}

/// The three overlapping sets in the orders that make a cycle ({a,b}, {b,c}, {c,a}), each on a
/// client of its own (a process of its own: its own queues), two workers per set: every hold
/// done, no name held twice, tokens increasing per name.
async fn overlapping_sets(deployment: &Deployment) {
    let sets = [["a", "b"], ["b", "c"], ["c", "a"]];
    let mut takers = Vec::new();
    let mut clients = Vec::new();
    for set in sets {
        let c = deployment.client();
        for _ in 0..2 {
            takers.push(Taker::Multi(multi(&c, &set)));
        }
        clients.push(c);
    }
    let done = run_rounds(takers, 15, Duration::from_secs(60))
        .await
        .expect("overlapping multi-locks");
    assert_eq!(done, 6 * 15);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_overlapping_sets_never_deadlock_nor_overlap() {
    overlapping_sets(&Deployment::standalone()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_overlapping_sets_never_deadlock_nor_overlap() {
    overlapping_sets(&Deployment::cluster()).await;
}

/// The negative control: the same three sets, taken by hand in the caller's order with a
/// moment between two names. The check must see the cycle: nobody moves any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_caller_order_deadlocks_and_the_check_sees_it() {
    let server = server();
    let mut takers = Vec::new();
    let mut clients = Vec::new();
    for set in [["a", "b"], ["b", "c"], ["c", "a"]] {
        let c = client(&server);
        let locks = set.iter().map(|n| single(&c, n)).collect();
        takers.push(Taker::CallerOrder(locks, Duration::from_millis(100)));
        clients.push(c);
    }
    let e = run_rounds(takers, 5, Duration::from_secs(4))
        .await
        .expect_err("the caller's order must deadlock");
    assert!(e.starts_with("deadlock"), "{e}");
}

/// A name taken early is lost while the set waits for a later one (an operator deletes it and
/// another client takes it): the set is not handed over with that name gone, it is taken
/// again once the other client lets go (review finding: the guard came back with a lost
/// name).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_lost_while_waiting_for_a_later_one_is_taken_again() {
    let server = server();
    let c1 = client(&server);
    let c2 = client(&server);
    let c3 = client(&server);
    let set = MultiLock::builder(&c1, ["a", "b"])
        .lease(Duration::from_secs(3))
        .renewal_period(Duration::from_millis(300))
        .build()
        .unwrap();
    let names: Vec<String> = set.locks().iter().map(|l| l.name().to_string()).collect();
    let (first, last) = (names[0].clone(), names[1].clone());
    let last_held = single(&c2, &last).lock().await.unwrap();
    let waiter = tokio::spawn({
        let set = set.clone();
        async move { set.lock().await }
    });
    eventually_async(
        Duration::from_secs(5),
        "the set holds its first name",
        || async { single(&c2, &first).is_locked().await.unwrap() },
    )
    .await;
    // An operator deletes the first name; another client takes it.
    single(&c2, &first).force_unlock().await.unwrap();
    let other = single(&c3, &first).lock().await.unwrap();
    // The set's renewal finds its first name gone.
    tokio::time::sleep(Duration::from_millis(800)).await;
    last_held.unlock().await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !waiter.is_finished(),
        "the set was handed over while {first} belongs to another client"
    );
    other.unlock().await.unwrap();
    let g = within(Duration::from_secs(5), "the set", waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(!g.is_lost(), "every name of the guard is held");
    g.unlock().await.unwrap();
}

/// The blocking twins, from plain threads: lock, re-enter, a timed try and a try that finds
/// the set busy, unlock.
#[test]
fn blocking_twins_work_on_threads() {
    let server = server();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(async { client(&server) });
    let set = MultiLock::builder(&client, ["x", "y"]).build().unwrap();
    let g = set.blocking_lock().unwrap();
    let inner = set.blocking_lock_as(g.holder()).unwrap();
    assert!(inner.guards().iter().all(|s| s.depth() == 2));
    let timed_out = std::thread::spawn({
        let set = set.clone();
        move || {
            set.blocking_try_lock_for(Duration::from_millis(200))
                .unwrap_err()
        }
    })
    .join()
    .unwrap();
    assert!(timed_out.is_timeout(), "{timed_out}");
    let busy = std::thread::spawn({
        let set = set.clone();
        move || set.blocking_try_lock().unwrap().is_none()
    })
    .join()
    .unwrap();
    assert!(busy, "blocking_try_lock of a held set is None");
    assert_eq!(inner.blocking_unlock().unwrap(), 1);
    assert_eq!(g.blocking_unlock().unwrap(), 0);
    let g = set.blocking_try_lock().unwrap().expect("free now");
    assert_eq!(g.blocking_unlock().unwrap(), 0);
}
