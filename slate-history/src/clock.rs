//! One monotonic timescale for every process on the machine.
//!
//! Histories from several worker processes are merged by timestamp, so every event is stamped
//! with `CLOCK_MONOTONIC` in nanoseconds ([`now_ns`]). That clock is shared by all processes on
//! one host (as long as they do not run in separate time namespaces) and never jumps with the
//! wall clock.
//!
//! Library values such as a guard's lease deadline are [`std::time::Instant`]s, which are not
//! serialisable. [`to_mono_ns`] converts an `Instant` of *this* process into the same timescale.
//! On Linux, `Instant` is itself read from `CLOCK_MONOTONIC`, so the conversion is an offset
//! sampled once (lazily, on first use): the error is at most half of the tightest of three
//! back-to-back samples, typically well under a microsecond, and it does not drift.

use std::sync::OnceLock;
use std::time::Instant;

use nix::errno::Errno;
use nix::time::{ClockId, clock_gettime};

/// Reads `CLOCK_MONOTONIC` in nanoseconds, or reports the OS error.
///
/// # Examples
///
/// ```
/// let a = slate_history::clock::try_now_ns()?;
/// let b = slate_history::clock::try_now_ns()?;
/// assert!(b >= a);
/// # Ok::<(), nix::errno::Errno>(())
/// ```
///
/// # Errors
///
/// The `errno` of `clock_gettime`. Linux never fails for `CLOCK_MONOTONIC`; the error exists
/// only because the system call has an error path.
pub fn try_now_ns() -> Result<u64, Errno> {
    let ts = clock_gettime(ClockId::CLOCK_MONOTONIC)?;
    let secs = u64::try_from(ts.tv_sec()).map_err(|_| Errno::EINVAL)?;
    let nanos = u64::try_from(ts.tv_nsec()).map_err(|_| Errno::EINVAL)?;
    Ok(secs.saturating_mul(1_000_000_000).saturating_add(nanos))
}

/// `CLOCK_MONOTONIC` in nanoseconds: the timestamp of every history event.
///
/// # Examples
///
/// ```
/// use slate_history::clock::now_ns;
/// let a = now_ns();
/// std::thread::sleep(std::time::Duration::from_millis(1));
/// assert!(now_ns() - a >= 1_000_000);
/// ```
///
/// # Errors
///
/// None; see the panic below.
///
/// # Panics
///
/// If `clock_gettime(CLOCK_MONOTONIC)` fails, which Linux never does. A history with a made-up
/// timestamp would be worse than a loud failure.
pub fn now_ns() -> u64 {
    match try_now_ns() {
        Ok(t) => t,
        Err(e) => panic!("clock_gettime(CLOCK_MONOTONIC) failed: {e}"),
    }
}

/// The calibration pair: an `Instant` and the monotonic nanoseconds read at the same moment.
fn calibration() -> (Instant, u64) {
    static CAL: OnceLock<(Instant, u64)> = OnceLock::new();
    *CAL.get_or_init(|| {
        let mut best: Option<(u64, Instant, u64)> = None;
        for _ in 0..3 {
            let before = now_ns();
            let instant = Instant::now();
            let after = now_ns();
            let gap = after.saturating_sub(before);
            let mid = before + gap / 2;
            if best.is_none_or(|(g, _, _)| gap < g) {
                best = Some((gap, instant, mid));
            }
        }
        match best {
            Some((_, instant, mid)) => (instant, mid),
            None => (Instant::now(), now_ns()),
        }
    })
}

/// Converts an `Instant` taken in this process to `CLOCK_MONOTONIC` nanoseconds, the timescale
/// of [`now_ns`].
///
/// The offset between the two clocks is sampled once, on first use. On Linux both read
/// `CLOCK_MONOTONIC`, so the error is bounded by half the sampling gap (sub-microsecond) and
/// constant for the life of the process. Results saturate at `0` and `u64::MAX`.
///
/// # Examples
///
/// ```
/// use slate_history::clock::{now_ns, to_mono_ns};
/// use std::time::{Duration, Instant};
/// let deadline = Instant::now() + Duration::from_secs(2);
/// let d = to_mono_ns(deadline);
/// let remaining = d - now_ns();
/// assert!(remaining <= 2_000_000_000 && remaining > 1_000_000_000);
/// ```
///
/// # Errors
///
/// None.
pub fn to_mono_ns(instant: Instant) -> u64 {
    let (base_instant, base_ns) = calibration();
    if instant >= base_instant {
        let d = instant.duration_since(base_instant).as_nanos();
        base_ns.saturating_add(u64::try_from(d).unwrap_or(u64::MAX))
    } else {
        let d = base_instant.duration_since(instant).as_nanos();
        base_ns.saturating_sub(u64::try_from(d).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn now_is_monotonic() {
        let mut last = now_ns();
        for _ in 0..1000 {
            let t = now_ns();
            assert!(t >= last);
            last = t;
        }
    }

    #[test]
    fn instant_conversion_matches_clock() {
        for _ in 0..100 {
            let before = now_ns();
            let i = Instant::now();
            let after = now_ns();
            let c = to_mono_ns(i);
            // The conversion error is sub-microsecond; allow 50 us for scheduling noise.
            assert!(
                c + 50_000 >= before && c <= after + 50_000,
                "{before} {c} {after}"
            );
        }
    }

    #[test]
    fn conversion_preserves_differences() {
        let a = Instant::now();
        let b = a + Duration::from_millis(1500);
        assert_eq!(to_mono_ns(b) - to_mono_ns(a), 1_500_000_000);
        let earlier = a.checked_sub(Duration::from_millis(5));
        if let Some(e) = earlier {
            assert_eq!(to_mono_ns(a) - to_mono_ns(e), 5_000_000);
        }
    }
}
