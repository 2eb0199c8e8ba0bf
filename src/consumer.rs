//! The extension point: a consumer receives deliveries and says what happened.

use std::time::Duration;

use crate::clock::Timestamp;
use crate::envelope::Envelope;
use crate::trace::TraceContext;

/// One delivery of one event to one consumer. The relay makes these; a
/// test (or a host calling a consumer directly) builds one from an envelope:
///
/// ```
/// # let envelope: outboxd::Envelope = serde_json::from_value(serde_json::json!({
/// #     "event_id": outboxd::EventId::new().to_string(), "event_type": "article.created.v1",
/// #     "event_version": 1, "causation_id": null, "correlation_id": null,
/// #     "occurred_at": "2026-11-30T07:18:00Z", "payload": {"id": 7}})).unwrap();
/// use outboxd::Delivery;
/// let d = Delivery::new(envelope).consumer("indexer").attempt(2).tenant_id(Some("acme".into()));
/// assert_eq!((d.attempt, d.consumer.as_str()), (2, "indexer"));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Delivery {
    /// The event.
    pub envelope: Envelope,
    /// 1 on the first try, 2 on the first retry, and so on.
    pub attempt: u32,
    /// The name the consumer was registered under.
    pub consumer: String,
    /// True for a row written without an event id: its id is derived from
    /// the row, and dedup across rows does not apply to it.
    pub legacy: bool,
    /// The event's tenant, if any.
    pub tenant_id: Option<String>,
    /// The event's ordering key, if any.
    pub ordering_key: Option<String>,
    /// This attempt's trace context, when the producer stored one: a child
    /// of the producer's ([`TraceContext::child`]: the same trace id, a new
    /// span id for every attempt to every consumer). The sinks send it in
    /// their transport metadata (docs/sql-contract.md, "Trace context").
    pub trace: Option<TraceContext>,
    /// When the event's row was written (its `created_at`, the producer's
    /// commit): `None` for a delivery made outside a relay.
    pub created_at: Option<Timestamp>,
}

impl Delivery {
    /// The first attempt of `envelope`, to no consumer in particular (an
    /// empty name), with no tenant or ordering key.
    pub fn new(envelope: Envelope) -> Delivery {
        Delivery {
            envelope,
            attempt: 1,
            consumer: String::new(),
            legacy: false,
            tenant_id: None,
            ordering_key: None,
            trace: None,
            created_at: None,
        }
    }

    /// The attempt number (1 on the first try).
    #[must_use]
    pub fn attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// The consumer's name.
    #[must_use]
    pub fn consumer(mut self, name: impl Into<String>) -> Self {
        self.consumer = name.into();
        self
    }

    /// Marks the delivery as one of a legacy row (no event id of its own).
    #[must_use]
    pub fn legacy(mut self, legacy: bool) -> Self {
        self.legacy = legacy;
        self
    }

    /// The event's tenant.
    #[must_use]
    pub fn tenant_id(mut self, tenant: Option<String>) -> Self {
        self.tenant_id = tenant;
        self
    }

    /// The event's ordering key.
    #[must_use]
    pub fn ordering_key(mut self, key: Option<String>) -> Self {
        self.ordering_key = key;
        self
    }

    /// This attempt's trace context.
    #[must_use]
    pub fn trace(mut self, trace: Option<TraceContext>) -> Self {
        self.trace = trace;
        self
    }
}

/// What a consumer reports for a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Done: never delivered to this consumer again (outside a replay).
    Delivered,
    /// Try again later: after the retry policy's backoff, or after `after`
    /// when that is later. After the last attempt the event is dead-lettered
    /// with `reason`.
    Retry {
        /// Why, for the log and the dead letter.
        reason: String,
        /// The earliest time from now to try again (a Retry-After header).
        after: Option<Duration>,
    },
    /// The destination cannot be reached (connection refused or reset, a
    /// resolver that does not answer, a connect or TLS-handshake timeout, a
    /// broker with no connection or no responders, HTTP 502/503/504/429):
    /// the event did not fail, the destination did. Spends no attempt and
    /// never dead-letters, however long it lasts: the event is tried again
    /// on the consumer's probe back-off (`retry.probe_interval` doubling to
    /// `retry.probe_max_interval`), or after `after` when that is later (up
    /// to `retry.max_delay`). While the same consumer delivers other events
    /// in the same batch, the destination is evidently up: the outcome then
    /// counts as a [`Retry`](Outcome::Retry), so one event that always gets
    /// a 503 still ends in a dead letter.
    Unavailable {
        /// Why, for the log and `last_error`.
        reason: String,
        /// The earliest time from now to try again (a Retry-After header).
        after: Option<Duration>,
    },
    /// Never deliverable: dead-lettered at once, spending no attempt.
    Poison {
        /// Why, for the dead letter.
        reason: String,
    },
}

impl Outcome {
    /// A retry after the policy's backoff.
    pub fn retry(reason: impl Into<String>) -> Outcome {
        Outcome::Retry {
            reason: reason.into(),
            after: None,
        }
    }

    /// A retry no sooner than `after` from now.
    pub fn retry_after(reason: impl Into<String>, after: Duration) -> Outcome {
        Outcome::Retry {
            reason: reason.into(),
            after: Some(after),
        }
    }

    /// An unavailable destination, probed again on the consumer's back-off.
    pub fn unavailable(reason: impl Into<String>) -> Outcome {
        Outcome::Unavailable {
            reason: reason.into(),
            after: None,
        }
    }

    /// An unavailable destination, probed again no sooner than `after`.
    pub fn unavailable_after(reason: impl Into<String>, after: Duration) -> Outcome {
        Outcome::Unavailable {
            reason: reason.into(),
            after: Some(after),
        }
    }

    /// This outcome as an ordinary retry (an unavailable outcome becomes
    /// one; the others are returned as they are).
    pub(crate) fn as_failure(&self) -> Outcome {
        match self {
            Outcome::Unavailable { reason, after } => Outcome::Retry {
                reason: reason.clone(),
                after: *after,
            },
            other => other.clone(),
        }
    }

    /// A poison verdict.
    pub fn poison(reason: impl Into<String>) -> Outcome {
        Outcome::Poison {
            reason: reason.into(),
        }
    }
}

/// Something that handles events: a closure, a sink, a host's own type.
///
/// `deliver` runs on a worker thread. It must not write to the outbox tables
/// (outcomes are recorded by the relay's writer). A panic inside it is caught
/// and counted as a retry carrying the panic message.
///
/// Tell an outage from a failure: return [`Outcome::Unavailable`] when the
/// destination could not be reached at all (no attempt is spent, nothing is
/// dead-lettered, the event waits on a short capped back-off), and
/// [`Outcome::Retry`] when this event failed (the retry schedule applies).
///
/// ```
/// use outboxd::consumer::{Consumer, Delivery, Outcome};
/// struct Indexer;
/// impl Consumer for Indexer {
///     fn deliver(&self, d: &Delivery) -> Outcome {
///         match d.envelope.payload_as::<serde_json::Value>() {
///             Ok(_) => Outcome::Delivered,
///             Err(e) => Outcome::poison(format!("payload is not an article: {e}")),
///         }
///     }
/// }
/// // Closures are consumers too.
/// let log = |d: &Delivery| { println!("{}", d.envelope.event_id); Outcome::Delivered };
/// # fn takes(_: impl Consumer) {}
/// # takes(Indexer); takes(log);
/// ```
pub trait Consumer: Send + Sync + 'static {
    /// Handles one delivery and reports the outcome.
    fn deliver(&self, delivery: &Delivery) -> Outcome;
}

impl<F> Consumer for F
where
    F: Fn(&Delivery) -> Outcome + Send + Sync + 'static,
{
    fn deliver(&self, delivery: &Delivery) -> Outcome {
        self(delivery)
    }
}

/// A consumer whose effect is a write into the same SQLite database, made
/// exactly once: its writes, the check that the relay still holds the
/// event's claim, and its progress row in `delivered_events` commit in one
/// transaction. Register one with
/// [`RelayBuilder::transactional_consumer`](crate::RelayBuilder::transactional_consumer);
/// docs/exactly-once.md tells the whole story.
///
/// `deliver` runs on a worker thread, inside a `BEGIN IMMEDIATE`
/// transaction on that worker's own connection to the relay's database
/// (opened with [`connection::open`](crate::connection::open): WAL, the busy
/// handler, `synchronous=FULL`). The relay has already checked the claim
/// and the ledger in it. Then:
///
/// - [`Outcome::Delivered`]: the ledger entry is written and the
///   transaction commits; the relay never runs this consumer for the event
///   again (outside a replay), even if it crashes before it records the
///   row's outcome.
/// - [`Outcome::Retry`], [`Outcome::Unavailable`], [`Outcome::Poison`] or a panic: the transaction is
///   rolled back, so none of its writes remain, and the outcome is
///   recorded as for any consumer.
///
/// The function **may** read and write any table through `tx` (it derefs
/// to [`rusqlite::Connection`]), use savepoints through SQL, and
/// [`enqueue`](crate::enqueue()) follow-up events (they commit with its
/// writes). It **must not** end the transaction (`COMMIT`, `ROLLBACK`,
/// `BEGIN`: outboxd finds that out, rolls back what it can and dead-letters
/// the event, because its writes may have committed without their ledger
/// entry), write through another connection to the same database (that
/// connection waits for the write lock this transaction holds: it would
/// fail with SQLITE_BUSY after the busy timeout), or wait long on anything
/// else: while it runs it holds SQLite's only write lock, so the host's
/// commits and the relay's writer wait for it. Keep it to milliseconds.
///
/// ```
/// use outboxd::consumer::{Delivery, Outcome, TransactionalConsumer};
/// struct Counter;
/// impl TransactionalConsumer for Counter {
///     fn deliver(&self, tx: &rusqlite::Transaction<'_>, d: &Delivery) -> Outcome {
///         match tx.execute(
///             "INSERT INTO counts (type, n) VALUES (?1, 1)
///              ON CONFLICT (type) DO UPDATE SET n = n + 1",
///             [d.envelope.event_type.as_str()],
///         ) {
///             Ok(_) => Outcome::Delivered,
///             Err(e) => Outcome::retry(format!("cannot count: {e}")),
///         }
///     }
/// }
/// // Closures are transactional consumers too.
/// let audit = |tx: &rusqlite::Transaction<'_>, d: &Delivery| {
///     match tx.execute("INSERT INTO audit (event_id) VALUES (?1)", [d.envelope.event_id.to_string()]) {
///         Ok(_) => Outcome::Delivered,
///         Err(e) => Outcome::poison(e.to_string()),
///     }
/// };
/// # fn takes(_: impl TransactionalConsumer) {}
/// # takes(Counter); takes(audit);
/// ```
pub trait TransactionalConsumer: Send + Sync + 'static {
    /// Handles one delivery inside `tx` and reports the outcome; the relay
    /// commits `tx` on [`Outcome::Delivered`] and rolls it back otherwise.
    fn deliver(&self, tx: &rusqlite::Transaction<'_>, delivery: &Delivery) -> Outcome;
}

impl<F> TransactionalConsumer for F
where
    F: Fn(&rusqlite::Transaction<'_>, &Delivery) -> Outcome + Send + Sync + 'static,
{
    fn deliver(&self, tx: &rusqlite::Transaction<'_>, delivery: &Delivery) -> Outcome {
        self(tx, delivery)
    }
}
