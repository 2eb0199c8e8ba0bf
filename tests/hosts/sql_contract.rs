//! The SQL contract (docs/sql-contract.md), tested for real: a Python and a
//! PHP producer write business rows and events with plain SQL in their own
//! transactions, and every row they leave is read back and validated here
//! the way the relay validates a claimed row, with `envelope::check_row`.
//!
//! python3 and php (with php-sqlite3) must be installed; `.ci/run` installs
//! php. Outside CI (CI != "true") a missing interpreter skips its test with
//! a message; in CI it fails.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use outboxd::envelope::{check_row, RawRow, ROW_COLUMNS, TRACE_COLUMNS};
use outboxd::{Envelope, EventId, Timestamp};
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value};

use common::available;

/// A migrated database with the host's business table.
struct Host {
    _dir: tempfile::TempDir,
    path: PathBuf,
    conn: Connection,
}

impl Host {
    fn new() -> Host {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shop.db");
        let mut conn = outboxd::connection::open(&path).unwrap();
        outboxd::schema::migrate(&mut conn).unwrap();
        conn.execute_batch(
            "CREATE TABLE orders (
                 id          INTEGER PRIMARY KEY,
                 ref         TEXT    NOT NULL UNIQUE,
                 total_cents INTEGER NOT NULL
             )",
        )
        .unwrap();
        Host {
            _dir: dir,
            path,
            conn,
        }
    }
}

/// One `event_outbox` row, validated: the envelope the relay would deliver
/// plus the routing columns.
#[derive(Debug)]
struct Checked {
    row_id: i64,
    stored_event_id: Option<String>,
    envelope: Envelope,
    event_version: Option<i64>,
    tenant_id: Option<String>,
    idempotency_key: Option<String>,
    ordering_key: Option<String>,
    created_at: i64,
    available_at: i64,
    status: String,
    attempts: i64,
}

/// Reads every row back and validates it as the relay does on claim. Fails
/// the test with the row and the reason if any row breaks the contract.
fn read_back(conn: &Connection) -> Vec<Checked> {
    let mut stmt = conn
        .prepare(&format!(
            "SELECT {ROW_COLUMNS}, idempotency_key, ordering_key, available_at, status, attempts
             FROM event_outbox ORDER BY id"
        ))
        .unwrap();
    let mut rows = stmt.query([]).unwrap();
    let mut out = Vec::new();
    while let Some(r) = rows.next().unwrap() {
        let row_id: i64 = r.get(0).unwrap();
        // Timestamps must be INTEGER milliseconds, not text or reals.
        let int = |i: usize, column: &str| match r.get_ref(i).unwrap() {
            ValueRef::Integer(v) => v,
            other => panic!("row {row_id}: {column} is {other:?}, the contract says INTEGER ms"),
        };
        let checked = check_row(&RawRow::read(r, 0).unwrap())
            .unwrap_or_else(|e| panic!("row {row_id} breaks the contract: {e}"));
        let envelope = checked.envelope;
        out.push(Checked {
            row_id,
            stored_event_id: r.get(1).unwrap(),
            envelope,
            event_version: r.get(3).unwrap(),
            tenant_id: checked.tenant_id,
            idempotency_key: r.get(10).unwrap(),
            ordering_key: r.get(11).unwrap(),
            created_at: int(8, "created_at"),
            available_at: int(12, "available_at"),
            status: r.get(13).unwrap(),
            attempts: r.get(14).unwrap(),
        });
    }
    out
}

/// Checks that a stored event id is a canonical ULID minted around `now`:
/// 26 upper-case Crockford characters whose 48-bit prefix is the
/// millisecond time (a producer writing seconds, or a random prefix, fails).
fn assert_fresh_ulid(stored: &str, now_ms: i64) {
    let id = EventId::parse(stored).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(id.to_string(), stored, "not in canonical upper case");
    let ms = id.ulid().timestamp_ms() as i64;
    assert!(
        (now_ms - 120_000..=now_ms + 1_000).contains(&ms),
        "ULID {stored} carries time {ms}, not the time it was made ({now_ms})"
    );
}

fn str_field<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

/// Runs a producer on the database and returns the JSON report it prints.
fn run_producer(program: &str, script: &str, db: &Path) -> Value {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(program)
        .arg(dir.join(script))
        .arg(db)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{program} {script} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{script} printed no JSON report ({e}):\n{stdout}\n{stderr}"))
}

/// The whole contract, for whichever producer wrote the database.
fn check_contract(program: &str, script: &str) {
    let host = Host::new();
    let started = Timestamp::now().as_millis();
    let report = run_producer(program, script, &host.path);
    let finished = Timestamp::now().as_millis();
    let conn = &host.conn;
    outboxd::schema::ensure_current(conn).unwrap();

    let rows = read_back(conn);
    assert_eq!(
        rows.len(),
        3,
        "expected the full, the minimal and the legacy event: {rows:#?}"
    );
    let recent = |ms: i64, what: &str| {
        assert!(
            (started - 1_000..=finished + 1_000).contains(&ms),
            "{what} = {ms} is not INTEGER ms since the epoch during the run ({started}..{finished})"
        );
    };

    // 1. The full event: every column as written.
    let full = &report["full"];
    let row = &rows[0];
    let stored = row
        .stored_event_id
        .as_deref()
        .expect("the full event has an id");
    assert_eq!(stored, str_field(full, "event_id"));
    assert_fresh_ulid(stored, finished);
    assert_eq!(row.envelope.event_type.as_str(), "order.placed.v1");
    assert_eq!(row.envelope.event_version, 1);
    assert_eq!(row.event_version, Some(1));
    assert_eq!(row.tenant_id.as_deref(), Some(str_field(full, "tenant_id")));
    assert_eq!(
        row.idempotency_key.as_deref(),
        Some(str_field(full, "idempotency_key"))
    );
    assert_eq!(
        row.ordering_key.as_deref(),
        Some(str_field(full, "ordering_key"))
    );
    assert_eq!(
        row.envelope.causation_id.as_deref(),
        Some(str_field(full, "causation_id"))
    );
    assert_eq!(
        row.envelope.correlation_id.as_deref(),
        Some(str_field(full, "correlation_id"))
    );
    assert_eq!(
        row.envelope.occurred_at.as_millis(),
        full["occurred_at"].as_i64().unwrap()
    );
    recent(row.envelope.occurred_at.as_millis(), "occurred_at");
    recent(row.available_at, "available_at (the julianday expression)");
    assert_eq!(
        row.envelope.payload_as::<Value>().unwrap(),
        full["payload"],
        "the payload (with non-ASCII text) round-trips"
    );

    // 2. The minimal event: the defaults fill the rest.
    let minimal = &report["minimal"];
    let row = &rows[1];
    let stored = row
        .stored_event_id
        .as_deref()
        .expect("the minimal event has an id");
    assert_eq!(stored, str_field(minimal, "event_id"));
    assert_fresh_ulid(stored, finished);
    assert_eq!(row.event_version, None);
    assert_eq!(
        row.envelope.event_version, 1,
        "taken from the type's suffix"
    );
    assert_eq!(
        row.envelope.payload_as::<Value>().unwrap(),
        minimal["payload"]
    );
    assert_eq!(
        (row.tenant_id.as_deref(), row.idempotency_key.as_deref()),
        (None, None)
    );
    assert_eq!(row.envelope.correlation_id, None);
    recent(row.created_at, "created_at (default)");
    assert_eq!(row.envelope.occurred_at.as_millis(), row.created_at);
    assert_eq!(row.available_at, row.created_at, "due at once");

    // 3. The legacy event: no id stored, a stable one derived from the row.
    let row = &rows[2];
    assert_eq!(row.row_id, report["legacy_row_id"].as_i64().unwrap());
    assert_eq!(row.stored_event_id, None);
    assert_eq!(
        row.envelope.event_id,
        EventId::for_legacy_row(Timestamp::from_millis(row.created_at), row.row_id)
    );

    for row in &rows {
        assert_eq!(row.status, "pending");
        assert_eq!(row.attempts, 0);
    }

    // 4. The duplicate key wrote nothing and found the first event.
    assert_eq!(
        str_field(&report, "duplicate_of"),
        str_field(full, "event_id")
    );
    let holders: i64 = conn
        .query_row(
            "SELECT count(*) FROM event_outbox WHERE tenant_id = ?1 AND idempotency_key = ?2",
            params![
                str_field(full, "tenant_id"),
                str_field(full, "idempotency_key")
            ],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(holders, 1);

    // 5. The business rows of committed transactions exist; the rolled-back
    // transaction left neither its business row nor its event.
    let order_exists = |r: &str| -> bool {
        conn.query_row("SELECT 1 FROM orders WHERE ref = ?1", [r], |_| Ok(()))
            .optional()
            .unwrap()
            .is_some()
    };
    for order in report["orders"].as_array().unwrap() {
        assert!(
            order_exists(order.as_str().unwrap()),
            "order {order} is missing"
        );
    }
    assert!(!order_exists(str_field(&report, "rolled_back_order")));
    let rolled_back: i64 = conn
        .query_row(
            "SELECT count(*) FROM event_outbox WHERE event_id = ?1",
            [str_field(&report, "rolled_back_event_id")],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(rolled_back, 0, "the rolled-back event was committed");
}

#[test]
fn python_producer_follows_the_sql_contract() {
    if available("python3", &["--version"]) {
        check_contract("python3", "tests/contract/producer.py");
    }
}

#[test]
fn php_producer_follows_the_sql_contract() {
    if available("php", &["--version"]) {
        check_contract("php", "tests/contract/producer.php");
    }
}

/// The malformed rows the doc lists are refused with the reasons it quotes
/// (the relay dead-letters them with that reason).
#[test]
fn malformed_rows_are_refused_with_a_precise_reason() {
    let host = Host::new();
    let conn = &host.conn;
    let cases: &[(&str, &str)] = &[
        (
            "INSERT INTO event_outbox (event_type, payload) VALUES ('OrderPlaced', '{}')",
            "invalid event type",
        ),
        (
            "INSERT INTO event_outbox (event_type, payload) VALUES ('order.placed', '{}')",
            "invalid event type",
        ),
        (
            "INSERT INTO event_outbox (event_id, event_type, payload)
             VALUES ('0f8fad5b-d9cb-469f-a165-70867728950e', 'order.placed.v1', '{}')",
            "expected a ULID",
        ),
        (
            "INSERT INTO event_outbox (event_type, event_version, payload)
             VALUES ('order.placed.v2', 1, '{}')",
            "does not match event type",
        ),
        (
            "INSERT INTO event_outbox (event_type, payload) VALUES ('order.placed.v1', '{oops')",
            "not valid JSON",
        ),
        (
            "INSERT INTO event_outbox (event_type, payload) VALUES ('order.placed.v1', X'FFFE')",
            "not valid UTF-8",
        ),
        (
            "INSERT INTO event_outbox (event_type, event_version, payload)
             VALUES ('order.placed.v1', 'one', '{}')",
            "event_version holds non-numeric text",
        ),
    ];
    for (sql, reason) in cases {
        conn.execute("DELETE FROM event_outbox", []).unwrap();
        conn.execute(sql, []).unwrap();
        let err = conn
            .query_row(
                &format!("SELECT {ROW_COLUMNS} FROM event_outbox"),
                [],
                |r| Ok(check_row(&RawRow::read(r, 0)?).map(|_| ())),
            )
            .unwrap()
            .expect_err(sql);
        let msg = err.to_string();
        assert!(msg.contains(reason), "{sql}: {msg:?} should say {reason:?}");
    }
}

/// `ON CONFLICT DO NOTHING` keeps the first event of a key, in either scope,
/// and still fails loudly on anything but a duplicate key.
#[test]
fn on_conflict_do_nothing_keeps_the_first_event_in_both_scopes() {
    let host = Host::new();
    let conn = &host.conn;
    let insert =
        "INSERT INTO event_outbox (event_id, event_type, payload, tenant_id, idempotency_key)
                  VALUES (?1, 'order.placed.v1', ?2, ?3, 'k') ON CONFLICT DO NOTHING";
    for tenant in [None, Some("shop-7")] {
        let first = EventId::new().to_string();
        assert_eq!(
            conn.execute(insert, params![first, json!(1).to_string(), tenant])
                .unwrap(),
            1
        );
        let second = EventId::new().to_string();
        assert_eq!(
            conn.execute(insert, params![second, json!(2).to_string(), tenant])
                .unwrap(),
            0,
            "the duplicate in scope {tenant:?} was written"
        );
        let kept: String = conn
            .query_row(
                "SELECT event_id FROM event_outbox WHERE tenant_id IS ?1 AND idempotency_key = 'k'",
                params![tenant],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(kept, first);
    }

    // Why not INSERT OR IGNORE: it also swallows a NOT NULL or CHECK
    // violation, so a broken event vanishes without an error.
    let ignored = conn
        .execute(
            "INSERT OR IGNORE INTO event_outbox (event_type, payload) VALUES (NULL, '{}')",
            [],
        )
        .unwrap();
    assert_eq!(ignored, 0, "OR IGNORE dropped the row silently");
    let err = conn
        .execute(
            "INSERT INTO event_outbox (event_type, payload) VALUES (NULL, '{}')
             ON CONFLICT DO NOTHING",
            [],
        )
        .unwrap_err();
    assert!(err.to_string().contains("NOT NULL"), "{err}");
}

/// The fenced code blocks of docs/sql-contract.md in one language, in order.
fn doc_blocks(lang: &str) -> Vec<String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/sql-contract.md"))
        .unwrap();
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        match current.as_mut() {
            None if line.trim_end() == format!("```{lang}") => current = Some(String::new()),
            Some(_) if line.trim_end() == "```" => blocks.push(current.take().unwrap()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    assert!(
        !blocks.is_empty(),
        "docs/sql-contract.md has no {lang} block"
    );
    blocks
}

/// The doc's blocks that use the contract, without the Django settings
/// snippet (a fragment of a settings module, checked on its own below).
fn contract_blocks(lang: &str) -> Vec<String> {
    doc_blocks(lang)
        .into_iter()
        .filter(|b| !b.contains("DATABASES = "))
        .collect()
}

#[test]
fn the_docs_django_settings_ask_for_immediate_transactions() {
    if !available("python3", &["--version"]) {
        return;
    }
    let settings = doc_blocks("python")
        .into_iter()
        .find(|b| b.contains("DATABASES = "))
        .expect("the Django settings example");
    let program = format!(
        "import pathlib\nBASE_DIR = pathlib.Path('/srv/site')\n{settings}\n\
         o = DATABASES['default']['OPTIONS']\n\
         print(o['transaction_mode'], o['timeout'])\n"
    );
    let out = Command::new("python3")
        .arg("-c")
        .arg(&program)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "IMMEDIATE 5");
}

/// A database for the doc's examples: `orders.ref` is not unique there, so
/// placing one order twice reaches the duplicate-key path.
fn doc_host() -> Host {
    let host = Host::new();
    host.conn
        .execute_batch("DROP TABLE orders; CREATE TABLE orders (id INTEGER PRIMARY KEY, ref TEXT, total_cents INTEGER)")
        .unwrap();
    host
}

/// Checks what placing order "doc-1" twice through the doc's code left:
/// one event and one order (the duplicate call rolled its order back).
fn check_doc_example(host: &Host, first: &str, second: &str) {
    assert_eq!(first, second, "the duplicate did not name the first event");
    let rows = read_back(&host.conn);
    assert_eq!(rows.len(), 1, "{rows:#?}");
    let row = &rows[0];
    assert_eq!(row.stored_event_id.as_deref(), Some(first));
    assert_fresh_ulid(first, Timestamp::now().as_millis());
    assert_eq!(row.tenant_id.as_deref(), Some("shop-9"));
    assert_eq!(row.idempotency_key.as_deref(), Some("order-doc-1-placed"));
    assert_eq!(row.ordering_key.as_deref(), Some("order-doc-1"));
    assert_eq!(row.envelope.correlation_id.as_deref(), Some("req-doc"));
    assert_eq!(
        row.envelope.payload_as::<Value>().unwrap(),
        json!({"order": "doc-1", "total_cents": 500})
    );
    let orders: i64 = host
        .conn
        .query_row("SELECT count(*) FROM orders WHERE ref = 'doc-1'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(
        orders, 1,
        "the duplicate committed a second order without its event"
    );
}

#[test]
fn the_docs_sql_example_runs() {
    let host = doc_host();
    let example = doc_blocks("sql")
        .into_iter()
        .find(|b| b.contains("BEGIN IMMEDIATE"))
        .expect("the SQL example");
    let conn = Connection::open(&host.path).unwrap();
    conn.execute_batch(&example).unwrap();
    let rows = read_back(&host.conn);
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0].tenant_id.as_deref(), Some("shop-7"));
    assert_eq!(rows[0].envelope.event_type.as_str(), "order.placed.v1");
}

/// The doc's trace context example stores a context the relay's check
/// keeps whole.
#[test]
fn the_docs_trace_context_example_is_kept_by_the_relays_check() {
    let host = doc_host();
    let example = doc_blocks("sql")
        .into_iter()
        .find(|b| b.contains("traceparent"))
        .expect("the trace context example");
    host.conn.execute_batch(&example).unwrap();
    let checked = host
        .conn
        .query_row(
            &format!("SELECT {ROW_COLUMNS}, {TRACE_COLUMNS} FROM event_outbox"),
            [],
            |r| Ok(check_row(&RawRow::read(r, 0)?.with_trace(r, 10)?)),
        )
        .unwrap()
        .unwrap();
    assert_eq!(checked.trace_dropped, None);
    let trace = checked.trace.expect("the example's context");
    assert_eq!(
        trace.traceparent.trace_id(),
        "4bf92f3577b34da6a3ce929d0e0e4736"
    );
    assert_eq!(trace.tracestate.unwrap().as_str(), "congo=t61rcWkgMzE");
}

#[test]
fn the_docs_python_example_runs() {
    if !available("python3", &["--version"]) {
        return;
    }
    let host = doc_host();
    let program = format!(
        "{}\nimport sys\nconn = connect(sys.argv[1])\n\
         a = place_order(conn, 'doc-1', 500, 'shop-9', 'req-doc')\n\
         b = place_order(conn, 'doc-1', 500, 'shop-9', 'req-doc')\n\
         print(a, b)\n",
        contract_blocks("python").join("\n")
    );
    let out = Command::new("python3")
        .arg("-c")
        .arg(&program)
        .arg(&host.path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: Vec<&str> = stdout.split_whitespace().collect();
    assert_eq!(ids.len(), 2, "{stdout}");
    check_doc_example(&host, ids[0], ids[1]);
}

#[test]
fn the_docs_php_example_runs() {
    if !available("php", &["--version"]) {
        return;
    }
    let host = doc_host();
    let program = format!(
        "<?php\n{}\n$db = connect($argv[1]);\n\
         $a = place_order($db, 'doc-1', 500, 'shop-9', 'req-doc');\n\
         $b = place_order($db, 'doc-1', 500, 'shop-9', 'req-doc');\n\
         echo $a, ' ', $b, \"\\n\";\n",
        doc_blocks("php").join("\n")
    );
    let script = host.path.with_file_name("example.php");
    std::fs::write(&script, program).unwrap();
    let out = Command::new("php")
        .arg(&script)
        .arg(&host.path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: Vec<&str> = stdout.split_whitespace().collect();
    assert_eq!(ids.len(), 2, "{stdout}");
    check_doc_example(&host, ids[0], ids[1]);
}
