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

pub mod command;
pub mod jsonl;
#[cfg(feature = "nats")]
pub mod nats;
pub mod webhook;

pub use command::{CommandError, CommandSink};
pub use jsonl::{JsonlError, JsonlSink};
pub use webhook::{WebhookError, WebhookSecret, WebhookSink, WebhookSinkBuilder};

/// Keeps at most `max` bytes of `s`, cut on a character boundary, and says
/// how much was dropped. Used for stderr tails and response snippets so a
/// hostile program or receiver cannot flood a dead letter.
pub(crate) fn bounded_text(bytes: &[u8], max: usize, keep_tail: bool) -> String {
    let text = String::from_utf8_lossy(bytes);
    let text = text.trim();
    if text.len() <= max {
        return text.to_string();
    }
    if keep_tail {
        let mut start = text.len() - max;
        while !text.is_char_boundary(start) {
            start += 1;
        }
        format!("…{}", &text[start..])
    } else {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &text[..end])
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
}
