//! Ready-made consumers: a JSON-lines writer, a child program, a webhook,
//! a NATS JetStream publisher (feature `nats`), and SQL statements run
//! exactly once in the relay's database.
//!
//! Each sink implements [`Consumer`](crate::consumer::Consumer) (the SQL
//! sink, [`TransactionalConsumer`](crate::consumer::TransactionalConsumer)),
//! so a host can register one exactly like its own consumers, and the
//! `outboxd` binary builds them from its config file. They live behind the
//! `sinks` cargo feature.
//!
//! | sink | delivered when | retried when | poison when |
//! |---|---|---|---|
//! | [`JsonlSink`] | the line is written and flushed (and synced, if asked) | a write fails | never (its failures are the file's, not the event's) |
//! | [`CommandSink`] | the program exits 0 | any other exit, a signal, the timeout | the program exits with the poison code (65); a variable it cannot be started with (a NUL byte, too large for the system) |
//! | [`WebhookSink`] | the receiver answers 2xx | 408, 425, 429, 5xx, network errors, timeouts | 410, other 4xx, redirects, refused addresses, a tenant header over [`MAX_TENANT_HEADER_BYTES`](webhook::MAX_TENANT_HEADER_BYTES) |
//! | [`NatsSink`](nats::NatsSink) (feature `nats`) | JetStream acknowledges the message (a duplicate too) | no ack within the timeout, not connected, no responders | invalid subject, no stream takes it, a header with a line break, over the max payload (headers included) |
//! | [`SqlSink`] | every statement ran (committed with its progress, exactly once) | any other SQL error (memory, a full disk) | a constraint fails, a value's type or size is refused, SQLite's JSON functions cannot read a value |
//!
//! A sink that cannot have the memory for an event's bytes (out of memory)
//! retries that event; the process goes on. Each holds a payload in one
//! buffer of its own at most, reserved at its size before it is written
//! (the sql sink's bound values are SQLite's: one copy, and a second to
//! read it as text), beside the one copy the relay keeps for the delivery.
//!
//! Every construction error is found before the first delivery: a missing
//! program, a bad URL, a malformed secret. [`WebhookSink::probe`] and
//! [`NatsSinkBuilder::probe`](nats::NatsSinkBuilder::probe) look at the
//! destination without delivering (check-config's look): what no retry can
//! fix, a host name that does not exist or a TLS handshake that cannot
//! succeed, is an error there; an outage is not.
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

mod buffer;
pub mod command;
pub mod jsonl;
#[cfg(feature = "nats")]
pub mod nats;
mod reach;
pub mod sql;
pub mod webhook;

pub use command::{CommandError, CommandSink};
pub use jsonl::{JsonlError, JsonlSink};
pub use sql::{SqlSink, SqlSinkError};
pub use webhook::{WebhookError, WebhookSecret, WebhookSink, WebhookSinkBuilder};

/// Text a program or a receiver wrote, made fit for a log line and a dead
/// letter: trimmed, on one line (control characters escaped, so what a
/// consumer prints can never forge a log line or move a terminal's
/// cursor), at most `max` bytes (the end of it with `keep_tail`, else the
/// start) with a `…` where text was dropped: [`crate::text::escape_clipped`].
pub(crate) fn bounded_text(bytes: &[u8], max: usize, keep_tail: bool) -> String {
    use crate::text::{escape_clipped, Keep};
    let keep = if keep_tail { Keep::Tail } else { Keep::Head };
    escape_clipped(String::from_utf8_lossy(bytes).trim(), max, keep)
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
