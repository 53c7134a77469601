//! Small statistics helpers: percentiles and min / median / max over runs.

use serde::Serialize;

/// The `q`-quantile (0.0..=1.0) of sorted samples, nearest-rank; `None` when empty.
#[must_use]
pub fn quantile(sorted: &[u32], q: f64) -> Option<u32> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Minimum, median and maximum of a series of per-run values.
#[derive(Clone, Copy, Debug, Serialize, PartialEq)]
pub struct Spread {
    /// Smallest value.
    pub min: f64,
    /// Median (the mean of the two middle values for an even count).
    pub median: f64,
    /// Largest value.
    pub max: f64,
}

impl Spread {
    /// The spread of `values`; `None` when empty or when any value is NaN.
    #[must_use]
    pub fn of(values: &[f64]) -> Option<Spread> {
        if values.is_empty() || values.iter().any(|v| v.is_nan()) {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Spread {
            min: v[0],
            median,
            max: v[n - 1],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_nearest_rank() {
        let s: Vec<u32> = (1..=100).collect();
        assert_eq!(quantile(&s, 0.5), Some(50));
        assert_eq!(quantile(&s, 0.99), Some(99));
        assert_eq!(quantile(&s, 1.0), Some(100));
        assert_eq!(quantile(&s, 0.0), Some(1));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn spread_median() {
        assert_eq!(Spread::of(&[3.0, 1.0, 2.0]).unwrap().median, 2.0);
        assert_eq!(Spread::of(&[4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
        assert!(Spread::of(&[]).is_none());
    }
}
