//! Correctness III (issue 28): the combination lock's defects, each with a test named after its
//! item that fails on the code before the fix.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use slate_combination::{CombinationLock, Order};
use slate_core::LossReason;

const OP: Duration = Duration::from_millis(300);

/// Item 8: a hold whose quorum was lost (two of three nodes paused) kept renewing the entry on
/// the node it still reached, until its guard was dropped: that node stayed taken, and with
/// the other two back a competitor found it busy for as long as the lost guard lived. The
/// surviving nodes' renewals now stop at the loss, and their entries run out with the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn i8_a_hold_that_lost_its_quorum_stops_renewing_the_node_it_kept() {
    let mut s = servers(3);
    let nodes = view_of(urls(&s), opts(OP));
    adopt(&nodes).await;
    let lease = Duration::from_secs(2);
    let lock = CombinationLock::builder(&nodes, "i8")
        .lease(lease)
        .order(Order::Sequential)
        .build()
        .unwrap();
    let guard = lock.lock().await.unwrap();
    assert_eq!(guard.nodes(), &[0, 1, 2]);
    s[1].pause().unwrap();
    s[2].pause().unwrap();
    let reason = tokio::time::timeout(lease * 2, guard.lease().lost())
        .await
        .expect("the loss is reported within two leases");
    // The combined deadline passes first, or the aggregation sees the quorum gone first.
    assert!(
        matches!(
            reason,
            LossReason::QuorumLost { .. } | LossReason::DeadlineExpired
        ),
        "{reason:?}"
    );
    assert!(
        exists(&s[0], "i8"),
        "node 0 still has the entry at the loss"
    );
    // Two leases: renewed every third of a lease, the entry would never run out.
    wait_for(lease * 2, "node 0's entry to run out", || {
        (!exists(&s[0], "i8")).then_some(())
    })
    .await;
    s[1].resume().unwrap();
    s[2].resume().unwrap();
    drop(guard);
}
