//! `[tracing] otlp_endpoint` (feature `otlp`): `outboxd run` exports a span
//! per delivery attempt to an OTLP/HTTP collector, here a stand-in that
//! decodes the protobuf itself. The spans are the attempts' trace context:
//! the producer's trace id, the producer's span as parent, and the span id
//! the receiver got in `traceparent`.
#![cfg(feature = "otlp")]

use crate::common;

use common::bin::{Outboxd, Running, Sandbox, WAIT};
use common::http::{Answer, Receiver};
use common::wait_until;
use outboxd::trace::TraceParent;
use outboxd::Event;

const PRODUCER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TOKEN: &str = "Bearer OtlpCollectorToken-Xq81Zr";
const TOKEN_VAR: &str = "E2E_OTLP_TOKEN";
const HOOK_VAR: &str = "E2E_OTLP_HOOK_SECRET";

/// One protobuf field: its number and its varint, fixed or bytes value.
#[derive(Debug, Clone)]
enum Field<'a> {
    Varint(u64),
    Fixed(u64),
    Bytes(&'a [u8]),
}

/// A message's fields, in order (the wire format, read by hand).
fn fields(mut b: &[u8]) -> Vec<(u64, Field<'_>)> {
    fn varint(b: &mut &[u8]) -> u64 {
        let mut v = 0;
        for shift in (0..64).step_by(7) {
            let byte = b[0];
            *b = &b[1..];
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                break;
            }
        }
        v
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let key = varint(&mut b);
        let value = match key & 7 {
            0 => Field::Varint(varint(&mut b)),
            1 => {
                let (v, rest) = b.split_at(8);
                b = rest;
                Field::Fixed(u64::from_le_bytes(v.try_into().unwrap()))
            }
            2 => {
                let len = varint(&mut b) as usize;
                let (v, rest) = b.split_at(len);
                b = rest;
                Field::Bytes(v)
            }
            wire => panic!("wire type {wire} is not one outboxd writes"),
        };
        out.push((key >> 3, value));
    }
    out
}

fn all(b: &[u8], n: u64) -> Vec<&[u8]> {
    fields(b)
        .into_iter()
        .filter_map(|(f, v)| match v {
            Field::Bytes(x) if f == n => Some(x),
            _ => None,
        })
        .collect()
}

fn one(b: &[u8], n: u64) -> Option<&[u8]> {
    all(b, n).first().copied()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A decoded span: ids in hex, attributes as text.
#[derive(Debug)]
struct Span {
    trace_id: String,
    span_id: String,
    parent: String,
    start: u64,
    end: u64,
    attributes: Vec<(String, String)>,
}

impl Span {
    fn attr(&self, k: &str) -> &str {
        &self.attributes.iter().find(|(n, _)| n == k).unwrap().1
    }
}

fn key_values(b: &[u8], n: u64) -> Vec<(String, String)> {
    all(b, n)
        .into_iter()
        .map(|kv| {
            let key = String::from_utf8(one(kv, 1).unwrap().to_vec()).unwrap();
            let value = match &fields(one(kv, 2).unwrap())[0] {
                (1, Field::Bytes(s)) => String::from_utf8(s.to_vec()).unwrap(),
                (3, Field::Varint(i)) => i.to_string(),
                other => panic!("{other:?}"),
            };
            (key, value)
        })
        .collect()
}

/// Every span of one ExportTraceServiceRequest, with its resource.
fn decode(body: &[u8]) -> (Vec<(String, String)>, Vec<Span>) {
    let rs = one(body, 1).unwrap();
    let resource = key_values(one(rs, 1).unwrap(), 1);
    let mut spans = Vec::new();
    for scope_spans in all(rs, 2) {
        for s in all(scope_spans, 2) {
            let fixed = |n| {
                fields(s)
                    .into_iter()
                    .find_map(|(f, v)| match v {
                        Field::Fixed(t) if f == n => Some(t),
                        _ => None,
                    })
                    .unwrap()
            };
            spans.push(Span {
                trace_id: hex(one(s, 1).unwrap()),
                span_id: hex(one(s, 2).unwrap()),
                parent: hex(one(s, 4).unwrap_or_default()),
                start: fixed(7),
                end: fixed(8),
                attributes: key_values(s, 9),
            });
        }
    }
    (resource, spans)
}

/// An event traced by its producer goes to a webhook that fails the first
/// request: the collector gets one span per attempt, each with the
/// producer's trace id and span as parent, and as span id the traceparent
/// the receiver got; the resource names the configured service; the
/// collector's token reaches the collector and never the log.
#[test]
fn run_exports_a_span_per_attempt_with_the_producers_span_as_parent() {
    let db = Sandbox::migrated();
    let collector = Receiver::start(|_, _| Answer::new("200 OK", ""));
    let hook = Receiver::start(|_, earlier| {
        if earlier.is_empty() {
            Answer::new("500 Internal Server Error", "later")
        } else {
            Answer::new("200 OK", "ok")
        }
    });
    let config = db.write(
        "outboxd.toml",
        &format!(
            r#"[tracing]
otlp_endpoint = "http://{collector}"
service_name = "shop-relay"
resource_attributes = {{ "deployment.environment" = "test" }}
auth_header_env = "{TOKEN_VAR}"

[[consumer]]
name = "hook"
types = ["*"]
retry = {{ initial = "100ms", max_attempts = 3 }}
[consumer.sink]
kind = "webhook"
url = "http://{hook}/"
secret_env = "{HOOK_VAR}"
"#,
            collector = collector.addr,
            hook = hook.addr,
        ),
    );
    let producer = TraceParent::parse(PRODUCER).unwrap();
    let id = db.enqueue(&[Event::new("article.created.v1", &1)
        .unwrap()
        .traceparent(producer)])[0];
    let mut cmd = Outboxd::on(&db.path).command(&["run", "--config", config.to_str().unwrap()]);
    cmd.env(TOKEN_VAR, TOKEN)
        .env(HOOK_VAR, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
    let mut run = Running::spawn(&mut cmd);
    wait_until("the event delivered", WAIT, || {
        run.assert_alive();
        db.count("status = 'delivered'") == 1
    });
    // `run` exports what is queued before it exits.
    assert!(run.stop().success(), "{}", run.stderr());
    assert!(
        !run.stderr().contains("OtlpCollectorToken"),
        "{}",
        run.stderr()
    );

    let requests = collector.requests();
    assert!(!requests.is_empty(), "no export reached the collector");
    let mut spans = Vec::new();
    for req in &requests {
        assert_eq!(req.path, "/v1/traces");
        assert_eq!(req.header("content-type"), Some("application/x-protobuf"));
        assert_eq!(req.header("authorization"), Some(TOKEN));
        let (resource, s) = decode(&req.body);
        assert_eq!(resource[0], ("service.name".into(), "shop-relay".into()));
        assert!(resource.contains(&("deployment.environment".into(), "test".into())));
        spans.extend(s);
    }
    spans.sort_by_key(|s| s.start);
    let sent: Vec<String> = hook
        .requests()
        .iter()
        .map(|r| {
            TraceParent::parse(r.header("traceparent").unwrap())
                .unwrap()
                .span_id()
        })
        .collect();
    assert_eq!(spans.len(), 2, "{spans:?}");
    assert_eq!(sent.len(), 2);
    for (n, (span, sent)) in spans.iter().zip(&sent).enumerate() {
        assert_eq!(span.trace_id, producer.trace_id());
        assert_eq!(span.parent, producer.span_id());
        assert_eq!(&span.span_id, sent, "the span is the receiver's parent");
        assert!(span.end >= span.start);
        assert_eq!(span.attr("outboxd.event_id"), id.to_string());
        assert_eq!(span.attr("outboxd.event_type"), "article.created.v1");
        assert_eq!(span.attr("outboxd.consumer"), "hook");
        assert_eq!(span.attr("outboxd.attempt"), (n + 1).to_string());
        assert_eq!(
            span.attr("outboxd.outcome"),
            ["retry", "delivered"][n],
            "{span:?}"
        );
        let to_start: u64 = span.attr("outboxd.commit_to_start_ms").parse().unwrap();
        let to_outcome: u64 = span.attr("outboxd.commit_to_outcome_ms").parse().unwrap();
        assert!(to_outcome >= to_start);
    }
    assert_ne!(spans[0].span_id, spans[1].span_id);
}
