//! Appending events to a per-process JSON-lines file.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::HistoryError;
use super::event::{EventKind, EventRef};
use crate::clock::now_ns;

/// Appends events of one process to `<dir>/proc-<proc>.jsonl`.
///
/// Cheap to clone and shareable across threads and tasks (`Clone + Send + Sync`; one
/// `Mutex<BufWriter<File>>` inside). The timestamp is taken *inside* the lock, so the lines of
/// one file are in time order.
///
/// A recorder made with [`Recorder::create`] writes every event through to the file before
/// `record` returns, so a worker killed with SIGKILL loses nothing it has logged; that matters
/// for soundness (a lost `rel_invoke` would make a window look longer than it was).
/// [`Recorder::create_buffered`] only writes on [`Recorder::flush`], when the buffer fills, and
/// on drop of the last clone: use it only where processes are never killed.
///
/// # Examples
///
/// ```
/// use slate_history::history::{EventKind, History, Recorder};
/// let dir = tempfile::tempdir()?;
/// let rec = Recorder::create(dir.path(), 7)?;
/// rec.record(0, "orders", EventKind::AcqInvoke { attempt: 1, budget_ms: Some(0) })?;
/// rec.flush()?;
/// let h = History::load(dir.path())?;
/// assert_eq!(h.events()[0].proc, 7);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
///
/// See each method.
#[derive(Clone, Debug)]
pub struct Recorder {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    proc: u32,
    path: PathBuf,
    write_through: bool,
    out: Mutex<BufWriter<File>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let out = self.out.get_mut().unwrap_or_else(PoisonError::into_inner);
        // Nothing useful can be done with an error while dropping.
        let _ = out.flush();
    }
}

impl Recorder {
    /// Opens (creating or appending to) `<dir>/proc-<proc>.jsonl`, writing every event through.
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let rec = slate_history::history::Recorder::create(dir.path(), 1)?;
    /// assert!(rec.path().ends_with("proc-1.jsonl"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HistoryError::Io`] if the directory is missing or the file cannot be opened.
    pub fn create(dir: impl AsRef<Path>, proc: u32) -> Result<Self, HistoryError> {
        Self::open(dir.as_ref(), proc, true)
    }

    /// Like [`Recorder::create`], but buffered: events reach the file on [`Recorder::flush`],
    /// when the buffer fills, and when the last clone is dropped.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_history::history::{EventKind, Recorder};
    /// let dir = tempfile::tempdir()?;
    /// let rec = Recorder::create_buffered(dir.path(), 2)?;
    /// rec.record(0, "l", EventKind::AcqInvoke { attempt: 0, budget_ms: None })?;
    /// drop(rec); // flushes
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HistoryError::Io`] if the directory is missing or the file cannot be opened.
    pub fn create_buffered(dir: impl AsRef<Path>, proc: u32) -> Result<Self, HistoryError> {
        Self::open(dir.as_ref(), proc, false)
    }

    fn open(dir: &Path, proc: u32, write_through: bool) -> Result<Self, HistoryError> {
        let path = dir.join(format!("proc-{proc}.jsonl"));
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|source| HistoryError::Io {
                path: path.clone(),
                source,
            })?;
        Ok(Recorder {
            inner: Arc::new(Inner {
                proc,
                path,
                write_through,
                out: Mutex::new(BufWriter::with_capacity(64 * 1024, file)),
            }),
        })
    }

    /// The `proc` stamped on every event.
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// assert_eq!(slate_history::history::Recorder::create(dir.path(), 4)?.proc(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn proc(&self) -> u32 {
        self.inner.proc
    }

    /// The file this recorder appends to.
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let rec = slate_history::history::Recorder::create(dir.path(), 4)?;
    /// assert_eq!(rec.path(), dir.path().join("proc-4.jsonl"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Records `kind` for `task` on `lock`, stamped now ([`now_ns`]); returns the stamp.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_history::history::{EventKind, Recorder};
    /// let dir = tempfile::tempdir()?;
    /// let rec = Recorder::create(dir.path(), 0)?;
    /// let t = rec.record(3, "l", EventKind::RelInvoke { holder: "h".into(), depth_before: 1 })?;
    /// assert!(t <= slate_history::clock::now_ns());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HistoryError::Io`] if the write fails (write-through recorders; buffered ones report
    /// errors when the buffer is written), [`HistoryError::Encode`] if serialisation fails.
    pub fn record(&self, task: u64, lock: &str, kind: EventKind) -> Result<u64, HistoryError> {
        let mut out = self.lock_out();
        let t = now_ns();
        self.write_line(&mut out, t, task, lock, &kind)?;
        Ok(t)
    }

    /// Records an event with an explicit timestamp (for example a nemesis action timed by the
    /// harness, or a replay). Lines written this way may be out of order within the file;
    /// [`super::History::load`] sorts anyway.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_history::history::{EventKind, Recorder};
    /// let dir = tempfile::tempdir()?;
    /// let rec = Recorder::create(dir.path(), u32::MAX)?;
    /// rec.record_at(slate_history::clock::now_ns(), 0, "", EventKind::kill_worker(2))?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Recorder::record`].
    pub fn record_at(
        &self,
        t: u64,
        task: u64,
        lock: &str,
        kind: EventKind,
    ) -> Result<(), HistoryError> {
        let mut out = self.lock_out();
        self.write_line(&mut out, t, task, lock, &kind)
    }

    /// Writes buffered events to the file.
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// slate_history::history::Recorder::create_buffered(dir.path(), 0)?.flush()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HistoryError::Io`] if the write fails.
    pub fn flush(&self) -> Result<(), HistoryError> {
        let mut out = self.lock_out();
        out.flush().map_err(|source| self.io(source))
    }

    fn lock_out(&self) -> MutexGuard<'_, BufWriter<File>> {
        // A panic while holding the lock cannot leave a half-written line in the buffer that
        // matters more than losing the whole recorder would; keep going.
        self.inner
            .out
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write_line(
        &self,
        out: &mut BufWriter<File>,
        t: u64,
        task: u64,
        lock: &str,
        kind: &EventKind,
    ) -> Result<(), HistoryError> {
        let ev = EventRef {
            t,
            proc: self.inner.proc,
            task,
            lock,
            kind,
        };
        let mut line = serde_json::to_vec(&ev).map_err(HistoryError::Encode)?;
        line.push(b'\n');
        out.write_all(&line).map_err(|source| self.io(source))?;
        if self.inner.write_through {
            out.flush().map_err(|source| self.io(source))?;
        }
        Ok(())
    }

    fn io(&self, source: std::io::Error) -> HistoryError {
        HistoryError::Io {
            path: self.inner.path.clone(),
            source,
        }
    }
}
