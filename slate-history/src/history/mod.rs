//! Event histories of lock scenarios, and the checker that decides whether a run kept its
//! promises (the invariants of `docs/RELIABILITY.md`).
//!
//! # Recording
//!
//! Every worker process opens a [`Recorder`] on a shared directory and logs [`EventKind`]s as
//! JSON lines, stamped with [`crate::clock::now_ns`] (`CLOCK_MONOTONIC`, shared by all processes
//! of the machine). Convert library deadlines (`Instant`s) with [`crate::clock::to_mono_ns`].
//! Stamp `*_invoke` before sending, everything else after the reply: the checker's windows are
//! then inner bounds of the true holdings, so every overlap it reports is real (§7.3).
//!
//! # Checking
//!
//! [`History::load`] merges the files by time; [`check`] returns a [`Report`]:
//!
//! - **I1 exclusion.** Per (lock, holder), a validity window opens at the `acq_ok` that finds the
//!   holder without an open window (depth 0 → 1) and closes at the earliest of: `rel_invoke`
//!   at depth 1, `lost`, and the latest deadline from `acq_ok`/`renew_ok` received before
//!   that (a deadline only moves back from the moment the holder was told, see
//!   `renew_ok`). A kill of its process (`kill_worker` nemesis or [`CheckConfig::killed`])
//!   does not close it: nobody released the lock, so the window runs to the last deadline the
//!   holder knew, and a grant before it is an overlap. Workers log every move of the
//!   deadline as it happens ([`crate::logged::RenewalLog`]). Re-entrant nesting stays inside
//!   one window. Windows are swept by start per lock; a
//!   window starting strictly before the latest end among earlier windows of *other* holders
//!   is a violation. `acq_info` never opens a window (a ghost, §7.6). A `rel_info` or
//!   `rel_fail{not_held}` that finds the window still open closes it at the holder's last
//!   confirmed-holding time, as does a `rel_ok` to depth 0 with no `rel_invoke` before it.
//! - **I2 fenced order.** Over the `res_op` events with op [`OP_FENCED_WRITE`] and an
//!   `accepted:<seq>` outcome: a write *sent* (its `invoked` stamp) after a grant with a
//!   higher token was acknowledged, yet accepted, fails (the old holder acted after the lock
//!   moved on and got through); so does one token accepted from two holders (exclusive
//!   locks), and a token below one accepted earlier in the resource's accept order. Without
//!   accepted writes it is unchecked.
//! - **I3 tokens.** `acq_ok` with depth 1, in time order per lock: each token strictly greater
//!   than the previous one (decreases only counted when [`CheckConfig::allow_token_reset`]).
//!   Depth > 1 must repeat the holder's current token.
//! - **I5 ownership.** A `rel_ok` by a holder the history shows at depth 0 fails; a
//!   `rel_fail{not_held: true}` before the holder's deadline while it held a known depth fails
//!   (its entry vanished inside its lease; a warning with [`CheckConfig::allow_token_reset`]).
//!   A `renew_ok` while not holding is a warning (its reply may be reordered with the release).
//! - **I6 reentry.** `acq_ok.depth` = previous + 1; `rel_ok.depth_after` = previous − 1;
//!   `rel_invoke.depth_before` = the known depth. After `lost`, `rel_info` or a kill the depth
//!   is unknown and the next `acq_ok`/`rel_ok` resynchronises it; after an `acq_info` by the
//!   same (proc, task) one depth mismatch on the next `acq_ok` is excused (ghost entry).
//! - **Validity accounting.** `acq_ok.deadline ≤ acq_invoke.t + L + tolerance` for
//!   single-attempt calls (`budget_ms == Some(0)`, or every call with
//!   [`CheckConfig::strict_invoke_bound`]), else `≤ acq_ok.t + L + tolerance`;
//!   `deadline − acq_ok.t ≥ min_validity`; `renew_ok.deadline ≤ renew_ok.t + L + tolerance`.
//!   With [`CheckConfig::reply_delay`] (a proxy that delays every reply), the bounds count
//!   from `acq_ok.t − delay` and `renew_ok.t − delay`: a lease measured from the reply fails.
//! - **Activity.** Every `res_op` must lie inside a window of its holder; one that does not
//!   fails, unless [`CheckConfig::expected_late`] names its process and the count stays within
//!   the number expected (a warning).
//!
//! A check with nothing to judge (one holder, no fenced write, no re-entry, no release) is
//! [`Status::Unchecked`], which [`Report::assert_pass`] refuses; a scenario opts out with
//! [`Report::assert_pass_or_unchecked`] and a reason. [`Report::assert_contention`] fails a
//! scenario that stopped contending.
//! - **Counter.** [`CheckConfig::counter`]: final value = expectation ([`CounterExpectation`]).
//! - **I8 quiescence.** No `observe` at or after [`CheckConfig::quiescent_after`] shows the key
//!   (fields or PTTL ≥ −1); [`CheckConfig::final_keys`] is empty; and, over the whole run, the
//!   PTTL of a field never rises (beyond [`CheckConfig::ttl_bump_tolerance`]) between two
//!   snapshots that both show it, more than [`CheckConfig::zombie_grace`] after its holder stopped
//!   holding and without any acquire by its task since (zombie renewal).
//!
//! # Examples
//!
//! ```
//! use slate_history::clock::now_ns;
//! use slate_history::history::{CheckConfig, EventKind, History, Recorder};
//! use std::time::Duration;
//!
//! let dir = tempfile::tempdir()?;
//! let rec = Recorder::create(dir.path(), 0)?;
//! rec.record(0, "l", EventKind::AcqInvoke { attempt: 1, budget_ms: None })?;
//! let deadline = now_ns() + 2_000_000_000;
//! rec.record(0, "l", EventKind::AcqOk {
//!     attempt: 1, holder: "p0:t0".into(), token: 1, depth: 1, deadline, nodes: vec![],
//!     permits: None,
//! })?;
//! rec.record(0, "l", EventKind::RelInvoke { holder: "p0:t0".into(), depth_before: 1 })?;
//! rec.record(0, "l", EventKind::RelOk { holder: "p0:t0".into(), depth_after: 0 })?;
//! let report = History::load(dir.path())?.check(&CheckConfig::new(Duration::from_secs(2)));
//! report.assert_ok();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::PathBuf;

mod check;
mod event;
mod recorder;
mod report;
mod store;

pub use check::{CheckConfig, CounterCheck, CounterExpectation, ExpectedLate, check};
pub use event::{
    Event, EventKind, FencedOutcome, KILL_WORKER, OP_FENCED_WRITE, OP_INCR, OUTCOME_OK,
};
pub use recorder::Recorder;
pub use report::{CheckId, CheckResult, Counterexample, Latency, Report, Stats, Status};
pub use store::History;

/// Errors of recording and loading histories.
///
/// # Examples
///
/// ```
/// let err = slate_history::history::History::load("/nonexistent/dir").unwrap_err();
/// assert!(matches!(err, slate_history::history::HistoryError::Io { .. }));
/// ```
///
/// # Errors
///
/// Not applicable.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// Reading or writing a file failed.
    #[error("history I/O on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A line of a history file is not a valid event.
    #[error("{path}:{line}: not a history event: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// An event could not be serialised.
    #[error("cannot encode history event: {0}")]
    Encode(serde_json::Error),
}
