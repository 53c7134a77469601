//! The small-state table on real nodes (reliability.md C11): each of 3 nodes is free, held by
//! another holder, refused, hung, or slow, 5³ = 125 cases. The outcome and error kind of one
//! attempt must match what [`AttemptState`] decides for the same answers, and the attempt must
//! end within its bound.
//!
//! Three servers with a fault proxy in front of each serve every case: `Refuse` is a refused
//! node, `Blackhole` a hung one, `Delay` of half the node operation time a slow one; "held by
//! another" is another holder's entry written directly on the server. Every case uses its own
//! lock name (leftovers of one case cannot disturb the next), and starts from a view whose
//! nodes were all just verified (a warm-up attempt with every proxy passing), so that a fault
//! is met by the attempt itself, as the table assumes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use slate_combination::decision::{AttemptState, Next, NodeAnswer, Order};
use slate_combination::{CombinationLock, NodeSetOptions};
use slate_core::HolderId;
use slate_harness::proxy::Mode;

const OP: Duration = Duration::from_millis(160);
const SLOW: Duration = Duration::from_millis(80);
const LEASE: Duration = Duration::from_secs(3);
/// Scheduling, proxies and a debug build on two cores.
const SLACK: Duration = Duration::from_millis(400);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    Free,
    Held,
    Refused,
    Hung,
    Slow,
}

const STATES: [Node; 5] = [
    Node::Free,
    Node::Held,
    Node::Refused,
    Node::Hung,
    Node::Slow,
];

impl Node {
    fn answer(self) -> NodeAnswer {
        match self {
            Node::Free | Node::Slow => NodeAnswer::Acquired,
            Node::Held => NodeAnswer::HeldByOther,
            Node::Refused | Node::Hung => NodeAnswer::Failed,
        }
    }

    /// What one command to this node costs at most (before slack).
    fn cost(self) -> Duration {
        match self {
            Node::Hung => OP,
            Node::Slow => SLOW,
            _ => Duration::ZERO,
        }
    }

    fn mode(self) -> Mode {
        match self {
            Node::Refused => Mode::Refuse,
            Node::Hung => Mode::Blackhole,
            Node::Slow => delay(SLOW),
            Node::Free | Node::Held => Mode::Pass,
        }
    }
}

/// What the decision function says for these answers (nominal times), and the time bound of
/// the attempt including its releases.
fn expected(case: [Node; 3], budget: Duration) -> (Next, Duration) {
    let mut state = AttemptState::new(vec![true; 3], 2, budget, Order::Sequential);
    let mut next = state.start();
    let mut elapsed = Duration::ZERO;
    for _ in 0..=3 {
        let Next::Send(batch) = &next else { break };
        let answers: Vec<_> = batch.iter().map(|&i| (i, case[i].answer())).collect();
        elapsed += batch
            .iter()
            .map(|&i| case[i].cost())
            .max()
            .unwrap_or_default();
        next = state.on_answers(&answers, elapsed);
    }
    assert!(next.is_final(), "{case:?}: {next:?}");
    let releases: Duration = next.release().iter().map(|&i| case[i].cost()).sum();
    (next, elapsed + releases + SLACK)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_125_cases_match_the_decision_function() {
    let started = Instant::now();
    let s = servers(3);
    adopt(&view_of(urls(&s), opts(OP))).await;
    let p = proxies(&s);
    // Re-probe at once: the warm-up of each case brings back the nodes the last case failed.
    let nodes = view_of(
        proxy_urls(&p),
        NodeSetOptions::builder()
            .node_operation_time(OP)
            .reprobe_interval(Duration::from_millis(1))
            .quarantine(Duration::from_secs(5))
            .build()
            .unwrap(),
    );
    let build = |name: &str| {
        CombinationLock::builder(&nodes, name)
            .lease(LEASE)
            .build()
            .expect("lock")
    };
    let warm = build("warm-up");
    let budget = OP * 3 + Duration::from_millis(100);
    let mut modes = [Mode::Pass; 3];
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for a in STATES {
        for b in STATES {
            for c in STATES {
                let case = [a, b, c];
                let name = format!("table-{a:?}-{b:?}-{c:?}");
                // Warm up with every proxy passing: all nodes verified and usable.
                for (i, m) in modes.iter_mut().enumerate() {
                    if *m != Mode::Pass {
                        set(&p[i], Mode::Pass);
                        *m = Mode::Pass;
                    }
                }
                // A connection the last case's `Refuse` reset while the attempt did not use it
                // fails its next command (the node is then skipped and re-verified, on a new
                // connection, by the next attempt): warm up until all three are used.
                // A node refused by the last case's `Refuse` (its proxy's new mode not yet in
                // force under load) is probed again after 1 s: retry for a few seconds.
                let warming = std::time::Instant::now();
                loop {
                    match warm.try_lock().await {
                        Ok(Some(g)) => {
                            let all = g.nodes() == [0, 1, 2];
                            g.unlock().await.unwrap();
                            if all {
                                break;
                            }
                        }
                        Err(e) if e.is_insufficient_nodes() => {}
                        other => panic!("{case:?}: warm-up: {other:?}"),
                    }
                    assert!(
                        warming.elapsed() < Duration::from_secs(10),
                        "{case:?}: warm-up; nodes: {:?}",
                        nodes.report()
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                for (i, node) in case.iter().enumerate() {
                    if *node == Node::Held {
                        hold_directly(&s[i], &name, "another-holder", 30_000);
                    }
                    if node.mode() != modes[i] {
                        set(&p[i], node.mode());
                        modes[i] = node.mode();
                    }
                }
                let (want, bound) = expected(case, budget);
                let h = HolderId::new();
                let t0 = Instant::now();
                let got = try_as(&build(&name), h).await;
                let took = t0.elapsed();
                let kind = match (&want, &got) {
                    (Next::Acquired { held }, Ok(Some(g))) => {
                        assert_eq!(g.nodes(), held.as_slice(), "{case:?}");
                        "acquired"
                    }
                    (Next::Busy { .. }, Ok(None)) => "busy",
                    (Next::InsufficientNodes { .. }, Err(e)) if e.is_insufficient_nodes() => {
                        "insufficient"
                    }
                    (Next::BudgetExceeded { .. }, Err(e)) if e.is_timeout() => "timeout",
                    _ => panic!(
                        "{case:?}: the decision function says {want:?}, the lock answered {:?}",
                        got.as_ref().map(|g| g.as_ref().map(|g| g.nodes().to_vec()))
                    ),
                };
                *outcomes.entry(kind.to_owned()).or_default() += 1;
                assert!(took <= bound, "{case:?}: took {took:?}, bound {bound:?}");
                // The servers, read directly: our entry exactly where we hold; another
                // holder's entry untouched.
                let held: &[usize] = match &want {
                    Next::Acquired { held } => held,
                    _ => &[],
                };
                for (i, node) in case.iter().enumerate() {
                    let mine = count_of(&s[i], &name, h);
                    if held.contains(&i) {
                        assert_eq!(mine, Some(1), "{case:?}: node {i}");
                    } else if *node != Node::Hung {
                        assert_eq!(mine, None, "{case:?}: node {i} not released");
                    }
                    if *node == Node::Held {
                        assert_eq!(
                            entries(&s[i], &name).get("another-holder"),
                            Some(&1),
                            "{case:?}: node {i}"
                        );
                    }
                }
                if let Ok(Some(g)) = got {
                    g.unlock().await.unwrap();
                }
                // Heal: a hung node now runs what it held back, and nothing of ours stays.
                for (i, m) in modes.iter_mut().enumerate() {
                    if *m != Mode::Pass {
                        set(&p[i], Mode::Pass);
                        *m = Mode::Pass;
                    }
                }
                wait_for(
                    Duration::from_secs(2),
                    &format!("{case:?}: no entry of the holder left"),
                    || {
                        s.iter()
                            .all(|x| count_of(x, &name, h).is_none())
                            .then_some(())
                    },
                )
                .await;
            }
        }
    }
    println!("125 cases in {:?}: {outcomes:?}", started.elapsed());
    assert_eq!(outcomes.values().sum::<usize>(), 125);
}
