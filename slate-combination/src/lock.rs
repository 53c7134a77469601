//! [`CombinationLock`]: one lock across N independent Redis masters.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures::future::join_all;
use slate_aqs::Synchronizer;
use slate_core::hold::{Held, Release};
use slate_core::lease;
use slate_core::metrics::Meter;
use slate_core::registry::Registered;
use slate_core::{Error, Hold, HolderId, LockName, LockOptions, LockOptionsBuilder, Result, Wait};
use slate_redis::LockStatus;
use slate_redis::node::NodeKeys;
use tokio::runtime::Handle;

use crate::competitor::{CombinationCompetitor, Grant};
use crate::decision::{Order, quorum};
use crate::lease::combined_deadline;
use crate::node_set::NodeSet;

pub(crate) struct Shared {
    pub(crate) sync: Synchronizer<CombinationCompetitor>,
    name: LockName,
}

/// What two handles of one combination lock in one node set must agree on: the options, the
/// quorum, the acquire budget and the order.
impl Registered for Shared {
    type Settings = (LockOptions, usize, Duration, Order);

    fn settings(&self) -> Self::Settings {
        let inner = &self.sync.competitor().inner;
        (
            inner.options.clone(),
            inner.required,
            inner.budget,
            inner.order,
        )
    }

    fn waiters(&self) -> usize {
        self.sync.waiters()
    }
}

/// A release published on a node, to anyone or to this process's queue (its turn), wakes the
/// head of this lock's local queue.
impl slate_redis::node::NodeReleased for Shared {
    fn released(&self) {
        self.sync.notify_released();
    }

    fn queue_id(&self) -> &str {
        self.sync.competitor().inner.turn.queue_id()
    }
}

/// A reentrant, leased, fenced lock held across N independent Redis masters, so that losing
/// nodes (fewer than N − quorum + 1... i.e. while a quorum remains) does not lose the lock.
///
/// ## Behaviour
///
/// - **Attempt**: in the sequential order (the default, Bedrock's), the nodes usable when it
///   starts are taken left to right within the acquire budget; the first node held by another
///   holder ends the attempt ("leftmost weight"); failed nodes are skipped and marked
///   unavailable while the quorum stays reachable. In the pipelined order every usable node is
///   asked at once (one round trip); the leftmost node that answered (the lead) decides between
///   contenders: held by another, the attempt is busy; ours, with a quorum, it is won; ours,
///   short of a quorum because contenders hold other nodes, those nodes are asked again (up to
///   3 times) while the contenders, lacking the lead, let go. Every unsuccessful exit releases
///   every node that may hold an entry of this attempt. See [`decision`](crate::decision) for
///   both tables.
/// - **Quorum**: at least `max(2, ⌊N/2⌋ + 1)` nodes (a lower setting is refused).
/// - **Renewal**: exactly the nodes held, each by its node's renewal service; the lease is the
///   quorum-th latest node deadline, and it is lost when fewer than the quorum can be renewed.
/// - **Release**: one level on every node held, going on past failures
///   ([`Error::ReleaseIncomplete`] lists them): right to left in the sequential order, all at
///   once (one round trip) in the pipelined order.
/// - **Fencing token**: see the crate documentation.
/// - **Waiting**: local waiters queue in FIFO order; only the head attempts. A head told busy
///   subscribes to the release messages of the node its attempt found held (every node
///   publishes when an entry's last level is released) and retries when one arrives, or after
///   the spin wait or the holder's remaining lease, whichever is shorter. One node, not all:
///   in the sequential order a holder releases its nodes right to left, so the node the head
///   found held is freed last of those it has to get past, and one message per release wakes
///   the head once; in the pipelined order the node is the lead, and a head woken before the
///   holder's other nodes are free holds the lead and asks them again. A
///   notifying node that dies or hangs leaves the head on its spin wait, never hung. The
///   subscription is dropped when the local queue drains.
/// - **Local passes (lock cohorting)**: callers whose holder is minted by the call
///   (`lock()`, `try_lock_for()`, `try_lock_until()` and the blocking twins, outside a
///   [`HolderId::scope`]) that wait behind each other share holds: the one that wins from the
///   queue reserves a block of 8 fencing tokens on every node it takes (the lagging nodes get
///   the block's last token written back), and at its release the next queued caller is
///   handed the whole set of held nodes without touching any node: its own next token, its
///   own lease (each node's renewal handed on, its max hold restarting), up to 8 holders in a
///   row. Such a hold's entries carry a holder id minted for it, which no caller is given.
///   Named holders always walk the nodes.
/// - **Drop** of a guard without `unlock()` releases in the background.
///
/// # Examples
///
/// ```no_run
/// use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
///
/// # #[tokio::main] async fn main() -> slate_combination::Result<()> {
/// let nodes = NodeSet::connect(
///     ["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"],
///     NodeSetOptions::default(),
/// )?;
/// let lock = CombinationLock::builder(&nodes, "orders").build()?;
/// let guard = lock.lock().await?;
/// println!("token {}", guard.fencing_token());
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct CombinationLock {
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for CombinationLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CombinationLock")
            .field("name", &self.shared.name)
            .finish_non_exhaustive()
    }
}

/// Builds a [`CombinationLock`]; see [`CombinationLock::builder`].
#[derive(Debug)]
#[must_use]
pub struct CombinationLockBuilder {
    nodes: NodeSet,
    name: Vec<u8>,
    options: LockOptionsBuilder,
    required: Option<usize>,
    budget: Option<Duration>,
    order: Order,
}

slate_core::lock_options_setters!(
    CombinationLockBuilder,
    slate_combination,
    setup = "# use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};\n# let nodes = NodeSet::connect([\"redis://127.0.0.1:7001\", \"redis://127.0.0.1:7002\", \"redis://127.0.0.1:7003\"], NodeSetOptions::default())?;",
    start = "CombinationLock::builder(&nodes, \"orders\")",
    [
        lease,
        renewal_period,
        spin_wait,
        max_hold,
        key_prefix,
        options
    ],
);

impl CombinationLockBuilder {
    /// Sets the quorum (default `max(2, ⌊N/2⌋ + 1)`; lower values are refused).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// let lock = CombinationLock::builder(&nodes, "orders").required_nodes(3).build()?;
    /// # Ok(()) }
    /// ```
    pub fn required_nodes(mut self, n: usize) -> Self {
        self.required = Some(n);
        self
    }

    /// Sets the acquire budget (default node operation time × N + 100 ms).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// let lock = CombinationLock::builder(&nodes, "orders").acquire_budget(std::time::Duration::from_millis(300)).build()?;
    /// # Ok(()) }
    /// ```
    pub fn acquire_budget(mut self, budget: Duration) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Sets the acquisition order (default [`Order::Sequential`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// use slate_combination::Order;
    /// let lock = CombinationLock::builder(&nodes, "orders").order(Order::Pipelined).build()?;
    /// # Ok(()) }
    /// ```
    pub fn order(mut self, order: Order) -> Self {
        self.order = order;
        self
    }

    /// Validates everything and builds the lock. Its background work runs on the current
    /// tokio runtime, or outside any on the node clients' own.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the bad option: invalid common options or name, a quorum
    /// below the majority or above N, an acquire budget of zero or not shorter than the lease,
    /// a node-set quarantine shorter than the lease.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// let lock = CombinationLock::builder(&nodes, "orders").build()?;
    /// # Ok(()) }
    /// ```
    pub fn build(self) -> Result<CombinationLock> {
        let options = self.options.build()?;
        let name = LockName::new(&self.name)?;
        let n = self.nodes.len();
        let required = quorum(n, self.required)?;
        let set_opts = self.nodes.options();
        let op = set_opts.node_operation_time();
        let budget = self.budget.unwrap_or_else(|| {
            op.checked_mul(u32::try_from(n).unwrap_or(u32::MAX))
                .and_then(|d| d.checked_add(Duration::from_millis(100)))
                .unwrap_or(Duration::MAX)
        });
        let lease = options.lease();
        if budget.is_zero() || budget >= lease {
            return Err(Error::invalid_input(
                "acquire budget",
                format!("{budget:?} must be positive and shorter than the {lease:?} lease"),
                "use a longer lease or a shorter budget (the default is node operation time x N + 100ms)",
            ));
        }
        if set_opts.quarantine_enabled() && set_opts.quarantine() < lease {
            return Err(Error::invalid_input(
                "quarantine",
                format!(
                    "the node set's quarantine {:?} is shorter than this lock's {lease:?} lease",
                    set_opts.quarantine()
                ),
                "give the node set a quarantine of at least the longest lease of its locks",
            ));
        }
        // The runtime the node clients run their services on, whichever runtime builds this
        // handle: every handle of the lock shares one state, which must not depend on the
        // runtime of the first one built (it may end while the others live on).
        let runtime = self.nodes.runtime().clone();
        let keys = NodeKeys::new(options.key_prefix(), &name);
        let key = keys.lock_key().to_vec();
        let settings = (options, required, budget, self.order);
        let nodes = self.nodes.clone();
        let shared = self.nodes.inner.locks.get_or_create(
            key,
            &name,
            settings,
            |(options, required, budget, order): (LockOptions, usize, Duration, Order)| {
                let label: Arc<str> = Arc::from(name.to_string());
                let spin = options.spin_wait();
                let meter = Meter::for_lock("combination", "combination", &name);
                Arc::new_cyclic(|me: &Weak<Shared>| {
                    let competitor = CombinationCompetitor::new(
                        nodes,
                        keys,
                        label.clone(),
                        options,
                        required,
                        budget,
                        order,
                        runtime,
                        me.clone(),
                        meter.clone(),
                    );
                    Shared {
                        sync: Synchronizer::new(Arc::clone(&label), competitor, spin)
                            .with_meter(meter),
                        name: name.clone(),
                    }
                })
            },
        )?;
        Ok(CombinationLock { shared })
    }
}

impl CombinationLock {
    /// Starts building a lock named `name` on `nodes`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002"], NodeSetOptions::default())?;
    /// let lock = CombinationLock::builder(&nodes, "orders")
    ///     .lease(std::time::Duration::from_secs(10))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn builder(nodes: &NodeSet, name: impl AsRef<[u8]>) -> CombinationLockBuilder {
        CombinationLockBuilder {
            nodes: nodes.clone(),
            name: name.as_ref().to_vec(),
            options: LockOptionsBuilder::default(),
            required: None,
            budget: None,
            order: Order::Sequential,
        }
    }

    fn inner(&self) -> &crate::competitor::Inner {
        &self.shared.sync.competitor().inner
    }

    /// The quorum.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// # let lock = CombinationLock::builder(&nodes, "orders").build()?;
    /// assert_eq!(lock.required_nodes(), 2); // of 3
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn required_nodes(&self) -> usize {
        self.inner().required
    }

    /// The node set.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// # let lock = CombinationLock::builder(&nodes, "orders").build()?;
    /// assert_eq!(lock.nodes().len(), 3);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn nodes(&self) -> &NodeSet {
        &self.inner().nodes
    }

    /// The options.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// # let lock = CombinationLock::builder(&nodes, "orders").build()?;
    /// assert_eq!(lock.options().key_prefix(), "slate:");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn options(&self) -> &LockOptions {
        &self.inner().options
    }

    /// The local owner and its depth (this process only).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// # let lock = CombinationLock::builder(&nodes, "orders").build()?;
    /// assert!(lock.local_owner().is_none());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn local_owner(&self) -> Option<(HolderId, u32)> {
        self.shared.sync.owner()
    }

    /// Tasks of this process waiting for the lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// # let lock = CombinationLock::builder(&nodes, "orders").build()?;
    /// assert_eq!(lock.local_waiters(), 0);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn local_waiters(&self) -> usize {
        self.shared.sync.waiters()
    }

    /// The name [`status`](Self::status) had before every primitive's status read took one
    /// name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// # let lock = CombinationLock::builder(&nodes, "orders").build()?;
    /// let per_node = lock.status().await;
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads).
    #[deprecated(since = "0.1.0", note = "renamed status, as on every lock")]
    pub async fn inspect(&self) -> Vec<Result<LockStatus>> {
        self.status().await
    }

    /// The lock's state on every node (`Err` for a node that did not answer in time).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// # let lock = CombinationLock::builder(&nodes, "orders").build()?;
    /// for (i, node) in lock.status().await.into_iter().enumerate() {
    ///     println!("node {i}: {node:?}");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn status(&self) -> Vec<Result<LockStatus>> {
        let inner = self.inner();
        let op = inner.nodes.options().node_operation_time();
        join_all((0..inner.nodes.len()).map(|i| async move {
            let client = &inner.nodes.node(i).client;
            tokio::time::timeout(op, client.node().inspect(&inner.keys))
                .await
                .unwrap_or_else(|_| {
                    Err(Error::backend(
                        slate_core::BackendKind::Timeout,
                        Some(client.address().to_owned()),
                        "inspect timed out",
                        None,
                    ))
                })
        }))
        .await
    }

    /// The answers of at least a quorum of nodes, or `InsufficientNodes`.
    async fn quorum_entries(&self) -> Result<Vec<LockStatus>> {
        let answers: Vec<LockStatus> = self
            .status()
            .await
            .into_iter()
            .filter_map(Result::ok)
            .collect();
        let required = self.required_nodes();
        if answers.len() < required {
            return Err(Error::insufficient_nodes(
                self.shared.name.to_string(),
                required,
                answers.len(),
                self.nodes().report(),
            ));
        }
        Ok(answers)
    }

    slate_core::blocking_waiting_methods!(
        "CombinationLock",
        CombinationLockGuard,
        setup = "# use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};\n\
                 # fn main() -> Result<(), Box<dyn std::error::Error>> {\n\
                 # let rt = tokio::runtime::Runtime::new()?;\n\
                 # let lock = rt.block_on(async {\n\
                 #     let nodes = NodeSet::connect([\"redis://10.0.0.1:6379\", \"redis://10.0.0.2:6379\", \"redis://10.0.0.3:6379\"], NodeSetOptions::default())?;\n\
                 #     CombinationLock::builder(&nodes, \"orders\").build()\n\
                 # })?;",
        errors = "too few nodes, backend failures",
    );

    fn guard(&self, holder: HolderId, grant: &Grant) -> CombinationLockGuard {
        let watch = grant
            .watch
            .get()
            .cloned()
            .unwrap_or_else(|| lease::channel(grant.deadline).1);
        let depth = match self.shared.sync.owner() {
            Some((h, d)) if h == holder => d,
            _ => 1,
        };
        CombinationLockGuard {
            held: Held::new(
                Hold::new(holder, grant.token, depth, watch),
                Releasing {
                    lock: self.clone(),
                    nodes: grant.nodes.clone(),
                },
            ),
        }
    }
}

/// The operations (also available through [`DistributedLock`](crate::DistributedLock) for generic code; no import is
/// needed to call them on a `CombinationLock`).
impl CombinationLock {
    /// The lock's name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// # let lock = CombinationLock::builder(&nodes, "orders").build()?;
    /// assert_eq!(lock.name().as_bytes(), b"orders");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn name(&self) -> &LockName {
        &self.shared.name
    }

    /// Acquires the lock for `holder`, waiting as `wait` allows (the one call the others are
    /// made of).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// # let lock = CombinationLock::builder(&nodes, "orders").build()?;
    /// use slate_combination::{HolderId, Wait};
    /// let guard = lock.acquire(HolderId::new(), Wait::Immediate).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] for a busy lock under [`Wait::Immediate`]; [`Error::Timeout`] when the
    /// deadline of [`Wait::Until`] passes; [`Error::InsufficientNodes`] when fewer than the
    /// quorum of nodes can be used; backend errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future removes the caller from the local queue and passes on
    /// any wake-up it had; nodes taken for a dropped future are released, never leaked.
    pub async fn acquire(&self, holder: HolderId, wait: Wait) -> Result<CombinationLockGuard> {
        self.acquire_for(Some(holder), wait).await
    }

    // Also `acquire_for` and `blocking_acquire`; from a plain thread, the competitor runs each
    // attempt's I/O on the lock's runtime.
    slate_core::waiting_methods!(
        sync = shared.sync,
        CombinationLockGuard,
        setup = "# use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};\n\
                 # #[tokio::main(flavor = \"current_thread\")] async fn main() -> slate_combination::Result<()> {\n\
                 # let nodes = NodeSet::connect([\"redis://127.0.0.1:7001\", \"redis://127.0.0.1:7002\", \"redis://127.0.0.1:7003\"], NodeSetOptions::default())?;\n\
                 # let lock = CombinationLock::builder(&nodes, \"orders\").build()?;",
        errors = "too few nodes; backend failures",
    );

    /// Whether some holder holds the lock on at least a quorum of nodes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// # let lock = CombinationLock::builder(&nodes, "orders").build()?;
    /// println!("locked: {}", lock.is_locked().await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InsufficientNodes`] when fewer than a quorum of nodes answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads).
    pub async fn is_locked(&self) -> Result<bool> {
        let entries = self.quorum_entries().await?;
        Ok(entries.iter().filter(|e| !e.holders.is_empty()).count() >= self.required_nodes())
    }

    /// How many times `holder` holds the lock on a quorum of nodes (0 if not at all).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// # let lock = CombinationLock::builder(&nodes, "orders").build()?;
    /// let guard = lock.lock().await?;
    /// assert_eq!(lock.hold_count(guard.holder()).await?, 1);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InsufficientNodes`] when fewer than a quorum of nodes answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads).
    pub async fn hold_count(&self, holder: HolderId) -> Result<u32> {
        // A local holder that was passed the hold counts on its remote holder's entries.
        let id = self.shared.sync.remote_holder(holder).to_string();
        let counts: Vec<u32> = self
            .quorum_entries()
            .await?
            .iter()
            .filter_map(|e| e.holders.iter().find(|(h, _)| *h == id).map(|(_, c)| *c))
            .collect();
        Ok(if counts.len() >= self.required_nodes() {
            counts.into_iter().min().unwrap_or(0)
        } else {
            0
        })
    }

    /// Whether `holder` holds the lock on a quorum of nodes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// # let lock = CombinationLock::builder(&nodes, "orders").build()?;
    /// let guard = lock.lock().await?;
    /// assert!(lock.is_held_by(guard.holder()).await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InsufficientNodes`] when fewer than a quorum of nodes answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads).
    pub async fn is_held_by(&self, holder: HolderId) -> Result<bool> {
        Ok(self.hold_count(holder).await? > 0)
    }

    /// The remaining lease of whoever holds the lock (the quorum-th latest node deadline), or
    /// `None` when it is free.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// # let lock = CombinationLock::builder(&nodes, "orders").build()?;
    /// if let Some(left) = lock.remaining_lease().await? {
    ///     println!("held for another {left:?}");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InsufficientNodes`] when fewer than a quorum of nodes answer.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (reads).
    pub async fn remaining_lease(&self) -> Result<Option<Duration>> {
        let now = Instant::now();
        let ends: Vec<Instant> = self
            .quorum_entries()
            .await?
            .iter()
            .filter(|e| !e.holders.is_empty())
            .filter_map(|e| e.remaining.map(|r| now + r))
            .collect();
        Ok(combined_deadline(&ends, self.required_nodes())
            .map(|d| d.saturating_duration_since(now)))
    }

    /// Deletes the lock on every node whoever holds it; returns the holds dropped (1 when any node had an entry, else 0).
    /// **Unsafe for correctness**: the holder keeps running its critical section. Meant for
    /// operators clearing a stuck lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// # let lock = CombinationLock::builder(&nodes, "orders").build()?;
    /// let deleted = lock.force_unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The first node's error, when no node deleted anything.
    ///
    /// # Cancel safety
    ///
    /// The deletions may or may not have happened when the future is dropped.
    pub async fn force_unlock(&self) -> Result<u64> {
        let inner = self.inner();
        let results = join_all(
            (0..inner.nodes.len())
                .map(|i| inner.nodes.node(i).client.node().force_unlock(&inner.keys)),
        )
        .await;
        let mut any = false;
        let mut first_err = None;
        for r in results {
            match r {
                Ok(deleted) => any |= deleted,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) if !any => Err(e),
            _ => Ok(u64::from(any)),
        }
    }
}

slate_core::delegate_distributed_lock!(CombinationLock, CombinationLockGuard);

/// One level of a [`CombinationLock`] hold. It dereferences to its [`Hold`]: holder, fencing
/// token, depth, lease and loss signal; [`nodes`](Self::nodes) are the nodes held.
///
/// Dropping it without [`unlock`](Self::unlock) releases in the background.
///
/// # Examples
///
/// ```no_run
/// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
/// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
/// let lock = CombinationLock::builder(&nodes, "orders").build()?;
/// let guard = lock.lock().await?;
/// println!("token {} on nodes {:?}", guard.fencing_token(), guard.nodes());
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the lock in the background; call unlock().await to see the outcome"]
pub struct CombinationLockGuard {
    held: Held<Releasing>,
}

/// The name this guard had before the guards were named after their locks.
#[deprecated(since = "0.1.0", note = "renamed CombinationLockGuard, after its lock")]
pub type CombinationGuard = CombinationLockGuard;

/// How a [`CombinationLockGuard`] ends: the lock handle and the nodes held.
pub(crate) struct Releasing {
    lock: CombinationLock,
    nodes: Vec<usize>,
}

impl Release for Releasing {
    fn release(
        &mut self,
        hold: &Hold,
    ) -> impl Future<Output = Result<u32>> + Send + 'static + use<> {
        // Called once, as the guard ends: the list is not read again.
        release(
            self.lock.clone(),
            hold.holder(),
            std::mem::take(&mut self.nodes),
        )
    }

    fn runtime(&self) -> &Handle {
        &self.lock.inner().runtime
    }

    fn label(&self) -> &str {
        &self.lock.inner().label
    }

    fn meter(&self) -> Option<&Meter> {
        Some(&self.lock.inner().meter)
    }
}

impl CombinationLockGuard {
    /// The lock this guard holds.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// # let lock = CombinationLock::builder(&nodes, "orders").build()?;
    /// let guard = lock.lock().await?;
    /// assert_eq!(guard.lock().name(), lock.name());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn lock(&self) -> &CombinationLock {
        &self.held.backend().lock
    }

    /// The nodes held, ascending ([`LockGuard::nodes`](slate_core::LockGuard::nodes), without the import).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// # let lock = CombinationLock::builder(&nodes, "orders").build()?;
    /// let guard = lock.lock().await?;
    /// println!("holding nodes {:?}", guard.nodes());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn nodes(&self) -> &[usize] {
        &self.held.backend().nodes
    }

    /// Acquires one more level for the same holder (on exactly the same nodes).
    ///
    /// # Errors
    ///
    /// As [`DistributedLock::lock`](crate::DistributedLock::lock); `InsufficientNodes` when a held node could not re-enter.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`DistributedLock::acquire`](crate::DistributedLock::acquire).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_combination::Result<()> {
    /// # let nodes = NodeSet::connect(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"], NodeSetOptions::default())?;
    /// # let lock = CombinationLock::builder(&nodes, "orders").build()?;
    /// let outer = lock.lock().await?;
    /// let inner = outer.reenter().await?;
    /// assert_eq!(inner.depth(), 2);
    /// # Ok(()) }
    /// ```
    pub fn reenter(&self) -> impl Future<Output = Result<CombinationLockGuard>> + Send + '_ {
        self.lock().lock_as(self.holder())
    }
}

/// Releases one level for `holder`: the last level goes to the next local waiter if it can be
/// passed (lock cohorting: no node is touched); otherwise every node is released (as the
/// hold's remote holder), then the local level, whatever the outcome.
async fn release(lock: CombinationLock, holder: HolderId, nodes: Vec<usize>) -> Result<u32> {
    if lock.shared.sync.try_pass(holder) {
        tracing::debug!(lock = %lock.shared.name, %holder, "passed to the next local holder");
        return Ok(0);
    }
    let remote = lock.shared.sync.remote_holder(holder);
    let mut order = nodes;
    order.reverse();
    let inner = lock.inner();
    let reports = inner.release_nodes(&order, remote).await;
    let remaining = lock.shared.sync.release(holder);
    let failed = reports
        .iter()
        .any(|r| matches!(r.state, slate_core::NodeState::Failed { .. }));
    let released = reports
        .iter()
        .filter(|r| r.state == slate_core::NodeState::Released)
        .count();
    if failed {
        return Err(Error::release_incomplete(
            lock.shared.name.to_string(),
            reports,
        ));
    }
    if released < inner.required {
        return Err(Error::not_held(lock.shared.name.to_string(), holder));
    }
    Ok(remaining)
}

slate_core::guard_surface!(
    CombinationLockGuard,
    slate_combination,
    setup = "# use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};\n# let nodes = NodeSet::connect([\"redis://127.0.0.1:7001\", \"redis://127.0.0.1:7002\", \"redis://127.0.0.1:7003\"], NodeSetOptions::default())?;\n# let lock = CombinationLock::builder(&nodes, \"orders\").build()?;\nlet guard = lock.lock().await?;",
    blocking_setup = "# use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};\n# let rt = tokio::runtime::Runtime::new()?;\n# let lock = rt.block_on(async {\n#     let nodes = NodeSet::connect([\"redis://10.0.0.1:6379\", \"redis://10.0.0.2:6379\"], NodeSetOptions::default())?;\n#     CombinationLock::builder(&nodes, \"orders\").build()\n# })?;\nlet guard = lock.blocking_lock()?;",
    nodes = |guard| guard.nodes(),
);
