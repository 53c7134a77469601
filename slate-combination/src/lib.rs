//! The combination lock: one lock held across N independent Redis masters, so that losing a
//! node does not lose the lock.
//!
//! Nodes are taken in the configured order; "leftmost weight" decides between contenders (the
//! first node held by another holder ends an attempt); a majority quorum keeps two holders
//! from holding disjoint node sets. The attempt's decisions are a pure, separately tested
//! state machine: [`decision`].
//!
//! ## Fencing token
//!
//! Every node keeps its own counter (`<prefix>{<name>}:fence`), raised by each first-level
//! acquisition on that node. The token of a hold is the **maximum** of the counters of the
//! nodes it holds; before the guard is returned, every held node whose counter is behind is
//! raised to the token ("write-back"; in steady state all counters agree and nothing is
//! written). The acquisition succeeds only if at least `N − q + 1` nodes carry the token
//! afterwards, where `q` is the smallest quorum any process may use (the default,
//! `max(2, ⌊N/2⌋ + 1)`), whatever quorum this handle uses.
//!
//! *Guarantee*: a later first-level holder's token is strictly greater, because its quorum
//! (at least `q` nodes) shares a node with every set of `N − q + 1` nodes, and that node's
//! counter is already at our token when the later holder increments it. Re-entries keep the
//! token. (Counted from the handle's own quorum, a process with a larger one fenced on fewer
//! nodes, which a later default quorum could miss.)
//!
//! *When it does not hold*: a node that loses its data (restart without persistence) restarts
//! its counter; the token still grows as long as another node of each later quorum kept the
//! written-back value, and the restarted node is quarantined (see [`NodeSet`]) so the lock's
//! exclusion is not broken by it. If so many nodes lose their data that a later quorum
//! consists only of them, tokens may repeat; the same data loss would break the quorum's
//! exclusion too.

#![forbid(unsafe_code)]

mod competitor;
pub mod decision;
pub mod lease;
mod lock;
mod node_set;

pub use decision::Order;
#[allow(deprecated)]
pub use lock::CombinationGuard;
pub use lock::{CombinationLock, CombinationLockBuilder, CombinationLockGuard};
pub use node_set::{NodeSet, NodeSetOptions, NodeSetOptionsBuilder};
// Everything the examples and a typical caller need, so that depending on `slate-combination`
// alone is enough (the traits are only needed for generic code).
pub use slate_core::{
    AnyGuard, AnyLock, BackendKind, DistributedLock, Error, FencingToken, Hold, HolderId,
    LeaseWatch, LockGuard, LockName, LockOptions, LockOptionsBuilder, LossReason, NodeReport,
    NodeState, Result, TimeoutKind, Wait,
};
pub use slate_redis::{ClientOptions, ClientOptionsBuilder, RedisClient};
