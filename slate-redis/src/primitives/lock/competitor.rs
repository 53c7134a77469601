//! The Redis side of the single lock, driven by the synchronizer: the acquire and release
//! scripts, the fair turn between processes, and the hold passed between local holders.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::*;

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
    /// Where its acquisitions, holds and renewals are counted.
    pub(crate) meter: Meter,
    pub(super) me: Weak<LockShared>,
    /// When the last attempt was sent (for [`Notifications::Live`]).
    pub(super) last_attempt: Arc<Mutex<Option<Instant>>>,
    /// The turn between processes.
    pub(crate) turn: Turn,
    /// The hold being passed between local holders, if the current one allows passes.
    pub(crate) cohort: Mutex<Option<Cohort>>,
    /// This process's place in the lock's line of waiting processes.
    pub(crate) line: Arc<InLine>,
    /// Replies a multi-lock's batch obtained for this lock, each waiting for its holder's
    /// next attempt (see [`Primed`]); almost always empty.
    pub(crate) primed: Mutex<Vec<Primed>>,
}

/// How long a batch's busy answer may serve as its lock's attempt (see
/// [`RedisCompetitor::take_primed`]): an attempt taken at once, as the multi-lock makes it,
/// is well within it.
const PRIMED_BUSY_FRESH: Duration = Duration::from_millis(100);

/// A reply of this lock's `acquire.lua` that a multi-lock's batch (`acquire_many.lua`, see
/// [`acquire_batch`]) obtained for `holder`: the holder's next (non-re-entry) attempt takes
/// it instead of sending one, and handles it exactly as its own reply. One that no attempt
/// takes is given back by the multi-lock ([`RedisCompetitor::unprime`]).
pub(crate) struct Primed {
    holder: HolderId,
    /// The batch's request id (what an undo names).
    request: u64,
    /// When the batch was sent (the grant's lease runs from then).
    sent: Instant,
    /// When its reply came (a busy answer is taken only fresh from then).
    answered: Instant,
    reply: Vec<i64>,
    /// The batch counted as an attempt in flight for this lock until the reply is handled.
    flying: Flying,
}

impl Primed {
    /// Whether the reply granted (a fresh hold or a re-entry).
    pub(crate) fn granted(&self) -> bool {
        is_grant(&self.reply)
    }
}

/// Whether an `acquire.lua` reply grants: a fresh hold (`{1, ..}`) or a re-entry (`{2, ..}`).
fn is_grant(reply: &[i64]) -> bool {
    matches!(reply.first(), Some(1 | 2))
}

/// Whether this process may have a place in the lock's line of waiting processes (`queue`):
/// a busy answer put it there and no grant has taken it out since; and the attempts in flight,
/// one of which may be a waiter's on its way into the line. A process whose local waiters all
/// left gives its place back (`leave.lua`), so that no release reserves the lock for a process
/// that will not claim it.
#[derive(Debug, Default)]
pub(crate) struct InLine {
    queued: AtomicBool,
    in_flight: AtomicUsize,
}

/// An attempt in flight, counted in [`InLine`] while it lives.
struct Flying(Arc<InLine>);

impl Flying {
    fn start(line: &Arc<InLine>) -> Self {
        line.in_flight.fetch_add(1, Ordering::SeqCst);
        Flying(Arc::clone(line))
    }

    /// Records what the attempt's answer did to the process's place in line.
    fn answered(&self, queued: bool) {
        self.0.queued.store(queued, Ordering::SeqCst);
    }
}

impl Drop for Flying {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl RedisCompetitor {
    /// The reply primed for `holder`'s next attempt, taken (not for a re-entry-only call,
    /// whose script refuses where the batch's would have granted), and the attempt's count in
    /// flight: the primed reply's, or a new one.
    fn take_primed(&self, holder: HolderId, reentry: bool) -> (Option<Primed>, Flying) {
        let taken = (!reentry)
            .then(|| {
                let mut primed = lock(&self.primed);
                let i = primed.iter().position(|p| p.holder == holder)?;
                Some(primed.swap_remove(i))
            })
            .flatten();
        // The attempt's count starts before the primed reply's ends (when it is dropped): no
        // gap in which a drain would leave the line.
        let flying = Flying::start(&self.line);
        match taken {
            Some(p) if p.granted() || p.answered.elapsed() < PRIMED_BUSY_FRESH => (Some(p), flying),
            Some(p) => {
                // A busy answer this old may predate a release (the holder's attempt was held
                // up in the local queue meanwhile): it is asked again instead. Its place in
                // line stays.
                p.flying.answered(!self.turn.queue_id.is_empty());
                (None, flying)
            }
            None => (None, flying),
        }
    }

    /// Takes back the reply primed for `holder` by the batch `request` if no attempt took it,
    /// and gives it back in the background (see [`give_back`](Self::give_back)). Answers
    /// whether the reply was still there.
    pub(crate) fn unprime(&self, holder: HolderId, request: u64) -> bool {
        let Some(left) = self.take_back(holder, request) else {
            return false;
        };
        if let Some(shared) = self.me.upgrade() {
            self.client.spawn(async move {
                drop(shared.competitor().give_back(left).await);
            });
        }
        true
    }

    /// The reply primed for `holder` by the batch `request`, if no attempt took it.
    pub(crate) fn take_back(&self, holder: HolderId, request: u64) -> Option<Primed> {
        let mut primed = lock(&self.primed);
        let i = primed
            .iter()
            .position(|p| p.holder == holder && p.request == request)?;
        Some(primed.swap_remove(i))
    }

    /// Gives back a primed reply no attempt took: a grant is released (one plain level); a
    /// busy answer left the process in line, which it leaves unless a task of this process
    /// waits.
    ///
    /// The grant is known (not an outcome in doubt, which `compensate` undoes by request id).
    /// By id it could miss: a later request of the same holder (a re-entry sent meanwhile)
    /// supersedes the batch's record, and the undo would only mark it, leaving the level
    /// held. A plain release also keeps the turn for this process's local waiters and wakes
    /// them. A grant whose lease has run out (never renewed: nobody took it) is not released:
    /// its level is gone, and a release could take a later hold of the same holder's.
    pub(crate) async fn give_back(&self, left: Primed) -> Result<()> {
        let (granted, holder, sent) = (left.granted(), left.holder, left.sent);
        left.flying
            .answered(!granted && !self.turn.queue_id.is_empty());
        drop(left);
        let lease = self.options.lease();
        if !granted {
            self.queue_drained();
            return Ok(());
        }
        if renewal::deadline(sent, lease) <= Instant::now() {
            return Ok(());
        }
        tracing::debug!(lock = %self.label, %holder, "giving back a batch's grant no attempt took");
        release_one(
            &self.client,
            &self.keys,
            &self.me,
            holder,
            1,
            lease,
            &self.turn,
            (&self.label, "a batch's grant no attempt took"),
        )
        .await
        .map(drop)
    }

    /// A release that kept the turn for this process's local waiters has ended: if they all
    /// left meanwhile, nobody here will claim it, so it is handed on as a drain would.
    pub(crate) fn turn_kept(&self) {
        self.line.queued.store(true, Ordering::SeqCst);
        self.queue_drained();
    }

    /// Sends `leave.lua` in the background: gives the process's place in line back and hands
    /// on a turn reserved for it.
    fn leave_line(&self) {
        let (client, keys, turn) = (self.client.clone(), self.keys.clone(), self.turn.clone());
        let (line, me) = (Arc::clone(&self.line), self.me.clone());
        let lease_ms = scripts::lease_ms(self.options.lease());
        self.client.spawn(async move {
            let busy = |line: &InLine| {
                me.upgrade().is_some_and(|s| s.sync.waiters() > 0)
                    || line.in_flight.load(Ordering::SeqCst) > 0
            };
            // Checked again as the task runs: a waiter that came meanwhile keeps the place.
            if busy(&line) {
                line.queued.store(true, Ordering::SeqCst);
                return;
            }
            let call = scripts::call::Leave {
                queue: &keys.queue,
                turn: &keys.turn,
                channel: &keys.channel,
                queue_id: &turn.queue_id,
                reserve_ms: scripts::lease_ms(turn.reserve),
                lease_ms,
                publish: client.publish_arg(),
            };
            let left: Result<i64> = client
                .exec("leave script", |mut c| async move { call.eval(&mut c).await })
                .await;
            if let Err(e) = left {
                tracing::debug!(error = %e, "leaving the line failed; a turn reserved for this process lapses by itself");
                line.queued.store(true, Ordering::SeqCst);
            }
            // A waiter that came between the check above and the script's run may have had
            // its fresh place taken out: its head asks again at once.
            if busy(&line)
                && let Some(s) = me.upgrade()
            {
                s.sync.notify_released();
            }
        });
    }

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
            alias: Some(self.keys.holder.clone()),
            leases: None,
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
pub(super) fn release_in_background(
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
        let released = release_one(
            &client2,
            &keys2,
            &me,
            holder,
            holds,
            lease,
            &turn,
            (&label, why),
        )
        .await;
        drop(released);
    });
}

/// Releases `holds` levels of `holder` that no local holder has: keeps the turn for this
/// process's local waiters (or hands it on if they left) and wakes them. A failure is logged
/// (the entry ends with its lease) and answered.
#[allow(clippy::too_many_arguments)]
async fn release_one(
    client: &RedisClient,
    keys: &Keys,
    me: &Weak<LockShared>,
    holder: HolderId,
    holds: u32,
    lease: Duration,
    turn: &Turn,
    (label, why): (&Arc<str>, &'static str),
) -> Result<i64> {
    let waiters = me.upgrade().is_some_and(|s| s.sync.waiters() > 0);
    let mut release = Release::plain(holder, lease, turn, waiters);
    release.holds = holds;
    let released = release_remote(client, keys, release).await;
    if let Err(e) = &released {
        tracing::warn!(lock = %label, %holder, error = %e, "release of {why} failed; the entry ends with its lease");
    }
    if let Some(shared) = me.upgrade() {
        if waiters && matches!(released, Ok(0)) {
            shared.competitor().turn_kept();
        }
        shared.sync.notify_released();
    }
    released
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
/// not held, `0` released, `n` still held. Sent again, with the same request id, if the
/// connection breaks before the reply.
///
/// The record of a release that ends a hold goes with the lock hash (`scripts/release.lua`), so
/// a resend whose first send did release the last level finds no field and answers `-1`. That
/// answer is read as released (`0`) when the hold's lease cannot have run out by the time the
/// reply came (the renewal service's deadline for it is still ahead): nothing but a release
/// deletes a field before its lease ends, except an operator's force-unlock or a server that
/// lost its data, and the hold was being given up anyway.
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
    // An undo's cancel mark must outlive any copy of the acquire it cancels: a multi-node
    // lock's node acquire keeps its own record for its lease and two command timeouts
    // (`Node::acquire`), and a copy may arrive within that.
    let record_ms = match release.undo {
        Some(_) => request::record_ttl_ms(client.command_timeout()).max(scripts::lease_ms(
            release.lease + client.command_timeout() * 2,
        )),
        None => request::record_ttl_ms(client.command_timeout()),
    };
    let undo = release.undo.map(|id| id.to_string()).unwrap_or_default();
    let waiters = u8::from(release.local_waiters);
    let publish = client.publish_arg();
    let mut request = release.request;
    let mut resends = 0;
    let (reply, resent) = loop {
        let call = scripts::call::Release {
            lock: &keys.lock,
            channel: &keys.channel,
            queue: &keys.queue,
            turn: &keys.turn,
            record: &record,
            holder: &holder_arg,
            lease_ms: ms,
            queue_id,
            tenure,
            local_waiters: waiters,
            reserve_ms: reserve,
            request,
            record_ms,
            undo: &undo,
            publish,
            holds: release.holds,
            resent: "",
        };
        let (reply, resent) = client
            .exec_resending("release script", |mut c, resent| async move {
                let call = scripts::call::Release {
                    resent: if resent { "1" } else { "" },
                    ..call
                };
                call.eval::<i64>(&mut c).await
            })
            .await?;
        // Overtaken by a later request of the same holder (another task's, sent after this
        // one but run before): nothing ran, unless this was a resend, whose first send may
        // have run before that request; a first send is sent again as a new request.
        if reply == request::OVERTAKEN && resent && release.undo.is_none() {
            return Err(may_have_run(client, "release"));
        }
        if reply == request::OVERTAKEN
            && release.undo.is_none()
            && resends < request::OVERTAKEN_RESENDS
        {
            resends += 1;
            request = request::next_id();
            continue;
        }
        break (reply, resent);
    };
    if release.undo.is_none() && released_by_first_send(client, keys, release.holder, reply, resent)
    {
        return Ok(0);
    }
    Ok(reply)
}

/// Whether a plain release's `reply` of "not held" (-1) to a resend means that its first send
/// released the last level (see [`release_remote`]): the hold's lease cannot have run out yet.
fn released_by_first_send(
    client: &RedisClient,
    keys: &Keys,
    holder: HolderId,
    reply: i64,
    resent: bool,
) -> bool {
    let gone = reply == -1
        && resent
        && client
            .inner
            .renewal
            .lease_ahead(&keys.lock, holder, Instant::now());
    if gone {
        tracing::debug!(%holder, "a resent release found the hold gone within its lease: the first send released it");
    }
    gone
}

/// The remote releases of several names of one server (or cluster slot), one level each, in
/// one `release_many.lua` call (the multi-lock's unlock): each name's answer, as
/// [`release_remote`] answers for one.
///
/// Sent again, with the same request id, if the connection breaks before the reply (each
/// name's record answers a resend). A name the call answers overtaken (a later request of the
/// same holder ran first) is answered `Ok(None)`: nothing ran there, and the caller releases
/// it again alone ([`RedisCompetitor::release_remote`], under a fresh id), after finishing the
/// others; after a resend that answer is an error (its first send may have run). A failed
/// call fails every name: nothing says which ran, and a blind retry could take a level twice.
pub(crate) async fn release_batch(
    names: &[(&RedisCompetitor, HolderId, bool)],
) -> Vec<Result<Option<i64>>> {
    let Some((first, _, _)) = names.first() else {
        return Vec::new();
    };
    let client = &first.client;
    let holders: Vec<String> = names.iter().map(|(_, h, _)| h.to_string()).collect();
    let records: Vec<Vec<u8>> = names
        .iter()
        .zip(&holders)
        .map(|((c, _, _), h)| c.keys.record(h))
        .collect();
    let many: Vec<scripts::call::ReleaseName<'_>> = names
        .iter()
        .zip(holders.iter().zip(&records))
        .map(
            |(&(c, holder, waiters), (holder_arg, record))| scripts::call::ReleaseName {
                lock: &c.keys.lock,
                channel: &c.keys.channel,
                queue: &c.keys.queue,
                turn: &c.keys.turn,
                record,
                holder: holder_arg,
                lease_ms: scripts::lease_ms(c.options.lease()),
                queue_id: &c.turn.queue_id,
                tenure: c.turn.tenure,
                local_waiters: u8::from(waiters),
                reserve_ms: scripts::lease_ms(c.turn.reserve),
                holds: c.holds(holder),
            },
        )
        .collect();
    let call = scripts::call::ReleaseMany {
        names: &many,
        request: request::next_id(),
        record_ms: request::record_ttl_ms(client.command_timeout()),
        publish: client.publish_arg(),
        resent: "",
    };
    let sent = client
        .exec_resending("release_many script", |mut c, resent| async move {
            let call = scripts::call::ReleaseMany {
                resent: if resent { "1" } else { "" },
                ..call
            };
            conn::eval::<Vec<redis::Value>>(&mut c, &scripts::RELEASE_MANY, &call.cmd()).await
        })
        .await
        .and_then(|(replies, resent)| {
            if replies.len() == names.len() {
                Ok((replies, resent))
            } else {
                Err(unexpected_reply(
                    "release_many script",
                    client.address(),
                    &replies,
                ))
            }
        });
    let (replies, resent) = match sent {
        Ok(sent) => sent,
        Err(e) => {
            // The call's error for the first name; the others say which call failed.
            let others: Vec<_> = (1..names.len())
                .map(|_| {
                    Err(Error::backend(
                        e.backend_kind().unwrap_or(BackendKind::Io),
                        Some(client.address().to_owned()),
                        format!("released in one call with other names, which failed: {e}"),
                        None,
                    ))
                })
                .collect();
            return std::iter::once(Err(e)).chain(others).collect();
        }
    };
    names
        .iter()
        .zip(replies)
        .map(|(&(c, holder, _), reply)| {
            let reply = match reply {
                redis::Value::Int(n) => n,
                // This name's own error, its code first (the script's header).
                redis::Value::BulkString(text) => return Err(name_error(client, &text)),
                other => {
                    return Err(unexpected_reply(
                        "release_many script",
                        client.address(),
                        &other,
                    ));
                }
            };
            if reply == request::OVERTAKEN {
                if resent {
                    return Err(may_have_run(&c.client, "release_many"));
                }
                return Ok(None);
            }
            if released_by_first_send(&c.client, &c.keys, holder, reply, resent) {
                return Ok(Some(0));
            }
            Ok(Some(reply))
        })
        .collect()
}

/// One name's error in a `release_many.lua` reply (`WRONGTYPE ...`), classified as the same
/// error answered to a single call would be.
fn name_error(client: &RedisClient, text: &[u8]) -> Error {
    let mut line = Vec::with_capacity(text.len() + 3);
    line.push(b'-');
    line.extend(text.iter().filter(|b| !matches!(b, b'\r' | b'\n')));
    line.extend_from_slice(b"\r\n");
    let e = match redis::parse_redis_value(&line) {
        Ok(redis::Value::ServerError(e)) => redis::RedisError::from(e),
        _ => redis::RedisError::from((redis::ErrorKind::Client, "an unreadable error text")),
    };
    crate::client::error::from_redis(e, "release_many script", client.address())
}

/// The error of a resent request that was overtaken by a later request of its holder: its first
/// send may or may not have run.
fn may_have_run(client: &RedisClient, what: &str) -> Error {
    Error::backend(
        BackendKind::Io,
        Some(client.address().to_owned()),
        format!(
            "the {what} was sent again after its connection broke, and a later request of the \
             same holder ran before the resend: the first send may or may not have run"
        ),
        None,
    )
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
    /// Fencing tokens a first acquisition reserves for local passes (1: none; more needs a
    /// turn, see `scripts/acquire.lua` ARGV[9]).
    pub(crate) block: u32,
    /// A send may raise the slot's fencing counter to the server's clock before taking a
    /// token, when the client needs it for that slot on the server the send reaches
    /// ([`RedisClient::fence_floor_needed`]); never on a multi-node lock's node.
    pub(crate) raise: bool,
    /// How long the request record is kept (`None`: two command timeouts, the window in which
    /// a retry may arrive). A multi-node lock keeps it for as long as it may give the level
    /// back by this request's id (`Node::undo`).
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
    let may_raise = acquire.raise && marker.is_none();
    let synced = client.synced();
    let call = scripts::call::Acquire {
        lock: &keys.lock,
        fence: &keys.slot_fence,
        queue: &keys.queue,
        turn: &keys.turn,
        record: &record,
        marker,
        holder: &holder_arg,
        lease_ms: ms,
        queue_id,
        tenure,
        request,
        record_ms,
        reentry: if reentry { "1" } else { "" },
        resent: "",
        // Set for each send (below).
        block: None,
        raise: None,
    };
    // The reply, the replicas that acknowledged it, the raise the send asked for, and whether
    // it was sent again.
    type Sent = ((Vec<i64>, Option<usize>, Option<u64>), bool);
    let ((reply, acked, floor), resent): Sent = client
        .exec_resending("acquire script", |mut c, resent| async move {
            // Decided for each send, on the connection it goes out on: a new connection to a
            // restarted server has been counted as a failover by now (`check_server`).
            let floor = if may_raise {
                client.fence_floor_needed(keys.slot)
            } else {
                None
            };
            let send = scripts::call::Acquire {
                // The first send may still run after a resend: the record must outlive the
                // hold (`scripts/acquire.lua`, KEYS[5]).
                resent: if resent { "1" } else { "" },
                // The token block only when it allows passes (the common call stays as short
                // as it was), or when the raise follows it.
                block: (block > 1 || floor.is_some()).then_some(block),
                raise: floor.map(|_| "1"),
                ..call
            }
            .cmd();
            // A grant counts once the replicas have it: WAIT behind it, where it ran.
            let granted = |r: &Vec<i64>| is_grant(r);
            conn::eval_then_wait(&mut c, &ACQUIRE, &send, synced, granted)
                .await
                .map(|(reply, acked)| (reply, acked, floor))
        })
        .await?;
    if let Some(generation) = floor_raised_by(floor, resent, &reply) {
        client.fence_floor_raised(keys.slot, generation);
    }
    if resent && reply == [request::OVERTAKEN] {
        // The resend was overtaken by a later request of the same holder; its first send may
        // have run before that one. Sent again under a fresh id it could run twice; an error
        // instead. (The caller's undo by this id then finds a newer record and only marks it
        // cancelled: a level its first send took, if any, ends with the lease.)
        return Err(may_have_run(client, "acquire"));
    }
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
        // Boxed: a rare path, whose future every acquire would otherwise carry.
        if let Err(e) = Box::pin(release_remote(client, keys, undo)).await {
            tracing::warn!(error = %e, "giving back a grant the replicas did not acknowledge failed; it ends with its lease");
        }
        return Err(conn::unacknowledged(
            client.address(),
            false,
            acked,
            (wanted, within),
        ));
    }
    Ok(reply)
}

/// The server generation under which a send's reply proves the slot's counter raised: a
/// fresh grant (`[1, ..]`) of a send that asked for the raise (`floor`), and not a resend. A
/// resend may be answered from its request record (the first send's grant, replayed), which
/// runs no raise: on a server that came back with older data, the record can be there while
/// the tokens issued after it are not (found by review: a replayed grant marked the slot, and
/// the client's next grant there repeated a token). A fresh grant of a resend is not counted
/// either; the next grant raises again, which costs two commands once.
fn floor_raised_by(floor: Option<u64>, resent: bool, reply: &[i64]) -> Option<u64> {
    match (floor, resent, reply) {
        (Some(generation), false, [1, ..]) => Some(generation),
        _ => None,
    }
}

#[cfg(test)]
mod floor_tests {
    use super::floor_raised_by;

    #[test]
    fn only_a_first_send_s_fresh_grant_counts_as_the_raise() {
        assert_eq!(floor_raised_by(Some(3), false, &[1, 77]), Some(3));
        assert_eq!(floor_raised_by(Some(3), false, &[1, 77, 8]), Some(3));
        // A resend may be a replay from the request record: no raise ran.
        assert_eq!(floor_raised_by(Some(3), true, &[1, 77]), None);
        // Not asked, or not a fresh grant (re-entry, busy, refusals).
        assert_eq!(floor_raised_by(None, false, &[1, 77]), None);
        assert_eq!(floor_raised_by(Some(3), false, &[2, 77, 2]), None);
        assert_eq!(floor_raised_by(Some(3), false, &[0, 100]), None);
        assert_eq!(floor_raised_by(Some(3), false, &[-7]), None);
    }
}

/// What a multi-lock's batch answered (see [`acquire_batch`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Batch {
    /// The batch's request id (each answered lock's [`Primed`] carries it).
    pub(crate) request: u64,
    /// How many locks, from the first, were granted.
    pub(crate) granted: usize,
    /// How many locks got a reply: `granted`, plus one when the first not granted answered
    /// (busy, or refused). Each has its reply primed; the rest were not touched.
    pub(crate) answered: usize,
}

/// Runs `acquire_many.lua` for `holder` over `locks` (one server's or one cluster slot's, in
/// the multi-lock's canonical order; one client, one lease): one server step takes them in
/// order until the first that is not granted. Each lock answered gets its reply primed for
/// `holder`'s next attempt (see [`Primed`]), which the caller then makes through the lock's
/// synchronizer, so that every grant becomes a hold (renewal, guard, local queue) exactly as
/// the lock's own attempt would make it.
///
/// Resent once, with the same request id, when the connection breaks before the reply (the
/// script's records make the resend replay what the first send did); on an error, every name
/// is undone by the request id (a grant the server made is released, a call that did not run
/// yet is marked cancelled), as a single attempt's error is.
pub(crate) async fn acquire_batch(locks: &[&RedisCompetitor], holder: HolderId) -> Result<Batch> {
    let first = locks.first().expect("a batch of at least one lock");
    let client = &first.client;
    let lease = first.options.lease();
    let holder_arg = holder.to_string();
    let records: Vec<Vec<u8>> = locks.iter().map(|c| c.keys.record(&holder_arg)).collect();
    let names: Vec<scripts::call::ManyName<'_>> = locks
        .iter()
        .zip(&records)
        .map(|(c, record)| scripts::call::ManyName {
            lock: &c.keys.lock,
            fence: &c.keys.slot_fence,
            queue: &c.keys.queue,
            turn: &c.keys.turn,
            record,
            queue_id: &c.turn.queue_id,
            tenure: c.turn.tenure,
        })
        .collect();
    let flying: Vec<Flying> = locks.iter().map(|c| Flying::start(&c.line)).collect();
    let request = request::next_id();
    let sent = Instant::now();
    let call = scripts::call::AcquireMany {
        names: &names,
        holder: &holder_arg,
        lease_ms: scripts::lease_ms(lease),
        request,
        record_ms: request::record_ttl_ms(client.command_timeout()),
        resent: "",
        raise: false,
    };
    let synced = client.synced();
    // The replies, the replicas that acknowledged them, the raise asked for each name, and
    // whether it was sent again.
    type Sent = ((Vec<Vec<i64>>, Option<usize>, Vec<Option<u64>>), bool);
    let outcome: Result<Sent> = client
        .exec_resending("acquire_many script", |mut c, resent| async move {
            // One raise for the call when any name's slot needs it, decided on the connection
            // the send goes out on (as `acquire_remote`).
            let floors: Vec<Option<u64>> = locks
                .iter()
                .map(|c| client.fence_floor_needed(c.keys.slot))
                .collect();
            let send = scripts::call::AcquireMany {
                resent: if resent { "1" } else { "" },
                raise: floors.iter().any(Option::is_some),
                ..call
            }
            .cmd();
            // The grants count once the replicas have them: WAIT behind the call.
            let granted = |r: &Vec<Vec<i64>>| r.iter().any(|x| is_grant(x));
            conn::eval_then_wait(&mut c, &scripts::ACQUIRE_MANY, &send, synced, granted)
                .await
                .map(|(replies, acked)| (replies, acked, floors))
        })
        .await;
    let checked = outcome.and_then(|((replies, acked, floors), resent)| {
        let well_formed = !replies.is_empty()
            && replies.len() <= locks.len()
            && replies.iter().all(|r| !r.is_empty())
            && replies[..replies.len() - 1].iter().all(|r| is_grant(r));
        if !well_formed {
            let flat: Vec<i64> = replies.iter().flatten().copied().collect();
            return Err(unexpected_reply(
                "acquire_many script",
                client.address(),
                &flat,
            ));
        }
        if resent && replies.iter().any(|r| *r == [request::OVERTAKEN]) {
            // As a single acquire's (see `acquire_remote`): its first send may have run.
            return Err(may_have_run(client, "acquire_many"));
        }
        if let (Some((wanted, within)), Some(acked)) = (synced, acked)
            && acked < wanted
        {
            return Err(conn::unacknowledged(
                client.address(),
                true,
                acked,
                (wanted, within),
            ));
        }
        for ((c, floor), reply) in locks.iter().zip(&floors).zip(&replies) {
            if let Some(generation) = floor_raised_by(*floor, resent, reply) {
                client.fence_floor_raised(c.keys.slot, generation);
            }
        }
        Ok(replies)
    });
    let replies = match checked {
        Ok(r) => r,
        Err(e) => {
            // Ran, maybe, in part or whole: every name is undone by the request id (a name
            // the call did not reach is only marked cancelled, so a late copy stops there).
            for (c, f) in locks.iter().zip(&flying) {
                f.answered(!c.turn.queue_id.is_empty());
            }
            drop(flying);
            if request::worth_undoing(&e) {
                let undos = locks.iter().map(|c| {
                    let waiters = c.me.upgrade().is_some_and(|s| s.sync.waiters() > 0);
                    compensate(
                        &c.client,
                        &c.keys,
                        waiters,
                        holder,
                        lease,
                        c.turn.clone(),
                        request,
                    )
                });
                futures::future::join_all(undos).await;
            }
            // A busy answer may have put the process in a name's line, and no attempt of
            // the name's lock will take it out: it is left unless a task here waits.
            for c in locks {
                c.queue_drained();
            }
            return Err(e);
        }
    };
    let granted = replies.iter().filter(|r| is_grant(r)).count();
    let answered = replies.len();
    let now = Instant::now();
    let mut flying = flying.into_iter();
    for (c, reply) in locks.iter().zip(replies) {
        let flying = flying.next().expect("one count in flight per lock");
        // The attempt this reply stands for was sent then (for `Notifications::Live`); the
        // names the call did not reach keep their own last attempt.
        *lock(&c.last_attempt) = Some(sent);
        lock(&c.primed).push(Primed {
            holder,
            request,
            sent,
            answered: now,
            reply,
            flying,
        });
    }
    // The names the call did not reach: their counts in flight end, and a drain that saw
    // them (a local waiter's, told busy meanwhile) and left the line to a later one is done
    // now.
    drop(flying);
    for c in &locks[answered..] {
        c.queue_drained();
    }
    Ok(Batch {
        request,
        granted,
        answered,
    })
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
        let last = self.last_attempt.clone();
        let label = self.label.clone();
        let keys = self.keys.clone();
        let me = self.me.clone();
        let inner = client.clone();
        // A multi-lock's batch may have asked already (see `Primed`).
        let (primed, flying) = self.take_primed(holder, reentry);
        let primed = primed.map(|p| (p.reply, p.request, p.sent));
        inner.on_runtime(async move {
            let (reply, request, sent) = match primed {
                Some((reply, request, sent)) => (Ok(reply), request, sent),
                None => {
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
                            block,
                            raise: true,
                            record_for: None,
                        };
                        acquire_remote(&client, &keys, acquire)
                    })
                    .await;
                    (reply, request, sent)
                }
            };
            let reply = match reply {
                Ok(r) => r,
                Err(e) => {
                    // The script may have run and answered busy, which puts the process in
                    // line: a later drain gives the place back (a leave of nothing is harmless).
                    flying.answered(!turn.queue_id.is_empty());
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
                // A grant takes the process out of the line (acquire.lua).
                [1, ..] => flying.answered(false),
                // A busy answer puts it in (when it has a queue id).
                [0, _] => flying.answered(!turn.queue_id.is_empty()),
                _ => {}
            }
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

/// How long a waiting head parks at most while its release notifications are live (see
/// [`Competitor::live_park_cap`]): it is woken by the release message, and otherwise attempts
/// again when the busy answer said the holder's lease or a turn's reservation ends by itself.
///
/// Trusting the messages is safe here: `Live` means the channel was confirmed subscribed
/// before the busy attempt was sent; that attempt left the hold marked as waited for (`w`,
/// and a queued process makes every later grant marked too), so its release publishes; a
/// broken pub/sub connection reports `Off` (spin wait) and wakes every waiter when it is back.
/// The cap bounds what a message lost any other way costs: one attempt a second instead of one
/// per spin wait (20 a second by default) for every waiting process.
pub(crate) const LIVE_PARK_CAP: Duration = Duration::from_secs(1);

impl Competitor for RedisCompetitor {
    type Grant = Grant;

    /// [`LIVE_PARK_CAP`], or half the lease if shorter: the line of waiting processes
    /// expires with the lease of the last busy answer, and a waiter asks again before its
    /// place in it lapses.
    fn live_park_cap(&self) -> Option<Duration> {
        Some(LIVE_PARK_CAP.min(self.options.lease() / 2))
    }

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

    /// Unsubscribes, and gives the process's place in line back if a busy answer put it
    /// there (see [`InLine`]).
    fn queue_drained(&self) {
        // Also called when an attempt whose caller was dropped ends in the background, with
        // tasks possibly queued by then: their notifications must stay (issue 28, item 12).
        // With the lock's handles all gone, nobody can wait any more.
        let shared = self.me.upgrade();
        let waiting = || shared.as_ref().is_some_and(|s| s.sync.waiters() > 0);
        if waiting() {
            return;
        }
        self.client
            .inner
            .notifier
            .unsubscribe(&self.client, &self.keys.channel);
        if waiting() {
            // A waiter queued between the check and the unsubscription may have been told its
            // notifications are live: wake it, so that it subscribes again now rather than at
            // its retry timer.
            if let Some(s) = &shared {
                s.sync.notify_released();
            }
            return;
        }
        // An attempt in flight may be a waiter's on its way into the line (its busy answer
        // renews the place it then waits in): the place stays; a later drain ends it.
        if self.line.in_flight.load(Ordering::SeqCst) == 0
            && self.line.queued.swap(false, Ordering::SeqCst)
        {
            self.leave_line();
        }
    }
}
