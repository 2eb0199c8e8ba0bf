//! Enqueue overhead: a host transaction writing one business row plus events
//! through `outboxd::enqueue`, against the same transaction writing the
//! business row plus a plain INSERT of the same payload into a plain table.
//!
//!   cargo bench --bench enqueue                      # 2,000 txns a run, 5 runs
//!   OUTBOXD_BENCH_TXNS=50 OUTBOXD_BENCH_RUNS=1 cargo bench --bench enqueue   # smoke
//!
//! For profiling, OUTBOXD_BENCH_SIDE=plain|outboxd runs one side only and
//! OUTBOXD_BENCH_SYNC=FULL|NORMAL one setting only (ratios then print as —):
//!
//!   OUTBOXD_BENCH_SIDE=outboxd OUTBOXD_BENCH_SYNC=NORMAL OUTBOXD_BENCH_TXNS=200 \
//!     OUTBOXD_BENCH_RUNS=1 valgrind --tool=callgrind target/release/deps/enqueue-*
//!
//! Shapes: one event per transaction (OUTBOXD_BENCH_TXNS transactions) and
//! 100 events per transaction (a tenth as many transactions), each with
//! synchronous=FULL and NORMAL. Both sides serialize the same payload struct
//! with serde_json inside the timed loop; the outboxd side also builds the
//! `Event` (type parse, ULID). Runs alternate plain/outboxd on a fresh
//! database each, and the ratio is taken per pair of runs.

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
    conn
}

/// One host transaction: the business row, then `per_txn` events. Never
/// inlined, so callgrind can collect exactly this (`--toggle-collect`).
#[inline(never)]
fn one_txn(conn: &mut Connection, side: Side, seq: i64, per_txn: usize) {
    let tx = conn.transaction().unwrap();
    tx.prepare_cached("INSERT INTO articles (title, body) VALUES (?1, ?2)")
        .unwrap()
        .execute(params!["Hello, world", "A short article body."])
        .unwrap();
    for k in 0..per_txn as i64 {
        let p = Payload {
            article_id: seq * 1000 + k,
            title: "Hello, world",
            author: "bench",
        };
        match side {
            Side::Plain => {
                let payload = serde_json::to_string(&p).unwrap();
                tx.prepare_cached(
                    "INSERT INTO plain_outbox (event_type, payload, created_at) VALUES (?1, ?2, ?3)",
                )
                .unwrap()
                .execute(params![EVENT_TYPE, payload, outboxd::Timestamp::now().as_millis()])
                .unwrap();
            }
            Side::Outboxd => {
                let event = outboxd::Event::new(EVENT_TYPE, &p).unwrap();
                outboxd::enqueue(&tx, &event).unwrap();
            }
        }
    }
    tx.commit().unwrap();
}

/// Time per transaction over `txns` transactions on a fresh database.
fn run(dir: &Path, side: Side, sync: &str, txns: usize, per_txn: usize) -> Duration {
    let path = dir.join(format!("enqueue-{}.db", ulid::Ulid::generate()));
    let mut conn = setup(&path, sync);
    // Warm the statement caches and the file.
    for i in 0..10 {
        one_txn(&mut conn, side, -i - 1, per_txn);
    }
    let start = Instant::now();
    for i in 0..txns {
        one_txn(&mut conn, side, i as i64, per_txn);
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

fn main() {
    let txns = env_or("OUTBOXD_BENCH_TXNS", 2000);
    let runs = env_or("OUTBOXD_BENCH_RUNS", 5);
    let dir = bench_dir();
    header(
        "enqueue",
        dir.path(),
        &format!(
            "{txns} txns of 1 event, {} txns of 100 events, {runs} runs each side",
            (txns / 10).max(1)
        ),
    );
    println!("| synchronous | events/txn | plain insert µs/txn (min–max) | outboxd::enqueue µs/txn (min–max) | ratio outboxd/plain, median of paired runs (min–max) | load |");
    println!("|---|---|---|---|---|---|");
    let side = std::env::var("OUTBOXD_BENCH_SIDE").unwrap_or_default();
    let only_sync = std::env::var("OUTBOXD_BENCH_SYNC").unwrap_or_default();
    let (do_plain, do_ours) = (side != "outboxd", side != "plain");
    for sync in ["FULL", "NORMAL"] {
        if !only_sync.is_empty() && !only_sync.eq_ignore_ascii_case(sync) {
            continue;
        }
        for per_txn in [1, 100] {
            let n = if per_txn == 1 {
                txns
            } else {
                (txns / 10).max(1)
            };
            let load = common::load();
            let (mut plain, mut ours, mut ratios) = (vec![], vec![], vec![]);
            for _ in 0..runs {
                if do_plain {
                    plain.push(micros(run(dir.path(), Side::Plain, sync, n, per_txn)));
                }
                if do_ours {
                    ours.push(micros(run(dir.path(), Side::Outboxd, sync, n, per_txn)));
                }
                if do_plain && do_ours {
                    ratios.push(ours[ours.len() - 1] / plain[plain.len() - 1]);
                }
            }
            if !(do_plain && do_ours) {
                let (name, v) = if do_plain {
                    ("plain", plain)
                } else {
                    ("outboxd", ours)
                };
                let s = Stats::of(v);
                println!(
                    "| {sync} | {per_txn} | {name} only: {:.1} ({:.1}–{:.1}) | | — | {load} |",
                    s.median, s.min, s.max
                );
                continue;
            }
            let (p, o, r) = (Stats::of(plain), Stats::of(ours), Stats::of(ratios));
            println!(
                "| {sync} | {per_txn} | {:.1} ({:.1}–{:.1}) | {:.1} ({:.1}–{:.1}) | **{:.2}** ({:.2}–{:.2}) | {load} |",
                p.median, p.min, p.max, o.median, o.min, o.max, r.median, r.min, r.max
            );
        }
    }
}
