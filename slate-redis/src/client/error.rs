//! Classification of Redis and pool failures into Slate's [`Error`].
//!
//! Failures are classified by `redis::ErrorKind` (and, for server errors redis-rs does not know,
//! by the server's error *code*), never by message text. Messages never carry credentials: the
//! node is named by its sanitized address only.

use std::time::Duration;

use deadpool_redis::PoolError;
use redis::{ErrorKind, RedisError, ServerErrorKind};
use slate_core::{BackendKind, Error};

/// A command refused by ACL *inside a script* is answered with a plain `ERR` and one of these
/// texts by Redis 7.0 and by Valkey 8 (Redis 7.2 and later answer `NOPERM`); the one place a
/// failure is told by its message.
const SCRIPT_ACL_REFUSALS: [&str; 2] = [
    // Redis 7.0
    "The user executing the script can't",
    // Valkey 8 ("ACL failure in script: User u has no permissions to run the 'set' command")
    "ACL failure in script",
];

/// The kind of a Redis failure.
pub(crate) fn kind_of(e: &RedisError) -> BackendKind {
    if e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| SCRIPT_ACL_REFUSALS.iter().any(|r| d.contains(r)))
    {
        return BackendKind::Permission;
    }
    match e.kind() {
        ErrorKind::Io if e.is_timeout() => BackendKind::Timeout,
        ErrorKind::Io => BackendKind::Io,
        ErrorKind::AuthenticationFailed => BackendKind::Auth,
        ErrorKind::Server(ServerErrorKind::NoPerm) => BackendKind::Permission,
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::ReadOnly,
        ) => BackendKind::Unavailable,
        // During a Sentinel failover the Sentinels may name no master (or one that is not
        // master yet) for a moment.
        ErrorKind::MasterNameNotFoundBySentinel | ErrorKind::NoValidReplicasFoundBySentinel => {
            BackendKind::Unavailable
        }
        ErrorKind::Extension => match e.code() {
            Some("NOAUTH" | "WRONGPASS") => BackendKind::Auth,
            Some("BUSY" | "MISCONF" | "OOM") => BackendKind::Unavailable,
            _ => BackendKind::Response,
        },
        ErrorKind::Server(_)
        | ErrorKind::Parse
        | ErrorKind::UnexpectedReturnType
        | ErrorKind::RESP3NotSupported => BackendKind::Response,
        _ => BackendKind::Other,
    }
}

/// Whether the connection that produced `e` should be replaced.
///
/// `READONLY` counts: a server that answers it was demoted to a replica (a Sentinel failover),
/// and a Sentinel client must ask for the new master. (A cluster connection routes by slot and
/// follows the new master itself.)
pub(crate) fn breaks_connection(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Io
        || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
        || e.is_unrecoverable_error()
}

fn hint(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Auth => {
            "; check the password (and ACL user) in the URL or ClientOptionsBuilder::username/password"
        }
        BackendKind::Permission => {
            "; grant the ACL user EVALSHA, SCRIPT LOAD, PING, SUBSCRIBE, UNSUBSCRIBE, EXISTS, HGET, \
             PTTL, INFO, SET, HSET, HINCRBY, HMGET, HGETALL, DEL, PEXPIRE, GET, INCR, \
             INCRBY, PUBLISH, TIME, ZADD, ZREM, ZRANGE, HDEL, ZSCORE, ZCARD, ZRANGEBYSCORE, \
             ZREMRANGEBYSCORE on the lock keys and channels (for the \
             default prefix: ~slate:* &slate:*); the scripts run most of them (README: ACL); \
             on a cluster also SPUBLISH, SSUBSCRIBE, SUNSUBSCRIBE, CLUSTER SLOTS, COMMAND INFO; with \
             ClientOptionsBuilder::synced_replicas also WAIT; on Redis 7.2+ and Valkey, CLIENT \
             SETINFO keeps the connection handshake out of ACL LOG"
        }
        BackendKind::Io => {
            "; check that Redis runs at this address and is reachable (for a rediss:// URL, \
             also that the server speaks TLS and its certificate is trusted and names this host)"
        }
        _ => "",
    }
}

/// Wraps a Redis failure, naming the operation and the node.
pub(crate) fn from_redis(e: RedisError, what: &str, node: &str) -> Error {
    let kind = kind_of(&e);
    let topology = match e.kind() {
        ErrorKind::MasterNameNotFoundBySentinel => {
            "; during a failover this passes within seconds; if it lasts, check the master \
             name (the one in the Sentinels' `sentinel monitor <name> ...`)"
        }
        // A standalone client sent a key to a cluster node that does not own it.
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask) => {
            "; this server is a Redis Cluster node: open the client with \
             RedisClient::open_cluster (the slate command: --cluster URL)"
        }
        _ => "",
    };
    Error::backend(
        kind,
        Some(node.to_owned()),
        format!("{what} failed: {e}{}{topology}", hint(kind)),
        Some(Box::new(e)),
    )
}

/// A command that got no answer within the command timeout.
pub(crate) fn command_timeout(what: &str, node: &str, budget: Duration) -> Error {
    Error::backend(
        BackendKind::Timeout,
        Some(node.to_owned()),
        format!(
            "{what} got no reply within the command timeout of {budget:?}; the server may be \
             hung or unreachable (raise ClientOptionsBuilder::command_timeout if it is only slow)"
        ),
        None,
    )
}

/// Wraps a pool failure.
pub(crate) fn from_pool(e: PoolError, node: &str, budget: Duration) -> Error {
    match e {
        PoolError::Backend(e) => from_redis(e, "connecting", node),
        PoolError::Timeout(_) => command_timeout("taking a connection from the pool", node, budget),
        PoolError::Closed => Error::closed("the connection pool"),
        PoolError::NoRuntimeSpecified => Error::backend(
            BackendKind::Other,
            Some(node.to_owned()),
            "the pool has timeouts but no runtime; build it with Runtime::Tokio1",
            Some(Box::new(e)),
        ),
        PoolError::PostCreateHook(_) => Error::backend(
            BackendKind::Other,
            Some(node.to_owned()),
            format!("the pool's post-create hook failed: {e}"),
            None,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_redis_error_kinds() {
        let io: RedisError = std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
        assert_eq!(kind_of(&io), BackendKind::Io);
        assert!(breaks_connection(&io));
        let timeout: RedisError = std::io::Error::from(std::io::ErrorKind::TimedOut).into();
        assert_eq!(kind_of(&timeout), BackendKind::Timeout);
        let auth: RedisError = (ErrorKind::AuthenticationFailed, "nope").into();
        assert_eq!(kind_of(&auth), BackendKind::Auth);
        let perm: RedisError = (ErrorKind::Server(ServerErrorKind::NoPerm), "x").into();
        assert_eq!(kind_of(&perm), BackendKind::Permission);
        let in_script: RedisError = (
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "ERR",
            "The user executing the script can't run this command or subcommand script: x"
                .to_owned(),
        )
            .into();
        assert_eq!(
            kind_of(&in_script),
            BackendKind::Permission,
            "{in_script:?}"
        );
        let in_script_valkey: RedisError = (
            ErrorKind::Server(ServerErrorKind::ResponseError),
            "ERR",
            "ACL failure in script: User u has no permissions to run the 'set' command script: \
             ff96, on @user_script:1."
                .to_owned(),
        )
            .into();
        assert_eq!(
            kind_of(&in_script_valkey),
            BackendKind::Permission,
            "{in_script_valkey:?}"
        );
        let loading: RedisError = (ErrorKind::Server(ServerErrorKind::BusyLoading), "x").into();
        assert_eq!(kind_of(&loading), BackendKind::Unavailable);
        let resp: RedisError = (ErrorKind::UnexpectedReturnType, "x").into();
        assert_eq!(kind_of(&resp), BackendKind::Response);
        assert!(!breaks_connection(&resp));
    }

    #[test]
    fn messages_name_the_fix() {
        let auth: RedisError = (ErrorKind::AuthenticationFailed, "nope").into();
        let e = from_redis(auth, "connecting", "127.0.0.1:1");
        assert_eq!(e.backend_kind(), Some(BackendKind::Auth));
        assert!(e.to_string().contains("check the password"), "{e}");
    }
}
