//! Each consumer's retrying and dead events that it has not delivered.

use rusqlite::Connection;

use super::text;
use crate::dedup;
use crate::error::{Error, Result};
use crate::router::Subscriptions;

/// Rows examined at most per kind when counting each consumer's retrying
/// and dead events (a bound for a background measure, not a page).
pub const CONSUMER_SCAN: usize = 100_000;

const SQL_RETRYING_ROWS: &str = "SELECT id, event_id, event_type FROM event_outbox \
     WHERE status = 'pending' AND attempts > 0 LIMIT ?1";

const SQL_DEAD_ROWS: &str = "SELECT id, event_id, event_type FROM event_outbox \
     WHERE status <> 'pending' AND status = 'dead' LIMIT ?1";

/// Each consumer's retrying and dead events that it has not delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backlog {
    /// (retrying, dead) per consumer, in the order given.
    pub per_consumer: Vec<(u64, u64)>,
    /// True when [`CONSUMER_SCAN`] cut the count short.
    pub truncated: bool,
}

/// Counts each consumer's [`Backlog`], routing each row's type by the
/// library's router.
pub fn consumer_backlog(conn: &Connection, consumers: &Subscriptions) -> Result<Backlog> {
    count_backlog(conn, consumers).map_err(Error::db("count each consumer's backlog"))
}

fn count_backlog(conn: &Connection, consumers: &Subscriptions) -> rusqlite::Result<Backlog> {
    let mut counts = vec![(0u64, 0u64); consumers.len()];
    let mut truncated = false;
    for (sql, dead) in [(SQL_RETRYING_ROWS, false), (SQL_DEAD_ROWS, true)] {
        let mut stmt = conn.prepare_cached(sql)?;
        let mut rows = stmt.query([CONSUMER_SCAN as i64 + 1])?;
        let mut n = 0;
        while let Some(r) = rows.next()? {
            n += 1;
            if n > CONSUMER_SCAN {
                truncated = true;
                break;
            }
            let (id, event_id, ty): (i64, Option<String>, Option<String>) =
                (r.get(0)?, text(r, 1)?, text(r, 2)?);
            let ty = ty.unwrap_or_default();
            let key = dedup::key(event_id.as_deref(), id);
            for (i, sub) in consumers.iter().enumerate() {
                if sub.takes(&ty) && !dedup::has(conn, &key, &sub.name)? {
                    if dead {
                        counts[i].1 += 1;
                    } else {
                        counts[i].0 += 1;
                    }
                }
            }
        }
    }
    Ok(Backlog {
        per_consumer: counts,
        truncated,
    })
}

#[cfg(test)]
pub(super) const STATEMENTS: [(&str, &str); 2] = [
    ("retrying rows", SQL_RETRYING_ROWS),
    ("dead rows", SQL_DEAD_ROWS),
];
