//! Options common to every Slate lock, validated when the lock is built.

use std::time::Duration;

use crate::error::{Error, Result};

/// The shortest lease accepted.
pub const MIN_LEASE: Duration = Duration::from_millis(30);
/// The shortest spin wait accepted.
pub const MIN_SPIN_WAIT: Duration = Duration::from_millis(1);
/// The longest key prefix accepted, in bytes.
pub const MAX_PREFIX_LEN: usize = 256;
/// The longest duration any Slate option accepts (lease, spin wait, max hold, timeouts): 365
/// days. Longer values mean nothing for a lock, and the bound keeps every deadline computed
/// from them (`Instant` + duration) and every lease sent to Redis (milliseconds) far inside
/// their ranges, so that no option can make an acquisition panic or a script refuse its TTL.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 60 * 60);

/// Checks that the option `what` is at most [`MAX_DURATION`]; for option types of every
/// Slate crate, so that they all refuse an oversize duration in the same words.
///
/// # Errors
///
/// [`Error::InvalidInput`] naming `what` when `d` is longer than [`MAX_DURATION`].
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use slate_core::options::check_max_duration;
///
/// check_max_duration("command timeout", Duration::from_secs(2))?;
/// let err = check_max_duration("command timeout", Duration::MAX).unwrap_err();
/// assert!(err.is_invalid_input());
/// # Ok::<(), slate_core::Error>(())
/// ```
pub fn check_max_duration(what: &'static str, d: Duration) -> Result<()> {
    if d > MAX_DURATION {
        return Err(Error::invalid_input(
            what,
            format!("{d:?} is longer than the maximum of 365 days"),
            format!("use a {what} of at most 365 days"),
        ));
    }
    Ok(())
}

/// Options common to every Redis lock (the ZooKeeper lock takes its lease from its session).
///
/// | option | default | rule |
/// | --- | --- | --- |
/// | lease | 30 s | at least 30 ms, at most [`MAX_DURATION`] (365 days) |
/// | renewal period | lease / 2 | between lease / 10 and lease / 2 |
/// | spin wait | 50 ms | at least 1 ms, at most [`MAX_DURATION`] |
/// | max hold | none | when set, non-zero and at most [`MAX_DURATION`] |
/// | key prefix | `slate:` | at most 256 bytes, no `{` or `}` |
///
/// Built with [`LockOptions::builder`] (or the lock builders' setters of the same names);
/// read back with getters named as the options. Setters never fail; `build()` reports the
/// first problem with a message naming the option and the fix. Nothing is silently corrected.
///
/// # Examples
///
/// ```
/// use slate_core::LockOptions;
/// use std::time::Duration;
///
/// let opts = LockOptions::builder().lease(Duration::from_secs(10)).build()?;
/// assert_eq!(opts.lease(), Duration::from_secs(10));
/// assert_eq!(opts.renewal_period(), Duration::from_secs(5));
/// # Ok::<(), slate_core::Error>(())
/// ```
///
/// Two options are equal when they behave alike: a renewal period left to its default equals
/// the same period given explicitly (lease / 2).
#[derive(Clone, Debug, Eq)]
pub struct LockOptions {
    lease: Duration,
    renewal_period: Option<Duration>,
    spin_wait: Duration,
    max_hold: Option<Duration>,
    key_prefix: String,
}

impl PartialEq for LockOptions {
    fn eq(&self, other: &Self) -> bool {
        self.lease == other.lease
            && self.renewal_period() == other.renewal_period()
            && self.spin_wait == other.spin_wait
            && self.max_hold == other.max_hold
            && self.key_prefix == other.key_prefix
    }
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            lease: Duration::from_secs(30),
            renewal_period: None,
            spin_wait: Duration::from_millis(50),
            max_hold: None,
            key_prefix: "slate:".to_owned(),
        }
    }
}

impl LockOptions {
    /// Starts building options from the defaults.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// let o = slate_core::LockOptions::builder().spin_wait(Duration::from_millis(20)).build()?;
    /// assert_eq!(o.spin_wait(), Duration::from_millis(20));
    /// # Ok::<(), slate_core::Error>(())
    /// ```
    pub fn builder() -> LockOptionsBuilder {
        LockOptionsBuilder::default()
    }

    /// The lease.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert_eq!(slate_core::LockOptions::default().lease(), Duration::from_secs(30));
    /// ```
    #[must_use]
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The renewal period: the explicit one, or half the lease.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert_eq!(slate_core::LockOptions::default().renewal_period(), Duration::from_secs(15));
    /// ```
    #[must_use]
    pub fn renewal_period(&self) -> Duration {
        self.renewal_period.unwrap_or(self.lease / 2)
    }

    /// The spin wait.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// assert_eq!(slate_core::LockOptions::default().spin_wait(), Duration::from_millis(50));
    /// ```
    #[must_use]
    pub fn spin_wait(&self) -> Duration {
        self.spin_wait
    }

    /// The max hold, if any.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_core::LockOptions::default().max_hold(), None);
    /// ```
    #[must_use]
    pub fn max_hold(&self) -> Option<Duration> {
        self.max_hold
    }

    /// The key prefix.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_core::LockOptions::default().key_prefix(), "slate:");
    /// ```
    #[must_use]
    pub fn key_prefix(&self) -> &str {
        &self.key_prefix
    }

    /// Checks every option against its rule.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the first invalid option, what is wrong and how to fix it.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// use slate_core::LockOptions;
    ///
    /// let opts = LockOptions::builder().lease(Duration::from_secs(10)).build()?;
    /// opts.validate()?; // built options always pass
    /// let err = LockOptions::builder()
    ///     .lease(Duration::from_secs(10))
    ///     .renewal_period(Duration::from_secs(10))
    ///     .build()
    ///     .unwrap_err();
    /// assert!(err.to_string().contains("renewal period"));
    /// # Ok::<(), slate_core::Error>(())
    /// ```
    pub fn validate(&self) -> Result<()> {
        if self.lease < MIN_LEASE {
            return Err(Error::invalid_input(
                "lease",
                format!("{:?} is shorter than the minimum {MIN_LEASE:?}", self.lease),
                format!("use a lease of at least {MIN_LEASE:?} (the default is 30s)"),
            ));
        }
        check_max_duration("lease", self.lease)?;
        if let Some(period) = self.renewal_period {
            let (lo, hi) = (self.lease / 10, self.lease / 2);
            if period >= self.lease || period > hi {
                return Err(Error::invalid_input(
                    "renewal period",
                    format!(
                        "{period:?} leaves too little of the {:?} lease to retry a failed renewal",
                        self.lease
                    ),
                    format!("use a renewal period of at most half the lease ({hi:?})"),
                ));
            }
            if period < lo {
                return Err(Error::invalid_input(
                    "renewal period",
                    format!(
                        "{period:?} is shorter than a tenth of the {:?} lease",
                        self.lease
                    ),
                    format!("use a renewal period of at least {lo:?}, or a shorter lease"),
                ));
            }
        }
        if self.spin_wait < MIN_SPIN_WAIT {
            return Err(Error::invalid_input(
                "spin wait",
                format!("{:?} would make waiters poll without pause", self.spin_wait),
                format!("use a spin wait of at least {MIN_SPIN_WAIT:?} (the default is 50ms)"),
            ));
        }
        check_max_duration("spin wait", self.spin_wait)?;
        if let Some(max_hold) = self.max_hold {
            check_max_duration("max hold", max_hold)?;
        }
        if self.max_hold == Some(Duration::ZERO) {
            return Err(Error::invalid_input(
                "max hold",
                "zero would stop renewal at once",
                "use a positive max hold, or leave it unset for no cap",
            ));
        }
        if self.key_prefix.len() > MAX_PREFIX_LEN {
            return Err(Error::invalid_input(
                "key prefix",
                format!("it is {} bytes long", self.key_prefix.len()),
                format!("use a prefix of at most {MAX_PREFIX_LEN} bytes"),
            ));
        }
        if self.key_prefix.contains(['{', '}']) {
            return Err(Error::invalid_input(
                "key prefix",
                format!("{:?} contains a brace", self.key_prefix),
                "remove '{' and '}' from the prefix: Slate puts the lock name in braces as the \
                 cluster hash tag",
            ));
        }
        Ok(())
    }
}

/// Builds [`LockOptions`]: one setter per option, named as the option (tokio's and redis-rs's
/// builder style); [`build`](Self::build) checks every rule.
///
/// # Examples
///
/// ```
/// use slate_core::LockOptions;
/// use std::time::Duration;
///
/// let opts = LockOptions::builder().lease(Duration::from_secs(10)).build()?;
/// assert_eq!(opts.renewal_period(), Duration::from_secs(5));
///
/// let bad = LockOptions::builder().lease(Duration::ZERO).build();
/// assert!(bad.unwrap_err().is_invalid_input());
/// # Ok::<(), slate_core::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
#[must_use = "a builder does nothing until build() is called"]
pub struct LockOptionsBuilder {
    options: LockOptions,
}

impl LockOptionsBuilder {
    /// Sets the lease: the time-to-live of the lock entry, renewed while held.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// let o = slate_core::LockOptions::builder().lease(Duration::from_secs(5)).build()?;
    /// assert_eq!(o.lease(), Duration::from_secs(5));
    /// # Ok::<(), slate_core::Error>(())
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.options.lease = lease;
        self
    }

    /// Sets the renewal period explicitly (default: half the lease).
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// let o = slate_core::LockOptions::builder().renewal_period(Duration::from_secs(5)).build()?;
    /// assert_eq!(o.renewal_period(), Duration::from_secs(5));
    /// # Ok::<(), slate_core::Error>(())
    /// ```
    pub fn renewal_period(mut self, period: Duration) -> Self {
        self.options.renewal_period = Some(period);
        self
    }

    /// Sets the spin wait: the longest a parked waiter waits without an unlock notification
    /// before it retries.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// let o = slate_core::LockOptions::builder().spin_wait(Duration::from_millis(20)).build()?;
    /// assert_eq!(o.spin_wait(), Duration::from_millis(20));
    /// # Ok::<(), slate_core::Error>(())
    /// ```
    pub fn spin_wait(mut self, spin_wait: Duration) -> Self {
        self.options.spin_wait = spin_wait;
        self
    }

    /// Caps how long a lock is renewed; after that the lease runs out (stops zombie holders).
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// let o = slate_core::LockOptions::builder().max_hold(Duration::from_secs(600)).build()?;
    /// assert_eq!(o.max_hold(), Some(Duration::from_secs(600)));
    /// # Ok::<(), slate_core::Error>(())
    /// ```
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.options.max_hold = Some(max_hold);
        self
    }

    /// Sets the namespace of every key and channel the lock uses.
    ///
    /// # Examples
    ///
    /// ```
    /// let o = slate_core::LockOptions::builder().key_prefix("billing:").build()?;
    /// assert_eq!(o.key_prefix(), "billing:");
    /// # Ok::<(), slate_core::Error>(())
    /// ```
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.options.key_prefix = prefix.into();
        self
    }

    /// Checks every option against its rule and returns the options.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidInput`] naming the first invalid option, what is wrong and how to fix it.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// use slate_core::LockOptions;
    ///
    /// let err = LockOptions::builder()
    ///     .lease(Duration::from_secs(10))
    ///     .renewal_period(Duration::from_secs(10))
    ///     .build()
    ///     .unwrap_err();
    /// assert!(err.to_string().contains("renewal period"));
    /// ```
    pub fn build(self) -> Result<LockOptions> {
        self.options.validate()?;
        Ok(self.options)
    }
}

impl From<LockOptions> for LockOptionsBuilder {
    /// Starts from existing options (to change a few of them).
    fn from(options: LockOptions) -> Self {
        LockOptionsBuilder { options }
    }
}

/// The [`LockOptions`] setters of a lock builder, written once for every primitive: each
/// builder lists the settings that apply to it (a setting that does not apply is absent, not
/// ignored), for a builder struct whose field `options` is a [`LockOptionsBuilder`].
///
/// `setup` is the hidden doc-example lines (inside an async `main` returning
/// `$crate_name::Result<()>`) that bind what `start` needs; `start` is the expression that
/// starts the builder.
///
/// # Examples
///
/// ```text
/// slate_core::lock_options_setters!(SingleLockBuilder, slate_redis,
///     setup = "# let client = slate_redis::RedisClient::open(\"redis://127.0.0.1:6379\")?;",
///     start = "slate_redis::SingleLock::builder(&client, \"a\")",
///     [lease, renewal_period, spin_wait, max_hold, key_prefix, options]);
/// ```
#[macro_export]
macro_rules! lock_options_setters {
    ($builder:ident, $crate_name:ident, setup = $setup:literal, start = $start:literal, [$($setter:ident),* $(,)?] $(,)?) => {
        impl $builder {
            $( $crate::lock_options_setters!(@setter $setter, $crate_name, $setup, $start); )*
        }
    };
    (@doc $crate_name:ident, $setup:literal, $start:literal, $call:literal) => {
        concat!(
            "\n\n# Examples\n\n```no_run\n",
            "# #[tokio::main(flavor = \"current_thread\")] async fn main() -> ",
            stringify!($crate_name), "::Result<()> {\n", $setup, "\nlet lock = ", $start,
            "\n    ", $call, "\n    .build()?;\n# Ok(()) }\n```"
        )
    };
    (@setter lease, $c:ident, $setup:literal, $start:literal) => {
        #[doc = concat!(
            "Sets the lease: how long a hold lasts without renewal (default 30 s, at least 30 ms).",
            $crate::lock_options_setters!(@doc $c, $setup, $start, ".lease(std::time::Duration::from_secs(5))")
        )]
        pub fn lease(mut self, lease: ::std::time::Duration) -> Self {
            self.options = self.options.lease(lease);
            self
        }
    };
    (@setter renewal_period, $c:ident, $setup:literal, $start:literal) => {
        #[doc = concat!(
            "Sets the renewal period (default lease / 2; between lease / 10 and lease / 2).",
            $crate::lock_options_setters!(@doc $c, $setup, $start, ".renewal_period(std::time::Duration::from_secs(5))")
        )]
        pub fn renewal_period(mut self, period: ::std::time::Duration) -> Self {
            self.options = self.options.renewal_period(period);
            self
        }
    };
    (@setter spin_wait, $c:ident, $setup:literal, $start:literal) => {
        #[doc = concat!(
            "Sets the spin wait: the longest the queue head waits without a release message ",
            "before it asks again (default 50 ms).",
            $crate::lock_options_setters!(@doc $c, $setup, $start, ".spin_wait(std::time::Duration::from_millis(200))")
        )]
        pub fn spin_wait(mut self, spin_wait: ::std::time::Duration) -> Self {
            self.options = self.options.spin_wait(spin_wait);
            self
        }
    };
    (@setter max_hold, $c:ident, $setup:literal, $start:literal) => {
        #[doc = concat!(
            "Caps how long one hold is renewed: at the cap renewal stops and the lease runs out ",
            "(default: no cap).",
            $crate::lock_options_setters!(@doc $c, $setup, $start, ".max_hold(std::time::Duration::from_secs(600))")
        )]
        pub fn max_hold(mut self, max_hold: ::std::time::Duration) -> Self {
            self.options = self.options.max_hold(max_hold);
            self
        }
    };
    (@setter key_prefix, $c:ident, $setup:literal, $start:literal) => {
        #[doc = concat!(
            "Sets the namespace of the lock's keys and channels (default `slate:`).",
            $crate::lock_options_setters!(@doc $c, $setup, $start, ".key_prefix(\"app:\")")
        )]
        pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
            self.options = self.options.key_prefix(prefix);
            self
        }
    };
    (@setter options, $c:ident, $setup:literal, $start:literal) => {
        #[doc = concat!(
            "Replaces every option at once (`build()` refuses one that does not apply to this ",
            "lock, naming it).",
            "\n\n# Examples\n\n```no_run\n",
            "# #[tokio::main(flavor = \"current_thread\")] async fn main() -> ",
            stringify!($c), "::Result<()> {\n", $setup, "\nlet lock = ", $start,
            "\n    .options(", stringify!($c), "::LockOptions::default())\n    .build()?;\n# Ok(()) }\n```"
        )]
        pub fn options(mut self, options: $crate::LockOptions) -> Self {
            self.options = $crate::LockOptionsBuilder::from(options);
            self
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn what(o: LockOptionsBuilder) -> &'static str {
        match o.build() {
            Err(Error::InvalidInput { what, .. }) => what,
            other => panic!("expected invalid input, got {other:?}"),
        }
    }

    /// Options that behave alike are equal (a second handle of a lock built with the default
    /// renewal period written out is the same lock, not one "with other options").
    #[test]
    fn equality_is_by_behaviour() {
        let lease = Duration::from_secs(10);
        let implicit = LockOptions::builder().lease(lease).build().unwrap();
        let explicit = LockOptions::builder()
            .lease(lease)
            .renewal_period(lease / 2)
            .build()
            .unwrap();
        assert_eq!(implicit, explicit);
        let other = LockOptions::builder()
            .lease(lease)
            .renewal_period(lease / 4)
            .build()
            .unwrap();
        assert_ne!(implicit, other);
    }

    #[test]
    fn defaults_are_valid() {
        LockOptions::default().validate().unwrap();
        LockOptions::builder().lease(MIN_LEASE).build().unwrap();
    }

    #[test]
    fn every_rule_has_an_error() {
        let d = LockOptions::builder;
        assert_eq!(what(d().lease(Duration::from_millis(29))), "lease");
        assert_eq!(
            what(d().renewal_period(Duration::from_secs(30))),
            "renewal period"
        );
        assert_eq!(
            what(d().renewal_period(Duration::from_secs(16))),
            "renewal period"
        );
        assert_eq!(
            what(d().renewal_period(Duration::from_millis(2999))),
            "renewal period"
        );
        assert_eq!(what(d().spin_wait(Duration::ZERO)), "spin wait");
        assert_eq!(what(d().max_hold(Duration::ZERO)), "max hold");
        // large_durations_are_refused (issue 19, defect 2): these panicked later, in the
        // renewal service or on the clock, or reached Redis as an out-of-range TTL.
        assert_eq!(what(d().lease(Duration::MAX)), "lease");
        assert_eq!(
            what(d().lease(MAX_DURATION + Duration::from_millis(1))),
            "lease"
        );
        assert_eq!(what(d().spin_wait(Duration::MAX)), "spin wait");
        assert_eq!(what(d().max_hold(Duration::MAX)), "max hold");
        d().lease(MAX_DURATION).build().unwrap();
        d().max_hold(MAX_DURATION).build().unwrap();
        assert_eq!(what(d().key_prefix("a{b")), "key prefix");
        assert_eq!(what(d().key_prefix("p".repeat(257))), "key prefix");
        d().renewal_period(Duration::from_secs(3)).build().unwrap();
        d().renewal_period(Duration::from_secs(15)).build().unwrap();
        d().key_prefix("").build().unwrap();
    }
}
