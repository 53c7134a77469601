//! Real ZooKeeper servers on loopback: a standalone [`ZkServer`] for the smoke tests and a
//! three-server [`ZkEnsemble`] for the fault scenarios (kill or pause a server, find the
//! leader).
//!
//! The harness runs the Debian package's `zookeeper.jar` on the system JRE, one JVM per
//! server, each in its own temporary directory with a fast tick (100 ms, so sessions of
//! 0.2–60 s are allowed and a lost leader is replaced within about a second). A missing
//! `java` or jar fails with an install hint; nothing skips.
//!
//! Environment: `SLATE_ZOOKEEPER_JAR` (default `/usr/share/java/zookeeper.jar`) and
//! `SLATE_JAVA` (default `java` on the `PATH`).

use std::fs;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use crate::proxy::{FaultProxy, Mode};
use crate::server::{HarnessError, free_port, free_ports};

/// How to install ZooKeeper when it is missing.
pub const INSTALL_HINT: &str = "install ZooKeeper and a JRE: `apt-get install -y zookeeper` \
     (Debian/Ubuntu), or set SLATE_ZOOKEEPER_JAR to a zookeeper.jar whose manifest names its \
     dependencies and SLATE_JAVA to a java binary";

/// The tick of every harness server.
pub const TICK: Duration = Duration::from_millis(100);

const START_TIMEOUT: Duration = Duration::from_secs(40);

/// An I/O failure wrapper usable more than once.
fn io_err(what: String) -> impl Fn(std::io::Error) -> HarnessError {
    move |source| HarnessError::Io {
        what: what.clone(),
        source,
    }
}

fn jar() -> Result<PathBuf, HarnessError> {
    let jar = std::env::var_os("SLATE_ZOOKEEPER_JAR").map_or_else(
        || PathBuf::from("/usr/share/java/zookeeper.jar"),
        PathBuf::from,
    );
    if jar.is_file() {
        Ok(jar)
    } else {
        Err(HarnessError::BinaryNotFound {
            detail: format!("no ZooKeeper jar at {}", jar.display()),
            hint: INSTALL_HINT,
        })
    }
}

fn java() -> Result<PathBuf, HarnessError> {
    if let Some(j) = std::env::var_os("SLATE_JAVA") {
        return Ok(PathBuf::from(j));
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("java"))
        .find(|p| p.is_file())
        .ok_or(HarnessError::BinaryNotFound {
            detail: "no `java` on the PATH".into(),
            hint: INSTALL_HINT,
        })
}

/// Sends a four-letter-word command and returns the answer.
///
/// # Errors
///
/// [`HarnessError::Io`] when the server does not answer.
pub fn four_letter(port: u16, cmd: &str) -> Result<String, HarnessError> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let io = io_err(format!("ZooKeeper `{cmd}` on port {port}"));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).map_err(&io)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(&io)?;
    s.write_all(cmd.as_bytes()).map_err(&io)?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(&io)?;
    Ok(out)
}

/// One ZooKeeper server process.
#[derive(Debug)]
pub struct ZkServer {
    id: usize,
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    pid: u32,
}

/// A started server's ports and files, before the process runs.
struct Layout {
    id: usize,
    port: u16,
    dir: PathBuf,
}

/// The `syncLimit` (in ticks) of the harness ensembles: how long a follower goes on without
/// hearing from its leader.
pub const SYNC_LIMIT: u32 = 20;

/// `peers`: how this server reaches each server of the ensemble (its own entry: where it
/// listens), as (quorum port, election port) on loopback.
fn write_config(
    l: &Layout,
    peers: &[(u16, u16)],
    force_sync: bool,
    sync_limit: u32,
) -> Result<(), HarnessError> {
    let io = io_err(format!("writing the config of ZooKeeper server {}", l.id));
    fs::create_dir_all(l.dir.join("data")).map_err(&io)?;
    let mut cfg = format!(
        "tickTime={}\ninitLimit=50\nsyncLimit={sync_limit}\ndataDir={}\nclientPort={}\n\
         clientPortAddress=127.0.0.1\nminSessionTimeout={}\nmaxSessionTimeout=60000\n\
         admin.enableServer=false\n4lw.commands.whitelist=*\nforceSync={}\n\
         maxClientCnxns=0\nznode.container.checkIntervalMs=1000\n",
        TICK.as_millis(),
        l.dir.join("data").display(),
        l.port,
        TICK.as_millis() * 2,
        if force_sync { "yes" } else { "no" },
    );
    if peers.len() > 1 {
        cfg.push_str("reconfigEnabled=false\nstandaloneEnabled=false\ncnxTimeout=500\n");
        for (i, (peer, election)) in peers.iter().enumerate() {
            cfg.push_str(&format!("server.{}=127.0.0.1:{peer}:{election}\n", i + 1));
        }
        fs::write(l.dir.join("data/myid"), format!("{}\n", l.id)).map_err(&io)?;
    }
    fs::write(l.dir.join("zoo.cfg"), cfg).map_err(&io)
}

impl ZkServer {
    /// Starts a standalone server (fsync on, as ZooKeeper ships) and waits until it serves.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let zk = slate_harness::zookeeper::ZkServer::start()?;
    /// println!("connect to {}", zk.connect_string());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::BinaryNotFound`] with the install hint; [`HarnessError::StartFailed`]
    /// when it does not serve within 40 s.
    pub fn start() -> Result<ZkServer, HarnessError> {
        Self::start_with(true)
    }

    /// Starts a standalone server, with or without fsync on every transaction (`forceSync`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let zk = slate_harness::zookeeper::ZkServer::start_with(false)?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_with(force_sync: bool) -> Result<ZkServer, HarnessError> {
        retry_taken_ports(|| {
            let l = Layout {
                id: 1,
                port: free_port()?,
                dir: temp_dir("zk")?,
            };
            write_config(&l, &[], force_sync, SYNC_LIMIT)?;
            let mut server = ZkServer::spawn(l)?;
            server.wait_serving(START_TIMEOUT, &["standalone"])?;
            Ok(server)
        })
    }

    fn spawn(l: Layout) -> Result<ZkServer, HarnessError> {
        let mut server = ZkServer {
            id: l.id,
            port: l.port,
            dir: l.dir,
            child: None,
            pid: 0,
        };
        server.launch()?;
        Ok(server)
    }

    fn launch(&mut self) -> Result<(), HarnessError> {
        let jar = jar()?;
        let java = java()?;
        let mut classpath = jar.display().to_string();
        // A logger binding, when installed, so that the server's log says what it did.
        if Path::new("/usr/share/java/slf4j-simple.jar").is_file() {
            classpath.push_str(":/usr/share/java/slf4j-simple.jar");
        }
        let io = io_err(format!("starting ZooKeeper server {}", self.id));
        let log = fs::File::create(self.log_path()).map_err(&io)?;
        let err = log.try_clone().map_err(&io)?;
        let child = Command::new(&java)
            .args([
                "-Xmx192m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-Xshare:auto",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-Dzookeeper.admin.enableServer=false",
                "-cp",
                &classpath,
                "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            ])
            .arg(self.dir.join("zoo.cfg"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    HarnessError::BinaryNotFound {
                        detail: format!("{} could not be run", java.display()),
                        hint: INSTALL_HINT,
                    }
                } else {
                    HarnessError::Io {
                        what: format!("starting ZooKeeper server {}", self.id),
                        source: e,
                    }
                }
            })?;
        self.pid = child.id();
        self.child = Some(child);
        Ok(())
    }

    fn wait_serving(&mut self, within: Duration, modes: &[&str]) -> Result<(), HarnessError> {
        let until = Instant::now() + within;
        loop {
            if self.mode().is_some_and(|m| modes.contains(&m.as_str())) {
                return Ok(());
            }
            if !self.is_running() {
                return Err(self.failed("the process exited"));
            }
            if Instant::now() >= until {
                return Err(self.failed(&format!("not serving as {modes:?} within {within:?}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn failed(&self, reason: &str) -> HarnessError {
        HarnessError::StartFailed {
            port: self.port,
            reason: format!("ZooKeeper server {}: {reason}", self.id),
            log_tail: self.log_tail(30),
        }
    }

    /// The server's role from `srvr`: `standalone`, `leader` or `follower`; `None` when it
    /// does not serve (down, paused, or without a quorum).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let zk = slate_harness::zookeeper::ZkServer::start()?;
    /// assert_eq!(zk.mode().as_deref(), Some("standalone"));
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn mode(&self) -> Option<String> {
        let out = four_letter(self.port, "srvr").ok()?;
        out.lines()
            .find_map(|l| l.strip_prefix("Mode: "))
            .map(|m| m.trim().to_owned())
    }

    /// `host:port` of this server.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let zk = slate_harness::zookeeper::ZkServer::start()?;
    /// assert!(zk.connect_string().starts_with("127.0.0.1:"));
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn connect_string(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The client port.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let zk = slate_harness::zookeeper::ZkServer::start()?;
    /// assert_ne!(zk.port(), 0);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The client address.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let zk = slate_harness::zookeeper::ZkServer::start()?;
    /// let proxy = slate_harness::proxy::FaultProxy::start(zk.addr())?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The JVM's process id.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let zk = slate_harness::zookeeper::ZkServer::start()?;
    /// assert_ne!(zk.pid(), 0);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process still runs.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut zk = slate_harness::zookeeper::ZkServer::start()?;
    /// assert!(zk.is_running());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    fn signal(&mut self, sig: Signal) -> Result<(), HarnessError> {
        if !self.is_running() {
            return Err(HarnessError::NotRunning {
                what: format!("{sig} ZooKeeper server {}", self.id),
            });
        }
        let pid = i32::try_from(self.pid)
            .map_err(|_| HarnessError::Config(format!("pid {} out of range", self.pid)))?;
        signal::kill(Pid::from_raw(pid), sig)
            .map_err(HarnessError::signal(format!("{sig} ZooKeeper server")))
    }

    /// Stops the JVM with `SIGSTOP` (a hung server: connections stay open, nothing answers).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut zk = slate_harness::zookeeper::ZkServer::start()?;
    /// zk.pause()?;
    /// zk.resume()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::NotRunning`] after a kill.
    pub fn pause(&mut self) -> Result<(), HarnessError> {
        self.signal(Signal::SIGSTOP)
    }

    /// Continues a paused server.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut zk = slate_harness::zookeeper::ZkServer::start()?;
    /// zk.pause()?;
    /// zk.resume()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::NotRunning`] after a kill.
    pub fn resume(&mut self) -> Result<(), HarnessError> {
        self.signal(Signal::SIGCONT)
    }

    /// Kills the JVM with `SIGKILL` and reaps it (a crashed server).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut zk = slate_harness::zookeeper::ZkServer::start()?;
    /// zk.kill();
    /// assert!(!zk.is_running());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts a killed server again on the same ports and data (it rejoins its ensemble).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut zk = slate_harness::zookeeper::ZkServer::start()?;
    /// zk.kill();
    /// zk.restart()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start) (it waits until the server serves in some role).
    pub fn restart(&mut self) -> Result<(), HarnessError> {
        self.kill();
        self.launch()?;
        self.wait_serving(START_TIMEOUT, &["standalone", "leader", "follower"])
    }

    /// The server's log file.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let zk = slate_harness::zookeeper::ZkServer::start()?;
    /// println!("{}", zk.log_path().display());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    /// The last `n` lines of the server's log.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let zk = slate_harness::zookeeper::ZkServer::start()?;
    /// println!("{}", zk.log_tail(20));
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn log_tail(&self, n: usize) -> String {
        let text = fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for ZkServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- ZooKeeper server {} (port {}, pid {}) log tail ---\n{}\n--- end ---",
                self.id,
                self.port,
                self.pid,
                self.log_tail(30)
            );
        }
        // A paused JVM must be continued to die promptly on some kernels; SIGKILL works on a
        // stopped process, so kill it directly.
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A quorum of ZooKeeper servers on loopback (three by default).
#[derive(Debug)]
pub struct ZkEnsemble {
    servers: Vec<ZkServer>,
    /// With [`ZkEnsemble::start_linked`]: the proxies through which the servers reach each
    /// other.
    links: Vec<PeerLink>,
    base: PathBuf,
}

/// Server `from`'s way to server `to` (both its ports), in a linked ensemble.
#[derive(Debug)]
struct PeerLink {
    from: usize,
    to: usize,
    quorum: FaultProxy,
    election: FaultProxy,
}

impl Drop for ZkEnsemble {
    fn drop(&mut self) {
        self.servers.clear();
        let _ = fs::remove_dir_all(&self.base);
    }
}

impl ZkEnsemble {
    /// Starts `n` servers (3 or 5 are the useful sizes) and waits until one leads and the
    /// others follow.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let ensemble = slate_harness::zookeeper::ZkEnsemble::start(3)?;
    /// assert!(ensemble.leader().is_some());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::BinaryNotFound`] with the install hint; [`HarnessError::StartFailed`]
    /// when the quorum does not form within 40 s.
    pub fn start(n: usize) -> Result<ZkEnsemble, HarnessError> {
        Self::start_with(n, false, SYNC_LIMIT)
    }

    /// Starts `n` servers that reach each other only through proxies of their own (one per
    /// ordered pair of servers and port), so that [`cut_off`](Self::cut_off) can separate a
    /// server from the others while clients still reach it: a follower that no longer hears
    /// its leader. `sync_limit`: ticks (of [`TICK`]) a follower goes on serving without its
    /// leader before it gives up (`syncLimit`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut ensemble = slate_harness::zookeeper::ZkEnsemble::start_linked(3, 50)?;
    /// let leader = ensemble.leader().unwrap();
    /// let follower = (leader + 1) % 3;
    /// ensemble.cut_off(follower)?;
    /// // ... clients of `follower` still connect; it hears no leader for 5 s ...
    /// ensemble.heal()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start), and a proxy that does not start.
    pub fn start_linked(n: usize, sync_limit: u32) -> Result<ZkEnsemble, HarnessError> {
        Self::start_with(n, true, sync_limit)
    }

    fn start_with(n: usize, linked: bool, sync_limit: u32) -> Result<ZkEnsemble, HarnessError> {
        if n < 2 {
            return Err(HarnessError::Config(format!(
                "an ensemble of {n} server(s): use ZkServer::start for one, or at least 3"
            )));
        }
        retry_taken_ports(|| Self::try_start(n, linked, sync_limit))
    }

    fn try_start(n: usize, linked: bool, sync_limit: u32) -> Result<ZkEnsemble, HarnessError> {
        let mut peers = Vec::with_capacity(n);
        let mut layouts = Vec::with_capacity(n);
        let base = temp_dir("zk-ensemble")?;
        // Every port of the ensemble distinct (quorum, election and client ports).
        let mut ports = free_ports(3 * n)?.into_iter();
        let mut next = || ports.next().expect("three ports per server");
        for id in 1..=n {
            peers.push((next(), next()));
            layouts.push(Layout {
                id,
                port: next(),
                dir: base.join(format!("s{id}")),
            });
        }
        let mut links = Vec::new();
        for (from, l) in layouts.iter().enumerate() {
            let mut view = peers.clone();
            if linked {
                for (to, (quorum, election)) in peers.iter().enumerate() {
                    if to == from {
                        continue;
                    }
                    let proxy = |port: u16| {
                        FaultProxy::start(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
                    };
                    let link = PeerLink {
                        from,
                        to,
                        quorum: proxy(*quorum)?,
                        election: proxy(*election)?,
                    };
                    view[to] = (link.quorum.addr().port(), link.election.addr().port());
                    links.push(link);
                }
            }
            write_config(l, &view, false, sync_limit)?;
        }
        let mut servers = Vec::with_capacity(n);
        for l in layouts {
            servers.push(ZkServer::spawn(l)?);
        }
        let mut ensemble = ZkEnsemble {
            servers,
            links,
            base,
        };
        for s in &mut ensemble.servers {
            s.wait_serving(START_TIMEOUT, &["leader", "follower"])?;
        }
        Ok(ensemble)
    }

    /// (A linked ensemble) separates server `i` from every other server, both ways, silently
    /// (the bytes are held, as in a partition, and flow again at [`heal`](Self::heal)). Its
    /// clients still reach it.
    ///
    /// # Examples
    ///
    /// See [`start_linked`](Self::start_linked).
    ///
    /// # Errors
    ///
    /// [`HarnessError::Config`] for an ensemble not started linked; a proxy that fails.
    pub fn cut_off(&self, i: usize) -> Result<(), HarnessError> {
        if self.links.is_empty() {
            return Err(HarnessError::Config(
                "cut_off needs an ensemble started with ZkEnsemble::start_linked".into(),
            ));
        }
        for l in self.links.iter().filter(|l| l.from == i || l.to == i) {
            l.quorum.set_mode(Mode::Blackhole)?;
            l.election.set_mode(Mode::Blackhole)?;
        }
        Ok(())
    }

    /// (A linked ensemble) lets every server reach every other again.
    ///
    /// # Examples
    ///
    /// See [`start_linked`](Self::start_linked).
    ///
    /// # Errors
    ///
    /// A proxy that fails.
    pub fn heal(&self) -> Result<(), HarnessError> {
        for l in &self.links {
            l.quorum.set_mode(Mode::Pass)?;
            l.election.set_mode(Mode::Pass)?;
        }
        Ok(())
    }

    /// `host:port,host:port,…` of every server.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let ensemble = slate_harness::zookeeper::ZkEnsemble::start(3)?;
    /// assert_eq!(ensemble.connect_string().split(',').count(), 3);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn connect_string(&self) -> String {
        self.servers
            .iter()
            .map(ZkServer::connect_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The index of the current leader, if one serves.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let ensemble = slate_harness::zookeeper::ZkEnsemble::start(3)?;
    /// let leader = ensemble.leader().expect("a leader");
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn leader(&self) -> Option<usize> {
        self.servers
            .iter()
            .position(|s| s.mode().as_deref() == Some("leader"))
    }

    /// Waits until a leader serves (after a kill or pause of the old one), and returns it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut ensemble = slate_harness::zookeeper::ZkEnsemble::start(3)?;
    /// let old = ensemble.leader().unwrap();
    /// ensemble.server_mut(old).kill();
    /// let new = ensemble.wait_leader(std::time::Duration::from_secs(20))?;
    /// assert_ne!(new, old);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Timeout`] when no leader serves within `within`.
    pub fn wait_leader(&self, within: Duration) -> Result<usize, HarnessError> {
        let until = Instant::now() + within;
        loop {
            if let Some(i) = self.leader() {
                return Ok(i);
            }
            if Instant::now() >= until {
                return Err(HarnessError::Timeout {
                    what: format!("a ZooKeeper leader within {within:?}"),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One server.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let ensemble = slate_harness::zookeeper::ZkEnsemble::start(3)?;
    /// println!("{}", ensemble.server(0).connect_string());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn server(&self, i: usize) -> &ZkServer {
        &self.servers[i]
    }

    /// One server, to break it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut ensemble = slate_harness::zookeeper::ZkEnsemble::start(3)?;
    /// ensemble.server_mut(2).pause()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn server_mut(&mut self, i: usize) -> &mut ZkServer {
        &mut self.servers[i]
    }

    /// How many servers the ensemble has.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// assert_eq!(slate_harness::zookeeper::ZkEnsemble::start(3)?.len(), 3);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// Never true for a started ensemble; here for the `len` convention.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// assert!(!slate_harness::zookeeper::ZkEnsemble::start(3)?.is_empty());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }
}

fn temp_dir(what: &str) -> Result<PathBuf, HarnessError> {
    let dir = std::env::temp_dir().join(format!(
        "slate-{what}-{}-{}",
        std::process::id(),
        crate::zookeeper::next_id()
    ));
    fs::create_dir_all(&dir).map_err(HarnessError::io(format!("creating {}", dir.display())))?;
    Ok(dir)
}

fn next_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// How many times a start whose port was taken is tried again, on fresh ports.
const PORT_ATTEMPTS: usize = 4;

/// Runs `start` again (on the fresh ports it picks) when a server exited because a port it
/// was given was taken meanwhile: ports are chosen free and then bound by the JVM a moment
/// later, and another test's server or proxy can take one in between (seen once in a loaded
/// workspace run: `java.net.BindException: Address already in use`). What the failed try
/// started is stopped as it is dropped.
fn retry_taken_ports<T>(
    mut start: impl FnMut() -> Result<T, HarnessError>,
) -> Result<T, HarnessError> {
    let mut attempt = 1;
    loop {
        match start() {
            Err(HarnessError::StartFailed { log_tail, .. })
                if attempt < PORT_ATTEMPTS && log_tail.contains("Address already in use") =>
            {
                attempt += 1;
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken() -> HarnessError {
        HarnessError::StartFailed {
            port: 1,
            reason: "ZooKeeper server 3: the process exited".into(),
            log_tail: "java.net.BindException: Address already in use".into(),
        }
    }

    #[test]
    fn a_start_whose_port_was_taken_is_tried_again_and_other_failures_are_not() {
        let mut tries = 0;
        let r = retry_taken_ports(|| {
            tries += 1;
            if tries < 3 { Err(taken()) } else { Ok(tries) }
        });
        assert_eq!(r.unwrap(), 3);

        let mut tries = 0;
        let r: Result<(), _> = retry_taken_ports(|| {
            tries += 1;
            Err(taken())
        });
        assert!(r.is_err());
        assert_eq!(tries, PORT_ATTEMPTS, "bounded");

        let mut tries = 0;
        let r: Result<(), _> = retry_taken_ports(|| {
            tries += 1;
            Err(HarnessError::Config("no".into()))
        });
        assert!(r.is_err());
        assert_eq!(tries, 1, "only a taken port is a reason to try again");
    }
}
