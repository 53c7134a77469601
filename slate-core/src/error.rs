//! The one error type of every Slate lock.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::holder::HolderId;
use crate::lease::LossReason;

/// A `Result` whose error is Slate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong with a Slate lock, grouped by what the caller can do about it.
///
/// | variant | what the caller can do |
/// | --- | --- |
/// | [`Error::Timeout`] | wait longer, or give up |
/// | [`Error::Busy`] | (only from a single attempt) retry later |
/// | [`Error::NotHeld`] | nothing to release: the lease ran out or was never held |
/// | [`Error::LeaseLost`] | stop acting as holder; the lease is gone |
/// | [`Error::InsufficientNodes`] | too few nodes reachable; retry when nodes are back |
/// | [`Error::ReleaseIncomplete`] | nothing; the entries left end with their lease |
/// | [`Error::Backend`] | a Redis or network failure; see [`BackendKind`] |
/// | [`Error::InvalidInput`] | fix the argument or option named in the message |
/// | [`Error::Closed`] | the client was shut down |
///
/// # Examples
///
/// ```
/// use slate_core::Error;
///
/// let err = Error::invalid_input("lease", "0ns is too short", "use a lease of at least 30ms");
/// assert!(err.is_invalid_input());
/// assert_eq!(err.to_string(), "invalid lease: 0ns is too short; use a lease of at least 30ms");
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A wait or an attempt ran out of time.
    #[error("{kind} for lock {lock} timed out after {elapsed:?} (budget {budget:?})")]
    #[non_exhaustive]
    Timeout {
        /// The lock's printable name (shared, cloning it does not allocate).
        lock: Arc<str>,
        /// What timed out.
        kind: TimeoutKind,
        /// The time that was allowed.
        budget: Duration,
        /// The time actually spent.
        elapsed: Duration,
    },
    /// The lock is held by another holder and the caller asked for a single attempt.
    #[error("lock {lock} is held by another holder{}", retry_hint(*retry_after))]
    #[non_exhaustive]
    Busy {
        /// The lock's printable name (shared, cloning it does not allocate).
        lock: Arc<str>,
        /// The holder's remaining lease, when the backend reported it.
        retry_after: Option<Duration>,
    },
    /// A release or renewal found no entry for this holder: the lease ran out, the lock was
    /// force-unlocked, or it was never held.
    #[error("lock {lock} is not held by {holder}")]
    #[non_exhaustive]
    NotHeld {
        /// The lock's printable name (shared, cloning it does not allocate).
        lock: Arc<str>,
        /// The holder that asked.
        holder: HolderId,
    },
    /// The lease was lost while the lock was held.
    #[error("lease on lock {lock} held by {holder} was lost: {reason}")]
    #[non_exhaustive]
    LeaseLost {
        /// The lock's printable name (shared, cloning it does not allocate).
        lock: Arc<str>,
        /// The holder that lost it.
        holder: HolderId,
        /// Why.
        reason: LossReason,
    },
    /// Fewer nodes than the quorum could be used (combination lock).
    #[error(
        "lock {lock} needs {required} nodes but only {usable} could be used: {}",
        NodeList(nodes)
    )]
    #[non_exhaustive]
    InsufficientNodes {
        /// The lock's printable name (shared, cloning it does not allocate).
        lock: Arc<str>,
        /// The quorum.
        required: usize,
        /// How many nodes were usable.
        usable: usize,
        /// The state of every node.
        nodes: Vec<NodeReport>,
    },
    /// A release over several nodes failed on some of them (it went on past each failure);
    /// the entries left behind end with their lease.
    #[error(
        "release of lock {lock} failed on {} node(s): {}",
        failed(nodes),
        NodeList(nodes)
    )]
    #[non_exhaustive]
    ReleaseIncomplete {
        /// The lock's printable name (shared, cloning it does not allocate).
        lock: Arc<str>,
        /// Every node the release was sent to, with its outcome.
        nodes: Vec<NodeReport>,
    },
    /// The backend (Redis, the network) failed.
    #[error("{kind} error{}: {message}", node_hint(node.as_deref()))]
    #[non_exhaustive]
    Backend {
        /// The kind of failure, classified from the backend's error kind (never its text).
        kind: BackendKind,
        /// The node's address (without credentials), when one node is concerned.
        node: Option<String>,
        /// A description of the failure.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
    /// An argument or option is invalid.
    #[error("invalid {what}: {problem}; {fix}")]
    #[non_exhaustive]
    InvalidInput {
        /// What was invalid (an option or argument name).
        what: &'static str,
        /// What is wrong with it.
        problem: String,
        /// How to fix it.
        fix: String,
    },
    /// The client or runtime that serves this lock was shut down.
    #[error("{what} was shut down")]
    #[non_exhaustive]
    Closed {
        /// What was shut down.
        what: &'static str,
    },
}

fn failed(nodes: &[NodeReport]) -> usize {
    nodes
        .iter()
        .filter(|n| matches!(n.state, NodeState::Failed { .. }))
        .count()
}

fn retry_hint(retry_after: Option<Duration>) -> String {
    match retry_after {
        Some(d) => format!(" (lease ends in {d:?})"),
        None => String::new(),
    }
}

fn node_hint(node: Option<&str>) -> String {
    match node {
        Some(n) => format!(" on node {n}"),
        None => String::new(),
    }
}

struct NodeList<'a>(&'a [NodeReport]);

impl fmt::Display for NodeList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, n) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{n}")?;
        }
        Ok(())
    }
}

/// What ran out of time in an [`Error::Timeout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TimeoutKind {
    /// Waiting for the lock (`try_lock_for`, `try_lock_until`).
    Wait,
    /// One whole acquisition attempt over several nodes (the combination lock's budget).
    AcquireBudget,
    /// One backend command.
    Command,
}

impl fmt::Display for TimeoutKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TimeoutKind::Wait => "waiting",
            TimeoutKind::AcquireBudget => "acquire attempt",
            TimeoutKind::Command => "command",
        })
    }
}

/// The kind of a backend failure, classified from the backend's own error kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendKind {
    /// Connecting failed or the connection broke.
    Io,
    /// A command got no reply in time.
    Timeout,
    /// Authentication failed (wrong or missing password).
    Auth,
    /// The user lacks a permission (ACL).
    Permission,
    /// The server answered something the client did not expect (protocol, script, type error).
    Response,
    /// The server is loading, read-only, or otherwise temporarily unable to serve.
    Unavailable,
    /// Anything else.
    Other,
}

impl BackendKind {
    /// Whether retrying the same call may succeed (I/O, timeout, temporarily unavailable).
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(slate_core::BackendKind::Io.is_transient());
    /// assert!(!slate_core::BackendKind::Auth.is_transient());
    /// ```
    #[must_use]
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            BackendKind::Io | BackendKind::Timeout | BackendKind::Unavailable
        )
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Io => "connection",
            BackendKind::Timeout => "timeout",
            BackendKind::Auth => "authentication",
            BackendKind::Permission => "permission",
            BackendKind::Response => "response",
            BackendKind::Unavailable => "server unavailable",
            BackendKind::Other => "backend",
        })
    }
}

/// One node's state, as reported by a multi-node lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeReport {
    /// The node's position in the configured order.
    pub index: usize,
    /// The node's address, without credentials.
    pub address: String,
    /// What happened on that node.
    pub state: NodeState,
}

impl fmt::Display for NodeReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {} ({}): {}", self.index, self.address, self.state)
    }
}

/// The state of one node in a [`NodeReport`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NodeState {
    /// This attempt acquired the node.
    Acquired,
    /// The node's entry was released.
    Released,
    /// The node had no entry of this holder (its lease there ran out).
    NotHeld,
    /// Another holder holds the lock on this node.
    HeldByOther,
    /// This attempt did not reach the node.
    NotTried,
    /// The node is marked unavailable.
    Unavailable {
        /// How long ago it was marked.
        since: Duration,
        /// The error that marked it.
        last_error: String,
    },
    /// The node's server restarted recently and is not used for new acquisitions.
    Quarantined {
        /// How long the quarantine still lasts.
        remaining: Duration,
    },
    /// A command on the node failed during this operation.
    Failed {
        /// The failure's kind.
        kind: BackendKind,
        /// A description.
        message: String,
    },
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeState::Acquired => f.write_str("acquired"),
            NodeState::Released => f.write_str("released"),
            NodeState::NotHeld => f.write_str("not held"),
            NodeState::HeldByOther => f.write_str("held by another holder"),
            NodeState::NotTried => f.write_str("not tried"),
            NodeState::Unavailable { since, last_error } => {
                write!(f, "unavailable for {since:?} ({last_error})")
            }
            NodeState::Quarantined { remaining } => {
                write!(f, "quarantined after a restart for another {remaining:?}")
            }
            NodeState::Failed { kind, message } => write!(f, "{kind} error: {message}"),
        }
    }
}

impl Error {
    /// Builds an [`Error::InvalidInput`] naming the input, the problem and the fix.
    ///
    /// # Examples
    ///
    /// ```
    /// let e = slate_core::Error::invalid_input("name", "it is empty", "give the lock a name");
    /// assert!(e.to_string().contains("give the lock a name"));
    /// ```
    pub fn invalid_input(
        what: &'static str,
        problem: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Error::InvalidInput {
            what,
            problem: problem.into(),
            fix: fix.into(),
        }
    }

    /// Builds an [`Error::Backend`].
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_core::{BackendKind, Error};
    ///
    /// let e = Error::backend(BackendKind::Io, Some("127.0.0.1:6379".into()), "refused", None);
    /// assert!(e.is_backend());
    /// assert_eq!(e.backend_kind(), Some(BackendKind::Io));
    /// ```
    pub fn backend(
        kind: BackendKind,
        node: Option<String>,
        message: impl Into<String>,
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        Error::Backend {
            kind,
            node,
            message: message.into(),
            source,
        }
    }

    /// Builds an [`Error::Timeout`].
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_core::{Error, TimeoutKind};
    /// use std::time::Duration;
    ///
    /// let e = Error::timeout("orders", TimeoutKind::Wait, Duration::from_secs(1), Duration::from_secs(1));
    /// assert!(e.is_timeout());
    /// assert_eq!(e.lock(), Some("orders"));
    /// ```
    pub fn timeout(
        lock: impl Into<Arc<str>>,
        kind: TimeoutKind,
        budget: Duration,
        elapsed: Duration,
    ) -> Self {
        Error::Timeout {
            lock: lock.into(),
            kind,
            budget,
            elapsed,
        }
    }

    /// Builds an [`Error::Busy`]. With an `Arc<str>` name it does not allocate (the busy path
    /// of `try_lock` builds one per attempt and throws it away).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let e = slate_core::Error::busy("orders", Some(Duration::from_secs(3)));
    /// assert!(e.is_busy());
    /// assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
    /// ```
    pub fn busy(lock: impl Into<Arc<str>>, retry_after: Option<Duration>) -> Self {
        Error::Busy {
            lock: lock.into(),
            retry_after,
        }
    }

    /// Builds an [`Error::NotHeld`].
    ///
    /// # Examples
    ///
    /// ```
    /// let e = slate_core::Error::not_held("orders", slate_core::HolderId::new());
    /// assert!(e.is_not_held());
    /// ```
    pub fn not_held(lock: impl Into<Arc<str>>, holder: HolderId) -> Self {
        Error::NotHeld {
            lock: lock.into(),
            holder,
        }
    }

    /// Builds an [`Error::LeaseLost`].
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_core::{Error, HolderId, LossReason};
    ///
    /// let e = Error::lease_lost("orders", HolderId::new(), LossReason::EntryGone);
    /// assert!(e.is_lease_lost());
    /// ```
    pub fn lease_lost(lock: impl Into<Arc<str>>, holder: HolderId, reason: LossReason) -> Self {
        Error::LeaseLost {
            lock: lock.into(),
            holder,
            reason,
        }
    }

    /// Builds an [`Error::InsufficientNodes`].
    ///
    /// # Examples
    ///
    /// ```
    /// let e = slate_core::Error::insufficient_nodes("orders", 2, 1, vec![]);
    /// assert!(e.is_insufficient_nodes());
    /// ```
    pub fn insufficient_nodes(
        lock: impl Into<Arc<str>>,
        required: usize,
        usable: usize,
        nodes: Vec<NodeReport>,
    ) -> Self {
        Error::InsufficientNodes {
            lock: lock.into(),
            required,
            usable,
            nodes,
        }
    }

    /// Builds an [`Error::ReleaseIncomplete`].
    ///
    /// # Examples
    ///
    /// ```
    /// let e = slate_core::Error::release_incomplete("orders", vec![]);
    /// assert!(e.is_release_incomplete());
    /// ```
    pub fn release_incomplete(lock: impl Into<Arc<str>>, nodes: Vec<NodeReport>) -> Self {
        Error::ReleaseIncomplete {
            lock: lock.into(),
            nodes,
        }
    }

    /// Builds an [`Error::Closed`].
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(slate_core::Error::closed("the client").is_closed());
    /// ```
    pub const fn closed(what: &'static str) -> Self {
        Error::Closed { what }
    }

    /// The printable name of the lock the error is about, when it is about one lock.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_core::Error::busy("orders", None).lock(), Some("orders"));
    /// assert_eq!(slate_core::Error::closed("the client").lock(), None);
    /// ```
    #[must_use]
    pub fn lock(&self) -> Option<&str> {
        match self {
            Error::Timeout { lock, .. }
            | Error::Busy { lock, .. }
            | Error::NotHeld { lock, .. }
            | Error::LeaseLost { lock, .. }
            | Error::InsufficientNodes { lock, .. }
            | Error::ReleaseIncomplete { lock, .. } => Some(lock),
            _ => None,
        }
    }

    /// The holder's remaining lease reported with an [`Error::Busy`], when the backend gave it.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_core::Error::busy("orders", None).retry_after(), None);
    /// ```
    #[must_use]
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Error::Busy { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether this is a [`Error::Timeout`] of any kind.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_core::{Error, TimeoutKind};
    /// use std::time::Duration;
    ///
    /// let e = Error::timeout("a", TimeoutKind::Wait, Duration::ZERO, Duration::ZERO);
    /// assert!(e.is_timeout());
    /// ```
    #[must_use]
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// Whether this is [`Error::Busy`].
    ///
    /// # Examples
    ///
    /// ```
    /// let e = slate_core::Error::busy("a", None);
    /// assert!(e.is_busy());
    /// ```
    #[must_use]
    pub fn is_busy(&self) -> bool {
        matches!(self, Error::Busy { .. })
    }

    /// Whether this is [`Error::NotHeld`].
    ///
    /// # Examples
    ///
    /// ```
    /// let e = slate_core::Error::not_held("a", slate_core::HolderId::new());
    /// assert!(e.is_not_held());
    /// ```
    #[must_use]
    pub fn is_not_held(&self) -> bool {
        matches!(self, Error::NotHeld { .. })
    }

    /// Whether this is [`Error::LeaseLost`].
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_core::{Error, HolderId, LossReason};
    ///
    /// let e = Error::lease_lost("a", HolderId::new(), LossReason::EntryGone);
    /// assert!(e.is_lease_lost());
    /// ```
    #[must_use]
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost { .. })
    }

    /// Whether this is [`Error::InsufficientNodes`].
    ///
    /// # Examples
    ///
    /// ```
    /// let e = slate_core::Error::insufficient_nodes("a", 2, 1, vec![]);
    /// assert!(e.is_insufficient_nodes());
    /// ```
    #[must_use]
    pub fn is_insufficient_nodes(&self) -> bool {
        matches!(self, Error::InsufficientNodes { .. })
    }

    /// Whether this is [`Error::ReleaseIncomplete`].
    ///
    /// # Examples
    ///
    /// ```
    /// let e = slate_core::Error::release_incomplete("a", vec![]);
    /// assert!(e.is_release_incomplete());
    /// ```
    #[must_use]
    pub fn is_release_incomplete(&self) -> bool {
        matches!(self, Error::ReleaseIncomplete { .. })
    }

    /// The per-node detail of a multi-node error ([`Error::InsufficientNodes`],
    /// [`Error::ReleaseIncomplete`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let e = slate_core::Error::release_incomplete("a", vec![]);
    /// assert_eq!(e.nodes().map(<[_]>::len), Some(0));
    /// ```
    #[must_use]
    pub fn nodes(&self) -> Option<&[NodeReport]> {
        match self {
            Error::InsufficientNodes { nodes, .. } | Error::ReleaseIncomplete { nodes, .. } => {
                Some(nodes)
            }
            _ => None,
        }
    }

    /// Whether this is [`Error::Backend`].
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_core::{BackendKind, Error};
    /// assert!(Error::backend(BackendKind::Auth, None, "WRONGPASS", None).is_backend());
    /// ```
    #[must_use]
    pub fn is_backend(&self) -> bool {
        matches!(self, Error::Backend { .. })
    }

    /// The backend failure's kind, for [`Error::Backend`].
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_core::{BackendKind, Error};
    /// let e = Error::backend(BackendKind::Permission, None, "NOPERM", None);
    /// assert_eq!(e.backend_kind(), Some(BackendKind::Permission));
    /// ```
    #[must_use]
    pub fn backend_kind(&self) -> Option<BackendKind> {
        match self {
            Error::Backend { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// Whether this is [`Error::InvalidInput`].
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(slate_core::Error::invalid_input("lease", "zero", "use 30s").is_invalid_input());
    /// ```
    #[must_use]
    pub fn is_invalid_input(&self) -> bool {
        matches!(self, Error::InvalidInput { .. })
    }

    /// Whether this is [`Error::Closed`].
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(slate_core::Error::closed("client").is_closed());
    /// ```
    #[must_use]
    pub fn is_closed(&self) -> bool {
        matches!(self, Error::Closed { .. })
    }

    /// Whether the same call may succeed if retried: timeouts, busy locks, too few nodes,
    /// transient backend failures.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_core::{BackendKind, Error};
    /// assert!(Error::backend(BackendKind::Io, None, "reset", None).is_retryable());
    /// assert!(!Error::invalid_input("name", "empty", "name it").is_retryable());
    /// ```
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Timeout { .. } | Error::Busy { .. } | Error::InsufficientNodes { .. } => true,
            Error::Backend { kind, .. } => kind.is_transient(),
            _ => false,
        }
    }
}
