//! Console pages at scale: how long each page of `outboxd console` takes to
//! answer (HTTP round trip on loopback, sequential requests) with
//!
//! - a small database (1,000 events, 100 dead letters): the baseline,
//! - a large one (1,000,000 events, 10,000 dead letters, two consumers'
//!   ledger entries for every delivered event).
//!
//!   cargo bench --bench console                 # 1,000,000 events, 20 requests a page
//!   OUTBOXD_BENCH_CONSOLE_EVENTS=20000 OUTBOXD_BENCH_CONSOLE_DEAD=500 \
//!   OUTBOXD_BENCH_RUNS=3 cargo bench --bench console                     # smoke
//!
//! The target is 50 ms a page on the large database. The overview, /metrics
//! and /healthz read the status measured in the background (its own time is
//! printed too: it counts every row); the replay count is an action over
//! every event the consumer had, shown apart.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{bench_dir, env_or, header, migrated, ms, percentile};
use rusqlite::params;

/// Fills a database: `events` rows, the newest `dead` of them dead letters
/// and the 1,000 before those pending, the rest delivered with a ledger row
/// for two consumers. Plain SQL in large transactions.
fn fill(path: &Path, events: usize, dead: usize) {
    let mut conn = migrated(path, "OFF");
    let pending = 1_000.min(events / 10);
    let tx = conn.transaction().unwrap();
    {
        let mut row = tx
            .prepare(
                "INSERT INTO event_outbox (event_id, event_type, tenant_id, payload, status,
                     attempts, last_error, occurred_at, created_at, available_at, finished_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?8, ?9)",
            )
            .unwrap();
        let mut ledger = tx
            .prepare("INSERT INTO delivered_events VALUES (?1, ?2, ?3, ?4)")
            .unwrap();
        let now = outboxd::Timestamp::now().as_millis();
        for i in 0..events {
            // Spread over the last 30 days, in id order.
            let at = now - 30 * 86_400_000 + (i as i64) * (30 * 86_400_000 / events as i64);
            let id = outboxd::EventId::new().to_string();
            let ty = ["article.created.v1", "order.placed.v1", "user.signed_up.v2"][i % 3];
            let (status, attempts, error, finished) = if i >= events - dead {
                (
                    "dead",
                    10,
                    Some("webhook: 503 Service Unavailable"),
                    Some(at + 5_000),
                )
            } else if i >= events - dead - pending {
                ("pending", (i % 2) as i64, None, None)
            } else {
                ("delivered", 0, None, Some(at + 100))
            };
            row.execute(params![
                id,
                ty,
                format!("tenant-{}", i % 50),
                format!("{{\"id\": {i}, \"title\": \"an article about something\"}}"),
                status,
                attempts,
                error,
                at,
                finished
            ])
            .unwrap();
            if status == "delivered" {
                let rowid = tx.last_insert_rowid();
                for consumer in ["search-index", "webhook"] {
                    ledger
                        .execute(params![id, consumer, rowid, at + 100])
                        .unwrap();
                }
            }
        }
    }
    tx.commit().unwrap();
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE); ANALYZE;")
        .unwrap();
}

/// One GET; the time to the whole answer.
fn get(addr: &str, path: &str) -> (u16, Duration) {
    let started = Instant::now();
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let status = String::from_utf8_lossy(&out[..out.len().min(12)])
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, started.elapsed())
}

struct Console {
    child: Child,
    addr: String,
}

impl Console {
    fn start(db: &Path, config: &Path) -> Console {
        let addr = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string();
        let child = Command::new(env!("CARGO_BIN_EXE_outboxd"))
            .args(["--db", db.to_str().unwrap(), "console", "--http", &addr])
            .args(["--config", config.to_str().unwrap()])
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        common::wait_for("the console to serve", Duration::from_secs(60), || {
            TcpStream::connect(&addr).is_ok()
        });
        Console { child, addr }
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const PAGES: &[&str] = &[
    "/",
    "/events",
    "/events?state=dead",
    "/events?type=order.*.v1&tenant=tenant-7",
    "/events?consumer=webhook&missing=1",
    "/events/{first_dead}",
    "/events/{event_id}",
    "/dead",
    "/dead?type=order.*.v1",
    "/replay",
    "/intents",
    "/metrics",
    "/healthz",
];

/// What one database measured.
struct Measured {
    /// Per page: (median, p95, max) ms over the runs.
    pages: Vec<(f64, f64, f64)>,
    /// One replay count of everything a consumer had, ms.
    replay: f64,
    /// The first status measure (counting every row), ms.
    status: f64,
}

fn measure(db: &Path, config: &Path, runs: usize) -> Measured {
    let console = Console::start(db, config);
    let conn = rusqlite::Connection::open(db).unwrap();
    let first_dead: i64 = conn
        .query_row(
            "SELECT min(id) FROM event_outbox WHERE status = 'dead'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let event_id: String = conn
        .query_row(
            "SELECT event_id FROM event_outbox WHERE id = ?1",
            [first_dead / 2],
            |r| r.get(0),
        )
        .unwrap();
    // The first status measure counts every row: wait for it once.
    let started = Instant::now();
    common::wait_for("the first status measure", Duration::from_secs(120), || {
        matches!(get(&console.addr, "/healthz").0, 200 | 503)
    });
    let status = ms(started.elapsed());
    let mut out = Vec::new();
    for page in PAGES {
        let path = page
            .replace("{first_dead}", &first_dead.to_string())
            .replace("{event_id}", &event_id);
        let (status, _) = get(&console.addr, &path); // warm
        assert!(status == 200 || status == 503, "{path}: {status}");
        let mut times: Vec<Duration> = (0..runs).map(|_| get(&console.addr, &path).1).collect();
        times.sort();
        out.push((
            ms(percentile(&times, 50.0)),
            ms(percentile(&times, 95.0)),
            ms(*times.last().unwrap()),
        ));
    }
    let (_, replay) = get(&console.addr, "/replay?consumer=webhook");
    Measured {
        pages: out,
        replay: ms(replay),
        status,
    }
}

fn main() {
    let large = env_or("OUTBOXD_BENCH_CONSOLE_EVENTS", 1_000_000);
    let dead = env_or("OUTBOXD_BENCH_CONSOLE_DEAD", 10_000);
    let runs = env_or("OUTBOXD_BENCH_RUNS", 20).max(1);
    let dir = bench_dir();
    header(
        "console",
        dir.path(),
        &format!("pages of `outboxd console`, {runs} sequential requests each"),
    );
    let config = dir.path().join("outboxd.toml");
    std::fs::write(
        &config,
        "[[consumer]]\nname = \"search-index\"\ntypes = [\"article.*.v1\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = \"-\"\n\
         [[consumer]]\nname = \"webhook\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = \"-\"\n",
    )
    .unwrap();
    let small_db = dir.path().join("small.db");
    let large_db = dir.path().join("large.db");
    fill(&small_db, 1_000, 100);
    let started = Instant::now();
    fill(&large_db, large, dead);
    eprintln!(
        "filled {large} events in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let small = measure(&small_db, &config, runs);
    let big = measure(&large_db, &config, runs);
    println!();
    println!("| page | small: median ms | large ({large} events, {dead} dead): median ms | p95 | max | ratio |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (i, page) in PAGES.iter().enumerate() {
        let (s, _, _) = small.pages[i];
        let (m, p95, max) = big.pages[i];
        println!(
            "| `{page}` | {s:.1} | {m:.1} | {p95:.1} | {max:.1} | {:.1}× |",
            m / s.max(0.001)
        );
    }
    for (what, s, m) in [
        (
            "replay count, everything `webhook` had (an action)",
            small.replay,
            big.replay,
        ),
        (
            "the status measure in the background (first one)",
            small.status,
            big.status,
        ),
    ] {
        println!(
            "| {what} | {s:.1} | {m:.1} | | | {:.1}× |",
            m / s.max(0.001)
        );
    }
}
