//! TTL purge of finished rows, in small batches so producers are never
//! blocked for long.
//!
//! ```
//! # fn main() -> outboxd::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let mut conn = outboxd::connection::open(dir.path().join("app.db"))?;
//! # outboxd::schema::migrate(&mut conn)?;
//! use outboxd::purge::{purge, PurgePolicy};
//! let report = purge(&mut conn, &PurgePolicy::default(), outboxd::Timestamp::now())?;
//! assert_eq!(report.total(), 0);
//! # Ok(()) }
//! ```

use std::time::Duration;

use rusqlite::{params, Connection, TransactionBehavior};

use crate::clock::Timestamp;
use crate::error::{Error, Result, Setting, SettingError};

/// How long delivered rows are kept by default: 7 days.
pub const DEFAULT_DELIVERED_RETENTION: Duration = Duration::from_secs(7 * 86400);
/// How long the dedup ledger remembers a delivery by default: 14 days.
pub const DEFAULT_DEDUP_TTL: Duration = Duration::from_secs(14 * 86400);
/// Rows deleted per transaction by default.
pub const DEFAULT_PURGE_BATCH: usize = 1000;
/// The largest [`PurgePolicy::batch_size`].
pub const MAX_PURGE_BATCH: usize = 100_000;
/// How long completed publish intents are kept by default: 30 days. After
/// that only the send's look-up stops a second post, so keep it longer than
/// any redelivery of the events that send.
pub const DEFAULT_INTENT_RETENTION: Duration = Duration::from_secs(30 * 86400);

/// What to purge and when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgePolicy {
    /// Delivered rows older than this (since delivery) are deleted.
    pub delivered_retention: Duration,
    /// `delivered_events` entries older than this are deleted, except those
    /// of rows still pending or dead (they are those rows' progress); never shorter
    /// than `delivered_retention`, or a retried duplicate could be delivered
    /// again while its first row is still kept.
    pub dedup_ttl: Duration,
    /// Dead letters older than this are deleted; None keeps them until they
    /// are requeued or discarded.
    pub dead_retention: Option<Duration>,
    /// Completed publish intents older than this are deleted.
    pub intent_retention: Duration,
    /// Rows deleted per transaction.
    pub batch_size: usize,
}

impl Default for PurgePolicy {
    fn default() -> Self {
        PurgePolicy {
            delivered_retention: DEFAULT_DELIVERED_RETENTION,
            dedup_ttl: DEFAULT_DEDUP_TTL,
            dead_retention: None,
            intent_retention: DEFAULT_INTENT_RETENTION,
            batch_size: DEFAULT_PURGE_BATCH,
        }
    }
}

impl PurgePolicy {
    /// Checks the settings. The error names the field (`purge.dedup_ttl`…).
    pub fn validate(&self) -> std::result::Result<(), SettingError> {
        if self.dedup_ttl < self.delivered_retention {
            return Err(SettingError::new(
                Setting::PurgeDedupTtl,
                format!(
                    "{:?} is shorter than purge.delivered_retention ({:?}); the dedup window must cover every kept row",
                    self.dedup_ttl, self.delivered_retention
                ),
            ));
        }
        if self.batch_size == 0 || self.batch_size > MAX_PURGE_BATCH {
            return Err(SettingError::new(
                Setting::PurgeBatchSize,
                format!(
                    "{} is out of range; allowed: 1 to {MAX_PURGE_BATCH}",
                    self.batch_size
                ),
            ));
        }
        Ok(())
    }
}

/// Rows deleted (or, for a dry run, that would be).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PurgeReport {
    /// Delivered rows of event_outbox.
    pub delivered: u64,
    /// Dead rows of event_outbox.
    pub dead: u64,
    /// Entries of delivered_events.
    pub dedup_entries: u64,
    /// Completed publish intents.
    pub intents: u64,
}

impl PurgeReport {
    /// All rows together.
    pub fn total(&self) -> u64 {
        self.delivered + self.dead + self.dedup_entries + self.intents
    }

    fn add(&mut self, other: PurgeReport) {
        self.delivered += other.delivered;
        self.dead += other.dead;
        self.dedup_entries += other.dedup_entries;
        self.intents += other.intents;
    }
}

/// Purges everything past its retention, one batch per transaction, until
/// nothing is left. Pending rows are never touched.
pub fn purge(conn: &mut Connection, policy: &PurgePolicy, now: Timestamp) -> Result<PurgeReport> {
    purge_with_progress(conn, policy, now, |_| {})
}

/// [`purge`], calling `progress` with the running totals after each batch.
pub fn purge_with_progress(
    conn: &mut Connection,
    policy: &PurgePolicy,
    now: Timestamp,
    mut progress: impl FnMut(&PurgeReport),
) -> Result<PurgeReport> {
    policy.validate()?;
    let mut total = PurgeReport::default();
    loop {
        let batch = purge_batch(conn, policy, now)?;
        total.add(batch);
        progress(&total);
        if batch.total() == 0 {
            return Ok(total);
        }
    }
}

/// Deletes up to ?3 rows of status ?1 finished before ?2.
const DELETE_FINISHED: &str = "DELETE FROM event_outbox WHERE id IN (
     SELECT id FROM event_outbox
      WHERE status <> 'pending' AND status = ?1 AND finished_at < ?2 LIMIT ?3)";

/// The condition on a `delivered_events d` entry that its row is not
/// still pending or dead.
const UNFINISHED_ROW_GONE: &str = "NOT EXISTS (SELECT 1 FROM event_outbox o
      WHERE o.id = d.outbox_id AND o.status <> 'delivered')";

/// One bounded transaction: at most `batch_size` rows of each kind. The
/// relay calls this from its housekeeping tick.
///
/// The queries on finished rows repeat the `status <> 'pending'` of the
/// partial index `event_outbox_finished`: SQLite uses a partial index only
/// when the query's own terms imply its WHERE, and without it they scan the
/// whole table.
pub fn purge_batch(
    conn: &mut Connection,
    policy: &PurgePolicy,
    now: Timestamp,
) -> Result<PurgeReport> {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(Error::db("start a purge"))?;
    let limit = policy.batch_size as i64;
    let delete_rows = |status: &str, retention: Duration| -> Result<u64> {
        let cutoff = now.as_millis() - retention.as_millis() as i64;
        tx.prepare_cached(DELETE_FINISHED)
            .and_then(|mut s| s.execute(params![status, cutoff, limit]))
            .map(|n| n as u64)
            .map_err(Error::db("purge finished events"))
    };
    let mut report = PurgeReport {
        delivered: delete_rows("delivered", policy.delivered_retention)?,
        ..PurgeReport::default()
    };
    if let Some(r) = policy.dead_retention {
        report.dead = delete_rows("dead", r)?;
    }
    let cutoff = now.as_millis() - policy.dedup_ttl.as_millis() as i64;
    // An entry is also the progress of its row: while the row is pending
    // (a retry may be due) or dead (it may be requeued), deleting it would
    // run a consumer that already succeeded again.
    report.dedup_entries = tx
        .prepare_cached(&format!(
            "DELETE FROM delivered_events WHERE (event_key, consumer) IN (
                 SELECT event_key, consumer FROM delivered_events d
                  WHERE delivered_at < ?1 AND {UNFINISHED_ROW_GONE} LIMIT ?2)"
        ))
        .and_then(|mut s| s.execute(params![cutoff, limit]))
        .map_err(Error::db("purge the dedup ledger"))? as u64;
    let cutoff =
        Timestamp::from_millis(now.as_millis() - policy.intent_retention.as_millis() as i64);
    report.intents = crate::intents::purge_completed_batch(&tx, cutoff, policy.batch_size)
        .map_err(Error::db("purge completed intents"))? as u64;
    tx.commit().map_err(Error::db("commit a purge"))?;
    Ok(report)
}

/// What [`purge`] would delete, counted without deleting.
pub fn purge_dry_run(
    conn: &Connection,
    policy: &PurgePolicy,
    now: Timestamp,
) -> Result<PurgeReport> {
    policy.validate()?;
    let count = |sql: &str, cutoff: i64| -> Result<u64> {
        conn.query_row(sql, [cutoff], |r| r.get::<_, i64>(0))
            .map(|n| n as u64)
            .map_err(Error::db("count purgeable rows"))
    };
    let ms = |d: Duration| now.as_millis() - d.as_millis() as i64;
    Ok(PurgeReport {
        delivered: count(
            "SELECT count(*) FROM event_outbox
              WHERE status <> 'pending' AND status = 'delivered' AND finished_at < ?1",
            ms(policy.delivered_retention),
        )?,
        dead: match policy.dead_retention {
            Some(r) => count(
                "SELECT count(*) FROM event_outbox
                  WHERE status <> 'pending' AND status = 'dead' AND finished_at < ?1",
                ms(r),
            )?,
            None => 0,
        },
        dedup_entries: count(
            &format!(
                "SELECT count(*) FROM delivered_events d
                  WHERE delivered_at < ?1 AND {UNFINISHED_ROW_GONE}"
            ),
            ms(policy.dedup_ttl),
        )?,
        intents: count(
            "SELECT count(*) FROM publish_intents WHERE status = 'completed' AND completed_at < ?1",
            ms(policy.intent_retention),
        )?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (found by tests/model.rs): a purge deleted the ledger
    /// entry of a consumer that had succeeded for a row still waiting for
    /// another consumer's retry, so the retry ran that consumer again.
    #[test]
    fn the_ledger_of_a_pending_or_dead_row_outlives_its_ttl() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = crate::connection::open(dir.path().join("a.db")).unwrap();
        crate::schema::migrate(&mut conn).unwrap();
        conn.execute_batch(
            "INSERT INTO event_outbox (id, event_id, event_type) VALUES (1, 'e1', 'a.b.v1');
             INSERT INTO event_outbox (id, event_id, event_type, status, finished_at)
                  VALUES (2, 'e2', 'a.b.v1', 'dead', 5), (3, 'e3', 'a.b.v1', 'delivered', 5);
             INSERT INTO delivered_events VALUES ('e1', 'a', 1, 5), ('e2', 'a', 2, 5),
                  ('e3', 'a', 3, 5), ('e4', 'a', 4, 5);",
        )
        .unwrap();
        let policy = PurgePolicy {
            delivered_retention: Duration::from_secs(1),
            dedup_ttl: Duration::from_secs(1),
            ..PurgePolicy::default()
        };
        let now = Timestamp::from_millis(1_000_000);
        let dry = purge_dry_run(&conn, &policy, now).unwrap();
        let report = purge(&mut conn, &policy, now).unwrap();
        assert_eq!(report, dry);
        // Row 3's entry goes with row 3; row 4 is long gone.
        assert_eq!((report.delivered, report.dedup_entries), (1, 2));
        let kept: Vec<String> = conn
            .prepare("SELECT event_key FROM delivered_events ORDER BY 1")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(
            kept,
            ["e1", "e2"],
            "the pending and the dead row keep theirs"
        );
    }

    /// Regression: with `WHERE status = ?1` alone SQLite cannot use the
    /// partial index of finished rows and scans the whole table, inside the
    /// write transaction (5,000,000 delivered rows made the relay 7x slower).
    #[test]
    fn deleting_finished_rows_searches_the_finished_index() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = crate::connection::open(dir.path().join("p.db")).unwrap();
        crate::schema::migrate(&mut conn).unwrap();
        let plan: Vec<String> = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {DELETE_FINISHED}"))
            .unwrap()
            .query_map(params!["delivered", 0, 10], |r| r.get(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert!(
            plan.iter()
                .any(|l| l.contains("USING COVERING INDEX event_outbox_finished")),
            "{plan:?}"
        );
        assert!(!plan.iter().any(|l| l.starts_with("SCAN")), "{plan:?}");
    }
}
