//! Holder identities: who holds a lock, independent of threads.

use std::fmt;
use std::future::Future;
use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Error;

/// The identity under which a lock is held.
///
/// A holder id is a process-unique random prefix of 128 bits plus a counter. It is never derived
/// from a thread: an async task may move between threads, and a thread may run many tasks.
/// Reentrancy is keyed by holder id: a lock acquired again by the **same holder** raises the
/// hold count instead of waiting.
///
/// ## How to re-enter
///
/// A fresh id is drawn for every acquisition unless the caller says otherwise, so two
/// unrelated `lock()` calls never re-enter each other by accident. There are three ways to
/// re-enter on purpose:
///
/// 1. pass the holder explicitly: `lock.lock_as(guard.holder())`;
/// 2. run a piece of code inside a holder scope, [`HolderId::scope`] (async, task-local) or
///    [`HolderId::sync_scope`] (a closure on this thread): every `lock()` inside the scope uses
///    the scope's holder, wherever the task is polled;
/// 3. use the lock's own re-entry method on a guard where the backend offers one.
///
/// Forking: the random prefix is re-drawn in a child process created with `fork()`, detected by
/// a change of process id, so a child never repeats its parent's ids.
///
/// # Examples
///
/// ```
/// use slate_core::HolderId;
///
/// let a = HolderId::new();
/// let b = HolderId::new();
/// assert_ne!(a, b);
/// let parsed: HolderId = a.to_string().parse()?;
/// assert_eq!(parsed, a);
/// # Ok::<(), slate_core::Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HolderId {
    prefix: u128,
    seq: u64,
}

tokio::task_local! {
    static TASK_HOLDER: HolderId;
}

std::thread_local! {
    static THREAD_HOLDER: std::cell::Cell<Option<HolderId>> = const { std::cell::Cell::new(None) };
}

/// The process prefix, tagged with the pid it was drawn in (a forked child re-draws).
static PREFIX: Mutex<Option<(u32, u128)>> = Mutex::new(None);
static SEQ: AtomicU64 = AtomicU64::new(1);

fn process_prefix() -> u128 {
    let pid = std::process::id();
    // A poisoned mutex only means another thread panicked while drawing; the value is still a
    // plain integer pair, so taking it over is sound.
    let mut slot = PREFIX.lock().unwrap_or_else(|p| p.into_inner());
    match *slot {
        Some((owner, prefix)) if owner == pid => prefix,
        _ => {
            let prefix = draw_prefix();
            *slot = Some((pid, prefix));
            prefix
        }
    }
}

fn draw_prefix() -> u128 {
    let mut buf = [0u8; 16];
    if getrandom::fill(&mut buf).is_ok() {
        return u128::from_le_bytes(buf);
    }
    // The OS random source failed (practically never on Linux). Fall back to std's per-process
    // randomly keyed hasher mixed with the pid and the time: still unique per process, though
    // not cryptographically strong.
    use std::hash::{BuildHasher, Hasher};
    let state = std::collections::hash_map::RandomState::new();
    let mut hi = state.build_hasher();
    hi.write_u32(std::process::id());
    let mut lo = state.build_hasher();
    lo.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    (u128::from(hi.finish()) << 64) | u128::from(lo.finish())
}

impl HolderId {
    /// Draws a new, process-unique holder id.
    ///
    /// # Examples
    ///
    /// ```
    /// let id = slate_core::HolderId::new();
    /// assert_eq!(id.to_string().len(), 32 + 1 + id.seq().to_string().len());
    /// ```
    #[must_use]
    pub fn new() -> Self {
        HolderId {
            prefix: process_prefix(),
            seq: SEQ.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// The holder of the enclosing scope, or a fresh id when there is none.
    ///
    /// The task-local scope of [`HolderId::scope`] wins over the thread scope of
    /// [`HolderId::sync_scope`].
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_core::HolderId;
    ///
    /// let id = HolderId::new();
    /// id.sync_scope(|| assert_eq!(HolderId::current(), id));
    /// assert_ne!(HolderId::current(), id);
    /// ```
    #[must_use]
    pub fn current() -> Self {
        Self::scoped().unwrap_or_default()
    }

    /// The holder of the enclosing scope, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// assert!(slate_core::HolderId::scoped().is_none());
    /// ```
    #[must_use]
    pub fn scoped() -> Option<Self> {
        TASK_HOLDER
            .try_with(|h| *h)
            .ok()
            .or_else(|| THREAD_HOLDER.with(|c| c.get()))
    }

    /// Runs `fut` with `self` as the current holder: every acquisition inside it that does not
    /// name a holder uses this one, so nested `lock()` calls re-enter.
    ///
    /// The scope is task-local, not thread-local: it follows the future wherever it is polled.
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_core::HolderId;
    ///
    /// # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
    /// let id = HolderId::new();
    /// id.scope(async move { assert_eq!(HolderId::current(), id) }).await;
    /// # });
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future drops `fut`; the scope ends with it.
    pub async fn scope<F: Future>(self, fut: F) -> F::Output {
        TASK_HOLDER.scope(self, fut).await
    }

    /// Runs `f` on this thread with `self` as the current holder (the thread twin of
    /// [`HolderId::scope`], for blocking callers).
    ///
    /// # Examples
    ///
    /// ```
    /// use slate_core::HolderId;
    ///
    /// let id = HolderId::new();
    /// assert_eq!(id.sync_scope(HolderId::current), id);
    /// ```
    pub fn sync_scope<R>(self, f: impl FnOnce() -> R) -> R {
        struct Restore(Option<HolderId>);
        impl Drop for Restore {
            fn drop(&mut self) {
                THREAD_HOLDER.with(|c| c.set(self.0));
            }
        }
        let _restore = Restore(THREAD_HOLDER.with(|c| c.replace(Some(self))));
        f()
    }

    /// The 128-bit process prefix.
    ///
    /// # Examples
    ///
    /// ```
    /// let (a, b) = (slate_core::HolderId::new(), slate_core::HolderId::new());
    /// assert_eq!(a.prefix(), b.prefix());
    /// ```
    #[must_use]
    pub fn prefix(&self) -> u128 {
        self.prefix
    }

    /// The per-process sequence number.
    ///
    /// # Examples
    ///
    /// ```
    /// let (a, b) = (slate_core::HolderId::new(), slate_core::HolderId::new());
    /// assert!(b.seq() > a.seq());
    /// ```
    #[must_use]
    pub fn seq(&self) -> u64 {
        self.seq
    }
}

impl Default for HolderId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}:{}", self.prefix, self.seq)
    }
}

impl fmt::Debug for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HolderId({self})")
    }
}

impl FromStr for HolderId {
    type Err = Error;

    /// Parses the `Display` form, `<32 hex digits>:<decimal counter>`.
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || {
            Error::invalid_input(
                "holder id",
                format!("{s:?} is not a holder id"),
                "use the text a HolderId displays as: 32 hex digits, ':', a decimal counter",
            )
        };
        let (prefix, seq) = s.split_once(':').ok_or_else(bad)?;
        if prefix.len() != 32 || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        if seq.is_empty() || !seq.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        Ok(HolderId {
            prefix: u128::from_str_radix(prefix, 16).map_err(|_| bad())?,
            seq: seq.parse().map_err(|_| bad())?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_rejects_garbage() {
        for s in [
            "",
            ":",
            "abc:1",
            &format!("{}:1", "g".repeat(32)),
            &format!("{}:", "a".repeat(32)),
        ] {
            let err = s.parse::<HolderId>().unwrap_err();
            assert!(err.is_invalid_input(), "{s:?}: {err}");
        }
        assert!(
            format!("{}:-1", "a".repeat(32))
                .parse::<HolderId>()
                .is_err()
        );
    }

    #[test]
    fn ids_are_unique_and_share_prefix() {
        let ids: std::collections::HashSet<_> = (0..10_000).map(|_| HolderId::new()).collect();
        assert_eq!(ids.len(), 10_000);
        let prefixes: std::collections::HashSet<_> = ids.iter().map(|h| h.prefix()).collect();
        assert_eq!(prefixes.len(), 1);
    }

    #[test]
    fn sync_scope_nests_and_restores() {
        let (a, b) = (HolderId::new(), HolderId::new());
        a.sync_scope(|| {
            assert_eq!(HolderId::current(), a);
            b.sync_scope(|| assert_eq!(HolderId::current(), b));
            assert_eq!(HolderId::current(), a);
        });
        assert_eq!(HolderId::scoped(), None);
    }
}
