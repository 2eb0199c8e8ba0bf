//! A foreign producer writes anything into every column of one
//! `event_outbox` row (whatever the schema's constraints let through).
//! Then one relay tick runs over it. Checked: nothing panics or hangs, the
//! row is never lost, a dead-lettered row says why, and an envelope that is
//! assembled survives a JSON round trip unchanged.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use outboxd::envelope::{check_row, RawRow, ROW_COLUMNS};
use outboxd::{Delivery, Envelope, ManualClock, Outcome, Relay, Timestamp};
use rusqlite::types::Value;

/// One column's value: a sensible default, or anything at all.
#[derive(Arbitrary, Debug)]
enum V {
    Default,
    Null,
    Int(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

const COLUMNS: [&str; 19] = [
    "id",
    "event_id",
    "event_type",
    "event_version",
    "tenant_id",
    "idempotency_key",
    "ordering_key",
    "causation_id",
    "correlation_id",
    "payload",
    "occurred_at",
    "created_at",
    "available_at",
    "status",
    "attempts",
    "claim_token",
    "lease_until",
    "last_error",
    "finished_at",
];

/// What a well-behaved producer would write in each column.
fn default(column: &str) -> Value {
    match column {
        "event_id" => Value::Text("01JDQ8F6ZC1Y0D3W9N7K2M4P5R".into()),
        "event_type" => Value::Text("fuzz.row.v1".into()),
        "payload" => Value::Text(r#"{"a":1}"#.into()),
        "occurred_at" | "created_at" | "available_at" => Value::Integer(1_700_000_000_000),
        "status" => Value::Text("pending".into()),
        "attempts" => Value::Integer(0),
        _ => Value::Null,
    }
}

/// A migrated database, copied for every input.
fn template() -> &'static PathBuf {
    static T: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &T.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("template.db");
        let mut conn = outboxd::connection::open(&path).unwrap();
        outboxd::schema::migrate(&mut conn).unwrap();
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .unwrap();
        (dir, path)
    })
    .1
}

fn round_trip(env: &Envelope) {
    let again: Envelope =
        serde_json::from_str(&env.to_json()).expect("an assembled envelope's JSON decodes");
    assert_eq!(&again, env, "the envelope changed in a JSON round trip");
}

fuzz_target!(|cols: [V; 19]| {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db.sqlite");
    std::fs::copy(template(), &db).unwrap();
    let conn = outboxd::connection::open(&db).unwrap();
    let values: Vec<Value> = cols
        .into_iter()
        .zip(COLUMNS)
        .map(|(v, c)| match v {
            V::Default => default(c),
            V::Null => Value::Null,
            V::Int(i) => Value::Integer(i),
            V::Real(f) => Value::Real(f),
            V::Text(s) => Value::Text(s),
            V::Blob(b) => Value::Blob(b),
        })
        .collect();
    let sql = format!(
        "INSERT INTO event_outbox ({}) VALUES ({})",
        COLUMNS.join(", "),
        vec!["?"; COLUMNS.len()].join(", ")
    );
    if conn
        .execute(&sql, rusqlite::params_from_iter(values.iter()))
        .is_err()
    {
        return; // the schema refused it: not a row the relay can meet
    }

    // The row checked straight from its columns, as the relay checks it.
    conn.query_row(
        &format!("SELECT {ROW_COLUMNS} FROM event_outbox"),
        [],
        |r| {
            if let Ok(row) = check_row(&RawRow::read(r, 0)?) {
                round_trip(&row.envelope);
            }
            Ok(())
        },
    )
    .unwrap();

    // One relay tick, late enough that any integer available_at is due.
    let relay = Relay::builder(&db)
        .consumer("all", ["*"], |d: &Delivery| {
            round_trip(&d.envelope);
            Outcome::Delivered
        })
        .workers(1)
        .poll_interval(Duration::from_millis(1))
        .flush_interval(Duration::from_millis(1))
        .purge(None)
        .clock(ManualClock::new(Timestamp::from_millis(i64::MAX / 2)))
        .build()
        .unwrap()
        .start()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let m = relay.metrics();
        let nothing_due = m.commits >= 1 && m.claimed == 0;
        let handled = m.claimed >= 1 && m.delivered + m.dead_lettered + m.retried >= 1;
        if nothing_due || handled {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the relay is stuck on this row: {m:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    relay.shutdown(Duration::from_secs(5)).unwrap();

    // last_error is read as bytes: a foreign row may hold any blob there.
    let (count, status, error): (i64, Option<String>, Option<Vec<u8>>) = conn
        .query_row(
            "SELECT count(*), max(CAST(status AS TEXT)), max(CAST(last_error AS BLOB)) FROM event_outbox",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!(count, 1, "the row is never lost");
    if status.as_deref() == Some("dead") {
        assert!(
            error.is_some_and(|e| !e.is_empty()),
            "a dead letter says why"
        );
    }
});
