//! ZooKeeper failures classified into Slate's error kinds.

use slate_core::{BackendKind, Error};
use zookeeper_client as zk;

/// Whether a request that failed may be asked again as it is: the connection was lost before
/// its answer (ZooKeeper's `ConnectionLoss`, or the error that broke the connection, which the
/// client hands to every request in flight).
pub(crate) fn lost_connection(e: &zk::Error) -> bool {
    matches!(e, zk::Error::ConnectionLoss | zk::Error::Custom(_))
}

/// Classifies a ZooKeeper error by its kind (never by its text) and names the servers.
pub(crate) fn from_zk(e: zk::Error, servers: &str, what: &str) -> Error {
    use zk::Error as Z;
    let kind = match &e {
        Z::ConnectionLoss | Z::NoHosts | Z::SessionMoved => BackendKind::Io,
        // The client fails every request in flight with the error that broke its connection
        // (an idle server, a reset, an I/O error): a connection loss under another name.
        Z::Custom(_) => BackendKind::Io,
        // A session that expired is replaced by a new one on the next call.
        Z::SessionExpired => BackendKind::Io,
        Z::Timeout => BackendKind::Timeout,
        Z::AuthFailed => BackendKind::Auth,
        Z::NoAuth | Z::InvalidAcl => BackendKind::Permission,
        Z::NotReadOnly | Z::Throttled | Z::QuotaExceeded => BackendKind::Unavailable,
        Z::MarshallingError | Z::UnexpectedError(_) | Z::UnexpectedErrorCode(_) => {
            BackendKind::Response
        }
        _ => BackendKind::Other,
    };
    let hint = match kind {
        BackendKind::Permission => {
            "; the client's identity may not touch this znode: connect with the digest \
             credentials the lock root was created with (ZkClientBuilder::digest), or ask the \
             operator to grant them"
        }
        BackendKind::Auth => "; check the digest user and password (ZkClientBuilder::digest)",
        _ => "",
    };
    Error::backend(
        kind,
        Some(servers.to_owned()),
        format!("ZooKeeper {what} failed: {e}{hint}"),
        Some(Box::new(e)),
    )
}

/// An operation that got no answer within the client's operation timeout.
pub(crate) fn op_timeout(servers: &str, what: &str, after: std::time::Duration) -> Error {
    Error::backend(
        BackendKind::Timeout,
        Some(servers.to_owned()),
        format!(
            "ZooKeeper {what} got no answer within {after:?}; the ensemble may have lost its \
             quorum or be unreachable (raise ZkClientBuilder::operation_timeout if it is only slow)"
        ),
        None,
    )
}
