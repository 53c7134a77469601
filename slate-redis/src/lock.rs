//! The single lock: one Redis master, reentrant, leased, renewed, notified.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, LazyLock, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use slate_aqs::{Attempt, Competitor, Notifications, Synchronizer};
use slate_core::{
    BackendKind, Error, FencingToken, HolderId, LeaseWatch, LockName, LockOptions,
    LockOptionsBuilder, LossReason, Result, Wait,
};
use tracing::Instrument;

use crate::client::{RedisClient, lock, unexpected_reply};
use crate::conn;
use crate::guard::SingleLockGuard;
use crate::keys::Keys;
use crate::node::LockStatus;
use crate::notify::ReleaseTarget;
use crate::renewal::{self, Renewable};
use crate::request;
use crate::scripts::{self, ACQUIRE, FORCE_UNLOCK, RELEASE};
use slate_core::registry::Registered;

/// A distributed, reentrant, leased lock on one Redis master.
///
/// Built once with [`SingleLock::builder`] and cloned wherever it is needed (cloning is an
/// `Arc` clone). Every handle built for the same name (and key prefix) from one
/// [`RedisClient`] shares one local queue: inside a process, waiters queue up in FIFO order and
/// only the head talks to Redis.
///
/// The operations are inherent methods (`lock`, `try_lock`, `try_lock_for`, `lock_as`, the
/// queries, and the blocking twins for threads); [`DistributedLock`](crate::DistributedLock) offers the same for
/// generic code, and [`AnyLock`](crate::AnyLock) for locks of several backends side by side.
///
/// ## Behaviour
///
/// - **Reentrancy** is keyed by [`HolderId`]: the same holder locking again raises the count
///   kept in Redis and gets the same fencing token. Re-enter with [`SingleLockGuard::reenter`],
///   [`DistributedLock::lock_as`](crate::DistributedLock::lock_as) or inside a [`HolderId::scope`].
/// - **Fencing tokens** strictly increase across holders (a persistent counter next to the
///   lock, `<prefix>{<name>}:fence`, which must never be deleted) and stay fixed across
///   re-entry. The counter restarts if the server loses its data. It costs about 60 bytes of
///   Redis memory plus its key's length per lock name ever used; for per-entity names, see
///   [`SingleLockBuilder::fence_expiry`] (an expiring counter seeded from the server clock).
/// - **Local passes (lock cohorting)**: callers whose holder is minted by the call itself
///   (`lock()`, `try_lock_for()`, `try_lock_until()` and the blocking twins, outside a
///   [`HolderId::scope`]) that wait behind each other share Redis holds: the one that wins a
///   hold from the queue reserves a block of 8 fencing tokens (one `INCRBY`), and at its
///   release the next waiter of the process is handed the hold without a round trip, up to
///   the tenure (8 holders in a row); then a real release lets other processes take their
///   turn. Each holder gets its own token (the next of the block; a later acquisition is
///   above the whole block), its own lease watch and max hold, and re-enters on its own
///   token. Such a hold is kept in Redis under a holder id minted for it, which no caller is
///   ever given, so that no other process can enter it, whatever holder id it names; `slate
///   status` shows that id. A caller that finds the lock free acquires as itself, and named
///   holders (`lock_as`, `acquire`, a scope) always acquire and release in Redis under their
///   own id, so a holder id shared between processes keeps its meaning.
/// - **Renewal**: while held, the client's renewal service renews the lease every renewal
///   period (all locks of a client in one pipeline per tick). It never re-creates a missing
///   entry. The guard's lease deadline moves with every renewal; its loss signal fires with
///   `EntryGone` when the entry is gone, `DeadlineExpired` when no renewal succeeded before the
///   deadline, `MaxHoldReached` at the deadline after the optional max hold stopped renewal.
/// - **Lease deadline** = the instant taken *before* the command was sent + lease − a drift
///   allowance of 1% of the lease + 2 ms; the server's TTL ends no earlier than that.
/// - **Notification**: the release script publishes on `<prefix>{<name>}:released`; while the
///   lock has local waiters the client's pub/sub connection is subscribed and wakes the queue
///   head at once. Without it (pub/sub down or not configured) the head retries after
///   min(spin wait, holder's remaining lease).
/// - **Drop**: a guard dropped without `unlock()` is released by a task spawned on the
///   client's runtime; nothing blocks. If the release cannot reach Redis the entry ends with
///   its lease (renewal stops at once).
/// - **Failed release**: the local queue moves on whatever the outcome; a release that could
///   not reach Redis leaves the entry to expire with its lease.
///
/// # Examples
///
/// ```no_run
/// use slate_redis::{RedisClient, SingleLock};
/// use std::time::Duration;
///
/// # #[tokio::main] async fn main() -> slate_redis::Result<()> {
/// let client = RedisClient::open("redis://127.0.0.1:6379")?;
/// let lock = SingleLock::builder(&client, "orders")
///     .lease(Duration::from_secs(10))
///     .build()?;
/// let guard = lock.lock().await?;
/// println!("token {}", guard.fencing_token());
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SingleLock {
    pub(crate) shared: Arc<LockShared>,
}

/// What every handle of one lock (in one client) shares.
pub(crate) struct LockShared {
    pub(crate) sync: Synchronizer<RedisCompetitor>,
}

impl LockShared {
    pub(crate) fn competitor(&self) -> &RedisCompetitor {
        self.sync.competitor()
    }
}

impl Registered for LockShared {
    type Settings = LockOptions;

    fn settings(&self) -> LockOptions {
        self.competitor().options.clone()
    }

    fn waiters(&self) -> usize {
        self.sync.waiters()
    }
}

impl ReleaseTarget for LockShared {
    fn released(&self) {
        self.sync.notify_released();
    }

    fn queue_id(&self) -> &str {
        &self.sync.competitor().turn.queue_id
    }
}

/// What a successful attempt yields.
pub(crate) struct Grant {
    pub(crate) token: FencingToken,
    pub(crate) count: u32,
    pub(crate) deadline: Instant,
    pub(crate) watch: OnceLock<LeaseWatch>,
    /// Local passes this fresh hold may serve (the tokens it reserved after its own).
    pub(crate) passes: u32,
}

/// The remote hold being passed between local holders (lock cohorting): whose hold it is,
/// the fencing tokens its acquisition reserved, and how many holders it served.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cohort {
    /// The remote holder (the hash field).
    pub(crate) remote: HolderId,
    /// The current local holder's token.
    pub(crate) token: u64,
    /// The last token of the reserved block.
    pub(crate) last: u64,
    /// Local holders served so far (1 + passes taken).
    pub(crate) holds: u32,
}

/// The Redis side of the lock, driven by the synchronizer.
pub(crate) struct RedisCompetitor {
    pub(crate) client: RedisClient,
    pub(crate) keys: Keys,
    pub(crate) name: LockName,
    pub(crate) label: Arc<str>,
    pub(crate) options: LockOptions,
    me: Weak<LockShared>,
    /// When the last attempt was sent (for [`Notifications::Live`]).
    last_attempt: Arc<Mutex<Option<Instant>>>,
    /// The turn between processes.
    pub(crate) turn: Turn,
    /// The hold being passed between local holders, if the current one allows passes.
    pub(crate) cohort: Mutex<Option<Cohort>>,
}

impl RedisCompetitor {
    /// Runs the release script for `holder`: `-1` not held, `0` released, `n` still held.
    /// Idempotent: a retry after a broken connection does not release twice.
    pub(crate) async fn release_remote(
        &self,
        holder: HolderId,
        local_waiters: bool,
    ) -> Result<i64> {
        let mut release = Release::plain(holder, self.options.lease(), &self.turn, local_waiters);
        release.holds = self.holds(holder);
        release_remote(&self.client, &self.keys, release).await
    }

    /// How many local holders the remote hold of `remote` served (1 unless it was passed).
    fn holds(&self, remote: HolderId) -> u32 {
        match *lock(&self.cohort) {
            Some(c) if c.remote == remote => c.holds,
            _ => 1,
        }
    }

    /// Fencing tokens a passable first acquisition reserves: one per holder of the tenure
    /// (the turn's bound on acquisitions in a row), so that passes end where the turn would
    /// hand the lock to another process anyway. 1 (no passes) without a turn.
    fn block(&self) -> u32 {
        if self.turn.queue_id.is_empty() {
            1
        } else {
            self.turn.tenure.max(1)
        }
    }

    fn hold(&self, holder: HolderId, grant: &Grant) -> Renewable {
        Renewable {
            key: self.keys.lock.clone(),
            turn: Some(self.keys.turn.clone()),
            fence: self
                .options
                .fence_expiry()
                .map(|idle| (self.keys.fence.clone(), idle)),
            alias: Some(self.keys.holder.clone()),
            leases: None,
            holder,
            lease: self.options.lease(),
            period: self.options.renewal_period(),
            max_hold: self.options.max_hold(),
            deadline: grant.deadline,
            label: self.label.clone(),
        }
    }

    /// The lease watch for a grant (normally set by `after_acquire`).
    pub(crate) fn watch(&self, holder: HolderId, grant: &Grant) -> LeaseWatch {
        match grant.watch.get() {
            Some(w) => w.clone(),
            None => self.client.inner.renewal.register_hold(
                &self.client,
                self.hold(holder, grant),
                grant.count == 1,
            ),
        }
    }
}

/// After an acquire whose reply never came (a timeout, or a connection that broke twice),
/// undoes it by its request id: the undo releases the level if the acquire ran, and otherwise
/// marks it cancelled so that it does nothing if it runs later (a hung server processes its
/// queue when it resumes). Exact for first acquisitions and re-entries alike.
///
/// The undo is put on the connection behind the acquire before this returns (one poll), so
/// the next attempt of the synchronizer queues behind it. If its connection breaks it is
/// sent again in the background, a few times within the lease (it is idempotent: it carries
/// its own request id); a late reply is not a reason to resend it. An entry it could not undo
/// is never renewed and ends with its lease.
pub(crate) async fn compensate(
    client: &RedisClient,
    keys: &Keys,
    waiters: bool,
    holder: HolderId,
    lease: Duration,
    turn: Turn,
    acquire_request: u64,
) {
    let (client2, keys2) = (client.clone(), keys.clone());
    let mut undo = Box::pin(async move {
        let request = request::next_id();
        let started = Instant::now();
        let mut tries = 0u32;
        loop {
            tries += 1;
            let release = Release {
                holder,
                lease,
                turn: &turn,
                local_waiters: waiters,
                request,
                undo: Some(acquire_request),
                holds: 1,
            };
            match release_remote(&client2, &keys2, release).await {
                Ok(-2) => tracing::debug!(%holder, "cancelled an acquire that had not run"),
                Ok(n) if n >= 0 => {
                    tracing::info!(%holder, left = n, "undid an acquire whose reply never came");
                }
                Ok(_) => {}
                // A late reply: the undo is queued behind the acquire it undoes and runs when
                // the server gets to them; sending it again would add nothing.
                Err(e) if e.backend_kind() == Some(BackendKind::Timeout) => {
                    tracing::debug!(%holder, error = %e, "the undo of a timed-out acquire got no reply in time either");
                }
                // The connection broke: the undo may not have been sent. Again, on a new one.
                Err(e) if tries < UNDO_TRIES && started.elapsed() < lease => {
                    tracing::debug!(%holder, error = %e, "undoing a timed-out acquire failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50 << tries)).await;
                    continue;
                }
                Err(e) => tracing::warn!(%holder, error = %e,
                    "could not undo a timed-out acquire; if it ran, its entry ends with its lease"),
            }
            break;
        }
    });
    // One poll puts the command on the connection (ordered after the acquire); the reply is
    // awaited in the background.
    if futures::poll!(undo.as_mut()).is_pending() {
        client.spawn(undo);
    }
}

/// The least validity a grant must have left when its reply arrives (a tenth of the lease):
/// below it, the holder could not even renew in time, and the grant is given back.
pub(crate) fn min_validity(lease: Duration) -> Duration {
    lease / 10
}

/// Releases one level of `holder` in the background: a level that was granted but cannot be
/// used (`why`, of lock `label`), which served `holds` local holders. If the release fails,
/// the entry is never renewed and ends with its lease. When it is done, the head of the local
/// queue is told: a release that keeps the turn for this process (its tasks wait) publishes
/// no message, and the head would otherwise wait for its spin wait.
#[allow(clippy::too_many_arguments)] // the pieces of a release, taken apart for the task
fn release_in_background(
    client: &RedisClient,
    keys: &Keys,
    me: &Weak<LockShared>,
    holder: HolderId,
    holds: u32,
    lease: Duration,
    turn: &Turn,
    (label, why): (&Arc<str>, &'static str),
) {
    let (client2, keys2, turn, label) = (client.clone(), keys.clone(), turn.clone(), label.clone());
    let me = me.clone();
    client.spawn(async move {
        let waiters = me.upgrade().is_some_and(|s| s.sync.waiters() > 0);
        let mut release = Release::plain(holder, lease, &turn, waiters);
        release.holds = holds;
        if let Err(e) = release_remote(&client2, &keys2, release).await {
            tracing::warn!(lock = %label, %holder, error = %e, "release of {why} failed; the entry ends with its lease");
        }
        if let Some(shared) = me.upgrade() {
            shared.sync.notify_released();
        }
    });
}

/// How many times an undo is sent before the entry is left to its lease.
const UNDO_TRIES: u32 = 4;

/// The turn between local queues (one per lock handle family in a client, normally one per
/// process), as the scripts take it (see `scripts/acquire.lua`).
#[derive(Clone, Debug)]
pub(crate) struct Turn {
    /// This local queue's id (`''`: no turn, any caller may take a free lock).
    pub(crate) queue_id: Arc<str>,
    /// Acquisitions in a row a process may keep while other processes wait.
    pub(crate) tenure: u32,
    /// How long a turn stays reserved for the process it is given to.
    pub(crate) reserve: Duration,
}

impl Turn {
    /// No turn (multi-node locks; their nodes are contended in node order instead). Shared,
    /// so that the node calls of every attempt do not allocate one.
    pub(crate) fn none() -> &'static Turn {
        static NONE: LazyLock<Turn> = LazyLock::new(|| Turn {
            queue_id: Arc::from(""),
            tenure: 0,
            reserve: Duration::ZERO,
        });
        &NONE
    }

    /// The turn of a new local queue for a lock with `options`. Its id is a fresh holder id
    /// (128 random bits per process plus a counter), unique among all queues.
    pub(crate) fn for_queue(options: &LockOptions) -> Self {
        Turn {
            queue_id: Arc::from(HolderId::new().to_string()),
            tenure: TENURE,
            reserve: (options.spin_wait() * 2)
                .clamp(Duration::from_millis(20), Duration::from_secs(1)),
        }
    }
}

/// Acquisitions in a row one local queue may keep while other queues (processes) wait for the
/// lock (its local waiters then go first, without waking anyone else); after that the turn
/// passes to the first waiting queue. It bounds how long a process can be kept waiting.
pub(crate) const TENURE: u32 = 8;

/// One release request (see `scripts/release.lua`).
pub(crate) struct Release<'a> {
    pub(crate) holder: HolderId,
    /// The TTL a partial release resets.
    pub(crate) lease: Duration,
    pub(crate) turn: &'a Turn,
    /// Whether tasks of this process wait for the lock (the turn may stay here).
    pub(crate) local_waiters: bool,
    /// This call's request id (a retry answers from its record).
    pub(crate) request: u64,
    /// Undo the acquire with this request id instead of releasing unconditionally.
    pub(crate) undo: Option<u64>,
    /// How many local holders this remote hold served (1 + its local passes): they count
    /// towards the turn's tenure.
    pub(crate) holds: u32,
}

impl<'a> Release<'a> {
    /// A plain release of one level, as a new request.
    pub(crate) fn plain(
        holder: HolderId,
        lease: Duration,
        turn: &'a Turn,
        local_waiters: bool,
    ) -> Self {
        Release {
            holder,
            lease,
            turn,
            local_waiters,
            request: request::next_id(),
            undo: None,
            holds: 1,
        }
    }
}

/// Runs the release script: `-2` (undo only) the acquire had not run and is cancelled, `-1`
/// not held, `0` released, `n` still held. Retried once, with the same request id, if the
/// connection breaks before the reply.
pub(crate) async fn release_remote(
    client: &RedisClient,
    keys: &Keys,
    release: Release<'_>,
) -> Result<i64> {
    let holder_arg = release.holder.to_string();
    let record = keys.record(&holder_arg);
    let ms = scripts::lease_ms(release.lease);
    let queue_id = &*release.turn.queue_id;
    let (tenure, reserve) = (release.turn.tenure, scripts::lease_ms(release.turn.reserve));
    let record_ms = request::record_ttl_ms(client.command_timeout());
    let undo = release.undo.map(|id| id.to_string()).unwrap_or_default();
    let (request, waiters) = (release.request, u8::from(release.local_waiters));
    let publish = client.publish_arg();
    let holds = release.holds;
    client
        .exec("release script", |mut c| {
            let mut invocation = RELEASE.script.prepare_invoke();
            invocation
                .key(&*keys.lock)
                .key(&*keys.channel)
                .key(&*keys.queue)
                .key(&*keys.turn)
                .key(&*record)
                .arg(&holder_arg)
                .arg(ms)
                .arg(queue_id)
                .arg(tenure)
                .arg(waiters)
                .arg(reserve)
                .arg(request)
                .arg(record_ms)
                .arg(&undo)
                .arg(publish)
                .arg(holds);
            async move { invocation.invoke_async(&mut c).await }
        })
        .await
}

/// One acquire request (see `scripts/acquire.lua`).
pub(crate) struct Acquire<'a> {
    pub(crate) holder: HolderId,
    pub(crate) lease: Duration,
    pub(crate) turn: &'a Turn,
    /// The node marker to check (multi-node locks).
    pub(crate) marker: Option<&'a [u8]>,
    /// This call's request id (a retry answers from its record; an undo names it).
    pub(crate) request: u64,
    /// A re-entry only: the holder's entry must exist; the script answers `{-4}` and touches
    /// nothing when it does not (the hold was lost), instead of starting a fresh hold.
    pub(crate) reentry: bool,
    /// The fencing counter's expiry (`None`: persistent).
    pub(crate) fence_expiry: Option<Duration>,
    /// Fencing tokens a first acquisition reserves for local passes (1: none; more needs a
    /// turn, see `scripts/acquire.lua` ARGV[9]).
    pub(crate) block: u32,
    /// How long the request record is kept (`None`: two command timeouts, the window in which
    /// a retry may arrive). A multi-node lock keeps it for as long as it may give the level
    /// back by this request's id (`RedisClient::node_undo`).
    pub(crate) record_for: Option<Duration>,
}

/// Runs the acquire script and returns its reply (see `scripts/acquire.lua`). Retried once,
/// with the same request id, if the connection breaks before the reply.
pub(crate) async fn acquire_remote(
    client: &RedisClient,
    keys: &Keys,
    acquire: Acquire<'_>,
) -> Result<Vec<i64>> {
    let holder_arg = acquire.holder.to_string();
    let record = keys.record(&holder_arg);
    let ms = scripts::lease_ms(acquire.lease);
    let queue_id = &*acquire.turn.queue_id;
    let tenure = acquire.turn.tenure;
    let record_ms = match acquire.record_for {
        Some(d) => scripts::lease_ms(d),
        None => request::record_ttl_ms(client.command_timeout()),
    };
    let (request, marker, reentry) = (acquire.request, acquire.marker, acquire.reentry);
    let block = acquire.block;
    let fence_expiry = acquire
        .fence_expiry
        .map(|d| scripts::lease_ms(d).to_string());
    let synced = client.synced();
    let mut keys_of: Vec<&[u8]> = vec![&keys.lock, &keys.fence, &keys.queue, &keys.turn, &record];
    keys_of.extend(marker);
    let mut eval = ACQUIRE.evalsha(&keys_of);
    eval.arg(&holder_arg)
        .arg(ms)
        .arg(queue_id)
        .arg(tenure)
        .arg(request)
        .arg(record_ms)
        // ARGV[7] and ARGV[8]: '' means no (see acquire.lua).
        .arg(if reentry { "1" } else { "" })
        .arg(fence_expiry.as_deref().unwrap_or(""));
    // ARGV[9]: the token block, only when it allows passes (the common call stays as short as
    // it was).
    if block > 1 {
        eval.arg(block);
    }
    let eval = &eval;
    let (reply, acked): (Vec<i64>, Option<usize>) = client
        .exec("acquire script", |mut c| async move {
            // A grant counts once the replicas have it: WAIT behind it, where it ran.
            let granted = |r: &Vec<i64>| matches!(r.first(), Some(1 | 2));
            conn::eval_then_wait(&mut c, &ACQUIRE, eval, synced, granted).await
        })
        .await?;
    if let (Some((wanted, within)), Some(acked)) = (synced, acked)
        && acked < wanted
    {
        // Not on enough replicas: a failover could lose it. Give the level back (undo by the
        // request id: exactly the level this request added) and report.
        let undo = Release {
            holder: acquire.holder,
            lease: acquire.lease,
            turn: acquire.turn,
            local_waiters: false,
            request: request::next_id(),
            undo: Some(request),
            holds: 1,
        };
        if let Err(e) = release_remote(client, keys, undo).await {
            tracing::warn!(error = %e, "giving back a grant the replicas did not acknowledge failed; it ends with its lease");
        }
        return Err(Error::backend(
            BackendKind::Unavailable,
            Some(client.address().to_owned()),
            format!(
                "the grant was acknowledged by {acked} of the {wanted} replicas required \
                 (ClientOptionsBuilder::synced_replicas) within {within:?}, so a failover could lose \
                 it; it was given back. Check the replicas' health and links"
            ),
            None,
        ));
    }
    Ok(reply)
}

impl RedisCompetitor {
    /// One acquire script call for `holder`; `reentry`: see [`Competitor::reenter`]; `block`:
    /// tokens a first acquisition reserves (see [`Competitor::attempt_passable`]).
    fn attempt_remote(
        &self,
        holder: HolderId,
        reentry: bool,
        block: u32,
    ) -> impl Future<Output = Result<Attempt<Grant>>> + Send + 'static {
        // A re-entry of a passed hold keeps its current holder's token (the counter names the
        // end of the reserved block, not this holder's token).
        let cohort_token = match *lock(&self.cohort) {
            Some(c) if reentry && c.remote == holder => Some(c.token),
            _ => None,
        };
        let client = self.client.clone();
        let turn = self.turn.clone();
        let lease = self.options.lease();
        let fence_expiry = self.options.fence_expiry();
        let last = self.last_attempt.clone();
        let label = self.label.clone();
        let keys = self.keys.clone();
        let me = self.me.clone();
        let inner = client.clone();
        inner.on_runtime(async move {
            let sent = Instant::now();
            *lock(&last) = Some(sent);
            let (reply, request) = request::send_fresh(|request| {
                let acquire = Acquire {
                    holder,
                    lease,
                    turn: &turn,
                    marker: None,
                    request,
                    reentry,
                    fence_expiry,
                    block,
                    record_for: None,
                };
                acquire_remote(&client, &keys, acquire)
            })
            .await;
            let reply = match reply {
                Ok(r) => r,
                Err(e) => {
                    // The script may have run (or may still run): no reply, or a reply to it
                    // followed by an error of what came after it (a `WAIT` the server refuses),
                    // or an error raised half-way through it. Undo it by id; an undo of an
                    // acquire that never ran only marks it cancelled (issue 35, defect 4). Not
                    // when the user may not run it (the undo would be refused too).
                    if request::worth_undoing(&e) {
                        let waiters = me.upgrade().is_some_and(|s| s.sync.waiters() > 0);
                        compensate(&client, &keys, waiters, holder, lease, turn, request).await;
                    }
                    return Err(e);
                }
            };
            // `block`: the tokens a first acquisition reserved (see acquire.lua); its passes are
            // the rest of the block.
            let grant = |token: i64, count: i64, block: i64| -> Result<Attempt<Grant>> {
                let (Ok(token), Ok(count)) = (u64::try_from(token), u32::try_from(count)) else {
                    return Err(unexpected_reply("acquire script", client.address(), &reply));
                };
                let deadline = renewal::deadline(sent, lease);
                let round_trip = sent.elapsed();
                if deadline < Instant::now() + min_validity(lease) {
                    // The reply came too late to hold anything: give the level back.
                    release_in_background(
                        &client,
                        &keys,
                        &me,
                        holder,
                        1,
                        lease,
                        &turn,
                        (&label, "a late grant"),
                    );
                    return Err(Error::backend(
                        BackendKind::Timeout,
                        Some(client.address().to_owned()),
                        format!(
                            "the acquire script answered after {round_trip:?}, leaving less than \
                             the minimum validity ({:?}) of a {lease:?} lease; the level was \
                             given back. The link or server is too slow for this lease: raise \
                             the lease (or the network's speed)",
                            min_validity(lease)
                        ),
                        None,
                    ));
                }
                let token = match cohort_token {
                    Some(t) if count > 1 => t,
                    _ => token,
                };
                Ok(Attempt::Acquired(Grant {
                    token: FencingToken::new(token),
                    count,
                    deadline: renewal::deadline(sent, lease),
                    watch: OnceLock::new(),
                    passes: if count == 1 {
                        u32::try_from(block - 1).unwrap_or(0)
                    } else {
                        0
                    },
                }))
            };
            match reply.as_slice() {
                // A block's size is absent from a replayed answer (a request record): no passes.
                [1, token] => {
                    tracing::debug!(lock = %label, %holder, token, "acquired");
                    grant(*token, 1, 1)
                }
                [1, token, reserved] => {
                    tracing::debug!(lock = %label, %holder, token, reserved, "acquired a block");
                    grant(*token, 1, (*reserved).clamp(1, i64::from(block)))
                }
                [2, token, count] => {
                    tracing::debug!(lock = %label, %holder, token, count, "re-entered");
                    grant(*token, *count, 1)
                }
                [0, pttl] => {
                    tracing::trace!(lock = %label, %holder, pttl, "busy");
                    let retry_after = u64::try_from(*pttl).ok().map(Duration::from_millis);
                    Ok(Attempt::Busy { retry_after })
                }
                // Only a request that was undone answers -3, and nobody awaits it then; -7
                // again and again (requests of one holder overtaking each other): later.
                [-3 | request::OVERTAKEN] => Ok(Attempt::Busy { retry_after: None }),
                [-4] => {
                    tracing::debug!(lock = %label, %holder, "re-entry found the hold gone");
                    // The guards of the hold learn it now, not at the next renewal.
                    let renewal = &client.inner.renewal;
                    renewal.lose(&keys.lock, holder, LossReason::EntryGone);
                    Err(Error::lease_lost(
                        Arc::clone(&label),
                        holder,
                        LossReason::EntryGone,
                    ))
                }
                _ => Err(unexpected_reply("acquire script", client.address(), &reply)),
            }
        })
    }
}

impl Competitor for RedisCompetitor {
    type Grant = Grant;

    fn grant_deadline(&self, grant: &Grant) -> Option<Instant> {
        Some(grant.deadline)
    }

    fn attempt(
        &self,
        holder: HolderId,
    ) -> impl Future<Output = Result<Attempt<Grant>>> + Send + 'static {
        self.attempt_remote(holder, false, 1)
    }

    /// A first acquisition reserves a block of fencing tokens (one per holder of the tenure)
    /// and marks the hold as this process's, so that it can be passed to local waiters.
    fn attempt_passable(
        &self,
        holder: HolderId,
    ) -> impl Future<Output = Result<Attempt<Grant>>> + Send + 'static {
        self.attempt_remote(holder, false, self.block())
    }

    fn pass_budget(&self, grant: &Grant) -> u32 {
        grant.passes
    }

    /// The next token of the block, and a lease watch of the receiver's own on the same
    /// remote hold; refused when the block is used up or the hold is lost or nearly expired.
    fn take_pass(&self, remote: HolderId, to: HolderId) -> Option<Grant> {
        let mut cohort = lock(&self.cohort);
        let c = cohort
            .as_mut()
            .filter(|c| c.remote == remote && c.token < c.last)?;
        let renewal = &self.client.inner.renewal;
        let watch = renewal.pass(
            &self.keys.lock,
            remote,
            min_validity(self.options.lease()),
            to,
        )?;
        c.token += 1;
        c.holds += 1;
        tracing::debug!(lock = %self.label, %remote, holder = %to, token = c.token, "took a passed hold");
        let grant = Grant {
            token: FencingToken::new(c.token),
            count: 1,
            deadline: watch.deadline(),
            watch: OnceLock::new(),
            passes: 0,
        };
        let _ = grant.watch.set(watch);
        Some(grant)
    }

    /// Ends the renewal of a passed hold nobody took and releases it in the background; the
    /// head is told when the release is done (it keeps the turn, so no message comes).
    fn drop_pass(&self, remote: HolderId) {
        let holds = self.holds(remote);
        self.after_release(remote);
        release_in_background(
            &self.client,
            &self.keys,
            &self.me,
            remote,
            holds,
            self.options.lease(),
            &self.turn,
            (&self.label, "a passed hold nobody took"),
        );
    }

    /// A re-entry never creates an entry: a holder whose entry is gone (lease lost) gets
    /// [`Error::LeaseLost`], and the local depth stays as it was.
    fn reenter(
        &self,
        holder: HolderId,
    ) -> impl Future<Output = Result<Attempt<Grant>>> + Send + 'static {
        self.attempt_remote(holder, true, 1)
    }

    fn after_acquire(&self, holder: HolderId, grant: &Grant) {
        if grant.watch.get().is_some() {
            // A passed hold: `take_pass` moved its registration to the new holder.
            return;
        }
        if grant.count == 1 {
            *lock(&self.cohort) = (grant.passes > 0).then(|| Cohort {
                remote: holder,
                token: grant.token.get(),
                last: grant.token.get() + u64::from(grant.passes),
                holds: 1,
            });
        }
        let watch = self.client.inner.renewal.register_hold(
            &self.client,
            self.hold(holder, grant),
            grant.count == 1,
        );
        let _ = grant.watch.set(watch);
    }

    fn after_release(&self, holder: HolderId) {
        {
            let mut cohort = lock(&self.cohort);
            if cohort.is_some_and(|c| c.remote == holder) {
                *cohort = None;
            }
        }
        self.client
            .inner
            .renewal
            .deregister(&self.keys.lock, holder);
    }

    fn abandon(&self, holder: HolderId, grant: Grant) {
        tracing::debug!(lock = %self.label, %holder, token = grant.token.get(), "releasing an abandoned grant");
        release_in_background(
            &self.client,
            &self.keys,
            &self.me,
            holder,
            1,
            self.options.lease(),
            &self.turn,
            (&self.label, "an abandoned grant"),
        );
    }

    fn prepare_wait(&self) -> impl Future<Output = Notifications> + Send {
        let target: Weak<dyn ReleaseTarget> = self.me.clone();
        let last = *lock(&self.last_attempt);
        self.client
            .subscribe_releases(self.keys.channel.clone(), target, last)
    }

    fn queue_drained(&self) {
        // Also called when an attempt whose caller was dropped ends in the background, with
        // tasks possibly queued by then: their notifications must stay (issue 28, item 12).
        if self.me.upgrade().is_some_and(|s| s.sync.waiters() > 0) {
            return;
        }
        self.client
            .inner
            .notifier
            .unsubscribe(&self.client, &self.keys.channel);
    }
}

/// What [`SingleLock::builder`] accepts as its client: a [`RedisClient`] or `&RedisClient`
/// (every lock of a client shares its queues, renewal and notifications). To start from an
/// existing `deadpool_redis` pool, build the client once with [`RedisClient::from_pool`] and
/// pass that: a lock never builds a private client of its own.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
/// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
/// let lock = slate_redis::SingleLock::builder(&client, "a").build()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ClientSource(pub(crate) RedisClient);

impl From<RedisClient> for ClientSource {
    fn from(c: RedisClient) -> Self {
        ClientSource(c)
    }
}

impl From<&RedisClient> for ClientSource {
    fn from(c: &RedisClient) -> Self {
        ClientSource(c.clone())
    }
}

/// Builds a [`SingleLock`]; see [`SingleLock::builder`].
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
/// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
/// let lock = slate_redis::SingleLock::builder(&client, "reports")
///     .lease(Duration::from_secs(5))
///     .renewal_period(Duration::from_secs(1))
///     .spin_wait(Duration::from_millis(100))
///     .max_hold(Duration::from_secs(600))
///     .key_prefix("billing:")
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until build() is called"]
pub struct SingleLockBuilder {
    source: ClientSource,
    name: Result<LockName>,
    options: LockOptionsBuilder,
}

slate_core::lock_options_setters!(
    SingleLockBuilder,
    slate_redis,
    setup = "# let client = slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\")?;",
    start = "slate_redis::SingleLock::builder(&client, \"a\")",
    [
        lease,
        renewal_period,
        spin_wait,
        max_hold,
        fence_expiry,
        key_prefix,
        options
    ],
);

impl SingleLockBuilder {
    /// Validates the name and options and returns the lock (sharing the local state of an
    /// existing lock of the same name and prefix in the same client).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let a = slate_redis::SingleLock::builder(&client, "a").build()?;
    /// let b = slate_redis::SingleLock::builder(&client, "a").build()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for an empty or oversize name, an invalid option (zero lease,
    /// renewal period not below the lease, ...), a lock of the same name in this client built
    /// with other options, or a pool used outside a tokio runtime.
    pub fn build(self) -> Result<SingleLock> {
        let name = self.name?;
        let options = self.options.build()?;
        let client = self.source.0;
        let keys = Keys::new(options.key_prefix(), &name);
        let key = keys.lock.clone();
        let shared =
            client
                .inner
                .locks
                .get_or_create(key, &name, options, |options: LockOptions| {
                    let label: Arc<str> = Arc::from(name.to_string());
                    let spin_wait = options.spin_wait();
                    let turn = Turn::for_queue(&options);
                    Arc::new_cyclic(|me: &Weak<LockShared>| LockShared {
                        sync: Synchronizer::new(
                            Arc::clone(&label),
                            RedisCompetitor {
                                client: client.clone(),
                                keys,
                                name: name.clone(),
                                label,
                                options,
                                me: me.clone(),
                                last_attempt: Arc::new(Mutex::new(None)),
                                cohort: Mutex::new(None),
                                turn,
                            },
                            spin_wait,
                        ),
                    })
                })?;
        Ok(SingleLock { shared })
    }
}

impl SingleLock {
    /// Starts building a lock named `name` on `client` (a [`RedisClient`] or `&RedisClient`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// # Ok(()) }
    /// ```
    pub fn builder(client: impl Into<ClientSource>, name: impl AsRef<[u8]>) -> SingleLockBuilder {
        SingleLockBuilder {
            source: client.into(),
            name: LockName::new(name),
            options: LockOptionsBuilder::default(),
        }
    }

    /// The options of this lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::SingleLock::builder(&client, "a").build()?;
    /// assert_eq!(lock.options().key_prefix(), "slate:");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn options(&self) -> &LockOptions {
        &self.shared.competitor().options
    }

    /// The client this lock uses.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::SingleLock::builder(&client, "a").build()?;
    /// let _stats = lock.client().stats();
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn client(&self) -> &RedisClient {
        &self.shared.competitor().client
    }

    /// The Redis key of the lock hash, `<prefix>{<name>}` (the fencing counter is this key
    /// followed by `:fence`, the release channel by `:released`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::SingleLock::builder(&client, "a").build()?;
    /// assert_eq!(lock.key(), b"slate:{a}");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn key(&self) -> &[u8] {
        &self.shared.competitor().keys.lock
    }

    /// The local owner and its local hold count, if a task of this process holds the lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::SingleLock::builder(&client, "a").build()?;
    /// assert!(lock.local_owner().is_none());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn local_owner(&self) -> Option<(HolderId, u32)> {
        self.shared.sync.owner()
    }

    /// Tasks and threads of this process waiting for this lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::SingleLock::builder(&client, "a").build()?;
    /// assert_eq!(lock.local_waiters(), 0);
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn local_waiters(&self) -> usize {
        self.shared.sync.waiters()
    }

    fn guard(&self, holder: HolderId, grant: &Grant) -> SingleLockGuard {
        let watch = self.shared.competitor().watch(holder, grant);
        SingleLockGuard::new(
            self.clone(),
            slate_core::Hold::new(holder, grant.token, grant.count, watch),
        )
    }

    fn blocking_acquire(
        &self,
        holder: Option<HolderId>,
        wait: Wait,
        what: &str,
    ) -> Result<SingleLockGuard> {
        slate_core::blocking::assert_outside_runtime(what);
        let (holder, grant) = self.shared.sync.blocking_acquire_current(holder, wait)?;
        Ok(self.guard(holder, &grant))
    }

    /// Acquires for `holder`, or when it is `None` for the current holder: the scope's
    /// ([`HolderId::scope`]), else a fresh one that nobody else can name, which may then be
    /// passed the hold by a local release and pass it on in turn (lock cohorting, see the
    /// type's docs).
    fn acquire_for(
        &self,
        holder: Option<HolderId>,
        wait: Wait,
    ) -> impl Future<Output = Result<SingleLockGuard>> + Send + '_ {
        let (holder, acquisition) = self.shared.sync.acquire_current(holder, wait);
        let span = tracing::debug_span!("acquire", lock = %self.shared.competitor().label, %holder);
        async move { Ok(self.guard(holder, &acquisition.await?)) }.instrument(span)
    }

    /// Blocks this thread until the lock is acquired for the current holder (the thread twin
    /// of `lock()`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let rt = tokio::runtime::Runtime::new()?;
    /// let client = rt.block_on(async { slate_redis::RedisClient::open("redis://127.0.0.1:6379") })?;
    /// let lock = slate_redis::SingleLock::builder(&client, "a").build()?;
    /// let guard = lock.blocking_lock()?;
    /// guard.blocking_unlock()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Panics
    ///
    /// Inside a tokio runtime (use `lock().await` there).
    pub fn blocking_lock(&self) -> Result<SingleLockGuard> {
        self.blocking_acquire(None, Wait::Forever, "SingleLock::blocking_lock")
    }

    /// Blocks this thread until the lock is acquired for `holder` (re-enters if it holds it).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let rt = tokio::runtime::Runtime::new()?;
    /// # let client = rt.block_on(async { slate_redis::RedisClient::open("redis://127.0.0.1:6379") })?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "a").build()?;
    /// let outer = lock.blocking_lock()?;
    /// let inner = lock.blocking_lock_as(outer.holder())?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Panics
    ///
    /// Inside a tokio runtime.
    pub fn blocking_lock_as(&self, holder: HolderId) -> Result<SingleLockGuard> {
        self.blocking_acquire(Some(holder), Wait::Forever, "SingleLock::blocking_lock_as")
    }

    /// One attempt from this thread, without waiting: `None` when another holder has it (the
    /// thread twin of `try_lock()`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let rt = tokio::runtime::Runtime::new()?;
    /// # let client = rt.block_on(async { slate_redis::RedisClient::open("redis://127.0.0.1:6379") })?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "a").build()?;
    /// if let Some(guard) = lock.blocking_try_lock()? {
    ///     guard.blocking_unlock()?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Panics
    ///
    /// Inside a tokio runtime.
    pub fn blocking_try_lock(&self) -> Result<Option<SingleLockGuard>> {
        match self.blocking_acquire(None, Wait::Immediate, "SingleLock::blocking_try_lock") {
            Ok(guard) => Ok(Some(guard)),
            Err(e) if e.is_busy() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Blocks this thread at most `d` waiting for the lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let rt = tokio::runtime::Runtime::new()?;
    /// # let client = rt.block_on(async { slate_redis::RedisClient::open("redis://127.0.0.1:6379") })?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "a").build()?;
    /// let guard = lock.blocking_try_lock_for(std::time::Duration::from_secs(1))?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when `d` passes first; backend failures.
    ///
    /// # Panics
    ///
    /// Inside a tokio runtime.
    pub fn blocking_try_lock_for(&self, d: Duration) -> Result<SingleLockGuard> {
        self.blocking_acquire(
            None,
            Wait::for_duration(d),
            "SingleLock::blocking_try_lock_for",
        )
    }
}

impl fmt::Debug for SingleLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.shared.competitor();
        f.debug_struct("SingleLock")
            .field("name", &c.name)
            .field("options", &c.options)
            .field("address", &c.client.address())
            .finish()
    }
}

/// The operations (also available through [`DistributedLock`](crate::DistributedLock) for generic code; no import is
/// needed to call them on a `SingleLock`).
impl SingleLock {
    /// The lock's name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// assert_eq!(lock.name().as_bytes(), b"orders");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn name(&self) -> &LockName {
        &self.shared.competitor().name
    }

    /// Acquires the lock for `holder`, waiting as `wait` allows (the one call the others are
    /// made of).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// use slate_redis::{HolderId, Wait};
    /// let guard = lock.acquire(HolderId::new(), Wait::Immediate).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] for a busy lock under [`Wait::Immediate`]; [`Error::Timeout`] when the
    /// deadline of [`Wait::Until`] passes; backend errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future removes the caller from the local queue and passes on
    /// any wake-up it had; a grant obtained for a dropped future is released, never leaked.
    pub fn acquire(
        &self,
        holder: HolderId,
        wait: Wait,
    ) -> impl Future<Output = Result<SingleLockGuard>> + Send + '_ {
        self.acquire_for(Some(holder), wait)
    }

    /// Waits until the lock is acquired for the current holder ([`HolderId::current`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// let guard = lock.lock().await?;
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures that make waiting pointless (authentication, permissions, a closed
    /// client).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub fn lock(&self) -> impl Future<Output = Result<SingleLockGuard>> + Send + '_ {
        self.acquire_for(None, Wait::Forever)
    }

    /// Waits until the lock is acquired for `holder` (re-enters if `holder` holds it).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// let outer = lock.lock().await?;
    /// let inner = lock.lock_as(outer.holder()).await?;
    /// assert_eq!(inner.fencing_token(), outer.fencing_token());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub fn lock_as(
        &self,
        holder: HolderId,
    ) -> impl Future<Output = Result<SingleLockGuard>> + Send + '_ {
        self.acquire(holder, Wait::Forever)
    }

    /// One remote attempt, never waiting: `Ok(None)` if another holder has the lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// if let Some(guard) = lock.try_lock().await? {
    ///     guard.unlock().await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub async fn try_lock(&self) -> Result<Option<SingleLockGuard>> {
        slate_core::lock::busy_to_none(self.acquire_for(None, Wait::Immediate).await)
    }

    /// Waits at most `d`, in the queue like everyone else.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// let guard = lock.try_lock_for(std::time::Duration::from_secs(2)).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when `d` passes first; backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub fn try_lock_for(
        &self,
        d: Duration,
    ) -> impl Future<Output = Result<SingleLockGuard>> + Send + '_ {
        self.acquire_for(None, Wait::for_duration(d))
    }

    /// Waits at most until `deadline`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    /// let guard = lock.try_lock_until(deadline).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the deadline passes first; backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](Self::acquire).
    pub fn try_lock_until(
        &self,
        deadline: Instant,
    ) -> impl Future<Output = Result<SingleLockGuard>> + Send + '_ {
        self.acquire_for(None, Wait::Until(deadline))
    }

    /// Whether any holder holds the lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// println!("locked: {}", lock.is_locked().await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub fn is_locked(&self) -> impl Future<Output = Result<bool>> + Send + '_ {
        let c = self.shared.competitor();
        async move {
            let key: &[u8] = &c.keys.lock;
            c.client
                .exec("EXISTS", |mut conn| async move {
                    redis::cmd("EXISTS").arg(&*key).query_async(&mut conn).await
                })
                .await
        }
    }

    /// How many times `holder` holds the lock (0 if not at all), as Redis counts it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// let guard = lock.lock().await?;
    /// assert_eq!(lock.hold_count(guard.holder()).await?, 1);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub fn hold_count(&self, holder: HolderId) -> impl Future<Output = Result<u32>> + Send + '_ {
        let c = self.shared.competitor();
        // A local holder that was passed the hold counts on its remote holder's field.
        let holder = self.shared.sync.remote_holder(holder);
        async move {
            let key: &[u8] = &c.keys.lock;
            let count: Option<i64> = c
                .client
                .exec("HGET", |mut conn| async move {
                    redis::cmd("HGET")
                        .arg(&*key)
                        .arg(holder.to_string())
                        .query_async(&mut conn)
                        .await
                })
                .await?;
            Ok(count.and_then(|n| u32::try_from(n).ok()).unwrap_or(0))
        }
    }

    /// Whether `holder` holds the lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// let guard = lock.lock().await?;
    /// assert!(lock.is_held_by(guard.holder()).await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub async fn is_held_by(&self, holder: HolderId) -> Result<bool> {
        Ok(self.hold_count(holder).await? > 0)
    }

    /// The remaining lease of whoever holds the lock, or `None` when it is free.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// if let Some(left) = lock.remaining_lease().await? {
    ///     println!("held for another {left:?}");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub fn remaining_lease(&self) -> impl Future<Output = Result<Option<Duration>>> + Send + '_ {
        let c = self.shared.competitor();
        async move {
            let key: &[u8] = &c.keys.lock;
            let pttl: i64 = c
                .client
                .exec("PTTL", |mut conn| async move {
                    redis::cmd("PTTL").arg(&*key).query_async(&mut conn).await
                })
                .await?;
            Ok(match pttl {
                -2 => None,
                -1 => Some(Duration::MAX),
                ms => Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
            })
        }
    }

    /// The lock's state in Redis in one round trip: holders and their levels, the lease
    /// left, the fencing counter, and the local holder a hold was passed to.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// let status = lock.status().await?;
    /// println!("{} holder(s), {:?} left", status.holders.len(), status.remaining);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub async fn status(&self) -> Result<LockStatus> {
        let c = self.shared.competitor();
        c.client.inspect(&c.keys).await
    }

    /// Deletes the lock whoever holds it and publishes on its channel so that waiters retry at
    /// once; returns the holds dropped (1 when there was an entry, else 0). **Unsafe for correctness**: the holder keeps
    /// running its critical section (its renewal then finds the entry gone and signals
    /// `EntryGone`). The fencing counter is kept. Meant for operators clearing a stuck lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::SingleLock::builder(&client, "orders").build()?;
    /// let deleted = lock.force_unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// The deletion may or may not have happened when the future is dropped.
    pub fn force_unlock(&self) -> impl Future<Output = Result<u64>> + Send + '_ {
        let c = self.shared.competitor();
        let (key, channel) = (c.keys.lock.clone(), c.keys.channel.clone());
        async move {
            let (key, channel): (&[u8], &[u8]) = (&key, &channel);
            let publish = c.client.publish_arg();
            let deleted: i64 = c
                .client
                .exec("force-unlock script", |mut conn| async move {
                    FORCE_UNLOCK
                        .script
                        .key(&*key)
                        .key(&*channel)
                        .arg(publish)
                        .invoke_async(&mut conn)
                        .await
                })
                .await?;
            tracing::warn!(lock = %c.label, deleted, "force unlock");
            Ok(u64::from(deleted == 1))
        }
    }
}

slate_core::delegate_distributed_lock!(SingleLock, SingleLockGuard);
