//! Real `redis-server` processes for tests, and the faults they can suffer.
//!
//! [`RedisServer`] starts one `redis-server` on a free loopback port, with its own temporary
//! directory, config file, log file and Unix socket, and waits until it answers `PING`. The API is
//! synchronous (plain `std`), so it works the same from `#[test]` and `#[tokio::test]`.
//!
//! ## Behaviour
//!
//! - The server is Redis or Valkey, chosen by `SLATE_SERVER` ([`ServerKind::from_env`]). The
//!   binary is, in order: [`ServerBuilder::binary`], the `SLATE_REDIS_SERVER` environment
//!   variable, the kind's binary (`redis-server` or `valkey-server`) on `PATH`. When none
//!   exists, starting fails with an install hint; tests never skip. A binary that is not the
//!   chosen kind (`SLATE_SERVER=valkey` with a Redis binary) is refused: the pass must test
//!   what it says. [`RedisServer::version`] tells a scenario which server and version it runs.
//! - The port is found by binding `127.0.0.1:0`; if another process takes it before
//!   `redis-server` binds, the start is retried on a new port (bounded).
//! - The harness talks to the server for its own needs (readiness, [`RedisServer::command`],
//!   [`RedisServer::debug_sleep`], ...) over the server's Unix socket, as the default user. That
//!   path works the same with TLS and ignores any [`crate::proxy::FaultProxy`] in front of the
//!   TCP port.
//! - Faults: [`RedisServer::pause`] / [`RedisServer::resume`] (`SIGSTOP` / `SIGCONT`),
//!   [`RedisServer::kill`] (`SIGKILL`), [`RedisServer::restart`] on the same port,
//!   [`RedisServer::debug_sleep`], [`RedisServer::client_pause`].
//! - Signals only ever go to the PID of the [`std::process::Child`] this value spawned, and only
//!   while that child is not yet reaped (so the PID cannot have been reused).
//! - `Drop` kills and reaps the process; when the thread is panicking it first prints the last
//!   lines of the server log to stderr.

mod error;
mod kind;
mod tls;

pub use error::HarnessError;
pub use kind::{KIND_ENV, ServerKind, ServerVersion};

use std::fmt::Write as _;
use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use redis::{ConnectionAddr, IntoConnectionInfo, RedisConnectionInfo};

/// The environment variable that overrides the `redis-server` binary path.
pub const BINARY_ENV: &str = "SLATE_REDIS_SERVER";

/// How many fresh ports a start tries when another process wins the race for the port.
const PORT_ATTEMPTS: usize = 8;
/// How long a restart keeps retrying its fixed port while something else holds it.
const RESTART_PORT_WAIT: Duration = Duration::from_secs(5);
/// Poll interval of the readiness wait.
const READY_POLL: Duration = Duration::from_millis(20);
/// Timeout of one readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// Timeout of [`RedisServer::connection`].
const ADMIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Lines of log printed when a test panics.
const PANIC_LOG_LINES: usize = 30;

/// Whether the server writes its data to disk.
///
/// # Examples
///
/// ```no_run
/// use slate_harness::server::{Persistence, RedisServer};
///
/// let server = RedisServer::builder().persistence(Persistence::Aof).start()?;
/// # Ok::<(), slate_harness::server::HarnessError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Persistence {
    /// Nothing is written: `save ""`, `appendonly no`. A killed server comes back empty.
    #[default]
    Off,
    /// `appendonly yes` with `appendfsync always`: every acknowledged write survives a `SIGKILL`.
    Aof,
}

/// What [`RedisServer::restart`] does with the data directory.
///
/// # Examples
///
/// ```no_run
/// use slate_harness::server::{Data, RedisServer};
///
/// let mut server = RedisServer::start()?;
/// server.kill()?;
/// server.restart(Data::Wipe)?;
/// # Ok::<(), slate_harness::server::HarnessError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Data {
    /// Keep the data directory, so the server reloads its AOF/RDB files (if it wrote any).
    Keep,
    /// Delete the data files first: the server comes back with an empty keyspace.
    Wipe,
}

#[derive(Debug, Clone)]
struct AclUser {
    name: String,
    password: String,
    rules: String,
}

/// Configures a [`RedisServer`] before it starts.
///
/// Defaults: no persistence, no password, no ACL users, no TLS, `DEBUG` enabled for local
/// connections, a 10 s start timeout.
///
/// # Examples
///
/// ```no_run
/// use slate_harness::server::{Persistence, RedisServer};
///
/// let server = RedisServer::builder()
///     .persistence(Persistence::Aof)
///     .password("s3cret")
///     .acl_user("worker", "w0rker", "~slate:* &slate:* +@all -@dangerous")
///     .arg("maxclients", "1000")
///     .start()?;
/// println!("{}", server.url());
/// # Ok::<(), slate_harness::server::HarnessError>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct ServerBuilder {
    binary: Option<PathBuf>,
    persistence: Persistence,
    password: Option<String>,
    acl_users: Vec<AclUser>,
    tls: bool,
    debug_command: bool,
    extra: Vec<(String, String)>,
    start_timeout: Duration,
    sentinel: bool,
}

impl Default for ServerBuilder {
    fn default() -> Self {
        Self {
            binary: None,
            persistence: Persistence::Off,
            password: None,
            acl_users: Vec::new(),
            tls: false,
            debug_command: true,
            extra: Vec::new(),
            start_timeout: Duration::from_secs(10),
            sentinel: false,
        }
    }
}

impl ServerBuilder {
    /// A builder with the defaults (same as [`RedisServer::builder`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::ServerBuilder::new().start()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses this `redis-server` binary, ahead of `SLATE_REDIS_SERVER` and `PATH`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::builder()
    ///     .binary("/usr/bin/redis-server")
    ///     .start()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// Chooses whether the server persists its data (see [`Persistence`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use slate_harness::server::{Persistence, RedisServer};
    ///
    /// let server = RedisServer::builder().persistence(Persistence::Aof).start()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn persistence(mut self, persistence: Persistence) -> Self {
        self.persistence = persistence;
        self
    }

    /// Requires this password for the default user (`requirepass`).
    ///
    /// [`RedisServer::url`] then carries it, and the harness's own connections use it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::builder().password("s3cret").start()?;
    /// assert!(server.url().contains(":s3cret@"));
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Adds an ACL user: `user NAME on >PASSWORD RULES...`.
    ///
    /// `rules` is split on whitespace into ACL rules, e.g.
    /// `"~slate:* &slate:* +@all -@dangerous"`. Connect as this user with
    /// [`RedisServer::url_for_user`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::builder()
    ///     .acl_user("worker", "pw", "~slate:* +@all -@dangerous")
    ///     .start()?;
    /// let url = server.url_for_user("worker", "pw");
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn acl_user(
        mut self,
        name: impl Into<String>,
        password: impl Into<String>,
        rules: impl Into<String>,
    ) -> Self {
        self.acl_users.push(AclUser {
            name: name.into(),
            password: password.into(),
            rules: rules.into(),
        });
        self
    }

    /// Serves TLS only: a fresh test CA and server certificate are generated into the server's
    /// directory (with the `openssl` CLI), `tls-port` gets the port and the plain port is off.
    ///
    /// Clients must trust [`RedisServer::ca_cert_path`]; no client certificate is required.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::builder().tls(true).start()?;
    /// assert!(server.url().starts_with("rediss://"));
    /// let ca = server.ca_cert_path();
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn tls(mut self, enabled: bool) -> Self {
        self.tls = enabled;
        self
    }

    /// Allows `DEBUG` from local connections (`enable-debug-command local`); on by default.
    ///
    /// [`RedisServer::debug_sleep`] needs it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::builder()
    ///     .enable_debug_command(false)
    ///     .start()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn enable_debug_command(mut self, enabled: bool) -> Self {
        self.debug_command = enabled;
        self
    }

    /// Starts the process as a Redis Sentinel (`redis-server <conf> --sentinel`) instead of a
    /// data server. The config's `sentinel ...` lines come from [`arg`](Self::arg); see
    /// [`crate::sentinel::SentinelGroup`], which builds a whole group.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use slate_harness::server::RedisServer;
    ///
    /// let master = RedisServer::start()?;
    /// let sentinel = RedisServer::builder()
    ///     .sentinel_mode(true)
    ///     .arg("sentinel", format!("monitor m 127.0.0.1 {} 1", master.port()))
    ///     .start()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn sentinel_mode(mut self, enabled: bool) -> Self {
        self.sentinel = enabled;
        self
    }

    /// Appends a raw config line `KEY VALUE` (written as given, after the harness's own lines,
    /// so it wins over them).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::builder()
    ///     .arg("hz", "100")
    ///     .arg("save", "\"60 1\"")
    ///     .start()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn arg(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra.push((key.into(), value.into()));
        self
    }

    /// How long a start waits for `PING` to answer (default 10 s).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let server = slate_harness::server::RedisServer::builder()
    ///     .start_timeout(Duration::from_secs(30))
    ///     .start()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }

    /// Starts the server and waits until it answers `PING`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::builder().start()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::BinaryNotFound`] without a binary; [`HarnessError::Config`] for an
    /// unusable setting; [`HarnessError::Tls`] when certificates cannot be made;
    /// [`HarnessError::StartFailed`] when the server exits or does not answer in time (with its
    /// log tail); [`HarnessError::Io`] when the temp dir or files cannot be written.
    pub fn start(self) -> Result<RedisServer, HarnessError> {
        RedisServer::launch(self)
    }

    fn validate(&self) -> Result<(), HarnessError> {
        if self.password.as_deref() == Some("") {
            return Err(HarnessError::Config(
                "the password must not be empty".into(),
            ));
        }
        for user in &self.acl_users {
            if user.name.is_empty() || user.name.contains(char::is_whitespace) {
                return Err(HarnessError::Config(format!(
                    "ACL user name {:?} must be non-empty and without whitespace",
                    user.name
                )));
            }
            if user.rules.contains('"') || user.rules.contains('\'') {
                return Err(HarnessError::Config(format!(
                    "ACL rules {:?} must not contain quotes",
                    user.rules
                )));
            }
        }
        for (key, _) in &self.extra {
            if key.is_empty() || key.contains(char::is_whitespace) {
                return Err(HarnessError::Config(format!(
                    "config key {key:?} is not a word"
                )));
            }
        }
        Ok(())
    }
}

/// How one launch attempt ended, when it did not succeed.
enum LaunchError {
    /// Another process held the port: try again.
    PortInUse,
    /// Anything else: give up.
    Failed(HarnessError),
}

impl From<HarnessError> for LaunchError {
    fn from(err: HarnessError) -> Self {
        Self::Failed(err)
    }
}

/// One `redis-server` process on loopback, killed when dropped.
///
/// ## Behaviour
///
/// - Own temp dir (config, log, Unix socket, `data/`), removed on drop.
/// - [`RedisServer::kill`] then [`RedisServer::restart`] brings it back on the same port.
/// - See the [module docs](self) for how the harness reaches the server and which signals it
///   sends.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
///
/// use slate_harness::server::{Data, RedisServer};
///
/// let mut server = RedisServer::start()?;
/// server.command(&["SET", "k", "v"])?;
/// server.pause()?; // a hung node
/// server.resume()?;
/// server.kill()?; // a crashed node
/// server.restart(Data::Wipe)?; // ... that comes back empty
/// server.debug_sleep(Duration::from_millis(200))?; // a slow node
/// # Ok::<(), slate_harness::server::HarnessError>(())
/// ```
#[derive(Debug)]
pub struct RedisServer {
    config: ServerBuilder,
    binary: PathBuf,
    version: ServerVersion,
    port: u16,
    conf_path: PathBuf,
    log_path: PathBuf,
    socket_path: PathBuf,
    data_dir: PathBuf,
    tls: Option<tls::TlsFiles>,
    child: Option<Child>,
    pid: u32,
    /// Dropped last: the directory goes away after the process is dead.
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server with the default configuration (see [`ServerBuilder`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::start()?;
    /// assert_eq!(server.command(&["PING"])?, redis::Value::SimpleString("PONG".into()));
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`ServerBuilder::start`].
    pub fn start() -> Result<Self, HarnessError> {
        ServerBuilder::default().start()
    }

    /// A builder for a server with persistence, passwords, ACL users, TLS or extra config.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use slate_harness::server::{Persistence, RedisServer};
    ///
    /// let server = RedisServer::builder().persistence(Persistence::Aof).start()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }

    /// Starts `n` independent default servers concurrently.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let nodes = slate_harness::server::RedisServer::start_many(3)?;
    /// assert_eq!(nodes.len(), 3);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// The first start error; the servers that did start are killed.
    pub fn start_many(n: usize) -> Result<Vec<Self>, HarnessError> {
        Self::start_many_with(n, &ServerBuilder::default())
    }

    /// Starts `n` independent servers configured by `builder`, concurrently.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use slate_harness::server::{Persistence, RedisServer};
    ///
    /// let builder = RedisServer::builder().persistence(Persistence::Aof);
    /// let nodes = RedisServer::start_many_with(5, &builder)?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// The first start error; the servers that did start are killed.
    pub fn start_many_with(n: usize, builder: &ServerBuilder) -> Result<Vec<Self>, HarnessError> {
        let results: Vec<Result<Self, HarnessError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..n)
                .map(|_| {
                    let builder = builder.clone();
                    scope.spawn(move || builder.start())
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| {
                    handle.join().unwrap_or_else(|_| {
                        Err(HarnessError::NotRunning {
                            what: "a server start thread panicked".into(),
                        })
                    })
                })
                .collect()
        });
        results.into_iter().collect()
    }

    fn launch(config: ServerBuilder) -> Result<Self, HarnessError> {
        config.validate()?;
        let binary = resolve_binary(config.binary.as_deref())?;
        let version = match config.binary {
            Some(_) => kind::probe(&binary)?,
            None => chosen_version()?,
        };
        let dir = tempfile::Builder::new()
            .prefix("slate-redis-")
            .tempdir()
            .map_err(HarnessError::io("creating the server temp dir"))?;
        let data_dir = dir.path().join("data");
        fs::create_dir(&data_dir).map_err(HarnessError::io("creating the data dir"))?;
        let tls = if config.tls {
            Some(tls::generate(dir.path())?)
        } else {
            None
        };
        let mut server = Self {
            binary,
            version,
            port: 0,
            conf_path: dir.path().join("redis.conf"),
            log_path: dir.path().join("redis.log"),
            socket_path: dir.path().join("redis.sock"),
            data_dir,
            tls,
            child: None,
            pid: 0,
            config,
            dir,
        };
        for attempt in 1..=PORT_ATTEMPTS {
            server.port = free_port()?;
            match server.spawn_and_wait(attempt) {
                Ok(()) => return Ok(server),
                Err(LaunchError::PortInUse) => continue,
                Err(LaunchError::Failed(err)) => return Err(err),
            }
        }
        Err(HarnessError::StartFailed {
            port: server.port,
            reason: format!("every port was taken by another process ({PORT_ATTEMPTS} tries)"),
            log_tail: server.log_tail(PANIC_LOG_LINES),
        })
    }

    fn render_config(&self) -> String {
        let c = &self.config;
        let mut conf = String::new();
        let mut line = |text: String| {
            conf.push_str(&text);
            conf.push('\n');
        };
        line("# written by slate_harness::server".into());
        line("bind 127.0.0.1".into());
        line("protected-mode no".into());
        match &self.tls {
            None => line(format!("port {}", self.port)),
            Some(files) => {
                line("port 0".into());
                line(format!("tls-port {}", self.port));
                line(format!(
                    "tls-cert-file {}",
                    quote(&files.server_cert.to_string_lossy())
                ));
                line(format!(
                    "tls-key-file {}",
                    quote(&files.server_key.to_string_lossy())
                ));
                line(format!(
                    "tls-ca-cert-file {}",
                    quote(&files.ca_cert.to_string_lossy())
                ));
                line("tls-auth-clients no".into());
            }
        }
        line(format!(
            "unixsocket {}",
            quote(&self.socket_path.to_string_lossy())
        ));
        line("unixsocketperm 700".into());
        line("daemonize no".into());
        line("supervised no".into());
        line("logfile \"\"".into());
        line("loglevel notice".into());
        line("always-show-logo no".into());
        line(format!("dir {}", quote(&self.data_dir.to_string_lossy())));
        line("save \"\"".into());
        match c.persistence {
            Persistence::Off => line("appendonly no".into()),
            Persistence::Aof => {
                line("appendonly yes".into());
                line("appendfsync always".into());
            }
        }
        line(format!(
            "enable-debug-command {}",
            if c.debug_command { "local" } else { "no" }
        ));
        if let Some(password) = &c.password {
            line(format!("requirepass {}", quote(password)));
        }
        for user in &c.acl_users {
            line(format!(
                "user {} on {} {}",
                user.name,
                quote(&format!(">{}", user.password)),
                user.rules.split_whitespace().collect::<Vec<_>>().join(" ")
            ));
        }
        for (key, value) in &c.extra {
            line(format!("{key} {value}"));
        }
        conf
    }

    /// Writes the config, spawns `redis-server` and waits for `PONG`.
    fn spawn_and_wait(&mut self, attempt: usize) -> Result<(), LaunchError> {
        fs::write(&self.conf_path, self.render_config())
            .map_err(HarnessError::io("writing redis.conf"))?;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .map_err(HarnessError::io("opening the server log"))?;
        // Marks where this attempt's output begins, so an old "Address already in use" is not
        // mistaken for a new one.
        writeln!(
            log,
            "=== ecosphere: starting {} on 127.0.0.1:{} (attempt {attempt}) ===",
            self.binary.display(),
            self.port
        )
        .map_err(HarnessError::io("writing the server log"))?;
        let log_start = log
            .metadata()
            .map_err(HarnessError::io("reading the server log size"))?
            .len();
        let stderr = log
            .try_clone()
            .map_err(HarnessError::io("duplicating the log handle"))?;
        let mut command = Command::new(&self.binary);
        command.arg(&self.conf_path);
        if self.config.sentinel {
            command.arg("--sentinel");
        }
        let child = command
            .args(["--daemonize", "no"])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .map_err(HarnessError::io(format!(
                "spawning {}",
                self.binary.display()
            )))?;
        self.pid = child.id();
        self.child = Some(child);
        self.wait_ready(log_start)
    }

    fn wait_ready(&mut self, log_start: u64) -> Result<(), LaunchError> {
        let timeout = self.config.start_timeout;
        let deadline = Instant::now() + timeout;
        loop {
            let exited = match self.child.as_mut() {
                Some(child) => child
                    .try_wait()
                    .map_err(HarnessError::io("polling the server process"))?,
                None => None,
            };
            if let Some(status) = exited {
                self.child = None;
                let output = self.log_since(log_start);
                if output.contains("Address already in use") {
                    return Err(LaunchError::PortInUse);
                }
                return Err(LaunchError::Failed(HarnessError::StartFailed {
                    port: self.port,
                    reason: format!("redis-server exited with {status}"),
                    log_tail: self.log_tail(PANIC_LOG_LINES),
                }));
            }
            let last_error = match self.ping(PROBE_TIMEOUT) {
                Ok(()) => return Ok(()),
                Err(err) => err.to_string(),
            };
            if Instant::now() >= deadline {
                self.kill_child();
                return Err(LaunchError::Failed(HarnessError::StartFailed {
                    port: self.port,
                    reason: format!("no PONG within {timeout:?}; last probe: {last_error}"),
                    log_tail: self.log_tail(PANIC_LOG_LINES),
                }));
            }
            std::thread::sleep(READY_POLL);
        }
    }

    fn ping(&self, timeout: Duration) -> Result<(), HarnessError> {
        let mut con = self.connection_with_timeout(timeout)?;
        let reply: String = redis::cmd("PING")
            .query(&mut con)
            .map_err(HarnessError::redis("PING"))?;
        if reply == "PONG" {
            Ok(())
        } else {
            Err(HarnessError::Config(format!("PING answered {reply:?}")))
        }
    }

    fn log_since(&self, offset: u64) -> String {
        let bytes = fs::read(&self.log_path).unwrap_or_default();
        let start = usize::try_from(offset).unwrap_or(0).min(bytes.len());
        String::from_utf8_lossy(&bytes[start..]).into_owned()
    }

    /// SIGKILLs and reaps the child, if any. Returns whether one was running.
    fn kill_child(&mut self) -> bool {
        match self.child.take() {
            Some(mut child) => {
                // `Child::kill` is SIGKILL; on a child that already exited (unreaped) it is a
                // no-op, and the PID cannot be reused before `wait` below reaps it.
                let _ = child.kill();
                let _ = child.wait();
                true
            }
            None => false,
        }
    }

    /// Which server this is and its version (from `<binary> --version`): for the scenarios
    /// whose expectations legitimately differ between Redis and Valkey or across versions.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::start()?;
    /// println!("running against {}", server.version());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn version(&self) -> ServerVersion {
        self.version
    }

    /// One field of `INFO <section>` (`None` when the server does not report it).
    ///
    /// # Errors
    ///
    /// When the server does not answer.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::start()?;
    /// let role = server.info_field("replication", "role")?;
    /// assert_eq!(role.as_deref(), Some("master"));
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn info_field(&self, section: &str, name: &str) -> Result<Option<String>, HarnessError> {
        let text = value_text(&self.command(&["INFO", section])?)?;
        Ok(text.lines().find_map(|line| {
            line.trim_end()
                .strip_prefix(name)
                .and_then(|rest| rest.strip_prefix(':'))
                .map(str::to_owned)
        }))
    }

    /// How many clients are subscribed to `channel` on this server (`PUBSUB NUMSUB`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::start()?;
    /// assert_eq!(server.subscribers("slate:{a}:released")?, 0);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError`] when the command fails or its answer is not a channel and a count.
    pub fn subscribers(&self, channel: &str) -> Result<i64, HarnessError> {
        match self.command(&["PUBSUB", "NUMSUB", channel])? {
            redis::Value::Array(v) if v.len() == 2 => match v[1] {
                redis::Value::Int(n) => Ok(n),
                ref other => Err(HarnessError::Config(format!(
                    "PUBSUB NUMSUB answered a count of {other:?}"
                ))),
            },
            other => Err(HarnessError::Config(format!(
                "PUBSUB NUMSUB answered {other:?}"
            ))),
        }
    }

    /// How many times the server ran these commands so far (`INFO commandstats` `calls=`,
    /// summed; commands run inside Lua scripts included, lower-case names as Redis reports
    /// them, e.g. `["evalsha", "eval"]`). 0 for a command never run.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::start()?;
    /// server.command(&["PING"])?;
    /// assert!(server.command_calls(&["ping"])? >= 1);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError`] when `INFO` fails.
    pub fn command_calls(&self, commands: &[&str]) -> Result<u64, HarnessError> {
        let mut total = 0;
        for command in commands {
            if let Some(stats) = self.info_field("commandstats", &format!("cmdstat_{command}"))? {
                total += stats
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("calls="))
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0);
            }
        }
        Ok(total)
    }

    /// The binary this server runs.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::start()?;
    /// println!("{}", server.binary().display());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The URL for the default user: `redis://127.0.0.1:PORT`, with `:PASSWORD@` when a password
    /// is set, and `rediss://` with TLS.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::start()?;
    /// let client = redis::Client::open(server.url())?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn url(&self) -> String {
        match &self.config.password {
            Some(password) => format!(
                "{}://:{}@127.0.0.1:{}",
                self.scheme(),
                percent_encode(password),
                self.port
            ),
            None => format!("{}://127.0.0.1:{}", self.scheme(), self.port),
        }
    }

    /// The URL that logs in as `user` with `password` (e.g. an [`ServerBuilder::acl_user`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::builder()
    ///     .acl_user("worker", "pw", "~slate:* +@all")
    ///     .start()?;
    /// assert!(server.url_for_user("worker", "pw").contains("worker:pw@"));
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn url_for_user(&self, user: &str, password: &str) -> String {
        format!(
            "{}://{}:{}@127.0.0.1:{}",
            self.scheme(),
            percent_encode(user),
            percent_encode(password),
            self.port
        )
    }

    fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        }
    }

    /// The loopback port clients connect to (the TLS port with TLS). It survives restarts.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::start()?;
    /// assert_ne!(server.port(), 0);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:PORT`, e.g. the upstream of a [`crate::proxy::FaultProxy`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::start()?;
    /// let proxy = slate_harness::proxy::FaultProxy::start(server.addr())?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The PID of the current process, or of the last one after [`RedisServer::kill`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::start()?;
    /// println!("redis-server pid {}", server.pid());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process is still alive (a paused process counts as alive).
    ///
    /// Reaps it if it has exited.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut server = slate_harness::server::RedisServer::start()?;
    /// assert!(server.is_running());
    /// server.kill()?;
    /// assert!(!server.is_running());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                self.child = None;
                false
            }
            None => false,
        }
    }

    /// The server's temp dir (config, log, socket, TLS files, `data/`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::start()?;
    /// assert!(server.dir().join("redis.conf").exists());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The data directory (`dir` of the config): AOF and RDB files live here.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::start()?;
    /// assert!(server.data_dir().starts_with(server.dir()));
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The log file: the server's stdout and stderr, across restarts.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::start()?;
    /// assert!(server.log_path().exists());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The Unix socket the harness uses to reach the server.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::start()?;
    /// let url = format!("redis+unix://{}", server.socket_path().display());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// The test CA certificate (PEM) that signed the server certificate, when TLS is on.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::builder().tls(true).start()?;
    /// assert!(server.ca_cert_path().is_some());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn ca_cert_path(&self) -> Option<&Path> {
        self.tls.as_ref().map(|files| files.ca_cert.as_path())
    }

    /// The last `n` lines of the log (lossy UTF-8; empty if it cannot be read).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::start()?;
    /// println!("{}", server.log_tail(20));
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn log_tail(&self, n: usize) -> String {
        let text = fs::read(&self.log_path)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// `run_id` from `INFO server`: it changes on every restart.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use slate_harness::server::{Data, RedisServer};
    ///
    /// let mut server = RedisServer::start()?;
    /// let before = server.run_id()?;
    /// server.restart(Data::Keep)?;
    /// assert_ne!(before, server.run_id()?);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Redis`] when `INFO` fails; [`HarnessError::Config`] when it has no
    /// `run_id`.
    pub fn run_id(&self) -> Result<String, HarnessError> {
        let mut con = self.connection()?;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query(&mut con)
            .map_err(HarnessError::redis("INFO server"))?;
        info.lines()
            .find_map(|line| line.strip_prefix("run_id:"))
            .map(|id| id.trim().to_owned())
            .ok_or_else(|| HarnessError::Config("INFO server has no run_id".into()))
    }

    /// A connection for the test itself, with 2 s connect/read/write timeouts.
    ///
    /// It goes over the Unix socket as the default user (password applied), so it works with
    /// TLS and bypasses any proxy.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::start()?;
    /// let mut con = server.connection()?;
    /// let _: () = redis::cmd("SET").arg("k").arg(1).query(&mut con)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Redis`] when the connection or its handshake fails or times out.
    pub fn connection(&self) -> Result<redis::Connection, HarnessError> {
        self.connection_with_timeout(ADMIN_TIMEOUT)
    }

    /// Like [`RedisServer::connection`], with `timeout` for connect, reads and writes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let server = slate_harness::server::RedisServer::start()?;
    /// let con = server.connection_with_timeout(Duration::from_millis(300))?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Redis`] when the connection or its handshake fails or times out.
    pub fn connection_with_timeout(
        &self,
        timeout: Duration,
    ) -> Result<redis::Connection, HarnessError> {
        let what = || format!("connecting to {}", self.socket_path.display());
        let mut settings = RedisConnectionInfo::default().set_skip_set_lib_name();
        if let Some(password) = &self.config.password {
            settings = settings.set_password(password);
        }
        let info = ConnectionAddr::Unix(self.socket_path.clone())
            .into_connection_info()
            .map_err(HarnessError::redis(what()))?
            .set_redis_settings(settings);
        let client = redis::Client::open(info).map_err(HarnessError::redis(what()))?;
        let con = client
            .get_connection_with_timeout(timeout)
            .map_err(HarnessError::redis(what()))?;
        con.set_read_timeout(Some(timeout))
            .map_err(HarnessError::redis(what()))?;
        con.set_write_timeout(Some(timeout))
            .map_err(HarnessError::redis(what()))?;
        Ok(con)
    }

    /// Runs one command on a fresh [`RedisServer::connection`] and returns the reply.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = slate_harness::server::RedisServer::start()?;
    /// server.command(&["SET", "k", "v"])?;
    /// let value = server.command(&["GET", "k"])?;
    /// assert_eq!(value, redis::Value::BulkString(b"v".to_vec()));
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Config`] for an empty command; [`HarnessError::Redis`] for connection
    /// failures and error replies.
    pub fn command(&self, args: &[&str]) -> Result<redis::Value, HarnessError> {
        let (name, rest) = args
            .split_first()
            .ok_or_else(|| HarnessError::Config("empty command".into()))?;
        let mut cmd = redis::cmd(name);
        for arg in rest {
            cmd.arg(*arg);
        }
        let mut con = self.connection()?;
        cmd.query(&mut con)
            .map_err(HarnessError::redis(args.join(" ")))
    }

    fn running_pid(&mut self, what: &str) -> Result<Pid, HarnessError> {
        if !self.is_running() {
            return Err(HarnessError::NotRunning {
                what: format!("{what} redis-server on port {}", self.port),
            });
        }
        let raw = i32::try_from(self.pid)
            .map_err(|_| HarnessError::Config(format!("pid {} out of range", self.pid)))?;
        Ok(Pid::from_raw(raw))
    }

    /// Stops the process with `SIGSTOP`: connections stay open, nothing is answered (a hung
    /// node). Undo with [`RedisServer::resume`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut server = slate_harness::server::RedisServer::start()?;
    /// server.pause()?;
    /// // ... commands now time out ...
    /// server.resume()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::NotRunning`] after a kill; [`HarnessError::Signal`] if `kill(2)` fails.
    pub fn pause(&mut self) -> Result<(), HarnessError> {
        let pid = self.running_pid("pause")?;
        signal::kill(pid, Signal::SIGSTOP).map_err(HarnessError::signal("SIGSTOP redis-server"))
    }

    /// Continues a paused process with `SIGCONT`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut server = slate_harness::server::RedisServer::start()?;
    /// server.pause()?;
    /// server.resume()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::NotRunning`] after a kill; [`HarnessError::Signal`] if `kill(2)` fails.
    pub fn resume(&mut self) -> Result<(), HarnessError> {
        let pid = self.running_pid("resume")?;
        signal::kill(pid, Signal::SIGCONT).map_err(HarnessError::signal("SIGCONT redis-server"))
    }

    /// Kills the process with `SIGKILL` and reaps it: a crashed node. The port then refuses
    /// connections until [`RedisServer::restart`]. Does nothing if it is not running.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut server = slate_harness::server::RedisServer::start()?;
    /// server.kill()?;
    /// assert!(std::net::TcpStream::connect(server.addr()).is_err());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// None today; the `Result` leaves room for reporting a failed reap.
    pub fn kill(&mut self) -> Result<(), HarnessError> {
        self.kill_child();
        Ok(())
    }

    /// Starts the server again on the same port (killing it first if it still runs), keeping
    /// or wiping its data, and waits for `PING`.
    ///
    /// With [`Persistence::Aof`] and [`Data::Keep`] every acknowledged write is back; with
    /// [`Persistence::Off`] the keyspace is empty either way.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use slate_harness::server::{Data, Persistence, RedisServer};
    ///
    /// let mut server = RedisServer::builder().persistence(Persistence::Aof).start()?;
    /// server.command(&["SET", "k", "v"])?;
    /// server.kill()?;
    /// server.restart(Data::Keep)?;
    /// assert_eq!(server.command(&["GET", "k"])?, redis::Value::BulkString(b"v".to_vec()));
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Io`] when the data cannot be wiped; [`HarnessError::StartFailed`] when
    /// the server does not come back (including when another process keeps the port for 5 s).
    pub fn restart(&mut self, data: Data) -> Result<(), HarnessError> {
        self.kill_child();
        if data == Data::Wipe {
            fs::remove_dir_all(&self.data_dir).map_err(HarnessError::io("wiping the data dir"))?;
            fs::create_dir(&self.data_dir).map_err(HarnessError::io("recreating the data dir"))?;
        }
        let deadline = Instant::now() + RESTART_PORT_WAIT;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.spawn_and_wait(attempt) {
                Ok(()) => return Ok(()),
                Err(LaunchError::Failed(err)) => return Err(err),
                Err(LaunchError::PortInUse) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(LaunchError::PortInUse) => {
                    return Err(HarnessError::StartFailed {
                        port: self.port,
                        reason: format!(
                            "the port stayed in use for {RESTART_PORT_WAIT:?} ({attempt} tries)"
                        ),
                        log_tail: self.log_tail(PANIC_LOG_LINES),
                    });
                }
            }
        }
    }

    /// Sends `DEBUG SLEEP` on its own connection and returns at once: the server then answers
    /// nothing for `duration` (a slow node). The reply is read by a background thread.
    ///
    /// When this returns, the connection has completed one round trip with the server and the
    /// command has been written after it, so a command sent afterwards on an established
    /// connection is served after the sleep.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let server = slate_harness::server::RedisServer::start()?;
    /// server.debug_sleep(Duration::from_millis(500))?;
    /// // ... the next command waits about 500 ms ...
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Config`] when `DEBUG` is disabled or the handshake (`AUTH` or `PING`)
    /// is refused;
    /// [`HarnessError::Io`] when the socket fails.
    pub fn debug_sleep(&self, duration: Duration) -> Result<(), HarnessError> {
        if !self.config.debug_command {
            return Err(HarnessError::Config(
                "debug_sleep needs enable_debug_command(true)".into(),
            ));
        }
        let mut stream = UnixStream::connect(&self.socket_path)
            .map_err(HarnessError::io("connecting for DEBUG SLEEP"))?;
        stream
            .set_read_timeout(Some(ADMIN_TIMEOUT))
            .and_then(|()| stream.set_write_timeout(Some(ADMIN_TIMEOUT)))
            .map_err(HarnessError::io("setting socket timeouts"))?;
        // A round trip first: until the server has accepted this connection and served it
        // once, a command from an established connection could overtake the DEBUG SLEEP.
        let (hello, expected) = match &self.config.password {
            Some(password) => (resp_command(&["AUTH", password]), "+OK"),
            None => (resp_command(&["PING"]), "+PONG"),
        };
        stream
            .write_all(&hello)
            .map_err(HarnessError::io("sending the DEBUG SLEEP handshake"))?;
        let reply = read_reply_line(&mut stream)
            .map_err(HarnessError::io("reading the DEBUG SLEEP handshake"))?;
        if reply != expected {
            return Err(HarnessError::Config(format!(
                "DEBUG SLEEP handshake answered {reply:?}"
            )));
        }
        let seconds = format!("{:.3}", duration.as_secs_f64());
        stream
            .write_all(&resp_command(&["DEBUG", "SLEEP", &seconds]))
            .map_err(HarnessError::io("sending DEBUG SLEEP"))?;
        stream
            .set_read_timeout(Some(duration + Duration::from_secs(10)))
            .map_err(HarnessError::io("setting socket timeouts"))?;
        std::thread::Builder::new()
            .name("ecosphere-debug-sleep".into())
            .spawn(move || {
                // Bounded by the read timeout; the reply itself is not needed.
                let _ = read_reply_line(&mut stream);
            })
            .map_err(HarnessError::io("spawning the DEBUG SLEEP reader"))?;
        Ok(())
    }

    /// `CLIENT PAUSE <ms> ALL`: every client's commands wait for `duration` (a frozen node
    /// whose connections still accept).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let server = slate_harness::server::RedisServer::start()?;
    /// server.client_pause(Duration::from_millis(500))?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Redis`] when the command fails.
    pub fn client_pause(&self, duration: Duration) -> Result<(), HarnessError> {
        let millis = duration.as_millis().to_string();
        self.command(&["CLIENT", "PAUSE", &millis, "ALL"]).map(drop)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- redis-server 127.0.0.1:{} (pid {}) log tail, {} ---\n{}\n--- end ---",
                self.port,
                self.pid,
                self.log_path.display(),
                self.log_tail(PANIC_LOG_LINES)
            );
        }
        self.kill_child();
    }
}

/// The server and version the harness runs by default (the binary [`RedisServer::start`]
/// would use), known before any server starts: for settings that depend on it, such as ACL
/// grants.
///
/// # Errors
///
/// [`HarnessError::BinaryNotFound`] with the install hint; [`HarnessError::Config`] when the
/// binary is not the kind `SLATE_SERVER` chose.
///
/// # Examples
///
/// ```no_run
/// let v = slate_harness::server::chosen_version()?;
/// println!("the scenarios run against {v}");
/// # Ok::<(), slate_harness::server::HarnessError>(())
/// ```
pub fn chosen_version() -> Result<ServerVersion, HarnessError> {
    let binary = resolve_binary(None)?;
    let version = kind::probe(&binary)?;
    let wanted = ServerKind::from_env()?;
    if version.kind != wanted {
        return Err(HarnessError::Config(format!(
            "{KIND_ENV} asks for {wanted} but {} is {version}: point {BINARY_ENV} at a {} \
             binary (or unset it)",
            binary.display(),
            wanted.binary_name()
        )));
    }
    Ok(version)
}

/// Finds the binary: explicit path, then `SLATE_REDIS_SERVER`, then the chosen kind's binary
/// on `PATH`.
fn resolve_binary(explicit: Option<&Path>) -> Result<PathBuf, HarnessError> {
    let kind = ServerKind::from_env()?;
    if let Some(path) = explicit {
        return existing(path, "ServerBuilder::binary", kind);
    }
    if let Some(value) = std::env::var_os(BINARY_ENV).filter(|value| !value.is_empty()) {
        return existing(Path::new(&value), BINARY_ENV, kind);
    }
    on_path(kind.binary_name()).ok_or_else(|| HarnessError::BinaryNotFound {
        detail: format!("{} not on PATH", kind.binary_name()),
        hint: kind.install_hint(),
    })
}

/// The first `name` on `PATH`.
pub(crate) fn on_path(name: &str) -> Option<PathBuf> {
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path_var)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

fn existing(path: &Path, source: &str, kind: ServerKind) -> Result<PathBuf, HarnessError> {
    if path.is_file() {
        Ok(path.to_path_buf())
    } else {
        Err(HarnessError::BinaryNotFound {
            detail: format!("{source} = {} does not exist", path.display()),
            hint: kind.install_hint(),
        })
    }
}

/// The text of a reply (bulk, simple or verbatim string), for parsing `INFO`-style answers.
pub(crate) fn value_text(v: &redis::Value) -> Result<String, HarnessError> {
    match v {
        redis::Value::BulkString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => Ok(s.clone()),
        redis::Value::VerbatimString { text, .. } => Ok(text.clone()),
        other => Err(HarnessError::Config(format!(
            "expected text, got {other:?}"
        ))),
    }
}

/// A port that was free a moment ago on 127.0.0.1.
pub(crate) fn free_port() -> Result<u16, HarnessError> {
    Ok(free_ports(1)?[0])
}

/// `n` distinct ports that were free a moment ago on 127.0.0.1: all held at once while they
/// are drawn, so that the kernel cannot hand out one twice (ports drawn one after another can
/// repeat, and a ZooKeeper ensemble given the same port twice refuses its configuration).
pub(crate) fn free_ports(n: usize) -> Result<Vec<u16>, HarnessError> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(HarnessError::io("finding a free port"))?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(HarnessError::io("finding a free port"))
}

/// Quotes a config value the way redis.conf parses it.
fn quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for ch in value.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            other => out.push(other),
        }
    }
    out.push('"');
    out
}

/// Percent-encodes a URL user-info component.
fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// Encodes a command as a RESP array of bulk strings.
fn resp_command(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads one `\r\n`-terminated line (enough for `+OK` / `-ERR ...` replies), bounded to 4 KiB.
fn read_reply_line(stream: &mut UnixStream) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut byte = [0_u8; 1];
    while !line.ends_with(b"\r\n") && line.len() < 4096 {
        if stream.read(&mut byte)? == 0 {
            break;
        }
        line.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&line).trim_end().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_and_encoding() {
        assert_eq!(quote(r#"a "b"\c"#), r#""a \"b\"\\c""#);
        assert_eq!(percent_encode("p@ss:w/rd"), "p%40ss%3Aw%2Frd");
        assert_eq!(resp_command(&["PING"]), b"*1\r\n$4\r\nPING\r\n");
    }

    #[test]
    fn explicit_missing_binary_names_the_install_hint() {
        let err = resolve_binary(Some(Path::new("/nonexistent/redis-server")))
            .expect_err("a missing binary must be an error");
        assert!(
            err.to_string().contains("apt-get install -y redis-server"),
            "{err}"
        );
    }
}
