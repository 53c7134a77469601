//! `ecosphere`: Slate's end-to-end scenario suite.
//!
//! The harness starts real `redis-server` processes on loopback and breaks them on purpose
//! ([`server`], [`proxy`]), runs multi-process workers ([`workers`]), and decides from recorded
//! event histories whether a run kept mutual exclusion ([`history`]).
//!
//! This crate is never published; every Slate crate uses it as a dev-dependency.

pub mod clock;
pub mod commandstats;
pub mod history;
pub mod proxy;
pub mod server;
pub mod workers;
