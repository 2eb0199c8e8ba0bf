//! Text for people: clipping text that others wrote (a producer's
//! malformed value, a consumer's failure reason) to a bounded size before
//! it goes into a message, a log line or a dead letter, so no row or
//! consumer can flood them; escaping its control characters, so it cannot
//! break a line or drive a terminal; and durations in the units a person
//! writes. The one place each is done.

use std::borrow::Cow;

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

/// A duration for people, in its two largest units (`5m 3s`, `7d`): kept
/// at its 0.1 path; the formatter lives with the parsers in [`crate::clock`].
pub use crate::clock::format_duration as duration;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
