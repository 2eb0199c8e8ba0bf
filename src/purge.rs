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

/// What to purge and when. Start from [`PurgePolicy::default`] and change
/// what differs:
///
/// ```
/// use outboxd::purge::PurgePolicy;
/// use std::time::Duration;
/// let policy = PurgePolicy::default()
///     .delivered_retention(Duration::from_secs(86_400))
///     .dead_retention(Some(Duration::from_secs(90 * 86_400)));
/// assert!(policy.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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
    /// How long delivered rows are kept after delivery.
    #[must_use]
    pub fn delivered_retention(mut self, d: Duration) -> Self {
        self.delivered_retention = d;
        self
    }

    /// How long dedup ledger entries are kept (at least as long as delivered rows).
    #[must_use]
    pub fn dedup_ttl(mut self, d: Duration) -> Self {
        self.dedup_ttl = d;
        self
    }

    /// How long dead letters are kept; None keeps them.
    #[must_use]
    pub fn dead_retention(mut self, d: Option<Duration>) -> Self {
        self.dead_retention = d;
        self
    }

    /// How long completed publish intents are kept.
    #[must_use]
    pub fn intent_retention(mut self, d: Duration) -> Self {
        self.intent_retention = d;
        self
    }

    /// Rows deleted per transaction.
    #[must_use]
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// Checks the settings. The error names the field (`purge.dedup_ttl`…).
    pub fn validate(&self) -> std::result::Result<(), SettingError> {
        if self.dedup_ttl < self.delivered_retention {
            return Err(SettingError::new(
                Setting::PurgeDedupTtl,
                format!(
                    "{} is shorter than purge.delivered_retention ({}); the dedup window must cover every kept row",
                    crate::text::duration(self.dedup_ttl),
                    crate::text::duration(self.delivered_retention)
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

/// Counts the rows of status ?1 finished before ?2.
const COUNT_FINISHED: &str = "SELECT count(*) FROM event_outbox
      WHERE status <> 'pending' AND status = ?1 AND finished_at < ?2";

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
    let limit = i64::try_from(policy.batch_size).unwrap_or(i64::MAX);
    let delete_rows = |status: &str, retention: Duration| -> Result<u64> {
        tx.prepare_cached(DELETE_FINISHED)
            .and_then(|mut s| s.execute(params![status, now.minus(retention).as_millis(), limit]))
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
    report.dedup_entries =
        crate::dedup::purge_batch(&tx, now.minus(policy.dedup_ttl), policy.batch_size)
            .map_err(Error::db("purge the dedup ledger"))?;
    report.intents = crate::intents::purge_completed_batch(
        &tx,
        now.minus(policy.intent_retention),
        policy.batch_size,
    )
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
    let finished = |status: &str, retention: Duration| -> Result<u64> {
        conn.query_row(
            COUNT_FINISHED,
            params![status, now.minus(retention).as_millis()],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n.max(0) as u64)
        .map_err(Error::db("count purgeable rows"))
    };
    Ok(PurgeReport {
        delivered: finished("delivered", policy.delivered_retention)?,
        dead: match policy.dead_retention {
            Some(r) => finished("dead", r)?,
            None => 0,
        },
        dedup_entries: crate::dedup::count_purgeable(
            conn,
            now.minus(policy.dedup_ttl),
            now.minus(policy.delivered_retention),
            policy.dead_retention.map(|r| now.minus(r)),
        )
        .map_err(Error::db("count purgeable rows"))?,
        intents: crate::intents::count_completed_before(conn, now.minus(policy.intent_retention))
            .map_err(Error::db("count purgeable rows"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (found by tests/library/model.rs): a purge deleted the ledger
    /// entry of a consumer that had succeeded for a row still waiting for
    /// another consumer's retry, so the retry ran that consumer again.
    #[test]
    fn the_ledger_of_a_pending_or_dead_row_outlives_its_ttl() {
        let (_dir, mut conn) = crate::schema::test_db();
        conn.execute_batch(
            "INSERT INTO event_outbox (id, event_id, event_type) VALUES (1, 'e1', 'a.b.v1');
             INSERT INTO event_outbox (id, event_id, event_type, status, finished_at)
                  VALUES (2, 'e2', 'a.b.v1', 'dead', 5), (3, 'e3', 'a.b.v1', 'delivered', 5);
             INSERT INTO delivered_events VALUES ('e1', 'a', 1, 5), ('e2', 'a', 2, 5),
                  ('e3', 'a', 3, 5), ('e4', 'a', 4, 5);",
        )
        .unwrap();
        let policy = PurgePolicy::default()
            .delivered_retention(Duration::from_secs(1))
            .dedup_ttl(Duration::from_secs(1));
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

    /// Regression (issue 11.1): an entry was purged by its own age alone
    /// once its row was delivered. A replay of another consumer refreshes
    /// the row's `finished_at`, so the row outlived the entry, and the next
    /// replay of the row ran the consumer whose entry was gone again. Now no
    /// entry goes while a row carrying its event is kept, in any status,
    /// and a dry run counts what the purge deletes.
    #[test]
    fn the_ledger_of_a_kept_row_is_never_purged_ahead_of_it() {
        let (_dir, mut conn) = crate::schema::test_db();
        let now = Timestamp::from_millis(1_000_000);
        conn.execute_batch(&format!(
            "INSERT INTO event_outbox (id, event_id, event_type, status, finished_at)
                  VALUES (1, 'E1', 'a.b.v1', 'delivered', {recent}),
                         (2, 'e2', 'a.b.v1', 'delivered', {recent}),
                         (3, 'E3', 'a.b.v1', 'delivered', 5);
             -- a delivered 1 long ago, b's replay just finished the row again;
             -- row 2 carries the event whose entry row 20 recorded (gone).
             INSERT INTO delivered_events VALUES ('E1', 'a', 1, 5), ('E1', 'b', 1, {recent}),
                  ('E2', 'a', 20, 5), ('E3', 'a', 3, 5);",
            recent = now.as_millis() - 100
        ))
        .unwrap();
        let policy = PurgePolicy::default()
            .delivered_retention(Duration::from_secs(1))
            .dedup_ttl(Duration::from_secs(1));
        let dry = purge_dry_run(&conn, &policy, now).unwrap();
        let report = purge(&mut conn, &policy, now).unwrap();
        assert_eq!(report, dry);
        assert_eq!(
            (report.delivered, report.dedup_entries),
            (1, 1),
            "row 3 and its entry"
        );
        let kept: Vec<(String, String)> = conn
            .prepare("SELECT event_key, consumer FROM delivered_events ORDER BY 1, 2")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let kept: Vec<(&str, &str)> = kept.iter().map(|(k, c)| (k.as_str(), c.as_str())).collect();
        assert_eq!(kept, [("E1", "a"), ("E1", "b"), ("E2", "a")]);
    }

    /// Regression: `now - retention` was computed as `now.as_millis() -
    /// retention.as_millis() as i64`, and a retention of `Duration::MAX`
    /// wrapped to -1 ms: the cutoff moved into the future and every delivered
    /// row and dedup entry was purged. A huge retention now means "keep".
    #[test]
    fn a_huge_retention_never_purges_a_delivered_row_or_its_ledger() {
        let (_dir, mut conn) = crate::schema::test_db();
        conn.execute_batch(
            "INSERT INTO event_outbox (id, event_id, event_type, status, finished_at)
                  VALUES (1, 'e1', 'a.b.v1', 'delivered', 5);
             INSERT INTO delivered_events VALUES ('e1', 'a', 1, 5);",
        )
        .unwrap();
        let now = Timestamp::from_millis(1_764_487_080_000);
        for huge in [
            Duration::MAX,
            Duration::from_secs(10_u64.pow(16)),
            Duration::from_secs(10_u64.pow(12)),
        ] {
            let policy = PurgePolicy::default()
                .delivered_retention(huge)
                .dedup_ttl(huge)
                .dead_retention(Some(huge))
                .intent_retention(huge);
            assert_eq!(
                purge_dry_run(&conn, &policy, now).unwrap().total(),
                0,
                "{huge:?}"
            );
            assert_eq!(
                purge(&mut conn, &policy, now).unwrap().total(),
                0,
                "{huge:?}"
            );
        }
        let left: i64 = conn
            .query_row(
                "SELECT (SELECT count(*) FROM event_outbox) + (SELECT count(*) FROM delivered_events)",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(left, 2);
        // The control: a short retention does purge them.
        let short = PurgePolicy::default()
            .delivered_retention(Duration::from_secs(1))
            .dedup_ttl(Duration::from_secs(1));
        assert_eq!(purge(&mut conn, &short, now).unwrap().total(), 2);
    }

    /// Regression: with `WHERE status = ?1` alone SQLite cannot use the
    /// partial index of finished rows and scans the whole table, inside the
    /// write transaction (5,000,000 delivered rows made the relay 7x slower).
    #[test]
    fn deleting_finished_rows_searches_the_finished_index() {
        let (_dir, conn) = crate::schema::test_db();
        let plan =
            crate::connection::query_plan(&conn, DELETE_FINISHED, params!["delivered", 0, 10]);
        assert!(
            plan.iter()
                .any(|l| l.contains("USING COVERING INDEX event_outbox_finished")),
            "{plan:?}"
        );
        assert!(!plan.iter().any(|l| l.starts_with("SCAN")), "{plan:?}");
    }
}
