//! The renewal service: one task per client renews every held lock of that client.
//!
//! ## State of one registration
//!
//! | state | renewed? | leaves it when |
//! | --- | --- | --- |
//! | renewing | at its period, batched with every other due registration into one pipeline | reply 0 (→ lost, `EntryGone`), deadline passes without a successful renewal (→ lost, `DeadlineExpired`), max hold reached (→ capped) |
//! | capped | no; the lease runs out | deadline passes (→ lost, `MaxHoldReached`) |
//! | lost | no; loss signalled once | – |
//!
//! Every registration is removed when its holder's local hold count returns to zero (release,
//! guard drop, failed release alike), whatever its state. Re-entrant guards of one holder share
//! one registration and one lease.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{ErrorKind, RedisResult, ServerErrorKind};
use slate_core::lease::{self, LeaseKeeper, LeaseWatch, LossReason};
use slate_core::metrics::{ClientMeter, Meter};
use slate_core::mutant::{self, Mutant};
use slate_core::{HolderId, Result};
use tokio::sync::Notify;
use tracing::Instrument;

use crate::client::conn::{self, Conn, Topology, slot_of, wait_cmd};
use crate::client::{Inner, RedisClient, lock};
use crate::scripts;

/// The clock-drift allowance taken off every lease deadline: 1% of the lease plus 2 ms.
///
/// The server counts the lease from when it runs the script, which is after the client took
/// its send instant, so `sent + lease` is never later than the real expiry as long as the two
/// clocks run at the same rate; the allowance covers a difference in rate (and timer
/// granularity). It follows the Redlock analysis.
pub(crate) fn drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// The lease deadline of a command sent at `sent` that set a TTL of `lease`.
pub(crate) fn deadline(sent: Instant, lease: Duration) -> Instant {
    // Every caller has the reply in hand: the mutant counts the lease from it.
    let sent = if mutant::active(Mutant::LeaseFromReply) {
        Instant::now()
    } else {
        sent
    };
    sent + lease - drift(lease)
}

/// How long to wait before retrying a failed renewal.
fn retry_delay(period: Duration) -> Duration {
    (period / 4).clamp(Duration::from_millis(5), Duration::from_millis(250))
}

/// How much before its deadline a capped lease is reported lost.
const CAPPED_EARLY: Duration = Duration::from_millis(5);

type RegKey = (Arc<[u8]>, HolderId);

/// What a lock tells the service about one hold.
pub(crate) struct Renewable {
    pub(crate) key: Arc<[u8]>,
    /// The lock's turn key, refreshed with the lease while held (the single lock, and the
    /// combination lock's node entries: the lead node keeps a turn; `None` for shared holds).
    pub(crate) turn: Option<Arc<[u8]>>,
    /// Where renewals record the local holder a passed hold now serves (single lock; `None`
    /// for node entries): see `Keys::holder`.
    pub(crate) alias: Option<Arc<[u8]>>,
    /// A shared-mode hold (read-write lock, semaphore): its leases key. `key` is then the
    /// holders hash and the renewal runs `shared_renew.lua` (`turn` and `alias` are
    /// `None`).
    pub(crate) leases: Option<Arc<[u8]>>,
    pub(crate) holder: HolderId,
    pub(crate) lease: Duration,
    pub(crate) period: Duration,
    pub(crate) max_hold: Option<Duration>,
    /// The lease deadline the acquisition established.
    pub(crate) deadline: Instant,
    /// The lock's printable name, for logs.
    pub(crate) label: Arc<str>,
    /// Where renewals are counted, and the lease's loss when `counts_loss`.
    pub(crate) meter: Meter,
    /// Whether this lease is the lock's own (`slate_lease_lost_total` counts its loss); not
    /// for one node's entry of a combination lock, which may be lost while the lock holds.
    pub(crate) counts_loss: bool,
}

enum Phase {
    Renewing,
    Capped,
    Lost,
}

struct Registration {
    hold: Renewable,
    generation: u64,
    keeper: LeaseKeeper,
    next_due: Instant,
    cap: Option<Instant>,
    phase: Phase,
    in_flight: bool,
    /// `next_due` is a retry time (after a failed renewal, or one that met a release in
    /// flight): it is kept to exactly, not brought forward like a scheduled renewal.
    retrying: bool,
    /// Releases of this holder that are on their way to the server: a renewal answering 0
    /// meanwhile is the release's doing, not a loss.
    releasing: u32,
    /// The local holder the hold was last passed to (lock cohorting): renewals record it
    /// under `hold.alias`, so that `slate status` names it.
    current: Option<HolderId>,
}

#[derive(Default)]
struct State {
    regs: HashMap<RegKey, Registration>,
    /// The client's meter, for the registered-renewals gauge (`None` in unit tests).
    meter: Option<ClientMeter>,
    generation: u64,
    /// When the service task will next wake on its own (None: it sleeps until notified).
    wake_at: Option<Instant>,
    running: bool,
    closed: bool,
}

impl State {
    fn counted(&self, delta: isize) {
        if let Some(m) = &self.meter {
            m.renewals_registered(delta);
        }
    }
    /// [`RenewalService::end_release`] under the state's lock.
    fn end_release(&mut self, key: &RegKey, generation: Option<u64>, freed: bool) {
        let Some(reg) = self.regs.get_mut(key) else {
            return;
        };
        if Some(reg.generation) != generation {
            return;
        }
        if freed {
            self.regs.remove(key);
            self.counted(-1);
            tracing::debug!(holder = %key.1, "renewal deregistered with its release");
        } else {
            reg.releasing = reg.releasing.saturating_sub(1);
        }
    }
}

struct Shared {
    state: Mutex<State>,
    notify: Notify,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The client is gone, and its registrations with it.
        let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        st.counted(-isize::try_from(st.regs.len()).unwrap_or(isize::MAX));
    }
}

/// The renewal service of one client.
pub(crate) struct Renewal {
    shared: Arc<Shared>,
    client: Weak<Inner>,
}

impl Renewal {
    pub(crate) fn new(client: Weak<Inner>, meter: ClientMeter) -> Self {
        Renewal {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    meter: Some(meter),
                    ..State::default()
                }),
                notify: Notify::new(),
            }),
            client,
        }
    }

    /// Registers a hold (or, for a holder already registered, moves its lease deadline) and
    /// returns a watch on its lease.
    pub(crate) fn register(&self, client: &RedisClient, hold: Renewable) -> LeaseWatch {
        self.register_hold(client, hold, false)
    }

    /// As [`register`](Self::register); `fresh` marks a first-level acquisition (count 1): for
    /// a holder that is still registered it means its earlier hold was lost and the lock was
    /// taken afresh, so the old lease ends (`EntryGone`) and a new one starts.
    pub(crate) fn register_hold(
        &self,
        client: &RedisClient,
        hold: Renewable,
        fresh: bool,
    ) -> LeaseWatch {
        let now = Instant::now();
        let mut st = lock(&self.shared.state);
        let key = (hold.key.clone(), hold.holder);
        if let Some(reg) = st.regs.get_mut(&key) {
            if fresh {
                lose(reg, LossReason::EntryGone);
            } else if !matches!(reg.phase, Phase::Lost) && !reg.keeper.is_lost() {
                reg.keeper.extend(hold.deadline);
                return reg.keeper.watch();
            }
        }
        st.generation += 1;
        let generation = st.generation;
        let (keeper, watch) = lease::channel(hold.deadline);
        let keeper = if hold.counts_loss {
            keeper.with_meter(hold.meter.clone())
        } else {
            keeper
        };
        // Normally one period from now; sooner when the acquisition left less than two
        // periods of validity (a slow link or a slow multi-node attempt), so that the first
        // renewal still lands before the deadline.
        let next_due =
            (now + hold.period).min(now + hold.deadline.saturating_duration_since(now) / 2);
        // Options bound the max hold, but a cap beyond the clock's range is simply no cap.
        let cap = hold.max_hold.and_then(|m| now.checked_add(m));
        tracing::debug!(lock = %hold.label, holder = %hold.holder, "renewal registered");
        let replaced = st.regs.insert(
            key,
            Registration {
                hold,
                generation,
                keeper,
                next_due,
                cap,
                phase: Phase::Renewing,
                in_flight: false,
                retrying: false,
                releasing: 0,
                current: None,
            },
        );
        if replaced.is_none() {
            st.counted(1);
        }
        let wake = cap.map_or(next_due, |c| c.min(next_due));
        let start = !st.running && !st.closed;
        st.running |= start;
        let earlier = st.wake_at.is_none_or(|w| wake < w);
        drop(st);
        if start {
            let shared = self.shared.clone();
            let weak = self.client.clone();
            client.spawn(run(shared, weak));
        } else if earlier {
            self.shared.notify.notify_one();
        }
        watch
    }

    /// Hands the registration of `holder` on `key` to the next local holder after a local pass
    /// (lock cohorting): the same remote hold goes on being renewed, and the new holder gets a
    /// lease watch of its own on the hold's deadline and max hold (one max hold bounds one
    /// Redis hold, whoever it serves). Answers the new watch, or `None` (nothing changed) when
    /// the hold may not be passed (see `passable`: lost, capped or nearly so, nearly expired,
    /// or not confirmed within a renewal period).
    ///
    /// `to` is the holder the hold now serves: the hold's next renewals record it (see
    /// `Keys::holder`), nothing is sent now.
    pub(crate) fn pass(
        &self,
        key: &Arc<[u8]>,
        holder: HolderId,
        min_validity: Duration,
        to: HolderId,
    ) -> Option<LeaseWatch> {
        let now = Instant::now();
        let mut st = lock(&self.shared.state);
        let reg = st.regs.get_mut(&(key.clone(), holder))?;
        if !passable(reg, now, min_validity) {
            return None;
        }
        let (keeper, watch) = lease::channel(if mutant::active(Mutant::PassOutlivesLease) {
            deadline(now, reg.hold.lease)
        } else {
            reg.keeper.deadline()
        });
        let keeper = if reg.hold.counts_loss {
            keeper.with_meter(reg.hold.meter.clone())
        } else {
            keeper
        };
        reg.keeper = keeper;
        reg.current = Some(to);
        Some(watch)
    }

    /// Whether [`pass`](Self::pass) would hand the registration on now.
    pub(crate) fn can_pass(
        &self,
        key: &Arc<[u8]>,
        holder: HolderId,
        min_validity: Duration,
    ) -> bool {
        lock(&self.shared.state)
            .regs
            .get(&(key.clone(), holder))
            .is_some_and(|reg| passable(reg, Instant::now(), min_validity))
    }

    /// Removes the registration of `holder` on `key` (its local hold count reached zero).
    pub(crate) fn deregister(&self, key: &Arc<[u8]>, holder: HolderId) {
        let mut st = lock(&self.shared.state);
        let removed = st.regs.remove(&(key.clone(), holder)).is_some();
        if removed {
            st.counted(-1);
            tracing::debug!(holder = %holder, "renewal deregistered");
        }
    }

    /// Reports `holder`'s lease on `key` lost now (a re-entry found its entry gone), unless it
    /// already was.
    ///
    /// Not while a release of this holder is on its way: the entry the re-entry found gone is
    /// the release's doing (as a renewal answering 0 then is, see `apply`), and the release
    /// ends the registration.
    pub(crate) fn lose(&self, key: &Arc<[u8]>, holder: HolderId, reason: LossReason) {
        if let Some(reg) = lock(&self.shared.state)
            .regs
            .get_mut(&(key.clone(), holder))
            && reg.releasing == 0
        {
            lose(reg, reason);
        }
    }

    /// Whether `holder`'s hold on `key` is registered and its lease deadline (taken from the
    /// send of its grant or last successful renewal, less the drift allowance) is after `at`:
    /// the server cannot have expired it by then.
    pub(crate) fn lease_ahead(&self, key: &Arc<[u8]>, holder: HolderId, at: Instant) -> bool {
        lock(&self.shared.state)
            .regs
            .get(&(key.clone(), holder))
            .is_some_and(|reg| reg.keeper.deadline() > at)
    }

    /// Marks a release of `holder` on `key` as in flight (see [`Registration::releasing`]);
    /// returns the registration's generation for [`end_release`](Self::end_release) (`None`:
    /// nothing is registered).
    pub(crate) fn begin_release(&self, key: &Arc<[u8]>, holder: HolderId) -> Option<u64> {
        let mut st = lock(&self.shared.state);
        let reg = st.regs.get_mut(&(key.clone(), holder))?;
        reg.releasing += 1;
        Some(reg.generation)
    }

    /// Ends what [`begin_release`](Self::begin_release) started. `freed`: the server answered
    /// that the holder has no level left; the registration then goes in this same step, so
    /// that no renewal can take the release's delete for a loss between the answer and the
    /// deregistration. A registration of a later generation (the holder
    /// registered again meanwhile) is not touched.
    pub(crate) fn end_release(
        &self,
        key: &Arc<[u8]>,
        holder: HolderId,
        generation: Option<u64>,
        freed: bool,
    ) {
        lock(&self.shared.state).end_release(&(key.clone(), holder), generation, freed);
    }

    /// The number of registrations.
    pub(crate) fn len(&self) -> usize {
        lock(&self.shared.state).regs.len()
    }

    /// Stops the service task (the client is gone).
    pub(crate) fn close(&self) {
        lock(&self.shared.state).closed = true;
        self.shared.notify.notify_one();
    }
}

/// A hold worth passing: renewed, not lost, with at least `min_validity` left.
/// Whether a hold may be passed to a local holder now: it is being renewed and not lost; it
/// has `min_validity` left before its deadline and before its max hold, which bounds the
/// Redis hold however many local holders it serves; and the server
/// confirmed it within one renewal period (its deadline is counted from the send of the
/// grant or of the last successful renewal, so that send is `deadline − lease`). A hold
/// taken away behind the process's back (`force_unlock`, an eviction, a failover that lost
/// it) is therefore passed on for at most one renewal period, and not at all while its
/// renewals fail.
fn passable(reg: &Registration, now: Instant, min_validity: Duration) -> bool {
    let deadline = reg.keeper.deadline();
    matches!(reg.phase, Phase::Renewing)
        && !reg.keeper.is_lost()
        && deadline >= now + min_validity
        && reg.cap.is_none_or(|cap| cap >= now + min_validity)
        && deadline + reg.hold.period > now + reg.hold.lease
}

/// One renewal to send.
struct Due {
    key: RegKey,
    turn: Option<Arc<[u8]>>,
    alias: Option<(Arc<[u8]>, HolderId)>,
    leases: Option<Arc<[u8]>>,
    generation: u64,
    lease: Duration,
}

/// The service task.
async fn run(shared: Arc<Shared>, client: Weak<Inner>) {
    loop {
        let (batch, wake_at) = {
            let mut st = lock(&shared.state);
            if st.closed {
                st.running = false;
                return;
            }
            let plan = plan(&mut st, Instant::now());
            st.wake_at = plan.1;
            plan
        };
        if !batch.is_empty() {
            match client.upgrade() {
                Some(inner) => {
                    let client = RedisClient::from_inner(inner);
                    let shared = shared.clone();
                    client.clone().spawn(async move {
                        send(&client, &shared, batch).await;
                    });
                }
                None => {
                    lock(&shared.state).running = false;
                    return;
                }
            }
        }
        match wake_at {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at.into()) => {}
                    () = shared.notify.notified() => {}
                }
            }
            None => shared.notify.notified().await,
        }
    }
}

/// Decides what to send now and when to wake next; fires losses whose time has come.
fn plan(st: &mut State, now: Instant) -> (Vec<Due>, Option<Instant>) {
    let mut batch = Vec::new();
    let mut wake: Option<Instant> = None;
    let mut at = |t: Instant| wake = Some(wake.map_or(t, |w: Instant| w.min(t)));
    for (key, reg) in &mut st.regs {
        if matches!(reg.phase, Phase::Lost) {
            continue;
        }
        if matches!(reg.phase, Phase::Renewing) && reg.cap.is_some_and(|c| now >= c) {
            reg.phase = Phase::Capped;
            tracing::info!(lock = %reg.hold.label, holder = %reg.hold.holder,
                "max hold reached: renewal stopped, the lease will run out");
        }
        let deadline = reg.keeper.deadline();
        // A capped lease is reported a little early, so that the reason reaches the guard
        // before its own deadline check answers `DeadlineExpired`.
        let report_at = match reg.phase {
            Phase::Capped => deadline.checked_sub(CAPPED_EARLY).unwrap_or(deadline),
            _ => deadline,
        };
        if now >= report_at && !mutant::active(Mutant::LeaseIgnoresDeadline) {
            let reason = match reg.phase {
                Phase::Capped => LossReason::MaxHoldReached,
                _ => LossReason::DeadlineExpired,
            };
            lose(reg, reason);
            continue;
        }
        if !mutant::active(Mutant::LeaseIgnoresDeadline) {
            at(report_at);
        }
        if let Phase::Renewing = reg.phase {
            if let Some(cap) = reg.cap {
                at(cap);
            }
            if !reg.in_flight {
                // Renew a little early rather than send one more round trip soon after (but
                // a retry waits its delay: brought forward, it would go back to back).
                let early = if reg.retrying {
                    Duration::ZERO
                } else {
                    reg.hold.period / 4
                };
                if reg.next_due <= now + early {
                    reg.in_flight = true;
                    batch.push(Due {
                        key: key.clone(),
                        turn: reg.hold.turn.clone(),
                        alias: reg.hold.alias.clone().zip(reg.current),
                        leases: reg.hold.leases.clone(),
                        generation: reg.generation,
                        lease: reg.hold.lease,
                    });
                } else {
                    at(reg.next_due);
                }
            }
        }
    }
    (batch, wake)
}

/// Reports the lease lost, once (a registration already lost is left as it is).
fn lose(reg: &mut Registration, reason: LossReason) {
    if matches!(reg.phase, Phase::Lost) {
        return;
    }
    reg.phase = Phase::Lost;
    reg.keeper.lose(reason);
    tracing::warn!(lock = %reg.hold.label, holder = %reg.hold.holder, %reason, "lease lost");
}

/// Sends one pipeline of renewals and applies the replies.
async fn send(client: &RedisClient, shared: &Shared, batch: Vec<Due>) {
    let sent = Instant::now();
    let span = tracing::debug_span!("renewal", locks = batch.len());
    if client.topology() == Topology::Cluster {
        // Each node's replies are applied as they come: a slow node must not hold back the
        // renewals another node already answered (issue 35, defect 16).
        let apply_now = |i: usize, reply: std::result::Result<i64, String>| {
            let due = &batch[i];
            let now = Instant::now();
            let mut st = lock(&shared.state);
            if let Some(reg) = st.regs.get_mut(&due.key)
                && reg.generation == due.generation
            {
                apply(reg, reply, due.lease, sent, now);
            }
            drop(st);
            shared.notify.notify_one();
        };
        renew_cluster(client, &batch, &apply_now)
            .instrument(span)
            .await;
        return;
    }
    let replies = renew_pipeline(client, &batch)
        .instrument(span.clone())
        .await;
    let _enter = span.enter();
    let now = Instant::now();
    let mut st = lock(&shared.state);
    for (i, due) in batch.iter().enumerate() {
        let Some(reg) = st.regs.get_mut(&due.key) else {
            continue;
        };
        if reg.generation != due.generation {
            continue;
        }
        let reply = match &replies {
            Ok(r) => r.get(i).cloned().unwrap_or(Ok(-2)),
            Err(e) => Err(e.to_string()),
        };
        apply(reg, reply, due.lease, sent, now);
    }
    drop(st);
    shared.notify.notify_one();
}

/// Applies one renewal reply (`sent`: when its pipeline was sent) to its registration.
fn apply(
    reg: &mut Registration,
    reply: std::result::Result<i64, String>,
    lease: Duration,
    sent: Instant,
    now: Instant,
) {
    reg.in_flight = false;
    match reply {
        Ok(1) => {
            reg.hold.meter.renewed(true);
            reg.keeper.extend(deadline(sent, lease));
            reg.next_due = sent + reg.hold.period;
            reg.retrying = false;
            tracing::trace!(lock = %reg.hold.label, "renewed");
        }
        // The release in flight deleted the entry; its reply will deregister the hold. Until
        // then, ask again at the retry pace (not at once: the renewal would go back to back).
        Ok(0) if reg.releasing > 0 => {
            reg.next_due = now + retry_delay(reg.hold.period);
            reg.retrying = true;
        }
        Ok(0) => lose(reg, LossReason::EntryGone),
        other => {
            reg.hold.meter.renewed(false);
            reg.next_due = now + retry_delay(reg.hold.period);
            reg.retrying = true;
            tracing::debug!(lock = %reg.hold.label, reply = ?other,
                "renewal failed; retrying until the deadline");
        }
    }
}

/// One round trip (standalone and Sentinel): every renewal of the batch as EVALSHA in one
/// pipeline; entries that answer NOSCRIPT (a restarted server) are sent again once after
/// `SCRIPT LOAD`. A cluster's batch goes through [`renew_cluster`].
async fn renew_pipeline(
    client: &RedisClient,
    batch: &[Due],
) -> Result<Vec<std::result::Result<i64, String>>> {
    let build = |items: &[&Due]| {
        let mut pipe = redis::pipe();
        for due in items {
            pipe.add_command(renew_cmd(due));
        }
        pipe.ignore_errors();
        pipe
    };
    let all: Vec<&Due> = batch.iter().collect();
    let mut pipe = build(&all);
    let synced = client.synced();
    if let Some((n, within)) = synced {
        // A renewal counts once the replicas have it (see ClientOptionsBuilder::synced_replicas).
        pipe.add_command(wait_cmd(n, within));
    }
    let pipe = &pipe;
    let mut first: Vec<RedisResult<i64>> = client
        .exec("renewal pipeline", |mut c| async move {
            pipe.query_async(&mut c).await
        })
        .await?;
    if let Some((n, _)) = synced {
        let acked = first.pop();
        unacknowledged(&mut first, acked, n);
    }
    let missing: Vec<usize> = first
        .iter()
        .enumerate()
        .filter(|(_, r)| r.as_ref().is_err_and(scripts::is_noscript))
        .map(|(i, _)| i)
        .collect();
    let mut out: Vec<std::result::Result<i64, String>> = first
        .into_iter()
        .map(|r| r.map_err(|e| e.to_string()))
        .collect();
    if missing.is_empty() {
        return Ok(out);
    }
    let retry: Vec<&Due> = missing.iter().map(|&i| &batch[i]).collect();
    // Load first, in the same round trip: the scripts are then known to every entry after it.
    let mut pipe = redis::pipe();
    pipe.add_command(scripts::RENEW.load_cmd()).ignore();
    pipe.add_command(scripts::SHARED_RENEW.load_cmd()).ignore();
    for due in retry {
        pipe.add_command(renew_cmd(due));
    }
    if let Some((n, within)) = synced {
        // The retry extends deadlines too, on a server that just lost its script cache (a
        // promoted replica, exactly when replication may lag): it waits like the first send
        // (issue 35, defect 15).
        pipe.add_command(wait_cmd(n, within));
    }
    pipe.ignore_errors();
    let pipe = &pipe;
    let mut second: Vec<RedisResult<i64>> = client
        .exec("renewal pipeline", |mut c| async move {
            pipe.query_async(&mut c).await
        })
        .await?;
    if let Some((n, _)) = synced {
        let acked = second.pop();
        unacknowledged(&mut second, acked, n);
    }
    for (slot, r) in missing.into_iter().zip(second) {
        out[slot] = r.map_err(|e| e.to_string());
    }
    Ok(out)
}

fn renew_cmd(due: &Due) -> redis::Cmd {
    if let Some(leases) = &due.leases {
        return scripts::shared_renew_cmd(&due.key.0, leases, due.key.1, due.lease);
    }
    scripts::renew_cmd(
        &due.key.0,
        due.turn.as_deref(),
        due.key.1,
        due.lease,
        due.alias.as_ref().map(|(key, to)| (&**key, *to)),
    )
}

/// Renewal on a cluster: one pipeline per node per tick, whatever the number of held locks.
///
/// Entries are grouped by the node that owns their slot in the client's copy of the slot map
/// (`CLUSTER SLOTS`, fetched on first use and again after any redirect), and each node's
/// pipeline is sent to that node by address, all nodes at once. An entry the node does not
/// serve any more (`MOVED`/`ASK` after a slot migration or failover), or that answers
/// `NOSCRIPT` (a promoted replica has no script cache), or whose node's pipeline failed, is
/// sent once more alone through redis-rs's routing, which follows the redirect; a hold that is
/// still valid is renewed on its new node in the same tick.
///
/// Every entry's answer goes to `on_reply(index, answer)` as soon as it is known: a node's
/// answers when its pipeline returns, a resent entry's when its single command does.
async fn renew_cluster(
    client: &RedisClient,
    batch: &[Due],
    on_reply: &(dyn Fn(usize, std::result::Result<i64, String>) + Sync),
) {
    let mut again: Vec<usize> = Vec::new();
    let synced = client.synced();
    // The slot map is never fetched inline: `CLUSTER SLOTS` may go to the very node that is
    // slow, and hold back every renewal of the tick (issue 35, defect 16). Without a map (the
    // first tick, or after a redirect) each lock is renewed alone through redis-rs's routing,
    // and the map is read in the background for the next tick.
    let slots = match client.cached_cluster_slots() {
        Some(map) => Ok(map),
        None => {
            let c = client.clone();
            client.spawn(async move {
                if let Err(e) = c.cluster_slots().await {
                    tracing::debug!(error = %e, "CLUSTER SLOTS failed; renewing each lock alone");
                }
            });
            Err(())
        }
    };
    match slots {
        Ok(map) => {
            let mut by_node: HashMap<(String, u16), Vec<usize>> = HashMap::new();
            for (i, due) in batch.iter().enumerate() {
                match map.owner(slot_of(&due.key.0)) {
                    Some(node) => by_node.entry(node).or_default().push(i),
                    None => again.push(i),
                }
            }
            let sends = by_node.into_iter().map(|((host, port), items)| {
                let mut pipe = redis::pipe();
                for &i in &items {
                    pipe.add_command(renew_cmd(&batch[i]));
                }
                if let Some((n, within)) = synced {
                    pipe.add_command(wait_cmd(n, within));
                }
                pipe.ignore_errors();
                async move {
                    let pipe = &pipe;
                    let n = items.len() + usize::from(synced.is_some());
                    let host = &host;
                    let replies = client
                        .exec("renewal pipeline", |c| async move {
                            match c {
                                Conn::Cluster(mut c) => {
                                    c.route_pipeline(
                                        pipe.clone(),
                                        0,
                                        n,
                                        SingleNodeRoutingInfo::ByAddress {
                                            host: host.clone(),
                                            port,
                                        },
                                    )
                                    .await
                                }
                                Conn::Server(mut c) => pipe.query_async(&mut c).await,
                            }
                        })
                        .await;
                    (items, replies)
                }
            });
            let mut stale = false;
            let mut sends: futures::stream::FuturesUnordered<_> = sends.collect();
            while let Some((items, replies)) = futures::StreamExt::next(&mut sends).await {
                let replies = replies.map(|mut values| {
                    if let Some((n, _)) = synced {
                        let acked = values.pop().map(redis::from_redis_value::<i64>);
                        if !acked.is_some_and(|a| {
                            a.is_ok_and(|a| usize::try_from(a).is_ok_and(|a| a >= n))
                        }) {
                            // Not acknowledged: none of these renewals counts.
                            for v in &mut values {
                                if matches!(v, redis::Value::Int(1)) {
                                    *v = redis::Value::SimpleString("unacknowledged".into());
                                }
                            }
                        }
                    }
                    values
                });
                match replies {
                    Ok(values) if values.len() == items.len() => {
                        for (i, v) in items.into_iter().zip(values) {
                            match redis::from_redis_value::<RedisResult<i64>>(v) {
                                Ok(Ok(n)) => on_reply(i, Ok(n)),
                                Ok(Err(e)) if needs_routing(&e) => {
                                    stale |= matches!(
                                        e.kind(),
                                        ErrorKind::Server(
                                            ServerErrorKind::Moved | ServerErrorKind::Ask
                                        )
                                    );
                                    again.push(i);
                                }
                                Ok(Err(e)) => on_reply(i, Err(e.to_string())),
                                Err(e) => on_reply(i, Err(e.to_string())),
                            }
                        }
                    }
                    // The map is read again in the background (a failed-over master keeps its
                    // old address in it otherwise); this tick resends these alone.
                    Ok(_) | Err(_) => {
                        stale = true;
                        again.extend(items);
                    }
                }
            }
            if stale {
                client.forget_cluster_slots();
            }
        }
        Err(()) => again.extend(0..batch.len()),
    }
    if again.is_empty() {
        return;
    }
    let singles = again.iter().map(|&i| {
        let cmd = renew_cmd(&batch[i]);
        async move {
            let cmd = &cmd;
            let r = client
                .exec("renewal", |mut c| async move {
                    let script = match batch[i].leases {
                        Some(_) => &scripts::SHARED_RENEW,
                        None => &scripts::RENEW,
                    };
                    // The WAIT runs where the renewal ran, even when a migrating slot
                    // redirects it (issue 35, defect 4).
                    let renewed = |r: &i64| *r == 1;
                    let (r, acked) =
                        conn::eval_then_wait(&mut c, script, cmd, synced, renewed).await?;
                    if let (Some((n, _)), Some(acked)) = (synced, acked)
                        && acked < n
                    {
                        return Err(redis::RedisError::from((
                            ErrorKind::Client,
                            "renewal not acknowledged by enough replicas",
                        )));
                    }
                    Ok(r)
                })
                .await;
            (i, r)
        }
    });
    let mut singles: futures::stream::FuturesUnordered<_> = singles.collect();
    while let Some((i, r)) = futures::StreamExt::next(&mut singles).await {
        on_reply(i, r.map_err(|e| e.to_string()));
    }
}

/// Turns the successful renewals of a pipeline into failures when its trailing `WAIT`
/// (`acked`) counted fewer than `wanted` replicas: they do not move any deadline (they are
/// retried until the deadline).
fn unacknowledged(
    replies: &mut [RedisResult<i64>],
    acked: Option<RedisResult<i64>>,
    wanted: usize,
) {
    let ok = matches!(acked, Some(Ok(a)) if usize::try_from(a).is_ok_and(|a| a >= wanted));
    if ok {
        return;
    }
    for r in replies.iter_mut() {
        if matches!(r, Ok(1)) {
            *r = Err(redis::RedisError::from((
                ErrorKind::Client,
                "renewal not acknowledged by enough replicas",
            )));
        }
    }
}

/// Whether a renewal's error means "send it where the cluster says" (or load the script).
fn needs_routing(e: &redis::RedisError) -> bool {
    scripts::is_noscript(e)
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::Moved
                    | ServerErrorKind::Ask
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
            )
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registration(now: Instant, period: Duration) -> Registration {
        let lease = period * 2;
        let (keeper, _watch) = lease::channel(now + lease);
        Registration {
            hold: Renewable {
                key: Arc::from(b"k".as_slice()),
                turn: None,
                alias: None,
                leases: None,
                holder: HolderId::new(),
                lease,
                period,
                max_hold: None,
                deadline: now + lease,
                label: Arc::from("k"),
                meter: Meter::custom(),
                counts_loss: true,
            },
            generation: 1,
            keeper,
            next_due: now,
            cap: None,
            phase: Phase::Renewing,
            in_flight: false,
            retrying: false,
            releasing: 0,
            current: None,
        }
    }

    /// Review of issue 32: a re-entry that found the entry gone while the holder's own release
    /// was on its way reported the lease lost (and counted the loss): the release deleted it.
    #[test]
    fn a_reentry_racing_its_own_release_is_not_a_loss() {
        let now = Instant::now();
        let renewal = Renewal::new(Weak::new(), ClientMeter::new("test"));
        let mut reg = registration(now, Duration::from_secs(1));
        let watch = reg.keeper.watch();
        let (key, holder) = (reg.hold.key.clone(), reg.hold.holder);
        reg.releasing = 1;
        lock(&renewal.shared.state)
            .regs
            .insert((key.clone(), holder), reg);
        renewal.lose(&key, holder, LossReason::EntryGone);
        assert_eq!(watch.loss_reason(), None, "the release's doing, not a loss");
        lock(&renewal.shared.state)
            .regs
            .get_mut(&(key.clone(), holder))
            .unwrap()
            .releasing = 0;
        renewal.lose(&key, holder, LossReason::EntryGone);
        assert_eq!(
            watch.loss_reason(),
            Some(LossReason::EntryGone),
            "without a release, a loss"
        );
    }

    /// a renewal that answered 0 while a release of the same holder was
    /// in flight left `next_due` in the past, so the service sent renewals back to back until
    /// the release answered. It now waits the retry delay.
    #[test]
    fn renewal_during_inflight_release_does_not_spin() {
        let now = Instant::now();
        let period = Duration::from_millis(100);
        let mut st = State::default();
        let mut reg = registration(now, period);
        let key = (reg.hold.key.clone(), reg.hold.holder);
        reg.releasing = 1;
        st.regs.insert(key.clone(), reg);
        let (batch, _) = plan(&mut st, now);
        assert_eq!(batch.len(), 1, "the registration is due");
        let reg = st.regs.get_mut(&key).unwrap();
        apply(reg, Ok(0), period * 2, now, now);
        assert!(
            !matches!(reg.phase, Phase::Lost),
            "a release's doing, not a loss"
        );
        // Right after the reply, and a little later: nothing to send yet.
        for later in [now, now + Duration::from_millis(1)] {
            let (batch, wake) = plan(&mut st, later);
            assert!(
                batch.is_empty(),
                "renewal sent again at once during the release"
            );
            assert!(
                wake.is_some_and(|w| w > later),
                "the service sleeps until the retry"
            );
        }
        // At the retry delay it asks again.
        let (batch, _) = plan(&mut st, now + retry_delay(period));
        assert_eq!(batch.len(), 1);
    }

    /// the release's answer ended the "release in flight" mark before
    /// the hold was deregistered, so a renewal answering 0 in between (the release had
    /// deleted the entry) reported a hold that was just released lost (`EntryGone`, a WARN).
    /// A release that frees the hold now deregisters it in the same step.
    #[test]
    fn d18_a_renewal_answered_after_the_release_is_not_a_loss() {
        let now = Instant::now();
        let period = Duration::from_millis(100);
        let mut st = State::default();
        let mut reg = registration(now, period);
        let watch = reg.keeper.watch();
        let key = (reg.hold.key.clone(), reg.hold.holder);
        reg.releasing = 1; // begin_release
        st.regs.insert(key.clone(), reg);
        let (batch, _) = plan(&mut st, now);
        assert_eq!(batch.len(), 1, "a renewal goes out beside the release");
        // The release answers first: 0 levels left.
        st.end_release(&key, Some(1), true);
        // Then the renewal's 0 (the entry is gone) is applied, as `renew_now` does.
        if let Some(reg) = st.regs.get_mut(&key) {
            apply(reg, Ok(0), period * 2, now, now);
        }
        assert!(
            !watch.is_lost(),
            "a released hold was reported lost: {:?}",
            watch.loss_reason()
        );
        // A registration of a later generation is not touched by an older release.
        let mut newer = registration(now, period);
        newer.generation = 2;
        newer.releasing = 1;
        let key = (newer.hold.key.clone(), newer.hold.holder);
        st.regs.insert(key.clone(), newer);
        st.end_release(&key, Some(1), true);
        assert_eq!(st.regs.get(&key).map(|r| r.releasing), Some(1));
    }

    /// A failed renewal (an error reply, a broken connection) is retried after the retry
    /// delay, not at once: the early-renewal window used to swallow the delay.
    #[test]
    fn failed_renewal_waits_the_retry_delay() {
        let now = Instant::now();
        let period = Duration::from_millis(100);
        let mut st = State::default();
        let reg = registration(now, period);
        let key = (reg.hold.key.clone(), reg.hold.holder);
        st.regs.insert(key.clone(), reg);
        assert_eq!(plan(&mut st, now).0.len(), 1);
        let reg = st.regs.get_mut(&key).unwrap();
        apply(reg, Err("connection reset".into()), period * 2, now, now);
        assert!(plan(&mut st, now).0.is_empty(), "retried back to back");
        assert_eq!(plan(&mut st, now + retry_delay(period)).0.len(), 1);
    }

    /// Without a release in flight, 0 is a loss (unchanged).
    #[test]
    fn renewal_answering_zero_is_entry_gone() {
        let now = Instant::now();
        let mut reg = registration(now, Duration::from_millis(100));
        let watch = reg.keeper.watch();
        apply(&mut reg, Ok(0), Duration::from_millis(200), now, now);
        assert!(matches!(reg.phase, Phase::Lost));
        assert_eq!(watch.loss_reason(), Some(LossReason::EntryGone));
    }
}
