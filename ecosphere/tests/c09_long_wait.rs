//! Combination lock, reliability.md C9: a long wait while holding a prefix.
//!
//! Slate's attempts never wait while holding: the first node held by another holder ends the
//! attempt, and the prefix taken so far is released at once (`Next::Busy`); the waiter retries
//! later from the left. These scenarios show it on real nodes with an observer polling n1's
//! hash every 20 ms.
//!
//! - **Prefix released at once** (smoke): N = 3, lease L = 1 s. X reaches n1 through a
//!   proxy that resets every connection, so X holds {n2, n3}, and holds them for 4 L,
//!   renewing. Y starts waiting at once, Z one lease later; both reach n2 through a 30 ms delay
//!   proxy, so each of their attempts visibly holds n1 before finding n2 busy. Expected: the
//!   observer sees Y's and Z's fields on n1, each time for less than one attempt's bound (3
//!   node operation times plus the observer's interval), never for the length of the wait; X
//!   keeps its lease for 4 L; after X releases, both Y and Z (the later one is not starved)
//!   complete within 2.5 s.
//! - **Holder on every node** (full matrix): the same with X holding all three nodes: Y and Z
//!   are busy at n1 and never hold anything.
//! - **Waiter killed while it holds n1** (smoke): lease L = 2 s; X holds {n2, n3}; Y is a
//!   `slate-worker` (`hold`, waiting) whose n2 is 120 ms away, so each attempt holds n1 for
//!   120 ms. The test SIGKILLs Y while its field is on n1 (at the k-th attempt, k from the
//!   seed). Expected: nobody releases that entry, and n1 frees when it expires, within
//!   L + 300 ms of the kill; Z, waiting meanwhile, completes within 2.5 s of X's release on all
//!   three nodes.
//!
//! Invariants: I1 exclusion, I3 tokens, I5 ownership, validity accounting, I8 quiescence
//! (checker); the bounded prefix and the liveness bounds (observer, timings).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::time::{Duration, Instant};

use ecosphere::history::{CheckConfig, CheckId, EventKind, Recorder};
use ecosphere::proxy::Mode;
use ecosphere::seed::Seed;
use scenario::*;
use slate_combination::{CombinationLock, NodeSet};
use slate_core::{HolderId, Wait};

const LEASE: Duration = Duration::from_secs(1);
/// Node operation time: generous for a loaded machine; the default budget (3 × OP + 100 ms)
/// stays below the lease.
const OP: Duration = Duration::from_millis(250);
/// A node a waiter's view marked unavailable (a command too slow under load) is re-probed soon.
const REPROBE: Duration = Duration::from_millis(200);
const NAME: &str = "c9";
/// The waiters' delay to n2 (in-process scenario).
const TO_N2: Duration = Duration::from_millis(30);
/// One attempt holding n1 at most: acquire n1, acquire n2, release n1, each within the node
/// operation time, plus the observer's interval.
const ATTEMPT_BOUND: Duration = Duration::from_millis(3 * 250 + 100);
/// Waiters' spin wait: far longer than the observer's interval, so that two attempts are never
/// seen as one presence.
const SPIN: Duration = Duration::from_millis(100);
/// Every waiter completes within this after X's release (two waiters, 100 ms holds, room for
/// a loaded machine).
const W: Duration = Duration::from_millis(2_500);

fn lock(nodes: &NodeSet, lease: Duration, spin: Duration) -> CombinationLock {
    CombinationLock::builder(nodes, NAME)
        .lease(lease)
        .renewal_period(Duration::from_millis(300))
        .spin_wait(spin)
        .build()
        .expect("lock")
}

/// A waiter: acquires (waiting), holds 100 ms, releases; returns when it acquired and on
/// which nodes.
async fn waiter(c: Client, holder: HolderId) -> (Instant, Vec<usize>) {
    let mut held = c.acquire_retrying(0, holder, Duration::from_secs(20)).await;
    let at = Instant::now();
    let nodes = held.guard.nodes().to_vec();
    assert!(held.hold_for(Duration::from_millis(100)).await, "kept");
    assert_eq!(held.release().await.expect("release"), 0);
    (at, nodes)
}

async fn prefix_scenario(x_cut_from_n1: bool) {
    let s = servers(3);
    adopt(&urls(&s)).await;
    let px = proxies(&s[..1]);
    let (py, pz) = (proxies(&s[1..2]), proxies(&s[1..2]));
    let x_view = view(vec![px[0].url(), s[1].url(), s[2].url()], opts(OP, REPROBE));
    let y_view = view(vec![s[0].url(), py[0].url(), s[2].url()], opts(OP, REPROBE));
    let z_view = view(vec![s[0].url(), pz[0].url(), s[2].url()], opts(OP, REPROBE));
    for v in [&x_view, &y_view, &z_view] {
        warm(v).await;
    }
    set(&py[0], delay(TO_N2));
    set(&pz[0], delay(TO_N2));
    if x_cut_from_n1 {
        set(&px[0], Mode::Reset);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let x = Client::new(
        dir.path(),
        0,
        lock(&x_view, LEASE, Duration::from_millis(20)),
    );
    let y = Client::new(dir.path(), 1, lock(&y_view, LEASE, SPIN));
    let z = Client::new(dir.path(), 2, lock(&z_view, LEASE, SPIN));
    let observer = Observer::start(
        &s[0],
        0,
        NAME,
        Recorder::create(dir.path(), 9).expect("observer recorder"),
        Duration::from_millis(20),
    );

    let mut held_x = x
        .acquire(0, HolderId::new(), Wait::Immediate, Duration::from_secs(5))
        .await
        .held("X");
    let x_nodes: &[usize] = if x_cut_from_n1 { &[1, 2] } else { &[0, 1, 2] };
    assert_eq!(held_x.guard.nodes(), x_nodes);
    let (hy, hz) = (HolderId::new(), HolderId::new());
    let ty = tokio::spawn(waiter(y, hy));
    assert!(held_x.hold_for(LEASE).await, "X keeps its lease");
    let tz = tokio::spawn(waiter(z, hz));
    assert!(
        held_x.hold_for(3 * LEASE).await,
        "X keeps its lease for 4 L"
    );
    assert!(
        !ty.is_finished() && !tz.is_finished(),
        "a waiter finished while X held"
    );
    let t_release = now();
    let released = Instant::now();
    assert_eq!(held_x.release().await.expect("X's release"), 0);
    let (y_at, y_nodes) = tokio::time::timeout(W + Duration::from_secs(3), ty)
        .await
        .expect("Y completes")
        .expect("Y's task");
    let (z_at, z_nodes) = tokio::time::timeout(W + Duration::from_secs(3), tz)
        .await
        .expect("Z completes")
        .expect("Z's task");
    let (y_wait, z_wait) = (y_at - released, z_at - released);
    println!("after X's release: Y acquired in {y_wait:?}, Z in {z_wait:?}");
    assert!(y_wait.max(z_wait) < W, "Y {y_wait:?}, Z {z_wait:?}");
    assert_eq!(y_nodes, [0, 1, 2]);
    assert_eq!(z_nodes, [0, 1, 2]);

    let snaps: Vec<Snapshot> = observer
        .stop()
        .into_iter()
        .filter(|x| x.t < t_release)
        .collect();
    for (label, h) in [("Y", hy), ("Z", hz)] {
        let p = presences(&snaps, &h.to_string());
        let longest = longest_presence(&snaps, &h.to_string());
        println!(
            "{label} held n1 {} times while X held, longest {longest:?}",
            p.len()
        );
        if x_cut_from_n1 {
            assert!(!p.is_empty(), "{label}'s prefix on n1 never seen");
            assert!(
                longest < ATTEMPT_BOUND,
                "{label} kept n1 for {longest:?} while X held n2"
            );
        } else {
            assert!(p.is_empty(), "{label} held n1 while X held it: {p:?}");
        }
    }

    let left = wait_quiet(&s, LEASE + Duration::from_secs(1));
    let cfg = CheckConfig {
        final_keys: Some(left),
        ..CheckConfig::new(LEASE)
    };
    let (_, report) = check(dir.path(), &cfg);
    report.assert_ok();
    // X, Y and Z acquire once each; Y and Z wait together through X's last 3 L.
    report.assert_contention(3, 1, 2);
    report.assert_pass(&[
        CheckId::Exclusion,
        CheckId::Tokens,
        CheckId::Ownership,
        CheckId::Validity,
        CheckId::Quiescence,
    ]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c9_waiters_release_their_prefix_at_once_while_the_holder_renews() {
    prefix_scenario(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "full-matrix"),
    ignore = "full matrix: cargo test -p ecosphere --features full-matrix"
)]
async fn c9_holder_on_every_node_waiters_never_touch_n1() {
    prefix_scenario(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c9_a_waiting_worker_killed_while_holding_n1_frees_it_within_a_lease() {
    /// A longer lease here, for a node operation time four times Y's delay to n2.
    const K_LEASE: Duration = Duration::from_secs(2);
    /// The worker's node operation time (its default budget, 3 × 500 + 100 ms, fits in L). A
    /// command on a connection idle for a second, or on a new one, costs up to three round
    /// trips (PING, or the pool's check and the script loads, then the command).
    const Y_OP: Duration = Duration::from_millis(500);
    /// How long each of Y's attempts holds n1 (the time n2 takes to answer).
    const Y_TO_N2: Duration = Duration::from_millis(120);
    /// ε of "n1 frees within L + ε".
    const EPSILON: Duration = Duration::from_millis(300);
    let mut seed = Seed::for_scenario("C9-kill");
    let k = 1 + seed.below(3);

    let s = servers(3);
    adopt(&urls(&s)).await;
    let px = proxies(&s[..1]);
    let py = proxies(&s[1..2]);
    let x_view = view(vec![px[0].url(), s[1].url(), s[2].url()], opts(OP, REPROBE));
    let z_view = view(urls(&s), opts(OP, REPROBE));
    warm(&x_view).await;
    warm(&z_view).await;
    set(&px[0], Mode::Reset);
    set(&py[0], delay(Y_TO_N2));
    let dir = tempfile::tempdir().expect("tempdir");
    let x = Client::new(
        dir.path(),
        0,
        lock(&x_view, K_LEASE, Duration::from_millis(20)),
    );
    let z = Client::new(
        dir.path(),
        2,
        lock(&z_view, K_LEASE, Duration::from_millis(50)),
    );
    let rec = Recorder::create(dir.path(), 99).expect("harness recorder");

    let mut held_x = x
        .acquire(0, HolderId::new(), Wait::Immediate, Duration::from_secs(5))
        .await
        .held("X");
    assert_eq!(held_x.guard.nodes(), &[1, 2]);

    let mut y = Worker::nodes(
        "hold",
        vec![s[0].url(), py[0].url(), s[2].url()],
        NAME,
        dir.path(),
    );
    y.proc_base = 1;
    y.lease = K_LEASE;
    y.node_op = Some(Y_OP);
    y.reprobe = Some(REPROBE);
    y.spin_wait = Some(SPIN);
    y.max_duration = Duration::from_secs(30);
    let mut workers = y.spawn(1);
    tokio::task::block_in_place(|| wait_line(&mut workers, 0, "READY", Duration::from_secs(20)));
    // Y's first attempt connects to every node, verifies it and loads the scripts while its
    // link to n2 is still fast; only once that attempt is over (busy at n2, n1 released) is
    // the link slowed down.
    let y_field = wait_async(Duration::from_secs(10), "Y's first attempt on n1", || {
        held_x.note();
        entries(&s[0], NAME).into_keys().next()
    })
    .await;
    wait_async(Duration::from_secs(5), "Y's first attempt to end", || {
        (!entries(&s[0], NAME).contains_key(&y_field)).then_some(())
    })
    .await;
    set(&py[0], delay(Y_TO_N2));

    // Kill Y inside its k-th hold of n1 that lasts (still there 20 ms after it was first seen).
    let deadline = Instant::now() + Duration::from_secs(15);
    let (mut counted, mut since): (u64, Option<Instant>) = (0, None);
    let sighted = loop {
        held_x.note();
        let present = tokio::task::block_in_place(|| entries(&s[0], NAME)).contains_key(&y_field);
        match (present, since) {
            (true, None) => since = Some(Instant::now()),
            (true, Some(t)) if t.elapsed() >= Duration::from_millis(20) => {
                counted += 1;
                if counted == k {
                    break t;
                }
                // Count this hold once: wait for it to end.
                while tokio::task::block_in_place(|| entries(&s[0], NAME)).contains_key(&y_field) {
                    assert!(Instant::now() < deadline, "Y's hold of n1 never ended");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                since = None;
            }
            (false, _) => since = None,
            _ => {}
        }
        assert!(
            Instant::now() < deadline,
            "Y held n1 only {counted} times in 15 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let killed = Instant::now();
    tokio::task::block_in_place(|| workers.kill(0)).expect("SIGKILL Y");
    let t_kill = now();
    rec.record_at(t_kill, 0, NAME, EventKind::kill_worker(1))
        .expect("record the kill");
    let after_kill = entries(&s[0], NAME);
    assert!(
        after_kill.contains_key(&y_field),
        "Y's entry on n1 is left by the kill (killed {:?} after it was seen; n1: {after_kill:?})",
        killed - sighted
    );

    // Z starts waiting; nobody releases Y's entry: it expires within L + ε of the kill.
    let hz = HolderId::new();
    let tz = tokio::spawn(async move {
        let c = z.clone();
        let mut held = c.acquire_retrying(0, hz, Duration::from_secs(20)).await;
        let at = Instant::now();
        let nodes = held.guard.nodes().to_vec();
        assert!(held.hold_for(Duration::from_millis(100)).await, "kept");
        assert_eq!(held.release().await.expect("release"), 0);
        (at, nodes)
    });
    let freed = loop {
        held_x.note();
        if !tokio::task::block_in_place(|| entries(&s[0], NAME)).contains_key(&y_field) {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < K_LEASE + EPSILON,
            "n1 still holds the killed waiter's entry {:?} after the kill",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    println!("seed k = {k}: Y killed at its hold of n1 number {k}; n1 freed {freed:?} later");
    assert!(held_x.hold_for(K_LEASE / 4).await, "X keeps its lease");
    assert!(!tz.is_finished(), "Z acquired while X held");
    let released = Instant::now();
    assert_eq!(held_x.release().await.expect("X's release"), 0);
    let (z_at, z_nodes) = tokio::time::timeout(Duration::from_secs(5), tz)
        .await
        .expect("Z completes")
        .expect("Z's task");
    let z_wait = z_at - released;
    println!("Z acquired {z_wait:?} after X's release");
    assert!(z_wait < W, "Z waited {z_wait:?}");
    assert_eq!(z_nodes, [0, 1, 2]);
    drop(workers);

    let left = wait_quiet(&s, K_LEASE + Duration::from_secs(1));
    let cfg = CheckConfig {
        final_keys: Some(left),
        ..CheckConfig::new(K_LEASE)
    };
    let (_, report) = check_killed(dir.path(), &cfg);
    report.assert_ok();
    // X and Z acquire once each; Y never does, and its kill ends its wait before Z invokes.
    report.assert_contention(2, 1, 1);
    report.assert_pass(&[
        CheckId::Exclusion,
        CheckId::Tokens,
        CheckId::Ownership,
        CheckId::Validity,
        CheckId::Quiescence,
    ]);
}
