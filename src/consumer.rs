//! The extension point: a consumer receives deliveries and says what happened.

use std::time::Duration;

use crate::envelope::Envelope;

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
