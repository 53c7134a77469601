//! The combination lock: one lock held across N independent Redis masters, so that losing a
//! node does not lose the lock.
//!
//! Nodes are taken in the configured order; "leftmost weight" decides between contenders (the
//! first node held by another holder ends an attempt); a majority quorum keeps two holders
//! from holding disjoint node sets. The attempt's decisions are a pure, separately tested
//! state machine: [`decision`].

#![forbid(unsafe_code)]

pub mod decision;
