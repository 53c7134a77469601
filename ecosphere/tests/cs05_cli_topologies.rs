//! The `slate` command on a Redis Cluster and on a Sentinel group (issue 13, item 8), and on
//! a ZooKeeper ensemble (issue 17).
//!
//! `slate-cli` must not depend on the harness, so these tests live here and run the `slate`
//! binary that the workspace build put next to this test binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

use ecosphere::cluster::RedisCluster;
use ecosphere::sentinel::SentinelGroup;
use ecosphere::zookeeper::ZkEnsemble;

/// `target/<profile>/slate`, beside `target/<profile>/deps/<this test>`.
fn slate_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    let bin = profile_dir.join("slate");
    assert!(
        bin.is_file(),
        "{} not found: build the command first (cargo build --workspace, or cargo nextest run \
         --workspace, which builds it)",
        bin.display()
    );
    bin
}

fn slate(args: &[&str]) -> Output {
    Command::new(slate_binary())
        .args(args)
        .env_remove("SLATE_REDIS_URL")
        .output()
        .expect("run slate")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn run_status_and_unlock_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0).expect("cluster");
    let seeds = cluster.urls().join(",");
    let out = slate(&[
        "run",
        "--lock",
        "nightly",
        "--cluster",
        &seeds,
        "--lease",
        "5s",
        "--",
        "sh",
        "-c",
        "exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));

    // Status names the slot and the master that serves it.
    let out = slate(&["status", "nightly", "--cluster", &seeds, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let node = &json["nodes"][0];
    let slot = node["slot"].as_u64().expect("slot") as u16;
    let owner = node["owner"].as_str().expect("owner").to_owned();
    let c = cluster;
    let master = c.master_of(slot).unwrap();
    assert_eq!(owner, format!("127.0.0.1:{}", c.node(master).port()));
    assert_eq!(json["held"], false);
    let out = slate(&["status", "nightly", "--cluster", &seeds]);
    assert!(
        text(&out.stdout).contains(&format!(
            "cluster slot {slot}, served by the master at {owner}"
        )),
        "{}",
        text(&out.stdout)
    );
    let out = slate(&["unlock", "--force", "nightly", "--cluster", &seeds]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    // A cluster node given as --redis is refused, naming --cluster.
    for args in [
        vec!["run", "--lock", "x", "--redis", &c.urls()[0], "--", "true"],
        vec!["status", "x", "--redis", &c.urls()[0]],
    ] {
        let out = slate(&args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains("--cluster"),
            "{}",
            text(&out.stderr)
        );
    }
}

#[test]
fn run_and_status_on_a_sentinel_group() {
    let group = SentinelGroup::start(1, 1).expect("sentinel group");
    let sentinels = group.sentinel_urls().join(",");
    let out = slate(&[
        "run",
        "--lock",
        "report",
        "--sentinel",
        &sentinels,
        "--master-name",
        group.master_name(),
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = slate(&[
        "status",
        "report",
        "--sentinel",
        &sentinels,
        "--master-name",
        group.master_name(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(json["held"], false);
    assert!(json["nodes"][0]["fence"].as_u64().unwrap() >= 1);

    // Usage errors name the missing piece.
    let out = slate(&["run", "--lock", "x", "--sentinel", &sentinels, "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--master-name"),
        "{}",
        text(&out.stderr)
    );
    // A Sentinel given as --redis.
    let out = slate(&["status", "x", "--redis", &group.sentinel_urls()[0]]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--sentinel"),
        "{}",
        text(&out.stderr)
    );
}

/// `slate run/status/unlock --zookeeper`: the job gets a fencing token (a zxid), a second run
/// finds it busy with the holder named, status shows holder and waiters, a killed `slate`
/// takes its command with it and the ensemble frees the lock when the session expires, and
/// `unlock --force` clears a holder.
#[test]
fn run_status_and_unlock_on_a_zookeeper_ensemble() {
    use std::time::{Duration, Instant};

    let ensemble = ZkEnsemble::start(3).expect("ZooKeeper ensemble");
    let zk = ensemble.connect_string();
    let out = slate(&[
        "run",
        "--lock",
        "nightly",
        "--zookeeper",
        &zk,
        "--lease",
        "4s",
        "--",
        "sh",
        "-c",
        "echo token=$SLATE_FENCING_TOKEN; exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    let token: u64 = text(&out.stdout)
        .trim()
        .strip_prefix("token=")
        .unwrap()
        .parse()
        .unwrap();
    assert!(token > 0);

    // A holder that runs on; it prints its pid, then sleeps.
    let (mut first, line) = holding(&[
        "run",
        "--lock",
        "nightly",
        "--zookeeper",
        &zk,
        "--lease",
        "2s",
        "--",
        "sh",
        "-c",
        "echo pid $$; exec sleep 60",
    ]);
    let job: i32 = line.trim().strip_prefix("pid ").unwrap().parse().unwrap();

    let busy = slate(&[
        "run",
        "--lock",
        "nightly",
        "--zookeeper",
        &zk,
        "--wait",
        "0s",
        "--",
        "true",
    ]);
    assert_eq!(busy.status.code(), Some(75), "{}", text(&busy.stderr));
    assert!(
        text(&busy.stderr).contains("held by"),
        "{}",
        text(&busy.stderr)
    );

    let status = slate(&["status", "nightly", "--zookeeper", &zk, "--json"]);
    assert_eq!(status.status.code(), Some(0), "{}", text(&status.stderr));
    let json: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(json["kind"], "zookeeper");
    assert_eq!(json["held"], true);
    assert_eq!(json["path"], "/slate/nightly");
    assert!(json["holder"]["token"].as_u64().unwrap() > token, "{json}");
    let table = slate(&["status", "nightly", "--zookeeper", &zk]);
    assert!(
        text(&table.stdout).contains("holder"),
        "{}",
        text(&table.stdout)
    );

    // SIGKILL the holding slate: its guardian kills the job; the ensemble frees the lock when
    // the session expires, and the next run gets it with a higher token.
    first.kill().unwrap();
    first.wait().unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(format!("/proc/{job}/stat")).is_ok_and(|s| !s.contains(") Z")) {
        assert!(Instant::now() < until, "the job outlived its slate");
        std::thread::sleep(Duration::from_millis(20));
    }
    let next = slate(&[
        "run",
        "--lock",
        "nightly",
        "--zookeeper",
        &zk,
        "--wait",
        "20s",
        "--",
        "sh",
        "-c",
        "echo $SLATE_FENCING_TOKEN",
    ]);
    assert_eq!(next.status.code(), Some(0), "{}", text(&next.stderr));
    let next_token: u64 = text(&next.stdout).trim().parse().unwrap();
    assert!(next_token > token);

    // unlock --force on a free lock, and on a held one.
    let free = slate(&["unlock", "--force", "nightly", "--zookeeper", &zk]);
    assert_eq!(free.status.code(), Some(0), "{}", text(&free.stderr));
    assert!(
        text(&free.stdout).contains("not held"),
        "{}",
        text(&free.stdout)
    );
    let (mut holder, _) = holding(&[
        "run",
        "--lock",
        "nightly",
        "--zookeeper",
        &zk,
        "--",
        "sh",
        "-c",
        "echo in; exec sleep 60",
    ]);
    let cleared = slate(&["unlock", "--force", "nightly", "--zookeeper", &zk]);
    assert_eq!(cleared.status.code(), Some(0), "{}", text(&cleared.stderr));
    assert!(
        text(&cleared.stdout).contains("deleted lock"),
        "{}",
        text(&cleared.stdout)
    );
    // The holder learns it lost the lock and kills its job (exit 76).
    let until = Instant::now() + Duration::from_secs(20);
    let code = loop {
        if let Some(s) = holder.try_wait().unwrap() {
            break s.code();
        }
        assert!(Instant::now() < until, "the holder did not notice the loss");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(code, Some(76));

    // Usage errors name the fix.
    let bad = slate(&[
        "run",
        "--lock",
        "x",
        "--zookeeper",
        &zk,
        "--read",
        "--",
        "true",
    ]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stderr));
    assert!(
        text(&bad.stderr).contains("exclusive"),
        "{}",
        text(&bad.stderr)
    );
    let bad = slate(&["status", "x", "--zookeeper", &zk, "--prefix", "relative"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stderr));
}

/// Starts `slate` with `args` (a `run` whose command prints a line first) and returns it with
/// that line, once the command runs under the lock.
fn holding(args: &[&str]) -> (std::process::Child, String) {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(slate_binary())
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line)
}

/// The findings of `slate doctor --json ARGS` and its exit code.
fn doctor(args: &[&str]) -> (Option<i32>, Vec<serde_json::Value>) {
    let mut all = vec!["doctor", "--json"];
    all.extend_from_slice(args);
    let out = slate(&all);
    let findings = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {} {}", text(&out.stdout), text(&out.stderr)));
    (out.status.code(), findings)
}

fn checks<'a>(findings: &'a [serde_json::Value], check: &str) -> Vec<&'a serde_json::Value> {
    findings.iter().filter(|f| f["check"] == check).collect()
}

/// Issue 32: `slate doctor` and `slate top` on a cluster and a Sentinel group: every master
/// checked (the cluster's state, each master's settings), the Sentinels counted, the master
/// found through them; `top` finds a held lock on whichever master serves its slot, and the
/// other masters' redirections are not errors.
#[test]
fn doctor_and_top_on_a_cluster_and_a_sentinel_group() {
    let cluster = RedisCluster::start(3, 0).expect("cluster");
    let seeds = cluster.urls().join(",");
    let (_, f) = doctor(&["--cluster", &seeds]);
    let state = checks(&f, "cluster");
    assert_eq!(state.len(), 1, "{f:#?}");
    assert_eq!(state[0]["severity"], "ok", "{f:#?}");
    assert!(
        state[0]["finding"]
            .as_str()
            .unwrap()
            .contains("16384 of 16384"),
        "{f:#?}"
    );
    assert_eq!(checks(&f, "eviction").len(), 3, "each master: {f:#?}");
    assert_eq!(checks(&f, "acl").len(), 3, "{f:#?}");
    // A cluster master's ACL probe includes SPUBLISH; all allowed here.
    assert!(
        checks(&f, "acl").iter().all(|a| a["severity"] == "ok"),
        "{f:#?}"
    );

    let (mut holder, _) = holding(&[
        "run",
        "--lock",
        "top-cluster",
        "--cluster",
        &seeds,
        "--",
        "sh",
        "-c",
        "echo held; sleep 60",
    ]);
    let out = slate(&["top", "--json", "--cluster", &seeds]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let snap: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(snap["locks"][0]["name"], "top-cluster", "{snap:#}");
    assert!(snap["locks"][0]["token"].as_u64().is_some(), "{snap:#}");
    // The masters that do not serve the name answer MOVED: not an error.
    assert_eq!(snap["errors"], serde_json::json!([]), "{snap:#}");
    holder.kill().unwrap();
    let _ = holder.wait();

    let group = SentinelGroup::start(1, 1).expect("sentinel group");
    let sentinels = group.sentinel_urls().join(",");
    let (_, f) = doctor(&[
        "--sentinel",
        &sentinels,
        "--master-name",
        group.master_name(),
    ]);
    let sentinel = checks(&f, "sentinel");
    assert_eq!(sentinel.len(), 1, "{f:#?}");
    assert_eq!(sentinel[0]["severity"], "advisory", "one Sentinel: {f:#?}");
    assert_eq!(
        checks(&f, "eviction").len(),
        1,
        "the master, found through them: {f:#?}"
    );
    let (code, f) = doctor(&["--sentinel", &sentinels, "--master-name", "nobody"]);
    assert_eq!(code, Some(1), "{f:#?}");
    assert!(
        checks(&f, "sentinel")
            .iter()
            .any(|s| s["severity"] == "unsafe"),
        "{f:#?}"
    );
}

/// Issue 32: `slate doctor --zookeeper`: the session and the ensemble's size; `slate top`
/// of named ZooKeeper locks: the holder with its token (a zxid), a free one free.
#[test]
fn doctor_and_top_on_zookeeper() {
    let zk = ecosphere::zookeeper::ZkServer::start().expect("zookeeper");
    let (mut holder, _) = holding(&[
        "run",
        "--lock",
        "top-zk",
        "--zookeeper",
        &zk.connect_string(),
        "--",
        "sh",
        "-c",
        "echo held; sleep 60",
    ]);
    let out = slate(&[
        "top",
        "top-zk",
        "top-zk-free",
        "--json",
        "--zookeeper",
        &zk.connect_string(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let snap: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(snap["locks"][0]["name"], "top-zk", "{snap:#}");
    assert!(snap["locks"][0]["holder"].is_string(), "{snap:#}");
    assert!(
        snap["locks"][0]["token"].as_u64().is_some_and(|t| t > 0),
        "{snap:#}"
    );
    assert!(snap["locks"][1]["holder"].is_null(), "{snap:#}");
    holder.kill().unwrap();
    let _ = holder.wait();
    let (code, f) = doctor(&["--zookeeper", &zk.connect_string(), "--lease", "1m"]);
    assert_eq!(code, Some(0), "{f:#?}");
    let z = checks(&f, "zookeeper");
    assert_eq!(z.len(), 2, "{f:#?}");
    assert!(
        z.iter()
            .any(|x| x["finding"].as_str().unwrap().contains("session timeout"))
    );
    assert!(
        z.iter()
            .any(|x| x["severity"] == "advisory"
                && x["finding"].as_str().unwrap().contains("1 server")),
        "one server is an advisory: {f:#?}"
    );
}
