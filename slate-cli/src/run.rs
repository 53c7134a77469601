//! `slate run`: take a lock, run a command while holding it (renewed), release when it exits.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use nix::sys::signal::Signal;
use slate_core::{
    BackendKind, DistributedLock, Error, HolderId, LockGuard, LossReason, NodeState, TimeoutKind,
    Wait,
};
use slate_redis::{RwLock, Semaphore};

use crate::duration::{WaitFor, human};
use crate::exit;
use crate::target::Target;
use crate::tree::{Deadlines, Event, Tree, TtyModes, kill_margin, term_grace};

/// How long CMD has between SIGTERM and SIGKILL under `--on-lost term` (at most a quarter of
/// the lease: the SIGKILL lands before the lease ends).
pub const TERM_GRACE: Duration = Duration::from_secs(5);

/// How long the release after CMD's exit may take before slate gives up on it (the entry then
/// ends with its lease).
const RELEASE_BUDGET: Duration = Duration::from_secs(10);

/// What to do with CMD when the lease is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OnLost {
    /// SIGKILL CMD at once.
    Kill,
    /// SIGTERM CMD, then SIGKILL it if it still runs 5 s later (sooner when less of the
    /// lease is left: the SIGKILL lands before the lease ends).
    Term,
    /// Let CMD go on (a warning is printed).
    Ignore,
}

/// How `slate run` takes the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Alone (the default, `--write`): the lock of the name, after any readers of the name
    /// left.
    Write,
    /// With the other readers of the name (`--read`).
    Read,
    /// `permits` of a semaphore of `of` (`--permits K --of N`).
    Permits {
        /// Permits taken.
        permits: u32,
        /// The semaphore's capacity (if it has none yet).
        of: u32,
    },
}

/// Everything `slate run` needs once arguments are parsed.
#[derive(Debug)]
pub struct RunSpec {
    /// The deployment: masters (one: single lock; several: combination lock), a cluster, or
    /// a Sentinel group.
    pub servers: crate::target::Servers,
    /// Lock name (several names: `names`, and this is them joined for messages).
    pub name: String,
    /// Every `--lock` name: more than one makes a multi-lock.
    pub names: Vec<String>,
    /// Key prefix.
    pub prefix: String,
    /// Lease.
    pub lease: Duration,
    /// Wait for the lock.
    pub wait: WaitFor,
    /// Loss policy.
    pub on_lost: OnLost,
    /// Print acquisition and release on stderr.
    pub verbose: bool,
    /// How the lock is taken.
    pub mode: Mode,
    /// The command and its arguments (non-empty).
    pub command: Vec<OsString>,
}

/// Runs `slate run` and returns the exit code.
pub async fn run(spec: RunSpec) -> u8 {
    if spec.names.len() > 1 {
        return crate::multi::run(spec).await;
    }
    let target = match Target::build(&spec.servers, &spec.name, &spec.prefix, spec.lease).await {
        Ok(t) => t,
        Err(e) => {
            return exit::of_error(&e);
        }
    };
    if let Target::Combination(lock) = &target
        && let Err(e) = lock.nodes().check_distinct_servers().await
    {
        eprintln!("slate: {e}");
        return exit::USAGE;
    }
    // A cluster node or a Sentinel given as --redis is named, with the flag to use instead.
    // (A server that does not answer is left to the acquisition, which retries within --wait.)
    if let Target::Single(lock) = &target
        && let Err(e) = lock.client().check_topology().await
        && e.is_invalid_input()
    {
        eprintln!("slate: {e}");
        return exit::USAGE;
    }
    match (target, spec.mode) {
        (Target::Combination(lock), Mode::Write) => {
            let busy = async || format!("held by another holder{}", lease_note(&lock).await);
            run_locked(
                async |h, w| lock.acquire(h, w).await,
                busy,
                &spec,
                one_token(&spec),
            )
            .await
        }
        (Target::ZooKeeper(lock), Mode::Write) => {
            let busy = async || match lock.status().await {
                Ok(s) => match s.holder {
                    Some(h) => format!(
                        "held by {} (pid {} on {}; freed at the latest {} after that process \
                         dies)",
                        h.holder.map_or_else(|| "?".to_owned(), |h| h.to_string()),
                        h.pid.map_or_else(|| "?".to_owned(), |p| p.to_string()),
                        h.host.as_deref().unwrap_or("?"),
                        h.session_timeout
                            .map_or_else(|| "its session timeout".to_owned(), human)
                    ),
                    None => "held by another holder".to_owned(),
                },
                Err(_) => "held by another holder".to_owned(),
            };
            run_locked(
                async |h, w| lock.acquire(h, w).await,
                busy,
                &spec,
                one_token(&spec),
            )
            .await
        }
        (Target::ZooKeeper(_), _) => usage(&Error::invalid_input(
            "--read/--permits",
            "read locks and semaphores live on Redis; the ZooKeeper lock is exclusive",
            "drop --read/--permits, or give --redis (or --cluster, or --sentinel)",
        )),
        (Target::Combination(_), _) => usage(&Error::invalid_input(
            "--read/--permits",
            "read locks and semaphores live on one Redis deployment, and several --redis \
             make a combination lock over independent masters",
            "give one --redis (or --cluster, or --sentinel with --master-name)",
        )),
        (Target::Single(lock), Mode::Permits { permits, of }) => {
            let sem = match Semaphore::builder(lock.client(), &spec.name, of)
                .lease(spec.lease)
                .key_prefix(&spec.prefix)
                .build()
            {
                Ok(s) => s,
                Err(e) => return usage(&e),
            };
            let busy = async || match sem.status().await {
                Ok(s) => format!(
                    "{} of {} permits in use",
                    s.in_use,
                    s.capacity.map_or_else(|| of.to_string(), |c| c.to_string())
                ),
                Err(_) => "no permits free".to_owned(),
            };
            run_locked(
                async |_, w| sem.acquire_waiting(permits, w).await,
                busy,
                &spec,
                one_token(&spec),
            )
            .await
        }
        (Target::Single(lock), mode) => {
            // The name's read-write lock, which treats its single lock as a writer.
            let readers = match RwLock::builder(lock.client(), &spec.name)
                .lease(spec.lease)
                .key_prefix(&spec.prefix)
                .spin_wait(DRAIN_POLL)
                .exclude_single_lock(true)
                .build()
            {
                Ok(r) => r,
                Err(e) => return usage(&e),
            };
            if mode == Mode::Read {
                let busy = async || format!("a writer holds it{}", lease_note(&lock).await);
                return run_locked(
                    async |h, w| readers.acquire_read(h, w).await,
                    busy,
                    &spec,
                    one_token(&spec),
                )
                .await;
            }
            let take = async |h, w| {
                let guard = lock.acquire(h, w).await?;
                match drain(&readers, w, &spec.name).await {
                    Ok(()) => Ok(guard),
                    Err(e) => {
                        let _ = guard.unlock().await;
                        Err(e)
                    }
                }
            };
            let busy = async || match readers.status().await {
                Ok(s) if s.readers() > 0 => format!("{} readers hold it", s.readers()),
                _ => format!("held by another holder{}", lease_note(&lock).await),
            };
            run_locked(take, busy, &spec, one_token(&spec)).await
        }
    }
}

/// The command's environment for a lock of one name: `SLATE_LOCK`, `SLATE_FENCING_TOKEN`
/// (`SLATE_HOLDER` is added by `run_locked`).
fn one_token<G: LockGuard>(spec: &RunSpec) -> impl Fn(&G) -> Vec<(&'static str, String)> + '_ {
    |guard: &G| {
        vec![
            ("SLATE_LOCK", spec.name.clone()),
            (
                "SLATE_FENCING_TOKEN",
                guard.fencing_token().get().to_string(),
            ),
        ]
    }
}

/// Reports a usage error.
pub(crate) fn usage(e: &Error) -> u8 {
    eprintln!("slate: {e}");
    exit::USAGE
}

/// ", whose lease ends in …" when the lock's remaining lease is known, else nothing.
async fn lease_note<L: DistributedLock>(lock: &L) -> String {
    match lock.remaining_lease().await {
        Ok(Some(d)) if d != Duration::MAX => format!(", whose lease ends in {}", human(d)),
        _ => String::new(),
    }
}

/// How often a writer that holds the lock checks whether the readers left.
pub(crate) const DRAIN_POLL: Duration = Duration::from_millis(50);

/// After a writer took the lock of the name (which keeps new readers out), waits within
/// `wait` until the readers already in have left.
pub(crate) async fn drain(readers: &RwLock, wait: Wait, name: &str) -> Result<(), Error> {
    let start = Instant::now();
    loop {
        let status = readers.status().await?;
        if status.holders.is_empty() {
            return Ok(());
        }
        let out_of_time = match wait {
            Wait::Immediate => true,
            Wait::Until(t) => Instant::now() + DRAIN_POLL >= t,
            _ => false,
        };
        if out_of_time {
            let budget = match wait {
                Wait::Until(t) => t.saturating_duration_since(start),
                _ => Duration::ZERO,
            };
            return Err(Error::timeout(
                name.to_owned(),
                TimeoutKind::Wait,
                budget,
                start.elapsed(),
            ));
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

/// SIGINT, SIGTERM, SIGHUP and SIGQUIT, each with whether the kernel sent it (the terminal,
/// to the whole job) or a process did (`kill`); none for a signal `slate` inherited as
/// ignored, e.g. SIGHUP under `nohup`: it stays ignored, here and in CMD.
struct Signals {
    rx: tokio::sync::mpsc::UnboundedReceiver<(Signal, bool)>,
    handle: signal_hook::iterator::Handle,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        use signal_hook::iterator::SignalsInfo;
        use signal_hook::iterator::exfiltrator::WithOrigin;
        use signal_hook::low_level::siginfo::Cause;
        let ignored = crate::tree::ignored_signals();
        let wanted: Vec<i32> = [
            Signal::SIGINT,
            Signal::SIGTERM,
            Signal::SIGHUP,
            Signal::SIGQUIT,
        ]
        .into_iter()
        .filter(|s| !ignored.contains(s))
        .map(|s| s as i32)
        .collect();
        let mut signals = SignalsInfo::<WithOrigin>::new(&wanted)?;
        let handle = signals.handle();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("slate-signals".into())
            .spawn(move || {
                for origin in signals.forever() {
                    let Ok(sig) = Signal::try_from(origin.signal) else {
                        continue;
                    };
                    if tx.send((sig, origin.cause == Cause::Kernel)).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Signals { rx, handle })
    }

    /// The next signal, and whether the kernel sent it (the terminal, to the whole job).
    async fn next(&mut self) -> (Signal, bool) {
        match self.rx.recv().await {
            Some(received) => received,
            None => std::future::pending().await,
        }
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        self.handle.close();
    }
}

fn signal_exit(sig: Signal) -> u8 {
    exit::SIGNAL_BASE + u8::try_from(sig as i32).unwrap_or(0)
}

/// The signal `slate run` should die of once it has cleaned up (0: none).
static DIE_OF: AtomicI32 = AtomicI32::new(0);

/// The signal `slate run` ended because of, if any: it received it (while waiting, or while
/// CMD ran and CMD died of it too). Shells tell a job interrupted by Ctrl-C from one that
/// merely exited 130 by how it ended (a loop in a script stops only for the former), so
/// `main` re-raises it after everything is released.
#[must_use]
pub fn die_of() -> Option<Signal> {
    Signal::try_from(DIE_OF.load(Ordering::Relaxed)).ok()
}

fn ended_by(sig: Signal) -> u8 {
    DIE_OF.store(sig as i32, Ordering::Relaxed);
    signal_exit(sig)
}

/// Pause between attempts after a transient failure (Redis unreachable, too few nodes).
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// Printed when a combination lock failed because nodes are quarantined.
const QUARANTINE_HINT: &str = "slate: hint: a Redis server without the node marker is not used by a \
combination lock until the quarantine (30s, the lease if longer, or the bound the servers' adoption \
recorded if longer still) has passed: a fresh server cannot be told from one that lost its data. \
Wait that long, \
or, for a brand-new deployment, run `slate nodes adopt --redis URL --redis URL ...` once (never \
while a lock on them may be held).";

/// Whether an acquisition error may go away by itself (worth retrying within `--wait`).
fn is_transient(e: &Error) -> bool {
    match e {
        Error::InsufficientNodes { .. } => true,
        Error::Timeout { kind, .. } => *kind != TimeoutKind::Wait,
        _ => e.backend_kind().is_some_and(BackendKind::is_transient),
    }
}

/// Whether nodes were quarantined after a restart.
fn quarantined(e: &Error) -> bool {
    match e {
        Error::InsufficientNodes { nodes, .. } => nodes
            .iter()
            .any(|n| matches!(n.state, NodeState::Quarantined { .. })),
        _ => false,
    }
}

/// The exit code for an acquisition error.
fn acquire_error_code(e: &Error) -> u8 {
    if e.is_timeout() || e.is_busy() {
        exit::BUSY
    } else if e.is_lease_lost() {
        // A set's early name lost while a later one was taken, with no time left to take
        // the set again: the command never ran.
        exit::LEASE_LOST
    } else if e.is_invalid_input() {
        exit::USAGE
    } else if e.is_closed() {
        exit::INTERNAL
    } else {
        exit::REDIS
    }
}

/// Takes the lock with `take` (retrying transient failures within `--wait`), runs CMD and
/// releases; `busy` says who holds the lock when the wait runs out.
pub(crate) async fn run_locked<G, T, B, E>(take: T, busy: B, spec: &RunSpec, env: E) -> u8
where
    G: LockGuard,
    T: AsyncFn(HolderId, Wait) -> Result<G, Error>,
    B: AsyncFn() -> String,
    E: Fn(&G) -> Vec<(&'static str, String)>,
{
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("slate: cannot install signal handlers: {e}");
            return exit::INTERNAL;
        }
    };
    let name = &spec.name;
    // The guardian is started (and `slate`'s binary located) before the lock is taken: a run
    // that cannot guard its command must not hold the lock, even for a moment.
    let tree = match std::env::current_exe() {
        Ok(exe) => Tree::start(&exe, &spec.command).await,
        Err(e) => Err(e),
    };
    let mut tree = match tree {
        Ok(t) => t,
        Err(e) => {
            eprintln!(
                "slate: cannot start the guardian of the command ({e}); not taking lock {name:?}"
            );
            return exit::INTERNAL;
        }
    };
    let holder = HolderId::new();
    // No deadline: forever (also for a wait too long to represent).
    let deadline = match spec.wait {
        WaitFor::Forever => None,
        WaitFor::Upto(d) => Instant::now().checked_add(d),
    };
    let forever = deadline.is_none();
    let mut retrying = false;
    let guard = loop {
        let wait = match deadline {
            None => Wait::Forever,
            Some(t) if t > Instant::now() => Wait::Until(t),
            Some(_) => Wait::Immediate,
        };
        let acquired = tokio::select! {
            r = take(holder, wait) => r,
            (sig, _) = signals.next() => {
                eprintln!("slate: {sig} while waiting for lock {name:?}; not running the command");
                tree.end().await;
                return ended_by(sig);
            }
        };
        let e = match acquired {
            Ok(g) => break g,
            Err(e) => e,
        };
        let time_left = forever || deadline.is_some_and(|t| Instant::now() + RETRY_PAUSE < t);
        if is_transient(&e) && time_left {
            // Redis unreachable or too few nodes: retried within --wait (a restart or a
            // failover should not fail a job that was willing to wait).
            if !retrying {
                eprintln!(
                    "slate: cannot take lock {name:?} yet: {e}; retrying until --wait {} runs out",
                    spec.wait
                );
                retrying = true;
            }
            tokio::select! {
                () = tokio::time::sleep(RETRY_PAUSE) => continue,
                (sig, _) = signals.next() => {
                    eprintln!("slate: {sig} while waiting for lock {name:?}; not running the command");
                    tree.end().await;
                    return ended_by(sig);
                }
            }
        }
        tree.end().await;
        let code = acquire_error_code(&e);
        if code == exit::BUSY {
            eprintln!(
                "slate: lock {name:?} not acquired within {}: {}",
                spec.wait,
                busy().await
            );
        } else {
            eprintln!("slate: cannot take lock {name:?}: {e}");
            if quarantined(&e) {
                eprintln!("{QUARANTINE_HINT}");
            }
        }
        return code;
    };
    let mut env = env(&guard);
    if spec.verbose {
        let tokens: Vec<String> = env
            .iter()
            .filter(|(k, _)| k.starts_with("SLATE_FENCING_TOKEN"))
            .map(|(_, v)| v.clone())
            .collect();
        eprintln!(
            "slate: acquired lock {name:?} (fencing token {}, holder {holder})",
            tokens.join(" ")
        );
    }
    if tree.deadlines(deadlines(&guard, spec)).await.is_err() {
        eprintln!("slate: the guardian of the command died; not running the command");
        tree.end().await;
        release(guard, name, spec.verbose, false).await;
        return exit::INTERNAL;
    }
    env.push(("SLATE_HOLDER", holder.to_string()));
    // A lease lost while the lock was being taken (a set's early name, a drain of readers
    // that took long): the command must not start.
    if let Some(reason) = guard.lease().loss_reason() {
        eprintln!(
            "slate: lease on lock {name:?} lost ({reason}) before the command started; not \
             running it"
        );
        tree.end().await;
        release(guard, name, spec.verbose, true).await;
        return exit::LEASE_LOST;
    }
    let modes = TtyModes::save();
    if let Err((code, msg)) = tree.run(&env).await {
        eprintln!("slate: {msg}");
        tree.end().await;
        release(guard, name, spec.verbose, false).await;
        return code;
    }
    let outcome = supervise(&mut tree, &guard, &mut signals, spec).await;
    // Nothing of CMD's tree runs on once the lock is released.
    tree.end().await;
    // A command that ended normally put its modes back itself.
    if outcome.status.is_none_or(|s| s.signal().is_some()) {
        modes.restore();
    }
    // A lease that ended as the command exited is a loss too (the command may have run its
    // last moments without the lock).
    let lost = outcome.lost.or_else(|| guard.lease().loss_reason());
    release(guard, name, spec.verbose, lost.is_some()).await;
    match outcome.status {
        Some(status) => {
            if lost.is_some() && spec.on_lost != OnLost::Ignore {
                exit::LEASE_LOST
            } else if let Some(sig) = outcome
                .received
                .filter(|s| status.signal() == Some(*s as i32))
            {
                // CMD died of the signal `slate` got (Ctrl-C): so does `slate`.
                ended_by(sig)
            } else {
                status_code(status)
            }
        }
        None => {
            eprintln!(
                "slate: the guardian of the command died; the command was killed, processes it \
                 started may still run"
            );
            exit::INTERNAL
        }
    }
}

/// When the guardian acts on its own if no newer deadline reaches it (none under
/// `--on-lost ignore`: the command may outlive the lease; `slate`'s own death still ends it).
fn deadlines<G: LockGuard>(guard: &G, spec: &RunSpec) -> Deadlines {
    let lease_end = guard.lease_deadline();
    let kill_at = lease_end
        .checked_sub(kill_margin(spec.lease))
        .unwrap_or(lease_end);
    match spec.on_lost {
        OnLost::Kill => Deadlines {
            kill_at,
            term_at: None,
        },
        OnLost::Term => Deadlines {
            kill_at,
            term_at: kill_at.checked_sub(term_grace(spec.lease, TERM_GRACE)),
        },
        OnLost::Ignore => Deadlines {
            kill_at: far_future(),
            term_at: None,
        },
    }
}

fn far_future() -> Instant {
    let now = Instant::now();
    now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600))
        .unwrap_or(now)
}

/// The exit code mirroring CMD's status.
fn status_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(exit::INTERNAL),
        (None, Some(sig)) => exit::SIGNAL_BASE.saturating_add(u8::try_from(sig).unwrap_or(0)),
        (None, None) => exit::INTERNAL,
    }
}

/// How the supervised run ended.
struct Outcome {
    /// CMD's status; `None` when the guardian died first.
    status: Option<ExitStatus>,
    lost: Option<LossReason>,
    /// The last of SIGINT/SIGTERM/SIGHUP `slate` received while CMD ran.
    received: Option<Signal>,
}

/// Waits for CMD (through its guardian), forwarding SIGINT/SIGTERM/SIGHUP to it, sending
/// every new lease deadline to the guardian, and acting on lease loss (`--on-lost`: the
/// guardian signals CMD's whole tree, not only its process group).
async fn supervise<G: LockGuard>(
    tree: &mut Tree,
    guard: &G,
    signals: &mut Signals,
    spec: &RunSpec,
) -> Outcome {
    let name = &spec.name;
    let mut lost: Option<LossReason> = None;
    let mut received = None;
    let mut lease = guard.lease().clone();
    loop {
        tokio::select! {
            event = tree.next() => {
                let status = match event {
                    Event::Exited(status) => Some(status),
                    Event::Acted(sig) => {
                        // No renewal reached the guardian before the lease's end: this
                        // process was stopped or starved, or the renewals failed.
                        if lost.is_none() {
                            eprintln!(
                                "slate: lease on lock {name:?} lost (no renewal before its \
                                 deadline); the guardian sent the command {sig}"
                            );
                            lost = Some(LossReason::DeadlineExpired);
                        }
                        continue;
                    }
                    Event::GuardianGone => {
                        // Nothing guards the tree any more: end it from here.
                        tree.kill_orphaned();
                        None
                    }
                };
                return Outcome {
                    status,
                    lost,
                    received,
                };
            }
            (sig, from_terminal) = signals.next() => {
                received = Some(sig);
                tree.signal(sig, from_terminal).await;
            }
            () = lease.changed(), if lost.is_none() && !lease.is_closed() => {
                let _ = tree.deadlines(deadlines(guard, spec)).await;
            }
            reason = guard.lost(), if lost.is_none() => {
                lost = Some(reason);
                match spec.on_lost {
                    OnLost::Kill => {
                        eprintln!(
                            "slate: lease on lock {name:?} lost ({reason}); killing the command \
                             (SIGKILL, --on-lost kill)"
                        );
                        tree.lost(None).await;
                    }
                    OnLost::Term => {
                        let grace = term_grace(spec.lease, TERM_GRACE);
                        eprintln!(
                            "slate: lease on lock {name:?} lost ({reason}); terminating the \
                             command (SIGTERM, SIGKILL in {}, --on-lost term)",
                            human(grace)
                        );
                        tree.lost(Some(grace)).await;
                    }
                    OnLost::Ignore => {
                        eprintln!(
                            "slate: WARNING: lease on lock {name:?} lost ({reason}); the command \
                             keeps running without the lock (--on-lost ignore)"
                        );
                    }
                }
            }
        }
    }
}

/// Releases the lock after CMD's exit; failures are reported, never fatal (the entry then
/// ends with its lease).
async fn release<G: LockGuard>(guard: G, name: &str, verbose: bool, lost: bool) {
    match tokio::time::timeout(RELEASE_BUDGET, guard.unlock()).await {
        Ok(Ok(_)) => {
            if verbose {
                eprintln!("slate: released lock {name:?}");
            }
        }
        Ok(Err(e)) if lost && e.is_not_held() => {}
        Ok(Err(e)) => {
            eprintln!(
                "slate: releasing lock {name:?} failed ({e}); it ends when its lease runs out"
            );
        }
        Err(_) => eprintln!(
            "slate: releasing lock {name:?} took over {}; it ends when its lease runs out",
            human(RELEASE_BUDGET)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes() {
        assert_eq!(status_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(status_code(ExitStatus::from_raw(9)), 137);
        assert_eq!(signal_exit(Signal::SIGINT), 130);
        assert_eq!(signal_exit(Signal::SIGTERM), 143);
        assert_eq!(signal_exit(Signal::SIGHUP), 129);
    }
}
