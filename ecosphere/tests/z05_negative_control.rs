//! **Z5** negative control: two workers on different roots "share" a name; the checker must
//! report the overlap (I1).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod scenario;

use std::time::Duration;

use ecosphere::history::{CheckConfig, CheckId, Status};
use ecosphere::zookeeper::ZkEnsemble;
use scenario::zookeeper::*;
use scenario::*;

#[test]
fn z05_negative_control_different_roots_do_not_exclude() {
    let ensemble = ZkEnsemble::start(3).expect("ZooKeeper ensemble");
    let servers = ensemble.connect_string();
    let resource = server();
    let root = tempfile::tempdir().unwrap();
    // the negative control: different roots do not exclude each other.
    let z = Phase::new(root.path(), "z5", &resource, &servers);
    let mut w = z.first("contend", &servers);
    w.iterations = 30;
    w.hold = Duration::ZERO;
    let mut a = w.clone();
    a.zk_root = Some("/left".into());
    let mut b = w;
    b.zk_root = Some("/right".into());
    b.proc_base = 1;
    let mut wa = a.spawn(1);
    let mut wb = b.spawn(1);
    finish_ok(&mut wa, Duration::from_secs(40));
    finish_ok(&mut wb, Duration::from_secs(40));
    let (_h, report) = check(&z.history, &CheckConfig::new(SESSION));
    let exclusion = report.status(CheckId::Exclusion);
    println!("Z5 (negative control): exclusion = {exclusion:?}");
    assert!(
        matches!(exclusion, Status::Fail(_)),
        "the checker must catch two holders that do not exclude each other"
    );
}
