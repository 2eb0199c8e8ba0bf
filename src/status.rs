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

use rusqlite::Connection;
use serde::{Serialize, Serializer};

use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::health::count_column as count;
use crate::schema;
// The 0.1 paths of what moved to `crate::health` and `crate::limits`.
pub use crate::health::{
    dead_count, oldest_due, stale_count, Problem, Thresholds, IMPLAUSIBLE_DELAY, STALE_COUNT_BOUND,
};
pub use crate::limits::CLOCK_STEP_SLACK;

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
    /// How long ago the oldest undelivered event was created (`created_at`),
    /// counting rows that are due, claimed, or waiting for a retry, but not
    /// rows delayed on purpose and never tried; None when there is none.
    /// Events waiting for a retry are not due, so only this age shows a
    /// consumer that keeps failing ([`Problem::Undelivered`]).
    #[serde(rename = "oldest_undelivered_age_ms", serialize_with = "millis")]
    pub oldest_undelivered_age: Option<Duration>,
    /// Leases still live (`lease_until > now`).
    pub leases_held: u64,
    /// Leases past their `lease_until`: a relay that claimed these rows has
    /// stopped or stalled, and another claim will take them over.
    pub expired_leases: u64,
    /// Rows of `delivered_events` per consumer name, in name order.
    pub delivered_by_consumer: BTreeMap<String, u64>,
    /// How far ahead the furthest live lease ends; None without one. A
    /// lease ending further ahead than any relay's lease setting could set
    /// it means the system clock stepped back since
    /// ([`Problem::ClockStep`]).
    #[serde(rename = "furthest_lease_ms", serialize_with = "millis")]
    pub furthest_lease: Option<Duration>,
    /// How far ahead the furthest scheduled retry is due (a pending row
    /// that failed before, not leased); None without one. Further ahead
    /// than any retry policy could schedule means a clock step.
    #[serde(rename = "furthest_retry_ms", serialize_with = "millis")]
    pub furthest_retry: Option<Duration>,
    /// Events delayed (never attempted, not leased) by more than
    /// [`IMPLAUSIBLE_DELAY`]: most likely an `available_at` written in
    /// another unit than milliseconds ([`Problem::ImplausibleDelay`]).
    pub implausible_delays: u64,
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
    let tx = crate::health::read_transaction(conn)?;
    let schema_version = schema::version(conn)?.unwrap_or(0);

    let pending = crate::health::pending(conn, now)?;

    let mut counts = StatusCounts {
        pending_due: pending.due,
        pending_delayed: pending.delayed,
        leased: pending.leased,
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
    let oldest_undelivered_age = pending.oldest_undelivered.map(|at| now.since(at));
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
        oldest_undelivered_age,
        leases_held: pending.live,
        expired_leases: pending.expired,
        delivered_by_consumer,
        furthest_lease: pending.furthest_lease,
        furthest_retry: pending.furthest_retry,
        implausible_delays: pending.implausible_delays,
    })
}

impl Status {
    /// The thresholds this snapshot crosses (stale, undelivered, dead
    /// letters, a clock step, implausible delays, in that order); empty when healthy. The
    /// whole verdict, captures included, is [`crate::health::check`]'s.
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
        crate::health::problems(
            &crate::health::Measures {
                oldest_due_age: self.oldest_due_age,
                oldest_undelivered_age: self.oldest_undelivered_age,
                dead: self.counts.dead,
                furthest_lease: self.furthest_lease,
                furthest_retry: self.furthest_retry,
                implausible_delays: self.implausible_delays,
            },
            t,
        )
    }
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
    use rusqlite::params;

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
        assert_eq!(dead_count(&conn).unwrap(), 1, "the alert's count agrees");
        // Delivered and dead rows are not due, however old.
        assert_eq!(s.oldest_due_age, Some(Duration::from_secs(5)));
    }

    #[test]
    fn the_dead_count_reads_an_index_range_not_the_table() {
        let (_dir, conn) = migrated();
        let plan: String = conn
            .query_row(
                &format!("EXPLAIN QUERY PLAN {}", crate::health::DEAD_COUNT),
                [],
                |r| r.get(3),
            )
            .unwrap();
        assert!(
            plan.contains("USING COVERING INDEX event_outbox_finished"),
            "{plan}"
        );
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

    /// Issues 11.8 and 11.9: a 30-second lease ending an hour away, a retry
    /// due further ahead than any policy could schedule (the clock stepped
    /// back), and an event delayed 50,000 years (microseconds written as
    /// milliseconds) were all reported healthy.
    #[test]
    fn a_clock_step_and_an_implausible_delay_are_problems() {
        let (_dir, conn) = migrated();
        let hour = 3_600_000;
        row(&conn, "pending", hour + 30_000, Some(hour + 30_000)); // a lease, stepped
        conn.execute(
            "INSERT INTO event_outbox (event_type, available_at, attempts) VALUES ('a.b.v1', ?1, 3)",
            [T0 + 20 * 86_400_000],
        )
        .unwrap(); // a retry three weeks ahead
                   // Microseconds, written before the schema refused them: schema
                   // version 5 moved such a row to the last millisecond of 9999.
        conn.execute(
            "INSERT INTO event_outbox (event_type, available_at) VALUES ('a.b.v1', ?1)",
            [253_402_300_799_999_i64],
        )
        .unwrap();
        row(&conn, "pending", 86_400_000, None); // delayed a day: fine
        let s = status(&conn, at(0)).unwrap();
        assert_eq!(
            s.furthest_lease,
            Some(Duration::from_millis(hour as u64 + 30_000))
        );
        assert_eq!(s.furthest_retry, Some(Duration::from_secs(20 * 86_400)));
        assert_eq!(s.implausible_delays, 1);
        let stepped_lease = Some(Duration::from_millis(hour as u64 + 30_000));
        assert_eq!(
            s.problems(&Thresholds::new(Duration::MAX, None)),
            [
                Problem::ClockStep {
                    lease: stepped_lease,
                    retry: Some(Duration::from_secs(20 * 86_400)),
                    max_lease: crate::limits::MAX_LEASE,
                    max_retry_wait: crate::limits::MAX_RETRY_DELAY * 2,
                },
                Problem::ImplausibleDelay { count: 1 },
            ]
        );
        // Under settings that allow them (a 2-hour lease, 30-day retries),
        // only the delay is a problem.
        let relaxed = Thresholds::new(Duration::MAX, None)
            .relay_settings(Duration::from_secs(7200), Duration::from_secs(30 * 86_400));
        assert_eq!(
            s.problems(&relaxed),
            [Problem::ImplausibleDelay { count: 1 }]
        );
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

    /// The oldest undelivered event counts rows that are due, claimed or
    /// retrying from their `created_at`, and not rows delayed on purpose and
    /// never tried.
    #[test]
    fn the_oldest_undelivered_event_includes_retries_but_not_delays() {
        let (_dir, conn) = migrated();
        let insert = |created: i64, available: i64, attempts: u32, token: Option<&str>| {
            conn.execute(
                "INSERT INTO event_outbox (event_type, created_at, available_at, attempts,
                     claim_token, lease_until)
                 VALUES ('article.created.v1', ?1, ?2, ?3, ?4, ?5)",
                params![
                    T0 + created,
                    T0 + available,
                    attempts,
                    token,
                    token.map(|_| T0 + available)
                ],
            )
            .unwrap();
        };
        insert(-9_000_000, 3_600_000, 0, None); // delayed on purpose, never tried
        let s = status(&conn, at(0)).unwrap();
        assert_eq!(s.oldest_undelivered_age, None);

        insert(-7_200_000, 600_000, 3, None); // retrying: not due, written 2 h ago
        let s = status(&conn, at(0)).unwrap();
        assert_eq!(s.oldest_due_age, None, "a retry is not due");
        assert_eq!(s.oldest_undelivered_age, Some(Duration::from_secs(7200)));
        let t = Thresholds::default();
        assert_eq!(
            s.problems(&t),
            vec![Problem::Undelivered {
                oldest_undelivered_age: Duration::from_secs(7200),
                max_undelivered_age: Duration::from_secs(3600),
            }]
        );
        assert!(s
            .problems(&t.max_undelivered_age(Duration::from_secs(3 * 3600)))
            .is_empty());

        insert(-8_000_000, 30_000, 0, Some("other")); // being delivered
        let s = status(&conn, at(0)).unwrap();
        assert_eq!(s.oldest_undelivered_age, Some(Duration::from_secs(8000)));
        insert(-8_500_000, -1_000, 0, None); // due
        let s = status(&conn, at(0)).unwrap();
        assert_eq!(s.oldest_undelivered_age, Some(Duration::from_secs(8500)));
        // The verdict reads the same measure.
        let verdict = crate::health::check(&conn, &t, at(0)).unwrap();
        assert!(verdict.has("undelivered"), "{verdict:?}");
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
