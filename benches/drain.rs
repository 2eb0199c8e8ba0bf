//! Drain throughput: outboxd's relay against the minimal claim-and-finish
//! loop written directly in rusqlite, on the same table and settings.
//!
//!   cargo bench --bench drain                 # 100,000 events, 5 runs each
//!   OUTBOXD_BENCH_EVENTS=2000 OUTBOXD_BENCH_RUNS=1 cargo bench --bench drain   # smoke
//!
//! Prints one table row per configuration: median, min and max rows/s, and
//! the median as a ratio of the baseline's median.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use outboxd::{Delivery, Event, Outcome, Relay};
use rusqlite::{params, Connection};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A fresh migrated database holding `n` due events.
fn prepare(dir: &Path, n: usize) -> std::path::PathBuf {
    let path = dir.join(format!("drain-{}.db", ulid::Ulid::generate()));
    let mut conn = outboxd::connection::open(&path).unwrap();
    outboxd::schema::migrate(&mut conn).unwrap();
    conn.execute_batch("PRAGMA synchronous = NORMAL").unwrap();
    let events: Vec<Event> = (0..n)
        .map(|i| Event::new("bench.drained.v1", &serde_json::json!({ "i": i })).unwrap())
        .collect();
    for chunk in events.chunks(10_000) {
        let tx = conn.transaction().unwrap();
        outboxd::enqueue_many(&tx, chunk).unwrap();
        tx.commit().unwrap();
    }
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    path
}

/// The baseline: claim 256 with UPDATE ... RETURNING, then mark them done
/// and insert their dedup rows in one transaction.
fn baseline(path: &Path, n: usize) -> Duration {
    let mut conn = Connection::open(path).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 5000",
    )
    .unwrap();
    let start = Instant::now();
    let mut done = 0;
    while done < n {
        let now = outboxd::Timestamp::now().as_millis();
        let claimed = common::raw_claim(&conn, now);
        let tx = conn.transaction().unwrap();
        {
            let mut fin = tx
                .prepare_cached(
                    "UPDATE event_outbox SET status = 'delivered', finished_at = ?2, claim_token = NULL, lease_until = NULL
                      WHERE id = ?1 AND claim_token = 'b'",
                )
                .unwrap();
            let mut dedup = tx
                .prepare_cached(
                    "INSERT OR IGNORE INTO delivered_events (event_key, consumer, outbox_id, delivered_at)
                     VALUES (?1, 'c', ?2, ?3)",
                )
                .unwrap();
            for (id, key) in &claimed {
                fin.execute(params![id, now]).unwrap();
                dedup.execute(params![key, id, now]).unwrap();
            }
        }
        tx.commit().unwrap();
        done += claimed.len();
    }
    start.elapsed()
}

/// outboxd's relay with default settings and no-op consumers.
fn relay(path: &Path, n: usize, consumers: usize, workers: Option<usize>) -> Duration {
    let mut b = Relay::builder(path);
    for c in 0..consumers {
        b = b.consumer(&format!("c{c}"), ["bench.*"], |_: &Delivery| {
            Outcome::Delivered
        });
    }
    if let Some(w) = workers {
        b = b.workers(w);
    }
    let check = Connection::open(path).unwrap();
    let start = Instant::now();
    let handle = b.build().unwrap().start().unwrap();
    // An O(1) probe of the due index, so that watching costs the relay
    // nothing measurable.
    loop {
        let left: bool = check
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM event_outbox WHERE status = 'pending')",
                [],
                |r| r.get(0),
            )
            .unwrap();
        if !left {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let took = start.elapsed();
    handle.shutdown(Duration::from_secs(10)).unwrap();
    let delivered: i64 = check
        .query_row(
            "SELECT count(*) FROM event_outbox WHERE status = 'delivered'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(delivered as usize, n);
    took
}

struct Stats {
    median: f64,
    min: f64,
    max: f64,
}

fn rates(n: usize, runs: usize, mut f: impl FnMut() -> Duration) -> Stats {
    let mut r: Vec<f64> = (0..runs).map(|_| n as f64 / f().as_secs_f64()).collect();
    r.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Stats {
        median: r[r.len() / 2],
        min: r[0],
        max: r[r.len() - 1],
    }
}

fn main() {
    let n = env_or("OUTBOXD_BENCH_EVENTS", 100_000);
    let runs = env_or("OUTBOXD_BENCH_RUNS", 5);
    let dir =
        tempfile::tempdir_in(std::env::var("OUTBOXD_BENCH_DIR").unwrap_or_else(|_| ".".into()))
            .expect("a temp dir on disk");
    println!("drain: {n} due events, {runs} runs each, WAL, file on disk");
    println!("| configuration | median rows/s | min | max | ratio to baseline |");
    println!("|---|---|---|---|---|");
    let base = rates(n, runs, || baseline(&prepare(dir.path(), n), n));
    println!(
        "| baseline: rusqlite claim-256 loop | {:.0} | {:.0} | {:.0} | 1.00 |",
        base.median, base.min, base.max
    );
    let configs: &[(&str, usize, Option<usize>)] = &[
        ("outboxd, 1 consumer, default workers", 1, None),
        ("outboxd, 2 consumers", 2, None),
        ("outboxd, 4 consumers", 4, None),
        ("outboxd, 1 worker", 1, Some(1)),
        ("outboxd, 2 workers", 1, Some(2)),
        ("outboxd, 4 workers", 1, Some(4)),
    ];
    for (name, consumers, workers) in configs {
        let s = rates(n, runs, || {
            relay(&prepare(dir.path(), n), n, *consumers, *workers)
        });
        println!(
            "| {name} | {:.0} | {:.0} | {:.0} | {:.2} |",
            s.median,
            s.min,
            s.max,
            s.median / base.median
        );
    }
}
