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

use std::fmt;
use std::str::FromStr;

use rusqlite::types::ValueRef;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use ulid::Ulid;

use crate::clock::Timestamp;

/// Longest event type accepted, in bytes.
pub const MAX_EVENT_TYPE_LEN: usize = 255;

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

/// A ULID naming one event: sortable by creation time, unique without
/// coordination, the same on every retry (so it is the webhook-id too).
///
/// ```
/// use outboxd::EventId;
/// let id = EventId::new();
/// assert_eq!(EventId::parse(&id.to_string()).unwrap(), id);
/// assert!(EventId::parse("not-a-ulid").is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventId(Ulid);

impl EventId {
    /// A fresh id, greater than every id minted before it in this process
    /// (within one millisecond the random part counts up instead of being
    /// drawn again).
    ///
    /// Why: the ids of one batch then enter the `event_id` index in order,
    /// at its right edge, instead of at random places among that
    /// millisecond's entries (BENCHMARKS.md section 1: 0.7 k instructions
    /// per event of a 100-event `enqueue_many`). Ids stay unique across
    /// processes: each millisecond still starts from 80 random bits.
    pub fn new() -> EventId {
        static IDS: std::sync::Mutex<ulid::Generator> =
            std::sync::Mutex::new(ulid::Generator::new());
        // A poisoned lock only means another thread panicked while holding
        // it; the generator inside is still a valid last id.
        let mut ids = IDS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let id = match ids.generate() {
            Ok(id) => id,
            // 2^80 ids in one millisecond: carry into the next.
            Err(overflow) => overflow.commit_overflow_random(),
        };
        EventId(id)
    }

    /// Parses a ULID (case-insensitive Crockford base32).
    pub fn parse(s: &str) -> Result<EventId, EnvelopeError> {
        // 26 characters carry 130 bits: a first character above '7' does not
        // fit in 128 and the ulid crate would silently drop its top bits.
        if s.as_bytes().first().is_some_and(|&b| b > b'7') {
            return Err(EnvelopeError::EventId { input: truncate(s) });
        }
        Ulid::from_string(s)
            .map(EventId)
            .map_err(|_| EnvelopeError::EventId { input: truncate(s) })
    }

    /// A stable id for a legacy row (one without an event id): the row's
    /// creation time and row id, so it is the same on every retry and unique
    /// per row.
    pub fn for_legacy_row(created_at: Timestamp, row_id: i64) -> EventId {
        EventId(Ulid::from_parts(
            created_at.as_millis().max(0) as u64,
            row_id as u128,
        ))
    }

    /// The underlying ULID.
    pub fn ulid(&self) -> Ulid {
        self.0
    }
}

impl Default for EventId {
    fn default() -> Self {
        EventId::new()
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for EventId {
    type Err = EnvelopeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventId::parse(s)
    }
}

impl Serialize for EventId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for EventId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        EventId::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A validated event type, `<domain>.<verb>.v<N>`: at least a domain and a
/// verb, lowercase segments of letters, digits and underscores, and a version
/// of 1 or more without leading zeros.
///
/// ```
/// use outboxd::EventType;
/// let t = EventType::parse("article.created.v2").unwrap();
/// assert_eq!(t.version(), 2);
/// assert_eq!(t.name(), "article.created");
/// assert!(EventType::parse("Article.created.v1").is_err());
/// assert!(EventType::parse("article.v1").is_err());
/// assert!(EventType::parse("article.created.v0").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventType {
    full: String,
    version: u32,
}

impl EventType {
    /// Parses and validates an event type.
    pub fn parse(s: &str) -> Result<EventType, EnvelopeError> {
        let fail = |reason| EnvelopeError::EventType {
            input: truncate(s),
            reason,
        };
        if s.is_empty() {
            return Err(fail("it is empty"));
        }
        if s.len() > MAX_EVENT_TYPE_LEN {
            return Err(fail("it is longer than 255 bytes"));
        }
        // One pass over the bytes, no allocation (this runs for every event
        // enqueued): the segments before the last dot are names, checked in
        // order, each for emptiness and then for its characters.
        let Some(last_dot) = s.rfind('.') else {
            return Err(fail("it needs a domain, a verb and a version"));
        };
        let (names, version) = (&s[..last_dot], &s[last_dot + 1..]);
        if !names.contains('.') {
            return Err(fail("it needs a domain, a verb and a version"));
        }
        let mut segment_start = 0;
        for (i, &b) in names.as_bytes().iter().enumerate() {
            if b == b'.' {
                if i == segment_start {
                    return Err(fail("it has an empty segment"));
                }
                segment_start = i + 1;
            } else if !(b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_') {
                return Err(fail("a segment has a character other than a-z, 0-9 or _"));
            }
        }
        if segment_start == names.len() {
            return Err(fail("it has an empty segment"));
        }
        let digits = version
            .strip_prefix('v')
            .ok_or_else(|| fail("the last segment is not a version such as v1"))?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(fail("the last segment is not a version such as v1"));
        }
        if digits.starts_with('0') {
            return Err(fail("the version must be 1 or more, without leading zeros"));
        }
        let version: u32 = digits
            .parse()
            .map_err(|_| fail("the version is too large"))?;
        Ok(EventType {
            full: s.to_string(),
            version,
        })
    }

    /// The whole type, `article.created.v1`.
    pub fn as_str(&self) -> &str {
        &self.full
    }

    /// The type without its version, `article.created`.
    pub fn name(&self) -> &str {
        let cut = self.full.rfind('.').expect("validated");
        &self.full[..cut]
    }

    /// The version from the suffix.
    pub fn version(&self) -> u32 {
        self.version
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.full)
    }
}

impl FromStr for EventType {
    type Err = EnvelopeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventType::parse(s)
    }
}

impl Serialize for EventType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.full)
    }
}

impl<'de> Deserialize<'de> for EventType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        EventType::parse(&s).map_err(serde::de::Error::custom)
    }
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

/// The columns of `event_outbox` that [`RawRow::read`] reads, in order:
/// everything [`check_row`] validates.
macro_rules! row_columns {
    () => {
        "id, event_id, event_type, event_version, causation_id, correlation_id, payload, \
         occurred_at, created_at, tenant_id"
    };
}
pub(crate) use row_columns;

/// [`RawRow::read`]'s columns, as text for a query of one's own:
/// `format!("SELECT {ROW_COLUMNS} FROM event_outbox")`.
#[doc(hidden)]
pub const ROW_COLUMNS: &str = row_columns!();

/// A row of `event_outbox` the relay can deliver: its envelope and tenant
/// ([`check_row`]'s answer; public with it, for the tests and fuzz targets).
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedRow {
    /// The envelope every consumer receives.
    pub envelope: Envelope,
    /// The tenant, text as stored.
    pub tenant_id: Option<String>,
}

/// The one check of an `event_outbox` row, however it was written: the
/// relay applies it to every row it delivers (and dead-letters a row it
/// refuses, with the error as the reason), a repair applies it before
/// keeping a change, and the console and the SQL-contract tests show or
/// assert what it says. Public for them and the fuzz targets, not as part
/// of the supported API.
///
/// The checks, in order (the first failure is the reason): the two times
/// are INTEGER milliseconds in the years 1 to 9999; the event type; the
/// event id (a legacy row without one gets an id derived from the row);
/// the version against the type; the payload is JSON; causation and
/// correlation ids and the tenant are text (or NULL) in UTF-8.
#[doc(hidden)]
pub fn check_row(row: &RawRow<'_>) -> Result<CheckedRow, EnvelopeError> {
    let occurred_at = row_time(row.occurred_at, "occurred_at")?;
    row_time(row.created_at, "created_at")?;
    let (event_type, event_id) = check_head(row)?;
    let event_version = match row.event_version {
        ValueRef::Null => event_type.version(),
        ValueRef::Integer(v) if v == i64::from(event_type.version()) => event_type.version(),
        ValueRef::Integer(v) => {
            return Err(EnvelopeError::VersionMismatch {
                event_type: event_type.to_string(),
                version: v,
                expected: event_type.version(),
            })
        }
        // Some drivers bind numbers as text; accept "2" for 2.
        ValueRef::Text(t) => {
            let s = std::str::from_utf8(t).map_err(|_| EnvelopeError::NotUtf8 {
                column: "event_version",
            })?;
            match s.trim().parse::<i64>() {
                Ok(v) if v == i64::from(event_type.version()) => event_type.version(),
                Ok(v) => {
                    return Err(EnvelopeError::VersionMismatch {
                        event_type: event_type.to_string(),
                        version: v,
                        expected: event_type.version(),
                    })
                }
                Err(_) => {
                    return Err(EnvelopeError::ColumnType {
                        column: "event_version",
                        found: "non-numeric text",
                        expected: "an integer or NULL",
                    })
                }
            }
        }
        other => {
            return Err(EnvelopeError::ColumnType {
                column: "event_version",
                found: type_name(other),
                expected: "an integer or NULL",
            })
        }
    };
    let payload_text = text(row.payload, "payload")?.unwrap_or("null");
    let payload = serde_json::from_str::<Box<RawValue>>(payload_text).map_err(|e| {
        EnvelopeError::PayloadJson {
            reason: e.to_string(),
        }
    })?;
    let envelope = Envelope {
        event_id,
        event_type,
        event_version,
        causation_id: text(row.causation_id, "causation_id")?.map(str::to_string),
        correlation_id: text(row.correlation_id, "correlation_id")?.map(str::to_string),
        occurred_at,
        payload,
    };
    let tenant_id = text(row.tenant_id, "tenant_id")?.map(str::to_string);
    Ok(CheckedRow {
        envelope,
        tenant_id,
    })
}

/// The first part of [`check_row`] after the times, which routing needs:
/// the event type and id. The relay's writer routes a claimed row with it
/// and leaves the rest of the check (the payload above all) to the worker
/// that delivers the row; whenever this fails, `check_row` fails too.
pub(crate) fn check_head(row: &RawRow<'_>) -> Result<(EventType, EventId), EnvelopeError> {
    let event_type = EventType::parse(text(row.event_type, "event_type")?.unwrap_or(""))?;
    let event_id = match text(row.event_id, "event_id")? {
        Some(id) => EventId::parse(id)?,
        None => EventId::for_legacy_row(row_time(row.created_at, "created_at")?, row.row_id),
    };
    Ok((event_type, event_id))
}

/// A time column: INTEGER milliseconds (the schema's CHECK keeps them so;
/// anything else is reported rather than trusted) that an envelope can
/// carry ([`check_time`]).
fn row_time(v: ValueRef<'_>, column: &'static str) -> Result<Timestamp, EnvelopeError> {
    match v {
        ValueRef::Integer(ms) => check_time(ms, column),
        _ => Err(EnvelopeError::ColumnType {
            column,
            found: "a value that is not an integer",
            expected: "INTEGER milliseconds since the Unix epoch",
        }),
    }
}

/// A time in milliseconds an envelope can carry: RFC 3339 text holds the
/// years 1 to 9999 only, and a time outside them would be delivered as a
/// wrong time (Timestamp's text falls back to 1970), not refused.
pub(crate) fn check_time(ms: i64, column: &'static str) -> Result<Timestamp, EnvelopeError> {
    const EARLIEST: i64 = -62_135_596_800_000; // 0001-01-01T00:00:00Z
    const LATEST: i64 = 253_402_300_799_999; // 9999-12-31T23:59:59.999Z
    if (EARLIEST..=LATEST).contains(&ms) {
        Ok(Timestamp::from_millis(ms))
    } else {
        Err(EnvelopeError::ColumnType {
            column,
            found: "a time outside the years 1 to 9999",
            expected: "INTEGER milliseconds since the Unix epoch",
        })
    }
}

/// The columns of one `event_outbox` row that [`check_row`] validates, as
/// SQLite holds them: untyped, because a foreign producer may have written
/// anything into them. Public for the SQL-contract tests and the fuzz
/// targets only.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct RawRow<'a> {
    /// The row id.
    pub row_id: i64,
    /// event_id column.
    pub event_id: ValueRef<'a>,
    /// event_type column.
    pub event_type: ValueRef<'a>,
    /// event_version column.
    pub event_version: ValueRef<'a>,
    /// causation_id column.
    pub causation_id: ValueRef<'a>,
    /// correlation_id column.
    pub correlation_id: ValueRef<'a>,
    /// payload column.
    pub payload: ValueRef<'a>,
    /// occurred_at column.
    pub occurred_at: ValueRef<'a>,
    /// created_at column.
    pub created_at: ValueRef<'a>,
    /// tenant_id column.
    pub tenant_id: ValueRef<'a>,
}

impl<'a> RawRow<'a> {
    /// Reads [`ROW_COLUMNS`] from a result row, starting at column `first`.
    pub fn read(r: &'a rusqlite::Row<'_>, first: usize) -> rusqlite::Result<RawRow<'a>> {
        Ok(RawRow {
            row_id: r.get(first)?,
            event_id: r.get_ref(first + 1)?,
            event_type: r.get_ref(first + 2)?,
            event_version: r.get_ref(first + 3)?,
            causation_id: r.get_ref(first + 4)?,
            correlation_id: r.get_ref(first + 5)?,
            payload: r.get_ref(first + 6)?,
            occurred_at: r.get_ref(first + 7)?,
            created_at: r.get_ref(first + 8)?,
            tenant_id: r.get_ref(first + 9)?,
        })
    }
}

/// A [`RawRow`] that owns its values, to check on another thread. Text is
/// kept as the bytes stored, so a column that is not UTF-8 reaches
/// [`check_row`] as it is. The text and blob columns share one allocation
/// (the writer copies every claimed row; one allocation instead of one per
/// column, freed on the worker's thread).
#[derive(Debug, Clone)]
pub(crate) struct OwnedRow {
    row_id: i64,
    /// The text and blob columns' bytes, one after another.
    bytes: Box<[u8]>,
    values: [Owned; 9],
}

/// A column of an [`OwnedRow`]: text and blobs as a range of its bytes.
#[derive(Debug, Clone, Copy)]
enum Owned {
    Null,
    Integer(i64),
    Real(f64),
    Text(usize, usize),
    Blob(usize, usize),
}

impl OwnedRow {
    pub(crate) fn new(raw: &RawRow<'_>) -> OwnedRow {
        let columns = [
            raw.event_id,
            raw.event_type,
            raw.event_version,
            raw.causation_id,
            raw.correlation_id,
            raw.payload,
            raw.occurred_at,
            raw.created_at,
            raw.tenant_id,
        ];
        let len = columns
            .iter()
            .map(|v| match v {
                ValueRef::Text(b) | ValueRef::Blob(b) => b.len(),
                _ => 0,
            })
            .sum();
        let mut bytes = Vec::with_capacity(len);
        let values = columns.map(|v| {
            let mut span = |b: &[u8]| {
                let at = bytes.len();
                bytes.extend_from_slice(b);
                (at, bytes.len())
            };
            match v {
                ValueRef::Null => Owned::Null,
                ValueRef::Integer(i) => Owned::Integer(i),
                ValueRef::Real(f) => Owned::Real(f),
                ValueRef::Text(t) => {
                    let (a, b) = span(t);
                    Owned::Text(a, b)
                }
                ValueRef::Blob(t) => {
                    let (a, b) = span(t);
                    Owned::Blob(a, b)
                }
            }
        });
        OwnedRow {
            row_id: raw.row_id,
            bytes: bytes.into_boxed_slice(),
            values,
        }
    }

    pub(crate) fn as_raw(&self) -> RawRow<'_> {
        let v = |i: usize| match self.values[i] {
            Owned::Null => ValueRef::Null,
            Owned::Integer(n) => ValueRef::Integer(n),
            Owned::Real(f) => ValueRef::Real(f),
            Owned::Text(a, b) => ValueRef::Text(&self.bytes[a..b]),
            Owned::Blob(a, b) => ValueRef::Blob(&self.bytes[a..b]),
        };
        RawRow {
            row_id: self.row_id,
            event_id: v(0),
            event_type: v(1),
            event_version: v(2),
            causation_id: v(3),
            correlation_id: v(4),
            payload: v(5),
            occurred_at: v(6),
            created_at: v(7),
            tenant_id: v(8),
        }
    }
}

/// Reads a text column that may be NULL. A BLOB is accepted when it is UTF-8
/// (some drivers bind strings as blobs); numbers are refused.
fn text<'a>(v: ValueRef<'a>, column: &'static str) -> Result<Option<&'a str>, EnvelopeError> {
    match v {
        ValueRef::Null => Ok(None),
        ValueRef::Text(b) | ValueRef::Blob(b) => std::str::from_utf8(b)
            .map(Some)
            .map_err(|_| EnvelopeError::NotUtf8 { column }),
        other => Err(EnvelopeError::ColumnType {
            column,
            found: type_name(other),
            expected: "text or NULL",
        }),
    }
}

fn type_name(v: ValueRef<'_>) -> &'static str {
    match v {
        ValueRef::Null => "NULL",
        ValueRef::Integer(_) => "an integer",
        ValueRef::Real(_) => "a real number",
        ValueRef::Text(_) => "text",
        ValueRef::Blob(_) => "a BLOB",
    }
}

/// Cuts long input in error messages so a hostile row cannot flood the log.
fn truncate(s: &str) -> String {
    crate::text::clip(s, 80, crate::text::Keep::Head).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn row<'a>(event_type: &'a str, version: ValueRef<'a>, payload: &'a [u8]) -> RawRow<'a> {
        RawRow {
            row_id: 7,
            event_id: ValueRef::Null,
            event_type: ValueRef::Text(event_type.as_bytes()),
            event_version: version,
            causation_id: ValueRef::Null,
            correlation_id: ValueRef::Text(b"req-1"),
            payload: ValueRef::Text(payload),
            occurred_at: ValueRef::Integer(1_000),
            created_at: ValueRef::Integer(2_000),
            tenant_id: ValueRef::Null,
        }
    }

    fn from_row(r: RawRow<'_>) -> Result<Envelope, EnvelopeError> {
        check_row(&r).map(|c| c.envelope)
    }

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

    /// Regression (found by fuzz/foreign_row): from_row took any
    /// occurred_at, and one past year 9999 came out of to_json as 1970.
    #[test]
    fn from_row_refuses_a_time_an_envelope_cannot_carry() {
        let mut r = row("a.b.v1", ValueRef::Null, b"{}");
        r.occurred_at = ValueRef::Integer(i64::MAX);
        let e = from_row(r).unwrap_err();
        assert!(e.to_string().contains("occurred_at"), "{e}");
        r.occurred_at = ValueRef::Integer(253_402_300_799_999);
        let env = from_row(r).unwrap();
        let back: Envelope = serde_json::from_str(&env.to_json()).unwrap();
        assert_eq!(back, env);
    }

    #[test]
    fn from_row_accepts_legacy_rows_with_a_stable_id() {
        let a = from_row(row("a.b.v1", ValueRef::Null, b"{}")).unwrap();
        let b = from_row(row("a.b.v1", ValueRef::Null, b"{}")).unwrap();
        assert_eq!(a.event_id, b.event_id);
        assert_eq!(a.event_version, 1);
        assert_eq!(a.correlation_id.as_deref(), Some("req-1"));
    }

    #[test]
    fn from_row_reports_each_defect() {
        let e = from_row(row("a.b.v2", ValueRef::Integer(1), b"{}")).unwrap_err();
        assert!(matches!(
            e,
            EnvelopeError::VersionMismatch {
                version: 1,
                expected: 2,
                ..
            }
        ));
        let e = from_row(row("a.b.v1", ValueRef::Null, b"{oops")).unwrap_err();
        assert!(matches!(e, EnvelopeError::PayloadJson { .. }), "{e}");
        let e = from_row(row("a.b.v1", ValueRef::Null, b"\xff\xfe")).unwrap_err();
        assert_eq!(e, EnvelopeError::NotUtf8 { column: "payload" });
        let e = from_row(row("nope", ValueRef::Null, b"{}")).unwrap_err();
        assert!(matches!(e, EnvelopeError::EventType { .. }));
        let mut r = row("a.b.v1", ValueRef::Null, b"{}");
        r.event_id = ValueRef::Text(b"123");
        assert!(matches!(
            from_row(r).unwrap_err(),
            EnvelopeError::EventId { .. }
        ));
        let e = from_row(row("a.b.v3", ValueRef::Text(b"3"), b"[1]")).unwrap();
        assert_eq!(e.event_version, 3);
    }

    /// Review finding: a tenant_id that is not UTF-8 was altered (U+FFFD)
    /// and delivered; it is a defect of the row like a bad payload.
    #[test]
    fn check_row_refuses_a_tenant_that_is_not_utf8_and_keeps_a_good_one() {
        let mut r = row("a.b.v1", ValueRef::Null, b"{}");
        r.tenant_id = ValueRef::Blob(b"acme\xff");
        let e = check_row(&r).unwrap_err();
        assert_eq!(
            e,
            EnvelopeError::NotUtf8 {
                column: "tenant_id"
            }
        );
        assert!(e.to_string().contains("tenant_id"), "{e}");
        r.tenant_id = ValueRef::Integer(7);
        assert!(matches!(
            check_row(&r).unwrap_err(),
            EnvelopeError::ColumnType {
                column: "tenant_id",
                ..
            }
        ));
        r.tenant_id = ValueRef::Text(b"acme");
        assert_eq!(check_row(&r).unwrap().tenant_id.as_deref(), Some("acme"));
    }

    /// The times are checked first, and a time that is not an integer is
    /// a defect, not a panic or a zero.
    #[test]
    fn check_row_refuses_a_time_that_is_not_an_integer() {
        let mut r = row("nope", ValueRef::Null, b"{}");
        r.created_at = ValueRef::Text(b"yesterday");
        let e = check_row(&r).unwrap_err();
        assert!(
            matches!(
                e,
                EnvelopeError::ColumnType {
                    column: "created_at",
                    ..
                }
            ),
            "{e}"
        );
        // A legacy row needs created_at for its id: the head fails too.
        assert!(check_head(&r).is_err());
    }

    /// What the owned copy checks on a worker is what the row says.
    #[test]
    fn an_owned_row_checks_as_the_row_it_copies() {
        let r = row("a.b.v1", ValueRef::Null, br#"{"x":[1,2]}"#);
        let owned = OwnedRow::new(&r);
        assert_eq!(check_row(&owned.as_raw()).unwrap(), check_row(&r).unwrap());
        let bad = row("a.b.v1", ValueRef::Null, b"{oops");
        assert_eq!(
            check_row(&OwnedRow::new(&bad).as_raw()).unwrap_err(),
            check_row(&bad).unwrap_err()
        );
    }

    /// Every column of the owned copy is the value it copied, of every
    /// storage class, empty and not UTF-8 included (one shared buffer).
    #[test]
    fn an_owned_row_gives_back_every_value_it_copied() {
        let r = RawRow {
            row_id: i64::MIN,
            event_id: ValueRef::Text(b"01ARZ3NDEKTSV4RRFFQ69G5FAV"),
            event_type: ValueRef::Blob(b"a.b.v1"),
            event_version: ValueRef::Real(1.5),
            causation_id: ValueRef::Text(b""),
            correlation_id: ValueRef::Blob(b""),
            payload: ValueRef::Text(b"{\"x\":\xff}"),
            occurred_at: ValueRef::Integer(i64::MAX),
            created_at: ValueRef::Null,
            tenant_id: ValueRef::Text(b"t"),
        };
        let owned = OwnedRow::new(&r);
        let back = owned.as_raw();
        let columns = |r: &RawRow<'_>| {
            [
                r.event_id,
                r.event_type,
                r.event_version,
                r.causation_id,
                r.correlation_id,
                r.payload,
                r.occurred_at,
                r.created_at,
                r.tenant_id,
            ]
            .map(|v| format!("{v:?}"))
        };
        assert_eq!(back.row_id, r.row_id);
        assert_eq!(columns(&back), columns(&r));
    }

    #[test]
    fn event_id_refuses_values_beyond_128_bits() {
        let max = "7ZZZZZZZZZZZZZZZZZZZZZZZZZ";
        assert_eq!(EventId::parse(max).unwrap().to_string(), max);
        for bad in ["8ZZZZZZZZZZZZZZZZZZZZZZZZZ", "ZZZZZZZZZZZZZZZZZZZZZZZZZZ"] {
            assert!(EventId::parse(bad).is_err(), "{bad} overflows a ULID");
        }
    }

    #[test]
    fn event_type_examples() {
        for ok in [
            "a.b.v1",
            "article.created.v1",
            "shop_2.order.paid.v10",
            "x.y.v4294967295",
        ] {
            assert!(EventType::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a.v1",
            "a.b",
            "a.b.1",
            "a.b.v",
            "a.b.v0",
            "a.b.v01",
            "A.b.v1",
            "a..b.v1",
            "a.b-c.v1",
            "a.b.v1 ",
            ".a.b.v1",
            "a.b.v4294967296",
            "a.b.V1",
        ] {
            assert!(EventType::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    /// Ids minted in a row, even within one millisecond and from several
    /// threads, come out in increasing order (random ULIDs would not: a
    /// thousand of them share a few milliseconds).
    #[test]
    fn new_ids_increase_within_a_millisecond() {
        let threads: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| (0..1000).map(|_| EventId::new()).collect::<Vec<_>>()))
            .collect();
        let mut all = Vec::new();
        for t in threads {
            let ids = t.join().unwrap();
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "not increasing");
            all.extend(ids);
        }
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 4000, "an id was minted twice");
    }

    /// The reading `EventType::parse` replaced (split into a list of
    /// segments, then check each): the one-pass parser must give the same
    /// verdict and the same reason for every input.
    fn reason_by_segment_list(s: &str) -> Option<&'static str> {
        if s.is_empty() {
            return Some("it is empty");
        }
        if s.len() > MAX_EVENT_TYPE_LEN {
            return Some("it is longer than 255 bytes");
        }
        let segments: Vec<&str> = s.split('.').collect();
        if segments.len() < 3 {
            return Some("it needs a domain, a verb and a version");
        }
        let (version, names) = segments.split_last().unwrap();
        for seg in names {
            if seg.is_empty() {
                return Some("it has an empty segment");
            }
            if !seg
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            {
                return Some("a segment has a character other than a-z, 0-9 or _");
            }
        }
        let Some(digits) = version.strip_prefix('v') else {
            return Some("the last segment is not a version such as v1");
        };
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Some("the last segment is not a version such as v1");
        }
        if digits.starts_with('0') {
            return Some("the version must be 1 or more, without leading zeros");
        }
        digits
            .parse::<u32>()
            .err()
            .map(|_| "the version is too large")
    }

    fn reason(s: &str) -> Option<&'static str> {
        match EventType::parse(s) {
            Ok(_) => None,
            Err(EnvelopeError::EventType { reason, .. }) => Some(reason),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn the_parser_gives_each_reason_as_before() {
        for s in [
            "",
            "a",
            "a.b",
            ".b.v1",
            "a..v1",
            "a.b.",
            "A.b.v1",
            "a.B..v1",
            "a..B.v1",
            "a.b.c",
            "a.b.v",
            "a.b.v01",
            "a.b.v0",
            "a.b.v99999999999",
            "a.b.v1",
            "a.b.c.v2",
            "a.b.1",
            "...",
            "a.b.v1.",
            "é.b.v1",
        ] {
            assert_eq!(reason(s), reason_by_segment_list(s), "{s:?}");
        }
    }

    proptest! {
        #[test]
        fn valid_types_parse_and_keep_their_parts(
            names in proptest::collection::vec("[a-z0-9_]{1,8}", 2..5),
            version in 1u32..100_000,
        ) {
            let s = format!("{}.v{}", names.join("."), version);
            let t = EventType::parse(&s).unwrap();
            prop_assert_eq!(t.version(), version);
            prop_assert_eq!(t.name(), names.join("."));
            prop_assert_eq!(t.as_str(), s.as_str());
        }

        #[test]
        fn parser_never_panics_and_accepts_only_the_grammar(s in "\\PC{0,40}") {
            if let Ok(t) = EventType::parse(&s) {
                let segs: Vec<&str> = s.split('.').collect();
                prop_assert!(segs.len() >= 3);
                prop_assert!(s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'.'));
                prop_assert_eq!(format!("v{}", t.version()), *segs.last().unwrap());
            }
        }

        #[test]
        fn the_parser_agrees_with_the_segment_list_reading(s in "[a-zA-Z0-9_.v]{0,12}") {
            prop_assert_eq!(reason(&s), reason_by_segment_list(&s));
        }

        #[test]
        fn event_id_text_round_trips(n in any::<u128>()) {
            let id = EventId(Ulid(n));
            prop_assert_eq!(EventId::parse(&id.to_string()).unwrap(), id);
            let json = serde_json::to_string(&id).unwrap();
            prop_assert_eq!(serde_json::from_str::<EventId>(&json).unwrap(), id);
        }
    }
}
