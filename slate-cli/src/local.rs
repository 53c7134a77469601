//! What `slate demo` runs locally: `redis-server` processes on loopback (one temporary
//! directory each, no persistence, killed on drop) and its worker processes (`slate
//! demo-worker`, their output lines collected as they come). Only the processes started here
//! are ever signalled. The command's own tests start their servers with it too.
//!
//! # Examples
//!
//! ```no_run
//! use slate_cli::local::LocalServer;
//!
//! let mut server = LocalServer::start()?;
//! println!("{}", server.url());
//! server.pause()?; // a hung server
//! server.resume()?;
//! # Ok::<(), slate_cli::local::LocalError>(())
//! ```

use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The environment variable naming the `redis-server` binary (default: found on `PATH`).
pub const SERVER_ENV: &str = "SLATE_REDIS_SERVER";

/// How long a server has to answer `PING` after it starts.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a local process could not be used.
#[derive(Debug)]
pub enum LocalError {
    /// `redis-server` is not installed (or `SLATE_REDIS_SERVER` names nothing runnable).
    NotFound(String),
    /// Anything else, in words.
    Failed(String),
}

impl fmt::Display for LocalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LocalError::NotFound(d) => write!(f, "redis-server not found ({d})"),
            LocalError::Failed(d) => f.write_str(d),
        }
    }
}

/// One `redis-server` on a loopback port, in its own temporary directory.
pub struct LocalServer {
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl LocalServer {
    /// Starts `n` servers.
    ///
    /// # Errors
    ///
    /// [`LocalError::NotFound`] without `redis-server`; otherwise why a server did not start.
    pub fn start_many(n: usize) -> Result<Vec<Self>, LocalError> {
        (0..n).map(|_| Self::start()).collect()
    }

    /// Starts one server on a free loopback port.
    ///
    /// # Errors
    ///
    /// [`LocalError::NotFound`] without `redis-server`; otherwise why it did not start.
    pub fn start() -> Result<Self, LocalError> {
        let dir = tempfile::Builder::new()
            .prefix("slate-demo-redis-")
            .tempdir()
            .map_err(|e| LocalError::Failed(format!("creating a server directory: {e}")))?;
        let port = free_port()?;
        let mut server = LocalServer {
            port,
            dir,
            child: None,
        };
        server.launch()?;
        Ok(server)
    }

    fn launch(&mut self) -> Result<(), LocalError> {
        let binary = std::env::var_os(SERVER_ENV).unwrap_or_else(|| "redis-server".into());
        let data = self.dir.path().join("data");
        std::fs::create_dir_all(&data)
            .map_err(|e| LocalError::Failed(format!("creating {}: {e}", data.display())))?;
        let child = Command::new(&binary)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(&data)
            .arg("--logfile")
            .arg(self.dir.path().join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => {
                    LocalError::NotFound(format!("{} is not on PATH", Path::new(&binary).display()))
                }
                _ => LocalError::Failed(format!("starting {}: {e}", Path::new(&binary).display())),
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if self.command(&["PING"]).is_ok() {
                return Ok(());
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(LocalError::Failed(format!(
                    "redis-server on port {} exited at start ({status}); its log: {}",
                    self.port,
                    self.dir.path().join("redis.log").display()
                )));
            }
            if Instant::now() > deadline {
                return Err(LocalError::Failed(format!(
                    "redis-server on port {} did not answer within {START_TIMEOUT:?}",
                    self.port
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `redis://127.0.0.1:<port>`.
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's port.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// One command on a fresh connection (bounded by a second).
    ///
    /// # Errors
    ///
    /// The server did not answer, or answered an error.
    pub fn command(&self, args: &[&str]) -> Result<redis::Value, LocalError> {
        let fail = |e: redis::RedisError| {
            LocalError::Failed(format!("{} on port {}: {e}", args.join(" "), self.port))
        };
        let client = redis::Client::open(self.url()).map_err(fail)?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .map_err(fail)?;
        let (name, rest) = args.split_first().unwrap_or((&"PING", &[]));
        redis::cmd(name).arg(rest).query(&mut conn).map_err(fail)
    }

    /// Stops the server (SIGSTOP): a hung server, its connections open and silent.
    ///
    /// # Errors
    ///
    /// The server is not running, or the signal failed.
    pub fn pause(&mut self) -> Result<(), LocalError> {
        self.signal(nix::sys::signal::Signal::SIGSTOP)
    }

    /// Resumes a paused server (SIGCONT).
    ///
    /// # Errors
    ///
    /// The server is not running, or the signal failed.
    pub fn resume(&mut self) -> Result<(), LocalError> {
        self.signal(nix::sys::signal::Signal::SIGCONT)
    }

    fn signal(&mut self, sig: nix::sys::signal::Signal) -> Result<(), LocalError> {
        let pid = self
            .child
            .as_ref()
            .and_then(|c| i32::try_from(c.id()).ok())
            .ok_or_else(|| LocalError::Failed("the server is not running".to_owned()))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig)
            .map_err(|e| LocalError::Failed(format!("{sig} to redis-server: {e}")))
    }

    /// Kills the server (SIGKILL), as a crash would.
    ///
    /// # Errors
    ///
    /// The process could not be killed.
    pub fn kill(&mut self) -> Result<(), LocalError> {
        if let Some(mut child) = self.child.take() {
            child
                .kill()
                .map_err(|e| LocalError::Failed(format!("killing redis-server: {e}")))?;
            let _ = child.wait();
        }
        Ok(())
    }

    /// Starts the server again on its port with an empty data directory (a server that lost
    /// its data).
    ///
    /// # Errors
    ///
    /// As a start.
    pub fn restart_empty(&mut self) -> Result<(), LocalError> {
        self.kill()?;
        let data = self.dir.path().join("data");
        let _ = std::fs::remove_dir_all(&data);
        self.launch()
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// A free loopback port (bound, then released for the server to take).
fn free_port() -> Result<u16, LocalError> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| LocalError::Failed(format!("finding a free port: {e}")))
}

/// How one worker ended.
pub struct WorkerOut {
    /// Its index.
    pub index: usize,
    /// Its exit status.
    pub status: ExitStatus,
    /// Everything it wrote on stderr.
    pub stderr: String,
}

struct Proc {
    child: Child,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
    /// The threads reading stdout and stderr; they end at the pipes' end of file.
    readers: Vec<std::thread::JoinHandle<()>>,
    status: Option<ExitStatus>,
}

/// The demo's worker processes, killed on drop if still running.
pub struct Workers {
    procs: Vec<Proc>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Workers {
    /// Starts `n` copies of `exe` with `args(i)`.
    ///
    /// # Errors
    ///
    /// A process could not be started.
    pub fn spawn(
        exe: &PathBuf,
        n: usize,
        args: impl Fn(usize) -> Vec<String>,
    ) -> Result<Self, LocalError> {
        let mut procs = Vec::with_capacity(n);
        for i in 0..n {
            let mut child = Command::new(exe)
                .args(args(i))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| LocalError::Failed(format!("starting worker {i}: {e}")))?;
            let stdout = Arc::new(Mutex::new(Vec::new()));
            let stderr = Arc::new(Mutex::new(String::new()));
            let mut readers = Vec::new();
            if let Some(out) = child.stdout.take() {
                let lines = Arc::clone(&stdout);
                readers.push(std::thread::spawn(move || {
                    for line in BufReader::new(out).lines().map_while(Result::ok) {
                        lock(&lines).push(line);
                    }
                }));
            }
            if let Some(mut err) = child.stderr.take() {
                let text = Arc::clone(&stderr);
                readers.push(std::thread::spawn(move || {
                    let mut s = String::new();
                    let _ = err.read_to_string(&mut s);
                    lock(&text).push_str(&s);
                }));
            }
            procs.push(Proc {
                child,
                stdout,
                stderr,
                readers,
                status: None,
            });
        }
        Ok(Workers { procs })
    }

    /// How many workers.
    #[must_use]
    pub fn len(&self) -> usize {
        self.procs.len()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    /// The lines worker `i` printed so far.
    #[must_use]
    pub fn stdout_lines(&self, i: usize) -> Vec<String> {
        self.procs
            .get(i)
            .map(|p| lock(&p.stdout).clone())
            .unwrap_or_default()
    }

    /// Waits (bounded) until worker `i` printed a line matching `pred`.
    ///
    /// # Errors
    ///
    /// The worker exited first, or `within` passed.
    pub fn wait_for_line(
        &mut self,
        i: usize,
        pred: impl Fn(&str) -> bool,
        within: Duration,
    ) -> Result<(), LocalError> {
        let deadline = Instant::now() + within;
        loop {
            if self.stdout_lines(i).iter().any(|l| pred(l)) {
                return Ok(());
            }
            if self.exited() > 0 && self.procs[i].status.is_some() {
                return Err(LocalError::Failed(format!(
                    "worker {i} exited before it was ready: {}",
                    lock(&self.procs[i].stderr).trim()
                )));
            }
            if Instant::now() > deadline {
                return Err(LocalError::Failed(format!(
                    "worker {i} was not ready within {within:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// How many workers have exited.
    pub fn exited(&mut self) -> usize {
        for p in &mut self.procs {
            if p.status.is_none() {
                p.status = p.child.try_wait().ok().flatten();
            }
        }
        self.procs.iter().filter(|p| p.status.is_some()).count()
    }

    /// Waits (bounded) for every worker to exit.
    ///
    /// # Errors
    ///
    /// `within` passed first (the workers are then killed).
    pub fn wait_all(&mut self, within: Duration) -> Result<Vec<WorkerOut>, LocalError> {
        let deadline = Instant::now() + within;
        while self.exited() < self.procs.len() {
            if Instant::now() > deadline {
                return Err(LocalError::Failed(format!(
                    "the workers did not exit within {within:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // The readers end at the pipes' end of file, which the exits closed: their last
        // output is in.
        for p in &mut self.procs {
            for reader in p.readers.drain(..) {
                let _ = reader.join();
            }
        }
        Ok(self
            .procs
            .iter()
            .enumerate()
            .filter_map(|(index, p)| {
                p.status.map(|status| WorkerOut {
                    index,
                    status,
                    stderr: lock(&p.stderr).clone(),
                })
            })
            .collect())
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for p in &mut self.procs {
            if p.status.is_none() && p.child.try_wait().ok().flatten().is_none() {
                let _ = p.child.kill();
                let _ = p.child.wait();
            }
        }
    }
}
