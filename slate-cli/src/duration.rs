//! Durations on the command line: `500ms`, `30s`, `2m`, `1h`, `1m30s`.

use std::fmt;
use std::time::Duration;

/// Parses a duration such as `30s`, `500ms`, `2m`, `1h` or `1m30s`.
///
/// A number without a unit is refused (it is ambiguous), as are negative or fractional
/// numbers and unknown units; every error says what was expected.
///
/// # Errors
///
/// A message for the user naming the problem and the accepted forms.
pub fn parse(text: &str) -> Result<Duration, String> {
    const FORMS: &str = "use a number with a unit: ms, s, m or h (e.g. 500ms, 30s, 2m, 1m30s)";
    let s = text.trim();
    if s.is_empty() {
        return Err(format!("empty duration; {FORMS}"));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!(
                "{text:?} is not a duration (expected a number at {rest:?}); {FORMS}"
            ));
        }
        let (number, after) = rest.split_at(digits);
        let value: u64 = number
            .parse()
            .map_err(|_| format!("{number:?} is too large in {text:?}"))?;
        let unit_len = after
            .bytes()
            .take_while(|b| b.is_ascii_alphabetic())
            .count();
        let (unit, next) = after.split_at(unit_len);
        let part = match unit {
            "ms" => Some(Duration::from_millis(value)),
            "s" => Some(Duration::from_secs(value)),
            "m" => value.checked_mul(60).map(Duration::from_secs),
            "h" => value.checked_mul(3600).map(Duration::from_secs),
            "" => {
                return Err(format!("{text:?} has no unit; {FORMS}"));
            }
            other => {
                return Err(format!("unknown unit {other:?} in {text:?}; {FORMS}"));
            }
        };
        total = part
            .and_then(|p| total.checked_add(p))
            .ok_or_else(|| format!("{text:?} is too large"))?;
        rest = next;
    }
    Ok(total)
}

/// How long `slate run` waits for the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitFor {
    /// At most this long (`0s`: one attempt, no waiting).
    Upto(Duration),
    /// Until acquired.
    Forever,
}

impl fmt::Display for WaitFor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WaitFor::Upto(d) => f.write_str(&human(*d)),
            WaitFor::Forever => f.write_str("forever"),
        }
    }
}

/// Parses `--wait`: a duration or `forever`.
///
/// # Errors
///
/// As [`parse`].
pub fn parse_wait(text: &str) -> Result<WaitFor, String> {
    match text.trim() {
        "forever" | "inf" | "infinite" => Ok(WaitFor::Forever),
        other => parse(other).map(WaitFor::Upto),
    }
}

/// A short human form: `850ms`, `12.3s`, `2m05s`, `3h20m`, `12d04h`.
#[must_use]
pub fn human(d: Duration) -> String {
    let ms = d.as_millis();
    if d.is_zero() {
        "0s".to_owned()
    } else if ms < 1_000 {
        if d < Duration::from_millis(10) {
            format!("{:.1}ms", d.as_secs_f64() * 1e3)
        } else {
            format!("{ms}ms")
        }
    } else if ms < 60_000 {
        let tenths = (ms + 50) / 100;
        if tenths.is_multiple_of(10) {
            format!("{}s", tenths / 10)
        } else {
            format!("{}.{}s", tenths / 10, tenths % 10)
        }
    } else if d < Duration::from_secs(3600) {
        let secs = d.as_secs();
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else if d < Duration::from_secs(86_400) {
        let mins = d.as_secs() / 60;
        format!("{}h{:02}m", mins / 60, mins % 60)
    } else {
        let hours = d.as_secs() / 3600;
        format!("{}d{:02}h", hours / 24, hours % 24)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse(" 0s "), Ok(Duration::ZERO));
    }

    #[test]
    fn errors_say_what_is_expected() {
        for bad in ["", "30", "3x", "s", "-1s", "1.5s", "99999999999999999999s"] {
            let e = parse(bad).expect_err(bad);
            assert!(!e.is_empty(), "{bad}");
        }
        assert!(parse("30").unwrap_err().contains("no unit"));
        assert!(parse("3x").unwrap_err().contains("unknown unit"));
    }

    #[test]
    fn wait_forever() {
        assert_eq!(parse_wait("forever"), Ok(WaitFor::Forever));
        assert_eq!(
            parse_wait("10s"),
            Ok(WaitFor::Upto(Duration::from_secs(10)))
        );
    }

    #[test]
    fn human_forms() {
        assert_eq!(human(Duration::from_millis(850)), "850ms");
        assert_eq!(human(Duration::from_millis(12_340)), "12.3s");
        assert_eq!(human(Duration::from_secs(10)), "10s");
        assert_eq!(human(Duration::from_secs(125)), "2m05s");
        assert_eq!(human(Duration::from_secs(3599)), "59m59s");
        assert_eq!(human(Duration::from_secs(24 * 3600 - 1)), "23h59m");
        assert_eq!(human(Duration::from_secs(49 * 3600)), "2d01h");
        assert_eq!(human(Duration::MAX), format!("{}d07h", u64::MAX / 86_400));
        assert_eq!(human(Duration::from_micros(1_500)), "1.5ms");
        assert_eq!(human(Duration::ZERO), "0s");
    }
}
