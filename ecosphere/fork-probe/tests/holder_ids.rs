//! Scenario X3, holder ids (issue #7, reliability.md §6.5 and §4 "unguessable and unique owner
//! ids"): 50 processes × 20,000 holder ids, including children forked after a Slate client was
//! created and used in their parent.
//!
//! Setup: one `redis-server` from the ecosphere harness; 5 plain `fork-probe` processes (4
//! drawing threads each) and 5 that fork 8 children each after taking and releasing a lock
//! with their client (45 + 5 = 50 processes in all; each parent draws its first id before the
//! forks, so its prefix is cached when the children are born).
//!
//! Expected: all 1,000,000 ids distinct; every process has one 128-bit prefix of its own, a
//! forked child's differs from its parent's; each of the 128 prefix bits takes both values
//! across the 50 processes (the prefix is random in all its bits, not a pid or a counter);
//! every id round-trips through its text form. The parents' clients still lock after the
//! forks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ecosphere::server::RedisServer;
use slate_core::HolderId;

const PROBE: &str = env!("CARGO_BIN_EXE_fork-probe");
const IDS: usize = 20_000;
const PLAIN: usize = 5;
const PARENTS: usize = 5;
const FORKS: usize = 8;
const PROCESSES: usize = PLAIN + PARENTS * (1 + FORKS);

/// One process's ids, as its file says.
struct Drawn {
    pid: u32,
    parent: u32,
    role: String,
    ids: Vec<HolderId>,
}

fn read(path: &Path) -> Drawn {
    let text = std::fs::read_to_string(path).expect("read an id file");
    let mut lines = text.lines();
    let header = lines.next().expect("header line");
    let fields: BTreeMap<&str, &str> = header
        .split(' ')
        .filter_map(|f| f.split_once('='))
        .collect();
    let ids: Vec<HolderId> = lines
        .map(|l| {
            let id: HolderId = l
                .parse()
                .unwrap_or_else(|e| panic!("{}: {l:?}: {e}", path.display()));
            assert_eq!(id.to_string(), l, "the text form round-trips");
            id
        })
        .collect();
    Drawn {
        pid: fields["pid"].parse().expect("pid"),
        parent: fields["parent"].parse().expect("parent"),
        role: fields["role"].to_owned(),
        ids,
    }
}

fn spawn(server: &RedisServer, out: &Path, tag: &str, forks: usize, threads: usize) -> Child {
    Command::new(PROBE)
        .args(["--redis-url", &server.url()])
        .arg("--out")
        .arg(out)
        .args(["--tag", tag])
        .args(["--ids", &IDS.to_string()])
        .args(["--forks", &forks.to_string()])
        .args(["--threads", &threads.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn fork-probe")
}

#[test]
fn x3_holder_ids_are_unique_across_50_processes_and_forked_children() {
    let server = RedisServer::start().expect("redis-server (apt-get install -y redis-server)");
    let dir = tempfile::tempdir().expect("tempdir");
    let start = Instant::now();
    let mut probes: Vec<(String, Child)> = Vec::new();
    for i in 0..PLAIN {
        let tag = format!("plain{i}");
        probes.push((tag.clone(), spawn(&server, dir.path(), &tag, 0, 4)));
    }
    for i in 0..PARENTS {
        let tag = format!("fork{i}");
        probes.push((tag.clone(), spawn(&server, dir.path(), &tag, FORKS, 2)));
    }
    // Bounded wait for every probe (they wait for their own children).
    let deadline = Instant::now() + Duration::from_secs(60);
    for (tag, child) in &mut probes {
        loop {
            if let Some(status) = child.try_wait().expect("poll a probe") {
                let mut stderr = String::new();
                if let Some(mut e) = child.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut stderr);
                }
                assert!(status.success(), "probe {tag} failed ({status}): {stderr}");
                break;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("probe {tag} did not finish within 60 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let ran = start.elapsed();

    let mut drawn: Vec<Drawn> = std::fs::read_dir(dir.path())
        .expect("read the output dir")
        .map(|e| read(&e.expect("dir entry").path()))
        .collect();
    drawn.sort_by_key(|d| d.pid);
    assert_eq!(drawn.len(), PROCESSES, "one id file per process");
    let roles = |r: &str| drawn.iter().filter(|d| d.role == r).count();
    assert_eq!(
        (roles("plain"), roles("parent"), roles("child")),
        (PLAIN, PARENTS, PARENTS * FORKS)
    );

    // Every id distinct, across processes, threads and forks.
    let mut all: HashSet<HolderId> = HashSet::with_capacity(PROCESSES * IDS);
    for d in &drawn {
        assert_eq!(d.ids.len(), IDS, "pid {}", d.pid);
        for id in &d.ids {
            assert!(
                all.insert(*id),
                "id {id} drawn twice (pid {} is one)",
                d.pid
            );
        }
    }
    assert_eq!(all.len(), PROCESSES * IDS);

    // One prefix per process, its own; a child's is not its parent's.
    let mut prefix_of: BTreeMap<u32, u128> = BTreeMap::new();
    for d in &drawn {
        let prefixes: HashSet<u128> = d.ids.iter().map(HolderId::prefix).collect();
        assert_eq!(prefixes.len(), 1, "pid {} has one prefix", d.pid);
        prefix_of.insert(d.pid, d.ids[0].prefix());
    }
    let distinct: HashSet<u128> = prefix_of.values().copied().collect();
    assert_eq!(
        distinct.len(),
        PROCESSES,
        "every process draws its own prefix"
    );
    for d in drawn.iter().filter(|d| d.role == "child") {
        let parent = prefix_of
            .get(&d.parent)
            .unwrap_or_else(|| panic!("child {} of unknown parent {}", d.pid, d.parent));
        assert_ne!(
            prefix_of[&d.pid], *parent,
            "child {} repeats its parent's prefix",
            d.pid
        );
    }
    // All 128 bits of the prefix are random: each takes both values among 50 processes
    // (a fixed bit would survive this with probability 2^-49).
    let ones = distinct.iter().fold(0u128, |acc, p| acc | p);
    let zeros = distinct.iter().fold(0u128, |acc, p| acc | !p);
    assert_eq!(ones, u128::MAX, "bits never set: {:#034x}", !ones);
    assert_eq!(zeros, u128::MAX, "bits never clear: {:#034x}", !zeros);
    println!(
        "{} ids from {PROCESSES} processes ({} forked after their parent's client) in {ran:?}: \
         all distinct",
        all.len(),
        PARENTS * FORKS
    );
}
