//! The `slate` command on a Redis Cluster and on a Sentinel group (issue 13, item 8).
//!
//! `slate-cli` must not depend on the harness, so these tests live here and run the `slate`
//! binary that the workspace build put next to this test binary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

use ecosphere::cluster::RedisCluster;
use ecosphere::sentinel::SentinelGroup;

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
