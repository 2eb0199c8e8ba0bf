//! The relay's housekeeping, run by the writer between its transactions:
//! one batch of TTL purge, the dead letters of payloads over the maximum, a
//! truncating WAL checkpoint when the relay is idle and the WAL has grown
//! (the passive ones run on their own thread: `checkpoint`), and the stale
//! check. Each in its own short transaction; a failure is logged and tried
//! again at the next tick, never allowed to stop deliveries.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{Connection, TransactionBehavior};

use super::clock_step::Repair;
use super::metrics::Metrics;
use crate::clock::Timestamp;
use crate::purge::{PurgePolicy, PurgeReport};

/// How soon the next tick comes while a purge still finds rows: more may be
/// left, and small batches between claims keep each write short.
const PURGE_AGAIN: Duration = Duration::from_millis(100);

/// How soon the next tick comes while far leases are being timed.
const REPAIR_AGAIN: Duration = Duration::from_secs(1);

/// Above this size, an idle relay truncates the WAL file. SQLite's
/// auto-checkpoint keeps a WAL near 4 MiB (1000 pages); one this much
/// larger grew behind a long reader, and stays that size on disk until the
/// next write otherwise (and then shrinks only to `journal_size_limit`).
const WAL_TRUNCATE_ABOVE: u64 = 8 << 20;

/// How many of the oldest due rows a tick looks at for payloads over the
/// maximum. The claim passes those over, so they gather at the head of the
/// due order, where this finds them.
const OVERSIZED_WINDOW: usize = 1000;

/// The housekeeping schedule and settings.
pub(crate) struct Housekeeping {
    interval: Duration,
    stale_after: Duration,
    purge: Option<PurgePolicy>,
    max_payload: u64,
    /// What a clock step left waiting.
    repair: Repair,
    /// The WAL file (None for a database without one on disk).
    wal: Option<PathBuf>,
    next: Instant,
}

/// What one tick changed that the writer must know.
#[derive(Debug, Default)]
pub(crate) struct Tick {
    /// Rows dead-lettered for a payload over the maximum.
    pub dead_lettered: u64,
    /// SQLite said the file is damaged (the writer stops).
    pub damage: Option<rusqlite::Error>,
    /// Rows a clock step left waiting were made due.
    pub made_due: bool,
}

/// What one stale check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Staleness {
    /// Due events that have waited longer than the threshold (bounded).
    pub stale: u64,
    /// How long the oldest due event has waited (zero: none is due).
    pub oldest_due_age: Duration,
}

impl Housekeeping {
    /// A schedule whose first tick is due at `at`.
    pub(crate) fn new(
        interval: Duration,
        stale_after: Duration,
        purge: Option<PurgePolicy>,
        max_payload: u64,
        repair: Repair,
        wal: Option<PathBuf>,
        at: Instant,
    ) -> Housekeeping {
        Housekeeping {
            interval,
            stale_after,
            purge,
            max_payload,
            repair,
            wal,
            next: at,
        }
    }

    /// The system clock stepped back: repair at a tick due now.
    pub(crate) fn clock_stepped(&mut self, at: Instant) {
        self.repair.watch();
        self.next = at;
    }

    /// True when a tick is due.
    pub(crate) fn due(&self, at: Instant) -> bool {
        at >= self.next
    }

    /// When the next tick is due.
    pub(crate) fn next_at(&self) -> Instant {
        self.next
    }

    /// The WAL file, if the database has one on disk.
    pub(crate) fn wal(&self) -> Option<&std::path::Path> {
        self.wal.as_deref()
    }

    /// Runs one tick and schedules the next. `idle`: the relay holds no
    /// delivery and has not written for a while; `held`: the rows of its
    /// deliveries.
    pub(crate) fn run(
        &mut self,
        conn: &mut Connection,
        now: Timestamp,
        metrics: &Metrics,
        idle: bool,
        held: impl Fn(i64) -> bool,
    ) -> Tick {
        let mut tick = Tick::default();
        match self.repair.run(conn, now, Instant::now(), held) {
            Ok(done) => {
                if done.any() {
                    tracing::warn!(
                        retries = done.retries,
                        created_ahead = done.created_ahead,
                        leases = done.leases,
                        "made due the retries and events a step of the system clock left far \
                         ahead, and ended the far leases no relay renewed"
                    );
                }
                tick.made_due = done.any();
            }
            Err(e) if crate::error::is_damage(&e) => tick.damage = Some(e),
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for rows a clock step left waiting; will retry")
            }
        }
        let mut purged = PurgeReport::default();
        if let Some(policy) = &self.purge {
            match crate::purge::purge_batch(conn, policy, now) {
                Ok(r) => {
                    if r.total() > 0 {
                        tracing::debug!(
                            delivered = r.delivered,
                            dead = r.dead,
                            dedup = r.dedup_entries,
                            intents = r.intents,
                            "purged"
                        );
                    }
                    purged = r;
                }
                Err(e) => match e.into_damage() {
                    Ok(damage) => tick.damage = Some(damage),
                    Err(e) => tracing::warn!(error = %e, "purge failed; will retry"),
                },
            }
        }
        dead_letter_oversized(conn, now, self.max_payload, &mut tick);
        Metrics::add(&metrics.dead_lettered, tick.dead_lettered);
        if let Some(wal) = self.wal.as_deref().filter(|_| idle) {
            truncate_large_wal(conn, wal);
        }
        match stale(conn, now, self.stale_after) {
            Ok(s) => {
                Metrics::set(&metrics.stale_events, s.stale);
                Metrics::set(
                    &metrics.oldest_due_ms,
                    u64::try_from(s.oldest_due_age.as_millis()).unwrap_or(u64::MAX),
                );
                if s.stale > 0 {
                    tracing::warn!(
                        count = s.stale,
                        oldest_due_secs = s.oldest_due_age.as_secs(),
                        threshold_secs = self.stale_after.as_secs(),
                        "stale events: due events are waiting longer than the threshold"
                    );
                }
            }
            Err(e) => match e.into_damage() {
                Ok(damage) => tick.damage = Some(damage),
                Err(e) => tracing::debug!(error = %e, "stale check failed"),
            },
        }
        let mut wait = next_tick(self.interval, &purged);
        if self.repair.watching() {
            // Timing far leases: look again within a lease.
            wait = wait.min(REPAIR_AGAIN);
        }
        self.next = Instant::now() + wait;
        tick
    }
}

/// Truncates the WAL file when it has grown past [`WAL_TRUNCATE_ABOVE`]:
/// `wal_checkpoint(TRUNCATE)`, which needs every reader to have moved past
/// the WAL. It never waits for them (the writer thread must not block): a
/// reader in the way means trying again at the next idle tick.
fn truncate_large_wal(conn: &Connection, wal: &Path) {
    let size = std::fs::metadata(wal).map_or(0, |m| m.len());
    if size <= WAL_TRUNCATE_ABOVE {
        return;
    }
    let busy = conn.busy_timeout(Duration::ZERO).and_then(|()| {
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            r.get::<_, i64>(0)
        })
    });
    if let Err(e) = crate::connection::set_busy_handler(conn) {
        tracing::warn!(error = %e, "cannot restore the busy handler");
    }
    match busy {
        Ok(0) => tracing::debug!(bytes = size, "truncated the WAL while idle"),
        Ok(_) => tracing::debug!(
            bytes = size,
            "a reader holds the WAL; will truncate it later"
        ),
        Err(e) => tracing::debug!(error = %e, "cannot truncate the WAL; will try later"),
    }
}

/// Dead-letters the due rows whose payload is over `max_payload` (the claim
/// passes them over), each in its own transaction, so one that SQLite has
/// not the memory to rewrite does not hold the others back; counts them in
/// `tick`.
fn dead_letter_oversized(conn: &mut Connection, now: Timestamp, max_payload: u64, tick: &mut Tick) {
    let found = match super::fenced::oversized(conn, now, max_payload, OVERSIZED_WINDOW) {
        Ok(found) => found,
        Err(e) if crate::error::is_damage(&e) => {
            tick.damage = Some(e);
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot look for payloads over max_payload_bytes; will retry");
            return;
        }
    };
    for (row_id, bytes) in found {
        let reason = format!(
            "payload is {bytes} bytes, larger than this relay's max_payload_bytes \
             ({max_payload}); it was not loaded. Raise max_payload_bytes (a delivery needs a \
             few times the payload's size in memory) or shrink the payload, then requeue it"
        );
        let ended = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .and_then(|tx| {
                let ended = super::fenced::dead_letter_oversized(&tx, row_id, now, &reason)?;
                tx.commit()?;
                Ok(ended)
            });
        match ended {
            Ok(true) => {
                tick.dead_lettered += 1;
                tracing::warn!(
                    row_id,
                    payload_bytes = bytes,
                    max_payload_bytes = max_payload,
                    "dead-lettered an event whose payload is larger than max_payload_bytes, unread"
                );
            }
            Ok(false) => {}
            Err(e) => tracing::error!(
                row_id,
                payload_bytes = bytes,
                error = %e,
                "cannot dead-letter an event whose payload is larger than max_payload_bytes \
                 (SQLite needs a few times its size in memory to rewrite the row); it stays \
                 pending and is passed over; will retry"
            ),
        }
    }
}

/// The wait until the next tick: soon while a purge still deletes rows,
/// otherwise the interval.
fn next_tick(interval: Duration, purged: &PurgeReport) -> Duration {
    if purged.total() > 0 {
        interval.min(PURGE_AGAIN)
    } else {
        interval
    }
}

/// The stale check: how many due events are older than `after`, and how
/// old the oldest is.
fn stale(conn: &Connection, now: Timestamp, after: Duration) -> crate::Result<Staleness> {
    let stale = crate::status::stale_count(conn, now, after)?;
    let oldest = crate::status::oldest_due(conn, now)?;
    Ok(Staleness {
        stale,
        oldest_due_age: oldest.map(|t| now.since(t)).unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tick_that_purged_comes_back_soon() {
        let hour = Duration::from_secs(3600);
        let some = PurgeReport {
            delivered: 1,
            ..PurgeReport::default()
        };
        assert_eq!(next_tick(hour, &some), PURGE_AGAIN);
        assert_eq!(next_tick(hour, &PurgeReport::default()), hour);
        assert_eq!(
            next_tick(Duration::from_millis(20), &some),
            Duration::from_millis(20)
        );
    }

    #[test]
    fn a_tick_purges_a_batch_and_measures_staleness() {
        let (_dir, mut conn) = crate::schema::test_db();
        conn.execute_batch(
            "INSERT INTO event_outbox (event_type, available_at) VALUES ('a.b.v1', 1000), ('a.b.v1', 9000);
             INSERT INTO event_outbox (event_type, status, finished_at) VALUES ('a.b.v1', 'delivered', 1);",
        )
        .unwrap();
        let metrics = Metrics::new(vec!["a".into()]);
        let policy = PurgePolicy::default()
            .delivered_retention(Duration::from_secs(1))
            .dedup_ttl(Duration::from_secs(1));
        let at = Instant::now();
        let mut h = Housekeeping::new(
            Duration::from_secs(3600),
            Duration::from_secs(5),
            Some(policy),
            1 << 20,
            Repair::new(Duration::from_secs(30), Duration::from_secs(60)),
            None,
            at,
        );
        assert!(h.due(at));
        h.run(
            &mut conn,
            Timestamp::from_millis(10_000),
            &metrics,
            false,
            |_| false,
        );
        assert!(!h.due(at + Duration::from_millis(50)));
        assert!(
            h.due(at + Duration::from_secs(1)),
            "more may be left to purge"
        );
        let s = metrics.snapshot();
        assert_eq!((s.stale_events, s.oldest_due_ms), (1, 9_000));
        let left: i64 = conn
            .query_row("SELECT count(*) FROM event_outbox", [], |r| r.get(0))
            .unwrap();
        assert_eq!(
            left, 2,
            "the delivered row is purged, the pending ones kept"
        );
    }
}
