//! Parsers for argument values that clap does not know: the library's own
//! ([`outboxd::clock`]), so a flag takes what the config and the console take.

pub(crate) use outboxd::clock::parse_duration;
use outboxd::clock::{parse_time, TimeError};
use outboxd::Timestamp;

/// A time flag (`replay --since`): RFC 3339, or how long before now
/// (`1h ago`), as the console's filters take it.
pub(crate) fn parse_time_now(input: &str) -> Result<Timestamp, TimeError> {
    parse_time(input, Timestamp::now())
}
