//! The one check of a stored `event_outbox` row ([`check_row`]), and the
//! row as SQLite holds it ([`RawRow`], [`OwnedRow`]).

use rusqlite::types::ValueRef;
use serde_json::value::RawValue;

use super::{Envelope, EnvelopeError, EventId, EventType};
use crate::clock::Timestamp;
use crate::trace::{TraceContext, TraceError};

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

/// The trace context columns [`RawRow::with_trace`] reads, in order.
macro_rules! trace_columns {
    () => {
        "traceparent, tracestate"
    };
}
pub(crate) use trace_columns;

/// [`RawRow::with_trace`]'s columns, as text.
#[doc(hidden)]
pub const TRACE_COLUMNS: &str = trace_columns!();

/// A row of `event_outbox` the relay can deliver: its envelope, tenant and
/// trace context ([`check_row`]'s answer; public with it, for the tests and
/// fuzz targets).
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq)]
pub struct CheckedRow {
    /// The envelope every consumer receives.
    pub envelope: Envelope,
    /// The tenant, text as stored.
    pub tenant_id: Option<String>,
    /// When the row was written (its created_at).
    pub created_at: Timestamp,
    /// The producer's trace context, when it stored a valid one.
    pub trace: Option<TraceContext>,
    /// What was dropped from the stored trace context, and why: never a
    /// reason to refuse the row.
    pub trace_dropped: Option<TraceError>,
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
/// correlation ids and the tenant are text (or NULL) in UTF-8. The trace
/// context is checked last and never refuses the row: an invalid value is
/// dropped ([`CheckedRow::trace_dropped`]).
#[doc(hidden)]
pub fn check_row(row: &RawRow<'_>) -> Result<CheckedRow, EnvelopeError> {
    check_with(row, |v| {
        let text = text(v, "payload")?.unwrap_or("null");
        serde_json::from_str::<Box<RawValue>>(text).map_err(payload_error)
    })
}

/// [`check_row`] with the payload's step given: the borrowed row's check
/// copies the payload, an [`OwnedRow`]'s moves its buffer into the envelope.
fn check_with(
    row: &RawRow<'_>,
    payload: impl FnOnce(ValueRef<'_>) -> Result<Box<RawValue>, EnvelopeError>,
) -> Result<CheckedRow, EnvelopeError> {
    let occurred_at = row_time(row.occurred_at, "occurred_at")?;
    let created_at = row_time(row.created_at, "created_at")?;
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
    let payload = payload(row.payload)?;
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
    let (trace, trace_dropped) = TraceContext::from_columns(row.traceparent, row.tracestate);
    Ok(CheckedRow {
        envelope,
        tenant_id,
        created_at,
        trace,
        trace_dropped,
    })
}

fn payload_error(e: serde_json::Error) -> EnvelopeError {
    EnvelopeError::PayloadJson {
        reason: e.to_string(),
    }
}

/// The payload of an [`OwnedRow`] as the envelope's, in the buffer it was
/// copied into: checked as [`check_row`] checks it (the same errors), and
/// copied again only when JSON whitespace surrounds it.
fn owned_payload(bytes: Vec<u8>) -> Result<Box<RawValue>, EnvelopeError> {
    let mut json =
        String::from_utf8(bytes).map_err(|_| EnvelopeError::NotUtf8 { column: "payload" })?;
    let space = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    if json.as_bytes().first().is_some_and(space) || json.as_bytes().last().is_some_and(space) {
        // Checked as it is, so that an error's line and column are the
        // stored text's; then trimmed in place.
        serde_json::from_str::<&RawValue>(&json).map_err(payload_error)?;
        let end = json.len() - json.bytes().rev().take_while(space).count();
        json.truncate(end);
        let start = json.bytes().take_while(space).count();
        json.drain(..start);
    }
    RawValue::from_string(json).map_err(payload_error)
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
    /// traceparent column ([`RawRow::with_trace`]; NULL after [`RawRow::read`]).
    pub traceparent: ValueRef<'a>,
    /// tracestate column (as traceparent).
    pub tracestate: ValueRef<'a>,
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
            traceparent: ValueRef::Null,
            tracestate: ValueRef::Null,
        })
    }

    /// The row with its trace context columns ([`TRACE_COLUMNS`]), read
    /// from column `first` on. Apart from [`ROW_COLUMNS`], so that a query
    /// that needs no trace context (a repair, a page of the console) stays
    /// as it is.
    pub fn with_trace(mut self, r: &'a rusqlite::Row<'_>, first: usize) -> rusqlite::Result<Self> {
        self.traceparent = r.get_ref(first)?;
        self.tracestate = r.get_ref(first + 1)?;
        Ok(self)
    }
}

/// A [`RawRow`] that owns its values, to check on another thread. Text is
/// kept as the bytes stored, so a column that is not UTF-8 reaches
/// [`check_row`] as it is. The payload has an allocation of its own, which
/// [`into_checked`](Self::into_checked) moves into the envelope, so a
/// delivery holds one copy of it; the other text and blob columns share
/// one (the writer copies every claimed row; one allocation instead of one
/// per column, freed on the worker's thread). Both are reserved fallibly:
/// a row too large for the memory left is an error of the claim, never an
/// abort of the process.
#[derive(Debug, Clone, Default)]
pub(crate) struct OwnedRow {
    row_id: i64,
    /// The text and blob columns' bytes but the payload's, one after another.
    bytes: Box<[u8]>,
    /// The payload's bytes, when it is text or a blob.
    payload: Vec<u8>,
    values: [Owned; COLUMNS],
}

/// Where the payload is among [`OwnedRow`]'s values; its range is of the
/// row's `payload` buffer.
const PAYLOAD: usize = 5;

/// The columns an [`OwnedRow`] keeps: the [`RawRow`]'s but the row id.
const COLUMNS: usize = 11;

/// A column of an [`OwnedRow`]: text and blobs as a range of its bytes.
#[derive(Debug, Clone, Copy, Default)]
enum Owned {
    #[default]
    Null,
    Integer(i64),
    Real(f64),
    Text(usize, usize),
    Blob(usize, usize),
}

impl OwnedRow {
    /// Copies `raw`'s values; SQLITE_NOMEM, naming the row and its size,
    /// when the memory for them cannot be had.
    pub(crate) fn new(raw: &RawRow<'_>) -> rusqlite::Result<OwnedRow> {
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
            raw.traceparent,
            raw.tracestate,
        ];
        let size = |v: &ValueRef<'_>| match v {
            ValueRef::Text(b) | ValueRef::Blob(b) => b.len(),
            _ => 0,
        };
        let len: usize = columns.iter().map(size).sum();
        let payload_len = size(&raw.payload);
        let mut bytes = Vec::new();
        let mut payload = Vec::new();
        bytes
            .try_reserve_exact(len - payload_len)
            .and_then(|()| payload.try_reserve_exact(payload_len))
            .map_err(|e| {
                rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_NOMEM),
                    Some(format!(
                        "cannot copy row {} ({len} bytes of text and blobs, {payload_len} of them \
                         the payload) for its delivery: {e}",
                        raw.row_id
                    )),
                )
            })?;
        let mut i = 0;
        let values = columns.map(|v| {
            let buffer = if i == PAYLOAD {
                &mut payload
            } else {
                &mut bytes
            };
            i += 1;
            let mut span = |b: &[u8]| {
                let at = buffer.len();
                buffer.extend_from_slice(b);
                (at, buffer.len())
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
        Ok(OwnedRow {
            row_id: raw.row_id,
            bytes: bytes.into_boxed_slice(),
            payload,
            values,
        })
    }

    pub(crate) fn as_raw(&self) -> RawRow<'_> {
        raw_of(self.row_id, &self.bytes, Some(&self.payload), &self.values)
    }

    /// [`check_row`] of the row, moving the payload's buffer into the
    /// envelope rather than copying it.
    pub(crate) fn into_checked(self) -> Result<CheckedRow, EnvelopeError> {
        let OwnedRow {
            row_id,
            bytes,
            payload,
            values,
        } = self;
        let kind = values[PAYLOAD];
        check_with(
            &raw_of(row_id, &bytes, None, &values),
            move |v| match kind {
                Owned::Text(..) | Owned::Blob(..) => owned_payload(payload),
                // NULL and numbers: as the borrowed check says.
                _ => {
                    let text = text(v, "payload")?.unwrap_or("null");
                    serde_json::from_str::<Box<RawValue>>(text).map_err(payload_error)
                }
            },
        )
    }
}

/// The [`RawRow`] an [`OwnedRow`]'s parts make; a text or blob payload
/// reads as NULL without its buffer (`None`: [`OwnedRow::into_checked`]
/// has moved it away).
fn raw_of<'a>(
    row_id: i64,
    bytes: &'a [u8],
    payload: Option<&'a [u8]>,
    values: &[Owned; COLUMNS],
) -> RawRow<'a> {
    let v = |i: usize| {
        let buffer = if i == PAYLOAD { payload } else { Some(bytes) };
        match (values[i], buffer) {
            (Owned::Integer(n), _) => ValueRef::Integer(n),
            (Owned::Real(f), _) => ValueRef::Real(f),
            (Owned::Text(a, b), Some(buffer)) => ValueRef::Text(&buffer[a..b]),
            (Owned::Blob(a, b), Some(buffer)) => ValueRef::Blob(&buffer[a..b]),
            (Owned::Null | Owned::Text(..) | Owned::Blob(..), _) => ValueRef::Null,
        }
    };
    RawRow {
        row_id,
        event_id: v(0),
        event_type: v(1),
        event_version: v(2),
        causation_id: v(3),
        correlation_id: v(4),
        payload: v(PAYLOAD),
        occurred_at: v(6),
        created_at: v(7),
        tenant_id: v(8),
        traceparent: v(9),
        tracestate: v(10),
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

#[cfg(test)]
#[path = "row_tests.rs"]
mod tests;
