//! Shared mode on Redis: the machinery under [`RwLock`](crate::RwLock) and
//! [`Semaphore`](crate::Semaphore).
//!
//! One Redis hash per lock keeps every holder's permits and levels, a sorted set their
//! leases, and a sorted set plus a hash the processes that wait, in arrival order (see
//! `scripts/shared_prelude.lua`). A read hold takes one permit and a write hold the whole
//! capacity (the *write weight*), so a read-write lock is a semaphore whose writers ask for
//! everything; a semaphore's holds take the permits they ask for. The local
//! [`Synchronizer`]'s shared mode sits in front: inside a process, readers hold together
//! and writers queue in one FIFO with them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use slate_aqs::{Attempt, Competitor, Notifications, Synchronizer};
use slate_core::hold::{Held, Release};
use slate_core::metrics::Meter;
use slate_core::{
    BackendKind, Error, FencingToken, Hold, HolderId, LeaseWatch, LockName, LockOptions,
    LossReason, Result,
};
use tracing::Instrument;

use crate::client::conn;
use crate::client::{RedisClient, lock, unexpected_reply};
use crate::primitives::lock::min_validity;
use crate::scripts::keys::Keys;
use crate::scripts::request;
use crate::scripts::{self, SHARED_ACQUIRE};
use crate::services::notify::ReleaseTarget;
use crate::services::renewal::{self, Renewable};
use slate_core::registry::Registered;

mod release;
mod status;

pub(crate) use release::SharedRelease;
use status::parse_status;
pub use status::{SharedHolder, SharedMode, SharedStatus};

/// The permits a write hold of a read-write lock takes: all of them. Readers are counted
/// against it, so a read-write lock admits up to 2^30 - 1 readers at once.
pub(crate) const WRITE_WEIGHT: u32 = 1 << 30;

/// Which primitive a shared lock is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A read-write lock: reads take one permit, writes all of them.
    RwLock,
    /// A semaphore; `permits` is the capacity it starts with if none is stored yet.
    Semaphore { permits: u32 },
}

impl Kind {
    /// The `primitive` label of its metrics.
    fn primitive(self) -> &'static str {
        match self {
            Kind::RwLock => "rwlock",
            Kind::Semaphore { .. } => "semaphore",
        }
    }

    /// The capacity argument of the scripts.
    fn capacity(self) -> u32 {
        match self {
            Kind::RwLock => WRITE_WEIGHT,
            Kind::Semaphore { permits } => permits,
        }
    }
}

/// The keys of one shared lock (see `scripts/shared_prelude.lua`).
#[derive(Clone, Debug)]
pub(crate) struct SharedKeys {
    /// The holders hash: `<prefix>{<name>}:rw` or `<prefix>{<name>}:sem`.
    pub(crate) holders: Arc<[u8]>,
    pub(crate) leases: Arc<[u8]>,
    pub(crate) queue: Arc<[u8]>,
    pub(crate) wants: Arc<[u8]>,
    pub(crate) fence: Arc<[u8]>,
    pub(crate) channel: Arc<[u8]>,
    /// The semaphore's capacity (persistent); `None` for a read-write lock.
    pub(crate) permits: Option<Arc<[u8]>>,
    /// A read-write lock that treats the single lock of its name as a writer: that lock's
    /// hash (see [`RwLockBuilder::exclude_single_lock`](crate::RwLockBuilder::exclude_single_lock)).
    pub(crate) exclusive: Option<Arc<[u8]>>,
}

impl SharedKeys {
    pub(crate) fn new(prefix: &str, name: &LockName, kind: Kind, exclude_single: bool) -> Self {
        let base = Keys::new(prefix, name).lock;
        let exclusive = exclude_single.then(|| base.clone());
        let mut holders = base.to_vec();
        holders.extend_from_slice(match kind {
            Kind::RwLock => b":rw",
            Kind::Semaphore { .. } => b":sem",
        });
        let with = |suffix: &[u8]| -> Arc<[u8]> {
            let mut k = holders.clone();
            k.extend_from_slice(suffix);
            Arc::from(k)
        };
        SharedKeys {
            leases: with(b":leases"),
            queue: with(b":queue"),
            wants: with(b":wants"),
            fence: with(b":fence"),
            channel: with(b":released"),
            permits: matches!(kind, Kind::Semaphore { .. }).then(|| with(b":permits")),
            exclusive,
            holders: Arc::from(holders),
        }
    }

    /// A holder's request record.
    pub(crate) fn record(&self, holder: &str) -> Vec<u8> {
        let mut k = self.holders.to_vec();
        k.extend_from_slice(b":req:");
        k.extend_from_slice(holder.as_bytes());
        k
    }
}

/// What every handle of one shared lock (in one client) shares.
pub(crate) struct SharedState {
    pub(crate) sync: Synchronizer<SharedCompetitor>,
}

impl SharedState {
    pub(crate) fn competitor(&self) -> &SharedCompetitor {
        self.sync.competitor()
    }
}

impl Registered for SharedState {
    type Settings = (LockOptions, Kind, Option<Arc<[u8]>>);

    fn settings(&self) -> Self::Settings {
        let c = self.competitor();
        (c.options.clone(), c.kind, c.keys.exclusive.clone())
    }

    fn waiters(&self) -> usize {
        self.sync.waiters()
    }
}

impl ReleaseTarget for SharedState {
    fn released(&self) {
        self.sync.notify_released();
    }

    fn queue_id(&self) -> &str {
        &self.sync.competitor().queue_id
    }
}

/// What a successful attempt yields.
pub(crate) struct SharedGrant {
    /// The holder whose Redis hold this is: the caller, or for a read of a read-write lock
    /// the holder minted for the process's shared read hold (see [`Reads`]).
    pub(crate) remote: HolderId,
    /// The read joined the process's shared read hold: nothing was sent.
    pub(crate) joined: bool,
    pub(crate) token: FencingToken,
    /// The holder's levels in the attempt's mode.
    pub(crate) count: u32,
    /// The holder held nothing before: a new lease (and token).
    pub(crate) fresh: bool,
    pub(crate) write: bool,
    pub(crate) deadline: Instant,
    pub(crate) watch: OnceLock<LeaseWatch>,
}

/// The Redis side of a shared lock, driven by the synchronizer's shared mode.
pub(crate) struct SharedCompetitor {
    pub(crate) client: RedisClient,
    pub(crate) keys: SharedKeys,
    pub(crate) name: LockName,
    pub(crate) label: Arc<str>,
    pub(crate) options: LockOptions,
    pub(crate) kind: Kind,
    /// Where its acquisitions, holds and renewals are counted.
    pub(crate) meter: Meter,
    me: Weak<SharedState>,
    last_attempt: Arc<Mutex<Option<Instant>>>,
    /// This process's entry in the waiting processes.
    pub(crate) queue_id: Arc<str>,
    /// How long a busy answer keeps this process's place while it waits for a message.
    claim: Duration,
    /// The permits each pending semaphore holder asks for (holders are minted per call).
    wants: Mutex<HashMap<HolderId, u32>>,
    /// A busy answer queued this process and no grant has taken it out since.
    queued: AtomicBool,
    /// Attempts sent (their sequence numbers, see `scripts/shared_leave.lua`).
    sent: AtomicU64,
    /// Attempts whose answer has not been processed yet.
    in_flight: Arc<AtomicU64>,
    /// The read holds this process's readers share (read-write lock only).
    reads: Mutex<Reads>,
}

/// Read cohorting: the readers of one process share Redis read holds.
///
/// A read that finds no joinable hold acquires one in Redis under a holder id minted for it;
/// later local reads **join** it without a round trip while it is young (less than
/// [`join_window`]: after that, new reads ask Redis again, where a waiting writer of another
/// process stops them, so a writer waits at most one such window plus the critical sections
/// in it), its lease has at least the minimum validity left, and it served fewer than
/// [`JOIN_BUDGET`] readers. Joined readers carry the hold's fencing token and lease watch; the
/// last one to leave releases the hold in Redis. Exclusion is unchanged: Redis sees one
/// reader for the process, and no writer, local or remote, is granted while it exists.
///
/// Invariant (under the `reads` lock): a reader's levels through shared
/// holds are counted here, the sum of `of[reader]`'s levels = its shared depth in the
/// synchronizer, and a hold's `levels` = the sum over its readers. Joining, re-entering and
/// leaving each change both in one critical section, so two releases of one reader (a guard
/// and its re-entry, unlocked at once) take one level each and exactly one of them is the
/// hold's last. A reader may read through more than one hold (two first reads of one holder
/// in flight at once each get one): its levels are kept per hold, never overwritten.
#[derive(Default)]
struct Reads {
    /// Local reader → the Redis read holds it uses (the newest last), and its levels in each.
    of: HashMap<HolderId, Vec<Joined>>,
    /// The Redis read holds and their local members.
    holds: HashMap<HolderId, ReadHold>,
    /// The hold new reads may join.
    current: Option<HolderId>,
}

/// A local reader's use of a Redis read hold.
#[derive(Clone, Copy)]
struct Joined {
    remote: HolderId,
    levels: u32,
}

/// One more level of a reader through `remote`.
fn add_level(joined: &mut Vec<Joined>, remote: HolderId) {
    match joined.iter_mut().find(|j| j.remote == remote) {
        Some(j) => j.levels += 1,
        None => joined.push(Joined { remote, levels: 1 }),
    }
}

/// What releasing one read level of a reader through a shared hold did ([`SharedCompetitor::leave`]).
enum Left {
    /// The reader reads through no shared hold: it releases its own hold.
    NotJoined,
    /// A level was taken; the hold keeps serving others (or this reader's other levels).
    Level,
    /// That was the hold's last level: the caller releases it in Redis.
    Last(HolderId),
}

struct ReadHold {
    token: FencingToken,
    /// Read levels of local readers on it now.
    levels: u32,
    /// Local readers it served.
    joins: u32,
    since: Instant,
    watch: LeaseWatch,
}

impl ReadHold {
    /// The grant of a reader through this hold (`remote`), at `count` read levels: nothing
    /// was sent, its token and lease watch are the hold's.
    fn grant(&self, remote: HolderId, count: u32) -> SharedGrant {
        SharedGrant {
            remote,
            joined: true,
            token: self.token,
            count,
            fresh: false,
            write: false,
            deadline: self.watch.deadline(),
            watch: OnceLock::from(self.watch.clone()),
        }
    }
}

/// Readers one Redis read hold serves at most.
const JOIN_BUDGET: u32 = 1024;

/// How long after its acquisition a Redis read hold takes new local readers: a tenth of the
/// spin wait (5 ms by default), at least 1 ms. It bounds what a writer of another process
/// waits for beyond the critical sections already running.
fn join_window(options: &LockOptions) -> Duration {
    (options.spin_wait() / 10).max(Duration::from_millis(1))
}

/// How long a busy answer keeps a process's place in the queue: past its spin wait (the
/// longest it parks without a message) with room for a slow round trip.
fn claim_window(options: &LockOptions) -> Duration {
    (options.spin_wait() * 2 + Duration::from_millis(200)).min(options.lease())
}

impl SharedCompetitor {
    /// The state shared by every handle of the lock named `name` in `client`: the existing
    /// one, or a new one.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] if the name is used by another kind of lock, or with other
    /// options, in this client.
    pub(crate) fn state(
        client: &RedisClient,
        name: LockName,
        options: LockOptions,
        kind: Kind,
        exclude_single: bool,
    ) -> Result<Arc<SharedState>> {
        let keys = SharedKeys::new(options.key_prefix(), &name, kind, exclude_single);
        let key = keys.holders.clone();
        let settings = (options, kind, keys.exclusive.clone());
        let state = client.inner.locks.get_or_create(
            key,
            &name,
            settings,
            |(options, kind, _): (LockOptions, Kind, _)| {
                let label: Arc<str> = Arc::from(name.to_string());
                let spin_wait = options.spin_wait();
                let meter = client.lock_meter(kind.primitive(), &name);
                Arc::new_cyclic(|me: &Weak<SharedState>| SharedState {
                    sync: Synchronizer::new(
                        Arc::clone(&label),
                        SharedCompetitor {
                            client: client.clone(),
                            keys,
                            name: name.clone(),
                            label,
                            claim: claim_window(&options),
                            options,
                            kind,
                            meter: meter.clone(),
                            me: me.clone(),
                            last_attempt: Arc::new(Mutex::new(None)),
                            queue_id: Arc::from(HolderId::new().to_string()),
                            wants: Mutex::new(HashMap::new()),
                            queued: AtomicBool::new(false),
                            sent: AtomicU64::new(0),
                            in_flight: Arc::new(AtomicU64::new(0)),
                            reads: Mutex::new(Reads::default()),
                        },
                        spin_wait,
                    )
                    .with_meter(meter),
                })
            },
        )?;
        Ok(state)
    }

    /// Records that `holder` (minted for one semaphore call) asks for `permits`; the returned
    /// guard forgets it.
    pub(crate) fn want(&self, holder: HolderId, permits: u32) -> Wanting<'_> {
        lock(&self.wants).insert(holder, permits);
        Wanting {
            competitor: self,
            holder,
        }
    }

    fn permits_for(&self, holder: HolderId) -> u32 {
        lock(&self.wants).get(&holder).copied().unwrap_or(1)
    }

    fn hold(&self, holder: HolderId, grant: &SharedGrant) -> Renewable {
        Renewable {
            key: self.keys.holders.clone(),
            turn: None,
            alias: None,
            leases: Some(self.keys.leases.clone()),
            holder,
            lease: self.options.lease(),
            period: self.options.renewal_period(),
            max_hold: self.options.max_hold(),
            deadline: grant.deadline,
            label: self.label.clone(),
            meter: self.meter.clone(),
            counts_loss: true,
        }
    }

    /// The lease watch of a grant (set by `after_acquire`; registered here only if it was
    /// not), renewed under the grant's Redis holder.
    pub(crate) fn watch(&self, grant: &SharedGrant) -> LeaseWatch {
        match grant.watch.get() {
            Some(w) => w.clone(),
            None => self.client.inner.renewal.register_hold(
                &self.client,
                self.hold(grant.remote, grant),
                grant.fresh,
            ),
        }
    }

    /// Ends `holder`'s renewal unless it still holds in the other mode.
    fn end_hold(&self, holder: HolderId, still_holds: impl FnOnce(&SharedState) -> bool) {
        if self.me.upgrade().is_some_and(|s| still_holds(&s)) {
            return;
        }
        self.client
            .inner
            .renewal
            .deregister(&self.keys.holders, holder);
    }

    /// A read of `holder` that joins the process's shared read hold, if one is joinable
    /// (see [`Reads`]); `None`: ask Redis.
    fn join(&self, holder: HolderId) -> Option<SharedGrant> {
        let mut reads = lock(&self.reads);
        let remote = reads.current?;
        let min_validity = min_validity(self.options.lease());
        let window = join_window(&self.options);
        let joinable = reads.holds.get(&remote).is_some_and(|h| {
            !h.watch.is_lost()
                && h.watch.deadline() >= Instant::now() + min_validity
                && h.joins < JOIN_BUDGET
                && h.since.elapsed() < window
        });
        if !joinable {
            reads.current = None;
            return None;
        }
        let h = reads.holds.get_mut(&remote)?;
        h.levels += 1;
        h.joins += 1;
        let grant = h.grant(remote, 1);
        add_level(reads.of.entry(holder).or_default(), remote);
        Some(grant)
    }

    /// The shared read hold `holder` uses, if it reads through one.
    pub(crate) fn read_hold_of(&self, holder: HolderId) -> Option<HolderId> {
        lock(&self.reads)
            .of
            .get(&holder)
            .and_then(|joined| joined.last())
            .map(|j| j.remote)
    }

    /// Takes one read level of `holder` off the shared hold it reads through, in one step
    /// with the decision whether it was the hold's last (then the caller releases the hold in
    /// Redis; nobody can join it any more).
    fn leave(&self, holder: HolderId) -> Left {
        let mut reads = lock(&self.reads);
        let Some(joined) = reads.of.get_mut(&holder) else {
            return Left::NotJoined;
        };
        let Some(newest) = joined.last_mut() else {
            reads.of.remove(&holder);
            return Left::NotJoined;
        };
        let remote = newest.remote;
        newest.levels = newest.levels.saturating_sub(1);
        if newest.levels == 0 {
            joined.pop();
        }
        if joined.is_empty() {
            reads.of.remove(&holder);
        }
        let last = reads.holds.get_mut(&remote).is_none_or(|h| {
            h.levels = h.levels.saturating_sub(1);
            h.levels == 0
        });
        if !last {
            return Left::Level;
        }
        reads.holds.remove(&remote);
        if reads.current == Some(remote) {
            reads.current = None;
        }
        Left::Last(remote)
    }

    /// One more read level of a reader that reads through a shared hold: nothing is sent
    /// (its Redis hold counts one read for the process); a lost hold answers `LeaseLost`.
    fn reenter_joined(&self, holder: HolderId, remote: HolderId) -> Result<Attempt<SharedGrant>> {
        let mut reads = lock(&self.reads);
        let lost = || Error::lease_lost(Arc::clone(&self.label), holder, LossReason::EntryGone);
        if reads.holds.get(&remote).is_none_or(|h| h.watch.is_lost()) {
            return Err(lost());
        }
        // Counted here, with the hold, in the same step as a concurrent release's (`leave`).
        let Some(joined) = reads.of.get_mut(&holder) else {
            return Err(lost());
        };
        let Some(j) = joined.iter_mut().find(|j| j.remote == remote) else {
            return Err(lost());
        };
        j.levels += 1;
        let levels = joined.iter().map(|j| j.levels).sum();
        let h = reads.holds.get_mut(&remote).ok_or_else(lost)?;
        h.levels += 1;
        Ok(Attempt::Acquired(h.grant(remote, levels)))
    }

    /// One acquire script call for `holder` (see `scripts/shared_acquire.lua`).
    fn attempt_remote(
        &self,
        holder: HolderId,
        write: bool,
        reentry: bool,
    ) -> impl std::future::Future<Output = Result<Attempt<SharedGrant>>> + Send + 'static {
        let permits = match self.kind {
            _ if write => 0,
            Kind::Semaphore { .. } => self.permits_for(holder),
            Kind::RwLock => 1,
        };
        let call = Call::of(self);
        let last = self.last_attempt.clone();
        let me = self.me.clone();
        let (label, claim, queue_id) = (self.label.clone(), self.claim, self.queue_id.clone());
        let seq = self.sent.fetch_add(1, Ordering::SeqCst) + 1;
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let answered = Answered(Arc::clone(&self.in_flight));
        self.client.clone().on_runtime(async move {
            let _answered = answered;
            let sent = Instant::now();
            *lock(&last) = Some(sent);
            let (reply, request) = request::send_fresh(|request| {
                let args = AcquireArgs {
                    holder,
                    write,
                    permits,
                    reentry,
                    request,
                    queue_id: &queue_id,
                    claim,
                    seq,
                };
                let call = &call;
                async move { call.acquire(&args).await }
            })
            .await;
            let reply = match reply {
                Ok(r) => r,
                Err(e) => {
                    // The script may have run (or may still run): no reply, an error after it
                    // (a refused `WAIT`), or one raised half-way. Undo it by id; the undo of an
                    // acquire that never ran only marks it cancelled (issue 35, defect 4). Not
                    // when the user may not run it (the undo would be refused too).
                    if request::worth_undoing(&e) {
                        call.undo(holder, write, request).await;
                    }
                    return Err(e);
                }
            };
            let lease = call.lease;
            match reply.as_slice() {
                [1, token, count, fresh] => {
                    let (Ok(token), Ok(count)) = (u64::try_from(*token), u32::try_from(*count))
                    else {
                        return Err(unexpected_reply(
                            "shared acquire script",
                            call.client.address(),
                            &reply,
                        ));
                    };
                    let deadline = renewal::deadline(sent, lease);
                    if deadline < Instant::now() + min_validity(lease) {
                        // The reply came too late to hold anything: give the level back.
                        let round_trip = sent.elapsed();
                        call.release_in_background(&me, holder, write, "a late grant");
                        return Err(Error::backend(
                            BackendKind::Timeout,
                            Some(call.client.address().to_owned()),
                            format!(
                                "the acquire script answered after {round_trip:?}, leaving less \
                                 than the minimum validity ({:?}) of a {lease:?} lease; the level \
                                 was given back. Raise the lease (or the network's speed)",
                                min_validity(lease)
                            ),
                            None,
                        ));
                    }
                    // A fresh hold took this process out of the waiting processes.
                    if *fresh == 1
                        && let Some(s) = me.upgrade()
                    {
                        s.competitor().queued.store(false, Ordering::Relaxed);
                    }
                    tracing::debug!(lock = %label, %holder, token, count, write, "acquired");
                    Ok(Attempt::Acquired(SharedGrant {
                        remote: holder,
                        joined: false,
                        token: FencingToken::new(token),
                        count,
                        fresh: *fresh == 1,
                        write,
                        deadline,
                        watch: OnceLock::new(),
                    }))
                }
                [0, ms] => {
                    if let Some(s) = me.upgrade() {
                        s.competitor().queued.store(true, Ordering::Relaxed);
                    }
                    tracing::trace!(lock = %label, %holder, ms, "busy");
                    let retry_after = u64::try_from(*ms).ok().map(Duration::from_millis);
                    Ok(Attempt::Busy { retry_after })
                }
                // Only a request that was undone answers -3, and nobody awaits it then; -7
                // again and again (requests of one holder overtaking each other): later.
                [-3 | request::OVERTAKEN] => Ok(Attempt::Busy { retry_after: None }),
                [-4] => {
                    tracing::debug!(lock = %label, %holder, "re-entry found the hold gone");
                    let renewal = &call.client.inner.renewal;
                    renewal.lose(&call.keys.holders, holder, LossReason::EntryGone);
                    Err(Error::lease_lost(
                        Arc::clone(&label),
                        holder,
                        LossReason::EntryGone,
                    ))
                }
                [-5, capacity] => Err(Error::invalid_input(
                    "permits",
                    format!(
                        "{permits} permits were asked of semaphore {label}, which has {capacity}"
                    ),
                    "ask for at most the semaphore's permits, or raise them with \
                     Semaphore::set_permits",
                )),
                [-6] => Err(Error::invalid_input(
                    "upgrade",
                    format!(
                        "{holder} holds {label} to read (in another process) and asked to write"
                    ),
                    "release the read lock first; a read lock is never upgraded",
                )),
                _ => Err(unexpected_reply(
                    "shared acquire script",
                    call.client.address(),
                    &reply,
                )),
            }
        })
    }

    /// Releases one level of `holder` (write or shared) remotely: `-1` not held, else the
    /// levels left in that mode. Retried once with the same request id if the connection
    /// breaks.
    pub(crate) async fn release_remote(&self, holder: HolderId, write: bool) -> Result<i64> {
        Call::of(self).release(holder, write, None).await
    }

    /// The operator's view: who holds, with what (see `scripts/shared_admin.lua`).
    pub(crate) async fn inspect(&self) -> Result<SharedStatus> {
        let reply: redis::Value = self.admin("inspect", 0).await?;
        parse_status(&reply)
            .ok_or_else(|| unexpected_reply("shared inspect script", self.client.address(), &reply))
    }

    /// An admin script call: `clear` or `permits` (with `n`), or `inspect`.
    pub(crate) async fn admin<T: redis::FromRedisValue>(&self, op: &str, n: u32) -> Result<T> {
        let keys = &self.keys;
        let publish = self.client.publish_arg();
        let call = scripts::call::SharedAdmin {
            holders: &keys.holders,
            leases: &keys.leases,
            channel: &keys.channel,
            capacity_key: keys.permits.as_deref(),
            op,
            n,
            publish,
        };
        self.client
            .exec("shared admin script", |mut c| async move {
                call.eval(&mut c).await
            })
            .await
    }
}

/// Forgets a pending semaphore holder's permits when its call ends (however it ends).
pub(crate) struct Wanting<'a> {
    competitor: &'a SharedCompetitor,
    holder: HolderId,
}

impl Drop for Wanting<'_> {
    fn drop(&mut self) {
        lock(&self.competitor.wants).remove(&self.holder);
    }
}

/// Counts an attempt as answered when dropped (see `SharedCompetitor::in_flight`).
struct Answered(Arc<AtomicU64>);

impl Drop for Answered {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One acquire request.
struct AcquireArgs<'a> {
    holder: HolderId,
    write: bool,
    permits: u32,
    reentry: bool,
    request: u64,
    queue_id: &'a str,
    claim: Duration,
    /// This attempt's sequence number in its process.
    seq: u64,
}

/// What a script call needs, owned (attempts run in `'static` futures).
#[derive(Clone)]
struct Call {
    client: RedisClient,
    keys: SharedKeys,
    kind: Kind,
    lease: Duration,
    label: Arc<str>,
}

impl Call {
    fn of(c: &SharedCompetitor) -> Self {
        Call {
            client: c.client.clone(),
            keys: c.keys.clone(),
            kind: c.kind,
            lease: c.options.lease(),
            label: c.label.clone(),
        }
    }

    async fn acquire(&self, a: &AcquireArgs<'_>) -> Result<Vec<i64>> {
        let holder = a.holder.to_string();
        let record = self.keys.record(&holder);
        let keys = &self.keys;
        let record_ms = request::record_ttl_ms(self.client.command_timeout());
        let lease_ms = scripts::lease_ms(self.lease);
        let claim_ms = scripts::lease_ms(a.claim);
        let capacity = self.kind.capacity();
        let publish = self.client.publish_arg();
        let synced = self.client.synced();
        let eval = scripts::call::SharedAcquire {
            holders: &keys.holders,
            leases: &keys.leases,
            queue: &keys.queue,
            wants: &keys.wants,
            fence: &keys.fence,
            record: &record,
            channel: &keys.channel,
            capacity_or_excluded: keys.permits.as_deref().or(keys.exclusive.as_deref()),
            holder: &holder,
            mode: if a.write { "w" } else { "r" },
            permits: a.permits,
            lease_ms,
            queue_id: a.queue_id,
            claim_ms,
            request: a.request,
            record_ms,
            reentry: if a.reentry { "1" } else { "" },
            capacity,
            exclude: if keys.exclusive.is_some() { "x" } else { "" },
            seq: a.seq,
            publish,
        }
        .cmd();
        let eval = &eval;
        let (reply, acked): (Vec<i64>, Option<usize>) = self
            .client
            .exec("shared acquire script", |mut c| async move {
                // A grant counts once the replicas have it, as the single lock's: WAIT behind
                // it, where it ran (issue 35, defects 2 and 4).
                let granted = |r: &Vec<i64>| r.first() == Some(&1);
                conn::eval_then_wait(&mut c, &SHARED_ACQUIRE, eval, synced, granted).await
            })
            .await?;
        if let (Some((wanted, within)), Some(acked)) = (synced, acked)
            && acked < wanted
        {
            // Not on enough replicas: a failover could lose it (two writers, an over-granted
            // semaphore). Give the level back by the request id and report.
            if let Err(e) = self.release(a.holder, a.write, Some(a.request)).await {
                tracing::warn!(error = %e, "giving back a grant the replicas did not acknowledge failed; it ends with its lease");
            }
            return Err(conn::unacknowledged(
                self.client.address(),
                false,
                acked,
                (wanted, within),
            ));
        }
        Ok(reply)
    }

    async fn release(&self, holder: HolderId, write: bool, undo: Option<u64>) -> Result<i64> {
        let holder = holder.to_string();
        let record = self.keys.record(&holder);
        let keys = &self.keys;
        let record_ms = request::record_ttl_ms(self.client.command_timeout());
        let lease_ms = scripts::lease_ms(self.lease);
        let request = request::next_id();
        let undo = undo.map(|id| id.to_string()).unwrap_or_default();
        let publish = self.client.publish_arg();
        let capacity = self.kind.capacity();
        let call = scripts::call::SharedRelease {
            holders: &keys.holders,
            leases: &keys.leases,
            queue: &keys.queue,
            wants: &keys.wants,
            channel: &keys.channel,
            record: &record,
            capacity_key: keys.permits.as_deref(),
            holder: &holder,
            mode: if write { "w" } else { "r" },
            lease_ms,
            request,
            record_ms,
            undo: &undo,
            publish,
            capacity,
        };
        self.client
            .exec("shared release script", |mut c| async move {
                call.eval(&mut c).await
            })
            .await
    }

    /// Takes the process `queue_id` out of the waiting processes, unless an attempt after
    /// `seq` renewed its place (see `scripts/shared_leave.lua`).
    async fn leave(&self, queue_id: &str, seq: u64) -> Result<i64> {
        let keys = &self.keys;
        let publish = self.client.publish_arg();
        let capacity = self.kind.capacity();
        let call = scripts::call::SharedLeave {
            holders: &keys.holders,
            leases: &keys.leases,
            queue: &keys.queue,
            wants: &keys.wants,
            channel: &keys.channel,
            capacity_key: keys.permits.as_deref(),
            queue_id,
            seq,
            publish,
            capacity,
        };
        self.client
            .exec("leaving the queue", |mut c| async move {
                call.eval(&mut c).await
            })
            .await
    }

    /// After an acquire whose reply never came, undoes it by its request id (releases the
    /// level if it ran, else marks it cancelled). The undo is put on the connection behind
    /// the acquire before this returns; a failed undo leaves the hold to its lease.
    async fn undo(&self, holder: HolderId, write: bool, request: u64) {
        let call = self.clone();
        let mut undo = Box::pin(async move {
            match call.release(holder, write, Some(request)).await {
                Ok(-2) => tracing::debug!(%holder, "cancelled an acquire that had not run"),
                Ok(n) => {
                    tracing::info!(%holder, left = n, "undid an acquire whose reply never came")
                }
                Err(e) => tracing::warn!(%holder, error = %e,
                    "could not undo a timed-out acquire; if it ran, its hold ends with its lease"),
            }
        });
        if futures::poll!(undo.as_mut()).is_pending() {
            self.client.spawn(undo);
        }
    }

    /// Releases one level in the background (a grant nobody can use: `why`), then wakes the
    /// local queue's head.
    fn release_in_background(
        &self,
        me: &Weak<SharedState>,
        holder: HolderId,
        write: bool,
        why: &'static str,
    ) {
        let (call, me) = (self.clone(), me.clone());
        self.client.spawn(async move {
            if let Err(e) = call.release(holder, write, None).await {
                tracing::warn!(lock = %call.label, %holder, error = %e,
                    "release of {why} failed; the hold ends with its lease");
            }
            if let Some(state) = me.upgrade() {
                state.sync.notify_released();
            }
        });
    }
}

impl Competitor for SharedCompetitor {
    type Grant = SharedGrant;

    fn grant_deadline(&self, grant: &SharedGrant) -> Option<Instant> {
        Some(grant.deadline)
    }

    fn attempt(
        &self,
        holder: HolderId,
    ) -> impl std::future::Future<Output = Result<Attempt<SharedGrant>>> + Send + 'static {
        self.attempt_remote(holder, true, false)
    }

    fn reenter(
        &self,
        holder: HolderId,
    ) -> impl std::future::Future<Output = Result<Attempt<SharedGrant>>> + Send + 'static {
        self.attempt_remote(holder, true, true)
    }

    /// A read of a read-write lock joins the process's shared read hold when it can (no
    /// round trip), else acquires a new one under a minted holder (see [`Reads`]); a
    /// semaphore's permits are always asked of Redis.
    fn attempt_shared(
        &self,
        holder: HolderId,
    ) -> impl std::future::Future<Output = Result<Attempt<SharedGrant>>> + Send + 'static {
        use futures::future::Either;
        if self.kind != Kind::RwLock {
            return Either::Right(self.attempt_remote(holder, false, false));
        }
        match self.join(holder) {
            Some(grant) => Either::Left(std::future::ready(Ok(Attempt::Acquired(grant)))),
            None => Either::Right(self.attempt_remote(HolderId::new(), false, false)),
        }
    }

    /// A reader that reads through a shared hold re-enters locally; a writer's covered read
    /// (or a semaphore holder) asks Redis.
    fn reenter_shared(
        &self,
        holder: HolderId,
    ) -> impl std::future::Future<Output = Result<Attempt<SharedGrant>>> + Send + 'static {
        use futures::future::Either;
        match self.read_hold_of(holder) {
            Some(remote) => Either::Left(std::future::ready(self.reenter_joined(holder, remote))),
            None => Either::Right(self.attempt_remote(holder, false, true)),
        }
    }

    fn after_acquire(&self, holder: HolderId, grant: &SharedGrant) {
        if grant.joined {
            // Its hold's registration serves it (`join` set its watch).
            return;
        }
        let watch = self.client.inner.renewal.register_hold(
            &self.client,
            self.hold(grant.remote, grant),
            grant.fresh,
        );
        let _ = grant.watch.set(watch.clone());
        if grant.remote != holder {
            // A new shared read hold: its first member, and the one new reads join.
            let mut reads = lock(&self.reads);
            reads.holds.insert(
                grant.remote,
                ReadHold {
                    token: grant.token,
                    levels: 1,
                    joins: 1,
                    since: Instant::now(),
                    watch,
                },
            );
            add_level(reads.of.entry(holder).or_default(), grant.remote);
            reads.current = Some(grant.remote);
        }
    }

    /// The write levels ended; the renewal goes on while the holder still reads (a
    /// downgrade).
    fn after_release(&self, holder: HolderId) {
        self.end_hold(holder, |s| s.sync.shared_depth(holder) > 0);
    }

    /// The shared levels ended; the renewal goes on while the holder still writes (it read
    /// under its write). A reader through a shared hold is left to its release, which
    /// leaves the hold (and releases it in Redis if it was the last member).
    fn after_release_shared(&self, holder: HolderId) {
        if self.read_hold_of(holder).is_some() {
            return;
        }
        self.end_hold(holder, |s| {
            s.sync.owner().is_some_and(|(owner, _)| owner == holder)
        });
    }

    fn abandon(&self, holder: HolderId, grant: SharedGrant) {
        tracing::debug!(lock = %self.label, %holder, token = grant.token.get(), "releasing an abandoned grant");
        let remote = if grant.joined {
            // The last member of a shared read hold ends its renewal; any other abandoned
            // grant never registered one (`after_acquire` did not run), and the holder may
            // renew an earlier hold of its own (a write whose covered read was abandoned).
            let Left::Last(last) = self.leave(holder) else {
                return;
            };
            self.client
                .inner
                .renewal
                .deregister(&self.keys.holders, last);
            last
        } else {
            grant.remote
        };
        Call::of(self).release_in_background(&self.me, remote, grant.write, "an abandoned grant");
    }

    fn prepare_wait(&self) -> impl std::future::Future<Output = Notifications> + Send {
        let target: Weak<dyn ReleaseTarget> = self.me.clone();
        let last = *lock(&self.last_attempt);
        self.client
            .subscribe_releases(self.keys.channel.clone(), target, last)
    }

    /// Unsubscribes, and takes this process out of the waiting processes if a busy answer
    /// put it there (its waiters gave up: nobody should wait for it to claim its place).
    /// Nothing while a local task waits: the hook may run for an attempt that ended in the
    /// background after new waiters queued (the `Competitor` contract).
    fn queue_drained(&self) {
        if self.me.upgrade().is_some_and(|s| s.sync.waiters() > 0) {
            return;
        }
        self.client
            .inner
            .notifier
            .unsubscribe(&self.client, &self.keys.channel);
        // An attempt still in flight may be a waiter's on its way into the queue (its busy
        // answer renews the place it then waits in): the place stays; a later drain, or the
        // claim window, ends it.
        if self.in_flight.load(Ordering::SeqCst) == 0 && self.queued.swap(false, Ordering::Relaxed)
        {
            // Only entries of attempts sent before now: a waiter that arrives meanwhile and
            // gets busy keeps the place its answer renewed.
            let seq = self.sent.load(Ordering::SeqCst);
            let (call, id) = (Call::of(self), self.queue_id.clone());
            self.client.spawn(async move {
                if let Err(e) = call.leave(&id, seq).await {
                    tracing::debug!(error = %e, "leaving the queue failed; the entry ends with its claim window");
                }
            });
        }
    }
}

/// The builder setters of a shared lock: the settings that apply to the read-write lock and
/// the semaphore (no fence expiry: their fencing counter is persistent), said once for both.
macro_rules! shared_builder_setters {
    ($builder:ident, $start:literal) => {
        slate_core::lock_options_setters!(
            $builder,
            slate_redis,
            setup = "# let client = slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\")?;",
            start = $start,
            [
                lease,
                renewal_period,
                spin_wait,
                max_hold,
                key_prefix,
                options
            ],
        );
    };
}
pub(crate) use shared_builder_setters;

/// The accessors every shared lock has (name, key, client, options), written once for
/// [`RwLock`](crate::RwLock) and [`Semaphore`](crate::Semaphore).
macro_rules! shared_lock_accessors {
    ($lock:ident, $build:literal, $name:literal, $suffix:literal) => {
        impl $lock {
            #[doc = concat!("The lock's name.\n\n# Examples\n\n```no_run\n# #[tokio::main(flavor = \"current_thread\")] async fn main() -> slate_redis::Result<()> {\n# let client = slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\")?;\nlet lock = ", $build, ";\nassert_eq!(lock.name().to_string(), \"", $name, "\");\n# Ok(()) }\n```")]
            #[must_use]
            pub fn name(&self) -> &LockName {
                &self.state.competitor().name
            }

            #[doc = concat!("The Redis key of the holders hash (`<prefix>{<name>}:", $suffix, "`).\n\n# Examples\n\n```no_run\n# #[tokio::main(flavor = \"current_thread\")] async fn main() -> slate_redis::Result<()> {\n# let client = slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\")?;\nlet lock = ", $build, ";\nassert_eq!(lock.key(), b\"slate:{", $name, "}:", $suffix, "\");\n# Ok(()) }\n```")]
            #[must_use]
            pub fn key(&self) -> &[u8] {
                &self.state.competitor().keys.holders
            }

            #[doc = concat!("The client the lock talks through.\n\n# Examples\n\n```no_run\n# #[tokio::main(flavor = \"current_thread\")] async fn main() -> slate_redis::Result<()> {\n# let client = slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\")?;\nlet lock = ", $build, ";\nassert_eq!(lock.client().address(), client.address());\n# Ok(()) }\n```")]
            #[must_use]
            pub fn client(&self) -> &RedisClient {
                &self.state.competitor().client
            }

            #[doc = concat!("The options the lock was built with.\n\n# Examples\n\n```no_run\n# #[tokio::main(flavor = \"current_thread\")] async fn main() -> slate_redis::Result<()> {\n# let client = slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\")?;\nlet lock = ", $build, ";\nassert_eq!(lock.options().lease(), std::time::Duration::from_secs(30));\n# Ok(()) }\n```")]
            #[must_use]
            pub fn options(&self) -> &LockOptions {
                &self.state.competitor().options
            }
        }
    };
}
pub(crate) use shared_lock_accessors;
