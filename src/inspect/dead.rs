//! Pages of dead letters, newest first (their count is
//! [`crate::status::dead_count`]; the actions are [`crate::dead_letter`]'s).

use rusqlite::{params, Connection};

use super::{event_row, EventRow, PAGE, SCAN_BUDGET};
use crate::error::{Error, Result};
use crate::router::Pattern;

/// One page of dead letters, newest first.
#[derive(Debug, Clone, Default)]
pub struct DeadPage {
    /// The rows.
    pub rows: Vec<EventRow>,
    /// The key to go on from: (finished_at, id).
    pub next: Option<(i64, i64)>,
}

const SQL_DEAD_WALK: &str = concat!(
    "SELECT ",
    row_columns!(),
    ", substr(last_error, 1, 300) FROM event_outbox \
     WHERE status <> 'pending' AND status = 'dead' \
     AND (finished_at, id) < (?1, ?2) ORDER BY finished_at DESC, id DESC LIMIT ?3"
);

/// Dead letters after the key `after` (newest first), of types matching
/// `pattern`, within [`SCAN_BUDGET`].
pub fn dead_page(
    conn: &Connection,
    pattern: Option<&Pattern>,
    after: Option<(i64, i64)>,
) -> Result<DeadPage> {
    walk_dead(conn, pattern, after).map_err(Error::db("read a page of dead letters"))
}

fn walk_dead(
    conn: &Connection,
    pattern: Option<&Pattern>,
    after: Option<(i64, i64)>,
) -> rusqlite::Result<DeadPage> {
    let (at, id) = after.unwrap_or((i64::MAX, i64::MAX));
    let mut stmt = conn.prepare_cached(SQL_DEAD_WALK)?;
    let mut rows = stmt.query(params![at, id, SCAN_BUDGET as i64])?;
    let mut page = DeadPage::default();
    let (mut scanned, mut last) = (0, None);
    while let Some(r) = rows.next()? {
        let row = event_row(r)?;
        scanned += 1;
        last = Some((row.finished_at.unwrap_or(0), row.id));
        if pattern.is_none_or(|p| p.matches(&row.event_type)) {
            page.rows.push(row);
            if page.rows.len() == PAGE {
                break;
            }
        }
    }
    let walked_out = page.rows.len() < PAGE && scanned < SCAN_BUDGET;
    page.next = if walked_out { None } else { last };
    Ok(page)
}

#[cfg(test)]
pub(super) const STATEMENTS: [(&str, &str); 1] = [("dead walk", SQL_DEAD_WALK)];
