//! Every `FaultProxy` mode, observed by a real Redis client going through the proxy to a real
//! `redis-server`.

use std::io::ErrorKind;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use redis::{Connection, RedisResult, Value};
use slate_harness::proxy::{FaultProxy, Mode};
use slate_harness::server::RedisServer;

const SHORT: Duration = Duration::from_millis(300);

fn setup() -> (RedisServer, FaultProxy) {
    let server = RedisServer::start().expect("start redis");
    let proxy = FaultProxy::start(server.addr()).expect("start proxy");
    (server, proxy)
}

/// Connects through the proxy (in a forwarding mode) with `timeout` on every operation.
fn connect(proxy: &FaultProxy, timeout: Duration) -> Connection {
    let con = redis::Client::open(proxy.url())
        .and_then(|client| client.get_connection_with_timeout(timeout))
        .expect("connect through the proxy");
    con.set_read_timeout(Some(timeout)).expect("read timeout");
    con.set_write_timeout(Some(timeout)).expect("write timeout");
    con
}

fn set(con: &mut Connection, key: &str) -> RedisResult<()> {
    redis::cmd("SET").arg(key).arg("v").query(con)
}

fn ping(con: &mut Connection) -> RedisResult<String> {
    redis::cmd("PING").query(con)
}

/// Polls the server directly (not through the proxy) until `key` exists, bounded.
fn wait_for_key(server: &RedisServer, key: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if server.command(&["EXISTS", key]).expect("EXISTS") == Value::Int(1) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn pass_forwards_both_ways_and_counts() {
    let (server, proxy) = setup();
    assert_ne!(proxy.port(), server.port());
    assert_eq!(proxy.upstream(), server.addr());
    let mut con = connect(&proxy, Duration::from_secs(2));
    set(&mut con, "k").expect("SET through the proxy");
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
    assert_eq!(
        server.command(&["GET", "k"]).expect("GET"),
        Value::BulkString(b"v".to_vec())
    );
    assert_eq!(proxy.connections_accepted(), 1);
    assert_eq!(proxy.open_connections(), 1);
    assert!(proxy.bytes_to_server() > 0);
    assert!(proxy.bytes_to_client() > 0);
}

#[test]
fn delay_adds_at_least_the_delay_in_each_direction() {
    let (_server, proxy) = setup();
    let mut con = connect(&proxy, Duration::from_secs(5));
    proxy
        .set_mode(Mode::Delay {
            to_server: Duration::from_millis(200),
            to_client: Duration::from_millis(150),
        })
        .expect("set delay");
    let started = Instant::now();
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(350),
        "round trip took {elapsed:?}"
    );
    assert!(
        elapsed < Duration::from_secs(3),
        "round trip took {elapsed:?}"
    );

    proxy.set_mode(Mode::Pass).expect("set pass");
    let started = Instant::now();
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
    assert!(
        started.elapsed() < Duration::from_millis(300),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn drop_replies_runs_the_command_but_the_client_times_out() {
    let (server, proxy) = setup();
    let mut con = connect(&proxy, SHORT);
    proxy.set_mode(Mode::DropReplies).expect("set drop-replies");
    let sent_before = proxy.bytes_to_client();
    let err = set(&mut con, "lost-reply").expect_err("the reply is dropped");
    assert!(err.is_timeout(), "{err:?}");
    assert!(
        wait_for_key(&server, "lost-reply", Duration::from_secs(2)),
        "SET never ran"
    );
    assert_eq!(
        proxy.bytes_to_client(),
        sent_before,
        "a reply leaked through"
    );
}

#[test]
fn blackhole_holds_everything_until_the_mode_changes() {
    let (server, proxy) = setup();
    let mut con = connect(&proxy, SHORT);
    proxy.set_mode(Mode::Blackhole).expect("set blackhole");
    let err = set(&mut con, "held").expect_err("nothing gets through");
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(
        server.command(&["EXISTS", "held"]).expect("EXISTS"),
        Value::Int(0)
    );
    assert_eq!(proxy.open_connections(), 1, "the socket is held open");

    // New connections are accepted but get nothing either.
    let started = Instant::now();
    let fresh = redis::Client::open(proxy.url())
        .and_then(|client| client.get_connection_with_timeout(SHORT))
        .and_then(|mut con| ping(&mut con));
    assert!(fresh.is_err(), "{fresh:?}");
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert_eq!(
        server.command(&["EXISTS", "held"]).expect("EXISTS"),
        Value::Int(0)
    );

    // Held, not lost: like TCP after a healed partition, the request arrives afterwards.
    proxy.set_mode(Mode::Pass).expect("set pass");
    assert!(
        wait_for_key(&server, "held", Duration::from_secs(2)),
        "held bytes were lost"
    );
}

/// A command on `con` fails quickly with a connection error (not a timeout).
fn assert_connection_error(con: &mut Connection) {
    let started = Instant::now();
    let err = ping(con).expect_err("the connection was reset");
    assert!(
        !err.is_timeout(),
        "expected a connection error, got a timeout: {err:?}"
    );
    assert!(started.elapsed() < SHORT, "{:?}", started.elapsed());
}

#[test]
fn reset_closes_open_and_new_connections() {
    let (_server, proxy) = setup();
    let mut con = connect(&proxy, Duration::from_secs(2));
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
    proxy.set_mode(Mode::Reset).expect("set reset");
    assert_eq!(proxy.open_connections(), 0);
    assert_connection_error(&mut con);

    let fresh = redis::Client::open(proxy.url())
        .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(2)))
        .and_then(|mut con| ping(&mut con));
    let err = fresh.expect_err("new connections are reset too");
    assert!(!err.is_timeout(), "{err:?}");

    proxy.set_mode(Mode::Pass).expect("set pass");
    let mut again = connect(&proxy, Duration::from_secs(2));
    assert_eq!(ping(&mut again).expect("PING after reset"), "PONG");
}

#[test]
fn reset_all_closes_current_connections_only() {
    let (_server, proxy) = setup();
    let mut con = connect(&proxy, Duration::from_secs(2));
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
    proxy.reset_all().expect("reset_all");
    assert_connection_error(&mut con);
    assert_eq!(proxy.mode(), Mode::Pass);
    let mut fresh = connect(&proxy, Duration::from_secs(2));
    assert_eq!(ping(&mut fresh).expect("PING"), "PONG");
}

fn echo(con: &mut Connection, what: &str) -> RedisResult<String> {
    redis::cmd("ECHO").arg(what).query(con)
}

#[test]
fn a_marked_connection_alone_gets_its_own_mode_and_the_mark_is_taken_once() {
    let (server, proxy) = setup();
    assert!(
        proxy.mark_next_sending(b"").is_err(),
        "an empty pattern is refused"
    );
    let mut plain = connect(&proxy, SHORT);
    let mut marked = connect(&proxy, SHORT);
    proxy.mark_next_sending(b"single-me-out").expect("arm");
    assert_eq!(
        echo(&mut plain, "nothing special").expect("ECHO"),
        "nothing special"
    );
    assert_eq!(proxy.marks_taken(), 0);
    assert_eq!(
        echo(&mut marked, "single-me-out").expect("ECHO"),
        "single-me-out"
    );
    assert_eq!(proxy.marks_taken(), 1);

    // Blackhole the marked connection only: its request is held, the other flows.
    proxy
        .set_marked_mode(Some(Mode::Blackhole))
        .expect("blackhole marked");
    let err = set(&mut marked, "held").expect_err("held");
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(ping(&mut plain).expect("PING"), "PONG");
    // One-shot: a later connection sending the pattern is not marked.
    let mut later = connect(&proxy, SHORT);
    assert_eq!(
        echo(&mut later, "single-me-out").expect("ECHO"),
        "single-me-out"
    );
    assert_eq!(proxy.marks_taken(), 1);
    // Back to the proxy's mode: the held request arrives.
    proxy.set_marked_mode(None).expect("follow the proxy");
    assert!(
        wait_for_key(&server, "held", Duration::from_secs(2)),
        "held bytes lost"
    );

    // A mode armed before the mark is taken applies from the chunk that takes it.
    // Arming unmarks the connection marked before: it is not reset.
    proxy.mark_next_sending(b"reset-me").expect("arm");
    proxy
        .set_marked_mode(Some(Mode::Reset))
        .expect("reset marked");
    assert_eq!(echo(&mut marked, "unmarked").expect("ECHO"), "unmarked");
    let err = echo(&mut plain, "reset-me").expect_err("reset before forwarding");
    assert!(!err.is_timeout(), "{err:?}");
    assert_eq!(echo(&mut later, "still here").expect("ECHO"), "still here");
}

#[test]
fn refuse_stops_listening_until_the_mode_changes() {
    let (_server, proxy) = setup();
    let mut con = connect(&proxy, Duration::from_secs(2));
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
    proxy.set_mode(Mode::Refuse).expect("set refuse");
    let refused = TcpStream::connect(proxy.addr()).expect_err("connect must be refused");
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);
    assert_connection_error(&mut con);

    proxy.set_mode(Mode::Pass).expect("set pass");
    let mut again = connect(&proxy, Duration::from_secs(2));
    assert_eq!(ping(&mut again).expect("PING after refuse"), "PONG");
}

#[test]
fn an_unreachable_upstream_resets_the_client() {
    let (mut server, proxy) = setup();
    server.kill().expect("kill redis");
    let result = redis::Client::open(proxy.url())
        .and_then(|client| client.get_connection_with_timeout(Duration::from_secs(2)))
        .and_then(|mut con| ping(&mut con));
    let err = result.expect_err("upstream is down");
    assert!(!err.is_timeout(), "{err:?}");
}

#[test]
fn drop_stops_the_proxy() {
    let (_server, proxy) = setup();
    let mut con = connect(&proxy, Duration::from_secs(2));
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
    let addr = proxy.addr();
    drop(proxy);
    let refused = TcpStream::connect(addr).expect_err("the port is closed");
    assert_eq!(refused.kind(), ErrorKind::ConnectionRefused);
    assert!(
        ping(&mut con).is_err(),
        "open connections close with the proxy"
    );
}

/// The proxy has its own thread and runtime: a test runtime whose only thread is blocked in a
/// synchronous client still gets its replies, and dropping the proxy inside it is fine.
#[tokio::test(flavor = "current_thread")]
async fn works_from_a_blocked_tokio_test() {
    let (server, proxy) = setup();
    let mut con = connect(&proxy, Duration::from_secs(2));
    set(&mut con, "from-async").expect("SET");
    assert_eq!(
        server.command(&["EXISTS", "from-async"]).expect("EXISTS"),
        Value::Int(1)
    );
    drop(proxy);
}
