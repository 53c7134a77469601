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
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::scripts;

static LAST: AtomicU64 = AtomicU64::new(0);

/// A fresh request id: above every id this process drew before, and at least the wall clock
/// in µs (records are per holder, and holder ids are unique across processes, so the pair is
/// unique everywhere).
///
/// The order matters: a request older than its holder's record does nothing (an acquire
/// that stalled on its way must not run after a later one of the same holder). The clock floor makes ids of different processes comparable too (a holder named
/// in two processes, one of them just started), up to their clocks' difference; ~1.8e15 now,
/// far from 2^53, so the scripts' comparisons stay exact.
pub(crate) fn next_id() -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let prev = LAST
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            Some(last.saturating_add(1).max(now))
        })
        .unwrap_or_else(|last| last);
    prev.saturating_add(1).max(now)
}

/// The acquire scripts' (and the single lock's release script's) answer to a request older
/// than its holder's request record (`acquire.lua`, `release.lua`, `shared_acquire.lua`): it
/// was overtaken by a later request of the same
/// holder (another task's, sent after it but run before) and did nothing.
pub(crate) const OVERTAKEN: i64 = -7;

/// How many times an overtaken request is sent again under a fresh id before its answer
/// stands (the callers then read it as busy).
pub(crate) const OVERTAKEN_RESENDS: u32 = 3;

/// Sends a request under a fresh id, and again under another while the script answers
/// [`OVERTAKEN`] (at most [`OVERTAKEN_RESENDS`] times): nothing ran, so nothing is undone.
/// Returns the last outcome and the id it was sent under (what an undo must name).
pub(crate) async fn send_fresh<F, Fut>(mut send: F) -> (crate::Result<Vec<i64>>, u64)
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = crate::Result<Vec<i64>>>,
{
    let mut resends = 0;
    loop {
        let id = next_id();
        let outcome = send(id).await;
        match &outcome {
            Ok(reply) if *reply == [OVERTAKEN] && resends < OVERTAKEN_RESENDS => resends += 1,
            _ => return (outcome, id),
        }
    }
}

/// How long a request record is kept, in ms, for a client with `command_timeout`.
pub(crate) fn record_ttl_ms(command_timeout: Duration) -> u64 {
    scripts::lease_ms((command_timeout * 2).max(Duration::from_millis(100)))
}

/// Whether a request that failed with `e` should be undone by its id: it may have run (no
/// reply, an error after it, or one raised half-way), unless the user may not run the script
/// at all (then the undo would be refused too).
pub(crate) fn worth_undoing(e: &slate_core::Error) -> bool {
    !matches!(
        e.backend_kind(),
        Some(slate_core::BackendKind::Permission | slate_core::BackendKind::Auth)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_distinct_and_the_window_covers_a_retry() {
        let (a, b) = (next_id(), next_id());
        assert!(b > a, "ids grow: {a} then {b}");
        assert!(a > 1_700_000_000_000_000, "at least the clock in µs: {a}");
        assert_eq!(record_ttl_ms(Duration::from_secs(2)), 4_000);
        assert_eq!(record_ttl_ms(Duration::from_millis(10)), 100);
    }
}
