//! Seeds for the fault schedules of the scenario tests, printed so any run can be replayed.
//!
//! Every scenario that draws something at random (which worker to pause, when to kill a node,
//! how long a delay lasts) takes a [`Seed`] first. The seed comes from `SLATE_SEED` when it is
//! set, so a failing run is replayed with the same schedule, and is otherwise drawn from the
//! clock and the process id. It is printed on standard error either way; the test harness
//! shows it with the output of a failing test.

use std::time::{SystemTime, UNIX_EPOCH};

/// The environment variable that fixes the seed of every scenario in a run.
pub const SEED_VAR: &str = "SLATE_SEED";

/// A scenario's seed and a small deterministic generator (SplitMix64) drawn from it.
///
/// # Examples
///
/// ```
/// let mut seed = slate_harness::seed::Seed::with_value("doc", 42);
/// let a = seed.below(10);
/// let mut again = slate_harness::seed::Seed::with_value("doc", 42);
/// assert_eq!(a, again.below(10));
/// ```
#[derive(Debug, Clone)]
pub struct Seed {
    value: u64,
    state: u64,
}

impl Seed {
    /// The seed for the scenario `name`: `SLATE_SEED` if set, else a fresh one; printed as
    /// `ecosphere seed: <name> SLATE_SEED=<value>`.
    ///
    /// # Panics
    ///
    /// When `SLATE_SEED` is set but is not an unsigned 64-bit integer (a test setup error,
    /// reported with the variable's value and what it should be).
    #[must_use]
    pub fn for_scenario(name: &str) -> Seed {
        let value = match std::env::var(SEED_VAR) {
            Ok(text) => text.trim().parse::<u64>().unwrap_or_else(|_| {
                panic!("{SEED_VAR}={text:?} is not a seed: give an unsigned 64-bit integer")
            }),
            Err(_) => fresh(),
        };
        Seed::with_value(name, value)
    }

    /// A seed with a given value (printed like [`Seed::for_scenario`]).
    #[must_use]
    pub fn with_value(name: &str, value: u64) -> Seed {
        eprintln!("ecosphere seed: {name} {SEED_VAR}={value}");
        Seed {
            value,
            state: value,
        }
    }

    /// The seed's value, as printed.
    #[must_use]
    pub fn value(&self) -> u64 {
        self.value
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (0 when `bound` is 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        if bound == 0 {
            0
        } else {
            self.next_u64() % bound
        }
    }

    /// A duration in `low..=high` milliseconds.
    pub fn millis_between(&mut self, low: u64, high: u64) -> std::time::Duration {
        let (low, high) = if low <= high {
            (low, high)
        } else {
            (high, low)
        };
        std::time::Duration::from_millis(low + self.below(high - low + 1))
    }
}

fn fresh() -> u64 {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    // Truncation is fine: only the low bits vary between runs anyway.
    #[allow(clippy::cast_possible_truncation)]
    let nanos = nanos as u64;
    nanos ^ (u64::from(std::process::id()) << 32)
}

#[cfg(test)]
mod tests {
    use super::Seed;

    #[test]
    fn the_same_seed_gives_the_same_draws_and_others_differ() {
        let draw = |v| {
            let mut s = Seed::with_value("t", v);
            (0..8).map(|_| s.below(1000)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        let mut s = Seed::with_value("t", 1);
        for _ in 0..100 {
            let d = s.millis_between(5, 9).as_millis();
            assert!((5..=9).contains(&d), "{d}");
        }
    }
}
