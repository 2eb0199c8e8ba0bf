//! Drain throughput: outboxd's relay against the minimal claim, mark-done
//! and ledger loop written directly in rusqlite, on the same schema and
//! settings (WAL, synchronous=NORMAL on both sides), with payloads of
//! realistic sizes.
//!
//!   cargo bench --bench drain                 # 100,000 events, 5 runs, ~200 B and ~2 KB
//!   OUTBOXD_BENCH_EVENTS=2000 OUTBOXD_BENCH_RUNS=1 cargo bench --bench drain   # smoke
//!
//! Settings: OUTBOXD_BENCH_PAYLOADS (payload sizes in bytes, default
//! `200,2000`), OUTBOXD_BENCH_WORKERS (extra one-consumer rows with these
//! worker counts, such as `1,2`), OUTBOXD_BENCH_ONLY (one configuration:
//! `raw1`, `relay1`, `raw2` or `relay2`, for a profiler).
//!
//! For each payload size, each run drains a fresh copy of one template file
//! with every configuration in turn, so a change of load hits all alike.
//! The ratio is the median of the per-run ratios (relay / its raw loop of
//! the same run), with min and max.
//!
//! Instructions per event (repeatable under load) with callgrind, counting
//! only the threads that drain:
//!
//!   OUTBOXD_BENCH_ONLY=relay1 OUTBOXD_BENCH_EVENTS=20000 OUTBOXD_BENCH_RUNS=1 \
//!     valgrind --tool=callgrind --collect-atstart=no \
//!       --toggle-collect='*raw_drain*' --toggle-collect='*Writer*run*' \
//!       --toggle-collect='*relay*worker*run*' target/release/deps/drain-<hash>

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{bench_dir, drain_timed, env_or, header, Stats};
use outboxd::{Delivery, Event, Outcome, Relay};
use rusqlite::Connection;

/// A payload of about `size` bytes of JSON: a small object with a text
/// field padded to the size (an order line, an article), numbered.
fn payload(i: usize, size: usize) -> serde_json::Value {
    let pad = size.saturating_sub(60);
    let text: String = "lorem ipsum dolor sit amet, consectetur adipiscing elit "
        .chars()
        .cycle()
        .take(pad)
        .collect();
    serde_json::json!({ "i": i, "kind": "order.line", "qty": 3, "text": text })
}

/// A template file holding `n` due events with payloads of ~`size` bytes.
fn template(dir: &Path, n: usize, size: usize) -> PathBuf {
    let path = dir.join(format!("drain-template-{size}.db"));
    let mut conn = common::migrated(&path, "NORMAL");
    let mut i = 0;
    while i < n {
        let k = (n - i).min(10_000);
        let events: Vec<Event> = (i..i + k)
            .map(|j| Event::new("bench.drained.v1", &payload(j, size)).unwrap())
            .collect();
        let tx = conn.transaction().unwrap();
        outboxd::enqueue_many(&tx, &events).unwrap();
        tx.commit().unwrap();
        i += k;
    }
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    drop(conn);
    path
}

/// A fresh copy of the template.
fn copy(template: &Path) -> PathBuf {
    let path = template.with_file_name(format!("drain-{}.db", ulid::Ulid::generate()));
    common::copy_at_rest(template, &path);
    path
}

/// The raw loop: claim up to 256 due rows with one `UPDATE … RETURNING`
/// of what a consumer needs (id, event id, type, payload), then in one
/// transaction mark each delivered (fenced by its token) and insert one
/// ledger row per consumer. This is the least SQLite work an outbox drain
/// with a dedup ledger can do on outboxd's schema.
#[inline(never)]
fn raw_drain(path: &Path, n: usize, consumers: usize) -> Duration {
    let mut conn = Connection::open(path).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 5000",
    )
    .unwrap();
    let names: Vec<String> = (0..consumers).map(|c| format!("c{c}")).collect();
    let start = Instant::now();
    let mut done = 0;
    while done < n {
        let now = outboxd::Timestamp::now().as_millis();
        let tx = conn.transaction().unwrap();
        let claimed: Vec<(i64, String, String, String)> = tx
            .prepare_cached(
                "UPDATE event_outbox SET claim_token = 'b', lease_until = ?1 + 30000,
                        available_at = ?1 + 30000
                  WHERE id IN (SELECT id FROM event_outbox
                                WHERE status = 'pending' AND available_at <= ?1
                                ORDER BY available_at, id LIMIT 256)
                  RETURNING id, event_id, event_type, payload",
            )
            .unwrap()
            .query_map([now], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        tx.commit().unwrap();
        let tx = conn.transaction().unwrap();
        common::raw_finish(
            &tx,
            claimed.iter().map(|(id, key, _, _)| (*id, key.as_str())),
            &names,
            now,
        );
        tx.commit().unwrap();
        done += claimed.len();
    }
    start.elapsed()
}

/// outboxd's relay, default settings but `workers`, with `consumers` no-op
/// consumers; the time from start until no row is pending.
fn relay_drain(path: &Path, n: usize, consumers: usize, workers: Option<usize>) -> Duration {
    let mut b = Relay::builder(path);
    for c in 0..consumers {
        b = b.consumer(&format!("c{c}"), ["bench.*"], |_: &Delivery| {
            Outcome::Delivered
        });
    }
    if let Some(w) = workers {
        b = b.workers(w);
    }
    drain_timed(path, b.build().unwrap(), n)
}

/// One measured configuration.
struct Config {
    key: &'static str,
    name: String,
    consumers: usize,
    /// None: the raw loop; Some(w): the relay with w workers (None inside:
    /// the default).
    relay: Option<Option<usize>>,
}

fn main() {
    let n = env_or("OUTBOXD_BENCH_EVENTS", 100_000);
    let runs = env_or("OUTBOXD_BENCH_RUNS", 5);
    let sizes: Vec<usize> = std::env::var("OUTBOXD_BENCH_PAYLOADS")
        .unwrap_or_else(|_| "200,2000".into())
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .expect("OUTBOXD_BENCH_PAYLOADS: sizes in bytes")
        })
        .collect();
    let only = std::env::var("OUTBOXD_BENCH_ONLY").ok();
    let mut configs = vec![
        Config {
            key: "raw1",
            name: "raw loop, 1 ledger row per event".into(),
            consumers: 1,
            relay: None,
        },
        Config {
            key: "relay1",
            name: "outboxd, 1 no-op consumer, default workers".into(),
            consumers: 1,
            relay: Some(None),
        },
        Config {
            key: "raw2",
            name: "raw loop, 2 ledger rows per event".into(),
            consumers: 2,
            relay: None,
        },
        Config {
            key: "relay2",
            name: "outboxd, 2 no-op consumers, default workers".into(),
            consumers: 2,
            relay: Some(None),
        },
    ];
    if let Ok(list) = std::env::var("OUTBOXD_BENCH_WORKERS") {
        for w in list.split(',').map(|s| s.trim().parse::<usize>().unwrap()) {
            configs.push(Config {
                key: "workers",
                name: format!("outboxd, 1 no-op consumer, {w} workers"),
                consumers: 1,
                relay: Some(Some(w)),
            });
        }
    }
    configs.retain(|c| only.as_deref().is_none_or(|o| o == c.key));
    let dir = bench_dir();
    header(
        "drain",
        dir.path(),
        &format!("{n} due events a run, {runs} runs, synchronous=NORMAL on both sides"),
    );
    println!("| payload | configuration | median events/s (min–max) | ratio to the raw loop of the same run, median (min–max) |");
    println!("|---|---|---|---|");
    for size in sizes {
        let t = template(dir.path(), n, size);
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
        for _ in 0..runs {
            for (c, rate) in configs.iter().zip(rates.iter_mut()) {
                let path = copy(&t);
                let took = match c.relay {
                    None => raw_drain(&path, n, c.consumers),
                    Some(workers) => relay_drain(&path, n, c.consumers, workers),
                };
                common::remove_db(&path);
                rate.push(n as f64 / took.as_secs_f64());
            }
        }
        for (i, c) in configs.iter().enumerate() {
            let s = Stats::of(rates[i].clone());
            // The raw loop with as many ledger rows per event.
            let base = configs
                .iter()
                .position(|b| b.relay.is_none() && b.consumers == c.consumers);
            let ratio = match base {
                Some(b) if b != i => {
                    let r = Stats::of(rates[i].iter().zip(&rates[b]).map(|(x, y)| x / y).collect());
                    format!("**{:.2}** ({:.2}–{:.2})", r.median, r.min, r.max)
                }
                Some(_) => "1.00".into(),
                None => "—".into(),
            };
            println!(
                "| ~{size} B | {} | {:.0} ({:.0}–{:.0}) | {ratio} |",
                c.name, s.median, s.min, s.max
            );
        }
        common::remove_db(&t);
    }
    println!("load average at end: {}", common::load());
}
