//! The connection every command goes through, whatever the deployment.

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::scripts::{SlateScript, is_noscript};

/// The Redis deployment a [`RedisClient`](crate::RedisClient) talks to.
///
/// # Examples
///
/// ```no_run
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> slate_redis::Result<()> {
/// let client = slate_redis::RedisClient::open("redis://127.0.0.1:6379")?;
/// assert_eq!(client.topology(), slate_redis::Topology::Standalone);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Topology {
    /// One master ([`RedisClient::open`](crate::RedisClient::open)).
    Standalone,
    /// A Redis Cluster ([`RedisClient::open_cluster`](crate::RedisClient::open_cluster)): each
    /// lock lives on the shard that owns its name's hash slot.
    Cluster,
    /// A Sentinel-managed master
    /// ([`RedisClient::open_sentinel`](crate::RedisClient::open_sentinel)): the client asks
    /// the Sentinels for the master and follows failovers.
    Sentinel,
}

impl std::fmt::Display for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Topology::Standalone => "standalone",
            Topology::Cluster => "cluster",
            Topology::Sentinel => "sentinel",
        })
    }
}

/// A multiplexed connection to one server (standalone, or the master a Sentinel named), or
/// redis-rs's cluster connection (one multiplexed connection per node, routing by slot and
/// following `MOVED`/`ASK`). Cheap to clone.
#[derive(Clone)]
pub(crate) enum Conn {
    Server(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Server(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Server(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Server(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// `WAIT replicas within` (milliseconds, at least 1).
pub(crate) fn wait_cmd(replicas: usize, within: std::time::Duration) -> redis::Cmd {
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(replicas)
        .arg(u64::try_from(within.as_millis()).unwrap_or(u64::MAX).max(1));
    cmd
}

/// Runs a script call (`EVALSHA`, as the bindings in `scripts::call` build it); on
/// `NOSCRIPT` (a restarted or failed-over server) loads the script and sends the call again.
pub(crate) async fn eval<T: redis::FromRedisValue>(
    conn: &mut Conn,
    script: &SlateScript,
    eval: &Cmd,
) -> redis::RedisResult<T> {
    match eval.query_async(conn).await {
        Err(e) if is_noscript(&e) => {
            script.load_cmd().query_async::<()>(conn).await?;
            eval.query_async(conn).await
        }
        r => r,
    }
}

/// Runs `eval` (an `EVALSHA` of `script`) and, with `wait` (replicas, within) and a reply
/// that `counts`, `WAIT`s for the replicas. Returns the script's reply and, when it waited,
/// how many replicas acknowledged the connection's writes up to it. After `NOSCRIPT`, loads
/// the script and sends it again, once.
///
/// On a cluster the `WAIT` rides in one pipeline with the script, so that it runs on the
/// server that ran the script even while its slot migrates: redis-rs sends the whole pipeline
/// again after an `ASK` (or `MOVED`), so both run on the importing node. A lone `WAIT` routed
/// by the key's slot went to the migrating node, which had nothing of this write to wait for
/// and counted every replica. The pipeline waits whatever the reply
/// (a busy answer too). On one server the `WAIT` follows the script on the same connection
/// only when the reply `counts` (a grant, a renewal), so busy answers never block the shared
/// connection behind a `WAIT` (review finding).
pub(crate) async fn eval_then_wait<T: redis::FromRedisValue>(
    conn: &mut Conn,
    script: &SlateScript,
    eval: &redis::Cmd,
    wait: Option<(usize, std::time::Duration)>,
    counts: impl Fn(&T) -> bool,
) -> redis::RedisResult<(T, Option<usize>)> {
    let pipelined = match wait {
        // A cluster's WAIT rides in the script's pipeline, redirected with it as a whole.
        Some(w) if matches!(conn, Conn::Cluster(_)) => w,
        _ => {
            // Alone (no replicas to wait for), or followed by its WAIT on one server's
            // connection: no pipeline around it.
            let reply: T = self::eval(conn, script, eval).await?;
            let Some((n, within)) = wait.filter(|_| counts(&reply)) else {
                return Ok((reply, None));
            };
            let acked = wait_cmd(n, within).query_async(conn).await?;
            return Ok((reply, Some(acked)));
        }
    };
    let mut pipe = redis::pipe();
    pipe.add_command(eval.clone());
    pipe.add_command(wait_cmd(pipelined.0, pipelined.1));
    // Errors stay in the replies: the script's own is read below, a `WAIT`'s is returned.
    pipe.ignore_errors();
    let mut replies: Vec<Value> = pipe.query_async(conn).await?;
    if matches!(replies.first().cloned().map(Value::extract_error), Some(Err(e)) if is_noscript(&e))
    {
        script.load_cmd().query_async::<()>(conn).await?;
        replies = pipe.query_async(conn).await?;
    }
    let mut replies = replies.into_iter();
    let reply = replies
        .next()
        .ok_or_else(|| redis::RedisError::from((redis::ErrorKind::Client, "no script reply")))?;
    let reply: T = redis::from_redis_value(reply.extract_error()?)?;
    let acked = match replies.next() {
        Some(v) if counts(&reply) => Some(redis::from_redis_value(v.extract_error()?)?),
        _ => None,
    };
    Ok((reply, acked))
}

/// The error of a grant (or several, `grants`) that fewer replicas than
/// `ClientOptionsBuilder::synced_replicas` acknowledged in time, which the caller has given
/// back.
pub(crate) fn unacknowledged(
    address: &str,
    grants: bool,
    acked: usize,
    (wanted, within): (usize, std::time::Duration),
) -> slate_core::Error {
    let (what, them) = if grants {
        ("grants were", "them; they were")
    } else {
        ("grant was", "it; it was")
    };
    slate_core::Error::backend(
        slate_core::BackendKind::Unavailable,
        Some(address.to_owned()),
        format!(
            "the {what} acknowledged by {acked} of the {wanted} replicas required \
             (ClientOptionsBuilder::synced_replicas) within {within:?}, so a failover could lose \
             {them} given back. Check the replicas' health and links"
        ),
        None,
    )
}

/// The cluster hash slot of `key` (CRC16 of its hash tag, as Redis computes it).
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(crate::scripts::keys::hash_tag(key)) % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_the_redis_documentation() {
        // From the Redis Cluster specification's examples.
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        // An empty tag: the whole key is hashed.
        assert_ne!(slot_of(b"foo{}{bar}"), slot_of(b"bar"));
        // CRC16-XMODEM of "123456789" is 0x31C3 (the check value).
        assert_eq!(slot_of(b"123456789"), 0x31C3);
    }
}
