//! W3C trace context from the producer's transaction to every sink: the
//! webhook, command, sql and jsonl sinks each send a child of the
//! producer's `traceparent` (the same trace id, a new span id for every
//! attempt), and an invalid value a foreign producer stored is dropped,
//! never a dead letter.
#![cfg(feature = "sinks")]

use crate::common;

use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::http::{Answer, Receiver};
use common::relay::{stop, StartRelay};
use outboxd::consumer::{Delivery, Outcome};
use outboxd::relay::RetryPolicy;
use outboxd::sinks::{CommandSink, JsonlSink, SqlSink, WebhookSink};
use outboxd::trace::{TraceContext, TraceParent, TraceState};
use outboxd::{Envelope, Event, EventId};

const PRODUCER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const STATE: &str = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";
const WAIT: Duration = Duration::from_secs(60);

/// A received traceparent: a child of [`PRODUCER`] (same trace id, the
/// sampled flag, a span id of its own). Returns its span id.
fn child_span(traceparent: &str) -> String {
    let producer = TraceParent::parse(PRODUCER).unwrap();
    let got = TraceParent::parse(traceparent).unwrap();
    assert_eq!(got.trace_id(), producer.trace_id(), "{traceparent}");
    assert!(got.sampled(), "{traceparent}");
    assert_ne!(got.span_id(), producer.span_id(), "{traceparent}");
    got.span_id()
}

/// One event enqueued with the producer's context reaches a webhook (that
/// fails its first request), a command, a sql sink and a jsonl file: each
/// sees the producer's trace id and state under a span id of its own, the
/// webhook's retry a second one; the envelope (the webhook's body, what the
/// command reads) carries no trace context.
#[test]
fn every_sink_sends_a_child_of_the_producers_context_per_attempt() {
    let db = common::TestDb::new();
    db.conn()
        .execute_batch("CREATE TABLE seen (event_id TEXT, traceparent TEXT, tracestate TEXT)")
        .unwrap();
    let event = Event::new("article.created.v1", &serde_json::json!({"id": 7}))
        .unwrap()
        .traceparent(TraceParent::parse(PRODUCER).unwrap())
        .tracestate(TraceState::parse(STATE).unwrap().unwrap());
    let id = db.enqueue(&[event])[0];
    let (parent, state): (String, String) = db
        .conn()
        .query_row(
            "SELECT traceparent, tracestate FROM event_outbox",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((parent.as_str(), state.as_str()), (PRODUCER, STATE));

    let hook = Receiver::start(|_, before| {
        if before.is_empty() {
            Answer::new("500 Internal Server Error", "not yet")
        } else {
            Answer::new("200 OK", "thanks")
        }
    });
    let script = db.write(
        "env.sh",
        "cat > /dev/null; printf '%s %s\\n' \"$TRACEPARENT\" \"$TRACESTATE\" >> \"$OUT/env\"\n",
    );
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let command = CommandSink::new("/bin/sh", [&script])
        .unwrap()
        .env("OUT", db.file(""))
        // Set in outboxd's own environment: the event's context replaces it.
        .env("TRACEPARENT", "00-inherited");
    let jsonl = db.file("events.jsonl");
    let relay = db
        .relay()
        .consumer(
            "hook",
            ["*"],
            WebhookSink::builder(hook.url("/"))
                .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
                .build()
                .unwrap(),
        )
        .consumer("cmd", ["*"], command)
        .consumer(
            "jsonl",
            ["*"],
            JsonlSink::file(&jsonl, false)
                .unwrap()
                .delivery_fields(true),
        )
        .transactional_consumer(
            "sql",
            ["*"],
            SqlSink::new(["INSERT INTO seen VALUES (:event_id, :traceparent, :tracestate)"])
                .unwrap(),
        )
        .retry_policy(
            RetryPolicy::default()
                .initial(Duration::from_millis(10))
                .jitter(0.0),
        )
        .started();
    common::wait_until("the event delivered", WAIT, || {
        db.count("status = 'delivered'") == 1
    });
    stop(relay);

    let mut spans = HashSet::new();
    let requests = hook.requests();
    assert_eq!(requests.len(), 2, "one failed attempt, one retry");
    for req in &requests {
        assert!(spans.insert(child_span(req.header("traceparent").unwrap())));
        assert_eq!(req.header("tracestate"), Some(STATE));
        let body: serde_json::Value = serde_json::from_slice(&req.body).unwrap();
        let envelope: Envelope = serde_json::from_value(body).unwrap();
        assert_eq!(envelope.event_id, id);
    }
    let env = std::fs::read_to_string(db.file("env")).unwrap();
    let (parent, state) = env.trim().split_once(' ').unwrap();
    assert!(spans.insert(child_span(parent)));
    assert_eq!(state, STATE);
    let (event_id, parent, state): (String, String, String) = db
        .conn()
        .query_row("SELECT * FROM seen", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert_eq!(event_id, id.to_string());
    assert!(spans.insert(child_span(&parent)));
    assert_eq!(state, STATE);
    let line: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&jsonl).unwrap().trim()).unwrap();
    assert!(spans.insert(child_span(line["traceparent"].as_str().unwrap())));
    assert_eq!(line["tracestate"], STATE);
    assert_eq!(spans.len(), 5, "a span id per attempt");
}

/// Each delivered event's id and the trace context its consumer saw.
type Seen = Arc<Mutex<Vec<(EventId, Option<TraceContext>)>>>;

/// A consumer that records what it saw of each event's trace context.
fn recorder() -> (Seen, impl Fn(&Delivery) -> Outcome + Send + Sync + 'static) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let consumer = move |d: &Delivery| {
        log.lock()
            .unwrap()
            .push((d.envelope.event_id, d.trace.clone()));
        Outcome::Delivered
    };
    (seen, consumer)
}

/// Rows a foreign producer wrote with values W3C Trace Context refuses are
/// delivered: an invalid traceparent without any context, a valid one with
/// an invalid tracestate without the state; a number where text belongs is
/// dropped too. None is dead-lettered.
#[test]
fn invalid_trace_context_from_a_foreign_producer_is_dropped_and_the_event_delivered() {
    let db = common::TestDb::new();
    let upper = PRODUCER.to_uppercase();
    let zeros = format!("00-{}-00f067aa0ba902b7-01", "0".repeat(32));
    let rows: [(&str, rusqlite::types::Value, Option<&str>); 5] = [
        ("01JDQ8F6ZC1Y0D3W9N7K2M4P50", upper.clone().into(), None),
        ("01JDQ8F6ZC1Y0D3W9N7K2M4P51", zeros.into(), Some(STATE)),
        (
            "01JDQ8F6ZC1Y0D3W9N7K2M4P52",
            PRODUCER.to_string().into(),
            Some("Bad=1"),
        ),
        ("01JDQ8F6ZC1Y0D3W9N7K2M4P53", 42i64.into(), None),
        (
            "01JDQ8F6ZC1Y0D3W9N7K2M4P54",
            PRODUCER.to_string().into(),
            Some(STATE),
        ),
    ];
    let conn = db.conn();
    for (id, parent, state) in &rows {
        conn.execute(
            "INSERT INTO event_outbox (event_id, event_type, payload, traceparent, tracestate)
             VALUES (?1, 'article.created.v1', '{}', ?2, ?3)",
            rusqlite::params![id, parent, state],
        )
        .unwrap();
    }
    let (seen, consumer) = recorder();
    let relay = db.relay().consumer("rec", ["*"], consumer).started();
    common::wait_until("every row delivered", WAIT, || {
        db.count("status = 'delivered'") == rows.len() as i64
    });
    stop(relay);
    assert_eq!(db.count("status <> 'delivered'"), 0);

    let seen = seen.lock().unwrap();
    let trace_of = |id: &str| {
        let id = EventId::parse(id).unwrap();
        seen.iter().find(|(e, _)| *e == id).unwrap().1.clone()
    };
    assert_eq!(trace_of(rows[0].0), None);
    assert_eq!(trace_of(rows[1].0), None);
    let kept = trace_of(rows[2].0).expect("the traceparent is kept");
    child_span(&kept.traceparent.to_string());
    assert_eq!(kept.tracestate, None);
    assert_eq!(trace_of(rows[3].0), None);
    let whole = trace_of(rows[4].0).expect("a valid context");
    child_span(&whole.traceparent.to_string());
    assert_eq!(whole.tracestate.unwrap().as_str(), STATE);
}

/// The builder stores what it was given; a tracestate without a
/// traceparent is not stored (alone it means nothing).
#[test]
fn a_tracestate_alone_is_not_stored() {
    let db = common::TestDb::new();
    let state = TraceState::parse(STATE).unwrap().unwrap();
    db.enqueue(&[
        Event::new("a.b.v1", &1).unwrap().tracestate(state),
        Event::new("a.b.v1", &2).unwrap(),
    ]);
    assert_eq!(db.count("traceparent IS NULL AND tracestate IS NULL"), 2);
}
