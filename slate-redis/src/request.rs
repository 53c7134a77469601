//! Request ids: what makes acquire and release idempotent.
//!
//! A command whose reply is lost (the connection broke after the server ran it) leaves the
//! caller unsure whether it ran. Sending it again must not apply it twice: a second re-entry
//! would leave the holder one level deeper than it believes, a lock its renewal then keeps
//! forever; a second release would take a level from an outer hold, or answer *not held*
//! after the first one freed the lock.
//!
//! So every acquire and release call draws a request id, and the scripts keep the holder's
//! last request and its answer in a small *request record* (`<lock key>:req:<holder>`, see
//! `scripts/acquire.lua`). A retry with the same id gets the first answer back and changes
//! nothing. The record lives for the *retry window* (two command timeouts, at least 100 ms):
//! retries are sent within one command timeout of the first send.
//!
//! The same record lets a caller that gave up on an acquire (its reply timed out) *undo* it
//! exactly: the undo releases the level if that acquire ran, and otherwise marks it
//! cancelled, so that the acquire does nothing if it runs later (a hung server resuming).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::scripts;

static NEXT: AtomicU64 = AtomicU64::new(1);

/// A fresh request id, unique in this process (records are per holder, and holder ids are
/// unique across processes, so the pair is unique everywhere).
pub(crate) fn next_id() -> u64 {
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// How long a request record is kept, in ms, for a client with `command_timeout`.
pub(crate) fn record_ttl_ms(command_timeout: Duration) -> u64 {
    scripts::lease_ms((command_timeout * 2).max(Duration::from_millis(100)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct_and_the_window_covers_a_retry() {
        let (a, b) = (next_id(), next_id());
        assert_ne!(a, b);
        assert_eq!(record_ttl_ms(Duration::from_secs(2)), 4_000);
        assert_eq!(record_ttl_ms(Duration::from_millis(10)), 100);
    }
}
