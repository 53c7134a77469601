//! The ZooKeeper side of the lock, driven by the synchronizer: the contender znodes, the
//! places in line, the watches, and the holds' levels.

use super::*;

/// What a granted attempt carries to the guard.
#[derive(Debug)]
pub(crate) struct Grant {
    pub(super) path: String,
    pub(super) session: i64,
    pub(super) token: FencingToken,
    /// The time the leader surely renewed the session no earlier than, at the grant (the
    /// lease counts from it: see `client::Confirmed`).
    pub(super) touched: Instant,
    pub(super) timeout: Duration,
    /// A fresh hold (its own znode), not a re-entry.
    pub(super) fresh: bool,
}

/// This process's place in the lock's queue: the contender znode its head task waits with.
#[derive(Debug)]
pub(super) struct Place {
    pub(super) name: String,
    pub(super) session: i64,
    pub(super) czxid: i64,
    pub(super) holder: HolderId,
}

#[derive(Debug, Default)]
pub(super) struct Places {
    pub(super) place: Option<Place>,
    /// A create whose answer was lost: the attempt id in its name and its session. The next
    /// attempt (or the drain) finds it by that id, so it never outlives its use in a live
    /// session.
    pub(super) pending: Option<(u64, i64)>,
    /// Since when the first place in line has waited for the session's renewal to be proven,
    /// and whether that wait was reported (once per wait, after a whole session).
    pub(super) gated: Option<(Instant, bool)>,
}

/// What releasing one level does (see [`ZkCompetitor::take_level`]).
pub(crate) struct Level {
    /// The znode to delete (and its session) when this was the holder's last level.
    pub(crate) delete: Option<(String, i64)>,
    /// Whether the releasing guard's own hold was still the holder's live hold.
    pub(crate) held: bool,
}

/// One holder's hold in this process.
pub(super) struct LocalHold {
    pub(super) path: String,
    pub(super) session: i64,
    pub(super) token: FencingToken,
    pub(super) depth: u32,
    pub(super) keeper: Arc<LeaseKeeper>,
    pub(super) watch: LeaseWatch,
}

pub(crate) struct ZkCompetitor {
    /// What attempts and drains (futures that outlive the call) share.
    pub(crate) ctx: Arc<Ctx>,
    pub(crate) name: LockName,
    pub(super) holds: Mutex<HashMap<HolderId, LocalHold>>,
}

/// The data of a contender znode: who it is for, for `status` and operators (`zkCli get`).
pub(crate) fn record(holder: HolderId, timeout: Duration) -> Vec<u8> {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let host = HOST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "?".into())
    });
    format!(
        "holder={holder}\npid={}\nhost={host}\nsession_timeout_ms={}\n",
        std::process::id(),
        timeout.as_millis()
    )
    .into_bytes()
}

/// Reads one field of a contender record.
pub(crate) fn field<'a>(data: &'a str, key: &str) -> Option<&'a str> {
    data.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

/// The contenders of a directory listing, lowest sequence first.
pub(super) fn contenders(children: &[String]) -> Vec<(i64, &str)> {
    let mut c: Vec<(i64, &str)> = children
        .iter()
        .filter_map(|n| parse_contender(n).map(|(seq, _)| (seq, n.as_str())))
        .collect();
    c.sort_unstable();
    c
}

/// The part of a lock's competitor that its remote calls use.
pub(crate) struct Ctx {
    pub(crate) client: ZkClient,
    pub(crate) dir: String,
    pub(crate) label: Arc<str>,
    /// Where its acquisitions, holds and losses are counted.
    pub(crate) meter: Meter,
    pub(super) me: Weak<LockShared>,
    pub(super) places: tokio::sync::Mutex<Places>,
    /// The predecessor this process's place watches (one watch at a time).
    pub(super) watched: Mutex<Option<String>>,
    /// The lock's directory is known to exist (no create of it before each contender).
    pub(super) dir_ready: AtomicBool,
}

impl ZkCompetitor {
    /// The lease watch of `holder`'s hold at `path`, for a new guard; `None` when the holder's
    /// hold is another znode by now (the guard's own hold ended).
    pub(crate) fn watch(&self, holder: HolderId, path: &str) -> Option<LeaseWatch> {
        lock(&self.holds)
            .get(&holder)
            .filter(|h| h.path == path)
            .map(|h| h.watch.clone())
    }

    /// Takes one level of `holder`'s hold, for a guard of the hold at `path`.
    ///
    /// The local depth counts every level the synchronizer counts, including those of guards
    /// whose own hold ended and was replaced by a newer one of the same holder. The last level
    /// returns the znode to delete, whichever guard releases it.
    pub(crate) fn take_level(&self, holder: HolderId, path: &str) -> Result<Level> {
        let mut holds = lock(&self.holds);
        let Some(h) = holds.get_mut(&holder) else {
            return Err(Error::not_held(Arc::clone(&self.ctx.label), holder));
        };
        let held = h.path == path && !h.keeper.is_lost();
        if h.depth > 1 {
            h.depth -= 1;
            return Ok(Level { delete: None, held });
        }
        let Some(h) = holds.remove(&holder) else {
            return Err(Error::not_held(Arc::clone(&self.ctx.label), holder));
        };
        self.ctx.client.drop_lease(&h.path);
        Ok(Level {
            held: h.path == path,
            delete: Some((h.path, h.session)),
        })
    }

    /// The local depth of `holder`'s hold (0 if none).
    pub(crate) fn local_depth(&self, holder: HolderId) -> u32 {
        lock(&self.holds).get(&holder).map_or(0, |h| h.depth)
    }
}

impl Ctx {
    /// Makes sure the lock's directory (and the root above it) exists.
    async fn ensure_dir(&self, s: &Session) -> Result<()> {
        let acls = self.client.acls();
        let container = zk::CreateMode::Container.with_acls(acls);
        for _ in 0..3 {
            match self
                .client
                .op(s, "create", s.zk.create(&self.dir, &[], &container))
                .await?
            {
                Ok(_) | Err(zk::Error::NodeExists) => return Ok(()),
                Err(zk::Error::NoNode) => {
                    let root = &self.dir[..self.dir.rfind('/').unwrap_or(0)];
                    let persistent = zk::CreateMode::Persistent.with_acls(acls);
                    match self
                        .client
                        .op(s, "mkdir", s.zk.mkdir(root, &persistent))
                        .await?
                    {
                        Ok(()) => {}
                        Err(e) => return Err(self.client.error(e, "creating the lock root")),
                    }
                }
                Err(e) => return Err(self.client.error(e, "creating the lock directory")),
            }
        }
        Err(Error::backend(
            slate_core::BackendKind::Other,
            Some(self.client.servers().to_owned()),
            format!(
                "the lock directory {} kept disappearing while it was created",
                self.dir
            ),
            None,
        ))
    }

    /// Finds the contender a lost create made (by its attempt id). The pending create is
    /// forgotten only once it is found or known to be absent: an error on the way leaves it
    /// for the next attempt, which looks again, so a contender of our session is never left
    /// in the queue unrecorded. The listing follows a `sync` of the
    /// lock directory: the server we ask has then applied everything the leader ordered
    /// before, a create that was still in flight when the connection broke included.
    async fn find_pending(&self, s: &Session, places: &mut Places) -> Result<()> {
        let Some((id, session)) = places.pending else {
            return Ok(());
        };
        if session != s.id {
            places.pending = None;
            return Ok(());
        }
        match self.client.read(s, "sync", || s.zk.sync(&self.dir)).await? {
            Ok(()) | Err(zk::Error::NoNode) => {}
            Err(e) => return Err(self.client.error(e, "syncing the lock directory")),
        }
        let children = match self
            .client
            .read(s, "list", || s.zk.list_children(&self.dir))
            .await?
        {
            Ok(c) => c,
            Err(zk::Error::NoNode) => Vec::new(),
            Err(e) => return Err(self.client.error(e, "listing contenders")),
        };
        let prefix = contender_prefix(id);
        let Some(name) = children.iter().find(|c| c.starts_with(&prefix)) else {
            // Absent after the sync: the create never happened.
            places.pending = None;
            return Ok(());
        };
        let path = format!("{}/{name}", self.dir);
        match self
            .client
            .read(s, "stat", || s.zk.check_stat(&path))
            .await?
        {
            Ok(Some(stat)) => {
                let data = match self.client.read(s, "get", || s.zk.get_data(&path)).await? {
                    Ok((d, _)) => d,
                    Err(_) => Vec::new(),
                };
                let holder = field(&String::from_utf8_lossy(&data), "holder")
                    .and_then(|h| h.parse().ok())
                    .unwrap_or_default();
                places.place = Some(Place {
                    name: name.clone(),
                    session,
                    czxid: stat.czxid,
                    holder,
                });
                places.pending = None;
            }
            Ok(None) => places.pending = None,
            Err(e) => return Err(self.client.error(e, "reading a contender")),
        }
        Ok(())
    }

    /// One attempt: make sure this process has a place, then grant it if it is the lowest,
    /// else watch its predecessor.
    async fn attempt(self: Arc<Self>, holder: HolderId) -> Result<Attempt<Grant>> {
        let mut places = self.places.lock().await;
        let s = self.client.session().await?;
        if places.place.as_ref().is_some_and(|p| p.session != s.id) {
            places.place = None;
        }
        if places.place.is_none() {
            self.find_pending(&s, &mut places).await?;
        }
        for _ in 0..64 {
            // The listing that decides. A new contender's create and this listing go out
            // back to back (the client sends requests in call order and the server answers a
            // session's requests in order, so the listing sees the contender): one round trip
            // for an uncontended acquisition.
            let mut pipelined = None;
            if places.place.is_none() {
                if !self.dir_ready.load(Ordering::Relaxed) {
                    self.ensure_dir(&s).await?;
                    self.dir_ready.store(true, Ordering::Relaxed);
                }
                let id = u64::from_ne_bytes(random8());
                let prefix = format!("{}/{}", self.dir, contender_prefix(id));
                let data = record(holder, s.timeout);
                let mode = zk::CreateMode::EphemeralSequential.with_acls(self.client.acls());
                places.pending = Some((id, s.id));
                let create = s.zk.create(&prefix, &data, &mode);
                let list = s.zk.list_children(&self.dir);
                match self.client.op(&s, "create", create).await? {
                    Ok((stat, seq)) => {
                        places.pending = None;
                        places.place = Some(Place {
                            name: format!("{}{seq}", contender_prefix(id)),
                            session: s.id,
                            czxid: stat.czxid,
                            holder,
                        });
                        pipelined = Some(list);
                    }
                    // The directory was removed (an empty container) since it was made.
                    Err(zk::Error::NoNode) => {
                        places.pending = None;
                        self.dir_ready.store(false, Ordering::Relaxed);
                        continue;
                    }
                    Err(e) => return Err(self.client.error(e, "creating a contender")),
                }
            }
            let answer = match pipelined {
                Some(list) => match self.client.op(&s, "list", list).await? {
                    Err(e) if lost_connection(&e) => None,
                    answer => Some(answer),
                },
                None => None,
            };
            let answer = match answer {
                Some(a) => a,
                None => {
                    self.client
                        .read(&s, "list", || s.zk.list_children(&self.dir))
                        .await?
                }
            };
            let children = match answer {
                Ok(c) => c,
                Err(zk::Error::NoNode) => Vec::new(),
                Err(e) => return Err(self.client.error(e, "listing contenders")),
            };
            let queue = contenders(&children);
            let place = places.place.as_ref().expect("a place was made above");
            let Some(at) = queue.iter().position(|(_, name)| *name == place.name) else {
                // Our place is gone (force-unlocked, or the session ended): take a new one.
                tracing::debug!(lock = %self.label, "the place in the queue is gone; taking a new one");
                places.place = None;
                continue;
            };
            if at == 0 {
                // The lease counts from the session's last proven renewal (`Confirmed`): after
                // an outage the proof may lag, and a grant now would carry a lease about to
                // end. Keep the place (the lock is ours in ZooKeeper) and come back once the
                // heartbeat has proven more.
                let period = heartbeat_period(s.timeout);
                let now = Instant::now();
                let proven = lease_deadline(s.touched(), s.timeout);
                if proven < now + period {
                    tracing::debug!(lock = %self.label, %holder, "first in line; waiting for the session's renewal to be proven");
                    // A proof that lags for a whole session will not catch up soon: the
                    // ensemble answers `sync` too slowly for this session timeout. Said once
                    // per wait, since nothing else shows why the lock is not granted.
                    let (since, told) = places.gated.get_or_insert((now, false));
                    if !*told && now.duration_since(*since) >= s.timeout {
                        *told = true;
                        tracing::warn!(
                            lock = %self.label,
                            waited = ?now.duration_since(*since),
                            proven_for = ?proven.saturating_duration_since(now),
                            session = ?s.timeout,
                            "first in line, but the session's renewal is proven too late to \
                             grant a lease: the ensemble answers sync slowly for this session \
                             timeout (a loaded or paused server); the lock is granted once the \
                             proof catches up, or use a longer session timeout"
                        );
                    }
                    return Ok(Attempt::Busy {
                        retry_after: Some(period),
                    });
                }
                places.gated = None;
                let place = places.place.take().expect("checked above");
                let path = format!("{}/{}", self.dir, place.name);
                if place.holder != holder {
                    // The place was made for a waiter that left; name the real holder.
                    let data = record(holder, s.timeout);
                    let _ = self
                        .client
                        .op(&s, "set", s.zk.set_data(&path, &data, None))
                        .await;
                }
                *lock(&self.watched) = None;
                tracing::debug!(lock = %self.label, %holder, znode = %path, token = place.czxid, "acquired");
                return Ok(Attempt::Acquired(Grant {
                    path,
                    session: s.id,
                    token: FencingToken::new(u64::try_from(place.czxid).unwrap_or(0)),
                    touched: s.touched(),
                    timeout: s.timeout,
                    fresh: true,
                }));
            }
            places.gated = None;
            let watched = if mutant::active(Mutant::ZkWrongPredecessor) {
                at
            } else {
                at - 1
            };
            let predecessor = format!("{}/{}", self.dir, queue[watched].1);
            if lock(&self.watched).as_deref() == Some(predecessor.as_str()) {
                return Ok(Attempt::Busy { retry_after: None });
            }
            match self
                .client
                .read(&s, "watch", || s.zk.check_and_watch_stat(&predecessor))
                .await?
            {
                Ok((Some(_), watcher)) => {
                    *lock(&self.watched) = Some(predecessor.clone());
                    // Weak: a pending watch must not keep the client (its session) alive.
                    let (me, ctx) = (self.me.clone(), Arc::downgrade(&self));
                    drop(self.client.runtime().spawn(async move {
                        let event = watcher.changed().await;
                        tracing::trace!(?event.event_type, "predecessor watch fired");
                        if let Some(ctx) = ctx.upgrade() {
                            let mut w = lock(&ctx.watched);
                            if w.as_deref() == Some(predecessor.as_str()) {
                                *w = None;
                            }
                        }
                        if let Some(shared) = me.upgrade() {
                            shared.sync.notify_released();
                        }
                    }));
                    tracing::trace!(lock = %self.label, %holder, "busy; watching the predecessor");
                    return Ok(Attempt::Busy { retry_after: None });
                }
                // The predecessor left between the listing and the watch: list again.
                Ok((None, _)) => {}
                Err(e) => return Err(self.client.error(e, "watching the predecessor")),
            }
        }
        Ok(Attempt::Busy { retry_after: None })
    }

    /// Gives up this process's place when no task of it waits any more. A contender whose
    /// create lost its answer is looked for again (backing off) until it is found or known
    /// absent, a waiter arrives, or the client is gone.
    async fn drain(self: Arc<Self>) {
        let mut pause = Duration::from_millis(100);
        let mut places = loop {
            let mut places = self.places.lock().await;
            // (A lock dropped meanwhile has nobody waiting: its place goes too.)
            if self.me.upgrade().is_some_and(|s| s.sync.waiters() > 0) {
                return;
            }
            let s = self.client.current();
            if s.zk.state().is_terminated() {
                // Its contenders went with it.
                places.place = None;
                places.pending = None;
                return;
            }
            match self.find_pending(&s, &mut places).await {
                Ok(()) => break places,
                Err(e) => {
                    tracing::debug!(lock = %self.label, error = %e, "looking for a lost contender failed; again");
                    drop(places);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                }
            }
        };
        if let Some(place) = places.place.take() {
            *lock(&self.watched) = None;
            let path = format!("{}/{}", self.dir, place.name);
            tracing::debug!(lock = %self.label, znode = %path, "nobody waits; leaving the queue");
            let _ = delete_until_gone(self.client.clone(), path, place.session).await;
        }
    }
}

pub(super) fn random8() -> [u8; 8] {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        b = (t.as_nanos() as u64 ^ u64::from(std::process::id())).to_ne_bytes();
    }
    b
}

/// Deletes a contender znode of `session`. A znode left behind in a live session would block
/// the lock for every other process, so a failed delete is retried in the background, backing
/// off to one attempt a second, until the znode is gone, its session is (an unreachable
/// ensemble expires it, which deletes the znode), or the client is dropped (which closes the
/// session). The retry holds no reference to the client, so it never keeps a session alive.
pub(crate) async fn delete_until_gone(
    client: ZkClient,
    path: String,
    session: i64,
) -> Result<bool> {
    match delete_once(&client, &path, session).await {
        Ok(found) => Ok(found),
        Err(e) => {
            tracing::warn!(znode = %path, error = %e, "delete failed; retrying in the background");
            let weak = Arc::downgrade(&client.inner);
            drop(client.runtime().spawn(async move {
                let mut pause = Duration::from_millis(100);
                for tries in 1u32.. {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                    let Some(inner) = weak.upgrade() else { return };
                    match delete_once(&ZkClient { inner }, &path, session).await {
                        Ok(_) => return,
                        Err(e) if tries % 30 == 0 => tracing::error!(znode = %path, error = %e,
                            tries, "still cannot delete the znode; it blocks the lock until it goes"),
                        Err(_) => {}
                    }
                }
            }));
            Err(e)
        }
    }
}

/// One delete: `Ok(true)` deleted, `Ok(false)` already gone (or its session ended).
pub(super) async fn delete_once(client: &ZkClient, path: &str, session: i64) -> Result<bool> {
    let s = client.current();
    if s.id != session {
        return Ok(false);
    }
    match client.op(&s, "delete", s.zk.delete(path, None)).await? {
        Ok(()) => Ok(true),
        Err(zk::Error::NoNode | zk::Error::SessionExpired) => Ok(false),
        Err(e) => Err(client.error(e, "deleting a contender")),
    }
}

impl Competitor for ZkCompetitor {
    type Grant = Grant;

    fn grant_deadline(&self, grant: &Grant) -> Option<Instant> {
        Some(lease_deadline(grant.touched, grant.timeout))
    }

    fn attempt(
        &self,
        holder: HolderId,
    ) -> impl Future<Output = Result<Attempt<Grant>>> + Send + 'static {
        let ctx = Arc::clone(&self.ctx);
        self.ctx.client.on_runtime(ctx.attempt(holder))
    }

    fn reenter(
        &self,
        holder: HolderId,
    ) -> impl Future<Output = Result<Attempt<Grant>>> + Send + 'static {
        let hold = lock(&self.holds)
            .get(&holder)
            .map(|h| (h.path.clone(), h.session, h.token, Arc::clone(&h.keeper)));
        let (client, label) = (self.ctx.client.clone(), Arc::clone(&self.ctx.label));
        self.ctx.client.on_runtime(async move {
            let lost = |reason| Err(Error::lease_lost(Arc::clone(&label), holder, reason));
            let Some((path, session, token, keeper)) = hold else {
                return lost(LossReason::EntryGone);
            };
            if keeper.is_lost() || Instant::now() >= keeper.deadline() {
                keeper.lose(LossReason::DeadlineExpired);
                return lost(LossReason::DeadlineExpired);
            }
            let s = client.session().await?;
            let owned = s.id == session
                && match client.read(&s, "stat", || s.zk.check_stat(&path)).await? {
                    Ok(stat) => stat.is_some_and(|st| st.ephemeral_owner == session),
                    Err(zk::Error::SessionExpired) => false,
                    Err(e) => return Err(client.error(e, "checking the hold")),
                };
            if !owned {
                keeper.lose(LossReason::EntryGone);
                return lost(LossReason::EntryGone);
            }
            if Instant::now() >= keeper.deadline() {
                // Confirmed too late: the lease had already run out (loss is final).
                keeper.lose(LossReason::DeadlineExpired);
                return lost(LossReason::DeadlineExpired);
            }
            // The check proves the znode is ours but, read from a follower, not that the
            // leader has not expired the session: only the heartbeat, after a `sync` through
            // the leader, moves the deadline (issue 35, defect 5; review finding).
            Ok(Attempt::Acquired(Grant {
                path,
                session,
                token,
                touched: s.touched(),
                timeout: s.timeout,
                fresh: false,
            }))
        })
    }

    fn after_acquire(&self, holder: HolderId, grant: &Grant) {
        let mut holds = lock(&self.holds);
        if !grant.fresh {
            // A re-entry counts as a level whatever it found (the synchronizer counts it); a
            // guard whose re-entry raced the hold's end is built lost (`ZkLock::guard`).
            if let Some(h) = holds.get_mut(&holder) {
                h.depth += 1;
            }
            return;
        }
        let (keeper, watch) = lease::channel(lease_deadline(grant.touched, grant.timeout));
        let keeper = Arc::new(keeper.with_meter(self.ctx.meter.clone()));
        let current = self.ctx.client.current();
        if current.id != grant.session || current.zk.state().is_terminated() {
            // The session ended between the grant and here.
            keeper.lose(LossReason::EntryGone);
        } else {
            self.ctx
                .client
                .keep_lease(grant.path.clone(), grant.session, Arc::clone(&keeper));
        }
        // A fresh grant to a holder that already holds here: its older znode is gone (the new
        // one is the lowest contender), so that hold is lost; its levels carry over.
        let depth = match holds.remove(&holder) {
            Some(old) => {
                tracing::warn!(lock = %self.ctx.label, %holder, old = %old.path, new = %grant.path,
                    "a fresh grant replaced the holder's lost hold");
                old.keeper.lose(LossReason::EntryGone);
                self.ctx.client.drop_lease(&old.path);
                old.depth + 1
            }
            None => 1,
        };
        holds.insert(
            holder,
            LocalHold {
                path: grant.path.clone(),
                session: grant.session,
                token: grant.token,
                depth,
                keeper,
                watch,
            },
        );
    }

    fn after_release(&self, holder: HolderId) {
        // Only a displaced holder is still here (its hold had already ended remotely).
        if let Some(h) = lock(&self.holds).remove(&holder) {
            h.keeper.lose(LossReason::EntryGone);
            self.ctx.client.drop_lease(&h.path);
        }
    }

    fn abandon(&self, holder: HolderId, grant: Grant) {
        if !grant.fresh {
            return;
        }
        tracing::debug!(lock = %self.ctx.label, %holder, znode = %grant.path, "giving back an abandoned grant");
        let (client, me) = (self.ctx.client.clone(), self.ctx.me.clone());
        drop(self.ctx.client.runtime().spawn(async move {
            let _ = delete_until_gone(client, grant.path, grant.session).await;
            if let Some(shared) = me.upgrade() {
                shared.sync.notify_released();
            }
        }));
    }

    fn prepare_wait(&self) -> impl Future<Output = Notifications> + Send {
        let live = lock(&self.ctx.watched).is_some();
        std::future::ready(if live {
            Notifications::Live
        } else {
            Notifications::Off
        })
    }

    fn queue_drained(&self) {
        drop(
            self.ctx
                .client
                .runtime()
                .spawn(Arc::clone(&self.ctx).drain()),
        );
    }
}
