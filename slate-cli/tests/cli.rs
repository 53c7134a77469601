//! The `slate` binary against real `redis-server` processes started by the harness.
//!
//! Every wait is on a condition with a deadline; nothing asserts speed.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;
use slate_cli::local::LocalServer;
use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};
use slate_redis::{RedisClient, SingleLock};

const SLATE: &str = env!("CARGO_BIN_EXE_slate");
/// Upper bound of any one wait in these tests (never a speed assertion).
const PATIENCE: Duration = Duration::from_secs(30);

/// A `slate` command with a clean environment (no `SLATE_REDIS_URL` from the caller).
fn slate(args: &[&str]) -> Command {
    let mut c = Command::new(SLATE);
    c.args(args).env_remove("SLATE_REDIS_URL");
    c
}

fn output(args: &[&str]) -> Output {
    slate(args).output().expect("slate runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Marks fresh servers as adopted (the node marker, stamped by each server) with
/// `NodeSet::adopt_fresh_servers`, so combination locks use them at once.
fn adopt(servers: &[LocalServer]) {
    let urls: Vec<String> = servers.iter().map(LocalServer::url).collect();
    runtime().block_on(async {
        let nodes = slate_combination::NodeSet::connect(urls, Default::default()).expect("nodes");
        let marked = nodes.adopt_fresh_servers("slate:").await.expect("adopt");
        assert_eq!(marked, servers.len(), "every server adopted");
    });
}

/// Sends every line of `r` to a channel, from a thread.
fn lines_of(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits (bounded) for a line matching `pred`.
fn wait_line(rx: &mpsc::Receiver<String>, pred: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if pred(&l) => return l,
            Ok(_) => {}
            Err(e) => panic!("no matching line from slate: {e}"),
        }
    }
}

/// A running `slate` whose stdout and stderr lines arrive on channels.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    err_lines: mpsc::Receiver<String>,
    err_seen: std::cell::RefCell<Vec<String>>,
}

impl Running {
    fn start(args: &[&str]) -> Self {
        let mut child = slate(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn slate");
        let lines = lines_of(child.stdout.take().expect("stdout"));
        let err_lines = lines_of(child.stderr.take().expect("stderr"));
        Running {
            child,
            lines,
            err_lines,
            err_seen: std::cell::RefCell::new(Vec::new()),
        }
    }

    fn line(&self, pred: impl Fn(&str) -> bool) -> String {
        wait_line(&self.lines, pred)
    }

    fn err_line(&self, pred: impl Fn(&str) -> bool) -> String {
        wait_line(&self.err_lines, |l| {
            self.err_seen.borrow_mut().push(l.to_owned());
            pred(l)
        })
    }

    /// Stderr read so far plus whatever arrives until the pipe closes (bounded).
    fn stderr_rest(&self) -> String {
        let deadline = Instant::now() + PATIENCE;
        let mut seen = self.err_seen.borrow_mut();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.err_lines.recv_timeout(left) {
                Ok(l) => seen.push(l),
                Err(_) => break,
            }
        }
        seen.iter().map(|l| format!("{l}\n")).collect()
    }

    /// The PIDs of the command's `n` processes, each printed as a `tree PID` line.
    fn tree_pids(&self, n: usize) -> Vec<i32> {
        (0..n)
            .map(|_| {
                self.line(|l| l.starts_with("tree "))
                    .trim_start_matches("tree ")
                    .parse()
                    .expect("pid")
            })
            .collect()
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("pid"))
    }

    /// Waits (bounded) for the exit; returns (code, stderr).
    fn finish(mut self) -> (Option<i32>, String) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return (status.code(), self.stderr_rest());
            }
            if Instant::now() > deadline {
                self.child.kill().ok();
                self.child.wait().ok();
                let err = self.stderr_rest();
                panic!("slate did not exit within {PATIENCE:?}; its stderr:\n{err}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Only our own child, only while not reaped (kill() on a reaped child is an error).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn process_exists(pid: i32) -> bool {
    signal::kill(Pid::from_raw(pid), None).is_ok()
}

fn status_json(urls: &[&str], name: &str) -> serde_json::Value {
    let mut args = vec!["status", name, "--json"];
    for u in urls {
        args.extend(["--redis", u]);
    }
    let out = output(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("status --json is JSON")
}

#[test]
fn exit_code_of_the_command_passes_through() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let run = |cmd: &[&str]| {
        let mut args = vec!["run", "--lock", "pass", "--redis", &url, "--"];
        args.extend(cmd);
        output(&args)
    };
    assert_eq!(run(&["sh", "-c", "exit 7"]).status.code(), Some(7));
    assert_eq!(run(&["true"]).status.code(), Some(0));
    let out = run(&["sh", "-c", "echo out; echo err >&2"]);
    assert_eq!(text(&out.stdout), "out\n");
    assert_eq!(text(&out.stderr), "err\n");
    // Died of a signal: 128 + N.
    assert_eq!(
        run(&["sh", "-c", "kill -TERM $$"]).status.code(),
        Some(128 + 15)
    );
    let out = run(&["/nonexistent/slate-test-cmd"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(text(&out.stderr).contains("command not found"));
    // The environment names the lock and carries the fencing token.
    let out = run(&["sh", "-c", "echo $SLATE_LOCK $SLATE_FENCING_TOKEN"]);
    let env = text(&out.stdout);
    let mut it = env.split_whitespace();
    assert_eq!(it.next(), Some("pass"));
    assert!(
        it.next().and_then(|t| t.parse::<u64>().ok()).is_some(),
        "{env}"
    );
    // Every run released the lock.
    assert_eq!(status_json(&[&url], "pass")["held"], false);
}

#[test]
fn wait_timeout_exits_75_with_a_reason() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let rt = runtime();
    let guard = rt.block_on(async {
        let client = RedisClient::open(&url).expect("client");
        let lock = SingleLock::builder(&client, "busy").build().expect("lock");
        lock.lock().await.expect("held by the test")
    });
    for wait in ["300ms", "0s"] {
        let started = Instant::now();
        let out = output(&[
            "run", "--lock", "busy", "--redis", &url, "--wait", wait, "--", "sh", "-c", "echo ran",
        ]);
        assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
        assert!(out.stdout.is_empty(), "the command must not run");
        let err = text(&out.stderr);
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            err.contains(&format!("not acquired within {wait}"))
                && err.contains("held by another holder"),
            "{err}"
        );
        if wait == "300ms" {
            assert!(started.elapsed() >= Duration::from_millis(300), "waited");
        }
    }
    rt.block_on(guard.unlock()).expect("unlock");
}

/// Three `slate run` at a time append `start`/`end` lines (pid, monotonic-ish ns) to one file;
/// the lines must alternate start/end of the same run, and the intervals must not overlap.
fn no_overlap_rounds(urls: &[String], dir: &Path, rounds: usize) {
    let log = dir.join("log");
    let script = format!(
        "echo \"start $$ $(date +%s%N)\" >> {log}; sleep 0.05; echo \"end $$ $(date +%s%N)\" >> {log}",
        log = log.display()
    );
    for _ in 0..rounds {
        let runs: Vec<Running> = (0..3)
            .map(|_| {
                let mut args = vec!["run", "--lock", "shared", "--wait", "forever"];
                for u in urls {
                    args.extend(["--redis", u.as_str()]);
                }
                args.extend(["--", "sh", "-c", &script]);
                Running::start(&args)
            })
            .collect();
        for r in runs {
            let (code, err) = r.finish();
            assert_eq!(code, Some(0), "{err}");
        }
    }
    let content = std::fs::read_to_string(&log).expect("log");
    let lines: Vec<Vec<&str>> = content.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(lines.len(), rounds * 3 * 2, "{content}");
    let mut last_end = 0u128;
    for pair in lines.chunks(2) {
        let (s, e) = (&pair[0], &pair[1]);
        assert_eq!((s[0], e[0]), ("start", "end"), "interleaved:\n{content}");
        assert_eq!(
            s[1], e[1],
            "another run started inside this one:\n{content}"
        );
        let (ts, te): (u128, u128) = (s[2].parse().expect("ns"), e[2].parse().expect("ns"));
        assert!(
            ts >= last_end && te >= ts,
            "overlapping intervals:\n{content}"
        );
        last_end = te;
    }
}

#[test]
fn concurrent_runs_never_overlap_single_lock() {
    let server = LocalServer::start().expect("redis-server");
    let dir = tempfile::tempdir().expect("tempdir");
    no_overlap_rounds(&[server.url()], dir.path(), 3);
}

#[test]
fn concurrent_runs_never_overlap_combination_lock() {
    let servers = LocalServer::start_many(3).expect("redis-servers");
    adopt(&servers);
    let urls: Vec<String> = servers.iter().map(LocalServer::url).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    no_overlap_rounds(&urls, dir.path(), 3);
}

#[test]
fn lease_loss_kills_the_command() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    // The entry is deleted while the command runs: renewal finds it gone.
    let run = Running::start(&[
        "run",
        "--lock",
        "lossy",
        "--redis",
        &url,
        "--lease",
        "1s",
        "--on-lost",
        "kill",
        "--",
        "sh",
        "-c",
        "echo $$; exec sleep 60",
    ]);
    let pid: i32 = run.line(|_| true).trim().parse().expect("pid line");
    assert!(process_exists(pid));
    server.command(&["DEL", "slate:{lossy}"]).expect("DEL");
    let (code, err) = run.finish();
    assert_eq!(code, Some(76), "{err}");
    assert!(
        err.contains("lease on lock \"lossy\" lost") && err.contains("SIGKILL"),
        "{err}"
    );
    assert!(!process_exists(pid), "the command still runs");
}

#[test]
fn lease_loss_with_on_lost_ignore_warns_and_lets_the_command_finish() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let dir = tempfile::tempdir().expect("tempdir");
    let go = dir.path().join("go");
    // The command runs until the test creates the file (bounded to 30 s), then exits 3.
    let script = format!(
        "echo ready; i=0; while [ ! -e {go} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; exit 3",
        go = go.display()
    );
    let run = Running::start(&[
        "run",
        "--lock",
        "ignored",
        "--redis",
        &url,
        "--lease",
        "1s",
        "--on-lost",
        "ignore",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    run.line(|l| l == "ready");
    server.command(&["DEL", "slate:{ignored}"]).expect("DEL");
    let warning = run.err_line(|l| l.contains("lost"));
    assert!(
        warning.contains("WARNING") && warning.contains("keeps running"),
        "{warning}"
    );
    std::fs::write(&go, b"").expect("go");
    let (code, err) = run.finish();
    assert_eq!(code, Some(3), "{err}");
}

#[test]
fn demo_without_redis_server_says_how_to_get_one() {
    let out = slate(&["demo", "--duration", "5s"])
        .env("SLATE_REDIS_SERVER", "/nonexistent/redis-server")
        .output()
        .expect("slate");
    assert_eq!(out.status.code(), Some(69));
    let err = text(&out.stderr);
    assert!(
        err.contains("apt-get install -y redis-server") && err.contains("docker/compose.yml"),
        "{err}"
    );
}

#[test]
fn lease_loss_on_a_hung_server_terminates_the_command() {
    let mut server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let run = Running::start(&[
        "run",
        "--lock",
        "hung",
        "--redis",
        &url,
        "--lease",
        "1s",
        "--on-lost",
        "term",
        "--",
        "sh",
        "-c",
        "trap 'kill $!; exit 42' TERM; echo ready; sleep 60 & wait",
    ]);
    run.line(|l| l == "ready");
    // SIGSTOP: no renewal can succeed before the deadline.
    server.pause().expect("pause");
    let (code, err) = run.finish();
    server.resume().expect("resume");
    assert_eq!(code, Some(76), "{err}");
    assert!(err.contains("lost") && err.contains("SIGTERM"), "{err}");
}

#[test]
fn sigterm_is_forwarded_and_the_lock_released() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let run = Running::start(&[
        "run",
        "--lock",
        "fwd",
        "--redis",
        &url,
        "--",
        "sh",
        "-c",
        "trap 'kill $!; exit 42' TERM; echo ready; sleep 60 & wait",
    ]);
    run.line(|l| l == "ready");
    assert_eq!(status_json(&[&url], "fwd")["held"], true);
    signal::kill(run.pid(), Signal::SIGTERM).expect("SIGTERM to our slate");
    let (code, err) = run.finish();
    assert_eq!(code, Some(42), "{err}");
    assert_eq!(status_json(&[&url], "fwd")["held"], false);
}

#[test]
fn status_json_matches_the_lock_state() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let rt = runtime();
    let (outer, inner) = rt.block_on(async {
        let client = RedisClient::open(&url).expect("client");
        let lock = SingleLock::builder(&client, "inspect")
            .build()
            .expect("lock");
        let outer = lock.lock().await.expect("lock");
        let inner = outer.reenter().await.expect("reenter");
        (outer, inner)
    });
    let v = status_json(&[&url], "inspect");
    assert_eq!(v["lock"], "inspect");
    assert_eq!(v["kind"], "single");
    assert_eq!(v["quorum"], 1);
    assert_eq!(v["held"], true);
    let holder = outer.holder().to_string();
    assert_eq!(v["holder"], holder.as_str());
    let node = &v["nodes"][0];
    assert_eq!(node["ok"], true);
    assert_eq!(node["address"], server.addr().to_string());
    assert_eq!(node["holders"][0]["holder"], holder.as_str());
    assert_eq!(node["holders"][0]["count"], 2);
    assert_eq!(node["fence"], outer.fencing_token().get());
    let ttl = node["ttl_ms"].as_u64().expect("ttl_ms");
    assert!(ttl > 0 && ttl <= 30_000, "{ttl}");
    // The human table names the holder too.
    let table = text(&output(&["status", "inspect", "--redis", &url]).stdout);
    assert!(
        table.contains(&holder) && table.contains("held by"),
        "{table}"
    );
    let fence = outer.fencing_token().get();
    rt.block_on(async {
        inner.unlock().await.expect("unlock inner");
        outer.unlock().await.expect("unlock outer");
    });
    let v = status_json(&[&url], "inspect");
    assert_eq!(v["held"], false);
    assert_eq!(v["holder"], serde_json::Value::Null);
    assert_eq!(v["nodes"][0]["holders"], serde_json::json!([]));
    assert_eq!(v["nodes"][0]["ttl_ms"], serde_json::Value::Null);
    assert_eq!(v["nodes"][0]["fence"], fence);
}

#[test]
fn status_json_of_a_combination_lock() {
    let mut servers = LocalServer::start_many(3).expect("redis-servers");
    let urls: Vec<String> = servers.iter().map(LocalServer::url).collect();
    let rt = runtime();
    let guard = rt.block_on(async {
        let nodes = NodeSet::connect(&urls, NodeSetOptions::default()).expect("nodes");
        nodes.adopt_fresh_servers("slate:").await.expect("adopt");
        let lock = CombinationLock::builder(&nodes, "multi")
            .build()
            .expect("lock");
        lock.lock().await.expect("lock")
    });
    let refs: Vec<&str> = urls.iter().map(String::as_str).collect();
    let v = status_json(&refs, "multi");
    assert_eq!(v["kind"], "combination");
    assert_eq!(v["quorum"], 2);
    assert_eq!(v["held"], true);
    assert_eq!(v["holder"], guard.holder().to_string().as_str());
    for &i in guard.nodes() {
        let node = &v["nodes"][i];
        assert_eq!(node["holders"][0]["count"], 1);
        assert!(node["fence"].as_u64().expect("fence") <= guard.fencing_token().get());
    }
    // A node down: the others still answer; exit 69 names the failure.
    drop(servers.pop());
    let mut args = vec!["status", "multi", "--json"];
    for u in &refs {
        args.extend(["--redis", u]);
    }
    let out = output(&args);
    assert_eq!(out.status.code(), Some(69));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["nodes"][2]["ok"], false);
    assert!(v["nodes"][2]["error"].is_string());
    assert_eq!(v["held"], true);
    drop(guard);
}

#[test]
fn unlock_needs_force() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let rt = runtime();
    let guard = rt.block_on(async {
        let client = RedisClient::open(&url).expect("client");
        let lock = SingleLock::builder(&client, "stuck").build().expect("lock");
        lock.lock().await.expect("lock")
    });
    let out = output(&["unlock", "stuck", "--redis", &url]);
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("--force") && err.contains("overlap"), "{err}");
    assert_eq!(status_json(&[&url], "stuck")["held"], true);
    let out = output(&["unlock", "--force", "stuck", "--redis", &url]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("deleted lock"));
    assert_eq!(status_json(&[&url], "stuck")["held"], false);
    let out = output(&["unlock", "--force", "stuck", "--redis", &url]);
    assert!(text(&out.stdout).contains("was not held"));
    // The holder finds out when it releases.
    assert!(rt.block_on(guard.unlock()).is_err());
}

#[test]
fn argument_errors_print_usage_and_exit_2() {
    let cases: &[&[&str]] = &[
        &["run", "--redis", "redis://127.0.0.1:1", "--", "true"],
        &["run", "--lock", "x", "--redis", "redis://127.0.0.1:1"],
        &["run", "--lock", "x", "--lease", "30", "--", "true"],
        &["run", "--lock", "x", "--wait", "soon", "--", "true"],
        &["run", "--lock", "x", "--on-lost", "explode", "--", "true"],
        &["status"],
        &["frobnicate"],
    ];
    for args in cases {
        let out = output(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        let err = text(&out.stderr);
        assert!(
            err.contains("Usage") || err.contains("usage"),
            "{args:?}: {err}"
        );
    }
    let out = output(&["run", "--lease", "30", "--lock", "x", "--", "true"]);
    assert!(text(&out.stderr).contains("no unit"));
    // No Redis at all: says how to give one.
    let out = output(&["run", "--lock", "x", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("SLATE_REDIS_URL"));
    // A Redis that is not there: a distinct code, after retrying within --wait.
    for wait in ["0s", "1s"] {
        let args = [
            "run",
            "--lock",
            "x",
            "--redis",
            "redis://127.0.0.1:1",
            "--wait",
            wait,
        ];
        let out = output(&[&args[..], &["--", "true"]].concat());
        assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
        let err = text(&out.stderr);
        assert_eq!(err.contains("retrying"), wait == "1s", "{err}");
    }
}

#[test]
fn redis_url_from_the_environment() {
    let servers = LocalServer::start_many(2).expect("redis-servers");
    adopt(&servers);
    let joined = format!("{},{}", servers[0].url(), servers[1].url());
    let out = slate(&["run", "--lock", "env", "--", "true"])
        .env("SLATE_REDIS_URL", &joined)
        .output()
        .expect("slate");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = slate(&["status", "env", "--json"])
        .env("SLATE_REDIS_URL", &joined)
        .output()
        .expect("slate");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["kind"], "combination");
    assert_eq!(v["nodes"].as_array().map(Vec::len), Some(2));
}

#[test]
fn demo_short_run_has_zero_overlaps() {
    let out = output(&["demo", "--duration", "5s"]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n--- stderr ---\n{}",
        text(&out.stderr)
    );
    for lock in ["single lock", "combination lock"] {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(lock) && !l.starts_with(&format!("{lock}:")))
            .unwrap_or_else(|| panic!("no row for {lock}:\n{stdout}"));
        let cols: Vec<&str> = row
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        // lock, nodes, acquisitions, overlaps, ...
        let acquisitions: u64 = cols[2].parse().expect("acquisitions");
        assert!(acquisitions > 0, "{row}");
        assert_eq!(cols[3], "0", "overlaps: {row}");
    }
    assert!(stdout.contains("node 1 killed"), "{stdout}");
    assert!(
        stdout.contains("history checker, combination lock: PASS"),
        "{stdout}"
    );
}

/// Issue 19, defect 2: an oversize lease reached Redis and came back as "value is not an
/// integer or out of range" (exit 69); it is a usage error naming the option, before any
/// connection (the URL below has nothing listening).
#[test]
fn huge_lease_is_a_usage_error() {
    for urls in [
        "redis://127.0.0.1:1",
        "redis://127.0.0.1:1,redis://127.0.0.1:2,redis://127.0.0.1:3",
    ] {
        let out = output(&[
            "run",
            "--lock",
            "job",
            "--redis",
            urls,
            "--lease",
            "18446744073709551615s",
            "--",
            "true",
        ]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{urls}: {err}");
        assert!(
            err.contains("lease") && err.contains("365 days"),
            "{urls}: {err}"
        );
    }
}

/// Whether `pid` is a live process (a zombie, killed and not yet reaped by whoever inherited
/// it, is not). Reads `/proc`; sends no signal.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name in parentheses.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
        Err(_) => false,
    }
}

/// Issue 12, item 1: a `slate run` killed with SIGKILL left its command running without the
/// lock, and a second `slate run` on the lock started its command while the first one still
/// ran. Now the command's whole tree (a shell and the two children it started) is gone before
/// the second command starts.
#[test]
fn a_killed_slate_takes_its_command_tree_with_it() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let script = "sleep 60 & echo tree $!; sleep 60 & echo tree $!; echo tree $$; wait";
    let first = Running::start(&[
        "run", "--lock", "job", "--lease", "2s", "--redis", &url, "--", "sh", "-c", script,
    ]);
    let tree = first.tree_pids(3);
    assert!(tree.iter().all(|&p| alive(p)), "the tree runs: {tree:?}");
    // The holder dies without a chance to clean up (our own child).
    signal::kill(first.pid(), Signal::SIGKILL).expect("SIGKILL slate");
    let second = Running::start(&[
        "run", "--lock", "job", "--wait", "30s", "--redis", &url, "--", "echo", "second",
    ]);
    second.line(|l| l == "second");
    let survivors: Vec<i32> = tree.iter().copied().filter(|&p| alive(p)).collect();
    assert!(
        survivors.is_empty(),
        "processes of the first command still ran when the second started: {survivors:?}"
    );
    let (code, err) = second.finish();
    assert_eq!(code, Some(0), "{err}");
}

/// Issue 12, item 1: what the command leaves running in its process group when it exits is
/// killed before the lock is released (it would otherwise run on without the lock).
#[test]
fn leftovers_of_the_command_do_not_outlive_the_lock() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let run = Running::start(&[
        "run",
        "--lock",
        "job2",
        "--redis",
        &url,
        "--",
        "sh",
        "-c",
        "sleep 60 & echo left $!",
    ]);
    let left: i32 = run
        .line(|l| l.starts_with("left "))
        .trim_start_matches("left ")
        .parse()
        .expect("pid");
    let (code, err) = run.finish();
    assert_eq!(code, Some(0), "{err}");
    assert!(!alive(left), "the background sleep outlived the lock");
}

/// Issue 12, item 2: the same server listed twice was accepted as a two-node combination lock.
/// It is a usage error naming both entries, whether the address repeats or two addresses
/// reach one server (found by its run id).
#[test]
fn one_server_listed_twice_is_a_usage_error() {
    let servers = LocalServer::start_many(2).expect("redis-server");
    let (a, b) = (servers[0].url(), servers[1].url());
    let alias = format!("redis://localhost:{}", servers[0].port());
    for (urls, says) in [
        (format!("{a},{a}"), "the same address"),
        (format!("{a},{b},{alias}"), "the same Redis server"),
    ] {
        let out = output(&["run", "--lock", "dup", "--redis", &urls, "--", "true"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{urls}: {err}");
        assert!(
            err.contains("node 0")
                && err.contains(says)
                && err.contains("list each Redis master once"),
            "{urls}: {err}"
        );
    }
}

/// Issue 12, item 3: brand-new servers were refused for 30 s by the restart quarantine, with
/// no way in the CLI to say they are new. The quarantine error names `slate nodes adopt`,
/// which marks them (with the safety note), after which the lock is taken at once.
#[test]
fn nodes_adopt_lets_brand_new_servers_in() {
    let servers = LocalServer::start_many(3).expect("redis-server");
    let urls: Vec<String> = servers.iter().map(LocalServer::url).collect();
    let joined = urls.join(",");
    let run = || {
        output(&[
            "run", "--lock", "new", "--wait", "0s", "--redis", &joined, "--", "true",
        ])
    };
    let out = run();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(err.contains("slate nodes adopt"), "{err}");
    let out = output(&["nodes", "adopt", "--redis", &joined]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        text(&out.stdout).contains("marked 3 of 3"),
        "{}",
        text(&out.stdout)
    );
    assert!(err.contains("never adopt while a lock"), "{err}");
    let out = run();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // Issue 28, item 3: the adoption recorded its quarantine (30 s) as the bound of every
    // lease on these servers; a longer lease is refused as a usage error, naming the fix.
    let out = output(&[
        "run", "--lock", "new", "--lease", "45s", "--wait", "0s", "--redis", &joined, "--", "true",
    ]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("quarantine"), "{err}");
    let out = output(&["nodes", "adopt", "--quarantine", "60s", "--redis", &joined]);
    assert!(
        text(&out.stdout).contains("at most 60s"),
        "{}",
        text(&out.stdout)
    );
    let out = output(&[
        "run", "--lock", "new", "--lease", "45s", "--wait", "0s", "--redis", &joined, "--", "true",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // One URL: nothing to adopt.
    let out = output(&["nodes", "adopt", "--redis", &urls[0]]);
    assert_eq!(out.status.code(), Some(2));
}

/// Issue 12, item 5: completion scripts and manual pages come from the same definitions as
/// the parser (every public subcommand and flag, no internal one).
#[test]
fn completions_and_man_pages_are_generated() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = output(&["completions", shell]);
        let script = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", text(&out.stderr));
        for word in ["run", "status", "unlock", "adopt", "lease", "on-lost"] {
            assert!(script.contains(word), "{shell}: no {word:?} in the script");
        }
        assert!(
            !script.contains("demo-worker"),
            "{shell}: an internal command is offered"
        );
    }
    let out = output(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));

    let page = text(&output(&["man"]).stdout);
    assert!(page.contains(".TH slate 1"), "{page}");
    assert!(page.contains("slate\\-run(1)"), "{page}");
    let page = text(&output(&["man", "run"]).stdout);
    assert!(page.contains(".TH slate-run 1"), "{page}");
    assert!(page.contains("on\\-lost"), "{page}");
    assert!(page.contains("guardian"), "{page}");
    let out = output(&["man", "guard"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "no page for an internal command"
    );
}

/// `slate run --read`: readers of one name run together; a plain run (a writer) waits for
/// them and keeps new readers out; `slate status` shows the readers.
#[test]
fn readers_run_together_and_a_writer_waits_for_them() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    // Reader 1 waits (bounded) for reader 2's file: only possible if both hold at once.
    let wait_for = |mine: &Path, theirs: &Path| {
        format!(
            "touch {}; i=0; while [ ! -e {} ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; [ -e {} ]",
            mine.display(),
            theirs.display(),
            theirs.display()
        )
    };
    let r1 = Running::start(&[
        "run",
        "--lock",
        "shared",
        "--redis",
        &url,
        "--read",
        "-v",
        "--",
        "sh",
        "-c",
        &wait_for(&a, &b),
    ]);
    r1.err_line(|l| l.contains("acquired lock"));
    // While a reader holds: a writer (plain run) is turned away at once, naming the readers.
    let out = output(&[
        "run", "--lock", "shared", "--redis", &url, "--wait", "0s", "--", "true",
    ]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("1 readers hold it"),
        "{}",
        text(&out.stderr)
    );
    let status = status_json(&[&url], "shared");
    assert_eq!(status["read_write"]["mode"], "read", "{status}");
    assert_eq!(
        status["read_write"]["holders"].as_array().map(Vec::len),
        Some(1)
    );
    // The table's head does not call the name free while its readers hold it.
    let table = text(&output(&["status", "shared", "--redis", &url]).stdout);
    assert!(
        table.contains("free as a single lock; its read-write lock is held (read, below)"),
        "{table}"
    );
    let r2 = Running::start(&[
        "run",
        "--lock",
        "shared",
        "--redis",
        &url,
        "--read",
        "--",
        "sh",
        "-c",
        &wait_for(&b, &a),
    ]);
    assert_eq!(r1.finish().0, Some(0), "reader 1 saw reader 2 inside");
    assert_eq!(r2.finish().0, Some(0), "reader 2 saw reader 1 inside");

    // A writer holds: a reader is turned away; a waiting writer gets in after a reader.
    let w = Running::start(&[
        "run",
        "--lock",
        "shared",
        "--redis",
        &url,
        "--write",
        "-v",
        "--",
        "sh",
        "-c",
        "sleep 0.5",
    ]);
    w.err_line(|l| l.contains("acquired lock"));
    let out = output(&[
        "run", "--lock", "shared", "--redis", &url, "--read", "--wait", "0s", "--", "true",
    ]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("a writer holds it"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(w.finish().0, Some(0));
    let out = output(&[
        "run", "--lock", "shared", "--redis", &url, "--read", "--wait", "5s", "--", "true",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(status_json(&[&url], "shared")["read_write"]["mode"], "free");

    // A writer that finds a reader inside takes the lock (new readers are kept out) and
    // waits for the reader to leave before its command runs.
    let done = dir.path().join("reader-done");
    let reader = Running::start(&[
        "run",
        "--lock",
        "shared",
        "--redis",
        &url,
        "--read",
        "-v",
        "--",
        "sh",
        "-c",
        &format!("sleep 0.8; touch {}", done.display()),
    ]);
    reader.err_line(|l| l.contains("acquired lock"));
    let writer = Running::start(&[
        "run",
        "--lock",
        "shared",
        "--redis",
        &url,
        "--wait",
        "10s",
        "--",
        "sh",
        "-c",
        &format!("[ -e {} ]", done.display()),
    ]);
    // The writer holds the name's lock (and waits for the reader): `slate status` shows it.
    let deadline = Instant::now() + PATIENCE;
    while status_json(&[&url], "shared")["held"] != true {
        assert!(Instant::now() < deadline, "the writer never took the lock");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = output(&[
        "run", "--lock", "shared", "--redis", &url, "--read", "--wait", "0s", "--", "true",
    ]);
    assert_eq!(
        out.status.code(),
        Some(75),
        "a new reader is kept out: {}",
        text(&out.stderr)
    );
    assert_eq!(reader.finish().0, Some(0));
    assert_eq!(
        writer.finish().0,
        Some(0),
        "the writer ran after the reader left"
    );
}

/// `slate run --permits K --of N`: at most N permits held together; status shows them.
#[test]
fn permits_of_a_semaphore_bound_the_jobs() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let two = Running::start(&[
        "run",
        "--lock",
        "pool",
        "--redis",
        &url,
        "--permits",
        "2",
        "--of",
        "3",
        "-v",
        "--",
        "sh",
        "-c",
        "sleep 1",
    ]);
    two.err_line(|l| l.contains("acquired lock"));
    let out = output(&[
        "run",
        "--lock",
        "pool",
        "--redis",
        &url,
        "--permits",
        "2",
        "--of",
        "3",
        "--wait",
        "0s",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("2 of 3 permits in use"),
        "{}",
        text(&out.stderr)
    );
    let out = output(&[
        "run",
        "--lock",
        "pool",
        "--redis",
        &url,
        "--permits",
        "1",
        "--of",
        "3",
        "--wait",
        "0s",
        "--",
        "true",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "one permit was free: {}",
        text(&out.stderr)
    );
    let status = status_json(&[&url], "pool");
    assert_eq!(status["semaphore"]["capacity"], 3, "{status}");
    assert_eq!(status["semaphore"]["in_use"], 2, "{status}");
    let table = text(&output(&["status", "pool", "--redis", &url]).stdout);
    assert!(
        table.contains("semaphore: 2 of 3 permits in use"),
        "{table}"
    );
    assert_eq!(two.finish().0, Some(0));
    // More permits than the semaphore has: a usage error naming the fix, not a wait.
    let out = output(&[
        "run",
        "--lock",
        "pool",
        "--redis",
        &url,
        "--permits",
        "4",
        "--of",
        "3",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("set_permits"),
        "{}",
        text(&out.stderr)
    );
    // Shared modes need one deployment; --of needs --permits.
    let other = LocalServer::start().expect("redis-server");
    let out = output(&[
        "run",
        "--lock",
        "pool",
        "--redis",
        &url,
        "--redis",
        &other.url(),
        "--read",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("one --redis"),
        "{}",
        text(&out.stderr)
    );
    let out = output(&[
        "run", "--lock", "pool", "--redis", &url, "--of", "3", "--", "true",
    ]);
    assert_eq!(out.status.code(), Some(2));

    // `slate unlock --force` drops a stuck permit holder too (its lease is 30 s).
    let stuck = Running::start(&[
        "run",
        "--lock",
        "pool",
        "--redis",
        &url,
        "--permits",
        "3",
        "--of",
        "3",
        "-v",
        "--on-lost",
        "ignore",
        "--",
        "sh",
        "-c",
        "sleep 2",
    ]);
    stuck.err_line(|l| l.contains("acquired lock"));
    let out = output(&["unlock", "--force", "pool", "--redis", &url]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("deleted lock"),
        "{}",
        text(&out.stdout)
    );
    let out = output(&[
        "run",
        "--lock",
        "pool",
        "--redis",
        &url,
        "--permits",
        "3",
        "--of",
        "3",
        "--wait",
        "0s",
        "--",
        "true",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the permits came back: {}",
        text(&out.stderr)
    );
    let _ = stuck.finish();
}

/// Issue 35, defect 14: `slate status` names a server whose eviction policy can drop held
/// locks, with the fix; a `noeviction` server gets no warning.
#[test]
fn status_warns_about_a_server_that_can_evict_lock_keys() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let table = text(&output(&["status", "evict", "--redis", &url]).stdout);
    assert!(!table.contains("maxmemory-policy"), "{table}");
    let mut con = redis::Client::open(url.as_str())
        .and_then(|c| c.get_connection())
        .expect("connection");
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("volatile-lru")
        .query::<()>(&mut con)
        .expect("CONFIG SET");
    let table = text(&output(&["status", "evict", "--redis", &url]).stdout);
    assert!(
        table.contains("warning: node 0")
            && table.contains("maxmemory-policy volatile-lru")
            && table.contains("CONFIG SET maxmemory-policy noeviction"),
        "{table}"
    );
    let v = status_json(&[&url], "evict");
    assert_eq!(v["nodes"][0]["eviction_policy"], "volatile-lru");
}

/// Issue 34: starts `slate run` on lock `name` (lease 2 s, `extra` flags) running `script`,
/// which prints `tree PID` for each of its `n` processes and has `{HB}` where a heartbeat
/// process goes (one more `tree` line: it writes the time every 10 ms); does `fault` to that
/// `slate`; then starts a second `slate run` on the lock, whose command prints the time it
/// starts. The first tree's last heartbeat must come before that, and no process of it may be
/// alive then. Returns the first run (for a fault that left it stopped).
fn tree_gone_before_the_next_holder(
    name: &str,
    extra: &[&str],
    script: &str,
    n: usize,
    fault: impl FnOnce(Pid, &str),
) -> Running {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let dir = std::env::temp_dir().join(format!("slate-hb-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("heartbeat dir");
    let hb = dir.join("hb");
    let beat = format!(
        "(while :; do date +%s%N > {0}.tmp; mv -f {0}.tmp {0}; sleep 0.01; done) & echo tree $!;",
        hb.display()
    );
    let script = script.replace("{HB}", &beat);
    let mut args = vec!["run", "--lock", name, "--lease", "2s", "--redis", &url];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", &script]);
    let first = Running::start(&args);
    let tree = first.tree_pids(n + 1);
    assert!(tree.iter().all(|&p| alive(p)), "the tree runs: {tree:?}");
    let read_beat = || -> u128 {
        std::fs::read_to_string(&hb)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0)
    };
    let started = Instant::now();
    while read_beat() == 0 {
        assert!(started.elapsed() < PATIENCE, "no heartbeat");
        std::thread::sleep(Duration::from_millis(10));
    }
    fault(first.pid(), &url);
    let second = Running::start(&[
        "run",
        "--lock",
        name,
        "--wait",
        "30s",
        "--redis",
        &url,
        "--",
        "date",
        "+second %s%N",
    ]);
    let second_started: u128 = second
        .line(|l| l.starts_with("second "))
        .trim_start_matches("second ")
        .parse()
        .expect("time");
    let survivors: Vec<i32> = tree.iter().copied().filter(|&p| alive(p)).collect();
    assert!(
        survivors.is_empty(),
        "processes of the first command still ran when the second started: {survivors:?}"
    );
    let last_beat = read_beat();
    assert!(
        last_beat < second_started,
        "the first tree beat {} ms after the second holder's command started",
        (last_beat - second_started) / 1_000_000
    );
    let (code, err) = second.finish();
    assert_eq!(code, Some(0), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
    first
}

/// Issue 34: GNU `timeout` moves itself into a process group of its own, so a kill of the
/// command's group missed it, and the job ran on beside the next holder after `slate` was
/// SIGKILLed. The guardian is now the tree's parent and subreaper and kills every
/// descendant, whatever its group.
#[test]
fn i34_a_job_under_timeout_dies_with_a_killed_slate() {
    tree_gone_before_the_next_holder(
        "under-timeout",
        &[],
        "exec timeout 60 sh -c '{HB} echo tree $$; sleep 60 & echo tree $!; wait'",
        2,
        |slate, _| signal::kill(slate, Signal::SIGKILL).expect("SIGKILL slate"),
    );
}

/// Issue 34: a job control shell (`set -m`) puts each background job in a group of its own.
#[test]
fn i34_background_jobs_of_a_job_control_shell_die_with_a_killed_slate() {
    tree_gone_before_the_next_holder(
        "set-m",
        &[],
        "exec bash -c 'set -m; {HB} echo tree $$; sleep 60 & echo tree $!; sleep 60 & echo tree $!; wait'",
        3,
        |slate, _| signal::kill(slate, Signal::SIGKILL).expect("SIGKILL slate"),
    );
}

/// Issue 34: a double fork (the middle process exits, its child is orphaned) and `setsid`
/// leave the group and the session; the orphan comes back to the guardian (a subreaper).
#[test]
fn i34_a_double_forked_orphan_dies_with_a_killed_slate() {
    tree_gone_before_the_next_holder(
        "double-fork",
        &[],
        "echo tree $$; (setsid sh -c '{HB} wait' & echo tree $!); (sleep 60 & echo tree $!); sleep 60",
        3,
        |slate, _| signal::kill(slate, Signal::SIGKILL).expect("SIGKILL slate"),
    );
}

/// Issue 34: a stopped `slate` (SIGSTOP, a debugger) renews nothing; the guardian, which holds
/// the lease deadline itself, kills the tree before the lease ends, so nothing of it runs
/// beside the next holder. Before, it watched only for `slate`'s death.
#[test]
fn i34_a_stopped_slate_cannot_keep_its_job_running_past_the_lease() {
    let first = tree_gone_before_the_next_holder(
        "stopped",
        &[],
        "{HB} echo tree $$; sleep 60 & echo tree $!; wait",
        2,
        |slate, _| signal::kill(slate, Signal::SIGSTOP).expect("SIGSTOP slate"),
    );
    signal::kill(first.pid(), Signal::SIGCONT).expect("SIGCONT slate");
    let (code, err) = first.finish();
    assert_eq!(code, Some(76), "{err}");
    assert!(err.contains("lost"), "{err}");
}

/// Issue 34: `--on-lost term` sent SIGTERM at the loss and SIGKILL 5 s later: a job that
/// ignores SIGTERM ran up to 5 s beside the next holder. The SIGTERM now goes out a grace
/// period (at most a quarter of the lease) before the SIGKILL, which lands before the lease
/// ends; here `slate` is stopped, so the guardian does both on its own.
#[test]
fn i34_on_lost_term_with_a_job_that_ignores_sigterm_ends_before_the_lease() {
    let first = tree_gone_before_the_next_holder(
        "ignores-term",
        &["--on-lost", "term"],
        "trap '' TERM; {HB} echo tree $$; sleep 60 & echo tree $!; wait",
        2,
        |slate, _| signal::kill(slate, Signal::SIGSTOP).expect("SIGSTOP slate"),
    );
    signal::kill(first.pid(), Signal::SIGCONT).expect("SIGCONT slate");
    let (code, err) = first.finish();
    assert_eq!(code, Some(76), "{err}");
}

/// Issue 34: on a lease loss the kill went to the guardian's process group only, so a job
/// under `timeout` (a group of its own) ran on without the lock, and `slate` waited for it
/// (60 s here). The server hangs (no renewal can succeed): the whole tree is killed by the
/// lease's end, `slate` exits 76, and nothing of the tree is left.
#[test]
fn i34_a_job_under_timeout_dies_when_the_lease_is_lost() {
    let mut server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let run = Running::start(&[
        "run",
        "--lock",
        "lost-under-timeout",
        "--lease",
        "1s",
        "--redis",
        &url,
        "--",
        "timeout",
        "60",
        "sh",
        "-c",
        "echo tree $$; sleep 60 & echo tree $!; wait",
    ]);
    let tree = run.tree_pids(2);
    server.pause().expect("pause");
    let (code, err) = run.finish();
    server.resume().expect("resume");
    assert_eq!(code, Some(76), "{err}");
    let survivors: Vec<i32> = tree.iter().copied().filter(|&p| alive(p)).collect();
    assert!(
        survivors.is_empty(),
        "ran on after the loss: {survivors:?}\n{err}"
    );
}

/// Issue 34: `slate` replaced the dispositions it inherited: under `nohup` (SIGHUP ignored)
/// it installed a handler, so the guardian and the command got the default back, and a
/// SIGHUP sent to `slate` was forwarded to the command. An inherited ignored signal now stays
/// ignored in `slate`, the guardian and the command.
#[test]
fn i34_a_signal_ignored_by_nohup_stays_ignored_in_the_command() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let exe = env!("CARGO_BIN_EXE_slate");
    let mut child = Command::new("sh")
        .args([
            "-c",
            &format!(
                "trap '' HUP; exec {exe} run --lock nohup --redis {url} -- sh -c 'echo tree $$; sleep 60'"
            ),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let lines = lines_of(child.stdout.take().expect("stdout"));
    let cmd: i32 = wait_line(&lines, |l| l.starts_with("tree "))
        .trim_start_matches("tree ")
        .parse()
        .expect("pid");
    let ignored = |pid: u32| -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("SigIgn:"))
                    .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            })
            .unwrap_or(0)
    };
    let hup = 1 << (Signal::SIGHUP as i32 - 1);
    assert_ne!(
        ignored(cmd.cast_unsigned()) & hup,
        0,
        "SIGHUP is not ignored in the command"
    );
    let slate_pid = Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    signal::kill(slate_pid, Signal::SIGHUP).expect("SIGHUP");
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        alive(cmd),
        "the command died of a SIGHUP that nohup ignores"
    );
    assert!(
        child.try_wait().expect("try_wait").is_none(),
        "slate died of SIGHUP"
    );
    signal::kill(slate_pid, Signal::SIGTERM).expect("SIGTERM");
    let status = child.wait().expect("wait");
    assert!(!status.success());
}

/// Issue 34: `slate` exited 130 on SIGINT instead of dying of it, so a shell loop around it
/// went on after a Ctrl-C. It now re-raises the signal once everything is released: while
/// waiting for the lock, and when its command died of the SIGINT it forwarded.
#[test]
fn i34_slate_dies_of_the_sigint_that_ended_it() {
    use std::os::unix::process::ExitStatusExt;
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let died_of_sigint = |args: &[&str]| {
        let mut child = KillOnDrop(
            slate(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn slate"),
        );
        let out = lines_of(child.0.stdout.take().expect("stdout"));
        wait_line(&out, |l| l == "ready");
        let pid = Pid::from_raw(i32::try_from(child.0.id()).expect("pid"));
        signal::kill(pid, Signal::SIGINT).expect("SIGINT");
        let status = child.0.wait().expect("wait");
        assert_eq!(status.signal(), Some(Signal::SIGINT as i32), "{status:?}");
    };
    // The command dies of the forwarded SIGINT.
    let holder = Running::start(&[
        "run",
        "--lock",
        "reraise",
        "--redis",
        &url,
        "--",
        "sh",
        "-c",
        "echo ready; sleep 60",
    ]);
    holder.line(|l| l == "ready");
    // A second run waits for the lock: SIGINT while waiting.
    let mut waiting = KillOnDrop(
        slate(&[
            "run", "--lock", "reraise", "--wait", "30s", "--redis", &url, "--", "true",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn slate"),
    );
    // Its handlers are in place once its guardian (started before the wait) runs.
    let deadline = Instant::now() + PATIENCE;
    while !has_child(waiting.0.id()) {
        assert!(
            Instant::now() < deadline,
            "the waiting slate started no guardian"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = Pid::from_raw(i32::try_from(waiting.0.id()).expect("pid"));
    signal::kill(pid, Signal::SIGINT).expect("SIGINT");
    let status = waiting.0.wait().expect("wait");
    assert_eq!(
        status.signal(),
        Some(Signal::SIGINT as i32),
        "waiting: {status:?}"
    );
    drop(holder);
    died_of_sigint(&[
        "run",
        "--lock",
        "reraise2",
        "--redis",
        &url,
        "--",
        "sh",
        "-c",
        "echo ready; sleep 60",
    ]);
}

/// A child process killed (and reaped) when a failing test unwinds.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether process `pid` has a child (from `/proc`).
fn has_child(pid: u32) -> bool {
    std::fs::read_dir("/proc").is_ok_and(|entries| {
        entries.flatten().any(|e| {
            std::fs::read_to_string(e.path().join("stat")).is_ok_and(|stat| {
                stat.rsplit_once(") ")
                    .and_then(|(_, rest)| rest.split(' ').nth(1))
                    .is_some_and(|ppid| ppid == pid.to_string())
            })
        })
    })
}

/// Issue 34: where a cgroup v2 can be made, the command's tree is born in one of its own and
/// ended with `cgroup.kill`. The test mounts a cgroup2 hierarchy in a private mount namespace
/// (`unshare`, as root; this machine's cgroups are v1, so this is where `slate` finds one),
/// kills `slate`, and checks that the tree is gone and the cgroup removed.
#[test]
fn i34_the_tree_lives_in_a_cgroup_of_its_own_where_one_can_be_made() {
    let server = LocalServer::start().expect("redis-server");
    let dir = tempfile::tempdir().expect("temp dir");
    let mnt = dir.path().display().to_string();
    let exe = env!("CARGO_BIN_EXE_slate");
    // The shell stays in the namespace: after `slate` dies it reports whether the tree's
    // cgroup (its path written to `leaf` by the test: other tests' `slate run`s have cgroups
    // of their own in the same hierarchy) is left (the guardian removes its own as it goes).
    // (Not in `dir`: the cgroup2 hierarchy is mounted over it.)
    let leaf_dir = tempfile::tempdir().expect("temp dir");
    let leaf = leaf_dir.path().join("leaf");
    let script = format!(
        "mount -t cgroup2 none {mnt} || exit 9; \
         {exe} run --lock cg --lease 2s --redis {url} -- sh -c 'echo tree $$; sleep 60 & echo tree $!; wait' & \
         echo slate $!; wait; \
         for i in $(seq 1 1000); do \
           if [ -s {leaf} ] && [ ! -e \"{mnt}$(cat {leaf})\" ]; then echo cgroup-gone; exit 0; fi; \
           sleep 0.01; \
         done; echo cgroup-left; cat {leaf}",
        url = server.url(),
        leaf = leaf.display()
    );
    let mut shell = KillOnDrop(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("unshare (util-linux) must be installed; the test needs root"),
    );
    let out = lines_of(shell.0.stdout.take().expect("stdout"));
    let err = lines_of(shell.0.stderr.take().expect("stderr"));
    let slate_pid: i32 = wait_line_or(&out, |l| l.starts_with("slate "), &err)
        .trim_start_matches("slate ")
        .parse()
        .expect("pid");
    let tree: Vec<i32> = (0..2)
        .map(|_| {
            let line = wait_line_or(&out, |l| l.starts_with("tree "), &err);
            line.trim_start_matches("tree ").parse().expect("pid")
        })
        .collect();
    for &pid in &tree {
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
        let v2 = cgroups
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or("");
        assert!(
            v2.rsplit('/')
                .next()
                .is_some_and(|leaf| leaf.starts_with("slate-run-")),
            "process {pid} of the tree is in cgroup {v2:?}, not one of its own"
        );
    }
    let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", tree[0])).expect("cgroup");
    let v2 = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("a v2 cgroup");
    std::fs::write(&leaf, v2).expect("write leaf");
    signal::kill(Pid::from_raw(slate_pid), Signal::SIGKILL).expect("SIGKILL slate");
    let verdict = wait_line_or(&out, |l| l.starts_with("cgroup-"), &err);
    assert_eq!(
        verdict, "cgroup-gone",
        "the guardian left its cgroup behind"
    );
    assert!(tree.iter().all(|&p| !alive(p)), "the tree outlived slate");
    assert!(shell.0.wait().expect("wait").success());
}

/// `wait_line`, but a failure shows what the process wrote on stderr.
fn wait_line_or(
    rx: &mpsc::Receiver<String>,
    pred: impl Fn(&str) -> bool,
    err: &mpsc::Receiver<String>,
) -> String {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(Duration::from_millis(100))) {
            Ok(line) if pred(&line) => return line,
            Ok(_) => {}
            Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
            Err(_) => {
                let said: Vec<String> = err.try_iter().collect();
                panic!(
                    "the expected line did not come; stderr:\n{}",
                    said.join("\n")
                );
            }
        }
    }
}

/// `slate latch`: two waiting processes stay until three `down` processes have counted the
/// latch to zero, then exit 0; `set` on a closed latch exits 1, `wait --timeout` on one exits
/// 75, and bad arguments exit 2.
#[test]
fn latch_processes_count_down_while_others_wait() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let latch = |args: &[&str]| {
        let mut all = vec!["latch"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--redis", &url]);
        output(&all)
    };
    let out = latch(&["loaders", "set", "3"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "3");
    let out = latch(&["loaders", "set", "5"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a closed latch is not set: {}",
        text(&out.stderr)
    );
    assert!(text(&out.stderr).contains("already counting down"));

    let started = Instant::now();
    let out = latch(&["loaders", "wait", "--timeout", "300ms"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(started.elapsed() >= Duration::from_millis(300));

    let mut waiters: Vec<Child> = (0..2)
        .map(|_| {
            slate(&[
                "latch",
                "loaders",
                "wait",
                "--timeout",
                "60s",
                "--redis",
                &url,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("slate latch wait")
        })
        .collect();
    let downs: Vec<Child> = (0..2)
        .map(|_| {
            slate(&["latch", "loaders", "down", "--redis", &url])
                .stdout(Stdio::piped())
                .spawn()
                .expect("slate latch down")
        })
        .collect();
    let mut left: Vec<String> = downs
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().expect("down");
            assert_eq!(out.status.code(), Some(0));
            text(&out.stdout).trim().to_owned()
        })
        .collect();
    left.sort();
    assert_eq!(left, ["1", "2"], "each count-down counted once");
    let out = latch(&["loaders", "count"]);
    assert_eq!(text(&out.stdout).trim(), "1");
    std::thread::sleep(Duration::from_millis(300));
    for w in &mut waiters {
        assert!(
            w.try_wait().expect("try_wait").is_none(),
            "a waiter left a closed latch"
        );
    }
    let out = latch(&["loaders", "down"]);
    assert_eq!(text(&out.stdout).trim(), "0");
    let deadline = Instant::now() + PATIENCE;
    for w in &mut waiters {
        let status = loop {
            if let Some(s) = w.try_wait().expect("try_wait") {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "a waiter did not see the latch open"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(0));
    }
    let out = latch(&["loaders", "wait"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "an open latch lets wait through"
    );

    for bad in [
        &["loaders", "set"][..],
        &["loaders", "down", "2"][..],
        &["loaders", "down", "--timeout", "1s"][..],
        &["loaders", "set", "0"][..],
    ] {
        let out = latch(bad);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", text(&out.stderr));
    }
    let out = output(&["latch", "x", "count", "--redis", &url, "--redis", &url]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("one Redis deployment"));
}

/// `slate run --lock a --lock b`: jobs naming overlapping sets in opposite orders never run
/// together and never deadlock; a plain job of one of the names is excluded too; the command
/// gets each name's token; a set with --read, or a name with ',' is a usage error.
#[test]
fn runs_over_several_names_exclude_each_other_in_any_order() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("log");
    let script = format!(
        "echo \"start $$ $(date +%s%N) $SLATE_LOCK $SLATE_FENCING_TOKENS ${{SLATE_FENCING_TOKEN:-none}}\" >> {log}; sleep 0.05; echo \"end $$ $(date +%s%N)\" >> {log}",
        log = log.display()
    );
    let sets: [&[&str]; 3] = [&["a", "b"], &["b", "a"], &["b"]];
    for _ in 0..3 {
        let runs: Vec<Running> = sets
            .iter()
            .map(|set| {
                let mut args = vec!["run", "--wait", "forever", "--redis", url.as_str()];
                for name in *set {
                    args.extend(["--lock", name]);
                }
                args.extend(["--", "sh", "-c", &script]);
                Running::start(&args)
            })
            .collect();
        for r in runs {
            let (code, err) = r.finish();
            assert_eq!(code, Some(0), "{err}");
        }
    }
    let content = std::fs::read_to_string(&log).expect("log");
    let lines: Vec<Vec<&str>> = content.lines().map(|l| l.split(' ').collect()).collect();
    assert_eq!(lines.len(), 3 * 3 * 2, "{content}");
    let mut last_end = 0u128;
    let mut sets_seen = 0;
    for pair in lines.chunks(2) {
        let (s, e) = (&pair[0], &pair[1]);
        assert_eq!(
            (s[0], e[0], s[1]),
            ("start", "end", e[1]),
            "interleaved:\n{content}"
        );
        let (ts, te): (u128, u128) = (s[2].parse().expect("ns"), e[2].parse().expect("ns"));
        assert!(ts >= last_end && te >= ts, "overlapping runs:\n{content}");
        last_end = te;
        if s[3].contains(',') {
            sets_seen += 1;
            let tokens = s[4];
            assert!(
                tokens.starts_with("a=") || tokens.starts_with("b="),
                "SLATE_FENCING_TOKENS: {tokens}"
            );
            assert_eq!(tokens.split(',').count(), 2, "{tokens}");
            assert_eq!(s[5], "none", "no single token for a set");
        }
    }
    assert_eq!(sets_seen, 6);

    let out = output(&[
        "run", "--lock", "a", "--lock", "b", "--read", "--redis", &url, "--", "true",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let out = output(&[
        "run", "--lock", "a,x", "--lock", "b", "--redis", &url, "--", "true",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("','"), "{}", text(&out.stderr));
    let out = output(&[
        "run", "--lock", "a", "--lock", "a", "--redis", &url, "--", "true",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("twice"), "{}", text(&out.stderr));
}

/// `slate status a b`: each name's report, in the order given (with --json, an array).
#[test]
fn status_of_several_names() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let rt = runtime();
    let guard = rt.block_on(async {
        let client = RedisClient::open(&url).expect("client");
        let set = slate_redis::MultiLock::builder(&client, ["a", "b"])
            .build()
            .expect("set");
        set.lock().await.expect("held")
    });
    let out = output(&["status", "b", "a", "c", "--redis", &url, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let all = v.as_array().expect("an array for several names");
    let held: Vec<(String, bool)> = all
        .iter()
        .map(|r| {
            (
                r["lock"].as_str().unwrap().to_owned(),
                r["held"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        held,
        [
            ("b".to_owned(), true),
            ("a".to_owned(), true),
            ("c".to_owned(), false)
        ]
    );
    let out = output(&["status", "a", "b", "--redis", &url]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text(&out.stdout).matches("lock ").count() >= 2,
        "{}",
        text(&out.stdout)
    );
    rt.block_on(guard.unlock()).expect("unlock");
}

/// For a job that runs until a file appears: a temporary directory, the file's path in it,
/// and a free local address for `--metrics-addr`.
fn stoppable_job_setup() -> (tempfile::TempDir, std::path::PathBuf, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let stop = dir.path().join("stop");
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        probe.local_addr().expect("its address").port()
    };
    (dir, stop, format!("127.0.0.1:{port}"))
}

/// Issue 32: `slate run --metrics-addr` serves the process's lock metrics for Prometheus while
/// the command runs (the hold it is in shows in them); an address it cannot listen on is a
/// usage error that names the flag, and the command never runs.
#[test]
fn run_serves_its_metrics_while_the_command_runs() {
    use std::io::{Read, Write};
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let (dir, stop, addr) = stoppable_job_setup();
    let mut child = slate(&[
        "run",
        "--lock",
        "metered",
        "--redis",
        &url,
        "--metrics-addr",
        &addr,
        "--",
        "sh",
        "-c",
        "while [ ! -e \"$STOP\" ]; do sleep 0.05; done",
    ])
    .env("STOP", &stop)
    .spawn()
    .unwrap();
    let deadline = Instant::now() + PATIENCE;
    let page = loop {
        let fetched = std::net::TcpStream::connect(&addr).ok().and_then(|mut s| {
            s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
                .ok()?;
            let mut body = String::new();
            s.read_to_string(&mut body).ok()?;
            Some(body)
        });
        if let Some(body) = fetched.as_ref().filter(|b| b.contains("slate_held{")) {
            break body.clone();
        }
        if Instant::now() > deadline {
            std::fs::write(&stop, "").unwrap();
            let _ = child.wait();
            panic!("no metrics page with the hold at {addr}: {fetched:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::fs::write(&stop, "").unwrap();
    assert!(child.wait().unwrap().success());
    let line = |prefix: &str| {
        page.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in {page}"))
            .to_owned()
    };
    let held = line("slate_held{");
    assert!(held.contains("backend=\"redis-standalone\""), "{held}");
    assert!(
        held.ends_with(" 1"),
        "the command runs inside one hold: {held}"
    );
    let acquired = page
        .lines()
        .find(|l| l.starts_with("slate_acquisitions_total{") && l.contains("how=\"remote\""))
        .unwrap_or_else(|| panic!("no remote acquisitions in {page}"));
    assert!(acquired.ends_with(" 1"), "{acquired}");
    assert!(
        page.contains("# HELP slate_acquisitions_total"),
        "described: {page}"
    );

    // An address in use: exit 2, the flag named, the command not run.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().to_string();
    let marker = dir.path().join("ran");
    let out = slate(&[
        "run",
        "--lock",
        "metered",
        "--redis",
        &url,
        "--metrics-addr",
        &busy,
        "--",
        "touch",
        marker.to_str().unwrap(),
    ])
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--metrics-addr"),
        "{}",
        text(&out.stderr)
    );
    assert!(!marker.exists(), "the command must not run");
    // Port 0 (a port nobody could find) and no port at all: exit 2, said why.
    for (addr, says) in [("127.0.0.1:0", "give a port"), ("localhost", "HOST:PORT")] {
        let out = slate(&[
            "run",
            "--lock",
            "metered",
            "--redis",
            &url,
            "--metrics-addr",
            addr,
            "--",
            "true",
        ])
        .output()
        .unwrap();
        assert_eq!(out.status.code(), Some(2), "{addr}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains(says),
            "{addr}: {}",
            text(&out.stderr)
        );
    }
}

/// The findings of `slate doctor --json` against `url`, with its exit code.
fn doctor(args: &[&str]) -> (Option<i32>, Vec<serde_json::Value>) {
    let mut all = vec!["doctor", "--json"];
    all.extend_from_slice(args);
    let out = output(&all);
    let findings: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {} {}", text(&out.stdout), text(&out.stderr)));
    (out.status.code(), findings)
}

fn severity_of(findings: &[serde_json::Value], check: &str) -> Vec<String> {
    findings
        .iter()
        .filter(|f| f["check"] == check)
        .map(|f| f["severity"].as_str().expect("a severity").to_owned())
        .collect()
}

/// Issue 32: `slate doctor` against servers with each unsafe setting, and a safe one: each
/// unsafe setting is an `unsafe` finding of its check (exit 1), the safe server has none
/// (exit 0), and a usage error exits 2.
#[test]
fn doctor_finds_what_breaks_a_lock() {
    let mut master = LocalServer::start().expect("redis-server");
    let url = master.url();
    let set = |s: &LocalServer, args: &[&str]| {
        s.command(args).unwrap();
    };
    // As started: no persistence, no replica.
    let (code, f) = doctor(&["--redis", &url]);
    assert_eq!(code, Some(1), "{f:#?}");
    assert_eq!(severity_of(&f, "persistence"), ["unsafe"], "{f:#?}");
    assert_eq!(severity_of(&f, "eviction"), ["ok"]);
    assert_eq!(severity_of(&f, "acl"), ["ok"]);
    assert_eq!(severity_of(&f, "replication"), ["advisory"]);
    assert_eq!(severity_of(&f, "server"), ["ok"]);
    let persistence = |f: &[serde_json::Value]| -> (String, String) {
        let p = f
            .iter()
            .find(|x| x["check"] == "persistence")
            .expect("a finding");
        (
            p["finding"].as_str().unwrap_or_default().to_owned(),
            p["consequence"].as_str().unwrap_or_default().to_owned(),
        )
    };
    // Started with `--save ""`: a restart loses everything, counters included.
    let (what, consequence) = persistence(&f);
    assert_eq!(what, "no AOF, no RDB snapshots", "{f:#?}");
    assert!(
        consequence.contains("tokens keep increasing"),
        "{consequence}"
    );
    // With snapshots a restart brings the fencing counters back older (the clients raise
    // them).
    set(&master, &["CONFIG", "SET", "save", "900 1"]);
    let (code, f) = doctor(&["--redis", &url]);
    assert_eq!(code, Some(1), "{f:#?}");
    assert_eq!(severity_of(&f, "persistence"), ["unsafe"], "{f:#?}");
    let (what, consequence) = persistence(&f);
    assert_eq!(what, "no AOF; RDB snapshots (save 900 1)", "{f:#?}");
    assert!(consequence.contains("come back older"), "{consequence}");

    // AOF on with the default fsync policy: an advisory (a crash loses up to a second).
    set(&master, &["CONFIG", "SET", "appendonly", "yes"]);
    let (code, f) = doctor(&["--redis", &url]);
    assert_eq!(code, Some(0), "{f:#?}");
    assert!(f.iter().all(|x| x["severity"] != "unsafe"), "{f:#?}");
    assert_eq!(severity_of(&f, "persistence"), ["advisory"], "{f:#?}");
    // Made safe: appendfsync always, every command allowed, noeviction.
    set(&master, &["CONFIG", "SET", "appendfsync", "always"]);
    let (code, f) = doctor(&["--redis", &url]);
    assert_eq!(code, Some(0), "{f:#?}");
    assert_eq!(severity_of(&f, "persistence"), ["ok"], "{f:#?}");

    // Evicting policies, with a limit.
    set(&master, &["CONFIG", "SET", "maxmemory", "100mb"]);
    for policy in ["allkeys-lru", "volatile-lru"] {
        set(&master, &["CONFIG", "SET", "maxmemory-policy", policy]);
        let (code, f) = doctor(&["--redis", &url]);
        assert_eq!(code, Some(1), "{policy}: {f:#?}");
        assert_eq!(severity_of(&f, "eviction"), ["unsafe"], "{policy}");
    }
    set(
        &master,
        &["CONFIG", "SET", "maxmemory-policy", "noeviction"],
    );

    // An ACL user without ZADD (the fair turn's queue).
    set(
        &master,
        &[
            "ACL", "SETUSER", "locks", "on", ">pw", "~slate:*", "&slate:*", "+@all", "-zadd",
        ],
    );
    let limited = url.replace("redis://", "redis://locks:pw@");
    let (code, f) = doctor(&["--redis", &limited]);
    assert_eq!(code, Some(1), "{f:#?}");
    let acl = f.iter().find(|x| x["check"] == "acl").unwrap();
    assert_eq!(acl["severity"], "unsafe");
    assert!(acl["finding"].as_str().unwrap().contains("ZADD"), "{acl}");
    assert!(acl["fix"].as_str().unwrap().contains("+zadd"), "{acl}");
    // The probes leave no key without a TTL (here DEL is allowed: none at all).
    let left: Vec<String> =
        redis::from_redis_value(master.command(&["KEYS", "slate:doctor:*"]).unwrap()).unwrap();
    assert!(left.is_empty(), "{left:?}");
    assert!(
        !acl["server"].as_str().unwrap().contains("pw"),
        "the password is never printed"
    );

    // A replica that stops (paused): behind the master, unsafe for a failover.
    let mut replica = LocalServer::start().expect("redis-server");
    set(
        &replica,
        &["REPLICAOF", "127.0.0.1", &master.port().to_string()],
    );
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (_, f) = doctor(&["--redis", &url]);
        if severity_of(&f, "replication") == ["ok"] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replica never got in sync: {f:#?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    replica.pause().unwrap();
    let deadline = Instant::now() + PATIENCE;
    let f = loop {
        let (code, f) = doctor(&["--redis", &url]);
        if code == Some(1) {
            break f;
        }
        assert!(
            Instant::now() < deadline,
            "the paused replica was never reported: {f:#?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    replica.resume().unwrap();
    assert_eq!(severity_of(&f, "replication"), ["unsafe"], "{f:#?}");

    // Several --redis: one server under two names, or a master and its replica, is one
    // failure counted twice.
    let other = LocalServer::start().expect("redis-server");
    let (code, f) = doctor(&["--redis", &url, "--redis", &other.url()]);
    assert_eq!(severity_of(&f, "nodes"), ["ok"], "{f:#?}");
    assert!(
        severity_of(&f, "persistence").iter().all(|s| s == "ok"),
        "a combination lock's node needs no persistence: {f:#?}"
    );
    assert_eq!(code, Some(0), "{f:#?}");
    let alias = url.replace("127.0.0.1", "localhost");
    let (code, f) = doctor(&["--redis", &url, "--redis", &alias]);
    assert_eq!(code, Some(1), "{f:#?}");
    assert_eq!(severity_of(&f, "nodes"), ["unsafe"], "{f:#?}");
    let (code, f) = doctor(&["--redis", &url, "--redis", &replica.url()]);
    assert_eq!(code, Some(1), "{f:#?}");
    assert_eq!(severity_of(&f, "nodes"), ["unsafe"], "{f:#?}");

    // Unreachable: unsafe; no server given: usage.
    master.kill().unwrap();
    let (code, f) = doctor(&["--redis", &url]);
    assert_eq!(code, Some(1));
    assert_eq!(severity_of(&f, "server"), ["unsafe"]);
    let out = output(&["doctor"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    // The table names the consequence and the fix.
    let table = output(&["doctor", "--redis", &url]);
    assert!(
        text(&table.stdout).contains("UNSAFE"),
        "{}",
        text(&table.stdout)
    );
}

/// `slate top --json --redis url` with `extra` arguments: its snapshot (exit 0 asserted).
fn top_json(url: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["top", "--json", "--redis", url];
    args.extend_from_slice(extra);
    let out = output(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("slate top --json prints JSON")
}

/// Issue 32: `slate top --once` and `--json`: a held lock with its holder, token, lease left
/// and a waiting process; names given are read directly (a free one shown free); the wait
/// figures of a process's metrics endpoint (`--metrics`); bounded SCAN (the cap reported).
#[test]
fn top_snapshots_list_held_and_waited_for_locks() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let (_dir, stop, metrics) = stoppable_job_setup();
    let job = format!("while [ ! -e {} ]; do sleep 0.05; done", stop.display());
    let mut holder = slate(&[
        "run",
        "--lock",
        "top-held",
        "--redis",
        &url,
        "--metrics-addr",
        &metrics,
        "--",
        "sh",
        "-c",
        &job,
    ])
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let top_json = |extra: &[&str]| top_json(&url, extra);
    // The metered job holds first; the second waits behind it.
    let deadline = Instant::now() + PATIENCE;
    while top_json(&[])["locks"][0]["holder"].is_null() {
        assert!(
            Instant::now() < deadline,
            "the first job never held the lock"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut waiter = slate(&[
        "run", "--lock", "top-held", "--redis", &url, "--wait", "1m", "--", "sh", "-c", &job,
    ])
    .spawn()
    .unwrap();
    let deadline = Instant::now() + PATIENCE;
    let snap = loop {
        let snap = top_json(&[]);
        if snap["locks"][0]["waiting"] == 1 {
            break snap;
        }
        assert!(
            Instant::now() < deadline,
            "no held lock with a waiter: {snap:#}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let lock = &snap["locks"][0];
    assert_eq!(lock["name"], "top-held", "{snap:#}");
    assert!(
        lock["holder"].as_str().is_some_and(|h| h.contains(':')),
        "{lock}"
    );
    assert!(lock["token"].as_u64().is_some_and(|t| t > 0), "{lock}");
    assert!(
        lock["ttl_ms"]
            .as_u64()
            .is_some_and(|t| t > 0 && t <= 30_000),
        "{lock}"
    );
    assert_eq!(
        snap["locks"].as_array().unwrap().len(),
        1,
        "only held or waited-for locks"
    );
    assert_eq!(snap["truncated"], false);

    // Names: read directly, a free one listed free.
    let named = top_json(&["top-held", "top-free"]);
    let names: Vec<&str> = named["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(names, ["top-held", "top-free"], "{named:#}");
    assert!(named["locks"][1]["holder"].is_null());
    assert_eq!(named["scanned"], 0, "no SCAN when names are given");

    // The holder's metrics endpoint: its acquisition and its wait.
    // (The exporter's summaries may come a render after the counters: read until both.)
    let deadline = Instant::now() + PATIENCE;
    loop {
        let with_metrics = top_json(&["--metrics", &format!("http://{metrics}/metrics")]);
        let Some(waits) = with_metrics["waits"].as_array() else {
            let _ = holder.kill();
            let out = holder.wait_with_output().unwrap();
            panic!("{with_metrics:#}\nholder: {out:?}");
        };
        if waits
            .iter()
            .any(|w| w["acquisitions"] == 1.0 && w["wait_p99_ms"].is_number())
        {
            break;
        }
        if Instant::now() > deadline {
            let _ = holder.kill();
            let out = holder.wait_with_output().unwrap();
            panic!("{with_metrics:#}\nholder: {out:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    // The table.
    let out = output(&["top", "--once", "--redis", &url]);
    let table = text(&out.stdout);
    assert!(
        table.contains("LEASE LEFT") && table.contains("top-held"),
        "{table}"
    );

    // A keyspace bigger than the cap: the walk stops and says so.
    for chunk in 0..3 {
        let mut args = vec!["MSET".to_owned()];
        for i in 0..1000 {
            args.push(format!("slate:{{filler-{chunk}-{i}}}:x"));
            args.push("1".to_owned());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        server.command(&args).unwrap();
    }
    let capped = top_json(&["--scan-limit", "1000"]);
    assert_eq!(capped["truncated"], true, "{capped:#}");

    std::fs::write(&stop, "").unwrap();
    assert!(holder.wait().unwrap().success());
    assert!(waiter.wait().unwrap().success());
    let after = top_json(&[]);
    assert_eq!(
        after["locks"].as_array().map(Vec::len),
        Some(0),
        "{after:#}"
    );
    // On ZooKeeper the names must be given.
    let out = output(&["top", "--once", "--zookeeper", "127.0.0.1:1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("name them"),
        "{}",
        text(&out.stderr)
    );
}

/// `slate top` shows read-write locks and semaphores beside the single locks (`kind`): two
/// readers sharing one (no single holder named), a writer with another process waiting, a
/// semaphore's permits in use of its capacity; names given read every kind.
#[test]
fn top_shows_read_write_locks_and_semaphores() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let rt = runtime();
    let (a, b) = (
        RedisClient::open(url.as_str()).unwrap(),
        RedisClient::open(url.as_str()).unwrap(),
    );
    let rw = |c: &RedisClient, name: &str| slate_redis::RwLock::builder(c, name).build().unwrap();
    let (ra, rb) = (rw(&a, "top-rw"), rw(&b, "top-rw"));
    let (wa, wb) = (rw(&a, "top-rw-w"), rw(&b, "top-rw-w"));
    let sem = slate_redis::Semaphore::builder(&a, "top-sem", 3)
        .build()
        .unwrap();
    let (reads, write, permit) = rt.block_on(async {
        let reads = (ra.read().await.unwrap(), rb.read().await.unwrap());
        let write = wa.write().await.unwrap();
        let permit = sem.acquire(2).await.unwrap();
        (reads, write, permit)
    });
    let waiter = rt.spawn(async move { wb.write().await });
    let top_json = |extra: &[&str]| top_json(&url, extra);
    let deadline = Instant::now() + PATIENCE;
    let snap = loop {
        let snap = top_json(&[]);
        if snap["locks"][0]["waiting"] == 1 {
            break snap;
        }
        assert!(Instant::now() < deadline, "no waiting writer: {snap:#}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let rows = snap["locks"].as_array().unwrap();
    assert_eq!(rows.len(), 3, "{snap:#}");
    let (w, r, s) = (&rows[0], &rows[1], &rows[2]);
    assert_eq!(
        (&w["name"], &w["kind"], &w["mode"], &w["holders"]),
        (
            &"top-rw-w".into(),
            &"rwlock".into(),
            &"write".into(),
            &1.into()
        ),
        "{snap:#}"
    );
    assert_eq!(
        w["holder"].as_str(),
        Some(&*write.holder().to_string()),
        "{w}"
    );
    assert!(w["token"].as_u64().is_some_and(|t| t > 0), "{w}");
    assert!(
        w["ttl_ms"].as_u64().is_some_and(|t| t > 0 && t <= 30_000),
        "{w}"
    );
    assert_eq!(
        (&r["name"], &r["kind"], &r["mode"], &r["holders"]),
        (
            &"top-rw".into(),
            &"rwlock".into(),
            &"read".into(),
            &2.into()
        ),
        "{snap:#}"
    );
    assert!(r["holder"].is_null(), "two readers share it: {r}");
    assert_eq!(
        (&s["name"], &s["kind"], &s["permits"], &s["capacity"]),
        (&"top-sem".into(), &"semaphore".into(), &2.into(), &3.into()),
        "{snap:#}"
    );
    assert_eq!(
        s["holder"].as_str(),
        Some(&*permit.holder().to_string()),
        "{s}"
    );

    // Names given: every kind of each is read; a name nothing holds is listed as its single
    // lock, free.
    let named = top_json(&["top-rw", "top-nothing"]);
    let kinds: Vec<String> = named["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| format!("{} {}", l["name"], l["kind"]))
        .collect();
    assert_eq!(
        kinds,
        ["\"top-rw\" \"rwlock\"", "\"top-nothing\" \"lock\""],
        "{named:#}"
    );

    // The table names the kind and how the shared ones are held.
    let table = text(&output(&["top", "--once", "--redis", &url]).stdout);
    for want in ["KIND", "2 readers (read)", "(write)", "2 of 3 permits"] {
        assert!(table.contains(want), "{want:?} missing:\n{table}");
    }

    rt.block_on(async {
        write.unlock().await.unwrap();
        waiter.await.unwrap().unwrap().unlock().await.unwrap();
        reads.0.unlock().await.unwrap();
        reads.1.unlock().await.unwrap();
        permit.unlock().await.unwrap();
    });
    let after = top_json(&[]);
    assert_eq!(
        after["locks"].as_array().map(Vec::len),
        Some(0),
        "{after:#}"
    );
}

/// Bad data and bad input (an adversarial probe's findings): `slate top` and `slate latch`
/// neither panic nor hide good locks behind a bad key, and refuse what they cannot use with
/// exit 2.
#[test]
fn top_and_latch_take_bad_data_and_bad_input_in_their_stride() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let cmd = |args: &[&str]| server.command(args).unwrap();
    // A semaphore whose permits would overflow a sum.
    cmd(&[
        "HSET",
        "slate:{s}:sem",
        "p:a",
        "18446744073709551615",
        "p:b",
        "1",
    ]);
    cmd(&[
        "ZADD",
        "slate:{s}:sem:leases",
        "9999999999999",
        "a",
        "9999999999999",
        "b",
    ]);
    // Keys of another type where a lock's would be, and a key no lock could have.
    cmd(&["SET", "slate:{x}", "not a hash"]);
    cmd(&["SET", "slate:{x}:rw", "not a hash"]);
    cmd(&["SET", "slate:{}", "no name"]);
    // Real holds beside them: a name that is not UTF-8, and a read-write lock.
    let rt = runtime();
    let client = RedisClient::open(url.as_str()).unwrap();
    let odd = SingleLock::builder(&client, b"\xffodd").build().unwrap();
    let rw = slate_redis::RwLock::builder(&client, "y").build().unwrap();
    let (odd_guard, read) =
        rt.block_on(async { (odd.lock().await.unwrap(), rw.read().await.unwrap()) });

    let snap = top_json(&url, &[]);
    let rows = snap["locks"].as_array().unwrap();
    let row = |name: &str, kind: &str| {
        rows.iter()
            .find(|r| r["name"] == name && r["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind} {name}: {snap:#}"))
    };
    assert_eq!(row("s", "semaphore")["permits"], u64::MAX, "saturated");
    assert!(row("\u{fffd}odd", "lock")["holder"].is_string(), "{snap:#}");
    assert_eq!(row("y", "rwlock")["mode"], "read");
    assert_eq!(rows.len(), 3, "{snap:#}");
    let unreadable = snap["unreadable"].to_string();
    assert!(
        unreadable.contains("slate:{x}: WRONGTYPE") && unreadable.contains("slate:{x}:rw:"),
        "{snap:#}"
    );
    assert_eq!(snap["errors"], serde_json::json!([]), "{snap:#}");
    // Names given: once each; a read-write lock's name without a free single-lock row.
    let named = top_json(&url, &["y", "y", "free"]);
    let kinds: Vec<String> = named["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| format!("{} {}", l["name"], l["kind"]))
        .collect();
    assert_eq!(
        kinds,
        ["\"y\" \"rwlock\"", "\"free\" \"lock\""],
        "{named:#}"
    );
    assert_eq!(named["locks"][0]["nodes_held"], 1, "{named:#}");
    // Bad input: exit 2 with the fix named.
    for (args, says) in [
        (vec!["top", "--once", "--redis", &url, ""], "empty"),
        (
            vec!["top", "--once", "--redis", "http://127.0.0.1:1"],
            "redis://HOST:PORT",
        ),
        (
            vec!["top", "--once", "--redis", &url, "--prefix", "p{q}:"],
            "prefix",
        ),
    ] {
        let out = output(&args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(says),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }

    // The latch: a wait too long for the clock on an open latch returns at once.
    let out = output(&[
        "latch",
        "open",
        "wait",
        "--timeout",
        "18446744073709551615s",
        "--redis",
        &url,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // A count no latch sets is an error, not "opened".
    cmd(&["HSET", "slate:{c}:latch", "n", "99999999999"]);
    let out = output(&["latch", "c", "down", "--redis", &url]);
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("not one a latch sets"),
        "{}",
        text(&out.stderr)
    );
    // Another program's key under the latch's name is not "already counting down".
    cmd(&["SET", "slate:{w}:latch", "a string"]);
    let out = output(&["latch", "w", "set", "3", "--redis", &url]);
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("WRONGTYPE"),
        "{}",
        text(&out.stderr)
    );
    // A server that cannot be reached: said at once, not waited for in silence.
    let started = Instant::now();
    let out = output(&["latch", "l", "wait", "--redis", "redis://127.0.0.1:1"]);
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
    assert!(started.elapsed() < PATIENCE);

    rt.block_on(async {
        odd_guard.unlock().await.unwrap();
        read.unlock().await.unwrap();
    });
}

/// A second probe's findings: `slate status` reads a fencing counter exactly (through Lua it
/// was a double: 2^53 + 1 read as 2^53), and refuses a server listed twice and a bad URL as
/// `run` does (exit 2); `slate doctor` refuses a lease the locks refuse instead of rating it.
#[test]
fn status_reads_counters_exactly_and_status_and_doctor_refuse_bad_input() {
    let server = LocalServer::start().expect("redis-server");
    let url = server.url();
    let name = slate_core::LockName::new("exact").unwrap();
    let fence = slate_redis::node::NodeKeys::new("slate:", &name)
        .fence_key()
        .to_vec();
    let fence = String::from_utf8(fence).unwrap();
    server
        .command(&["SET", &fence, "9007199254740993"])
        .unwrap();
    let out = output(&["status", "exact", "--json", "--redis", &url]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["nodes"][0]["fence"], 9_007_199_254_740_993_u64,
        "{report:#}"
    );

    for (args, says) in [
        (
            vec!["status", "x", "--redis", &url, "--redis", &url],
            "listed twice",
        ),
        (vec!["status", "x", "--redis", "http://127.0.0.1:1"], "URL"),
        (vec!["doctor", "--redis", &url, "--lease", "29ms"], "lease"),
    ] {
        let out = output(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
