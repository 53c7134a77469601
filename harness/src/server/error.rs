//! The one error type of the harness.

use std::io;

/// What went wrong in the harness: which step failed, and why.
///
/// Every variant names the step (`what`) so a failing test says which server, proxy or worker
/// operation broke, not just "I/O error".
///
/// # Examples
///
/// ```no_run
/// use slate_harness::server::{HarnessError, RedisServer};
///
/// match RedisServer::start() {
///     Ok(server) => println!("redis on {}", server.url()),
///     Err(HarnessError::BinaryNotFound { .. }) => panic!("install redis-server"),
///     Err(other) => panic!("{other}"),
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// No server binary was found (or the configured one does not exist).
    #[error("server binary not found ({detail}): {hint}")]
    BinaryNotFound {
        /// Where the harness looked.
        detail: String,
        /// How to install the chosen server ([`ServerKind::install_hint`]).
        ///
        /// [`ServerKind::install_hint`]: crate::server::ServerKind::install_hint
        hint: &'static str,
    },
    /// An operating-system call failed.
    #[error("{what}: {source}")]
    Io {
        /// The step that failed.
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A Redis command or connection failed.
    #[error("{what}: {source}")]
    Redis {
        /// The step that failed.
        what: String,
        /// The underlying error.
        #[source]
        source: redis::RedisError,
    },
    /// Sending a signal to a process the harness started failed.
    #[error("{what}: {source}")]
    Signal {
        /// The step that failed.
        what: String,
        /// The underlying error.
        #[source]
        source: nix::Error,
    },
    /// A `redis-server` did not come up.
    #[error("redis-server on port {port} did not start: {reason}\n--- log tail ---\n{log_tail}")]
    StartFailed {
        /// The port it was asked to listen on.
        port: u16,
        /// Why the harness gave up.
        reason: String,
        /// The last lines of its log.
        log_tail: String,
    },
    /// A bounded wait ran out.
    #[error("timed out: {what}")]
    Timeout {
        /// What was being waited for (with any collected diagnostics).
        what: String,
    },
    /// The operation needs a running process, and it is not running.
    #[error("not running: {what}")]
    NotRunning {
        /// The operation that was refused.
        what: String,
    },
    /// A builder was given a value the harness cannot use.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Generating TLS material failed.
    #[error("TLS setup failed: {0}")]
    Tls(String),
    /// A worker process ended without doing what was waited for.
    #[error("worker {index}: {what}")]
    Worker {
        /// The worker's index in its set.
        index: usize,
        /// What happened, with its stderr tail.
        what: String,
    },
}

impl HarnessError {
    /// Wraps an I/O error with the step that failed.
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> Self {
        let what = what.into();
        move |source| Self::Io { what, source }
    }

    /// Wraps a Redis error with the step that failed.
    pub(crate) fn redis(what: impl Into<String>) -> impl FnOnce(redis::RedisError) -> Self {
        let what = what.into();
        move |source| Self::Redis { what, source }
    }

    /// Wraps a signal error with the step that failed.
    pub(crate) fn signal(what: impl Into<String>) -> impl FnOnce(nix::Error) -> Self {
        let what = what.into();
        move |source| Self::Signal { what, source }
    }

    /// Whether this is a bounded wait that ran out.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_harness::server::HarnessError;
    ///
    /// let err = HarnessError::Timeout { what: "PING".into() };
    /// assert!(err.is_timeout());
    /// ```
    #[must_use]
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. })
    }
}
