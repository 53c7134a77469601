//! [`ClientOptions`]: what a [`RedisClient`] is built with.

use super::*;

/// The default command timeout.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// Options of a [`RedisClient`], built with [`ClientOptions::builder`] and read back with
/// getters named as the options.
///
/// | option | default | meaning |
/// | --- | --- | --- |
/// | command timeout | 2 s | budget of every command Slate sends (script calls, queries, renewal pipelines, subscriptions), enforced with a tokio timeout around the call; also the response timeout of connections the client creates |
/// | connect timeout | 2 s | budget for opening a connection |
/// | credentials | from the URL | ACL user and password; override the URL's |
/// | pool size | 8 | connections of the pool [`RedisClient::open`] builds (commands are multiplexed, so few are needed) |
/// | runtime | the current one | the tokio runtime that runs renewal, notifications and background releases |
/// | synced replicas | off | replicas that must acknowledge every grant and renewal (`WAIT`) before it counts; see [`synced_replicas`](Self::synced_replicas) |
///
/// TLS is chosen by the URL scheme, `rediss://`, and needs the `tls` cargo feature.
///
/// `Debug` never shows the password.
///
/// # Examples
///
/// ```
/// use slate_redis::ClientOptions;
/// use std::time::Duration;
///
/// let opts = ClientOptions::builder()
///     .command_timeout(Duration::from_millis(500))
///     .username("app")
///     .password("s3cret")
///     .build()?;
/// assert!(!format!("{opts:?}").contains("s3cret"));
/// # Ok::<(), slate_redis::Error>(())
/// ```
#[derive(Clone)]
pub struct ClientOptions {
    pub(super) command_timeout: Duration,
    pub(super) connect_timeout: Duration,
    pub(super) username: Option<String>,
    pub(super) password: Option<String>,
    pub(super) pool_size: usize,
    pub(super) runtime: Option<Handle>,
    pub(super) synced_replicas: Option<(usize, Duration)>,
    pub(super) refuse_evicting_server: bool,
    #[cfg(feature = "tls")]
    pub(super) tls_root_certificate: Option<Vec<u8>>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: DEFAULT_COMMAND_TIMEOUT,
            username: None,
            password: None,
            pool_size: 8,
            runtime: None,
            synced_replicas: None,
            refuse_evicting_server: false,
            #[cfg(feature = "tls")]
            tls_root_certificate: None,
        }
    }
}

impl fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientOptions")
            .field("command_timeout", &self.command_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("pool_size", &self.pool_size)
            .field("runtime", &self.runtime.as_ref().map(|_| "<handle>"))
            .field("synced_replicas", &self.synced_replicas)
            .field("refuse_evicting_server", &self.refuse_evicting_server)
            .finish_non_exhaustive()
    }
}

/// Builds [`ClientOptions`]: one setter per option, named as the option (tokio's and
/// redis-rs's builder style); [`build`](Self::build) checks every rule.
///
/// # Examples
///
/// ```
/// use slate_redis::ClientOptions;
/// use std::time::Duration;
///
/// let opts = ClientOptions::builder()
///     .command_timeout(Duration::from_millis(500))
///     .username("app")
///     .password("s3cret")
///     .build()?;
/// assert_eq!(opts.command_timeout(), Duration::from_millis(500));
/// # Ok::<(), slate_redis::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
#[must_use = "a builder does nothing until build() is called"]
pub struct ClientOptionsBuilder(ClientOptions);

impl From<ClientOptions> for ClientOptionsBuilder {
    /// Starts from existing options (to change a few of them).
    fn from(options: ClientOptions) -> Self {
        ClientOptionsBuilder(options)
    }
}

impl ClientOptionsBuilder {
    /// Sets the budget of every command (default 2 s).
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// let o = slate_redis::ClientOptions::builder().command_timeout(Duration::from_secs(1)).build()?;
    /// assert_eq!(o.command_timeout(), Duration::from_secs(1));
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.0.command_timeout = timeout;
        self
    }

    /// Sets the budget for opening a connection (default 2 s).
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// let _ = slate_redis::ClientOptions::builder().connect_timeout(Duration::from_secs(1));
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.0.connect_timeout = timeout;
        self
    }

    /// Sets the ACL user, overriding the URL's (default: the URL's, or Redis's `default` user).
    ///
    /// # Examples
    ///
    /// ```
    /// let o = slate_redis::ClientOptions::builder().username("app").password("s3cret").build()?;
    /// assert_eq!(o.username(), Some("app"));
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.0.username = Some(username.into());
        self
    }

    /// Sets the password, overriding the URL's (never shown by `Debug`, errors or logs).
    ///
    /// # Examples
    ///
    /// ```
    /// let o = slate_redis::ClientOptions::builder().password("s3cret").build()?;
    /// assert!(!format!("{o:?}").contains("s3cret"));
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.0.password = Some(password.into());
        self
    }

    /// Sets the size of the pool that [`RedisClient::open`] builds (default 8).
    ///
    /// # Examples
    ///
    /// ```
    /// let _ = slate_redis::ClientOptions::builder().pool_size(4);
    /// ```
    pub fn pool_size(mut self, size: usize) -> Self {
        self.0.pool_size = size;
        self
    }

    /// Sets the tokio runtime that runs renewal, notifications and background releases
    /// (default: the runtime current when the client is built; outside any runtime, a small
    /// one the client starts for itself).
    ///
    /// # Examples
    ///
    /// ```
    /// let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    /// let _ = slate_redis::ClientOptions::builder().runtime(rt.handle().clone());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn runtime(mut self, handle: Handle) -> Self {
        self.0.runtime = Some(handle);
        self
    }

    /// Makes every grant and every renewal wait until `replicas` replicas of the lock's master
    /// have acknowledged it (`WAIT replicas within`, on the connection that wrote it), in the
    /// spirit of Redisson's synced-replicas check.
    ///
    /// Replication is asynchronous: without this, a master that fails right after a grant can
    /// lose it when a replica that never received it is promoted, and a second holder is then
    /// granted the same lock. With it:
    /// - a grant not acknowledged by `replicas` replicas within `within` is **given back** and
    ///   the attempt fails with a transient backend error naming the count (the lock call
    ///   retries as after any transient error);
    /// - a renewal counts (moves the lease deadline) only once acknowledged, so the holder's
    ///   deadline never runs past what the replicas know;
    /// - what it promises: a promoted replica that was among the acknowledging ones has every
    ///   grant and renewal the holder relies on. Choose `replicas` so that the replica the
    ///   failover promotes is one of them (e.g. all replicas, or a majority with Sentinel's or
    ///   the cluster's own election preferring the most up-to-date replica). `WAIT` does not
    ///   make Redis strongly consistent: a replica that acknowledged and then lost its data
    ///   (restarted without persistence) still loses grants.
    ///
    /// `within` must be shorter than the command timeout (it is part of each call's budget).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let o = slate_redis::ClientOptions::builder()
    ///     .synced_replicas(1, Duration::from_millis(500))
    ///     .build()?;
    /// assert_eq!(o.synced_replicas(), Some((1, Duration::from_millis(500))));
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    pub fn synced_replicas(mut self, replicas: usize, within: Duration) -> Self {
        self.0.synced_replicas = (replicas > 0).then_some((replicas, within));
        self
    }

    /// Refuses a server whose `maxmemory-policy` can evict lock keys (anything but
    /// `noeviction`: every lock key has a TTL, so `volatile-*` policies evict them first, and
    /// `allkeys-*` ones may): each connection then fails with a [`BackendKind::Other`] error
    /// naming the policy and the fix. Off by default: such a server is used, and the client
    /// logs one warning with the fix. A server that does not let the
    /// client read its configuration (`CONFIG GET` denied by an ACL) is used either way; with
    /// this option on, a warning says the policy could not be checked.
    ///
    /// On a Redis Cluster the node the client's connection asks is checked.
    ///
    /// # Examples
    ///
    /// ```
    /// let o = slate_redis::ClientOptions::builder().refuse_evicting_server(true).build()?;
    /// assert!(o.refuses_evicting_server());
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    pub fn refuse_evicting_server(mut self, refuse: bool) -> Self {
        self.0.refuse_evicting_server = refuse;
        self
    }

    /// Trusts this CA certificate (PEM) for `rediss://` connections instead of the platform's
    /// root store (feature `tls`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let pem = std::fs::read("ca.crt")?;
    /// let _ = slate_redis::ClientOptions::builder().tls_root_certificate(pem);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.0.tls_root_certificate = Some(pem.into());
        self
    }

    /// Checks every option against its rule and returns the options.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the first invalid option (a zero or over-long timeout, a
    /// pool of 0, a replica wait not below the command timeout) and the fix.
    ///
    /// # Examples
    ///
    /// ```
    /// let e = slate_redis::ClientOptions::builder().pool_size(0).build().unwrap_err();
    /// assert!(e.to_string().contains("pool size"));
    /// ```
    pub fn build(self) -> Result<ClientOptions> {
        self.0.validate()?;
        Ok(self.0)
    }
}

impl ClientOptions {
    /// Starts building options from the defaults.
    ///
    /// # Examples
    ///
    /// ```
    /// let o = slate_redis::ClientOptions::builder().pool_size(4).build()?;
    /// assert_eq!(o.pool_size(), 4);
    /// # Ok::<(), slate_redis::Error>(())
    /// ```
    pub fn builder() -> ClientOptionsBuilder {
        ClientOptionsBuilder::default()
    }

    /// Whether a server whose eviction policy can remove lock keys is refused (see
    /// [`ClientOptionsBuilder::refuse_evicting_server`]).
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(!slate_redis::ClientOptions::default().refuses_evicting_server());
    /// ```
    #[must_use]
    pub fn refuses_evicting_server(&self) -> bool {
        self.refuse_evicting_server
    }

    /// The budget of every command.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert_eq!(slate_redis::ClientOptions::default().command_timeout(), Duration::from_secs(2));
    /// ```
    #[must_use]
    pub fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// The budget for opening a connection.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert_eq!(slate_redis::ClientOptions::default().connect_timeout(), Duration::from_secs(2));
    /// ```
    #[must_use]
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The ACL user set in the options (`None`: the URL's).
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_redis::ClientOptions::default().username(), None);
    /// ```
    #[must_use]
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// The size of the pool [`RedisClient::open`] builds.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_redis::ClientOptions::default().pool_size(), 8);
    /// ```
    #[must_use]
    pub fn pool_size(&self) -> usize {
        self.pool_size
    }

    /// The synced-replicas setting: replicas and their wait, `None` when off.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_redis::ClientOptions::default().synced_replicas(), None);
    /// ```
    #[must_use]
    pub fn synced_replicas(&self) -> Option<(usize, Duration)> {
        self.synced_replicas
    }

    pub(super) fn validate(&self) -> Result<()> {
        if self.command_timeout.is_zero() {
            return Err(Error::invalid_input(
                "command timeout",
                "it is zero, so every command would time out",
                "use a command timeout of at least a few milliseconds (the default is 2s)",
            ));
        }
        if self.connect_timeout.is_zero() {
            return Err(Error::invalid_input(
                "connect timeout",
                "it is zero, so no connection could be opened",
                "use a connect timeout of at least a few milliseconds (the default is 2s)",
            ));
        }
        slate_core::options::check_max_duration("command timeout", self.command_timeout)?;
        slate_core::options::check_max_duration("connect timeout", self.connect_timeout)?;
        if let Some((_, within)) = self.synced_replicas
            && (within.is_zero() || within >= self.command_timeout)
        {
            return Err(Error::invalid_input(
                "synced replicas",
                format!(
                    "the acknowledgement wait {within:?} must be above zero and below the \
                     command timeout {:?}, which bounds each call",
                    self.command_timeout
                ),
                "wait at most about half the command timeout for replicas (or raise the \
                 command timeout)",
            ));
        }
        if self.pool_size == 0 {
            return Err(Error::invalid_input(
                "pool size",
                "it is zero",
                "use a pool size of at least 1 (the default is 8)",
            ));
        }
        Ok(())
    }
}
