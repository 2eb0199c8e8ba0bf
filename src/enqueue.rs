//! The producer side: write an event in the host's own transaction.
//!
//! The event commits or rolls back with the host's business rows, because it
//! is written on the host's connection inside the host's transaction.
//! `enqueue` refuses a connection in autocommit mode, where the event would
//! commit on its own.
//!
//! ```
//! # fn main() -> outboxd::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! use outboxd::{enqueue, Event};
//! let mut conn = outboxd::connection::open(dir.path().join("app.db"))?;
//! outboxd::schema::migrate(&mut conn)?;
//! conn.execute_batch("CREATE TABLE articles (id INTEGER PRIMARY KEY, title TEXT)").unwrap();
//!
//! let tx = conn.transaction().unwrap();
//! tx.execute("INSERT INTO articles (title) VALUES ('Hello')", []).unwrap();
//! let event = Event::new("article.created.v1", &serde_json::json!({"id": 1}))?
//!     .idempotency_key("article-1-created");
//! let first = enqueue(&tx, &event)?;
//! // The same key again writes nothing and names the first event.
//! let again = enqueue(&tx, &Event::new("article.created.v1", &1)?.idempotency_key("article-1-created"))?;
//! assert!(again.is_duplicate());
//! assert_eq!(again.event_id(), first.event_id());
//! tx.commit().unwrap();
//! # Ok(()) }
//! ```

use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;

use crate::clock::Timestamp;
use crate::envelope::{EnvelopeError, EventId, EventType};
use crate::error::{Error, Result};
use crate::trace::{TraceParent, TraceState};

/// Default bound on a payload's JSON size: 1 MiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// An event to enqueue: its type and payload, plus optional routing fields.
/// Built with [`Event::new`] and the setters, then passed to [`enqueue`].
#[derive(Debug, Clone)]
pub struct Event {
    event_id: EventId,
    event_type: EventType,
    payload: String,
    tenant: Option<String>,
    idempotency_key: Option<String>,
    ordering_key: Option<String>,
    causation_id: Option<String>,
    correlation_id: Option<String>,
    occurred_at: Option<Timestamp>,
    available: Available,
    traceparent: Option<TraceParent>,
    tracestate: Option<TraceState>,
}

#[derive(Debug, Clone, Copy)]
enum Available {
    Now,
    After(Duration),
    At(Timestamp),
}

impl Event {
    /// An event of a validated type with a payload serialized to JSON.
    pub fn new(event_type: &str, payload: &impl Serialize) -> Result<Event> {
        let payload = serde_json::to_string(payload).map_err(Error::Payload)?;
        Event::from_parts(event_type, payload)
    }

    /// An event whose payload is JSON text already; the text is checked to
    /// be valid JSON and stored as given.
    pub fn from_json(event_type: &str, payload_json: impl Into<String>) -> Result<Event> {
        let payload = payload_json.into();
        serde_json::from_str::<serde::de::IgnoredAny>(&payload).map_err(|e| {
            Error::Envelope(EnvelopeError::PayloadJson {
                reason: e.to_string(),
            })
        })?;
        Event::from_parts(event_type, payload)
    }

    fn from_parts(event_type: &str, payload: String) -> Result<Event> {
        Ok(Event {
            event_id: EventId::new(),
            event_type: EventType::parse(event_type)?,
            payload,
            tenant: None,
            idempotency_key: None,
            ordering_key: None,
            causation_id: None,
            correlation_id: None,
            occurred_at: None,
            available: Available::Now,
            traceparent: None,
            tracestate: None,
        })
    }

    /// Uses this id instead of a fresh ULID (to carry an id minted earlier).
    #[must_use]
    pub fn event_id(mut self, id: EventId) -> Self {
        self.event_id = id;
        self
    }

    /// The tenant the event belongs to; idempotency keys are unique per tenant.
    /// Without one the event is in the system scope.
    #[must_use]
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// A key that makes enqueueing idempotent within the event's scope: a
    /// second event with the same scope and key is not written.
    #[must_use]
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Events sharing an ordering key reach each consumer one at a time, in
    /// commit order.
    #[must_use]
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }

    /// The id of what caused this event.
    #[must_use]
    pub fn causation_id(mut self, id: impl Into<String>) -> Self {
        self.causation_id = Some(id.into());
        self
    }

    /// The id shared by everything one request caused.
    #[must_use]
    pub fn correlation_id(mut self, id: impl Into<String>) -> Self {
        self.correlation_id = Some(id.into());
        self
    }

    /// When it happened (default: when it is enqueued).
    #[must_use]
    pub fn occurred_at(mut self, t: Timestamp) -> Self {
        self.occurred_at = Some(t);
        self
    }

    /// Deliver no sooner than this long after enqueueing.
    #[must_use]
    pub fn delay(mut self, d: Duration) -> Self {
        self.available = Available::After(d);
        self
    }

    /// Deliver no sooner than this time.
    #[must_use]
    pub fn available_at(mut self, t: Timestamp) -> Self {
        self.available = Available::At(t);
        self
    }

    /// The producer's W3C trace context, stored with the event: every
    /// delivery attempt sends a child of it (a new span id, the same trace
    /// id) in its transport metadata, never in the envelope.
    ///
    /// ```
    /// # fn main() -> outboxd::Result<()> {
    /// use outboxd::trace::{TraceParent, TraceState};
    /// let parent = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")?;
    /// let event = outboxd::Event::new("article.created.v1", &1)?
    ///     .traceparent(parent)
    ///     .tracestate(TraceState::parse("congo=t61rcWkgMzE")?.expect("one member"));
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn traceparent(mut self, traceparent: TraceParent) -> Self {
        self.traceparent = Some(traceparent);
        self
    }

    /// The vendors' state that goes with [`traceparent`](Self::traceparent);
    /// stored only beside one (alone it means nothing).
    #[must_use]
    pub fn tracestate(mut self, tracestate: TraceState) -> Self {
        self.tracestate = Some(tracestate);
        self
    }

    /// The trace context of the current `tracing` span, through its
    /// OpenTelemetry layer (feature `otel`: tracing-opentelemetry 0.32 with
    /// opentelemetry 0.31); unchanged when the span has none, which is
    /// logged once per process.
    #[cfg(feature = "otel")]
    #[must_use]
    pub fn current_trace(self) -> Self {
        match crate::trace::current() {
            Some(t) => {
                let with = self.traceparent(t.traceparent);
                match t.tracestate {
                    Some(s) => with.tracestate(s),
                    None => with,
                }
            }
            None => self,
        }
    }

    /// The event's id (a duplicate keeps the first event's id instead: see
    /// [`Enqueued::event_id`]).
    pub fn id(&self) -> EventId {
        self.event_id
    }

    /// When the event becomes due, if enqueued at `now`.
    fn available_at_from(&self, now: Timestamp) -> Timestamp {
        match self.available {
            Available::Now => now,
            Available::After(d) => now.plus(d),
            Available::At(t) => t,
        }
    }

    /// True when the event can share a multi-row INSERT: it has no
    /// idempotency key (so it cannot be a duplicate) and no CHECK of the
    /// table refuses it. Its type is validated, its times are integers and
    /// its status is the default; only a due time past year 9999 remains,
    /// and such an event goes alone, to be refused with the schema's reason.
    fn batchable(&self, now: Timestamp) -> bool {
        self.idempotency_key.is_none()
            && self.available_at_from(now).as_millis() <= LATEST_AVAILABLE_AT
    }
}

/// What [`enqueue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enqueued {
    /// The event was written.
    New(EventId),
    /// An event with the same scope and idempotency key exists; nothing was
    /// written and this is the existing event's id.
    Duplicate(EventId),
}

impl Enqueued {
    /// The id of the event now in the outbox.
    pub fn event_id(&self) -> EventId {
        match *self {
            Enqueued::New(id) | Enqueued::Duplicate(id) => id,
        }
    }

    /// True when nothing was written because of the idempotency key.
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Enqueued::Duplicate(_))
    }
}

/// Enqueues one event inside the caller's transaction, with the default
/// settings of [`Enqueuer`]. Pass `&tx` (a `rusqlite::Transaction` or
/// `Savepoint` derefs to the connection).
pub fn enqueue(conn: &Connection, event: &Event) -> Result<Enqueued> {
    Enqueuer::new().enqueue(conn, event)
}

/// Enqueues several events in one call, inside the caller's transaction.
pub fn enqueue_many<'a>(
    conn: &Connection,
    events: impl IntoIterator<Item = &'a Event>,
) -> Result<Vec<Enqueued>> {
    Enqueuer::new().enqueue_many(conn, events)
}

/// Enqueue with settings other than the defaults.
///
/// ```
/// # fn main() -> outboxd::Result<()> {
/// # let dir = tempfile::tempdir().unwrap();
/// # let mut conn = outboxd::connection::open(dir.path().join("app.db"))?;
/// # outboxd::schema::migrate(&mut conn)?;
/// use outboxd::{Enqueuer, Event, Error};
/// let small = Enqueuer::new().max_payload_bytes(16);
/// let tx = conn.transaction().unwrap();
/// let big = Event::new("log.written.v1", &"x".repeat(100))?;
/// assert!(matches!(small.enqueue(&tx, &big), Err(Error::PayloadTooLarge { limit: 16, .. })));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Enqueuer {
    max_payload_bytes: usize,
    allow_autocommit: bool,
}

impl Default for Enqueuer {
    fn default() -> Self {
        Enqueuer::new()
    }
}

impl Enqueuer {
    /// The default settings: payloads up to [`DEFAULT_MAX_PAYLOAD_BYTES`],
    /// autocommit refused.
    pub fn new() -> Enqueuer {
        Enqueuer {
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
            allow_autocommit: false,
        }
    }

    /// The largest payload accepted, in bytes of JSON.
    #[must_use]
    pub fn max_payload_bytes(mut self, n: usize) -> Self {
        self.max_payload_bytes = n;
        self
    }

    /// Accepts a connection in autocommit mode: each event then commits on
    /// its own. For producers that have no business rows to write with it
    /// (the `outboxd enqueue` command).
    #[must_use]
    pub fn allow_autocommit(mut self, yes: bool) -> Self {
        self.allow_autocommit = yes;
        self
    }

    /// Enqueues one event. See [`enqueue`].
    pub fn enqueue(&self, conn: &Connection, event: &Event) -> Result<Enqueued> {
        self.check_transaction(conn)?;
        self.check_size(event)?;
        insert_one(
            conn,
            &mut prepare(conn, INSERT_ONE)?,
            event,
            Timestamp::now(),
        )
    }

    /// Enqueues several events. See [`enqueue_many`].
    ///
    /// Events without an idempotency key are written 32 (then 4) to a
    /// statement: one INSERT of several rows pays SQLite's per-statement
    /// work (cursors on the table and its indexes, the AUTOINCREMENT
    /// counter) once instead of once per event. Such events cannot
    /// conflict, so the rows written are exactly the rows given. An event
    /// with a key, one the schema would refuse, and the last few of a
    /// batch go one to a statement: each needs its own answer (written or
    /// duplicate, or the schema's reason). Ids follow the order given
    /// either way.
    pub fn enqueue_many<'a>(
        &self,
        conn: &Connection,
        events: impl IntoIterator<Item = &'a Event>,
    ) -> Result<Vec<Enqueued>> {
        self.check_transaction(conn)?;
        // Check every payload before writing any, so a bad event does not
        // leave the ones before it in the caller's transaction.
        let events: Vec<&Event> = events.into_iter().collect();
        for e in &events {
            self.check_size(e)?;
        }
        let now = Timestamp::now();
        let mut done = Vec::with_capacity(events.len());
        let mut one = None;
        let mut many: [Option<rusqlite::CachedStatement<'_>>; ROWS_PER_INSERT.len()] =
            Default::default();
        let mut rest = &events[..];
        while let Some(first) = rest.first() {
            let batchable = rest
                .iter()
                .take(ROWS_PER_INSERT[0])
                .take_while(|e| e.batchable(now))
                .count();
            if let Some(size) = ROWS_PER_INSERT.iter().position(|&n| n <= batchable) {
                let stmt = match &mut many[size] {
                    Some(stmt) => stmt,
                    slot => slot.insert(prepare(conn, insert_many_sql(size))?),
                };
                let rows = &rest[..ROWS_PER_INSERT[size]];
                insert_keyless(stmt, rows, now)?;
                done.extend(rows.iter().map(|e| Enqueued::New(e.event_id)));
                rest = &rest[rows.len()..];
            } else {
                let stmt = match &mut one {
                    Some(stmt) => stmt,
                    None => one.insert(prepare(conn, INSERT_ONE)?),
                };
                done.push(insert_one(conn, stmt, first, now)?);
                rest = &rest[1..];
            }
        }
        Ok(done)
    }

    fn check_transaction(&self, conn: &Connection) -> Result<()> {
        if conn.is_autocommit() && !self.allow_autocommit {
            return Err(Error::NotInTransaction);
        }
        Ok(())
    }

    fn check_size(&self, e: &Event) -> Result<()> {
        if e.payload.len() > self.max_payload_bytes {
            return Err(Error::PayloadTooLarge {
                size: e.payload.len(),
                limit: self.max_payload_bytes,
            });
        }
        Ok(())
    }
}

/// Events per multi-row INSERT in [`Enqueuer::enqueue_many`], largest
/// first: a batch is written in statements of 32 rows, its remainder in
/// statements of 4, the last 0–3 one at a time. Past 32 rows a statement
/// the cost per event hardly falls (BENCHMARKS.md, enqueue), and two sizes
/// keep the connection's statement cache to three enqueue entries.
const ROWS_PER_INSERT: [usize; 2] = [32, 4];

/// The latest `available_at` the schema accepts for a pending row (the
/// last millisecond of year 9999: CHECK `event_outbox_times_in_milliseconds`).
const LATEST_AVAILABLE_AT: i64 = 253_402_300_799_999;

/// The columns every enqueue writes, in the order [`bind_row`] binds them.
macro_rules! columns {
    () => {
        "event_id, event_type, event_version, tenant_id, idempotency_key, ordering_key, \
         causation_id, correlation_id, payload, occurred_at, created_at, available_at, \
         traceparent, tracestate"
    };
}

/// Parameters per row: one per column of [`columns!`].
const PARAMS_PER_ROW: usize = 14;

/// The INSERT of one event. ON CONFLICT DO NOTHING: the unique indexes on
/// (scope, key) decide whether an event is a duplicate, atomically, never a
/// check-then-insert.
const INSERT_ONE: &str = concat!(
    "INSERT INTO event_outbox (",
    columns!(),
    ") VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14) ON CONFLICT DO NOTHING"
);

/// The INSERT of `ROWS_PER_INSERT[size]` events without idempotency keys.
///
/// `OR FAIL` rather than the default `ABORT`: with no function call in the
/// table's CHECKs (schema version 7), SQLite then writes the rows without a
/// statement journal (a copy of every page the statement touches, kept to
/// undo its earlier rows if a later one fails). No row in it can fail: [`Event::batchable`] keeps out every row
/// a CHECK would refuse, no unique index covers a row without a key, and
/// the rowid comes from AUTOINCREMENT. (An I/O error or a full disk in the
/// middle rolls back the host's whole transaction, as it does for a
/// one-row INSERT.)
fn insert_many_sql(size: usize) -> &'static str {
    static SQL: [std::sync::OnceLock<String>; ROWS_PER_INSERT.len()] =
        [const { std::sync::OnceLock::new() }; ROWS_PER_INSERT.len()];
    SQL[size].get_or_init(|| {
        let row = format!("({})", ["?"; PARAMS_PER_ROW].join(", "));
        format!(
            "INSERT OR FAIL INTO event_outbox ({}) VALUES {}",
            columns!(),
            vec![row; ROWS_PER_INSERT[size]].join(", ")
        )
    })
}

fn prepare<'c>(conn: &'c Connection, sql: &str) -> Result<rusqlite::CachedStatement<'c>> {
    conn.prepare_cached(sql)
        .map_err(Error::db("prepare the enqueue statement"))
}

/// Binds one event's columns ([`columns!`]) from parameter `first` on.
fn bind_row(
    stmt: &mut rusqlite::Statement<'_>,
    first: usize,
    e: &Event,
    now: Timestamp,
) -> rusqlite::Result<()> {
    let available_at = e.available_at_from(now);
    // The id as text on the stack: no allocation per event.
    let mut id = [0; ulid::ULID_LEN];
    stmt.raw_bind_parameter(first, &*e.event_id.ulid().array_to_str(&mut id))?;
    stmt.raw_bind_parameter(first + 1, e.event_type.as_str())?;
    stmt.raw_bind_parameter(first + 2, e.event_type.version())?;
    stmt.raw_bind_parameter(first + 3, e.tenant.as_deref())?;
    stmt.raw_bind_parameter(first + 4, e.idempotency_key.as_deref())?;
    stmt.raw_bind_parameter(first + 5, e.ordering_key.as_deref())?;
    stmt.raw_bind_parameter(first + 6, e.causation_id.as_deref())?;
    stmt.raw_bind_parameter(first + 7, e.correlation_id.as_deref())?;
    stmt.raw_bind_parameter(first + 8, e.payload.as_str())?;
    stmt.raw_bind_parameter(first + 9, e.occurred_at.unwrap_or(now).as_millis())?;
    stmt.raw_bind_parameter(first + 10, now.as_millis())?;
    stmt.raw_bind_parameter(first + 11, available_at.as_millis())?;
    let parent = e.traceparent.map(|p| p.to_string());
    stmt.raw_bind_parameter(first + 12, parent.as_deref())?;
    let state = e.tracestate.as_ref().filter(|_| parent.is_some());
    stmt.raw_bind_parameter(first + 13, state.map(TraceState::as_str))
}

/// Writes events without idempotency keys with one statement of as many
/// rows (the caller checked their sizes and [`Event::batchable`]).
fn insert_keyless(
    stmt: &mut rusqlite::CachedStatement<'_>,
    rows: &[&Event],
    now: Timestamp,
) -> Result<()> {
    let written = rows
        .iter()
        .enumerate()
        .try_for_each(|(i, e)| bind_row(stmt, 1 + i * PARAMS_PER_ROW, e, now))
        .and_then(|()| stmt.raw_execute())
        .map_err(Error::db("enqueue events"))?;
    if written != rows.len() {
        return Err(Error::Invariant {
            what: format!(
                "{} events without idempotency keys were written as {written} rows",
                rows.len()
            ),
        });
    }
    Ok(())
}

/// Writes one event with the prepared [`INSERT_ONE`] (the caller checked
/// its size).
fn insert_one(
    conn: &Connection,
    stmt: &mut rusqlite::CachedStatement<'_>,
    e: &Event,
    now: Timestamp,
) -> Result<Enqueued> {
    let inserted = bind_row(stmt, 1, e, now)
        .and_then(|()| stmt.raw_execute())
        .map_err(Error::db("enqueue an event"))?;
    if inserted == 1 {
        return Ok(Enqueued::New(e.event_id));
    }
    let Some(key) = e.idempotency_key.as_deref() else {
        // Only an idempotency key can make the insert a no-op.
        return Err(Error::Invariant {
            what: format!("an event without an idempotency key was not inserted ({inserted} rows)"),
        });
    };
    // The insert met a conflict on the key inside this transaction, so
    // the row holding it is there to read.
    existing_event(conn, e.tenant.as_deref(), key)?
        .map(Enqueued::Duplicate)
        .ok_or_else(|| Error::Invariant {
            what: format!(
                "the event holding idempotency key {key:?} conflicted but cannot be read"
            ),
        })
}

/// The id of the event holding an idempotency key in a scope (a legacy row
/// without an event id gets its derived id).
fn existing_event(conn: &Connection, tenant: Option<&str>, key: &str) -> Result<Option<EventId>> {
    let row = match tenant {
        Some(t) => conn
            .prepare_cached(
                "SELECT id, event_id, created_at FROM event_outbox
                 WHERE tenant_id = ?1 AND idempotency_key = ?2",
            )
            .and_then(|mut s| s.query_row(params![t, key], read_id).optional()),
        None => conn
            .prepare_cached(
                "SELECT id, event_id, created_at FROM event_outbox
                 WHERE tenant_id IS NULL AND idempotency_key = ?1",
            )
            .and_then(|mut s| s.query_row(params![key], read_id).optional()),
    }
    .map_err(Error::db("look up an idempotency key"))?;
    Ok(row.map(|(row_id, event_id, created_at)| {
        event_id
            .as_deref()
            .and_then(|s| EventId::parse(s).ok())
            .unwrap_or_else(|| EventId::for_legacy_row(Timestamp::from_millis(created_at), row_id))
    }))
}

fn read_id(r: &rusqlite::Row<'_>) -> rusqlite::Result<(i64, Option<String>, i64)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
}
