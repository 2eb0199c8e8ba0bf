//! Operators' read-only views of the outbox: pages of events and dead
//! letters, one event whole, each consumer's backlog, and per-minute counts.
//! The web console (`outboxd console`) shows what these return; any other
//! tool may too.
//!
//! Every statement is bounded so a page costs the same on a million events
//! as on a hundred. Lists page by key, never by OFFSET: events by row id
//! (newest first), dead letters by (finished_at, id) on the index of
//! finished rows. Filters that no index serves (a type pattern, a tenant, a
//! consumer's progress, a time range) are applied while walking the key
//! order, and a page stops after [`SCAN_BUDGET`] rows, offering to go on
//! from where it stopped. A test runs EXPLAIN QUERY PLAN on every statement
//! here. The dedup ledger is read through [`crate::dedup`], the one module
//! that knows its layout; the dead-letter count is [`crate::status::dead_count`].
//!
//! Text columns are read whatever type a foreign producer stored in them:
//! a row that cannot be parsed is shown rather than failing the page.

/// The columns of a list row, in [`event_row`]'s order (the last error follows).
macro_rules! row_columns {
    () => {
        "id, event_id, event_type, tenant_id, status, attempts, \
         available_at, lease_until, occurred_at, finished_at"
    };
}

mod backlog;
mod dead;
mod events;
mod minutes;

pub use backlog::{consumer_backlog, Backlog, CONSUMER_SCAN};
pub use dead::{dead_page, DeadPage};
pub use events::{events_page, find_event, EventDetail, EventFilter, EventsPage, StateFilter};
pub use minutes::{enqueued_total, minute_counts, MinuteCounts};

use rusqlite::types::ValueRef;
use rusqlite::Row;

use crate::Timestamp;

/// Rows a list page examines at most before it stops and offers "go on".
pub const SCAN_BUDGET: usize = 5_000;

/// Rows on one list page.
pub const PAGE: usize = 50;

/// The most of a payload shown on an event's page.
pub const PAYLOAD_CAP: usize = 64 * 1024;

/// Any stored value as text (a foreign producer may have bound a number or
/// a blob where text belongs).
fn text(r: &Row<'_>, i: usize) -> rusqlite::Result<Option<String>> {
    Ok(match r.get_ref(i)? {
        ValueRef::Null => None,
        ValueRef::Integer(n) => Some(n.to_string()),
        ValueRef::Real(f) => Some(f.to_string()),
        ValueRef::Text(b) | ValueRef::Blob(b) => Some(String::from_utf8_lossy(b).into_owned()),
    })
}

/// One row of the events or dead-letter list.
#[derive(Debug, Clone)]
pub struct EventRow {
    /// Row id.
    pub id: i64,
    /// Event id (None for a legacy row).
    pub event_id: Option<String>,
    /// Type as stored.
    pub event_type: String,
    /// Tenant.
    pub tenant: Option<String>,
    /// pending, delivered or dead.
    pub status: String,
    /// Failed attempts.
    pub attempts: i64,
    /// When it is (or was) due, ms.
    pub available_at: i64,
    /// Lease end, ms, when claimed.
    pub lease_until: Option<i64>,
    /// When it occurred, ms.
    pub occurred_at: i64,
    /// When it finished, ms.
    pub finished_at: Option<i64>,
    /// The start of the last error.
    pub last_error: Option<String>,
}

impl EventRow {
    /// The state an operator thinks in: due, delayed, leased, delivered, dead.
    pub fn state(&self, now: Timestamp) -> &'static str {
        match self.status.as_str() {
            "delivered" => "delivered",
            "dead" => "dead",
            _ if self.lease_until.is_some() => "leased",
            _ if self.available_at <= now.as_millis() => "due",
            _ => "delayed",
        }
    }
}

/// A row selected as `row_columns!()` followed by the last error.
fn event_row(r: &Row<'_>) -> rusqlite::Result<EventRow> {
    Ok(EventRow {
        id: r.get(0)?,
        event_id: text(r, 1)?,
        event_type: text(r, 2)?.unwrap_or_default(),
        tenant: text(r, 3)?,
        status: text(r, 4)?.unwrap_or_default(),
        attempts: r.get(5)?,
        available_at: r.get(6)?,
        lease_until: r.get(7)?,
        occurred_at: r.get(8)?,
        finished_at: r.get(9)?,
        last_error: text(r, 10)?,
    })
}

/// Every statement of this module, for the query-plan test.
#[cfg(test)]
fn all_statements() -> Vec<(&'static str, String)> {
    let mut all = events::STATEMENTS.to_vec();
    all.extend_from_slice(&dead::STATEMENTS);
    all.extend_from_slice(&backlog::STATEMENTS);
    all.extend_from_slice(&minutes::STATEMENTS);
    all.into_iter().map(|(n, s)| (n, s.to_string())).collect()
}

#[cfg(test)]
mod tests;
