//! The mutex the synchronizer's state lives in: std's, or loom's under `--cfg slate_loom`.

#[cfg(slate_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(slate_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
