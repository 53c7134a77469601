//! Expected-violation run (reliability.md 7.7, C4(c)): the checker sees an overlap when the
//! combination lock's protection is switched off.
//!
//! A holds {n0, n1, n2}. n0 and n2 restart without their data while B cannot reach n1 (it is
//! paused). B's node set has quarantine disabled (`disable_quarantine_unsafe`), so it takes the
//! restarted nodes as healthy, gets {n0, n2} — a quorum — while A still holds: both holders'
//! acquisitions are recorded, and the history checker must report the I1 overlap. The same run
//! with quarantine on is clean: B is refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ecosphere::clock::to_mono_ns;
use ecosphere::history::{CheckConfig, CheckId, EventKind, History, Recorder, Report, Status};
use ecosphere::server::{Data, RedisServer};
use slate_combination::{CombinationLock, NodeSet, NodeSetOptions};

const LEASE: Duration = Duration::from_secs(2);

fn options() -> NodeSetOptions {
    NodeSetOptions::builder()
        .node_operation_time(Duration::from_millis(200))
        .reprobe_interval(Duration::from_millis(300))
        .quarantine(LEASE)
        .build()
        .unwrap()
}

fn lock(nodes: &NodeSet) -> CombinationLock {
    CombinationLock::builder(nodes, "c4c")
        .lease(LEASE)
        .build()
        .expect("lock")
}

/// Records one acquisition attempt of `lock` by `task` of `rec`; `Some(nodes)` if it won.
async fn try_recorded(
    rec: &Recorder,
    task: u64,
    lock: &CombinationLock,
) -> Option<slate_combination::CombinationLockGuard> {
    rec.record(
        task,
        "c4c",
        // Not a bare single attempt: a new node set first checks every node (INFO), and the
        // lease runs from the acquire commands that follow.
        EventKind::AcqInvoke {
            attempt: 1,
            budget_ms: None,
        },
    )
    .unwrap();
    match lock.try_lock().await {
        Ok(Some(g)) => {
            rec.record(
                task,
                "c4c",
                EventKind::AcqOk {
                    attempt: 1,
                    holder: g.holder().to_string(),
                    token: g.fencing_token().get(),
                    depth: 1,
                    deadline: to_mono_ns(g.lease().deadline()),
                    nodes: g.nodes().to_vec(),
                    permits: None,
                },
            )
            .unwrap();
            Some(g)
        }
        Ok(None) => {
            rec.record(
                task,
                "c4c",
                EventKind::AcqFail {
                    attempt: 1,
                    reason: "busy".into(),
                },
            )
            .unwrap();
            None
        }
        Err(e) => {
            assert!(e.is_insufficient_nodes(), "{e}");
            rec.record(
                task,
                "c4c",
                EventKind::AcqFail {
                    attempt: 1,
                    reason: e.to_string(),
                },
            )
            .unwrap();
            None
        }
    }
}

async fn release_recorded(rec: &Recorder, task: u64, g: slate_combination::CombinationLockGuard) {
    let holder = g.holder().to_string();
    rec.record(
        task,
        "c4c",
        EventKind::RelInvoke {
            holder: holder.clone(),
            depth_before: 1,
        },
    )
    .unwrap();
    let kind = match g.unlock().await {
        Ok(left) => EventKind::RelOk {
            holder,
            depth_after: left,
        },
        // A's entries on the restarted nodes are gone: its release reaches only n1.
        Err(e) => EventKind::RelInfo {
            holder,
            reason: e.to_string(),
        },
    };
    rec.record(task, "c4c", kind).unwrap();
}

/// The scenario; returns the checker's report and whether B won.
async fn run(quarantine: bool) -> (Report, bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut s = RedisServer::start_many(3).expect("redis-server");
    let a_nodes = NodeSet::connect(s.iter().map(RedisServer::url), options()).unwrap();
    assert_eq!(a_nodes.adopt_fresh_servers("slate:").await.unwrap(), 3);
    let a = Recorder::create(dir.path(), 0).unwrap();
    let b = Recorder::create(dir.path(), 1).unwrap();
    let ga = try_recorded(&a, 0, &lock(&a_nodes))
        .await
        .expect("A takes the free lock");
    assert_eq!(ga.nodes(), [0, 1, 2]);

    s[0].restart(Data::Wipe).unwrap();
    s[2].restart(Data::Wipe).unwrap();
    s[1].pause().unwrap();
    let mut opts = slate_combination::NodeSetOptionsBuilder::from(options());
    if !quarantine {
        opts = opts.disable_quarantine_unsafe();
    }
    let b_nodes = NodeSet::connect(s.iter().map(RedisServer::url), opts.build().unwrap()).unwrap();
    let gb = try_recorded(&b, 0, &lock(&b_nodes)).await;
    let b_won = gb.is_some();
    // A is still inside its lease: nothing told it (it cannot know before its next renewal).
    assert!(!ga.is_lost() || ga.lease().deadline() > std::time::Instant::now());
    if let Some(gb) = gb {
        release_recorded(&b, 0, gb).await;
    }
    s[1].resume().unwrap();
    release_recorded(&a, 0, ga).await;
    let report = History::load(dir.path())
        .unwrap()
        .check(&CheckConfig::new(LEASE));
    (report, b_won)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c4c_without_quarantine_the_checker_reports_the_overlap() {
    let (report, b_won) = run(false).await;
    println!("{report}");
    assert!(b_won, "B got a quorum of restarted-empty nodes");
    assert!(
        matches!(report.status(CheckId::Exclusion), Status::Fail(_)),
        "the checker must see the overlap"
    );
    // The restarted nodes' fencing counters started again: B's token does not exceed A's.
    assert_eq!(
        report.failed(),
        [CheckId::Exclusion, CheckId::Tokens],
        "exactly the overlap and the token order fail"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c4c_with_quarantine_the_same_run_is_clean() {
    let (report, b_won) = run(true).await;
    println!("{report}");
    assert!(!b_won, "quarantine keeps B out");
    report.assert_ok();
}
