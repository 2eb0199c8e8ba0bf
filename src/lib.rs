//! # outboxd
//!
//! A transactional outbox for applications that keep their data in SQLite.
//! The application writes its business rows and an event in one transaction;
//! outboxd delivers the event to every consumer subscribed to its type and
//! never loses one.
//!
//! ```
//! # fn main() -> outboxd::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! use outboxd::{enqueue, Event};
//!
//! let mut conn = outboxd::connection::open(dir.path().join("app.db"))?;
//! outboxd::schema::migrate(&mut conn)?;
//!
//! let tx = conn.transaction().unwrap();
//! // ... the host's business rows ...
//! let queued = enqueue(&tx, &Event::new("article.created.v1", &serde_json::json!({"id": 7}))?)?;
//! tx.commit().unwrap();
//! assert!(!queued.is_duplicate());
//! # Ok(()) }
//! ```
//!
//! ## Layout
//!
//! - [`envelope`]: the delivered form of an event; every field validated here.
//! - [`schema`]: embedded migrations and the schema version.
//! - [`connection`]: opening connections with outboxd's settings (WAL, FULL sync).
//! - [`enqueue`](mod@enqueue): the producer side, inside the host's transaction.
//! - [`consumer`]: the traits a consumer implements (plain or transactional), and its outcomes.
//! - [`router`]: event-type patterns, and which consumers each event goes to.
//! - [`relay`]: claims, delivers on a worker pool, records outcomes (leases, retries, dead letters).
//! - [`dedup`]: the `delivered_events` ledger, each consumer's progress and the dedup window.
//! - [`purge`]: TTL purge of finished rows in small batches.
//! - [`dead_letter`], [`replay`]: operator operations.
//! - [`clock`]: time as an input.
//! - [`limits`]: the bounds and defaults of the relay's settings.
//! - [`status`]: a read-only snapshot of the outbox for operators.
//! - [`inspect`]: operators' bounded views: pages of events and dead letters, one event,
//!   each consumer's backlog, per-minute counts (what the web console shows).
//! - [`health`]: the thresholds, the problems and the one health verdict.
//! - [`integrity`]: whether the database file is damaged, and what to do.
//! - [`intents`]: publish intents, outside writes that are never posted twice.
//! - [`repair`]: fixing a malformed dead letter's columns, checked as the relay would.
//! - [`text`]: clipping text others wrote before it goes into a message or a dead letter.
//! - [`trace`]: W3C Trace Context (`traceparent`, `tracestate`) from the producer to every sink.
//! - [`capture`]: triggers that turn a host's own writes into events (change capture).
//! - [`sinks`] (feature `sinks`): ready-made consumers: JSON lines, a child program, a webhook;
//!   and a NATS JetStream stream (feature `nats`).
#![warn(missing_docs)]

pub mod capture;
pub mod clock;
pub mod connection;
pub mod consumer;
pub mod dead_letter;
pub mod dedup;
pub mod enqueue;
pub mod envelope;
pub mod error;
pub mod health;
pub mod inspect;
pub mod integrity;
pub mod intents;
pub mod limits;
mod liveness;
pub mod purge;
pub mod relay;
pub mod repair;
pub mod replay;
pub mod router;
pub mod schema;
#[cfg(feature = "sinks")]
pub mod sinks;
pub mod status;
pub mod text;
pub mod trace;

pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use consumer::{Consumer, Delivery, Outcome, TransactionalConsumer};
pub use enqueue::{enqueue, enqueue_many, Enqueued, Enqueuer, Event};
pub use envelope::{Envelope, EnvelopeError, EventId, EventType};
pub use error::{Error, Result};
pub use relay::{Relay, RelayBuilder, RelayHandle, RetryPolicy};

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// docs/exactly-once.md's example, compiled and run as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../docs/exactly-once.md")]
pub struct ExactlyOnceDoctests;
