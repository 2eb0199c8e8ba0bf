//! Ready-made consumers: a JSON-lines writer, a child program and a webhook.
//!
//! Each sink implements [`Consumer`](crate::consumer::Consumer), so a host
//! can register one exactly like its own consumers, and the `outboxd` binary
//! builds them from its config file. They live behind the `sinks` cargo
//! feature.
//!
//! | sink | delivered when | retried when | poison when |
//! |---|---|---|---|
//! | [`JsonlSink`] | the line is written and flushed (and synced, if asked) | a write fails | never |
//! | [`CommandSink`] | the program exits 0 | any other exit, a signal, the timeout | the program exits with the poison code (65) |
//! | [`WebhookSink`] | the receiver answers 2xx | 408, 425, 429, 5xx, network errors, timeouts | 410, other 4xx, redirects, refused addresses |
//! | [`NatsSink`](nats::NatsSink) (feature `nats`) | JetStream acknowledges the message (a duplicate too) | no ack within the timeout, not connected, no responders | invalid subject, no stream takes it, over the max payload |
//!
//! Every construction error is found before the first delivery: a missing
//! program, a bad URL, a malformed secret.
//!
//! What each sink delivers:
//!
//! | sink | envelope bytes | tenant id, legacy flag |
//! |---|---|---|
//! | [`JsonlSink`] | re-encoded on one line (whitespace between tokens dropped, U+0085/U+2028/U+2029 escaped), the same JSON value | extra `tenant_id` and `legacy` fields with [`delivery_fields`](JsonlSink::delivery_fields) |
//! | [`CommandSink`] | on stdin, the payload's bytes as stored | `OUTBOXD_TENANT_ID`, `OUTBOXD_LEGACY` |
//! | [`WebhookSink`] | the body, the payload's bytes as stored (signed) | `outboxd-tenant-id`, `outboxd-legacy` headers |
//!
//! Reasons (for logs and dead letters) never carry a configured secret, and
//! what a program or a receiver wrote into one is clipped and kept on one
//! line.

pub mod command;
pub mod jsonl;
#[cfg(feature = "nats")]
pub mod nats;
pub mod webhook;

pub use command::{CommandError, CommandSink};
pub use jsonl::{JsonlError, JsonlSink};
pub use webhook::{WebhookError, WebhookSecret, WebhookSink, WebhookSinkBuilder};

/// Text a program or a receiver wrote, made fit for a log line and a dead
/// letter: at most `max` bytes (the end of it with `keep_tail`, else the
/// start), with a `…` where text was dropped, on one line.
///
/// Line breaks, tabs, other control characters (an ANSI escape, say) and the
/// Unicode line and paragraph separators are written as escapes (`\n`,
/// `\u{1b}`), so what a consumer prints can never start a line of its own in
/// a text log or move a terminal's cursor: it cannot forge a log line.
pub(crate) fn bounded_text(bytes: &[u8], max: usize, keep_tail: bool) -> String {
    use std::fmt::Write;
    let text = String::from_utf8_lossy(bytes);
    let mut line = String::with_capacity(text.len());
    // Where each character's (possibly escaped) form starts: the only places
    // to cut, so that no escape is cut in half.
    let mut starts = Vec::with_capacity(text.len());
    for c in text.trim().chars() {
        starts.push(line.len());
        match c {
            '\n' => line.push_str("\\n"),
            '\r' => line.push_str("\\r"),
            '\t' => line.push_str("\\t"),
            c if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') => {
                let _ = write!(line, "\\u{{{:x}}}", u32::from(c));
            }
            c => line.push(c),
        }
    }
    if line.len() <= max {
        return line;
    }
    if keep_tail {
        let cut = starts
            .iter()
            .copied()
            .find(|&s| line.len() - s <= max)
            .unwrap_or(line.len());
        format!("…{}", &line[cut..])
    } else {
        let cut = starts
            .iter()
            .copied()
            .take_while(|&s| s <= max)
            .last()
            .unwrap_or(0);
        format!("{}…", &line[..cut])
    }
}

#[cfg(test)]
mod tests {
    use super::bounded_text;

    #[test]
    fn bounded_text_cuts_on_char_boundaries() {
        assert_eq!(bounded_text(b"  short \n", 10, true), "short");
        assert_eq!(bounded_text(b"abcdef", 3, true), "…def");
        assert_eq!(bounded_text(b"abcdef", 3, false), "abc…");
        let s = "ééé".as_bytes(); // 6 bytes
        assert_eq!(bounded_text(s, 3, true), "…é");
        assert_eq!(bounded_text(s, 3, false), "é…");
    }

    #[test]
    fn bounded_text_is_one_line() {
        assert_eq!(
            bounded_text(b"a\nb\r\nc\td\x1b[31me\xe2\x80\xa8f\xc2\x85g", 100, true),
            "a\\nb\\r\\nc\\td\\u{1b}[31me\\u{2028}f\\u{85}g"
        );
        // The bound holds after escaping, and no escape is cut in half.
        assert_eq!(bounded_text(b"ab\n\ncd", 5, false), "ab\\n…");
        assert_eq!(bounded_text(b"ab\n\ncd", 5, true), "…\\ncd");
    }
}
