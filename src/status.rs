//! A read-only snapshot of the outbox: how many events wait, how old the
//! oldest due one is, who holds leases, what each consumer has delivered.
//!
//! Works on a read-only connection ([`connection::open_read_only`]), so an
//! operator can inspect a file they may not write. The staleness measure is
//! the age of the oldest *due* event, not queue depth: events delayed on
//! purpose do not make the outbox look stuck.
//!
//! ```
//! # fn main() -> outboxd::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! use outboxd::{enqueue, Event, Timestamp};
//! let mut conn = outboxd::connection::open(dir.path().join("app.db"))?;
//! outboxd::schema::migrate(&mut conn)?;
//! let tx = conn.transaction().unwrap();
//! enqueue(&tx, &Event::new("article.created.v1", &7)?)?;
//! tx.commit().unwrap();
//!
//! let later = Timestamp::now().plus(std::time::Duration::from_secs(60));
//! let status = outboxd::status::status(&conn, later)?;
//! assert_eq!(status.counts.pending_due, 1);
//! assert!(status.oldest_due_age.unwrap() >= std::time::Duration::from_secs(60));
//! # Ok(()) }
//! ```
//!
//! [`connection::open_read_only`]: crate::connection::open_read_only

use std::collections::BTreeMap;
use std::time::Duration;

use rusqlite::{params, Connection};
use serde::{Serialize, Serializer};

use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::schema;

/// The state of the outbox at one moment. Serializes to JSON with
/// `oldest_due_age_ms` in milliseconds (null when nothing is due).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Status {
    /// The outboxd schema version of the database.
    pub schema_version: u32,
    /// The time the snapshot was measured against.
    pub now: Timestamp,
    /// Rows of `event_outbox` by state.
    pub counts: StatusCounts,
    /// How long the oldest due row (pending, `available_at <= now`) has been
    /// due; None when no row is due. A row whose lease expired counts, since
    /// it is due to be claimed again.
    #[serde(rename = "oldest_due_age_ms", serialize_with = "millis")]
    pub oldest_due_age: Option<Duration>,
    /// Leases still live (`lease_until > now`).
    pub leases_held: u64,
    /// Leases past their `lease_until`: a relay that claimed these rows has
    /// stopped or stalled, and another claim will take them over.
    pub expired_leases: u64,
    /// Rows of `delivered_events` per consumer name, in name order.
    pub delivered_by_consumer: BTreeMap<String, u64>,
}

/// How many `event_outbox` rows are in each state. The pending rows are split
/// three ways without overlap: `pending_due + pending_delayed + leased`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct StatusCounts {
    /// Pending, not leased, and `available_at <= now`: waiting for a relay.
    pub pending_due: u64,
    /// Pending, not leased, and `available_at > now`: delayed on purpose or
    /// waiting for a retry.
    pub pending_delayed: u64,
    /// Pending and claimed by a relay (a claim token is set), whether the
    /// lease is live or expired.
    pub leased: u64,
    /// Delivered to every consumer.
    pub delivered: u64,
    /// Dead-lettered.
    pub dead: u64,
}

/// Measures the outbox at `now`. Reads only, in one read transaction when
/// the connection is in autocommit mode (otherwise inside the caller's).
///
/// Fails with [`Error::NotMigrated`], [`Error::SchemaOutdated`] or
/// [`Error::SchemaTooNew`] unless the schema is current, before reading any
/// of outboxd's tables.
pub fn status(conn: &Connection, now: Timestamp) -> Result<Status> {
    schema::ensure_current(conn)?;
    // A read transaction makes the numbers one consistent snapshot.
    let tx = if conn.is_autocommit() {
        Some(
            conn.unchecked_transaction()
                .map_err(Error::db("start a read transaction"))?,
        )
    } else {
        None
    };
    let schema_version = schema::version(conn)?.unwrap_or(0);
    let now_ms = now.as_millis();

    let (pending_due, pending_delayed, leased, leases_held, expired_leases) = conn
        .query_row(
            "SELECT
                 coalesce(sum(claim_token IS NULL AND available_at <= ?1), 0),
                 coalesce(sum(claim_token IS NULL AND available_at > ?1), 0),
                 coalesce(sum(claim_token IS NOT NULL), 0),
                 coalesce(sum(claim_token IS NOT NULL AND lease_until > ?1), 0),
                 coalesce(sum(claim_token IS NOT NULL AND lease_until <= ?1), 0)
             FROM event_outbox WHERE status = 'pending'",
            params![now_ms],
            |r| {
                Ok((
                    count(r, 0)?,
                    count(r, 1)?,
                    count(r, 2)?,
                    count(r, 3)?,
                    count(r, 4)?,
                ))
            },
        )
        .map_err(Error::db("count pending events"))?;

    let mut counts = StatusCounts {
        pending_due,
        pending_delayed,
        leased,
        ..StatusCounts::default()
    };
    {
        // Served by the partial index on finished rows.
        let mut stmt = conn
            .prepare(
                "SELECT status, count(*) FROM event_outbox
                 WHERE status <> 'pending' GROUP BY status",
            )
            .map_err(Error::db("count finished events"))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, count(r, 1)?)))
            .map_err(Error::db("count finished events"))?;
        for row in rows {
            match row.map_err(Error::db("count finished events"))? {
                (s, n) if s == "delivered" => counts.delivered = n,
                (s, n) if s == "dead" => counts.dead = n,
                _ => {} // the CHECK constraint allows no other status
            }
        }
    }

    let oldest_due_age = oldest_due(conn, now)?.map(|at| now.since(at));
    let delivered_by_consumer = crate::dedup::count_by_consumer(conn)
        .map_err(Error::db("count deliveries per consumer"))?;

    if let Some(tx) = tx {
        tx.finish().map_err(Error::db("end the read transaction"))?;
    }
    Ok(Status {
        schema_version,
        now,
        counts,
        oldest_due_age,
        leases_held,
        expired_leases,
        delivered_by_consumer,
    })
}

/// The due time of the oldest due event (pending, `available_at <= now`),
/// None when nothing is due: the measure of a stuck relay, since events
/// delayed on purpose are not due. A row whose lease expired counts, since
/// it is due to be claimed again. One seek on the due index, however long
/// the queue. [`status`], the relay's stale check and `outboxd doctor` all
/// measure staleness with it.
pub fn oldest_due(conn: &Connection, now: Timestamp) -> Result<Option<Timestamp>> {
    conn.prepare_cached(
        "SELECT min(available_at) FROM event_outbox
         WHERE status = 'pending' AND available_at <= ?1",
    )
    .and_then(|mut s| s.query_row([now.as_millis()], |r| r.get::<_, Option<i64>>(0)))
    .map(|t| t.map(Timestamp::from_millis))
    .map_err(Error::db("find the oldest due event"))
}

/// The most stale events [`stale_count`] counts: beyond it the exact number
/// does not matter, and counting a huge backlog would hold a read open.
pub const STALE_COUNT_BOUND: u64 = 1_000_000;

/// How many due events have waited longer than `after` (up to
/// [`STALE_COUNT_BOUND`]).
pub fn stale_count(conn: &Connection, now: Timestamp, after: Duration) -> Result<u64> {
    conn.prepare_cached(
        "SELECT count(*) FROM (SELECT 1 FROM event_outbox
          WHERE status = 'pending' AND available_at <= ?1 LIMIT ?2)",
    )
    .and_then(|mut s| {
        s.query_row(
            params![now.minus(after).as_millis(), STALE_COUNT_BOUND as i64],
            |r| r.get::<_, i64>(0),
        )
    })
    .map(|n| n.max(0) as u64)
    .map_err(Error::db("count stale events"))
}

/// The limits a monitor alerts on: `outboxd status` exits 1 when one is
/// crossed, and the relay logs a stale alert.
///
/// ```
/// use outboxd::status::Thresholds;
/// use std::time::Duration;
/// let t = Thresholds::new(Duration::from_secs(60), Some(10));
/// assert_eq!(t.max_dead, Some(10));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Thresholds {
    /// Unhealthy when the oldest due event has waited longer than this.
    pub stale_after: Duration,
    /// Unhealthy when there are more dead letters than this; None: no limit.
    pub max_dead: Option<u64>,
}

impl Thresholds {
    /// Thresholds with these limits.
    pub fn new(stale_after: Duration, max_dead: Option<u64>) -> Thresholds {
        Thresholds {
            stale_after,
            max_dead,
        }
    }
}

impl Default for Thresholds {
    /// The relay's stale threshold ([`DEFAULT_STALE_AFTER`](crate::relay::DEFAULT_STALE_AFTER)), no dead-letter limit.
    fn default() -> Self {
        Thresholds::new(crate::relay::DEFAULT_STALE_AFTER, None)
    }
}

/// A threshold a [`Status`] crosses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// The oldest due event has waited longer than `stale_after`.
    Stale {
        /// How long it has waited.
        oldest_due_age: Duration,
        /// The threshold.
        stale_after: Duration,
    },
    /// More dead letters than `max_dead`.
    TooManyDead {
        /// How many there are.
        dead: u64,
        /// The threshold.
        max_dead: u64,
    },
}

impl Status {
    /// The thresholds this snapshot crosses, stale first; empty when healthy.
    ///
    /// ```
    /// # fn main() -> outboxd::Result<()> {
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let mut conn = outboxd::connection::open(dir.path().join("app.db"))?;
    /// # outboxd::schema::migrate(&mut conn)?;
    /// use outboxd::status::{status, Thresholds};
    /// let s = status(&conn, outboxd::Timestamp::now())?;
    /// assert!(s.problems(&Thresholds::default()).is_empty());
    /// # Ok(()) }
    /// ```
    pub fn problems(&self, t: &Thresholds) -> Vec<Problem> {
        let mut found = Vec::new();
        if let Some(age) = self.oldest_due_age.filter(|age| *age > t.stale_after) {
            found.push(Problem::Stale {
                oldest_due_age: age,
                stale_after: t.stale_after,
            });
        }
        if let Some(max) = t.max_dead.filter(|max| self.counts.dead > *max) {
            found.push(Problem::TooManyDead {
                dead: self.counts.dead,
                max_dead: max,
            });
        }
        found
    }
}

/// Reads a count(*) or sum() column; SQLite never returns a negative one.
fn count(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<u64> {
    Ok(u64::try_from(r.get::<_, i64>(i)?).unwrap_or(0))
}

fn millis<S: Serializer>(d: &Option<Duration>, s: S) -> std::result::Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection;
    use crate::enqueue::{Enqueuer, Event};

    const T0: i64 = 1_764_487_080_000;

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(T0 + ms)
    }

    fn migrated() -> (tempfile::TempDir, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = connection::open(dir.path().join("s.db")).unwrap();
        schema::migrate(&mut conn).unwrap();
        (dir, conn)
    }

    /// Inserts a row directly, in the state the relay would leave it.
    fn row(conn: &Connection, status: &str, available_at: i64, lease_until: Option<i64>) {
        conn.execute(
            "INSERT INTO event_outbox (event_type, status, available_at, claim_token,
                 lease_until, finished_at)
             VALUES ('article.created.v1', ?1, ?2, ?3, ?4, ?5)",
            params![
                status,
                T0 + available_at,
                lease_until.map(|_| "token"),
                lease_until.map(|l| T0 + l),
                (status != "pending").then_some(T0),
            ],
        )
        .unwrap();
    }

    #[test]
    fn empty_outbox() {
        let (_dir, conn) = migrated();
        let s = status(&conn, at(0)).unwrap();
        assert_eq!(s.schema_version, schema::LATEST_VERSION);
        assert_eq!(s.counts, StatusCounts::default());
        assert_eq!(s.oldest_due_age, None);
        assert_eq!((s.leases_held, s.expired_leases), (0, 0));
        assert!(s.delivered_by_consumer.is_empty());
    }

    #[test]
    fn counts_every_state_without_overlap() {
        let (_dir, conn) = migrated();
        row(&conn, "pending", -5_000, None); // due for 5 s
        row(&conn, "pending", -1_000, None); // due for 1 s
        row(&conn, "pending", 0, None); // due exactly now
        row(&conn, "pending", 60_000, None); // delayed
        row(&conn, "pending", 30_000, Some(30_000)); // live lease
        row(&conn, "pending", -2_000, Some(-2_000)); // expired lease
        row(&conn, "delivered", -9_000, None);
        row(&conn, "delivered", -9_000, None);
        row(&conn, "dead", -9_000, None);

        let s = status(&conn, at(0)).unwrap();
        assert_eq!(
            s.counts,
            StatusCounts {
                pending_due: 3,
                pending_delayed: 1,
                leased: 2,
                delivered: 2,
                dead: 1,
            }
        );
        assert_eq!(s.leases_held, 1);
        assert_eq!(s.expired_leases, 1);
        // Delivered and dead rows are not due, however old.
        assert_eq!(s.oldest_due_age, Some(Duration::from_secs(5)));
    }

    #[test]
    fn problems_are_the_thresholds_crossed() {
        let (_dir, conn) = migrated();
        row(&conn, "pending", -120_000, None); // due for 2 min
        row(&conn, "pending", -10_000, None);
        row(&conn, "dead", -9_000, None);
        row(&conn, "dead", -9_000, None);
        let s = status(&conn, at(0)).unwrap();
        let minute = Duration::from_secs(60);
        assert_eq!(
            s.problems(&Thresholds::new(minute, Some(1))),
            [
                Problem::Stale {
                    oldest_due_age: Duration::from_secs(120),
                    stale_after: minute
                },
                Problem::TooManyDead {
                    dead: 2,
                    max_dead: 1
                }
            ]
        );
        assert!(s
            .problems(&Thresholds::new(Duration::from_secs(120), Some(2)))
            .is_empty());
        assert!(s.problems(&Thresholds::new(Duration::MAX, None)).is_empty());
        assert_eq!(stale_count(&conn, at(0), minute).unwrap(), 1);
        assert_eq!(
            stale_count(&conn, at(0), Duration::from_secs(1)).unwrap(),
            2
        );
        assert_eq!(stale_count(&conn, at(0), Duration::MAX).unwrap(), 0);
        assert_eq!(oldest_due(&conn, at(0)).unwrap(), Some(at(-120_000)));
    }

    #[test]
    fn delayed_events_do_not_count_as_stale() {
        let (_dir, conn) = migrated();
        row(&conn, "pending", 3_600_000, None);
        let s = status(&conn, at(0)).unwrap();
        assert_eq!(s.counts.pending_delayed, 1);
        assert_eq!(s.oldest_due_age, None);
        // Once its time comes it is due, and ages from then.
        let s = status(&conn, at(3_600_000 + 250)).unwrap();
        assert_eq!(s.counts.pending_due, 1);
        assert_eq!(s.oldest_due_age, Some(Duration::from_millis(250)));
    }

    #[test]
    fn counts_deliveries_per_consumer() {
        let (_dir, conn) = migrated();
        for (key, consumer) in [("a", "webhook"), ("b", "webhook"), ("a", "audit")] {
            conn.execute(
                "INSERT INTO delivered_events (event_key, consumer, outbox_id, delivered_at)
                 VALUES (?1, ?2, 1, ?3)",
                params![key, consumer, T0],
            )
            .unwrap();
        }
        let s = status(&conn, at(0)).unwrap();
        let got: Vec<(&str, u64)> = s
            .delivered_by_consumer
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        assert_eq!(got, [("audit", 1), ("webhook", 2)]);
    }

    #[test]
    fn sees_events_enqueued_through_the_library() {
        let (_dir, mut conn) = migrated();
        let tx = conn.transaction().unwrap();
        let e = Event::new("article.created.v1", &1).unwrap();
        Enqueuer::new().enqueue(&tx, &e).unwrap();
        let delayed = Event::new("article.created.v1", &2)
            .unwrap()
            .delay(Duration::from_secs(3600));
        Enqueuer::new().enqueue(&tx, &delayed).unwrap();
        // Inside the caller's transaction the uncommitted rows are visible.
        let s = status(&tx, Timestamp::now()).unwrap();
        assert_eq!((s.counts.pending_due, s.counts.pending_delayed), (1, 1));
        tx.commit().unwrap();
        assert!(conn.is_autocommit());
        status(&conn, Timestamp::now()).unwrap();
        assert!(conn.is_autocommit(), "the read transaction is ended");
    }

    #[test]
    fn json_shape() {
        let (_dir, conn) = migrated();
        row(&conn, "pending", -1_500, None);
        let v = serde_json::to_value(status(&conn, at(0)).unwrap()).unwrap();
        assert_eq!(v["oldest_due_age_ms"], 1500);
        assert_eq!(v["counts"]["pending_due"], 1);
        assert_eq!(v["now"], at(0).to_string());
        assert!(v["delivered_by_consumer"].is_object());
        let v = serde_json::to_value(status(&conn, at(-10_000)).unwrap()).unwrap();
        assert!(v["oldest_due_age_ms"].is_null());
    }

    #[test]
    fn refuses_an_unmigrated_database() {
        let dir = tempfile::tempdir().unwrap();
        let conn = connection::open(dir.path().join("host.db")).unwrap();
        conn.execute_batch("CREATE TABLE articles (id INTEGER PRIMARY KEY)")
            .unwrap();
        let e = status(&conn, at(0)).unwrap_err();
        assert!(matches!(e, Error::NotMigrated), "{e}");
        assert!(e.to_string().contains("outboxd migrate"), "{e}");
    }

    #[test]
    fn refuses_a_newer_schema() {
        let (_dir, conn) = migrated();
        conn.execute(
            "INSERT INTO outboxd_schema (version, name, applied_at) VALUES (999, 'future', 0)",
            [],
        )
        .unwrap();
        let e = status(&conn, at(0)).unwrap_err();
        assert!(matches!(e, Error::SchemaTooNew { found: 999, .. }), "{e}");
    }
}
