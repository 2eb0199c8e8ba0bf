//! What can never succeed is dead-lettered at once with its reason, and
//! what may succeed later is retried (issue 30.7): a payload SQLite's JSON
//! functions cannot read, in a sql sink; a variable too large for the
//! system's environment, in a command sink; a tenant header too large to
//! send, in a webhook sink; a transaction SQLite rolled back itself (a full
//! database), which is a retry and no consumer's doing. NATS headers too
//! large for the server are in tests/hosts/nats_sink.rs; the JSON-lines
//! sink's failures are the file's, never the event's.
#![cfg(feature = "sinks")]

use crate::common;

use std::time::Duration;

use common::relay::{stop, StartRelay, LONG};
use common::{event, wait_until, TestDb};
use outboxd::consumer::{Consumer, Delivery, Outcome};
use outboxd::sinks::{CommandSink, SqlSink};
use outboxd::{Envelope, Event, EventId, RetryPolicy};

/// JSON nested `depth` arrays deep: valid to outboxd, which sets no depth
/// limit, and deeper than SQLite's JSON functions read (1,000 levels).
fn nested(depth: usize) -> String {
    "[".repeat(depth) + &"]".repeat(depth)
}

/// An envelope of type a.b.v1 with a fresh id and a small payload.
fn envelope() -> Envelope {
    serde_json::from_value(serde_json::json!({
        "event_id": EventId::new().to_string(), "event_type": "a.b.v1", "event_version": 1,
        "causation_id": null, "correlation_id": null,
        "occurred_at": "2026-11-30T07:18:00Z", "payload": {"id": 7},
    }))
    .unwrap()
}

/// A retry policy that would keep a retried event pending for an hour.
fn patient() -> RetryPolicy {
    RetryPolicy::default()
        .initial(Duration::from_secs(3600))
        .max_attempts(10)
}

fn status_and_reason(db: &TestDb, id: EventId) -> (String, i64, String) {
    db.conn()
        .query_row(
            "SELECT status, attempts, coalesce(last_error, '') FROM event_outbox WHERE event_id = ?1",
            [id.to_string()],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap()
}

/// Issue 30.7: a payload nested 2,000 deep was retried 10 times over
/// 4.5 hours while the events behind it on its ordering key waited, since
/// SQLite's "malformed JSON" is a plain SQL error. It is poison now, at
/// the first try, and the key goes on.
#[test]
fn a_sql_sink_dead_letters_json_sqlite_cannot_read_at_once_and_the_key_goes_on() {
    let db = TestDb::new();
    db.conn()
        .execute_batch("CREATE TABLE titles (event_id TEXT PRIMARY KEY, title TEXT)")
        .unwrap();
    let sink =
        SqlSink::new(["INSERT INTO titles VALUES (:event_id, json_extract(:payload, '$.title'))"])
            .unwrap();
    let ids = db.enqueue(&[
        Event::from_json("article.created.v1", nested(2000))
            .unwrap()
            .ordering_key("article:7"),
        Event::new("article.created.v1", &serde_json::json!({"title": "next"}))
            .unwrap()
            .ordering_key("article:7"),
    ]);
    let relay = db
        .relay()
        .retry_policy(patient())
        .transactional_consumer("titles", ["article.*.v1"], sink)
        .started();
    wait_until("both events finished", LONG, || {
        db.count("status = 'pending'") == 0
    });
    stop(relay);
    let (status, attempts, reason) = status_and_reason(&db, ids[0]);
    assert_eq!((status.as_str(), attempts), ("dead", 0), "{reason}");
    assert!(reason.contains("statement 0: malformed JSON"), "{reason}");
    assert_eq!(status_and_reason(&db, ids[1]).0, "delivered");
    let title: String = db.scalar("SELECT title FROM titles");
    assert_eq!(title, "next");
}

/// SQLite rolls a whole transaction back by itself after a full disk (or
/// out of memory, an I/O error). The session took that for the consumer
/// ending the transaction and dead-lettered the event ("the consumer
/// ended outboxd's transaction itself"), where a full disk is a retry. A
/// full database (max_page_count on the consumer's own connection) stands
/// in for the disk.
#[test]
fn a_transaction_sqlite_rolled_back_itself_is_a_retry_saying_why() {
    let db = TestDb::new();
    db.conn()
        .execute_batch("CREATE TABLE blobs (b BLOB)")
        .unwrap();
    let sink = SqlSink::new([
        "PRAGMA max_page_count = 1",
        "INSERT INTO blobs VALUES (zeroblob(1000000))",
    ])
    .unwrap();
    let id = db.enqueue(&[event("a.b.v1", 1)])[0];
    let relay = db
        .relay()
        .retry_policy(patient())
        .transactional_consumer("blobs", ["a.b.v1"], sink)
        .started();
    wait_until("the first attempt recorded", LONG, || {
        status_and_reason(&db, id).1 > 0 || db.count("status = 'dead'") > 0
    });
    stop(relay);
    let (status, attempts, reason) = status_and_reason(&db, id);
    assert_eq!((status.as_str(), attempts), ("pending", 1), "{reason}");
    assert!(
        reason.contains("statement 1: database or disk is full")
            && reason.contains("SQLite rolled the transaction back"),
        "{reason}"
    );
    assert_eq!(db.scalar::<i64>("SELECT count(*) FROM blobs"), 0);
}

/// Issue 30.7: a correlation id of a megabyte, which `execve` refuses as an
/// environment variable (E2BIG, "Argument list too long"), was a retry
/// on every attempt. It is poison, naming the variable; the program never
/// ran.
#[test]
fn a_command_sink_dead_letters_a_variable_too_large_for_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");
    let sink = CommandSink::new("/bin/sh", ["-c", "touch \"$0\"", ran.to_str().unwrap()]).unwrap();
    let mut envelope = envelope();
    assert_eq!(
        sink.deliver(&Delivery::new(envelope.clone())),
        Outcome::Delivered
    );
    std::fs::remove_file(&ran).unwrap();
    envelope.correlation_id = Some("r".repeat(1 << 20));
    let outcome = sink.deliver(&Delivery::new(envelope));
    let Outcome::Poison { reason } = outcome else {
        panic!("expected poison, got {outcome:?}")
    };
    assert!(
        reason.contains("OUTBOXD_CORRELATION_ID (1048576 bytes")
            && reason.contains("Argument list too long"),
        "{reason}"
    );
    assert!(!ran.exists(), "the program ran");
}

/// The webhook sink's one header that varies with the event beyond fixed
/// forms is the tenant's, percent-encoded so that any text can be sent. A
/// megabyte tenant id was a retry on every attempt, for days: the HTTP
/// client refuses a request head over its buffer ("output too small to
/// write output"). It is poison now, naming the header; a smaller one that
/// the receiver refuses (431, as a server with an 8 KiB limit answers) was
/// poison already.
#[test]
fn a_webhook_header_too_large_to_send_or_to_be_taken_is_poison() {
    use common::http::{Answer, Receiver};
    use outboxd::sinks::WebhookSink;
    let receiver = Receiver::start(|req, _| {
        if req.headers.iter().any(|(_, v)| v.len() > 8192) {
            Answer::new("431 Request Header Fields Too Large", "header too large")
        } else {
            Answer::new("200 OK", "")
        }
    });
    let sink = WebhookSink::builder(receiver.url("/hook"))
        .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        .build()
        .unwrap();
    let envelope = envelope();
    let with_tenant = |tenant: String| Delivery::new(envelope.clone()).tenant_id(Some(tenant));
    assert_eq!(
        sink.deliver(&with_tenant("acme/é".into())),
        Outcome::Delivered
    );
    let poison = |d: Delivery| match sink.deliver(&d) {
        Outcome::Poison { reason } => reason,
        other => panic!("expected poison, got {other:?}"),
    };
    let reason = poison(with_tenant("t".repeat(1 << 20)));
    assert!(
        reason.contains("outboxd-tenant-id header of 1048576 bytes"),
        "{reason}"
    );
    let reason = poison(with_tenant("t".repeat(16 << 10)));
    assert!(reason.contains("431"), "{reason}");
    assert_eq!(
        receiver.requests().len(),
        2,
        "the megabyte one was not sent"
    );
}
