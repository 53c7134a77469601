//! The history checker (reliability.md §7.4–7.5).
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

    fn kill(&mut self, t: u64, proc: u32, idx: usize) {
        // Its pending acquisitions will never complete.
        let waiting = &mut self.waiting;
        self.pending.retain(|&(p, lock, _), _| {
            if p == proc {
                waiting[lock] -= 1;
            }
            p != proc
        });
        let Some(hs) = self.by_proc.get(&proc) else {
            return;
        };
        for h in hs.clone() {
            if self.hs[h].open.is_some() {
                // Win::end runs a killed holder's window to its deadline.
                self.close(h, t, idx, Cause::Kill);
            }
            let s = &mut self.hs[h];
            if s.depth > 0 || !s.certain {
                s.released_at = Some(t);
            }
            s.depth = 0;
            s.certain = false;
        }
    }

    fn event(&mut self, i: usize, e: &'h Event) {
        let lock = self.lock_id(&e.lock);
        match &e.kind {
            EventKind::AcqInvoke { attempt, .. } => {
                if self.max_acked[lock] != [None, None] {
                    self.acked_at_invoke
                        .insert((e.proc, lock, *attempt), self.max_acked[lock]);
                }
                if self.pending.insert((e.proc, lock, *attempt), i).is_none() {
                    self.waiting[lock] += 1;
                    self.stats.max_waiters = self.stats.max_waiters.max(self.waiting[lock]);
                }
                if let Some(&h) = self.task_holder.get(&(e.proc, e.task, lock)) {
                    self.hs[h].last_acq_activity = e.t;
                }
            }
            EventKind::AcqOk {
                attempt,
                holder,
                token,
                depth,
                deadline,
                permits,
                ..
            } => {
                let grant = (*token, *depth, *deadline, *permits);
                self.acq_ok(i, e, lock, *attempt, holder, grant);
            }
            EventKind::AcqFail { attempt, .. } | EventKind::AcqInfo { attempt, .. } => {
                if self.pending.remove(&(e.proc, lock, *attempt)).is_some() {
                    self.waiting[lock] -= 1;
                }
                if matches!(e.kind, EventKind::AcqInfo { .. }) {
                    self.stats.ghosts += 1;
                    self.ghosts.insert((e.proc, e.task, lock));
                } else {
                    self.stats.acq_failures += 1;
                }
            }
            EventKind::RenewOk { holder, deadline } => {
                self.renew_ok(i, e, lock, holder, *deadline);
            }
            EventKind::RenewFail { holder, .. } => {
                let h = self.holder_id(lock, holder, i);
                self.hs[h].last_idx = i;
            }
            EventKind::Lost { holder, .. } => {
                self.stats.losses += 1;
                let h = self.holder_id(lock, holder, i);
                self.close(h, e.t, i, Cause::Lost);
                let s = &mut self.hs[h];
                s.certain = false;
                s.released_at = Some(e.t);
                s.last_idx = i;
            }
            EventKind::RelInvoke {
                holder,
                depth_before,
            } => {
                self.rel_invoke(i, e, lock, holder, *depth_before);
            }
            EventKind::RelOk {
                holder,
                depth_after,
            } => {
                self.rel_ok(i, e, lock, holder, *depth_after);
            }
            EventKind::RelFail {
                holder, not_held, ..
            } => {
                self.rel_fail(i, e, lock, holder, *not_held);
            }
            EventKind::RelInfo { holder, .. } => {
                // A release at depth 1 was closed by its rel_invoke. If the window is still
                // open (a deeper release, or no rel_invoke), close it where holding was last
                // confirmed unless the holder certainly keeps an outer level.
                let h = self.holder_id(lock, holder, i);
                let (depth, certain) = (self.hs[h].depth, self.hs[h].certain);
                if depth <= 1 || !certain {
                    self.close_late(h, i);
                }
                let s = &mut self.hs[h];
                s.certain = false;
                s.last_idx = i;
            }
            EventKind::ResOp { op, outcome, .. } => {
                self.res_ops.push(i);
                if op == OP_INCR && outcome == OUTCOME_OK {
                    self.acked_incr += 1;
                }
                if op == OP_FENCED_WRITE {
                    match FencedOutcome::parse(outcome) {
                        Some(FencedOutcome::Accepted { seq }) => {
                            self.stats.fenced_accepted += 1;
                            self.fenced_ops.push((lock, seq, i));
                        }
                        Some(FencedOutcome::Rejected { .. }) => self.stats.fenced_rejected += 1,
                        _ => {}
                    }
                }
            }
            EventKind::Nemesis { .. } => {}
            EventKind::Observe {
                node,
                fields,
                pttl_ms,
                ..
            } => {
                self.observe(i, e, lock, *node, fields, *pttl_ms);
            }
        }
    }

    /// `grant`: (token, depth, deadline, permits) of the `acq_ok`.
    fn acq_ok(
        &mut self,
        i: usize,
        e: &'h Event,
        lock: usize,
        attempt: u64,
        holder: &'h str,
        grant: (u64, u32, u64, Option<u64>),
    ) {
        let (token, depth, deadline, permits) = grant;
        self.stats.acquisitions += 1;
        let acked_before = self.acked_at_invoke.remove(&(e.proc, lock, attempt));
        let invoke = self.pending.remove(&(e.proc, lock, attempt));
        if invoke.is_some() {
            self.waiting[lock] -= 1;
        }
        if let Some(inv) = invoke {
            self.latencies.push(e.t.saturating_sub(self.ev[inv].t));
        }
        // Validity accounting.
        if let Some(lease) = self.cfg.lease {
            let single = invoke.is_some_and(|inv| {
                self.cfg.strict_invoke_bound
                    || matches!(
                        self.ev[inv].kind,
                        EventKind::AcqInvoke {
                            budget_ms: Some(0),
                            ..
                        }
                    )
            });
            let (from, what, from_idx) = match invoke {
                Some(inv) if single => (self.ev[inv].t, "acq_invoke", inv),
                _ if !self.cfg.reply_delay.is_zero() => (
                    e.t.saturating_sub(dur_ns(self.cfg.reply_delay)),
                    "acq_ok.t − reply delay",
                    i,
                ),
                _ => (e.t, "acq_ok", i),
            };
            let bound = from
                .saturating_add(dur_ns(lease))
                .saturating_add(dur_ns(self.cfg.deadline_tolerance));
            if deadline > bound {
                let msg = format!(
                    "holder {holder:?}: acq_ok deadline {} is {} beyond {what}.t + lease ({} + {:?}, \
                     tolerance {:?})",
                    self.rel(deadline),
                    ms(deadline - bound),
                    self.rel(from),
                    lease,
                    self.cfg.deadline_tolerance
                );
                let mut events = vec![i];
                if from_idx != i {
                    events.insert(0, from_idx);
                }
                self.valid.add(|| Finding {
                    message: msg,
                    events,
                    anchor: i,
                });
            }
        }
        let min_v = dur_ns(self.cfg.min_validity);
        if deadline < e.t.saturating_add(min_v) {
            let left = deadline.saturating_sub(e.t);
            let msg = format!(
                "holder {holder:?}: acquired with {} of validity left (deadline {}), minimum {:?}",
                if deadline >= e.t {
                    ms(left)
                } else {
                    format!("-{}", ms(e.t - deadline))
                },
                self.rel(deadline),
                self.cfg.min_validity
            );
            self.valid.add(|| Finding {
                message: msg,
                events: vec![i],
                anchor: i,
            });
        }

        *self.stats.acquisitions_per_proc.entry(e.proc).or_default() += 1;
        if depth > 1 {
            self.reentries += 1;
        } else {
            let excludes = match (self.cfg.capacity, permits) {
                (Some(c), Some(p)) => p >= c,
                _ => true,
            };
            self.grants[lock].push((e.t, token, excludes));
        }
        let h = self.holder_id(lock, holder, i);
        let ghost = self.ghosts.remove(&(e.proc, e.task, lock));
        let (prev_depth, certain, prev_token, prev_idx, prev_deadline) = {
            let s = &self.hs[h];
            (s.depth, s.certain, s.token, s.last_idx, s.deadline)
        };
        // A re-entrant call that reaches the server after the entry expired creates a fresh
        // entry (depth 1, new token): legitimate once the holder's deadline has passed.
        let recreated = depth == 1 && prev_depth >= 1 && e.t >= prev_deadline;
        // I6: depth goes up by exactly one.
        if certain && depth != prev_depth.saturating_add(1) && !ghost && !recreated {
            let msg = format!(
                "holder {holder:?}: acq_ok reports depth {depth} but the holder had depth \
                 {prev_depth} (expected {})",
                prev_depth.saturating_add(1)
            );
            let events = if prev_idx == i {
                vec![i]
            } else {
                vec![prev_idx, i]
            };
            self.reent.add(|| Finding {
                message: msg,
                events,
                anchor: i,
            });
        }
        // I3: tokens.
        if let (true, Some(capacity)) = (depth <= 1, self.cfg.capacity) {
            // Shared mode: a writer above every token acknowledged before this call was
            // invoked, anyone else above every such writer's.
            self.stats.first_level_acquisitions += 1;
            let writer = permits.is_none_or(|p| p >= capacity);
            let bound = acked_before.and_then(|[all, writes]| if writer { all } else { writes });
            if let Some((prev, pidx)) = bound
                && token <= prev
            {
                let msg = format!(
                    "lock {:?}: holder {holder:?} ({}) acquired with token {token}, not greater \
                     than token {prev} of a {} acknowledged before this acquisition was invoked",
                    self.lock_names[lock],
                    if writer { "a writer" } else { "a reader" },
                    if writer { "hold" } else { "writer" }
                );
                self.tokens.add(|| Finding {
                    message: msg,
                    events: vec![pidx, i],
                    anchor: i,
                });
            }
            let max = &mut self.max_acked[lock];
            for (slot, counts) in max.iter_mut().zip([true, writer]) {
                if counts && slot.is_none_or(|(m, _)| token > m) {
                    *slot = Some((token, i));
                }
            }
        } else if depth <= 1 {
            self.stats.first_level_acquisitions += 1;
            if let Some((prev, pidx)) = self.last_first_level[lock]
                && token <= prev
            {
                if self.cfg.allow_token_reset {
                    self.stats.token_resets += 1;
                } else {
                    let msg = format!(
                        "lock {:?}: holder {holder:?} acquired with token {token}, not greater \
                         than token {prev} of the previous first-level acquisition",
                        self.lock_names[lock]
                    );
                    self.tokens.add(|| Finding {
                        message: msg,
                        events: vec![pidx, i],
                        anchor: i,
                    });
                }
            }
            self.last_first_level[lock] = Some((token, i));
        } else if (prev_depth >= 1 || !certain)
            && let Some(prev) = prev_token
            && prev != token
        {
            let msg = format!(
                "holder {holder:?}: re-entrant acquisition (depth {depth}) returned token {token}, \
                 the holder's token is {prev}"
            );
            let events = if prev_idx == i {
                vec![i]
            } else {
                vec![prev_idx, i]
            };
            self.tokens.add(|| Finding {
                message: msg,
                events,
                anchor: i,
            });
        }

        let s = &mut self.hs[h];
        let fresh = depth <= 1;
        s.depth = depth;
        s.certain = true;
        s.token = Some(token);
        // A re-entry reports the hold's deadline as its guard read it, possibly before a
        // renewal already logged: the window keeps the latest.
        s.deadline = if fresh {
            deadline
        } else {
            s.deadline.max(deadline)
        };
        s.acquired = true;
        s.last_idx = i;
        s.last_confirm_t = e.t;
        s.released_at = None;
        s.last_acq_activity = e.t;
        if depth <= 1 {
            // A fresh entry: the previous one is gone, its window ends by its own deadline.
            s.open = None;
        }
        match s.open {
            Some(w) => {
                let w = &mut self.wins[w];
                if deadline > w.deadline {
                    w.deadline = deadline;
                    w.deadline_idx = i;
                }
            }
            None => {
                let w = self.wins.len();
                s.open = Some(w);
                s.windows.push(w);
                self.wins.push(Win {
                    lock,
                    holder: h,
                    start: e.t,
                    start_idx: i,
                    deadline,
                    deadline_idx: i,
                    close: None,
                    permits: permits.unwrap_or(1),
                });
            }
        }
    }

    fn renew_ok(&mut self, i: usize, e: &'h Event, lock: usize, holder: &'h str, deadline: u64) {
        self.ownership_events += 1;
        if let Some(lease) = self.cfg.lease {
            let delay = dur_ns(self.cfg.reply_delay);
            let bound =
                e.t.saturating_sub(delay)
                    .saturating_add(dur_ns(lease))
                    .saturating_add(dur_ns(self.cfg.deadline_tolerance));
            if deadline > bound {
                let msg = format!(
                    "holder {holder:?}: renew_ok deadline {} is {} beyond renew_ok.t{} + lease",
                    self.rel(deadline),
                    ms(deadline - bound),
                    if delay > 0 {
                        format!(" − reply delay {:?}", self.cfg.reply_delay)
                    } else {
                        String::new()
                    }
                );
                self.valid.add(|| Finding {
                    message: msg,
                    events: vec![i],
                    anchor: i,
                });
            }
        }
        let h = self.holder_id(lock, holder, i);
        let s = &self.hs[h];
        if s.certain && s.depth == 0 {
            let msg = format!(
                "holder {holder:?}: renew_ok while not holding (renewal outlived release or \
                 acquisition; a reply reordered against the release is possible, so this is a \
                 warning)"
            );
            let events = if s.last_idx == i {
                vec![i]
            } else {
                vec![s.last_idx, i]
            };
            self.own_warn.add(|| Finding {
                message: msg,
                events,
                anchor: i,
            });
            self.hs[h].last_idx = i;
            return;
        }
        let s = &mut self.hs[h];
        s.deadline = moved_deadline(s.deadline, deadline, e.t);
        s.last_idx = i;
        s.last_confirm_t = e.t;
        if let Some(w) = s.open {
            let w = &mut self.wins[w];
            let moved = moved_deadline(w.deadline, deadline, e.t);
            if moved != w.deadline {
                w.deadline = moved;
                w.deadline_idx = i;
            }
        }
    }

    fn rel_invoke(&mut self, i: usize, e: &'h Event, lock: usize, holder: &'h str, before: u32) {
        let h = self.holder_id(lock, holder, i);
        let (depth, certain, prev_idx) = {
            let s = &self.hs[h];
            (s.depth, s.certain, s.last_idx)
        };
        if certain && depth > 0 && before != depth {
            let msg = format!(
                "holder {holder:?}: rel_invoke says depth_before {before}, the history gives \
                 depth {depth}"
            );
            self.reent.add(|| Finding {
                message: msg,
                events: vec![prev_idx, i],
                anchor: i,
            });
        }
        if before <= 1 || (certain && depth <= 1) {
            self.close(h, e.t, i, Cause::Release);
        }
        self.hs[h].last_idx = i;
        self.hs[h].last_rel_invoke = Some((e.t, i));
    }

    fn rel_ok(&mut self, i: usize, e: &'h Event, lock: usize, holder: &'h str, after: u32) {
        self.stats.releases += 1;
        self.ownership_events += 1;
        if after > 0 {
            self.reentries += 1;
        }
        let h = self.holder_id(lock, holder, i);
        let (depth, certain, prev_idx) = {
            let s = &self.hs[h];
            (s.depth, s.certain, s.last_idx)
        };
        if certain && depth == 0 {
            let msg = format!(
                "holder {holder:?} does not hold lock {:?}, yet its release succeeded \
                 (depth_after {after})",
                self.lock_names[lock]
            );
            let events = if prev_idx == i {
                vec![i]
            } else {
                vec![prev_idx, i]
            };
            self.own.add(|| Finding {
                message: msg,
                events,
                anchor: i,
            });
        } else if certain && after != depth - 1 {
            let msg = format!(
                "holder {holder:?}: one release took depth from {depth} to {after} (expected {})",
                depth - 1
            );
            self.reent.add(|| Finding {
                message: msg,
                events: vec![prev_idx, i],
                anchor: i,
            });
        }
        if after == 0 && self.hs[h].open.is_some() {
            // No rel_invoke at depth 1 closed the window (rel_ok.t is after the server-side
            // delete, so it cannot be the end).
            self.close_late(h, i);
        }
        let s = &mut self.hs[h];
        if after == 0 && (s.depth > 0 || !s.certain) {
            s.released_at = Some(e.t);
        }
        s.depth = after;
        s.certain = true;
        s.last_idx = i;
    }

    fn rel_fail(&mut self, i: usize, e: &'h Event, lock: usize, holder: &'h str, not_held: bool) {
        let h = self.holder_id(lock, holder, i);
        if !not_held {
            self.hs[h].last_idx = i;
            return;
        }
        self.ownership_events += 1;
        let (depth, certain, prev_idx, deadline) = {
            let s = &self.hs[h];
            (s.depth, s.certain, s.last_idx, s.deadline)
        };
        if certain && depth > 0 && e.t < deadline {
            let msg = format!(
                "holder {holder:?} (depth {depth}, lease valid until {}) was answered \"not held\" \
                 at {}: its entry vanished inside its lease",
                self.rel(deadline),
                self.rel(e.t)
            );
            let f = || Finding {
                message: msg,
                events: vec![prev_idx, i],
                anchor: i,
            };
            if self.cfg.allow_token_reset {
                self.own_warn.add(f);
            } else {
                self.own.add(f);
            }
        }
        self.close_late(h, i);
        let s = &mut self.hs[h];
        if s.depth > 0 || !s.certain {
            s.released_at = Some(e.t);
        }
        s.depth = 0;
        s.certain = true;
        s.last_idx = i;
    }

    fn observe(
        &mut self,
        i: usize,
        e: &'h Event,
        lock: usize,
        node: usize,
        fields: &'h std::collections::BTreeMap<String, u64>,
        pttl_ms: i64,
    ) {
        self.observes += 1;
        let present = !fields.is_empty() || pttl_ms >= -1;
        if present && self.cfg.quiescent_after.is_some_and(|q| e.t >= q) {
            let msg = format!(
                "lock {:?} node {node}: key still present at {} (fields {fields:?}, pttl {pttl_ms} \
                 ms) after quiescence began",
                self.lock_names[lock],
                self.rel(e.t)
            );
            self.quiet.add(|| Finding {
                message: msg,
                events: vec![i],
                anchor: i,
            });
        }
        // Zombie renewal: the TTL of a field whose holder has stopped holding jumps up.
        if let Some(prev) = self.last_observe.insert((lock, node), i)
            && let EventKind::Observe {
                fields: pf,
                pttl_ms: pp,
                ..
            } = &self.ev[prev].kind
            && *pp >= 0
            && pttl_ms >= 0
        {
            let tol = i64::try_from(self.cfg.ttl_bump_tolerance.as_millis()).unwrap_or(i64::MAX);
            if pttl_ms > pp.saturating_add(tol) {
                let t1 = self.ev[prev].t;
                for field in fields.keys() {
                    if !pf.contains_key(field) {
                        continue;
                    }
                    let Some(&h) = self.holder_ids.get(&(lock, field.as_str())) else {
                        continue;
                    };
                    let s = &self.hs[h];
                    if let Some(r) = s.released_at
                        && r.saturating_add(dur_ns(self.cfg.zombie_grace)) <= t1
                        && r < t1
                        && s.last_acq_activity < r
                    {
                        let msg = format!(
                            "lock {:?} node {node}: TTL of holder {field:?} rose from {pp} ms to \
                             {pttl_ms} ms after the holder stopped holding at {} (zombie renewal)",
                            self.lock_names[lock],
                            self.rel(r)
                        );
                        let events = vec![s.last_idx, prev, i];
                        self.quiet.add(|| Finding {
                            message: msg,
                            events,
                            anchor: i,
                        });
                    }
                }
            }
        }
    }

    /// I1: per lock, sort windows by start; a window starting before the latest end among
    /// earlier windows of *other* holders is a violation.
    /// Counts the windows and how they closed; answers, per lock, the windows that are not
    /// empty.
    fn windows_per_lock(&mut self) -> Vec<Vec<usize>> {
        let mut per_lock: Vec<Vec<usize>> = vec![Vec::new(); self.lock_names.len()];
        for (w, win) in self.wins.iter().enumerate() {
            let (end, _, cause) = win.end();
            self.stats.windows_closed[match cause {
                Cause::Release => 0,
                Cause::Lost => 1,
                Cause::Deadline => 2,
                Cause::Kill => 3,
            }] += 1;
            if end > win.start {
                per_lock[win.lock].push(w);
            }
        }
        self.stats.windows = self.wins.len();
        self.stats.locks = per_lock.iter().filter(|v| !v.is_empty()).count();
        per_lock
    }

    fn sweep(&mut self) {
        if let Some(capacity) = self.cfg.capacity {
            self.shared_sweep(capacity);
            return;
        }
        let mut per_lock = self.windows_per_lock();
        for ws in &mut per_lock {
            ws.sort_by_key(|&w| (self.wins[w].start, self.wins[w].start_idx));
            // best: latest-ending window; second: latest-ending of a holder other than best's.
            let mut best: Option<(u64, usize)> = None;
            let mut second: Option<(u64, usize)> = None;
            for &w in ws.iter() {
                let win = &self.wins[w];
                let other = match best {
                    Some((_, b)) if self.wins[b].holder != win.holder => best,
                    _ => second,
                };
                if let Some((end, o)) = other
                    && win.start < end
                {
                    let f = self.overlap_finding(o, w);
                    self.excl.add(|| f);
                }
                let (end, _, _) = win.end();
                match best {
                    None => best = Some((end, w)),
                    Some((bend, b)) => {
                        if self.wins[b].holder == win.holder {
                            if end > bend {
                                best = Some((end, w));
                            }
                        } else if end > bend {
                            second = best;
                            best = Some((end, w));
                        } else if second.is_none_or(|(send, _)| end > send) {
                            second = Some((end, w));
                        }
                    }
                }
            }
        }
    }

    /// I1 in shared mode: at every window start, the permits of the windows open (of every
    /// holder) must fit in `capacity`. The finding names the new window and the open window
    /// of another holder that takes the most permits.
    fn shared_sweep(&mut self, capacity: u64) {
        for ws in self.windows_per_lock() {
            // Ends sort before starts at the same instant: touching windows do not overlap.
            let mut points: Vec<(u64, bool, usize)> = ws
                .iter()
                .flat_map(|&w| {
                    [
                        (self.wins[w].start, true, w),
                        (self.wins[w].end().0, false, w),
                    ]
                })
                .collect();
            points.sort_by_key(|&(t, start, w)| (t, start, self.wins[w].start_idx));
            let mut open: Vec<usize> = Vec::new();
            let mut used = 0u64;
            for &(_, start, w) in points.iter() {
                let permits = self.wins[w].permits;
                if !start {
                    open.retain(|&o| o != w);
                    used = used.saturating_sub(permits);
                    continue;
                }
                used = used.saturating_add(permits);
                if used > capacity {
                    let holder = self.wins[w].holder;
                    let other = open
                        .iter()
                        .copied()
                        .filter(|&o| self.wins[o].holder != holder)
                        .max_by_key(|&o| self.wins[o].permits);
                    if let Some(o) = other {
                        let mut f = self.overlap_finding(o, w);
                        f.message = format!("{} ({used} permits in use of {capacity})", f.message);
                        self.excl.add(|| f);
                    }
                }
                open.push(w);
            }
        }
    }

    fn overlap_finding(&self, a: usize, b: usize) -> Finding {
        let (wa, wb) = (&self.wins[a], &self.wins[b]);
        let (ea, ea_idx, ca) = wa.end();
        let (eb, eb_idx, cb) = wb.end();
        let (ha, hb) = (&self.hs[wa.holder], &self.hs[wb.holder]);
        let message = format!(
            "lock {:?}: holder {:?} (proc {}) window [{}, {}] (ended by {}) overlaps holder {:?} \
             (proc {}) window [{}, {}] (ended by {}) by {}",
            self.lock_names[wa.lock],
            ha.name,
            ha.proc,
            self.rel(wa.start),
            self.rel(ea),
            ca.as_str(),
            hb.name,
            hb.proc,
            self.rel(wb.start),
            self.rel(eb),
            cb.as_str(),
            ms(ea.min(eb) - wb.start)
        );
        let mut events = vec![
            wa.start_idx,
            wa.deadline_idx,
            ea_idx,
            wb.start_idx,
            wb.deadline_idx,
            eb_idx,
        ];
        if let Some((_, i, _)) = wa.close {
            events.push(i);
        }
        if let Some((_, i, _)) = wb.close {
            events.push(i);
        }
        events.retain(|&i| i != NO_EVENT);
        events.sort_unstable();
        events.dedup();
        Finding {
            message,
            events,
            anchor: wb.start_idx,
        }
    }

    /// Resource operations must fall inside their holder's window.
    fn activity_check(&mut self) {
        let ops = std::mem::take(&mut self.res_ops);
        for &i in &ops {
            let e = &self.ev[i];
            let EventKind::ResOp {
                holder, op, token, ..
            } = &e.kind
            else {
                continue;
            };
            let Some(&lock) = self.locks.get(e.lock.as_str()) else {
                continue;
            };
            let h = self.holder_ids.get(&(lock, holder.as_str())).copied();
            let wins: &[usize] = h.map_or(&[], |h| &self.hs[h].windows);
            let k = wins.partition_point(|&w| self.wins[w].start <= e.t);
            let inside = k > 0 && {
                let (end, _, _) = self.wins[wins[k - 1]].end();
                e.t <= end
            };
            if inside {
                continue;
            }
            self.stats.activity_past_validity += 1;
            if let (Some(c), true) = (&self.cfg.counter, op == OP_INCR)
                && let CounterExpectation::AckedIncrementsLosingToLate { procs } = &c.expected
                && procs.contains(&e.proc)
                && matches!(&e.kind, EventKind::ResOp { outcome, .. } if outcome == OUTCOME_OK)
            {
                self.late_incr += 1;
            }
            let expected = self
                .cfg
                .expected_late
                .as_ref()
                .is_some_and(|x| x.procs.contains(&e.proc));
            let (message, events) = if k > 0 {
                let w = &self.wins[wins[k - 1]];
                let (end, end_idx, cause) = w.end();
                let mut ev = vec![w.start_idx, end_idx, i];
                ev.retain(|&x| x != NO_EVENT);
                ev.dedup();
                (
                    format!(
                        "holder {holder:?}: {op} (token {token}) at {} is {} past its window \
                         [{}, {}] (ended by {})",
                        self.rel(e.t),
                        ms(e.t - end),
                        self.rel(w.start),
                        self.rel(end),
                        cause.as_str()
                    ),
                    ev,
                )
            } else {
                (
                    format!(
                        "holder {holder:?}: {op} (token {token}) at {} without any validity window",
                        self.rel(e.t)
                    ),
                    vec![i],
                )
            };
            let tally = if expected {
                &mut self.activity_expected
            } else {
                &mut self.activity
            };
            tally.add(|| Finding {
                message,
                events,
                anchor: i,
            });
        }
        self.res_ops = ops;
        // More late operations than the scenario said it expects: all of them fail.
        if let Some(x) = &self.cfg.expected_late
            && self.activity_expected.count > x.max_ops
        {
            let extra = std::mem::take(&mut self.activity_expected);
            if let Some(mut f) = extra.first {
                f.message = format!(
                    "{} operations past validity of processes {:?}, at most {} expected ({}); \
                     first: {}",
                    extra.count, x.procs, x.max_ops, x.reason, f.message
                );
                self.activity.count += extra.count;
                if self.activity.first.is_none() {
                    self.activity.first = Some(f);
                }
            }
        }
    }

    /// I2: a fenced write that the resource accepted although a newer grant had been
    /// acknowledged before the write was sent (a stale token got through: the resource's check
    /// or the lock's token order is broken, or an old holder acted after the lock moved on and
    /// before the new holder's first write); two holders' accepted writes with one token
    /// (exclusive locks: tokens are per hold); and, per lock, accepted tokens going down in
    /// the resource's accept order.
    fn fenced_check(&mut self) {
        let mut ops = std::mem::take(&mut self.fenced_ops);
        ops.sort_by_key(|&(lock, seq, i)| (lock, seq, i));
        // Per lock, the highest excluding grant token acknowledged up to each grant.
        let prefix: Vec<Vec<(u64, u64)>> = self
            .grants
            .iter()
            .map(|g| {
                let mut best = 0u64;
                g.iter()
                    .filter(|&&(_, _, excludes)| excludes)
                    .map(|&(t, token, _)| {
                        best = best.max(token);
                        (t, best)
                    })
                    .collect()
            })
            .collect();
        let mut token_holder: HashMap<(usize, u64), usize> = HashMap::new();
        // (lock, highest token so far, its event)
        let mut max: Option<(usize, u64, usize)> = None;
        for &(lock, seq, i) in &ops {
            let EventKind::ResOp {
                holder,
                token,
                invoked,
                ..
            } = &self.ev[i].kind
            else {
                continue;
            };
            if let Some(sent) = *invoked {
                let g = &prefix[lock];
                let k = g.partition_point(|&(t, _)| t < sent);
                if k > 0 && g[k - 1].1 > *token {
                    let newer = g[k - 1].1;
                    let message = format!(
                        "lock {:?}: the fenced resource accepted token {token} of holder \
                         {holder:?} (accept #{seq}, sent at {}), though token {newer} had been \
                         granted and acknowledged before it was sent",
                        self.lock_names[lock],
                        self.rel(sent),
                    );
                    self.fenced.add(|| Finding {
                        message,
                        events: vec![i],
                        anchor: i,
                    });
                }
            }
            if self.cfg.capacity.is_none() {
                match token_holder.entry((lock, *token)) {
                    Entry::Vacant(v) => {
                        v.insert(i);
                    }
                    Entry::Occupied(o) => {
                        let j = *o.get();
                        if self.ev[j].kind.holder() != Some(holder.as_str()) {
                            let message = format!(
                                "lock {:?}: the fenced resource accepted token {token} from two \
                                 holders, {:?} and {holder:?}",
                                self.lock_names[lock],
                                self.ev[j].kind.holder().unwrap_or("?"),
                            );
                            self.fenced.add(|| Finding {
                                message,
                                events: vec![j.min(i), j.max(i)],
                                anchor: i,
                            });
                        }
                    }
                }
            }
            match max {
                Some((l, m, mi)) if l == lock && *token < m => {
                    let (ph, pseq) = match &self.ev[mi].kind {
                        EventKind::ResOp {
                            holder, outcome, ..
                        } => (
                            holder.as_str(),
                            match FencedOutcome::parse(outcome) {
                                Some(FencedOutcome::Accepted { seq }) => seq,
                                _ => 0,
                            },
                        ),
                        _ => ("?", 0),
                    };
                    let message = format!(
                        "lock {:?}: the fenced resource accepted token {token} of holder \
                         {holder:?} (accept #{seq}, at {}) after token {m} of holder {ph:?} \
                         (accept #{pseq}, at {})",
                        self.lock_names[lock],
                        self.rel(self.ev[i].t),
                        self.rel(self.ev[mi].t)
                    );
                    self.fenced.add(|| Finding {
                        message,
                        events: vec![mi.min(i), mi.max(i)],
                        anchor: i,
                    });
                }
                Some((l, m, _)) if l == lock && *token == m => {}
                _ => max = Some((lock, *token, i)),
            }
        }
        self.fenced_ops = ops;
    }

    fn finish(mut self) -> Report {
        // Counter.
        let counter_note;
        let counter_status = match &self.cfg.counter {
            None => {
                counter_note = String::new();
                Some(Status::Unchecked("no counter configured".into()))
            }
            Some(c) => {
                let (expected, source) = match c.expected {
                    CounterExpectation::Exact(v) => (v, "given"),
                    CounterExpectation::AckedIncrements
                    | CounterExpectation::AckedIncrementsLosingToLate { .. } => {
                        (self.acked_incr, "acked increments")
                    }
                    CounterExpectation::FirstLevelAcquisitions => (
                        u64::try_from(self.stats.first_level_acquisitions).unwrap_or(u64::MAX),
                        "first-level acquisitions",
                    ),
                };
                counter_note = format!("final {} vs {expected} {source}", c.final_value);
                let excused = matches!(
                    c.expected,
                    CounterExpectation::AckedIncrementsLosingToLate { .. }
                ) && c.final_value < expected
                    && expected - c.final_value <= self.late_incr;
                if excused {
                    let message = format!(
                        "counter is {} but {expected} was expected ({source}): {} lost update(s), \
                         within the {} increment(s) the late processes made past validity",
                        c.final_value,
                        expected - c.final_value,
                        self.late_incr
                    );
                    self.counter_warn = true;
                    self.counter.add(|| Finding {
                        message,
                        events: Vec::new(),
                        anchor: NO_EVENT,
                    });
                } else if c.final_value != expected {
                    let late = if matches!(
                        c.expected,
                        CounterExpectation::AckedIncrementsLosingToLate { .. }
                    ) {
                        format!(
                            "; the late processes made only {} increment(s) past validity",
                            self.late_incr
                        )
                    } else {
                        String::new()
                    };
                    let message = format!(
                        "counter is {} but {expected} was expected ({source}): {} lost \
                         update(s){late}",
                        c.final_value,
                        i128::from(expected) - i128::from(c.final_value)
                    );
                    self.counter.add(|| Finding {
                        message,
                        events: Vec::new(),
                        anchor: NO_EVENT,
                    });
                }
                None
            }
        };
        // Quiescence: final scan.
        if let Some(keys) = &self.cfg.final_keys
            && !keys.is_empty()
        {
            let message = format!("lock keys left after the scenario: {keys:?}");
            let last = self.ev.len().checked_sub(1).unwrap_or(NO_EVENT);
            self.quiet.add(|| Finding {
                message,
                events: Vec::new(),
                anchor: last,
            });
        }
        // Latency.
        let mut lat = std::mem::take(&mut self.latencies);
        lat.sort_unstable();
        if let Some(&max) = lat.last() {
            let rank = |p: usize| lat[(lat.len() * p).div_ceil(100).saturating_sub(1)];
            self.stats.acquire_latency = Latency {
                count: lat.len(),
                p50: Duration::from_nanos(rank(50)),
                p99: Duration::from_nanos(rank(99)),
                max: Duration::from_nanos(max),
            };
        }
        self.stats.holders = self.hs.iter().filter(|h| h.acquired).count();

        let acquisitions = self.stats.acquisitions;
        let mut checks = Vec::new();
        let none = |what: &str| Some(Status::Unchecked(what.to_owned()));
        let excl = std::mem::take(&mut self.excl);
        // A check compares holders: with fewer than two on every lock it has nothing to judge.
        let mut holders_per_lock: HashMap<usize, HashSet<usize>> = HashMap::new();
        for w in &self.wins {
            holders_per_lock.entry(w.lock).or_default().insert(w.holder);
        }
        let pairs = holders_per_lock.values().any(|h| h.len() >= 2);
        let two_grants = self.grants.iter().any(|g| g.len() >= 2);
        checks.push(self.result(
            CheckId::Exclusion,
            excl,
            false,
            if acquisitions == 0 {
                none("no acq_ok events")
            } else if !pairs {
                none("fewer than two holders on every lock: no pair of windows to compare")
            } else {
                None
            },
            format!(
                "{} windows on {} locks",
                self.stats.windows, self.stats.locks
            ),
        ));
        let fenced = std::mem::take(&mut self.fenced);
        let fenced_note = format!(
            "{} accepted, {} rejected fenced writes",
            self.stats.fenced_accepted, self.stats.fenced_rejected
        );
        checks.push(self.result(
            CheckId::FencedOrder,
            fenced,
            false,
            if self.fenced_ops.is_empty() {
                none("no accepted fenced writes")
            } else {
                None
            },
            fenced_note,
        ));
        let tokens = std::mem::take(&mut self.tokens);
        checks.push(self.result(
            CheckId::Tokens,
            tokens,
            false,
            if acquisitions == 0 {
                none("no acq_ok events")
            } else if !two_grants {
                none("fewer than two first-level acquisitions on every lock")
            } else {
                None
            },
            format!(
                "{} first-level acquisitions",
                self.stats.first_level_acquisitions
            ),
        ));
        let own = std::mem::take(&mut self.own);
        let mut own_res = self.result(
            CheckId::Ownership,
            own,
            false,
            if self.ownership_events == 0 {
                none("no release or renewal answers")
            } else {
                None
            },
            format!("{} releases", self.stats.releases),
        );
        if own_res.status == Status::Pass && self.own_warn.count > 0 {
            let warn = std::mem::take(&mut self.own_warn);
            own_res = self.result(CheckId::Ownership, warn, true, None, own_res.note);
        }
        checks.push(own_res);
        let reent = std::mem::take(&mut self.reent);
        let reent_note = format!(
            "{acquisitions} acquisitions, {} releases",
            self.stats.releases
        );
        let no_reentry = self.reentries == 0 && reent.count == 0;
        checks.push(self.result(
            CheckId::Reentry,
            reent,
            false,
            if no_reentry {
                none("no re-entrant acquisition or release")
            } else {
                None
            },
            reent_note,
        ));
        let valid = std::mem::take(&mut self.valid);
        let valid_note = if self.cfg.lease.is_some() {
            format!("min validity {:?}", self.cfg.min_validity)
        } else {
            "no lease given: upper bounds not checked".to_owned()
        };
        checks.push(self.result(
            CheckId::Validity,
            valid,
            false,
            if acquisitions == 0 {
                none("no acq_ok events")
            } else {
                None
            },
            valid_note,
        ));
        let activity = std::mem::take(&mut self.activity);
        let expected_late = std::mem::take(&mut self.activity_expected);
        let n_ops = self.res_ops.len();
        let activity_note = match &self.cfg.expected_late {
            Some(x) => format!(
                "{n_ops} resource operations; {} past validity of processes {:?} expected (at \
                 most {}: {})",
                expected_late.count, x.procs, x.max_ops, x.reason
            ),
            None => format!("{n_ops} resource operations"),
        };
        let unchecked_ops = if n_ops == 0 {
            none("no res_op events")
        } else {
            None
        };
        let activity_res = if activity.count == 0 && expected_late.count > 0 {
            self.result(
                CheckId::Activity,
                expected_late,
                true,
                unchecked_ops,
                activity_note,
            )
        } else {
            self.result(
                CheckId::Activity,
                activity,
                false,
                unchecked_ops,
                activity_note,
            )
        };
        checks.push(activity_res);
        let counter = std::mem::take(&mut self.counter);
        checks.push(self.result(
            CheckId::Counter,
            counter,
            self.counter_warn,
            counter_status,
            counter_note,
        ));
        let quiet = std::mem::take(&mut self.quiet);
        let quiet_unchecked = self.cfg.quiescent_after.is_none()
            && self.cfg.final_keys.is_none()
            && self.observes == 0;
        let quiet_note = format!(
            "{} snapshots{}{}",
            self.observes,
            if self.cfg.quiescent_after.is_some() {
                ", quiescence window"
            } else {
                ""
            },
            if self.cfg.final_keys.is_some() {
                ", final key scan"
            } else {
                ""
            }
        );
        checks.push(self.result(
            CheckId::Quiescence,
            quiet,
            false,
            if quiet_unchecked {
                none("no observer snapshots or final key scan")
            } else {
                None
            },
            quiet_note,
        ));
        Report {
            checks,
            stats: self.stats,
            origin: self.origin,
        }
    }

    fn result(
        &self,
        id: CheckId,
        tally: Tally,
        warn_only: bool,
        unchecked: Option<Status>,
        note: String,
    ) -> CheckResult {
        let status = match (tally.first, unchecked) {
            (Some(f), _) => {
                let cx = Box::new(self.counterexample(f));
                if warn_only {
                    Status::Warn(cx)
                } else {
                    Status::Fail(cx)
                }
            }
            (None, Some(u)) => u,
            (None, None) => Status::Pass,
        };
        CheckResult {
            id,
            status,
            violations: tally.count,
            note,
        }
    }

    fn counterexample(&self, f: Finding) -> Counterexample {
        let pick = |i: usize| (i, self.ev[i].clone());
        let events = f
            .events
            .iter()
            .copied()
            .filter(|&i| i < self.ev.len())
            .map(pick)
            .collect();
        let context = if f.anchor < self.ev.len() {
            let n = self.cfg.context_events;
            let lo = f.anchor.saturating_sub(n / 2);
            let hi = (lo + n + 1).min(self.ev.len());
            let lo = hi.saturating_sub(n + 1).min(lo);
            (lo..hi).map(pick).collect()
        } else {
            Vec::new()
        };
        Counterexample {
            message: f.message,
            events,
            context,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn win(deadline: u64, close: Option<(u64, usize, Cause)>) -> Win {
        Win {
            permits: 1,
            lock: 0,
            holder: 0,
            start: 10,
            start_idx: 0,
            deadline,
            deadline_idx: 1,
            close,
        }
    }

    #[test]
    fn window_end_is_the_earlier_of_close_and_deadline() {
        assert_eq!(win(100, None).end(), (100, 1, Cause::Deadline));
        assert_eq!(
            win(100, Some((50, 7, Cause::Release))).end(),
            (50, 7, Cause::Release)
        );
        assert_eq!(
            win(100, Some((150, 7, Cause::Lost))).end(),
            (100, 1, Cause::Deadline)
        );
        // A tie goes to the deadline.
        assert_eq!(
            win(100, Some((100, 7, Cause::Lost))).end(),
            (100, 1, Cause::Deadline)
        );
        // A killed holder's window runs to its deadline, however early the kill.
        assert_eq!(
            win(100, Some((50, 7, Cause::Kill))).end(),
            (100, 1, Cause::Kill)
        );
    }

    #[test]
    fn tally_keeps_the_first_finding_and_counts_all() {
        let mut t = Tally::default();
        for n in 0..3 {
            t.add(|| Finding {
                message: format!("{n}"),
                events: vec![],
                anchor: n,
            });
        }
        assert_eq!(t.count, 3);
        assert_eq!(t.first.map(|f| f.message), Some("0".to_owned()));
    }

    #[test]
    fn durations_format_as_milliseconds() {
        assert_eq!(ms(1_234_567), "1.234567ms");
        assert_eq!(ms(0), "0.000000ms");
        assert_eq!(dur_ns(Duration::from_millis(3)), 3_000_000);
        assert_eq!(dur_ns(Duration::MAX), u64::MAX);
    }

    fn fw(t: u64, lock: &str, holder: &str, token: u64, outcome: FencedOutcome) -> Event {
        Event::new(
            t,
            0,
            0,
            lock,
            EventKind::ResOp {
                holder: holder.into(),
                token,
                op: OP_FENCED_WRITE.into(),
                outcome: outcome.to_outcome(),
                invoked: None,
            },
        )
    }

    fn acc(seq: u64) -> FencedOutcome {
        FencedOutcome::Accepted { seq }
    }

    /// Checks fenced writes alone: they have no windows, which the activity check is told.
    fn i2(events: Vec<Event>) -> Report {
        let cfg = CheckConfig {
            expected_late: Some(ExpectedLate {
                procs: vec![0, 1],
                max_ops: 100,
                reason: "I2 unit tests log writes without windows".into(),
            }),
            ..CheckConfig::default()
        };
        check(&History::from_events(events), &cfg)
    }

    #[test]
    fn i2_passes_non_decreasing_tokens_in_accept_order() {
        // Equal tokens (one holder's several writes) are fine; a rejected lower token is too.
        let r = i2(vec![
            fw(10, "l", "a", 3, acc(1)),
            fw(20, "l", "a", 3, acc(2)),
            fw(30, "l", "b", 5, acc(3)),
            fw(40, "l", "a", 3, FencedOutcome::Rejected { max: 5 }),
            fw(
                45,
                "l",
                "a",
                3,
                FencedOutcome::Unknown { error: "x".into() },
            ),
            fw(50, "l", "b", 5, acc(4)),
        ]);
        assert_eq!(r.status(CheckId::FencedOrder), &Status::Pass, "{r}");
        assert_eq!((r.stats.fenced_accepted, r.stats.fenced_rejected), (4, 1));
    }

    #[test]
    fn i2_fails_a_lower_token_accepted_after_a_higher_one() {
        let r = i2(vec![
            fw(10, "l", "a", 3, acc(1)),
            fw(20, "l", "b", 5, acc(2)),
            fw(30, "l", "a", 3, acc(3)),
            fw(40, "l", "a", 2, acc(4)),
        ]);
        assert!(!r.is_ok());
        assert_eq!(r.failed(), vec![CheckId::FencedOrder], "{r}");
        let res = r.result(CheckId::FencedOrder).expect("I2 present");
        assert_eq!(res.violations, 2, "{r}");
        let cx = r
            .status(CheckId::FencedOrder)
            .counterexample()
            .expect("counterexample");
        assert!(
            cx.message.contains("token 3") && cx.message.contains("token 5"),
            "{r}"
        );
        assert_eq!(cx.events.len(), 2);
    }

    #[test]
    fn i2_uses_the_accept_order_not_the_reply_time() {
        // The replies arrive in the other order than F accepted them: still legal.
        let ok = i2(vec![
            fw(10, "l", "b", 5, acc(2)),
            fw(20, "l", "a", 3, acc(1)),
        ]);
        assert_eq!(ok.status(CheckId::FencedOrder), &Status::Pass, "{ok}");
        // Time order looks fine, accept order is not.
        let bad = i2(vec![
            fw(10, "l", "a", 3, acc(2)),
            fw(20, "l", "b", 5, acc(1)),
        ]);
        assert_eq!(bad.failed(), vec![CheckId::FencedOrder], "{bad}");
    }

    #[test]
    fn i2_keeps_locks_apart_and_is_unchecked_without_fenced_writes() {
        let r = i2(vec![
            fw(10, "x", "a", 9, acc(1)),
            fw(20, "y", "b", 1, acc(1)),
        ]);
        assert_eq!(r.status(CheckId::FencedOrder), &Status::Pass, "{r}");
        let empty = i2(vec![]);
        assert!(
            matches!(empty.status(CheckId::FencedOrder), Status::Unchecked(_)),
            "{empty}"
        );
    }

    fn grant(t: u64, p: u32, holder: &str, token: u64) -> Event {
        Event::new(
            t,
            p,
            0,
            "l",
            EventKind::AcqOk {
                attempt: token,
                holder: holder.into(),
                token,
                depth: 1,
                deadline: t + 1_000,
                nodes: vec![],
                permits: None,
            },
        )
    }

    fn sent_at(mut e: Event, sent: u64) -> Event {
        if let EventKind::ResOp { invoked, .. } = &mut e.kind {
            *invoked = Some(sent);
        }
        e
    }

    #[test]
    fn i2_fails_a_stale_token_sent_after_a_newer_grant_and_accepted() {
        // a (token 1) sends its write after b's grant of token 2 was acknowledged; the
        // resource accepts it because b has not written yet.
        let stale = i2(vec![
            grant(10, 0, "a", 1),
            grant(50, 1, "b", 2),
            sent_at(fw(60, "l", "a", 1, acc(1)), 55),
            sent_at(fw(70, "l", "b", 2, acc(2)), 65),
        ]);
        assert!(stale.failed().contains(&CheckId::FencedOrder), "{stale}");
        // Sent before the newer grant: the hazard fencing cannot see, not a violation.
        let early = i2(vec![
            grant(10, 0, "a", 1),
            grant(50, 1, "b", 2),
            sent_at(fw(60, "l", "a", 1, acc(1)), 45),
            sent_at(fw(70, "l", "b", 2, acc(2)), 65),
        ]);
        assert_eq!(early.status(CheckId::FencedOrder), &Status::Pass, "{early}");
        // One token accepted from two holders.
        let shared = i2(vec![
            fw(60, "l", "a", 3, acc(1)),
            fw(70, "l", "b", 3, acc(2)),
        ]);
        assert_eq!(shared.failed(), vec![CheckId::FencedOrder], "{shared}");
    }

    #[test]
    fn moved_deadline_keeps_the_latest_belief() {
        // Later: taken.
        assert_eq!(moved_deadline(100, 150, 50), 150);
        // Earlier, learned at 60 while 100 was believed: counts from 60.
        assert_eq!(moved_deadline(100, 40, 60), 60);
        // Earlier, but above the time it was learned: the new deadline.
        assert_eq!(moved_deadline(100, 80, 60), 80);
        // Learned after the old deadline had passed: the old one stands.
        assert_eq!(moved_deadline(100, 40, 120), 100);
    }

    #[test]
    fn config_defaults() {
        let c = CheckConfig::new(Duration::from_secs(2));
        assert_eq!(c.zombie_grace, Duration::from_secs(2));
        assert_eq!(c.deadline_tolerance, Duration::from_millis(1));
        assert_eq!(CheckConfig::default().lease, None);
    }

    /// One hold of `holder` (proc `p`) with `permits`, from `t` to `t + len` ms.
    fn hold(p: u32, holder: &str, token: u64, permits: u64, t: u64, len: u64) -> Vec<Event> {
        let ms = 1_000_000;
        vec![
            Event::new(
                t * ms,
                p,
                0,
                "rw",
                EventKind::AcqInvoke {
                    attempt: token,
                    budget_ms: None,
                },
            ),
            Event::new(
                t * ms + 1,
                p,
                0,
                "rw",
                EventKind::AcqOk {
                    attempt: token,
                    holder: holder.into(),
                    token,
                    depth: 1,
                    deadline: (t + 10_000) * ms,
                    nodes: vec![],
                    permits: Some(permits),
                },
            ),
            Event::new(
                (t + len) * ms,
                p,
                0,
                "rw",
                EventKind::RelInvoke {
                    holder: holder.into(),
                    depth_before: 1,
                },
            ),
            Event::new(
                (t + len) * ms + 1,
                p,
                0,
                "rw",
                EventKind::RelOk {
                    holder: holder.into(),
                    depth_after: 0,
                },
            ),
        ]
    }

    fn shared(mut events: Vec<Event>, capacity: u64) -> Report {
        events.sort_by_key(|e| e.t);
        let cfg = CheckConfig {
            capacity: Some(capacity),
            ..CheckConfig::default()
        };
        check(&History::from_events(events), &cfg)
    }

    const W: u64 = 1 << 30;

    #[test]
    fn shared_mode_lets_readers_overlap_and_catches_a_writer_among_them() {
        let readers = [hold(1, "r1", 1, 1, 0, 50), hold(2, "r2", 2, 1, 10, 50)].concat();
        let ok = shared(readers.clone(), W);
        assert_eq!(ok.status(CheckId::Exclusion), &Status::Pass, "{ok}");
        assert_eq!(ok.status(CheckId::Tokens), &Status::Pass, "{ok}");
        // A writer that starts while r2 still reads.
        let bad = shared([readers, hold(3, "w", 3, W, 40, 10)].concat(), W);
        assert_eq!(bad.failed(), vec![CheckId::Exclusion], "{bad}");
        assert!(format!("{bad}").contains("permits in use"), "{bad}");
        // The same writer after both readers left passes.
        let after = shared(
            [hold(1, "r1", 1, 1, 0, 50), hold(3, "w", 3, W, 60, 10)].concat(),
            W,
        );
        assert_eq!(after.status(CheckId::Exclusion), &Status::Pass, "{after}");
    }

    #[test]
    fn shared_mode_counts_permits_against_the_capacity() {
        let three = [hold(1, "a", 1, 2, 0, 50), hold(2, "b", 2, 1, 5, 50)].concat();
        assert_eq!(
            shared(three.clone(), 3).status(CheckId::Exclusion),
            &Status::Pass
        );
        let four = shared([three, hold(3, "c", 3, 1, 10, 5)].concat(), 3);
        assert_eq!(four.failed(), vec![CheckId::Exclusion], "{four}");
    }

    #[test]
    fn shared_mode_tokens_must_exceed_every_token_acknowledged_before_the_invoke() {
        // Two readers whose replies cross: token order differs from reply order, fine.
        let mut crossed = hold(1, "r1", 2, 1, 0, 50);
        crossed.extend(hold(2, "r2", 1, 1, 0, 50));
        assert_eq!(shared(crossed, W).status(CheckId::Tokens), &Status::Pass);
        // A writer invoked after a reader was acknowledged with a higher token.
        let bad = shared(
            [hold(1, "r1", 5, 1, 0, 10), hold(2, "w", 4, W, 20, 10)].concat(),
            W,
        );
        assert_eq!(bad.failed(), vec![CheckId::Tokens], "{bad}");
        // Readers sharing one Redis hold share its token: fine. A reader below an earlier
        // writer's token is not.
        let same = shared(
            [hold(1, "r1", 5, 1, 0, 10), hold(1, "r2", 5, 1, 20, 10)].concat(),
            W,
        );
        assert_eq!(same.status(CheckId::Tokens), &Status::Pass, "{same}");
        let stale = shared(
            [hold(1, "w", 5, W, 0, 10), hold(2, "r", 4, 1, 20, 10)].concat(),
            W,
        );
        assert_eq!(stale.failed(), vec![CheckId::Tokens], "{stale}");
    }
}
