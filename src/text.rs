//! Text for people: clipping text that others wrote (a producer's
//! malformed value, a consumer's failure reason) to a bounded size before
//! it goes into a message, a log line or a dead letter, so no row or
//! consumer can flood them; escaping its control characters, so it cannot
//! break a line or drive a terminal; and durations in the units a person
//! writes. The one place each is done.

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

/// True for what [`escape`] writes as an escape: control characters (line
/// breaks, tabs, ESC, BEL…) and the Unicode line and paragraph separators.
fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{2028}' | '\u{2029}')
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if needs_escape(c) => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
        c => out.push(c),
    }
}

/// `s` on one line, safe to print: line breaks, tabs, other control
/// characters (an ANSI escape, a BEL) and the Unicode line and paragraph
/// separators are written as escapes (`\n`, `\u{1b}`), so text a producer or
/// a consumer wrote can neither start a line of its own (in a table, a text
/// log) nor move a terminal's cursor or change its colours. Every CLI output
/// of such text goes through it (the console escapes for HTML instead).
///
/// ```
/// use outboxd::text::escape;
/// assert_eq!(escape("order.placed.v1"), "order.placed.v1");
/// assert_eq!(escape("a\nb\x1b[31mc\x07"), "a\\nb\\u{1b}[31mc\\u{7}");
/// ```
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        push_escaped(&mut out, c);
    }
    Cow::Owned(out)
}

/// [`escape`]d `s`, then at most `max` bytes of it (its start or its end)
/// with [`ELLIPSIS`] added where text was dropped; an escape is never cut in
/// half. What the sinks keep of a program's or a receiver's words.
///
/// ```
/// use outboxd::text::{escape_clipped, Keep};
/// assert_eq!(escape_clipped("ab\n\ncd", 5, Keep::Head), "ab\\n…");
/// assert_eq!(escape_clipped("ab\n\ncd", 5, Keep::Tail), "…\\ncd");
/// ```
pub fn escape_clipped(s: &str, max: usize, keep: Keep) -> String {
    let mut line = String::with_capacity(s.len());
    // Where each character's (possibly escaped) form starts: the only places
    // to cut, so that no escape is cut in half.
    let mut starts = Vec::with_capacity(s.len());
    for c in s.chars() {
        starts.push(line.len());
        push_escaped(&mut line, c);
    }
    if line.len() <= max {
        return line;
    }
    match keep {
        Keep::Tail => {
            let cut = starts
                .iter()
                .copied()
                .find(|&s| line.len() - s <= max)
                .unwrap_or(line.len());
            format!("{ELLIPSIS}{}", &line[cut..])
        }
        Keep::Head => {
            let cut = starts
                .iter()
                .copied()
                .take_while(|&s| s <= max)
                .last()
                .unwrap_or(0);
            format!("{}{ELLIPSIS}", &line[..cut])
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
