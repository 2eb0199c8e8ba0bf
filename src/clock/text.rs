//! Durations and times as people write and read them: the one formatter
//! and the two parsers every message, flag, config value and form uses, so
//! that `30m` means the same everywhere and a duration is said one way.

use std::time::Duration;

use super::Timestamp;

/// A duration for people, in its two largest units: `850ms`, `1s 500ms`,
/// `42s`, `5m 3s`, `2h 10m`, `3d 4h`; a zero second unit is left out (`5m`,
/// `7d`), and zero is `0s`. Setting errors, `status` ages and `check-config`
/// echo durations in the units a person writes in a config (`604800s`
/// reads as `7d`).
///
/// ```
/// use std::time::Duration;
/// use outboxd::clock::format_duration;
/// assert_eq!(format_duration(Duration::from_secs(7 * 86_400)), "7d");
/// assert_eq!(format_duration(Duration::from_millis(303_000)), "5m 3s");
/// assert_eq!(format_duration(Duration::ZERO), "0s");
/// ```
pub fn format_duration(d: Duration) -> String {
    const UNITS: [(&str, u128); 5] = [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ];
    let ms = d.as_millis();
    if d.is_zero() {
        return "0s".to_string();
    }
    let Some(big) = UNITS.iter().position(|(_, size)| ms >= *size) else {
        // Under a millisecond, but not zero.
        return format!("{}µs", d.as_micros());
    };
    let (unit, size) = UNITS[big];
    let mut text = format!("{}{unit}", ms / size);
    if let Some((small_unit, small_size)) = UNITS.get(big + 1) {
        let small = ms % size / small_size;
        if small > 0 {
            text.push_str(&format!(" {small}{small_unit}"));
        }
    }
    text
}

/// [`format_duration`] of `d` rounded up to the smaller unit shown, for a
/// value that must be at least `d` (a window to set): `3h 23m 6s` is
/// `3h 24m`, never the too-short `3h 23m`.
pub fn format_duration_at_least(d: Duration) -> String {
    const SIZES: [u128; 5] = [86_400_000, 3_600_000, 60_000, 1_000, 1];
    let ms = d.as_millis();
    let step = match SIZES.iter().position(|size| ms >= *size) {
        Some(big) => SIZES.get(big + 1).copied().unwrap_or(1),
        None => return format_duration(d),
    };
    let up = ms.div_ceil(step) * step;
    format_duration(Duration::from_millis(u64::try_from(up).unwrap_or(u64::MAX)))
}

/// Why a duration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {input:?}: {reason}; expected a whole number and a unit: \
     500ms, 30s, 5m, 2h or 1d"
)]
pub struct DurationError {
    /// The text that was given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// Parses a duration written as a whole number and one unit: `ms`, `s`,
/// `m`, `h` or `d` (`500ms`, `30s`, `5m`, `2h`, `1d`), with blanks around
/// it allowed. The form of every duration in flags and the config.
///
/// ```
/// use std::time::Duration;
/// use outboxd::clock::parse_duration;
/// assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
/// assert!(parse_duration("5 min").is_err());
/// ```
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let fail = |reason| DurationError {
        input: input.to_string(),
        reason,
    };
    let s = input.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(|| {
        fail(if s.is_empty() {
            "it is empty"
        } else {
            "it has no unit"
        })
    })?;
    let (digits, unit) = s.split_at(split);
    if digits.is_empty() {
        return Err(fail("it does not start with a number"));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| fail("the number is too large"))?;
    let ms_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(fail("the unit is not one of ms, s, m, h, d")),
    };
    n.checked_mul(ms_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| fail("the number is too large"))
}

/// A time was neither RFC 3339 nor how long ago.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid time {input:?}: expected RFC 3339 (2026-11-30T07:18:00Z) or how long ago \
     (30m ago, 2h ago, 1d ago)"
)]
pub struct TimeError {
    /// The text that was given.
    pub input: String,
}

/// Parses a point in time: RFC 3339 (`2026-11-30T07:18:00Z`), a date and
/// time without a zone (taken as UTC: `2026-11-30T07:18`), or a duration
/// before `now` (`1h ago`, or just `1h`). What `replay --since/--until` and
/// the console's filters take.
///
/// ```
/// use outboxd::clock::parse_time;
/// use outboxd::Timestamp;
/// let now: Timestamp = "2026-11-30T08:00:00Z".parse().unwrap();
/// assert_eq!(parse_time("1h ago", now).unwrap().to_string(), "2026-11-30T07:00:00.000Z");
/// assert_eq!(parse_time("2026-11-30T07:18", now).unwrap().to_string(), "2026-11-30T07:18:00.000Z");
/// assert!(parse_time("yesterday", now).is_err());
/// ```
pub fn parse_time(input: &str, now: Timestamp) -> Result<Timestamp, TimeError> {
    let s = input.trim();
    if let Ok(t) = s.parse::<Timestamp>() {
        return Ok(t);
    }
    for suffix in ["Z", ":00Z"] {
        if let Ok(t) = format!("{s}{suffix}").parse::<Timestamp>() {
            return Ok(t);
        }
    }
    let before = s.strip_suffix("ago").map_or(s, str::trim_end);
    match parse_duration(before) {
        Ok(d) => Ok(now.minus(d)),
        Err(_) => Err(TimeError {
            input: input.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_a_persons_units() {
        let cases = [
            (0, "0s"),
            (850, "850ms"),
            (1_500, "1s 500ms"),
            (30_000, "30s"),
            (42_000, "42s"),
            (303_000, "5m 3s"),
            (7_800_000, "2h 10m"),
            (273_600_000, "3d 4h"),
            (300_000, "5m"),
            (604_800_000, "7d"),
            (1_209_600_000, "14d"),
        ];
        for (ms, want) in cases {
            assert_eq!(format_duration(Duration::from_millis(ms)), want);
        }
        assert_eq!(format_duration(Duration::from_micros(250)), "250µs");
    }

    #[test]
    fn at_least_rounds_up_to_the_smaller_unit_shown() {
        let at_least = |ms| format_duration_at_least(Duration::from_millis(ms));
        assert_eq!(at_least(12_186_000), "3h 24m");
        assert_eq!(at_least(12_180_000), "3h 23m");
        assert_eq!(at_least(40_500), "40s 500ms");
        assert_eq!(at_least(86_399_999), "1d");
        assert_eq!(at_least(0), "0s");
    }

    #[test]
    fn parses_every_unit() {
        let cases = [
            ("500ms", 500),
            ("0s", 0),
            ("30s", 30_000),
            ("5m", 300_000),
            ("2h", 7_200_000),
            ("1d", 86_400_000),
            (" 7s ", 7_000),
        ];
        for (input, ms) in cases {
            assert_eq!(
                parse_duration(input).unwrap(),
                Duration::from_millis(ms),
                "{input}"
            );
        }
    }

    #[test]
    fn refuses_other_duration_forms_and_names_the_allowed_ones() {
        for input in [
            "",
            "30",
            "s",
            "-5s",
            "1.5s",
            "5 m",
            "5min",
            "1h30m",
            "5S",
            "99999999999999999999s",
            "9999999999999999d",
        ] {
            let e = parse_duration(input).unwrap_err().to_string();
            assert!(e.contains("500ms, 30s, 5m, 2h or 1d"), "{input:?}: {e}");
        }
        let e = parse_duration("30").unwrap_err().to_string();
        assert!(e.contains("no unit"), "{e}");
        let e = parse_duration("5min").unwrap_err().to_string();
        assert!(e.contains("not one of ms, s, m, h, d"), "{e}");
    }

    #[test]
    fn every_formatted_whole_unit_parses_back() {
        for ms in [1, 500, 30_000, 300_000, 7_200_000, 86_400_000] {
            let d = Duration::from_millis(ms);
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d);
        }
    }

    #[test]
    fn times_are_rfc3339_or_how_long_ago() {
        let now: Timestamp = "2026-11-30T08:00:00Z".parse().unwrap();
        let at = |s: &str| parse_time(s, now).map(|t| t.to_string());
        let hour_ago = Ok("2026-11-30T07:00:00.000Z".to_string());
        assert_eq!(at("1h ago"), hour_ago);
        assert_eq!(at("1h  ago "), hour_ago);
        assert_eq!(at("1hago"), hour_ago);
        assert_eq!(at("1h"), hour_ago);
        assert_eq!(at("60m ago"), hour_ago);
        assert_eq!(at("2026-11-30T07:00:00Z"), hour_ago);
        assert_eq!(at("2026-11-30T09:00:00+02:00"), hour_ago);
        assert_eq!(at("2026-11-30T07:00:00"), hour_ago);
        assert_eq!(at("2026-11-30T07:00"), hour_ago);
        for bad in [
            "yesterday",
            "",
            "ago",
            "1.5h ago",
            "2026-11-30",
            "1h from now",
        ] {
            let e = parse_time(bad, now).unwrap_err().to_string();
            assert!(
                e.contains("RFC 3339") && e.contains("30m ago"),
                "{bad:?}: {e}"
            );
        }
    }
}
