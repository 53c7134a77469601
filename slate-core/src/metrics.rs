//! What the locks record through the [`metrics`](https://docs.rs/metrics) facade: the crate
//! Prometheus, StatsD and OpenTelemetry exporters plug into.
//!
//! Nothing is recorded until the application installs a recorder (an exporter), and the
//! recorder must be installed **before the first lock operation**: each lock kind resolves its
//! metric handles once, at its first event, and handles resolved without a recorder stay
//! no-ops (the event then costs a branch). With a recorder, an event is an atomic update on a
//! handle resolved once; nothing is looked up or allocated per event.
//!
//! Every metric is listed in [`METRICS`] (name, kind, labels, meaning), which is also what
//! the recorder is told through `describe_*` and what `docs/OPERATIONS.md` tabulates.
//!
//! # Labels
//!
//! - `primitive`: `lock`, `rwlock`, `semaphore`, `combination` (the lock kind), `latch` (the
//!   countdown latch);
//! - `backend`: `redis-standalone`, `redis-cluster`, `redis-sentinel`, `zookeeper`,
//!   `combination`;
//! - `lock`: the lock's name, **only** when the application opts in with
//!   [`label_lock_names`] (per-entity names would make a series per entity);
//! - per metric: `how`, `outcome`, `reason`, `kind` (see [`METRICS`]).
//!
//! # Examples
//!
//! ```
//! use slate_core::metrics::{self, Meter};
//! use slate_core::LockName;
//!
//! // Only the locks whose names start with "job:" get a `lock` label.
//! metrics::label_lock_names(|name| {
//!     let name = std::str::from_utf8(name.as_bytes()).ok()?;
//!     name.starts_with("job:").then(|| name.to_owned())
//! });
//! let meter = Meter::for_lock("lock", "redis-standalone", &LockName::new("job:nightly")?);
//! meter.busy(); // a no-op until a recorder is installed
//! # Ok::<(), slate_core::Error>(())
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Label, Unit};

use crate::{BackendKind, LockName, LossReason};

/// One metric Slate records.
#[derive(Clone, Copy, Debug)]
pub struct MetricInfo {
    /// Its name, as exporters show it.
    pub name: &'static str,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// The labels beyond `primitive`, `backend` and the opt-in `lock` (or, for the
    /// client-wide metrics, beyond `backend`).
    pub labels: &'static str,
    /// What it counts or measures.
    pub help: &'static str,
}

macro_rules! metric_names {
    ($($konst:ident = $name:literal, $kind:literal, $labels:literal, $help:literal;)*) => {
        $(
            #[doc = concat!("`", $name, "` (", $kind, "): ", $help)]
            pub const $konst: &str = $name;
        )*
        /// Every metric Slate records, in the order of `docs/OPERATIONS.md`.
        pub const METRICS: &[MetricInfo] = &[$(MetricInfo {
            name: $name,
            kind: $kind,
            labels: $labels,
            help: $help,
        }),*];
    };
}

metric_names! {
    ACQUISITIONS = "slate_acquisitions_total", "counter", "how = remote | reentry | pass",
        "acquisitions that returned a guard: won from the backend, re-entered by the holder, or passed by a local holder without a remote call (lock cohorting)";
    BUSY = "slate_acquire_busy_total", "counter", "",
        "acquisitions that returned busy (a try-lock that found the lock held)";
    TIMEOUTS = "slate_acquire_timeouts_total", "counter", "",
        "acquisitions whose wait ran out before the lock was free";
    ACQUIRE_ERRORS = "slate_acquire_errors_total", "counter", "",
        "acquisitions that failed otherwise (a backend error, a re-entry that found its hold gone, a refused upgrade)";
    ATTEMPTS = "slate_attempts_total", "counter", "outcome = acquired | busy | error",
        "remote attempts (one script call or znode check each) and what the backend answered";
    WAIT = "slate_acquire_wait_seconds", "histogram", "",
        "from the acquire call to the guard, for acquisitions that got one";
    ATTEMPT_TIME = "slate_attempt_seconds", "histogram", "",
        "round trip of one remote attempt";
    HOLD = "slate_hold_seconds", "histogram", "",
        "from a guard's creation to its release (each re-entered level is a guard)";
    HELD = "slate_held", "gauge", "",
        "guards alive (each re-entered level counts)";
    WAITERS = "slate_waiters", "gauge", "",
        "callers of this process queued for a lock, or waiting for a latch to open";
    LEASE_LOST = "slate_lease_lost_total", "counter", "reason = entry_gone | deadline_expired | max_hold_reached | quorum_lost",
        "holds whose lease was lost, counted once each when the loss is signalled";
    RENEWALS = "slate_renewals_total", "counter", "",
        "lease renewals that succeeded (per node for the combination lock)";
    RENEWAL_FAILURES = "slate_renewal_failures_total", "counter", "",
        "lease renewals that got no positive answer (retried until the lease deadline)";
    RENEWALS_REGISTERED = "slate_renewals_registered", "gauge", "",
        "holds the client's renewal service keeps alive (client-wide: backend label only)";
    RECONNECTS = "slate_reconnects_total", "counter", "",
        "connections (or ZooKeeper sessions) opened again after one broke (client-wide)";
    FAILOVERS = "slate_failovers_total", "counter", "",
        "times the server behind a client changed: a Sentinel failover or a restart seen by its run id (client-wide)";
    QUARANTINES = "slate_quarantines_total", "counter", "",
        "combination-lock nodes quarantined after they lost their data (client-wide)";
    SERVER_ERRORS = "slate_server_errors_total", "counter", "kind = io | timeout | auth | permission | response | unavailable | other",
        "commands the backend failed, by kind (client-wide)";
    LATCH_SETS = "slate_latch_sets_total", "counter", "outcome = set | refused | error",
        "countdown-latch sets: a count set on an open latch, refused because a round was counting down, or failed";
    LATCH_COUNT_DOWNS = "slate_latch_count_downs_total", "counter", "outcome = counted | error",
        "countdown-latch count-downs the server answered (once each, however often sent; one on an open latch does nothing and counts here too), or that failed";
    LATCH_WAITS = "slate_latch_waits_total", "counter", "outcome = opened | timed_out | error",
        "countdown-latch waits by how they ended: the latch opened, the wait ran out, or a failure";
    LATCH_WAIT = "slate_latch_wait_seconds", "histogram", "",
        "from a latch wait's call to its return, for waits that saw the latch open";
}

/// How an acquisition got its guard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// Won from the backend.
    Remote,
    /// A re-entry by the holder.
    Reentry,
    /// Passed by a local holder without a remote call (lock cohorting).
    Pass,
}

/// How a countdown latch's set ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LatchSet {
    /// The count was set (the latch was open).
    Set,
    /// A round was counting down: nothing was set.
    Refused,
    /// The set failed (it may or may not have run).
    Error,
}

/// How a wait for a countdown latch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LatchWait {
    /// The latch opened.
    Opened,
    /// The wait ran out first.
    TimedOut,
    /// A failure that waiting longer could not cure.
    Error,
}

/// What the backend answered one remote attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The lock was granted.
    Acquired,
    /// The lock was held.
    Busy,
    /// The attempt failed.
    Error,
}

type Namer = Arc<dyn Fn(&LockName) -> Option<String> + Send + Sync>;

static NAMER: RwLock<Option<Namer>> = RwLock::new(None);
/// Whether [`label_lock_names`] was ever called (no read of `NAMER` otherwise).
static NAMED: AtomicBool = AtomicBool::new(false);

/// Gives the locks created from now on a `lock` label: `f` maps a lock's name to the label's
/// value, or to `None` for no label. `f` runs when a lock's shared state is created, under
/// its client's table of locks: it must not build locks itself. Off by default: an application that locks per entity
/// (`order:1234`) would otherwise make one series per entity. Calling it again replaces `f`;
/// locks already created keep the labels they have.
///
/// # Examples
///
/// ```
/// slate_core::metrics::label_lock_names(|name| String::from_utf8(name.as_bytes().to_vec()).ok());
/// ```
pub fn label_lock_names(f: impl Fn(&LockName) -> Option<String> + Send + Sync + 'static) {
    *NAMER.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(f));
    NAMED.store(true, Ordering::Release);
}

/// A lock's metric handles: one per lock kind and backend, or one per lock with a `lock`
/// label. Cloning is cheap.
///
/// # Examples
///
/// ```
/// use slate_core::metrics::{How, Meter};
/// use std::time::Duration;
///
/// let meter = Meter::for_lock("lock", "zookeeper", &slate_core::LockName::new("a")?);
/// meter.acquired(How::Remote, Duration::from_millis(3));
/// # Ok::<(), slate_core::Error>(())
/// ```
#[derive(Clone)]
pub struct Meter(Arc<LockMeter>);

struct LockMeter {
    labels: Vec<Label>,
    handles: OnceLock<LockHandles>,
    /// A latch's own handles (`primitive = latch`), resolved at its first latch event.
    latch: OnceLock<LatchHandles>,
}

struct LatchHandles {
    sets: [Counter; 3],
    count_downs: [Counter; 2],
    waits: [Counter; 3],
    wait: Histogram,
    /// `slate_waiters` with the latch's labels (its own handle: a latch registers none of the
    /// locks' series).
    waiters: Gauge,
}

struct LockHandles {
    acquisitions: [Counter; 3],
    busy: Counter,
    timeouts: Counter,
    errors: Counter,
    attempts: [Counter; 3],
    wait: Histogram,
    attempt_time: Histogram,
    hold: Histogram,
    held: Gauge,
    waiters: Gauge,
    lost: [Counter; 4],
    renewals: Counter,
    renewal_failures: Counter,
}

/// The meters without a `lock` label, one per (primitive, backend): a lock built per
/// acquisition costs a short scan under a read lock here, not a registration.
static SHARED: RwLock<Vec<(&'static str, &'static str, Meter)>> = RwLock::new(Vec::new());

impl Meter {
    /// The meter of the lock `name` of kind `primitive` on `backend` (see the module's labels).
    ///
    /// # Examples
    ///
    /// See the [type's](Meter).
    #[must_use]
    pub fn for_lock(primitive: &'static str, backend: &'static str, name: &LockName) -> Meter {
        let namer = if NAMED.load(Ordering::Acquire) {
            NAMER.read().unwrap_or_else(PoisonError::into_inner).clone()
        } else {
            None
        };
        if let Some(value) = namer.and_then(|f| f(name)) {
            return Meter::with_labels(vec![
                Label::from_static_parts("primitive", primitive),
                Label::from_static_parts("backend", backend),
                Label::new("lock", value),
            ]);
        }
        let find = |shared: &[(&'static str, &'static str, Meter)]| {
            shared
                .iter()
                .find(|(p, b, _)| *p == primitive && *b == backend)
                .map(|(_, _, m)| m.clone())
        };
        if let Some(m) = find(&SHARED.read().unwrap_or_else(PoisonError::into_inner)) {
            return m;
        }
        let mut shared = SHARED.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = find(&shared) {
            return m;
        }
        let meter = Meter::with_labels(vec![
            Label::from_static_parts("primitive", primitive),
            Label::from_static_parts("backend", backend),
        ]);
        shared.push((primitive, backend, meter.clone()));
        meter
    }

    /// A meter labelled `primitive = "custom"`, `backend = "custom"`: for synchronizers and
    /// guards built outside Slate's backends (tests, other crates).
    ///
    /// # Examples
    ///
    /// ```
    /// slate_core::metrics::Meter::custom().busy();
    /// ```
    #[must_use]
    pub fn custom() -> Meter {
        static CUSTOM: OnceLock<Meter> = OnceLock::new();
        CUSTOM
            .get_or_init(|| {
                Meter::with_labels(vec![
                    Label::from_static_parts("primitive", "custom"),
                    Label::from_static_parts("backend", "custom"),
                ])
            })
            .clone()
    }

    fn with_labels(labels: Vec<Label>) -> Meter {
        Meter(Arc::new(LockMeter {
            labels,
            handles: OnceLock::new(),
            latch: OnceLock::new(),
        }))
    }

    fn h(&self) -> &LockHandles {
        self.0.handles.get_or_init(|| {
            describe();
            let l = &self.0.labels;
            let c = |name: &'static str| metrics::counter!(name, l.iter());
            let cw = |name: &'static str, k, v| metrics::counter!(name, with_label(l, k, v));
            LockHandles {
                acquisitions: [
                    cw(ACQUISITIONS, "how", "remote"),
                    cw(ACQUISITIONS, "how", "reentry"),
                    cw(ACQUISITIONS, "how", "pass"),
                ],
                busy: c(BUSY),
                timeouts: c(TIMEOUTS),
                errors: c(ACQUIRE_ERRORS),
                attempts: [
                    cw(ATTEMPTS, "outcome", "acquired"),
                    cw(ATTEMPTS, "outcome", "busy"),
                    cw(ATTEMPTS, "outcome", "error"),
                ],
                wait: metrics::histogram!(WAIT, l.iter()),
                attempt_time: metrics::histogram!(ATTEMPT_TIME, l.iter()),
                hold: metrics::histogram!(HOLD, l.iter()),
                held: metrics::gauge!(HELD, l.iter()),
                waiters: metrics::gauge!(WAITERS, l.iter()),
                lost: [
                    cw(LEASE_LOST, "reason", "entry_gone"),
                    cw(LEASE_LOST, "reason", "deadline_expired"),
                    cw(LEASE_LOST, "reason", "max_hold_reached"),
                    cw(LEASE_LOST, "reason", "quorum_lost"),
                ],
                renewals: c(RENEWALS),
                renewal_failures: c(RENEWAL_FAILURES),
            }
        })
    }

    fn latch(&self) -> &LatchHandles {
        self.0.latch.get_or_init(|| {
            describe();
            let l = &self.0.labels;
            let cw = |name: &'static str, v| metrics::counter!(name, with_label(l, "outcome", v));
            LatchHandles {
                sets: [
                    cw(LATCH_SETS, "set"),
                    cw(LATCH_SETS, "refused"),
                    cw(LATCH_SETS, "error"),
                ],
                count_downs: [
                    cw(LATCH_COUNT_DOWNS, "counted"),
                    cw(LATCH_COUNT_DOWNS, "error"),
                ],
                waits: [
                    cw(LATCH_WAITS, "opened"),
                    cw(LATCH_WAITS, "timed_out"),
                    cw(LATCH_WAITS, "error"),
                ],
                wait: metrics::histogram!(LATCH_WAIT, l.iter()),
                waiters: metrics::gauge!(WAITERS, l.iter()),
            }
        })
    }

    /// A countdown latch's set ended with `outcome`.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_core::metrics::{LatchSet, Meter};
    /// Meter::for_lock("latch", "redis-standalone", &slate_core::LockName::new("loaders")?)
    ///     .latch_set(LatchSet::Refused);
    /// # Ok::<(), slate_core::Error>(())
    /// ```
    pub fn latch_set(&self, outcome: LatchSet) {
        self.latch().sets[outcome as usize].increment(1);
    }

    /// A countdown latch's count-down was answered (`true`) or failed (`false`).
    ///
    /// # Examples
    ///
    /// ```
    /// slate_core::metrics::Meter::custom().latch_counted_down(true);
    /// ```
    pub fn latch_counted_down(&self, answered: bool) {
        self.latch().count_downs[usize::from(!answered)].increment(1);
    }

    /// A task began (`true`) or ended (`false`) waiting for a countdown latch.
    ///
    /// # Examples
    ///
    /// ```
    /// let meter = slate_core::metrics::Meter::custom();
    /// meter.latch_waiting(true);
    /// meter.latch_waiting(false);
    /// ```
    pub fn latch_waiting(&self, joined: bool) {
        step(&self.latch().waiters, joined);
    }

    /// A wait for a countdown latch ended with `outcome` after `waited` (from the call; the
    /// wait-time histogram takes the waits that saw the latch open).
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_core::metrics::{LatchWait, Meter};
    /// Meter::custom().latch_waited(LatchWait::Opened, std::time::Duration::from_millis(40));
    /// ```
    pub fn latch_waited(&self, outcome: LatchWait, waited: Duration) {
        let h = self.latch();
        h.waits[outcome as usize].increment(1);
        if outcome == LatchWait::Opened {
            h.wait.record(waited.as_secs_f64());
        }
    }

    /// An acquisition returned a guard after `waited` (from the call).
    ///
    /// # Examples
    ///
    /// See the [type's](Meter).
    pub fn acquired(&self, how: How, waited: Duration) {
        let h = self.h();
        h.acquisitions[how as usize].increment(1);
        h.wait.record(waited.as_secs_f64());
    }

    /// An acquisition returned busy.
    ///
    /// # Examples
    ///
    /// See the [module's](self).
    pub fn busy(&self) {
        self.h().busy.increment(1);
    }

    /// An acquisition's wait ran out.
    ///
    /// # Examples
    ///
    /// ```
    /// slate_core::metrics::Meter::custom().timed_out();
    /// ```
    pub fn timed_out(&self) {
        self.h().timeouts.increment(1);
    }

    /// An acquisition failed (not busy, not a timeout).
    ///
    /// # Examples
    ///
    /// ```
    /// slate_core::metrics::Meter::custom().failed();
    /// ```
    pub fn failed(&self) {
        self.h().errors.increment(1);
    }

    /// One remote attempt came back with `outcome` after `took`.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_core::metrics::{Meter, Outcome};
    /// Meter::custom().attempt(Outcome::Busy, std::time::Duration::from_micros(180));
    /// ```
    pub fn attempt(&self, outcome: Outcome, took: Duration) {
        let h = self.h();
        h.attempts[outcome as usize].increment(1);
        h.attempt_time.record(took.as_secs_f64());
    }

    /// A guard was created.
    ///
    /// # Examples
    ///
    /// ```
    /// let meter = slate_core::metrics::Meter::custom();
    /// meter.hold_started();
    /// meter.hold_ended(std::time::Duration::from_millis(5));
    /// ```
    pub fn hold_started(&self) {
        self.h().held.increment(1.0);
    }

    /// A guard was released after `held`.
    ///
    /// # Examples
    ///
    /// See [`hold_started`](Meter::hold_started).
    pub fn hold_ended(&self, held: Duration) {
        let h = self.h();
        h.held.decrement(1.0);
        h.hold.record(held.as_secs_f64());
    }

    /// A caller joined (`true`) or left (`false`) the local queue.
    ///
    /// # Examples
    ///
    /// ```
    /// let meter = slate_core::metrics::Meter::custom();
    /// meter.queued(true);
    /// meter.queued(false);
    /// ```
    pub fn queued(&self, joined: bool) {
        step(&self.h().waiters, joined);
    }

    /// A hold's lease was lost.
    ///
    /// # Examples
    ///
    /// ```
    /// slate_core::metrics::Meter::custom().lease_lost(&slate_core::LossReason::EntryGone);
    /// ```
    pub fn lease_lost(&self, reason: &LossReason) {
        let i = match reason {
            LossReason::EntryGone => 0,
            LossReason::DeadlineExpired => 1,
            LossReason::MaxHoldReached => 2,
            LossReason::QuorumLost { .. } => 3,
        };
        self.h().lost[i].increment(1);
    }

    /// A renewal succeeded (`true`) or failed (`false`).
    ///
    /// # Examples
    ///
    /// ```
    /// slate_core::metrics::Meter::custom().renewed(true);
    /// ```
    pub fn renewed(&self, ok: bool) {
        let h = self.h();
        if ok {
            h.renewals.increment(1);
        } else {
            h.renewal_failures.increment(1);
        }
    }
}

impl std::fmt::Debug for Meter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Meter");
        for l in &self.0.labels {
            d.field(l.key(), &l.value());
        }
        d.finish()
    }
}

/// A client's metric handles (the `backend` label only): reconnects, failovers, quarantines,
/// server errors and registered renewals. Cloning is cheap.
///
/// # Examples
///
/// ```
/// let meter = slate_core::metrics::ClientMeter::new("redis-cluster");
/// meter.server_error(slate_core::BackendKind::Timeout);
/// ```
#[derive(Clone)]
pub struct ClientMeter(Arc<ClientInner>);

struct ClientInner {
    backend: &'static str,
    handles: OnceLock<ClientHandles>,
}

struct ClientHandles {
    reconnects: Counter,
    failovers: Counter,
    quarantines: Counter,
    errors: [Counter; 7],
    registered: Gauge,
}

impl ClientMeter {
    /// The client meter of `backend`.
    ///
    /// # Examples
    ///
    /// See the [type's](ClientMeter).
    #[must_use]
    pub fn new(backend: &'static str) -> ClientMeter {
        static SHARED: Mutex<Vec<ClientMeter>> = Mutex::new(Vec::new());
        let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = shared.iter().find(|m| m.0.backend == backend) {
            return m.clone();
        }
        let meter = ClientMeter(Arc::new(ClientInner {
            backend,
            handles: OnceLock::new(),
        }));
        shared.push(meter.clone());
        meter
    }

    fn h(&self) -> &ClientHandles {
        self.0.handles.get_or_init(|| {
            describe();
            let b = self.0.backend;
            let e = |kind: &'static str| {
                metrics::counter!(SERVER_ERRORS, "backend" => b, "kind" => kind)
            };
            ClientHandles {
                reconnects: metrics::counter!(RECONNECTS, "backend" => b),
                failovers: metrics::counter!(FAILOVERS, "backend" => b),
                quarantines: metrics::counter!(QUARANTINES, "backend" => b),
                errors: [
                    e("io"),
                    e("timeout"),
                    e("auth"),
                    e("permission"),
                    e("response"),
                    e("unavailable"),
                    e("other"),
                ],
                registered: metrics::gauge!(RENEWALS_REGISTERED, "backend" => b),
            }
        })
    }

    /// A connection (or session) was opened again after one broke.
    ///
    /// # Examples
    ///
    /// ```
    /// slate_core::metrics::ClientMeter::new("zookeeper").reconnected();
    /// ```
    pub fn reconnected(&self) {
        self.h().reconnects.increment(1);
    }

    /// The server behind the client changed.
    ///
    /// # Examples
    ///
    /// ```
    /// slate_core::metrics::ClientMeter::new("redis-sentinel").failover();
    /// ```
    pub fn failover(&self) {
        self.h().failovers.increment(1);
    }

    /// A node was quarantined.
    ///
    /// # Examples
    ///
    /// ```
    /// slate_core::metrics::ClientMeter::new("combination").quarantined();
    /// ```
    pub fn quarantined(&self) {
        self.h().quarantines.increment(1);
    }

    /// The backend failed a command with an error of `kind`.
    ///
    /// # Examples
    ///
    /// See the [type's](ClientMeter).
    pub fn server_error(&self, kind: BackendKind) {
        let i = match kind {
            BackendKind::Io => 0,
            BackendKind::Timeout => 1,
            BackendKind::Auth => 2,
            BackendKind::Permission => 3,
            BackendKind::Response => 4,
            BackendKind::Unavailable => 5,
            BackendKind::Other => 6,
        };
        self.h().errors[i].increment(1);
    }

    /// `delta` holds were registered with (positive) or left (negative) the renewal service.
    ///
    /// # Examples
    ///
    /// ```
    /// let meter = slate_core::metrics::ClientMeter::new("redis-standalone");
    /// meter.renewals_registered(1);
    /// meter.renewals_registered(-1);
    /// ```
    #[allow(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    pub fn renewals_registered(&self, delta: isize) {
        self.h().registered.increment(delta as f64);
    }
}

impl std::fmt::Debug for ClientMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientMeter")
            .field("backend", &self.0.backend)
            .finish()
    }
}

/// A gauge of tasks up by one (`joined`) or down by one.
fn step(gauge: &Gauge, joined: bool) {
    if joined {
        gauge.increment(1.0);
    } else {
        gauge.decrement(1.0);
    }
}

/// `labels` and one more, `key = value`.
fn with_label(labels: &[Label], key: &'static str, value: &'static str) -> Vec<Label> {
    let mut all = labels.to_vec();
    all.push(Label::from_static_parts(key, value));
    all
}

/// Tells the installed recorder each metric's kind, unit and meaning (once per process; run
/// at the first event).
fn describe() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        for m in METRICS {
            let unit = if m.name.ends_with("_seconds") {
                Unit::Seconds
            } else {
                Unit::Count
            };
            match m.kind {
                "counter" => metrics::describe_counter!(m.name, unit, m.help),
                "gauge" => metrics::describe_gauge!(m.name, unit, m.help),
                _ => metrics::describe_histogram!(m.name, unit, m.help),
            }
        }
    });
}
