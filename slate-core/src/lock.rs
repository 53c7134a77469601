//! The lock and guard contract every backend implements.

use std::future::Future;
use std::ops::Deref;
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::hold::Hold;
use crate::holder::HolderId;
use crate::name::LockName;

/// How long an acquisition may wait.
///
/// # Examples
///
/// ```
/// use slate_core::Wait;
/// use std::time::Duration;
///
/// assert_eq!(Wait::for_duration(Duration::MAX), Wait::Forever);
/// assert!(matches!(Wait::for_duration(Duration::from_secs(1)), Wait::Until(_)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// At most one remote attempt; never waits. A busy lock answers [`Error::Busy`].
    ///
    /// [`Error::Busy`]: crate::Error::Busy
    Immediate,
    /// Wait in the queue until this instant, then [`Error::Timeout`].
    ///
    /// [`Error::Timeout`]: crate::Error::Timeout
    Until(Instant),
    /// Wait until acquired (or the future is dropped).
    Forever,
}

impl Wait {
    /// A wait of at most `d` from now (`Forever` if the instant would overflow).
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert_ne!(slate_core::Wait::for_duration(Duration::ZERO), slate_core::Wait::Forever);
    /// ```
    #[must_use]
    pub fn for_duration(d: Duration) -> Self {
        Instant::now()
            .checked_add(d)
            .map_or(Wait::Forever, Wait::Until)
    }

    /// The deadline, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_core::Wait::Forever.deadline(), None);
    /// ```
    #[must_use]
    pub fn deadline(self) -> Option<Instant> {
        match self {
            Wait::Until(t) => Some(t),
            Wait::Immediate | Wait::Forever => None,
        }
    }
}

/// A held lock.
///
/// Every guard dereferences to its [`Hold`]: holder, fencing token, depth and lease, with
/// their accessors (`guard.fencing_token()`, `guard.lost().await`...), written once.
///
/// ## Contract
///
/// - [`unlock`](LockGuard::unlock) releases one level and reports the outcome.
/// - Dropping a guard without `unlock`, or dropping the `unlock` future (even before its
///   first poll), hands the release to a background task: it never blocks and never leaks the
///   entry (at worst the entry outlives the guard by one command round trip, or, if the
///   backend is unreachable, until its lease runs out).
/// - The lease deadline moves forward with every renewal; the loss signal fires when renewal
///   finds the entry gone or cannot renew before the deadline. After a loss, stop acting as
///   the holder: another holder may already have the lock.
/// - Guards are `Send + 'static`: hold one across `.await` points and move it between tasks.
///
/// # Examples
///
/// ```
/// use slate_core::LockGuard;
///
/// fn describe<G: LockGuard>(guard: &G) -> String {
///     format!("{} holds level {} with token {}", guard.holder(), guard.depth(), guard.fencing_token())
/// }
/// ```
pub trait LockGuard: Deref<Target = Hold> + Send + Sync + 'static {
    /// The nodes this hold is on, ascending: a combination lock's; empty for a lock on one
    /// server (or one ZooKeeper ensemble).
    fn nodes(&self) -> &[usize] {
        &[]
    }

    /// How many permits of a shared lock's capacity this hold takes (a semaphore's permits;
    /// 1 for a read, [`WRITE_PERMITS`] for a write); `None` for an exclusive lock.
    fn permits(&self) -> Option<u64> {
        None
    }

    /// Releases one level of this hold and returns the holder's remaining hold count: how many
    /// levels the same holder still holds through its other guards (0: the holder no longer
    /// holds the lock). Every backend gives it the same meaning, whatever order re-entrant
    /// guards are released in.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when the entry is gone (lease expired, force-unlocked);
    /// [`Error::Backend`] when the backend failed; the lock then frees when its lease runs out.
    ///
    /// # Cancel safety
    ///
    /// The release starts when this is called: a dropped future (even one never polled) still
    /// completes it in the background, exactly once; only the outcome is lost.
    ///
    /// [`Error::NotHeld`]: crate::Error::NotHeld
    /// [`Error::Backend`]: crate::Error::Backend
    fn unlock(self) -> impl Future<Output = Result<u32>> + Send;
}

/// The permits a write hold of a read-write lock takes: its whole capacity, so that no read
/// (1 permit) fits beside it.
pub const WRITE_PERMITS: u64 = 1 << 30;

/// A distributed, reentrant, leased lock.
///
/// Backends implement [`acquire`](DistributedLock::acquire) and the queries; the
/// convenience methods pick the holder with [`HolderId::current`] (the enclosing holder scope,
/// or a fresh id) when the call is made.
///
/// | method | waits | busy lock gives |
/// | --- | --- | --- |
/// | `lock()` | until acquired | (waits) |
/// | `try_lock()` | never; one remote attempt | `Ok(None)` |
/// | `try_lock_for(d)` / `try_lock_until(t)` | in the queue, at most until the deadline | `Err(Timeout)` |
pub trait DistributedLock: Clone + Send + Sync + 'static {
    /// The guard this lock returns.
    type Guard: LockGuard;

    /// The lock's name.
    fn name(&self) -> &LockName;

    /// Acquires the lock for `holder`, waiting as `wait` allows.
    ///
    /// # Errors
    ///
    /// `Busy` for a busy lock under [`Wait::Immediate`]; `Timeout` when the deadline of
    /// [`Wait::Until`] passes; backend and node errors as the backend reports them.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future removes the caller from the wait queue and passes on
    /// any wake-up it had received; a grant the backend obtained for a dropped future is
    /// released, never leaked.
    fn acquire(
        &self,
        holder: HolderId,
        wait: Wait,
    ) -> impl Future<Output = Result<Self::Guard>> + Send;

    /// Acquires for the current holder, waiting as `wait` allows: the enclosing
    /// [`HolderId::scope`]'s holder, else a fresh one that nobody else can name, which a
    /// backend that passes holds inside a process (lock cohorting) may hand a local holder's
    /// hold. [`lock`](DistributedLock::lock), [`try_lock`](DistributedLock::try_lock),
    /// [`try_lock_for`](DistributedLock::try_lock_for) and
    /// [`try_lock_until`](DistributedLock::try_lock_until) are this with their waits, so
    /// generic code gets what the backend's own methods give. The default acquires for
    /// [`HolderId::current`] (right for a backend that passes no holds).
    ///
    /// # Errors
    ///
    /// As [`acquire`](DistributedLock::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](DistributedLock::acquire).
    fn acquire_current(&self, wait: Wait) -> impl Future<Output = Result<Self::Guard>> + Send {
        self.acquire(HolderId::current(), wait)
    }

    /// Waits until the lock is acquired for the current holder.
    ///
    /// # Errors
    ///
    /// Backend failures that make waiting pointless (invalid configuration, authentication).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](DistributedLock::acquire).
    fn lock(&self) -> impl Future<Output = Result<Self::Guard>> + Send {
        self.acquire_current(Wait::Forever)
    }

    /// Waits until the lock is acquired for `holder` (re-enters if `holder` holds it).
    ///
    /// # Errors
    ///
    /// As [`lock`](DistributedLock::lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](DistributedLock::acquire).
    fn lock_as(&self, holder: HolderId) -> impl Future<Output = Result<Self::Guard>> + Send {
        self.acquire(holder, Wait::Forever)
    }

    /// One remote attempt, never waiting: `Ok(None)` if another holder has the lock.
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](DistributedLock::acquire).
    fn try_lock(&self) -> impl Future<Output = Result<Option<Self::Guard>>> + Send {
        let attempt = self.acquire_current(Wait::Immediate);
        async move { busy_to_none(attempt.await) }
    }

    /// Waits at most `d` (in the queue, like everyone else).
    ///
    /// # Errors
    ///
    /// `Timeout` when `d` passes first; backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](DistributedLock::acquire).
    fn try_lock_for(&self, d: Duration) -> impl Future<Output = Result<Self::Guard>> + Send {
        self.acquire_current(Wait::for_duration(d))
    }

    /// Waits at most until `deadline`.
    ///
    /// # Errors
    ///
    /// `Timeout` when the deadline passes first; backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`acquire`](DistributedLock::acquire).
    fn try_lock_until(
        &self,
        deadline: Instant,
    ) -> impl Future<Output = Result<Self::Guard>> + Send {
        self.acquire_current(Wait::Until(deadline))
    }

    /// Whether any holder holds the lock.
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    fn is_locked(&self) -> impl Future<Output = Result<bool>> + Send;

    /// How many times `holder` holds the lock (0 if not at all).
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    fn hold_count(&self, holder: HolderId) -> impl Future<Output = Result<u32>> + Send;

    /// Whether `holder` holds the lock.
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    fn is_held_by(&self, holder: HolderId) -> impl Future<Output = Result<bool>> + Send {
        let count = self.hold_count(holder);
        async move { Ok(count.await? > 0) }
    }

    /// The remaining lease of whoever holds the lock, or `None` when it is free.
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    fn remaining_lease(&self) -> impl Future<Output = Result<Option<Duration>>> + Send;

    /// Deletes the lock whoever holds it. **Unsafe for correctness**: the holder keeps
    /// running its critical section. Meant for operators clearing a stuck lock. Returns how
    /// many holds it dropped: 0 when the lock was free, at most 1 for an exclusive lock, the
    /// holders for a shared one (every primitive answers the same way).
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// The deletion may or may not have happened when the future is dropped.
    fn force_unlock(&self) -> impl Future<Output = Result<u64>> + Send;
}

/// The answer of a `try_lock`: a busy lock ([`Error::Busy`]) becomes `Ok(None)`, every other
/// outcome passes through. Shared by every backend's `try_lock`.
///
/// # Examples
///
/// ```
/// use slate_core::{lock::busy_to_none, Error};
///
/// assert!(matches!(busy_to_none::<u8>(Err(Error::busy("a", None))), Ok(None)));
/// assert!(matches!(busy_to_none(Ok(1)), Ok(Some(1))));
/// assert!(busy_to_none::<u8>(Err(Error::closed("x"))).is_err());
/// ```
///
/// # Errors
///
/// Every error but [`Error::Busy`].
///
/// [`Error::Busy`]: crate::Error::Busy
pub fn busy_to_none<G>(result: Result<G>) -> Result<Option<G>> {
    match result {
        Ok(guard) => Ok(Some(guard)),
        Err(e) if e.is_busy() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Implements [`DistributedLock`] for a lock type by delegating to its inherent methods of the
/// same names (`name`, `acquire`, `is_locked`, `hold_count`, `remaining_lease`,
/// `force_unlock`), which every lock has so that the common path needs no trait import, and
/// [`acquire_current`](DistributedLock::acquire_current) to its `acquire_for(None, wait)`, the
/// acquisition its own `lock()` makes (for the current holder, passable where it passes holds).
///
/// # Examples
///
/// ```text
/// slate_core::delegate_distributed_lock!(SingleLock, SingleLockGuard);
/// ```
#[macro_export]
macro_rules! delegate_distributed_lock {
    ($lock:ident, $guard:ty) => {
        impl $crate::DistributedLock for $lock {
            type Guard = $guard;

            fn name(&self) -> &$crate::LockName {
                $lock::name(self)
            }

            fn acquire(
                &self,
                holder: $crate::HolderId,
                wait: $crate::Wait,
            ) -> impl ::std::future::Future<Output = $crate::Result<$guard>> + Send {
                $lock::acquire(self, holder, wait)
            }

            fn acquire_current(
                &self,
                wait: $crate::Wait,
            ) -> impl ::std::future::Future<Output = $crate::Result<$guard>> + Send {
                $lock::acquire_for(self, None, wait)
            }

            fn is_locked(&self) -> impl ::std::future::Future<Output = $crate::Result<bool>> + Send {
                $lock::is_locked(self)
            }

            fn hold_count(
                &self,
                holder: $crate::HolderId,
            ) -> impl ::std::future::Future<Output = $crate::Result<u32>> + Send {
                $lock::hold_count(self, holder)
            }

            fn remaining_lease(
                &self,
            ) -> impl ::std::future::Future<Output = $crate::Result<Option<::std::time::Duration>>> + Send
            {
                $lock::remaining_lease(self)
            }

            fn force_unlock(&self) -> impl ::std::future::Future<Output = $crate::Result<u64>> + Send {
                $lock::force_unlock(self)
            }
        }
    };
}

/// Writes a lock's inherent waiting methods, the same on every lock: `lock`, `lock_as`,
/// `try_lock`, `try_lock_for` and `try_lock_until`, over its `acquire(holder, wait)` and its
/// `acquire_for(Option<HolderId>, wait)` (written too, with `blocking_acquire`, for a lock
/// given as `sync = <field path>` of its synchronizer; the acquisition for the current holder, see
/// [`DistributedLock::acquire_current`]), each reading the current holder when it is called
/// (not when its future is first polled). `setup` is the hidden first lines of every example,
/// ending with a `lock` in scope; `errors` is what a non-waiting or timed call may fail with
/// besides a busy lock or a timeout.
///
/// # Examples
///
/// ```text
/// impl SingleLock {
///     slate_core::waiting_methods!(SingleLockGuard, setup = "# ...", errors = "backend failures");
/// }
/// ```
#[macro_export]
macro_rules! waiting_methods {
    // A lock built on a `slate_aqs::Synchronizer` at `self.<sync>`, whose `guard(holder,
    // &grant)` makes its guard: its `acquire_for` and `blocking_acquire` too.
    (sync = $($sync:ident).+, $guard:ty, setup = $setup:literal, errors = $errors:literal $(,)?) => {
        /// Acquires for `holder`, or when it is `None` for the current holder, read now (not
        /// when the future is first polled), as
        /// [`DistributedLock::acquire_current`](slate_core::DistributedLock::acquire_current)
        /// describes.
        fn acquire_for(
            &self,
            holder: ::std::option::Option<$crate::HolderId>,
            wait: $crate::Wait,
        ) -> impl ::std::future::Future<Output = $crate::Result<$guard>> + Send + '_ {
            let sync = &self.$($sync).+;
            let (holder, acquisition) =
                sync.acquire_current_with(holder, wait, |h, g| self.guard(h, g));
            let span = ::tracing::debug_span!("acquire", lock = %sync.label(), %holder);
            ::tracing::Instrument::instrument(acquisition, span)
        }

        /// The blocking twin of `acquire_for`, for threads (`what` names the caller's method in
        /// the panic message inside a runtime).
        fn blocking_acquire(
            &self,
            holder: ::std::option::Option<$crate::HolderId>,
            wait: $crate::Wait,
            what: &str,
        ) -> $crate::Result<$guard> {
            self.$($sync).+
                .blocking_acquire_current_with(holder, wait, what, |h, g| self.guard(h, g))
        }

        $crate::waiting_methods!($guard, setup = $setup, errors = $errors);
    };
    ($guard:ty, setup = $setup:literal, errors = $errors:literal $(,)?) => {
        /// Waits until the lock is acquired for the current holder (the scope's, else a fresh
        /// one: see [`DistributedLock::acquire_current`](slate_core::DistributedLock::acquire_current)).
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = $setup]
        /// let guard = lock.lock().await?;
        /// guard.unlock().await?;
        /// # Ok(()) }
        /// ```
        ///
        /// # Errors
        ///
        /// Failures that make waiting pointless (authentication, permissions, a closed
        /// client or runtime).
        ///
        /// # Cancel safety
        ///
        /// Cancel safe, as [`acquire`](Self::acquire).
        pub fn lock(&self) -> impl ::std::future::Future<Output = $crate::Result<$guard>> + Send + '_ {
            self.acquire_for(None, $crate::Wait::Forever)
        }

        /// Waits until the lock is acquired for `holder` (re-enters if `holder` holds it).
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = $setup]
        /// let outer = lock.lock().await?;
        /// let inner = lock.lock_as(outer.holder()).await?;
        /// assert_eq!(inner.holder(), outer.holder());
        /// # Ok(()) }
        /// ```
        ///
        /// # Errors
        ///
        /// As [`lock`](Self::lock).
        ///
        /// # Cancel safety
        ///
        /// Cancel safe, as [`acquire`](Self::acquire).
        pub fn lock_as(
            &self,
            holder: $crate::HolderId,
        ) -> impl ::std::future::Future<Output = $crate::Result<$guard>> + Send + '_ {
            self.acquire(holder, $crate::Wait::Forever)
        }

        /// One attempt, never waiting: `Ok(None)` if another holder has the lock.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = $setup]
        /// if let Some(guard) = lock.try_lock().await? {
        ///     guard.unlock().await?;
        /// }
        /// # Ok(()) }
        /// ```
        ///
        /// # Errors
        ///
        #[doc = concat!("Anything but a busy lock: ", $errors, ".")]
        ///
        /// # Cancel safety
        ///
        /// Cancel safe, as [`acquire`](Self::acquire).
        pub fn try_lock(
            &self,
        ) -> impl ::std::future::Future<Output = $crate::Result<Option<$guard>>> + Send + '_ {
            // The holder is read now, not when the future is first polled.
            let attempt = self.acquire_for(None, $crate::Wait::Immediate);
            async move { $crate::lock::busy_to_none(attempt.await) }
        }

        /// Waits at most `d`, in the queue like everyone else.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = $setup]
        /// let guard = lock.try_lock_for(std::time::Duration::from_secs(2)).await?;
        /// # Ok(()) }
        /// ```
        ///
        /// # Errors
        ///
        #[doc = concat!("[`Error::Timeout`](slate_core::Error::Timeout) when `d` passes first; ", $errors, ".")]
        ///
        /// # Cancel safety
        ///
        /// Cancel safe, as [`acquire`](Self::acquire).
        pub fn try_lock_for(
            &self,
            d: ::std::time::Duration,
        ) -> impl ::std::future::Future<Output = $crate::Result<$guard>> + Send + '_ {
            self.acquire_for(None, $crate::Wait::for_duration(d))
        }

        /// Waits at most until `deadline`.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = $setup]
        /// let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        /// let guard = lock.try_lock_until(deadline).await?;
        /// # Ok(()) }
        /// ```
        ///
        /// # Errors
        ///
        #[doc = concat!("[`Error::Timeout`](slate_core::Error::Timeout) when the deadline passes first; ", $errors, ".")]
        ///
        /// # Cancel safety
        ///
        /// Cancel safe, as [`acquire`](Self::acquire).
        pub fn try_lock_until(
            &self,
            deadline: ::std::time::Instant,
        ) -> impl ::std::future::Future<Output = $crate::Result<$guard>> + Send + '_ {
            self.acquire_for(None, $crate::Wait::Until(deadline))
        }
    };
}

/// Writes a lock's blocking twins, the same on every lock: `blocking_lock`,
/// `blocking_lock_as`, `blocking_try_lock` and `blocking_try_lock_for`, over its
/// `blocking_acquire(Option<HolderId>, Wait, what)` (which panics inside a runtime). `lock` is
/// the type's name in the panic messages; `setup` the hidden first lines of every example,
/// ending with a `lock` in scope inside a `fn main() -> Result<(), Box<dyn Error>>` on a plain
/// thread; `errors` what the calls may fail with besides a busy lock or a timeout.
///
/// # Examples
///
/// ```text
/// impl SingleLock {
///     slate_core::blocking_waiting_methods!("SingleLock", SingleLockGuard, setup = "# ...", errors = "backend failures");
/// }
/// ```
#[macro_export]
macro_rules! blocking_waiting_methods {
    ($lock:literal, $guard:ty, setup = $setup:literal, errors = $errors:literal $(,)?) => {
        /// Blocks this thread until the lock is acquired for the current holder (the thread
        /// twin of `lock()`).
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = $setup]
        /// let guard = lock.blocking_lock()?;
        /// guard.blocking_unlock()?;
        /// # Ok(()) }
        /// ```
        ///
        /// # Errors
        ///
        #[doc = concat!("As `lock()`: ", $errors, ".")]
        ///
        /// # Panics
        ///
        /// Inside a tokio runtime (use `lock().await` there).
        pub fn blocking_lock(&self) -> $crate::Result<$guard> {
            self.blocking_acquire(None, $crate::Wait::Forever, concat!($lock, "::blocking_lock"))
        }

        /// Blocks this thread until the lock is acquired for `holder` (re-enters if it holds
        /// it).
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = $setup]
        /// let outer = lock.blocking_lock()?;
        /// let inner = lock.blocking_lock_as(outer.holder())?;
        /// # Ok(()) }
        /// ```
        ///
        /// # Errors
        ///
        /// As [`blocking_lock`](Self::blocking_lock).
        ///
        /// # Panics
        ///
        /// Inside a tokio runtime.
        pub fn blocking_lock_as(&self, holder: $crate::HolderId) -> $crate::Result<$guard> {
            self.blocking_acquire(
                Some(holder),
                $crate::Wait::Forever,
                concat!($lock, "::blocking_lock_as"),
            )
        }

        /// One attempt from this thread, without waiting: `None` when another holder has the
        /// lock (the thread twin of `try_lock()`).
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = $setup]
        /// if let Some(guard) = lock.blocking_try_lock()? {
        ///     guard.blocking_unlock()?;
        /// }
        /// # Ok(()) }
        /// ```
        ///
        /// # Errors
        ///
        #[doc = concat!("Anything but a busy lock: ", $errors, ".")]
        ///
        /// # Panics
        ///
        /// Inside a tokio runtime.
        pub fn blocking_try_lock(&self) -> $crate::Result<::std::option::Option<$guard>> {
            $crate::lock::busy_to_none(self.blocking_acquire(
                None,
                $crate::Wait::Immediate,
                concat!($lock, "::blocking_try_lock"),
            ))
        }

        /// Blocks this thread at most `d` waiting for the lock.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = $setup]
        /// let guard = lock.blocking_try_lock_for(std::time::Duration::from_secs(1))?;
        /// # Ok(()) }
        /// ```
        ///
        /// # Errors
        ///
        #[doc = concat!("[`Error::Timeout`](slate_core::Error::Timeout) when `d` passes first; ", $errors, ".")]
        ///
        /// # Panics
        ///
        /// Inside a tokio runtime.
        pub fn blocking_try_lock_for(
            &self,
            d: ::std::time::Duration,
        ) -> $crate::Result<$guard> {
            self.blocking_acquire(
                None,
                $crate::Wait::for_duration(d),
                concat!($lock, "::blocking_try_lock_for"),
            )
        }
    };
}
