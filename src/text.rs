//! Text for people: clipping text that others wrote (a producer's
//! malformed value, a consumer's failure reason) to a bounded size before
//! it goes into a message, a log line or a dead letter, so no row or
//! consumer can flood them; and durations in the units a person writes.
//! The one place each is done.

use std::borrow::Cow;
use std::time::Duration;

/// The mark left where text was cut.
pub const ELLIPSIS: &str = "…";

/// Which end of a long text to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// The start (a value, a message that leads with its point).
    Head,
    /// The end (a log's or an error chain's tail, where the cause is).
    Tail,
}

/// `s` itself when it has at most `max` bytes; otherwise its head or tail,
/// cut on a character boundary, with [`ELLIPSIS`] where text was dropped,
/// in at most `max` bytes all told (unless `max` is smaller than the mark).
///
/// ```
/// use outboxd::text::{clip, Keep};
/// assert_eq!(clip("short", 10, Keep::Head), "short");
/// assert_eq!(clip("abcdefgh", 7, Keep::Head), "abcd…");
/// assert_eq!(clip("abcdefgh", 7, Keep::Tail), "…efgh");
/// assert_eq!(clip("ééé", 5, Keep::Head), "é…"); // never half a character
/// ```
pub fn clip(s: &str, max: usize, keep: Keep) -> Cow<'_, str> {
    if s.len() <= max {
        return Cow::Borrowed(s);
    }
    let room = max.saturating_sub(ELLIPSIS.len());
    match keep {
        Keep::Head => {
            let mut end = room;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            Cow::Owned(format!("{}{ELLIPSIS}", &s[..end]))
        }
        Keep::Tail => {
            let mut start = s.len() - room;
            while !s.is_char_boundary(start) {
                start += 1;
            }
            Cow::Owned(format!("{ELLIPSIS}{}", &s[start..]))
        }
    }
}

/// A duration for people, in its two largest units: `850ms`, `1s 500ms`,
/// `42s`, `5m 3s`, `2h 10m`, `3d 4h`; a zero second unit is left out (`5m`,
/// `7d`), and zero is `0s`. The one duration formatter of outboxd: setting
/// errors, `status` ages and `check-config` settings echo durations in the
/// units a person writes in a config (`604800s` reads as `7d`).
///
/// ```
/// use std::time::Duration;
/// use outboxd::text::duration;
/// assert_eq!(duration(Duration::from_secs(7 * 86_400)), "7d");
/// assert_eq!(duration(Duration::from_millis(303_000)), "5m 3s");
/// assert_eq!(duration(Duration::ZERO), "0s");
/// ```
pub fn duration(d: Duration) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
            assert_eq!(duration(Duration::from_millis(ms)), want);
        }
        assert_eq!(duration(Duration::from_micros(250)), "250µs");
    }

    #[test]
    fn cuts_on_character_boundaries() {
        let s = "ééé"; // 6 bytes
        assert_eq!(clip(s, 6, Keep::Head), "ééé");
        assert_eq!(clip(s, 5, Keep::Head), "é…");
        assert_eq!(clip(s, 5, Keep::Tail), "…é");
        assert_eq!(clip(s, 4, Keep::Head), "…");
        assert_eq!(clip("aéé", 5, Keep::Head), "aéé");
        assert_eq!(clip("aéé", 4, Keep::Head), "a…");
    }

    proptest! {
        #[test]
        fn never_longer_than_max_and_keeps_the_chosen_end(s in ".{0,40}", max in 3usize..30) {
            for keep in [Keep::Head, Keep::Tail] {
                let c = clip(&s, max, keep);
                prop_assert!(c.len() <= max);
                if s.len() <= max {
                    prop_assert_eq!(&*c, s.as_str());
                } else if keep == Keep::Head {
                    prop_assert!(s.starts_with(c.trim_end_matches(ELLIPSIS)));
                } else {
                    prop_assert!(s.ends_with(c.trim_start_matches(ELLIPSIS)));
                }
            }
        }
    }
}
