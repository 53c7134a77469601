//! Fencing tokens.

use std::fmt;

/// A number that strictly increases with every new holder of a lock.
///
/// Every first-level acquisition returns a token strictly greater than any token an earlier
/// holder of the same lock received; a re-entrant acquisition returns the holder's current
/// token. Pass it to every storage system the critical section writes to and have that
/// system reject a token lower than the highest it has seen: that turns a holder that
/// outlived its lease (a long pause, a partition) from a silent corruption into a rejected
/// write.
///
/// Limits: on a single Redis node the counter lives on that node and restarts from zero if
/// the node loses its data. See each lock's documentation for what its tokens guarantee.
///
/// # Examples
///
/// ```
/// use slate_core::FencingToken;
///
/// let t = FencingToken::new(7);
/// assert!(t > FencingToken::new(6));
/// assert_eq!(t.get(), 7);
/// assert_eq!(t.to_string(), "7");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a raw token value.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_core::FencingToken::new(1).get(), 1);
    /// ```
    #[must_use]
    pub const fn new(value: u64) -> Self {
        FencingToken(value)
    }

    /// The raw value.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(slate_core::FencingToken::new(3).get(), 3);
    /// ```
    #[must_use]
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<FencingToken> for u64 {
    fn from(t: FencingToken) -> u64 {
        t.0
    }
}
