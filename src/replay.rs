//! Replay: deliver events again to one consumer, although it already had them.
//!
//! The consumer's entries in the dedup ledger are removed for the chosen
//! events and their rows go back to pending; the relay then runs that
//! consumer alone, because every other consumer still has its entry.
//! Events whose rows were purged cannot be replayed.
//!
//! ```
//! # fn main() -> outboxd::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let mut conn = outboxd::connection::open(dir.path().join("app.db"))?;
//! # outboxd::schema::migrate(&mut conn)?;
//! use outboxd::replay::{replay, ReplayFilter};
//! let filter = ReplayFilter { consumer: "indexer".into(), ..ReplayFilter::default() };
//! assert_eq!(replay(&mut conn, &filter, outboxd::Timestamp::now())?, 0);
//! # Ok(()) }
//! ```

use rusqlite::{params, Connection, TransactionBehavior};

use crate::clock::Timestamp;
use crate::envelope::EventId;
use crate::error::{Error, Result};
use crate::router::Pattern;

/// Rows replayed per transaction.
const BATCH: usize = 1000;

/// Which events to replay, to which consumer. Filters combine with AND; an
/// empty `ids` means any id.
#[derive(Debug, Clone, Default)]
pub struct ReplayFilter {
    /// The consumer to deliver to again.
    pub consumer: String,
    /// Only these event ids.
    pub ids: Vec<EventId>,
    /// Only event types matching this pattern.
    pub event_type: Option<Pattern>,
    /// Only events that occurred at or after this time.
    pub since: Option<Timestamp>,
    /// Only events that occurred before this time.
    pub until: Option<Timestamp>,
}

/// Replays the events the filter selects that were delivered to the
/// consumer. Returns how many rows were put back.
pub fn replay(conn: &mut Connection, filter: &ReplayFilter, now: Timestamp) -> Result<u64> {
    replay_with_progress(conn, filter, now, |_, _| {})
}

/// How many rows the filter selects now: what [`replay`] would put back,
/// less any row a relay holds leased when it runs (left to that relay). The
/// console shows it before replaying.
pub fn count(conn: &Connection, filter: &ReplayFilter) -> Result<u64> {
    crate::schema::ensure_current(conn)?;
    Ok(candidates(conn, filter)?.len() as u64)
}

/// [`replay`], calling `progress(done, total)` after each batch.
pub fn replay_with_progress(
    conn: &mut Connection,
    filter: &ReplayFilter,
    now: Timestamp,
    mut progress: impl FnMut(u64, u64),
) -> Result<u64> {
    crate::schema::ensure_current(conn)?;
    if filter.consumer.is_empty() {
        return Err(Error::InvalidSetting {
            field: "consumer",
            reason: "name the consumer to replay to".into(),
        });
    }
    let rows = candidates(conn, filter)?;
    let total = rows.len() as u64;
    let mut done = 0;
    for chunk in rows.chunks(BATCH) {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(Error::db("start a replay"))?;
        {
            let mut forget = tx
                .prepare_cached(
                    "DELETE FROM delivered_events WHERE event_key = ?1 AND consumer = ?2",
                )
                .map_err(Error::db("replay events"))?;
            // A leased row is left to its relay: replaying it mid-delivery
            // would race the lease.
            let mut reopen = tx
                .prepare_cached(
                    "UPDATE event_outbox
                        SET status = 'pending', attempts = 0, available_at = ?2, finished_at = NULL
                      WHERE id = ?1 AND claim_token IS NULL",
                )
                .map_err(Error::db("replay events"))?;
            for (row_id, key) in chunk {
                let reopened = reopen
                    .execute(params![row_id, now.as_millis()])
                    .map_err(Error::db("replay events"))?;
                if reopened == 1 {
                    forget
                        .execute(params![key, filter.consumer])
                        .map_err(Error::db("replay events"))?;
                    done += 1;
                }
            }
        }
        tx.commit().map_err(Error::db("commit a replay"))?;
        progress(done, total);
    }
    Ok(done)
}

/// (row id, event key) of each row delivered to the consumer that matches.
fn candidates(conn: &Connection, f: &ReplayFilter) -> Result<Vec<(i64, String)>> {
    let mut stmt = conn
        .prepare(
            "SELECT o.id, d.event_key, CAST(o.event_type AS TEXT)
               FROM delivered_events d JOIN event_outbox o ON o.id = d.outbox_id
              WHERE d.consumer = ?1
                AND (?2 IS NULL OR o.occurred_at >= ?2)
                AND (?3 IS NULL OR o.occurred_at < ?3)
              ORDER BY o.id",
        )
        .map_err(Error::db("select events to replay"))?;
    let ids: Vec<String> = f.ids.iter().map(|i| i.to_string()).collect();
    let rows = stmt
        .query_map(
            params![
                f.consumer,
                f.since.map(|t| t.as_millis()),
                f.until.map(|t| t.as_millis())
            ],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Option<String>>(2)?,
                ))
            },
        )
        .and_then(|r| r.collect::<rusqlite::Result<Vec<_>>>())
        .map_err(Error::db("select events to replay"))?;
    Ok(rows
        .into_iter()
        .filter(|(_, key, _)| ids.is_empty() || ids.contains(key))
        .filter(|(_, _, ty)| {
            f.event_type
                .as_ref()
                .is_none_or(|p| ty.as_deref().is_some_and(|t| p.matches(t)))
        })
        .map(|(id, key, _)| (id, key))
        .collect())
}
