//! The attempt state machine against the decision table of SEMANTICS.md, read as directly as
//! possible (the oracle below), plus the structural properties every run must have. Both
//! orders: the sequential walk, and the parallel round (every node at once, the lead deciding,
//! re-asks of nodes held by others while we hold the lead).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use proptest::prelude::*;
use slate_combination::decision::{
    AttemptState, MAX_REASKS, Next, NodeAnswer, Order, default_quorum,
};

const BUDGET: Duration = Duration::from_millis(250);

fn answer() -> impl Strategy<Value = NodeAnswer> {
    prop_oneof![
        4 => Just(NodeAnswer::Acquired),
        1 => Just(NodeAnswer::HeldByOther),
        2 => Just(NodeAnswer::Failed),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    usable: Vec<bool>,
    answers: Vec<NodeAnswer>,
    /// Time each node's answer arrives, counted from the first command (ms).
    times: Vec<u64>,
    /// (Parallel round) a node first held by another answers *acquired* from this re-ask on
    /// (its holder was a contender that let go); above `MAX_REASKS`: never.
    frees_at: Vec<u32>,
    required: usize,
    order: Order,
    /// (Parallel round) the lead is asked alone first (`AttemptState::lead_first`).
    lead_first: bool,
}

/// Time of the answers of re-ask `k` (ms): each re-ask takes 5 ms after the first round.
fn reask_time(c: &Case, k: u32) -> u64 {
    c.times.iter().copied().max().unwrap_or(0) + 5 * u64::from(k)
}

/// The answer of node `i` at re-ask `k` (0: the first round).
fn answer_at(c: &Case, i: usize, k: u32) -> NodeAnswer {
    match c.answers[i] {
        NodeAnswer::HeldByOther if k >= 1 && k >= c.frees_at[i] => NodeAnswer::Acquired,
        a => a,
    }
}

fn case() -> impl Strategy<Value = Case> {
    (2usize..=7)
        .prop_flat_map(|n| {
            (
                prop::collection::vec(prop::bool::weighted(0.85), n),
                prop::collection::vec(answer(), n),
                prop::collection::vec(0u64..120, n),
                prop::collection::vec(1..=MAX_REASKS + 1, n),
                0..=(n - default_quorum(n)),
                prop_oneof![Just(Order::Sequential), Just(Order::Pipelined)],
                any::<bool>(),
            )
        })
        .prop_map(
            |(usable, answers, steps, frees_at, extra, order, lead_first)| {
                let n = usable.len();
                // Answers arrive in node order; times grow by a random step per node.
                let times = steps
                    .iter()
                    .scan(0, |t, s| {
                        *t += s;
                        Some(*t)
                    })
                    .collect();
                Case {
                    usable,
                    answers,
                    times,
                    frees_at,
                    required: default_quorum(n) + extra,
                    order,
                    lead_first,
                }
            },
        )
}

/// Runs the state machine, answering each sent node from the case. Returns the final step and
/// the batches sent.
fn run(c: &Case) -> (Next, Vec<Vec<usize>>) {
    let mut state = AttemptState::new(c.usable.clone(), c.required, BUDGET, c.order);
    if c.lead_first {
        state = state.lead_first();
    }
    let mut next = state.start();
    let mut sent = Vec::new();
    // Lead first: the lead's round and the others' are both the first round (no re-ask).
    let first_rounds = if c.lead_first { 2 } else { 1 };
    for _ in 0..=c.usable.len() + MAX_REASKS as usize {
        let Next::Send(batch) = &next else {
            return (next, sent);
        };
        let round = (sent.len() + 1).saturating_sub(first_rounds);
        let (answers, elapsed): (Vec<_>, u64) = match (c.order, round) {
            (Order::Pipelined, k @ 1..) => {
                let k = u32::try_from(k).unwrap();
                let answers = batch.iter().map(|&i| (i, answer_at(c, i, k))).collect();
                (answers, reask_time(c, k))
            }
            _ => (
                batch.iter().map(|&i| (i, c.answers[i])).collect(),
                batch.iter().map(|&i| c.times[i]).max().unwrap_or(0),
            ),
        };
        sent.push(batch.clone());
        next = state.on_answers(&answers, Duration::from_millis(elapsed));
    }
    panic!("attempt did not finish within n + 1 + MAX_REASKS steps: {c:?}");
}

fn desc(mut v: Vec<usize>) -> Vec<usize> {
    v.sort_unstable_by(|a, b| b.cmp(a));
    v
}

/// The table, read row by row: the expected final step.
fn oracle(c: &Case) -> Next {
    let usable: Vec<usize> = (0..c.usable.len()).filter(|&i| c.usable[i]).collect();
    if usable.len() < c.required {
        return Next::InsufficientNodes { release: vec![] };
    }
    if c.order == Order::Pipelined {
        if c.lead_first {
            // Lead first (the module's "Lead first"), the table's rows in order on the lead's
            // answer alone: past the budget; lost at once at another holder's lead; otherwise
            // the parallel table on all the answers.
            let lead = usable[0];
            let held_by_other = c.answers[lead] == NodeAnswer::HeldByOther;
            if Duration::from_millis(c.times[lead]) > BUDGET {
                let release = if held_by_other { vec![] } else { vec![lead] };
                return Next::BudgetExceeded { release };
            }
            if held_by_other {
                return Next::Busy {
                    at: lead,
                    release: vec![],
                };
            }
        }
        return parallel_oracle(c, &usable);
    }
    // The answer groups in the order they arrive: sequential = one node each.
    let groups: Vec<Vec<usize>> = usable.iter().map(|&i| vec![i]).collect();
    let (mut held, mut failed) = (Vec::new(), Vec::new());
    let mut seen = 0;
    for group in groups {
        seen += group.len();
        let mut busy = None;
        for &i in &group {
            match c.answers[i] {
                NodeAnswer::Acquired => held.push(i),
                NodeAnswer::Failed => failed.push(i),
                NodeAnswer::HeldByOther => {
                    busy.get_or_insert(i);
                }
            }
        }
        let release = desc(held.iter().chain(&failed).copied().collect());
        if let Some(at) = busy {
            return Next::Busy { at, release };
        }
        let elapsed = group.iter().map(|&i| c.times[i]).max().unwrap_or(0);
        if Duration::from_millis(elapsed) > BUDGET {
            return Next::BudgetExceeded { release };
        }
        if held.len() + (usable.len() - seen) < c.required {
            return Next::InsufficientNodes { release };
        }
    }
    Next::Acquired { held }
}

/// The parallel table (`decision` module docs), row by row.
fn parallel_oracle(c: &Case, usable: &[usize]) -> Next {
    let mut held: Vec<usize> = Vec::new();
    let mut failed: Vec<usize> = Vec::new();
    let mut asked: Vec<usize> = usable.to_vec();
    let mut k = 0;
    loop {
        let mut others = Vec::new();
        for &i in &asked {
            match answer_at(c, i, k) {
                NodeAnswer::Acquired => held.push(i),
                NodeAnswer::Failed => failed.push(i),
                NodeAnswer::HeldByOther => others.push(i),
            }
        }
        held.sort_unstable();
        let release = desc(held.iter().chain(&failed).copied().collect());
        let elapsed = if k == 0 {
            usable.iter().map(|&i| c.times[i]).max().unwrap_or(0)
        } else {
            reask_time(c, k)
        };
        // Row 1: the budget.
        if Duration::from_millis(elapsed) > BUDGET {
            return Next::BudgetExceeded { release };
        }
        // Row 2: the lead (leftmost node that did not fail) is another holder's.
        let lead = held.iter().chain(&others).min().copied();
        if lead.is_some() && lead == others.first().copied() {
            return Next::Busy {
                at: others[0],
                release,
            };
        }
        // Row 3: we hold the lead and a quorum.
        if held.len() >= c.required {
            return Next::Acquired { held };
        }
        // Row 4: the quorum is out of reach even if the others let go.
        if others.is_empty() || held.len() + others.len() < c.required {
            return Next::InsufficientNodes { release };
        }
        // Rows 5 and 6: ask the others again, at most MAX_REASKS times.
        if k >= MAX_REASKS {
            return Next::Busy {
                at: others[0],
                release,
            };
        }
        k += 1;
        asked = others;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn machine_matches_the_table(c in case()) {
        let (got, _) = run(&c);
        prop_assert_eq!(got, oracle(&c), "case {:?}", c);
    }

    #[test]
    fn structural_properties(c in case()) {
        let (got, sent) = run(&c);
        if c.order == Order::Pipelined {
            return parallel_structure(&c, &got, &sent);
        }
        let flat: Vec<usize> = sent.iter().flatten().copied().collect();
        // Left to right, each node at most once, only usable nodes.
        prop_assert!(flat.windows(2).all(|w| w[0] < w[1]), "order {:?}", flat);
        prop_assert!(flat.iter().all(|&i| c.usable[i]));
        // What is released is exactly what may hold our entry, in reverse order.
        let may_hold: Vec<usize> = flat
            .iter()
            .copied()
            .filter(|&i| c.answers[i] != NodeAnswer::HeldByOther)
            .collect();
        match &got {
            Next::Acquired { held } => {
                prop_assert!(held.len() >= c.required);
                prop_assert!(held.iter().all(|&i| c.answers[i] == NodeAnswer::Acquired));
                prop_assert!(flat.iter().all(|&i| c.answers[i] != NodeAnswer::HeldByOther));
                let acquired: Vec<usize> =
                    flat.iter().copied().filter(|&i| c.answers[i] == NodeAnswer::Acquired).collect();
                prop_assert_eq!(held, &acquired);
            }
            Next::Busy { at, release } => {
                prop_assert_eq!(c.answers[*at], NodeAnswer::HeldByOther);
                prop_assert_eq!(release, &desc(may_hold));
            }
            Next::InsufficientNodes { release } | Next::BudgetExceeded { release } => {
                prop_assert_eq!(release, &desc(may_hold));
            }
            Next::Send(_) => prop_assert!(false, "not final"),
        }
    }
}

/// The parallel round's structure: one first batch of every usable node, ascending; then only
/// re-asks of nodes another holder held at the previous answer, at most `MAX_REASKS`; what is
/// released is exactly what may hold our entry.
fn parallel_structure(
    c: &Case,
    got: &Next,
    sent: &[Vec<usize>],
) -> std::result::Result<(), TestCaseError> {
    let usable: Vec<usize> = (0..c.usable.len()).filter(|&i| c.usable[i]).collect();
    let mut sent = sent;
    if c.lead_first {
        // The lead alone, then (unless that decided) every other usable node at once: the
        // first round in two batches.
        if let Some(first) = sent.first() {
            prop_assert_eq!(first, &vec![usable[0]], "lead first asks the lead alone");
        }
        if let Some(second) = sent.get(1) {
            prop_assert_eq!(&second[..], &usable[1..], "then every other usable node");
        }
        if sent.len() == 1 {
            prop_assert!(
                c.answers[usable[0]] == NodeAnswer::HeldByOther
                    || Duration::from_millis(c.times[usable[0]]) > BUDGET,
                "only another holder's lead or the budget end the attempt after the lead"
            );
        }
    }
    let merged: Vec<Vec<usize>>;
    if c.lead_first && sent.len() >= 2 {
        merged = std::iter::once(usable.clone())
            .chain(sent[2..].iter().cloned())
            .collect();
        sent = &merged;
    } else if c.lead_first && !sent.is_empty() {
        // Ended after the lead: its answer is all there is.
        let lead = usable[0];
        match got {
            Next::Busy { at, release } => {
                prop_assert_eq!(*at, lead);
                prop_assert!(release.is_empty());
            }
            Next::BudgetExceeded { release } => {
                let may_hold = c.answers[lead] != NodeAnswer::HeldByOther;
                prop_assert_eq!(release, &if may_hold { vec![lead] } else { vec![] });
            }
            other => prop_assert!(false, "after the lead alone: {:?}", other),
        }
        return Ok(());
    }
    if let Some(first) = sent.first() {
        prop_assert_eq!(first, &usable, "the first round asks every usable node");
    }
    prop_assert!(sent.len() <= 1 + MAX_REASKS as usize);
    for (k, batch) in sent.iter().enumerate().skip(1) {
        let k = u32::try_from(k).unwrap();
        for &i in batch {
            prop_assert_eq!(
                answer_at(c, i, k - 1),
                NodeAnswer::HeldByOther,
                "re-ask {} of node {}, which was not held by another",
                k,
                i
            );
        }
    }
    // The last answer of every node asked.
    let mut last = std::collections::BTreeMap::new();
    for (k, batch) in sent.iter().enumerate() {
        for &i in batch {
            last.insert(i, answer_at(c, i, u32::try_from(k).unwrap()));
        }
    }
    let may_hold: Vec<usize> = last
        .iter()
        .filter(|(_, a)| **a != NodeAnswer::HeldByOther)
        .map(|(i, _)| *i)
        .collect();
    match got {
        Next::Acquired { held } => {
            prop_assert!(held.len() >= c.required);
            prop_assert!(
                held.iter()
                    .all(|i| last.get(i) == Some(&NodeAnswer::Acquired))
            );
            let lead = last
                .iter()
                .find(|(_, a)| **a != NodeAnswer::Failed)
                .map(|(i, _)| *i);
            prop_assert_eq!(lead, held.first().copied(), "we hold the lead");
        }
        Next::Busy { at, release } => {
            prop_assert_eq!(last.get(at), Some(&NodeAnswer::HeldByOther));
            prop_assert_eq!(release, &desc(may_hold));
        }
        Next::InsufficientNodes { release } | Next::BudgetExceeded { release } => {
            prop_assert_eq!(release, &desc(may_hold));
        }
        Next::Send(_) => prop_assert!(false, "not final"),
    }
    Ok(())
}

/// The small-state table (reliability.md C11) for N = 3, as the pure function sees it: each
/// node free (acquired), held by another, refused or hung (failed), or slow (acquired late).
#[test]
fn all_125_three_node_cases() {
    #[derive(Clone, Copy, Debug)]
    enum S {
        Free,
        Held,
        Refused,
        Hung,
        Slow,
    }
    let states = [S::Free, S::Held, S::Refused, S::Hung, S::Slow];
    let mut counts = std::collections::BTreeMap::new();
    for a in states {
        for b in states {
            for c in states {
                let nodes = [a, b, c];
                let answers = nodes.map(|s| match s {
                    S::Free | S::Slow => NodeAnswer::Acquired,
                    S::Held => NodeAnswer::HeldByOther,
                    S::Refused | S::Hung => NodeAnswer::Failed,
                });
                // Node timeout 50 ms: hung costs 50, slow 25, others ~1.
                let cost = |s: S| match s {
                    S::Hung => 50,
                    S::Slow => 25,
                    _ => 1,
                };
                let times: Vec<u64> = nodes
                    .iter()
                    .scan(0, |t, s| {
                        *t += cost(*s);
                        Some(*t)
                    })
                    .collect();
                let case = Case {
                    usable: vec![true; 3],
                    answers: answers.to_vec(),
                    times,
                    frees_at: vec![MAX_REASKS + 1; 3],
                    required: 2,
                    order: Order::Sequential,
                    lead_first: false,
                };
                let (got, _) = run(&case);
                // Expected, stated per case from the rules: the first held node (left to right,
                // before the quorum became unreachable) makes it busy; two failures before
                // reaching a held node make it insufficient; otherwise acquired.
                let first_held = nodes.iter().position(|s| matches!(s, S::Held));
                let failures_before = |k: usize| {
                    nodes[..k]
                        .iter()
                        .filter(|s| matches!(s, S::Refused | S::Hung))
                        .count()
                };
                let expected_kind = match first_held {
                    Some(k) if failures_before(k) < 2 => "busy",
                    _ if failures_before(3) >= 2 => "insufficient",
                    _ => "acquired",
                };
                let kind = match got {
                    Next::Acquired { .. } => "acquired",
                    Next::Busy { .. } => "busy",
                    Next::InsufficientNodes { .. } => "insufficient",
                    Next::BudgetExceeded { .. } => "budget",
                    Next::Send(_) => "unfinished",
                };
                assert_eq!(kind, expected_kind, "nodes {nodes:?}");
                *counts.entry(kind).or_insert(0) += 1;
            }
        }
    }
    assert_eq!(counts.values().sum::<i32>(), 125);
}
