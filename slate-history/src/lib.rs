//! `slate-history`: record what the holders of a distributed lock did, from many processes,
//! and decide whether the run kept the lock's promises.
//!
//! - [`history`]: the event model, a per-process [`Recorder`](history::Recorder) writing JSON
//!   lines, and the checker ([`History::check`](history::History::check)) that decides mutual
//!   exclusion (I1), fenced order (I2), fencing tokens (I3), ownership (I5), reentry (I6),
//!   validity accounting, activity inside validity windows, a shared counter and quiescence,
//!   with counterexamples.
//! - [`clock`]: the one monotonic timescale all processes of a machine stamp events with.
//! - [`commandstats`]: lock commands per acquisition, from a Redis server's
//!   `INFO commandstats`.
//! - [`logged`]: a lock call and its events, recorded the same way by every worker (the
//!   demo's and the scenario suite's).
//!
//! Slate's fault matrix (`ecosphere`, not published) and `slate demo` judge every run with it;
//! it is published so that an application can check its own use of a lock the same way.

#![forbid(unsafe_code)]

pub mod clock;
pub mod commandstats;
pub mod history;
pub mod logged;
