//! Loading and merging the per-process logs.

use std::fs;
use std::path::{Path, PathBuf};

use super::HistoryError;
use super::check::{CheckConfig, check};
use super::event::Event;
use super::report::Report;

/// A merged history: every event of every process, sorted by `t`.
///
/// Ties are broken by file (in file-name order) and then by line, so the order is
/// deterministic and each process's own order is kept.
///
/// # Examples
///
/// ```
/// use slate_history::history::{Event, EventKind, History};
/// let h = History::from_events(vec![
///     Event::new(20, 1, 0, "l", EventKind::AcqInvoke { attempt: 1, budget_ms: None }),
///     Event::new(10, 0, 0, "l", EventKind::AcqInvoke { attempt: 1, budget_ms: None }),
/// ]);
/// assert_eq!(h.events()[0].proc, 0);
/// ```
///
/// # Errors
///
/// See [`History::load`].
#[derive(Clone, Debug, Default)]
pub struct History {
    events: Vec<Event>,
    files: Vec<PathBuf>,
    truncated_lines: usize,
}

impl History {
    /// Reads every `*.jsonl` file in `dir` and merges them by time.
    ///
    /// Blank lines are skipped. A malformed *last* line of a file that does not end with a
    /// newline is taken to be cut short by a killed process: it is skipped and counted
    /// ([`History::truncated_lines`]). Any other malformed line is an error.
    ///
    /// # Examples
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// std::fs::write(dir.path().join("a.jsonl"),
    ///     "{\"t\":2,\"proc\":0,\"task\":0,\"lock\":\"l\",\"kind\":\"acq_invoke\",\
    ///       \"attempt\":0,\"budget_ms\":null}\n{\"t\":3,\"pro")?;
    /// let h = slate_history::history::History::load(dir.path())?;
    /// assert_eq!((h.len(), h.truncated_lines()), (1, 1));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`HistoryError::Io`] if the directory or a file cannot be read,
    /// [`HistoryError::Parse`] (with file and line) for a malformed line.
    pub fn load(dir: impl AsRef<Path>) -> Result<History, HistoryError> {
        let dir = dir.as_ref();
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| HistoryError::Io { path, source }
        };
        let mut files = Vec::new();
        for entry in fs::read_dir(dir).map_err(io(dir))? {
            let path = entry.map_err(io(dir))?.path();
            if path.extension().is_some_and(|e| e == "jsonl") && path.is_file() {
                files.push(path);
            }
        }
        files.sort();
        let mut events = Vec::new();
        let mut truncated_lines = 0;
        for path in &files {
            let text = fs::read_to_string(path).map_err(io(path))?;
            let complete = text.ends_with('\n');
            let n_lines = text.lines().count();
            for (i, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                match serde_json::from_str::<Event>(line) {
                    Ok(e) => events.push(e),
                    Err(_) if !complete && i + 1 == n_lines => truncated_lines += 1,
                    Err(source) => {
                        return Err(HistoryError::Parse {
                            path: path.clone(),
                            line: i + 1,
                            source,
                        });
                    }
                }
            }
        }
        let mut h = History::from_events(events);
        h.files = files;
        h.truncated_lines = truncated_lines;
        Ok(h)
    }

    /// Builds a history from events in any order (sorted stably by `t`).
    ///
    /// # Examples
    ///
    /// ```
    /// let h = slate_history::history::History::from_events(Vec::new());
    /// assert!(h.is_empty());
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn from_events(mut events: Vec<Event>) -> History {
        events.sort_by_key(|e| e.t);
        History {
            events,
            files: Vec::new(),
            truncated_lines: 0,
        }
    }

    /// The events, in time order.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(slate_history::history::History::default().events().is_empty());
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Number of events.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_history::history::History::default().len(), 0);
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether there are no events.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(slate_history::history::History::default().is_empty());
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The files merged by [`History::load`], in tie-break order.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(slate_history::history::History::default().files().is_empty());
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// Cut-short last lines skipped by [`History::load`].
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_history::history::History::default().truncated_lines(), 0);
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn truncated_lines(&self) -> usize {
        self.truncated_lines
    }

    /// Shorthand for [`check`]`(self, cfg)`.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_history::history::{CheckConfig, History};
    /// History::default().check(&CheckConfig::default()).assert_ok();
    /// ```
    ///
    /// # Errors
    ///
    /// None; violations are in the [`Report`].
    pub fn check(&self, cfg: &CheckConfig) -> Report {
        check(self, cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::EventKind;

    #[test]
    fn from_events_sorts_stably() {
        let e = |t, attempt| {
            Event::new(
                t,
                0,
                0,
                "l",
                EventKind::AcqInvoke {
                    attempt,
                    budget_ms: None,
                },
            )
        };
        let h = History::from_events(vec![e(5, 0), e(3, 1), e(5, 2), e(3, 3)]);
        let order: Vec<u64> = h
            .events()
            .iter()
            .map(|e| match e.kind {
                EventKind::AcqInvoke { attempt, .. } => attempt,
                _ => u64::MAX,
            })
            .collect();
        assert_eq!(order, vec![1, 3, 0, 2]);
    }
}
