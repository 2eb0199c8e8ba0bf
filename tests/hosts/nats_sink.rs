//! The NATS sink as a library consumer, against a real `nats-server`
//! (tests/common/nats_server.rs): what is published, what counts as
//! delivered, what is poison, and every start-up error; each test that
//! needs a server on Debian's and on the current release
//! (tests/common/nats_versions.rs).
#![cfg(feature = "nats")]

use crate::common;
use crate::common::nats_server;
use crate::common::nats_versions;

use std::collections::HashSet;
use std::time::Duration;

use nats_server::{Auth, NatsServer, Settings, StreamAdmin};
use outboxd::relay::RetryPolicy;
use outboxd::sinks::nats::{CreateStream, NatsAuth, NatsError, NatsSink, Storage};
use outboxd::sinks::JsonlSink;
use outboxd::{Consumer, Delivery, Envelope, Event, EventId, EventType, Outcome, Relay, Timestamp};

const WAIT: Duration = Duration::from_secs(60);

fn delivery(ty: &str, tenant: Option<&str>) -> Delivery {
    let t = EventType::parse(ty).unwrap();
    Delivery::new(Envelope {
        event_id: EventId::new(),
        event_version: t.version(),
        event_type: t,
        causation_id: None,
        correlation_id: None,
        occurred_at: Timestamp::from_millis(1_764_487_080_123),
        payload: serde_json::value::RawValue::from_string(r#"{"id":7}"#.into()).unwrap(),
    })
    .consumer("nats")
    .tenant_id(tenant.map(str::to_string))
}

fn short_connect(
    b: outboxd::sinks::nats::NatsSinkBuilder,
) -> outboxd::sinks::nats::NatsSinkBuilder {
    b.connect_timeout(Duration::from_secs(2))
        .ack_timeout(Duration::from_secs(2))
}

/// Events through a relay with many workers: each is one message whose
/// body is byte for byte the JSONL sink's line, with the headers, and the
/// message ids are the event ids.
#[test]
fn every_event_becomes_one_message_with_the_envelope_and_headers() {
    nats_versions::each(|| {
        let server = NatsServer::start();
        let admin = StreamAdmin::connect(&[server.url()]);
        admin.create("EVENTS", &["events.>"], 1);
        let db = common::TestDb::new();
        let n = 2_000u64;
        let events: Vec<Event> = (0..n)
            .map(|i| {
                let e = common::event("article.created.v1", i);
                match i % 4 {
                    0 => e
                        .tenant("acme")
                        .causation_id("cmd-1")
                        .correlation_id(format!("req-{i}")),
                    1 => e.ordering_key(format!("article-{}", i % 10)),
                    _ => e,
                }
            })
            .collect();
        db.enqueue(&events);
        let jsonl = db.file("events.jsonl");
        let sink = short_connect(NatsSink::builder([server.url()], "EVENTS"))
            .build()
            .unwrap();
        let relay = Relay::builder(&db.path)
            .consumer("nats", ["*"], sink)
            .consumer("jsonl", ["*"], JsonlSink::file(&jsonl, false).unwrap())
            .workers(16)
            .build()
            .unwrap()
            .start()
            .unwrap();
        common::wait_until("every event delivered", WAIT, || {
            db.count("status = 'delivered'") == n as i64
        });
        relay.shutdown(Duration::from_secs(5)).unwrap();

        assert_eq!(admin.count("EVENTS"), n);
        let messages = admin.read_all("EVENTS");
        let lines: HashSet<String> = std::fs::read_to_string(&jsonl)
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(lines.len(), n as usize);
        let mut ids = HashSet::new();
        for m in &messages {
            let body = String::from_utf8(m.body.clone()).unwrap();
            assert!(lines.contains(&body), "body is not a JSONL line: {body}");
            let env: Envelope = serde_json::from_str(&body).unwrap();
            assert_eq!(
                m.header("Nats-Msg-Id"),
                Some(env.event_id.to_string().as_str())
            );
            assert!(
                ids.insert(env.event_id),
                "message id {} twice",
                env.event_id
            );
            assert_eq!(m.subject, "events.article.created.v1");
            assert_eq!(m.header("Outboxd-Event-Type"), Some("article.created.v1"));
            assert_eq!(m.header("Outboxd-Event-Version"), Some("1"));
            assert_eq!(m.header("Outboxd-Attempt"), Some("1"));
            assert_eq!(
                m.header("Outboxd-Correlation-Id"),
                env.correlation_id.as_deref()
            );
            assert_eq!(
                m.header("Outboxd-Causation-Id"),
                env.causation_id.as_deref()
            );
            let tenant = m.header("Outboxd-Tenant-Id");
            assert_eq!(
                tenant.is_some(),
                env.causation_id.is_some(),
                "tenant rides with cmd-1"
            );
            if let Some(key) = m.header("Outboxd-Ordering-Key") {
                assert!(key.starts_with("article-"), "{key}");
            }
        }
        let keyed = messages
            .iter()
            .filter(|m| m.header("Outboxd-Ordering-Key").is_some())
            .count();
        assert_eq!(keyed, (n / 4) as usize);
    });
}

/// An event enqueued with the producer's W3C trace context reaches a
/// subscriber with `traceparent` and `tracestate` headers: the producer's
/// trace id and state under a span id of the attempt's own; the body is the
/// envelope, which carries no trace context.
#[test]
fn the_message_carries_a_child_of_the_producers_trace_context() {
    nats_versions::each(|| {
        use outboxd::trace::{TraceParent, TraceState};
        let server = NatsServer::start();
        let admin = StreamAdmin::connect(&[server.url()]);
        admin.create("EVENTS", &["events.>"], 1);
        let db = common::TestDb::new();
        let producer =
            TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        let state = TraceState::parse("congo=t61rcWkgMzE").unwrap().unwrap();
        db.enqueue(&[common::event("article.created.v1", 1)
            .traceparent(producer)
            .tracestate(state.clone())]);
        let sink = short_connect(NatsSink::builder([server.url()], "EVENTS"))
            .build()
            .unwrap();
        let relay = Relay::builder(&db.path)
            .consumer("nats", ["*"], sink)
            .build()
            .unwrap()
            .start()
            .unwrap();
        common::wait_until("the event delivered", WAIT, || {
            db.count("status = 'delivered'") == 1
        });
        relay.shutdown(Duration::from_secs(5)).unwrap();
        let m = &admin.read_all("EVENTS")[0];
        let got = TraceParent::parse(m.header("traceparent").unwrap()).unwrap();
        assert_eq!(got.trace_id(), producer.trace_id());
        assert_ne!(got.span_id(), producer.span_id());
        assert!(got.sampled());
        assert_eq!(m.header("tracestate"), Some(state.as_str()));
        let body = String::from_utf8(m.body.clone()).unwrap();
        assert!(!body.contains("trace"), "{body}");
    });
}

/// A second publish of the same event (a replay, or a crash after the
/// publish) gets a duplicate acknowledgement: delivered, and stored once.
#[test]
fn a_repeat_is_delivered_and_stored_once() {
    nats_versions::each(|| {
        let server = NatsServer::start();
        let admin = StreamAdmin::connect(&[server.url()]);
        admin.create("EVENTS", &["events.>"], 1);
        let sink = short_connect(NatsSink::builder([server.url()], "EVENTS"))
            .build()
            .unwrap();
        let d = delivery("article.created.v1", None);
        assert_eq!(sink.deliver(&d), Outcome::Delivered);
        let mut again = d.clone();
        again.attempt = 2;
        assert_eq!(sink.deliver(&again), Outcome::Delivered);
        assert_eq!(admin.count("EVENTS"), 1);
        let m = &admin.read_all("EVENTS")[0];
        assert_eq!(
            m.header("Outboxd-Attempt"),
            Some("1"),
            "the first publish is the one kept"
        );
    });
}

fn poison_reason(o: Outcome) -> String {
    match o {
        Outcome::Poison { reason } => reason,
        other => panic!("expected poison, got {other:?}"),
    }
}

#[test]
fn what_can_never_be_stored_is_poison_with_the_reason() {
    nats_versions::each(|| {
        let server = NatsServer::with(Settings {
            max_payload: Some(4096),
            ..Settings::default()
        });
        let admin = StreamAdmin::connect(&[server.url()]);
        admin.create("EVENTS", &["events.article.>", "events.t.*.>"], 1);

        // A subject the stream does not take (it takes only some of the
        // template's subjects: a warning at start, poison per event).
        let sink = short_connect(NatsSink::builder([server.url()], "EVENTS"))
            .build()
            .unwrap();
        let r = poison_reason(sink.deliver(&delivery("user.created.v1", None)));
        assert!(
            r.contains("events.user.created.v1") && r.contains("EVENTS"),
            "{r}"
        );
        assert_eq!(
            sink.deliver(&delivery("article.created.v1", None)),
            Outcome::Delivered
        );

        // Larger than the server's max_payload.
        let mut big = delivery("article.created.v1", None);
        big.envelope.payload =
            serde_json::value::RawValue::from_string(format!("\"{}\"", "x".repeat(5000))).unwrap();
        let r = poison_reason(sink.deliver(&big));
        assert!(r.contains("larger"), "{r}");

        // Headers that make the message larger than the server's max_payload
        // (they count, as the body does): poison too.
        let mut long_header = delivery("article.created.v1", None);
        long_header.envelope.correlation_id = Some("r".repeat(5000));
        let r = poison_reason(sink.deliver(&long_header));
        assert!(r.contains("larger"), "{r}");

        // A header value with a line break.
        let mut crlf = delivery("article.created.v1", None);
        crlf.envelope.causation_id = Some("a\r\nb".into());
        let r = poison_reason(sink.deliver(&crlf));
        assert!(r.contains("causation_id"), "{r}");

        // A tenant that cannot be one subject token.
        let tenant_sink = short_connect(NatsSink::builder([server.url()], "EVENTS"))
            .subject("events.t.{tenant}.{event_type}")
            .build()
            .unwrap();
        assert_eq!(
            tenant_sink.deliver(&delivery("article.created.v1", Some("acme"))),
            Outcome::Delivered
        );
        let r = poison_reason(tenant_sink.deliver(&delivery("article.created.v1", Some("a.b"))));
        assert!(r.contains("tenant id \"a.b\""), "{r}");
        assert_eq!(admin.count("EVENTS"), 2);
    });
}

/// Regression (review of issue 13): the stream's subjects were read once at
/// start-up, and an event whose subject was not among them was
/// dead-lettered, so widening the stream's subjects needed a restart and
/// lost (to the dead letters) every event meanwhile.
#[test]
fn a_stream_widened_while_the_relay_runs_takes_the_new_subjects_without_a_restart() {
    nats_versions::each(|| {
        let server = NatsServer::start();
        let admin = StreamAdmin::connect(&[server.url()]);
        admin.create("EVENTS", &["events.article.>"], 1);
        let db = common::TestDb::new();
        let sink = short_connect(NatsSink::builder([server.url()], "EVENTS"))
            .build()
            .unwrap();
        // Quick retries that never run out: only poison dead-letters here.
        let retry = RetryPolicy::default()
            .initial(Duration::from_millis(50))
            .max_delay(Duration::from_millis(200))
            .max_attempts(1000)
            .jitter(0.0);
        let relay = Relay::builder(&db.path)
            .consumer("nats", ["*"], sink)
            .retry_policy(retry)
            .workers(4)
            .build()
            .unwrap()
            .start()
            .unwrap();
        // Not taken, as the stream's info fetched for it confirms: poison.
        db.enqueue(&[common::event("user.created.v1", 0)]);
        common::wait_until("the first event dead-lettered", WAIT, || {
            db.count("status = 'dead'") == 1
        });
        let reason: String = db.scalar("SELECT last_error FROM event_outbox WHERE status = 'dead'");
        assert!(
            reason.contains("events.user.created.v1")
                && reason.contains("events.article.>")
                && reason.contains("checked as this event was delivered"),
            "{reason}"
        );

        admin.set_subjects("EVENTS", &["events.>"]);
        let n = 20;
        db.enqueue(
            &(1..=n)
                .map(|i| common::event("user.created.v1", i))
                .collect::<Vec<_>>(),
        );
        common::wait_until("the events after the widening delivered", WAIT, || {
            db.count("status = 'delivered'") == n as i64
        });
        assert_eq!(
            db.count("status = 'dead'"),
            1,
            "nothing dead-lettered after the widening"
        );
        relay.shutdown(Duration::from_secs(5)).unwrap();
        assert_eq!(admin.count("EVENTS"), n);
    });
}

#[test]
fn a_missing_stream_is_an_error_naming_it_and_the_subject_unless_created() {
    nats_versions::each(|| {
        let server = NatsServer::start();
        let e = short_connect(NatsSink::builder([server.url()], "ORDERS"))
            .subject("orders.{event_type}")
            .build()
            .unwrap_err();
        assert!(matches!(e, NatsError::StreamMissing { .. }), "{e:?}");
        assert_eq!(e.field(), "stream");
        let msg = e.to_string();
        assert!(
            msg.contains("ORDERS")
                && msg.contains("orders.{event_type}")
                && msg.contains("orders.>"),
            "{msg}"
        );

        // probe says the same without creating anything.
        let probe = short_connect(NatsSink::builder([server.url()], "ORDERS")).probe();
        assert!(
            matches!(probe, Err(NatsError::StreamMissing { .. })),
            "{probe:?}"
        );

        // create_stream creates it with the settings given.
        let spec = CreateStream {
            replicas: 1,
            duplicate_window: Duration::from_secs(600),
            max_age: Duration::from_secs(86_400),
            storage: Storage::File,
        };
        let builder = short_connect(NatsSink::builder([server.url()], "ORDERS"))
            .subject("orders.{event_type}")
            .create_stream(Some(spec));
        assert_eq!(builder.probe().unwrap(), None, "missing, to be created");
        let sink = builder.clone().build().unwrap();
        let s = sink.stream().unwrap();
        assert!(s.created);
        assert_eq!(s.subjects, ["orders.>"]);
        assert_eq!(s.duplicate_window, Duration::from_secs(600));
        assert_eq!(
            sink.deliver(&delivery("order.paid.v1", None)),
            Outcome::Delivered
        );
        let admin = StreamAdmin::connect(&[server.url()]);
        assert_eq!(admin.duplicate_window("ORDERS"), Duration::from_secs(600));
        let probed = builder.probe().unwrap().unwrap();
        assert_eq!((probed.messages, probed.created), (1, false));
    });
}

#[test]
fn a_stream_taking_none_of_the_subjects_is_an_error_naming_both() {
    nats_versions::each(|| {
        let server = NatsServer::start();
        StreamAdmin::connect(&[server.url()]).create("EVENTS", &["other.>"], 1);
        let e = short_connect(NatsSink::builder([server.url()], "EVENTS"))
            .build()
            .unwrap_err();
        assert_eq!(e.field(), "stream");
        let msg = e.to_string();
        assert!(
            msg.contains("EVENTS")
                && msg.contains("other.>")
                && msg.contains("events.{event_type}"),
            "{msg}"
        );
    });
}

#[test]
fn refused_credentials_are_an_error_naming_the_credential() {
    nats_versions::each(|| {
        let server = NatsServer::with(Settings {
            auth: Auth::Token("right-token".into()),
            ..Settings::default()
        });
        let e = short_connect(NatsSink::builder([server.url()], "EVENTS"))
            .auth(NatsAuth::Token("wrong-token".into()))
            .build()
            .unwrap_err();
        assert!(matches!(e, NatsError::Authorization { .. }), "{e:?}");
        assert_eq!(e.field(), "token");
        assert!(
            !e.to_string().contains("wrong-token"),
            "no secret in errors: {e}"
        );

        let server = NatsServer::with(Settings {
            auth: Auth::UserPassword("outboxd".into(), "s3cret".into()),
            ..Settings::default()
        });
        let e = short_connect(NatsSink::builder([server.url()], "EVENTS"))
            .auth(NatsAuth::UserPassword {
                user: "outboxd".into(),
                password: "nope".into(),
            })
            .build()
            .unwrap_err();
        assert_eq!(e.field(), "password", "{e}");
        // The right ones get as far as the stream check.
        let e = short_connect(NatsSink::builder([server.url()], "EVENTS"))
            .auth(NatsAuth::UserPassword {
                user: "outboxd".into(),
                password: "s3cret".into(),
            })
            .build()
            .unwrap_err();
        assert!(matches!(e, NatsError::StreamMissing { .. }), "{e:?}");
    });
}

#[test]
fn bad_settings_are_refused_before_connecting() {
    let b = |servers: &[&str]| NatsSink::builder(servers.iter().copied(), "EVENTS");
    let field = |r: Result<(), NatsError>| r.unwrap_err().field();
    assert_eq!(field(b(&[]).validate()), "servers");
    assert_eq!(field(b(&["http://127.0.0.1:4222"]).validate()), "servers");
    assert_eq!(field(b(&["127.0.0.1:4222"]).validate()), "servers");
    let e = b(&["nats://user:pw@127.0.0.1:4222"])
        .validate()
        .unwrap_err();
    assert!(
        e.to_string().contains("credentials") && !e.to_string().contains("pw"),
        "{e}"
    );
    assert_eq!(
        field(
            b(&["nats://127.0.0.1:1"])
                .subject("events.{nope}")
                .validate()
        ),
        "subject"
    );
    assert_eq!(
        field(NatsSink::builder(["nats://127.0.0.1:1"], "a.b").validate()),
        "stream"
    );
    assert_eq!(
        field(
            b(&["nats://127.0.0.1:1"])
                .ack_timeout(Duration::ZERO)
                .validate()
        ),
        "ack_timeout"
    );
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.creds");
    let e = b(&["nats://127.0.0.1:1"])
        .auth(NatsAuth::CredsFile(missing.clone()))
        .validate()
        .unwrap_err();
    assert_eq!(e.field(), "creds_file");
    assert!(e.to_string().contains("nope.creds"), "{e}");
    let seed = dir.path().join("seed.nk");
    std::fs::write(&seed, "not a seed").unwrap();
    let e = b(&["nats://127.0.0.1:1"])
        .auth(NatsAuth::NkeySeedFile(seed))
        .validate()
        .unwrap_err();
    assert_eq!(e.field(), "nkey_seed_file");
    let e = b(&["nats://127.0.0.1:1"])
        .create_stream(Some(CreateStream {
            replicas: 7,
            ..CreateStream::default()
        }))
        .validate()
        .unwrap_err();
    assert_eq!(e.field(), "create_stream.replicas");
}

/// A server that is down when the sink starts: the sink is built, answers
/// Retry at once (it never holds a worker for a timeout), and delivers once
/// the server is up.
#[test]
fn an_unreachable_server_is_waited_for() {
    nats_versions::each(|| {
        let mut server = NatsServer::start();
        StreamAdmin::connect(&[server.url()]).create("EVENTS", &["events.>"], 1);
        server.stop();
        // An hour to wait for an acknowledgement: a deliver that waited for
        // one, instead of answering at once, could not answer within WAIT.
        let sink = std::sync::Arc::new(
            short_connect(NatsSink::builder([server.url()], "EVENTS"))
                .ack_timeout(Duration::from_secs(3600))
                .build()
                .expect("an unreachable server is not a start-up error"),
        );
        let d = delivery("article.created.v1", None);
        let (tx, rx) = std::sync::mpsc::channel();
        // Not a scoped thread: a failing test must not wait the hour for it.
        std::thread::spawn({
            let (sink, d) = (sink.clone(), d.clone());
            move || tx.send(sink.deliver(&d))
        });
        let outcome = rx
            .recv_timeout(WAIT)
            .expect("a retry must not wait for the ack timeout");
        match outcome {
            Outcome::Unavailable { reason, .. } => {
                assert!(reason.contains("not connected"), "{reason}")
            }
            other => panic!("expected an unavailable destination, got {other:?}"),
        }
        server.start_again();
        common::wait_until("the sink to deliver after the server came up", WAIT, || {
            sink.deliver(&d) == Outcome::Delivered
        });
        assert_eq!(StreamAdmin::connect(&[server.url()]).count("EVENTS"), 1);
    });
}

/// examples/nats_consumer.rs, the README's downstream consumer, reads what
/// the sink published: one line per event, in order.
#[test]
fn the_example_consumer_reads_the_published_events() {
    nats_versions::each(|| {
        let server = NatsServer::start();
        StreamAdmin::connect(&[server.url()]).create("EVENTS", &["events.>"], 1);
        let sink = short_connect(NatsSink::builder([server.url()], "EVENTS"))
            .build()
            .unwrap();
        let deliveries: Vec<Delivery> = (0..5)
            .map(|_| delivery("article.created.v1", None))
            .collect();
        for d in &deliveries {
            assert_eq!(sink.deliver(d), Outcome::Delivered);
        }
        // The example's own code (included as a module by tests/hosts.rs), not
        // a build of it: a test never runs cargo.
        let mut out = Vec::new();
        crate::nats_consumer::run(server.url().as_str(), "EVENTS", 5, &mut out).unwrap();
        let ids: Vec<String> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| l.split(' ').next().unwrap().to_string())
            .collect();
        let expected: Vec<String> = deliveries
            .iter()
            .map(|d| d.envelope.event_id.to_string())
            .collect();
        assert_eq!(ids, expected);
    });
}
