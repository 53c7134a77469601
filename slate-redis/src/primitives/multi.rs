//! The multi-lock: several named single locks held as one, all or nothing, without deadlock.
//!
//! ## How it takes the names
//!
//! The names are kept in one **canonical order**, the same in every process whatever order the
//! caller gave them in: by the lock's key (its bytes: the names sorted, as a careful caller
//! sorts them by hand); on a Redis Cluster by the key's hash slot first, so that the names of
//! one slot come together. Every process of a deployment uses the same topology, so the same
//! order.
//! The invariant everything rests on: **a caller waits for a name only while it holds no name
//! after it in that order.** Two callers can then never wait for each other in a cycle (the
//! one holding the later of the contested names is never waiting for an earlier one), so
//! there is no deadlock, and a caller waiting on a busy name waits in that name's own queue,
//! with its fair turn and its release notification, exactly as a single-lock waiter does.
//!
//! 1. **The names one server holds are taken in one script call** (`acquire_many.lua`: off
//!    a cluster, the whole set; on a cluster, the names of one hash slot, which the order
//!    puts together). In one server step it runs each name's own acquire (`acquire.lua`, with
//!    its queue, fair turn, re-entry, request record and fencing token) in order, and stops at
//!    the first name it does not grant: that one is waited for in its queue, and the names
//!    after it are not touched (never taken to be given back). Each name's reply then becomes
//!    a hold through the name's own lock (its synchronizer, renewal and guard), as the lock's
//!    own attempt would make it (`competitor::Primed`).
//! 2. **A name a task of this process holds or waits for** is taken alone, through its lock's
//!    local queue (its local holders' passes and turn stay as they are).
//! 3. **Across servers (a cluster), uncontended:** every name is asked at once, one attempt
//!    per name, all sent together (one pipeline per server, one round trip). If every name is
//!    granted, the guard is made. On a busy name k, the names after k that were granted are
//!    released (the invariant), the ones before it are kept, and the caller waits for k in
//!    its queue, then takes the rest group by group as in 1. **Contended** (a busy answer less
//!    than a second ago, or local waiters on one of the names), the groups are taken one
//!    after the other from the start, so that a contended set costs no grants given back.
//!
//! Under [`Wait::Immediate`] (`try_lock`), a busy name ends the call: the names taken before
//! it are released.
//!
//! Whatever happens in between, the caller sees nothing until every name is held: the guard
//! exists only then. A failure, a timeout or a cancelled future releases every name taken.

use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::Either;
use futures::future::{join_all, select_all};
use slate_core::detach::{Detached, on_runtime};
use slate_core::{
    Error, FencingToken, HolderId, LockName, LockOptions, LockOptionsBuilder, LossReason, Result,
    Wait,
};

use crate::client::lock;
use crate::primitives::lock::competitor::release_batch;
use crate::primitives::lock::guard::{RemoteRelease, SingleLockGuard};
use crate::primitives::lock::{ClientSource, SingleLock};

/// How long a busy answer makes a multi-lock take its names one by one in order.
const CONTENDED_FOR: Duration = Duration::from_secs(1);

/// Several named locks held as one: all of them or none, by one holder, without deadlock
/// whatever sets other callers take (see the module's canonical order).
///
/// Each name is a [`SingleLock`] of the same client and options: a multi-lock holder excludes
/// the single-lock holders of each of its names and the other way round, each name keeps its
/// own fencing token (strictly increasing per name), lease (renewed by the client's renewal
/// service, every lock of the client in one pipeline per server and tick), re-entry per
/// holder, queue and fair turn; a waiter for `{a, b}` waits in `b`'s queue like any waiter
/// for `b`, so a stream of `b`'s single-lock holders cannot starve it.
///
/// ## Behaviour
///
/// - **All or nothing**: the guard exists only when every name is held; a busy answer under
///   [`try_lock`](Self::try_lock), a timeout, an error or a dropped future releases every name
///   taken so far.
/// - **Deadlock-free by construction**: names are taken in one canonical order (sorted keys;
///   on a cluster, hash slot then key), and a caller never waits for a name while holding a
///   later one. Two multi-locks
///   of overlapping sets, given in any order, never wait for each other in a cycle. (A holder
///   that already holds a name through a single lock and then asks a multi-lock for an earlier
///   one steps outside that order, as nested locks always can.)
/// - **Waiting without polling**: on a busy name the caller waits in its queue and is woken by
///   its release message, as [`SingleLock::lock`] is.
/// - **One server step per server**: the names one server (or one cluster slot) holds are
///   taken by one script call, in order, up to the first busy one, which is waited for; the
///   names after it are not touched. Uncontended, the set costs one round trip; see the
///   module doc for the cluster's several servers.
/// - **Loss**: [`MultiLockGuard::lost`] fires when any name's lease is lost. A name taken
///   early and lost while the caller waited for a later one (a renewal failed, an operator
///   deleted it) is not handed over: the set is given back and taken again in order, as the
///   wait allows; a name lost to its max hold (which runs from its own grant, so a retry would
///   lose it again) ends the call with [`Error::LeaseLost`].
/// - At most [`MAX_NAMES`](Self::MAX_NAMES) names; duplicates are refused.
///
/// # Examples
///
/// ```no_run
/// use slate_redis::{MultiLock, RedisClient};
///
/// # #[tokio::main] async fn main() -> slate_redis::Result<()> {
/// let client = RedisClient::open("redis://127.0.0.1:6379")?;
/// // Move money from account 7 to account 9: both or neither, in any order.
/// let accounts = MultiLock::builder(&client, ["account:9", "account:7"]).build()?;
/// let guard = accounts.lock().await?;
/// let from = guard.fencing_token("account:7").expect("a name of the set");
/// let to = guard.fencing_token("account:9").expect("a name of the set");
/// # let _ = (from, to);
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MultiLock {
    inner: Arc<MultiInner>,
}

struct MultiInner {
    /// The names' locks, in canonical order.
    locks: Vec<SingleLock>,
    /// For each name, the end of its group: the names after it (in order) that the same
    /// server holds (one cluster slot, or the whole set off a cluster), which one
    /// `acquire_many.lua` call can take.
    group_end: Vec<usize>,
    /// When a name last answered busy (the set is contended for a while after it).
    busy_at: Mutex<Option<Instant>>,
    label: Arc<str>,
}

/// Builds a [`MultiLock`] (see [`MultiLock::builder`]).
///
/// # Examples
///
/// ```no_run
/// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
/// let lock = slate_redis::MultiLock::builder(&client, ["a", "b"])
///     .lease(std::time::Duration::from_secs(10))
///     .build()?;
/// # Ok::<(), slate_redis::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "a builder does nothing until build() is called"]
pub struct MultiLockBuilder {
    source: ClientSource,
    names: Result<Vec<LockName>>,
    options: LockOptionsBuilder,
}

slate_core::lock_options_setters!(
    MultiLockBuilder,
    slate_redis,
    setup = "# let client = slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\")?;",
    start = "slate_redis::MultiLock::builder(&client, [\"a\", \"b\"])",
    [
        lease,
        renewal_period,
        spin_wait,
        max_hold,
        key_prefix,
        options
    ],
);

impl MultiLockBuilder {
    /// Builds the multi-lock (nothing is sent to Redis).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::MultiLock::builder(&client, ["a", "b"]).build()?;
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a bad name or option, no names, a name given twice, more
    /// than [`MultiLock::MAX_NAMES`] names, or a name this client already uses with other
    /// options or for another kind of lock.
    pub fn build(self) -> Result<MultiLock> {
        let names = self.names?;
        let options: LockOptions = self.options.build()?;
        if names.is_empty() {
            return Err(Error::invalid_input(
                "multi-lock names",
                "no names",
                "name at least one lock (a multi-lock of one name is a single lock)",
            ));
        }
        if names.len() > MultiLock::MAX_NAMES {
            return Err(Error::invalid_input(
                "multi-lock names",
                format!("{} names", names.len()),
                format!(
                    "lock at most {} names at once (split the set, or lock a coarser name)",
                    MultiLock::MAX_NAMES
                ),
            ));
        }
        let client = self.source.0;
        let mut locks = Vec::with_capacity(names.len());
        for name in &names {
            locks.push(
                SingleLock::builder(&client, name.as_bytes())
                    .options(options.clone())
                    .build()?,
            );
        }
        let cluster = client.topology() == crate::Topology::Cluster;
        locks.sort_by_cached_key(|l| canonical_key(l.key(), cluster));
        if let Some(w) = locks.windows(2).find(|w| w[0].key() == w[1].key()) {
            return Err(Error::invalid_input(
                "multi-lock names",
                format!("{} is given twice", w[0].name()),
                "name each lock once",
            ));
        }
        let label = locks
            .iter()
            .map(|l| l.name().to_string())
            .collect::<Vec<_>>()
            .join("+");
        let group_end = group_ends(&locks, cluster);
        Ok(MultiLock {
            inner: Arc::new(MultiInner {
                locks,
                group_end,
                busy_at: Mutex::new(None),
                label: Arc::from(label),
            }),
        })
    }
}

/// For each lock (in canonical order), the end of the run of locks from it that one server
/// holds: off a cluster, every lock; on a cluster, those of its hash slot (the canonical order
/// puts them together).
fn group_ends(locks: &[SingleLock], cluster: bool) -> Vec<usize> {
    let slots: Vec<u16> = locks
        .iter()
        .map(|l| canonical_key(l.key(), cluster).0)
        .collect();
    let mut ends = vec![locks.len(); locks.len()];
    for i in (0..locks.len().saturating_sub(1)).rev() {
        ends[i] = if slots[i] == slots[i + 1] {
            ends[i + 1]
        } else {
            i + 1
        };
    }
    ends
}

/// A lock key's place in the canonical order: its bytes; on a cluster, its hash slot first.
fn canonical_key(key: &[u8], cluster: bool) -> (u16, Vec<u8>) {
    let slot = if cluster {
        crate::client::conn::slot_of(key)
    } else {
        0
    };
    (slot, key.to_vec())
}

impl MultiLock {
    /// The most names one multi-lock takes.
    pub const MAX_NAMES: usize = 64;

    /// Starts building a multi-lock over `names` (in any order) on `client`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::MultiLock::builder(&client, ["account:7", "account:9"]).build()?;
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    pub fn builder<N: AsRef<[u8]>>(
        client: impl Into<ClientSource>,
        names: impl IntoIterator<Item = N>,
    ) -> MultiLockBuilder {
        MultiLockBuilder {
            source: client.into(),
            names: names.into_iter().map(LockName::new).collect(),
            options: LockOptionsBuilder::default(),
        }
    }

    /// The names' locks, in the canonical order they are taken in.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::MultiLock::builder(&client, ["b", "a"]).build()?;
    /// for single in lock.locks() {
    ///     println!("{}", single.name());
    /// }
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    #[must_use]
    pub fn locks(&self) -> &[SingleLock] {
        &self.inner.locks
    }

    /// The client the names' locks use.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// let lock = slate_redis::MultiLock::builder(&client, ["a", "b"]).build()?;
    /// let _stats = lock.client().stats();
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    #[must_use]
    pub fn client(&self) -> &crate::RedisClient {
        self.inner.locks[0].client()
    }

    /// Acquires every name for `holder`, waiting as `wait` allows (the one call the others are
    /// made of).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::MultiLock::builder(&client, ["a", "b"]).build()?;
    /// use slate_redis::{HolderId, Wait};
    /// let guard = lock.acquire(HolderId::new(), Wait::Immediate).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Busy`] naming a busy name under [`Wait::Immediate`]; [`Error::Timeout`] when
    /// the deadline of [`Wait::Until`] passes; [`Error::LeaseLost`] when a name taken early
    /// was lost and the set could not be taken again (its max hold, or no time left);
    /// backend errors. No name is held after an error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future releases the names it took (in the background) and
    /// leaves the queue of the name it waited for.
    pub fn acquire(
        &self,
        holder: HolderId,
        wait: Wait,
    ) -> impl Future<Output = Result<MultiLockGuard>> + Send + '_ {
        self.acquire_for(Some(holder), wait)
    }

    /// Acquires for `holder`, or for the current holder (read now) when it is `None`.
    fn acquire_for(
        &self,
        holder: Option<HolderId>,
        wait: Wait,
    ) -> impl Future<Output = Result<MultiLockGuard>> + Send + '_ {
        let holder = holder.unwrap_or_else(HolderId::current);
        let span = tracing::debug_span!("acquire", lock = %self.inner.label, %holder);
        tracing::Instrument::instrument(self.take_all(holder, wait), span)
    }

    async fn take_all(&self, holder: HolderId, wait: Wait) -> Result<MultiLockGuard> {
        let locks = &self.inner.locks;
        let mut held: Vec<SingleLockGuard> = Vec::with_capacity(locks.len());
        // One server (or one cluster slot) holds every name: its batch takes them in order,
        // in one step, and never has to give one back (`in_order`). Across servers, the
        // uncontended set is asked everywhere at once.
        let one_group = self.inner.group_end[0] == locks.len();
        if !one_group && !self.contended() {
            // Every name at once, none waiting.
            let tries = join_all(locks.iter().map(|l| l.acquire(holder, Wait::Immediate))).await;
            let mut later = Vec::new();
            let mut failed = None;
            for t in tries {
                match (t, &failed) {
                    (Ok(g), None) => held.push(g),
                    // Granted after a name that was not: given back before any wait.
                    (Ok(g), Some(_)) => later.push(g),
                    (Err(e), None) => failed = Some(e),
                    (Err(_), Some(_)) => {}
                }
            }
            let Some(e) = failed else {
                return self.in_order(holder, held, wait).await;
            };
            if e.is_busy() {
                self.note_busy();
            }
            let given_back = release_all(later).await;
            if !e.is_busy() || matches!(wait, Wait::Immediate) {
                drop(release_all(held).await);
                return Err(e);
            }
            // A later name whose release failed may stay held in Redis until its lease ends:
            // waiting now could wait for a caller that waits for it. Give up instead.
            if let Err(release_error) = given_back {
                drop(release_all(held).await);
                return Err(release_error);
            }
        }
        self.in_order(holder, held, wait).await
    }

    /// Takes the names from the first one not in `held`, in order, waiting on each as `wait`
    /// allows. A name taken early and lost while the caller waits for a later one (a failed
    /// renewal, an operator's force-unlock) is not handed over: everything is given back and
    /// the names are taken again from the first, as `wait` still allows; a name lost to its
    /// max hold (which a retry would lose again), or any loss under [`Wait::Immediate`] or
    /// past the deadline, is answered with [`Error::LeaseLost`].
    async fn in_order(
        &self,
        holder: HolderId,
        mut held: Vec<SingleLockGuard>,
        wait: Wait,
    ) -> Result<MultiLockGuard> {
        let locks = &self.inner.locks;
        loop {
            let mut lost = None;
            while held.len() < locks.len() {
                lost = lost_name(&held);
                if lost.is_some() {
                    break;
                }
                if let Err(e) = self.take_next(holder, &mut held, wait).await {
                    if e.is_busy() || e.is_timeout() {
                        self.note_busy();
                    }
                    drop(release_all(held).await);
                    return Err(e);
                }
            }
            let Some((name, reason)) = lost.or_else(|| lost_name(&held)) else {
                return Ok(self.guard(holder, held));
            };
            tracing::debug!(lock = %self.inner.label, %name, %reason, "a name was lost while the set was taken");
            let given_back = release_all(std::mem::take(&mut held)).await;
            let out_of_time = matches!(wait, Wait::Immediate)
                || wait.deadline().is_some_and(|d| Instant::now() >= d);
            if out_of_time || reason == LossReason::MaxHoldReached {
                return Err(Error::lease_lost(name.to_string(), holder, reason));
            }
            // A name whose release failed may stay held in Redis until its lease ends: taking
            // the set again could wait for a caller that waits for it.
            given_back?;
        }
    }

    /// Takes the next name not in `held`, and with it the following names of its group (one
    /// server's, or one cluster slot's) that no task of this process holds or waits for: one
    /// `acquire_many.lua` call takes them in order up to the first it does not grant, which
    /// is then waited for in its queue, as `wait` allows. Each reply becomes a hold through
    /// its name's own lock (see `competitor::Primed`). A name this process already holds or
    /// waits for is taken alone, through its lock's local queue.
    async fn take_next(
        &self,
        holder: HolderId,
        held: &mut Vec<SingleLockGuard>,
        wait: Wait,
    ) -> Result<()> {
        let locks = &self.inner.locks;
        let start = held.len();
        let group_end = self.inner.group_end[start];
        let end = (start..group_end)
            .find(|&i| !locally_idle(&locks[i]))
            .unwrap_or(group_end);
        if end < start + 2 {
            held.push(locks[start].acquire(holder, wait).await?);
            return Ok(());
        }
        let batch = Answered::send(locks[start..end].to_vec(), holder).await?;
        if batch.granted < batch.answered {
            self.note_busy();
        }
        take_answered(batch, holder, held, wait).await
    }

    /// Whether to take the names one by one: a busy answer came less than
    /// [`CONTENDED_FOR`] ago, or tasks of this process wait for one of them.
    fn contended(&self) -> bool {
        let recent = lock(&self.inner.busy_at).is_some_and(|at| at.elapsed() < CONTENDED_FOR);
        recent || self.inner.locks.iter().any(|l| l.local_waiters() > 0)
    }

    fn note_busy(&self) {
        *lock(&self.inner.busy_at) = Some(Instant::now());
    }

    fn guard(&self, holder: HolderId, guards: Vec<SingleLockGuard>) -> MultiLockGuard {
        MultiLockGuard {
            lock: self.clone(),
            holder,
            guards,
        }
    }

    /// The blocking twin of `acquire_for`, for threads.
    fn blocking_acquire(
        &self,
        holder: Option<HolderId>,
        wait: Wait,
        what: &str,
    ) -> Result<MultiLockGuard> {
        slate_core::blocking::assert_outside_runtime(what);
        let holder = holder.unwrap_or_else(HolderId::current);
        let me = self.clone();
        slate_core::blocking::wait_on(self.client().runtime(), async move {
            me.take_all(holder, wait).await
        })
    }

    slate_core::waiting_methods!(
        MultiLockGuard,
        setup = "# #[tokio::main(flavor = \"current_thread\")] async fn main() -> slate_redis::Result<()> {\n\
                 # let client = slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\")?;\n\
                 # let lock = slate_redis::MultiLock::builder(&client, [\"a\", \"b\"]).build()?;",
        errors = "backend failures",
    );

    slate_core::blocking_waiting_methods!(
        "MultiLock",
        MultiLockGuard,
        setup = "# fn main() -> Result<(), Box<dyn std::error::Error>> {\n\
                 # let rt = tokio::runtime::Runtime::new()?;\n\
                 # let client = rt.block_on(async { slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\") })?;\n\
                 # let lock = slate_redis::MultiLock::builder(&client, [\"a\", \"b\"]).build()?;",
        errors = "backend failures",
    );
}

/// Takes a batch's replies in order, each through its name's own lock, pushing each hold
/// taken on `held`: a grant at once, the first name not granted waiting as `wait` allows.
async fn take_answered(
    mut batch: Answered,
    holder: HolderId,
    held: &mut Vec<SingleLockGuard>,
    wait: Wait,
) -> Result<()> {
    while let Some((lock, granted)) = batch.next_lock() {
        if !granted && !locally_idle(&lock) {
            // A task of this process came for the name since: its busy answer is given
            // back, and the name is waited for in the local queue (asked anew).
            batch.done();
        }
        // A grant is taken at once; the first name not granted is waited for.
        let now = if granted { Wait::Immediate } else { wait };
        let taken = lock.acquire(holder, now).await;
        batch.done_if_next(&lock);
        match taken {
            // The grant did not become a hold here: a task of this process owns the name (its
            // hold ended remotely, not yet here), or took the grant under the same holder. It
            // is waited for; the grants after it are given back first (the invariant), and
            // taken again afterwards.
            Err(e) if granted && e.is_busy() => {
                batch.give_back_rest().await?;
                held.push(lock.acquire(holder, wait).await?);
                return Ok(());
            }
            taken => held.push(taken?),
        }
    }
    Ok(())
}

/// Whether no task of this process holds `lock` or waits for it (its next acquisition then
/// attempts at once, and takes a batch's reply).
fn locally_idle(lock: &SingleLock) -> bool {
    let sync = &lock.shared.sync;
    sync.owner().is_none() && sync.waiters() == 0
}

/// A batch's replies, primed on its locks (see `competitor::Primed`) and taken one by one in
/// order; the ones not taken when it is dropped (an error, a dropped caller) are taken back:
/// a grant is given back, and a busy answer's place in line is left.
struct Answered {
    locks: Vec<SingleLock>,
    holder: HolderId,
    request: u64,
    granted: usize,
    answered: usize,
    next: usize,
}

impl Answered {
    /// Sends `acquire_many.lua` over `locks` (one group, canonical order). Detached: if the
    /// caller is dropped before the reply, a task finishes the call and drops its answer,
    /// which takes every reply back.
    async fn send(locks: Vec<SingleLock>, holder: HolderId) -> Result<Answered> {
        let runtime = locks[0].client().runtime().clone();
        let send = async move {
            let sent = {
                let competitors: Vec<_> = locks.iter().map(|l| l.shared.competitor()).collect();
                crate::primitives::lock::competitor::acquire_batch(&competitors, holder).await
            };
            sent.map(|b| Answered {
                locks,
                holder,
                request: b.request,
                granted: b.granted,
                answered: b.answered,
                next: 0,
            })
        };
        Detached::new(send, runtime).await
    }

    /// The next lock whose reply waits, and whether that reply is a grant.
    fn next_lock(&self) -> Option<(SingleLock, bool)> {
        (self.next < self.answered)
            .then(|| (self.locks[self.next].clone(), self.next < self.granted))
    }

    /// The next lock's acquisition has ended (or will not use the reply): takes its reply
    /// back if it is still there.
    fn done(&mut self) {
        self.locks[self.next]
            .shared
            .competitor()
            .unprime(self.holder, self.request);
        self.next += 1;
    }

    /// [`done`](Self::done) for `lock` unless it was done already (its reply given back
    /// before its acquisition).
    fn done_if_next(&mut self, lock: &SingleLock) {
        let next = self
            .locks
            .get(self.next)
            .filter(|_| self.next < self.answered);
        if next.is_some_and(|l| Arc::ptr_eq(&l.shared, &lock.shared)) {
            self.done();
        }
    }

    /// Gives back every reply not taken yet, and waits until it is given back: a caller
    /// about to wait must not hold a later name meanwhile. The first release that failed is
    /// answered (its name ends with its lease: waiting could wait for a caller that waits for
    /// it).
    ///
    /// Cancel safe: each give-back is [`Detached`], so a dropped caller leaves it to finish
    /// (taken back from its lock, a reply lives only in that future).
    async fn give_back_rest(&mut self) -> Result<()> {
        let mut given = Vec::new();
        while self.next < self.answered {
            let shared = Arc::clone(&self.locks[self.next].shared);
            self.next += 1;
            let Some(left) = shared.competitor().take_back(self.holder, self.request) else {
                continue;
            };
            let runtime = shared.competitor().client.runtime().clone();
            given.push(Detached::new(
                async move { shared.competitor().give_back(left).await },
                runtime,
            ));
        }
        join_all(given).await.into_iter().collect()
    }
}

impl Drop for Answered {
    fn drop(&mut self) {
        for l in &self.locks[self.next..self.answered] {
            l.shared.competitor().unprime(self.holder, self.request);
        }
    }
}

/// The first of `held` whose lease is lost, with the reason.
fn lost_name(held: &[SingleLockGuard]) -> Option<(LockName, LossReason)> {
    held.iter().find_map(|g| {
        g.lease()
            .loss_reason()
            .map(|r| (g.lock().name().clone(), r))
    })
}

/// Releases each guard, all at once. A name found not held is given back; the first other
/// failure is answered (that name's entry then ends with its lease).
async fn release_all(guards: Vec<SingleLockGuard>) -> Result<()> {
    let mut first = None;
    for r in release_guards(guards).await? {
        match r {
            Ok(_) => {}
            Err(e) if e.is_not_held() => {}
            Err(e) => {
                tracing::debug!(error = %e, "a multi-lock name could not be released; it ends with its lease");
                first.get_or_insert(e);
            }
        }
    }
    first.map_or(Ok(()), Err)
}

/// Releases one level of each guard (names of one multi-lock, in canonical order), all at
/// once, and answers each name's outcome in order, as its own `unlock` would.
///
/// A level passed to a local waiter ends here, at the call. The remote releases of the names
/// one server holds (one cluster slot, or every name off a cluster: a run of the canonical
/// order) go in one `release_many.lua` call; a name alone in its run goes as a single lock's
/// release. The releases start when this is called and are finished by a task if the future
/// is dropped.
///
/// # Errors
///
/// [`Error::Closed`] when the client's runtime shut down before the releases ran (each
/// name's own failure is in its answer).
fn release_guards(
    guards: Vec<SingleLockGuard>,
) -> impl Future<Output = Result<Vec<Result<u32>>>> + Send + 'static {
    let Some(first) = guards.first() else {
        return Either::Left(std::future::ready(Ok(Vec::new())));
    };
    let runtime = first.lock().client().runtime().clone();
    let cluster = first.lock().client().topology() == crate::Topology::Cluster;
    let slot = |r: &RemoteRelease| canonical_key(r.lock.key(), cluster).0;
    let mut runs: Vec<Vec<(usize, RemoteRelease)>> = Vec::new();
    let mut answers: Vec<Option<Result<u32>>> = Vec::with_capacity(guards.len());
    for (i, g) in guards.into_iter().enumerate() {
        match g.into_release() {
            // Passed to a local waiter: done.
            None => answers.push(Some(Ok(0))),
            Some(r) => {
                answers.push(None);
                match runs.last_mut() {
                    Some(run) if slot(&run[0].1) == slot(&r) => run.push((i, r)),
                    _ => runs.push(vec![(i, r)]),
                }
            }
        }
    }
    let releases = async move {
        let released = runs.into_iter().map(|run| async move {
            if run.len() == 1 {
                let (i, r) = run.into_iter().next().expect("one name");
                return vec![(i, r.run().await)];
            }
            let names: Vec<_> = run
                .iter()
                .map(|(_, r)| (r.lock.shared.competitor(), r.remote, r.local_waiters))
                .collect();
            let replies = release_batch(&names).await;
            // Each name ends as soon as its answer is known (its local waiters are woken
            // within the turn kept for them); an overtaken one is released alone after.
            let mut done = Vec::with_capacity(run.len());
            let mut again = Vec::new();
            for ((i, r), reply) in run.into_iter().zip(replies) {
                match reply {
                    Ok(None) => again.push((i, r)),
                    Ok(Some(n)) => done.push((i, r.finish(Ok(n)))),
                    Err(e) => done.push((i, r.finish(Err(e)))),
                }
            }
            for (i, r) in again {
                done.push((i, r.run().await));
            }
            done
        });
        for (i, answer) in join_all(released).await.into_iter().flatten() {
            answers[i] = Some(answer);
        }
        Ok(answers
            .into_iter()
            .map(|a| a.expect("every name answered"))
            .collect())
    };
    Either::Right(Detached::new(
        on_runtime(runtime.clone(), releases),
        runtime,
    ))
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field("names", &self.inner.label)
            .field("options", self.inner.locks[0].options())
            .finish_non_exhaustive()
    }
}

/// Every name of a [`MultiLock`] held by one holder: one level of each name's hold.
///
/// Release it with [`unlock`](Self::unlock) (every name at once). Dropping it releases
/// every name in the background, as dropping a [`SingleLockGuard`] does.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
/// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
/// let lock = slate_redis::MultiLock::builder(&client, ["a", "b"]).build()?;
/// let guard = lock.lock().await?;
/// for (name, token) in guard.fencing_tokens() {
///     println!("{name}: {token}");
/// }
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases every name in the background; call unlock().await to see the outcome"]
pub struct MultiLockGuard {
    lock: MultiLock,
    holder: HolderId,
    /// One per name, in canonical order.
    guards: Vec<SingleLockGuard>,
}

impl MultiLockGuard {
    /// The holder every name is held by.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::MultiLock::builder(&client, ["a", "b"]).build()?;
    /// let guard = lock.lock().await?;
    /// println!("held by {}", guard.holder());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn holder(&self) -> HolderId {
        self.holder
    }

    /// The fencing token of `name` (as given to the builder), or `None` for a name not in the
    /// set.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::MultiLock::builder(&client, ["a", "b"]).build()?;
    /// let guard = lock.lock().await?;
    /// let token = guard.fencing_token("a").expect("a is in the set");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn fencing_token(&self, name: impl AsRef<[u8]>) -> Option<FencingToken> {
        let name = name.as_ref();
        self.guards
            .iter()
            .find(|g| g.lock().name().as_bytes() == name)
            .map(|g| g.fencing_token())
    }

    /// Every name with its fencing token, in canonical order.
    ///
    /// # Examples
    ///
    /// See the [type's](MultiLockGuard).
    pub fn fencing_tokens(&self) -> impl Iterator<Item = (&LockName, FencingToken)> + '_ {
        self.guards
            .iter()
            .map(|g| (g.lock().name(), g.fencing_token()))
    }

    /// Each name's own guard, in canonical order (its token, depth and lease).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::MultiLock::builder(&client, ["a", "b"]).build()?;
    /// let guard = lock.lock().await?;
    /// assert!(guard.guards().iter().all(|g| g.depth() == 1));
    /// # Ok(()) }
    /// ```
    pub fn guards(&self) -> &[SingleLockGuard] {
        &self.guards
    }

    /// The names' own guards, to release them one by one (each then behaves as a
    /// [`SingleLockGuard`]: dropping one releases that name in the background).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::MultiLock::builder(&client, ["a", "b"]).build()?;
    /// let guard = lock.lock().await?;
    /// for single in guard.into_guards() {
    ///     single.unlock().await?;
    /// }
    /// # Ok(()) }
    /// ```
    #[must_use = "dropping the guards releases every name in the background"]
    pub fn into_guards(mut self) -> Vec<SingleLockGuard> {
        std::mem::take(&mut self.guards)
    }

    /// The earliest lease deadline of the names: until then every name is held.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::MultiLock::builder(&client, ["a", "b"]).build()?;
    /// let guard = lock.lock().await?;
    /// assert!(guard.lease_deadline() > std::time::Instant::now());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn lease_deadline(&self) -> Instant {
        self.guards
            .iter()
            .map(|g| g.lease_deadline())
            .min()
            .unwrap_or_else(Instant::now)
    }

    /// Whether any name's lease is lost.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::MultiLock::builder(&client, ["a", "b"]).build()?;
    /// let guard = lock.lock().await?;
    /// assert!(!guard.is_lost());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(|g| g.is_lost())
    }

    /// Resolves when the lease of any name is lost, with that name and the reason: stop
    /// acting as the holder of the set.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::MultiLock::builder(&client, ["a", "b"]).build()?;
    /// let guard = lock.lock().await?;
    /// tokio::select! {
    ///     () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
    ///     (name, reason) = guard.lost() => eprintln!("{name} lost: {reason}"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a watch).
    pub async fn lost(&self) -> (LockName, LossReason) {
        let losses = self.guards.iter().map(|g| {
            Box::pin(async move {
                let reason = g.lost().await;
                (g.lock().name().clone(), reason)
            })
        });
        select_all(losses).await.0
    }

    /// Takes every name once more for this guard's holder (a re-entry of each: it does not
    /// wait for other holders and keeps each name's token).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::MultiLock::builder(&client, ["a", "b"]).build()?;
    /// let outer = lock.lock().await?;
    /// let inner = outer.reenter().await?;
    /// assert_eq!(inner.fencing_token("a"), outer.fencing_token("a"));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] when a name's hold ended meanwhile (the re-entry finds it gone;
    /// every name re-entered is given back); backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`MultiLock::acquire`].
    pub fn reenter(&self) -> impl Future<Output = Result<MultiLockGuard>> + Send + '_ {
        self.lock.acquire(self.holder, Wait::Immediate)
    }

    /// Releases one level of every name, all at once, and returns the holder's remaining hold
    /// count (0: the holder holds none of the names any more; re-entered sets count alike on
    /// every name).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// # let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # let lock = slate_redis::MultiLock::builder(&client, ["a", "b"]).build()?;
    /// let guard = lock.lock().await?;
    /// assert_eq!(guard.unlock().await?, 0);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The first name's error when some release failed ([`Error::NotHeld`] for a name whose
    /// lease was lost; backend failures, after which the name ends with its lease). Every
    /// name's release is attempted whatever the others do.
    ///
    /// # Cancel safety
    ///
    /// The releases start when this is called: a dropped future still completes them in the
    /// background.
    pub fn unlock(mut self) -> impl Future<Output = Result<u32>> + Send + 'static {
        let released = release_guards(std::mem::take(&mut self.guards));
        async move {
            let mut left = 0;
            let mut first_error = None;
            for r in released.await? {
                match r {
                    Ok(n) => left = left.max(n),
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            first_error.map_or(Ok(left), Err)
        }
    }

    /// The thread twin of [`unlock`](Self::unlock).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let rt = tokio::runtime::Runtime::new()?;
    /// # let client = rt.block_on(async { slate_redis::RedisClient::open("redis://127.0.0.1:6379") })?;
    /// # let lock = slate_redis::MultiLock::builder(&client, ["a", "b"]).build()?;
    /// let guard = lock.blocking_lock()?;
    /// guard.blocking_unlock()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`unlock`](Self::unlock).
    ///
    /// # Panics
    ///
    /// Inside a tokio runtime (use `unlock().await` there).
    pub fn blocking_unlock(self) -> Result<u32> {
        slate_core::blocking::assert_outside_runtime("MultiLockGuard::blocking_unlock");
        let runtime = self.lock.client().runtime().clone();
        slate_core::blocking::wait_on(&runtime, self.unlock())
    }
}

/// A dropped guard releases as [`unlock`](MultiLockGuard::unlock) does (one call per server),
/// in a task.
impl Drop for MultiLockGuard {
    fn drop(&mut self) {
        if !self.guards.is_empty() {
            drop(release_guards(std::mem::take(&mut self.guards)));
        }
    }
}

impl fmt::Debug for MultiLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLockGuard")
            .field("names", &self.lock.inner.label)
            .field("holder", &self.holder)
            .field(
                "tokens",
                &self
                    .guards
                    .iter()
                    .map(|g| g.fencing_token().get())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::primitives::lock::competitor::acquire_batch;

    /// A standalone server and a multi-lock over `names` there (30 s lease).
    #[allow(clippy::unwrap_used, reason = "a test")]
    fn set_on_a_server(names: &[&str]) -> (slate_harness::server::RedisServer, MultiLock) {
        let server = slate_harness::server::RedisServer::start().unwrap();
        let client = crate::RedisClient::open(server.url()).unwrap();
        let set = MultiLock::builder(&client, names)
            .lease(Duration::from_secs(30))
            .build()
            .unwrap();
        (server, set)
    }

    /// One batch over `locks` for `holder`, its replies held as the multi-lock holds them.
    #[allow(clippy::unwrap_used, reason = "a test")]
    async fn answered(locks: &[SingleLock], holder: HolderId) -> Answered {
        let competitors: Vec<_> = locks.iter().map(|l| l.shared.competitor()).collect();
        let sent = acquire_batch(&competitors, holder).await.unwrap();
        Answered {
            locks: locks.to_vec(),
            holder,
            request: sent.request,
            granted: sent.granted,
            answered: sent.answered,
            next: 0,
        }
    }

    /// Second review of the batched release: a name whose release meets a key of another
    /// type under its name answers that error (a response error, as a single release's), and
    /// the other names of the call keep their own answers (before, the call answered the
    /// error for every name, and a released name's kept turn was not handed on).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[allow(clippy::unwrap_used, reason = "a test")]
    async fn a_name_s_error_in_the_batched_release_is_that_name_s_alone() {
        let (server, set) = set_on_a_server(&["ea", "eb", "ec"]);
        let other = crate::RedisClient::open(server.url()).unwrap();
        let g = set.lock().await.unwrap();
        // Another process is told busy on eb (eb's release then reads its turn key), which
        // is then not Slate's.
        let eb = SingleLock::builder(&other, "eb").build().unwrap();
        assert!(eb.try_lock_for(Duration::from_millis(100)).await.is_err());
        server.command(&["SET", "slate:{eb}:turn", "x"]).unwrap();
        let answers = release_guards(g.into_guards()).await.unwrap();
        assert_eq!(answers.len(), 3);
        assert!(matches!(answers[0], Ok(0)), "{:?}", answers[0]);
        let e = answers[1].as_ref().unwrap_err();
        assert!(e.to_string().contains("WRONGTYPE"), "{e}");
        assert_eq!(e.backend_kind(), Some(slate_core::BackendKind::Response));
        assert!(matches!(answers[2], Ok(0)), "{:?}", answers[2]);
    }

    /// Review finding (issue 31): a granted name of a batch that a task of this process still
    /// owns (its hold ended in Redis, not yet here) is waited for in the local queue; the
    /// batch's later grants are given back first, or the caller would wait holding them (the
    /// invariant), and a set waiting for one of them in the other order would wait for it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[allow(clippy::unwrap_used, reason = "a test")]
    async fn a_batch_waiting_on_a_local_owner_holds_no_later_name() {
        let (server, set) = set_on_a_server(&["xc", "xb"]);
        let (b, c) = (set.locks()[0].clone(), set.locks()[1].clone());
        assert_eq!(b.name().to_string(), "xb");
        // X owns b here, and its hold is gone from Redis.
        let x = b.acquire(HolderId::new(), Wait::Immediate).await.unwrap();
        server.command(&["DEL", "slate:{xb}"]).unwrap();
        let holder = HolderId::new();
        let batch = answered(&[b.clone(), c.clone()], holder).await;
        assert_eq!((batch.granted, batch.answered), (2, 2));
        let taking = tokio::spawn(async move {
            let mut held = Vec::new();
            take_answered(batch, holder, &mut held, Wait::Forever)
                .await
                .map(|()| held)
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        while b.local_waiters() == 0 || c.is_locked().await.unwrap() {
            assert!(
                Instant::now() < deadline,
                "waiting on b (waiters {}) with c still held: {}",
                b.local_waiters(),
                c.is_locked().await.unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!taking.is_finished());
        taking.abort();
        drop(x);
    }

    /// Third review: the give-back of a batch's later grants before a wait is cancel safe. A
    /// caller dropped while a later name's release is on its way (here: reconnecting, after
    /// the server dropped the client's connection) leaves it to finish; the name does not
    /// stay held, unrenewed, for its 30 s lease.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[allow(clippy::unwrap_used, reason = "a test")]
    async fn a_dropped_wait_still_gives_the_later_grants_back() {
        let (server, set) = set_on_a_server(&["wc", "wb"]);
        let (b, c) = (set.locks()[0].clone(), set.locks()[1].clone());
        // X owns b here, and its hold is gone from Redis: the batch's grant of b is refused
        // locally, and c's is given back before the wait.
        let x = b.acquire(HolderId::new(), Wait::Immediate).await.unwrap();
        server.command(&["DEL", "slate:{wb}"]).unwrap();
        let holder = HolderId::new();
        let batch = answered(&[b.clone(), c.clone()], holder).await;
        assert_eq!((batch.granted, batch.answered), (2, 2));
        server
            .command(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"])
            .unwrap();
        let mut held = Vec::new();
        let mut taking = Box::pin(take_answered(batch, holder, &mut held, Wait::Forever));
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            assert!(
                futures::poll!(taking.as_mut()).is_pending(),
                "b is owned here: the set waits"
            );
            if lock(&c.shared.competitor().primed).is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "c's grant was never taken back");
            tokio::task::yield_now().await;
        }
        drop(taking);
        let deadline = Instant::now() + Duration::from_secs(5);
        while c.is_locked().await.unwrap() {
            assert!(
                Instant::now() < deadline,
                "c stays held after the dropped wait"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(x);
    }

    /// Second review (C1): a batch's grant taken by another task of the same holder, which
    /// then let the name go to another client, makes the set's own attempt busy: the set
    /// waits for the name (here until its deadline) instead of failing busy under a wait.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[allow(clippy::unwrap_used, reason = "a test")]
    async fn a_batch_grant_taken_by_the_same_holder_elsewhere_is_waited_for() {
        let (server, set) = set_on_a_server(&["yc", "yb"]);
        let other = crate::RedisClient::open(server.url()).unwrap();
        let lease = set.locks()[0].options().lease();
        let (b, c) = (set.locks()[0].clone(), set.locks()[1].clone());
        let holder = HolderId::new();
        let batch = answered(&[b.clone(), c.clone()], holder).await;
        assert_eq!((batch.granted, batch.answered), (2, 2));
        // Another task of the same holder takes b's grant, and lets b go to another client.
        let taken = b.acquire(holder, Wait::Immediate).await.unwrap();
        assert_eq!(taken.unlock().await.unwrap(), 0);
        let elsewhere = SingleLock::builder(&other, "yb")
            .lease(lease)
            .build()
            .unwrap()
            .acquire(HolderId::new(), Wait::Immediate)
            .await
            .unwrap();
        let mut held = Vec::new();
        let wait = Wait::Until(Instant::now() + Duration::from_millis(300));
        let e = take_answered(batch, holder, &mut held, wait)
            .await
            .expect_err("b is held elsewhere");
        assert!(e.is_timeout(), "a wait ends in a timeout, not busy: {e}");
        assert!(
            !c.is_locked().await.unwrap(),
            "c was given back before the wait"
        );
        drop(elsewhere);
    }

    /// Review finding (issue 31): a batch's grant that no attempt took is given back as one
    /// plain level. Given back by its request id, it was only marked when a later request of
    /// the same holder (a re-entry sent meanwhile) superseded the batch's record, and the
    /// level stayed held: 3 on the server against 2 held here.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[allow(clippy::unwrap_used, reason = "a test")]
    async fn a_batch_grant_nobody_took_is_given_back_even_after_a_later_request() {
        let server = slate_harness::server::RedisServer::start().unwrap();
        let client = crate::RedisClient::open(server.url()).unwrap();
        let lease = Duration::from_secs(30);
        let a = SingleLock::builder(&client, "ga")
            .lease(lease)
            .build()
            .unwrap();
        let b = SingleLock::builder(&client, "gb")
            .lease(lease)
            .build()
            .unwrap();
        let holder = HolderId::new();
        let outer = b.acquire(holder, Wait::Immediate).await.unwrap();
        // The batch re-enters b for the holder (2 on the server) and takes a.
        let competitors = [a.shared.competitor(), b.shared.competitor()];
        let batch = acquire_batch(&competitors, holder).await.unwrap();
        assert_eq!((batch.granted, batch.answered), (2, 2));
        // The holder re-enters b through its lock: a re-entry does not take the batch's
        // reply, and its request supersedes the batch's record (3 on the server).
        let inner = b.acquire(holder, Wait::Immediate).await.unwrap();
        assert_eq!(b.hold_count(holder).await.unwrap(), 3);
        assert!(b.shared.competitor().unprime(holder, batch.request));
        assert!(a.shared.competitor().unprime(holder, batch.request));
        let deadline = Instant::now() + Duration::from_secs(5);
        while b.hold_count(holder).await.unwrap() != 2 || a.is_locked().await.unwrap() {
            assert!(
                Instant::now() < deadline,
                "the batch's levels were not given back: b at {}, a locked: {}",
                b.hold_count(holder).await.unwrap(),
                a.is_locked().await.unwrap()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(inner.unlock().await.unwrap(), 1);
        assert_eq!(outer.unlock().await.unwrap(), 0);
        assert!(!b.is_locked().await.unwrap());
    }

    #[test]
    fn the_canonical_order_is_the_key_or_on_a_cluster_slot_then_key() {
        assert!(canonical_key(b"slate:{a}", false) < canonical_key(b"slate:{b}", false));
        // On a cluster the slot comes first: {b} (slot 3300) before {a} (slot 15495).
        assert!(canonical_key(b"slate:{b}", true) < canonical_key(b"slate:{a}", true));
        let a = canonical_key(b"slate:{a}", true);
        let b = canonical_key(b"slate:{b}", true);
        assert_eq!(a.0, crate::client::conn::slot_of(b"slate:{a}"));
        // The same two keys compare the same way whatever order they come in.
        let mut one = vec![b.clone(), a.clone()];
        let mut two = vec![a, b];
        one.sort();
        two.sort();
        assert_eq!(one, two);
    }
}
