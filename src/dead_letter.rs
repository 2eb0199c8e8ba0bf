//! Operator operations on dead letters: list, show, requeue, discard.
//!
//! Queries over dead rows say `status <> 'pending' AND status = 'dead'` so
//! that SQLite can use the partial index of finished rows.
//!
//! ```
//! # fn main() -> outboxd::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let mut conn = outboxd::connection::open(dir.path().join("app.db"))?;
//! # outboxd::schema::migrate(&mut conn)?;
//! use outboxd::dead_letter::{self, Selector};
//! let dead = dead_letter::list(&conn, 50)?;
//! assert!(dead.is_empty());
//! let requeued = dead_letter::requeue(&mut conn, &Selector::All, outboxd::Timestamp::now())?;
//! assert_eq!(requeued, 0);
//! # Ok(()) }
//! ```

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde::Serialize;

use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::router::Pattern;

/// Rows changed per transaction by requeue and discard.
const BATCH: usize = 1000;

/// One dead-lettered event, as an operator sees it (read with [`list`] or
/// [`show`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct DeadLetter {
    /// The row id (what `show`, `requeue` and `discard` take).
    pub row_id: i64,
    /// The event id as stored (None for a legacy row). Not checked: a
    /// producer may have written a malformed one, and one stored as a blob
    /// is shown as its bytes in hex, `x'0a1b…'` (never mistaken for a ULID).
    pub event_id: Option<String>,
    /// The event type as stored.
    pub event_type: String,
    /// The tenant, if any (a number or a blob a producer wrote, as text).
    pub tenant_id: Option<String>,
    /// Failed attempts spent.
    pub attempts: i64,
    /// Why it was dead-lettered.
    pub reason: Option<String>,
    /// When it was dead-lettered.
    pub dead_at: Option<Timestamp>,
    /// The payload as stored (only filled by [`show`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
}

/// Which dead letters an operation applies to.
#[derive(Debug, Clone)]
pub enum Selector {
    /// One row, by row id or event id.
    One(String),
    /// Every dead letter whose type matches a pattern (one whose type is
    /// not text, such as bytes that are not UTF-8, matches none).
    Type(Pattern),
    /// Every dead letter.
    All,
}

/// The newest `limit` dead letters, newest first.
pub fn list(conn: &Connection, limit: usize) -> Result<Vec<DeadLetter>> {
    crate::schema::ensure_current(conn)?;
    let mut stmt = conn
        .prepare(
            "SELECT id, event_id, event_type, tenant_id, attempts, last_error, finished_at, NULL
               FROM event_outbox WHERE status <> 'pending' AND status = 'dead'
              ORDER BY finished_at DESC, id DESC LIMIT ?1",
        )
        .map_err(Error::db("list dead letters"))?;
    let rows = stmt
        .query_map([limit as i64], read)
        .and_then(|r| r.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(Error::db("list dead letters"))?;
    Ok(rows)
}

/// One dead letter with its payload, by row id or event id.
pub fn show(conn: &Connection, id: &str) -> Result<DeadLetter> {
    crate::schema::ensure_current(conn)?;
    let row_id = resolve(conn, id)?;
    conn.query_row(
        "SELECT id, event_id, event_type, tenant_id, attempts, last_error, finished_at,
                CAST(payload AS TEXT)
           FROM event_outbox WHERE status = 'dead' AND id = ?1",
        [row_id],
        read,
    )
    .optional()
    .map_err(Error::db("show a dead letter"))?
    .ok_or_else(|| Error::NotFound {
        what: format!("dead letter {id}"),
    })
}

/// How many dead letters a selector names now: what [`requeue`] or
/// [`discard`] would change (the console's confirmation shows it).
pub fn count(conn: &Connection, which: &Selector) -> Result<u64> {
    crate::schema::ensure_current(conn)?;
    if let Selector::All = which {
        // Counted, not listed (there may be millions): the status's count.
        return crate::status::dead_count(conn);
    }
    Ok(select(conn, which)?.len() as u64)
}

/// Puts dead letters back in the queue, due now, with their attempts reset.
/// Returns how many were requeued.
pub fn requeue(conn: &mut Connection, which: &Selector, now: Timestamp) -> Result<u64> {
    change(
        conn,
        which,
        "UPDATE event_outbox
            SET status = 'pending', attempts = 0, available_at = ?2, finished_at = NULL
          WHERE id = ?1 AND status = 'dead'",
        Some(now),
        "requeue dead letters",
    )
}

/// Deletes dead letters for good. Returns how many were deleted.
pub fn discard(conn: &mut Connection, which: &Selector) -> Result<u64> {
    change(
        conn,
        which,
        "DELETE FROM event_outbox WHERE id = ?1 AND status = 'dead'",
        None,
        "discard dead letters",
    )
}

fn change(
    conn: &mut Connection,
    which: &Selector,
    sql: &str,
    now: Option<Timestamp>,
    op: &'static str,
) -> Result<u64> {
    crate::schema::ensure_current(conn)?;
    let ids = select(conn, which)?;
    if let Selector::One(id) = which {
        if ids.is_empty() {
            return Err(Error::NotFound {
                what: format!("dead letter {id}"),
            });
        }
    }
    let mut changed = 0;
    for chunk in ids.chunks(BATCH) {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(Error::db(op))?;
        {
            let mut stmt = tx.prepare_cached(sql).map_err(Error::db(op))?;
            for id in chunk {
                let n = match now {
                    Some(now) => stmt.execute(params![id, now.as_millis()]),
                    None => stmt.execute(params![id]),
                };
                changed += n.map_err(Error::db(op))? as u64;
            }
        }
        tx.commit().map_err(Error::db(op))?;
    }
    Ok(changed)
}

/// The row ids of the dead letters a selector names.
fn select(conn: &Connection, which: &Selector) -> Result<Vec<i64>> {
    // Each dead row's id and its type as text, None when it is not text: a
    // producer may have written bytes that are not UTF-8 (the relay
    // dead-letters such a row). It matches no pattern, and is one of --all.
    let all = || -> Result<Vec<(i64, Option<String>)>> {
        let mut stmt = conn
            .prepare(
                "SELECT id, CAST(event_type AS TEXT) FROM event_outbox
                  WHERE status <> 'pending' AND status = 'dead' ORDER BY id",
            )
            .map_err(Error::db("select dead letters"))?;
        let rows = stmt
            .query_map([], |r| {
                let event_type = match r.get_ref(1)? {
                    rusqlite::types::ValueRef::Text(t) => {
                        std::str::from_utf8(t).ok().map(str::to_owned)
                    }
                    _ => None,
                };
                Ok((r.get(0)?, event_type))
            })
            .and_then(|r| r.collect())
            .map_err(Error::db("select dead letters"))?;
        Ok(rows)
    };
    Ok(match which {
        Selector::One(id) => match resolve(conn, id) {
            Ok(row) => vec![row],
            Err(Error::NotFound { .. }) => vec![],
            Err(e) => return Err(e),
        },
        Selector::Type(p) => all()?
            .into_iter()
            .filter(|(_, t)| t.as_deref().is_some_and(|t| p.matches(t)))
            .map(|(id, _)| id)
            .collect(),
        Selector::All => all()?.into_iter().map(|(id, _)| id).collect(),
    })
}

/// The oldest dead row carrying event id ?1, in any letter case.
const RESOLVE_EVENT_ID: &str = "SELECT id FROM event_outbox
  WHERE event_id = ?1 COLLATE NOCASE AND event_id IS NOT NULL AND status = 'dead'
  ORDER BY id LIMIT 1";

/// A row id ("42") or an event id (a ULID) → the row id of a dead letter.
fn resolve(conn: &Connection, id: &str) -> Result<i64> {
    let found = if let Ok(row_id) = id.parse::<i64>() {
        conn.query_row(
            "SELECT id FROM event_outbox WHERE id = ?1 AND status = 'dead'",
            [row_id],
            |r| r.get(0),
        )
    } else {
        // A producer may store the id in any letter case (the SQL contract
        // accepts it): compare under NOCASE, which is also how the event-id
        // index compares (schema 6), so this is one index probe, not a walk
        // over every dead row.
        let canonical = crate::EventId::parse(id)?.to_string();
        conn.query_row(RESOLVE_EVENT_ID, [canonical], |r| r.get(0))
    };
    found
        .optional()
        .map_err(Error::db("find a dead letter"))?
        .ok_or_else(|| Error::NotFound {
            what: format!("dead letter {id}"),
        })
}

/// A blob as SQL writes one, `x'0a1b'`, its first 64 bytes at most.
fn blob_literal(b: &[u8]) -> String {
    const SHOWN: usize = 64;
    let hex: String = b.iter().take(SHOWN).map(|x| format!("{x:02x}")).collect();
    let more = if b.len() > SHOWN {
        crate::text::ELLIPSIS
    } else {
        ""
    };
    format!("x'{hex}{more}'")
}

fn read(r: &rusqlite::Row<'_>) -> rusqlite::Result<DeadLetter> {
    use rusqlite::types::ValueRef;
    // A producer may have stored any type in a text column.
    let as_text = |v: ValueRef<'_>| match v {
        ValueRef::Null => None,
        ValueRef::Text(t) => Some(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Integer(n) => Some(n.to_string()),
        ValueRef::Real(x) => Some(x.to_string()),
        ValueRef::Blob(b) => Some(String::from_utf8_lossy(b).into_owned()),
    };
    let event_id = match r.get_ref(1)? {
        ValueRef::Blob(b) => Some(blob_literal(b)),
        v => as_text(v),
    };
    Ok(DeadLetter {
        row_id: r.get(0)?,
        event_id,
        event_type: r
            .get::<_, String>(2)
            .unwrap_or_else(|_| "(not text)".into()),
        tenant_id: as_text(r.get_ref(3)?),
        attempts: r.get(4)?,
        reason: r.get(5)?,
        dead_at: r.get::<_, Option<i64>>(6)?.map(Timestamp::from_millis),
        payload: r.get(7).ok().flatten(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A dead letter is found by its event id in any letter case (a
    /// producer may write one in lower or mixed case), with one probe of
    /// the event-id index rather than a walk over every dead row.
    #[test]
    fn a_dead_letter_is_found_by_its_event_id_in_any_case_on_the_index() {
        let (_dir, conn) = crate::schema::test_db();
        conn.execute_batch(
            "INSERT INTO event_outbox (id, event_id, event_type, status, finished_at)
                  VALUES (3, '01jDq8F6zc1Y0d3w9N7k2M4p5R', 'a.b.v1', 'dead', 1),
                         (4, '01JDQ8F6ZC1Y0D3W9N7K2M4P5S', 'a.b.v1', 'delivered', 1);",
        )
        .unwrap();
        assert_eq!(resolve(&conn, "01JDQ8F6ZC1Y0D3W9N7K2M4P5R").unwrap(), 3);
        assert_eq!(resolve(&conn, "01jdq8f6zc1y0d3w9n7k2m4p5r").unwrap(), 3);
        // Not dead: not a dead letter.
        assert!(matches!(
            resolve(&conn, "01JDQ8F6ZC1Y0D3W9N7K2M4P5S"),
            Err(Error::NotFound { .. })
        ));
        let plan = crate::connection::query_plan(&conn, RESOLVE_EVENT_ID, ["X"]);
        assert!(
            plan.iter()
                .any(|l| l.contains("INDEX event_outbox_event_id")),
            "{plan:?}"
        );
    }
}
