//! The event log: one JSON object per line.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `Nemesis::action` for a SIGKILL of a worker process; `target` is that worker's `proc`
/// number in decimal. The checker closes every validity window of that process at this time.
pub const KILL_WORKER: &str = "kill_worker";

/// `ResOp::op` of one increment of the shared (non-atomic) counter.
pub const OP_INCR: &str = "incr";

/// `ResOp::outcome` of an acknowledged operation.
pub const OUTCOME_OK: &str = "ok";

/// `ResOp::op` of one write to the fenced resource F (`docs/RELIABILITY.md`, invariant I2); its outcome is a
/// [`FencedOutcome`] in text form. Checked by I2 ([`crate::history::CheckId::FencedOrder`]).
pub const OP_FENCED_WRITE: &str = "f_write";

/// What the fenced resource answered to one write; stored in `ResOp::outcome` as
/// `accepted:<seq>` (the write was the `seq`-th accepted by F, 1-based: the accept order),
/// `rejected:<max>` (F had already accepted token `max`, above this write's token) or
/// `unknown:<error>` (no reply).
///
/// # Examples
///
/// ```
/// use slate_history::history::FencedOutcome;
/// let a = FencedOutcome::Accepted { seq: 7 };
/// assert_eq!(a.to_outcome(), "accepted:7");
/// assert_eq!(FencedOutcome::parse("accepted:7"), Some(a));
/// assert_eq!(FencedOutcome::parse("rejected:12"), Some(FencedOutcome::Rejected { max: 12 }));
/// assert_eq!(FencedOutcome::parse("ok"), None);
/// ```
///
/// # Errors
///
/// Not applicable (plain data).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FencedOutcome {
    /// Accepted as the `seq`-th write F accepted.
    Accepted {
        /// Accept order, 1-based, per fenced key.
        seq: u64,
    },
    /// Rejected: F had already accepted the higher token `max`.
    Rejected {
        /// The highest token F had accepted.
        max: u64,
    },
    /// No reply (I/O error, timeout): the write may or may not have been applied.
    Unknown {
        /// Why.
        error: String,
    },
}

impl FencedOutcome {
    /// The `ResOp::outcome` text.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_history::history::FencedOutcome;
    /// assert_eq!(FencedOutcome::Rejected { max: 3 }.to_outcome(), "rejected:3");
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn to_outcome(&self) -> String {
        match self {
            FencedOutcome::Accepted { seq } => format!("accepted:{seq}"),
            FencedOutcome::Rejected { max } => format!("rejected:{max}"),
            FencedOutcome::Unknown { error } => format!("unknown:{error}"),
        }
    }

    /// Parses a `ResOp::outcome` text; `None` if it is not a fenced outcome.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_history::history::FencedOutcome;
    /// assert!(matches!(FencedOutcome::parse("unknown:timed out"),
    ///     Some(FencedOutcome::Unknown { .. })));
    /// assert_eq!(FencedOutcome::parse("accepted:x"), None);
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn parse(outcome: &str) -> Option<Self> {
        let (word, rest) = outcome.split_once(':')?;
        match word {
            "accepted" => rest.parse().ok().map(|seq| FencedOutcome::Accepted { seq }),
            "rejected" => rest.parse().ok().map(|max| FencedOutcome::Rejected { max }),
            "unknown" => Some(FencedOutcome::Unknown {
                error: rest.to_owned(),
            }),
            _ => None,
        }
    }
}

/// One recorded event.
///
/// Serialised as one flat JSON object: the common fields, then `"kind"` (snake case) and the
/// kind's own fields, for example
/// `{"t":5,"proc":1,"task":0,"lock":"a","kind":"rel_ok","holder":"h1","depth_after":0}`.
///
/// # Examples
///
/// ```
/// use slate_history::history::{Event, EventKind};
/// let e = Event::new(5, 1, 0, "a", EventKind::RelOk { holder: "h1".into(), depth_after: 0 });
/// let line = serde_json::to_string(&e)?;
/// assert_eq!(line,
///     r#"{"t":5,"proc":1,"task":0,"lock":"a","kind":"rel_ok","holder":"h1","depth_after":0}"#);
/// assert_eq!(serde_json::from_str::<Event>(&line)?, e);
/// # Ok::<(), serde_json::Error>(())
/// ```
///
/// # Errors
///
/// Not applicable (plain data).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// `CLOCK_MONOTONIC` nanoseconds ([`crate::clock::now_ns`]).
    pub t: u64,
    /// Worker index (or pid) of the process that logged the event.
    pub proc: u32,
    /// Task (logical client) within the process.
    pub task: u64,
    /// Logical lock name (for the combination lock: the name across all nodes).
    pub lock: String,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

impl Event {
    /// Builds an event (tests, replays, harness-side events with an explicit time).
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_history::history::{Event, EventKind};
    /// let e = Event::new(1, 0, 0, "l", EventKind::AcqInvoke { attempt: 0, budget_ms: None });
    /// assert_eq!(e.lock, "l");
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn new(t: u64, proc: u32, task: u64, lock: impl Into<String>, kind: EventKind) -> Self {
        Event {
            t,
            proc,
            task,
            lock: lock.into(),
            kind,
        }
    }
}

/// Borrowed form used by the recorder, serialised identically to [`Event`].
#[derive(Serialize)]
pub(crate) struct EventRef<'a> {
    pub(crate) t: u64,
    pub(crate) proc: u32,
    pub(crate) task: u64,
    pub(crate) lock: &'a str,
    #[serde(flatten)]
    pub(crate) kind: &'a EventKind,
}

/// The kind of an event and its fields. Times are `CLOCK_MONOTONIC` nanoseconds.
///
/// When to stamp (the checker's soundness depends on it): `*_invoke` **before** the first
/// command is sent; `acq_ok`, `renew_ok`, `rel_ok`, `rel_fail`, `*_info` **after** the reply is
/// processed; `lost` when the library tells the application; `holder` is the exact hash field
/// the lock writes (so observer snapshots can be matched).
///
/// # Examples
///
/// ```
/// use slate_history::history::EventKind;
/// let k = EventKind::AcqOk {
///     attempt: 3, holder: "p1:t0".into(), token: 17, depth: 1, deadline: 2_000_000_000,
///     nodes: vec![0, 1, 2], permits: None,
/// };
/// assert!(serde_json::to_string(&k)?.starts_with(r#"{"kind":"acq_ok","attempt":3"#));
/// # Ok::<(), serde_json::Error>(())
/// ```
///
/// # Errors
///
/// Not applicable (plain data).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventKind {
    /// An acquire call starts (before the first command).
    AcqInvoke {
        /// Attempt id, unique per (`proc`, `lock`); links the outcome to this invocation.
        attempt: u64,
        /// Wait budget: `Some(0)` for `try_lock` (one remote attempt), `None` for `lock()`.
        budget_ms: Option<u64>,
    },
    /// Acquired (after the reply): the application may enter the critical section.
    AcqOk {
        /// Attempt id of the matching [`EventKind::AcqInvoke`].
        attempt: u64,
        /// Holder id (the hash field).
        holder: String,
        /// Fencing token returned.
        token: u64,
        /// Hold count after this acquisition (1 = first level).
        depth: u32,
        /// Lease deadline, monotonic ns ([`crate::clock::to_mono_ns`] of the guard's deadline).
        deadline: u64,
        /// Nodes held (combination lock); empty for the single lock.
        nodes: Vec<usize>,
        /// Shared mode (read-write lock, semaphore): the permits this hold takes (a read 1, a
        /// write the whole capacity, see [`CheckConfig::capacity`](crate::history::CheckConfig::capacity)).
        /// `None` for exclusive locks: the hold takes everything.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        permits: Option<u64>,
    },
    /// Definitely not acquired (busy, timed out waiting, insufficient nodes).
    AcqFail {
        /// Attempt id.
        attempt: u64,
        /// Why.
        reason: String,
    },
    /// Indeterminate (I/O error, in-flight timeout): not a holder, but may leave a ghost entry.
    AcqInfo {
        /// Attempt id.
        attempt: u64,
        /// Why.
        reason: String,
    },
    /// A renewal succeeded (after the reply).
    RenewOk {
        /// Holder id.
        holder: String,
        /// New lease deadline, monotonic ns.
        deadline: u64,
    },
    /// A renewal failed without (yet) losing the lock. Informational.
    RenewFail {
        /// Holder id.
        holder: String,
        /// Why.
        reason: String,
    },
    /// The library signalled loss of the lock to the application.
    Lost {
        /// Holder id.
        holder: String,
        /// Why.
        reason: String,
    },
    /// A release call starts (before the first command).
    RelInvoke {
        /// Holder id.
        holder: String,
        /// Hold count the application believes it has before this release.
        depth_before: u32,
    },
    /// A release succeeded (after the reply).
    RelOk {
        /// Holder id.
        holder: String,
        /// Hold count after the release (0 = the lock is free).
        depth_after: u32,
    },
    /// A release definitely failed.
    RelFail {
        /// Holder id.
        holder: String,
        /// Why.
        reason: String,
        /// The lock answered "not held by you".
        not_held: bool,
    },
    /// A release with unknown outcome (I/O error, in-flight timeout).
    RelInfo {
        /// Holder id.
        holder: String,
        /// Why.
        reason: String,
    },
    /// An operation on the protected resource (counter, fenced or unfenced set).
    ResOp {
        /// Holder id on whose behalf the operation runs.
        holder: String,
        /// Fencing token carried.
        token: u64,
        /// Operation, e.g. [`OP_INCR`], [`OP_FENCED_WRITE`], `"u_read"`.
        op: String,
        /// Outcome, e.g. [`OUTCOME_OK`], a [`FencedOutcome`] as text, a value read.
        outcome: String,
        /// When the operation was sent (monotonic ns), if the worker stamped it; the event's
        /// own `t` is after the reply. I2 needs it: a stale token sent after a newer grant was
        /// acknowledged and still accepted is a violation.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        invoked: Option<u64>,
    },
    /// The harness injected or healed a fault (stamped at the moment it acts).
    Nemesis {
        /// Action, e.g. [`KILL_WORKER`], `"sigstop_server"`, `"heal"`.
        action: String,
        /// Target, e.g. a worker's `proc` number, `"node:1"`.
        target: String,
    },
    /// An observer snapshot of one node's lock key (stamped when the reply arrives).
    Observe {
        /// Node index.
        node: usize,
        /// Hash fields: holder id → count (`HGETALL`); empty when the key is absent.
        fields: BTreeMap<String, u64>,
        /// `PTTL` of the key: −2 absent, −1 no expiry.
        pttl_ms: i64,
        /// `INFO server` `run_id` of the node.
        run_id: String,
    },
}

impl EventKind {
    /// The `Nemesis` event for a SIGKILL of worker `proc` (see [`KILL_WORKER`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_history::history::EventKind;
    /// assert_eq!(EventKind::kill_worker(3),
    ///     EventKind::Nemesis { action: "kill_worker".into(), target: "3".into() });
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn kill_worker(proc: u32) -> Self {
        EventKind::Nemesis {
            action: KILL_WORKER.to_owned(),
            target: proc.to_string(),
        }
    }

    /// The snake-case name used as `"kind"` in JSON.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_history::history::EventKind;
    /// assert_eq!(EventKind::AcqInvoke { attempt: 0, budget_ms: None }.name(), "acq_invoke");
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::AcqInvoke { .. } => "acq_invoke",
            EventKind::AcqOk { .. } => "acq_ok",
            EventKind::AcqFail { .. } => "acq_fail",
            EventKind::AcqInfo { .. } => "acq_info",
            EventKind::RenewOk { .. } => "renew_ok",
            EventKind::RenewFail { .. } => "renew_fail",
            EventKind::Lost { .. } => "lost",
            EventKind::RelInvoke { .. } => "rel_invoke",
            EventKind::RelOk { .. } => "rel_ok",
            EventKind::RelFail { .. } => "rel_fail",
            EventKind::RelInfo { .. } => "rel_info",
            EventKind::ResOp { .. } => "res_op",
            EventKind::Nemesis { .. } => "nemesis",
            EventKind::Observe { .. } => "observe",
        }
    }

    /// The holder id this event is about, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_history::history::EventKind;
    /// let k = EventKind::Lost { holder: "h".into(), reason: "expired".into() };
    /// assert_eq!(k.holder(), Some("h"));
    /// ```
    ///
    /// # Errors
    ///
    /// None.
    pub fn holder(&self) -> Option<&str> {
        match self {
            EventKind::AcqOk { holder, .. }
            | EventKind::RenewOk { holder, .. }
            | EventKind::RenewFail { holder, .. }
            | EventKind::Lost { holder, .. }
            | EventKind::RelInvoke { holder, .. }
            | EventKind::RelOk { holder, .. }
            | EventKind::RelFail { holder, .. }
            | EventKind::RelInfo { holder, .. }
            | EventKind::ResOp { holder, .. } => Some(holder),
            _ => None,
        }
    }
}
