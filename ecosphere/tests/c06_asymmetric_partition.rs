//! Combination lock, reliability.md C6: asymmetric partition versus the quorum rule.
//!
//! Scenario: two clients A and B, each reaching every node through its own fault proxy (one
//! proxy per (client, node) pair, the user-space stand-in for network namespaces). Both views
//! are verified first; then each client's proxies to its cut nodes reset every connection
//! (unreachable nodes; a reset rather than a closed port, so that no other test can take the
//! port meanwhile). Both contend for one lock for 2 s (hold 20 ms with one GET-then-SET
//! increment of a counter on a separate server, think 30 ms, each acquisition waiting at most
//! 500 ms).
//!
//! Faults and expected behaviour, with Slate's majority quorum `max(2, ⌊N/2⌋ + 1)`:
//! - N = 3, A cut from n1, B cut from n3: A can only hold {n2, n3}, B only {n1, n2}; they share
//!   n2, so both make progress but only one holds at a time.
//! - N = 4, A cut from {n3, n4}, B cut from {n1, n2}: each reaches 2 < 3 nodes, so both are
//!   refused (`InsufficientNodes`) and nothing is left on any node: no violation, at the cost of
//!   availability. Bedrock's fixed quorum of 2 would let both hold disjoint pairs (the expected
//!   I1 violation of the research matrix); Slate refuses to build such a lock.
//! - N = 5, A cut from {n4, n5}, B cut from {n1, n2}: A holds {n1, n2, n3}, B {n3, n4, n5};
//!   they share n3: both progress, one at a time.
//!
//! Invariants (checker): I1 exclusion, I3 tokens, I5 ownership, validity accounting, activity
//! inside the holder's window, counter = acknowledged increments, I8 quiescence.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::time::{Duration, Instant};

use ecosphere::history::{CheckConfig, CheckId, CounterCheck, CounterExpectation, Status};
use ecosphere::proxy::Mode;
use ecosphere::server::RedisServer;
use scenario::*;
use slate_combination::{CombinationLock, NodeSet, Order};
use slate_core::{HolderId, Wait};

/// Long enough for the default acquire budget of five nodes (5 × OP + 100 ms).
const LEASE: Duration = Duration::from_secs(2);
/// Node operation time: generous for a loaded machine; the default budget (3 × OP + 100 ms)
/// stays below the lease.
const OP: Duration = Duration::from_millis(250);
const REPROBE: Duration = Duration::from_millis(200);
const RUN: Duration = Duration::from_secs(2);
const HOLD: Duration = Duration::from_millis(20);
const THINK: Duration = Duration::from_millis(30);
const NAME: &str = "c6";
const COUNTER: &str = "counter";

fn lock(nodes: &NodeSet, order: Order) -> CombinationLock {
    CombinationLock::builder(nodes, NAME)
        .lease(LEASE)
        .spin_wait(Duration::from_millis(20))
        .order(order)
        .build()
        .expect("lock")
}

/// What one client did in the run.
#[derive(Debug, Default)]
struct Tally {
    acquired: usize,
    insufficient: usize,
    other_failures: usize,
    node_sets: Vec<Vec<usize>>,
}

/// Contends for `RUN`: acquire (waiting at most 500 ms), increment, hold, release, think.
async fn contend(client: Client, resource: std::sync::Arc<RedisServer>) -> Tally {
    let mut t = Tally::default();
    let end = Instant::now() + RUN;
    let mut rounds = 0;
    while Instant::now() < end && rounds < 1_000 {
        rounds += 1;
        let wait = Wait::Until(Instant::now() + Duration::from_millis(500));
        match client
            .acquire(0, HolderId::new(), wait, Duration::from_secs(5))
            .await
        {
            Outcome::Acquired(mut held) => {
                t.acquired += 1;
                t.node_sets.push(held.guard.nodes().to_vec());
                held.increment(&resource, COUNTER);
                held.hold_for(HOLD).await;
                held.release().await.expect("release");
            }
            Outcome::Failed(Some(e)) if e.is_insufficient_nodes() => t.insufficient += 1,
            Outcome::Failed(_) => t.other_failures += 1,
            Outcome::Indeterminate(e) => panic!("indeterminate acquisition: {e}"),
        }
        tokio::time::sleep(THINK).await;
    }
    t
}

/// Runs the partition; returns both tallies after checking the history.
async fn scenario(n: usize, a_cut: &[usize], b_cut: &[usize], order: Order) -> (Tally, Tally) {
    let s = servers(n);
    let resource = std::sync::Arc::new(RedisServer::start().expect("resource server"));
    adopt(&urls(&s)).await;
    let (pa, pb) = (proxies(&s), proxies(&s));
    let a_view = view(proxy_urls(&pa), opts(OP, REPROBE));
    let b_view = view(proxy_urls(&pb), opts(OP, REPROBE));
    warm(&a_view).await;
    warm(&b_view).await;
    for &i in a_cut {
        set(&pa[i], Mode::Reset);
    }
    for &i in b_cut {
        set(&pb[i], Mode::Reset);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let a = Client::new(dir.path(), 0, lock(&a_view, order));
    let b = Client::new(dir.path(), 1, lock(&b_view, order));
    let ta = tokio::spawn(contend(a, resource.clone()));
    let tb = tokio::spawn(contend(b, resource.clone()));
    let (ta, tb) = (ta.await.expect("A"), tb.await.expect("B"));
    println!(
        "N = {n}, A cut from {a_cut:?}: {} acquired, {} insufficient, {} other; \
         B cut from {b_cut:?}: {} acquired, {} insufficient, {} other",
        ta.acquired,
        ta.insufficient,
        ta.other_failures,
        tb.acquired,
        tb.insufficient,
        tb.other_failures
    );
    // Entries a release could not reach (none expected: the cut nodes were never sent to)
    // would expire within the lease.
    let left = wait_quiet(&s, LEASE + Duration::from_secs(1));
    let counter: u64 = {
        let v: Option<u64> = redis::from_redis_value(
            resource
                .command(&["GET", COUNTER])
                .expect("GET the counter"),
        )
        .expect("int");
        v.unwrap_or(0)
    };
    assert_eq!(counter, (ta.acquired + tb.acquired) as u64);
    let cfg = CheckConfig {
        counter: Some(CounterCheck {
            final_value: counter,
            expected: CounterExpectation::AckedIncrements,
        }),
        final_keys: Some(left),
        ..CheckConfig::new(LEASE)
    };
    let (_, report) = check(dir.path(), &cfg);
    report.assert_ok();
    // N = 3 and 5 leave both clients a quorum: each acquires (one task each, taking turns, so
    // their acquire calls need not overlap). N = 4 refuses both.
    if n != 4 {
        report.assert_contention(2, 1, 1);
    }
    // Without any acquisition, exclusion, tokens and validity have nothing to check.
    let checks: &[CheckId] = if counter == 0 {
        &[CheckId::Ownership, CheckId::Counter, CheckId::Quiescence]
    } else {
        &[
            CheckId::Exclusion,
            CheckId::Tokens,
            CheckId::Ownership,
            CheckId::Validity,
            CheckId::Activity,
            CheckId::Counter,
            CheckId::Quiescence,
        ]
    };
    for &id in checks {
        if id == CheckId::Ownership && counter == 0 {
            // Nothing acquired, nothing released: nothing to judge.
            report.assert_pass_or_unchecked(id, "no acquisition, so no release");
            continue;
        }
        assert_eq!(report.status(id), &Status::Pass, "{}", id.label());
    }
    (ta, tb)
}

/// Both clients progress on the node sets their cuts leave them, never on a cut node.
fn assert_one_at_a_time(ta: &Tally, tb: &Tally, a_nodes: &[usize], b_nodes: &[usize]) {
    assert!(ta.acquired > 0, "A never acquired: {ta:?}");
    assert!(tb.acquired > 0, "B never acquired: {tb:?}");
    assert!(
        ta.node_sets.iter().all(|x| x == a_nodes),
        "A held {:?}",
        ta.node_sets
    );
    assert!(
        tb.node_sets.iter().all(|x| x == b_nodes),
        "B held {:?}",
        tb.node_sets
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c6_three_nodes_a_cut_from_n1_b_cut_from_n3_share_n2_one_at_a_time() {
    let (ta, tb) = scenario(3, &[0], &[2], Order::Sequential).await;
    assert_one_at_a_time(&ta, &tb, &[1, 2], &[0, 1]);
}

/// The same partition against the parallel round (issue 15): A's lead is n2 (n1 is cut), B's
/// is n1; both progress, one at a time, on the node sets the partition allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c6_three_nodes_parallel_round_shares_n2_one_at_a_time() {
    let (ta, tb) = scenario(3, &[0], &[2], Order::Pipelined).await;
    assert_one_at_a_time(&ta, &tb, &[1, 2], &[0, 1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c6_four_nodes_split_two_and_two_both_refused_by_the_majority_quorum() {
    // Bedrock's "at least 2 remain" is refused when the lock is built.
    let s = servers(4);
    let nodes = view(urls(&s), opts(OP, REPROBE));
    let two = CombinationLock::builder(&nodes, NAME)
        .lease(LEASE)
        .required_nodes(2)
        .build()
        .expect_err("a quorum of 2 of 4 is refused");
    assert!(two.is_invalid_input(), "{two}");
    assert_eq!(lock(&nodes, Order::Sequential).required_nodes(), 3);
    drop(s);

    let (ta, tb) = scenario(4, &[2, 3], &[0, 1], Order::Sequential).await;
    assert_eq!(ta.acquired + tb.acquired, 0, "A {ta:?}, B {tb:?}");
    assert!(
        ta.insufficient > 0 && tb.insufficient > 0,
        "A {ta:?}, B {tb:?}"
    );
    assert_eq!(ta.other_failures + tb.other_failures, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c6_five_nodes_a_cut_from_n4_n5_b_cut_from_n1_n2_share_n3_one_at_a_time() {
    let (ta, tb) = scenario(5, &[3, 4], &[0, 1], Order::Sequential).await;
    assert_one_at_a_time(&ta, &tb, &[0, 1, 2], &[2, 3, 4]);
}

/// The five-node partition against the parallel round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c6_five_nodes_parallel_round_shares_n3_one_at_a_time() {
    let (ta, tb) = scenario(5, &[3, 4], &[0, 1], Order::Pipelined).await;
    assert_one_at_a_time(&ta, &tb, &[0, 1, 2], &[2, 3, 4]);
}
