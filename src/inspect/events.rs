//! The events list and one event whole.

use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension};

use super::{event_row, text, EventRow, PAGE, PAYLOAD_CAP, SCAN_BUDGET};
use crate::error::{Error, Result};
use crate::router::Pattern;
use crate::{dedup, Timestamp};

/// The states the events list filters on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFilter {
    /// Any pending row.
    Pending,
    /// Pending, not leased, due.
    Due,
    /// Pending, not leased, not yet due.
    Delayed,
    /// Claimed by a relay.
    Leased,
    /// Pending after at least one failed attempt.
    Retrying,
    /// Delivered.
    Delivered,
    /// Dead-lettered.
    Dead,
}

impl StateFilter {
    /// Every filter, with its name in URLs.
    pub const ALL: [(StateFilter, &'static str); 7] = [
        (StateFilter::Pending, "pending"),
        (StateFilter::Due, "due"),
        (StateFilter::Delayed, "delayed"),
        (StateFilter::Leased, "leased"),
        (StateFilter::Retrying, "retrying"),
        (StateFilter::Delivered, "delivered"),
        (StateFilter::Dead, "dead"),
    ];

    /// The filter named `s`.
    pub fn parse(s: &str) -> Option<StateFilter> {
        Self::ALL.iter().find(|(_, n)| *n == s).map(|(f, _)| *f)
    }

    fn matches(self, row: &EventRow, now: Timestamp) -> bool {
        let state = row.state(now);
        match self {
            StateFilter::Pending => row.status == "pending",
            StateFilter::Due => state == "due",
            StateFilter::Delayed => state == "delayed",
            StateFilter::Leased => state == "leased",
            StateFilter::Retrying => row.status == "pending" && row.attempts > 0,
            StateFilter::Delivered => state == "delivered",
            StateFilter::Dead => state == "dead",
        }
    }
}

/// What the events list shows.
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    /// State.
    pub state: Option<StateFilter>,
    /// Type pattern.
    pub event_type: Option<Pattern>,
    /// Exact tenant.
    pub tenant: Option<String>,
    /// A consumer, with `missing`: rows it has (false) or has not (true)
    /// delivered.
    pub consumer: Option<String>,
    /// See `consumer`.
    pub missing: bool,
    /// Occurred at or after.
    pub since: Option<Timestamp>,
    /// Occurred before.
    pub until: Option<Timestamp>,
    /// Only rows with a smaller id (the page's key).
    pub before: Option<i64>,
    /// Exact ordering key (a captured row's `cms_page:42`).
    pub ordering_key: Option<String>,
    /// A captured row's key: its payload's `key` values joined by `:`
    /// (`42`, or `acme:hello` for a two-column key).
    pub key: Option<String>,
}

/// A payload's `key` object (captured events), as its values joined by
/// `:`, strings unquoted; None for anything else.
fn key_text(json: Option<&str>) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(json?).ok()?;
    let parts: Vec<String> = v
        .as_object()?
        .values()
        .map(|x| match x {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect();
    Some(parts.join(":"))
}

impl EventFilter {
    fn matches(&self, row: &EventRow, now: Timestamp) -> bool {
        self.state.is_none_or(|s| s.matches(row, now))
            && self
                .event_type
                .as_ref()
                .is_none_or(|p| p.matches(&row.event_type))
            && self
                .tenant
                .as_ref()
                .is_none_or(|t| row.tenant.as_deref() == Some(t.as_str()))
            && self.since.is_none_or(|t| row.occurred_at >= t.as_millis())
            && self.until.is_none_or(|t| row.occurred_at < t.as_millis())
    }
}

/// One page of the events list.
#[derive(Debug, Clone, Default)]
pub struct EventsPage {
    /// Matching rows, newest first.
    pub rows: Vec<EventRow>,
    /// The key to go on from, when there may be more.
    pub next_before: Option<i64>,
    /// Rows examined.
    pub scanned: usize,
}

const SQL_EVENTS_WALK: &str = concat!(
    "SELECT ",
    row_columns!(),
    ", substr(last_error, 1, 300), ordering_key, NULL FROM event_outbox WHERE id < ?1 ORDER BY id DESC LIMIT ?2"
);

/// The walk, with each row's payload `key` (only when a key is looked for:
/// it reads every payload).
const SQL_EVENTS_WALK_KEYS: &str = concat!(
    "SELECT ",
    row_columns!(),
    ", substr(last_error, 1, 300), ordering_key, \
     CASE WHEN json_valid(payload) THEN json_extract(payload, '$.key') END \
     FROM event_outbox WHERE id < ?1 ORDER BY id DESC LIMIT ?2"
);

/// Walks rows newest first from `f.before`, keeping those that match,
/// until a page is full or [`SCAN_BUDGET`] rows were examined.
pub fn events_page(conn: &Connection, f: &EventFilter, now: Timestamp) -> Result<EventsPage> {
    walk_events(conn, f, now).map_err(Error::db("read a page of events"))
}

fn walk_events(conn: &Connection, f: &EventFilter, now: Timestamp) -> rusqlite::Result<EventsPage> {
    let sql = if f.key.is_some() {
        SQL_EVENTS_WALK_KEYS
    } else {
        SQL_EVENTS_WALK
    };
    let mut walk = conn.prepare_cached(sql)?;
    let mut page = EventsPage::default();
    let mut rows = walk.query(params![f.before.unwrap_or(i64::MAX), SCAN_BUDGET as i64])?;
    let mut last_seen = None;
    while let Some(r) = rows.next()? {
        let row = event_row(r)?;
        page.scanned += 1;
        last_seen = Some(row.id);
        if !f.matches(&row, now) {
            continue;
        }
        if let Some(k) = &f.ordering_key {
            if r.get::<_, Option<String>>(11).ok().flatten().as_deref() != Some(k.as_str()) {
                continue;
            }
        }
        if let Some(k) = &f.key {
            let json: Option<String> = r.get(12).ok().flatten();
            if key_text(json.as_deref()).as_deref() != Some(k.as_str()) {
                continue;
            }
        }
        if let Some(consumer) = &f.consumer {
            let key = dedup::key(row.event_id.as_deref(), row.id);
            if dedup::has(conn, &key, consumer)? == f.missing {
                continue;
            }
        }
        page.rows.push(row);
        if page.rows.len() == PAGE {
            break;
        }
    }
    // More may follow unless the walk reached the first row.
    let walked_out = page.rows.len() < PAGE && page.scanned < SCAN_BUDGET;
    page.next_before = if walked_out { None } else { last_seen };
    Ok(page)
}

/// Everything about one event, for its page.
#[derive(Debug, Clone)]
pub struct EventDetail {
    /// The list's columns.
    pub row: EventRow,
    /// Version column as stored.
    pub event_version: Option<String>,
    /// Idempotency key.
    pub idempotency_key: Option<String>,
    /// Ordering key.
    pub ordering_key: Option<String>,
    /// Causation id.
    pub causation_id: Option<String>,
    /// Correlation id.
    pub correlation_id: Option<String>,
    /// When it was inserted, ms.
    pub created_at: i64,
    /// The whole last error.
    pub last_error: Option<String>,
    /// Up to [`PAYLOAD_CAP`] bytes of the payload.
    pub payload: String,
    /// The payload's full size in bytes.
    pub payload_bytes: i64,
    /// Why the relay cannot build its envelope, if it cannot (only checked
    /// for payloads within the cap).
    pub envelope_error: Option<String>,
    /// (consumer, delivered at ms) from the dedup ledger.
    pub progress: Vec<(String, i64)>,
    /// Other rows carrying the same event id.
    pub same_id: Vec<i64>,
}

const SQL_EVENT: &str = concat!(
    "SELECT ",
    row_columns!(),
    ", last_error, event_version, idempotency_key, ordering_key, causation_id, \
     correlation_id, created_at, substr(CAST(payload AS BLOB), 1, ?2), \
     length(CAST(payload AS BLOB)) FROM event_outbox WHERE id = ?1"
);

// An id in any letter case: foreign producers may write any, and the
// event-id index compares under NOCASE (schema version 6).
const SQL_ROWS_WITH_EVENT_ID: &str =
    "SELECT id FROM event_outbox WHERE event_id = ?1 COLLATE NOCASE ORDER BY id LIMIT 20";

/// Finds an event by row id (digits) or event id (a ULID in any case).
pub fn find_event(conn: &Connection, id: &str) -> Result<Option<EventDetail>> {
    read_event(conn, id).map_err(Error::db("read an event"))
}

fn read_event(conn: &Connection, id: &str) -> rusqlite::Result<Option<EventDetail>> {
    let row_id = if let Ok(n) = id.parse::<i64>() {
        Some(n)
    } else {
        conn.prepare_cached(SQL_ROWS_WITH_EVENT_ID)?
            .query_row([id], |r| r.get(0))
            .optional()?
    };
    let Some(row_id) = row_id else {
        return Ok(None);
    };
    let detail = conn
        .prepare_cached(SQL_EVENT)?
        .query_row(params![row_id, PAYLOAD_CAP as i64], |r| detail(r, row_id))
        .optional()?;
    let Some(mut detail) = detail else {
        return Ok(None);
    };
    let key = dedup::key(detail.row.event_id.as_deref(), detail.row.id);
    detail.progress = dedup::progress(conn, &key)?
        .into_iter()
        .map(|(consumer, at)| (consumer, at.as_millis()))
        .collect();
    if let Some(event_id) = &detail.row.event_id {
        detail.same_id = conn
            .prepare_cached(SQL_ROWS_WITH_EVENT_ID)?
            .query_map([event_id], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<i64>>>()?
            .into_iter()
            .filter(|id| *id != detail.row.id)
            .collect();
    }
    Ok(Some(detail))
}

/// One row of [`SQL_EVENT`], its ledger and same-id rows still to read.
fn detail(r: &rusqlite::Row<'_>, row_id: i64) -> rusqlite::Result<EventDetail> {
    let payload_bytes: i64 = r.get(18)?;
    let payload = match r.get_ref(17)? {
        ValueRef::Blob(b) | ValueRef::Text(b) => String::from_utf8_lossy(b).into_owned(),
        _ => String::new(),
    };
    let row = event_row(r)?;
    // The relay's own check, for a payload small enough to load.
    let envelope_error = if payload_bytes as usize <= PAYLOAD_CAP {
        crate::envelope::check_row(&crate::envelope::RawRow {
            row_id,
            event_id: r.get_ref(1)?,
            event_type: r.get_ref(2)?,
            event_version: r.get_ref(11)?,
            causation_id: r.get_ref(14)?,
            correlation_id: r.get_ref(15)?,
            payload: r.get_ref(17)?,
            occurred_at: r.get_ref(8)?,
            created_at: r.get_ref(16)?,
            tenant_id: r.get_ref(3)?,
            traceparent: ValueRef::Null,
            tracestate: ValueRef::Null,
        })
        .err()
        .map(|e| e.to_string())
    } else {
        None
    };
    Ok(EventDetail {
        last_error: row.last_error.clone(),
        row,
        event_version: text(r, 11)?,
        idempotency_key: text(r, 12)?,
        ordering_key: text(r, 13)?,
        causation_id: text(r, 14)?,
        correlation_id: text(r, 15)?,
        created_at: r.get(16)?,
        payload,
        payload_bytes,
        envelope_error,
        progress: Vec::new(),
        same_id: Vec::new(),
    })
}

#[cfg(test)]
pub(super) const STATEMENTS: [(&str, &str); 4] = [
    ("events walk", SQL_EVENTS_WALK),
    ("events walk with keys", SQL_EVENTS_WALK_KEYS),
    ("event", SQL_EVENT),
    ("rows with event id", SQL_ROWS_WITH_EVENT_ID),
];
