//! Mutant builds: test-only switches that break the library on purpose, one way each, so that
//! the scenario suite can show that it catches every way a lock is known to break
//! (`docs/RELIABILITY.md`, "Mutants", and `.ci/mutants`).
//!
//! The switches exist only with the `mutants` feature, which no published build enables (the
//! test harness turns it on for the workspace's tests). Without it [`active`] is a constant
//! `false` and every switch folds away. With it, a switch is on when the environment variable
//! `SLATE_MUTANT` names it, read once per process.
//!
//! # Examples
//!
//! ```
//! use slate_core::mutant::{self, Mutant};
//! // Off unless the build has the feature and SLATE_MUTANT names the mutant.
//! if mutant::active(Mutant::ReleaseSkipsHolderCheck) {
//!     println!("this process breaks the lock on purpose");
//! }
//! assert_eq!(Mutant::from_name("lease-from-reply"), Some(Mutant::LeaseFromReply));
//! ```

/// One way to break a lock on purpose.
///
/// # Examples
///
/// ```
/// use slate_core::mutant::Mutant;
/// assert!(Mutant::ALL.iter().all(|m| Mutant::from_name(m.name()) == Some(*m)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutant {
    /// The lease watch never reports its deadline passing, and the renewal service never
    /// reports a lease it could not renew in time: a holder believes it holds for ever.
    LeaseIgnoresDeadline,
    /// The Redis locks count a lease from the reply instead of from the send.
    LeaseFromReply,
    /// The single lock's release deletes the lock whoever holds it.
    ReleaseSkipsHolderCheck,
    /// The single lock's renewal extends the key whoever holds it.
    RenewAnyHolder,
    /// The single lock grants a free lock whatever process's turn it is.
    GrantIgnoresTurn,
    /// The single lock's acquire takes a fencing token before it checks the holder.
    TokenBeforeHolderCheck,
    /// The combination lock admits a server restarted empty without quarantine.
    QuarantineAdmitsYoung,
    /// A hold passed to a local waiter gets a fresh lease instead of what is left of the Redis
    /// hold's.
    PassOutlivesLease,
    /// The ZooKeeper lock watches its own znode instead of its predecessor.
    ZkWrongPredecessor,
    /// A waiter that becomes the head keeps the retry state of its own busy entry attempt:
    /// it parks a full spin wait instead of attempting.
    NewHeadKeepsRetry,
    /// A grant processed after its lease ran out displaces a live local hold ("the last
    /// grant processed wins").
    LateGrantDisplaces,
    /// The countdown latch counts every copy of a count-down that was sent again.
    LatchCountsResends,
    /// The multi-lock's batch goes on past the first name it does not grant.
    BatchPastRefusal,
    /// The multi-lock's batched release leaves its last name out.
    ReleaseManySkipsAName,
    /// The acquire never raises a slot's fencing counter to the server's clock, so a server
    /// that came back with older data issues tokens again.
    FenceRaiseSkipped,
    /// The single lock's fast path takes a free lock without looking for the holder's request
    /// record key: a stale copy of a request its caller gave up on (cancelled) grants.
    FastPathSkipsRecord,
    /// The single lock's fast path takes a free lock without looking for the line and the
    /// turn: a newcomer takes a lock reserved for a waiting process.
    FastPathSkipsTurn,
    /// The single lock's fast path grants a re-entry-only call: a holder whose hold was lost
    /// counts a fresh hold as one more level.
    FastPathGrantsReentryOnly,
}

impl Mutant {
    /// Every mutant.
    pub const ALL: [Mutant; 18] = [
        Mutant::LeaseIgnoresDeadline,
        Mutant::LeaseFromReply,
        Mutant::ReleaseSkipsHolderCheck,
        Mutant::RenewAnyHolder,
        Mutant::GrantIgnoresTurn,
        Mutant::TokenBeforeHolderCheck,
        Mutant::QuarantineAdmitsYoung,
        Mutant::PassOutlivesLease,
        Mutant::ZkWrongPredecessor,
        Mutant::NewHeadKeepsRetry,
        Mutant::LateGrantDisplaces,
        Mutant::LatchCountsResends,
        Mutant::BatchPastRefusal,
        Mutant::ReleaseManySkipsAName,
        Mutant::FenceRaiseSkipped,
        Mutant::FastPathSkipsRecord,
        Mutant::FastPathSkipsTurn,
        Mutant::FastPathGrantsReentryOnly,
    ];

    /// The name `SLATE_MUTANT` takes.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_core::mutant::Mutant::RenewAnyHolder.name(), "renew-any-holder");
    /// ```
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Mutant::LeaseIgnoresDeadline => "lease-ignores-deadline",
            Mutant::LeaseFromReply => "lease-from-reply",
            Mutant::ReleaseSkipsHolderCheck => "release-skips-holder-check",
            Mutant::RenewAnyHolder => "renew-any-holder",
            Mutant::GrantIgnoresTurn => "grant-ignores-turn",
            Mutant::TokenBeforeHolderCheck => "token-before-holder-check",
            Mutant::QuarantineAdmitsYoung => "quarantine-admits-young",
            Mutant::PassOutlivesLease => "pass-outlives-lease",
            Mutant::ZkWrongPredecessor => "zk-wrong-predecessor",
            Mutant::NewHeadKeepsRetry => "new-head-keeps-retry",
            Mutant::LateGrantDisplaces => "late-grant-displaces",
            Mutant::LatchCountsResends => "latch-counts-resends",
            Mutant::BatchPastRefusal => "batch-past-refusal",
            Mutant::ReleaseManySkipsAName => "release-many-skips-a-name",
            Mutant::FenceRaiseSkipped => "fence-raise-skipped",
            Mutant::FastPathSkipsRecord => "fast-path-skips-record",
            Mutant::FastPathSkipsTurn => "fast-path-skips-turn",
            Mutant::FastPathGrantsReentryOnly => "fast-path-grants-reentry-only",
        }
    }

    /// The mutant a name stands for.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_core::mutant::Mutant::from_name("nonsense"), None);
    /// ```
    #[must_use]
    pub fn from_name(name: &str) -> Option<Mutant> {
        Mutant::ALL.into_iter().find(|m| m.name() == name)
    }
}

/// Whether this build has the mutant switches (the test-only `mutants` feature): a test crate
/// whose tests `.ci/mutants` runs asserts it, so that losing the feature (a dev-dependency
/// dropped) fails at once instead of every mutant of that crate going uncaught.
///
/// # Examples
///
/// ```
/// let _compiled_in: bool = slate_core::mutant::BUILT_IN;
/// ```
pub const BUILT_IN: bool = cfg!(feature = "mutants");

/// Whether `m` is switched on in this process.
///
/// # Examples
///
/// ```
/// use slate_core::mutant::{active, Mutant};
/// let _ = active(Mutant::LeaseFromReply);
/// ```
#[cfg(feature = "mutants")]
#[must_use]
pub fn active(m: Mutant) -> bool {
    use std::sync::OnceLock;
    static ON: OnceLock<Option<Mutant>> = OnceLock::new();
    *ON.get_or_init(|| {
        let name = std::env::var("SLATE_MUTANT").ok()?;
        if name.is_empty() {
            return None;
        }
        let found = Mutant::from_name(&name);
        match found {
            Some(m) => eprintln!(
                "slate: SLATE_MUTANT={} is on: this process breaks its locks on purpose",
                m.name()
            ),
            None => eprintln!(
                "slate: SLATE_MUTANT={name:?} names no mutant and is ignored; the mutants are: {}",
                Mutant::ALL.map(Mutant::name).join(", ")
            ),
        }
        found
    }) == Some(m)
}

/// Whether `m` is switched on in this process: never, in a build without the `mutants`
/// feature.
///
/// # Examples
///
/// ```
/// use slate_core::mutant::{active, Mutant};
/// let _ = active(Mutant::LeaseFromReply);
/// ```
#[cfg(not(feature = "mutants"))]
#[must_use]
#[inline(always)]
pub const fn active(_m: Mutant) -> bool {
    false
}
