//! The trigger SQL: what a captured write runs inside the host's statement.
//!
//! Every trigger here runs on the *host's* SQLite (Debian 12's 3.40, PHP's,
//! Python's), not outboxd's, so the SQL uses nothing newer than SQLite 3.34
//! and no extension (no JSON1): the payload is built with `||`, `replace`,
//! `hex` and `quote`. It must also never fail, since a failing trigger fails
//! the host's write: every value of every type renders, nothing raises, and
//! a change too large to carry is sent without its values rather than
//! pushing the payload past SQLite's length limit.
//!
//! Older SQLite parsers have a fixed stack of 100 entries: an expression
//! nested more than about 25 calls deep does not parse. Long chains of
//! `replace` are therefore split across statements.
//!
//! The work is split in two:
//! - per table, triggers on the captured table build each event: its type,
//!   the payload with every value rendered ([`value`](json::value)), the
//!   tenant and the ordering key, and insert it into the view
//!   `outboxd_capture_event` (per_table.rs, json.rs);
//! - one shared `INSTEAD OF` trigger on that view ([`event_objects`],
//!   shared.rs, with the checks of utf8.rs) writes the row into
//!   `event_outbox`: it mints the ULID and stamps the time, escapes control
//!   characters, and checks that the payload is UTF-8, replacing it by a hex
//!   form when it is not (text that is not UTF-8, or holds NUL, cannot be
//!   JSON). A view's trigger receives the payload as a value it can test
//!   many times for free, so an ordinary payload costs one insert. Doing
//!   this once keeps the per-table SQL small, which matters: SQLite parses
//!   every trigger whenever a connection opens, and compiles the triggers a
//!   statement fires whenever it is prepared.

mod json;
mod payload;
mod per_table;
mod shared;
mod snapshot;
mod utf8;

pub(crate) use per_table::Plan;
pub(crate) use per_table::KINDS;
pub(crate) use shared::{event_objects, EVENT_VIEW};

/// Prefix of every trigger capture installs.
pub(crate) const TRIGGER_PREFIX: &str = "outboxd_capture_";

/// The bound older versions used for the values of one change. A capture's
/// bound is now its `max_payload_bytes` ([`CaptureSpec::payload_bound`](crate::capture::CaptureSpec::payload_bound)),
/// by default the relay's.
#[deprecated(note = "a capture's bound is its max_payload_bytes (CaptureSpec::payload_bound)")]
pub const MAX_CHANGE_BYTES: i64 = 48 * 1024 * 1024;

/// How every capture trigger writes an event.
const INSERT_EVENT: &str =
    "INSERT INTO outboxd_capture_event (event_type, payload, tenant_id, ordering_key)";

/// The scratch table where BEFORE triggers note the rows a REPLACE will
/// delete (migration 0003).
const REPLACED_TABLE: &str = "outboxd_capture_replaced";

/// A trigger or view capture installs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SqlObject {
    /// Its name.
    pub name: String,
    /// `trigger` or `view`, as sqlite_master says.
    pub kind: &'static str,
    /// The captured table it belongs to; empty for the shared view and its
    /// trigger.
    pub table: String,
    /// `CREATE TRIGGER …` or `CREATE VIEW …`.
    pub sql: String,
}

impl SqlObject {
    fn trigger(name: String, table: &str, sql: String) -> SqlObject {
        SqlObject {
            name,
            kind: "trigger",
            table: table.to_string(),
            sql,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::per_table::KINDS;
    use super::shared::{EVENT_TRIGGER, FIX_TRIGGER, REPLACED_TRIGGER};
    use super::*;

    #[test]
    fn no_kind_begins_another_so_trigger_names_never_collide() {
        for a in KINDS {
            for b in KINDS {
                if a != b {
                    assert!(!format!("{b}_").starts_with(&format!("{a}_")), "{a} / {b}");
                }
            }
            for shared in [EVENT_VIEW, EVENT_TRIGGER, FIX_TRIGGER, REPLACED_TRIGGER] {
                let own = format!("{TRIGGER_PREFIX}{a}_");
                assert!(!shared.starts_with(&own), "{shared} / {a}");
            }
        }
    }
}
