//! The promise of capture, tried with random tables, rows and statements: a
//! captured write never fails where the same write without capture
//! succeeds, never changes what the host's table holds, and every row it
//! changes becomes exactly one event that the relay's own validation
//! accepts, carrying the row as SQLite holds it.
//!
//! Each case runs the same statements on two databases: one captured, one
//! with a plain logging trigger instead (with `recursive_triggers` on, so
//! SQLite itself reports the rows a REPLACE deletes). The log is the truth
//! the events are checked against.
//!
//! OUTBOXD_CAPTURE_CASES sets the number of cases (default 48).

use crate::common;

use common::stored_events;
use outboxd::capture::{self, CaptureSpec, Columns};
use outboxd::Timestamp;
use proptest::prelude::*;
use rusqlite::types::Value as V;
use rusqlite::Connection;
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::BTreeMap;

/// How a generated table is keyed.
#[derive(Debug, Clone, Copy)]
enum Keying {
    /// No primary key: keyed by rowid.
    Rowid,
    /// `id INTEGER PRIMARY KEY`.
    IntegerPk,
    /// A primary key on the first column (any type).
    ColumnPk,
    /// A composite primary key on the first two columns, WITHOUT ROWID.
    CompositeWithoutRowid,
}

#[derive(Debug, Clone)]
struct Table {
    keying: Keying,
    /// Declared types of the data columns c0, c1, ….
    types: Vec<&'static str>,
    /// A UNIQUE constraint on the last data column.
    unique_last: bool,
    /// A generated column over c0.
    generated: bool,
    changed_only: bool,
    recursive_triggers: bool,
}

impl Table {
    fn ddl(&self) -> String {
        let mut cols = Vec::new();
        if matches!(self.keying, Keying::IntegerPk) {
            cols.push("id INTEGER PRIMARY KEY".to_string());
        }
        for (i, ty) in self.types.iter().enumerate() {
            let mut c = format!("c{i} {ty}");
            if i + 1 == self.types.len() && self.unique_last {
                c.push_str(" UNIQUE");
            }
            cols.push(c);
        }
        if self.generated {
            cols.push("g GENERATED ALWAYS AS (typeof(c0)) VIRTUAL".into());
        }
        match self.keying {
            Keying::ColumnPk => cols.push("PRIMARY KEY (c0)".into()),
            Keying::CompositeWithoutRowid => cols.push("PRIMARY KEY (c0, c1)".into()),
            _ => {}
        }
        let tail = if matches!(self.keying, Keying::CompositeWithoutRowid) {
            " WITHOUT ROWID"
        } else {
            ""
        };
        format!("CREATE TABLE t ({}){tail}", cols.join(", "))
    }

    /// The columns the statements write: the data columns, and `id` for an
    /// INTEGER PRIMARY KEY (to make REPLACE conflicts on it).
    fn writable(&self) -> Vec<String> {
        let mut v: Vec<String> = (0..self.types.len()).map(|i| format!("c{i}")).collect();
        if matches!(self.keying, Keying::IntegerPk) {
            v.insert(0, "id".into());
        }
        v
    }

    /// Every column, as `SELECT *` returns them.
    fn all_columns(&self) -> Vec<String> {
        let mut v = self.writable();
        if self.generated {
            v.push("g".into());
        }
        v
    }
}

#[derive(Debug, Clone)]
enum Stmt {
    Insert(&'static str, Vec<V>),
    Upsert(Vec<V>),
    Update(&'static str, usize, V, i64),
    Delete(i64),
}

fn value() -> impl Strategy<Value = V> {
    prop_oneof![
        Just(V::Null),
        prop_oneof![
            Just(0i64),
            Just(1),
            Just(-1),
            Just(i64::MAX),
            Just(i64::MIN),
            any::<i64>(),
            0i64..5
        ]
        .prop_map(V::Integer),
        prop_oneof![
            any::<f64>(),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(-0.0),
            Just(5e-324),
            Just(0.1),
            Just(f64::MAX),
        ]
        .prop_map(V::Real),
        "\\PC{0,12}".prop_map(V::Text),
        // Any bytes as TEXT: invalid UTF-8, NUL, control characters.
        proptest::collection::vec(any::<u8>(), 0..12).prop_map(|b| V::Text(unsafe_text(b))),
        prop_oneof![
            Just("a".to_string()),
            Just("A".to_string()),
            Just("\"\\'".to_string())
        ]
        .prop_map(V::Text),
        proptest::collection::vec(any::<u8>(), 0..12).prop_map(V::Blob),
    ]
}

/// Bytes to bind as TEXT. rusqlite binds a String; the bytes must reach
/// SQLite as they are, so they are bound as a BLOB and CAST to TEXT in the
/// statement instead (see `bind`). This marks them with a prefix.
fn unsafe_text(b: Vec<u8>) -> String {
    format!("\u{0}raw:{}", hex(&b))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02X}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A value as SQL text: literals, so the exact bytes and types reach SQLite.
fn sql(v: &V) -> String {
    match v {
        V::Null => "NULL".into(),
        V::Integer(i) => format!("({i})"),
        V::Real(r) if r.is_infinite() && *r > 0.0 => "9e999".into(),
        V::Real(r) if r.is_infinite() => "(-9e999)".into(),
        V::Real(r) if r.is_nan() => "NULL".into(),
        V::Real(r) => format!("({r:e})"),
        V::Text(t) => match t.strip_prefix("\u{0}raw:") {
            Some(h) => format!("CAST(x'{h}' AS TEXT)"),
            None => format!("'{}'", t.replace('\'', "''")),
        },
        V::Blob(b) => format!("x'{}'", hex(b)),
    }
}

fn table() -> impl Strategy<Value = Table> {
    let types = prop_oneof![
        Just(""),
        Just("INTEGER"),
        Just("TEXT"),
        Just("REAL"),
        Just("BLOB"),
        Just("NUMERIC"),
        Just("TEXT COLLATE NOCASE")
    ];
    (
        prop_oneof![
            Just(Keying::Rowid),
            Just(Keying::IntegerPk),
            Just(Keying::ColumnPk),
            Just(Keying::CompositeWithoutRowid)
        ],
        proptest::collection::vec(types, 2..5),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(keying, types, unique_last, generated, changed_only, recursive_triggers)| Table {
                keying,
                types,
                unique_last,
                generated,
                changed_only,
                recursive_triggers,
            },
        )
}

fn stmt(width: usize) -> impl Strategy<Value = Stmt> {
    let row = || proptest::collection::vec(value(), width);
    prop_oneof![
        3 => (prop_oneof![Just("INSERT"), Just("INSERT OR REPLACE"), Just("REPLACE"), Just("INSERT OR IGNORE")], row())
            .prop_map(|(verb, r)| Stmt::Insert(verb, r)),
        1 => row().prop_map(Stmt::Upsert),
        2 => (prop_oneof![Just("UPDATE"), Just("UPDATE OR REPLACE"), Just("UPDATE OR IGNORE")], 0..width, value(), 0i64..3)
            .prop_map(|(verb, col, v, m)| Stmt::Update(verb, col, v, m)),
        1 => (0i64..3).prop_map(Stmt::Delete),
    ]
}

fn case() -> impl Strategy<Value = (Table, Vec<Stmt>)> {
    table().prop_flat_map(|t| {
        let width = t.writable().len();
        (Just(t), proptest::collection::vec(stmt(width), 1..10))
    })
}

fn render(t: &Table, s: &Stmt) -> String {
    let cols = t.writable();
    // A rowid of i64::MAX makes SQLite choose the next one at random, which
    // two databases would not agree on: keep explicit ids small.
    let id_safe = |row: &[V]| -> Vec<V> {
        let mut row = row.to_vec();
        let rowid_alias = match t.keying {
            Keying::IntegerPk => true,
            Keying::ColumnPk => t.types[0] == "INTEGER",
            _ => false,
        };
        if let (true, Some(V::Integer(i))) = (rowid_alias, row.first()) {
            row[0] = V::Integer(i.rem_euclid(50));
        }
        row
    };
    match s {
        Stmt::Insert(verb, row) => format!(
            "{verb} INTO t ({}) VALUES ({})",
            cols.join(", "),
            id_safe(row).iter().map(sql).collect::<Vec<_>>().join(", ")
        ),
        Stmt::Upsert(row) => format!(
            "INSERT INTO t ({}) VALUES ({}) ON CONFLICT DO UPDATE SET {} = excluded.{}",
            cols.join(", "),
            id_safe(row).iter().map(sql).collect::<Vec<_>>().join(", "),
            cols.last().unwrap(),
            cols.last().unwrap()
        ),
        Stmt::Update(verb, col, v, m) => format!(
            "{verb} t SET {} = {} WHERE rowid_or_all(t) % 3 = {m}",
            cols[*col],
            sql(&if *col == 0 {
                id_safe(std::slice::from_ref(v)).remove(0)
            } else {
                v.clone()
            })
        ),
        Stmt::Delete(m) => format!("DELETE FROM t WHERE rowid_or_all(t) % 3 = {m}"),
    }
    // WITHOUT ROWID tables have no rowid: pick rows by a hash of c0.
    .replace(
        "rowid_or_all(t)",
        if matches!(t.keying, Keying::CompositeWithoutRowid) {
            "abs(length(CAST(c0 AS BLOB)))"
        } else {
            "rowid"
        },
    )
}

/// Every row as (typeof, hex) pairs, in a stable order: what the host's
/// table holds, byte for byte.
fn snapshot(conn: &Connection, t: &Table) -> Vec<Vec<(String, String)>> {
    let cols = t.all_columns();
    let select: Vec<String> = cols
        .iter()
        .flat_map(|c| [format!("typeof({c})"), format!("hex({c})")])
        .collect();
    let order: Vec<String> = (1..=select.len()).map(|i| i.to_string()).collect();
    let sql = format!(
        "SELECT {} FROM t ORDER BY {}",
        select.join(", "),
        order.join(", ")
    );
    let mut stmt = conn.prepare(&sql).unwrap();
    let n = cols.len();
    stmt.query_map([], |r| {
        (0..n)
            .map(|i| Ok((r.get(2 * i)?, r.get(2 * i + 1)?)))
            .collect::<rusqlite::Result<Vec<_>>>()
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// The plain database: the same table, and triggers that log every row
/// change SQLite reports, as the capture's payload would show it.
fn plain(t: &Table) -> Connection {
    let conn = Connection::open_in_memory().unwrap();
    conn.execute_batch(&t.ddl()).unwrap();
    conn.pragma_update(None, "recursive_triggers", true)
        .unwrap();
    let all = t.all_columns();
    let image = |row: &str| {
        all.iter()
            .map(|c| format!("typeof({row}.{c})||':'||hex({row}.{c})"))
            .collect::<Vec<_>>()
            .join("||','||")
    };
    let changed = all
        .iter()
        .map(|c| format!("OLD.{c} IS NOT NEW.{c} COLLATE BINARY"))
        .collect::<Vec<_>>()
        .join(" OR ");
    let when = if t.changed_only {
        format!(" WHEN {changed}")
    } else {
        String::new()
    };
    conn.execute_batch(&format!(
        "CREATE TABLE log (op TEXT, before TEXT, after TEXT);
         CREATE TRIGGER li AFTER INSERT ON t BEGIN INSERT INTO log VALUES ('c', NULL, {}); END;
         CREATE TRIGGER lu AFTER UPDATE ON t{when} BEGIN INSERT INTO log VALUES ('u', {}, {}); END;
         CREATE TRIGGER ld AFTER DELETE ON t BEGIN INSERT INTO log VALUES ('d', {}, NULL); END;",
        image("NEW"),
        image("OLD"),
        image("NEW"),
        image("OLD")
    ))
    .unwrap();
    conn
}

fn captured(t: &Table) -> Connection {
    let mut conn = Connection::open_in_memory().unwrap();
    outboxd::schema::migrate(&mut conn).unwrap();
    conn.execute_batch(&t.ddl()).unwrap();
    let mut spec = CaptureSpec::new("t", "t.{op}.v1", Columns::All);
    spec.changed_only = t.changed_only;
    capture::apply(&mut conn, &[spec], Timestamp::now()).unwrap();
    conn.pragma_update(None, "recursive_triggers", t.recursive_triggers)
        .unwrap();
    conn
}

/// A JSON value of the payload, as its text, back to the SQLite value it
/// renders, as (typeof, hex) like the log. Numbers are read from their text
/// with Rust's own parser: serde_json's default one is not always correctly
/// rounded, SQLite's and Rust's are.
fn decode(raw: &RawValue) -> String {
    let v: Value = serde_json::from_str(raw.get()).unwrap();
    match &v {
        Value::Null => "null:".into(),
        Value::Number(n) if n.is_i64() => format!("integer:{}", hex(n.to_string().as_bytes())),
        Value::Number(_) => format!("real:{}", raw.get().parse::<f64>().unwrap().to_bits()),
        Value::String(s) => format!("text:{}", hex(s.as_bytes())),
        Value::Object(o) if o.contains_key("$blob") => {
            format!("blob:{}", o["$blob"].as_str().unwrap())
        }
        Value::Object(o) if o.contains_key("$real") => match o["$real"].as_str().unwrap() {
            "Inf" => format!("real:{}", f64::INFINITY.to_bits()),
            "-Inf" => format!("real:{}", f64::NEG_INFINITY.to_bits()),
            other => panic!("unexpected $real {other}"),
        },
        other => panic!("unexpected value {other}"),
    }
}

/// A logged image (typeof:hex pairs) in the same form as `decode`.
fn logged(image: &str, all: &[String]) -> Vec<String> {
    image
        .split(',')
        .zip(all)
        .map(|(field, _)| {
            let (ty, h) = field.split_once(':').unwrap();
            match ty {
                "integer" => format!("integer:{h}"),
                "real" => {
                    let text = String::from_utf8(unhex(h)).unwrap();
                    let r: f64 = match text.as_str() {
                        "Inf" => f64::INFINITY,
                        "-Inf" => f64::NEG_INFINITY,
                        t => t.parse().unwrap(),
                    };
                    format!("real:{}", r.to_bits())
                }
                other => format!("{other}:{h}"),
            }
        })
        .collect()
}

fn check(t: &Table, stmts: &[Stmt]) -> Result<(), TestCaseError> {
    let a = captured(t);
    let b = plain(t);
    for s in stmts {
        let sql = render(t, s);
        let ra = a.execute(&sql, []);
        let rb = b.execute(&sql, []);
        prop_assert_eq!(
            ra.is_ok(),
            rb.is_ok(),
            "{}: captured {:?}, plain {:?}",
            sql,
            ra,
            rb
        );
        if let (Ok(na), Ok(nb)) = (&ra, &rb) {
            prop_assert_eq!(na, nb, "{}: changes() differ", sql);
        }
        prop_assert_eq!(
            snapshot(&a, t),
            snapshot(&b, t),
            "{}: table contents differ",
            sql
        );
    }
    // Every row change SQLite reported, and no other, is one valid event.
    let log: Vec<(String, Option<String>, Option<String>)> = b
        .prepare("SELECT op, before, after FROM log ORDER BY rowid")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let events = stored_events(&a);
    let ops: Vec<&str> = events
        .iter()
        .map(|e| e.payload["op"].as_str().unwrap())
        .collect();
    let want: Vec<&str> = log.iter().map(|(op, _, _)| op.as_str()).collect();
    prop_assert_eq!(
        &ops,
        &want,
        "events {:#?}",
        events.iter().map(|e| &e.payload).collect::<Vec<_>>()
    );
    let all = t.all_columns();
    for (e, (op, before, after)) in events.iter().zip(&log) {
        let p = &e.payload;
        if p.get("payload_hex").is_some() {
            // Text JSON cannot hold: the change as hex, and its bytes must
            // hold every text value's bytes.
            let bytes = unhex(p["payload_hex"].as_str().unwrap());
            for image in [before, after].into_iter().flatten() {
                for field in image.split(',') {
                    if let Some(h) = field.strip_prefix("text:") {
                        let raw = unhex(h);
                        let ok = raw.is_empty()
                            || bytes.windows(raw.len()).any(|w| w == raw.as_slice())
                            || raw
                                .iter()
                                .any(|&b| b == b'"' || b == b'\\' || (b < 0x20 && b != 0));
                        prop_assert!(
                            ok,
                            "text {:?} not in the hex payload",
                            String::from_utf8_lossy(&raw)
                        );
                    }
                }
            }
            continue;
        }
        prop_assert_eq!(&p["op"], op);
        let top: BTreeMap<String, Box<RawValue>> =
            serde_json::from_str(e.envelope.payload.get()).unwrap();
        for (side, image) in [("before", before), ("after", after)] {
            let got: Option<BTreeMap<String, Box<RawValue>>> =
                serde_json::from_str(top[side].get()).unwrap();
            match (image, got) {
                (None, got) => prop_assert!(got.is_none(), "{side} of {p}"),
                (Some(image), Some(got)) => {
                    let got: Vec<String> = all.iter().map(|c| decode(&got[c])).collect();
                    prop_assert_eq!(got, logged(image, &all), "{} of {}", side, p);
                }
                (Some(_), None) => prop_assert!(false, "{side} missing in {p}"),
            }
        }
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("OUTBOXD_CAPTURE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn captured_writes_behave_as_uncaptured_and_each_row_change_is_one_valid_event((t, stmts) in case()) {
        check(&t, &stmts)?;
    }
}
