//! [`Registry`]: the get-or-create table that makes every handle built for one lock in one
//! client share one state (one local queue), whatever the primitive.
//!
//! A lock's local queue is what keeps a process's tasks in FIFO order with only the head
//! talking to the server; two states for one name would be two queues racing each other, and
//! a process competing with itself. So every builder goes through [`Registry::get_or_create`]:
//! a live state of the same key is returned when it is of the same kind and was built with the
//! same settings, refused otherwise; a new one is made and registered when there is none.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use crate::error::{Error, Result};

/// A lock state the registry keeps: what two handles of one name must agree on, and its local
/// waiters (for a client's statistics).
///
/// # Examples
///
/// ```
/// use slate_core::registry::Registered;
///
/// struct State {
///     spin_wait: std::time::Duration,
/// }
///
/// impl Registered for State {
///     type Settings = std::time::Duration;
///     fn settings(&self) -> std::time::Duration {
///         self.spin_wait
///     }
///     fn waiters(&self) -> usize {
///         0
///     }
/// }
/// ```
pub trait Registered: Any + Send + Sync {
    /// What every handle of one lock in one client must be built with alike (its options).
    type Settings: PartialEq + fmt::Debug;

    /// The settings this state was built with.
    fn settings(&self) -> Self::Settings;

    /// How many tasks of this process wait in this lock's local queue.
    fn waiters(&self) -> usize;
}

/// A registered state, its type erased.
pub trait Entry: Send + Sync {
    /// [`Registered::waiters`].
    fn waiters(&self) -> usize;

    /// For downcasting to the concrete state.
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

impl<S: Registered> Entry for S {
    fn waiters(&self) -> usize {
        Registered::waiters(self)
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

/// A client's table of lock states by key (the lock's key, znode directory...), holding them
/// weakly: a state lives as long as a handle or guard of it does.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use slate_core::registry::{Registered, Registry};
///
/// struct State(u32);
/// impl Registered for State {
///     type Settings = u32;
///     fn settings(&self) -> u32 {
///         self.0
///     }
///     fn waiters(&self) -> usize {
///         0
///     }
/// }
///
/// let registry = Registry::<String>::default();
/// let a = registry.get_or_create("orders".to_owned(), &"orders", 5, |s| Arc::new(State(s))).unwrap();
/// let b = registry.get_or_create("orders".to_owned(), &"orders", 5, |s| Arc::new(State(s))).unwrap();
/// assert!(Arc::ptr_eq(&a, &b), "one state for one name");
/// let other = registry.get_or_create("orders".to_owned(), &"orders", 6, |s| Arc::new(State(s)));
/// assert!(other.is_err_and(|e| e.is_invalid_input()), "other settings are refused");
/// ```
pub struct Registry<K> {
    states: Mutex<HashMap<K, Weak<dyn Entry>>>,
}

impl<K> Default for Registry<K> {
    fn default() -> Self {
        Registry {
            states: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash> Registry<K> {
    /// The live state registered under `key`, or a new one made by `make` from `settings` and
    /// registered. `name` names the lock in errors.
    ///
    /// # Examples
    ///
    /// See the [type's](Registry).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] when a live state of `key` is of another kind of lock, or was
    /// built with other settings.
    pub fn get_or_create<S: Registered>(
        &self,
        key: K,
        name: &dyn fmt::Display,
        settings: S::Settings,
        make: impl FnOnce(S::Settings) -> Arc<S>,
    ) -> Result<Arc<S>> {
        let mut states = self.states();
        if let Some(existing) = states.get(&key).and_then(Weak::upgrade) {
            let Ok(state) = existing.into_any().downcast::<S>() else {
                return Err(Error::invalid_input(
                    "lock name",
                    format!("{name} is used by another kind of lock in this client"),
                    "use another name or key prefix",
                ));
            };
            let built = state.settings();
            if built != settings {
                return Err(Error::invalid_input(
                    "options",
                    format!(
                        "lock {name} already exists in this client with other options ({built:?})"
                    ),
                    "build every handle of one lock with the same options (or clone the first \
                     handle)",
                ));
            }
            return Ok(state);
        }
        let state = make(settings);
        // Sweep the states no handle uses any more, at doubling sizes: amortized O(1).
        if states.len() >= 64 && states.len().is_power_of_two() {
            states.retain(|_, w| w.strong_count() > 0);
        }
        let entry: Weak<dyn Entry> = Arc::downgrade(&state) as Weak<S>;
        states.insert(key, entry);
        Ok(state)
    }

    /// The states alive now.
    ///
    /// # Examples
    ///
    /// ```
    /// let registry = slate_core::registry::Registry::<String>::default();
    /// assert!(registry.live().is_empty());
    /// ```
    #[must_use]
    pub fn live(&self) -> Vec<Arc<dyn Entry>> {
        self.states().values().filter_map(Weak::upgrade).collect()
    }

    fn states(&self) -> MutexGuard<'_, HashMap<K, Weak<dyn Entry>>> {
        // Every update leaves the map consistent, so a panic elsewhere cannot poison it.
        self.states.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<K> fmt::Debug for Registry<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}
