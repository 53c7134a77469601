//! What a guard holds ([`Hold`]) and the one place a hold is ended ([`Held`]).
//!
//! Every guard of every backend is a thin type over a [`Held`]: the backend says how one
//! level is released ([`Release`]); [`Held`] says when, exactly once, whoever ends the guard
//! (an awaited `unlock`, a dropped `unlock` future, a blocking thread, a plain drop). The
//! guards dereference to their [`Hold`], so `guard.fencing_token()` and the other accessors
//! are written once, here.

use std::fmt;
use std::future::Future;
use std::time::Instant;

use tokio::runtime::Handle;

use crate::detach::{Detached, on_runtime};
use crate::error::Result;
use crate::fencing::FencingToken;
use crate::holder::HolderId;
use crate::lease::{LeaseWatch, LossReason};

/// One level of a hold: who holds, with which fencing token, how deep, and the lease.
///
/// Every guard dereferences to one, so these accessors are every guard's.
///
/// # Examples
///
/// ```
/// use slate_core::{FencingToken, Hold, HolderId};
/// use std::time::{Duration, Instant};
///
/// let (_keeper, watch) = slate_core::lease::channel(Instant::now() + Duration::from_secs(30));
/// let hold = Hold::new(HolderId::new(), FencingToken::new(7), 1, watch);
/// assert_eq!(hold.fencing_token().get(), 7);
/// assert_eq!(hold.depth(), 1);
/// assert!(!hold.is_lost());
/// ```
pub struct Hold {
    holder: HolderId,
    token: FencingToken,
    depth: u32,
    watch: LeaseWatch,
}

impl Hold {
    /// A level held by `holder` with `token`; `depth` is the holder's hold count right after
    /// this acquisition (1 for a first acquisition); `watch` is the hold's lease.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_core::{FencingToken, Hold, HolderId};
    /// # let (_keeper, watch) = slate_core::lease::channel(std::time::Instant::now());
    /// let hold = Hold::new(HolderId::new(), FencingToken::new(1), 2, watch);
    /// assert_eq!(hold.depth(), 2);
    /// ```
    #[must_use]
    pub fn new(holder: HolderId, token: FencingToken, depth: u32, watch: LeaseWatch) -> Self {
        Hold {
            holder,
            token,
            depth,
            watch,
        }
    }

    /// The holder this level is held for.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_core::{FencingToken, Hold, HolderId};
    /// # let (_keeper, watch) = slate_core::lease::channel(std::time::Instant::now());
    /// let me = HolderId::new();
    /// let hold = Hold::new(me, FencingToken::new(1), 1, watch);
    /// assert_eq!(hold.holder(), me);
    /// ```
    #[must_use]
    pub fn holder(&self) -> HolderId {
        self.holder
    }

    /// The fencing token of this hold (the same for every re-entry of one holder): pass it to
    /// every store the critical section writes to, which refuses writes with a lower one.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_core::{FencingToken, Hold, HolderId};
    /// # let (_keeper, watch) = slate_core::lease::channel(std::time::Instant::now());
    /// let hold = Hold::new(HolderId::new(), FencingToken::new(12), 1, watch);
    /// println!("writing with token {}", hold.fencing_token());
    /// ```
    #[must_use]
    pub fn fencing_token(&self) -> FencingToken {
        self.token
    }

    /// The holder's hold count right after this level was granted (1 for a first
    /// acquisition; a shared lock counts the levels in this guard's mode).
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_core::{FencingToken, Hold, HolderId};
    /// # let (_keeper, watch) = slate_core::lease::channel(std::time::Instant::now());
    /// let hold = Hold::new(HolderId::new(), FencingToken::new(1), 1, watch);
    /// assert_eq!(hold.depth(), 1);
    /// ```
    #[must_use]
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// The lease of this hold: deadline and loss signal (clone it for the code that must stop
    /// on a loss).
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_core::{FencingToken, Hold, HolderId};
    /// # let (_keeper, watch) = slate_core::lease::channel(std::time::Instant::now());
    /// let hold = Hold::new(HolderId::new(), FencingToken::new(1), 1, watch);
    /// let watch = hold.lease().clone();
    /// ```
    #[must_use]
    pub fn lease(&self) -> &LeaseWatch {
        &self.watch
    }

    /// The lease deadline on the monotonic clock (it moves with every renewal).
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_core::{FencingToken, Hold, HolderId};
    /// # use std::time::{Duration, Instant};
    /// let (_keeper, watch) = slate_core::lease::channel(Instant::now() + Duration::from_secs(30));
    /// let hold = Hold::new(HolderId::new(), FencingToken::new(1), 1, watch);
    /// assert!(hold.lease_deadline() > Instant::now());
    /// ```
    #[must_use]
    pub fn lease_deadline(&self) -> Instant {
        self.watch.deadline()
    }

    /// Whether the lease is lost (loss signalled, or the deadline passed).
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_core::{FencingToken, Hold, HolderId};
    /// let (_keeper, watch) = slate_core::lease::channel(std::time::Instant::now());
    /// let hold = Hold::new(HolderId::new(), FencingToken::new(1), 1, watch);
    /// assert!(hold.is_lost(), "a lease whose deadline is now is over");
    /// ```
    #[must_use]
    pub fn is_lost(&self) -> bool {
        self.watch.is_lost()
    }

    /// Completes when the lease is lost, with the reason: race it against the critical
    /// section, and stop acting as the holder when it wins.
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_core::{FencingToken, Hold, HolderId, LossReason};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let (_keeper, watch) = slate_core::lease::channel(std::time::Instant::now());
    /// let hold = Hold::new(HolderId::new(), FencingToken::new(1), 1, watch);
    /// assert_eq!(hold.lost().await, LossReason::DeadlineExpired);
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only observes.
    pub async fn lost(&self) -> LossReason {
        self.watch.lost().await
    }
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold")
            .field("holder", &self.holder)
            .field("token", &self.token)
            .field("depth", &self.depth)
            .field("deadline", &self.watch.deadline())
            .finish()
    }
}

/// How a backend ends one level of a hold. Implemented by each primitive's release state (the
/// lock handle, and what else the release needs: the nodes held, the znode, the mode).
///
/// # Examples
///
/// ```
/// use slate_core::hold::Release;
/// use slate_core::{Hold, Result};
///
/// struct Nothing(tokio::runtime::Handle);
///
/// impl Release for Nothing {
///     fn release(&mut self, _hold: &Hold) -> impl Future<Output = Result<u32>> + Send + 'static + use<> {
///         async { Ok(0) }
///     }
///     fn runtime(&self) -> &tokio::runtime::Handle {
///         &self.0
///     }
///     fn label(&self) -> &str {
///         "nothing"
///     }
/// }
/// ```
pub trait Release: Send + Sync + 'static {
    /// The release of one level of `hold`, answering the holder's levels left (0: the holder
    /// no longer holds the lock). [`Held`] calls it at most once per hold and always runs the
    /// future to completion, so it must own what it needs.
    ///
    /// # Errors
    ///
    /// As [`LockGuard::unlock`](crate::LockGuard::unlock).
    ///
    /// # Cancel safety
    ///
    /// Never cancelled: [`Held`] finishes it in a task when its caller stops waiting.
    fn release(
        &mut self,
        hold: &Hold,
    ) -> impl Future<Output = Result<u32>> + Send + 'static + use<Self>;

    /// The runtime a release runs on when nobody awaits it (a dropped guard or `unlock`
    /// future, a blocking thread): the client's.
    fn runtime(&self) -> &Handle;

    /// The lock's name as the logs show it.
    fn label(&self) -> &str;

    /// Where [`Held`] counts its guard (`slate_held`, `slate_hold_seconds`); `None` (the
    /// default) for nowhere.
    fn meter(&self) -> Option<&crate::metrics::Meter> {
        None
    }
}

/// A hold and the release that ends it, exactly once: the engine of every guard.
///
/// | the guard is | the release |
/// | --- | --- |
/// | `unlock().await`ed | runs, and its outcome is returned |
/// | `unlock()`ed, the future dropped (even unpolled) | runs in a task on [`Release::runtime`] |
/// | `blocking_unlock()`ed from a thread | runs on [`Release::runtime`]; the thread waits |
/// | dropped | runs in a task on [`Release::runtime`] |
///
/// # Examples
///
/// ```
/// use slate_core::hold::{Held, Release};
/// use slate_core::{FencingToken, Hold, HolderId, Result};
///
/// struct Count(tokio::runtime::Handle);
/// impl Release for Count {
///     fn release(&mut self, hold: &Hold) -> impl Future<Output = Result<u32>> + Send + 'static + use<> {
///         let left = hold.depth() - 1;
///         async move { Ok(left) }
///     }
///     fn runtime(&self) -> &tokio::runtime::Handle {
///         &self.0
///     }
///     fn label(&self) -> &str {
///         "count"
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<()> {
/// let (_keeper, watch) = slate_core::lease::channel(std::time::Instant::now());
/// let hold = Hold::new(HolderId::new(), FencingToken::new(1), 2, watch);
/// let held = Held::new(hold, Count(tokio::runtime::Handle::current()));
/// assert_eq!(held.unlock().await?, 1);
/// # Ok(()) }
/// ```
pub struct Held<R: Release> {
    hold: Hold,
    release: R,
    released: bool,
    /// When the guard was made, if its release counts it (see [`Release::meter`]).
    since: Option<Instant>,
}

impl<R: Release> Held<R> {
    /// `hold`, ended by `release`.
    ///
    /// # Examples
    ///
    /// See the [type's](Held).
    pub fn new(hold: Hold, release: R) -> Self {
        let since = release.meter().map(|m| {
            m.hold_started();
            Instant::now()
        });
        Held {
            hold,
            release,
            released: false,
            since,
        }
    }

    /// The hold.
    ///
    /// # Examples
    ///
    /// See the [type's](Held).
    #[must_use]
    pub fn hold(&self) -> &Hold {
        &self.hold
    }

    /// The backend's release state (the lock handle, the nodes held...).
    ///
    /// # Examples
    ///
    /// See the [type's](Held).
    #[must_use]
    pub fn backend(&self) -> &R {
        &self.release
    }

    /// Starts the release now and returns its outcome; dropped before it completes (even
    /// before its first poll), the release finishes in a task.
    ///
    /// # Examples
    ///
    /// See the [type's](Held).
    ///
    /// # Errors
    ///
    /// The release's.
    ///
    /// # Cancel safety
    ///
    /// A dropped future still completes the release in the background, exactly once.
    pub fn unlock(mut self) -> Detached<Result<u32>> {
        let release = self.start();
        let runtime = self.release.runtime().clone();
        Detached::new(on_runtime(runtime.clone(), release), runtime)
    }

    /// The release from a plain thread: runs it on [`Release::runtime`] and blocks until it is
    /// done. `what` names the call in the panic message.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo<R: slate_core::hold::Release>(held: slate_core::hold::Held<R>) -> slate_core::Result<()> {
    /// let left = held.blocking_unlock("MyGuard::blocking_unlock")?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The release's; [`Error::Closed`](crate::Error::Closed) when the runtime shut down first.
    ///
    /// # Panics
    ///
    /// Inside a tokio runtime, where blocking would stall its threads.
    pub fn blocking_unlock(mut self, what: &str) -> Result<u32> {
        crate::blocking::assert_outside_runtime(what);
        let release = self.start();
        crate::blocking::wait_on(self.release.runtime(), release)
    }

    /// Ends the guard with a release its caller runs itself (several guards released in one
    /// server call): the guard is counted as ended, [`Release::release`] is not called, and
    /// `end` gets the backend's state and the hold to take what that release needs.
    ///
    /// The caller then owns the release: it must run it to the end, including when its own
    /// future is dropped (see [`Detached`]).
    ///
    /// # Examples
    ///
    /// ```
    /// # use slate_core::hold::{Held, Release};
    /// # use slate_core::{FencingToken, Hold, HolderId, Result};
    /// # struct Count(tokio::runtime::Handle);
    /// # impl Release for Count {
    /// #     fn release(&mut self, hold: &Hold) -> impl Future<Output = Result<u32>> + Send + 'static + use<> {
    /// #         async { Ok(0) }
    /// #     }
    /// #     fn runtime(&self) -> &tokio::runtime::Handle { &self.0 }
    /// #     fn label(&self) -> &str { "count" }
    /// # }
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// # let (_keeper, watch) = slate_core::lease::channel(std::time::Instant::now());
    /// let holder = HolderId::new();
    /// let held = Held::new(Hold::new(holder, FencingToken::new(1), 1, watch), Count(tokio::runtime::Handle::current()));
    /// let taken = held.end_with(|_, hold| hold.holder());
    /// assert_eq!(taken, holder);
    /// # }
    /// ```
    pub fn end_with<T>(mut self, end: impl FnOnce(&mut R, &Hold) -> T) -> T {
        self.ended();
        end(&mut self.release, &self.hold)
    }

    fn start(&mut self) -> impl Future<Output = Result<u32>> + Send + 'static + use<R> {
        self.ended();
        self.release.release(&self.hold)
    }

    /// The guard's end: no release on drop any more, and its hold counted as ended.
    fn ended(&mut self) {
        self.released = true;
        if let (Some(m), Some(since)) = (self.release.meter(), self.since) {
            m.hold_ended(since.elapsed());
        }
    }
}

impl<R: Release> Drop for Held<R> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        tracing::debug!(lock = %self.release.label(), holder = %self.hold.holder,
            "guard dropped without unlock; releasing in the background");
        let release = self.start();
        let label = self.release.label().to_owned();
        drop(self.release.runtime().spawn(async move {
            if let Err(e) = release.await {
                tracing::debug!(lock = %label, error = %e, "background release of a dropped guard failed");
            }
        }));
    }
}

impl<R: Release> fmt::Debug for Held<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Held")
            .field("lock", &self.release.label())
            .field("hold", &self.hold)
            .finish()
    }
}

/// The surface every guard shares, written once: `unlock`, `blocking_unlock`, `Deref` to
/// its [`Hold`], [`LockGuard`](crate::LockGuard) and `Debug`, for a guard struct whose
/// field `held` is a [`Held`]. Each backend's guard adds only what is its own (the lock
/// handle, re-entry, the nodes held, the permits).
///
/// - `$guard`: the guard type; `$crate_name`: the crate's name in the doc examples'
///   `Result`.
/// - `setup`: doc-example lines, inside an async `main`, that bind `guard`; `blocking_setup`:
///   the same on a plain thread (with `blocking_*` calls).
/// - optionally `nodes = |g| expr` and `permits = |g| expr`: [`LockGuard::nodes`] and
///   [`LockGuard::permits`] (`g` is `&$guard`).
///
/// [`LockGuard::nodes`]: crate::LockGuard::nodes
/// [`LockGuard::permits`]: crate::LockGuard::permits
///
/// # Examples
///
/// ```text
/// slate_core::guard_surface!(SingleLockGuard, slate_redis,
///     setup = "let guard = lock.lock().await?;",
///     blocking_setup = "let guard = lock.blocking_lock()?;");
/// ```
#[macro_export]
macro_rules! guard_surface {
    (
        $guard:ident, $crate_name:ident,
        setup = $setup:expr,
        blocking_setup = $blocking_setup:expr
        $(, nodes = |$gn:ident| $nodes:expr)?
        $(, permits = |$gp:ident| $permits:expr)?
        $(,)?
    ) => {
        impl $guard {
            #[doc = concat!(
                "Releases this level and returns the holder's remaining hold count (0: this ",
                "holder no longer holds it; the one meaning every guard gives it, see ",
                "[`LockGuard::unlock`](slate_core::LockGuard::unlock)).\n\n",
                "# Examples\n\n```no_run\n",
                "# #[tokio::main(flavor = \"current_thread\")] async fn main() -> ",
                stringify!($crate_name), "::Result<()> {\n", $setup,
                "\nlet left = guard.unlock().await?;\n# Ok(()) }\n```\n\n",
                "# Errors\n\n",
                "[`Error::NotHeld`](slate_core::Error::NotHeld) when the hold had already ended ",
                "(lease lost, force-unlocked); [`Error::Backend`](slate_core::Error::Backend) ",
                "and the backend's other errors when the release failed: the hold then ends ",
                "with its lease. The local queue moves on either way.\n\n",
                "# Cancel safety\n\n",
                "The release starts when this is called: a dropped future (even one never ",
                "polled) still completes it in the background, exactly once."
            )]
            pub fn unlock(self) -> impl ::std::future::Future<Output = $crate::Result<u32>> + Send {
                self.held.unlock()
            }

            #[doc = concat!(
                "The thread twin of [`unlock`](Self::unlock): runs the release on the client's ",
                "runtime and blocks until it is done.\n\n",
                "# Examples\n\n```no_run\n",
                "# fn main() -> Result<(), Box<dyn std::error::Error>> {\n", $blocking_setup,
                "\nguard.blocking_unlock()?;\n# Ok(()) }\n```\n\n",
                "# Errors\n\nAs [`unlock`](Self::unlock).\n\n",
                "# Panics\n\nInside a tokio runtime (use `unlock().await` there)."
            )]
            pub fn blocking_unlock(self) -> $crate::Result<u32> {
                self.held
                    .blocking_unlock(concat!(stringify!($guard), "::blocking_unlock"))
            }
        }

        impl ::std::ops::Deref for $guard {
            type Target = $crate::Hold;

            fn deref(&self) -> &$crate::Hold {
                self.held.hold()
            }
        }

        impl $crate::LockGuard for $guard {
            $(
                fn nodes(&self) -> &[usize] {
                    let $gn = self;
                    $nodes
                }
            )?
            $(
                fn permits(&self) -> Option<u64> {
                    let $gp = self;
                    $permits
                }
            )?

            fn unlock(self) -> impl ::std::future::Future<Output = $crate::Result<u32>> + Send {
                $guard::unlock(self)
            }
        }

        impl ::std::fmt::Debug for $guard {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_tuple(stringify!($guard)).field(&self.held).finish()
            }
        }
    };
}
