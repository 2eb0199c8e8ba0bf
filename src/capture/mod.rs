//! Capture: the host's own inserts, updates and deletes on chosen tables
//! become events, through SQLite triggers, with no change to the host's code.
//!
//! A trigger runs inside the statement that fired it, so the event commits
//! or rolls back with the host's write: a transactional outbox for a host
//! that cannot add an `INSERT` to the code that writes its pages (a plugin,
//! a framework's admin). [`apply`] installs the triggers a [`CaptureSpec`]
//! describes; [`inspect`] reports drift (a host migration that rebuilt a
//! table dropped them); [`remove`] takes them away. docs/capture.md is the
//! user's guide: the payload, the trigger SQL, the limits.
//!
//! ```
//! # fn main() -> outboxd::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! use outboxd::capture::{self, CaptureSpec, Columns};
//! use outboxd::Timestamp;
//!
//! let mut conn = outboxd::connection::open(dir.path().join("cms.db"))?;
//! outboxd::schema::migrate(&mut conn)?;
//! conn.execute_batch("CREATE TABLE pages (id INTEGER PRIMARY KEY, title TEXT, body TEXT)").unwrap();
//!
//! let spec = CaptureSpec::new("pages", "page.{op}.v1", Columns::List(vec!["title".into()]));
//! capture::apply(&mut conn, &[spec], Timestamp::now())?;
//!
//! // The host writes as it always did...
//! conn.execute("INSERT INTO pages (title, body) VALUES ('Hello', '...')", []).unwrap();
//! // ...and the event is in the outbox, committed with the page.
//! let (ty, payload): (String, String) = conn
//!     .query_row("SELECT event_type, payload FROM event_outbox", [], |r| Ok((r.get(0)?, r.get(1)?)))
//!     .unwrap();
//! assert_eq!(ty, "page.created.v1");
//! assert_eq!(
//!     payload,
//!     r#"{"op":"c","table":"pages","key":{"id":1},"before":null,"after":{"title":"Hello"}}"#
//! );
//! assert!(capture::inspect(&conn)?.iter().all(|c| c.is_intact()));
//! # Ok(()) }
//! ```

mod compare;
mod drift;
mod gap;
pub(crate) mod generate;
mod install;
mod objects;
mod resolve;
pub mod snapshot;
mod spec;
mod sqltext;
mod table;

pub use compare::{compare, Comparison, ConfigMatch};
pub use drift::{inspect, mark_verified, CaptureStatus, ObjectStatus, TriggerState};
pub use gap::{ack, gaps, open_gaps, Gap, GapEnd, GapSelection};
#[allow(deprecated)]
pub use generate::MAX_CHANGE_BYTES;
pub use install::{
    apply, apply_as, check, remove, ApplyReport, Change, Removal, RemoveReport, TableChange,
};
pub use spec::{
    assign_names, CaptureSpec, Columns, Operation, When, AUTO_SNAPSHOT_EVERY, DEFAULT_ORDERING_KEY,
    MIN_MAX_PAYLOAD_BYTES,
};

use crate::envelope::EnvelopeError;

/// The triggers and views a capture would install on `conn` (shared ones
/// first), as (name, kind, SQL): for tests that build the records an
/// earlier schema held.
#[cfg(test)]
pub(crate) fn objects_of(
    conn: &rusqlite::Connection,
    spec: &CaptureSpec,
) -> Vec<(String, &'static str, String)> {
    let plan = resolve::resolve(conn, spec).unwrap();
    generate::event_objects()
        .into_iter()
        .chain(plan.triggers())
        .map(|o| (o.name, o.kind, o.sql))
        .collect()
}

/// outboxd's own tables, which cannot be captured.
const OWN_TABLES: &[&str] = &["event_outbox", "delivered_events", "publish_intents"];

/// Why a capture cannot be installed. Each names the table and the field or
/// column at fault; nothing has been changed when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// The table does not exist in the main database.
    #[error("capture of {table}: no such table")]
    NoSuchTable {
        /// The name as given.
        table: String,
    },
    /// A column named in the capture does not exist.
    #[error("capture of {table}: {field} names column {column:?}, which the table does not have")]
    NoSuchColumn {
        /// The table.
        table: String,
        /// The setting that names it (`columns`, `key`, `tenant_column`,
        /// `ordering_key`).
        field: &'static str,
        /// The column as given.
        column: String,
    },
    /// The table cannot be captured (a view, a virtual table, outboxd's own).
    #[error("capture of {table}: cannot capture it: {reason}")]
    Unsupported {
        /// The table.
        table: String,
        /// Why.
        reason: String,
    },
    /// A setting is invalid.
    #[error("capture of {table}: invalid {field}: {reason}")]
    Invalid {
        /// The table.
        table: String,
        /// The setting.
        field: &'static str,
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// The event type template gives an invalid type for an operation.
    #[error("capture of {table}: event_type for {operation}: {source}")]
    EventType {
        /// The table.
        table: String,
        /// The operation whose type is invalid.
        operation: Operation,
        /// Why the type is refused.
        #[source]
        source: EnvelopeError,
    },
    /// The key's columns do not identify one row.
    #[error(
        "capture of {table}: key ({key}) is not unique: use the primary key, the rowid or the \
         columns of a UNIQUE constraint"
    )]
    KeyNotUnique {
        /// The table.
        table: String,
        /// The key's columns.
        key: String,
    },
    /// Two captures name the same table (no longer refused: a table may
    /// have several captures, each with its own name).
    #[error("capture of {table}: the table is captured twice; merge the two entries")]
    DuplicateTable {
        /// The table.
        table: String,
    },
    /// Two captures have the same name.
    #[error("capture of {table}: the name {name:?} is taken by another capture; give each capture of a table its own `name`")]
    DuplicateName {
        /// The table.
        table: String,
        /// The name.
        name: String,
    },
    /// A snapshot cannot start or go on.
    #[error("snapshot of capture {capture}: {reason}")]
    Snapshot {
        /// The capture's name.
        capture: String,
        /// Why, and what to do.
        reason: String,
    },
    /// The record of an installed capture (`outboxd_capture.spec`) cannot be
    /// read: written by a newer outboxd, or edited by hand.
    #[error("capture of {table}: its record in outboxd_capture cannot be read ({reason}); run `outboxd capture apply` again")]
    Record {
        /// The table.
        table: String,
        /// Why.
        reason: String,
    },
    /// A trigger capture would install has the name of one it does not
    /// own: a host's trigger (on any table), or the trigger of another
    /// capture installed by an outboxd that named them differently.
    #[error(
        "capture of {table}: a trigger named {name} exists already on {on} and is not this \
         capture's; drop or rename it (if it is another capture's, run `outboxd capture apply` \
         for that table first)"
    )]
    NameTaken {
        /// The table being captured.
        table: String,
        /// The name.
        name: String,
        /// The table the existing object is on.
        on: String,
    },
    /// SQLite refused the generated triggers, most often because a `when`
    /// condition names a column that does not exist or a row the operation
    /// lacks (an insert has no OLD, a delete no NEW).
    #[error(
        "capture of {table}: the triggers{} do not compile: {message}{}",
        operation.map(|o| format!(" for {o}")).unwrap_or_default(),
        if operation.is_some() { " (check `when`: an insert has only NEW, a delete only OLD)" } else { "" }
    )]
    DoesNotCompile {
        /// The table.
        table: String,
        /// The operation whose statement failed to compile, if known.
        operation: Option<Operation>,
        /// SQLite's message.
        message: String,
    },
}
