//! The one driver of every exclusive lock (the single lock on any topology, the combination
//! lock, the ZooKeeper lock): the modes `contend`, `hold`, `reenter` and `wait`, written once
//! over the `DistributedLock` contract. What a lock does differently is a method of
//! [`Driven`]: which failed attempts mean "nothing held, ask again", how a holder re-enters,
//! whether the worker can PING its server or send a release past depth 0.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use ecosphere::clock::now_ns;
use ecosphere::history::{EventKind, OP_INCR, Recorder};
use ecosphere::worker::{Mode, WorkerArgs as Args};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use slate_combination::CombinationLock;
use slate_core::{DistributedLock, Error, HolderId, LockGuard};
use slate_history::logged::{Held, Log, Released as Logged};
use slate_redis::{RedisClient, SingleLock, SingleLockGuard};
use slate_zookeeper::ZkLock;

use crate::{
    Burners, Fenced, MAX_DURATION, Res, TICK, counter_incr, incr_outcome, late_word, may_operate,
    reason_code, recording, say, wait_file,
};

/// The guard of a driven lock.
type Guard<L> = <<L as Driven>::Lock as DistributedLock>::Guard;

/// The figures of the `STATS` line.
pub(crate) struct Stats {
    renewals: usize,
    subscriptions: usize,
    local_waiters: usize,
}

/// A lock this worker drives, with what it does differently from the others.
pub(crate) trait Driven: Send + Sync + 'static {
    /// The lock.
    type Lock: DistributedLock;

    /// The lock.
    fn lock(&self) -> &Self::Lock;

    /// The `STATS` line's figures: this client's renewals and subscriptions still registered,
    /// and the tasks of this process still waiting.
    fn stats(&self) -> Stats;

    /// Whether a failed acquisition held nothing and is asked again (recorded as `acq_fail`),
    /// rather than ending the mode: an attempt that found too few nodes, or ran out of its
    /// budget, released what it took; with `--tolerate-errors`, a retryable error (an
    /// election, a failover) too.
    fn asks_again(&self, e: &Error, tolerate_errors: bool) -> bool {
        e.is_insufficient_nodes() || e.is_timeout() || (tolerate_errors && e.is_retryable())
    }

    /// One more level for `guard`'s holder.
    fn reenter<'a>(
        &'a self,
        guard: &'a Guard<Self>,
    ) -> Pin<Box<dyn Future<Output = slate_core::Result<Guard<Self>>> + Send + 'a>> {
        Box::pin(self.lock().lock_as(guard.holder()))
    }

    /// PINGs the lock's server (after a healed link, before the unlock: `LINK_OK`), where the
    /// lock has one server to ask.
    fn ping(&self) -> Option<Pin<Box<dyn Future<Output = slate_core::Result<()>> + Send + '_>>> {
        None
    }

    /// Sends one release of `holder`'s hold although it holds nothing any more (the last step
    /// of `reenter`: `EXTRA`), where the lock's release is one script call; answers the
    /// script's reply.
    fn release_past_zero<'a>(
        &'a self,
        _holder: &'a str,
        _lease: Duration,
    ) -> Option<Pin<Box<dyn Future<Output = Res<i64>> + Send + 'a>>> {
        None
    }
}

/// The single lock, on a standalone server, a cluster or a Sentinel group.
pub(crate) struct Single {
    pub(crate) lock: SingleLock,
    pub(crate) client: RedisClient,
    /// A plain connection to the lock server (the release past depth 0).
    pub(crate) direct: MultiplexedConnection,
}

impl Driven for Single {
    type Lock = SingleLock;

    fn lock(&self) -> &SingleLock {
        &self.lock
    }

    fn stats(&self) -> Stats {
        let s = self.client.stats();
        Stats {
            renewals: s.renewals,
            subscriptions: s.subscriptions,
            local_waiters: s.local_waiters,
        }
    }

    /// Only with `--tolerate-errors`, and then any error (a failover, a slot migration): a
    /// single lock's timeout is an outcome the scenarios check (a grant too late to use).
    fn asks_again(&self, _e: &Error, tolerate_errors: bool) -> bool {
        tolerate_errors
    }

    fn reenter<'a>(
        &'a self,
        guard: &'a SingleLockGuard,
    ) -> Pin<Box<dyn Future<Output = slate_core::Result<SingleLockGuard>> + Send + 'a>> {
        // The guard's own re-entry (not `lock_as`): both are the single lock's API.
        Box::pin(guard.reenter())
    }

    fn ping(&self) -> Option<Pin<Box<dyn Future<Output = slate_core::Result<()>> + Send + '_>>> {
        Some(Box::pin(self.client.ping()))
    }

    fn release_past_zero<'a>(
        &'a self,
        holder: &'a str,
        lease: Duration,
    ) -> Option<Pin<Box<dyn Future<Output = Res<i64>> + Send + 'a>>> {
        Some(Box::pin(async move {
            let key = self.lock.key().to_vec();
            let mut channel = key.clone();
            channel.extend_from_slice(b":released");
            // The library's release script: no guard can express a release past depth 0.
            let release = slate_redis::lua_script("release").ok_or("no release script")?;
            let mut direct = self.direct.clone();
            redis::Script::new(release.source)
                .key(key)
                .key(channel)
                .arg(holder)
                .arg(u64::try_from(lease.as_millis()).unwrap_or(u64::MAX))
                .invoke_async(&mut direct)
                .await
                .map_err(|e| format!("extra release: {e}"))
        }))
    }
}

impl Driven for CombinationLock {
    type Lock = Self;

    fn lock(&self) -> &Self {
        self
    }

    fn stats(&self) -> Stats {
        Stats {
            renewals: 0,
            subscriptions: 0,
            local_waiters: self.local_waiters(),
        }
    }
}

impl Driven for ZkLock {
    type Lock = Self;

    fn lock(&self) -> &Self {
        self
    }

    fn stats(&self) -> Stats {
        Stats {
            renewals: 0,
            subscriptions: 0,
            local_waiters: self.local_waiters(),
        }
    }
}

/// What the modes share.
struct Ctx<L> {
    args: Args,
    rec: Recorder,
    driven: L,
    resource: Option<MultiplexedConnection>,
    /// The fenced resource, with `--fenced-key`.
    fenced: Option<Fenced>,
    deadline: Instant,
    attempts: AtomicU64,
    failed: AtomicU64,
    incomplete: AtomicU64,
}

impl<L: Driven> Ctx<L> {
    fn lock(&self) -> &L::Lock {
        self.driven.lock()
    }

    fn record(&self, task: u64, kind: EventKind) -> Res<u64> {
        self.log(task).record(kind).map_err(recording)
    }

    /// Records that `held`'s lease was lost, and why.
    fn record_lost(&self, task: u64, held: &Held, reason: slate_core::LossReason) -> Res<()> {
        self.record(
            task,
            EventKind::Lost {
                holder: held.holder.clone(),
                reason: reason.to_string(),
            },
        )
        .map(drop)
    }

    /// Task `task`'s log of the lock's calls (shared with `slate demo`'s worker).
    fn log(&self, task: u64) -> Log<'_> {
        Log::new(&self.rec, &self.args.lock, task)
    }

    fn next_attempt(&self) -> u64 {
        self.attempts.fetch_add(1, Ordering::Relaxed)
    }

    fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    /// Logs `renew_ok` if the guard's deadline moved since the last logged one.
    fn note_renewal(&self, task: u64, held: &mut Held, guard: &Guard<L>) -> Res<()> {
        self.log(task).note_renewal(held, guard).map_err(recording)
    }

    /// One resource operation: the fenced write (with `--fenced-key`), then GET and SET+1 of
    /// the counter (non-atomic on purpose); then `renew_ok` if the deadline moved, and the
    /// `res_op` events (`f_write`, `incr`). A failed increment is recorded (outcome
    /// `unknown:<error>`: the SET may have been applied) and returned as the error. Without a
    /// resource server, only the renewal is noted.
    async fn resource_op(&self, task: u64, held: &mut Held, guard: Option<&Guard<L>>) -> Res<()> {
        let fenced = match &self.fenced {
            Some(f) => Some(f.write(&held.holder, held.token).await),
            None => None,
        };
        let counted = match &self.resource {
            Some(conn) => Some(counter_incr(conn.clone(), &self.args.counter_key).await),
            None => None,
        };
        if let Some(g) = guard {
            self.note_renewal(task, held, g)?;
        }
        if let Some(f) = fenced {
            self.record(task, f)?;
        }
        let Some(counted) = counted else {
            return Ok(());
        };
        self.record(
            task,
            EventKind::ResOp {
                holder: held.holder.clone(),
                token: held.token,
                op: OP_INCR.to_owned(),
                outcome: incr_outcome(&counted),
                invoked: None,
            },
        )?;
        counted
    }

    /// The lock, bounded by the run's deadline, as `holder` if given: `acq_invoke`, then
    /// `acq_ok`, or `acq_fail` and another attempt after the spin wait while
    /// [`Driven::asks_again`] says so. Any other error is the inner `Err` (recorded).
    async fn acquire(
        &self,
        task: u64,
        holder: Option<HolderId>,
    ) -> Res<Result<(Guard<L>, Held), Error>> {
        let log = self.log(task);
        loop {
            let attempt = self.next_attempt();
            let call = async {
                let lock = async {
                    match holder {
                        Some(h) => self.lock().lock_as(h).await,
                        None => self.lock().lock().await,
                    }
                };
                tokio::time::timeout(self.remaining(), lock)
                    .await
                    .unwrap_or(Err(MAX_DURATION))
            };
            match log.acquire(attempt, call).await.map_err(recording)? {
                Ok(acquired) => return Ok(Ok(acquired)),
                Err(_) if self.remaining().is_zero() => {
                    return Err("max duration reached while waiting for the lock".to_owned());
                }
                Err(e) if self.driven.asks_again(&e, self.args.tolerate_errors) => {
                    self.failed.fetch_add(1, Ordering::Relaxed);
                    let pause = self.args.spin_wait.unwrap_or(Duration::from_millis(50));
                    tokio::time::sleep(pause.min(self.remaining())).await;
                }
                Err(e) => return Ok(Err(e)),
            }
        }
    }

    /// As [`acquire`](Self::acquire), an error ending the mode.
    async fn acquire_or_fail(&self, task: u64, holder: Option<HolderId>) -> Res<(Guard<L>, Held)> {
        self.acquire(task, holder)
            .await?
            .map_err(|e| format!("lock() failed: {e}"))
    }

    /// `rel_invoke`, `unlock()`, then `rel_ok` / `rel_fail{not_held}` / `rel_info` (with
    /// `--cancel-unlock`, the unlock is given up after its first poll: `rel_info`).
    async fn release(&self, task: u64, held: &mut Held, guard: Guard<L>) -> Res<Released> {
        let log = self.log(task);
        let released = if self.args.cancel_unlock {
            log.release_invoked(held).map_err(recording)?;
            let mut unlock = Box::pin(guard.unlock());
            match futures::poll!(unlock.as_mut()) {
                Poll::Pending => {
                    drop(unlock);
                    self.record(
                        task,
                        EventKind::RelInfo {
                            holder: held.holder.clone(),
                            reason: "cancelled: unlock dropped after its first poll".to_owned(),
                        },
                    )?;
                    return Ok(Released::Cancelled);
                }
                Poll::Ready(outcome) => log.release_answered(held, outcome),
            }
        } else {
            log.release(held, guard, self.remaining()).await
        };
        Ok(match released.map_err(recording)? {
            Logged::Done(n) => Released::Ok(n),
            Logged::NotHeld => Released::NotHeld,
            Logged::Failed(e) if e.is_release_incomplete() => Released::Incomplete(e.to_string()),
            Logged::Failed(e) => Released::Error(e.to_string()),
            Logged::TimedOut => Released::Error("max duration reached during unlock".to_owned()),
        })
    }

    /// Releases one level and checks that exactly one level went (`RELEASED n`).
    async fn release_level(&self, held: &mut Held, guard: Guard<L>) -> Res<()> {
        let expect = held.depth.saturating_sub(1);
        self.note_renewal(0, held, &guard)?;
        match self.release(0, held, guard).await? {
            Released::Ok(n) if n == expect => say(&format!("RELEASED {n}")),
            other => Err(format!("release to depth {expect} answered {other:?}")),
        }
    }

    /// Holds `guard` for `d`, a resource operation every tick; fails if the lease is lost.
    async fn hold_for(&self, held: &mut Held, guard: &Guard<L>, d: Duration) -> Res<()> {
        let end = (Instant::now() + d).min(self.deadline);
        while Instant::now() < end {
            if let Some(reason) = guard.lease().loss_reason() {
                self.record_lost(0, held, reason)?;
                return Err(format!("lease lost while holding: {reason}"));
            }
            self.resource_op(0, held, Some(guard)).await?;
            tokio::time::sleep(TICK.min(end.saturating_duration_since(Instant::now()))).await;
        }
        Ok(())
    }
}

/// Outcome of a logged release.
#[derive(Debug)]
pub(crate) enum Released {
    Ok(u32),
    NotHeld,
    /// `ReleaseIncomplete`: some node could not be reached (its entry expires with the lease).
    Incomplete(String),
    Error(String),
    /// `--cancel-unlock`: the caller stopped waiting; the release goes on in the background.
    Cancelled,
}

impl Released {
    /// The `UNLOCK` line's words.
    pub(crate) fn line(&self) -> String {
        match self {
            Released::Ok(n) => format!("ok {n}"),
            Released::NotHeld => "not_held".to_owned(),
            Released::Cancelled => "cancelled".to_owned(),
            Released::Incomplete(m) | Released::Error(m) => {
                format!("error {}", m.replace('\n', " "))
            }
        }
    }
}

/// Runs the mode of `args` on `driven`, then prints the `FENCED` and `STATS` lines.
pub(crate) async fn drive<L: Driven>(
    args: Args,
    deadline: Instant,
    rec: Recorder,
    driven: L,
) -> Res<()> {
    if args.mode == Mode::Contend && args.resource_url.is_none() {
        return Err("contend needs --resource-url".to_owned());
    }
    let resource = match &args.resource_url {
        Some(url) => Some(crate::connect(url).await?),
        None => None,
    };
    let fenced = match (&args.fenced_key, &resource) {
        (Some(key), Some(conn)) => Some(Fenced::new(conn.clone(), key, args.proc)),
        _ => None,
    };
    let ctx = Arc::new(Ctx {
        args,
        rec,
        driven,
        resource,
        fenced,
        deadline,
        attempts: AtomicU64::new(0),
        failed: AtomicU64::new(0),
        incomplete: AtomicU64::new(0),
    });
    say("READY")?;
    crate::wait_go(ctx.args.go_file.as_ref(), deadline).await?;
    let result = match ctx.args.mode {
        Mode::Contend => contend(&ctx).await,
        Mode::Hold => hold(&ctx).await,
        Mode::Reenter => reenter(&ctx).await,
        Mode::Wait => wait(&ctx).await,
    };
    if !ctx.args.linger.is_zero() {
        tokio::time::sleep(ctx.args.linger.min(ctx.remaining())).await;
    }
    if let Some(f) = &ctx.fenced {
        say(&f.line())?;
    }
    let s = ctx.driven.stats();
    crate::finish(s.renewals, s.subscriptions, s.local_waiters, &ctx.rec)?;
    result
}

/// `contend`: tasks × iterations of lock / GET+SET / unlock.
async fn contend<L: Driven>(ctx: &Arc<Ctx<L>>) -> Res<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..ctx.args.tasks {
        let ctx = Arc::clone(ctx);
        tasks.spawn(async move { contend_task(&ctx, task).await });
    }
    let (total, outcome) = crate::joined(tasks).await;
    say(&format!(
        "DONE acquisitions={total} failed_attempts={} incomplete_releases={}",
        ctx.failed.load(Ordering::Relaxed),
        ctx.incomplete.load(Ordering::Relaxed)
    ))?;
    outcome
}

async fn contend_task<L: Driven>(ctx: &Ctx<L>, task: u64) -> Res<u64> {
    let mut done = 0;
    while done < ctx.args.iterations && !crate::stop_requested(&ctx.args) {
        if Instant::now() >= ctx.deadline {
            return Err(format!("max duration reached after {done} iterations"));
        }
        if ctx.args.unsafe_skip_lock {
            unsafe_iteration(ctx, task, done).await?;
            done += 1;
            continue;
        }
        // A fresh holder per acquisition sends every lock and unlock to the server (no local
        // passes), which a cancelled unlock needs to have anything to cancel.
        let named = (ctx.args.named_holders || ctx.args.cancel_unlock).then(HolderId::new);
        let (guard, mut held) = ctx.acquire_or_fail(task, named).await?;
        let op = ctx.resource_op(task, &mut held, Some(&guard)).await;
        ctx.log(task).note_loss(&held, &guard).map_err(recording)?;
        let lost = guard.lease().is_lost();
        let released = ctx.release(task, &mut held, guard).await?;
        // The hold's deadline passed before the answer came: the entry may have expired.
        let expired = now_ns() >= held.deadline;
        op?;
        match released {
            Released::Ok(0) | Released::Cancelled => {}
            // The lease ended while held (a loss): the release finds nothing.
            Released::NotHeld if lost || expired || ctx.args.tolerate_errors => {}
            Released::Incomplete(_) => {
                ctx.incomplete.fetch_add(1, Ordering::Relaxed);
            }
            // A release that failed (a server going away) is finished by the lease.
            Released::Error(e) if ctx.args.tolerate_errors => {
                eprintln!(
                    "slate-worker {}: release failed (the lease ends it): {e}",
                    ctx.args.proc
                );
                ctx.incomplete.fetch_add(1, Ordering::Relaxed);
            }
            other => return Err(format!("unlock of a depth-1 guard answered {other:?}")),
        }
        done += 1;
    }
    Ok(done)
}

/// One iteration of the negative control: no lock at all, a made-up holder and token.
async fn unsafe_iteration<L: Driven>(ctx: &Ctx<L>, task: u64, i: u64) -> Res<()> {
    let attempt = ctx.next_attempt();
    ctx.record(
        task,
        EventKind::AcqInvoke {
            attempt,
            budget_ms: None,
        },
    )?;
    let mut conn = ctx
        .resource
        .clone()
        .ok_or("the negative control needs --resource-url")?;
    let token: u64 = conn
        .incr("unsafe-token", 1)
        .await
        .map_err(|e| format!("INCR unsafe-token: {e}"))?;
    let mut held = Held {
        holder: format!("unsafe:{}:{task}:{i}", ctx.args.proc),
        token,
        depth: 1,
        deadline: now_ns() + u64::try_from(ctx.args.lease.as_nanos()).unwrap_or(u64::MAX),
        nodes: Vec::new(),
        renewals: None,
    };
    ctx.record(
        task,
        EventKind::AcqOk {
            attempt,
            holder: held.holder.clone(),
            token,
            depth: 1,
            deadline: held.deadline,
            nodes: vec![],
            permits: None,
        },
    )?;
    ctx.resource_op(task, &mut held, None).await?;
    ctx.record(
        task,
        EventKind::RelInvoke {
            holder: held.holder.clone(),
            depth_before: 1,
        },
    )?;
    ctx.record(
        task,
        EventKind::RelOk {
            holder: held.holder.clone(),
            depth_after: 0,
        },
    )?;
    Ok(())
}

/// `hold`: acquire once (asking again only where [`Driven::asks_again`] says nothing is
/// held), hold with resource operations until done or lost, unlock.
async fn hold<L: Driven>(ctx: &Ctx<L>) -> Res<()> {
    let (guard, mut held) = match ctx.acquire(0, None).await? {
        Ok(acquired) => acquired,
        Err(e) => {
            return say(&format!(
                "ACQUIRE error {}",
                e.to_string().replace('\n', " ")
            ));
        }
    };
    say(&format!("HOLDING {} {}", held.holder, held.token))?;
    let end = (Instant::now() + ctx.args.hold).min(ctx.deadline);
    let burners = Burners::start(ctx.args.burn_threads, end);
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let lost = loop {
        tokio::select! {
            biased;
            reason = guard.lost() => break Some(reason),
            () = tokio::time::sleep_until(end.into()) => break None,
            _ = tick.tick() => {
                if may_operate(guard.lease()) {
                    // A failed increment is a recorded outcome here, not a worker failure.
                    let _ = ctx.resource_op(0, &mut held, Some(&guard)).await;
                }
                // Else lost (lost() completes at once), or too close to the deadline.
            }
        }
    };
    if let Some(reason) = lost {
        ctx.record_lost(0, &held, reason)?;
        say(&format!("LOST {}", reason_code(reason)))?;
        if ctx.args.late_write
            && let Some(f) = &ctx.fenced
        {
            let event = f.write(&held.holder, held.token).await;
            say(&format!("LATE {}", late_word(&event)))?;
            ctx.record(0, event)?;
        }
    }
    drop(burners);
    if ctx.args.unlock_file.is_some() {
        wait_file("UNLOCK_WAIT", ctx.args.unlock_file.as_ref(), ctx.deadline).await?;
        link_ok(ctx).await?;
    }
    let released = ctx.release(0, &mut held, guard).await?;
    say(&format!("UNLOCK {}", released.line()))
}

/// After a healed link: PINGs the lock's server until it answers (TCP retransmission backoff
/// may keep a healed link silent a while), bounded by the run's deadline; `LINK_OK pings=N`.
async fn link_ok<L: Driven>(ctx: &Ctx<L>) -> Res<()> {
    if ctx.driven.ping().is_none() {
        return Ok(());
    }
    let mut pings = 0u32;
    while let Some(ping) = ctx.driven.ping() {
        pings += 1;
        if let Ok(Ok(())) = tokio::time::timeout(ctx.remaining(), ping).await {
            break;
        }
        if ctx.remaining().is_zero() {
            return Err("the lock server never answered PING after the unlock file".into());
        }
        tokio::time::sleep(Duration::from_millis(20).min(ctx.remaining())).await;
    }
    say(&format!("LINK_OK pings={pings}"))
}

/// `reenter`: depth 3 and back, with renewal running and resource operations at each level,
/// then (where the lock can send one) one release too many.
async fn reenter<L: Driven>(ctx: &Ctx<L>) -> Res<()> {
    let (g1, mut held) = ctx.acquire_or_fail(0, None).await?;
    say(&format!("HOLDING {} {}", held.holder, held.token))?;
    say("DEPTH 1")?;
    let holder = g1.holder();
    wait_file("REENTER_WAIT", ctx.args.reenter_file.as_ref(), ctx.deadline).await?;
    let (g2, h2) = {
        let attempt = ctx.next_attempt();
        let call = async {
            tokio::time::timeout(ctx.remaining(), ctx.driven.reenter(&g1))
                .await
                .unwrap_or(Err(MAX_DURATION))
        };
        match ctx.log(0).acquire(attempt, call).await.map_err(recording)? {
            Ok(acquired) => acquired,
            Err(e) if ctx.args.reenter_file.is_some() && e.is_lease_lost() => {
                say("REENTER lease_lost")?;
                let released = ctx.release(0, &mut held, g1).await?;
                return say(&format!("RELEASED {}", released.line()));
            }
            Err(e) => return Err(format!("re-entry to depth 2 failed: {e}")),
        }
    };
    say("DEPTH 2")?;
    let (g3, h3) = ctx.acquire_or_fail(0, Some(holder)).await?;
    say("DEPTH 3")?;
    for (d, h) in [(2, &h2), (3, &h3)] {
        if h.depth != d || h.token != held.token || h.holder != held.holder {
            return Err(format!(
                "re-entry {d}: depth {} token {} holder {} (first level: token {} holder {})",
                h.depth, h.token, h.holder, held.token, held.holder
            ));
        }
    }
    held.depth = 3;
    held.deadline = held.deadline.max(h2.deadline).max(h3.deadline);
    let count = ctx
        .lock()
        .hold_count(holder)
        .await
        .map_err(|e| format!("hold_count: {e}"))?;
    say(&format!("HOLD_COUNT {count}"))?;
    if count != 3 {
        return Err(format!("hold_count is {count} at depth 3"));
    }
    ctx.hold_for(&mut held, &g3, ctx.args.hold).await?;
    for inner in [g3, g2] {
        ctx.release_level(&mut held, inner).await?;
        ctx.hold_for(&mut held, &g1, ctx.args.step).await?;
    }
    ctx.release_level(&mut held, g1).await?;
    extra_release(ctx, &held).await
}

/// One release too many, where the lock can send it: it must answer not held (`EXTRA`).
async fn extra_release<L: Driven>(ctx: &Ctx<L>, held: &Held) -> Res<()> {
    let Some(release) = ctx.driven.release_past_zero(&held.holder, ctx.args.lease) else {
        return Ok(());
    };
    ctx.record(
        0,
        EventKind::RelInvoke {
            holder: held.holder.clone(),
            depth_before: 0,
        },
    )?;
    let reply = release.await?;
    if reply == -1 {
        ctx.record(
            0,
            EventKind::RelFail {
                holder: held.holder.clone(),
                reason: "not held (release past depth 0)".to_owned(),
                not_held: true,
            },
        )?;
        say("EXTRA not_held")
    } else {
        ctx.record(
            0,
            EventKind::RelOk {
                holder: held.holder.clone(),
                depth_after: u32::try_from(reply).unwrap_or(u32::MAX),
            },
        )?;
        say(&format!("EXTRA unexpected {reply}"))?;
        Err(format!("a release past depth 0 answered {reply}, not -1"))
    }
}

/// `wait`: many waiters, one bounded acquire each.
async fn wait<L: Driven>(ctx: &Arc<Ctx<L>>) -> Res<()> {
    let invoked = Arc::new(AtomicUsize::new(0));
    let all_invoked = Arc::new(tokio::sync::Notify::new());
    let n = usize::try_from(ctx.args.tasks).map_err(|e| e.to_string())?;
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..ctx.args.tasks {
        let (ctx, invoked, all_invoked) = (
            Arc::clone(ctx),
            Arc::clone(&invoked),
            Arc::clone(&all_invoked),
        );
        tasks.spawn(async move {
            let attempt = ctx.next_attempt();
            let budget = u64::try_from(ctx.args.budget.as_millis()).unwrap_or(u64::MAX);
            ctx.record(
                task,
                EventKind::AcqInvoke {
                    attempt,
                    budget_ms: Some(budget),
                },
            )?;
            if invoked.fetch_add(1, Ordering::SeqCst) + 1 == n {
                all_invoked.notify_one();
            }
            wait_task(&ctx, task, attempt, budget).await
        });
    }
    let announce = async {
        all_invoked.notified().await;
        say(&format!("INVOKED {n}"))
    };
    tokio::select! {
        r = announce => r?,
        () = tokio::time::sleep(ctx.remaining()) => {},
    }
    let (mut acquired, mut failed, mut errors) = (0u64, 0u64, 0u64);
    let mut problems = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(WaitOutcome::Acquired)) => acquired += 1,
            Ok(Ok(WaitOutcome::Failed)) => failed += 1,
            Ok(Ok(WaitOutcome::Error)) => errors += 1,
            Ok(Err(e)) => problems.push(e),
            Err(e) => problems.push(format!("task panicked: {e}")),
        }
    }
    say(&format!(
        "DONE acquired={acquired} failed={failed} errors={errors}"
    ))?;
    match problems.first() {
        None => Ok(()),
        Some(first) => Err(format!(
            "{} waiter(s) failed; first: {first}",
            problems.len()
        )),
    }
}

enum WaitOutcome {
    Acquired,
    Failed,
    Error,
}

async fn wait_task<L: Driven>(
    ctx: &Ctx<L>,
    task: u64,
    attempt: u64,
    budget: u64,
) -> Res<WaitOutcome> {
    // An explicit holder scope, so that a failed attempt can name the holder it tried as (a
    // late grant after a timeout would leave that field behind as a ghost).
    let holder = HolderId::new();
    let call = async {
        if budget == 0 {
            ctx.lock().try_lock().await.map(|g| g.ok_or(()))
        } else {
            ctx.lock()
                .try_lock_for(Duration::from_millis(budget))
                .await
                .map(Ok)
        }
    };
    let call: Pin<Box<dyn Future<Output = _> + Send + '_>> = if ctx.args.implicit_holders {
        Box::pin(call)
    } else {
        Box::pin(holder.scope(call))
    };
    let as_holder = if ctx.args.implicit_holders {
        String::new()
    } else {
        format!(" (as holder {holder})")
    };
    let (failure, outcome) = match tokio::time::timeout(ctx.remaining(), call).await {
        Ok(Ok(Ok(guard))) => return waited(ctx, task, attempt, guard).await,
        Ok(Ok(Err(()))) => (format!("busy{as_holder}"), WaitOutcome::Failed),
        Ok(Err(e)) if e.is_timeout() || e.is_busy() => {
            (format!("{e}{as_holder}"), WaitOutcome::Failed)
        }
        Ok(Err(e)) => (format!("{e}{as_holder}"), WaitOutcome::Error),
        Err(_) => {
            ctx.record(
                task,
                EventKind::AcqInfo {
                    attempt,
                    reason: "cancelled: worker max duration".to_owned(),
                },
            )?;
            return Err("max duration reached while waiting".to_owned());
        }
    };
    let event = match outcome {
        WaitOutcome::Failed => EventKind::AcqFail {
            attempt,
            reason: failure,
        },
        _ => EventKind::AcqInfo {
            attempt,
            reason: failure,
        },
    };
    ctx.record(task, event)?;
    Ok(outcome)
}

/// A waiter that got the lock: one resource operation, hold until `--hold-ms` is up or the
/// lease is lost, release.
async fn waited<L: Driven>(
    ctx: &Ctx<L>,
    task: u64,
    attempt: u64,
    guard: Guard<L>,
) -> Res<WaitOutcome> {
    let mut held = ctx.log(task).acquired(attempt, &guard).map_err(recording)?;
    ctx.resource_op(task, &mut held, Some(&guard)).await?;
    let lost = if ctx.args.hold.is_zero() {
        guard.lease().loss_reason()
    } else {
        tokio::select! {
            reason = guard.lost() => Some(reason),
            () = tokio::time::sleep(ctx.args.hold) => None,
        }
    };
    if let Some(reason) = lost {
        ctx.record_lost(task, &held, reason)?;
    }
    match ctx.release(task, &mut held, guard).await? {
        Released::Ok(0) => Ok(WaitOutcome::Acquired),
        // After a loss the entry may be gone or the link down: the release cannot succeed.
        Released::NotHeld | Released::Error(_) if lost.is_some() => Ok(WaitOutcome::Acquired),
        other => Err(format!("unlock of a depth-1 guard answered {other:?}")),
    }
}
