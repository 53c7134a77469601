//! The library half of the `slate` command: what its demo (and its own tests) use to run
//! local `redis-server` processes without any test harness.
//!
//! The command itself is the `slate` binary of this package (`cargo install slate-cli`);
//! see the README for `slate run`, `status`, `unlock`, `nodes adopt` and `demo`.

#![forbid(unsafe_code)]

pub mod local;
