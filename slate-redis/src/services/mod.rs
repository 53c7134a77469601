//! The background services a client runs for all its locks: lease renewal (one pipeline per
//! period for every hold) and release notifications (one pub/sub connection).

pub(crate) mod notify;
pub(crate) mod renewal;
