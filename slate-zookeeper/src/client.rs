//! [`ZkClient`]: one ZooKeeper session shared by every lock of a process, and the lease
//! keeping that turns the session into each hold's lease.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use slate_core::{BackendKind, Error, LeaseKeeper, LossReason, Result};
use tokio::runtime::Handle;
use zookeeper_client as zk;

use crate::error::{from_zk, lost_connection, op_timeout};
use slate_core::metrics::ClientMeter;
use slate_core::registry::Registry;

/// The session timeout asked for when the builder names none.
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest session timeout the protocol carries (`i32::MAX` milliseconds, 24.8 days).
pub const MAX_SESSION_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// The lease deadline of a hold whose session the leader surely renewed no earlier than
/// `touched` (see [`Confirmed`]): the leader cannot expire the session before
/// `touched + timeout`, less the clock-rate allowance the Redis locks use too (1 % of the
/// timeout + 2 ms).
pub(crate) fn lease_deadline(touched: Instant, timeout: Duration) -> Instant {
    touched + timeout - (timeout / 100 + Duration::from_millis(2)).min(timeout / 2)
}

/// The heartbeat's period: an eighth of the session timeout (see [`Confirmed`] for why the
/// deadline then stays about half a session ahead).
pub(crate) fn heartbeat_period(timeout: Duration) -> Duration {
    timeout / 8
}

/// What the heartbeat has proven about when the leader last renewed the session.
///
/// Only the leader expires sessions, and it renews the session of a client connected to a
/// follower only when that follower answers one of the leader's pings (every half tick) with
/// the sessions it saw since the last one. An answered request proves no renewal: a follower
/// cut off from its leader right after answering never passes it on, and keeps answering its
/// client's reads until it gives up (`syncLimit` ticks), while the leader expires the session
/// one timeout after the last renewal it did get (the Z10 scenario had a
/// second holder 100 ms before the first one's deadline when the deadline counted from the
/// last answered `sync`).
///
/// The proof uses `sync`, which the follower forwards to the leader on its one connection to
/// it and answers when the leader's answer comes back. Round *i*'s `sync` (sent at `t_i`,
/// answered at `a_i`) renewed the session on the follower before `a_i`. If a later round *m*
/// was sent at least [`SPACING`](Confirmed::answered) after `a_i`, the leader pinged the
/// follower in between (pings are half a tick apart, and a session is at least two ticks, so
/// the spacing of a third of the session is more than half a tick), those pings travelled
/// before round *m*'s answer on the same connection, and the follower answered one of them,
/// with round *i*'s renewal, before it handed round *m*'s answer to the client. When a still
/// later round *k*'s `sync` is answered, that ping answer had reached the leader before
/// round *k*'s `sync` on the follower's connection, so the leader had renewed the session at
/// some time after `t_i` and before it answered round *k*; and the session was alive then
/// (an expiry ordered before the `sync` would have reached the client first, and each hold's
/// znode is checked after it). So once round *k* is answered, the session lives at least
/// until `t_i + timeout`. With a round every eighth of the session, `t_i` is four rounds
/// back (round *m* three rounds after *i* is the first a third of the session after its
/// answer): the deadline stays about half a session ahead, and three lost rounds in a row
/// cost nothing.
///
/// The chain holds across a change of connection too: a client that reconnects (to the same
/// or another server) with its session is let in only once the leader has revalidated the
/// session, which renews it on the leader itself; the client sends that request after every
/// request of its old connection, so after round *i*'s. And a new leader starts every session
/// afresh (a full timeout from its election).
///
/// A new session starts from the time its connect request was sent (the leader creates it
/// after that, with a full timeout).
#[derive(Debug)]
pub(crate) struct Confirmed {
    /// Answered rounds (send time, answer time), oldest first, back to the last one used.
    rounds: std::collections::VecDeque<(Instant, Instant)>,
    /// The latest time the leader surely renewed the session no earlier than.
    touched: Instant,
}

impl Confirmed {
    fn new(connect_sent: Instant) -> Self {
        Confirmed {
            rounds: std::collections::VecDeque::new(),
            touched: connect_sent,
        }
    }

    /// Round (`sent`, `answered`) got its `sync` answered; `spacing` is a third of the session
    /// timeout. Returns the updated [`touched`](Self::touched).
    pub(crate) fn answered(
        &mut self,
        sent: Instant,
        answered: Instant,
        spacing: Duration,
    ) -> Instant {
        // Rounds may overlap: round m is the latest answered before this one was sent (its
        // answer reached the client before this `sync` left), and round i the latest answered
        // a spacing before m was sent.
        if let Some(m) = self.rounds.iter().rposition(|&(_, a)| a < sent) {
            let m_sent = self.rounds[m].0;
            if let Some(i) = self
                .rounds
                .range(..=m)
                .rposition(|&(_, i_answered)| i_answered + spacing <= m_sent)
            {
                self.touched = self.touched.max(self.rounds[i].0);
                self.rounds.drain(..i);
            }
        }
        // Reported by concurrent rounds, so not always in the order the answers came: each
        // check above compares recorded times, which err on the safe side (an answer time is
        // taken after the answer, a send time before the send); a round out of place can only
        // make the proof lag.
        self.rounds.push_back((sent, answered));
        // Bounded whatever the answers' timing (64 rounds are more than ten sessions).
        if self.rounds.len() > 64 {
            self.rounds.pop_front();
        }
        self.touched
    }

    pub(crate) fn touched(&self) -> Instant {
        self.touched
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A connection to a ZooKeeper ensemble: one session, shared by every [`ZkLock`](crate::ZkLock) built on it.
///
/// The session is each hold's lease. ZooKeeper deletes a session's ephemeral znodes (its
/// holds and its places in the lock queues) when the session expires: when no server of the
/// ensemble heard from the client for the negotiated session timeout (a killed or paused
/// process, a partition). The client pings on its own while the process runs; Slate adds a
/// round every eighth of the session timeout, for the client's life: a `sync` through the
/// leader, then a light check per held lock. The rounds prove when the leader last renewed the
/// session (a follower's answers alone prove nothing: a follower cut off from its leader keeps
/// answering), and each guard's lease deadline is *that renewal + session timeout* (less a 1 %
/// clock allowance), about half a session ahead: a guard knows it may have lost the lock
/// **before** the ensemble can give it to anybody else.
///
/// An expired session is replaced by a new one at the next call; the guards of the old one
/// are told at once ([`LossReason::EntryGone`]).
///
/// Clones share the session. Dropping the last clone closes it, which frees its holds at
/// once.
///
/// # Examples
///
/// ```no_run
/// use slate_zookeeper::{ZkClient, ZkLock};
///
/// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
/// let client = ZkClient::builder("10.0.0.1:2181,10.0.0.2:2181,10.0.0.3:2181")
///     .session_timeout(std::time::Duration::from_secs(6))
///     .digest("billing", "secret")
///     .connect()
///     .await?;
/// let lock = ZkLock::builder(&client, "invoices").build()?;
/// let guard = lock.lock().await?;
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZkClient {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    servers: String,
    requested_timeout: Duration,
    op_timeout: Option<Duration>,
    auth: Option<(String, Vec<u8>)>,
    pub(crate) runtime: Handle,
    session: Mutex<Arc<Session>>,
    reconnect: tokio::sync::Mutex<()>,
    leases: Mutex<Leases>,
    pub(crate) locks: Registry<String>,
}

/// One ZooKeeper session.
pub(crate) struct Session {
    pub(crate) zk: zk::Client,
    pub(crate) id: i64,
    /// The negotiated session timeout.
    pub(crate) timeout: Duration,
    /// What the heartbeat has proven about the leader's renewals of the session.
    pub(crate) confirmed: Mutex<Confirmed>,
}

impl Session {
    /// The time the leader surely renewed the session no earlier than (see [`Confirmed`]).
    pub(crate) fn touched(&self) -> Instant {
        lock(&self.confirmed).touched()
    }
}

#[derive(Default)]
struct Leases {
    /// Znode path of a hold → its session and lease.
    map: HashMap<String, (i64, Arc<LeaseKeeper>)>,
}

/// Builds a [`ZkClient`].
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
/// let client = slate_zookeeper::ZkClient::builder("127.0.0.1:2181/apps/billing")
///     .session_timeout(std::time::Duration::from_secs(4))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZkClientBuilder {
    servers: String,
    session_timeout: Duration,
    op_timeout: Option<Duration>,
    auth: Option<(String, Vec<u8>)>,
    runtime: Option<Handle>,
}

impl fmt::Debug for ZkClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkClientBuilder")
            .field("servers", &self.servers)
            .field("session_timeout", &self.session_timeout)
            .field("user", &self.auth.as_ref().map(|(u, _)| u))
            .finish_non_exhaustive()
    }
}

impl ZkClientBuilder {
    /// The session timeout to ask the ensemble for (default 10 s). The servers clamp it to
    /// their `minSessionTimeout`..`maxSessionTimeout` (2 to 20 ticks unless configured); the
    /// negotiated value is [`ZkClient::session_timeout`]. It is the lease of every hold: a
    /// dead holder's lock frees this long after the ensemble last heard from it.
    ///
    /// # Examples
    ///
    /// ```
    /// let b = slate_zookeeper::ZkClient::builder("127.0.0.1:2181")
    ///     .session_timeout(std::time::Duration::from_secs(6));
    /// ```
    #[must_use]
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// How long one ZooKeeper request may go unanswered before the call fails with a timeout
    /// (default: the session timeout; after that long the session is gone anyway).
    ///
    /// # Examples
    ///
    /// ```
    /// let b = slate_zookeeper::ZkClient::builder("127.0.0.1:2181")
    ///     .operation_timeout(std::time::Duration::from_secs(2));
    /// ```
    #[must_use]
    pub fn operation_timeout(mut self, timeout: Duration) -> Self {
        self.op_timeout = Some(timeout);
        self
    }

    /// Authenticates the session with ZooKeeper's `digest` scheme, and creates every znode
    /// (the lock root, each lock's directory, each contender) with the `creator_all` ACL: only
    /// sessions authenticated as the same user can see, take or clear these locks.
    ///
    /// # Examples
    ///
    /// ```
    /// let b = slate_zookeeper::ZkClient::builder("127.0.0.1:2181").digest("billing", "secret");
    /// ```
    #[must_use]
    pub fn digest(mut self, user: impl Into<String>, password: impl AsRef<str>) -> Self {
        let user = user.into();
        let cred = format!("{user}:{}", password.as_ref()).into_bytes();
        self.auth = Some((user, cred));
        self
    }

    /// The tokio runtime for the client's background work (lease checks, releases of dropped
    /// guards); default: the runtime `connect` runs on.
    ///
    /// # Examples
    ///
    /// ```
    /// # let rt = tokio::runtime::Runtime::new().unwrap();
    /// let b = slate_zookeeper::ZkClient::builder("127.0.0.1:2181").runtime(rt.handle().clone());
    /// ```
    #[must_use]
    pub fn runtime(mut self, handle: Handle) -> Self {
        self.runtime = Some(handle);
        self
    }

    /// Connects: opens the session (waiting up to about the session timeout for a server).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for an empty server list or a zero timeout;
    /// [`Error::Backend`] when no server answered ([`BackendKind::Io`] or `Timeout`) or the
    /// credentials were refused ([`BackendKind::Auth`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a session opened for a dropped call is closed.
    pub async fn connect(self) -> Result<ZkClient> {
        if self.servers.trim().is_empty() {
            return Err(Error::invalid_input(
                "ZooKeeper servers",
                "the server list is empty",
                "pass host:port[,host:port…][/chroot], such as \"127.0.0.1:2181\"",
            ));
        }
        if self.session_timeout.is_zero() || self.op_timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::invalid_input(
                "ZooKeeper timeouts",
                "a timeout is zero",
                "give the session and operation timeouts a positive duration (e.g. 10 s)",
            ));
        }
        if self.session_timeout > MAX_SESSION_TIMEOUT {
            return Err(Error::invalid_input(
                "session timeout",
                format!(
                    "{:?} is more than ZooKeeper's protocol carries (32-bit milliseconds)",
                    self.session_timeout
                ),
                "use a session timeout of at most 24 days; servers clamp it to their \
                 maxSessionTimeout anyway (20 ticks, 40 s, unless configured)",
            ));
        }
        if let Some(t) = self.op_timeout {
            slate_core::options::check_max_duration("operation timeout", t)?;
        }
        let runtime = match self.runtime {
            Some(h) => h,
            None => Handle::try_current().map_err(|_| {
                Error::invalid_input(
                    "runtime",
                    "ZkClient::connect ran outside a tokio runtime",
                    "call it from a tokio runtime, or pass one with ZkClientBuilder::runtime",
                )
            })?,
        };
        let session = open(
            &self.servers,
            self.session_timeout,
            self.auth.as_ref().map(|(_, c)| c.as_slice()),
        )
        .await?;
        let inner = Arc::new(Inner {
            servers: self.servers,
            requested_timeout: self.session_timeout,
            op_timeout: self.op_timeout,
            auth: self.auth,
            runtime,
            session: Mutex::new(Arc::clone(&session)),
            reconnect: tokio::sync::Mutex::new(()),
            leases: Mutex::default(),
            locks: Registry::default(),
        });
        watch_session(&inner, &session);
        // For the client's whole life: an acquisition's lease counts from what it proved.
        inner.runtime.spawn(heartbeat(Arc::downgrade(&inner)));
        Ok(ZkClient { inner })
    }
}

async fn open(servers: &str, timeout: Duration, auth: Option<&[u8]>) -> Result<Arc<Session>> {
    let mut connector = zk::Client::connector().with_session_timeout(timeout);
    if let Some(cred) = auth {
        connector = connector.with_auth("digest", cred);
    }
    // The client gives up after about one session timeout; the outer bound only guards
    // against a server that accepts the connection and never answers.
    let connect_sent = Instant::now();
    let connect = connector.connect(servers);
    let zk = match tokio::time::timeout(timeout * 2 + Duration::from_secs(1), connect).await {
        Ok(Ok(zk)) => zk,
        Ok(Err(zk::Error::BadArguments(why))) => {
            return Err(Error::invalid_input(
                "ZooKeeper servers",
                format!("{servers:?} is not a connection string: {why}"),
                "pass host:port[,host:port…][/chroot], such as \"127.0.0.1:2181\"",
            ));
        }
        Ok(Err(e)) => return Err(from_zk(e, servers, "connect")),
        Err(_) => return Err(op_timeout(servers, "connect", timeout * 2)),
    };
    let id = zk.session_id().0;
    let timeout = zk.session_timeout();
    tracing::debug!(
        servers,
        session = format!("{id:#x}"),
        ?timeout,
        "ZooKeeper session opened"
    );
    Ok(Arc::new(Session {
        zk,
        id,
        timeout,
        confirmed: Mutex::new(Confirmed::new(connect_sent)),
    }))
}

/// Loses every lease of `session` as soon as the session ends (expired, closed, refused).
fn watch_session(inner: &Arc<Inner>, session: &Session) {
    let weak = Arc::downgrade(inner);
    let mut states = session.zk.state_watcher();
    let id = session.id;
    inner.runtime.spawn(async move {
        loop {
            let state = states.changed().await;
            tracing::debug!(
                session = format!("{id:#x}"),
                ?state,
                "ZooKeeper session state"
            );
            if state.is_terminated() {
                if let Some(inner) = weak.upgrade() {
                    inner.lose_session(id);
                }
                return;
            }
        }
    });
}

impl Inner {
    fn lose_session(&self, id: i64) {
        let lost: Vec<Arc<LeaseKeeper>> = {
            let mut leases = lock(&self.leases);
            let mut lost = Vec::new();
            leases.map.retain(|_, (sid, keeper)| {
                if *sid == id {
                    lost.push(Arc::clone(keeper));
                    false
                } else {
                    true
                }
            });
            lost
        };
        for keeper in lost {
            keeper.lose(LossReason::EntryGone);
        }
    }
}

impl ZkClient {
    /// Starts building a client for `servers`: `host:port[,host:port…][/chroot]`, as
    /// ZooKeeper's own clients take it.
    ///
    /// # Examples
    ///
    /// ```
    /// let b = slate_zookeeper::ZkClient::builder("zk1:2181,zk2:2181,zk3:2181");
    /// ```
    pub fn builder(servers: impl Into<String>) -> ZkClientBuilder {
        ZkClientBuilder {
            servers: servers.into(),
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            op_timeout: None,
            auth: None,
            runtime: None,
        }
    }

    /// Connects to `servers` with the default options.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`ZkClientBuilder::connect`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn connect(servers: &str) -> Result<ZkClient> {
        ZkClient::builder(servers).connect().await
    }

    /// The connection string this client was built with.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
    /// assert_eq!(client.servers(), "127.0.0.1:2181");
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn servers(&self) -> &str {
        &self.inner.servers
    }

    /// The negotiated session timeout of the current session: every hold's lease.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
    /// println!("a dead holder frees its locks within {:?}", client.session_timeout());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn session_timeout(&self) -> Duration {
        self.current().timeout
    }

    /// The id of the current session (it changes when an expired session is replaced).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// let client = slate_zookeeper::ZkClient::connect("127.0.0.1:2181").await?;
    /// println!("session {:#x}", client.session_id());
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn session_id(&self) -> i64 {
        self.current().id
    }

    /// The digest user this client authenticates as, if any.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main] async fn main() -> slate_zookeeper::Result<()> {
    /// let client = slate_zookeeper::ZkClient::builder("127.0.0.1:2181").digest("ops", "pw").connect().await?;
    /// assert_eq!(client.user(), Some("ops"));
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn user(&self) -> Option<&str> {
        self.inner.auth.as_ref().map(|(u, _)| u.as_str())
    }

    pub(crate) fn acls(&self) -> zk::Acls<'static> {
        if self.inner.auth.is_some() {
            zk::Acls::creator_all()
        } else {
            zk::Acls::anyone_all()
        }
    }

    pub(crate) fn current(&self) -> Arc<Session> {
        Arc::clone(&lock(&self.inner.session))
    }

    /// The live session, replacing an ended one (expired, closed) by a new one.
    pub(crate) async fn session(&self) -> Result<Arc<Session>> {
        let current = self.current();
        if !current.zk.state().is_terminated() {
            return Ok(current);
        }
        let _one = self.inner.reconnect.lock().await;
        let current = self.current();
        match current.zk.state() {
            zk::SessionState::AuthFailed => {
                return Err(Error::backend(
                    BackendKind::Auth,
                    Some(self.inner.servers.clone()),
                    "ZooKeeper refused the session's credentials; check the digest user and \
                     password (ZkClientBuilder::digest)",
                    None,
                ));
            }
            state if !state.is_terminated() => return Ok(current),
            state => tracing::info!(
                servers = %self.inner.servers,
                session = format!("{:#x}", current.id),
                ?state,
                "ZooKeeper session ended; opening a new one"
            ),
        }
        self.inner.lose_session(current.id);
        let fresh = open(
            &self.inner.servers,
            self.inner.requested_timeout,
            self.inner.auth.as_ref().map(|(_, c)| c.as_slice()),
        )
        .await?;
        watch_session(&self.inner, &fresh);
        *lock(&self.inner.session) = Arc::clone(&fresh);
        client_meter().reconnected();
        Ok(fresh)
    }

    /// How long one request may wait for its answer.
    pub(crate) fn op_timeout(&self, session: &Session) -> Duration {
        self.inner.op_timeout.unwrap_or(session.timeout)
    }

    /// Runs one request under the operation timeout. The outer error is the timeout; the
    /// inner result is ZooKeeper's answer, for the caller to read (`NoNode`, `NodeExists`...).
    pub(crate) async fn op<T>(
        &self,
        session: &Session,
        what: &str,
        request: impl Future<Output = std::result::Result<T, zk::Error>>,
    ) -> Result<std::result::Result<T, zk::Error>> {
        let limit = self.op_timeout(session);
        tokio::time::timeout(limit, request).await.map_err(|_| {
            client_meter().server_error(BackendKind::Timeout);
            op_timeout(&self.inner.servers, what, limit)
        })
    }

    /// Runs a **read** (or a watch registration, which is idempotent) under the operation
    /// timeout, sending it again when the connection was lost before the answer: the client
    /// is failing over to another server of the ensemble (a leader election, a server that
    /// died). Writes are not repeated here: a create whose answer was lost is found by its
    /// attempt id, a delete is retried by its own loop.
    pub(crate) async fn read<T, F, Fut>(
        &self,
        session: &Session,
        what: &str,
        request: F,
    ) -> Result<std::result::Result<T, zk::Error>>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = std::result::Result<T, zk::Error>>,
    {
        const PAUSE: Duration = Duration::from_millis(50);
        let limit = self.op_timeout(session);
        let until = Instant::now() + limit;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, request()).await {
                Err(_) => {
                    client_meter().server_error(BackendKind::Timeout);
                    return Err(op_timeout(&self.inner.servers, what, limit));
                }
                Ok(Err(e)) if lost_connection(&e) && Instant::now() + PAUSE < until => {
                    tracing::debug!(what, "connection lost before the answer; asking again");
                    tokio::time::sleep(PAUSE).await;
                }
                Ok(answer) => return Ok(answer),
            }
        }
    }

    /// A ZooKeeper error as a Slate error.
    pub(crate) fn error(&self, e: zk::Error, what: &str) -> Error {
        let e = from_zk(e, &self.inner.servers, what);
        if let Some(kind) = e.backend_kind() {
            client_meter().server_error(kind);
        }
        e
    }

    pub(crate) fn runtime(&self) -> &Handle {
        &self.inner.runtime
    }

    /// Runs `fut` on the client's runtime (directly when already inside a runtime; see
    /// [`slate_core::detach::on_runtime`]).
    pub(crate) fn on_runtime<T, F>(
        &self,
        fut: F,
    ) -> impl Future<Output = Result<T>> + Send + 'static + use<T, F>
    where
        T: Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        slate_core::detach::on_runtime(self.inner.runtime.clone(), fut)
    }

    /// Starts keeping the lease of the hold at `path` (of `session`).
    pub(crate) fn keep_lease(&self, path: String, session: i64, keeper: Arc<LeaseKeeper>) {
        let path_of_watch = path.clone();
        lock(&self.inner.leases)
            .map
            .insert(path, (session, Arc::clone(&keeper)));
        drop(self.inner.runtime.spawn(watch_hold(
            Arc::downgrade(&self.inner),
            path_of_watch,
            session,
            keeper,
        )));
    }

    /// Stops keeping the lease of the hold at `path` (released).
    pub(crate) fn drop_lease(&self, path: &str) {
        lock(&self.inner.leases).map.remove(path);
    }

    /// Whether `keeper` is still the lease kept for `path`: a release stops keeping its lease
    /// before it deletes the znode, so a znode found gone while its lease is still kept was
    /// not deleted by its release.
    fn keeps(&self, path: &str, keeper: &Arc<LeaseKeeper>) -> bool {
        lock(&self.inner.leases)
            .map
            .get(path)
            .is_some_and(|(_, k)| Arc::ptr_eq(k, keeper))
    }
}

/// Watches a held znode, so that its deletion (a `force_unlock`, or its session ended) is a
/// loss at once rather than at the next heartbeat, up to an eighth of the session timeout later.
/// A release stops keeping the lease before it deletes the znode, so
/// its own delete finds the lease gone and signals nothing. The pending watch keeps no
/// strong reference to the client: it must not keep the session alive.
async fn watch_hold(inner: Weak<Inner>, path: String, sid: i64, keeper: Arc<LeaseKeeper>) {
    let watched = {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let session = Arc::clone(&lock(&strong.session));
        if session.id != sid {
            return;
        }
        match session.zk.check_and_watch_stat(&path).await {
            Ok((Some(stat), watcher)) if stat.ephemeral_owner == sid => Some(watcher),
            Ok(_) => None,
            // The heartbeat decides.
            Err(_) => return,
        }
    };
    if let Some(watcher) = watched {
        let event = watcher.changed().await;
        if event.event_type != zk::EventType::NodeDeleted {
            return;
        }
    }
    let Some(inner) = inner.upgrade() else {
        return;
    };
    let client = ZkClient { inner };
    if client.keeps(&path, &keeper) {
        tracing::warn!(%path, "the hold's znode was deleted; the lock is lost");
        keeper.lose(LossReason::EntryGone);
        client.drop_lease(&path);
    }
}

/// Runs a round every eighth of the session timeout for as long as the client lives: a `sync`
/// through the leader, which advances what the session's [`Confirmed`] proves, then a check of
/// every held znode, which moves each lease's deadline to what is proven (or signals a znode
/// found gone: force-unlocked, or its session ended).
async fn heartbeat(inner: Weak<Inner>) {
    // Rounds start at a fixed rate and may overlap: a round waits for its `sync` (which the
    // leader answers once its pending writes are committed), and waiting for it before the
    // next would stretch the rounds, and the proof's lag, by that latency (review finding).
    let in_flight = Arc::new(AtomicUsize::new(0));
    let mut next = Instant::now();
    loop {
        let period = match inner.upgrade() {
            Some(i) => heartbeat_period(lock(&i.session).timeout),
            None => return,
        };
        next = (next + period).max(Instant::now());
        tokio::time::sleep_until(next.into()).await;
        let Some(strong) = inner.upgrade() else {
            return;
        };
        // A server that answers nothing would otherwise pile rounds up (each is bounded by
        // the operation timeout): a few in flight are enough to keep proving.
        if in_flight.load(Ordering::Relaxed) >= MAX_ROUNDS_IN_FLIGHT {
            continue;
        }
        in_flight.fetch_add(1, Ordering::Relaxed);
        let (weak, done) = (Arc::downgrade(&strong), InFlight(Arc::clone(&in_flight)));
        strong.runtime.spawn(async move {
            round(weak).await;
            drop(done);
        });
    }
}

/// Rounds of the heartbeat that may be in flight at once.
const MAX_ROUNDS_IN_FLIGHT: usize = 4;

/// One round in flight, counted until it ends however it ends (a panic included).
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The ZooKeeper clients' meter (reconnects, server errors).
fn client_meter() -> ClientMeter {
    ClientMeter::new("zookeeper")
}

/// One heartbeat round (see [`heartbeat`]).
async fn round(inner: Weak<Inner>) {
    let Some(inner) = inner.upgrade() else { return };
    let client = ZkClient { inner };
    let holds: Vec<(String, i64, Arc<LeaseKeeper>)> = {
        let mut leases = lock(&client.inner.leases);
        leases.map.retain(|_, (_, k)| !k.is_lost());
        leases
            .map
            .iter()
            .map(|(p, (s, k))| (p.clone(), *s, Arc::clone(k)))
            .collect()
    };
    let session = client.current();
    if session.zk.state().is_terminated() {
        // The next call opens a new session (with its own proof).
        return;
    }
    let sent = Instant::now();
    let synced = matches!(
        client
            .read(&session, "lease sync", || session.zk.sync("/"))
            .await,
        Ok(Ok(()))
    );
    if synced {
        let touched = lock(&session.confirmed).answered(sent, Instant::now(), session.timeout / 3);
        let margin =
            lease_deadline(touched, session.timeout).saturating_duration_since(Instant::now());
        if margin < session.timeout / 4 && !holds.is_empty() {
            tracing::warn!(?margin, session_timeout = ?session.timeout,
                "the ZooKeeper session's proven renewal lags (slow sync answers?): holds are close to the end of their lease");
        }
    }
    let checks = holds.iter().map(|(path, sid, _)| {
        let (session, client) = (&session, &client);
        async move {
            if *sid != session.id {
                return Some(false);
            }
            if !synced {
                return None;
            }
            match client
                .read(session, "lease check", || session.zk.check_stat(path))
                .await
            {
                Ok(Ok(Some(stat))) => Some(stat.ephemeral_owner == *sid),
                Ok(Ok(None) | Err(zk::Error::SessionExpired)) => Some(false),
                _ => None,
            }
        }
    });
    let answers = futures::future::join_all(checks).await;
    for ((path, _, keeper), answer) in holds.iter().zip(answers) {
        // Released while the round ran (its release may have deleted the znode by now): a
        // loss for nobody, and nothing to extend.
        if !client.keeps(path, keeper) {
            continue;
        }
        match answer {
            // Confirmed too late: the deadline passed first, and a loss is final.
            Some(true) if Instant::now() >= keeper.deadline() => {
                keeper.lose(LossReason::DeadlineExpired);
                client.drop_lease(path);
            }
            // What is proven now (rounds may end out of order: never an older proof).
            Some(true) => keeper.extend(lease_deadline(session.touched(), session.timeout)),
            Some(false) => {
                tracing::warn!(%path, "the hold's znode is gone; the lock is lost");
                keeper.lose(LossReason::EntryGone);
                client.drop_lease(path);
            }
            None if Instant::now() >= keeper.deadline() => {
                tracing::warn!(%path, "no answer from ZooKeeper within the session timeout; the lock may be lost");
                keeper.lose(LossReason::DeadlineExpired);
            }
            None => {}
        }
    }
}

impl fmt::Debug for ZkClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.current();
        f.debug_struct("ZkClient")
            .field("servers", &self.inner.servers)
            .field("session", &format_args!("{:#x}", s.id))
            .field("session_timeout", &s.timeout)
            .field("user", &self.user())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(8);
    const MS: Duration = Duration::from_millis(1);

    /// A round sent `at` after `t0` and answered 1 ms later.
    fn round(c: &mut Confirmed, t0: Instant, at: Duration) -> Instant {
        c.answered(t0 + at, t0 + at + MS, TIMEOUT / 3)
    }

    /// an answered `sync` proves no renewal by itself. A round's renewal
    /// counts once a round sent a third of the session after its answer has been answered,
    /// and then one more: with rounds every eighth of the session, four rounds back.
    #[test]
    fn a_renewal_counts_once_two_rounds_a_third_of_the_session_later_are_answered() {
        let t0 = Instant::now();
        let mut c = Confirmed::new(t0);
        let period = heartbeat_period(TIMEOUT);
        assert_eq!(period, Duration::from_secs(1));
        // Rounds at 1 s to 4 s: no round is yet a third of the session (2.67 s) after
        // another's answer and followed by a further answered round.
        for k in 1..=4 {
            assert_eq!(round(&mut c, t0, period * k), t0, "round {k}");
        }
        // Round 5: round 4 (4 s) came at least 2.67 s after round 1's answer (1 s + 1 ms):
        // round 1's renewal (sent at 1 s) counts.
        assert_eq!(round(&mut c, t0, period * 5), t0 + period);
        // And so on, four rounds back.
        assert_eq!(round(&mut c, t0, period * 6), t0 + period * 2);
        assert!(c.rounds.len() <= 5, "{}", c.rounds.len());
        // The deadline stays about half a session ahead of the last round.
        let deadline = lease_deadline(c.touched(), TIMEOUT);
        assert!(deadline > t0 + period * 6 + TIMEOUT / 2 - TIMEOUT / 50);
        assert!(deadline <= t0 + period * 6 + TIMEOUT / 2);
    }

    /// Failed rounds (not reported) leave gaps: what counts is time, not round numbers. A lone
    /// answered round after a long silence proves nothing new until another follows it.
    #[test]
    fn a_gap_proves_nothing_until_two_rounds_follow_it() {
        let t0 = Instant::now();
        let mut c = Confirmed::new(t0);
        assert_eq!(round(&mut c, t0, Duration::from_secs(1)), t0);
        // Silence (an outage), then one round: round 1 was answered more than 2.67 s before,
        // but round 2 is the one that would have to carry the follower's ping answer.
        assert_eq!(round(&mut c, t0, Duration::from_secs(5)), t0);
        // A further round: now round 1's renewal counts.
        let s1 = t0 + Duration::from_secs(1);
        assert_eq!(round(&mut c, t0, Duration::from_secs(6)), s1);
        // Never backwards.
        assert_eq!(round(&mut c, t0, Duration::from_secs(6) + MS * 5), s1);
    }

    /// Rounds overlap when a `sync` takes longer than a period (the heartbeat starts them at a
    /// fixed rate): round m must have been answered before round k was sent.
    #[test]
    fn overlapping_rounds_chain_only_through_answers_received_before_a_send() {
        let t0 = Instant::now();
        let mut c = Confirmed::new(t0);
        let s = |ms: u64| Duration::from_millis(ms);
        let spacing = TIMEOUT / 3;
        // Each round takes 1.5 s; one starts every second: answers at 2.5, 3.5, 4.5, ...
        let mut last = t0;
        for k in 1..=8u64 {
            last = c.answered(t0 + s(1000 * k), t0 + s(1000 * k + 1500), spacing);
        }
        // Round 8 (sent at 8 s): the latest round answered before that is round 6 (answered
        // at 7.5 s, sent at 6 s); the latest answered 2.67 s before 6 s is round 1 (2.5 s).
        assert_eq!(last, t0 + s(1000));
    }
}
