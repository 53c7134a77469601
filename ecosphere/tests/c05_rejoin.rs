//! Combination lock, reliability.md C5: re-check and rejoin versus the acquisition order.
//!
//! Scenario: N = 3. Client A reaches n1 only through a fault proxy; B reaches every node
//! directly (its n2 through a 40 ms delay proxy, so that each of B's attempts visibly holds
//! n1 for a moment). Both views are verified first.
//!
//! Fault: A's proxy to n1 resets every connection (an unreachable node; smoke) or blackholes
//! them (full matrix), so A's attempt finds n1 failed, marks it unavailable and takes
//! {n2, n3}. B then waits (its attempts take n1 and find n2 busy). During A's hold the link
//! is healed; after the re-probe interval a new attempt of A's view (another lock on the same
//! node set) verifies n1 again, so A's view counts n1 usable while A still holds {n2, n3}.
//!
//! Expected: A's hold set is frozen: A's renewals and A's re-entry use exactly {n2, n3} and
//! never add n1 (an observer polling n1's hash every 20 ms never sees A's field there, except,
//! with the blackhole, the ghost of A's lost first command, which expires and is never
//! renewed); B never keeps n1 longer than one attempt (busy at n2 releases its prefix at
//! once), so no circular wait can form; once A releases, B completes within 2 s on all three
//! nodes. A's next acquisition starts again from the left: busy at n1 while B holds, then all
//! three nodes.
//!
//! Invariants: I1 exclusion, I3 tokens, I5 ownership, I6 re-entry, validity accounting, I8
//! quiescence (checker), plus the frozen hold set and the bounded prefix (observer).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::time::{Duration, Instant};

use ecosphere::history::{CheckConfig, CheckId, Recorder};
use ecosphere::proxy::Mode;
use scenario::*;
use slate_combination::{CombinationLock, NodeSet};
use slate_core::{HolderId, NodeState, Wait};

const LEASE: Duration = Duration::from_secs(1);
/// Node operation time: generous for a loaded machine; the default budget (3 × OP + 100 ms)
/// stays below the lease.
const OP: Duration = Duration::from_millis(250);
const REPROBE: Duration = Duration::from_millis(300);
/// B's delay to n2: how long each of B's attempts holds n1 before it learns n2 is busy.
const B_TO_N2: Duration = Duration::from_millis(40);
/// Upper bound of one of B's attempts holding n1: acquire n1, acquire n2, release n1, each
/// within the node operation time, plus the observer's interval.
const PREFIX_BOUND: Duration = Duration::from_millis(3 * 250 + 100);
/// B completes within this after A's release (a spin wait and one attempt, with room for a
/// loaded machine).
const W: Duration = Duration::from_secs(2);
const NAME: &str = "c5";

/// B's spin wait: far longer than the observer's interval, so that two of B's attempts are
/// never seen as one presence on n1.
const B_SPIN: Duration = Duration::from_millis(100);

fn lock(nodes: &NodeSet, name: &str, spin: Duration) -> CombinationLock {
    CombinationLock::builder(nodes, name)
        .lease(LEASE)
        .renewal_period(Duration::from_millis(300))
        .spin_wait(spin)
        .build()
        .expect("lock")
}

async fn scenario(cut: Mode) {
    let s = servers(3);
    adopt(&urls(&s)).await;
    let pa = proxies(&s[..1]);
    let pb = proxies(&s[1..2]);
    let a_view = view(vec![pa[0].url(), s[1].url(), s[2].url()], opts(OP, REPROBE));
    let b_view = view(vec![s[0].url(), pb[0].url(), s[2].url()], opts(OP, REPROBE));
    warm(&a_view).await;
    warm(&b_view).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Client::new(
        dir.path(),
        0,
        lock(&a_view, NAME, Duration::from_millis(20)),
    );
    let b = Client::new(dir.path(), 1, lock(&b_view, NAME, B_SPIN));
    let observer = Observer::start(
        &s[0],
        0,
        NAME,
        Recorder::create(dir.path(), 9).expect("observer recorder"),
        Duration::from_millis(20),
    );
    set(&pb[0], delay(B_TO_N2));

    // A's view loses n1: A takes {n2, n3}.
    set(&pa[0], cut);
    let ha = HolderId::new();
    let mut held_a = a
        .acquire(0, ha, Wait::Immediate, Duration::from_secs(5))
        .await
        .held("A without n1");
    assert_eq!(held_a.guard.nodes(), &[1, 2], "A holds n2 and n3");
    assert!(
        matches!(a.nodes().report()[0].state, NodeState::Unavailable { .. }),
        "A's view marked n1 unavailable: {:?}",
        a.nodes().report()
    );

    // B waits: each attempt takes n1 and finds n2 busy.
    let hb = HolderId::new();
    let b_task = {
        let b = b.clone();
        tokio::spawn(async move { b.acquire_retrying(0, hb, Duration::from_secs(20)).await })
    };
    let hb_field = hb.to_string();
    wait_async(Duration::from_secs(5), "B's attempt seen on n1", || {
        entries(&s[0], NAME).contains_key(&hb_field).then_some(())
    })
    .await;

    // Heal A↔n1 during A's hold; once the re-probe interval has passed, a new attempt of A's
    // view (another lock on the same node set) re-checks n1 and finds it alive.
    assert!(held_a.hold_for(LEASE / 2).await, "A keeps its hold");
    set(&pa[0], Mode::Pass);
    let healed = now();
    assert!(held_a.hold_for(REPROBE + OP).await, "A keeps its hold");
    let probe = lock(a.nodes(), "c5-probe", Duration::from_millis(20));
    let probe_until = Instant::now() + Duration::from_secs(5);
    let g = loop {
        let g = probe
            .try_lock()
            .await
            .expect("probe attempt")
            .expect("the probe lock is free");
        if g.nodes() == [0, 1, 2] {
            break g;
        }
        g.unlock().await.expect("probe release");
        assert!(
            Instant::now() < probe_until,
            "A's view never used n1 again: {:?}",
            a.nodes().report()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    g.unlock().await.expect("probe release");
    assert_eq!(
        a.nodes().report()[0].state,
        NodeState::NotTried,
        "n1 usable in A's view"
    );

    // A's hold stays {n2, n3}: renewal goes on there, and a re-entry takes exactly those.
    assert!(
        held_a.hold_for(LEASE).await,
        "A keeps its hold past a lease"
    );
    let inner = held_a.reenter(Duration::from_secs(2)).await;
    assert_eq!(inner.guard.nodes(), &[1, 2], "the re-entry added no node");
    assert_eq!(inner.guard.fencing_token(), held_a.guard.fencing_token());
    assert!(
        !entries(&s[0], NAME).contains_key(held_a.holder()),
        "A has no entry on n1"
    );
    assert_eq!(inner.release().await.expect("release the re-entry"), 1);
    assert!(held_a.hold_for(LEASE / 2).await, "A keeps its hold");
    assert!(!b_task.is_finished(), "B cannot acquire while A holds");

    // A releases: B completes within W, on every node.
    let released = Instant::now();
    let t_a_release = now();
    assert_eq!(held_a.release().await.expect("A's release"), 0);
    let held_b = tokio::time::timeout(W + Duration::from_secs(2), b_task)
        .await
        .expect("B completes")
        .expect("B's task");
    let waited = released.elapsed();
    assert!(waited < W, "B completed {waited:?} after A's release");
    assert_eq!(held_b.guard.nodes(), &[0, 1, 2], "B holds every node");

    // A's next acquisition starts from the left again: busy at n1, taking nothing.
    let t_next = now();
    match a
        .acquire(0, HolderId::new(), Wait::Immediate, Duration::from_secs(5))
        .await
    {
        Outcome::Failed(None) => {}
        Outcome::Failed(Some(e)) | Outcome::Indeterminate(e) => panic!("A's next attempt: {e}"),
        Outcome::Acquired(h) => panic!("A acquired while B holds: {:?}", h.guard),
    }
    for (i, x) in s.iter().enumerate() {
        let e = entries(x, NAME);
        assert_eq!(
            e.keys().collect::<Vec<_>>(),
            vec![&hb_field],
            "node {i}: only B's entry"
        );
    }
    assert_eq!(held_b.release().await.expect("B's release"), 0);
    let last = a
        .acquire(0, HolderId::new(), Wait::Forever, Duration::from_secs(5))
        .await
        .held("A's next acquisition");
    assert_eq!(
        last.guard.nodes(),
        &[0, 1, 2],
        "a new acquisition starts at n1"
    );
    assert_eq!(last.release().await.expect("release"), 0);

    let snaps = observer.stop();
    let before_next: Vec<Snapshot> = snaps.into_iter().filter(|x| x.t < t_next).collect();
    // A's field on n1: never (reset), or only the ghost of its lost command (blackhole),
    // after the heal, never renewed, gone within a lease.
    let ghost = presences(&before_next, &ha.to_string());
    match cut {
        Mode::Reset => assert!(ghost.is_empty(), "A's entry on n1: {ghost:?}"),
        _ => {
            for &(from, to) in &ghost {
                assert!(from >= healed, "A's entry on n1 before the heal");
                assert!(
                    Duration::from_nanos(to - from) < LEASE + Duration::from_millis(100),
                    "A's ghost on n1 outlived a lease"
                );
            }
            let ttls: Vec<i64> = before_next
                .iter()
                .filter(|x| x.fields.contains_key(&ha.to_string()))
                .map(|x| x.pttl_ms)
                .collect();
            assert!(
                ttls.windows(2).all(|w| w[1] <= w[0] + 5),
                "A's ghost on n1 was renewed: {ttls:?}"
            );
        }
    }
    // B's attempts while A held (its winning attempt starts after A's release).
    let waiting: Vec<Snapshot> = before_next
        .iter()
        .filter(|x| x.t < t_a_release)
        .cloned()
        .collect();
    let b_prefix = presences(&waiting, &hb_field);
    let longest = longest_presence(&waiting, &hb_field);
    let spans: Vec<u64> = b_prefix.iter().map(|(x, y)| (y - x) / 1_000_000).collect();
    println!("B's presences on n1 (ms): {spans:?}");
    println!(
        "B held n1 {} times while waiting, longest {longest:?}; waited {waited:?} after A's \
         release; A's ghosts on n1: {}",
        b_prefix.len(),
        ghost.len()
    );
    assert!(!b_prefix.is_empty(), "the observer never saw B's prefix");
    assert!(
        longest < PREFIX_BOUND,
        "B kept n1 for {longest:?} while A held n2"
    );

    let left = wait_quiet(&s, LEASE + Duration::from_secs(1));
    let cfg = CheckConfig {
        final_keys: Some(left),
        // A's first command, to n1, hangs for the node operation time; its lease counts from
        // the commands to n2 and n3, sent after it (each node's entry lives at least the lease
        // from its own command), so its deadline may pass `acq_invoke + L` by up to that.
        deadline_tolerance: if cut == Mode::Blackhole {
            OP + Duration::from_millis(5)
        } else {
            CheckConfig::default().deadline_tolerance
        },
        ..CheckConfig::new(LEASE)
    };
    let (_, report) = check(dir.path(), &cfg);
    report.assert_ok();
    // A and B acquire; only A's re-entry may overlap B's wait (B may be between attempts).
    report.assert_contention(2, 1, 1);
    report.assert_pass(&[
        CheckId::Exclusion,
        CheckId::Tokens,
        CheckId::Ownership,
        CheckId::Reentry,
        CheckId::Validity,
        CheckId::Quiescence,
    ]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c5_unreachable_node_rejoins_during_the_hold_and_the_hold_set_stays_frozen() {
    scenario(Mode::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(feature = "full-matrix"),
    ignore = "full matrix: cargo test -p ecosphere --features full-matrix"
)]
async fn c5_blackholed_node_rejoins_during_the_hold_and_the_hold_set_stays_frozen() {
    scenario(Mode::Blackhole).await;
}
