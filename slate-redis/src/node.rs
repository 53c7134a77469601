//! Building blocks for locks that span several independent servers (the combination lock of
//! `slate-combination`): one lock entry on one server, with the single lock's scripts,
//! connection, command timeout and renewal service.
//!
//! Nothing here queues or waits: a multi-node lock drives these calls from its own attempt
//! logic. Every call is bounded by the client's command timeout.
//!
//! ## The node marker
//!
//! A server that restarts without its data forgets every lock entry on it, and a holder that
//! counted that node in its quorum silently loses it. To see this from any client (even one
//! that never talked to the server before the restart), multi-node locks keep one persistent
//! key per server, the *node marker* (`<prefix>node-marker`). [`Node::acquire`]
//! answers [`NodeAcquire::DataLost`] when it is missing or pending, and touches nothing. The
//! multi-node lock then quarantines the node, on the server, for at least the longest lease
//! (every entry it lost has expired by then everywhere else too) and stamps the marker again,
//! with [`Node::mark`].

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use slate_core::metrics::Meter;
use slate_core::{Error, FencingToken, HolderId, LeaseWatch, LockName, LockOptions, Result};

use crate::client::{RedisClient, unexpected_reply};
use crate::primitives::lock::{
    Acquire, Release, Turn, acquire_remote, min_validity, release_remote,
};
use crate::scripts;
use crate::scripts::keys::Keys;
use crate::scripts::request;
use crate::services::notify::ReleaseTarget;
use crate::services::renewal::{self, Renewable};
use slate_aqs::Notifications;

/// The acquire script's answer when the lease is longer than the quarantine the node marker
/// records (nothing was touched).
const LEASE_OVER_QUARANTINE: i64 = -8;

/// The keys of one lock on one server, plus the server's node marker.
///
/// # Examples
///
/// ```
/// use slate_redis::node::NodeKeys;
///
/// let keys = NodeKeys::new("slate:", &slate_redis::LockName::new("orders")?);
/// assert_eq!(keys.lock_key(), b"slate:{orders}");
/// assert_eq!(keys.marker_key(), b"slate:node-marker");
/// # Ok::<(), slate_redis::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct NodeKeys {
    keys: Keys,
    marker: Arc<[u8]>,
}

impl NodeKeys {
    /// The keys of lock `name` under `prefix`.
    #[must_use]
    pub fn new(prefix: &str, name: &LockName) -> Self {
        let mut marker = prefix.as_bytes().to_vec();
        marker.extend_from_slice(b"node-marker");
        NodeKeys {
            keys: Keys::new(prefix, name),
            marker: Arc::from(marker),
        }
    }

    /// The lock hash key.
    #[must_use]
    pub fn lock_key(&self) -> &[u8] {
        &self.keys.lock
    }

    /// The name of the lock whose hash is `key` under `prefix` (the inverse of
    /// [`lock_key`](Self::lock_key)), or `None` when `key` is no lock hash under `prefix`.
    #[must_use]
    pub fn name_of_lock_key<'k>(prefix: &str, key: &'k [u8]) -> Option<&'k [u8]> {
        crate::scripts::keys::name_of_lock_key(prefix, key)
    }

    /// The fencing counter key: the counter of the lock key's cluster hash slot, shared by
    /// every lock whose key hashes there (`<prefix>fence:{<slot tag>}`).
    #[must_use]
    pub fn fence_key(&self) -> &[u8] {
        &self.keys.slot_fence
    }

    /// The node marker key.
    #[must_use]
    pub fn marker_key(&self) -> &[u8] {
        &self.marker
    }
}

/// The answer of [`Node::acquire`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeAcquire {
    /// The entry was created (`count == 1`) or re-entered.
    Acquired {
        /// This node's fencing counter for the holder.
        token: FencingToken,
        /// The holder's reentry count on this node.
        count: u32,
        /// When the entry's lease ends at the latest, on the monotonic clock (taken before
        /// sending, minus a drift allowance).
        deadline: Instant,
        /// The fencing tokens this acquisition reserved, from `token` on: the block asked for,
        /// or less where the node keeps the turn and the row had less left (1 without a
        /// block, and for a re-entry or a replayed answer).
        reserved: u32,
        /// The acquire's request id: [`Node::undo`] gives back exactly this level.
        request: u64,
    },
    /// Another holder holds the lock on this node.
    Busy {
        /// Its remaining lease.
        retry_after: Option<Duration>,
    },
    /// The node marker is missing: the server lost its data. Nothing was touched.
    DataLost,
    /// (A re-entry only, [`Node::reenter`]) the holder has no entry on this node
    /// (its lease ran out there): nothing was touched.
    NotHeld,
}

/// A server's identity, age and replication history, from `INFO`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerInfo {
    /// The server's run id (changes at every start).
    pub run_id: String,
    /// How long the server has been up (second resolution).
    pub uptime: Duration,
    /// Its replication id (`master_replid`): a new one at every start and every promotion of
    /// a replica, so a change means the data may have come from elsewhere. `None` when the
    /// server does not report one.
    pub replication_id: Option<String>,
}

impl ServerInfo {
    /// What the node marker records of the server that wrote it: its run id and replication
    /// id. A marker whose stamp is not the server's own came with data the server did not
    /// write itself: a restart from disk (a snapshot may roll the lock keys and the fencing
    /// counter back), a promoted replica (which may lack its old master's newest grants), or a
    /// replication history that changed since (A -> B -> A).
    ///
    /// # Examples
    ///
    /// ```
    /// # fn stamp(info: &slate_redis::node::ServerInfo) -> String {
    /// info.marker_stamp()
    /// # }
    /// ```
    #[must_use]
    pub fn marker_stamp(&self) -> String {
        format!(
            "{} {}",
            self.run_id,
            self.replication_id.as_deref().unwrap_or("-")
        )
    }
}

/// What [`Node::mark`] writes. A marker's quarantine bound never goes down but by
/// an adoption.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// let _ = slate_redis::node::Mark::Stamp(Some(Duration::from_secs(30)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// Stamp the node usable, with this bound (or the larger one it records): only a node
    /// whose quarantine ran its course on this very server (a `pending` marker of its own,
    /// with no time left), or one already stamped by it. Anything else (the marker gone,
    /// another server's, time left) is left alone and reported.
    Stamp(Option<Duration>),
    /// Start a quarantine of this long on the server's clock (`pending`), with this bound,
    /// unless this very server already runs one, which is kept as it is.
    Pend {
        /// The bound to record (or the larger one the marker records).
        bound: Option<Duration>,
        /// How long the quarantine lasts from now.
        wait: Duration,
    },
    /// Set exactly this bound, stamped usable (an operator's adoption of fresh servers).
    Adopt(Option<Duration>),
}

/// What [`Node::mark`] found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Marked {
    /// The bound the marker now records.
    pub bound: Option<Duration>,
    /// What is left of the server's quarantine of the node (zero: none).
    pub left: Duration,
    /// Whether the marker was written as asked (a refused [`Mark::Stamp`] is not).
    pub written: bool,
}

/// What a node marker records: the [stamp](ServerInfo::marker_stamp) of the server that
/// wrote it (`1` from a Slate version before stamps) and the node set's
/// quarantine, which bounds every lease on the node, and a quarantine under way. Stored as
/// `<stamp> q=<ms>`, or `pending <stamp> <until ms> q=<ms>`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use slate_redis::node::NodeMarker;
/// let m = NodeMarker::parse("3f2a 8c1d q=60000");
/// assert_eq!(m.stamp, "3f2a 8c1d");
/// assert_eq!(m.quarantine, Some(Duration::from_secs(60)));
/// assert_eq!(m.to_string(), "3f2a 8c1d q=60000");
/// assert_eq!(NodeMarker::parse("1").quarantine, None);
/// let p = NodeMarker::parse("pending 3f2a 8c1d 1700000000000 q=60000");
/// assert_eq!((p.stamp.as_str(), p.pending), ("3f2a 8c1d", Some(1_700_000_000_000)));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeMarker {
    /// The stamp of the server that wrote the marker.
    pub stamp: String,
    /// The node set's quarantine when the marker was written (`None` from older versions).
    pub quarantine: Option<Duration>,
    /// A quarantine under way on the server: its end in ms since the epoch on the server's
    /// clock (`pending <stamp> <until> q=<ms>`); the node is not used until then.
    pub pending: Option<u64>,
}

impl NodeMarker {
    /// Reads a marker's value (never fails: an unknown form is all stamp, which no server
    /// matches, so the node is treated as foreign and quarantined once).
    #[must_use]
    pub fn parse(value: &str) -> NodeMarker {
        let (value, pending) = match value.strip_prefix("pending ") {
            Some(rest) => (rest, true),
            None => (value, false),
        };
        let mut m = NodeMarker::parse_stamped(value);
        if pending {
            // '<stamp> <until ms>': the quarantine's end, on the server's clock.
            m.pending = match m.stamp.rsplit_once(' ') {
                Some((stamp, until)) if until.bytes().all(|b| b.is_ascii_digit()) => {
                    // An end past u64 (no script writes one) still reads as pending.
                    let until = until.parse().unwrap_or(0);
                    m.stamp = stamp.to_owned();
                    Some(until)
                }
                _ => Some(0),
            };
        }
        m
    }

    fn parse_stamped(value: &str) -> NodeMarker {
        match value.rsplit_once(" q=") {
            Some((stamp, ms)) if !ms.is_empty() && ms.bytes().all(|b| b.is_ascii_digit()) => {
                NodeMarker {
                    stamp: stamp.to_owned(),
                    quarantine: ms.parse().ok().map(Duration::from_millis),
                    pending: None,
                }
            }
            _ => NodeMarker {
                stamp: value.to_owned(),
                quarantine: None,
                pending: None,
            },
        }
    }
}

impl std::fmt::Display for NodeMarker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(until) = self.pending {
            write!(f, "pending {} {until}", self.stamp)?;
        } else {
            f.write_str(&self.stamp)?;
        }
        if let Some(q) = self.quarantine {
            write!(f, " q={}", q.as_millis())?;
        }
        Ok(())
    }
}

/// What a node's release message wakes (see [`Node::subscribe`]): a multi-node
/// lock's local queue.
pub trait NodeReleased: Send + Sync + 'static {
    /// A release of the lock was published on the node, to anyone or to this queue.
    fn released(&self);

    /// The id of this local queue in the turn (see [`NodeTurn::queue_id`]); messages addressed
    /// to another queue do not wake it. `""` (the default): only messages to anyone.
    fn queue_id(&self) -> &str {
        ""
    }
}

impl<T: NodeReleased> ReleaseTarget for T {
    fn released(&self) {
        NodeReleased::released(self);
    }

    fn queue_id(&self) -> &str {
        NodeReleased::queue_id(self)
    }
}

/// A multi-node lock's local queue in the fair turn between processes, kept on the lock's lead
/// node (see [`Node::acquire_lead`]).
#[derive(Debug)]
pub struct NodeTurn(Turn);

impl NodeTurn {
    /// The turn of a new local queue of a lock with `options` (a fresh queue id; the tenure
    /// and the reservation the single lock uses).
    #[must_use]
    pub fn new(options: &LockOptions) -> Self {
        NodeTurn(Turn::for_queue(options))
    }

    /// This queue's id, as release messages address it.
    #[must_use]
    pub fn queue_id(&self) -> &str {
        &self.0.queue_id
    }
}

/// One lock's state on one server: what [`SingleLock::status`](crate::SingleLock::status)
/// answers, and each node's answer of a combination lock's `status()`.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
/// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
/// let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
/// let status: slate_redis::LockStatus = lock.status().await?;
/// for (holder, levels) in &status.holders {
///     println!("{holder} holds {levels} level(s); token counter at {}", status.fence);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockStatus {
    /// Holders and their reentry counts.
    pub holders: Vec<(String, u32)>,
    /// The lock's remaining lease, `None` when there is no lock.
    pub remaining: Option<Duration>,
    /// The fencing counter.
    pub fence: u64,
    /// `(holder, local holder)`: the hold of `holder` (one of `holders`) was passed inside its
    /// process to `local holder` (lock cohorting), as of the hold's last renewal. A hold's
    /// id is minted for it when it may be passed, so this names who holds the lock now.
    pub passed: Option<(String, String)>,
}

/// The name [`LockStatus`] had when only the combination lock's nodes answered it.
#[deprecated(
    since = "0.1.0",
    note = "renamed LockStatus: every primitive's `status()` answers one"
)]
pub type NodeEntries = LockStatus;

/// What the renewal service needs to renew one node entry.
#[derive(Clone, Debug)]
pub struct NodeHold {
    /// The lease each renewal sets.
    pub lease: Duration,
    /// How often to renew.
    pub period: Duration,
    /// Stop renewing after this long.
    pub max_hold: Option<Duration>,
    /// The deadline the acquisition established.
    pub deadline: Instant,
}

/// The combination lock's calls on one node: a borrowed view of a [`RedisClient`], reached
/// with [`RedisClient::node`], so that they stay off the client's own surface. Every call
/// names the lock by its [`NodeKeys`].
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
/// use slate_redis::node::NodeKeys;
/// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
/// let keys = NodeKeys::new("slate:", &slate_redis::LockName::new("orders")?);
/// let status = client.node().inspect(&keys).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Node<'c>(&'c RedisClient);

impl RedisClient {
    /// This client as a node of a combination lock (see [`Node`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let runtime = client.node().runtime();
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    #[must_use]
    pub fn node(&self) -> Node<'_> {
        Node(self)
    }
}

impl<'c> Node<'c> {
    /// The tokio runtime this client runs its services on (the one current when it was built,
    /// or its own when built outside any).
    #[must_use]
    pub fn runtime(self) -> &'c tokio::runtime::Handle {
        self.0.runtime()
    }

    /// Acquires (or re-enters) `holder`'s entry on this server, checking the node marker.
    ///
    /// A call that fails after its command may have run (a timeout, a broken connection) is
    /// undone by its request id before it returns, as the single lock's: the undo is queued
    /// behind the acquire on its connection.
    ///
    /// # Errors
    ///
    /// Backend failures (timeouts included), unexpected replies.
    ///
    /// # Cancel safety
    ///
    /// The command may or may not have run when the future is dropped; release the node.
    pub async fn acquire(
        self,
        keys: &NodeKeys,
        holder: HolderId,
        lease: Duration,
    ) -> Result<NodeAcquire> {
        self.acquire_as(keys, holder, lease, false, 1, Turn::none())
            .await
    }

    /// As [`acquire_block`](Self::acquire_block), on the lock's **lead node** (its
    /// first usable node), taking part in the fair turn between processes that the single
    /// lock keeps: the node keeps the queue of waiting processes and the turn, and a free
    /// entry reserved for another process's turn answers busy.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_lead(
        self,
        keys: &NodeKeys,
        holder: HolderId,
        lease: Duration,
        block: u32,
        turn: &NodeTurn,
    ) -> Result<NodeAcquire> {
        self.acquire_as(keys, holder, lease, false, block.max(1), &turn.0)
            .await
    }

    /// As [`acquire`](Self::acquire), reserving `block` fencing tokens on a first
    /// acquisition (the counter moves by `block`; the reply's token is the block's first), for
    /// a hold that may be passed to `block - 1` more local holders (lock cohorting).
    ///
    /// # Errors
    ///
    /// Backend failures (timeouts included), unexpected replies.
    ///
    /// # Cancel safety
    ///
    /// The command may or may not have run when the future is dropped; release the node.
    pub async fn acquire_block(
        self,
        keys: &NodeKeys,
        holder: HolderId,
        lease: Duration,
        block: u32,
    ) -> Result<NodeAcquire> {
        self.acquire_as(keys, holder, lease, false, block.max(1), Turn::none())
            .await
    }

    /// Re-enters `holder`'s entry on this server: as [`acquire`](Self::acquire), but
    /// an entry that does not exist is never created ([`NodeAcquire::NotHeld`]), so a level is
    /// only ever added to a hold that still exists.
    ///
    /// # Errors
    ///
    /// Backend failures (timeouts included), unexpected replies.
    ///
    /// # Cancel safety
    ///
    /// The command may or may not have run when the future is dropped; release the node.
    pub async fn reenter(
        self,
        keys: &NodeKeys,
        holder: HolderId,
        lease: Duration,
    ) -> Result<NodeAcquire> {
        self.acquire_as(keys, holder, lease, true, 1, Turn::none())
            .await
    }

    async fn acquire_as(
        self,
        keys: &NodeKeys,
        holder: HolderId,
        lease: Duration,
        reentry: bool,
        block: u32,
        turn: &Turn,
    ) -> Result<NodeAcquire> {
        let sent = Instant::now();
        let (reply, request) = request::send_fresh(|request| {
            let acquire = Acquire {
                holder,
                lease,
                turn,
                marker: Some(&keys.marker),
                request,
                reentry,
                block,
                // A node's counters follow the multi-node lock's own scheme (quarantine and
                // `raise_fence`), not the clock.
                raise: false,
                // An attempt that does not win gives its nodes back by this request's id,
                // retrying until the lease is over (the record must outlive that).
                record_for: Some(lease + self.0.command_timeout() * 2),
            };
            acquire_remote(self.0, &keys.keys, acquire)
        })
        .await;
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                // The script may have run, or may still run (a hung server processes its queue
                // when it resumes): undo it by its request id, queued right behind it on its
                // connection, as the single lock does (issue 28, item 7: the multi-node lock's
                // release of the node came later, on another connection, and could run before
                // the acquire, which then left an entry nobody renewed). Not when the user may
                // not run it (the undo would be refused too).
                if request::worth_undoing(&e) {
                    crate::primitives::lock::compensate(
                        self.0,
                        &keys.keys,
                        false,
                        holder,
                        lease,
                        turn.clone(),
                        request,
                    )
                    .await;
                }
                return Err(e);
            }
        };
        let acquired = |token: i64, count: i64, reserved: i64| match (
            u64::try_from(token),
            u32::try_from(count),
            u32::try_from(reserved),
        ) {
            (Ok(token), Ok(count), Ok(reserved)) => Ok(NodeAcquire::Acquired {
                token: FencingToken::new(token),
                count,
                deadline: renewal::deadline(sent, lease),
                reserved: reserved.clamp(1, block.max(1)),
                request,
            }),
            _ => Err(unexpected_reply("acquire script", self.0.address(), &reply)),
        };
        match reply.as_slice() {
            [1, token] => acquired(*token, 1, 1),
            [1, token, reserved] => acquired(*token, 1, *reserved),
            [2, token, count] => acquired(*token, *count, 1),
            [0, pttl] => Ok(NodeAcquire::Busy {
                retry_after: u64::try_from(*pttl).ok().map(Duration::from_millis),
            }),
            [-2] => Ok(NodeAcquire::DataLost),
            [-4] => Ok(NodeAcquire::NotHeld),
            [LEASE_OVER_QUARANTINE, quarantine] => Err(Error::invalid_input(
                "lease",
                format!(
                    "this lock's {lease:?} lease is longer than the {:?} quarantine recorded in \
                     the node marker of {} (by the adoption of the servers, or the longest \
                     quarantine of the processes that marked them): after a data loss, a \
                     process could use the node again while this lease still ran",
                    Duration::from_millis(u64::try_from(*quarantine).unwrap_or(0)),
                    self.0.address()
                ),
                "use a lease within that quarantine, or adopt the servers again with a longer \
                 one (NodeSet::adopt_fresh_servers with NodeSetOptions::quarantine, or \
                 `slate nodes adopt --quarantine`) while no lock on them is held",
            )),
            // Overtaken again and again by later requests of the same holder, or (-3) a resend
            // that finds its request cancelled by its own undo: busy for now.
            [-3 | request::OVERTAKEN] => Ok(NodeAcquire::Busy { retry_after: None }),
            _ => Err(unexpected_reply("acquire script", self.0.address(), &reply)),
        }
    }

    /// Releases one level of `holder`'s entry: `Some(remaining)`, or `None` when the holder has
    /// no entry (nothing is touched then).
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// The release may or may not have run when the future is dropped.
    pub async fn release(
        self,
        keys: &NodeKeys,
        holder: HolderId,
        lease: Duration,
    ) -> Result<Option<u32>> {
        self.release_as(keys, Release::plain(holder, lease, Turn::none(), false))
            .await
    }

    /// Gives back exactly the level that acquire `request` (see [`NodeAcquire::Acquired`])
    /// took, or, if that acquire has not run, marks it cancelled so that it does nothing when
    /// it does. Unlike [`release`](Self::release), it never touches a level a later
    /// request of the same holder took, so it may be sent again and again: a multi-node lock
    /// gives back the nodes of an attempt that did not win with it (a
    /// retried plain release deleted the entry the holder's next attempt had taken).
    /// Returns the levels left, or `None` when the holder has no entry (or the acquire was
    /// cancelled before it ran).
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Idempotent: send it again.
    pub async fn undo(
        self,
        keys: &NodeKeys,
        holder: HolderId,
        lease: Duration,
        request: u64,
    ) -> Result<Option<u32>> {
        let mut release = Release::plain(holder, lease, Turn::none(), false);
        release.undo = Some(request);
        self.release_as(keys, release).await
    }

    /// As [`release`](Self::release), on the lead node of an entry acquired with
    /// [`acquire_lead`](Self::acquire_lead): at the last level the turn stays with
    /// this process if `local_waiters` and its tenure (8 holds in a row, `holds` of them by
    /// this entry: 1 plus its local passes) allow, else it goes to the first waiting process,
    /// and the release message is addressed to that process only.
    ///
    /// # Errors
    ///
    /// As [`release`](Self::release).
    ///
    /// # Cancel safety
    ///
    /// As [`release`](Self::release).
    pub async fn release_lead(
        self,
        keys: &NodeKeys,
        holder: HolderId,
        lease: Duration,
        turn: &NodeTurn,
        local_waiters: bool,
        holds: u32,
    ) -> Result<Option<u32>> {
        let mut release = Release::plain(holder, lease, &turn.0, local_waiters);
        release.holds = holds.max(1);
        self.release_as(keys, release).await
    }

    async fn release_as(self, keys: &NodeKeys, release: Release<'_>) -> Result<Option<u32>> {
        let holder = release.holder;
        let renewal = &self.0.inner.renewal;
        let generation = renewal.begin_release(&keys.keys.lock, holder);
        let reply = release_remote(self.0, &keys.keys, release).await;
        let freed = matches!(reply, Ok(0));
        renewal.end_release(&keys.keys.lock, holder, generation, freed);
        match reply? {
            // -1: no entry; -2 (an undo): the acquire had not run, and now never will.
            -1 | -2 => Ok(None),
            n => u32::try_from(n)
                .map(Some)
                .map_err(|_| unexpected_reply("release script", self.0.address(), n)),
        }
    }

    /// Raises this server's fencing counter of the lock to at least `token`; returns its value.
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Idempotent: safe to drop and repeat.
    pub async fn raise_fence(self, keys: &NodeKeys, token: FencingToken) -> Result<u64> {
        let call = scripts::call::RaiseFence {
            fence: &keys.keys.slot_fence,
            token: token.get(),
        };
        self.0
            .exec("raise-fence script", |mut c| async move {
                call.eval(&mut c).await
            })
            .await
    }

    /// Writes the node marker with `info`'s [stamp](ServerInfo::marker_stamp) (`info` read
    /// from this server), as `mark` says (see [`Mark`]), and reports the outcome.
    ///
    /// The marker records a quarantine bound, which bounds every new lease on this node: an
    /// acquire whose lease is longer is refused ([`acquire`](Self::acquire)), so
    /// that no lease lost with the node's data outlives the quarantine any process then keeps.
    /// A quarantine runs on the server (`pending`, on its clock): the
    /// acquire script answers [`NodeAcquire::DataLost`] while it runs, for every process, and
    /// a data loss during it erases it, so a second loss is never taken for the first one's
    /// quarantine served.
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Idempotent.
    pub async fn mark(self, keys: &NodeKeys, info: &ServerInfo, mark: Mark) -> Result<Marked> {
        let marker: &[u8] = &keys.marker;
        let stamp = info.marker_stamp();
        let (bound, mode, wait) = match mark {
            Mark::Stamp(q) => (q, "stamp", Duration::ZERO),
            Mark::Pend { bound, wait } => (bound, "pend", wait),
            Mark::Adopt(q) => (q, "adopt", Duration::ZERO),
        };
        let ms = bound.map_or(String::new(), |q| q.as_millis().to_string());
        let wait = wait.as_millis().to_string();
        let call = scripts::call::Mark {
            marker,
            stamp: &stamp,
            bound_ms: &ms,
            mode,
            wait_ms: &wait,
        };
        let reply: Vec<i64> = self
            .0
            .exec("node marker script", |mut c| async move {
                call.eval(&mut c).await
            })
            .await?;
        match reply.as_slice() {
            [bound, left, written] => Ok(Marked {
                bound: u64::try_from(*bound).ok().map(Duration::from_millis),
                left: Duration::from_millis(u64::try_from(*left).unwrap_or(0)),
                written: *written == 1,
            }),
            _ => Err(unexpected_reply(
                "node marker script",
                self.0.address(),
                &reply,
            )),
        }
    }

    /// The node marker (`None` when it is missing).
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub async fn marker(self, keys: &NodeKeys) -> Result<Option<NodeMarker>> {
        let marker: &[u8] = &keys.marker;
        let value = self
            .0
            .exec("GET node marker", |mut c| async move {
                redis::cmd("GET")
                    .arg(&*marker)
                    .query_async::<Option<String>>(&mut c)
                    .await
            })
            .await?;
        Ok(value.map(|v| NodeMarker::parse(&v)))
    }

    /// The server's run id and uptime.
    ///
    /// # Errors
    ///
    /// Backend failures; a reply without the two fields.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub async fn server_info(self) -> Result<ServerInfo> {
        // The default sections: `server` and `replication` (one section per call on servers
        // before Redis 7).
        let text: String = self
            .0
            .exec("INFO", |mut c| async move {
                redis::cmd("INFO").query_async(&mut c).await
            })
            .await?;
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .map(str::trim)
        };
        match (
            field("run_id"),
            field("uptime_in_seconds").and_then(|u| u.parse().ok()),
        ) {
            (Some(run_id), Some(secs)) => Ok(ServerInfo {
                run_id: run_id.to_owned(),
                uptime: Duration::from_secs(secs),
                replication_id: field("master_replid").map(str::to_owned),
            }),
            _ => Err(unexpected_reply(
                "INFO server",
                self.0.address(),
                "no run_id/uptime",
            )),
        }
    }

    /// Deletes the lock on this server whoever holds it, and wakes its waiters. **Unsafe for
    /// correctness** (see [`DistributedLock::force_unlock`](crate::DistributedLock::force_unlock)).
    /// Returns whether there was an entry.
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// The deletion may or may not have happened when the future is dropped.
    pub async fn force_unlock(self, keys: &NodeKeys) -> Result<bool> {
        self.0.force_unlock_of(&keys.keys).await
    }

    /// Registers `holder`'s entry with this client's renewal service and returns its lease.
    /// Registering a holder again moves its deadline and returns a watch on the same lease.
    #[must_use]
    pub fn renew(
        self,
        keys: &NodeKeys,
        holder: HolderId,
        hold: NodeHold,
        label: &str,
        meter: &Meter,
    ) -> LeaseWatch {
        self.0.inner.renewal.register(
            self.0,
            Renewable {
                key: keys.keys.lock.clone(),
                // The turn lives as long as the hold on the lead node, where the fair turn
                // is kept (on the others there is no turn key and the renewal's PEXPIRE of
                // it does nothing): a hold longer than the lease kept its tenure only while
                // the turn key outlived it (issue 28, item 4).
                turn: Some(keys.keys.turn.clone()),
                alias: None,
                leases: None,
                holder,
                lease: hold.lease,
                period: hold.period,
                max_hold: hold.max_hold,
                deadline: hold.deadline,
                label: Arc::from(label),
                meter: meter.clone(),
                // One node's entry: the lock may outlive its loss.
                counts_loss: false,
            },
        )
    }

    /// Hands the renewal of `holder`'s entry to the next local holder after a local pass: the
    /// entry goes on being renewed, with a new lease watch and a max hold that starts now.
    /// `None` (nothing changed) if the entry's lease is lost, capped, or has less than the
    /// minimum validity of a grant of a `lease` lease left (a tenth of it, as for a grant).
    #[must_use]
    pub fn pass_renewal(
        self,
        keys: &NodeKeys,
        holder: HolderId,
        lease: Duration,
    ) -> Option<LeaseWatch> {
        self.0
            .inner
            .renewal
            .pass(&keys.keys.lock, holder, min_validity(lease), holder)
    }

    /// Whether [`pass_renewal`](Self::pass_renewal) would succeed now.
    #[must_use]
    pub fn can_pass_renewal(self, keys: &NodeKeys, holder: HolderId, lease: Duration) -> bool {
        self.0
            .inner
            .renewal
            .can_pass(&keys.keys.lock, holder, min_validity(lease))
    }

    /// Asks this node's pub/sub connection for the lock's release messages (a release of a
    /// level that ends an entry publishes on the lock's channel; a node entry's release is
    /// addressed to anyone): each message calls `target.released()` until
    /// [`unsubscribe`](Self::unsubscribe). `attempt_sent` is when the attempt that
    /// was just told busy was sent: the answer is [`Notifications::Live`] only if the
    /// subscription was confirmed before it (a release after that attempt is then delivered),
    /// [`Notifications::Started`] if it was confirmed now (a release may have slipped in: try
    /// again once), [`Notifications::Off`] if the node's pub/sub connection is down.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a subscription that is confirmed after the future was dropped stays until
    /// `unsubscribe`.
    pub async fn subscribe<T: NodeReleased>(
        self,
        keys: &NodeKeys,
        target: &Arc<T>,
        attempt_sent: Option<Instant>,
    ) -> Notifications {
        let target: Weak<dyn ReleaseTarget> = Arc::downgrade(target) as Weak<T>;
        self.0
            .subscribe_releases(keys.keys.channel.clone(), target, attempt_sent)
            .await
    }

    /// Drops the subscription [`subscribe`](Self::subscribe) made (the lock's queue
    /// is empty).
    pub fn unsubscribe(self, keys: &NodeKeys) {
        self.0
            .inner
            .notifier
            .unsubscribe(self.0, &keys.keys.channel);
    }

    /// Stops renewing `holder`'s entry.
    pub fn stop_renewal(self, keys: &NodeKeys, holder: HolderId) {
        self.0.inner.renewal.deregister(&keys.keys.lock, holder);
    }

    /// Reads the lock's state on this server in one round trip.
    ///
    /// # Errors
    ///
    /// Backend failures, unexpected replies.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub async fn inspect(self, keys: &NodeKeys) -> Result<LockStatus> {
        self.0.status_of(&keys.keys).await
    }
}

impl RedisClient {
    /// Deletes the lock whose keys are `keys` whoever holds it, and wakes its waiters;
    /// answers whether there was an entry.
    pub(crate) async fn force_unlock_of(&self, keys: &Keys) -> Result<bool> {
        let call = scripts::call::ForceUnlock {
            lock: &keys.lock,
            channel: &keys.channel,
            publish: self.publish_arg(),
        };
        let n: i64 = self
            .exec("force-unlock script", |mut c| async move {
                call.eval(&mut c).await
            })
            .await?;
        Ok(n == 1)
    }

    /// Reads the state of the lock whose keys are `keys` in one round trip.
    pub(crate) async fn status_of(&self, keys: &Keys) -> Result<LockStatus> {
        let call = scripts::call::Inspect {
            lock: &keys.lock,
            fence: &keys.slot_fence,
            current: &keys.holder,
        };
        let reply: Vec<redis::Value> = self
            .exec(
                "inspect script",
                |mut c| async move { call.eval(&mut c).await },
            )
            .await?;
        let bad = || unexpected_reply("inspect script", self.address(), "malformed reply");
        let int = |v: &redis::Value| redis::from_redis_value_ref::<i64>(v).map_err(|_| bad());
        let (pttl, fence, passed, rest) = match reply.as_slice() {
            [p, f, passed, rest @ ..] if rest.len() % 2 == 0 => {
                let passed: String = redis::from_redis_value_ref(passed).map_err(|_| bad())?;
                let fence: u64 = redis::from_redis_value_ref(f).map_err(|_| {
                    unexpected_reply(
                        "inspect script",
                        self.address(),
                        format!("a fencing counter of {f:?}, not a token count"),
                    )
                })?;
                (int(p)?, fence, passed, rest)
            }
            _ => return Err(bad()),
        };
        let passed = passed
            .split_once(' ')
            .map(|(h, to)| (h.to_owned(), to.to_owned()));
        let mut holders = Vec::with_capacity(rest.len() / 2);
        for pair in rest.chunks(2) {
            let h: String = redis::from_redis_value_ref(&pair[0]).map_err(|_| bad())?;
            let c = u32::try_from(int(&pair[1])?).map_err(|_| bad())?;
            holders.push((h, c));
        }
        Ok(LockStatus {
            holders,
            remaining: u64::try_from(pttl).ok().map(Duration::from_millis),
            fence,
            passed,
        })
    }
}
