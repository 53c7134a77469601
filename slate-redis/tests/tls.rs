//! `rediss://` through the `tls` feature (run with `--features tls`).

#![cfg(feature = "tls")]
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use slate_harness::server::RedisServer;
use slate_redis::{ClientOptions, RedisClient, SingleLock};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_over_tls() {
    let server = RedisServer::builder().tls(true).start().unwrap();
    assert!(server.url().starts_with("rediss://"));
    let pem = std::fs::read(server.ca_cert_path().unwrap()).unwrap();
    let client = RedisClient::open_with(
        server.url(),
        ClientOptions::builder()
            .tls_root_certificate(pem)
            .build()
            .unwrap(),
    )
    .unwrap();
    client.ping().await.unwrap();
    let lock = SingleLock::builder(&client, "tls")
        .lease(Duration::from_secs(5))
        .build()
        .unwrap();
    let g = lock.lock().await.unwrap();
    assert!(g.fencing_token().get() >= 1);
    assert_eq!(g.unlock().await.unwrap(), 0);
    assert_eq!(
        keys_but_records(&server, 2 * DEFAULT_COMMAND_TIMEOUT),
        [fence_key("tls")]
    );

    // Without trusting the test CA the handshake fails, as a connection error.
    let untrusted = RedisClient::open(server.url()).unwrap();
    let err = untrusted.ping().await.unwrap_err();
    assert!(err.is_backend(), "{err}");
}
