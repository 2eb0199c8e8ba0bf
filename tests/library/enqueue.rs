//! The producer side: `enqueue` writes the event in the host's transaction,
//! every option lands in its column, and idempotency keys are decided by
//! the database per (tenant, key) scope.

use std::time::Duration;

use outboxd::enqueue::DEFAULT_MAX_PAYLOAD_BYTES;
use outboxd::{
    enqueue, enqueue_many, Enqueued, Enqueuer, EnvelopeError, Error, Event, EventId, Timestamp,
};
use rusqlite::{Connection, OptionalExtension};
use serde_json::json;

/// A migrated database with a business table, in a temp directory that
/// lives as long as the value.
struct Host {
    _dir: tempfile::TempDir,
    conn: Connection,
}

impl Host {
    fn new() -> Host {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = outboxd::connection::open(dir.path().join("app.db")).unwrap();
        outboxd::schema::migrate(&mut conn).unwrap();
        conn.execute_batch("CREATE TABLE articles (id INTEGER PRIMARY KEY, title TEXT NOT NULL)")
            .unwrap();
        Host { _dir: dir, conn }
    }

    fn events(&self) -> i64 {
        count(&self.conn, "SELECT count(*) FROM event_outbox")
    }

    fn articles(&self) -> i64 {
        count(&self.conn, "SELECT count(*) FROM articles")
    }
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

fn event(payload: serde_json::Value) -> Event {
    Event::new("article.created.v1", &payload).unwrap()
}

/// The stored columns of one event, looked up by its id.
#[derive(Debug)]
struct Stored {
    event_type: String,
    event_version: Option<i64>,
    tenant_id: Option<String>,
    idempotency_key: Option<String>,
    ordering_key: Option<String>,
    causation_id: Option<String>,
    correlation_id: Option<String>,
    payload: String,
    occurred_at: i64,
    created_at: i64,
    available_at: i64,
    status: String,
    attempts: i64,
}

fn stored(conn: &Connection, id: EventId) -> Option<Stored> {
    conn.query_row(
        "SELECT event_type, event_version, tenant_id, idempotency_key, ordering_key,
                causation_id, correlation_id, payload, occurred_at, created_at,
                available_at, status, attempts
         FROM event_outbox WHERE event_id = ?1",
        [id.to_string()],
        |r| {
            Ok(Stored {
                event_type: r.get(0)?,
                event_version: r.get(1)?,
                tenant_id: r.get(2)?,
                idempotency_key: r.get(3)?,
                ordering_key: r.get(4)?,
                causation_id: r.get(5)?,
                correlation_id: r.get(6)?,
                payload: r.get(7)?,
                occurred_at: r.get(8)?,
                created_at: r.get(9)?,
                available_at: r.get(10)?,
                status: r.get(11)?,
                attempts: r.get(12)?,
            })
        },
    )
    .optional()
    .unwrap()
}

#[test]
fn an_event_commits_with_the_business_row() {
    let mut host = Host::new();
    let tx = host.conn.transaction().unwrap();
    tx.execute("INSERT INTO articles (title) VALUES ('Hello')", [])
        .unwrap();
    let queued = enqueue(&tx, &event(json!({"id": 1}))).unwrap();
    tx.commit().unwrap();

    assert!(matches!(queued, Enqueued::New(_)));
    assert_eq!(host.articles(), 1);
    let row = stored(&host.conn, queued.event_id()).expect("the event was committed");
    assert_eq!(row.event_type, "article.created.v1");
    assert_eq!(row.event_version, Some(1));
    assert_eq!(row.payload, r#"{"id":1}"#);
    assert_eq!(row.status, "pending");
    assert_eq!(row.attempts, 0);
}

#[test]
fn a_rolled_back_transaction_leaves_neither_row() {
    let mut host = Host::new();
    let tx = host.conn.transaction().unwrap();
    tx.execute("INSERT INTO articles (title) VALUES ('Hello')", [])
        .unwrap();
    let queued = enqueue(&tx, &event(json!({"id": 1}))).unwrap();
    tx.rollback().unwrap();

    // And one dropped without commit (rusqlite rolls back on drop).
    {
        let tx = host.conn.transaction().unwrap();
        tx.execute("INSERT INTO articles (title) VALUES ('Bye')", [])
            .unwrap();
        enqueue(&tx, &event(json!({"id": 2}))).unwrap();
    }

    assert_eq!(host.articles(), 0);
    assert_eq!(host.events(), 0);
    assert!(stored(&host.conn, queued.event_id()).is_none());
}

#[test]
fn autocommit_is_refused_unless_allowed() {
    let host = Host::new();
    let err = enqueue(&host.conn, &event(json!(1))).unwrap_err();
    assert!(matches!(err, Error::NotInTransaction), "{err:?}");
    assert!(err.to_string().contains("allow_autocommit"), "{err}");
    let err = enqueue_many(&host.conn, [&event(json!(1))]).unwrap_err();
    assert!(matches!(err, Error::NotInTransaction), "{err:?}");
    assert_eq!(host.events(), 0);

    let queued = Enqueuer::new()
        .allow_autocommit(true)
        .enqueue(&host.conn, &event(json!(1)))
        .unwrap();
    assert!(stored(&host.conn, queued.event_id()).is_some());
}

#[test]
fn enqueue_works_on_a_savepoint() {
    let mut host = Host::new();
    let mut tx = host.conn.transaction().unwrap();
    tx.execute("INSERT INTO articles (title) VALUES ('kept')", [])
        .unwrap();

    let kept = {
        let sp = tx.savepoint().unwrap();
        let q = enqueue(&sp, &event(json!("kept"))).unwrap();
        sp.commit().unwrap();
        q
    };
    let undone = {
        let mut sp = tx.savepoint().unwrap();
        let q = enqueue(&sp, &event(json!("undone"))).unwrap();
        sp.rollback().unwrap();
        sp.commit().unwrap();
        q
    };
    tx.commit().unwrap();

    assert_eq!(host.articles(), 1);
    assert!(stored(&host.conn, kept.event_id()).is_some());
    assert!(stored(&host.conn, undone.event_id()).is_none());
    assert_eq!(host.events(), 1);
}

#[test]
fn every_option_lands_in_its_column() {
    let mut host = Host::new();
    let occurred = Timestamp::from_millis(1_700_000_000_123);
    let at = Timestamp::from_millis(4_000_000_000_000);
    let id = EventId::new();
    let tx = host.conn.transaction().unwrap();
    let full = Event::new("order.paid.v3", &json!({"order": 9}))
        .unwrap()
        .event_id(id)
        .tenant("shop-7")
        .idempotency_key("order-9-paid")
        .ordering_key("order-9")
        .causation_id("cmd-1")
        .correlation_id("req-1")
        .occurred_at(occurred)
        .available_at(at);
    assert_eq!(enqueue(&tx, &full).unwrap(), Enqueued::New(id));
    let delayed = enqueue(
        &tx,
        &event(json!(null)).delay(Duration::from_millis(90_500)),
    )
    .unwrap();
    let plain = enqueue(&tx, &event(json!(null))).unwrap();
    tx.commit().unwrap();

    let row = stored(&host.conn, id).unwrap();
    assert_eq!(row.event_type, "order.paid.v3");
    assert_eq!(row.event_version, Some(3));
    assert_eq!(row.tenant_id.as_deref(), Some("shop-7"));
    assert_eq!(row.idempotency_key.as_deref(), Some("order-9-paid"));
    assert_eq!(row.ordering_key.as_deref(), Some("order-9"));
    assert_eq!(row.causation_id.as_deref(), Some("cmd-1"));
    assert_eq!(row.correlation_id.as_deref(), Some("req-1"));
    assert_eq!(row.occurred_at, occurred.as_millis());
    assert_eq!(row.available_at, at.as_millis());
    assert_eq!(row.payload, r#"{"order":9}"#);

    let row = stored(&host.conn, delayed.event_id()).unwrap();
    assert_eq!(row.available_at - row.created_at, 90_500);
    assert_eq!(row.occurred_at, row.created_at);

    let row = stored(&host.conn, plain.event_id()).unwrap();
    assert_eq!(row.available_at, row.created_at);
    assert_eq!(row.occurred_at, row.created_at);
    assert_eq!(row.tenant_id, None);
    assert_eq!(row.idempotency_key, None);
    assert_eq!(row.ordering_key, None);
    assert_eq!(row.causation_id, None);
    assert_eq!(row.correlation_id, None);
    let now = Timestamp::now().as_millis();
    assert!(
        (now - 60_000..=now).contains(&row.created_at),
        "created_at {} is not ms since the epoch near {now}",
        row.created_at
    );
}

#[test]
fn a_repeated_key_returns_the_first_id_and_writes_nothing() {
    let mut host = Host::new();
    let tx = host.conn.transaction().unwrap();
    let first = enqueue(&tx, &event(json!("first")).idempotency_key("k")).unwrap();
    let again = enqueue(&tx, &event(json!("second")).idempotency_key("k")).unwrap();
    tx.commit().unwrap();
    assert!(matches!(first, Enqueued::New(_)));
    assert_eq!(again, Enqueued::Duplicate(first.event_id()));

    // In a later transaction too.
    let tx = host.conn.transaction().unwrap();
    let later = enqueue(&tx, &event(json!("third")).idempotency_key("k")).unwrap();
    tx.commit().unwrap();
    assert_eq!(later, Enqueued::Duplicate(first.event_id()));

    assert_eq!(host.events(), 1);
    assert_eq!(
        stored(&host.conn, first.event_id()).unwrap().payload,
        r#""first""#
    );
}

#[test]
fn a_key_held_by_a_legacy_row_returns_its_derived_id() {
    let mut host = Host::new();
    host.conn
        .execute(
            "INSERT INTO event_outbox (event_type, payload, idempotency_key)
             VALUES ('article.created.v1', '{}', 'legacy-key')",
            [],
        )
        .unwrap();
    let (row_id, created_at): (i64, i64) = host
        .conn
        .query_row("SELECT id, created_at FROM event_outbox", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    let tx = host.conn.transaction().unwrap();
    let got = enqueue(&tx, &event(json!(1)).idempotency_key("legacy-key")).unwrap();
    tx.commit().unwrap();
    assert_eq!(
        got,
        Enqueued::Duplicate(EventId::for_legacy_row(
            Timestamp::from_millis(created_at),
            row_id
        ))
    );
    assert_eq!(host.events(), 1);
}

#[test]
fn scopes_never_collide_whatever_their_characters() {
    let mut host = Host::new();
    let tx = host.conn.transaction().unwrap();
    let results: Vec<Enqueued> = [
        event(json!(1)).tenant("a:b").idempotency_key("c"),
        event(json!(2)).tenant("a").idempotency_key("b:c"),
        event(json!(3)).tenant("a:b:c").idempotency_key(""),
        event(json!(4)).idempotency_key("same"),
        event(json!(5)).tenant("t").idempotency_key("same"),
        event(json!(6)).tenant("").idempotency_key("same"),
    ]
    .iter()
    .map(|e| enqueue(&tx, e).unwrap())
    .collect();
    assert!(
        results.iter().all(|r| !r.is_duplicate()),
        "distinct scopes collided: {results:?}"
    );

    // Each scope still deduplicates its own key.
    let again = enqueue(&tx, &event(json!(7)).tenant("a:b").idempotency_key("c")).unwrap();
    assert_eq!(again, Enqueued::Duplicate(results[0].event_id()));
    let again = enqueue(&tx, &event(json!(8)).idempotency_key("same")).unwrap();
    assert_eq!(again, Enqueued::Duplicate(results[3].event_id()));
    let again = enqueue(&tx, &event(json!(9)).tenant("t").idempotency_key("same")).unwrap();
    assert_eq!(again, Enqueued::Duplicate(results[4].event_id()));
    tx.commit().unwrap();
    assert_eq!(host.events(), 6);
}

#[test]
fn enqueue_many_writes_each_event_and_reports_duplicates() {
    let mut host = Host::new();
    let events = [
        event(json!(1)),
        event(json!(2)).idempotency_key("k"),
        event(json!(3)).idempotency_key("k"),
        Event::new("user.deleted.v2", &json!({"id": 4})).unwrap(),
    ];
    let tx = host.conn.transaction().unwrap();
    tx.execute("INSERT INTO articles (title) VALUES ('batch')", [])
        .unwrap();
    let results = enqueue_many(&tx, &events).unwrap();
    tx.commit().unwrap();

    assert_eq!(results.len(), 4);
    assert_eq!(results[0], Enqueued::New(events[0].id()));
    assert_eq!(results[1], Enqueued::New(events[1].id()));
    assert_eq!(results[2], Enqueued::Duplicate(events[1].id()));
    assert_eq!(results[3], Enqueued::New(events[3].id()));
    assert_eq!(host.events(), 3);
    assert_eq!(
        stored(&host.conn, events[3].id()).unwrap().event_version,
        Some(2)
    );
}

/// enqueue_many writes events without keys several to a statement: a long
/// batch with keys, delays and options mixed in still lands event by
/// event, in the order given, with every column and every duplicate right.
#[test]
fn a_long_batch_lands_in_order_with_every_column() {
    let mut host = Host::new();
    let at = Timestamp::from_millis(4_000_000_000_000);
    let events: Vec<Event> = (0..53)
        .map(|i| {
            let e = event(json!({ "i": i }));
            match i {
                // Keys break runs of keyless events; 30 repeats 20's key.
                20 | 30 => e.idempotency_key("twenty"),
                41 => e.tenant("t").idempotency_key("forty-one"),
                _ if i % 7 == 3 => e.delay(Duration::from_millis(5_000)).ordering_key("o"),
                _ if i % 11 == 5 => e.available_at(at).correlation_id(format!("c{i}")),
                _ => e,
            }
        })
        .collect();
    let tx = host.conn.transaction().unwrap();
    let results = enqueue_many(&tx, &events).unwrap();
    tx.commit().unwrap();

    assert_eq!(results.len(), events.len());
    for (i, (got, e)) in results.iter().zip(&events).enumerate() {
        let expected = if i == 30 {
            Enqueued::Duplicate(events[20].id())
        } else {
            Enqueued::New(e.id())
        };
        assert_eq!(*got, expected, "event {i}");
    }
    assert_eq!(host.events(), 52);
    // Row ids follow the order given.
    let mut stmt = host
        .conn
        .prepare("SELECT event_id, payload FROM event_outbox ORDER BY id")
        .unwrap();
    let rows: Vec<(String, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let expected: Vec<(String, String)> = (0..53)
        .filter(|&i| i != 30)
        .map(|i| (events[i].id().to_string(), format!(r#"{{"i":{i}}}"#)))
        .collect();
    assert_eq!(rows, expected);
    for (i, e) in events.iter().enumerate().filter(|&(i, _)| i != 30) {
        let row = stored(&host.conn, e.id()).unwrap();
        assert_eq!(row.status, "pending", "event {i}");
        assert_eq!(row.event_version, Some(1), "event {i}");
        assert_eq!(row.occurred_at, row.created_at, "event {i}");
        let (delay, ordering, correlation) = match i {
            20 | 41 => (0, None, None),
            _ if i % 7 == 3 => (5_000, Some("o".to_string()), None),
            _ if i % 11 == 5 => (at.as_millis() - row.created_at, None, Some(format!("c{i}"))),
            _ => (0, None, None),
        };
        assert_eq!(row.available_at - row.created_at, delay, "event {i}");
        assert_eq!(row.ordering_key, ordering, "event {i}");
        assert_eq!(row.correlation_id, correlation, "event {i}");
    }
    let keyed = stored(&host.conn, events[41].id()).unwrap();
    assert_eq!(keyed.tenant_id.as_deref(), Some("t"));
    assert_eq!(keyed.idempotency_key.as_deref(), Some("forty-one"));
}

/// Batches of every size around the statement sizes (32 rows, then 4,
/// then one at a time) land whole and in order, each event with its own
/// columns, a run of 32 broken by a key included.
#[test]
fn batches_of_every_size_land_whole_and_in_order() {
    for n in [1, 3, 4, 5, 31, 32, 33, 35, 36, 37, 64, 68, 71, 100] {
        let mut host = Host::new();
        let events: Vec<Event> = (0..n)
            .map(|i| {
                let e = event(json!({ "n": n, "i": i }));
                match i {
                    34 => e.idempotency_key("k"),
                    _ if i % 5 == 2 => e.causation_id(format!("c{i}")).tenant("t"),
                    _ if i % 9 == 4 => e.delay(Duration::from_millis(1_000)),
                    _ => e,
                }
            })
            .collect();
        let tx = host.conn.transaction().unwrap();
        let results = enqueue_many(&tx, &events).unwrap();
        tx.commit().unwrap();
        let expected: Vec<Enqueued> = events.iter().map(|e| Enqueued::New(e.id())).collect();
        assert_eq!(results, expected, "n = {n}");
        let in_id_order: Vec<(String, String)> = host
            .conn
            .prepare("SELECT event_id, payload FROM event_outbox ORDER BY id")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let given: Vec<(String, String)> = (0..n)
            .map(|i| {
                (
                    events[i].id().to_string(),
                    format!(r#"{{"i":{i},"n":{n}}}"#),
                )
            })
            .collect();
        assert_eq!(in_id_order, given, "n = {n}");
        for (i, e) in events.iter().enumerate() {
            let row = stored(&host.conn, e.id()).unwrap();
            let (causation, tenant) = if i % 5 == 2 {
                (Some(format!("c{i}")), Some("t".to_string()))
            } else {
                (None, None)
            };
            assert_eq!(
                (row.causation_id, row.tenant_id),
                (causation, tenant),
                "n = {n}, {i}"
            );
            assert_eq!(row.idempotency_key.is_some(), i == 34, "n = {n}, {i}");
            let delay = if i % 9 == 4 && i % 5 != 2 && i != 34 {
                1_000
            } else {
                0
            };
            assert_eq!(row.available_at - row.created_at, delay, "n = {n}, {i}");
        }
    }
}

/// A row the schema refuses in the middle of a batch (inside a statement
/// of several rows) fails the call with the database's reason.
#[test]
fn a_refused_row_in_a_batch_fails_the_call() {
    let mut host = Host::new();
    let events: Vec<Event> = (0..16)
        .map(|i| {
            let e = event(json!(i));
            if i == 5 {
                // Microseconds: refused by the schema at INSERT.
                e.available_at(Timestamp::from_millis(Timestamp::now().as_millis() * 1000))
            } else {
                e
            }
        })
        .collect();
    let tx = host.conn.transaction().unwrap();
    let err = enqueue_many(&tx, &events).unwrap_err();
    assert!(
        err.to_string()
            .contains("event_outbox_times_in_milliseconds"),
        "{err}"
    );
}

#[test]
fn enqueue_many_checks_every_payload_before_writing_any() {
    let mut host = Host::new();
    let big = Event::new("a.b.v1", &"x".repeat(DEFAULT_MAX_PAYLOAD_BYTES)).unwrap();
    let tx = host.conn.transaction().unwrap();
    let err = enqueue_many(&tx, [&event(json!(1)), &big]).unwrap_err();
    assert!(matches!(err, Error::PayloadTooLarge { .. }), "{err:?}");
    // Even a host that commits after the error gets no half batch.
    tx.commit().unwrap();
    assert_eq!(host.events(), 0);
}

#[test]
fn payloads_are_bounded_by_a_default_of_one_mib() {
    assert_eq!(DEFAULT_MAX_PAYLOAD_BYTES, 1024 * 1024);
    let mut host = Host::new();
    // A JSON string of n characters is n + 2 bytes with its quotes.
    let at_limit = Event::new("a.b.v1", &"x".repeat(DEFAULT_MAX_PAYLOAD_BYTES - 2)).unwrap();
    let over = Event::new("a.b.v1", &"x".repeat(DEFAULT_MAX_PAYLOAD_BYTES - 1)).unwrap();
    let tx = host.conn.transaction().unwrap();
    enqueue(&tx, &at_limit).unwrap();
    let err = enqueue(&tx, &over).unwrap_err();
    tx.commit().unwrap();
    match &err {
        Error::PayloadTooLarge { size, limit } => {
            assert_eq!(*size, DEFAULT_MAX_PAYLOAD_BYTES + 1);
            assert_eq!(*limit, DEFAULT_MAX_PAYLOAD_BYTES);
        }
        other => panic!("expected PayloadTooLarge, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains(&(DEFAULT_MAX_PAYLOAD_BYTES + 1).to_string()),
        "{msg}"
    );
    assert!(
        msg.contains(&DEFAULT_MAX_PAYLOAD_BYTES.to_string()),
        "{msg}"
    );
    assert_eq!(host.events(), 1);
}

#[test]
fn the_payload_bound_is_configurable() {
    let mut host = Host::new();
    let small = Enqueuer::new().max_payload_bytes(10);
    let tx = host.conn.transaction().unwrap();
    small.enqueue(&tx, &event(json!("12345678"))).unwrap(); // 10 bytes
    let err = small.enqueue(&tx, &event(json!("123456789"))).unwrap_err();
    assert!(
        matches!(
            err,
            Error::PayloadTooLarge {
                size: 11,
                limit: 10
            }
        ),
        "{err:?}"
    );
    // Larger than the default is allowed when configured.
    let large = Enqueuer::new().max_payload_bytes(2 * DEFAULT_MAX_PAYLOAD_BYTES);
    let big = Event::new("a.b.v1", &"x".repeat(DEFAULT_MAX_PAYLOAD_BYTES)).unwrap();
    large.enqueue(&tx, &big).unwrap();
    tx.commit().unwrap();
    assert_eq!(host.events(), 2);
}

#[test]
fn an_invalid_event_type_is_refused() {
    for bad in [
        "",
        "Article.created.v1",
        "article.v1",
        "article.created",
        "a.b.v0",
    ] {
        let err = Event::new(bad, &json!(1)).unwrap_err();
        assert!(
            matches!(err, Error::Envelope(EnvelopeError::EventType { .. })),
            "{bad:?}: {err:?}"
        );
        let msg = err.to_string();
        assert!(msg.contains("<domain>.<verb>.v<N>"), "{msg}");
        assert!(Event::from_json(bad, "{}").is_err(), "{bad:?}");
    }
}

#[test]
fn from_json_refuses_invalid_json_and_keeps_valid_text_as_given() {
    for bad in ["", "{", "{\"a\":}", "nul", "{} {}"] {
        let err = Event::from_json("a.b.v1", bad).unwrap_err();
        assert!(
            matches!(err, Error::Envelope(EnvelopeError::PayloadJson { .. })),
            "{bad:?}: {err:?}"
        );
        assert!(err.to_string().contains("not valid JSON"), "{err}");
    }

    let mut host = Host::new();
    let text = "{ \"b\": 1,  \"a\": [1.50] }";
    let e = Event::from_json("a.b.v1", text).unwrap();
    let tx = host.conn.transaction().unwrap();
    enqueue(&tx, &e).unwrap();
    tx.commit().unwrap();
    assert_eq!(stored(&host.conn, e.id()).unwrap().payload, text);
}
