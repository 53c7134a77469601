//! Running commands: a connection per call, the server checks a new connection gets, the
//! command budget, and failover bookkeeping.

use super::*;

/// How many times [`RedisClient::exec`] sends one request whose connection breaks before its
/// reply (each on a new connection, all within one command timeout).
const IO_SENDS: u32 = 3;

impl RedisClient {
    /// The shared multiplexed connection (borrowed from the pool on first use and after a
    /// failure), with its generation for [`invalidate`](Self::invalidate).
    ///
    /// It is never checked before use (a check would cost a round trip inside the caller's
    /// command timeout): a connection a restarted server broke fails the command at once with
    /// an I/O error, and [`exec`](Self::exec) sends it again on a new one; every command Slate
    /// sends may be repeated (acquire and release carry request ids).
    pub(super) async fn connection(&self) -> Result<(u64, Conn)> {
        {
            let slot = lock(&self.inner.conn);
            if let Some(c) = &slot.conn {
                return Ok((slot.generation, c.conn()));
            }
        }
        // Boxed: connecting takes futures of several kilobytes, which every command's future
        // would otherwise carry (and copy when it is built) for a path a command rarely takes.
        Box::pin(self.fill_connection()).await
    }

    /// The cold path of [`connection`](Self::connection): opens (or borrows) a connection,
    /// checks the server and loads the scripts.
    async fn fill_connection(&self) -> Result<(u64, Conn)> {
        // One task fills the slot; the others wait for it instead of each taking (and
        // PING-recycling) a pool connection.
        let _filling = self.inner.fill.lock().await;
        {
            let slot = lock(&self.inner.conn);
            if let Some(c) = &slot.conn {
                return Ok((slot.generation, c.conn()));
            }
        }
        let budget = self.inner.options.connect_timeout;
        let address = &self.inner.address;
        let held = match &self.inner.backend {
            Backend::Standalone(pool) => Held::Pooled(
                pool.get()
                    .await
                    .map_err(|e| error::from_pool(e, address, budget))?,
            ),
            Backend::Cluster(client) => {
                let conn = tokio::time::timeout(budget, client.get_async_connection())
                    .await
                    .map_err(|_| {
                        error::command_timeout("connecting to the cluster", address, budget)
                    })?
                    .map_err(|e| error::from_redis(e, "connecting to the cluster", address))?;
                // Sharded pub/sub needs Redis 7: asked once per connection (the answer names
                // no command on older servers, or where SPUBLISH is renamed away).
                let mut probe = conn.clone();
                let spublish: redis::Value = redis::cmd("COMMAND")
                    .arg("INFO")
                    .arg("SPUBLISH")
                    .query_async(&mut probe)
                    .await
                    .map_err(|e| error::from_redis(e, "COMMAND INFO SPUBLISH", address))?;
                let missing = match &spublish {
                    redis::Value::Array(v) => v.iter().all(|x| matches!(x, redis::Value::Nil)),
                    _ => false,
                };
                if missing && !self.inner.no_sharded_pubsub.swap(true, Ordering::Relaxed) {
                    tracing::warn!(cluster = %address,
                        "the cluster has no sharded pub/sub (SPUBLISH/SSUBSCRIBE, Redis 7): \
                         releases are published with PUBLISH and waiters wait on the spin-wait \
                         timer instead of being woken by releases");
                }
                Held::Owned(Conn::Cluster(conn))
            }
            Backend::Sentinel { sentinel, config } => {
                let connect = async {
                    let master = sentinel.lock().await.async_get_client().await?;
                    let now = master.get_connection_info().addr().to_string();
                    let before = lock(&self.inner.master).replace(now.clone());
                    if before.as_ref().is_some_and(|b| *b != now) {
                        self.inner.failovers.fetch_add(1, Ordering::Relaxed);
                        self.inner.meter.failover();
                        // Counted once: the new master's run id is not another change.
                        lock(&self.inner.run_id).take();
                        tracing::warn!(sentinel = %address, master = %now,
                            "the Sentinels name a new master (a failover)");
                    }
                    master
                        .get_multiplexed_async_connection_with_config(config)
                        .await
                };
                let conn = tokio::time::timeout(budget, connect)
                    .await
                    .map_err(|_| {
                        error::command_timeout(
                            "asking the Sentinels for the master",
                            address,
                            budget,
                        )
                    })?
                    .map_err(|e| {
                        error::from_redis(e, "asking the Sentinels for the master", address)
                    })?;
                Held::Owned(Conn::Server(conn))
            }
        };
        let mut conn = held.conn();
        // Load every script once per connection, so that normal operation never meets NOSCRIPT
        // (after a restart or a failover it still can; the callers reload then).
        let loaded = match &mut conn {
            // SCRIPT LOAD goes to every master of a cluster; a pipeline cannot (no key).
            Conn::Cluster(_) => {
                let mut r = Ok(());
                for script in scripts::ALL {
                    r = script.load_cmd().query_async::<()>(&mut conn).await;
                    if r.is_err() {
                        break;
                    }
                }
                r
            }
            Conn::Server(_) => {
                let mut load = redis::pipe();
                for script in scripts::ALL {
                    load.add_command(script.load_cmd()).ignore();
                }
                load.query_async::<()>(&mut conn).await
            }
        };
        loaded.map_err(|e| error::from_redis(e, "loading the lock scripts", address))?;
        self.check_server(&mut conn).await?;
        let mut slot = lock(&self.inner.conn);
        slot.conn = Some(held);
        slot.silent_since = None;
        if slot.generation > 0 {
            // Each replaced connection bumped the generation: this one follows a broken one.
            self.inner.meter.reconnected();
        }
        Ok((slot.generation, conn))
    }

    /// Reads `INFO` on a new connection. Its run id: a server other than the one the last
    /// connection reached (a restart behind the same address, whatever came back from disk)
    /// counts as a failover ([`failovers`](Self::failovers)), so that a multi-node lock
    /// verifies the node before its answers count again. Its `maxmemory-policy`: a policy that can evict lock keys is refused with
    /// [`ClientOptionsBuilder::refuse_evicting_server`], and otherwise warned about once per
    /// client.
    pub(super) async fn check_server(&self, conn: &mut Conn) -> Result<()> {
        let address = &self.inner.address;
        let strict = self.inner.options.refuse_evicting_server;
        // `INFO` rather than `CONFIG GET`: the least-privilege user already has it (README).
        // The default sections hold both fields (one section per call before Redis 7). A
        // cluster connection may answer for several nodes: any evicting one counts.
        let reply: RedisResult<redis::Value> = redis::cmd("INFO").query_async(conn).await;
        let mut run_id_read = false;
        if let (Ok(v), Conn::Server(_)) = (&reply, &*conn) {
            let mut text = String::new();
            collect_text(v, &mut text);
            let run_id = text
                .lines()
                .find_map(|l| l.trim().strip_prefix("run_id:"))
                .map(str::to_owned);
            if let Some(now) = run_id {
                run_id_read = true;
                let before = lock(&self.inner.run_id).replace(now.clone());
                if before.is_some_and(|b| b != now) {
                    self.inner.failovers.fetch_add(1, Ordering::Relaxed);
                    self.inner.meter.failover();
                    tracing::warn!(node = %address, run_id = %now,
                        "a new connection reached another server than the last one (a restart or a failover)");
                }
            }
        }
        // On any connection, the first or a later one: a restart behind it goes unseen.
        if matches!(conn, Conn::Server(_))
            && !run_id_read
            && !self.inner.run_id_warned.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(node = %address,
                "no run id read from the server's INFO (grant the ACL user +info): a restart \
                 behind this address is not seen, and after one that brings older data back \
                 (a snapshot) fencing tokens may repeat");
        }
        let policy = match reply {
            Ok(v) => eviction_policy_of(&v),
            Err(e) => {
                if strict {
                    tracing::warn!(node = %address, error = %e,
                        "could not read the server's maxmemory-policy (grant +info to check \
                         it); a policy that evicts keys with a TTL would drop held locks");
                } else {
                    tracing::debug!(node = %address, error = %e, "INFO failed");
                }
                None
            }
        };
        let Some(policy) = policy.filter(|p| !p.eq_ignore_ascii_case("noeviction")) else {
            return Ok(());
        };
        let what = format!(
            "the server's maxmemory-policy is {policy}: once it reaches maxmemory it evicts \
             keys{}, and every lock key has a TTL, so a held lock can vanish and be granted to \
             another holder. Fix: `CONFIG SET maxmemory-policy noeviction` (and in the server's \
             configuration)",
            if policy.starts_with("volatile") {
                " with a TTL first"
            } else {
                ""
            }
        );
        if strict {
            return Err(Error::backend(
                BackendKind::Other,
                Some(address.to_owned()),
                format!("{what}; refused (ClientOptionsBuilder::refuse_evicting_server)"),
                None,
            ));
        }
        if !self.inner.eviction_warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(node = %address, "{what}");
        }
        Ok(())
    }

    pub(super) fn mark_ok(&self, generation: u64) {
        let mut slot = lock(&self.inner.conn);
        if slot.generation == generation {
            slot.silent_since = None;
        }
    }

    /// Notes a command that timed out on connection `generation`. The connection is replaced
    /// once it has given no reply for two command timeouts since its first late one: a
    /// connection whose peer is gone (half-open after a partition) never answers again. Late
    /// replies within that time keep it, so that what is sent right after a late command (an
    /// undo) stays on the same connection, ordered behind it.
    pub(super) fn note_timeout(&self, generation: u64) {
        let replace = {
            let mut slot = lock(&self.inner.conn);
            if slot.generation != generation {
                false
            } else {
                let since = *slot.silent_since.get_or_insert_with(Instant::now);
                since.elapsed() >= self.inner.options.command_timeout * 2
            }
        };
        if replace {
            tracing::debug!(node = %self.inner.address, "the connection has not answered for two command timeouts; replacing it");
            self.invalidate(generation);
        }
    }

    pub(super) fn invalidate(&self, generation: u64) {
        let mut slot = lock(&self.inner.conn);
        if slot.generation == generation {
            slot.generation += 1;
            if let Some(Held::Pooled(obj)) = slot.conn.take() {
                // A broken connection must not go back to the pool.
                drop(deadpool_redis::Connection::take(obj));
            }
        }
    }

    /// Runs one command (or pipeline) on the shared connection within the command timeout.
    ///
    /// When the connection breaks before the reply arrives (a restarted server, a reset), the
    /// command may or may not have run; it is sent again, on a new connection, within what is
    /// left of the command timeout (at most [`IO_SENDS`] sends: a new connection can break
    /// too, under the same fault). Every command Slate sends may be repeated: reads,
    /// `PEXPIRE`-style renewals, `SET NX`, a fence raised to a maximum, and the acquire and
    /// release scripts, which carry a request id so that the server answers a retry from the
    /// request's record instead of applying it twice (see `request.rs`).
    pub(crate) async fn exec<T, F, Fut>(&self, what: &'static str, f: F) -> Result<T>
    where
        F: Fn(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        self.exec_resending(what, |conn, _| f(conn))
            .await
            .map(|(reply, _)| reply)
    }

    /// As [`exec`](Self::exec), telling `f` whether the request may have been sent before (a
    /// send after a broken connection: the earlier one may have run, or may still run if it is
    /// stuck on its way), and answering with the reply whether it was.
    pub(crate) async fn exec_resending<T, F, Fut>(
        &self,
        what: &'static str,
        f: F,
    ) -> Result<(T, bool)>
    where
        F: Fn(Conn, bool) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let start = Instant::now();
        let budget = self.inner.options.command_timeout;
        let mut sends = 1;
        loop {
            let left = budget.saturating_sub(start.elapsed());
            let resent = sends > 1;
            match self.exec_within(what, left, |c| f(c, resent)).await {
                Err(e) if e.backend_kind() == Some(BackendKind::Io) && sends < IO_SENDS => {
                    if budget.saturating_sub(start.elapsed()).is_zero() {
                        self.inner.meter.server_error(BackendKind::Io);
                        return Err(e);
                    }
                    sends += 1;
                    tracing::debug!(node = %self.inner.address, error = %e, "{what}: the connection broke before the reply; sending the same request again");
                }
                r => {
                    // Counted once per command, whatever it took to send it.
                    if let Err(e) = &r
                        && let Some(kind) = e.backend_kind()
                    {
                        self.inner.meter.server_error(kind);
                    }
                    return r.map(|reply| (reply, resent));
                }
            }
        }
    }

    pub(super) async fn exec_within<T, F, Fut>(
        &self,
        what: &'static str,
        budget: Duration,
        f: F,
    ) -> Result<T>
    where
        F: FnOnce(Conn) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        // The connection's generation, once taken (u64::MAX: none yet).
        let generation = std::sync::atomic::AtomicU64::new(u64::MAX);
        let run = async {
            let (gen_now, conn) = self.connection().await?;
            generation.store(gen_now, std::sync::atomic::Ordering::Relaxed);
            match f(conn).await {
                Ok(v) => {
                    self.mark_ok(gen_now);
                    Ok(v)
                }
                Err(e) => {
                    if e.is_timeout() {
                        self.note_timeout(gen_now);
                    } else if error::breaks_connection(&e) {
                        self.invalidate(gen_now);
                    }
                    Err(error::from_redis(e, what, &self.inner.address))
                }
            }
        };
        match tokio::time::timeout(budget, run).await {
            Ok(r) => r,
            Err(_) => {
                let g = generation.load(std::sync::atomic::Ordering::Relaxed);
                if g != u64::MAX {
                    self.note_timeout(g);
                }
                Err(error::command_timeout(what, &self.inner.address, budget))
            }
        }
    }

    /// Runs `fut` in the current runtime context when there is one, otherwise on the client's
    /// runtime (blocking callers poll from plain threads, where tokio timers and I/O need a
    /// runtime to be registered with).
    pub(crate) fn on_runtime<T, F>(
        &self,
        fut: F,
    ) -> impl Future<Output = Result<T>> + Send + 'static + use<T, F>
    where
        T: Send + 'static,
        F: Future<Output = Result<T>> + Send + 'static,
    {
        slate_core::detach::on_runtime(self.inner.runtime.clone(), fut)
    }

    /// Spawns background work on the client's runtime.
    pub(crate) fn spawn<F>(&self, fut: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        drop(self.inner.runtime.spawn(fut));
    }
}
