//! CMD's process tree and its guardian: no process of CMD's tree runs once `slate run`'s lease
//! is over, whatever happens to `slate` (killed, stopped, hung, starved of CPU) and whatever
//! the tree does with process groups (`timeout`, `bash -c 'set -m; ...'`, a double fork).
//!
//! ## How
//!
//! - The **guardian** is a second `slate` process (`slate guard`, internal), started before
//!   the lock is taken: `slate run` waits for its `ready` (a guardian that cannot start, or
//!   dies at once, fails the run before any lock is held). It talks to `slate run` over a Unix
//!   socket that only the two of them hold.
//! - The guardian is CMD's **parent** and on Linux a **child subreaper**
//!   (`PR_SET_CHILD_SUBREAPER`): a process of CMD's tree whose parent exits (a daemon's double
//!   fork, `setsid`, `timeout`'s own process group) is re-parented to the guardian, never to
//!   init. Every process of the tree stays a descendant of the guardian, whatever group or
//!   session it moved to. CMD joins `slate`'s process group (the shell's job); the guardian
//!   keeps a group of its own, out of reach of the terminal's signals and of a `kill 0` by
//!   CMD (see [`OWN_GROUP`] for elsewhere).
//! - The guardian **holds the lease deadline itself**: `slate run` sends each new deadline
//!   (on the system-wide monotonic clock) as the lease is renewed. When the last deadline it
//!   was given, minus a margin, passes, the guardian kills the tree, whether `slate` died,
//!   was stopped (`SIGSTOP`, a debugger), hangs or is starved. With `--on-lost term` it sends
//!   SIGTERM a grace period earlier (see [`Deadlines`]).
//! - **Killing the tree**: where the guardian can make a cgroup v2 of its own (a cgroup2
//!   hierarchy mounted, its cgroup writable, `cgroup.kill` there), CMD's tree is born in one
//!   (the guardian steps in to start CMD and out at once) and `cgroup.kill` ends it at once; then (and everywhere else on Linux) SIGKILL to every descendant of the
//!   guardian found in `/proc` (orphans included, thanks to the subreaper), repeated until
//!   none is left. On other Unixes (no subreaper, no `/proc`): SIGKILL to the process group, which
//!   misses processes that left it.
//! - The socket closing (`slate run` exited or was killed: the kernel closes its end) kills
//!   the tree at once. So does the end of CMD (`slate run` asks for it before it releases the
//!   lock: nothing CMD left behind runs on without the lock).
//! - Signals `slate` receives (INT, TERM, HUP, QUIT) go to every process of the tree; one the
//!   kernel sent to the whole job (Ctrl-C, Ctrl-\\, a hangup), only to those that left the
//!   job's group (the others got it already). A signal `slate`
//!   inherited as ignored (`nohup`) stays ignored in the guardian and in CMD.
//! - **Job control** (Linux): Ctrl-Z stops the job (`slate` and CMD) like any other, but not
//!   the guardian: a job stopped longer than its lease is killed at the lease's end (after
//!   `fg`, `slate` reports the loss, exit 76); one resumed in time goes on holding the lock.
//!
//! What still escapes: a process started outside the tree on its behalf (a service manager's
//! unit, `at`, a job handed to a daemon); a guardian killed on its own (SIGKILL of that one
//! PID) while `slate` stays stopped, which leaves the tree to the lease; a machine that stops
//! as a whole (the lease is the bound).

use std::ffi::OsString;
use std::io::ErrorKind;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, SigSet, SigmaskHow, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::process::{Child, Command};

use crate::exit;

/// The hidden subcommand that runs the guardian.
pub const GUARD_SUBCOMMAND: &str = "guard";

/// How long the guardian may take to start and say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long the guardian may take to start CMD.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How long `end` waits for the guardian to report the tree gone.
const END_TIMEOUT: Duration = Duration::from_secs(10);

/// Rounds of the kill (each finds the descendants still alive and kills them).
const KILL_ROUNDS: u32 = 200;

/// Whether the tree gets a process group of its own (and the terminal while it runs). Only
/// where the guardian cannot find its descendants (no `/proc`, no subreaper): there the group
/// is how it reaches them. On Linux CMD joins `slate`'s process group, the shell's job:
/// Ctrl-C, Ctrl-Z and `fg` act on the job as on any other (a pager after a pipe stays in the
/// foreground with it), and the guardian, in a group of its own, keeps the lease's time
/// while the job is stopped.
const OWN_GROUP: bool = !cfg!(target_os = "linux");

/// Where the guardian's socket lives while it connects: a directory only this user can enter.
struct SocketDir(PathBuf);

impl SocketDir {
    fn create() -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!("slate-run-{}-{nanos:x}", std::process::id()));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        Ok(SocketDir(dir))
    }

    fn socket(&self) -> PathBuf {
        self.0.join("guardian.sock")
    }
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.socket());
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// When the guardian acts on its own if no newer deadline reaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// SIGKILL to the tree (the lease deadline minus [`kill_margin`]).
    pub kill_at: Instant,
    /// SIGTERM to the tree (`--on-lost term`: a grace period before `kill_at`).
    pub term_at: Option<Instant>,
}

/// How long before the lease deadline the guardian's SIGKILL goes out: a twentieth of the
/// lease, at least 10 ms and at most 1 s (the kill, the reaping and a scheduler's delay fit
/// in it; the deadline itself is already the client's conservative view of the server's
/// expiry).
#[must_use]
pub fn kill_margin(lease: Duration) -> Duration {
    (lease / 20).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// How long before the SIGKILL the SIGTERM of `--on-lost term` goes out: `grace`, at most a
/// quarter of the lease (a renewal every third of the lease keeps the deadline far enough
/// ahead that a healthy run never reaches it).
#[must_use]
pub fn term_grace(lease: Duration, grace: Duration) -> Duration {
    grace.min(lease / 4)
}

/// What the guardian reports.
#[derive(Debug)]
pub enum Event {
    /// CMD (the guardian's child) exited.
    Exited(ExitStatus),
    /// The guardian acted on its own deadline (no newer one reached it): it sent the tree
    /// this signal (SIGTERM under `--on-lost term`, then SIGKILL).
    Acted(Signal),
    /// The guardian is gone (killed, crashed): nothing guards the tree any more.
    GuardianGone,
}

/// CMD's tree, kept by its guardian.
pub struct Tree {
    /// The guardian's PID.
    pid: Pid,
    /// CMD's process group (the guardian's PID), with [`OWN_GROUP`].
    pgid: Option<Pid>,
    guardian: Child,
    lines: Lines<BufReader<OwnedReadHalf>>,
    /// The socket's write end: dropping it (or dying) fires the guardian.
    out: Option<OwnedWriteHalf>,
    /// CMD, once started and until it exited.
    cmd: Option<Pid>,
    /// Whether the group was given the terminal (and must give it back).
    took_terminal: bool,
}

impl Tree {
    /// Starts the guardian of `command` (run later by [`Tree::run`]) and waits until it is
    /// ready. `exe` is `slate`'s own binary, located before the lock is taken.
    ///
    /// # Errors
    ///
    /// The guardian could not be started or did not get ready (then CMD must not run).
    pub async fn start(exe: &Path, command: &[OsString]) -> std::io::Result<Self> {
        let dir = SocketDir::create()?;
        let listener = UnixListener::bind(dir.socket())?;
        let mut spawn = Command::new(exe);
        spawn
            .arg(GUARD_SUBCOMMAND)
            .arg("--socket")
            .arg(dir.socket());
        if !OWN_GROUP {
            // CMD joins `slate`'s group (the shell's job); the guardian keeps a group of its
            // own, out of reach of the terminal's signals and of a `kill 0` by CMD.
            spawn
                .arg("--join-group")
                .arg(nix::unistd::getpgrp().as_raw().to_string());
        }
        spawn
            .arg("--")
            .args(command)
            .stdin(Stdio::inherit())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .process_group(0)
            .kill_on_drop(true);
        let mut guardian = spawn.spawn()?;
        let pid = guardian
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| std::io::Error::other("the guardian exited at once"))?;
        let accepted = tokio::select! {
            a = tokio::time::timeout(READY_TIMEOUT, listener.accept()) => a,
            status = guardian.wait() => {
                return Err(std::io::Error::other(format!("the guardian exited at once ({})", status?)));
            }
        };
        let (stream, _) = accepted
            .map_err(|_| std::io::Error::other("the guardian did not connect within 10 s"))??;
        drop(dir);
        let (read, write) = stream.into_split();
        let mut tree = Tree {
            pid: Pid::from_raw(pid),
            pgid: OWN_GROUP.then_some(Pid::from_raw(pid)),
            guardian,
            lines: BufReader::new(read).lines(),
            out: Some(write),
            cmd: None,
            took_terminal: false,
        };
        match tokio::time::timeout(READY_TIMEOUT, tree.lines.next_line()).await {
            Ok(Ok(Some(line))) if line == "ready" => Ok(tree),
            Ok(Ok(Some(line))) => Err(std::io::Error::other(format!(
                "the guardian answered {line:?} instead of ready"
            ))),
            Ok(Ok(None)) | Ok(Err(_)) => Err(std::io::Error::other("the guardian died")),
            Err(_) => Err(std::io::Error::other(
                "the guardian did not get ready within 10 s",
            )),
        }
    }

    async fn send(&mut self, line: &str) -> std::io::Result<()> {
        let out = self
            .out
            .as_mut()
            .ok_or_else(|| std::io::Error::other("the guardian's socket is closed"))?;
        out.write_all(format!("{line}\n").as_bytes()).await
    }

    /// Tells the guardian when to act on its own (see [`Deadlines`]).
    ///
    /// # Errors
    ///
    /// The guardian is gone.
    pub async fn deadlines(&mut self, d: Deadlines) -> std::io::Result<()> {
        let term = d
            .term_at
            .map_or_else(|| "-".to_owned(), |t| monotonic_ns(t).to_string());
        self.send(&format!("deadline {} {term}", monotonic_ns(d.kill_at)))
            .await
    }

    /// Has the guardian start CMD with `env` added (with [`OWN_GROUP`], after giving the
    /// group the terminal if `slate` has it); returns CMD's PID, or the exit code and message
    /// for a command that cannot run.
    ///
    /// # Errors
    ///
    /// CMD could not be started: (exit code, message).
    pub async fn run(&mut self, env: &[(&str, String)]) -> Result<Pid, (u8, String)> {
        self.take_terminal();
        let mut line = String::from("run");
        for (k, v) in env {
            line.push(' ');
            line.push_str(&hex(k.as_bytes()));
            line.push('=');
            line.push_str(&hex(v.as_bytes()));
        }
        if self.send(&line).await.is_err() {
            return Err((
                exit::INTERNAL,
                "the guardian is gone; not running the command".into(),
            ));
        }
        let answer = tokio::time::timeout(START_TIMEOUT, async {
            loop {
                match self.lines.next_line().await {
                    Ok(Some(line))
                        if line.starts_with("started ") || line.starts_with("failed ") =>
                    {
                        return Some(line);
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => return None,
                }
            }
        })
        .await;
        let Ok(Some(answer)) = answer else {
            return Err((
                exit::INTERNAL,
                "the guardian did not start the command".into(),
            ));
        };
        if let Some(pid) = answer.strip_prefix("started ") {
            let pid = pid
                .parse()
                .map_err(|_| (exit::INTERNAL, format!("the guardian said {answer:?}")))?;
            let pid = Pid::from_raw(pid);
            self.cmd = Some(pid);
            return Ok(pid);
        }
        let failed = answer.strip_prefix("failed ").unwrap_or(&answer);
        let (code, message) = failed.split_once(' ').unwrap_or((failed, ""));
        Err((
            code.parse().unwrap_or(exit::CANNOT_EXECUTE),
            message.to_owned(),
        ))
    }

    /// The guardian's next report.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a line read is never lost (tokio's `Lines::next_line` is cancel safe).
    pub async fn next(&mut self) -> Event {
        loop {
            match self.lines.next_line().await {
                Ok(Some(line)) => {
                    if let Some(raw) = line.strip_prefix("exited ")
                        && let Ok(raw) = raw.parse()
                    {
                        self.cmd = None;
                        return Event::Exited(ExitStatus::from_raw(raw));
                    }
                    match line.strip_prefix("acted ") {
                        Some("term") => return Event::Acted(Signal::SIGTERM),
                        Some("kill") => return Event::Acted(Signal::SIGKILL),
                        _ => {}
                    }
                }
                Ok(None) | Err(_) => return Event::GuardianGone,
            }
        }
    }

    /// Sends `sig` to every process of CMD's tree (the guardian signals its descendants,
    /// whatever their group); to CMD (and its group) from here if the guardian is gone.
    /// `from_terminal`: the kernel sent it to `slate`'s whole group (Ctrl-C, Ctrl-\\, a
    /// hangup), which CMD is in (without [`OWN_GROUP`]): only the processes that left the
    /// group get it, so that CMD sees one SIGINT per Ctrl-C.
    pub async fn signal(&mut self, sig: Signal, from_terminal: bool) {
        let line = if from_terminal && !OWN_GROUP {
            format!("signal {} outside", sig as i32)
        } else {
            format!("signal {}", sig as i32)
        };
        if self.send(&line).await.is_err() && !from_terminal {
            self.signal_here(sig);
        }
    }

    /// `sig` to CMD and its group from `slate` itself (ESRCH, already gone, is ignored).
    fn signal_here(&self, sig: Signal) {
        if let Some(pgid) = self.pgid {
            let _ = signal::killpg(pgid, sig);
        }
        if let Some(cmd) = self.cmd {
            let _ = signal::kill(cmd, sig);
        }
    }

    /// The guardian is gone: CMD (and, with [`OWN_GROUP`], its group) is killed from here.
    /// Its children were re-parented past the dead guardian and are out of reach.
    pub fn kill_orphaned(&self) {
        self.signal_here(Signal::SIGKILL);
    }

    /// The lease is lost: the guardian kills the tree now (`term`: None) or sends SIGTERM now
    /// and SIGKILL when `grace` runs out (or its kill deadline comes, whichever first).
    pub async fn lost(&mut self, term: Option<Duration>) {
        let line = match term {
            None => "kill".to_owned(),
            Some(grace) => format!("term {}", grace.as_millis()),
        };
        let _ = self.send(&line).await;
    }

    /// Ends the tree: the guardian kills whatever is left of it and exits, the terminal is
    /// given back. Call before releasing the lock.
    pub async fn end(mut self) {
        if self.send("end").await.is_ok() {
            let _ = tokio::time::timeout(END_TIMEOUT, async {
                while !matches!(self.next().await, Event::GuardianGone) {}
            })
            .await;
        }
        drop(self.out.take());
        // Bounded: a guardian that did not finish is killed, after its descendants (they
        // would be orphaned out of anyone's reach).
        if tokio::time::timeout(END_TIMEOUT, self.guardian.wait())
            .await
            .is_err()
        {
            #[cfg(target_os = "linux")]
            for f in descendants_of(self.pid) {
                let _ = signal::kill(f.pid, Signal::SIGKILL);
            }
            self.signal_here(Signal::SIGKILL);
            let _ = signal::kill(self.pid, Signal::SIGKILL);
            let _ = self.guardian.wait().await;
        }
        if self.took_terminal {
            let stdin = std::io::stdin();
            without_sigttou(|| {
                let _ = nix::unistd::tcsetpgrp(&stdin, nix::unistd::getpgrp());
            });
        }
    }

    fn take_terminal(&mut self) {
        let Some(pgid) = self.pgid else { return };
        let stdin = std::io::stdin();
        if matches!(nix::unistd::tcgetpgrp(&stdin), Ok(fg) if fg == nix::unistd::getpgrp()) {
            self.took_terminal = without_sigttou(|| nix::unistd::tcsetpgrp(&stdin, pgid).is_ok());
        }
    }
}

/// The terminal's modes when CMD started, put back after it: a command killed in raw or
/// no-echo mode (by the lease, or by its own crash) would otherwise leave the terminal so,
/// and the shell, seeing `slate` exit normally, would keep them.
pub struct TtyModes(Option<nix::sys::termios::Termios>);

impl TtyModes {
    /// The modes of `slate`'s standard input, if it is a terminal.
    #[must_use]
    pub fn save() -> Self {
        Self(nix::sys::termios::tcgetattr(std::io::stdin()).ok())
    }

    /// Puts the saved modes back, only while `slate`'s job owns the terminal (a background
    /// job must not change the modes of whatever runs in the foreground), and at once
    /// (draining the output first could block on a stopped terminal, with the lock held).
    pub fn restore(&self) {
        let Some(modes) = &self.0 else { return };
        let stdin = std::io::stdin();
        if matches!(nix::unistd::tcgetpgrp(&stdin), Ok(fg) if fg == nix::unistd::getpgrp()) {
            let _ = nix::sys::termios::tcsetattr(&stdin, nix::sys::termios::SetArg::TCSANOW, modes);
        }
    }
}

/// Runs `f` with SIGTTOU blocked on this thread: a process outside the terminal's foreground
/// group may then take the terminal back (otherwise the kernel stops it with SIGTTOU).
fn without_sigttou<T>(f: impl FnOnce() -> T) -> T {
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let mut old = SigSet::empty();
    let blocked = signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut old));
    let out = f();
    if blocked.is_ok() {
        let _ = signal::pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
    }
    out
}

/// `t` on the system-wide monotonic clock (`CLOCK_MONOTONIC`, which `Instant` reads on Linux),
/// in nanoseconds: the form a deadline crosses the process boundary in.
fn monotonic_ns(t: Instant) -> u128 {
    let now = Instant::now();
    let mono = mono_now();
    if t >= now {
        mono + (t - now).as_nanos()
    } else {
        mono.saturating_sub((now - t).as_nanos())
    }
}

/// The monotonic clock now, in nanoseconds.
fn mono_now() -> u128 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).map_or(0, |ts| {
        u128::try_from(ts.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u128::try_from(ts.tv_nsec()).unwrap_or(0)
    })
}

/// The tokio instant of a monotonic-clock time in nanoseconds.
fn from_monotonic_ns(ns: u128) -> tokio::time::Instant {
    let mono = mono_now();
    let now = tokio::time::Instant::now();
    if ns >= mono {
        let ahead = u64::try_from(ns - mono).unwrap_or(u64::MAX);
        now.checked_add(Duration::from_nanos(ahead))
            .unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
    } else {
        let behind = u64::try_from(mono - ns).unwrap_or(u64::MAX);
        now.checked_sub(Duration::from_nanos(behind)).unwrap_or(now)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The guardian's arguments (`slate guard --socket PATH -- CMD...`).
#[derive(Debug, clap::Args)]
pub struct GuardArgs {
    /// The socket `slate run` listens on.
    #[arg(long)]
    socket: PathBuf,
    /// The process group CMD joins (`slate`'s, the shell's job); else the guardian's.
    #[arg(long)]
    join_group: Option<i32>,
    /// The command to run.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    command: Vec<OsString>,
}

/// The guardian (`slate guard`). Returns its exit code.
pub fn guard(args: &GuardArgs) -> u8 {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return exit::INTERNAL;
    };
    rt.block_on(Guardian::serve(args))
}

/// The guardian's state.
struct Guardian {
    out: OwnedWriteHalf,
    cmd: Option<Pid>,
    /// The guardian acted on its kill deadline: the lease is over, CMD may no longer start.
    expired: bool,
    kill_at: Option<tokio::time::Instant>,
    term_at: Option<tokio::time::Instant>,
    termed: bool,
}

impl Guardian {
    async fn serve(args: &GuardArgs) -> u8 {
        // The terminal sends INT/QUIT/HUP (and `kill` TERM) to the whole foreground group; the
        // guardian must outlive them. Handled (by tokio's signal driver), they are harmless,
        // and a handled signal is reset to the default in CMD by `exec`. One inherited as
        // ignored (`nohup`) stays ignored, here and in CMD.
        use tokio::signal::unix::SignalKind;
        let ignored = ignored_signals();
        let mut handlers = Vec::new();
        for (sig, kind) in [
            (Signal::SIGINT, SignalKind::interrupt()),
            (Signal::SIGTERM, SignalKind::terminate()),
            (Signal::SIGHUP, SignalKind::hangup()),
            (Signal::SIGQUIT, SignalKind::quit()),
            // Ctrl-Z stops the job, never its guardian (it keeps the lease's time).
            (
                Signal::SIGTSTP,
                SignalKind::from_raw(Signal::SIGTSTP as i32),
            ),
            (
                Signal::SIGTTIN,
                SignalKind::from_raw(Signal::SIGTTIN as i32),
            ),
            (
                Signal::SIGTTOU,
                SignalKind::from_raw(Signal::SIGTTOU as i32),
            ),
        ] {
            if !ignored.contains(&sig) {
                match tokio::signal::unix::signal(kind) {
                    Ok(h) => handlers.push(h),
                    Err(_) => return exit::INTERNAL,
                }
            }
        }
        let Ok(mut children) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
        else {
            return exit::INTERNAL;
        };
        #[cfg(target_os = "linux")]
        if !can_find_descendants() {
            eprintln!(
                "slate: /proc is not mounted: the guardian could not find the command's \
                 processes to end them with the lease; mount /proc (or run slate where it is)"
            );
            return exit::INTERNAL;
        }
        #[cfg(target_os = "linux")]
        let _ = CGROUP.set(Cgroup::create());
        #[cfg(target_os = "linux")]
        if nix::sys::prctl::set_child_subreaper(true).is_err() {
            eprintln!(
                "slate guard: cannot become a child subreaper; orphans of the command may escape"
            );
        }
        let Ok(stream) = UnixStream::connect(&args.socket).await else {
            remove_cgroup();
            return exit::INTERNAL;
        };
        let (read, out) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        let mut g = Guardian {
            out,
            cmd: None,
            expired: false,
            kill_at: None,
            term_at: None,
            termed: false,
        };
        if g.say("ready").await.is_err() {
            remove_cgroup();
            return exit::INTERNAL;
        }
        loop {
            let term_at = g.term_at.filter(|_| !g.termed);
            let kill_at = g.kill_at;
            tokio::select! {
                line = lines.next_line() => match line {
                    Ok(Some(line)) => {
                        if g.command(&line, args).await {
                            return exit::OK;
                        }
                    }
                    // `slate run` is gone: nothing may run on.
                    Ok(None) | Err(_) => {
                        kill_tree();
                        remove_cgroup();
                        return exit::OK;
                    }
                },
                _ = children.recv() => g.reap().await,
                () = sleep_until(term_at) => {
                    g.termed = true;
                    terminate_tree();
                    let _ = g.say("acted term").await;
                }
                () = sleep_until(kill_at) => {
                    g.kill_at = None;
                    g.expired = true;
                    kill_tree();
                    let _ = g.say("acted kill").await;
                    g.reap().await;
                }
            }
        }
    }

    async fn say(&mut self, line: &str) -> std::io::Result<()> {
        self.out.write_all(format!("{line}\n").as_bytes()).await
    }

    /// Acts on one line from `slate run`; true when the guardian is done.
    async fn command(&mut self, line: &str, args: &GuardArgs) -> bool {
        let mut words = line.split(' ');
        match words.next() {
            Some("deadline") => {
                let kill = words.next().and_then(|w| w.parse().ok());
                let term = words.next().and_then(|w| w.parse().ok());
                self.kill_at = kill.map(from_monotonic_ns);
                self.term_at = term.map(from_monotonic_ns);
            }
            Some("run") => {
                let env: Vec<(Vec<u8>, Vec<u8>)> = words
                    .filter_map(|w| {
                        let (k, v) = w.split_once('=')?;
                        Some((unhex(k)?, unhex(v)?))
                    })
                    .collect();
                // A `run` that comes after the lease's end (slate stopped between the deadline
                // and the run) starts nothing.
                let expired = self.expired
                    || self
                        .kill_at
                        .is_some_and(|t| t <= tokio::time::Instant::now());
                let answer = if expired {
                    self.expired = true;
                    self.kill_at = None;
                    format!(
                        "failed {} the lease ran out before the command could start",
                        exit::LEASE_LOST
                    )
                } else {
                    self.spawn(&args.command, args.join_group, &env)
                };
                let _ = self.say(&answer).await;
            }
            Some("kill") => {
                kill_tree();
                self.reap().await;
            }
            Some("signal") => {
                // `signal N outside`: the terminal sent it to the job (`slate`'s group), so
                // only the processes that left the group still need it.
                if let Some(sig) = words
                    .next()
                    .and_then(|w| w.parse::<i32>().ok())
                    .and_then(|n| Signal::try_from(n).ok())
                {
                    let skip = (words.next() == Some("outside"))
                        .then_some(args.join_group)
                        .flatten();
                    signal_tree(sig, skip);
                }
            }
            Some("term") => {
                let grace = words
                    .next()
                    .and_then(|w| w.parse().ok())
                    .map_or(Duration::ZERO, Duration::from_millis);
                terminate_tree();
                self.termed = true;
                let at = tokio::time::Instant::now() + grace;
                self.kill_at = Some(self.kill_at.map_or(at, |k| k.min(at)));
            }
            Some("end") => {
                kill_tree();
                self.reap().await;
                remove_cgroup();
                return true;
            }
            _ => {}
        }
        false
    }

    /// Starts CMD (in the guardian's process group); the answer for `slate run`.
    fn spawn(
        &mut self,
        command: &[OsString],
        group: Option<i32>,
        env: &[(Vec<u8>, Vec<u8>)],
    ) -> String {
        use std::os::unix::ffi::OsStringExt;
        use std::os::unix::process::CommandExt;
        let Some((program, rest)) = command.split_first() else {
            return format!("failed {} no command given", exit::USAGE);
        };
        let mut cmd = std::process::Command::new(program);
        cmd.args(rest);
        if let Some(group) = group {
            cmd.process_group(group);
        }
        for (k, v) in env {
            cmd.env(OsString::from_vec(k.clone()), OsString::from_vec(v.clone()));
        }
        #[cfg(target_os = "linux")]
        let spawned = match CGROUP.get() {
            Some(Some(cgroup)) => cgroup.spawn_inside(|| cmd.spawn()),
            _ => cmd.spawn(),
        };
        #[cfg(not(target_os = "linux"))]
        let spawned = cmd.spawn();
        match spawned {
            Ok(child) => {
                let pid = i32::try_from(child.id()).unwrap_or(0);
                // Reaped by `reap` (waitpid), not through the handle.
                drop(child);
                self.cmd = Some(Pid::from_raw(pid));
                format!("started {pid}")
            }
            Err(e) => {
                let shown = program.to_string_lossy();
                match e.kind() {
                    ErrorKind::NotFound => {
                        format!("failed {} {shown}: command not found", exit::NOT_FOUND)
                    }
                    ErrorKind::PermissionDenied => {
                        format!("failed {} {shown}: permission denied", exit::CANNOT_EXECUTE)
                    }
                    _ => format!("failed {} {shown}: cannot run: {e}", exit::CANNOT_EXECUTE),
                }
            }
        }
    }

    /// Reaps every child that exited (CMD and the orphans re-parented here); reports CMD's
    /// status.
    async fn reap(&mut self) {
        use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if Some(pid) == self.cmd => {
                    self.cmd = None;
                    let _ = self.say(&format!("exited {}", (code & 0xff) << 8)).await;
                }
                Ok(WaitStatus::Signaled(pid, sig, core)) if Some(pid) == self.cmd => {
                    self.cmd = None;
                    let raw = sig as i32 | if core { 0x80 } else { 0 };
                    let _ = self.say(&format!("exited {raw}")).await;
                }
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Signals inherited as ignored, from `/proc/self/status` (`SigIgn`); none elsewhere. `slate`
/// installs no handler for them (so that the guardian and CMD inherit them ignored).
#[must_use]
pub fn ignored_signals() -> Vec<Signal> {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return Vec::new();
    };
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .unwrap_or(0);
    [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGTSTP,
        Signal::SIGTTIN,
        Signal::SIGTTOU,
    ]
    .into_iter()
    .filter(|&s| mask & (1 << (s as i32 - 1)) != 0)
    .collect()
}

/// A descendant found in `/proc`.
#[cfg(target_os = "linux")]
#[derive(Clone, Copy, Debug)]
struct Found {
    pid: Pid,
    /// It shows as a zombie (dead, or its main thread exited while others run).
    zombie: bool,
    /// Its process group.
    pgrp: i32,
}

/// The descendants of this process, from `/proc`.
#[cfg(target_os = "linux")]
fn descendants() -> Vec<Found> {
    descendants_of(Pid::this())
}

/// The descendants of `root`, from `/proc`.
#[cfg(target_os = "linux")]
fn descendants_of(root: Pid) -> Vec<Found> {
    use std::collections::HashMap;
    let mut children: HashMap<i32, Vec<Found>> = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": the name may hold spaces and parentheses.
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let mut fields = rest.split(' ');
        let state = fields.next().unwrap_or("");
        let Some(ppid) = fields.next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        let pgrp = fields
            .next()
            .and_then(|p| p.parse::<i32>().ok())
            .unwrap_or(0);
        // A zombie is walked through too: a process whose main thread exited shows `Z`
        // while its other threads (and its children) run on.
        children.entry(ppid).or_default().push(Found {
            pid: Pid::from_raw(pid),
            zombie: state == "Z" || state == "X",
            pgrp,
        });
    }
    let mut found = Vec::new();
    let mut next = vec![root.as_raw()];
    while let Some(p) = next.pop() {
        for &f in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            found.push(f);
            next.push(f.pid.as_raw());
        }
    }
    found
}

/// Whether this machine lets the guardian find its descendants (`/proc` mounted).
#[cfg(target_os = "linux")]
fn can_find_descendants() -> bool {
    std::fs::metadata("/proc/self/stat").is_ok()
}

/// CMD's tree in a cgroup v2 of its own, where the guardian may make one (Linux, a cgroup2
/// hierarchy mounted, the guardian's own cgroup writable): `cgroup.kill` ends every process
/// in it at once, so a tree that forks faster than the `/proc` walk kills cannot outrun it.
/// The guardian steps into it only to start CMD (so that every process of the tree is born
/// inside) and out again at once; it never kills through a cgroup it could not leave.
#[cfg(target_os = "linux")]
struct Cgroup {
    dir: PathBuf,
    /// The guardian's own cgroup, where it goes back to.
    parent: PathBuf,
    /// Whether `cgroup.kill` may be used: CMD was started inside and the guardian is out.
    usable: std::sync::atomic::AtomicBool,
}

/// The guardian's cgroup for CMD's tree, once set up (`None`: none could be made).
#[cfg(target_os = "linux")]
static CGROUP: std::sync::OnceLock<Option<Cgroup>> = std::sync::OnceLock::new();

/// Writes `data` to an existing file (a cgroup's control files exist; creating one would mean
/// the directory is not a cgroup).
#[cfg(target_os = "linux")]
fn write_existing(path: &Path, data: &str) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(data.as_bytes())
}

#[cfg(target_os = "linux")]
impl Cgroup {
    /// A new, empty cgroup below the guardian's own cgroup v2; `None` where there is no
    /// cgroup2 hierarchy mounted or the guardian may not make one there.
    fn create() -> Option<Self> {
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let rel = own.lines().find_map(|l| l.strip_prefix("0::"))?.to_owned();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        for line in mounts.lines() {
            // "id parent major:minor root mount-point options ... - fstype source options"
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            if !right.starts_with("cgroup2 ") {
                continue;
            }
            let fields: Vec<&str> = left.split(' ').collect();
            let (Some(root), Some(point)) = (fields.get(3), fields.get(4)) else {
                continue;
            };
            let root = root.trim_end_matches('/');
            let Some(below) = rel
                .strip_prefix(root)
                .filter(|b| b.is_empty() || b.starts_with('/'))
            else {
                continue;
            };
            let parent = Path::new(point).join(below.trim_start_matches('/'));
            // A real cgroup directory has its control files.
            if !parent.join("cgroup.procs").is_file() {
                continue;
            }
            let dir = parent.join(format!("slate-run-{}", std::process::id()));
            if std::fs::create_dir(&dir).is_err() {
                continue;
            }
            if !dir.join("cgroup.kill").is_file() {
                // Not a cgroup after all, or a kernel without cgroup.kill (before 5.14).
                let _ = std::fs::remove_dir(&dir);
                continue;
            }
            return Some(Cgroup {
                dir,
                parent,
                usable: std::sync::atomic::AtomicBool::new(false),
            });
        }
        None
    }

    /// Runs `spawn` with the guardian inside the cgroup, so that what it starts is born
    /// there, and steps back out. If stepping in fails, CMD starts outside (the `/proc` walk
    /// still reaches it); if stepping out fails, the cgroup is never killed through (it would
    /// kill the guardian too).
    fn spawn_inside<T>(&self, spawn: impl FnOnce() -> T) -> T {
        use std::sync::atomic::Ordering;
        let me = std::process::id().to_string();
        let entered = write_existing(&self.dir.join("cgroup.procs"), &me).is_ok();
        let out = spawn();
        if entered {
            let left = write_existing(&self.parent.join("cgroup.procs"), &me).is_ok();
            self.usable.store(left, Ordering::SeqCst);
        }
        out
    }

    /// SIGKILL to every process of the tree at once.
    fn kill(&self) {
        if self.usable.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = write_existing(&self.dir.join("cgroup.kill"), "1");
        }
    }

    /// Kills what is left in it and removes it, with any cgroups made below it (a nested
    /// `slate run`'s, emptied by the same kill). A cgroup cannot be removed while its killed
    /// processes are not yet reaped, which on a loaded machine took longer than the second
    /// this waited before; bounded at 5 s: a removal that keeps failing (a process stuck in
    /// the kernel) leaves an empty cgroup behind.
    fn remove(&self) {
        self.kill();
        for _ in 0..500 {
            if remove_cgroup_dir(&self.dir) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Removes a cgroup directory and the cgroups below it, deepest first; whether it is gone.
#[cfg(target_os = "linux")]
fn remove_cgroup_dir(dir: &Path) -> bool {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_dir(&entry.path());
            }
        }
    }
    std::fs::remove_dir(dir).is_ok() || !dir.exists()
}

/// Removes the tree's cgroup, if one was made (the guardian is done).
fn remove_cgroup() {
    #[cfg(target_os = "linux")]
    if let Some(Some(cgroup)) = CGROUP.get() {
        cgroup.remove();
    }
}

/// SIGKILL to every descendant until none is left (their zombies are reaped by the guardian,
/// their parent or subreaper): through the tree's cgroup at once where there is one, then
/// process by process as found in `/proc`.
fn kill_tree() {
    #[cfg(target_os = "linux")]
    {
        if let Some(Some(cgroup)) = CGROUP.get() {
            cgroup.kill();
        }
        for _ in 0..KILL_ROUNDS {
            let found = descendants();
            if found.iter().all(|f| f.zombie) {
                return;
            }
            for f in found {
                let _ = signal::kill(f.pid, Signal::SIGKILL);
            }
            // Let the kills land before looking again. Nothing is reaped here: CMD's status
            // must reach `reap` (which the callers run next).
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        // The group, the guardian included: the best a portable process can do.
        let _ = signal::killpg(nix::unistd::getpgrp(), Signal::SIGKILL);
    }
}

/// SIGTERM to every descendant (`--on-lost term`).
fn terminate_tree() {
    signal_tree(Signal::SIGTERM, None);
}

/// `sig` to every descendant, except those in process group `skip` (elsewhere than Linux: to
/// the group, the guardian included, which handles the forwarded signals).
fn signal_tree(sig: Signal, skip: Option<i32>) {
    #[cfg(target_os = "linux")]
    for f in descendants() {
        if Some(f.pgrp) != skip {
            let _ = signal::kill(f.pid, sig);
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = skip;
        let _ = signal::killpg(nix::unistd::getpgrp(), sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_any_bytes() {
        for bytes in [&b""[..], b"SLATE_LOCK", b"\x00\xff a=b"] {
            assert_eq!(unhex(&hex(bytes)).as_deref(), Some(bytes));
        }
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn monotonic_times_cross_the_process_boundary() {
        let t = Instant::now() + Duration::from_secs(3);
        let back = from_monotonic_ns(monotonic_ns(t));
        let diff = back.into_std().max(t) - back.into_std().min(t);
        assert!(diff < Duration::from_millis(50), "{diff:?}");
    }

    #[test]
    fn margins() {
        assert_eq!(
            kill_margin(Duration::from_secs(2)),
            Duration::from_millis(100)
        );
        assert_eq!(
            kill_margin(Duration::from_millis(100)),
            Duration::from_millis(10)
        );
        assert_eq!(kill_margin(Duration::from_secs(60)), Duration::from_secs(1));
        assert_eq!(
            term_grace(Duration::from_secs(8), Duration::from_secs(5)),
            Duration::from_secs(2)
        );
    }
}
