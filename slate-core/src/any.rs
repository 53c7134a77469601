//! The object-safe layer: locks of different backends behind one type.
//!
//! [`DistributedLock`] and [`LockGuard`] return `impl Future`, which keeps calls free of boxing
//! but makes the traits unusable as `dyn`. [`DynLock`] and [`DynGuard`] are their object-safe
//! twins (boxed futures), implemented for every lock and guard; [`AnyLock`] and [`AnyGuard`]
//! wrap them with the same inherent methods as the concrete locks, for users who keep
//! heterogeneous locks in one collection:
//!
//! ```
//! use slate_core::{AnyLock, DistributedLock};
//!
//! fn registry<A: DistributedLock, B: DistributedLock>(a: A, b: B) -> Vec<AnyLock> {
//!     vec![AnyLock::new(a), AnyLock::new(b)]
//! }
//! ```
//!
//! Each call through this layer costs one allocation for its future (and one for the guard);
//! use the concrete types where the lock's type is known.

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::hold::Hold;
use crate::holder::HolderId;
use crate::lock::{DistributedLock, LockGuard, Wait};
use crate::name::LockName;

/// A boxed, `Send` future: what the object-safe traits return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The object-safe twin of [`DistributedLock`], implemented for every lock.
///
/// Prefer [`AnyLock`], which wraps it with the usual method names.
///
/// # Examples
///
/// ```
/// use slate_core::{DistributedLock, DynLock};
/// use std::sync::Arc;
///
/// fn erase<L: DistributedLock>(lock: L) -> Arc<dyn DynLock> {
///     Arc::new(lock)
/// }
/// ```
pub trait DynLock: Send + Sync + 'static {
    /// The lock's name.
    fn dyn_name(&self) -> &LockName;

    /// [`DistributedLock::acquire`], boxed.
    ///
    /// # Errors
    ///
    /// As [`DistributedLock::acquire`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`DistributedLock::acquire`].
    fn dyn_acquire(&self, holder: HolderId, wait: Wait) -> BoxFuture<'_, Result<AnyGuard>>;

    /// [`DistributedLock::acquire_current`], boxed.
    ///
    /// # Errors
    ///
    /// As [`DistributedLock::acquire`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`DistributedLock::acquire`].
    fn dyn_acquire_current(&self, wait: Wait) -> BoxFuture<'_, Result<AnyGuard>>;

    /// [`DistributedLock::is_locked`], boxed.
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    fn dyn_is_locked(&self) -> BoxFuture<'_, Result<bool>>;

    /// [`DistributedLock::hold_count`], boxed.
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    fn dyn_hold_count(&self, holder: HolderId) -> BoxFuture<'_, Result<u32>>;

    /// [`DistributedLock::remaining_lease`], boxed.
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    fn dyn_remaining_lease(&self) -> BoxFuture<'_, Result<Option<Duration>>>;

    /// [`DistributedLock::force_unlock`], boxed.
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// The deletion may or may not have happened when the future is dropped.
    fn dyn_force_unlock(&self) -> BoxFuture<'_, Result<u64>>;
}

impl<L: DistributedLock> DynLock for L {
    fn dyn_name(&self) -> &LockName {
        self.name()
    }

    fn dyn_acquire(&self, holder: HolderId, wait: Wait) -> BoxFuture<'_, Result<AnyGuard>> {
        let acquire = self.acquire(holder, wait);
        Box::pin(async move { acquire.await.map(AnyGuard::new) })
    }

    fn dyn_acquire_current(&self, wait: Wait) -> BoxFuture<'_, Result<AnyGuard>> {
        let acquire = self.acquire_current(wait);
        Box::pin(async move { acquire.await.map(AnyGuard::new) })
    }

    fn dyn_is_locked(&self) -> BoxFuture<'_, Result<bool>> {
        Box::pin(self.is_locked())
    }

    fn dyn_hold_count(&self, holder: HolderId) -> BoxFuture<'_, Result<u32>> {
        Box::pin(self.hold_count(holder))
    }

    fn dyn_remaining_lease(&self) -> BoxFuture<'_, Result<Option<Duration>>> {
        Box::pin(self.remaining_lease())
    }

    fn dyn_force_unlock(&self) -> BoxFuture<'_, Result<u64>> {
        Box::pin(self.force_unlock())
    }
}

/// The object-safe twin of [`LockGuard`], implemented for every guard.
///
/// Prefer [`AnyGuard`], which wraps it with the usual method names.
///
/// # Examples
///
/// ```
/// use slate_core::{DynGuard, LockGuard};
///
/// fn erase<G: LockGuard>(guard: G) -> Box<dyn DynGuard> {
///     Box::new(guard)
/// }
/// ```
pub trait DynGuard: Send + Sync + 'static {
    /// The guard's [`Hold`].
    fn dyn_hold(&self) -> &Hold;

    /// [`LockGuard::nodes`].
    fn dyn_nodes(&self) -> &[usize];

    /// [`LockGuard::permits`].
    fn dyn_permits(&self) -> Option<u64>;

    /// [`LockGuard::unlock`], boxed.
    ///
    /// # Errors
    ///
    /// As [`LockGuard::unlock`].
    ///
    /// # Cancel safety
    ///
    /// As [`LockGuard::unlock`]: a dropped future still completes its release in the
    /// background.
    fn dyn_unlock(self: Box<Self>) -> BoxFuture<'static, Result<u32>>;
}

impl<G: LockGuard> DynGuard for G {
    fn dyn_hold(&self) -> &Hold {
        self
    }

    fn dyn_nodes(&self) -> &[usize] {
        self.nodes()
    }

    fn dyn_permits(&self) -> Option<u64> {
        self.permits()
    }

    fn dyn_unlock(self: Box<Self>) -> BoxFuture<'static, Result<u32>> {
        Box::pin((*self).unlock())
    }
}

/// A lock of any backend: a cheap, cloneable handle with the inherent methods of the concrete
/// locks, for collections of locks of different types.
///
/// It implements [`DistributedLock`] itself, so generic code takes it too.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(locks: Vec<slate_core::AnyLock>) -> slate_core::Result<()> {
/// for lock in &locks {
///     if let Some(guard) = lock.try_lock().await? {
///         println!("{} is mine, token {}", lock.name(), guard.fencing_token());
///         guard.unlock().await?;
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct AnyLock(Arc<dyn DynLock>);

impl AnyLock {
    /// Erases a lock's type.
    ///
    /// # Examples
    ///
    /// ```
    /// fn erase<L: slate_core::DistributedLock>(lock: L) -> slate_core::AnyLock {
    ///     slate_core::AnyLock::new(lock)
    /// }
    /// ```
    pub fn new<L: DistributedLock>(lock: L) -> Self {
        AnyLock(Arc::new(lock))
    }

    /// The lock's name.
    ///
    /// # Examples
    ///
    /// ```
    /// fn name(lock: &slate_core::AnyLock) -> String {
    ///     lock.name().to_string()
    /// }
    /// ```
    #[must_use]
    pub fn name(&self) -> &LockName {
        self.0.dyn_name()
    }

    /// Acquires the lock for `holder`, waiting as `wait` allows ([`DistributedLock::acquire`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: slate_core::AnyLock) -> slate_core::Result<()> {
    /// use slate_core::{HolderId, Wait};
    /// let guard = lock.acquire(HolderId::new(), Wait::Forever).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`DistributedLock::acquire`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`DistributedLock::acquire`].
    pub async fn acquire(&self, holder: HolderId, wait: Wait) -> Result<AnyGuard> {
        self.0.dyn_acquire(holder, wait).await
    }

    crate::waiting_methods!(
        AnyGuard,
        setup = "# async fn demo(lock: slate_core::AnyLock) -> slate_core::Result<()> {",
        errors = "backend failures",
    );

    /// Acquires for `holder`, or when it is `None` for the current holder as the erased lock
    /// does ([`DistributedLock::acquire_current`]).
    fn acquire_for(&self, holder: Option<HolderId>, wait: Wait) -> BoxFuture<'_, Result<AnyGuard>> {
        match holder {
            Some(holder) => self.0.dyn_acquire(holder, wait),
            None => self.0.dyn_acquire_current(wait),
        }
    }

    /// Whether any holder holds the lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: slate_core::AnyLock) -> slate_core::Result<()> {
    /// println!("locked: {}", lock.is_locked().await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub async fn is_locked(&self) -> Result<bool> {
        self.0.dyn_is_locked().await
    }
}

impl AnyLock {
    /// How many times `holder` holds the lock (0 if not at all).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: slate_core::AnyLock) -> slate_core::Result<()> {
    /// let guard = lock.lock().await?;
    /// assert_eq!(lock.hold_count(guard.holder()).await?, 1);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub async fn hold_count(&self, holder: HolderId) -> Result<u32> {
        self.0.dyn_hold_count(holder).await
    }

    /// Whether `holder` holds the lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: slate_core::AnyLock) -> slate_core::Result<()> {
    /// let guard = lock.lock().await?;
    /// assert!(lock.is_held_by(guard.holder()).await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub async fn is_held_by(&self, holder: HolderId) -> Result<bool> {
        Ok(self.hold_count(holder).await? > 0)
    }

    /// The remaining lease of whoever holds the lock, or `None` when it is free.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: slate_core::AnyLock) -> slate_core::Result<()> {
    /// if let Some(left) = lock.remaining_lease().await? {
    ///     println!("held for another {left:?}");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub async fn remaining_lease(&self) -> Result<Option<Duration>> {
        self.0.dyn_remaining_lease().await
    }

    /// Deletes the lock whoever holds it ([`DistributedLock::force_unlock`]; **unsafe for
    /// correctness**, for operators clearing a stuck lock).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lock: slate_core::AnyLock) -> slate_core::Result<()> {
    /// let deleted = lock.force_unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Backend failures.
    ///
    /// # Cancel safety
    ///
    /// The deletion may or may not have happened when the future is dropped.
    pub async fn force_unlock(&self) -> Result<u64> {
        self.0.dyn_force_unlock().await
    }
}

impl fmt::Debug for AnyLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("AnyLock").field(self.name()).finish()
    }
}

impl DistributedLock for AnyLock {
    type Guard = AnyGuard;

    fn name(&self) -> &LockName {
        self.0.dyn_name()
    }

    fn acquire(
        &self,
        holder: HolderId,
        wait: Wait,
    ) -> impl Future<Output = Result<AnyGuard>> + Send {
        self.0.dyn_acquire(holder, wait)
    }

    fn acquire_current(&self, wait: Wait) -> impl Future<Output = Result<AnyGuard>> + Send {
        self.0.dyn_acquire_current(wait)
    }

    fn is_locked(&self) -> impl Future<Output = Result<bool>> + Send {
        self.0.dyn_is_locked()
    }

    fn hold_count(&self, holder: HolderId) -> impl Future<Output = Result<u32>> + Send {
        self.0.dyn_hold_count(holder)
    }

    fn remaining_lease(&self) -> impl Future<Output = Result<Option<Duration>>> + Send {
        self.0.dyn_remaining_lease()
    }

    fn force_unlock(&self) -> impl Future<Output = Result<u64>> + Send {
        self.0.dyn_force_unlock()
    }
}

/// A held level of an [`AnyLock`] (or any guard whose type was erased).
///
/// Dropping it releases in the background, as the concrete guard does.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(lock: slate_core::AnyLock) -> slate_core::Result<()> {
/// let guard = lock.lock().await?;
/// let token = guard.fencing_token();
/// # let _ = token;
/// assert_eq!(guard.unlock().await?, 0);
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the lock in the background; call unlock().await to see the outcome"]
pub struct AnyGuard(Box<dyn DynGuard>);

impl AnyGuard {
    /// Erases a guard's type.
    ///
    /// # Examples
    ///
    /// ```
    /// fn erase<G: slate_core::LockGuard>(guard: G) -> slate_core::AnyGuard {
    ///     slate_core::AnyGuard::new(guard)
    /// }
    /// ```
    pub fn new<G: LockGuard>(guard: G) -> Self {
        AnyGuard(Box::new(guard))
    }

    /// Releases one level and returns the holder's remaining hold count
    /// ([`LockGuard::unlock`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(guard: slate_core::AnyGuard) -> slate_core::Result<()> {
    /// assert_eq!(guard.unlock().await?, 0);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`LockGuard::unlock`].
    ///
    /// # Cancel safety
    ///
    /// As [`LockGuard::unlock`]: a dropped future still completes its release.
    pub async fn unlock(self) -> Result<u32> {
        self.0.dyn_unlock().await
    }
}

impl fmt::Debug for AnyGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("AnyGuard").field(self.0.dyn_hold()).finish()
    }
}

impl Deref for AnyGuard {
    type Target = Hold;

    fn deref(&self) -> &Hold {
        self.0.dyn_hold()
    }
}

impl LockGuard for AnyGuard {
    fn nodes(&self) -> &[usize] {
        self.0.dyn_nodes()
    }

    fn permits(&self) -> Option<u64> {
        self.0.dyn_permits()
    }

    fn unlock(self) -> impl Future<Output = Result<u32>> + Send {
        self.0.dyn_unlock()
    }
}
