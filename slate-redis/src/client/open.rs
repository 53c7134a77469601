//! Opening a client on each topology: a standalone master (URL or pool), a Redis Cluster, a
//! Sentinel group.

use super::*;

impl RedisClient {
    /// Opens a client for the server at `url` with default options.
    ///
    /// `redis://[user:password@]host:port[/db]`, or `rediss://...` for TLS (with the `tls`
    /// feature). Nothing is sent until the first command; call [`ping`](Self::ping) to check
    /// the server and credentials at once.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for a malformed URL, a `rediss://` URL without the `tls`
    /// feature. Outside a tokio runtime (and without
    /// [`ClientOptionsBuilder::runtime`]) the client starts a small runtime of its own (one
    /// worker thread, shut down with the client), so it serves the `blocking_*` methods from
    /// plain threads.
    pub fn open(url: impl AsRef<str>) -> Result<Self> {
        Self::open_with(url, ClientOptions::default())
    }

    /// Opens a client for the server at `url` with `options`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use slate_redis::{ClientOptions, RedisClient};
    /// use std::time::Duration;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let opts = ClientOptions::builder().command_timeout(Duration::from_millis(500)).build()?;
    /// let client = RedisClient::open_with("redis://127.0.0.1:6379", opts)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`open`](Self::open), plus invalid options.
    pub fn open_with(url: impl AsRef<str>, options: ClientOptions) -> Result<Self> {
        options.validate()?;
        let url = url.as_ref();
        let info = parse_url(url)?;
        let info = apply_credentials(info, &options);
        #[cfg(feature = "tls")]
        let info = match &options.tls_root_certificate {
            Some(pem) => redis::Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.clone()),
                },
            )
            .map_err(|e| bad_url(url, &e))?
            .get_connection_info()
            .clone(),
            None => info,
        };
        let client = redis::Client::open(info.clone()).map_err(|e| bad_url(url, &e))?;
        let address = info.addr().to_string();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.command_timeout));
        let manager = Manager::new_with_config(info, config).map_err(|e| bad_url(url, &e))?;
        let pool = Pool::builder(manager)
            .max_size(options.pool_size)
            .wait_timeout(Some(options.command_timeout))
            .create_timeout(Some(options.connect_timeout))
            .recycle_timeout(Some(options.command_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| {
                Error::invalid_input(
                    "pool",
                    format!("the pool could not be built: {e}"),
                    "check the pool options",
                )
            })?;
        Self::build(
            Backend::Standalone(pool),
            Some(PubSubSource::Server(Box::new(client))),
            address,
            options,
        )
    }

    /// Wraps an existing pool; `pubsub` (a client for the same server) opens the pub/sub
    /// connection that wakes waiters on release.
    ///
    /// The pool's own connection settings apply (redis-rs's default response timeout is
    /// 500 ms); Slate's command timeout applies on top of them.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let url = "redis://127.0.0.1:6379";
    /// let pool = deadpool_redis::Config::from_url(url).create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
    /// let client = slate_redis::RedisClient::from_pool(pool, redis::Client::open(url)?)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// None today (the signature leaves room for checks); outside a tokio runtime the client
    /// starts one of its own, as [`open`](Self::open) does.
    pub fn from_pool(pool: Pool, pubsub: redis::Client) -> Result<Self> {
        Self::from_pool_with(pool, Some(pubsub), ClientOptions::default())
    }

    /// Wraps an existing pool with `options` (credentials in `options` only apply to the
    /// pub/sub client; the pool keeps its own). Without a `pubsub` client, waiters are woken by
    /// the spin-wait timer only.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:6379")
    ///     .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
    /// let client = slate_redis::RedisClient::from_pool_with(pool, None, Default::default())?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// None today beyond a malformed pub/sub client; outside a tokio runtime the client starts
    /// one of its own, as [`open`](Self::open) does.
    pub fn from_pool_with(
        pool: Pool,
        pubsub: Option<redis::Client>,
        options: ClientOptions,
    ) -> Result<Self> {
        options.validate()?;
        let pubsub = match pubsub {
            Some(c) if options.password.is_some() => {
                let info = apply_credentials(c.get_connection_info().clone(), &options);
                Some(redis::Client::open(info).map_err(|e| bad_url("<pubsub client>", &e))?)
            }
            other => other,
        };
        let address = pubsub.as_ref().map_or_else(
            || "redis".to_owned(),
            |c| c.get_connection_info().addr().to_string(),
        );
        Self::build(
            Backend::Standalone(pool),
            pubsub.map(|c| PubSubSource::Server(Box::new(c))),
            address,
            options,
        )
    }

    /// Opens a client for a Redis Cluster, discovered from `seeds` (any of its nodes; several
    /// in case some are down).
    ///
    /// Every key of one lock shares one hash slot (the `{…}` tag of its name), so each lock
    /// lives on the shard that owns that slot, and its scripts run there in one call. The
    /// client follows `MOVED`/`ASK` redirects and failovers; release notifications use sharded
    /// pub/sub (`SSUBSCRIBE`/`SPUBLISH`, Redis 7), delivered by the shard that owns the lock;
    /// renewals go as one pipeline per node per tick.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use slate_redis::{ClientOptions, RedisClient};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let client = RedisClient::open_cluster(
    ///     ["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"],
    ///     ClientOptions::default(),
    /// )?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for no seed, a malformed URL, seeds that differ in TLS or
    /// credentials. Outside a tokio runtime the client starts one of its own, as
    /// [`open`](Self::open) does.
    pub fn open_cluster<I, S>(seeds: I, options: ClientOptions) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        options.validate()?;
        let seeds: Vec<String> = seeds.into_iter().map(|s| s.as_ref().to_owned()).collect();
        if seeds.is_empty() {
            return Err(Error::invalid_input(
                "cluster seeds",
                "no seed node was given",
                "give at least one node of the cluster (redis://host:port)",
            ));
        }
        let infos = seeds
            .iter()
            .map(|u| parse_url(u).map(|i| apply_credentials(i, &options)))
            .collect::<Result<Vec<_>>>()?;
        let address = format!("cluster {}", addresses(&infos));
        let build = {
            let infos = infos.clone();
            let options = options.clone();
            move |push: Option<tokio::sync::mpsc::UnboundedSender<redis::PushInfo>>| {
                let mut b = redis::cluster::ClusterClientBuilder::new(infos.clone())
                    .connection_timeout(options.connect_timeout)
                    .response_timeout(options.command_timeout);
                #[cfg(feature = "tls")]
                if let Some(pem) = &options.tls_root_certificate {
                    b = b.certs(redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(pem.clone()),
                    });
                }
                if let Some(push) = push {
                    b = b
                        .use_protocol(redis::ProtocolVersion::RESP3)
                        .push_sender(push);
                }
                b.build()
            }
        };
        let client = build(None).map_err(|e| bad_url(&seeds[0], &e))?;
        Self::build(
            Backend::Cluster(Box::new(client)),
            Some(PubSubSource::Cluster(Arc::new(build))),
            address,
            options,
        )
    }

    /// Opens a client for the master that the Sentinels at `sentinels` name `master_name`,
    /// following failovers: when the master changes (its connection breaks, or it answers
    /// `READONLY` after being demoted), the client asks the Sentinels again.
    ///
    /// The Sentinels' URLs carry the Sentinels' own credentials, if any;
    /// [`ClientOptionsBuilder::username`] and [`ClientOptionsBuilder::password`] are those of the data servers.
    ///
    /// Replication is asynchronous: a grant the master acknowledged but had not yet sent to a
    /// replica is lost if that replica is promoted. [`ClientOptionsBuilder::synced_replicas`] makes
    /// every grant (and renewal) wait for replicas first.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use slate_redis::{ClientOptions, RedisClient};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
    /// let client = RedisClient::open_sentinel(
    ///     ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"],
    ///     "mymaster",
    ///     ClientOptions::default(),
    /// )?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] for no Sentinel, an empty master name, a malformed URL, a
    /// `rediss://` Sentinel URL (TLS to Sentinels is not supported yet), invalid options, or
    /// (outside a tokio runtime the client starts one of its own, as [`open`](Self::open)
    /// does).
    pub fn open_sentinel<I, S>(
        sentinels: I,
        master_name: &str,
        options: ClientOptions,
    ) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        options.validate()?;
        let urls: Vec<String> = sentinels
            .into_iter()
            .map(|s| s.as_ref().to_owned())
            .collect();
        if urls.is_empty() {
            return Err(Error::invalid_input(
                "sentinels",
                "no Sentinel was given",
                "give the Sentinels' addresses (redis://host:26379)",
            ));
        }
        if master_name.is_empty() {
            return Err(Error::invalid_input(
                "master name",
                "it is empty",
                "give the name the Sentinels monitor the master under (sentinel monitor <name> ...)",
            ));
        }
        if let Some(u) = urls.iter().find(|u| u.starts_with("rediss://")) {
            return Err(Error::invalid_input(
                "sentinels",
                format!(
                    "{} asks for TLS, which Slate does not support with Sentinels yet",
                    redact(u)
                ),
                "reach the Sentinels over redis:// (or use a standalone or cluster URL)",
            ));
        }
        let infos = urls
            .iter()
            .map(|u| parse_url(u))
            .collect::<Result<Vec<_>>>()?;
        let mut node = redis::RedisConnectionInfo::default();
        if let Some(password) = &options.password {
            node = node.set_password(password);
            if let Some(user) = &options.username {
                node = node.set_username(user);
            }
        }
        let node_info = SentinelNodeConnectionInfo::default().set_redis_connection_info(node);
        // An owned name: redis-rs takes a `String` without TLS support and `impl AsRef<str>`
        // with it (both are built: the `tls` feature, and crates built alone).
        #[allow(clippy::unnecessary_to_owned)]
        let sentinel = SentinelClient::build(
            infos.clone(),
            master_name.to_owned(),
            Some(node_info),
            SentinelServerType::Master,
        )
        .map_err(|e| bad_url(&urls[0], &e))?;
        let address = format!("sentinel {master_name} via {}", addresses(&infos));
        let sentinel = Arc::new(tokio::sync::Mutex::new(sentinel));
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.command_timeout));
        Self::build(
            Backend::Sentinel {
                sentinel: sentinel.clone(),
                config: Box::new(config),
            },
            Some(PubSubSource::Sentinel(sentinel)),
            address,
            options,
        )
    }

    pub(super) fn build(
        backend: Backend,
        pubsub: Option<PubSubSource>,
        address: String,
        options: ClientOptions,
    ) -> Result<Self> {
        let (runtime, own_runtime) = match options.runtime.clone() {
            Some(h) => (h, None),
            None => match Handle::try_current() {
                Ok(h) => (h, None),
                Err(_) => {
                    let (own, handle) = OwnRuntime::start()?;
                    (handle, Some(own))
                }
            },
        };
        let no_sharded_pubsub = Arc::new(AtomicBool::new(false));
        let meter = ClientMeter::new(super::backend_label(backend.topology()));
        let inner = Arc::new_cyclic(|weak: &Weak<Inner>| Inner {
            renewal: Renewal::new(weak.clone(), meter.clone()),
            notifier: Notifier::new(
                pubsub,
                options.command_timeout,
                options.connect_timeout,
                no_sharded_pubsub.clone(),
            ),
            no_sharded_pubsub,
            eviction_warned: AtomicBool::new(false),
            master: Mutex::new(None),
            run_id: Mutex::new(None),
            failovers: AtomicU64::new(0),
            fence_floors: Mutex::new(super::FenceFloors::new()),
            run_id_warned: AtomicBool::new(false),
            meter,
            backend,
            address,
            runtime,
            _own_runtime: own_runtime,
            options,
            conn: Mutex::new(ConnSlot {
                generation: 0,
                conn: None,
                silent_since: None,
            }),
            fill: tokio::sync::Mutex::new(()),
            slots: Mutex::new(None),
            locks: Registry::default(),
        });
        Ok(RedisClient { inner })
    }
}
