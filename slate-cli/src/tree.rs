//! CMD's process tree and its guardian: no process of CMD's tree outlives `slate run`'s hold
//! of the lock, whatever kills `slate` (SIGKILL, the OOM killer, a container runtime).
//!
//! ## How
//!
//! - The **guardian** is a second `slate` process (`slate guard`, internal) started first, as
//!   the leader of a new process group. It ignores the terminal's signals (INT, TERM, HUP,
//!   QUIT), blocks on a pipe from `slate run` whose write end only `slate run` holds, and when
//!   that pipe closes (`slate run` exited or was killed: the kernel closes its descriptors) it
//!   sends SIGKILL to its whole process group, itself included.
//! - **CMD** is started in the guardian's process group, so CMD's children and grandchildren
//!   are in it too unless they leave it on purpose (`setsid`, a daemon's double fork).
//! - When CMD exits, `slate run` kills whatever CMD left running in the group (and the
//!   guardian) **before** it releases the lock; when the lease is lost, `--on-lost` signals go
//!   to the whole group.
//! - If `slate` owned the terminal (foreground), the group gets it while CMD runs (an
//!   interactive CMD can read the terminal and gets Ctrl-C directly), and `slate` takes it back
//!   after.
//!
//! Between `slate`'s death and the group's SIGKILL there is one pipe wake-up (microseconds);
//! the lock's entry outlives `slate` by at least half a lease (it was renewed every half
//! lease), so the tree is gone before any other holder can be granted the lock. The lease
//! stays the outer bound for what no process can see: a machine that stops as a whole.
//!
//! This holds on every Unix (process groups, `killpg` and pipe EOF are POSIX). What escapes:
//! a process that leaves the group (`setsid`), and a guardian killed on its own (SIGKILL of
//! that one PID) before `slate` dies; on Linux the supervision of a whole cgroup (systemd's
//! `KillMode=control-group`) covers both.

use std::io::Read;
use std::os::fd::AsFd;
use std::process::Stdio;

use nix::sys::signal::{self, SigSet, SigmaskHow, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, ChildStdin, Command};

/// The hidden subcommand that runs the guardian.
pub const GUARD_SUBCOMMAND: &str = "guard";

/// CMD's process group, kept by its guardian.
pub struct Tree {
    /// The group (the guardian's PID).
    pgid: Pid,
    guardian: Child,
    /// The write end of the guardian's pipe: dropping it (or dying) fires the guardian.
    lifeline: Option<ChildStdin>,
    /// Whether the group was given the terminal (and must give it back).
    took_terminal: bool,
}

impl Tree {
    /// Starts the guardian, a new process group.
    ///
    /// # Errors
    ///
    /// The guardian could not be started (then CMD must not be).
    pub fn start() -> std::io::Result<Self> {
        let exe = std::env::current_exe()?;
        let mut guardian = Command::new(exe)
            .arg(GUARD_SUBCOMMAND)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()?;
        let lifeline = guardian.stdin.take();
        let pid = guardian
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| std::io::Error::other("the guardian exited at once"))?;
        Ok(Tree {
            pgid: Pid::from_raw(pid),
            guardian,
            lifeline,
            took_terminal: false,
        })
    }

    /// Puts `command` into the group (call before spawning it).
    pub fn adopt(&self, command: &mut Command) {
        command.process_group(self.pgid.as_raw());
    }

    /// Gives the terminal to the group if `slate` has it (so that CMD can read it and gets the
    /// terminal's signals itself).
    pub fn take_terminal(&mut self) {
        let stdin = std::io::stdin();
        if matches!(nix::unistd::tcgetpgrp(stdin.as_fd()), Ok(fg) if fg == nix::unistd::getpgrp()) {
            self.took_terminal =
                without_sigttou(|| nix::unistd::tcsetpgrp(stdin.as_fd(), self.pgid).is_ok());
        }
    }

    /// Sends `sig` to every process of the group (CMD's whole tree).
    pub fn signal(&self, sig: Signal) {
        // ESRCH: the group is already gone.
        let _ = signal::killpg(self.pgid, sig);
    }

    /// Ends the group: SIGKILL to whatever is left in it (CMD's leftovers, the guardian), the
    /// guardian reaped, the terminal given back. Call before releasing the lock.
    pub async fn end(mut self) {
        self.signal(Signal::SIGKILL);
        drop(self.lifeline.take());
        let _ = self.guardian.wait().await;
        if self.took_terminal {
            let stdin = std::io::stdin();
            without_sigttou(|| {
                let _ = nix::unistd::tcsetpgrp(stdin.as_fd(), nix::unistd::getpgrp());
            });
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

/// The guardian (`slate guard`): waits for its stdin to close, then kills its process group.
/// Returns the exit code (only reached if the group kill failed).
pub fn guard() -> u8 {
    // The terminal sends INT/QUIT/HUP (and `kill` TERM) to the whole foreground group; the
    // guardian must outlive them. Handled (by tokio's signal driver), they are harmless.
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return crate::exit::INTERNAL;
    };
    let _handlers = rt.block_on(async {
        [
            tokio::signal::unix::SignalKind::interrupt(),
            tokio::signal::unix::SignalKind::terminate(),
            tokio::signal::unix::SignalKind::hangup(),
            tokio::signal::unix::SignalKind::quit(),
        ]
        .map(tokio::signal::unix::signal)
    });
    let mut stdin = std::io::stdin().lock();
    let mut buf = [0u8; 64];
    loop {
        match stdin.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = signal::killpg(nix::unistd::getpgrp(), Signal::SIGKILL);
    crate::exit::INTERNAL
}
