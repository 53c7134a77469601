//! The checker's verdict: per-check status, counterexamples, statistics.

use std::fmt;
use std::time::Duration;

use super::event::{Event, EventKind};

/// The checks, in report order.
///
/// # Examples
///
/// ```
/// use slate_history::history::CheckId;
/// assert_eq!(CheckId::Exclusion.label(), "I1 exclusion");
/// ```
///
/// # Errors
///
/// Not applicable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CheckId {
    /// I1: no two holders' validity windows overlap.
    Exclusion,
    /// I2: writes accepted by the fenced resource carry non-decreasing tokens in accept order.
    FencedOrder,
    /// I3: first-level tokens strictly increase; re-entry keeps the token.
    Tokens,
    /// I5: only the holder releases; "not held" never answered inside a valid lease.
    Ownership,
    /// I6: depth goes up and down by exactly one per call, never below zero.
    Reentry,
    /// Deadlines within lease bounds, and at least `min_validity` left at `acq_ok`.
    Validity,
    /// No resource operation outside the holder's validity window.
    Activity,
    /// The shared counter equals the expected count.
    Counter,
    /// I8: no lock keys left, no renewal of a released holder's entry.
    Quiescence,
}

impl CheckId {
    /// Every check, in report order.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_history::history::CheckId::ALL.len(), 9);
    /// ```
    ///
    /// # Errors
    ///
    /// Not applicable.
    pub const ALL: [CheckId; 9] = [
        CheckId::Exclusion,
        CheckId::FencedOrder,
        CheckId::Tokens,
        CheckId::Ownership,
        CheckId::Reentry,
        CheckId::Validity,
        CheckId::Activity,
        CheckId::Counter,
        CheckId::Quiescence,
    ];

    /// Short label with the invariant number.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_history::history::CheckId::Tokens.label(), "I3 tokens");
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn label(self) -> &'static str {
        match self {
            CheckId::Exclusion => "I1 exclusion",
            CheckId::FencedOrder => "I2 fenced order",
            CheckId::Tokens => "I3 tokens",
            CheckId::Ownership => "I5 ownership",
            CheckId::Reentry => "I6 reentry",
            CheckId::Validity => "validity accounting",
            CheckId::Activity => "activity in validity",
            CheckId::Counter => "counter",
            CheckId::Quiescence => "I8 quiescence",
        }
    }
}

/// Outcome of one check.
///
/// # Examples
///
/// ```
/// use slate_history::history::Status;
/// assert!(Status::Pass.is_ok());
/// assert!(Status::Unchecked("no data".into()).is_ok());
/// ```
///
/// # Errors
///
/// Not applicable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// Checked, nothing found.
    Pass,
    /// Something suspicious that the configuration does not treat as a failure.
    Warn(Box<Counterexample>),
    /// Violated; the first counterexample found.
    Fail(Box<Counterexample>),
    /// Not decided, and why (no data, not configured).
    Unchecked(String),
}

impl Status {
    /// `false` only for [`Status::Fail`].
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(slate_history::history::Status::Pass.is_ok());
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn is_ok(&self) -> bool {
        !matches!(self, Status::Fail(_))
    }

    /// The counterexample of a failure or warning.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(slate_history::history::Status::Pass.counterexample().is_none());
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn counterexample(&self) -> Option<&Counterexample> {
        match self {
            Status::Warn(c) | Status::Fail(c) => Some(c),
            _ => None,
        }
    }

    fn word(&self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Warn(_) => "WARN",
            Status::Fail(_) => "FAIL",
            Status::Unchecked(_) => "UNCHECKED",
        }
    }
}

/// The first violation of a check: what is wrong, the events that conflict, and the events
/// around it from every process. Indices are positions in [`super::History::events`].
///
/// # Examples
///
/// ```
/// let c = slate_history::history::Counterexample::default();
/// assert!(c.events.is_empty());
/// ```
///
/// # Errors
///
/// Not applicable.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counterexample {
    /// What is wrong, with times in ms relative to the first event.
    pub message: String,
    /// The conflicting events (for I1: both windows' opening, deadline and closing events).
    pub events: Vec<(usize, Event)>,
    /// Neighbouring events (about ten, all processes).
    pub context: Vec<(usize, Event)>,
}

/// Result of one check.
///
/// # Examples
///
/// ```
/// use slate_history::history::{CheckConfig, CheckId, History};
/// let r = History::default().check(&CheckConfig::default());
/// assert_eq!(r.checks[0].id, CheckId::Exclusion);
/// ```
///
/// # Errors
///
/// Not applicable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckResult {
    /// Which check.
    pub id: CheckId,
    /// Its outcome.
    pub status: Status,
    /// Number of violations (or warnings) found; only the first is shown.
    pub violations: usize,
    /// What was checked (counts, skipped parts).
    pub note: String,
}

/// Acquire latency, `acq_invoke` → `acq_ok`.
///
/// # Examples
///
/// ```
/// let l = slate_history::history::Latency::default();
/// assert_eq!(l.count, 0);
/// ```
///
/// # Errors
///
/// Not applicable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Latency {
    /// Number of matched pairs.
    pub count: usize,
    /// Median (nearest rank).
    pub p50: Duration,
    /// 99th percentile (nearest rank).
    pub p99: Duration,
    /// Maximum.
    pub max: Duration,
}

/// Statistics of a history.
///
/// # Examples
///
/// ```
/// use slate_history::history::{CheckConfig, History};
/// assert_eq!(History::default().check(&CheckConfig::default()).stats.events, 0);
/// ```
///
/// # Errors
///
/// Not applicable.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Events in the history.
    pub events: usize,
    /// Distinct processes.
    pub processes: usize,
    /// Distinct lock names with at least one acquisition.
    pub locks: usize,
    /// All `acq_ok` events.
    pub acquisitions: usize,
    /// `acq_ok` with depth 1.
    pub first_level_acquisitions: usize,
    /// Distinct (lock, holder) pairs that acquired.
    pub holders: usize,
    /// Validity windows (merged nesting).
    pub windows: usize,
    /// Windows ended by `rel_invoke` / `lost` / deadline / worker kill.
    pub windows_closed: [usize; 4],
    /// `acq_fail` events.
    pub acq_failures: usize,
    /// `acq_info` events (possible ghost entries).
    pub ghosts: usize,
    /// `lost` events.
    pub losses: usize,
    /// `rel_ok` events.
    pub releases: usize,
    /// Token decreases accepted because the config allows resets.
    pub token_resets: usize,
    /// Resource operations outside their holder's window.
    pub activity_past_validity: usize,
    /// Writes the fenced resource accepted.
    pub fenced_accepted: usize,
    /// Writes the fenced resource rejected (a stale token).
    pub fenced_rejected: usize,
    /// Most acquire calls outstanding at once on one lock.
    pub max_waiters: usize,
    /// `acq_ok` events per process.
    pub acquisitions_per_proc: std::collections::BTreeMap<u32, usize>,
    /// Acquire latency.
    pub acquire_latency: Latency,
}

/// The checker's verdict.
///
/// # Examples
///
/// ```
/// use slate_history::history::{CheckConfig, History};
/// let report = History::default().check(&CheckConfig::default());
/// assert!(report.is_ok());
/// println!("{report}");
/// ```
///
/// # Errors
///
/// Not applicable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// One result per [`CheckId`], in [`CheckId::ALL`] order.
    pub checks: Vec<CheckResult>,
    /// Statistics.
    pub stats: Stats,
    /// `t` of the first event: times in messages are relative to it.
    pub origin: u64,
}

impl Report {
    /// `true` unless some check failed (warnings and unchecked are fine).
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_history::history::{CheckConfig, History};
    /// assert!(History::default().check(&CheckConfig::default()).is_ok());
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn is_ok(&self) -> bool {
        self.checks.iter().all(|c| c.status.is_ok())
    }

    /// The result of one check.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_history::history::{CheckConfig, CheckId, History, Status};
    /// let r = History::default().check(&CheckConfig::default());
    /// assert!(matches!(r.status(CheckId::Counter), Status::Unchecked(_)));
    /// ```
    ///
    /// # Errors
    ///
    /// None. A check missing from a hand-made report reads as [`Status::Unchecked`].
    pub fn status(&self, id: CheckId) -> &Status {
        static MISSING: Status = Status::Unchecked(String::new());
        self.result(id).map_or(&MISSING, |c| &c.status)
    }

    /// The full result of one check, if present (always, for a report made by the checker).
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_history::history::{CheckConfig, CheckId, History};
    /// let r = History::default().check(&CheckConfig::default());
    /// assert_eq!(r.result(CheckId::Tokens).map(|c| c.violations), Some(0));
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn result(&self, id: CheckId) -> Option<&CheckResult> {
        self.checks.iter().find(|c| c.id == id)
    }

    /// The checks that failed.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_history::history::{CheckConfig, History};
    /// assert!(History::default().check(&CheckConfig::default()).failed().is_empty());
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn failed(&self) -> Vec<CheckId> {
        self.checks
            .iter()
            .filter(|c| !c.status.is_ok())
            .map(|c| c.id)
            .collect()
    }

    /// Panics unless each of `ids` passed outright ([`Status::Pass`]: no failure, no warning,
    /// and actually checked), naming the first that did not.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_history::clock::now_ns;
    /// use slate_history::history::{CheckConfig, CheckId, EventKind, History, Recorder};
    /// use std::time::Duration;
    ///
    /// let dir = tempfile::tempdir()?;
    /// let rec = Recorder::create(dir.path(), 0)?;
    /// rec.record(0, "l", EventKind::AcqInvoke { attempt: 1, budget_ms: None })?;
    /// let deadline = now_ns() + 2_000_000_000;
    /// rec.record(0, "l", EventKind::AcqOk {
    ///     attempt: 1, holder: "p0:t0".into(), token: 1, depth: 1, deadline, nodes: vec![],
    ///     permits: None,
    /// })?;
    /// rec.record(0, "l", EventKind::RelInvoke { holder: "p0:t0".into(), depth_before: 1 })?;
    /// rec.record(0, "l", EventKind::RelOk { holder: "p0:t0".into(), depth_after: 0 })?;
    /// rec.record(1, "l", EventKind::AcqInvoke { attempt: 2, budget_ms: None })?;
    /// let deadline = now_ns() + 2_000_000_000;
    /// rec.record(1, "l", EventKind::AcqOk {
    ///     attempt: 2, holder: "p0:t1".into(), token: 2, depth: 1, deadline, nodes: vec![],
    ///     permits: None,
    /// })?;
    /// let r = History::load(dir.path())?.check(&CheckConfig::new(Duration::from_secs(2)));
    /// r.assert_pass(&[CheckId::Exclusion, CheckId::Tokens, CheckId::Ownership]);
    /// // One holder alone has nobody to be excluded from: not a pass, unless opted out.
    /// r.assert_pass_or_unchecked(CheckId::Reentry, "nobody re-enters here");
    /// // An empty history checks nothing: not a pass.
    /// let empty = History::default().check(&CheckConfig::new(Duration::from_secs(2)));
    /// assert!(std::panic::catch_unwind(|| empty.assert_pass(&[CheckId::Exclusion])).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    ///
    /// # Panics
    ///
    /// If a check in `ids` is not [`Status::Pass`]; the message names it and shows the report.
    #[track_caller]
    pub fn assert_pass(&self, ids: &[CheckId]) {
        for &id in ids {
            assert!(
                matches!(self.status(id), Status::Pass),
                "{} is {:?}, not Pass\n{self}",
                id.label(),
                self.status(id)
            );
        }
    }

    /// Panics unless `id` passed or had nothing to check; for a scenario that opts out of
    /// that check, saying why (`because` is shown if it fails). A warning or a failure panics.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_history::history::{CheckConfig, CheckId, History};
    /// let r = History::default().check(&CheckConfig::default());
    /// r.assert_pass_or_unchecked(CheckId::Reentry, "this scenario never re-enters");
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    ///
    /// # Panics
    ///
    /// If the check warned or failed.
    #[track_caller]
    pub fn assert_pass_or_unchecked(&self, id: CheckId, because: &str) {
        assert!(
            matches!(self.status(id), Status::Pass | Status::Unchecked(_)),
            "{} is {:?} (allowed to be unchecked: {because})\n{self}",
            id.label(),
            self.status(id)
        );
    }

    /// Panics unless the scenario contended as it was built to: at least `processes`
    /// processes each acquired at least `per_process` times, and at some instant at least
    /// `waiters` acquire calls were outstanding on one lock. A scenario that stops contending
    /// (every worker failing fast, one process doing all the work) would otherwise pass its
    /// checks with nothing to compare.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_history::history::{CheckConfig, History};
    /// let r = History::default().check(&CheckConfig::default());
    /// assert!(std::panic::catch_unwind(|| r.assert_contention(2, 1, 2)).is_err());
    /// r.assert_contention(0, 0, 0);
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    ///
    /// # Panics
    ///
    /// If the history shows less contention; the message gives the counts.
    #[track_caller]
    pub fn assert_contention(&self, processes: usize, per_process: usize, waiters: usize) {
        let busy = self
            .stats
            .acquisitions_per_proc
            .values()
            .filter(|&&n| n >= per_process)
            .count();
        assert!(
            busy >= processes && self.stats.max_waiters >= waiters,
            "too little contention: {busy} process(es) with at least {per_process} \
             acquisitions (wanted {processes}; per process: {:?}), at most {} outstanding \
             acquire calls (wanted {waiters})",
            self.stats.acquisitions_per_proc,
            self.stats.max_waiters
        );
    }

    /// Panics with the whole report if any check failed.
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
    /// None.
    ///
    /// # Panics
    ///
    /// If [`Report::is_ok`] is false; the message is the [`fmt::Display`] text.
    #[track_caller]
    pub fn assert_ok(&self) {
        if !self.is_ok() {
            panic!("history check failed\n{self}");
        }
    }

    fn fmt_event(&self, f: &mut fmt::Formatter<'_>, idx: usize, e: &Event) -> fmt::Result {
        let kind = serde_json::to_string(&e.kind).unwrap_or_else(|_| format!("{:?}", e.kind));
        let idx = if idx == usize::MAX {
            "config".to_owned()
        } else {
            format!("#{idx}")
        };
        let deadline = match &e.kind {
            EventKind::AcqOk { deadline, .. } | EventKind::RenewOk { deadline, .. } => {
                format!(" (deadline {})", rel_ms(*deadline, self.origin))
            }
            _ => String::new(),
        };
        writeln!(
            f,
            "    {idx:>7} {:>13} proc={} task={} lock={:?} {kind}{deadline}",
            rel_ms(e.t, self.origin),
            e.proc,
            e.task,
            e.lock
        )
    }
}

/// `t` relative to `origin`, formatted as `+12.345678ms`.
pub(crate) fn rel_ms(t: u64, origin: u64) -> String {
    if t >= origin {
        let d = t - origin;
        format!("+{}.{:06}ms", d / 1_000_000, d % 1_000_000)
    } else {
        let d = origin - t;
        format!("-{}.{:06}ms", d / 1_000_000, d % 1_000_000)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stats;
        writeln!(
            f,
            "history check: {} ({} events, {} processes, t0 = {} ns)",
            if self.is_ok() { "OK" } else { "FAILED" },
            s.events,
            s.processes,
            self.origin
        )?;
        for c in &self.checks {
            let extra = match &c.status {
                Status::Unchecked(why) => format!(" ({why})"),
                Status::Fail(_) | Status::Warn(_) => format!(" {} found", c.violations),
                Status::Pass => String::new(),
            };
            writeln!(
                f,
                "  {:<22} {:<9}{extra}  {}",
                c.id.label(),
                c.status.word(),
                c.note
            )?;
        }
        let l = &s.acquire_latency;
        writeln!(
            f,
            "  stats: {} acquisitions ({} first-level) by {} holders on {} locks; {} windows \
             (closed by release {}, lost {}, deadline {}, kill {}); {} acq_fail, {} ghosts \
             (acq_info), {} lost, {} releases, {} token resets, {} ops past validity, \
             fenced writes {} accepted {} rejected, max waiters {}; acquire latency p50 {:?} \
             p99 {:?} max {:?} (n={})",
            s.acquisitions,
            s.first_level_acquisitions,
            s.holders,
            s.locks,
            s.windows,
            s.windows_closed[0],
            s.windows_closed[1],
            s.windows_closed[2],
            s.windows_closed[3],
            s.acq_failures,
            s.ghosts,
            s.losses,
            s.releases,
            s.token_resets,
            s.activity_past_validity,
            s.fenced_accepted,
            s.fenced_rejected,
            s.max_waiters,
            l.p50,
            l.p99,
            l.max,
            l.count
        )?;
        for c in &self.checks {
            let Some(cx) = c.status.counterexample() else {
                continue;
            };
            writeln!(
                f,
                "--- {} {}: first of {} ---",
                c.id.label(),
                c.status.word(),
                c.violations
            )?;
            writeln!(f, "  {}", cx.message)?;
            if !cx.events.is_empty() {
                writeln!(f, "  conflicting events:")?;
                for (i, e) in &cx.events {
                    self.fmt_event(f, *i, e)?;
                }
            }
            if !cx.context.is_empty() {
                writeln!(f, "  surrounding events (all processes):")?;
                for (i, e) in &cx.context {
                    self.fmt_event(f, *i, e)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_times() {
        assert_eq!(rel_ms(1_500_000, 1_000_000), "+0.500000ms");
        assert_eq!(rel_ms(1_000_000, 3_000_001), "-2.000001ms");
    }

    #[test]
    fn status_is_ok_only_without_failure() {
        let cx = Box::<Counterexample>::default;
        assert!(Status::Warn(cx()).is_ok());
        assert!(!Status::Fail(cx()).is_ok());
        assert!(Status::Fail(cx()).counterexample().is_some());
        let r = Report {
            checks: vec![CheckResult {
                id: CheckId::Tokens,
                status: Status::Fail(cx()),
                violations: 1,
                note: String::new(),
            }],
            stats: Stats::default(),
            origin: 0,
        };
        assert!(!r.is_ok());
        assert_eq!(r.failed(), vec![CheckId::Tokens]);
        assert!(matches!(r.status(CheckId::Counter), Status::Unchecked(_)));
        assert!(r.to_string().contains("I3 tokens"));
    }
}
