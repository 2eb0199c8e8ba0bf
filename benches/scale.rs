//! Scale: does the drain rate hold as the table grows? The relay (default
//! settings, one no-op consumer) drains
//!
//! - a small backlog of due events (the baseline),
//! - a large backlog of due events,
//! - the small backlog in a table that also holds millions of delivered rows
//!   (and their `delivered_events` rows) not yet purged.
//!
//!   cargo bench --bench scale        # 10,000 / 1,000,000 due, 5,000,000 delivered, 5 runs
//!   OUTBOXD_BENCH_SMALL=1000 OUTBOXD_BENCH_LARGE=5000 OUTBOXD_BENCH_DELIVERED=20000 \
//!   OUTBOXD_BENCH_RUNS=1 cargo bench --bench scale                          # smoke
//!
//! Each case is built once as a template file (due events through
//! `enqueue_many`; delivered rows with plain SQL in big transactions) and
//! every run drains a fresh copy of it. The time from starting the relay until its metrics count
//! every event delivered is the drain time, as in benches/drain.rs.
//! OUTBOXD_BENCH_PURGE=off runs the relay without its housekeeping purge.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{bench_dir, env_or, header, migrated, remove_db, Stats};
use outboxd::{Delivery, Event, Outcome, Relay};

/// Adds `n` due events through `enqueue_many`, 10,000 per transaction.
fn enqueue_due(conn: &mut rusqlite::Connection, n: usize) {
    let mut i = 0;
    while i < n {
        let k = (n - i).min(10_000);
        let events: Vec<Event> = (i..i + k)
            .map(|j| Event::new("bench.scaled.v1", &serde_json::json!({ "i": j })).unwrap())
            .collect();
        let tx = conn.transaction().unwrap();
        outboxd::enqueue_many(&tx, &events).unwrap();
        tx.commit().unwrap();
        i += k;
    }
}

fn new_db(dir: &Path, name: &str) -> (PathBuf, rusqlite::Connection) {
    let path = dir.join(format!("{name}-{}.db", ulid::Ulid::generate()));
    let conn = migrated(&path, "NORMAL");
    (path, conn)
}

fn checkpoint(conn: &rusqlite::Connection) {
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
}

/// Drains every due event with a default relay and one no-op consumer;
/// returns events per second.
fn drain(path: &Path, n: usize) -> f64 {
    let start = Instant::now();
    let handle = Relay::builder(path)
        .consumer("c0", ["bench.*"], |_: &Delivery| Outcome::Delivered)
        .purge(common::purge_policy())
        .build()
        .unwrap()
        .start()
        .unwrap();
    common::wait_for("the relay to drain", Duration::from_secs(3600), || {
        handle.metrics().delivered >= n as u64
    });
    let took = start.elapsed();
    let m = handle.metrics();
    eprintln!(
        "  drained {n} in {:.2} s: {} commits, {:.0} ms in claims, {:.0} ms in write transactions",
        took.as_secs_f64(),
        m.commits,
        m.claim_micros_total as f64 / 1e3,
        m.commit_micros_total as f64 / 1e3
    );
    handle.shutdown(Duration::from_secs(10)).unwrap();
    let conn = rusqlite::Connection::open(path).unwrap();
    let pending: i64 = conn
        .query_row(
            "SELECT count(*) FROM event_outbox WHERE status = 'pending'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(pending, 0, "every due event was delivered");
    n as f64 / took.as_secs_f64()
}

fn main() {
    let small = env_or("OUTBOXD_BENCH_SMALL", 10_000);
    let large = env_or("OUTBOXD_BENCH_LARGE", 1_000_000);
    let delivered = env_or("OUTBOXD_BENCH_DELIVERED", 5_000_000);
    let runs = env_or("OUTBOXD_BENCH_RUNS", 5);
    let dir = bench_dir();
    header(
        "scale",
        dir.path(),
        &format!("{small} vs {large} due events, and {small} due among {delivered} delivered rows; {runs} runs; relay defaults, 1 no-op consumer, purge {}", common::purge_label()),
    );

    let template = |name: &str, due: usize, delivered: usize| {
        let (path, mut conn) = new_db(dir.path(), name);
        common::fill_delivered(&mut conn, delivered, "old-consumer");
        enqueue_due(&mut conn, due);
        checkpoint(&conn);
        path
    };
    let t = Instant::now();
    let small_template = template("small-template", small, 0);
    let large_template = template("large-template", large, 0);
    let large_fill = t.elapsed();
    let t = Instant::now();
    let full_template = template("delivered-template", small, delivered);
    let delivered_fill = t.elapsed();
    let size_mb = std::fs::metadata(&full_template).unwrap().len() as f64 / 1e6;
    println!(
        "setup: {small} + {large} due events enqueued in {:.1} s; {delivered} delivered rows (+ dedup rows) inserted with plain SQL (+ {small} due enqueued) in {:.1} s, file {size_mb:.0} MB",
        large_fill.as_secs_f64(),
        delivered_fill.as_secs_f64()
    );

    // Every run drains a fresh copy of its template, so the three cases
    // start alike (a file at rest on disk, its pages in the page cache).
    let drain_copy = |template: &Path, n: usize| {
        let p = dir
            .path()
            .join(format!("run-{}.db", ulid::Ulid::generate()));
        common::copy_at_rest(template, &p);
        let rate = drain(&p, n);
        remove_db(&p);
        rate
    };
    let (mut base, mut big, mut old) = (vec![], vec![], vec![]);
    let (mut big_ratio, mut old_ratio) = (vec![], vec![]);
    for _ in 0..runs {
        let b = drain_copy(&small_template, small);
        let l = drain_copy(&large_template, large);
        let o = drain_copy(&full_template, small);
        base.push(b);
        big.push(l);
        old.push(o);
        big_ratio.push(l / b);
        old_ratio.push(o / b);
    }
    println!("| table | median events/s (min–max) | ratio to small backlog, median of paired runs (min–max) |");
    println!("|---|---|---|");
    let row = |name: String, r: Vec<f64>, ratio: Option<Vec<f64>>| {
        let s = Stats::of(r);
        let ratio = ratio.map_or("1.00".to_string(), |v| {
            let q = Stats::of(v);
            format!("**{:.2}** ({:.2}–{:.2})", q.median, q.min, q.max)
        });
        println!(
            "| {name} | {:.0} ({:.0}–{:.0}) | {ratio} |",
            s.median, s.min, s.max
        );
    };
    row(format!("baseline: {small} due"), base, None);
    row(format!("{large} due"), big, Some(big_ratio));
    row(
        format!("{small} due + {delivered} delivered rows not purged"),
        old,
        Some(old_ratio),
    );
    println!("load average at end: {}", common::load());
}
