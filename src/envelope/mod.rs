//! The versioned event envelope: what every consumer receives.
//!
//! ```json
//! {"event_id":"01JDQ8F6ZC1Y0D3W9N7K2M4P5R","event_type":"article.created.v1",
//!  "event_version":1,"causation_id":null,"correlation_id":"req-42",
//!  "occurred_at":"2026-11-30T07:18:00.123Z","payload":{"id":7}}
//! ```
//!
//! Every envelope field is parsed and validated here and nowhere else: by
//! [`EventType::parse`], [`EventId::parse`] and `check_row`, the one check
//! of a stored row, which the relay applies to each row it delivers,
//! whoever wrote it.
//!
//! The ids are in id.rs, the event types in event_type.rs, the check of a
//! stored row in row.rs; the envelope itself and the error every check
//! gives are here.

mod event_type;
mod id;
mod row;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::clock::Timestamp;

pub use event_type::{EventType, MAX_EVENT_TYPE_LEN};
pub use id::EventId;
pub(crate) use row::{check_head, row_columns, trace_columns, OwnedRow};
pub use row::{check_row, CheckedRow, RawRow, ROW_COLUMNS, TRACE_COLUMNS};

/// Why an envelope field was refused. Each message says what is wrong and
/// what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvelopeError {
    /// The event type does not follow `<domain>.<verb>.v<N>`.
    #[error(
        "invalid event type {input:?}: {reason}; expected <domain>.<verb>.v<N> \
         (lowercase segments of a-z, 0-9 and _, such as article.created.v1)"
    )]
    EventType {
        /// The type as given.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The event id is not a ULID.
    #[error("invalid event id {input:?}: expected a ULID (26 characters of Crockford base32)")]
    EventId {
        /// The id as given.
        input: String,
    },
    /// event_version disagrees with the type's suffix.
    #[error(
        "event_version {version} does not match event type {event_type} (which says {expected})"
    )]
    VersionMismatch {
        /// The type.
        event_type: String,
        /// The version stored beside it.
        version: i64,
        /// The version the type's suffix says.
        expected: u32,
    },
    /// The payload is not valid JSON.
    #[error("payload is not valid JSON: {reason}")]
    PayloadJson {
        /// serde_json's description, with line and column.
        reason: String,
    },
    /// A text column holds bytes that are not UTF-8.
    #[error("column {column} is not valid UTF-8")]
    NotUtf8 {
        /// The column's name.
        column: &'static str,
    },
    /// A column holds a value of the wrong SQL type.
    #[error("column {column} holds {found}, expected {expected}")]
    ColumnType {
        /// The column's name.
        column: &'static str,
        /// What was found ("a BLOB").
        found: &'static str,
        /// What is allowed.
        expected: &'static str,
    },
}

/// The delivered form of an event. The payload stays the JSON text the
/// producer wrote (validated, never re-encoded); [`Envelope::payload_as`]
/// decodes it.
///
/// ```
/// use outboxd::Envelope;
/// let json = r#"{"event_id":"01JDQ8F6ZC1Y0D3W9N7K2M4P5R","event_type":"article.created.v1",
///   "event_version":1,"causation_id":null,"correlation_id":null,
///   "occurred_at":"2026-11-30T07:18:00.000Z","payload":{"id":7}}"#;
/// let env: Envelope = serde_json::from_str(json).unwrap();
/// assert_eq!(env.event_type.as_str(), "article.created.v1");
/// #[derive(serde::Deserialize)] struct Article { id: u32 }
/// assert_eq!(env.payload_as::<Article>().unwrap().id, 7);
/// ```
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// The event's id.
    pub event_id: EventId,
    /// The event's type, with its version suffix.
    pub event_type: EventType,
    /// The version, equal to the type's suffix.
    pub event_version: u32,
    /// The id of whatever caused this event (a command, a request, another event).
    pub causation_id: Option<String>,
    /// The id shared by everything one request caused.
    pub correlation_id: Option<String>,
    /// When the producer says it happened.
    pub occurred_at: Timestamp,
    /// The business payload.
    pub payload: Box<RawValue>,
}

impl PartialEq for Envelope {
    fn eq(&self, other: &Self) -> bool {
        self.event_id == other.event_id
            && self.event_type == other.event_type
            && self.event_version == other.event_version
            && self.causation_id == other.causation_id
            && self.correlation_id == other.correlation_id
            && self.occurred_at == other.occurred_at
            && self.payload.get() == other.payload.get()
    }
}

impl Envelope {
    /// Decodes the payload into a type of the consumer's.
    pub fn payload_as<T: serde::de::DeserializeOwned>(&self) -> serde_json::Result<T> {
        serde_json::from_str(self.payload.get())
    }

    /// The envelope as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an envelope always serializes")
    }
}

/// Cuts long input in error messages so a hostile row cannot flood the log.
fn truncate(s: &str) -> String {
    crate::text::clip(s, 80, crate::text::Keep::Head).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_serde_round_trip() {
        let env = Envelope {
            event_id: EventId::new(),
            event_type: EventType::parse("article.created.v1").unwrap(),
            event_version: 1,
            causation_id: Some("cmd-1".into()),
            correlation_id: None,
            occurred_at: Timestamp::from_millis(1_764_487_080_123),
            payload: RawValue::from_string(r#"{"id":7,"tags":["a"]}"#.into()).unwrap(),
        };
        let json = env.to_json();
        let back: Envelope = serde_json::from_str(&json).unwrap();
        assert_eq!(back, env);
        assert!(
            json.contains(r#""occurred_at":"2025-11-30T07:18:00.123Z""#),
            "{json}"
        );
    }

    #[test]
    fn envelope_json_rejects_bad_fields() {
        let good = EventId::new().to_string();
        let bad_type = format!(
            r#"{{"event_id":"{good}","event_type":"Article.v1","event_version":1,"causation_id":null,"correlation_id":null,"occurred_at":"2026-01-01T00:00:00Z","payload":1}}"#
        );
        let err = serde_json::from_str::<Envelope>(&bad_type).unwrap_err();
        assert!(err.to_string().contains("invalid event type"), "{err}");
        let unknown = format!(
            r#"{{"event_id":"{good}","event_type":"a.b.v1","event_version":1,"causation_id":null,"correlation_id":null,"occurred_at":"2026-01-01T00:00:00Z","payload":1,"extra":2}}"#
        );
        assert!(serde_json::from_str::<Envelope>(&unknown).is_err());
    }
}
