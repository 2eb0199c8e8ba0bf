//! Parsers for argument values that clap does not know.

use std::time::Duration;

/// Why a duration argument was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {input:?}: {reason}; expected a whole number and a unit: \
     500ms, 30s, 5m, 2h or 1d"
)]
pub struct DurationError {
    input: String,
    reason: &'static str,
}

/// Parses a duration written as a whole number and one unit: `ms`, `s`,
/// `m`, `h` or `d` (`500ms`, `30s`, `5m`, `2h`, `1d`).
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn refuses_other_forms_and_names_the_allowed_ones() {
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
}
