//! The combination lock's metrics (issue 32), read with the `metrics-util` debugging
//! recorder: its acquisitions and holds under `primitive = backend = "combination"`, its
//! nodes' renewals, and a node quarantined after it restarted empty.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use slate_combination::CombinationLock;
use slate_harness::server::Data;

/// A node restarted without its data is quarantined (counted once per quarantine), while
/// the acquisitions before it are counted as the combination lock's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_renewals_and_a_quarantine_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshots = recorder.snapshotter();
    recorder.install().unwrap();
    let mut totals = std::collections::HashMap::<String, u64>::new();
    let mut read = move || {
        for (key, _, _, value) in snapshots.snapshot().into_vec() {
            if let DebugValue::Counter(n) = value {
                let k = key.key();
                let mut labels: Vec<String> = k
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                labels.sort();
                *totals
                    .entry(format!("{}{{{}}}", k.name(), labels.join(",")))
                    .or_default() += n;
            }
        }
        totals.clone()
    };
    let sum = |t: &std::collections::HashMap<String, u64>, name: &str, label: &str| -> u64 {
        t.iter()
            .filter(|(k, _)| k.starts_with(&format!("{name}{{")) && k.contains(label))
            .map(|(_, v)| *v)
            .sum()
    };

    let mut s = servers(3);
    let nodes = view_of(urls(&s), opts(Duration::from_millis(200)));
    adopt(&nodes).await;
    let lock = |name: &str| {
        CombinationLock::builder(&nodes, name)
            .lease(Duration::from_secs(1))
            .build()
            .unwrap()
    };
    let g = lock("m-comb").lock().await.unwrap();
    let t = read();
    assert_eq!(
        sum(&t, "slate_acquisitions_total", "primitive=combination"),
        1,
        "{t:?}"
    );
    let until = Instant::now() + Duration::from_secs(5);
    while sum(&read(), "slate_renewals_total", "primitive=combination") < 3 {
        assert!(Instant::now() < until, "no node renewal counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    g.unlock().await.unwrap();
    assert_eq!(
        sum(&read(), "slate_quarantines_total", ""),
        0,
        "nothing restarted yet"
    );
    assert_eq!(sum(&read(), "slate_lease_lost_total", ""), 0);

    s[0].kill().unwrap();
    s[0].restart(Data::Wipe).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    let mut i = 0;
    while sum(&read(), "slate_quarantines_total", "backend=combination") == 0 {
        assert!(
            Instant::now() < until,
            "the emptied node was not quarantined"
        );
        i += 1;
        if let Ok(Some(g)) = lock(&format!("m-after-{i}")).try_lock().await {
            g.unlock().await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Attempts while it stays quarantined verify it again: no new quarantine.
    for j in 0..5 {
        if let Ok(Some(g)) = lock(&format!("m-later-{j}")).try_lock().await {
            g.unlock().await.unwrap();
        }
    }
    assert_eq!(
        sum(&read(), "slate_quarantines_total", "backend=combination"),
        1,
        "one quarantine is counted once"
    );
}
