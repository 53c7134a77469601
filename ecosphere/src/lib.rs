//! `ecosphere`: Slate's end-to-end scenario suite.
//!
//! The harness starts real `redis-server` processes on loopback (standalone [`server`]s, a Redis
//! [`cluster`], a [`sentinel`] group) and real ZooKeeper servers (a standalone one and an
//! ensemble, [`zookeeper`]) and breaks them on purpose ([`server`], [`proxy`]), runs multi-process workers ([`workers`]), and decides from recorded
//! event histories whether a run kept mutual exclusion ([`history`]).
//!
//! The CI runs the smoke subset of the fault matrix; the full matrix (longer and rarer
//! scenarios, marked `#[cfg_attr(not(feature = "full-matrix"), ignore)]`) runs with
//! `cargo test -p ecosphere --features full-matrix` (see `docs/RELIABILITY.md`). Seeds are
//! printed by [`seed`] and replayed with `SLATE_SEED`.
//!
//! The harness itself (servers, proxies, namespaces, cgroups, workers) is the crate
//! `slate-harness`, which knows nothing of Slate; this crate adds the worker binary that
//! drives the locks, the history checker's re-exports, and the scenarios. Never published.

pub mod worker;

pub use slate_harness::{
    cgroup, cluster, netns, proxy, seed, sentinel, server, undriven, workers, zookeeper,
};

// The history recorder and checker, the shared clock and the command counts live in the
// published crate `slate-history` (the `slate` command's demo uses them too).
pub use slate_history::{clock, commandstats, history};
