//! Repairing a malformed dead letter. A producer writing plain SQL can store
//! a row the relay cannot read (an event type without a version, a payload
//! that is not JSON, a malformed event id, a version that disagrees with
//! the type); the relay dead-letters it with the reason. [`repair`] rewrites
//! the columns given, checks the whole row with the rules the relay applies
//! when it claims one, and keeps the change only when the row is valid now.
//! Then [`dead_letter::requeue`] puts it back
//! in the queue (`outboxd dead edit --requeue` does both).
//!
//! ```
//! # fn main() -> outboxd::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let mut conn = outboxd::connection::open(dir.path().join("app.db"))?;
//! # outboxd::schema::migrate(&mut conn)?;
//! use outboxd::dead_letter::{self, Selector};
//! use outboxd::repair::{repair, Repair};
//! use outboxd::{EventType, Timestamp};
//! // A foreign producer forgot the version.
//! conn.execute(
//!     "INSERT INTO event_outbox (event_type, payload, status, finished_at)
//!      VALUES ('order.placed', '{\"id\": 7}', 'dead', 1)",
//!     [],
//! ).unwrap();
//! let fixed = repair(&mut conn, "1", &Repair::new().event_type(EventType::parse("order.placed.v1")?))?;
//! assert_eq!(fixed.event_type, "order.placed.v1");
//! dead_letter::requeue(&mut conn, &Selector::One("1".into()), Timestamp::now())?;
//! # Ok(()) }
//! ```

use rusqlite::{Connection, TransactionBehavior};

use crate::clock::Timestamp;
use crate::dead_letter::{self, DeadLetter};
use crate::envelope::{check_row, row_columns, CheckedRow, EventId, EventType, RawRow};
use crate::error::{Error, Result};

/// The columns to rewrite; a column not set is left as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use]
pub struct Repair {
    event_type: Option<EventType>,
    event_id: Option<EventId>,
    payload: Option<String>,
    causation_id: Option<Option<String>>,
    correlation_id: Option<Option<String>>,
    occurred_at: Option<Timestamp>,
}

impl Repair {
    /// No change yet.
    pub fn new() -> Repair {
        Repair::default()
    }

    /// The event type; the version column follows it.
    pub fn event_type(mut self, t: EventType) -> Repair {
        self.event_type = Some(t);
        self
    }

    /// The event id.
    pub fn event_id(mut self, id: EventId) -> Repair {
        self.event_id = Some(id);
        self
    }

    /// The payload, as JSON text (checked with the rest of the row).
    pub fn payload(mut self, json: impl Into<String>) -> Repair {
        self.payload = Some(json.into());
        self
    }

    /// The causation id; None clears it.
    pub fn causation_id(mut self, id: Option<String>) -> Repair {
        self.causation_id = Some(id);
        self
    }

    /// The correlation id; None clears it.
    pub fn correlation_id(mut self, id: Option<String>) -> Repair {
        self.correlation_id = Some(id);
        self
    }

    /// When the event occurred.
    pub fn occurred_at(mut self, t: Timestamp) -> Repair {
        self.occurred_at = Some(t);
        self
    }

    /// The columns this repair rewrites, in table order.
    pub fn columns(&self) -> Vec<&'static str> {
        [
            ("event_id", self.event_id.is_some()),
            ("event_type", self.event_type.is_some()),
            ("causation_id", self.causation_id.is_some()),
            ("correlation_id", self.correlation_id.is_some()),
            ("payload", self.payload.is_some()),
            ("occurred_at", self.occurred_at.is_some()),
        ]
        .into_iter()
        .filter_map(|(column, set)| set.then_some(column))
        .collect()
    }
}

/// Rewrites the columns `r` sets on the dead letter `id` (its row id, or
/// its event id in either case), in one `BEGIN IMMEDIATE` transaction, and
/// returns it as it is now. The row stays dead: requeue it to deliver it.
///
/// Fails with [`Error::NotFound`] when no dead letter has that id, and with
/// [`Error::Envelope`] (nothing changed) when the row, repaired, would still
/// be refused by the relay: the error says which column and why.
pub fn repair(conn: &mut Connection, id: &str, r: &Repair) -> Result<DeadLetter> {
    crate::schema::ensure_current(conn)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(Error::db("start a repair"))?;
    let row_id = dead_letter::show(&tx, id)?.row_id;
    let set = |column: &str, value: &dyn rusqlite::ToSql| {
        tx.execute(
            &format!("UPDATE event_outbox SET {column} = ?2 WHERE id = ?1"),
            rusqlite::params![row_id, value],
        )
        .map(drop)
        .map_err(Error::db("repair a dead letter"))
    };
    if let Some(t) = &r.event_type {
        set("event_type", &t.to_string())?;
        set("event_version", &i64::from(t.version()))?;
    }
    if let Some(event_id) = &r.event_id {
        set("event_id", &event_id.to_string())?;
    }
    if let Some(payload) = &r.payload {
        set("payload", payload)?;
    }
    if let Some(c) = &r.causation_id {
        set("causation_id", c)?;
    }
    if let Some(c) = &r.correlation_id {
        set("correlation_id", c)?;
    }
    if let Some(t) = r.occurred_at {
        set("occurred_at", &t.as_millis())?;
    }
    check(&tx, row_id)?;
    let repaired = dead_letter::show(&tx, &row_id.to_string())?;
    tx.commit().map_err(Error::db("commit a repair"))?;
    Ok(repaired)
}

/// The relay's verdict on row `row_id` ([`check_row`]): what it would
/// deliver, or why it would dead-letter the row.
fn check(conn: &Connection, row_id: i64) -> Result<CheckedRow> {
    conn.query_row(
        concat!(
            "SELECT ",
            row_columns!(),
            " FROM event_outbox WHERE id = ?1"
        ),
        [row_id],
        |r| Ok(check_row(&RawRow::read(r, 0)?)),
    )
    .map_err(Error::db("check a repaired dead letter"))?
    .map_err(Error::Envelope)
}
