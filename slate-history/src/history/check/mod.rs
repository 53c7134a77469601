//! The history checker (the invariants of `docs/RELIABILITY.md`).
//!
//! One pass over the merged events drives a per-(lock, holder) state machine and builds the
//! validity windows; a sweep per lock then looks for overlaps; resource operations are matched
//! against the windows last. Cost is O(n log n) in the number of events.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::event::{
    Event, EventKind, FencedOutcome, KILL_WORKER, OP_FENCED_WRITE, OP_INCR, OUTCOME_OK,
};
use super::report::{CheckId, CheckResult, Counterexample, Latency, Report, Stats, Status, rel_ms};
use super::store::History;

mod events;
mod invariants;
mod verdict;

/// What the checker is told about the scenario.
///
/// # Examples
///
/// ```
/// use slate_history::history::{CheckConfig, CounterCheck, CounterExpectation};
/// use std::time::Duration;
/// let cfg = CheckConfig {
///     min_validity: Duration::from_millis(200),
///     counter: Some(CounterCheck { final_value: 42, expected: CounterExpectation::AckedIncrements }),
///     ..CheckConfig::new(Duration::from_secs(2))
/// };
/// assert_eq!(cfg.lease, Some(Duration::from_secs(2)));
/// ```
///
/// # Errors
///
/// Not applicable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckConfig {
    /// The lock's lease `L`. Without it the upper deadline bounds are not checked.
    pub lease: Option<Duration>,
    /// At `acq_ok`, `deadline − t` must be at least this.
    pub min_validity: Duration,
    /// Slack on the upper deadline bounds: the `Instant` → monotonic conversion error plus the
    /// library's own rounding. Default 1 ms.
    pub deadline_tolerance: Duration,
    /// Bound every `acq_ok` deadline by its `acq_invoke.t + L`. By default that bound is used
    /// only for single-attempt calls (`budget_ms == Some(0)`, i.e. `try_lock`), because a call
    /// that waits makes later remote attempts whose send time is after the invoke; waiting
    /// calls are bounded by `acq_ok.t + L` instead.
    pub strict_invoke_bound: bool,
    /// The scenario loses server data on purpose (a single node restarted without
    /// persistence): token decreases between holders are counted (stats) instead of failing
    /// I3, and a "not held" answer inside a holder's lease is an I5 warning, not a failure.
    pub allow_token_reset: bool,
    /// Resource operations past their holder's window that the scenario expects, and how
    /// many. `None` (the default): every such operation fails
    /// [`CheckId::Activity`](super::CheckId::Activity).
    pub expected_late: Option<ExpectedLate>,
    /// Every reply from the lock's servers is known to arrive at least this long after the
    /// server acted (a proxy that delays replies): the upper deadline bounds are then counted
    /// from `acq_ok.t − reply_delay` and `renew_ok.t − reply_delay`, which catches a lease
    /// measured from the reply instead of the send. Default zero.
    pub reply_delay: Duration,
    /// The shared-counter check, if the scenario has a counter.
    pub counter: Option<CounterCheck>,
    /// Worker processes killed, as (`proc`, monotonic ns), in addition to `kill_worker`
    /// nemesis events in the history.
    pub killed: Vec<(u32, u64)>,
    /// From this time on, every `observe` snapshot must show the lock key absent.
    pub quiescent_after: Option<u64>,
    /// Lock keys found by a final scan; must be empty.
    pub final_keys: Option<Vec<String>>,
    /// A TTL "jump up" between two snapshots must exceed this to count (zombie renewal).
    /// Default 5 ms.
    pub ttl_bump_tolerance: Duration,
    /// A TTL jump counts as a zombie renewal only if the earlier snapshot is at least this long
    /// after the holder stopped holding, so that a renewal sent before the loss and delayed in
    /// flight (fault proxy) is not blamed. [`CheckConfig::new`] sets it to the lease;
    /// the default is zero.
    pub zombie_grace: Duration,
    /// Number of surrounding events shown with a counterexample. Default 10.
    pub context_events: usize,
    /// Shared mode (read-write lock, semaphore): the lock's capacity in permits, and every
    /// `acq_ok` says how many its hold takes (`permits`; a read-write lock's read takes 1 and
    /// its write the whole capacity). I1 then checks that the permits of the windows open at
    /// any instant never exceed the capacity (readers may overlap each other, never a
    /// writer), and I3 that a fresh hold taking the whole capacity (a writer) has a token
    /// above every token acknowledged before its `acq_invoke`, and any other fresh hold one
    /// above every such writer's (concurrent readers' replies may arrive in any order, and
    /// the readers of one process may share one Redis hold and its token). `None`: an
    /// exclusive lock.
    pub capacity: Option<u64>,
}

impl Default for CheckConfig {
    fn default() -> Self {
        CheckConfig {
            lease: None,
            min_validity: Duration::ZERO,
            deadline_tolerance: Duration::from_millis(1),
            strict_invoke_bound: false,
            allow_token_reset: false,
            expected_late: None,
            reply_delay: Duration::ZERO,
            counter: None,
            killed: Vec::new(),
            quiescent_after: None,
            final_keys: None,
            ttl_bump_tolerance: Duration::from_millis(5),
            zombie_grace: Duration::ZERO,
            context_events: 10,
            capacity: None,
        }
    }
}

impl CheckConfig {
    /// This configuration for a scenario that pauses holder process `proc` across its
    /// deadline and then has it write once more on purpose: up to three of its operations may
    /// fall past its window (the fenced write and the increment it was in, and the deliberate
    /// late write), and the counter, read as `counter` after the run, may fall short by at
    /// most its late increments.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let cfg = slate_history::history::CheckConfig::new(Duration::from_secs(1))
    ///     .with_paused_holder(0, 42);
    /// assert_eq!(cfg.expected_late.map(|x| x.procs), Some(vec![0]));
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    #[must_use]
    pub fn with_paused_holder(self, proc: u32, counter: u64) -> Self {
        CheckConfig {
            expected_late: Some(ExpectedLate {
                procs: vec![proc],
                max_ops: 3,
                reason: format!(
                    "process {proc} is paused across its deadline: the operation it was in (a \
                     fenced write and an increment) completes late, and it writes once more \
                     after its loss on purpose"
                ),
            }),
            counter: Some(CounterCheck {
                final_value: counter,
                expected: CounterExpectation::AckedIncrementsLosingToLate { procs: vec![proc] },
            }),
            ..self
        }
    }

    /// Defaults with the given lease.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let cfg = slate_history::history::CheckConfig::new(Duration::from_secs(2));
    /// assert_eq!(cfg.lease, Some(Duration::from_secs(2)));
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn new(lease: Duration) -> Self {
        CheckConfig {
            lease: Some(lease),
            zombie_grace: lease,
            ..CheckConfig::default()
        }
    }
}

/// Resource operations past their holder's window that a scenario expects: a holder paused
/// or starved across its deadline (the hazard fencing tokens exist for), or a deliberate
/// write after a loss. Operations of other processes, or more than `max_ops`, fail.
///
/// # Examples
///
/// ```
/// use slate_history::history::{CheckConfig, ExpectedLate};
/// use std::time::Duration;
/// let cfg = CheckConfig {
///     expected_late: Some(ExpectedLate {
///         procs: vec![0],
///         max_ops: 2,
///         reason: "worker 0 is paused across its deadline".into(),
///     }),
///     ..CheckConfig::new(Duration::from_secs(2))
/// };
/// assert_eq!(cfg.expected_late.map(|e| e.max_ops), Some(2));
/// ```
///
/// # Errors
///
/// Not applicable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpectedLate {
    /// The processes whose operations may fall past their window.
    pub procs: Vec<u32>,
    /// At most this many such operations in all.
    pub max_ops: usize,
    /// Why the scenario expects them (shown in the report).
    pub reason: String,
}

/// The shared-counter check: the final value read must equal the expectation.
///
/// # Examples
///
/// ```
/// use slate_history::history::{CounterCheck, CounterExpectation};
/// let c = CounterCheck { final_value: 10, expected: CounterExpectation::Exact(10) };
/// assert_eq!(c.final_value, 10);
/// ```
///
/// # Errors
///
/// Not applicable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterCheck {
    /// The counter's value read after the scenario.
    pub final_value: u64,
    /// What it must equal.
    pub expected: CounterExpectation,
}

/// Where the expected counter value comes from.
///
/// # Examples
///
/// ```
/// let e = slate_history::history::CounterExpectation::AckedIncrements;
/// assert_ne!(e, slate_history::history::CounterExpectation::FirstLevelAcquisitions);
/// ```
///
/// # Errors
///
/// Not applicable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CounterExpectation {
    /// A value known to the scenario.
    Exact(u64),
    /// The number of `res_op` events with `op == "incr"` and `outcome == "ok"` (acknowledged
    /// increments). The recommended choice: a worker killed between its SET and its log line
    /// makes the counter one higher, which is then visible as a mismatch.
    AckedIncrements,
    /// The number of `acq_ok` with depth 1 (one increment per first-level acquisition).
    FirstLevelAcquisitions,
    /// [`AckedIncrements`](Self::AckedIncrements), except that each acknowledged increment of
    /// one of these processes that falls past its holder's window (a holder paused between
    /// its GET and its SET) may have overwritten one other increment: the counter may fall
    /// short by at most that many, and such a shortfall is a warning. A shortfall without
    /// enough late increments of these processes fails.
    AckedIncrementsLosingToLate {
        /// The processes expected to act late (the paused or starved holders).
        procs: Vec<u32>,
    },
}

/// Checks a history; see the crate-level description of each check in [`CheckId`] and in the
/// module documentation of [`crate::history`].
///
/// # Examples
///
/// ```
/// use slate_history::history::{check, CheckConfig, Event, EventKind::*, History};
/// let h = History::from_events(vec![
///     Event::new(10, 0, 0, "l", AcqOk { attempt: 0, holder: "a".into(), token: 1, depth: 1,
///         deadline: 1_000, nodes: vec![], permits: None }),
///     Event::new(20, 1, 0, "l", AcqOk { attempt: 0, holder: "b".into(), token: 2, depth: 1,
///         deadline: 1_000, nodes: vec![], permits: None }),
/// ]);
/// assert!(!check(&h, &CheckConfig::default()).is_ok());
/// ```
///
/// # Errors
///
/// None; violations are in the [`Report`].
pub fn check(history: &History, cfg: &CheckConfig) -> Report {
    Checker::new(history.events(), cfg).run()
}

/// Marks an index that does not point into the history (a kill from the config).
const NO_EVENT: usize = usize::MAX;

/// The deadline a window keeps when its holder, believing `cur`, is told `new` at `t`: a
/// later deadline is taken; an earlier one (an aggregated lease that lost a node) counts only
/// from `t`, when the holder learned of it, since until then it believed `cur`.
fn moved_deadline(cur: u64, new: u64, t: u64) -> u64 {
    if new >= cur { new } else { new.max(t.min(cur)) }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cause {
    Release,
    Lost,
    Deadline,
    Kill,
}

impl Cause {
    fn as_str(self) -> &'static str {
        match self {
            Cause::Release => "release invoked",
            Cause::Lost => "loss signalled",
            Cause::Deadline => "deadline",
            Cause::Kill => "worker killed",
        }
    }
}

#[derive(Debug)]
struct Win {
    lock: usize,
    holder: usize,
    start: u64,
    start_idx: usize,
    deadline: u64,
    deadline_idx: usize,
    close: Option<(u64, usize, Cause)>,
    /// The permits the hold takes (shared mode; exclusive windows: 1).
    permits: u64,
}

impl Win {
    /// Where the window ends: the earlier of its close and its deadline. A killed holder's
    /// window runs to its deadline: nobody released it, so the lock must not be handed over
    /// before the lease the holder last knew of has run out.
    fn end(&self) -> (u64, usize, Cause) {
        match self.close {
            Some((_, _, Cause::Kill)) => (self.deadline, self.deadline_idx, Cause::Kill),
            Some((t, i, c)) if t < self.deadline => (t, i, c),
            _ => (self.deadline, self.deadline_idx, Cause::Deadline),
        }
    }
}

#[derive(Debug)]
struct HolderState<'h> {
    name: &'h str,
    proc: u32,
    /// Hold count as the checker knows it.
    depth: u32,
    /// Whether `depth` is known (false after `lost`, `rel_info`, a kill).
    certain: bool,
    token: Option<u64>,
    /// Latest deadline from `acq_ok` / `renew_ok`.
    deadline: u64,
    /// The window not yet closed, if any.
    open: Option<usize>,
    windows: Vec<usize>,
    acquired: bool,
    /// Latest event of this holder.
    last_idx: usize,
    /// Latest time the holder was confirmed to hold (`acq_ok`, `renew_ok`).
    last_confirm_t: u64,
    /// Latest `rel_invoke` of this holder: (t, index).
    last_rel_invoke: Option<(u64, usize)>,
    /// When the holder last stopped holding (full release, loss, kill); cleared on `acq_ok`.
    released_at: Option<u64>,
    /// Latest acquire activity (`acq_invoke` of its task, `acq_ok`).
    last_acq_activity: u64,
}

struct Finding {
    message: String,
    events: Vec<usize>,
    anchor: usize,
}

#[derive(Default)]
struct Tally {
    count: usize,
    first: Option<Finding>,
}

impl Tally {
    fn add(&mut self, f: impl FnOnce() -> Finding) {
        self.count += 1;
        if self.first.is_none() {
            self.first = Some(f());
        }
    }
}

fn ms(ns: u64) -> String {
    format!("{}.{:06}ms", ns / 1_000_000, ns % 1_000_000)
}

fn dur_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Shared mode: the highest token acknowledged (of any hold, of a writer's), and its event.
type Acked = [Option<(u64, usize)>; 2];

struct Checker<'h> {
    ev: &'h [Event],
    cfg: &'h CheckConfig,
    origin: u64,
    locks: HashMap<&'h str, usize>,
    lock_names: Vec<&'h str>,
    holder_ids: HashMap<(usize, &'h str), usize>,
    hs: Vec<HolderState<'h>>,
    by_proc: HashMap<u32, Vec<usize>>,
    task_holder: HashMap<(u32, u64, usize), usize>,
    wins: Vec<Win>,
    pending: HashMap<(u32, usize, u64), usize>,
    waiting: Vec<usize>,
    ghosts: HashSet<(u32, u64, usize)>,
    last_first_level: Vec<Option<(u64, usize)>>,
    /// Shared mode: the highest token acknowledged so far per lock (of any hold, of a
    /// writer's), and its event.
    max_acked: Vec<Acked>,
    /// Shared mode: `max_acked` of the lock when each pending acquire was invoked.
    acked_at_invoke: HashMap<(u32, usize, u64), Acked>,
    last_observe: HashMap<(usize, usize), usize>,
    latencies: Vec<u64>,
    res_ops: Vec<usize>,
    /// Accepted fenced writes: (lock, seq, index).
    fenced_ops: Vec<(usize, u64, usize)>,
    /// First-level grants per lock, in time order: (t, token, whether it excludes everyone
    /// else: an exclusive hold or a writer). I2 compares fenced writes with them.
    grants: Vec<Vec<(u64, u64, bool)>>,
    acked_incr: u64,
    /// Acknowledged increments past validity of the processes a
    /// [`CounterExpectation::AckedIncrementsLosingToLate`] names.
    late_incr: u64,
    /// Re-entrant evidence: `acq_ok` above depth 1, `rel_ok` above depth 0.
    reentries: usize,
    /// Ownership evidence: `rel_ok`, `rel_fail` not held, `renew_ok`.
    ownership_events: usize,
    stats: Stats,
    observes: usize,
    excl: Tally,
    fenced: Tally,
    tokens: Tally,
    own: Tally,
    own_warn: Tally,
    reent: Tally,
    valid: Tally,
    activity: Tally,
    activity_expected: Tally,
    counter: Tally,
    /// The counter's finding is an expected, excused shortfall (a warning).
    counter_warn: bool,
    quiet: Tally,
}

impl<'h> Checker<'h> {
    fn new(ev: &'h [Event], cfg: &'h CheckConfig) -> Self {
        Checker {
            ev,
            cfg,
            origin: ev.first().map_or(0, |e| e.t),
            locks: HashMap::new(),
            lock_names: Vec::new(),
            holder_ids: HashMap::new(),
            hs: Vec::new(),
            by_proc: HashMap::new(),
            task_holder: HashMap::new(),
            wins: Vec::new(),
            pending: HashMap::new(),
            waiting: Vec::new(),
            ghosts: HashSet::new(),
            last_first_level: Vec::new(),
            max_acked: Vec::new(),
            acked_at_invoke: HashMap::new(),
            last_observe: HashMap::new(),
            latencies: Vec::new(),
            res_ops: Vec::new(),
            fenced_ops: Vec::new(),
            grants: Vec::new(),
            acked_incr: 0,
            late_incr: 0,
            reentries: 0,
            ownership_events: 0,
            stats: Stats::default(),
            observes: 0,
            excl: Tally::default(),
            fenced: Tally::default(),
            tokens: Tally::default(),
            own: Tally::default(),
            own_warn: Tally::default(),
            reent: Tally::default(),
            valid: Tally::default(),
            activity: Tally::default(),
            activity_expected: Tally::default(),
            counter: Tally::default(),
            counter_warn: false,
            quiet: Tally::default(),
        }
    }

    fn rel(&self, t: u64) -> String {
        rel_ms(t, self.origin)
    }

    fn lock_id(&mut self, name: &'h str) -> usize {
        match self.locks.entry(name) {
            Entry::Occupied(o) => *o.get(),
            Entry::Vacant(v) => {
                let id = self.lock_names.len();
                v.insert(id);
                self.lock_names.push(name);
                self.waiting.push(0);
                self.last_first_level.push(None);
                self.max_acked.push([None, None]);
                self.grants.push(Vec::new());
                id
            }
        }
    }

    fn holder_id(&mut self, lock: usize, name: &'h str, idx: usize) -> usize {
        let e = &self.ev[idx];
        let id = match self.holder_ids.entry((lock, name)) {
            Entry::Occupied(o) => *o.get(),
            Entry::Vacant(v) => {
                let id = self.hs.len();
                v.insert(id);
                self.hs.push(HolderState {
                    name,
                    proc: e.proc,
                    depth: 0,
                    certain: true,
                    token: None,
                    deadline: 0,
                    open: None,
                    windows: Vec::new(),
                    acquired: false,
                    last_idx: idx,
                    last_confirm_t: e.t,
                    last_rel_invoke: None,
                    released_at: None,
                    last_acq_activity: 0,
                });
                self.by_proc.entry(e.proc).or_default().push(id);
                id
            }
        };
        self.task_holder.insert((e.proc, e.task, lock), id);
        id
    }

    /// Closes an open window of `h` whose release outcome (`rel_ok` to depth 0, `rel_fail`
    /// not held, `rel_info`) arrives without a `rel_invoke` having closed it: at that release's
    /// `rel_invoke` if there was one in this window (the server acted after it), else at the
    /// last time holding was confirmed. Both are inner bounds.
    fn close_late(&mut self, h: usize, idx: usize) {
        let s = &self.hs[h];
        let Some(w) = s.open else { return };
        let (t, i) = match s.last_rel_invoke {
            Some((t, i)) if t >= self.wins[w].start => (t, i),
            _ => (s.last_confirm_t, idx),
        };
        self.close(h, t, i, Cause::Release);
    }

    fn close(&mut self, h: usize, t: u64, idx: usize, cause: Cause) {
        if let Some(w) = self.hs[h].open.take() {
            self.wins[w].close = Some((t, idx, cause));
        }
    }

    fn run(mut self) -> Report {
        let ev = self.ev;
        // Kills: from the config and from nemesis events, applied in time order before any
        // event with the same or a later timestamp.
        let mut kills: Vec<(u64, u32, usize)> = self
            .cfg
            .killed
            .iter()
            .map(|&(p, t)| (t, p, NO_EVENT))
            .collect();
        for (i, e) in ev.iter().enumerate() {
            if let EventKind::Nemesis { action, target } = &e.kind
                && action == KILL_WORKER
                && let Ok(p) = target.trim().parse::<u32>()
            {
                kills.push((e.t, p, i));
            }
        }
        kills.sort_by_key(|k| k.0);
        let mut next_kill = 0;
        let mut procs = HashSet::new();
        for (i, e) in ev.iter().enumerate() {
            while next_kill < kills.len() && kills[next_kill].0 <= e.t {
                let (t, p, idx) = kills[next_kill];
                self.kill(t, p, idx);
                next_kill += 1;
            }
            procs.insert(e.proc);
            self.event(i, e);
        }
        for &(t, p, idx) in &kills[next_kill..] {
            self.kill(t, p, idx);
        }
        self.stats.events = ev.len();
        self.stats.processes = procs.len();
        self.sweep();
        self.activity_check();
        self.fenced_check();
        self.finish()
    }
}

#[cfg(test)]
mod tests;
