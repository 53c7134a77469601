//! cgroup v1 groups for worker processes: starve one of CPU (`cpu` controller, CFS quota) or
//! freeze it (`freezer` controller), for the single-lock scenarios S3 (freezer variant) and
//! S4 (renewal starved of CPU) of the fault matrix.
//!
//! ## Behaviour
//!
//! - [`Cgroup::create`] makes a uniquely named group (`ecosphere-<pid>-<n>`) under
//!   `/sys/fs/cgroup/<controller>` (or the root given to [`Cgroup::create_under`]).
//! - [`Cgroup::add`] moves a whole process (every thread) into it; pass only PIDs of processes
//!   the test started itself (e.g. [`crate::workers::WorkerSet::pid`]). The process's previous
//!   group of that controller is remembered.
//! - `Drop` lifts the quota, thaws the group, moves every process still in it back where it
//!   came from (or to the controller's root), and removes the directory, also while a test
//!   panics. Errors there are printed, never raised.
//! - Nothing is retried in the background; every wait (freezing) is bounded.
//!
//! # Examples
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use slate_harness::cgroup::{Cgroup, Controller};
//!
//! let mut child = std::process::Command::new("sleep").arg("5").spawn()?;
//! let mut group = Cgroup::create(Controller::Cpu)?;
//! group.add(child.id())?;
//! // 1 ms of CPU per 100 ms period: about 1 % of one core.
//! group.set_cpu_quota(Duration::from_millis(1), Duration::from_millis(100))?;
//! drop(group); // quota lifted, the child moved back, the group removed
//! child.kill()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Where cgroup v1 controllers are mounted on this machine.
pub const CGROUP_V1_ROOT: &str = "/sys/fs/cgroup";

/// How long [`Cgroup::freeze`] waits for `freezer.state` to read `FROZEN`.
const FREEZE_WAIT: Duration = Duration::from_secs(5);

/// Attempts to remove the directory on drop (it can be busy for a moment after the last
/// process left).
const RMDIR_TRIES: u32 = 50;

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A cgroup v1 controller this module drives.
///
/// # Examples
///
/// ```
/// assert_eq!(slate_harness::cgroup::Controller::Cpu.name(), "cpu");
/// ```
///
/// # Errors
///
/// Not applicable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Controller {
    /// CPU bandwidth: `cpu.cfs_quota_us` / `cpu.cfs_period_us`.
    Cpu,
    /// Freezing: `freezer.state`.
    Freezer,
}

impl Controller {
    /// The controller's name (its directory under `/sys/fs/cgroup` and its field in
    /// `/proc/<pid>/cgroup`).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_harness::cgroup::Controller::Freezer.name(), "freezer");
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn name(self) -> &'static str {
        match self {
            Controller::Cpu => "cpu",
            Controller::Freezer => "freezer",
        }
    }
}

/// Errors of this module.
///
/// # Examples
///
/// ```
/// use slate_harness::cgroup::{Cgroup, CgroupError, Controller};
/// let err = Cgroup::create_under(Controller::Cpu, "/nonexistent/cgroup").unwrap_err();
/// assert!(matches!(err, CgroupError::Unavailable(_)));
/// ```
///
/// # Errors
///
/// Not applicable.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The controller is not mounted or a group cannot be made here (not root, no cgroup v1):
    /// scenarios that need it skip with this reason.
    #[error("cgroups unavailable: {0}")]
    Unavailable(String),
    /// Reading or writing a control file failed.
    #[error("cgroup file {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The freezer did not reach `FROZEN` in time.
    #[error("freezer state stayed {state:?} for {waited:?}")]
    FreezeTimeout {
        /// The last state read.
        state: String,
        /// How long it waited.
        waited: Duration,
    },
}

/// One cgroup v1 group, removed on drop.
///
/// # Examples
///
/// ```no_run
/// use slate_harness::cgroup::{Cgroup, Controller};
///
/// let mut child = std::process::Command::new("sleep").arg("5").spawn()?;
/// let mut group = Cgroup::create(Controller::Freezer)?;
/// group.add(child.id())?;
/// group.freeze()?; // like SIGSTOP, but the process cannot tell
/// group.thaw()?;
/// # child.kill()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Cgroup {
    controller: Controller,
    root: PathBuf,
    path: PathBuf,
    /// Processes moved in, with the group each came from.
    moved: Vec<(u32, PathBuf)>,
}

impl Cgroup {
    /// Creates `ecosphere-<pid>-<n>` under `/sys/fs/cgroup/<controller>`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let group = slate_harness::cgroup::Cgroup::create(slate_harness::cgroup::Controller::Cpu)?;
    /// assert!(group.path().exists());
    /// # Ok::<(), slate_harness::cgroup::CgroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`CgroupError::Unavailable`] when the controller is not mounted there or the directory
    /// cannot be made.
    pub fn create(controller: Controller) -> Result<Self, CgroupError> {
        let root = Path::new(CGROUP_V1_ROOT).join(controller.name());
        Self::create_under(controller, root)
    }

    /// Creates a uniquely named group under `root`, the mount point of `controller`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use slate_harness::cgroup::{Cgroup, Controller};
    /// let group = Cgroup::create_under(Controller::Freezer, "/sys/fs/cgroup/freezer")?;
    /// # Ok::<(), slate_harness::cgroup::CgroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`CgroupError::Unavailable`] when `root` has no control file of `controller` or the
    /// directory cannot be made.
    pub fn create_under(
        controller: Controller,
        root: impl Into<PathBuf>,
    ) -> Result<Self, CgroupError> {
        let root = root.into();
        let probe = root.join(match controller {
            Controller::Cpu => "cpu.cfs_quota_us",
            Controller::Freezer => "cgroup.procs",
        });
        if !probe.exists() {
            return Err(CgroupError::Unavailable(format!(
                "{} is not a cgroup v1 {} hierarchy ({} missing)",
                root.display(),
                controller.name(),
                probe.display()
            )));
        }
        let name = format!(
            "ecosphere-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let path = root.join(name);
        fs::create_dir(&path).map_err(|e| {
            CgroupError::Unavailable(format!("cannot create {}: {e}", path.display()))
        })?;
        Ok(Cgroup {
            controller,
            root,
            path,
            moved: Vec::new(),
        })
    }

    /// The group's directory.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let group = slate_harness::cgroup::Cgroup::create(slate_harness::cgroup::Controller::Cpu)?;
    /// println!("{}", group.path().display());
    /// # Ok::<(), slate_harness::cgroup::CgroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves process `pid` (all its threads) into the group. Only for processes the caller
    /// started.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let mut child = std::process::Command::new("sleep").arg("1").spawn()?;
    /// let mut group = slate_harness::cgroup::Cgroup::create(slate_harness::cgroup::Controller::Cpu)?;
    /// group.add(child.id())?;
    /// # child.kill()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`CgroupError::Io`] when `cgroup.procs` cannot be written (the process is gone).
    pub fn add(&mut self, pid: u32) -> Result<(), CgroupError> {
        let from = self.current_group(pid);
        write(&self.path.join("cgroup.procs"), &pid.to_string())?;
        self.moved.push((pid, from));
        Ok(())
    }

    /// The PIDs now in the group (`cgroup.procs`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let group = slate_harness::cgroup::Cgroup::create(slate_harness::cgroup::Controller::Cpu)?;
    /// assert!(group.pids()?.is_empty());
    /// # Ok::<(), slate_harness::cgroup::CgroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`CgroupError::Io`] when the file cannot be read.
    pub fn pids(&self) -> Result<Vec<u32>, CgroupError> {
        let text = read(&self.path.join("cgroup.procs"))?;
        Ok(text
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect())
    }

    /// Limits the group to `quota` of CPU time per `period` (CFS bandwidth; the kernel accepts
    /// quotas from 1 ms and periods from 1 ms to 1 s).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// let group = slate_harness::cgroup::Cgroup::create(slate_harness::cgroup::Controller::Cpu)?;
    /// group.set_cpu_quota(Duration::from_millis(1), Duration::from_millis(100))?;
    /// # Ok::<(), slate_harness::cgroup::CgroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`CgroupError::Unavailable`] on a freezer group; [`CgroupError::Io`] when the kernel
    /// refuses the values.
    pub fn set_cpu_quota(&self, quota: Duration, period: Duration) -> Result<(), CgroupError> {
        self.need(Controller::Cpu)?;
        write(
            &self.path.join("cpu.cfs_period_us"),
            &period.as_micros().to_string(),
        )?;
        write(
            &self.path.join("cpu.cfs_quota_us"),
            &quota.as_micros().to_string(),
        )
    }

    /// Removes the CPU limit (`cpu.cfs_quota_us = -1`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let group = slate_harness::cgroup::Cgroup::create(slate_harness::cgroup::Controller::Cpu)?;
    /// group.clear_cpu_quota()?;
    /// # Ok::<(), slate_harness::cgroup::CgroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`CgroupError::Unavailable`] on a freezer group; [`CgroupError::Io`] when the file
    /// cannot be written.
    pub fn clear_cpu_quota(&self) -> Result<(), CgroupError> {
        self.need(Controller::Cpu)?;
        write(&self.path.join("cpu.cfs_quota_us"), "-1")
    }

    /// CPU time the group has been throttled, and how many periods (`cpu.stat`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let group = slate_harness::cgroup::Cgroup::create(slate_harness::cgroup::Controller::Cpu)?;
    /// let (periods, time) = group.throttled()?;
    /// # Ok::<(), slate_harness::cgroup::CgroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`CgroupError::Unavailable`] on a freezer group; [`CgroupError::Io`] when the file
    /// cannot be read.
    pub fn throttled(&self) -> Result<(u64, Duration), CgroupError> {
        self.need(Controller::Cpu)?;
        let text = read(&self.path.join("cpu.stat"))?;
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
                .unwrap_or(0)
        };
        Ok((
            field("nr_throttled "),
            Duration::from_nanos(field("throttled_time ")),
        ))
    }

    /// Freezes every process of the group and waits (bounded) until the kernel reports
    /// `FROZEN`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let group = slate_harness::cgroup::Cgroup::create(slate_harness::cgroup::Controller::Freezer)?;
    /// group.freeze()?;
    /// group.thaw()?;
    /// # Ok::<(), slate_harness::cgroup::CgroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`CgroupError::Unavailable`] on a cpu group; [`CgroupError::Io`] when the state cannot
    /// be written; [`CgroupError::FreezeTimeout`] when it is not frozen within 5 s.
    pub fn freeze(&self) -> Result<(), CgroupError> {
        self.need(Controller::Freezer)?;
        let state = self.path.join("freezer.state");
        write(&state, "FROZEN")?;
        let start = Instant::now();
        loop {
            let now = read(&state)?;
            if now.trim() == "FROZEN" {
                return Ok(());
            }
            if start.elapsed() >= FREEZE_WAIT {
                return Err(CgroupError::FreezeTimeout {
                    state: now.trim().to_owned(),
                    waited: start.elapsed(),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Thaws the group (`THAWED`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let group = slate_harness::cgroup::Cgroup::create(slate_harness::cgroup::Controller::Freezer)?;
    /// group.thaw()?;
    /// # Ok::<(), slate_harness::cgroup::CgroupError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`CgroupError::Unavailable`] on a cpu group; [`CgroupError::Io`] when the state cannot
    /// be written.
    pub fn thaw(&self) -> Result<(), CgroupError> {
        self.need(Controller::Freezer)?;
        write(&self.path.join("freezer.state"), "THAWED")
    }

    fn need(&self, controller: Controller) -> Result<(), CgroupError> {
        if self.controller == controller {
            Ok(())
        } else {
            Err(CgroupError::Unavailable(format!(
                "{} is a {} group, not {}",
                self.path.display(),
                self.controller.name(),
                controller.name()
            )))
        }
    }

    /// The directory of `pid`'s group of this controller (from `/proc/<pid>/cgroup`), or the
    /// root when it cannot be read.
    fn current_group(&self, pid: u32) -> PathBuf {
        let name = self.controller.name();
        fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .ok()
            .and_then(|text| {
                text.lines().find_map(|l| {
                    let mut parts = l.splitn(3, ':');
                    let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
                    ctrls
                        .split(',')
                        .any(|c| c == name)
                        .then(|| self.root.join(path.trim_start_matches('/')))
                })
            })
            .filter(|p| p.join("cgroup.procs").exists())
            .unwrap_or_else(|| self.root.clone())
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let report = |what: &str, r: Result<(), CgroupError>| {
            if let Err(e) = r {
                eprintln!("slate_harness::cgroup: {what} {}: {e}", self.path.display());
            }
        };
        match self.controller {
            Controller::Cpu => report("lifting the quota of", self.clear_cpu_quota()),
            Controller::Freezer => report("thawing", self.thaw()),
        }
        let left = self.pids().unwrap_or_default();
        for pid in left {
            let back = self
                .moved
                .iter()
                .find(|(p, _)| *p == pid)
                .map_or_else(|| self.root.clone(), |(_, from)| from.clone());
            report(
                &format!("moving pid {pid} back to {} from", back.display()),
                write(&back.join("cgroup.procs"), &pid.to_string()),
            );
        }
        for attempt in 0..RMDIR_TRIES {
            match fs::remove_dir(&self.path) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(e) if attempt + 1 == RMDIR_TRIES => {
                    eprintln!(
                        "slate_harness::cgroup: cannot remove {}: {e}",
                        self.path.display()
                    );
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(path, value).map_err(|source| CgroupError::Io {
        path: path.to_owned(),
        source,
    })
}

fn read(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|source| CgroupError::Io {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_hierarchy_is_unavailable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = Cgroup::create_under(Controller::Cpu, dir.path()).expect_err("no cpu files");
        assert!(matches!(err, CgroupError::Unavailable(_)), "{err}");
        assert!(err.to_string().contains("cpu.cfs_quota_us"), "{err}");
    }

    #[test]
    fn controller_names() {
        assert_eq!(Controller::Cpu.name(), "cpu");
        assert_eq!(Controller::Freezer.name(), "freezer");
    }
}
