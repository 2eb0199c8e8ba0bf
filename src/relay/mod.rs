//! The relay: claims due events, delivers them to their consumers on a pool
//! of worker threads, and records the outcomes.
//!
//! ```
//! # fn main() -> outboxd::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("app.db");
//! use outboxd::{enqueue, Delivery, Event, Outcome, Relay};
//! use std::time::Duration;
//!
//! let mut conn = outboxd::connection::open(&path)?;
//! outboxd::schema::migrate(&mut conn)?;
//!
//! let (seen_tx, seen) = crossbeam_channel::unbounded();
//! let relay = Relay::builder(&path)
//!     .consumer("indexer", ["article.*.v1"], move |d: &Delivery| {
//!         seen_tx.send(d.envelope.event_id).unwrap();
//!         Outcome::Delivered
//!     })
//!     .workers(2)
//!     .build()?
//!     .start()?;
//!
//! let tx = conn.transaction().unwrap();
//! let id = enqueue(&tx, &Event::new("article.created.v1", &7)?)?.event_id();
//! tx.commit().unwrap();
//! relay.notify(); // a producer in the same process wakes the relay at once
//!
//! assert_eq!(seen.recv_timeout(Duration::from_secs(10)).unwrap(), id);
//! relay.shutdown(Duration::from_secs(5))?;
//! # Ok(()) }
//! ```
//!
//! How the relay's threads work together, and which module decides what:
//! docs/relay.md.

mod availability;
mod builder;
mod checkpoint;
pub(crate) mod claim;
mod clock_step;
mod consumers;
pub(crate) mod fenced;
mod handle;
mod housekeeping;
mod job;
mod metrics;
mod owners;
mod panic;
mod plan;
mod retry;
mod settings;
mod start;
mod transactional;
mod wake;
mod worker;
mod writer;

use std::sync::Arc;
use std::thread::JoinHandle;

pub use crate::router::UnroutedPolicy;
pub use builder::RelayBuilder;
pub use handle::RelayHandle;
pub use metrics::{ConsumerMetrics, Metrics, MetricsSnapshot};
pub use retry::RetryPolicy;
// The 0.1 paths of the bounds and defaults, which live in `crate::limits`.
pub use crate::limits::{
    DEFAULT_BATCH_BYTES, DEFAULT_BATCH_SIZE, DEFAULT_DROP_GRACE, DEFAULT_FLUSH_INTERVAL,
    DEFAULT_HOUSEKEEPING_INTERVAL, DEFAULT_JITTER, DEFAULT_LEASE, DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_PAYLOAD_BYTES, DEFAULT_POLL_INTERVAL, DEFAULT_RETRY_INITIAL,
    DEFAULT_RETRY_MAX_DELAY, DEFAULT_STALE_AFTER, MAX_BATCH_SIZE, MAX_FLUSH_INTERVAL,
    MAX_HOUSEKEEPING_INTERVAL, MAX_LEASE, MAX_PAYLOAD_BYTES, MAX_POLL_INTERVAL, MAX_RETRY_ATTEMPTS,
    MAX_RETRY_DELAY, MAX_WORKERS, MIN_HOUSEKEEPING_INTERVAL, MIN_LEASE, MIN_POLL_INTERVAL,
};
pub use settings::validate_consumer_name;

pub(crate) use consumers::{ConsumerEntry, ConsumerKind};
pub(crate) use handle::Control;
pub(crate) use settings::Settings;

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::router::Routes;

/// A configured relay, ready to [`start`](Relay::start).
#[must_use = "a relay does nothing until it is started"]
pub struct Relay {
    settings: Settings,
    consumers: Vec<ConsumerEntry>,
    routes: Routes,
    clock: Arc<dyn Clock>,
}

/// The writer thread's name.
const WRITER_THREAD: &str = "outboxd-writer";

/// Starts a named thread of the relay.
fn spawn<T, F>(name: String, f: F) -> Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    #[cfg(test)]
    if tests::spawn_fails(&name) {
        return Err(Error::Spawn {
            thread: name,
            source: std::io::Error::other("refused by the test"),
        });
    }
    std::thread::Builder::new()
        .name(name.clone())
        .spawn(f)
        .map_err(|source| Error::Spawn {
            thread: name,
            source,
        })
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::time::Duration;

    use super::*;
    use crate::consumer::{Delivery, Outcome};

    thread_local! {
        /// The thread whose start `Relay::start` on this thread fails.
        static REFUSE: RefCell<Option<String>> = const { RefCell::new(None) };
    }

    pub(super) fn spawn_fails(name: &str) -> bool {
        REFUSE.with(|r| r.borrow().as_deref() == Some(name))
    }

    /// A row the writer finishes without a delivery (no consumer takes its
    /// type, skipped; or every consumer has it) is checked whole there, as
    /// one going to a worker is checked on the worker: an invalid payload
    /// or tenant is dead-lettered with its reason either way, never marked
    /// delivered.
    #[test]
    fn an_invalid_row_is_dead_lettered_whether_or_not_a_worker_gets_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.db");
        let mut conn = crate::connection::open(&path).unwrap();
        crate::schema::migrate(&mut conn).unwrap();
        conn.execute_batch(
            "INSERT INTO event_outbox (id, event_type, payload) VALUES (1, 'a.b.v1', '{oops');
             INSERT INTO event_outbox (id, event_type, payload) VALUES (2, 'x.y.v1', '{oops');
             INSERT INTO event_outbox (id, event_type, payload, tenant_id)
                  VALUES (3, 'x.y.v1', '{}', X'FF');
             INSERT INTO event_outbox (id, event_type, payload, tenant_id)
                  VALUES (4, 'a.b.v1', '{}', X'FF');
             INSERT INTO event_outbox (id, event_type, payload) VALUES (5, 'x.y.v1', '{}');
             INSERT INTO event_outbox (id, event_type, payload) VALUES (6, 'a.b.v1', '{}');",
        )
        .unwrap();
        let (seen_tx, seen) = crossbeam_channel::unbounded();
        let relay = Relay::builder(&path)
            .consumer("a", ["a.*.v1"], move |d: &Delivery| {
                seen_tx.send(d.envelope.payload.get().to_string()).unwrap();
                Outcome::Delivered
            })
            .unrouted(UnroutedPolicy::Skip)
            .poll_interval(Duration::from_millis(1))
            .build()
            .unwrap()
            .start()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let pending = || -> i64 {
            conn.query_row(
                "SELECT count(*) FROM event_outbox WHERE status = 'pending'",
                [],
                |r| r.get(0),
            )
            .unwrap()
        };
        while pending() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the relay settles every row"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        relay.shutdown(Duration::from_secs(5)).unwrap();
        let rows: Vec<(i64, String, Option<String>)> = conn
            .prepare("SELECT id, status, last_error FROM event_outbox ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let reason = |i: usize| rows[i].2.clone().unwrap_or_default();
        for (i, needle) in [
            (0, "payload is not valid JSON"),
            (1, "payload is not valid JSON"),
            (2, "tenant_id is not valid UTF-8"),
            (3, "tenant_id is not valid UTF-8"),
        ] {
            assert_eq!(rows[i].1, "dead", "row {}: {rows:?}", i + 1);
            assert!(
                reason(i).starts_with("invalid row: ") && reason(i).contains(needle),
                "row {}: {rows:?}",
                i + 1
            );
        }
        assert_eq!(
            (rows[4].1.as_str(), rows[5].1.as_str()),
            ("delivered", "delivered")
        );
        assert_eq!(
            seen.try_iter().collect::<Vec<_>>(),
            ["{}"],
            "only row 6 reached the consumer"
        );
    }

    /// Regression (issue 10): a worker that could not start was logged and
    /// the relay ran on, claiming and heart-beating rows it had too few
    /// workers for (with none, forever); a writer that could not start was
    /// reported as an invalid setting. Now `start` fails with the thread's
    /// name, and nothing runs.
    #[test]
    fn a_relay_that_cannot_start_a_thread_stops_and_says_which() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let mut conn = crate::connection::open(&path).unwrap();
        crate::schema::migrate(&mut conn).unwrap();
        crate::Enqueuer::new()
            .allow_autocommit(true)
            .enqueue(&conn, &crate::Event::new("a.b.v1", &1).unwrap())
            .unwrap();
        for thread in ["outboxd-worker-0", "outboxd-worker-2", WRITER_THREAD] {
            REFUSE.with(|r| *r.borrow_mut() = Some(thread.to_string()));
            let (seen_tx, seen) = crossbeam_channel::unbounded();
            let started = Relay::builder(&path)
                .consumer("a", ["*"], move |_: &Delivery| {
                    seen_tx.send(()).unwrap();
                    Outcome::Delivered
                })
                .workers(3)
                .build()
                .unwrap()
                .start();
            let Err(Error::Spawn { thread: name, .. }) = &started else {
                panic!("start must fail when {thread} cannot start");
            };
            assert_eq!(name, thread);
            assert!(started.err().unwrap().to_string().contains(thread));
            // Nothing claimed, nothing delivered: the relay never ran.
            let touched: i64 = conn
                .query_row(
                    "SELECT count(*) FROM event_outbox
                      WHERE claim_token IS NOT NULL OR status <> 'pending'",
                    [],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(touched, 0, "{thread}");
            assert!(seen.try_recv().is_err(), "{thread}");
        }
        REFUSE.with(|r| *r.borrow_mut() = None);
    }
}
