//! `fork-probe`: draws holder ids in a process that already uses a Slate client, and in children
//! it forks *after* creating that client (reliability.md §4: "id generation must stay unique
//! after `fork()`; a per-process random prefix created before a fork would be shared").
//!
//! ```text
//! fork-probe --redis-url URL --out DIR --tag TAG [--ids N] [--forks K] [--threads T]
//! ```
//!
//! 1. Opens a `RedisClient`, builds a lock and takes and releases it (connections open,
//!    scripts loaded, holder ids drawn: the process prefix is cached).
//! 2. Forks `K` children (default 0). Each child draws `N` ids (default 20,000) on its one
//!    thread, writes them and exits.
//! 3. The process itself draws `N` ids on `T` threads (default 1), the first of them drawn
//!    before the forks, writes them, takes and releases the lock again (the client still works
//!    after the forks), and waits for its children.
//!
//! Output: `DIR/TAG-<role>.ids`, one file per process: a header line
//! `pid=<pid> parent=<pid of the forking process, or 0> role=<plain|parent|child>`, then one
//! holder id per line in its `Display` form. Prints `DONE <files>` and exits 0; on failure a
//! message on stderr and exit 1 (2 for bad arguments).
//!
//! The fork happens only when the process has exactly one thread (checked in `/proc`): a
//! current-thread tokio runtime, idle between `block_on` calls, owns no other thread. Children
//! never touch the inherited runtime, sockets or client; they draw ids, write a file and leave
//! with `std::process::exit`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid};
use slate_core::HolderId;
use slate_redis::{ClientOptions, RedisClient, SingleLock};

/// Command line.
struct Args {
    redis_url: String,
    out: PathBuf,
    tag: String,
    ids: usize,
    forks: usize,
    threads: usize,
}

fn usage(msg: &str) -> ExitCode {
    eprintln!(
        "fork-probe: {msg}\nusage: fork-probe --redis-url URL --out DIR --tag TAG [--ids N] \
         [--forks K] [--threads T]"
    );
    ExitCode::from(2)
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        redis_url: String::new(),
        out: PathBuf::new(),
        tag: String::new(),
        ids: 20_000,
        forks: 0,
        threads: 1,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<usize>()
                .map_err(|e| format!("{flag} {value}: {e}"))
        };
        match flag.as_str() {
            "--redis-url" => a.redis_url = value.clone(),
            "--out" => a.out = PathBuf::from(&value),
            "--tag" => a.tag = value.clone(),
            "--ids" => a.ids = number()?.clamp(1, 1_000_000),
            "--forks" => a.forks = number()?.min(64),
            "--threads" => a.threads = number()?.clamp(1, 64),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.redis_url.is_empty() || a.tag.is_empty() || a.out.as_os_str().is_empty() {
        return Err("--redis-url, --out and --tag are required".into());
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(msg) => return usage(&msg),
    };
    match run(&args) {
        Ok(files) => {
            println!("DONE {files}");
            ExitCode::SUCCESS
        }
        Err(msg) => {
            eprintln!("fork-probe {}: {msg}", args.tag);
            ExitCode::from(1)
        }
    }
}

/// Takes and releases the probe's lock once, within 10 s.
async fn lock_once(lock: &SingleLock) -> Result<(), String> {
    let guard = tokio::time::timeout(Duration::from_secs(10), lock.lock())
        .await
        .map_err(|_| "lock() took more than 10 s".to_owned())?
        .map_err(|e| format!("lock(): {e}"))?;
    guard
        .unlock()
        .await
        .map(drop)
        .map_err(|e| format!("unlock(): {e}"))
}

fn run(args: &Args) -> Result<usize, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let (client, lock) = rt.block_on(async {
        let client = RedisClient::open_with(
            &args.redis_url,
            ClientOptions::builder()
                .command_timeout(Duration::from_secs(5))
                .build()
                .map_err(|e| format!("client options: {e}"))?,
        )
        .map_err(|e| format!("client: {e}"))?;
        let lock = SingleLock::builder(&client, "fork-probe")
            .lease(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("lock: {e}"))?;
        lock_once(&lock).await?;
        Ok::<_, String>((client, lock))
    })?;
    // Drawn before the forks: the parent's prefix is now cached.
    let first = HolderId::new();
    let me = std::process::id();

    let mut children = Vec::new();
    if args.forks > 0 {
        let threads = thread_count()?;
        if threads != 1 {
            return Err(format!(
                "cannot fork soundly: the process has {threads} threads (expected 1)"
            ));
        }
    }
    for i in 0..args.forks {
        match fork()? {
            ForkResult::Child => {
                let path = args.out.join(format!("{}-c{i}.ids", args.tag));
                let code = match draw_and_write(&path, me, "child", None, args.ids, 1) {
                    Ok(()) => 0,
                    Err(msg) => {
                        eprintln!("fork-probe {} child {i}: {msg}", args.tag);
                        1
                    }
                };
                std::process::exit(code);
            }
            ForkResult::Parent { child } => children.push(child),
        }
    }

    let role = if args.forks > 0 { "parent" } else { "plain" };
    let path = args.out.join(format!("{}-p.ids", args.tag));
    let written = draw_and_write(&path, 0, role, Some(first), args.ids, args.threads);
    let failed_children = wait_children(&children);
    written?;
    failed_children?;
    // The parent's client still works after the forks.
    rt.block_on(lock_once(&lock))?;
    drop(lock);
    drop(client);
    Ok(1 + children.len())
}

/// The number of threads of this process (`/proc/self/task`).
fn thread_count() -> Result<usize, String> {
    std::fs::read_dir("/proc/self/task")
        .map(Iterator::count)
        .map_err(|e| format!("reading /proc/self/task: {e}"))
}

/// Forks this (single-threaded) process.
#[allow(unsafe_code)]
fn fork() -> Result<ForkResult, String> {
    // SAFETY: `fork()` is unsafe because a child of a multi-threaded process may only call
    // async-signal-safe functions (a lock held by another thread at the fork stays locked
    // forever in the child). `run` checks right before the forks that this process has exactly
    // one thread (the current-thread runtime is idle between `block_on` calls and owns no
    // other thread), so no lock can be held elsewhere. The child does not touch what it shares
    // with the parent (the runtime's epoll descriptor, the client's sockets): it draws ids,
    // writes its own file and exits with `std::process::exit`, which runs no destructor of the
    // parent's objects.
    unsafe { nix::unistd::fork() }.map_err(|e| format!("fork: {e}"))
}

/// Waits for every child; an error if one failed.
fn wait_children(children: &[Pid]) -> Result<(), String> {
    let mut failed = Vec::new();
    for &child in children {
        match waitpid(child, None) {
            Ok(WaitStatus::Exited(_, 0)) => {}
            other => failed.push(format!("{child}: {other:?}")),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("children failed: {}", failed.join(", ")))
    }
}

/// Draws `n` ids (`first` counts as one of them) on `threads` threads and writes them to
/// `path` after the header line.
fn draw_and_write(
    path: &Path,
    parent: u32,
    role: &str,
    first: Option<HolderId>,
    n: usize,
    threads: usize,
) -> Result<(), String> {
    let mut ids: Vec<HolderId> = first.into_iter().collect();
    let rest = n - ids.len();
    let drawn: Vec<Vec<HolderId>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let share = rest / threads + usize::from(t < rest % threads);
                s.spawn(move || (0..share).map(|_| HolderId::new()).collect::<Vec<_>>())
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    ids.extend(drawn.into_iter().flatten());
    if ids.len() != n {
        return Err(format!("drew {} ids instead of {n}", ids.len()));
    }
    let file = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = BufWriter::new(file);
    let write = |out: &mut BufWriter<File>| -> std::io::Result<()> {
        writeln!(
            out,
            "pid={} parent={parent} role={role}",
            std::process::id()
        )?;
        for id in &ids {
            writeln!(out, "{id}")?;
        }
        out.flush()
    };
    write(&mut out).map_err(|e| format!("{}: {e}", path.display()))
}
