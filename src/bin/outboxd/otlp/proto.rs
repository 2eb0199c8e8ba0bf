//! The few OTLP protobuf messages `run` sends, encoded by hand:
//! `ExportTraceServiceRequest` with one `ResourceSpans` of one `ScopeSpans`
//! (opentelemetry-proto, trace/v1/trace.proto and common/v1/common.proto).
//! Only the fields outboxd fills are written; a receiver reads the others
//! as their defaults.

/// An attribute's value (`AnyValue`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Str(String),
    Int(i64),
}

/// One finished span.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Span {
    pub(crate) trace_id: [u8; 16],
    pub(crate) span_id: [u8; 8],
    pub(crate) parent_span_id: Option<[u8; 8]>,
    pub(crate) trace_state: Option<String>,
    pub(crate) name: String,
    pub(crate) start_unix_nano: u64,
    pub(crate) end_unix_nano: u64,
    pub(crate) attributes: Vec<(&'static str, Value)>,
    /// `Some(message)`: status ERROR with it; `None`: status OK.
    pub(crate) error: Option<String>,
}

/// `SPAN_KIND_PRODUCER`: the attempt hands the event to a receiver.
const SPAN_KIND_PRODUCER: u64 = 4;
const STATUS_CODE_OK: u64 = 1;
const STATUS_CODE_ERROR: u64 = 2;

/// `ExportTraceServiceRequest { resource_spans: [ResourceSpans {
/// resource, scope_spans: [ScopeSpans { scope, spans }] }] }`.
pub(crate) fn export_request(resource: &[(String, String)], spans: &[Span]) -> Vec<u8> {
    let mut res = Vec::new();
    for (k, v) in resource {
        message(&mut res, 1, &key_value(k, &Value::Str(v.clone())));
    }
    let mut scope = Vec::new();
    string(&mut scope, 1, "outboxd");
    string(&mut scope, 2, env!("CARGO_PKG_VERSION"));
    let mut scope_spans = Vec::new();
    message(&mut scope_spans, 1, &scope);
    for s in spans {
        message(&mut scope_spans, 2, &span(s));
    }
    let mut resource_spans = Vec::new();
    message(&mut resource_spans, 1, &res);
    message(&mut resource_spans, 2, &scope_spans);
    let mut out = Vec::new();
    message(&mut out, 1, &resource_spans);
    out
}

fn span(s: &Span) -> Vec<u8> {
    let mut b = Vec::new();
    bytes(&mut b, 1, &s.trace_id);
    bytes(&mut b, 2, &s.span_id);
    if let Some(state) = &s.trace_state {
        string(&mut b, 3, state);
    }
    if let Some(parent) = &s.parent_span_id {
        bytes(&mut b, 4, parent);
    }
    string(&mut b, 5, &s.name);
    varint_field(&mut b, 6, SPAN_KIND_PRODUCER);
    fixed64(&mut b, 7, s.start_unix_nano);
    fixed64(&mut b, 8, s.end_unix_nano);
    for (k, v) in &s.attributes {
        message(&mut b, 9, &key_value(k, v));
    }
    let mut status = Vec::new();
    match &s.error {
        Some(m) => {
            string(&mut status, 2, m);
            varint_field(&mut status, 3, STATUS_CODE_ERROR);
        }
        None => varint_field(&mut status, 3, STATUS_CODE_OK),
    }
    message(&mut b, 15, &status);
    b
}

fn key_value(k: &str, v: &Value) -> Vec<u8> {
    let mut any = Vec::new();
    match v {
        Value::Str(s) => string(&mut any, 1, s),
        Value::Int(n) => varint_field(&mut any, 3, *n as u64),
    }
    let mut kv = Vec::new();
    string(&mut kv, 1, k);
    message(&mut kv, 2, &any);
    kv
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn tag(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

fn varint_field(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, 0);
    varint(out, v);
}

fn fixed64(out: &mut Vec<u8>, field: u32, v: u64) {
    tag(out, field, 1);
    out.extend_from_slice(&v.to_le_bytes());
}

fn bytes(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    tag(out, field, 2);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn string(out: &mut Vec<u8>, field: u32, s: &str) {
    bytes(out, field, s.as_bytes());
}

fn message(out: &mut Vec<u8>, field: u32, m: &[u8]) {
    bytes(out, field, m);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known encodings: a varint over several bytes, and a whole request
    /// whose bytes were checked field by field against trace.proto.
    #[test]
    fn encodes_the_wire_format() {
        let mut b = Vec::new();
        varint(&mut b, 300);
        assert_eq!(b, [0xac, 0x02]);
        let span = Span {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent_span_id: Some([3; 8]),
            trace_state: None,
            name: "n".into(),
            start_unix_nano: 5,
            end_unix_nano: 6,
            attributes: vec![("a", Value::Int(7))],
            error: None,
        };
        let body = super::span(&span);
        let mut expected = vec![0x0a, 16];
        expected.extend([1; 16]);
        expected.extend([0x12, 8]);
        expected.extend([2; 8]);
        expected.extend([0x22, 8]);
        expected.extend([3; 8]);
        expected.extend([0x2a, 1, b'n', 0x30, 4, 0x39]);
        expected.extend(5u64.to_le_bytes());
        expected.push(0x41);
        expected.extend(6u64.to_le_bytes());
        // attributes: KeyValue { key "a", value AnyValue { int_value 7 } }
        expected.extend([0x4a, 7, 0x0a, 1, b'a', 0x12, 2, 0x18, 7]);
        // status { code OK }
        expected.extend([0x7a, 2, 0x18, 1]);
        assert_eq!(body, expected);
    }
}
