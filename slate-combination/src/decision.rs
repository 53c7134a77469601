//! The combination lock's attempt as a pure state machine: which node to ask next, and when
//! the attempt is won, lost, or must give up. No I/O and no clock: the caller sends the
//! commands, measures time, and feeds the answers back.
//!
//! ## The table
//!
//! One attempt walks the nodes usable for it (fixed when the attempt starts) from left to
//! right. At each answer, the first matching row decides:
//!
//! | answer at node i | decision |
//! | --- | --- |
//! | held by another holder | **leftmost weight**: the attempt loses at once ([`Next::Busy`]); release every node that may hold our entry, in reverse order |
//! | any answer, but the budget is spent | [`Next::BudgetExceeded`]; release, in reverse order |
//! | failed (timeout, connection) and the nodes held plus the usable nodes right of i cannot reach the quorum | [`Next::InsufficientNodes`]; release, in reverse order |
//! | failed, quorum still reachable | skip node i (the caller marks it unavailable), continue |
//! | acquired, a usable node remains | continue with the next usable node |
//! | acquired at the last usable node | [`Next::Acquired`] (the nodes held reach the quorum by construction) |
//!
//! Before the first command: fewer usable nodes than the quorum → [`Next::InsufficientNodes`]
//! with nothing to release.
//!
//! "Nodes that may hold our entry" are the nodes that answered *acquired* and the nodes whose
//! command failed (a timeout may hide a command that ran and a reply that was lost). A node
//! that answered *held by another* certainly holds nothing of ours and is not released.
//!
//! ## The parallel round ([`Order::Pipelined`])
//!
//! Every usable node is asked at once (or the lead first, see "Lead first" below). With all
//! the answers in, the *lead* is the leftmost
//! node that did not fail (the node every contender reaches first), and the first matching
//! row decides:
//!
//! | answers | decision |
//! | --- | --- |
//! | the budget is spent | [`Next::BudgetExceeded`]; release what may hold our entry |
//! | the lead is held by another holder | **leftmost weight**: [`Next::Busy`] at the lead; release what may hold our entry |
//! | we hold the lead and at least the quorum | [`Next::Acquired`] with the nodes held (nodes held by others are not ours and stay untouched) |
//! | nodes held plus nodes held by others cannot reach the quorum (the rest failed) | [`Next::InsufficientNodes`]; release |
//! | we hold the lead, other nodes are held by others, and fewer than [`MAX_REASKS`] re-asks were made | ask those nodes again ([`Next::Send`]): their holders lack the lead, so they are contenders that lose at it and release, or a holder whose quorum lacks the lead (it was down for it) |
//! | the same after [`MAX_REASKS`] re-asks | [`Next::Busy`] at the first node held by another; release |
//!
//! Two contenders never both keep waiting for each other: the one without the lead gives up
//! at once (unless the lead failed for it, when both re-ask at most [`MAX_REASKS`] times).
//! Safety does not rest on the order: two holders need intersecting quorums, and a node has
//! one holder. The caller waits a little before each re-ask (see the competitor), so that the
//! losing contender's release can land.
//!
//! Before the table: answers are recorded first, so every node that may hold our entry is
//! released on any unsuccessful exit, as in the sequential order.
//!
//! ### Lead first ([`AttemptState::lead_first`])
//!
//! While the lock is contended, a parallel attempt asks the lead (the leftmost usable node)
//! alone first. Held by another holder there, it loses at once with nothing to give back;
//! otherwise (acquired, or failed) every other usable node is asked at once, and the table
//! above decides on all the answers, as if they had come in one round. Contenders then meet
//! at the lead one by one instead of each taking a part of the nodes and giving it back (a
//! split vote, which re-asks and releases resolve at the cost of a round trip or more each):
//! two round trips for an acquisition under contention, against one uncontended. Safety does
//! not depend on it (quorums intersect whatever the order).

use std::time::Duration;

use slate_core::{Error, Result};

/// The order in which an attempt sends its acquire commands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Order {
    /// One node after the other, left to right (Bedrock's order).
    #[default]
    Sequential,
    /// Every usable node at once (one round trip), the leftmost node that answered deciding
    /// between contenders (see the parallel table in [`decision`](crate::decision)); releases
    /// go to every node at once too.
    Pipelined,
}

/// How a node answered one acquire command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeAnswer {
    /// Our entry was created or re-entered.
    Acquired,
    /// Another holder holds the lock on this node.
    HeldByOther,
    /// The command failed: timeout, connection error, or an unexpected reply. The command may
    /// have run.
    Failed,
}

/// What the caller does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Send the acquire command to these nodes: one node in sequential order; in pipelined
    /// order every usable node at once (the lead alone first, then all the others together,
    /// with [`AttemptState::lead_first`]), then re-asks of nodes other holders held.
    Send(Vec<usize>),
    /// The attempt won; these are the nodes held, ascending.
    Acquired {
        /// Nodes held, ascending.
        held: Vec<usize>,
    },
    /// Another holder holds node `at`; release `release` (descending) and wait.
    Busy {
        /// The node held by another holder.
        at: usize,
        /// Nodes to release, descending.
        release: Vec<usize>,
    },
    /// Too few nodes could be used; release `release` (descending) and fail.
    InsufficientNodes {
        /// Nodes to release, descending.
        release: Vec<usize>,
    },
    /// The attempt's budget is spent; release `release` (descending) and fail.
    BudgetExceeded {
        /// Nodes to release, descending.
        release: Vec<usize>,
    },
}

impl Next {
    /// Whether the attempt is over (anything but [`Next::Send`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_combination::decision::{AttemptState, NodeAnswer, Next};
    /// use slate_combination::Order;
    /// use std::time::Duration;
    ///
    /// let mut a = AttemptState::new(vec![true; 3], 2, Duration::from_secs(1), Order::Sequential);
    /// assert!(!a.start().is_final()); // the first command goes out
    /// ```
    #[must_use]
    pub fn is_final(&self) -> bool {
        !matches!(self, Next::Send(_))
    }

    /// The nodes to release, descending (empty for `Send` and `Acquired`).
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_combination::decision::{AttemptState, NodeAnswer, Next};
    /// use slate_combination::Order;
    /// use std::time::Duration;
    ///
    /// let mut a = AttemptState::new(vec![true; 3], 2, Duration::from_secs(1), Order::Sequential);
    /// a.start();
    /// let next = a.on_answers(&[(0, NodeAnswer::HeldByOther)], Duration::ZERO);
    /// assert!(next.is_final());
    /// assert!(next.release().is_empty()); // nothing was held
    /// ```
    #[must_use]
    pub fn release(&self) -> &[usize] {
        match self {
            Next::Busy { release, .. }
            | Next::InsufficientNodes { release }
            | Next::BudgetExceeded { release } => release,
            Next::Send(_) | Next::Acquired { .. } => &[],
        }
    }
}

/// How many times a parallel attempt that holds the lead asks again the nodes other holders
/// held (see the parallel table), before it gives up as busy.
pub const MAX_REASKS: u32 = 3;

/// The default quorum for `n` nodes: `max(2, ⌊n/2⌋ + 1)`.
///
/// # Examples
///
/// ```
/// use slate_combination::decision::default_quorum;
///
/// assert_eq!(default_quorum(2), 2);
/// assert_eq!(default_quorum(3), 2);
/// assert_eq!(default_quorum(4), 3);
/// assert_eq!(default_quorum(5), 3);
/// ```
#[must_use]
pub fn default_quorum(n: usize) -> usize {
    (n / 2 + 1).max(2)
}

/// Checks a node count and a requested quorum, returning the quorum to use.
///
/// # Errors
///
/// [`Error::InvalidInput`] when there are fewer than 2 nodes, or the requested quorum is below
/// the majority (it would let two holders hold disjoint node sets) or above `n`.
///
/// # Examples
///
/// ```
/// use slate_combination::decision::quorum;
///
/// assert_eq!(quorum(5, None)?, 3);
/// assert_eq!(quorum(5, Some(4))?, 4);
/// assert!(quorum(4, Some(2)).is_err()); // Bedrock's fixed 2: disjoint pairs possible
/// assert!(quorum(1, None).is_err());
/// # Ok::<(), slate_combination::Error>(())
/// ```
pub fn quorum(n: usize, requested: Option<usize>) -> Result<usize> {
    if n < 2 {
        return Err(Error::invalid_input(
            "nodes",
            format!("{n} node(s) given"),
            "give at least 2 independent Redis masters (use the single lock for one)",
        ));
    }
    let floor = default_quorum(n);
    match requested {
        None => Ok(floor),
        Some(q) if q < floor => Err(Error::invalid_input(
            "required nodes",
            format!(
                "{q} of {n} is less than a majority, so two holders could hold disjoint node sets"
            ),
            format!("use at least {floor} (the default)"),
        )),
        Some(q) if q > n => Err(Error::invalid_input(
            "required nodes",
            format!("{q} is more than the {n} nodes configured"),
            format!("use at most {n}"),
        )),
        Some(q) => Ok(q),
    }
}

/// One attempt's state: feed it answers, it says what to do next.
///
/// # Examples
///
/// ```
/// use slate_combination::decision::{AttemptState, NodeAnswer, Next, Order};
/// use std::time::Duration;
///
/// let budget = Duration::from_millis(250);
/// let mut a = AttemptState::new(vec![true, true, true], 2, budget, Order::Sequential);
/// assert_eq!(a.start(), Next::Send(vec![0]));
/// let ms = Duration::from_millis;
/// assert_eq!(a.on_answers(&[(0, NodeAnswer::Acquired)], ms(1)), Next::Send(vec![1]));
/// assert_eq!(a.on_answers(&[(1, NodeAnswer::Failed)], ms(51)), Next::Send(vec![2]));
/// assert_eq!(
///     a.on_answers(&[(2, NodeAnswer::Acquired)], ms(52)),
///     Next::Acquired { held: vec![0, 2] }
/// );
/// ```
#[derive(Clone, Debug)]
pub struct AttemptState {
    usable: Vec<bool>,
    required: usize,
    budget: Duration,
    order: Order,
    /// Nodes sent to and not yet answered.
    pending: Vec<usize>,
    /// The next node index to consider for sending (all below were sent or skipped).
    cursor: usize,
    held: Vec<usize>,
    failed: Vec<usize>,
    /// (Parallel round) nodes another holder held at their last answer, ascending.
    others: Vec<usize>,
    /// (Parallel round) re-asks made.
    reasks: u32,
    /// (Parallel round) the lead is asked alone first ([`lead_first`](Self::lead_first)).
    lead_first: bool,
    done: bool,
}

impl AttemptState {
    /// A new attempt over nodes `usable[i]` (false: unavailable or quarantined, skipped),
    /// needing `required` nodes within `budget`.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_combination::decision::{AttemptState, NodeAnswer, Next};
    /// use slate_combination::Order;
    /// use std::time::Duration;
    ///
    /// // Node 1 is quarantined; 2 of 3 are needed.
    /// let a = AttemptState::new(vec![true, false, true], 2, Duration::from_secs(1), Order::Sequential);
    /// ```
    #[must_use]
    pub fn new(usable: Vec<bool>, required: usize, budget: Duration, order: Order) -> Self {
        AttemptState {
            usable,
            required,
            budget,
            order,
            pending: Vec::new(),
            cursor: 0,
            held: Vec::new(),
            failed: Vec::new(),
            others: Vec::new(),
            reasks: 0,
            lead_first: false,
            done: false,
        }
    }

    /// (Parallel round) asks the lead alone first, then every other usable node at once (see
    /// the module's "Lead first"); for an attempt on a contended lock. No effect in the
    /// sequential order, which asks the lead first anyway.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_combination::decision::{AttemptState, NodeAnswer, Next, Order};
    /// use std::time::Duration;
    ///
    /// let budget = Duration::from_secs(1);
    /// let mut a = AttemptState::new(vec![true; 3], 2, budget, Order::Pipelined).lead_first();
    /// assert_eq!(a.start(), Next::Send(vec![0]));
    /// assert_eq!(a.on_answers(&[(0, NodeAnswer::Acquired)], Duration::ZERO), Next::Send(vec![1, 2]));
    /// let answers = [(1, NodeAnswer::Acquired), (2, NodeAnswer::HeldByOther)];
    /// assert_eq!(a.on_answers(&answers, Duration::ZERO), Next::Acquired { held: vec![0, 1] });
    ///
    /// // Held by another holder at the lead: lost at once, nothing to give back.
    /// let mut b = AttemptState::new(vec![true; 3], 2, budget, Order::Pipelined).lead_first();
    /// b.start();
    /// let lost = b.on_answers(&[(0, NodeAnswer::HeldByOther)], Duration::ZERO);
    /// assert_eq!(lost, Next::Busy { at: 0, release: vec![] });
    /// ```
    #[must_use]
    pub fn lead_first(mut self) -> Self {
        self.lead_first = true;
        self
    }

    /// How many times this (parallel) attempt asked again nodes that other holders held; the
    /// caller waits a little before each such round.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_combination::decision::{AttemptState, NodeAnswer, Next, Order};
    /// use std::time::Duration;
    ///
    /// let mut a = AttemptState::new(vec![true; 3], 2, Duration::from_secs(1), Order::Pipelined);
    /// assert_eq!(a.start(), Next::Send(vec![0, 1, 2])); // one round
    /// let answers = [(0, NodeAnswer::Acquired), (1, NodeAnswer::HeldByOther), (2, NodeAnswer::Failed)];
    /// assert_eq!(a.on_answers(&answers, Duration::ZERO), Next::Send(vec![1]));
    /// assert_eq!(a.reasks(), 1);
    /// ```
    #[must_use]
    pub fn reasks(&self) -> u32 {
        self.reasks
    }

    /// The first step.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_combination::decision::{AttemptState, NodeAnswer, Next};
    /// use slate_combination::Order;
    /// use std::time::Duration;
    ///
    /// let mut a = AttemptState::new(vec![true; 3], 2, Duration::from_secs(1), Order::Sequential);
    /// assert_eq!(a.start(), Next::Send(vec![0])); // leftmost first
    /// ```
    #[must_use]
    pub fn start(&mut self) -> Next {
        let usable = self.usable.iter().filter(|u| **u).count();
        if usable < self.required {
            return self.finish(|release| Next::InsufficientNodes { release });
        }
        self.send_next()
    }

    /// Applies the answers to the commands last sent (all of them, in any order) after
    /// `elapsed` since the attempt's first command, and returns the next step.
    ///
    /// # Panics
    ///
    /// Debug builds assert that the answers match the nodes last sent to.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_combination::decision::{AttemptState, NodeAnswer, Next};
    /// use slate_combination::Order;
    /// use std::time::Duration;
    ///
    /// let mut a = AttemptState::new(vec![true; 3], 2, Duration::from_secs(1), Order::Sequential);
    /// a.start();
    /// assert_eq!(a.on_answers(&[(0, NodeAnswer::Acquired)], Duration::ZERO), Next::Send(vec![1]));
    /// ```
    pub fn on_answers(&mut self, answers: &[(usize, NodeAnswer)], elapsed: Duration) -> Next {
        debug_assert!(!self.done, "answers after the attempt ended");
        let mut answers = answers.to_vec();
        answers.sort_by_key(|(node, _)| *node);
        debug_assert_eq!(
            answers.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            self.pending,
            "answers must match the nodes last sent to"
        );
        self.pending.clear();
        if self.order == Order::Pipelined {
            return self.on_parallel_answers(&answers, elapsed);
        }
        // Record every answer first: whatever the decision, every node that may hold our
        // entry must be released.
        let mut busy_at = None;
        for &(node, answer) in &answers {
            match answer {
                NodeAnswer::Acquired => self.held.push(node),
                NodeAnswer::Failed => self.failed.push(node),
                NodeAnswer::HeldByOther => {
                    busy_at.get_or_insert(node);
                }
            }
        }
        if let Some(at) = busy_at {
            return self.finish(|release| Next::Busy { at, release });
        }
        if elapsed > self.budget {
            return self.finish(|release| Next::BudgetExceeded { release });
        }
        let reachable = self.held.len() + self.remaining_usable();
        if reachable < self.required {
            return self.finish(|release| Next::InsufficientNodes { release });
        }
        self.send_next()
    }

    /// Nodes held so far, ascending.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_combination::decision::{AttemptState, NodeAnswer, Next};
    /// use slate_combination::Order;
    /// use std::time::Duration;
    ///
    /// let mut a = AttemptState::new(vec![true; 3], 2, Duration::from_secs(1), Order::Sequential);
    /// a.start();
    /// a.on_answers(&[(0, NodeAnswer::Acquired)], Duration::ZERO);
    /// assert_eq!(a.held(), &[0]);
    /// ```
    #[must_use]
    pub fn held(&self) -> &[usize] {
        &self.held
    }

    /// Nodes whose command failed in this attempt, ascending.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_combination::decision::{AttemptState, NodeAnswer, Next};
    /// use slate_combination::Order;
    /// use std::time::Duration;
    ///
    /// let mut a = AttemptState::new(vec![true; 3], 2, Duration::from_secs(1), Order::Sequential);
    /// a.start();
    /// a.on_answers(&[(0, NodeAnswer::Failed)], Duration::ZERO);
    /// assert_eq!(a.failed(), &[0]);
    /// ```
    #[must_use]
    pub fn failed(&self) -> &[usize] {
        &self.failed
    }

    /// The parallel table (module docs).
    fn on_parallel_answers(&mut self, answers: &[(usize, NodeAnswer)], elapsed: Duration) -> Next {
        self.others.clear();
        for &(node, answer) in answers {
            match answer {
                NodeAnswer::Acquired => self.held.push(node),
                NodeAnswer::Failed => self.failed.push(node),
                NodeAnswer::HeldByOther => self.others.push(node),
            }
        }
        self.held.sort_unstable();
        self.failed.sort_unstable();
        if elapsed > self.budget {
            return self.finish(|release| Next::BudgetExceeded { release });
        }
        if self.remaining_usable() > 0 {
            // Lead first: the lead alone answered. Another holder's: lost at once (the
            // leftmost weight). Otherwise every other usable node, at once.
            if let Some(&at) = self.others.first() {
                return self.finish(|release| Next::Busy { at, release });
            }
            return self.send_next();
        }
        let lead = self.held.iter().chain(&self.others).min().copied();
        if let Some(&first_other) = self.others.first()
            && lead == Some(first_other)
        {
            return self.finish(|release| Next::Busy {
                at: first_other,
                release,
            });
        }
        if self.held.len() >= self.required {
            self.done = true;
            return Next::Acquired {
                held: self.held.clone(),
            };
        }
        if self.others.is_empty() || self.held.len() + self.others.len() < self.required {
            return self.finish(|release| Next::InsufficientNodes { release });
        }
        if self.reasks >= MAX_REASKS {
            let at = self.others[0];
            return self.finish(|release| Next::Busy { at, release });
        }
        self.reasks += 1;
        self.pending.clone_from(&self.others);
        Next::Send(self.others.clone())
    }

    fn remaining_usable(&self) -> usize {
        self.usable.iter().skip(self.cursor).filter(|u| **u).count()
    }

    fn send_next(&mut self) -> Next {
        let rest: Vec<usize> = (self.cursor..self.usable.len())
            .filter(|&i| self.usable[i])
            .collect();
        let batch = match self.order {
            Order::Pipelined if !(self.lead_first && self.cursor == 0) => rest,
            Order::Pipelined | Order::Sequential => rest.into_iter().take(1).collect(),
        };
        match batch.last() {
            None => {
                debug_assert!(self.held.len() >= self.required, "walk ended below quorum");
                self.done = true;
                Next::Acquired {
                    held: self.held.clone(),
                }
            }
            Some(&last) => {
                self.cursor = last + 1;
                self.pending.clone_from(&batch);
                Next::Send(batch)
            }
        }
    }

    fn finish(&mut self, make: impl FnOnce(Vec<usize>) -> Next) -> Next {
        self.done = true;
        let mut release: Vec<usize> = self.held.iter().chain(&self.failed).copied().collect();
        release.sort_unstable_by(|a, b| b.cmp(a));
        make(release)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeAnswer::*;

    const B: Duration = Duration::from_millis(250);
    const MS: Duration = Duration::from_millis(1);

    /// cargo-mutants found these outside the unit and property tests (doc tests
    /// covered some; `quorum(n, Some(majority))` nothing at all).
    #[test]
    fn quorum_bounds_and_the_accessors() {
        assert_eq!(
            (1..=7).map(default_quorum).collect::<Vec<_>>(),
            [2, 2, 2, 3, 3, 4, 4]
        );
        assert_eq!(
            quorum(5, Some(3)).unwrap(),
            3,
            "the majority itself is allowed"
        );
        assert_eq!(quorum(4, Some(3)).unwrap(), 3);
        assert!(quorum(5, Some(2)).is_err());
        assert!(quorum(5, Some(6)).is_err());
        let mut a = AttemptState::new(vec![true; 3], 2, B, Order::Sequential);
        let first = a.start();
        assert!(!first.is_final());
        assert!(first.release().is_empty());
        a.on_answers(&[(0, Acquired)], MS);
        assert_eq!(a.held(), &[0]);
        let busy = a.on_answers(&[(1, HeldByOther)], MS);
        assert!(busy.is_final());
        assert_eq!(busy.release(), &[0]);
        let mut f = AttemptState::new(vec![true; 3], 2, B, Order::Sequential);
        let _ = f.start();
        f.on_answers(&[(0, Failed)], MS);
        assert_eq!(f.failed(), &[0]);
        let mut two = AttemptState::new(vec![true; 3], 2, B, Order::Sequential);
        let _ = two.start();
        two.on_answers(&[(0, Acquired)], MS);
        let next = two.on_answers(&[(1, Acquired)], MS);
        assert!(next.release().is_empty());
        assert_eq!(two.held(), &[0, 1]);
    }

    #[test]
    fn busy_at_second_node_releases_the_first() {
        let mut a = AttemptState::new(vec![true; 3], 2, B, Order::Sequential);
        assert_eq!(a.start(), Next::Send(vec![0]));
        assert_eq!(a.on_answers(&[(0, Acquired)], MS), Next::Send(vec![1]));
        assert_eq!(
            a.on_answers(&[(1, HeldByOther)], MS),
            Next::Busy {
                at: 1,
                release: vec![0]
            }
        );
    }

    #[test]
    fn one_node_left_is_insufficient_at_once() {
        let mut a = AttemptState::new(vec![true, false, false], 2, B, Order::Sequential);
        assert_eq!(a.start(), Next::InsufficientNodes { release: vec![] });
        let mut a = AttemptState::new(vec![true; 3], 2, B, Order::Sequential);
        assert_eq!(a.start(), Next::Send(vec![0]));
        assert_eq!(a.on_answers(&[(0, Acquired)], MS), Next::Send(vec![1]));
        assert_eq!(a.on_answers(&[(1, Failed)], MS), Next::Send(vec![2]));
        assert_eq!(
            a.on_answers(&[(2, Failed)], MS),
            Next::InsufficientNodes {
                release: vec![2, 1, 0]
            }
        );
    }

    #[test]
    fn failure_early_stops_when_quorum_is_out_of_reach() {
        let mut a = AttemptState::new(vec![true; 3], 2, B, Order::Sequential);
        assert_eq!(a.start(), Next::Send(vec![0]));
        assert_eq!(a.on_answers(&[(0, Failed)], MS), Next::Send(vec![1]));
        assert_eq!(
            a.on_answers(&[(1, Failed)], MS),
            Next::InsufficientNodes {
                release: vec![1, 0]
            }
        );
    }

    #[test]
    fn budget_is_checked_after_every_answer() {
        let mut a = AttemptState::new(vec![true; 3], 2, B, Order::Sequential);
        assert_eq!(a.start(), Next::Send(vec![0]));
        assert_eq!(
            a.on_answers(&[(0, Acquired)], B + MS),
            Next::BudgetExceeded { release: vec![0] }
        );
    }

    #[test]
    fn pipelined_sends_every_node_at_once() {
        let mut a = AttemptState::new(vec![true, true, false, true, true], 3, B, Order::Pipelined);
        assert_eq!(a.start(), Next::Send(vec![0, 1, 3, 4]));
        // The lead (node 0) is held by another: busy there at once.
        assert_eq!(
            a.on_answers(
                &[(4, Acquired), (1, Failed), (3, Acquired), (0, HeldByOther)],
                MS
            ),
            Next::Busy {
                at: 0,
                release: vec![4, 3, 1]
            }
        );
    }

    #[test]
    fn the_lead_waits_out_a_contender_then_gives_up() {
        // We hold the lead (node 0); node 1 is held by a contender, node 2 failed: quorum 2
        // needs node 1, asked again up to MAX_REASKS times.
        let mut a = AttemptState::new(vec![true; 3], 2, B, Order::Pipelined);
        assert_eq!(a.start(), Next::Send(vec![0, 1, 2]));
        let mut next = a.on_answers(&[(0, Acquired), (1, HeldByOther), (2, Failed)], MS);
        for k in 1..=MAX_REASKS {
            assert_eq!(next, Next::Send(vec![1]), "re-ask {k}");
            assert_eq!(a.reasks(), k);
            next = a.on_answers(&[(1, HeldByOther)], MS);
        }
        assert_eq!(
            next,
            Next::Busy {
                at: 1,
                release: vec![2, 0]
            }
        );
        // The contender lets go at the second re-ask: acquired.
        let mut a = AttemptState::new(vec![true; 3], 2, B, Order::Pipelined);
        assert_eq!(a.start(), Next::Send(vec![0, 1, 2]));
        assert_eq!(
            a.on_answers(&[(0, Acquired), (1, HeldByOther), (2, Failed)], MS),
            Next::Send(vec![1])
        );
        assert_eq!(a.on_answers(&[(1, HeldByOther)], MS), Next::Send(vec![1]));
        assert_eq!(
            a.on_answers(&[(1, Acquired)], MS),
            Next::Acquired { held: vec![0, 1] }
        );
    }

    #[test]
    fn the_lead_with_a_quorum_does_not_wait() {
        let mut a = AttemptState::new(vec![true; 3], 2, B, Order::Pipelined);
        assert_eq!(a.start(), Next::Send(vec![0, 1, 2]));
        assert_eq!(
            a.on_answers(&[(0, Acquired), (1, HeldByOther), (2, Acquired)], MS),
            Next::Acquired { held: vec![0, 2] }
        );
    }

    #[test]
    fn quorum_rules() {
        assert_eq!(quorum(2, None).unwrap(), 2);
        assert_eq!(quorum(3, Some(3)).unwrap(), 3);
        assert!(
            quorum(3, Some(1))
                .unwrap_err()
                .to_string()
                .contains("at least 2")
        );
        assert!(quorum(3, Some(4)).unwrap_err().is_invalid_input());
    }
}
