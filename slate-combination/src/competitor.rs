//! The combination lock's remote attempt: the I/O around [`decision::AttemptState`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use futures::future::join_all;
use slate_aqs::{Attempt, Competitor, Notifications};
use slate_core::lease::{self, LeaseWatch};
use slate_core::metrics::Meter;
use slate_core::{
    BackendKind, Error, FencingToken, HolderId, LockOptions, NodeReport, NodeState, Result,
    TimeoutKind,
};
use slate_redis::node::{NodeAcquire, NodeHold, NodeKeys, NodeTurn};
use tokio::runtime::Handle;
use tokio::task::AbortHandle;

use crate::decision::{AttemptState, Next, NodeAnswer, Order};
use crate::lease::{aggregate, combined_deadline};
use crate::node_set::NodeSet;

/// What a successful attempt yields.
pub(crate) struct Grant {
    pub(crate) token: FencingToken,
    /// Nodes held, ascending.
    pub(crate) nodes: Vec<usize>,
    /// Per held node, its lease deadline at acquisition.
    node_deadlines: Vec<Instant>,
    /// The combined lease deadline at acquisition.
    pub(crate) deadline: Instant,
    /// The lease watch (set by `after_acquire`, or by `take_pass` for a passed hold).
    pub(crate) watch: OnceLock<LeaseWatch>,
    /// Local passes this fresh hold may serve (the tokens it reserved after its own).
    pub(crate) passes: u32,
    /// The lead node, when this fresh hold took the process's turn there.
    lead: Option<usize>,
}

/// Fencing tokens a passable first acquisition reserves on every node it takes: one per
/// holder a hold may serve in a row (the single lock's tenure), so that a process's queued
/// tasks share one walk over the nodes per eight holders.
pub(crate) const TOKEN_BLOCK: u32 = 8;

/// One holder's hold of the combination lock in this process.
struct Hold {
    nodes: Vec<usize>,
    /// The current local holder's token.
    token: FencingToken,
    /// The last token of the block the acquisition reserved (= `token` without passes).
    last: u64,
    watch: LeaseWatch,
    aggregator: AbortHandle,
    /// The lead node where the hold took the process's turn (released with the turn).
    lead: Option<usize>,
    /// Local holders this hold served (1 plus its passes): they count towards the tenure.
    holds: u32,
}

pub(crate) struct Inner {
    pub(crate) nodes: NodeSet,
    pub(crate) keys: NodeKeys,
    pub(crate) label: Arc<str>,
    /// Where its acquisitions, holds, renewals and losses are counted.
    pub(crate) meter: Meter,
    pub(crate) options: LockOptions,
    pub(crate) required: usize,
    pub(crate) budget: Duration,
    pub(crate) order: Order,
    pub(crate) runtime: Handle,
    holds: Mutex<HashMap<HolderId, Hold>>,
    /// Release notifications (see `prepare_wait`): what a release message wakes, the node
    /// the last busy attempt found held (whose holder's release publishes there), when that
    /// attempt started, and the nodes subscribed to while the queue is not empty.
    waiters: Weak<crate::lock::Shared>,
    /// This process's place in the fair turn, kept on the lead node.
    pub(crate) turn: NodeTurn,
    /// The node the last busy attempt found held, and when (the parallel round asks the lead
    /// first for a while after, see [`CONTENDED_FOR`]).
    busy: Mutex<Option<(usize, Instant)>>,
    last_attempt: Mutex<Option<Instant>>,
    subscribed: Mutex<Vec<usize>>,
}

/// How long after a busy answer the lock counts as contended: its parallel attempts ask the
/// lead alone first (`decision`'s "Lead first"), so that contenders meet there one by one
/// instead of splitting the nodes between them.
const CONTENDED_FOR: Duration = Duration::from_secs(1);

/// What a node call of an attempt may have left on the node, to give back if the node does
/// not end up in a hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Leftover {
    /// Nothing: no level was taken, or a call that failed was undone by the node client (by
    /// its request id, queued behind it on its connection).
    Nothing,
    /// The level taken by this acquire request: given back by its request id, which never
    /// touches a level a later attempt of the same holder took.
    Level(u64),
    /// A call dropped before the node client could answer or undo it: one level, maybe (a
    /// plain release).
    Unknown,
}

/// The Redis side of the combination lock, driven by the synchronizer.
pub(crate) struct CombinationCompetitor {
    pub(crate) inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update keeps the map consistent, so a poisoned lock is still sound.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CombinationCompetitor {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        nodes: NodeSet,
        keys: NodeKeys,
        label: Arc<str>,
        options: LockOptions,
        required: usize,
        budget: Duration,
        order: Order,
        runtime: Handle,
        waiters: Weak<crate::lock::Shared>,
        meter: Meter,
    ) -> Self {
        CombinationCompetitor {
            inner: Arc::new(Inner {
                waiters,
                turn: NodeTurn::new(&options),
                busy: Mutex::new(None),
                last_attempt: Mutex::new(None),
                subscribed: Mutex::new(Vec::new()),
                nodes,
                keys,
                label,
                meter,
                options,
                required,
                budget,
                order,
                runtime,
                holds: Mutex::new(HashMap::new()),
            }),
        }
    }
}

impl Inner {
    fn op_time(&self) -> Duration {
        self.nodes.options().node_operation_time()
    }

    /// The nodes `holder` holds in this process, if any.
    pub(crate) fn held_nodes(&self, holder: HolderId) -> Option<Vec<usize>> {
        lock(&self.holds).get(&holder).map(|h| h.nodes.clone())
    }

    /// Acquires on node `i`; `reentry`: only one more level of an entry that exists.
    /// One node's acquire (`block` > 1: reserving that many tokens) or re-entry.
    /// `lead`: node `i` is the attempt's lead, where the process's turn is taken.
    /// `verified`: for a first-level acquire, the node's failover count as verified at the
    /// attempt's start (the reply counts only if it is still that); `None` for a re-entry
    /// (compared with the count when it is sent). Also returns what the call may have left on
    /// the node (see [`Leftover`]).
    async fn acquire_on(
        &self,
        i: usize,
        holder: HolderId,
        reentry: bool,
        block: u32,
        lead: bool,
        verified: Option<u64>,
    ) -> (Result<NodeAcquire>, Leftover) {
        let client = &self.nodes.node(i).client;
        let lease = self.options.lease();
        // A first-level acquire compares with the count at the node's verification, read at
        // the attempt's start, not now: a failover between the two, or a re-verification by
        // another attempt meanwhile, would otherwise count the promoted replica's reply
        // (issue 28, item 6, and its review).
        let failovers = verified.unwrap_or_else(|| client.failovers());
        let call = async {
            if reentry {
                client.node().reenter(&self.keys, holder, lease).await
            } else if lead {
                client
                    .node()
                    .acquire_lead(&self.keys, holder, lease, block, &self.turn)
                    .await
            } else if block > 1 {
                client
                    .node()
                    .acquire_block(&self.keys, holder, lease, block)
                    .await
            } else {
                client.node().acquire(&self.keys, holder, lease).await
            }
        };
        // The client's own command timeout (the node operation time) ends the call first, and
        // undoes it by its request id; this bound only catches a call that outlives it (a
        // slow connect), whose future is then dropped without that undo.
        let reply = match tokio::time::timeout(self.op_time() * 3 / 2, call).await {
            Ok(r) => r,
            Err(_) => return (Err(self.node_timeout(i, "acquire")), Leftover::Unknown),
        };
        // The node's Sentinel group failed over under this call: the answer came from a
        // promoted replica, which may lack grants its old master never replicated. It does not
        // count: the node is verified (and quarantined) before its next use, and what the call
        // may have taken is released with the other failed nodes.
        // A failed call was undone by the node client (by its request id); a level taken is
        // given back by its request id if the node does not count.
        let leftover = match &reply {
            Ok(NodeAcquire::Acquired { request, .. }) => Leftover::Level(*request),
            _ => Leftover::Nothing,
        };
        if client.failovers() != failovers {
            return (
                Err(Error::backend(
                    BackendKind::Unavailable,
                    Some(self.nodes.node(i).address().to_owned()),
                    "the node's Sentinel group failed over during the acquisition; the node is \
                     verified again (and quarantined) before it counts",
                    None,
                )),
                leftover,
            );
        }
        (reply, leftover)
    }

    fn node_timeout(&self, i: usize, what: &str) -> Error {
        Error::backend(
            BackendKind::Timeout,
            Some(self.nodes.node(i).address().to_owned()),
            format!(
                "{what} took longer than the node operation time {:?}",
                self.op_time()
            ),
            None,
        )
    }

    /// Releases one level of `holder` on `nodes`, in the order given (callers pass it
    /// descending), going on past failures. Returns each node's report.
    pub(crate) async fn release_nodes(&self, nodes: &[usize], holder: HolderId) -> Vec<NodeReport> {
        // The lead node of a hold that took the turn there is released with the turn.
        let turn = lock(&self.holds)
            .get(&holder)
            .and_then(|h| h.lead.map(|lead| (lead, h.holds)));
        let local_waiters = self.waiters.upgrade().is_some_and(|s| s.sync.waiters() > 0);
        let release_node = |i: usize| {
            let lead = turn
                .filter(|(l, _)| *l == i)
                .map(|(_, holds)| (local_waiters, holds));
            self.release_node(i, holder, lead)
        };
        // The parallel order: one round to every node. A head woken by the leftmost node's
        // message may find another node not freed yet; its parallel attempt then holds the
        // lead and asks that node again (see `decision`).
        self.each_node(nodes.iter().copied(), release_node).await
    }

    /// Runs `call` for each of `items` (nodes, in the order given): all at once in the
    /// pipelined order, one after another in the sequential one.
    async fn each_node<I, T, Fut>(
        &self,
        items: impl IntoIterator<Item = I>,
        call: impl Fn(I) -> Fut,
    ) -> Vec<T>
    where
        Fut: Future<Output = T>,
    {
        match self.order {
            Order::Pipelined => join_all(items.into_iter().map(call)).await,
            Order::Sequential => {
                let mut out = Vec::new();
                for item in items {
                    out.push(call(item).await);
                }
                out
            }
        }
    }

    /// Releases one level of `holder` on node `i`, within the node operation time; `lead`:
    /// (local waiters, holds) when node `i` is the lead where the hold took the turn.
    async fn release_node(
        &self,
        i: usize,
        holder: HolderId,
        lead: Option<(bool, u32)>,
    ) -> NodeReport {
        let node = self.nodes.node(i);
        let lease = self.options.lease();
        let call = async {
            match lead {
                Some((local_waiters, holds)) => {
                    node.client
                        .node()
                        .release_lead(&self.keys, holder, lease, &self.turn, local_waiters, holds)
                        .await
                }
                None => node.client.node().release(&self.keys, holder, lease).await,
            }
        };
        let r = tokio::time::timeout(self.op_time(), call)
            .await
            .unwrap_or_else(|_| Err(self.node_timeout(i, "release")));
        let state = match r {
            Ok(Some(_)) => NodeState::Released,
            Ok(None) => NodeState::NotHeld,
            Err(e) => {
                tracing::debug!(lock = %self.label, node = node.address(), error = %e, "release failed");
                NodeState::Failed {
                    kind: e.backend_kind().unwrap_or(BackendKind::Other),
                    message: e.to_string(),
                }
            }
        };
        NodeReport {
            index: i,
            address: node.address().to_owned(),
            state,
        }
    }

    /// One first-level attempt over the nodes.
    /// A walk over the nodes; `block` > 1 reserves that many fencing tokens for local passes.
    async fn first_level(self: &Arc<Self>, holder: HolderId, block: u32) -> Result<Attempt<Grant>> {
        let start = Instant::now();
        *lock(&self.last_attempt) = Some(start);
        let usable = self.nodes.usable_for_attempt(&self.keys).await;
        let verified: Vec<u64> = (0..usable.len())
            .map(|i| self.nodes.node(i).verified_failovers())
            .collect();
        let usable_count = usable.iter().filter(|u| **u).count();
        // The fair turn between processes is kept on the lead node, which every contender
        // asks first (sequential) or which decides between them (pipelined).
        let lead = usable.iter().position(|u| *u);
        let mut state = AttemptState::new(usable, self.required, self.budget, self.order);
        if self.contended(start) {
            state = state.lead_first();
        }
        let mut next = state.start();
        let mut won: HashMap<usize, (FencingToken, Instant)> = HashMap::new();
        // What to give back, node by node, of what does not end up held.
        let mut left: HashMap<usize, Leftover> = HashMap::new();
        let mut retry_after = None;
        let mut failures: HashMap<usize, Error> = HashMap::new();
        // A node's refusal of this lock's lease (see `Err(e) if e.is_invalid_input()` below).
        let mut invalid: Option<Error> = None;
        // The block every won node reserved: the lead node cuts it to what its turn's row has
        // left (issue 35, defect 10), and the passes must stay within that.
        let mut reserved = block.max(1);
        loop {
            match next {
                Next::Send(batch) => {
                    // A re-ask of nodes a contender held (parallel round): give its release a
                    // moment to land, 1, 2, then 4 ms.
                    if let Some(k) = state.reasks().checked_sub(1) {
                        tokio::time::sleep(Duration::from_millis(1 << k.min(4))).await;
                    }
                    let verified = &verified;
                    let replies = join_all(batch.iter().map(|&i| async move {
                        (
                            i,
                            self.acquire_on(
                                i,
                                holder,
                                false,
                                block,
                                Some(i) == lead,
                                verified.get(i).copied(),
                            )
                            .await,
                        )
                    }))
                    .await;
                    let mut answers = Vec::with_capacity(replies.len());
                    for (i, (reply, leftover)) in replies {
                        if leftover != Leftover::Nothing {
                            left.insert(i, leftover);
                        }
                        let answer = match reply {
                            Ok(NodeAcquire::Acquired {
                                token,
                                deadline,
                                reserved: r,
                                ..
                            }) => {
                                reserved = reserved.min(r);
                                won.insert(i, (token, deadline));
                                NodeAnswer::Acquired
                            }
                            Ok(NodeAcquire::Busy { retry_after: r }) => {
                                retry_after = retry_after.or(r);
                                NodeAnswer::HeldByOther
                            }
                            Ok(NodeAcquire::DataLost) => {
                                self.nodes.mark_data_lost(i);
                                NodeAnswer::Failed
                            }
                            Ok(_) => NodeAnswer::Failed,
                            Err(e) if e.is_invalid_input() => {
                                // A configuration error (this lock's lease is longer than the
                                // quarantine the node's marker records): the node does not
                                // count (it stays usable), and the acquisition fails with the
                                // error if the other nodes make no quorum (review finding: one
                                // node recording a smaller bound failed every acquisition).
                                invalid = Some(e);
                                NodeAnswer::Failed
                            }
                            Err(e) => {
                                // Another server answers behind the node now (a failover, a
                                // restart): verify it at the next attempt (and quarantine it)
                                // rather than bench it for the re-probe interval.
                                let client = &self.nodes.node(i).client;
                                if verified.get(i).is_some_and(|&v| client.failovers() != v) {
                                    self.nodes.mark_data_lost(i);
                                } else {
                                    self.nodes.mark_failed(i, &e);
                                }
                                failures.insert(i, e);
                                NodeAnswer::Failed
                            }
                        };
                        answers.push((i, answer));
                    }
                    next = state.on_answers(&answers, start.elapsed());
                }
                Next::Acquired { held } => {
                    // A node whose command failed was skipped, but the command may have run
                    // (a lost reply, a hung server that runs it later): release it too, in the
                    // background so the acquisition does not wait on a failed node.
                    let stray: Vec<(usize, Leftover)> = state
                        .failed()
                        .iter()
                        .filter_map(|i| Some((*i, *left.get(i)?)))
                        .collect();
                    let lead = lead.filter(|l| held.contains(l));
                    let mut won_it = self.win(holder, start, held, &won, &left, reserved).await;
                    if let Ok(Attempt::Acquired(grant)) = &mut won_it {
                        grant.lead = lead;
                    }
                    if matches!(won_it, Ok(Attempt::Acquired(_))) && !stray.is_empty() {
                        self.give_back_in_background(holder, stray, self.release_until(start));
                    }
                    return won_it;
                }
                Next::Busy { at, release } => {
                    tracing::trace!(lock = %self.label, %holder, at, "busy");
                    *lock(&self.busy) = Some((at, Instant::now()));
                    self.release_attempt(&release, &left, holder, start).await;
                    return Ok(Attempt::Busy { retry_after });
                }
                Next::InsufficientNodes { release } => {
                    self.release_attempt(&release, &left, holder, start).await;
                    return Err(invalid
                        .take()
                        .unwrap_or_else(|| self.insufficient(usable_count, &won, &failures)));
                }
                Next::BudgetExceeded { release } => {
                    self.release_attempt(&release, &left, holder, start).await;
                    return Err(Error::timeout(
                        Arc::clone(&self.label),
                        TimeoutKind::AcquireBudget,
                        self.budget,
                        start.elapsed(),
                    ));
                }
            }
        }
    }

    /// Whether the lock is contended as an attempt starts at `now`: this process has tasks
    /// queued for it, or an attempt found it held less than [`CONTENDED_FOR`] ago.
    fn contended(&self, now: Instant) -> bool {
        self.waiters.upgrade().is_some_and(|s| s.sync.waiters() > 0)
            || lock(&self.busy).is_some_and(|(_, t)| now.duration_since(t) < CONTENDED_FOR)
    }

    /// After the walk was won: establish the fencing token on enough nodes, compute the
    /// combined deadline.
    async fn win(
        self: &Arc<Self>,
        holder: HolderId,
        start: Instant,
        held: Vec<usize>,
        won: &HashMap<usize, (FencingToken, Instant)>,
        left: &HashMap<usize, Leftover>,
        block: u32,
    ) -> Result<Attempt<Grant>> {
        let token = held
            .iter()
            .filter_map(|i| won.get(i))
            .map(|(t, _)| *t)
            .max();
        let Some(token) = token else {
            return Err(Error::backend(
                BackendKind::Other,
                None,
                "won without nodes",
                None,
            ));
        };
        // Write the token back where a node's counter is behind, so that any later holder,
        // whose quorum shares a node with ours, draws a greater one there. With a block, the
        // last token of the block is written back (every node drew a block of the same size,
        // so the lagging ones are those whose first token is below ours).
        let top = FencingToken::new(token.get() + u64::from(block.max(1)) - 1);
        let lagging: Vec<usize> = held
            .iter()
            .copied()
            .filter(|i| won.get(i).is_some_and(|(t, _)| *t < token))
            .collect();
        let raised = join_all(lagging.iter().map(|&i| async move {
            let client = &self.nodes.node(i).client;
            match tokio::time::timeout(self.op_time(), client.node().raise_fence(&self.keys, top))
                .await
            {
                Ok(Ok(v)) => Ok(v >= top.get()),
                Ok(Err(e)) => Err(e),
                Err(_) => Ok(false),
            }
        }))
        .await;
        let fenced =
            held.len() - lagging.len() + raised.iter().filter(|r| matches!(r, Ok(true))).count();
        // Counted from the smallest quorum any process may use (the default one: lower values
        // are refused), not this handle's: a process with a larger quorum fenced on fewer
        // nodes, and a later holder with the default quorum could miss all of them and draw
        // a smaller token (issue 28, item 3).
        let n = self.nodes.len();
        let need = n - crate::decision::default_quorum(n).min(n) + 1;
        let deadlines: Vec<Instant> = held
            .iter()
            .filter_map(|i| won.get(i))
            .map(|(_, d)| *d)
            .collect();
        let deadline = combined_deadline(&deadlines, self.required);
        let mut release: Vec<usize> = left.keys().copied().collect();
        release.sort_unstable_by(|a, b| b.cmp(a));
        if fenced < need {
            self.release_attempt(&release, left, holder, start).await;
            // A configuration error (an ACL user without INCRBY) is reported as itself, not
            // as a shortage of nodes that would never end.
            if let Some(e) = raised
                .into_iter()
                .filter_map(|r| r.err())
                .find(|e| e.backend_kind() == Some(BackendKind::Permission))
            {
                return Err(e);
            }
            return Err(Error::insufficient_nodes(
                Arc::clone(&self.label),
                need,
                fenced,
                self.nodes.report(),
            ));
        }
        match deadline {
            Some(deadline) if deadline > Instant::now() => {
                tracing::debug!(lock = %self.label, %holder, token = token.get(), ?held, "acquired");
                Ok(Attempt::Acquired(Grant {
                    token,
                    node_deadlines: deadlines,
                    nodes: held,
                    deadline,
                    watch: OnceLock::new(),
                    passes: block.max(1) - 1,
                    lead: None,
                }))
            }
            _ => {
                self.release_attempt(&release, left, holder, start).await;
                Err(Error::timeout(
                    Arc::clone(&self.label),
                    TimeoutKind::AcquireBudget,
                    self.budget,
                    start.elapsed(),
                ))
            }
        }
    }

    /// Gives back what an attempt that did not win left on `nodes` (descending): see
    /// [`give_back_now`](Self::give_back_now).
    async fn release_attempt(
        self: &Arc<Self>,
        nodes: &[usize],
        left: &HashMap<usize, Leftover>,
        holder: HolderId,
        start: Instant,
    ) {
        let todo: Vec<(usize, Leftover)> = nodes
            .iter()
            .filter_map(|i| Some((*i, *left.get(i)?)))
            .collect();
        self.give_back_now(&todo, holder, start).await;
    }

    /// Gives back each node's leftover (each level by its acquire's request id, a dropped
    /// call's maybe-level by a plain release), then keeps retrying in the background each node
    /// that did not answer, until the lease of an acquire sent after `start` is over.
    async fn give_back_now(
        self: &Arc<Self>,
        todo: &[(usize, Leftover)],
        holder: HolderId,
        start: Instant,
    ) {
        let failed = self.give_back(todo, holder).await;
        if !failed.is_empty() {
            self.give_back_in_background(holder, failed, self.release_until(start));
        }
    }

    /// Gives back each node's leftover (in the order given), going on past failures; returns
    /// those that failed.
    async fn give_back(
        &self,
        nodes: &[(usize, Leftover)],
        holder: HolderId,
    ) -> Vec<(usize, Leftover)> {
        let lease = self.options.lease();
        let one = |(i, leftover): (usize, Leftover)| async move {
            let client = &self.nodes.node(i).client;
            let call = async {
                match leftover {
                    Leftover::Level(request) => {
                        client.node().undo(&self.keys, holder, lease, request).await
                    }
                    Leftover::Unknown => client.node().release(&self.keys, holder, lease).await,
                    Leftover::Nothing => Ok(None),
                }
            };
            match tokio::time::timeout(self.op_time(), call).await {
                Ok(Ok(_)) => None,
                Ok(Err(e)) => {
                    tracing::debug!(lock = %self.label, node = client.address(), error = %e, "giving back a node failed");
                    Some((i, leftover))
                }
                Err(_) => Some((i, leftover)),
            }
        };
        let failed = self.each_node(nodes.iter().copied(), one).await;
        failed.into_iter().flatten().collect()
    }

    /// Until when giving back an attempt's node is worth retrying: its entry ends with the
    /// lease of an acquire sent after `start`.
    fn release_until(&self, start: Instant) -> Instant {
        start + self.options.lease() + self.op_time()
    }

    /// Gives back `nodes`' leftovers (descending) in the background, retrying each node that
    /// does not answer, every node operation time, until it answers or `until` passes.
    ///
    /// An undo names its acquire's request id, so a retry never touches a level a later
    /// attempt of the same holder took (a waiting call keeps its holder id across attempts,
    /// and a retried plain release would delete the next attempt's entry).
    fn give_back_in_background(
        self: &Arc<Self>,
        holder: HolderId,
        mut nodes: Vec<(usize, Leftover)>,
        until: Instant,
    ) {
        nodes.sort_unstable_by_key(|n| std::cmp::Reverse(n.0));
        let inner = Arc::clone(self);
        let pause = self.op_time();
        drop(self.runtime.spawn(async move {
            loop {
                nodes = inner.give_back(&nodes, holder).await;
                if nodes.is_empty() || Instant::now() + pause >= until {
                    if !nodes.is_empty() {
                        tracing::debug!(%holder, ?nodes, "gave up giving back; the entries expire with the lease");
                    }
                    break;
                }
                tokio::time::sleep(pause).await;
            }
        }));
    }

    /// A re-entry by a holder that holds the lock here: exactly its nodes, all of them, each
    /// only if its entry still exists there (a re-entry never creates an entry).
    ///
    /// Whatever goes wrong, the levels it took are given back before it answers, so that
    /// every node keeps the count the hold had (a hold that ended while
    /// the re-entry was in flight kept the new levels, which blocked contenders for a lease).
    async fn reenter(
        self: &Arc<Self>,
        holder: HolderId,
        nodes: Vec<usize>,
    ) -> Result<Attempt<Grant>> {
        let calls =
            join_all(nodes.iter().map(|&i| async move {
                (i, self.acquire_on(i, holder, true, 1, false, None).await)
            }))
            .await;
        // A level taken by an answer that does not count (the node's server changed under the
        // call) is given back by its request id (review finding: it was left on the node). Not
        // a dropped call's maybe-level: a plain release could take the hold's own level.
        let stray: Vec<(usize, Leftover)> = calls
            .iter()
            .filter(|(_, (r, l))| r.is_err() && matches!(l, Leftover::Level(_)))
            .map(|(i, (_, l))| (*i, *l))
            .collect();
        self.give_back_now(&stray, holder, Instant::now()).await;
        let replies: Vec<(usize, Result<NodeAcquire>)> =
            calls.into_iter().map(|(i, (r, _))| (i, r)).collect();
        let ok: Vec<usize> = replies
            .iter()
            .filter(|(_, r)| matches!(r, Ok(NodeAcquire::Acquired { .. })))
            .map(|(i, _)| *i)
            .collect();
        // Read after the replies: a hold that ended meanwhile gets none of the new levels.
        let hold = lock(&self.holds)
            .get(&holder)
            .map(|h| (h.token, h.watch.clone()));
        if let Some((token, watch)) = &hold
            && ok.len() == nodes.len()
        {
            let grant = Grant {
                token: *token,
                node_deadlines: Vec::new(),
                nodes,
                deadline: watch.deadline(),
                watch: OnceLock::new(),
                passes: 0,
                lead: None,
            };
            let _ = grant.watch.set(watch.clone());
            return Ok(Attempt::Acquired(grant));
        }
        let mut undo = ok.clone();
        undo.reverse();
        self.release_nodes(&undo, holder).await;
        if hold.is_none() {
            return Err(Error::not_held(Arc::clone(&self.label), holder));
        }
        let gone = replies
            .iter()
            .filter(|(_, r)| matches!(r, Ok(NodeAcquire::NotHeld)))
            .count();
        if nodes.len() - gone < self.required {
            // Fewer than a quorum of the held nodes still have the entry: the hold is lost.
            return Err(Error::lease_lost(
                Arc::clone(&self.label),
                holder,
                slate_core::LossReason::EntryGone,
            ));
        }
        let reports = replies
            .into_iter()
            .map(|(i, r)| NodeReport {
                index: i,
                address: self.nodes.node(i).address().to_owned(),
                state: match r {
                    Ok(NodeAcquire::Acquired { .. }) => NodeState::Released,
                    Ok(NodeAcquire::NotHeld) => NodeState::NotHeld,
                    Ok(_) => NodeState::HeldByOther,
                    Err(e) => NodeState::Failed {
                        kind: e.backend_kind().unwrap_or(BackendKind::Other),
                        message: e.to_string(),
                    },
                },
            })
            .collect();
        Err(Error::insufficient_nodes(
            Arc::clone(&self.label),
            self.required,
            0,
            reports,
        ))
    }

    fn insufficient(
        &self,
        usable: usize,
        won: &HashMap<usize, (FencingToken, Instant)>,
        failures: &HashMap<usize, Error>,
    ) -> Error {
        let mut nodes = self.nodes.report();
        for n in &mut nodes {
            if won.contains_key(&n.index) {
                n.state = NodeState::Released;
            } else if let Some(e) = failures.get(&n.index) {
                n.state = NodeState::Failed {
                    kind: e.backend_kind().unwrap_or(BackendKind::Other),
                    message: e.to_string(),
                };
            }
        }
        Error::insufficient_nodes(Arc::clone(&self.label), self.required, usable, nodes)
    }

    /// Starts renewal of a new hold and returns its lease.
    fn start_hold(&self, holder: HolderId, grant: &Grant) -> LeaseWatch {
        let hold = |deadline| NodeHold {
            lease: self.options.lease(),
            period: self.options.renewal_period(),
            max_hold: self.options.max_hold(),
            deadline,
        };
        let watches: Vec<(usize, LeaseWatch)> = grant
            .nodes
            .iter()
            .zip(&grant.node_deadlines)
            .map(|(&i, &d)| {
                let client = &self.nodes.node(i).client;
                (
                    i,
                    client
                        .node()
                        .renew(&self.keys, holder, hold(d), &self.label, &self.meter),
                )
            })
            .collect();
        let (keeper, watch) = lease::channel(grant.deadline);
        let keeper = keeper.with_meter(self.meter.clone());
        let aggregator = self
            .runtime
            .spawn(self.aggregate_then_stop(watches, keeper, holder, grant.nodes.clone()))
            .abort_handle();
        lock(&self.holds).insert(
            holder,
            Hold {
                nodes: grant.nodes.clone(),
                token: grant.token,
                last: grant.token.get() + u64::from(grant.passes),
                watch: watch.clone(),
                aggregator,
                lead: grant.lead,
                holds: 1,
            },
        );
        watch
    }

    /// Hands `remote`'s hold to the next local holder: the next token of the block, and a
    /// lease of its own (every node's renewal is handed on, with the hold's max hold, and a
    /// new aggregation of them). `None` (nothing changed) when the block is used up, or a
    /// node's lease is lost or too short to be worth passing.
    fn pass_hold(&self, remote: HolderId) -> Option<Grant> {
        let mut holds = lock(&self.holds);
        let hold = holds.get_mut(&remote)?;
        if hold.token.get() >= hold.last {
            return None;
        }
        let lease = self.options.lease();
        let client = |i: usize| &self.nodes.node(i).client;
        if !hold
            .nodes
            .iter()
            .all(|&i| client(i).node().can_pass_renewal(&self.keys, remote, lease))
        {
            return None;
        }
        let watches: Vec<(usize, LeaseWatch)> = hold
            .nodes
            .iter()
            .filter_map(|&i| Some((i, client(i).node().pass_renewal(&self.keys, remote, lease)?)))
            .collect();
        let node_deadlines: Vec<Instant> = watches.iter().map(|(_, w)| w.deadline()).collect();
        let deadline = combined_deadline(&node_deadlines, self.required)?;
        let (keeper, watch) = lease::channel(deadline);
        let keeper = keeper.with_meter(self.meter.clone());
        hold.aggregator.abort();
        hold.aggregator = self
            .runtime
            .spawn(self.aggregate_then_stop(watches, keeper, remote, hold.nodes.clone()))
            .abort_handle();
        hold.token = FencingToken::new(hold.token.get() + 1);
        hold.holds += 1;
        hold.watch = watch.clone();
        let grant = Grant {
            token: hold.token,
            nodes: hold.nodes.clone(),
            node_deadlines,
            deadline,
            watch: OnceLock::new(),
            passes: 0,
            lead: None,
        };
        let _ = grant.watch.set(watch);
        Some(grant)
    }

    /// The combined lease of `holder`'s hold over `nodes` ([`aggregate`], which returns only
    /// once the hold is lost); then the renewals of the nodes that survived stop, so that
    /// their entries expire with their lease instead of being renewed, and keeping other
    /// processes out, until the guard is dropped. Aborted at release.
    fn aggregate_then_stop(
        &self,
        watches: Vec<(usize, LeaseWatch)>,
        keeper: slate_core::lease::LeaseKeeper,
        holder: HolderId,
        nodes: Vec<usize>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let required = self.required;
        let (set, keys) = (self.nodes.clone(), self.keys.clone());
        async move {
            // A renewal that found its entry gone: the node may have lost its data (a restart
            // from an older snapshot keeps the marker), so it is verified before its next use.
            aggregate(watches, required, keeper, |i| set.mark_data_lost(i)).await;
            for i in nodes {
                set.node(i).client.node().stop_renewal(&keys, holder);
            }
        }
    }

    /// Ends the renewal of `holder`'s hold.
    fn end_hold(&self, holder: HolderId) {
        if let Some(hold) = lock(&self.holds).remove(&holder) {
            hold.aggregator.abort();
            for i in hold.nodes {
                self.nodes
                    .node(i)
                    .client
                    .node()
                    .stop_renewal(&self.keys, holder);
            }
        }
    }
}

impl Competitor for CombinationCompetitor {
    type Grant = Grant;

    fn grant_deadline(&self, grant: &Grant) -> Option<Instant> {
        Some(grant.deadline)
    }

    fn attempt(
        &self,
        holder: HolderId,
    ) -> impl Future<Output = Result<Attempt<Grant>>> + Send + 'static {
        let inner = self.inner.clone();
        // A holder that holds the lock here re-enters its nodes (never creating an entry: the
        // default `Competitor::reenter` comes here too); anyone else walks the nodes.
        let run = async move {
            match inner.held_nodes(holder) {
                Some(nodes) => inner.reenter(holder, nodes).await,
                None => inner.first_level(holder, 1).await,
            }
        };
        slate_core::detach::on_runtime(self.inner.runtime.clone(), run)
    }

    /// A walk that reserves a block of fencing tokens on every node it takes, so that the
    /// hold can be passed to the process's next queued tasks (see [`Competitor`]).
    fn attempt_passable(
        &self,
        holder: HolderId,
    ) -> impl Future<Output = Result<Attempt<Grant>>> + Send + 'static {
        let inner = self.inner.clone();
        let run = async move { inner.first_level(holder, TOKEN_BLOCK).await };
        slate_core::detach::on_runtime(self.inner.runtime.clone(), run)
    }

    fn pass_budget(&self, grant: &Grant) -> u32 {
        grant.passes
    }

    /// No node is touched: the next token of the block, and a lease of the receiver's own.
    fn take_pass(&self, remote: HolderId, to: HolderId) -> Option<Grant> {
        let grant = self.inner.pass_hold(remote)?;
        tracing::debug!(lock = %self.inner.label, %remote, holder = %to, token = grant.token.get(), "took a passed hold");
        Some(grant)
    }

    /// Ends the hold's renewal and releases its nodes in the background.
    fn drop_pass(&self, remote: HolderId) {
        let Some(mut nodes) = self.inner.held_nodes(remote) else {
            return;
        };
        self.inner.end_hold(remote);
        nodes.reverse();
        let inner = self.inner.clone();
        self.inner.runtime.spawn(async move {
            inner.release_nodes(&nodes, remote).await;
        });
    }

    fn after_acquire(&self, holder: HolderId, grant: &Grant) {
        if grant.watch.get().is_none() {
            let watch = self.inner.start_hold(holder, grant);
            let _ = grant.watch.set(watch);
        }
    }

    fn after_release(&self, holder: HolderId) {
        self.inner.end_hold(holder);
    }

    /// Subscribes to the release messages of the node the last attempt found held: whoever
    /// holds it there releases it. One node, not all: a message per node would wake the head
    /// once per node. In the sequential order a holder releases right to left, so that node
    /// is freed last of those in the head's way; in the pipelined order it is the lead, and a
    /// head woken before the other nodes are free holds the lead and asks them again. If that
    /// node's pub/sub connection is down (a dead, paused or quarantined node), this answers
    /// [`Notifications::Off`] and the head waits its spin wait: never a hang.
    fn prepare_wait(&self) -> impl Future<Output = Notifications> + Send {
        let inner = self.inner.clone();
        async move {
            let busy_at = lock(&inner.busy).map(|(at, _)| at);
            let (Some(i), Some(target)) = (busy_at, inner.waiters.upgrade()) else {
                return Notifications::Off;
            };
            {
                let mut subscribed = lock(&inner.subscribed);
                if !subscribed.contains(&i) {
                    subscribed.push(i);
                }
            }
            let sent = *lock(&inner.last_attempt);
            inner
                .nodes
                .node(i)
                .client
                .node()
                .subscribe(&inner.keys, &target, sent)
                .await
        }
    }

    fn queue_drained(&self) {
        // Also called when an attempt whose caller was dropped ends in the background, with
        // tasks possibly queued by then: their notifications must stay (issue 28, item 12).
        if self
            .inner
            .waiters
            .upgrade()
            .is_some_and(|s| s.sync.waiters() > 0)
        {
            return;
        }
        let nodes = std::mem::take(&mut *lock(&self.inner.subscribed));
        for i in nodes {
            self.inner
                .nodes
                .node(i)
                .client
                .node()
                .unsubscribe(&self.inner.keys);
        }
    }

    fn abandon(&self, holder: HolderId, grant: Grant) {
        let inner = self.inner.clone();
        tracing::debug!(lock = %inner.label, %holder, "releasing an abandoned grant");
        let mut nodes = grant.nodes;
        nodes.reverse();
        self.inner.runtime.spawn(async move {
            inner.release_nodes(&nodes, holder).await;
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use slate_harness::server::RedisServer;

    use crate::{CombinationLock, NodeSet, NodeSetOptions};

    /// `reenter` took a level on every node, then found the hold gone
    /// (its last local level was released while the re-entry was in flight) and returned
    /// `NotHeld` without giving the levels back: they blocked contenders for a whole lease.
    /// The window is forced here by ending the hold, as the outer release's local step does,
    /// right before the re-entry's node calls.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reentry_racing_the_release_leaks_no_level() {
        let servers = RedisServer::start_many(3).expect("redis-server");
        let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
        let nodes = NodeSet::connect(urls, NodeSetOptions::default()).unwrap();
        nodes.adopt_fresh_servers("slate:").await.unwrap();
        let lock = CombinationLock::builder(&nodes, "race").build().unwrap();
        let guard = lock.lock().await.unwrap();
        let holder = guard.holder();
        let inner = &lock.shared.sync.competitor().inner;
        let held = inner.held_nodes(holder).unwrap();
        inner.end_hold(holder);
        let err = inner.reenter(holder, held).await.err().unwrap();
        assert!(err.is_not_held(), "{err:?}");
        // Every node keeps the one level the hold had (not two).
        for server in &servers {
            let count: Option<i64> = redis::from_redis_value(
                server
                    .command(&["HGET", "slate:{race}", &holder.to_string()])
                    .unwrap(),
            )
            .unwrap();
            assert_eq!(count, Some(1), "a re-entry level was left behind");
        }
        guard.unlock().await.unwrap();
        assert!(!lock.is_locked().await.unwrap());
    }
}
