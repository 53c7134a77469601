//! The real-Redis harness against real `redis-server` processes: start, faults, persistence,
//! auth, ACL, TLS.

use std::process::Command;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal;
use nix::unistd::Pid;
use redis::{Connection, RedisResult, Value};
use slate_harness::server::{Data, HarnessError, Persistence, RedisServer};

/// A TCP connection to `url` with `timeout` for connect, reads and writes.
fn connect(url: &str, timeout: Duration) -> RedisResult<Connection> {
    let con = redis::Client::open(url)?.get_connection_with_timeout(timeout)?;
    con.set_read_timeout(Some(timeout))?;
    con.set_write_timeout(Some(timeout))?;
    Ok(con)
}

fn ping(con: &mut Connection) -> RedisResult<String> {
    redis::cmd("PING").query(con)
}

fn get(server: &RedisServer, key: &str) -> Value {
    server.command(&["GET", key]).expect("GET")
}

fn pid_is_gone(pid: u32) -> bool {
    let pid = Pid::from_raw(i32::try_from(pid).expect("pid fits i32"));
    signal::kill(pid, None) == Err(Errno::ESRCH)
}

#[test]
fn start_answers_ping_over_tcp_and_the_admin_socket() {
    let server = RedisServer::start().expect("start");
    let mut con = connect(&server.url(), Duration::from_secs(2)).expect("connect");
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
    assert_eq!(
        server.command(&["PING"]).expect("PING"),
        Value::SimpleString("PONG".into())
    );
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert_eq!(server.addr().port(), server.port());
    assert!(server.log_path().starts_with(server.dir()));
    assert!(server.log_tail(50).contains("Ready to accept connections"));
    assert!(!server.run_id().expect("run_id").is_empty());
}

#[test]
fn two_servers_get_different_ports_and_drop_kills_the_process() {
    let a = RedisServer::start().expect("start a");
    let b = RedisServer::start().expect("start b");
    assert_ne!(a.port(), b.port());
    assert_ne!(a.pid(), b.pid());
    let (pid, dir) = (a.pid(), a.dir().to_path_buf());
    assert!(!pid_is_gone(pid));
    drop(a);
    assert!(pid_is_gone(pid), "redis-server {pid} survived Drop");
    assert!(!dir.exists(), "the temp dir survived Drop");
    drop(b);
}

#[test]
fn start_many_starts_independent_servers() {
    let nodes = RedisServer::start_many(3).expect("start_many");
    let mut ports: Vec<u16> = nodes.iter().map(RedisServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3);
    nodes[0].command(&["SET", "k", "0"]).expect("SET");
    assert_eq!(get(&nodes[1], "k"), Value::Nil, "servers share no data");
}

#[test]
fn paused_server_times_out_then_answers_after_resume() {
    let mut server = RedisServer::start().expect("start");
    let mut con = connect(&server.url(), Duration::from_millis(300)).expect("connect");
    server.pause().expect("pause");
    let started = Instant::now();
    let err = ping(&mut con).expect_err("a paused server must not answer");
    assert!(err.is_timeout(), "expected a timeout, got {err:?}");
    assert!(started.elapsed() >= Duration::from_millis(250));
    server.resume().expect("resume");
    let mut fresh = connect(&server.url(), Duration::from_secs(2)).expect("connect after resume");
    assert_eq!(ping(&mut fresh).expect("PING after resume"), "PONG");
}

#[test]
fn killed_server_refuses_and_restarts_empty_on_the_same_port() {
    let mut server = RedisServer::start().expect("start");
    let (port, old_pid, old_run_id) = (server.port(), server.pid(), server.run_id().expect("id"));
    server.command(&["SET", "k", "v"]).expect("SET");
    server.kill().expect("kill");
    assert!(!server.is_running());
    assert!(pid_is_gone(old_pid));
    let refused = std::net::TcpStream::connect(server.addr()).expect_err("must refuse");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
    assert!(matches!(
        server.pause(),
        Err(HarnessError::NotRunning { .. })
    ));

    server.restart(Data::Wipe).expect("restart");
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), old_pid);
    assert_ne!(server.run_id().expect("run_id"), old_run_id);
    let mut con = connect(&server.url(), Duration::from_secs(2)).expect("connect");
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
    assert_eq!(server.command(&["DBSIZE"]).expect("DBSIZE"), Value::Int(0));
}

#[test]
fn aof_keeps_acknowledged_writes_across_kill_and_restart() {
    let mut server = RedisServer::builder()
        .persistence(Persistence::Aof)
        .start()
        .expect("start");
    server.command(&["SET", "survivor", "yes"]).expect("SET");
    server.kill().expect("kill");
    server.restart(Data::Keep).expect("restart keep");
    assert_eq!(get(&server, "survivor"), Value::BulkString(b"yes".to_vec()));

    // Wipe on the same AOF server really empties it.
    server.restart(Data::Wipe).expect("restart wipe");
    assert_eq!(get(&server, "survivor"), Value::Nil);
}

#[test]
fn without_persistence_keep_still_comes_back_empty() {
    let mut server = RedisServer::start().expect("start");
    server.command(&["SET", "k", "v"]).expect("SET");
    server.kill().expect("kill");
    server.restart(Data::Keep).expect("restart");
    assert_eq!(get(&server, "k"), Value::Nil);
}

/// Runs `GET k` on a connection opened before the fault and returns how long it took.
fn timed_get(con: &mut Connection) -> Duration {
    let started = Instant::now();
    let _: Option<String> = redis::cmd("GET").arg("k").query(con).expect("GET");
    started.elapsed()
}

#[test]
fn debug_sleep_blocks_the_server() {
    let server = RedisServer::start().expect("start");
    let mut con = connect(&server.url(), Duration::from_secs(5)).expect("connect");
    let baseline = timed_get(&mut con);
    assert!(
        baseline < Duration::from_millis(200),
        "baseline {baseline:?}"
    );
    server
        .debug_sleep(Duration::from_millis(600))
        .expect("debug_sleep");
    let elapsed = timed_get(&mut con);
    assert!(
        elapsed >= Duration::from_millis(450),
        "DEBUG SLEEP 600ms, GET took {elapsed:?}"
    );
    assert!(elapsed < Duration::from_secs(4), "GET took {elapsed:?}");
}

#[test]
fn debug_sleep_needs_the_debug_command() {
    let server = RedisServer::builder()
        .enable_debug_command(false)
        .start()
        .expect("start");
    assert!(matches!(
        server.debug_sleep(Duration::from_millis(10)),
        Err(HarnessError::Config(_))
    ));
    let err = server
        .command(&["DEBUG", "SLEEP", "0"])
        .expect_err("DEBUG is disabled");
    assert!(err.to_string().contains("DEBUG"), "{err}");
}

#[test]
fn client_pause_delays_commands() {
    let server = RedisServer::start().expect("start");
    let mut con = connect(&server.url(), Duration::from_secs(5)).expect("connect");
    server
        .client_pause(Duration::from_millis(600))
        .expect("CLIENT PAUSE");
    let elapsed = timed_get(&mut con);
    assert!(
        elapsed >= Duration::from_millis(450),
        "CLIENT PAUSE 600ms, GET took {elapsed:?}"
    );
    assert!(elapsed < Duration::from_secs(4), "GET took {elapsed:?}");
}

#[test]
fn password_is_required() {
    let server = RedisServer::builder()
        .password("s3cret pass")
        .start()
        .expect("start");
    let plain = format!("redis://127.0.0.1:{}", server.port());
    let mut anonymous = connect(&plain, Duration::from_secs(2)).expect("connect");
    let err = ping(&mut anonymous).expect_err("no auth");
    assert_eq!(err.code(), Some("NOAUTH"), "{err:?}");
    let mut authed = connect(&server.url(), Duration::from_secs(2)).expect("connect with url()");
    assert_eq!(ping(&mut authed).expect("PING"), "PONG");
    assert_eq!(
        server.command(&["PING"]).expect("admin PING"),
        Value::SimpleString("PONG".into())
    );
    let wrong = connect(
        &server.url_for_user("default", "wrong"),
        Duration::from_secs(2),
    );
    assert!(wrong.is_err(), "a wrong password must fail the handshake");
}

#[test]
fn acl_user_is_limited_to_its_keys() {
    let server = RedisServer::builder()
        .password("admin")
        .acl_user("worker", "w0rker", "~slate:* &slate:* +@all -@dangerous")
        .start()
        .expect("start");
    let mut con = connect(
        &server.url_for_user("worker", "w0rker"),
        Duration::from_secs(2),
    )
    .expect("login");
    let _: () = redis::cmd("SET")
        .arg("slate:lock")
        .arg("1")
        .query(&mut con)
        .expect("own key");
    let err = redis::cmd("SET")
        .arg("other:key")
        .arg("1")
        .query::<()>(&mut con)
        .expect_err("foreign key");
    assert_eq!(err.code(), Some("NOPERM"), "{err:?}");
    let err = redis::cmd("FLUSHALL")
        .query::<()>(&mut con)
        .expect_err("dangerous command");
    assert_eq!(err.code(), Some("NOPERM"), "{err:?}");
    assert_eq!(get(&server, "other:key"), Value::Nil);
}

fn redis_cli(args: &[&str]) -> std::process::Output {
    Command::new("redis-cli")
        .args(args)
        .output()
        .expect("redis-cli (package redis-tools, installed with redis-server) must be runnable")
}

#[test]
fn tls_server_serves_clients_that_trust_its_ca() {
    let server = RedisServer::builder()
        .tls(true)
        .password("pw")
        .start()
        .expect("start TLS");
    assert!(server.url().starts_with("rediss://:pw@127.0.0.1:"));
    let ca = server
        .ca_cert_path()
        .expect("CA path")
        .to_str()
        .expect("utf-8 path")
        .to_owned();
    let port = server.port().to_string();
    let common = [
        "-h",
        "127.0.0.1",
        "-p",
        &port,
        "--no-auth-warning",
        "-a",
        "pw",
    ];

    let trusted = redis_cli(&[&["--tls", "--cacert", &ca][..], &common[..], &["PING"]].concat());
    assert_eq!(
        String::from_utf8_lossy(&trusted.stdout).trim(),
        "PONG",
        "{trusted:?}"
    );

    let untrusted = redis_cli(&[&["--tls"][..], &common[..], &["PING"]].concat());
    assert_ne!(
        String::from_utf8_lossy(&untrusted.stdout).trim(),
        "PONG",
        "a client without the test CA must not verify the server"
    );

    let plain = format!("redis://:pw@127.0.0.1:{port}");
    let plain_result =
        connect(&plain, Duration::from_millis(500)).and_then(|mut con| ping(&mut con));
    assert!(
        plain_result.is_err(),
        "plain RESP on the TLS port: {plain_result:?}"
    );

    // The admin socket still works with TLS on.
    assert_eq!(
        server.command(&["PING"]).expect("admin"),
        Value::SimpleString("PONG".into())
    );
}

#[test]
fn a_missing_binary_fails_with_the_install_hint() {
    let err = RedisServer::builder()
        .binary("/nonexistent/redis-server")
        .start()
        .expect_err("no binary");
    assert!(matches!(err, HarnessError::BinaryNotFound { .. }));
    let message = err.to_string();
    let kind = slate_harness::server::ServerKind::from_env().unwrap();
    assert!(message.contains(kind.install_hint()), "{message}");
    if kind == slate_harness::server::ServerKind::Redis {
        assert!(
            message.contains("apt-get install -y redis-server"),
            "{message}"
        );
    }
    assert!(message.contains("SLATE_REDIS_SERVER"), "{message}");
}

/// The server the harness started is the one `SLATE_SERVER` asked for, and the server itself
/// agrees with what `--version` said (so a scenario that asks "which server is this" gets the
/// truth).
#[test]
fn the_server_is_the_chosen_kind_and_says_so() {
    use slate_harness::server::ServerKind;
    let server = RedisServer::start().expect("server");
    let v = server.version();
    assert_eq!(v.kind, ServerKind::from_env().unwrap());
    let field = |name: &str| server.info_field("server", name).expect("INFO");
    match v.kind {
        ServerKind::Valkey => {
            assert_eq!(field("server_name").as_deref(), Some("valkey"));
            assert_eq!(
                field("valkey_version"),
                Some(format!("{}.{}.{}", v.major, v.minor, v.patch))
            );
            assert!(v.at_least(8, 0), "Valkey 8+ is supported, not {v}");
        }
        ServerKind::Redis => {
            assert_eq!(
                field("redis_version"),
                Some(format!("{}.{}.{}", v.major, v.minor, v.patch))
            );
            assert!(v.at_least(7, 0), "Redis 7.0+ is supported, not {v}");
        }
    }
}

#[test]
fn a_broken_config_fails_with_the_log_tail() {
    let err = RedisServer::builder()
        .arg("no-such-directive", "1")
        .start()
        .expect_err("bad config");
    let message = err.to_string();
    assert!(matches!(err, HarnessError::StartFailed { .. }), "{message}");
    assert!(message.contains("no-such-directive"), "{message}");
}

#[test]
fn harness_types_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync + 'static>() {}
    assert_send_sync::<RedisServer>();
    assert_send_sync::<HarnessError>();
    assert_send_sync::<slate_harness::proxy::FaultProxy>();
    assert_send_sync::<slate_harness::workers::WorkerSet>();
}
