//! `slate-harness`: the test harness of Slate's suites, which knows nothing of Slate.
//!
//! It starts real `redis-server` processes on loopback (standalone [`server`]s, a Redis
//! [`cluster`], a [`sentinel`] group) and real ZooKeeper servers (a standalone one and an
//! ensemble, [`zookeeper`]), breaks them on purpose ([`server`]'s pause, kill and restart,
//! [`proxy`] faults, [`netns`] network namespaces, [`cgroup`] CPU starvation), runs
//! multi-process [`workers`], prints and replays [`seed`]s, and drives a future on a runtime
//! nobody else drives ([`undriven`]).
//!
//! A missing server binary fails loudly with an install hint; nothing here skips. The lock
//! crates' tests, the scenario suite (`slate-harness`) and the benchmarks depend on it; no
//! product crate does. Never published.

#![forbid(unsafe_code)]

pub mod cgroup;
pub mod cluster;
pub mod netns;
pub mod proxy;
pub mod seed;
pub mod sentinel;
pub mod server;
pub mod undriven;
pub mod workers;
pub mod zookeeper;
