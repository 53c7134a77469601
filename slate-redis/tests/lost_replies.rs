//! S10, lost replies: the command ran, its reply was lost, the library sends it again.
//!
//! A fault proxy between the client and the server forwards the request and drops the reply
//! (the script has run: the server shows it), then resets the connection. The library sends
//! the same request again on a new connection, and the request record makes the retry answer
//! what the first run did: a logical acquire never leaves depth 2, a release never takes two
//! levels nor answers *not held* after freeing the lock itself (reliability.md S10, I5, I6).
//!
//! When no reply comes at all (a timeout), the acquire is undone by its request id: exactly
//! one level if it ran, first acquisition or re-entry alike, and an acquire that runs after
//! its undo does nothing (a tombstone).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use slate_core::BackendKind;
use slate_harness::proxy::{FaultProxy, Mode};
use slate_harness::server::RedisServer;
use slate_redis::{ClientOptions, HolderId, RedisClient, SingleLock};

const LEASE: Duration = Duration::from_secs(10);

struct Rig {
    server: RedisServer,
    proxy: FaultProxy,
    client: RedisClient,
    lock: SingleLock,
}

async fn rig(name: &str, command_timeout: Duration) -> Rig {
    let server = server();
    let proxy = FaultProxy::start(server.addr()).expect("proxy");
    let client = RedisClient::open_with(
        proxy.url(),
        ClientOptions::builder()
            .command_timeout(command_timeout)
            .build()
            .unwrap(),
    )
    .expect("client");
    client.ping().await.expect("ping through the proxy");
    let lock = lock(&client, name, LEASE);
    Rig {
        server,
        proxy,
        client,
        lock,
    }
}

impl Rig {
    /// The holder's count on the server, read directly (not through the proxy).
    fn depth(&self, holder: HolderId) -> i64 {
        let key = String::from_utf8(self.lock.key().to_vec()).unwrap();
        let v = self
            .server
            .command(&["HGET", &key, &holder.to_string()])
            .expect("HGET");
        redis::from_redis_value::<Option<i64>>(v)
            .expect("count")
            .unwrap_or(0)
    }

    /// Drops replies until the server shows `done`, then heals the proxy and resets the
    /// connection: the client sees its connection break with the reply lost.
    async fn lose_reply_once(&self, what: &str, done: impl Fn() -> bool) {
        eventually(Duration::from_secs(5), what, done).await;
        self.proxy.set_mode(Mode::Pass).expect("pass");
        self.proxy.reset_all().expect("reset");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s10_lost_acquire_reply_is_retried_without_a_second_level() {
    let rig = rig("s10-acquire", Duration::from_secs(3)).await;
    let holder = HolderId::new();
    rig.proxy.set_mode(Mode::DropReplies).unwrap();
    let lock = rig.lock.clone();
    let acquire = tokio::spawn(async move { lock.lock_as(holder).await });
    rig.lose_reply_once("the first acquire to run", || rig.depth(holder) == 1)
        .await;
    let guard = within(Duration::from_secs(5), "the retried acquire", acquire)
        .await
        .unwrap()
        .expect("the retry answers the first run's grant");
    assert_eq!(guard.depth(), 1);
    assert_eq!(rig.depth(holder), 1, "the retry did not re-enter");
    assert!(
        rig.proxy.connections_accepted() >= 2,
        "the retry went on a new connection"
    );

    // A lost re-entry reply: depth 2, not 3.
    rig.proxy.set_mode(Mode::DropReplies).unwrap();
    let inner = {
        let lock = rig.lock.clone();
        tokio::spawn(async move { lock.lock_as(holder).await })
    };
    rig.lose_reply_once("the re-entry to run", || rig.depth(holder) == 2)
        .await;
    let inner = within(Duration::from_secs(5), "the retried re-entry", inner)
        .await
        .unwrap()
        .expect("re-entry");
    assert_eq!(inner.depth(), 2);
    assert_eq!(rig.depth(holder), 2, "one logical re-entry, one level");
    assert_eq!(
        inner.fencing_token(),
        guard.fencing_token(),
        "a re-entry keeps the token"
    );

    // A lost release reply on the inner level: one level taken, not two.
    rig.proxy.set_mode(Mode::DropReplies).unwrap();
    let release = tokio::spawn(async move { inner.unlock().await });
    rig.lose_reply_once("the inner release to run", || rig.depth(holder) == 1)
        .await;
    let left = within(Duration::from_secs(5), "the retried release", release)
        .await
        .unwrap()
        .expect("the retried release answers its first run");
    assert_eq!(left, 1);
    assert_eq!(rig.depth(holder), 1, "the outer hold kept its level");

    // A lost reply of the last release: the retry answers 0, not *not held*.
    rig.proxy.set_mode(Mode::DropReplies).unwrap();
    let release = tokio::spawn(async move { guard.unlock().await });
    rig.lose_reply_once("the last release to run", || rig.depth(holder) == 0)
        .await;
    let left = within(Duration::from_secs(5), "the retried last release", release)
        .await
        .unwrap()
        .expect("no spurious not-held after a lost reply");
    assert_eq!(left, 0);
    assert!(!rig.lock.is_locked().await.unwrap());
    assert_eq!(
        keys_but_records(&rig.server, Duration::from_secs(6)),
        [fence_key("s10-acquire")]
    );
    drop(rig.client);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s10_timed_out_acquires_are_undone_exactly() {
    let rig = rig("s10-undo", Duration::from_millis(300)).await;
    let holder = HolderId::new();

    // A first acquisition whose reply never comes: the undo removes the entry it made.
    rig.proxy.set_mode(Mode::DropReplies).unwrap();
    let err = rig.lock.try_lock_for(Duration::ZERO).await;
    let err = match err {
        Err(e) => e,
        Ok(g) => panic!("acquired without a reply: depth {}", g.depth()),
    };
    assert!(
        matches!(err.backend_kind(), Some(BackendKind::Timeout)) || err.is_timeout(),
        "{err}"
    );
    // The undo went behind the acquire on the same connection; its reply is dropped too.
    eventually(
        Duration::from_secs(5),
        "the undo to remove the entry",
        || !keys(&rig.server).contains(&"slate:{s10-undo}".to_owned()),
    )
    .await;
    rig.proxy.set_mode(Mode::Pass).unwrap();
    rig.proxy.reset_all().unwrap();

    // A re-entry whose reply never comes: the undo takes that level, and only that one.
    let guard = within(
        Duration::from_secs(5),
        "a plain acquire",
        rig.lock.lock_as(holder),
    )
    .await
    .expect("acquire");
    rig.proxy.set_mode(Mode::DropReplies).unwrap();
    let reentry = rig.lock.lock_as(holder);
    let reentry = tokio::time::timeout(Duration::from_secs(5), reentry)
        .await
        .expect("the re-entry is bounded by the command timeout");
    assert!(reentry.is_err(), "no reply, no re-entry");
    eventually(Duration::from_secs(5), "the undo of the re-entry", || {
        rig.depth(holder) == 1
    })
    .await;
    rig.proxy.set_mode(Mode::Pass).unwrap();
    rig.proxy.reset_all().unwrap();
    // The outer hold is intact and still renewed.
    assert_eq!(rig.depth(holder), 1);
    assert!(!guard.is_lost());
    assert_eq!(
        within(Duration::from_secs(5), "unlock", guard.unlock())
            .await
            .expect("unlock"),
        0
    );
}

/// The request protocol at the script level: an undo that arrives before its acquire cancels
/// it; a first send keeps its record in the lock hash (no key of its own); a resend also
/// writes the record key, so that a stale copy of the first send arriving after the hold ended
/// does nothing instead of starting a hold nobody knows of.
#[test]
fn s10_an_acquire_that_runs_after_its_undo_does_nothing() {
    let server = server();
    let mut con = server.connection().unwrap();
    let acquire = |con: &mut redis::Connection, request: &str, resent: &str| {
        acquire_script(con, "late", "h1", request, resent)
    };
    // The undo of request 7 arrives first (the acquire is still in flight): nothing to undo.
    let undo = release_script(&server, "late", "h1", ("8", "7", "5000"), "");
    assert_eq!(undo, -2, "the acquire had not run");
    // Then the acquire runs: it finds itself cancelled and touches nothing.
    assert_eq!(acquire(&mut con, "7", ""), [-3]);
    assert_eq!(int(&server, &["EXISTS", "slate:{late}"]), 0);
    assert_eq!(
        int(&server, &["EXISTS", &fence_key("late")]),
        0,
        "no token was taken"
    );

    // Another request of the same holder is not affected by the tombstone.
    let reply = acquire(&mut con, "8", "");
    assert_eq!(reply.len(), 2);
    assert_eq!(reply[0], 1);
    assert!(
        reply[1] > 1_700_000_000_000_000,
        "a clock-seeded token: {reply:?}"
    );
    // Sent again (a resend), request 8 answers the same and changes nothing.
    assert_eq!(acquire(&mut con, "8", "1"), reply);
    assert_eq!(int(&server, &["HGET", "slate:{late}", "h1"]), 1);
    // The hold ends; a stale copy of request 8's first send arrives after: it does nothing.
    assert_eq!(
        release_script(&server, "late", "h1", ("9", "", "5000"), ""),
        0
    );
    assert_eq!(acquire(&mut con, "8", ""), [-7]);
    assert_eq!(
        int(&server, &["EXISTS", "slate:{late}"]),
        0,
        "no hold nobody knows of"
    );
    // A resend of the last release finds no field: -1 at the script level, which the client
    // reads as released while the hold's lease cannot have ended (`release_remote`).
    assert_eq!(
        release_script(&server, "late", "h1", ("9", "", "5000"), "1"),
        -1
    );
    // A wrong holder gets -1 and nothing is written.
    assert_eq!(
        release_script(&server, "late", "h2", ("10", "", "5000"), ""),
        -1
    );
    assert_eq!(
        int(&server, &["EXISTS", "slate:{late}:req:h2"]),
        0,
        "not-held writes nothing"
    );
}

/// A copy of a release that stalled on its way (its resend ran and freed the lock, and the
/// holder acquired again since) must not take a level of the newer hold: it is older than the
/// holder's latest request and does nothing (`-7`). Before, it released the newer hold, and
/// the lock was free while its holder believed it held it.
#[test]
fn s10_a_stale_copy_of_a_release_leaves_the_next_hold_alone() {
    let server = server();
    let name = "stale-release";
    let release = |request: &str, resent: &str| {
        release_script(&server, name, "h1", (request, "", "5000"), resent)
    };
    let mut con = server.connection().unwrap();
    assert_eq!(acquire_script(&mut con, name, "h1", "10", "")[0], 1);
    // Release 11's first send stalls; its resend frees the lock.
    assert_eq!(release("11", "1"), 0);
    // The holder acquires again.
    assert_eq!(acquire_script(&mut con, name, "h1", "12", "")[0], 1);
    // The stalled first send of release 11 arrives now: it does nothing.
    assert_eq!(release("11", ""), -7);
    assert_eq!(int(&server, &["HGET", "slate:{stale-release}", "h1"]), 1);
    // The holder's own release of the new hold works.
    assert_eq!(release("13", ""), 0);
    assert_eq!(int(&server, &["EXISTS", "slate:{stale-release}"]), 0);
}

/// Review finding (issue 30): an acquire's first send stalls, its resend is told busy, the
/// holder later acquires and releases under new requests whose records live in the lock hash
/// and go with it; then the stalled first send arrives. It must not grant a hold nobody knows
/// of: the resend that did not grant marked it in the record key.
#[test]
fn s10_a_stale_first_send_whose_resend_was_told_busy_never_grants() {
    let server = server();
    let name = "stale-busy";
    let mut con = server.connection().unwrap();
    assert_eq!(acquire_script(&mut con, name, "h0", "5", "")[0], 1);
    // h1's request 10: the first send stalls; the resend is told busy.
    assert_eq!(acquire_script(&mut con, name, "h1", "10", "1")[0], 0);
    assert_eq!(
        release_script(&server, name, "h0", ("6", "", "5000"), ""),
        0
    );
    // h1 acquires and releases under new requests (first sends: records in the hash only).
    assert_eq!(acquire_script(&mut con, name, "h1", "11", "")[0], 1);
    assert_eq!(
        release_script(&server, name, "h1", ("12", "", "5000"), ""),
        0
    );
    // The stalled first send of request 10 arrives: it does nothing.
    assert_eq!(
        acquire_script(&mut con, name, "h1", "10", ""),
        [-3],
        "a stale first send whose resend was told busy granted"
    );
    assert_eq!(
        int(&server, &["EXISTS", "slate:{stale-busy}"]),
        0,
        "a hold nobody knows of"
    );
}

/// The multi-lock's batched release (`release_many.lua`) at the script level: each name
/// loses one level; a resend answers from each name's record and takes nothing more (a name
/// whose last level went answers -1, which the client reads as released within the lease); a
/// stale copy arriving after a later request of the holder does nothing to that name; a name
/// not held answers -1 and the others are released all the same.
#[test]
fn s10_a_batched_release_is_replayed_by_its_resend_and_takes_one_level_per_name() {
    let server = server();
    let mut con = server.connection().unwrap();
    let depth = |name: &str| {
        let v = server
            .command(&["HGET", &format!("slate:{{{name}}}"), "h1"])
            .expect("HGET");
        redis::from_redis_value::<Option<i64>>(v)
            .unwrap()
            .unwrap_or(0)
    };
    for (name, request) in [
        ("ra", "1"),
        ("ra", "2"),
        ("rb", "3"),
        ("rb", "4"),
        ("rc", "5"),
    ] {
        assert!(acquire_script(&mut con, name, "h1", request, "")[0] >= 1);
    }
    let names = ["ra", "rb", "rc"];
    assert_eq!(
        release_many_script(&mut con, &names, "h1", "10", ""),
        [1, 1, 0]
    );
    let resend = release_many_script(&mut con, &names, "h1", "10", "1");
    assert_eq!(resend, [1, 1, -1], "answered from the records");
    assert_eq!(
        (depth("ra"), depth("rb"), depth("rc")),
        (1, 1, 0),
        "one level each"
    );

    // h1 takes rc again (request 11); the stalled first send of request 10 arrives.
    assert_eq!(acquire_script(&mut con, "rc", "h1", "11", "")[0], 1);
    let stale = release_many_script(&mut con, &names, "h1", "10", "");
    assert_eq!(stale, [1, 1, -7], "rc's newer record: overtaken, untouched");
    assert_eq!((depth("ra"), depth("rb"), depth("rc")), (1, 1, 1));

    // rd is not held: it answers so, and the others are released.
    let partial = release_many_script(&mut con, &["ra", "rd", "rb", "rc"], "h1", "12", "");
    assert_eq!(partial, [0, -1, 0, 0]);
    for name in ["ra", "rb", "rc", "rd"] {
        assert_eq!(
            int(&server, &["EXISTS", &format!("slate:{{{name}}}")]),
            0,
            "{name}"
        );
    }
}

/// The multi-lock's batch (`acquire_many.lua`) at the script level: a resend replays the
/// grants of its first send (the same tokens, one level each); a resend told busy on the
/// second name marks it, so that the stalled first send, arriving after the holds ended, stops
/// at the first name and grants nothing; the names after a busy one are never touched.
#[test]
fn s10_a_batch_is_replayed_by_its_resend_and_its_stale_first_send_grants_nothing() {
    let server = server();
    let mut con = server.connection().unwrap();
    let depth = |name: &str, holder: &str| {
        let v = server
            .command(&["HGET", &format!("slate:{{{name}}}"), holder])
            .expect("HGET");
        redis::from_redis_value::<Option<i64>>(v)
            .unwrap()
            .unwrap_or(0)
    };
    let first = acquire_many_script(&mut con, &["ba", "bb", "bc"], "h1", "20", "");
    assert_eq!(first.len(), 3);
    assert!(first.iter().all(|r| r[0] == 1), "{first:?}");
    let again = acquire_many_script(&mut con, &["ba", "bb", "bc"], "h1", "20", "1");
    assert_eq!(again, first, "a resend answers the first send's grants");
    for name in ["ba", "bb", "bc"] {
        assert_eq!(depth(name, "h1"), 1, "{name}: one level, not two");
        assert_eq!(
            release_script(&server, name, "h1", ("21", "", "5000"), ""),
            0
        );
    }

    // h0 holds the second name. h1's request 30: the first send stalls, the resend takes the
    // first name and is told busy on the second; the third is not touched.
    assert_eq!(acquire_script(&mut con, "sb", "h0", "5", "")[0], 1);
    let resend = acquire_many_script(&mut con, &["sa", "sb", "sc"], "h1", "30", "1");
    assert_eq!(resend.len(), 2, "{resend:?}");
    assert_eq!(resend[0][0], 1);
    assert_eq!(resend[1][0], 0, "busy");
    assert_eq!(int(&server, &["EXISTS", "slate:{sc}"]), 0);
    assert_eq!(int(&server, &["EXISTS", "slate:{sc}:req:h1"]), 0);
    // The caller gives up: it releases the first name; h0 releases the second.
    assert_eq!(
        release_script(&server, "sa", "h1", ("31", "", "5000"), ""),
        0
    );
    assert_eq!(
        release_script(&server, "sb", "h0", ("6", "", "5000"), ""),
        0
    );
    // The stalled first send arrives: it stops at the first name, whose grant ended.
    let stale = acquire_many_script(&mut con, &["sa", "sb", "sc"], "h1", "30", "");
    assert_eq!(
        stale,
        [[-7]],
        "the first name refuses, and the batch stops there"
    );
    for name in ["sa", "sb", "sc"] {
        assert_eq!(
            int(&server, &["EXISTS", &format!("slate:{{{name}}}")]),
            0,
            "{name}: a hold nobody knows of"
        );
    }
}

/// A multi-lock's batch whose reply is lost is sent again on a new connection and answers
/// what its first send did: one level of each name. One whose reply never comes within the
/// command timeout is undone on every name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s10_a_multi_lock_batch_with_a_lost_reply_takes_each_name_once() {
    let rig = rig("s10-multi", Duration::from_secs(3)).await;
    let names = ["s10-multi", "s10-multi-b", "s10-multi-c"];
    let set = slate_redis::MultiLock::builder(&rig.client, names)
        .lease(LEASE)
        .build()
        .unwrap();
    let depth = |name: &str, holder: HolderId| {
        let v = rig
            .server
            .command(&["HGET", &format!("slate:{{{name}}}"), &holder.to_string()])
            .expect("HGET");
        redis::from_redis_value::<Option<i64>>(v)
            .unwrap()
            .unwrap_or(0)
    };
    let holder = HolderId::new();
    rig.proxy.set_mode(Mode::DropReplies).unwrap();
    let acquire = tokio::spawn({
        let set = set.clone();
        async move { set.lock_as(holder).await }
    });
    rig.lose_reply_once("the batch to run", || {
        names.iter().all(|n| depth(n, holder) == 1)
    })
    .await;
    let guard = within(Duration::from_secs(5), "the resent batch", acquire)
        .await
        .unwrap()
        .expect("the resend answers the first run's grants");
    for n in names {
        assert_eq!(depth(n, holder), 1, "{n}: one level");
    }
    assert!(guard.guards().iter().all(|g| g.depth() == 1));
    assert_eq!(guard.unlock().await.unwrap(), 0);

    // No reply within the command timeout: the batch is undone on every name.
    let quick = RedisClient::open_with(
        rig.proxy.url(),
        ClientOptions::builder()
            .command_timeout(Duration::from_millis(300))
            .build()
            .unwrap(),
    )
    .unwrap();
    quick.ping().await.unwrap();
    let set = slate_redis::MultiLock::builder(&quick, names)
        .lease(LEASE)
        .build()
        .unwrap();
    rig.proxy.set_mode(Mode::DropReplies).unwrap();
    let e = set
        .try_lock_for(Duration::ZERO)
        .await
        .expect_err("no reply, no set");
    assert!(
        matches!(e.backend_kind(), Some(BackendKind::Timeout)) || e.is_timeout(),
        "{e}"
    );
    eventually(Duration::from_secs(5), "every name undone", || {
        names
            .iter()
            .all(|n| !keys(&rig.server).contains(&format!("slate:{{{n}}}")))
    })
    .await;
    rig.proxy.set_mode(Mode::Pass).unwrap();
    rig.proxy.reset_all().unwrap();
}

/// Review finding (issue 30): two requests of one holder in flight on one connection, both
/// replies lost. The inner release ran (2 → 1), then the holder's re-entry (1 → 2). Sent again
/// on a new connection, the release is older than the re-entry's record (`-7`): its first send
/// may have run, so it must not be sent once more as a new request (which took a second level:
/// the server left at 1 while two guards believed they held 2). The release reports an error;
/// the server keeps the re-entry's level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s10_a_resent_release_overtaken_by_the_holders_reentry_is_not_applied_twice() {
    let rig = rig("s10-overtaken", Duration::from_secs(3)).await;
    let holder = HolderId::new();
    let outer = rig.lock.lock_as(holder).await.unwrap();
    let inner = rig.lock.lock_as(holder).await.unwrap();
    assert_eq!(rig.depth(holder), 2);
    rig.proxy.set_mode(Mode::DropReplies).unwrap();
    let release = tokio::spawn(async move { inner.unlock().await });
    eventually(Duration::from_secs(5), "the release to run", || {
        rig.depth(holder) == 1
    })
    .await;
    let reenter = {
        let lock = rig.lock.clone();
        tokio::spawn(async move { lock.lock_as(holder).await })
    };
    eventually(Duration::from_secs(5), "the re-entry to run", || {
        rig.depth(holder) == 2
    })
    .await;
    rig.proxy.set_mode(Mode::Pass).unwrap();
    rig.proxy.reset_all().unwrap();
    let released = within(Duration::from_secs(5), "the release", release)
        .await
        .unwrap();
    let again = within(Duration::from_secs(5), "the re-entry", reenter)
        .await
        .unwrap()
        .expect("the re-entry's resend answers its first run");
    assert!(released.is_err(), "the release may have run: {released:?}");
    assert_eq!(rig.depth(holder), 2, "the release was applied twice");
    drop(again);
    drop(outer);
}

/// Second review (issue 30): a resend that was refused marks its request so that the first
/// send, arriving later, does nothing; but a further resend of the same request (a third send
/// after another broken connection) is answered anew, not as cancelled. And a write to the
/// record key never shortens its expiry: a long cancel mark (a combination node's undo keeps
/// it for a lease) is not cut short by a later request's two command timeouts.
#[test]
fn s10_a_refused_resend_is_answered_anew_and_record_marks_are_never_shortened() {
    let server = server();
    let name = "third-send";
    let mut con = server.connection().unwrap();
    assert_eq!(acquire_script(&mut con, name, "h0", "5", "")[0], 1);
    // h1's request 10, sent a second time: busy.
    assert_eq!(acquire_script(&mut con, name, "h1", "10", "1")[0], 0);
    assert_eq!(
        release_script(&server, name, "h0", ("6", "", "5000"), ""),
        0
    );
    // A third send of request 10: answered anew (granted), not as cancelled.
    let third = acquire_script(&mut con, name, "h1", "10", "1");
    assert_eq!(third[0], 1, "{third:?}");
    // The first send arrives at last: the grant is replayed, nothing is added.
    assert_eq!(acquire_script(&mut con, name, "h1", "10", ""), third);
    assert_eq!(int(&server, &["HGET", "slate:{third-send}", "h1"]), 1);

    // An undo's mark kept for a minute is not cut to 5 s by a later resent release.
    let undo = release_script(&server, name, "h1", ("30", "29", "60000"), "");
    assert_eq!(undo, -2, "request 29 never ran");
    assert_eq!(
        release_script(&server, name, "h1", ("31", "", "5000"), "1"),
        0
    );
    let left = int(&server, &["PTTL", "slate:{third-send}:req:h1"]);
    assert!(
        left > 30_000,
        "the record key's expiry was shortened to {left} ms"
    );
}
