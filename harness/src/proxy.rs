//! A test-only TCP fault proxy: delay, lost replies, blackholes, resets and refusals between a
//! client and one Redis node, switchable while connections are open.
//!
//! `tc netem` is unavailable on our machines (see `TESTING.md`), so network faults are made in
//! user space: the client connects to the proxy, the proxy to the node.
//!
//! ## Behaviour
//!
//! - The proxy runs on its own thread with its own single-threaded tokio runtime, so a test's
//!   runtime (or a blocked test thread) cannot stall it. The API is synchronous.
//! - A mode switch applies at once to existing connections and new ones. Bytes are judged when
//!   the proxy reads them: a chunk read under [`Mode::Pass`] is forwarded even if the mode
//!   changes while it is in flight, except that nothing is written while [`Mode::Blackhole`]
//!   holds.
//! - [`FaultProxy::set_mode`] and [`FaultProxy::reset_all`] return once the switch has taken
//!   effect: the listener is closed or rebound, and the connections that had to close are
//!   closed.
//! - Each proxied connection has its own upstream connection, opened when the client connects.
//! - `Drop` stops the thread (bounded at 2 s) and closes every socket.
//! - One connection can be singled out by what its client sends
//!   ([`FaultProxy::mark_next_sending`]) and given a mode of its own
//!   ([`FaultProxy::set_marked_mode`]): a fault on one of a client's connections (its pub/sub
//!   connection, the request that follows a lost reply) while the others flow.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::server::HarnessError;

/// How long a mode switch may take to apply before it is reported as failed.
const APPLY_TIMEOUT: Duration = Duration::from_secs(3);
/// How long to wait for the proxy thread to stop on drop.
const STOP_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the proxy waits to connect upstream before resetting the client.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Rebinding the port after [`Mode::Refuse`]: tries and pause between them.
const REBIND_TRIES: u32 = 20;
const REBIND_PAUSE: Duration = Duration::from_millis(100);
/// Chunks in flight per direction (bounds memory under a long delay).
const QUEUE_CHUNKS: usize = 1024;

/// What the proxy does with traffic.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
///
/// use slate_harness::proxy::{FaultProxy, Mode};
/// use slate_harness::server::RedisServer;
///
/// let server = RedisServer::start()?;
/// let proxy = FaultProxy::start(server.addr())?;
/// proxy.set_mode(Mode::Delay {
///     to_server: Duration::from_millis(50),
///     to_client: Duration::ZERO,
/// })?;
/// # Ok::<(), slate_harness::server::HarnessError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Forward everything both ways.
    #[default]
    Pass,
    /// Forward everything, each chunk delayed by the given time in its direction (latency,
    /// not reduced throughput: chunks do not wait for each other's delays).
    Delay {
        /// Delay of client-to-server bytes (requests).
        to_server: Duration,
        /// Delay of server-to-client bytes (replies).
        to_client: Duration,
    },
    /// Forward requests, discard replies: the command runs, the client never hears back.
    DropReplies,
    /// Forward nothing either way and hold the sockets open (a silent partition). Bytes are
    /// held, not lost: they flow again, like TCP after a healed partition, when the mode
    /// returns to a forwarding one.
    Blackhole,
    /// Close every connection at once with a TCP RST, and every new one as soon as it is
    /// accepted.
    Reset,
    /// Stop listening, so connects are refused, and reset every open connection (a node that
    /// is down). The proxy listens again on the same port when the mode changes.
    Refuse,
}

impl Mode {
    fn closes_connections(self) -> bool {
        matches!(self, Self::Reset | Self::Refuse)
    }
}

/// What the controlling thread publishes to the proxy thread.
#[derive(Debug, Clone, Copy)]
struct Control {
    mode: Mode,
    /// Bumped by [`FaultProxy::reset_all`]: connections registered under an older epoch close.
    reset_epoch: u64,
    /// Bumped on every change; the acceptor acknowledges it.
    seq: u64,
    shutdown: bool,
    /// The marked connection, if one took the armed mark.
    marked: Option<u64>,
    /// The marked connection's own mode (`None`: the proxy's mode).
    marked_mode: Option<Mode>,
}

impl Control {
    /// The mode that applies to connection `id`. [`Mode::Refuse`] given to the marked
    /// connection alone acts as [`Mode::Reset`] (the listener serves the others).
    fn mode_of(&self, id: u64) -> Mode {
        match self.marked_mode {
            Some(mode) if self.marked == Some(id) => {
                if mode == Mode::Refuse {
                    Mode::Reset
                } else {
                    mode
                }
            }
            _ => self.mode,
        }
    }
}

/// State shared between the handle and the proxy thread.
#[derive(Debug)]
struct Shared {
    control: watch::Sender<Control>,
    /// The armed mark: the next connection whose client sends these bytes is marked.
    mark: Mutex<Option<Vec<u8>>>,
    marks_taken: AtomicU64,
    upstream: SocketAddr,
    port: u16,
    accepted: AtomicU64,
    to_server: AtomicU64,
    to_client: AtomicU64,
    next_id: AtomicU64,
    /// Open connections: id -> reset epoch at registration.
    live: Mutex<HashMap<u64, u64>>,
    live_changed: Condvar,
    /// Last control `seq` the acceptor applied, with the error if applying it failed.
    ack: Mutex<(u64, Option<String>)>,
    ack_changed: Condvar,
    /// Set when the proxy thread has finished.
    done: Mutex<bool>,
    done_changed: Condvar,
}

/// Locks a mutex, ignoring poisoning: every critical section here leaves the data consistent.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    fn unregister(&self, id: u64) {
        lock(&self.live).remove(&id);
        self.live_changed.notify_all();
    }

    fn acknowledge(&self, seq: u64, error: Option<String>) {
        let mut ack = lock(&self.ack);
        if ack.0 != seq || error.is_some() {
            *ack = (seq, error);
            self.ack_changed.notify_all();
        }
    }

    /// Marks connection `id` if the armed pattern occurs in `chunk` (client-to-server bytes),
    /// disarming it.
    fn take_mark(&self, id: u64, chunk: &[u8]) {
        let mut mark = lock(&self.mark);
        let hit = mark
            .as_deref()
            .is_some_and(|p| chunk.windows(p.len()).any(|w| w == p));
        if hit {
            *mark = None;
            self.marks_taken.fetch_add(1, Ordering::SeqCst);
            self.control
                .send_modify(|control| control.marked = Some(id));
        }
    }

    fn finish(&self) {
        *lock(&self.done) = true;
        self.done_changed.notify_all();
        // Wake a `set_mode` waiting for an acknowledgement that will never come.
        let _ack = lock(&self.ack);
        self.ack_changed.notify_all();
    }
}

/// A TCP proxy on `127.0.0.1:<free port>` in front of one upstream, with switchable faults.
///
/// ## Behaviour
///
/// See the [module docs](self).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
///
/// use slate_harness::proxy::{FaultProxy, Mode};
/// use slate_harness::server::RedisServer;
///
/// let server = RedisServer::start()?;
/// let proxy = FaultProxy::start(server.addr())?;
/// let client = redis::Client::open(proxy.url())?;
/// let mut con = client.get_connection_with_timeout(Duration::from_secs(1))?;
/// con.set_read_timeout(Some(Duration::from_millis(300)))?;
/// proxy.set_mode(Mode::DropReplies)?;
/// let lost: redis::RedisResult<()> = redis::cmd("SET").arg("k").arg(1).query(&mut con);
/// assert!(lost.is_err()); // ... but the key is set on the server
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct FaultProxy {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts a proxy in [`Mode::Pass`] in front of `upstream`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::start()?;
    /// let proxy = slate_harness::proxy::FaultProxy::start(server.addr())?;
    /// println!("clients use {}", proxy.url());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Io`] when the port cannot be bound or the proxy thread or runtime cannot
    /// start.
    pub fn start(upstream: SocketAddr) -> Result<Self, HarnessError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(HarnessError::io("building the proxy runtime"))?;
        // Registered with the proxy's runtime (entering it works inside another runtime too).
        let listener = {
            let _in_proxy_runtime = runtime.enter();
            port_socket(0).and_then(|s| s.listen(LISTEN_BACKLOG))
        }
        .map_err(HarnessError::io("binding the proxy port"))?;
        let port = listener
            .local_addr()
            .map_err(HarnessError::io("reading the proxy port"))?
            .port();
        let (control, control_rx) = watch::channel(Control {
            mode: Mode::Pass,
            reset_epoch: 0,
            seq: 0,
            shutdown: false,
            marked: None,
            marked_mode: None,
        });
        let shared = Arc::new(Shared {
            control,
            mark: Mutex::new(None),
            marks_taken: AtomicU64::new(0),
            upstream,
            port,
            accepted: AtomicU64::new(0),
            to_server: AtomicU64::new(0),
            to_client: AtomicU64::new(0),
            next_id: AtomicU64::new(0),
            live: Mutex::new(HashMap::new()),
            live_changed: Condvar::new(),
            ack: Mutex::new((0, None)),
            ack_changed: Condvar::new(),
            done: Mutex::new(false),
            done_changed: Condvar::new(),
        });
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name(format!("ecosphere-proxy-{port}"))
            .spawn(move || {
                let result = runtime.block_on(accept_loop(
                    Arc::clone(&thread_shared),
                    listener,
                    control_rx,
                ));
                if let Err(err) = result {
                    eprintln!("ecosphere proxy on port {port}: {err}");
                }
                // Dropping the runtime here drops every connection task and closes its sockets.
                drop(runtime);
                thread_shared.finish();
            })
            .map_err(HarnessError::io("spawning the proxy thread"))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }

    /// The address clients connect to.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let server = slate_harness::server::RedisServer::start()?;
    /// let proxy = slate_harness::proxy::FaultProxy::start(server.addr())?;
    /// let stream = std::net::TcpStream::connect(proxy.addr());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.shared.port))
    }

    /// The proxy's port (the same for its whole life, across [`Mode::Refuse`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let server = slate_harness::server::RedisServer::start()?;
    /// let proxy = slate_harness::proxy::FaultProxy::start(server.addr())?;
    /// assert_ne!(proxy.port(), server.port());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn port(&self) -> u16 {
        self.shared.port
    }

    /// `redis://127.0.0.1:PORT` of the proxy (add credentials yourself if the server needs them).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let server = slate_harness::server::RedisServer::start()?;
    /// let proxy = slate_harness::proxy::FaultProxy::start(server.addr())?;
    /// let client = redis::Client::open(proxy.url());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.shared.port)
    }

    /// The upstream it forwards to.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let server = slate_harness::server::RedisServer::start()?;
    /// let proxy = slate_harness::proxy::FaultProxy::start(server.addr())?;
    /// assert_eq!(proxy.upstream(), server.addr());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// The current mode.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let server = slate_harness::server::RedisServer::start()?;
    /// let proxy = slate_harness::proxy::FaultProxy::start(server.addr())?;
    /// assert_eq!(proxy.mode(), slate_harness::proxy::Mode::Pass);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn mode(&self) -> Mode {
        self.shared.control.borrow().mode
    }

    /// Switches the mode for existing and new connections, and returns once it applies.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use slate_harness::proxy::{FaultProxy, Mode};
    ///
    /// # let server = slate_harness::server::RedisServer::start()?;
    /// let proxy = FaultProxy::start(server.addr())?;
    /// proxy.set_mode(Mode::Refuse)?;
    /// assert!(std::net::TcpStream::connect(proxy.addr()).is_err());
    /// proxy.set_mode(Mode::Pass)?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Io`] when leaving [`Mode::Refuse`] cannot rebind the port (another
    /// process took it); [`HarnessError::Timeout`] when the switch does not apply within 3 s;
    /// [`HarnessError::NotRunning`] when the proxy thread is gone.
    pub fn set_mode(&self, mode: Mode) -> Result<(), HarnessError> {
        let close = if mode.closes_connections() {
            Close::All
        } else {
            Close::None
        };
        self.switch(|control| control.mode = mode, close)
    }

    /// Arms a one-shot mark: the first connection (open or new) whose client then sends bytes
    /// containing `pattern` becomes the marked connection, before that chunk is judged. The
    /// connection marked before, if any, is unmarked at once (it follows the proxy's mode). The pattern is looked for within each read, so keep it shorter
    /// than a request (on loopback a request of a few hundred bytes arrives in one read).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use slate_harness::proxy::{FaultProxy, Mode};
    ///
    /// # let server = slate_harness::server::RedisServer::start()?;
    /// let proxy = FaultProxy::start(server.addr())?;
    /// // The client's pub/sub connection, and only it, goes silent once it subscribes.
    /// proxy.set_marked_mode(Some(Mode::Blackhole))?;
    /// proxy.mark_next_sending(b"$9\r\nSUBSCRIBE\r\n")?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Config`] for an empty pattern; [`HarnessError::Timeout`] when the
    /// earlier mark's release does not apply within 3 s; [`HarnessError::NotRunning`] when
    /// the proxy thread is gone.
    pub fn mark_next_sending(&self, pattern: &[u8]) -> Result<(), HarnessError> {
        if pattern.is_empty() {
            return Err(HarnessError::Config(
                "an empty mark pattern would mark the next connection whatever it sends; give \
                 the bytes that single out the connection"
                    .into(),
            ));
        }
        *lock(&self.shared.mark) = Some(pattern.to_vec());
        self.switch(|control| control.marked = None, Close::None)
    }

    /// Gives the marked connection (see [`FaultProxy::mark_next_sending`]) a mode of its own:
    /// `Some(mode)` applies to it alone and at once ([`Mode::Refuse`] acts as [`Mode::Reset`]),
    /// `None` makes it follow the proxy's mode again. Set before the mark is taken, the mode
    /// applies from the chunk that takes it (that chunk is reset, held or dropped).
    ///
    /// # Examples
    ///
    /// See [`FaultProxy::mark_next_sending`].
    ///
    /// # Errors
    ///
    /// [`HarnessError::Timeout`] when the switch (or closing the marked connection) does not
    /// apply within 3 s; [`HarnessError::NotRunning`] when the proxy thread is gone.
    pub fn set_marked_mode(&self, mode: Option<Mode>) -> Result<(), HarnessError> {
        let close = if mode.is_some_and(|m| m.closes_connections()) {
            Close::Marked
        } else {
            Close::None
        };
        self.switch(|control| control.marked_mode = mode, close)
    }

    /// How many times an armed mark was taken (see [`FaultProxy::mark_next_sending`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let server = slate_harness::server::RedisServer::start()?;
    /// let proxy = slate_harness::proxy::FaultProxy::start(server.addr())?;
    /// assert_eq!(proxy.marks_taken(), 0);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn marks_taken(&self) -> u64 {
        self.shared.marks_taken.load(Ordering::SeqCst)
    }

    /// Closes every currently open connection with a TCP RST, keeping the mode (new
    /// connections are served as usual).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let server = slate_harness::server::RedisServer::start()?;
    /// let proxy = slate_harness::proxy::FaultProxy::start(server.addr())?;
    /// proxy.reset_all()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Timeout`] when the connections do not close within 3 s;
    /// [`HarnessError::NotRunning`] when the proxy thread is gone.
    pub fn reset_all(&self) -> Result<(), HarnessError> {
        self.switch(|control| control.reset_epoch += 1, Close::All)
    }

    fn switch(&self, change: impl FnOnce(&mut Control), close: Close) -> Result<(), HarnessError> {
        // Registration of new connections happens under the same lock, so the snapshot holds
        // exactly the connections that predate this switch.
        let (seq, must_close) = {
            let live = lock(&self.shared.live);
            let mut seq = 0;
            let mut marked = None;
            self.shared.control.send_modify(|control| {
                change(control);
                control.seq += 1;
                seq = control.seq;
                marked = control.marked;
            });
            let must_close: Vec<u64> = match close {
                Close::All => live.keys().copied().collect(),
                Close::Marked => marked
                    .filter(|id| live.contains_key(id))
                    .into_iter()
                    .collect(),
                Close::None => Vec::new(),
            };
            (seq, must_close)
        };
        self.wait_ack(seq)?;
        let live = lock(&self.shared.live);
        let (live, timeout) = self
            .shared
            .live_changed
            .wait_timeout_while(live, APPLY_TIMEOUT, |live| {
                must_close.iter().any(|id| live.contains_key(id))
            })
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if timeout.timed_out() {
            let left = must_close.iter().filter(|id| live.contains_key(id)).count();
            return Err(HarnessError::Timeout {
                what: format!("{left} proxied connection(s) did not close"),
            });
        }
        Ok(())
    }

    fn wait_ack(&self, seq: u64) -> Result<(), HarnessError> {
        let ack = lock(&self.shared.ack);
        let (ack, timeout) = self
            .shared
            .ack_changed
            .wait_timeout_while(ack, APPLY_TIMEOUT, |ack| {
                ack.0 < seq && !*lock(&self.shared.done)
            })
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(error) = &ack.1 {
            return Err(HarnessError::Io {
                what: format!("proxy on port {}", self.shared.port),
                source: std::io::Error::other(error.clone()),
            });
        }
        if ack.0 >= seq {
            Ok(())
        } else if timeout.timed_out() {
            Err(HarnessError::Timeout {
                what: format!("proxy on port {} applying a mode switch", self.shared.port),
            })
        } else {
            Err(HarnessError::NotRunning {
                what: format!("proxy on port {}", self.shared.port),
            })
        }
    }

    /// Connections accepted so far (including ones reset at once).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let server = slate_harness::server::RedisServer::start()?;
    /// let proxy = slate_harness::proxy::FaultProxy::start(server.addr())?;
    /// assert_eq!(proxy.connections_accepted(), 0);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn connections_accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Connections currently open through the proxy.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let server = slate_harness::server::RedisServer::start()?;
    /// let proxy = slate_harness::proxy::FaultProxy::start(server.addr())?;
    /// assert_eq!(proxy.open_connections(), 0);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn open_connections(&self) -> usize {
        lock(&self.shared.live).len()
    }

    /// Bytes written to the upstream so far.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let server = slate_harness::server::RedisServer::start()?;
    /// let proxy = slate_harness::proxy::FaultProxy::start(server.addr())?;
    /// assert_eq!(proxy.bytes_to_server(), 0);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn bytes_to_server(&self) -> u64 {
        self.shared.to_server.load(Ordering::SeqCst)
    }

    /// Bytes written to clients so far (dropped replies are not counted).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let server = slate_harness::server::RedisServer::start()?;
    /// let proxy = slate_harness::proxy::FaultProxy::start(server.addr())?;
    /// assert_eq!(proxy.bytes_to_client(), 0);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn bytes_to_client(&self) -> u64 {
        self.shared.to_client.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared
            .control
            .send_modify(|control| control.shutdown = true);
        let done = lock(&self.shared.done);
        let (done, _) = self
            .shared
            .done_changed
            .wait_timeout_while(done, STOP_TIMEOUT, |done| !*done)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let finished = *done;
        drop(done);
        if let Some(thread) = self.thread.take() {
            if finished {
                let _ = thread.join();
            } else {
                eprintln!(
                    "ecosphere proxy on port {}: thread did not stop within {STOP_TIMEOUT:?}; \
                     leaving it detached",
                    self.shared.port
                );
            }
        }
    }
}

/// Which open connections a switch waits to see closed.
#[derive(Debug, Clone, Copy)]
enum Close {
    None,
    All,
    Marked,
}

/// Listen backlog of the proxy port.
const LISTEN_BACKLOG: u32 = 1024;

/// A socket bound to `port` on loopback (0: any free port) with `SO_REUSEPORT`, so that a
/// second one can hold the port while the first stops listening.
fn port_socket(port: u16) -> std::io::Result<TcpSocket> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.set_reuseport(true)?;
    socket.bind((Ipv4Addr::LOCALHOST, port).into())?;
    Ok(socket)
}

/// Accepts connections and keeps the listener in line with the mode.
///
/// Under [`Mode::Refuse`] the port stays bound by a socket that does not listen (connects are
/// refused), so that no other socket (an outgoing connection given it as its ephemeral port,
/// another test's server) can take it meanwhile and make the proxy unable to listen again.
async fn accept_loop(
    shared: Arc<Shared>,
    listener: TcpListener,
    mut control: watch::Receiver<Control>,
) -> std::io::Result<()> {
    let mut listener = Some(listener);
    let mut held: Option<TcpSocket> = None;
    loop {
        let current = *control.borrow_and_update();
        if current.shutdown {
            return Ok(());
        }
        let mut error = None;
        match (current.mode == Mode::Refuse, listener.is_some()) {
            (true, true) => {
                held = port_socket(shared.port).ok();
                listener = None;
            }
            (false, false) => {
                let bound = match held.take() {
                    Some(socket) => socket.listen(LISTEN_BACKLOG),
                    None => rebind(shared.port).await,
                };
                match bound {
                    Ok(bound) => listener = Some(bound),
                    Err(err) => error = Some(format!("rebinding port {}: {err}", shared.port)),
                }
            }
            _ => {}
        }
        shared.acknowledge(current.seq, error);
        let Some(bound) = listener.as_ref() else {
            if control.changed().await.is_err() {
                return Ok(());
            }
            continue;
        };
        tokio::select! {
            accepted = bound.accept() => {
                // A failed accept (e.g. the peer gave up) concerns that connection only.
                if let Ok((client, _)) = accepted {
                    shared.accepted.fetch_add(1, Ordering::SeqCst);
                    let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
                    let epoch = {
                        let mut live = lock(&shared.live);
                        let epoch = control.borrow().reset_epoch;
                        live.insert(id, epoch);
                        epoch
                    };
                    tokio::spawn(connection(Arc::clone(&shared), client, control.clone(), id, epoch));
                }
            }
            changed = control.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
            }
        }
    }
}

async fn rebind(port: u16) -> std::io::Result<TcpListener> {
    let mut tries = 0;
    loop {
        tries += 1;
        match port_socket(port).and_then(|s| s.listen(LISTEN_BACKLOG)) {
            Ok(listener) => return Ok(listener),
            Err(err) if tries >= REBIND_TRIES => return Err(err),
            Err(_) => tokio::time::sleep(REBIND_PAUSE).await,
        }
    }
}

/// Whether connection `id` must close now.
fn must_reset(control: &Control, id: u64, epoch: u64) -> bool {
    control.shutdown || control.reset_epoch != epoch || control.mode_of(id).closes_connections()
}

/// Serves one client connection until it ends or is reset.
async fn connection(
    shared: Arc<Shared>,
    client: TcpStream,
    control: watch::Receiver<Control>,
    id: u64,
    epoch: u64,
) {
    if must_reset(&control.borrow(), id, epoch) {
        let _ = client.set_zero_linger();
        drop(client);
        shared.unregister(id);
        return;
    }
    let upstream = tokio::time::timeout(
        UPSTREAM_CONNECT_TIMEOUT,
        TcpStream::connect(shared.upstream),
    )
    .await;
    let Ok(Ok(server)) = upstream else {
        // The node is unreachable: the client sees a reset, as if the node were down.
        let _ = client.set_zero_linger();
        drop(client);
        shared.unregister(id);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();

    let mut reset_watch = control.clone();
    let reset = async move {
        loop {
            if must_reset(&reset_watch.borrow_and_update(), id, epoch) {
                return;
            }
            if reset_watch.changed().await.is_err() {
                return;
            }
        }
    };
    let pumps = async {
        // When one direction fails the other is abandoned: the connection is over.
        let _ = tokio::try_join!(
            pump(
                &mut client_read,
                &mut server_write,
                Direction::ToServer,
                control.clone(),
                (shared.as_ref(), id),
            ),
            pump(
                &mut server_read,
                &mut client_write,
                Direction::ToClient,
                control.clone(),
                (shared.as_ref(), id),
            ),
        );
    };
    let was_reset = tokio::select! {
        () = pumps => false,
        () = reset => true,
    };
    if was_reset {
        // Zero linger turns the close into an RST; `forget` skips the FIN a write half
        // would otherwise send on drop.
        let _ = client_read.as_ref().set_zero_linger();
        let _ = server_read.as_ref().set_zero_linger();
        client_write.forget();
        server_write.forget();
    }
    drop(client_read);
    drop(server_read);
    shared.unregister(id);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToServer,
    ToClient,
}

impl Direction {
    /// When a chunk read now should be written, or `None` to drop it, or `Err(())` to hold it.
    fn schedule(self, mode: Mode) -> Result<Option<Instant>, ()> {
        let now = Instant::now();
        match (mode, self) {
            (Mode::Blackhole | Mode::Reset | Mode::Refuse, _) => Err(()),
            (Mode::DropReplies, Direction::ToClient) => Ok(None),
            (Mode::Delay { to_server, .. }, Direction::ToServer) => Ok(Some(now + to_server)),
            (Mode::Delay { to_client, .. }, Direction::ToClient) => Ok(Some(now + to_client)),
            _ => Ok(Some(now)),
        }
    }
}

/// Moves bytes one way for connection `id`: a reader that judges each chunk by the mode (a
/// request may first take the armed mark), and a writer that writes it when due. On end of
/// input it half-closes the destination.
async fn pump(
    src: &mut OwnedReadHalf,
    dst: &mut OwnedWriteHalf,
    direction: Direction,
    control: watch::Receiver<Control>,
    (shared, id): (&Shared, u64),
) -> std::io::Result<()> {
    let counter = match direction {
        Direction::ToServer => &shared.to_server,
        Direction::ToClient => &shared.to_client,
    };
    let (queue, mut due_chunks) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUE_CHUNKS);
    let mut reader_control = control.clone();
    let reader = async move {
        let mut buf = vec![0_u8; 16 * 1024];
        loop {
            let n = src.read(&mut buf).await?;
            if n == 0 {
                return Ok::<(), std::io::Error>(());
            }
            if direction == Direction::ToServer {
                shared.take_mark(id, &buf[..n]);
            }
            let due = loop {
                let mode = reader_control.borrow_and_update().mode_of(id);
                match direction.schedule(mode) {
                    Ok(due) => break due,
                    // Held (blackhole) until the mode changes; a reset ends the connection
                    // from the outside.
                    Err(()) => {
                        if reader_control.changed().await.is_err() {
                            return Ok(());
                        }
                    }
                }
            };
            if let Some(due) = due
                && queue.send((due, buf[..n].to_vec())).await.is_err()
            {
                return Ok(());
            }
        }
    };
    let mut writer_control = control;
    let writer = async move {
        while let Some((due, bytes)) = due_chunks.recv().await {
            tokio::time::sleep_until(due).await;
            while writer_control.borrow_and_update().mode_of(id) == Mode::Blackhole {
                if writer_control.changed().await.is_err() {
                    return Ok(());
                }
            }
            dst.write_all(&bytes).await?;
            counter.fetch_add(bytes.len() as u64, Ordering::SeqCst);
        }
        dst.shutdown().await
    };
    let (read, write) = tokio::join!(reader, writer);
    read.and(write)
}
