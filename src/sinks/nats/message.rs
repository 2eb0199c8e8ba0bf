//! One event as one NATS message (its headers), and the publish result as
//! an outcome.

use std::time::Duration;

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::publish::PublishAck;
use async_nats::{HeaderMap, HeaderValue};

use crate::consumer::{Delivery, Outcome};

/// JetStream's "message size exceeds maximum allowed" (the stream's
/// `max_msg_size`): the same message will never fit.
const STREAM_MESSAGE_EXCEEDS_MAXIMUM: u64 = 10054;

/// The headers of a delivery's message (see the module docs of the sink),
/// or why the event cannot carry them: a value with a line break, which
/// the NATS header block cannot hold.
pub(super) fn headers(d: &Delivery) -> Result<HeaderMap, String> {
    let env = &d.envelope;
    let mut h = HeaderMap::new();
    h.insert("Nats-Msg-Id", env.event_id.to_string());
    h.insert("Outboxd-Event-Type", env.event_type.as_str());
    h.insert("Outboxd-Event-Version", env.event_version.to_string());
    let optional = [
        ("Outboxd-Tenant-Id", "tenant_id", d.tenant_id.as_deref()),
        (
            "Outboxd-Causation-Id",
            "causation_id",
            env.causation_id.as_deref(),
        ),
        (
            "Outboxd-Correlation-Id",
            "correlation_id",
            env.correlation_id.as_deref(),
        ),
        (
            "Outboxd-Ordering-Key",
            "ordering_key",
            d.ordering_key.as_deref(),
        ),
    ];
    for (name, column, value) in optional {
        let Some(value) = value else { continue };
        let value: HeaderValue = value.parse().map_err(|_| {
            format!(
                "{column} holds a line break, which the {name} header cannot carry; \
                 correct the row's {column} and requeue the event"
            )
        })?;
        h.insert(name, value);
    }
    h.insert("Outboxd-Attempt", d.attempt.to_string());
    if d.legacy {
        // As the webhook sink says it: the id is derived from the row, and
        // rows carrying the same event are not deduplicated in the outbox.
        h.insert("Outboxd-Legacy", "true");
    }
    // A checked context is printable ASCII: it always fits a header.
    for (name, value) in d.trace.iter().flat_map(|t| t.fields()) {
        h.insert(name, value);
    }
    Ok(h)
}

/// The outcome of one publish.
pub(super) fn outcome(
    result: Result<PublishAck, PublishError>,
    subject: &str,
    stream: &str,
    ack_timeout: Duration,
) -> Outcome {
    let e = match result {
        // A duplicate acknowledgement means the stream already holds this
        // event id: delivered all the same.
        Ok(_) => return Outcome::Delivered,
        Err(e) => e,
    };
    // A timeout, a lost connection, no responders: the broker is out of
    // reach (a paused node, a leader election), not this message at fault.
    match e.kind() {
        PublishErrorKind::TimedOut => Outcome::unavailable(format!(
            "no acknowledgement from JetStream within {ack_timeout:?} (ack_timeout) for the \
             message to {subject}"
        )),
        PublishErrorKind::BrokenPipe => Outcome::unavailable(format!(
            "the connection to NATS was lost before JetStream acknowledged the message to {subject}"
        )),
        // Only subjects the stream takes get this far, so no responders
        // means the stream cannot answer now (its server or leader is down).
        PublishErrorKind::StreamNotFound => Outcome::unavailable(format!(
            "no responders for {subject}: stream {stream} takes the subject but did not answer \
             (is its server or leader down?)"
        )),
        PublishErrorKind::MaxPayloadExceeded => Outcome::poison(format!(
            "the message to {subject} is larger than the NATS server accepts: {e}"
        )),
        _ if jetstream_code(&e) == Some(STREAM_MESSAGE_EXCEEDS_MAXIMUM) => {
            Outcome::poison(format!(
                "stream {stream} refused the message to {subject} as larger than its maximum \
             message size: {e}"
            ))
        }
        _ => Outcome::retry(format!("JetStream refused the message to {subject}: {e}")),
    }
}

fn jetstream_code(e: &PublishError) -> Option<u64> {
    std::error::Error::source(e)?
        .downcast_ref::<async_nats::jetstream::Error>()
        .map(|js| js.error_code().0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{Envelope, EventId, EventType};

    fn delivery() -> Delivery {
        Delivery {
            envelope: Envelope {
                event_id: EventId::new(),
                event_type: EventType::parse("article.created.v2").unwrap(),
                event_version: 2,
                causation_id: Some("cmd-1".into()),
                correlation_id: None,
                occurred_at: crate::Timestamp::from_millis(0),
                payload: serde_json::value::RawValue::from_string("{}".into()).unwrap(),
            },
            attempt: 3,
            consumer: "nats".into(),
            legacy: false,
            tenant_id: Some("acme".into()),
            ordering_key: None,
            trace: None,
            created_at: None,
        }
    }

    #[test]
    fn headers_carry_what_is_present() {
        let d = delivery();
        let h = headers(&d).unwrap();
        let get = |n: &str| h.get(n).map(|v| v.as_str().to_string());
        assert_eq!(get("Nats-Msg-Id"), Some(d.envelope.event_id.to_string()));
        assert_eq!(
            get("Outboxd-Event-Type").as_deref(),
            Some("article.created.v2")
        );
        assert_eq!(get("Outboxd-Event-Version").as_deref(), Some("2"));
        assert_eq!(get("Outboxd-Tenant-Id").as_deref(), Some("acme"));
        assert_eq!(get("Outboxd-Causation-Id").as_deref(), Some("cmd-1"));
        assert_eq!(get("Outboxd-Correlation-Id"), None);
        assert_eq!(get("Outboxd-Ordering-Key"), None);
        assert_eq!(get("Outboxd-Attempt").as_deref(), Some("3"));
        assert_eq!(get("Outboxd-Legacy"), None);
        let legacy = Delivery { legacy: true, ..d };
        let h = headers(&legacy).unwrap();
        assert_eq!(h.get("Outboxd-Legacy").map(|v| v.as_str()), Some("true"));
    }

    #[test]
    fn a_line_break_in_a_header_value_is_named() {
        let mut d = delivery();
        d.envelope.correlation_id = Some("req\r\nInjected: yes".into());
        let e = headers(&d).unwrap_err();
        assert!(
            e.contains("correlation_id") && e.contains("Outboxd-Correlation-Id"),
            "{e}"
        );
    }

    #[test]
    fn publish_errors_map_to_outcomes() {
        let t = Duration::from_secs(1);
        let o = |kind| outcome(Err(PublishError::new(kind)), "events.a", "S", t);
        assert!(matches!(
            o(PublishErrorKind::TimedOut),
            Outcome::Unavailable { .. }
        ));
        assert!(matches!(
            o(PublishErrorKind::BrokenPipe),
            Outcome::Unavailable { .. }
        ));
        assert!(matches!(
            o(PublishErrorKind::StreamNotFound),
            Outcome::Unavailable { .. }
        ));
        assert!(matches!(o(PublishErrorKind::Other), Outcome::Retry { .. }));
        assert!(matches!(
            o(PublishErrorKind::MaxPayloadExceeded),
            Outcome::Poison { .. }
        ));
    }
}
