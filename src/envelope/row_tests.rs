//! Tests of row.rs: the check of a stored row and its owned copy.

use super::*;

fn row<'a>(event_type: &'a str, version: ValueRef<'a>, payload: &'a [u8]) -> RawRow<'a> {
    RawRow {
        row_id: 7,
        event_id: ValueRef::Null,
        event_type: ValueRef::Text(event_type.as_bytes()),
        event_version: version,
        causation_id: ValueRef::Null,
        correlation_id: ValueRef::Text(b"req-1"),
        payload: ValueRef::Text(payload),
        occurred_at: ValueRef::Integer(1_000),
        created_at: ValueRef::Integer(2_000),
        tenant_id: ValueRef::Null,
        traceparent: ValueRef::Null,
        tracestate: ValueRef::Null,
    }
}

fn from_row(r: RawRow<'_>) -> Result<Envelope, EnvelopeError> {
    check_row(&r).map(|c| c.envelope)
}

/// Regression (found by fuzz/foreign_row): from_row took any
/// occurred_at, and one past year 9999 came out of to_json as 1970.
#[test]
fn from_row_refuses_a_time_an_envelope_cannot_carry() {
    let mut r = row("a.b.v1", ValueRef::Null, b"{}");
    r.occurred_at = ValueRef::Integer(i64::MAX);
    let e = from_row(r).unwrap_err();
    assert!(e.to_string().contains("occurred_at"), "{e}");
    r.occurred_at = ValueRef::Integer(253_402_300_799_999);
    let env = from_row(r).unwrap();
    let back: Envelope = serde_json::from_str(&env.to_json()).unwrap();
    assert_eq!(back, env);
}

#[test]
fn from_row_accepts_legacy_rows_with_a_stable_id() {
    let a = from_row(row("a.b.v1", ValueRef::Null, b"{}")).unwrap();
    let b = from_row(row("a.b.v1", ValueRef::Null, b"{}")).unwrap();
    assert_eq!(a.event_id, b.event_id);
    assert_eq!(a.event_version, 1);
    assert_eq!(a.correlation_id.as_deref(), Some("req-1"));
}

#[test]
fn from_row_reports_each_defect() {
    let e = from_row(row("a.b.v2", ValueRef::Integer(1), b"{}")).unwrap_err();
    assert!(matches!(
        e,
        EnvelopeError::VersionMismatch {
            version: 1,
            expected: 2,
            ..
        }
    ));
    let e = from_row(row("a.b.v1", ValueRef::Null, b"{oops")).unwrap_err();
    assert!(matches!(e, EnvelopeError::PayloadJson { .. }), "{e}");
    let e = from_row(row("a.b.v1", ValueRef::Null, b"\xff\xfe")).unwrap_err();
    assert_eq!(e, EnvelopeError::NotUtf8 { column: "payload" });
    let e = from_row(row("nope", ValueRef::Null, b"{}")).unwrap_err();
    assert!(matches!(e, EnvelopeError::EventType { .. }));
    let mut r = row("a.b.v1", ValueRef::Null, b"{}");
    r.event_id = ValueRef::Text(b"123");
    assert!(matches!(
        from_row(r).unwrap_err(),
        EnvelopeError::EventId { .. }
    ));
    let e = from_row(row("a.b.v3", ValueRef::Text(b"3"), b"[1]")).unwrap();
    assert_eq!(e.event_version, 3);
}

/// Review finding: a tenant_id that is not UTF-8 was altered (U+FFFD)
/// and delivered; it is a defect of the row like a bad payload.
#[test]
fn check_row_refuses_a_tenant_that_is_not_utf8_and_keeps_a_good_one() {
    let mut r = row("a.b.v1", ValueRef::Null, b"{}");
    r.tenant_id = ValueRef::Blob(b"acme\xff");
    let e = check_row(&r).unwrap_err();
    assert_eq!(
        e,
        EnvelopeError::NotUtf8 {
            column: "tenant_id"
        }
    );
    assert!(e.to_string().contains("tenant_id"), "{e}");
    r.tenant_id = ValueRef::Integer(7);
    assert!(matches!(
        check_row(&r).unwrap_err(),
        EnvelopeError::ColumnType {
            column: "tenant_id",
            ..
        }
    ));
    r.tenant_id = ValueRef::Text(b"acme");
    assert_eq!(check_row(&r).unwrap().tenant_id.as_deref(), Some("acme"));
}

/// The times are checked first, and a time that is not an integer is
/// a defect, not a panic or a zero.
#[test]
fn check_row_refuses_a_time_that_is_not_an_integer() {
    let mut r = row("nope", ValueRef::Null, b"{}");
    r.created_at = ValueRef::Text(b"yesterday");
    let e = check_row(&r).unwrap_err();
    assert!(
        matches!(
            e,
            EnvelopeError::ColumnType {
                column: "created_at",
                ..
            }
        ),
        "{e}"
    );
    // A legacy row needs created_at for its id: the head fails too.
    assert!(check_head(&r).is_err());
}

/// What the owned copy checks on a worker is what the row says.
#[test]
fn an_owned_row_checks_as_the_row_it_copies() {
    let r = row("a.b.v1", ValueRef::Null, br#"{"x":[1,2]}"#);
    let owned = OwnedRow::new(&r).unwrap();
    assert_eq!(check_row(&owned.as_raw()).unwrap(), check_row(&r).unwrap());
    let bad = row("a.b.v1", ValueRef::Null, b"{oops");
    assert_eq!(
        check_row(&OwnedRow::new(&bad).unwrap().as_raw()).unwrap_err(),
        check_row(&bad).unwrap_err()
    );
}

/// The check that moves the payload into the envelope says what the
/// borrowed check says, for every kind of payload: surrounded by
/// whitespace (its error's line and column those of the stored text),
/// not JSON, not UTF-8, a blob, NULL, a number; and the envelope's
/// payload is the owned row's buffer itself, not a copy of it.
#[test]
fn an_owned_row_checked_by_moving_its_payload_is_checked_alike() {
    let payloads: [ValueRef<'_>; 9] = [
        ValueRef::Text(br#"{"x":[1,2]}"#),
        ValueRef::Text(b"\n\t {\"x\": 1}\r\n "),
        ValueRef::Text(b"\n\n  {oops"),
        ValueRef::Text(b"[1] x"),
        ValueRef::Text(b"\xff\xfe"),
        ValueRef::Blob(b"[true]"),
        ValueRef::Null,
        ValueRef::Integer(7),
        ValueRef::Text(b""),
    ];
    for payload in payloads {
        let mut r = row("a.b.v1", ValueRef::Null, b"");
        r.payload = payload;
        let owned = OwnedRow::new(&r).unwrap();
        assert_eq!(owned.into_checked(), check_row(&r), "{payload:?}");
    }
    let r = row("a.b.v1", ValueRef::Null, br#"{"x":[1,2]}"#);
    let owned = OwnedRow::new(&r).unwrap();
    let buffer = owned.payload.as_ptr();
    let checked = owned.into_checked().unwrap();
    assert_eq!(checked.envelope.payload.get().as_ptr(), buffer);
}

/// Every column of the owned copy is the value it copied, of every
/// storage class, empty and not UTF-8 included (one shared buffer).
#[test]
fn an_owned_row_gives_back_every_value_it_copied() {
    let r = RawRow {
        row_id: i64::MIN,
        event_id: ValueRef::Text(b"01ARZ3NDEKTSV4RRFFQ69G5FAV"),
        event_type: ValueRef::Blob(b"a.b.v1"),
        event_version: ValueRef::Real(1.5),
        causation_id: ValueRef::Text(b""),
        correlation_id: ValueRef::Blob(b""),
        payload: ValueRef::Text(b"{\"x\":\xff}"),
        occurred_at: ValueRef::Integer(i64::MAX),
        created_at: ValueRef::Null,
        tenant_id: ValueRef::Text(b"t"),
        traceparent: ValueRef::Text(b"00-x"),
        tracestate: ValueRef::Blob(b"a=1"),
    };
    let owned = OwnedRow::new(&r).unwrap();
    let back = owned.as_raw();
    let columns = |r: &RawRow<'_>| {
        [
            r.event_id,
            r.event_type,
            r.event_version,
            r.causation_id,
            r.correlation_id,
            r.payload,
            r.occurred_at,
            r.created_at,
            r.tenant_id,
            r.traceparent,
            r.tracestate,
        ]
        .map(|v| format!("{v:?}"))
    };
    assert_eq!(back.row_id, r.row_id);
    assert_eq!(columns(&back), columns(&r));
}
