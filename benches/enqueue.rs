//! Enqueue overhead: a host transaction writing one business row plus events
//! through `outboxd::enqueue` (one event) or `outboxd::enqueue_many` (100),
//! against the same transaction writing the business row plus a plain INSERT
//! of the same payload into a plain table.
//!
//!   cargo bench --bench enqueue                      # 2,000 txns a run, 5 runs
//!   OUTBOXD_BENCH_TXNS=50 OUTBOXD_BENCH_RUNS=1 cargo bench --bench enqueue   # smoke
//!
//! For profiling, OUTBOXD_BENCH_SIDE=plain|outboxd runs one side only,
//! OUTBOXD_BENCH_SYNC=FULL|NORMAL one setting only, OUTBOXD_BENCH_SHAPE=1|100
//! one shape only and OUTBOXD_BENCH_PAYLOADS the payload sizes (bytes of
//! JSON, comma-separated; default 200,2048). Ratios print as — when one side
//! runs alone:
//!
//!   OUTBOXD_BENCH_SIDE=outboxd OUTBOXD_BENCH_SYNC=NORMAL OUTBOXD_BENCH_SHAPE=100 \
//!     OUTBOXD_BENCH_PAYLOADS=200 OUTBOXD_BENCH_TXNS=200 OUTBOXD_BENCH_RUNS=1 \
//!     valgrind --tool=callgrind --toggle-collect='*one_txn*' target/release/deps/enqueue-*
//!
//! OUTBOXD_BENCH_SCHEMA rebuilds the (empty) event table before a run, to
//! measure what a part of the schema costs the producer; a variant is a
//! measurement, not a schema outboxd supports (its relay would refuse or
//! misread some of them):
//!
//!   current               the migrated schema (the default)
//!   no-autoincrement      the same table without AUTOINCREMENT
//!   no-event-id-index     the same without the index on event_id
//!   neither               without both
//!   claim-index-only      the table's columns and defaults, no CHECK, no
//!                         AUTOINCREMENT, and only the claim's index
//!                         (event_outbox_due)
//!   no-index              the same columns, no CHECK and no index at all
//!
//! Shapes: one event per transaction (OUTBOXD_BENCH_TXNS transactions) and
//! 100 events per transaction (a tenth as many transactions), each with
//! synchronous=FULL and NORMAL, each with every payload size. Both sides
//! serialize the same payload struct with serde_json inside the timed loop;
//! the outboxd side also builds the `Event` (type parse, ULID). With 100
//! events the plain side prepares its INSERT once per transaction, as
//! `enqueue_many` does. Runs alternate plain/outboxd on a fresh database
//! each, and the ratio is taken per pair of runs.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{bench_dir, env_or, header, migrated, Stats};
use rusqlite::{params, Connection};

#[derive(serde::Serialize)]
struct Payload<'a> {
    article_id: i64,
    title: &'a str,
    author: &'a str,
    /// Filler that brings the JSON to the size under test.
    body: &'a str,
}

/// A body that makes the payload's JSON `bytes` long (the other fields
/// take 69 bytes with a four-digit article id).
fn body_for(bytes: usize) -> String {
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit. "
        .chars()
        .cycle()
        .take(bytes.saturating_sub(69))
        .collect()
}

const EVENT_TYPE: &str = "article.created.v1";

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Plain,
    Outboxd,
}

fn setup(path: &Path, sync: &str) -> Connection {
    let conn = migrated(path, sync);
    conn.execute_batch(
        "CREATE TABLE articles (id INTEGER PRIMARY KEY, title TEXT NOT NULL, body TEXT NOT NULL);
         CREATE TABLE plain_outbox (id INTEGER PRIMARY KEY, event_type TEXT NOT NULL,
                                    payload TEXT NOT NULL, created_at INTEGER NOT NULL);",
    )
    .unwrap();
    if let Ok(variant) = std::env::var("OUTBOXD_BENCH_SCHEMA") {
        rebuild_event_table(&conn, &variant);
    }
    conn
}

/// Replaces the empty event table with the variant OUTBOXD_BENCH_SCHEMA
/// names (see the top of this file).
fn rebuild_event_table(conn: &Connection, variant: &str) {
    let table_sql: String = conn
        .query_row(
            "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'event_outbox'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let indexes: Vec<(String, String)> = conn
        .prepare(
            "SELECT name, sql FROM sqlite_schema
              WHERE type = 'index' AND tbl_name = 'event_outbox' AND sql IS NOT NULL",
        )
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    // The columns with their declared types and defaults, nothing else.
    let bare = || {
        let columns: Vec<String> = conn
            .prepare("SELECT name, type, \"notnull\", dflt_value, pk FROM pragma_table_info('event_outbox')")
            .unwrap()
            .query_map([], |r| {
                let (name, ty, notnull, default, pk): (String, String, bool, Option<String>, i64) =
                    (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?);
                Ok(format!(
                    "{name} {ty}{}{}{}",
                    if pk > 0 { " PRIMARY KEY" } else { "" },
                    if notnull { " NOT NULL" } else { "" },
                    default.map(|d| format!(" DEFAULT ({d})")).unwrap_or_default()
                ))
            })
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        format!("CREATE TABLE event_outbox ({})", columns.join(", "))
    };
    let without_autoincrement = || {
        let sql = table_sql.replace(" AUTOINCREMENT", "");
        assert_ne!(sql, table_sql, "the table has no AUTOINCREMENT to remove");
        sql
    };
    let keep = |drop: &[&str]| -> Vec<&str> {
        indexes
            .iter()
            .filter(|(name, _)| !drop.contains(&name.as_str()))
            .map(|(_, sql)| sql.as_str())
            .collect()
    };
    let all_but_due: Vec<&str> = indexes
        .iter()
        .map(|(name, _)| name.as_str())
        .filter(|&name| name != "event_outbox_due")
        .collect();
    let (table, indexes) = match variant {
        "current" => return,
        "no-autoincrement" => (without_autoincrement(), keep(&[])),
        "no-event-id-index" => (table_sql.clone(), keep(&["event_outbox_event_id"])),
        "neither" => (without_autoincrement(), keep(&["event_outbox_event_id"])),
        "claim-index-only" => (bare(), keep(&all_but_due)),
        "no-index" => (bare(), Vec::new()),
        other => panic!(
            "OUTBOXD_BENCH_SCHEMA={other}: expected current, no-autoincrement, \
             no-event-id-index, neither, claim-index-only or no-index"
        ),
    };
    let mut sql = format!("DROP TABLE event_outbox; DELETE FROM sqlite_sequence; {table};");
    for index in indexes {
        sql.push_str(index);
        sql.push(';');
    }
    conn.execute_batch(&sql).unwrap();
}

/// One host transaction: the business row, then `per_txn` events. Never
/// inlined, so callgrind can collect exactly this (`--toggle-collect`).
#[inline(never)]
fn one_txn(conn: &mut Connection, side: Side, seq: i64, per_txn: usize, body: &str) {
    let tx = conn.transaction().unwrap();
    tx.prepare_cached("INSERT INTO articles (title, body) VALUES (?1, ?2)")
        .unwrap()
        .execute(params!["Hello, world", "A short article body."])
        .unwrap();
    let payload = |k: i64| Payload {
        article_id: seq * 1000 + k,
        title: "Hello, world",
        author: "bench",
        body,
    };
    match side {
        Side::Plain => {
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO plain_outbox (event_type, payload, created_at) VALUES (?1, ?2, ?3)",
                )
                .unwrap();
            for k in 0..per_txn as i64 {
                let json = serde_json::to_string(&payload(k)).unwrap();
                insert
                    .execute(params![
                        EVENT_TYPE,
                        json,
                        outboxd::Timestamp::now().as_millis()
                    ])
                    .unwrap();
            }
        }
        Side::Outboxd if per_txn == 1 => {
            let event = outboxd::Event::new(EVENT_TYPE, &payload(0)).unwrap();
            outboxd::enqueue(&tx, &event).unwrap();
        }
        Side::Outboxd => {
            let events: Vec<outboxd::Event> = (0..per_txn as i64)
                .map(|k| outboxd::Event::new(EVENT_TYPE, &payload(k)).unwrap())
                .collect();
            outboxd::enqueue_many(&tx, &events).unwrap();
        }
    }
    tx.commit().unwrap();
}

/// Time per transaction over `txns` transactions on a fresh database.
fn run(dir: &Path, side: Side, sync: &str, txns: usize, per_txn: usize, body: &str) -> Duration {
    let path = dir.join(format!("enqueue-{}.db", ulid::Ulid::generate()));
    let mut conn = setup(&path, sync);
    // Warm the statement caches and the file.
    for i in 0..10 {
        one_txn(&mut conn, side, -i - 1, per_txn, body);
    }
    let start = Instant::now();
    for i in 0..txns {
        one_txn(&mut conn, side, i as i64, per_txn, body);
    }
    let took = start.elapsed() / txns as u32;
    drop(conn);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    took
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// A comma-separated list of numbers from the environment, or the default.
fn list_or(name: &str, default: &[usize]) -> Vec<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .split(',')
            .map(|n| {
                n.trim().parse().unwrap_or_else(|_| {
                    panic!("{name}={v:?}: expected numbers separated by commas")
                })
            })
            .collect(),
        Err(_) => default.to_vec(),
    }
}

fn main() {
    let txns = env_or("OUTBOXD_BENCH_TXNS", 2000);
    let runs = env_or("OUTBOXD_BENCH_RUNS", 5);
    let payloads = list_or("OUTBOXD_BENCH_PAYLOADS", &[200, 2048]);
    let shapes = list_or("OUTBOXD_BENCH_SHAPE", &[1, 100]);
    let dir = bench_dir();
    header(
        "enqueue",
        dir.path(),
        &format!(
            "{txns} txns of 1 event, {} txns of 100 events, {runs} runs each side; event table: {}",
            (txns / 10).max(1),
            std::env::var("OUTBOXD_BENCH_SCHEMA").unwrap_or_else(|_| "current".into())
        ),
    );
    println!("| synchronous | events/txn | payload B | plain insert µs/txn (min–max) | outboxd µs/txn (min–max) | ratio outboxd/plain, median of paired runs (min–max) | load start→end |");
    println!("|---|---|---|---|---|---|---|");
    let side = std::env::var("OUTBOXD_BENCH_SIDE").unwrap_or_default();
    let only_sync = std::env::var("OUTBOXD_BENCH_SYNC").unwrap_or_default();
    let (do_plain, do_ours) = (side != "outboxd", side != "plain");
    for sync in ["FULL", "NORMAL"] {
        if !only_sync.is_empty() && !only_sync.eq_ignore_ascii_case(sync) {
            continue;
        }
        for &per_txn in &shapes {
            for &bytes in &payloads {
                let body = body_for(bytes);
                let size = serde_json::to_string(&Payload {
                    article_id: 1000,
                    title: "Hello, world",
                    author: "bench",
                    body: &body,
                })
                .unwrap()
                .len();
                let n = if per_txn == 1 {
                    txns
                } else {
                    (txns / 10).max(1)
                };
                let load = common::load();
                let (mut plain, mut ours, mut ratios) = (vec![], vec![], vec![]);
                for _ in 0..runs {
                    if do_plain {
                        let t = run(dir.path(), Side::Plain, sync, n, per_txn, &body);
                        plain.push(micros(t));
                    }
                    if do_ours {
                        let t = run(dir.path(), Side::Outboxd, sync, n, per_txn, &body);
                        ours.push(micros(t));
                    }
                    if do_plain && do_ours {
                        ratios.push(ours[ours.len() - 1] / plain[plain.len() - 1]);
                    }
                }
                let load = format!("{load}→{}", common::load());
                if !(do_plain && do_ours) {
                    let (name, v) = if do_plain {
                        ("plain", plain)
                    } else {
                        ("outboxd", ours)
                    };
                    let s = Stats::of(v);
                    println!(
                        "| {sync} | {per_txn} | {size} | {name} only: {:.1} ({:.1}–{:.1}) | | — | {load} |",
                        s.median, s.min, s.max
                    );
                    continue;
                }
                let (p, o, r) = (Stats::of(plain), Stats::of(ours), Stats::of(ratios));
                println!(
                    "| {sync} | {per_txn} | {size} | {:.1} ({:.1}–{:.1}) | {:.1} ({:.1}–{:.1}) | **{:.2}** ({:.2}–{:.2}) | {load} |",
                    p.median, p.min, p.max, o.median, o.min, o.max, r.median, r.min, r.max
                );
            }
        }
    }
}
