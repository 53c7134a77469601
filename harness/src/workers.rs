//! Worker processes: N copies of a program, each with its own arguments and environment, their
//! output captured, and the faults a holder can suffer (kill, pause).
//!
//! ## Behaviour
//!
//! - Every worker is a separate OS process, so a signal hits exactly one holder.
//! - Background threads read each worker's stdout (by line) and stderr; scenarios use
//!   [`WorkerSet::wait_for_line`] to learn that "worker 2 now holds the lock".
//! - Signals only ever go to the PIDs of children this set spawned, and only before they are
//!   reaped (so a PID cannot have been reused).
//! - `Drop` kills (`SIGKILL`) and reaps every worker still running.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use crate::server::HarnessError;

/// Lines of stderr quoted in error messages.
const TAIL_LINES: usize = 20;
/// Poll interval of [`WorkerSet::wait_all`].
const EXIT_POLL: Duration = Duration::from_millis(10);
/// How long to wait, after a worker exits, for its output pipes to drain.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

type ArgsFn = Box<dyn Fn(usize) -> Vec<String>>;
type EnvFn = Box<dyn Fn(usize) -> Vec<(String, String)>>;

/// What one worker left behind.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
///
/// use slate_harness::workers::WorkerSet;
///
/// let mut workers = WorkerSet::spawn("/bin/echo", 2, |i| vec![format!("hello {i}")])?;
/// for out in workers.wait_all(Duration::from_secs(5))? {
///     assert!(out.status.success());
///     assert_eq!(out.stdout, format!("hello {}\n", out.index));
/// }
/// # Ok::<(), slate_harness::server::HarnessError>(())
/// ```
#[derive(Debug, Clone)]
pub struct WorkerOutput {
    /// The worker's index in its set.
    pub index: usize,
    /// How it ended (a killed worker reports the signal).
    pub status: ExitStatus,
    /// Everything it wrote to stdout (lossy UTF-8).
    pub stdout: String,
    /// Everything it wrote to stderr (lossy UTF-8).
    pub stderr: String,
}

impl WorkerOutput {
    /// Stdout split into lines.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # let mut workers = slate_harness::workers::WorkerSet::spawn("/bin/echo", 1, |_| vec![])?;
    /// let outputs = workers.wait_all(Duration::from_secs(5))?;
    /// let lines: Vec<&str> = outputs[0].stdout_lines().collect();
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn stdout_lines(&self) -> impl Iterator<Item = &str> {
        self.stdout.lines()
    }
}

/// Output collected so far from one worker.
#[derive(Debug, Default)]
struct Captured {
    stdout: String,
    lines: Vec<String>,
    stderr: String,
    stdout_closed: bool,
    stderr_closed: bool,
}

#[derive(Debug, Default)]
struct Capture {
    state: Mutex<Captured>,
    changed: Condvar,
}

impl Capture {
    fn lock(&self) -> MutexGuard<'_, Captured> {
        // Each critical section leaves the data consistent, so poisoning is harmless.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn update(&self, f: impl FnOnce(&mut Captured)) {
        f(&mut self.lock());
        self.changed.notify_all();
    }

    fn stderr_tail(&self) -> String {
        tail(&self.lock().stderr, TAIL_LINES)
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[derive(Debug)]
struct Worker {
    /// `None` once reaped.
    child: Option<Child>,
    pid: u32,
    status: Option<ExitStatus>,
    capture: Arc<Capture>,
    /// Stdout lines already consumed by [`WorkerSet::wait_for_line`].
    cursor: usize,
}

impl Worker {
    /// Reaps the child if it has exited; returns whether it still runs.
    fn poll(&mut self) -> Result<bool, HarnessError> {
        let Some(child) = self.child.as_mut() else {
            return Ok(false);
        };
        match child
            .try_wait()
            .map_err(HarnessError::io("polling a worker"))?
        {
            Some(status) => {
                self.status = Some(status);
                self.child = None;
                Ok(false)
            }
            None => Ok(true),
        }
    }

    fn kill_and_reap(&mut self) -> Result<(), HarnessError> {
        if let Some(mut child) = self.child.take() {
            // SIGKILL; harmless on an exited but unreaped child.
            let _ = child.kill();
            let status = child.wait().map_err(HarnessError::io("reaping a worker"))?;
            self.status = Some(status);
        }
        Ok(())
    }
}

/// Configures a [`WorkerSet`]: program, count, per-index arguments and environment.
///
/// # Examples
///
/// ```no_run
/// use slate_harness::workers::WorkerSet;
///
/// let workers = WorkerSet::builder("target/debug/my-worker")
///     .count(3)
///     .args(|i| vec!["--id".into(), i.to_string()])
///     .env("REDIS_URL", "redis://127.0.0.1:6379")
///     .env_for(|i| vec![("WORKER_INDEX".into(), i.to_string())])
///     .spawn()?;
/// # Ok::<(), slate_harness::server::HarnessError>(())
/// ```
#[must_use]
pub struct WorkerSetBuilder {
    program: PathBuf,
    count: usize,
    args: Option<ArgsFn>,
    env: Vec<(OsString, OsString)>,
    env_for: Option<EnvFn>,
    current_dir: Option<PathBuf>,
}

impl std::fmt::Debug for WorkerSetBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerSetBuilder")
            .field("program", &self.program)
            .field("count", &self.count)
            .field("env", &self.env)
            .field("current_dir", &self.current_dir)
            .finish_non_exhaustive()
    }
}

impl WorkerSetBuilder {
    /// How many workers (default 1).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let workers = slate_harness::workers::WorkerSet::builder("/bin/true").count(4).spawn()?;
    /// assert_eq!(workers.len(), 4);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn count(mut self, n: usize) -> Self {
        self.count = n;
        self
    }

    /// The arguments of worker `i`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let workers = slate_harness::workers::WorkerSet::builder("/bin/echo")
    ///     .count(2)
    ///     .args(|i| vec![format!("worker-{i}")])
    ///     .spawn()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn args(mut self, args: impl Fn(usize) -> Vec<String> + 'static) -> Self {
        self.args = Some(Box::new(args));
        self
    }

    /// Sets an environment variable for every worker (on top of the inherited environment).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let workers = slate_harness::workers::WorkerSet::builder("/usr/bin/env")
    ///     .env("RUST_LOG", "debug")
    ///     .spawn()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Environment variables of worker `i` (applied after [`WorkerSetBuilder::env`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let workers = slate_harness::workers::WorkerSet::builder("/usr/bin/env")
    ///     .count(2)
    ///     .env_for(|i| vec![("WORKER_INDEX".into(), i.to_string())])
    ///     .spawn()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn env_for(mut self, env: impl Fn(usize) -> Vec<(String, String)> + 'static) -> Self {
        self.env_for = Some(Box::new(env));
        self
    }

    /// The working directory of every worker.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let workers = slate_harness::workers::WorkerSet::builder("/bin/pwd")
    ///     .current_dir("/tmp")
    ///     .spawn()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.current_dir = Some(dir.into());
        self
    }

    /// Spawns the workers, in index order.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let workers = slate_harness::workers::WorkerSet::builder("/bin/true").count(2).spawn()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Io`] when a worker cannot be spawned (those already spawned are killed).
    pub fn spawn(self) -> Result<WorkerSet, HarnessError> {
        let mut set = WorkerSet {
            program: self.program.clone(),
            workers: Vec::with_capacity(self.count),
        };
        for index in 0..self.count {
            let mut cmd = Command::new(&self.program);
            if let Some(args) = &self.args {
                cmd.args(args(index));
            }
            cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
            if let Some(env_for) = &self.env_for {
                cmd.envs(env_for(index));
            }
            if let Some(dir) = &self.current_dir {
                cmd.current_dir(dir);
            }
            let mut child = cmd
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(HarnessError::io(format!(
                    "spawning worker {index} ({})",
                    self.program.display()
                )))?;
            let capture = Arc::new(Capture::default());
            let stdout = child.stdout.take();
            let stderr = child.stderr.take();
            let pid = child.id();
            // Pushed before the readers start so that `Drop` reaps it if they fail to.
            set.workers.push(Worker {
                child: Some(child),
                pid,
                status: None,
                capture: Arc::clone(&capture),
                cursor: 0,
            });
            start_readers(index, stdout, stderr, &capture)?;
        }
        Ok(set)
    }
}

fn start_readers(
    index: usize,
    stdout: Option<ChildStdout>,
    stderr: Option<ChildStderr>,
    capture: &Arc<Capture>,
) -> Result<(), HarnessError> {
    let out_capture = Arc::clone(capture);
    std::thread::Builder::new()
        .name(format!("ecosphere-worker-{index}-stdout"))
        .spawn(move || {
            if let Some(stdout) = stdout {
                let mut reader = BufReader::new(stdout);
                let mut line = Vec::new();
                // Ends at EOF (the worker and any child holding the pipe are gone) or error.
                while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
                    let text = String::from_utf8_lossy(&line).into_owned();
                    out_capture.update(|c| {
                        c.stdout.push_str(&text);
                        c.lines.push(text.trim_end_matches(['\n', '\r']).to_owned());
                    });
                    line.clear();
                }
            }
            out_capture.update(|c| c.stdout_closed = true);
        })
        .map_err(HarnessError::io("spawning a stdout reader"))?;
    let err_capture = Arc::clone(capture);
    std::thread::Builder::new()
        .name(format!("ecosphere-worker-{index}-stderr"))
        .spawn(move || {
            if let Some(mut stderr) = stderr {
                let mut buf = [0_u8; 4096];
                while let Ok(n) = stderr.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                    err_capture.update(|c| c.stderr.push_str(&text));
                }
            }
            err_capture.update(|c| c.stderr_closed = true);
        })
        .map_err(HarnessError::io("spawning a stderr reader"))?;
    Ok(())
}

/// N worker processes of one program, killed when dropped.
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
/// use slate_harness::workers::WorkerSet;
///
/// let mut workers = WorkerSet::spawn("target/debug/my-worker", 3, |i| vec![i.to_string()])?;
/// let line = workers.wait_for_line(2, |l| l.starts_with("acquired"), Duration::from_secs(5))?;
/// workers.pause(2)?; // the holder stalls, like a long GC pause
/// workers.resume(2)?;
/// workers.kill(1)?; // a crashed waiter
/// let outputs = workers.wait_all(Duration::from_secs(30))?;
/// # Ok::<(), slate_harness::server::HarnessError>(())
/// ```
#[derive(Debug)]
pub struct WorkerSet {
    program: PathBuf,
    workers: Vec<Worker>,
}

impl WorkerSet {
    /// Spawns `n` copies of `program`, worker `i` with arguments `args(i)`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let workers = slate_harness::workers::WorkerSet::spawn("/bin/echo", 3, |i| vec![i.to_string()])?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`WorkerSetBuilder::spawn`].
    pub fn spawn(
        program: impl AsRef<Path>,
        n: usize,
        args: impl Fn(usize) -> Vec<String> + 'static,
    ) -> Result<Self, HarnessError> {
        Self::builder(program).count(n).args(args).spawn()
    }

    /// A builder, for environment variables or a working directory.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let workers = slate_harness::workers::WorkerSet::builder("/usr/bin/env")
    ///     .count(2)
    ///     .env("SLATE_SEED", "42")
    ///     .spawn()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    pub fn builder(program: impl AsRef<Path>) -> WorkerSetBuilder {
        WorkerSetBuilder {
            program: program.as_ref().to_path_buf(),
            count: 1,
            args: None,
            env: Vec::new(),
            env_for: None,
            current_dir: None,
        }
    }

    /// How many workers the set has.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let workers = slate_harness::workers::WorkerSet::spawn("/bin/true", 2, |_| vec![])?;
    /// assert_eq!(workers.len(), 2);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Whether the set has no workers.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let workers = slate_harness::workers::WorkerSet::spawn("/bin/true", 0, |_| vec![])?;
    /// assert!(workers.is_empty());
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// The PID of worker `i` (stays readable after it exits).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let workers = slate_harness::workers::WorkerSet::spawn("/bin/sleep", 1, |_| vec!["1".into()])?;
    /// println!("{}", workers.pid(0));
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// When `i` is out of range.
    #[must_use]
    pub fn pid(&self, i: usize) -> u32 {
        self.workers[i].pid
    }

    fn worker(&mut self, i: usize) -> Result<&mut Worker, HarnessError> {
        let len = self.workers.len();
        self.workers
            .get_mut(i)
            .ok_or_else(|| HarnessError::Config(format!("no worker {i} (the set has {len})")))
    }

    fn signal(&mut self, i: usize, sig: Signal) -> Result<(), HarnessError> {
        let worker = self.worker(i)?;
        if !worker.poll()? {
            return Err(HarnessError::NotRunning {
                what: format!("{sig} to worker {i}: it has exited"),
            });
        }
        let pid = i32::try_from(worker.pid)
            .map_err(|_| HarnessError::Config(format!("pid {} out of range", worker.pid)))?;
        // The child is unreaped (checked just above), so this PID is still ours.
        signal::kill(Pid::from_raw(pid), sig)
            .map_err(HarnessError::signal(format!("{sig} to worker {i}")))
    }

    /// Kills worker `i` with `SIGKILL` and reaps it (a crashed holder). Does nothing if it has
    /// already exited.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut workers = slate_harness::workers::WorkerSet::spawn("/bin/sleep", 1, |_| vec!["9".into()])?;
    /// workers.kill(0)?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Config`] for a bad index; [`HarnessError::Io`] if reaping fails.
    pub fn kill(&mut self, i: usize) -> Result<(), HarnessError> {
        self.worker(i)?.kill_and_reap()
    }

    /// Stops worker `i` with `SIGSTOP` (a paused, GC-like holder).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut workers = slate_harness::workers::WorkerSet::spawn("/bin/sleep", 1, |_| vec!["9".into()])?;
    /// workers.pause(0)?;
    /// workers.resume(0)?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Config`] for a bad index; [`HarnessError::NotRunning`] when it has
    /// exited; [`HarnessError::Signal`] if `kill(2)` fails.
    pub fn pause(&mut self, i: usize) -> Result<(), HarnessError> {
        self.signal(i, Signal::SIGSTOP)
    }

    /// Continues worker `i` with `SIGCONT`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut workers = slate_harness::workers::WorkerSet::spawn("/bin/sleep", 1, |_| vec!["9".into()])?;
    /// workers.pause(0)?;
    /// workers.resume(0)?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`WorkerSet::pause`].
    pub fn resume(&mut self, i: usize) -> Result<(), HarnessError> {
        self.signal(i, Signal::SIGCONT)
    }

    /// Whether worker `i` is still running (a paused worker counts as running).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut workers = slate_harness::workers::WorkerSet::spawn("/bin/sleep", 1, |_| vec!["9".into()])?;
    /// assert!(workers.is_running(0)?);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Config`] for a bad index; [`HarnessError::Io`] if polling fails.
    pub fn is_running(&mut self, i: usize) -> Result<bool, HarnessError> {
        self.worker(i)?.poll()
    }

    /// The stdout lines worker `i` has printed so far.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let workers = slate_harness::workers::WorkerSet::spawn("/bin/echo", 1, |_| vec!["hi".into()])?;
    /// let lines = workers.stdout_lines(0);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// When `i` is out of range.
    #[must_use]
    pub fn stdout_lines(&self, i: usize) -> Vec<String> {
        self.workers[i].capture.lock().lines.clone()
    }

    /// What worker `i` has written to stderr so far.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let workers = slate_harness::workers::WorkerSet::spawn("/bin/true", 1, |_| vec![])?;
    /// let stderr = workers.stderr(0);
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Panics
    ///
    /// When `i` is out of range.
    #[must_use]
    pub fn stderr(&self, i: usize) -> String {
        self.workers[i].capture.lock().stderr.clone()
    }

    /// Blocks until worker `i` prints a stdout line matching `predicate`, and returns it.
    ///
    /// Lines are consumed: each call looks only at lines after the one the previous call
    /// returned, so waiting twice for `"acquired"` waits for the second acquisition.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let mut workers = slate_harness::workers::WorkerSet::spawn("target/debug/my-worker", 3, |i| {
    ///     vec![i.to_string()]
    /// })?;
    /// workers.wait_for_line(2, |line| line == "acquired", Duration::from_secs(5))?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Timeout`] when no such line comes in time; [`HarnessError::Worker`] when
    /// the worker closes stdout (exits) first; both carry its stderr tail.
    /// [`HarnessError::Config`] for a bad index.
    pub fn wait_for_line(
        &mut self,
        i: usize,
        predicate: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Result<String, HarnessError> {
        let deadline = Instant::now() + timeout;
        let worker = self.worker(i)?;
        let capture = Arc::clone(&worker.capture);
        let mut captured = capture.lock();
        // Set when stdout is seen closed: no line can come any more, but stderr gets a moment
        // to drain so the error carries it.
        let mut drain_deadline: Option<Instant> = None;
        loop {
            while worker.cursor < captured.lines.len() {
                let line = &captured.lines[worker.cursor];
                worker.cursor += 1;
                if predicate(line) {
                    return Ok(line.clone());
                }
            }
            let now = Instant::now();
            let wait_until = if captured.stdout_closed {
                let drain_until = *drain_deadline.get_or_insert(now + DRAIN_TIMEOUT);
                if captured.stderr_closed || now >= drain_until {
                    let stderr = tail(&captured.stderr, TAIL_LINES);
                    return Err(HarnessError::Worker {
                        index: i,
                        what: format!(
                            "closed stdout (exited?) before printing a matching line\n\
                             --- stderr tail ---\n{stderr}"
                        ),
                    });
                }
                drain_until
            } else if now >= deadline {
                let stdout = tail(&captured.stdout, TAIL_LINES);
                let stderr = tail(&captured.stderr, TAIL_LINES);
                return Err(HarnessError::Timeout {
                    what: format!(
                        "worker {i} printing a matching line within {timeout:?}\n\
                         --- stdout tail ---\n{stdout}\n--- stderr tail ---\n{stderr}"
                    ),
                });
            } else {
                deadline
            };
            captured = capture
                .changed
                .wait_timeout(captured, wait_until - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// Waits until every worker has exited, and returns their outputs in index order.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let mut workers = slate_harness::workers::WorkerSet::spawn("/bin/echo", 3, |i| vec![i.to_string()])?;
    /// let outputs = workers.wait_all(Duration::from_secs(10))?;
    /// assert!(outputs.iter().all(|out| out.status.success()));
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Timeout`] when some are still running at the deadline: those are killed
    /// and reaped, and the error lists them with their stderr tails. [`HarnessError::Io`] if
    /// polling or reaping fails.
    pub fn wait_all(&mut self, timeout: Duration) -> Result<Vec<WorkerOutput>, HarnessError> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut running = Vec::new();
            for (index, worker) in self.workers.iter_mut().enumerate() {
                if worker.poll()? {
                    running.push(index);
                }
            }
            if running.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                let mut report = String::new();
                for &index in &running {
                    let worker = &mut self.workers[index];
                    worker.kill_and_reap()?;
                    report.push_str(&format!(
                        "\n--- worker {index} (pid {}) stderr tail ---\n{}",
                        worker.pid,
                        worker.capture.stderr_tail()
                    ));
                }
                return Err(HarnessError::Timeout {
                    what: format!(
                        "workers {running:?} of {} still running after {timeout:?}; killed them{report}",
                        self.program.display()
                    ),
                });
            }
            std::thread::sleep(EXIT_POLL);
        }
        let drain_deadline = Instant::now() + DRAIN_TIMEOUT;
        let mut outputs = Vec::with_capacity(self.workers.len());
        for (index, worker) in self.workers.iter().enumerate() {
            let capture = &worker.capture;
            let remaining = drain_deadline.saturating_duration_since(Instant::now());
            // A grandchild holding the pipes open would keep them from closing: bounded.
            let captured = capture
                .changed
                .wait_timeout_while(capture.lock(), remaining, |c| {
                    !(c.stdout_closed && c.stderr_closed)
                })
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
            let status = worker.status.ok_or_else(|| HarnessError::NotRunning {
                what: format!("worker {index} has no exit status"),
            })?;
            outputs.push(WorkerOutput {
                index,
                status,
                stdout: captured.stdout.clone(),
                stderr: captured.stderr.clone(),
            });
        }
        Ok(outputs)
    }

    /// The exit status of every worker that has exited so far, by index.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut workers = slate_harness::workers::WorkerSet::spawn("/bin/true", 2, |_| vec![])?;
    /// let exited = workers.exited()?;
    /// # Ok::<(), slate_harness::server::HarnessError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HarnessError::Io`] if polling fails.
    pub fn exited(&mut self) -> Result<HashMap<usize, ExitStatus>, HarnessError> {
        let mut exited = HashMap::new();
        for (index, worker) in self.workers.iter_mut().enumerate() {
            worker.poll()?;
            if let Some(status) = worker.status {
                exited.insert(index, status);
            }
        }
        Ok(exited)
    }
}

impl Drop for WorkerSet {
    fn drop(&mut self) {
        for worker in &mut self.workers {
            let _ = worker.kill_and_reap();
        }
    }
}
