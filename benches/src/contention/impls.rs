//! The lock implementations the runner compares, as seen from one worker process.

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use slate_combination::{CombinationLock, CombinationLockGuard, NodeSet, NodeSetOptions, Order};
use slate_redis::{
    HolderId, MultiLock, MultiLockGuard, RedisClient, RwLock, RwLockReadGuard, RwLockWriteGuard,
    SingleLock, SingleLockGuard, Wait,
};

use slate_zookeeper::{ZkClient, ZkLock, ZkLockGuard};

use super::Impl;

/// Lease given to every implementation (the perf anchors used 5 s).
pub const LEASE: Duration = Duration::from_secs(5);

/// Compare-and-delete, the release of the naive spin lock.
const CAD: &str = r"if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0";

/// One worker's handle on the implementation under test.
pub enum Locker {
    /// Slate's single lock, one handle per lock name.
    Slate(Vec<SingleLock>),
    /// Slate's combination lock, one handle per lock name.
    SlateCombination(Vec<CombinationLock>),
    /// Slate's read-write lock, one handle per lock name.
    SlateRw(Vec<RwLock>),
    /// Slate's ZooKeeper lock, one handle per lock name.
    SlateZk(Vec<ZkLock>),
    /// `zookeeper-client`'s lock recipe: one session per process, a contender per task.
    ZkCurator(zookeeper_client::Client),
    /// The `rslock` crate (Redlock), with its default retry settings.
    Rslock(rslock::LockManager),
    /// Slate's multi-lock, one per set (indexed by the set's first lock).
    SlateMulti(Vec<MultiLock>),
    /// Slate's single locks, one handle per lock name, a set taken in sorted order by hand.
    SlateOrdered(Vec<SingleLock>),
    /// `redis-lock`: the client its `MultiResourceLock` is made from (it opens a connection
    /// per call).
    #[cfg(feature = "multi-peers")]
    RedisLock(redis027::Client),
    /// The `redisson` crate's client (boxed: it is large).
    #[cfg(feature = "multi-peers")]
    Redisson(Box<redisson::AsyncRedissonClient>),
    /// `SET NX PX`, sleeping 1 ms between failed attempts; compare-and-delete release.
    Spin {
        /// One multiplexed connection per process.
        conn: MultiplexedConnection,
        /// The release script.
        release: redis::Script,
    },
}

/// A held lock, whatever the implementation.
pub enum Held {
    /// Slate's single-lock guard.
    Slate(SingleLockGuard),
    /// Slate's combination guard.
    SlateCombination(CombinationLockGuard),
    /// Slate's read guard.
    SlateRead(RwLockReadGuard),
    /// Slate's write guard.
    SlateWrite(RwLockWriteGuard),
    /// Slate's ZooKeeper guard.
    SlateZk(ZkLockGuard),
    /// The recipe's lock (its znode is deleted in the background when dropped).
    ZkCurator(zookeeper_client::OwnedLockClient),
    /// rslock's lock.
    Rslock(rslock::Lock),
    /// The spin lock's random value.
    Spin(String),
    /// Slate's multi-lock guard.
    SlateMulti(MultiLockGuard),
    /// Slate's single-lock guards of a set.
    SlateOrdered(Vec<SingleLockGuard>),
    /// `redis-lock`'s lock id.
    #[cfg(feature = "multi-peers")]
    RedisLock(String),
    /// The `redisson` crate's held multi-lock.
    #[cfg(feature = "multi-peers")]
    Redisson(redisson::AsyncRMultiLock),
}

impl Locker {
    /// Connects to `nodes` for `which`.
    ///
    /// # Errors
    ///
    /// Connection failures, as text.
    pub async fn connect(
        which: Impl,
        nodes: &[String],
        names: &[String],
        set_size: usize,
    ) -> Result<Locker, String> {
        let singles = |client: RedisClient| -> Result<Locker, String> {
            let locks = names
                .iter()
                .map(|name| {
                    SingleLock::builder(&client, name.as_str())
                        .lease(LEASE)
                        .build()
                        .map_err(|e| e.to_string())
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Locker::Slate(locks))
        };
        match which {
            Impl::Slate => singles(RedisClient::open(&nodes[0]).map_err(|e| e.to_string())?),
            Impl::SlateMetered => {
                // The recorder first (locks resolve their handles at their first event); no
                // listener: what is measured is the recording.
                let recorder =
                    metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
                metrics::set_global_recorder(recorder).map_err(|e| e.to_string())?;
                singles(RedisClient::open(&nodes[0]).map_err(|e| e.to_string())?)
            }
            Impl::SlateCluster => singles(
                RedisClient::open_cluster(nodes, slate_redis::ClientOptions::default())
                    .map_err(|e| e.to_string())?,
            ),
            Impl::SlateComb3 | Impl::SlateComb3Pipelined => {
                let set = NodeSet::connect(nodes, NodeSetOptions::default())
                    .map_err(|e| e.to_string())?;
                // The runner's servers were started moments ago: adopt them (see
                // `NodeSet::adopt_fresh_servers`); no lock is held yet.
                set.adopt_fresh_servers("slate:")
                    .await
                    .map_err(|e| e.to_string())?;
                let order = if which == Impl::SlateComb3 {
                    Order::Sequential
                } else {
                    Order::Pipelined
                };
                let locks = names
                    .iter()
                    .map(|name| {
                        CombinationLock::builder(&set, name.as_str())
                            .lease(LEASE)
                            .order(order)
                            .build()
                            .map_err(|e| e.to_string())
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Locker::SlateCombination(locks))
            }
            Impl::SlateRw => {
                let client = RedisClient::open(&nodes[0]).map_err(|e| e.to_string())?;
                let locks = names
                    .iter()
                    .map(|name| {
                        RwLock::builder(&client, name.as_str())
                            .lease(LEASE)
                            .build()
                            .map_err(|e| e.to_string())
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Locker::SlateRw(locks))
            }
            Impl::SlateZk => {
                // The session is the lease.
                let client = ZkClient::builder(nodes[0].as_str())
                    .session_timeout(LEASE)
                    .connect()
                    .await
                    .map_err(|e| e.to_string())?;
                let locks = names
                    .iter()
                    .map(|name| {
                        ZkLock::builder(&client, name.as_str())
                            .build()
                            .map_err(|e| e.to_string())
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Locker::SlateZk(locks))
            }
            Impl::ZkCurator => {
                let client = zookeeper_client::Client::connector()
                    .with_session_timeout(LEASE)
                    .connect(&nodes[0])
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Locker::ZkCurator(client))
            }
            Impl::Rslock1 | Impl::Rslock3 => {
                Ok(Locker::Rslock(rslock::LockManager::new(nodes.to_vec())))
            }
            Impl::SlateMulti => {
                let client = RedisClient::open(&nodes[0]).map_err(|e| e.to_string())?;
                let sets = (0..names.len())
                    .map(|i| {
                        let set = (0..set_size).map(|k| names[(i + k) % names.len()].as_str());
                        MultiLock::builder(&client, set)
                            .lease(LEASE)
                            .build()
                            .map_err(|e| e.to_string())
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Locker::SlateMulti(sets))
            }
            Impl::SlateOrdered => {
                match singles(RedisClient::open(&nodes[0]).map_err(|e| e.to_string())?)? {
                    Locker::Slate(locks) => Ok(Locker::SlateOrdered(locks)),
                    _ => unreachable!("singles makes single locks"),
                }
            }
            #[cfg(feature = "multi-peers")]
            Impl::RedisLock => {
                let client =
                    redis027::Client::open(nodes[0].as_str()).map_err(|e| e.to_string())?;
                redis_lock::setup(&client)
                    .await
                    .map_err(|e| format!("redis-lock setup: {e}"))?;
                Ok(Locker::RedisLock(client))
            }
            #[cfg(feature = "multi-peers")]
            Impl::Redisson => {
                let config =
                    redisson::RedissonConfig::single_server(&nodes[0]).with_lock_expire_time(LEASE);
                let client = redisson::AsyncRedissonClient::new(config)
                    .await
                    .map_err(|e| format!("redisson: {e}"))?;
                Ok(Locker::Redisson(Box::new(client)))
            }
            #[cfg(not(feature = "multi-peers"))]
            Impl::RedisLock | Impl::Redisson => Err(format!(
                "{which} is built with the runner's multi-peers feature: cargo build --release \
                 -p benches --bin contention --features multi-peers"
            )),
            Impl::Spin => {
                let client = redis::Client::open(nodes[0].as_str()).map_err(|e| e.to_string())?;
                let conn = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(Locker::Spin {
                    conn,
                    release: redis::Script::new(CAD),
                })
            }
        }
    }

    /// Acquires `name` (to `read` it, for the implementations that share reads), giving up
    /// at `give_up` (`Ok(None)`).
    ///
    /// # Errors
    ///
    /// Backend failures, as text.
    pub async fn acquire(
        &self,
        index: usize,
        name: &str,
        give_up: Instant,
        read: bool,
    ) -> Result<Option<Held>, String> {
        let wait = slate_redis::Wait::Until(give_up);
        match self {
            Locker::SlateRw(locks) => {
                let holder = slate_redis::HolderId::new();
                let held = if read {
                    locks[index]
                        .acquire_read(holder, wait)
                        .await
                        .map(Held::SlateRead)
                } else {
                    locks[index]
                        .acquire_write(holder, wait)
                        .await
                        .map(Held::SlateWrite)
                };
                match held {
                    Ok(h) => Ok(Some(h)),
                    Err(e) if e.is_timeout() => Ok(None),
                    Err(e) => Err(e.to_string()),
                }
            }
            // What an application writes: a holder per call, minted by the lock (so that
            // queued tasks of a process may pass the hold between them, issue 14).
            Locker::Slate(locks) => match locks[index].try_lock_until(give_up).await {
                Ok(g) => Ok(Some(Held::Slate(g))),
                Err(e) if e.is_timeout() => Ok(None),
                Err(e) => Err(e.to_string()),
            },
            Locker::SlateCombination(locks) => match locks[index].try_lock_until(give_up).await {
                Ok(g) => Ok(Some(Held::SlateCombination(g))),
                Err(e) if e.is_timeout() => Ok(None),
                Err(e) => Err(e.to_string()),
            },
            // Sets of one name (`--set-size 1`).
            Locker::SlateMulti(sets) => match sets[index].try_lock_until(give_up).await {
                Ok(g) => Ok(Some(Held::SlateMulti(g))),
                Err(e) if e.is_timeout() => Ok(None),
                Err(e) => Err(e.to_string()),
            },
            Locker::SlateOrdered(locks) => match locks[index].try_lock_until(give_up).await {
                Ok(g) => Ok(Some(Held::SlateOrdered(vec![g]))),
                Err(e) if e.is_timeout() => Ok(None),
                Err(e) => Err(e.to_string()),
            },
            #[cfg(feature = "multi-peers")]
            Locker::RedisLock(_) | Locker::Redisson(_) => {
                let names = [(name.to_owned(), String::new())];
                self.acquire_set(0, &[0], &names, give_up).await
            }
            Locker::ZkCurator(client) => {
                use zookeeper_client::{Acls, CreateMode, LockOptions, LockPrefix};
                let dir = format!("/curator/{name}");
                let prefix = LockPrefix::new_curator(&dir, "lock-").map_err(|e| e.to_string())?;
                let options = LockOptions::new(Acls::anyone_all())
                    .with_ancestor_options(CreateMode::Persistent.with_acls(Acls::anyone_all()))
                    .map_err(|e| e.to_string())?;
                // Cancel safe (the recipe's own promise): a timed-out contender is deleted.
                let wait = give_up.saturating_duration_since(Instant::now());
                match tokio::time::timeout(wait, client.lock(prefix, b"", options)).await {
                    Ok(Ok(lock)) => Ok(Some(Held::ZkCurator(lock.into_owned()))),
                    Ok(Err(e)) => Err(format!("zookeeper-client lock: {e}")),
                    Err(_) => Ok(None),
                }
            }
            Locker::SlateZk(locks) => match locks[index].try_lock_until(give_up).await {
                Ok(g) => Ok(Some(Held::SlateZk(g))),
                Err(e) if e.is_timeout() => Ok(None),
                Err(e) => Err(e.to_string()),
            },
            Locker::Rslock(lm) => loop {
                // Exactly `LockManager::acquire`, bounded by the deadline.
                match lm.lock(name.as_bytes(), LEASE).await {
                    Ok(lock) => return Ok(Some(Held::Rslock(lock))),
                    Err(rslock::LockError::Unavailable) => {}
                    Err(e) => return Err(format!("rslock: {e:?}")),
                }
                if Instant::now() >= give_up {
                    return Ok(None);
                }
            },
            Locker::Spin { conn, .. } => {
                let value = format!("{:032x}", rand_u128());
                let mut conn = conn.clone();
                loop {
                    let ok: Option<String> = redis::cmd("SET")
                        .arg(name)
                        .arg(&value)
                        .arg("NX")
                        .arg("PX")
                        .arg(LEASE.as_millis() as u64)
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| e.to_string())?;
                    if ok.is_some() {
                        return Ok(Some(Held::Spin(value)));
                    }
                    if Instant::now() >= give_up {
                        return Ok(None);
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }
    }

    /// Acquires the names `set` (indices into `names`, lock name first) together, giving up
    /// at `give_up` (`Ok(None)`); `index` is the set's first lock.
    ///
    /// # Errors
    ///
    /// Backend failures, as text.
    pub async fn acquire_set(
        &self,
        index: usize,
        set: &[usize],
        names: &[(String, String)],
        give_up: Instant,
    ) -> Result<Option<Held>, String> {
        match self {
            Locker::SlateMulti(sets) => match sets[index].try_lock_until(give_up).await {
                Ok(g) => Ok(Some(Held::SlateMulti(g))),
                Err(e) if e.is_timeout() => Ok(None),
                Err(e) => Err(e.to_string()),
            },
            // What a careful application writes by hand: sort the names, take them in that
            // order as one holder, give everything back on a timeout.
            Locker::SlateOrdered(locks) => {
                let mut order = set.to_vec();
                order.sort_by(|a, b| names[*a].0.cmp(&names[*b].0));
                let holder = HolderId::new();
                let mut held = Vec::with_capacity(order.len());
                for i in order {
                    match locks[i].acquire(holder, Wait::Until(give_up)).await {
                        Ok(g) => held.push(g),
                        Err(e) => {
                            for g in held {
                                let _ = g.unlock().await;
                            }
                            return if e.is_timeout() {
                                Ok(None)
                            } else {
                                Err(e.to_string())
                            };
                        }
                    }
                }
                Ok(Some(Held::SlateOrdered(held)))
            }
            #[cfg(feature = "multi-peers")]
            Locker::RedisLock(client) => {
                // `acquire_default`'s loop (its default sleep, 1 s), bounded by the deadline.
                let resources: Vec<String> = set.iter().map(|&i| names[i].0.clone()).collect();
                let mut lock = redis_lock::MultiResourceLock::new(client.clone())
                    .map_err(|e| e.to_string())?;
                let timeout = give_up.saturating_duration_since(Instant::now());
                match lock
                    .acquire(&resources, LEASE, timeout, redis_lock::DEFAULT_SLEEP)
                    .await
                {
                    Ok(Some(id)) => Ok(Some(Held::RedisLock(id))),
                    Ok(None) => Ok(None),
                    Err(e) => Err(format!("redis-lock: {e}")),
                }
            }
            #[cfg(feature = "multi-peers")]
            Locker::Redisson(client) => {
                let set_names: Vec<String> = set.iter().map(|&i| names[i].0.clone()).collect();
                let multi = client.get_multi_lock(set_names);
                loop {
                    match multi.lock().await {
                        Ok(()) => return Ok(Some(Held::Redisson(multi))),
                        Err(redisson::RedissonError::LockAcquisitionError) => {}
                        Err(e) => return Err(format!("redisson: {e}")),
                    }
                    if Instant::now() >= give_up {
                        return Ok(None);
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            _ => Err(format!(
                "sets of names (--set-size) are for slate-multi, slate-ordered, redis-lock and \
                 redisson, not {}",
                match self {
                    Locker::Slate(_) => "slate",
                    Locker::SlateCombination(_) => "the combination lock",
                    Locker::SlateRw(_) => "slate-rw",
                    _ => "this implementation",
                }
            )),
        }
    }

    /// Releases `held`.
    ///
    /// # Errors
    ///
    /// Backend failures, as text.
    pub async fn release(&self, name: &str, held: Held) -> Result<(), String> {
        match (self, held) {
            (Locker::Slate(_), Held::Slate(g)) => {
                g.unlock().await.map(drop).map_err(|e| e.to_string())
            }
            (Locker::SlateCombination(_), Held::SlateCombination(g)) => {
                g.unlock().await.map(drop).map_err(|e| e.to_string())
            }
            (Locker::SlateRw(_), Held::SlateRead(g)) => {
                g.unlock().await.map(drop).map_err(|e| e.to_string())
            }
            (Locker::SlateRw(_), Held::SlateWrite(g)) => {
                g.unlock().await.map(drop).map_err(|e| e.to_string())
            }
            (Locker::SlateZk(_), Held::SlateZk(g)) => {
                g.unlock().await.map(drop).map_err(|e| e.to_string())
            }
            // The recipe's release: drop, which deletes the znode in the background.
            (Locker::ZkCurator(_), Held::ZkCurator(lock)) => {
                drop(lock);
                Ok(())
            }
            (Locker::Rslock(lm), Held::Rslock(lock)) => {
                lm.unlock(&lock).await;
                Ok(())
            }
            (Locker::Spin { conn, release }, Held::Spin(value)) => {
                let mut conn = conn.clone();
                let _: i64 = release
                    .key(name)
                    .arg(value)
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(())
            }
            (Locker::SlateMulti(_), Held::SlateMulti(g)) => {
                g.unlock().await.map(drop).map_err(|e| e.to_string())
            }
            (Locker::SlateOrdered(_), Held::SlateOrdered(gs)) => {
                let releases: Vec<_> = gs.into_iter().map(SingleLockGuard::unlock).collect();
                for r in futures::future::join_all(releases).await {
                    r.map_err(|e| e.to_string())?;
                }
                Ok(())
            }
            #[cfg(feature = "multi-peers")]
            (Locker::RedisLock(client), Held::RedisLock(id)) => {
                let mut lock = redis_lock::MultiResourceLock::new(client.clone())
                    .map_err(|e| e.to_string())?;
                lock.release(&id)
                    .await
                    .map(drop)
                    .map_err(|e| format!("redis-lock: {e}"))
            }
            #[cfg(feature = "multi-peers")]
            (Locker::Redisson(_), Held::Redisson(multi)) => {
                multi.unlock().await.map_err(|e| format!("redisson: {e}"))
            }
            _ => Err("held lock of another implementation".to_owned()),
        }
    }
}

fn rand_u128() -> u128 {
    let mut buf = [0u8; 16];
    // The value only has to differ between holders; on the (impossible here) failure of the OS
    // source, the time is unique enough for a benchmark.
    if getrandom::fill(&mut buf).is_err() {
        return u128::from(ecosphere::clock::now_ns());
    }
    u128::from_le_bytes(buf)
}

/// The workload: the deliberately non-atomic critical section, `GET counter; SET counter+1`,
/// or for a reader `GET counter` alone.
///
/// # Errors
///
/// Backend failures, as text.
pub async fn critical_section(
    resource: &mut MultiplexedConnection,
    key: &str,
    read: bool,
) -> Result<(), String> {
    let v: Option<i64> = resource.get(key).await.map_err(|e| e.to_string())?;
    if read {
        return Ok(());
    }
    let () = resource
        .set(key, v.unwrap_or(0) + 1)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}
