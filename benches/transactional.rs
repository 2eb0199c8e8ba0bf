//! Exactly once, what it costs: events per second through a transactional
//! consumer that writes one row, against a plain consumer doing the same
//! write in a transaction of its own (at least once), against the raw
//! SQLite loop of claim + write + mark done; and a host's commit latency
//! while each drains.
//!
//!   cargo bench --bench transactional      # 3,000 events, 2,000 host writes, 5 runs
//!   OUTBOXD_BENCH_EVENTS=300 OUTBOXD_BENCH_WRITES=300 OUTBOXD_BENCH_RUNS=1 \
//!     cargo bench --bench transactional                                     # smoke
//!
//! Every write that makes an effect durable is `synchronous=FULL` (one
//! fsync per commit): the transactional consumer's connection, the plain
//! consumer's own connection, the raw loop's per-event transaction. The
//! relay's writer records outcomes with NORMAL, as always.
//!
//! - **raw loop** (the baseline): one connection claims 256 due rows (one
//!   transaction, like benches/drain.rs), then for each row `BEGIN
//!   IMMEDIATE; INSERT the row's effect; INSERT its ledger entry; mark it
//!   delivered; COMMIT`: exactly once, the least SQLite can do for it.
//! - **transactional**: `RelayBuilder::transactional_consumer` inserting the
//!   effect row (relay defaults: the writer thread, a worker per core).
//! - **plain**: `RelayBuilder::consumer` inserting the same row in a
//!   transaction of its own on a connection per worker thread.
//!
//! Beside each relay row: the writer's mean write transaction (BEGIN
//! IMMEDIATE to COMMIT, including its wait for the lock a consumer holds)
//! and its SQLITE_BUSY retries, from `RelayHandle::metrics`.
//!
//! The second table is benches/host_impact.rs's measure (a host commits
//! one row per millisecond on its own connection; p50/p99/max) with no
//! relay, and while each relay drains a backlog.

mod common;

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{bench_dir, env_or, header, host_writes, migrated, ms, percentile, remove_db, Stats};
use outboxd::{Delivery, Outcome, Relay, RelayBuilder};
use rusqlite::{params, Connection, Transaction};

/// The effect: one row per event.
const EFFECTS: &str = "CREATE TABLE effects (event_id TEXT NOT NULL, body TEXT NOT NULL)";
const INSERT_EFFECT: &str = "INSERT INTO effects (event_id, body) VALUES (?1, ?2)";
const EVENT_TYPE: &str = "bench.effect.v1";

fn effect(conn: &Connection, event_id: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(INSERT_EFFECT)?
        .execute(params![event_id, "the consumer's one row"])?;
    Ok(())
}

/// A template database: migrated, the effect and host tables, `n` due
/// events. Each run copies it.
fn template(dir: &Path, name: &str, n: usize) -> PathBuf {
    let path = dir.join(name);
    let mut conn = migrated(&path, "NORMAL");
    conn.execute_batch(EFFECTS).unwrap();
    conn.execute_batch(common::HOST_ROWS).unwrap();
    common::enqueue_backlog(&mut conn, n, EVENT_TYPE);
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    path
}

/// A fresh copy of `template`.
fn copy(template: &Path) -> PathBuf {
    let path = template.with_file_name(format!("run-{}.db", ulid::Ulid::generate()));
    std::fs::copy(template, &path).unwrap();
    path
}

/// The baseline: claim 256, then one FULL transaction per row with its
/// effect, its ledger entry and its delivered mark.
fn raw_loop(path: &Path, n: usize) -> Duration {
    let conn = outboxd::connection::open(path).unwrap(); // WAL, FULL, busy handler
    let start = Instant::now();
    let mut done = 0;
    while done < n {
        let now = outboxd::Timestamp::now().as_millis();
        let claimed = common::raw_claim(&conn, now);
        for (id, key) in &claimed {
            let tx = Transaction::new_unchecked(&conn, rusqlite::TransactionBehavior::Immediate)
                .unwrap();
            effect(&tx, key).unwrap();
            tx.prepare_cached(
                "INSERT INTO delivered_events (event_key, consumer, outbox_id, delivered_at)
                 VALUES (?1, 'c', ?2, ?3)",
            )
            .unwrap()
            .execute(params![key, id, now])
            .unwrap();
            tx.prepare_cached(
                "UPDATE event_outbox SET status = 'delivered', finished_at = ?2, claim_token = NULL, lease_until = NULL
                  WHERE id = ?1 AND claim_token = 'b'",
            )
            .unwrap()
            .execute(params![id, now])
            .unwrap();
            tx.commit().unwrap();
        }
        done += claimed.len();
    }
    start.elapsed()
}

/// How the relay's consumer makes its write.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Transactional,
    Plain,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Transactional => "transactional consumer (exactly once)",
            Kind::Plain => "plain consumer, own transaction (at least once)",
        }
    }
}

/// A relay on `path` whose one consumer writes the effect row.
fn relay(path: &Path, kind: Kind, workers: Option<usize>) -> RelayBuilder {
    let b = Relay::builder(path).purge(None);
    let b = match workers {
        Some(w) => b.workers(w),
        None => b,
    };
    match kind {
        Kind::Transactional => {
            b.transactional_consumer("c", [EVENT_TYPE], |tx: &Transaction<'_>, d: &Delivery| {
                match effect(tx, &d.envelope.event_id.to_string()) {
                    Ok(()) => Outcome::Delivered,
                    Err(e) => Outcome::retry(e.to_string()),
                }
            })
        }
        Kind::Plain => {
            let path = path.to_path_buf();
            b.consumer("c", [EVENT_TYPE], move |d: &Delivery| {
                plain_write(&path, &d.envelope.event_id.to_string())
            })
        }
    }
}

thread_local! {
    /// The plain consumer's connection on this worker thread.
    static PLAIN: RefCell<Option<(PathBuf, Connection)>> = const { RefCell::new(None) };
}

/// The plain consumer's write: its own FULL transaction, on a connection
/// of its worker thread's.
fn plain_write(path: &Path, event_id: &str) -> Outcome {
    PLAIN.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|(p, _)| p != path) {
            *slot = Some((path.to_path_buf(), outboxd::connection::open(path).unwrap()));
        }
        let (_, conn) = slot.as_mut().unwrap();
        let written = conn.transaction().and_then(|tx| {
            effect(&tx, event_id)?;
            tx.commit()
        });
        match written {
            Ok(()) => Outcome::Delivered,
            Err(e) => Outcome::retry(e.to_string()),
        }
    })
}

/// The writer's figures of one run.
struct Writer {
    mean_txn_ms: f64,
    busy_retries: u64,
}

/// Drains `n` events with a relay; the time and the writer's figures.
fn drain(path: &Path, n: usize, kind: Kind, workers: Option<usize>) -> (Duration, Writer) {
    let check = Connection::open(path).unwrap();
    let start = Instant::now();
    let handle = relay(path, kind, workers).build().unwrap().start().unwrap();
    common::wait_for("the relay to drain", Duration::from_secs(600), || {
        !check
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM event_outbox WHERE status = 'pending')",
                [],
                |r| r.get::<_, bool>(0),
            )
            .unwrap()
    });
    let took = start.elapsed();
    let m = handle.metrics();
    handle.shutdown(Duration::from_secs(10)).unwrap();
    let effects: i64 = check
        .query_row("SELECT count(*) FROM effects", [], |r| r.get(0))
        .unwrap();
    assert_eq!(effects as usize, n, "one effect per event");
    let writer = Writer {
        mean_txn_ms: m.commit_micros_total as f64 / 1000.0 / m.commits.max(1) as f64,
        busy_retries: m.busy_retries,
    };
    (took, writer)
}

/// One row of the throughput table: its samples over the runs.
#[derive(Default)]
struct ThroughputRow {
    rate: Vec<f64>,
    ratio: Vec<f64>,
    txn_ms: Vec<f64>,
    busy: Vec<f64>,
}

/// One row of the host table: its samples over the runs.
struct HostRow {
    label: &'static str,
    kind: Option<Kind>,
    p50: Vec<f64>,
    p99: Vec<f64>,
    max: Vec<f64>,
    ratio: Vec<f64>,
    rate: Vec<f64>,
}

fn fmt(s: &Stats, digits: usize) -> String {
    format!("{:.d$} ({:.d$}–{:.d$})", s.median, s.min, s.max, d = digits)
}

fn main() {
    let n = env_or("OUTBOXD_BENCH_EVENTS", 3000);
    let writes = env_or("OUTBOXD_BENCH_WRITES", 2000);
    let runs = env_or("OUTBOXD_BENCH_RUNS", 5);
    let dir = bench_dir();
    header(
        "transactional",
        dir.path(),
        &format!("{n} events of one row each, {runs} runs; effects written with synchronous=FULL"),
    );
    let events = template(dir.path(), "events.db", n);

    // Table 1: throughput. Each run measures the raw loop and then every
    // relay configuration, so each ratio is to a baseline measured
    // minutes, not a quarter of an hour, earlier (the disk's fsync time
    // moves with the machine's load).
    let rate = |d: Duration| n as f64 / d.as_secs_f64();
    let configs = [
        (Kind::Transactional, None, "default workers"),
        (Kind::Transactional, Some(1), "1 worker"),
        (Kind::Plain, None, "default workers"),
    ];
    let mut raw = vec![];
    let mut rows: Vec<ThroughputRow> = configs.iter().map(|_| ThroughputRow::default()).collect();
    for _ in 0..runs {
        let path = copy(&events);
        let base = rate(raw_loop(&path, n));
        remove_db(&path);
        raw.push(base);
        for ((kind, workers, _), row) in configs.iter().zip(rows.iter_mut()) {
            let path = copy(&events);
            let (took, w) = drain(&path, n, *kind, *workers);
            remove_db(&path);
            row.rate.push(rate(took));
            row.ratio.push(rate(took) / base);
            row.txn_ms.push(w.mean_txn_ms);
            row.busy.push(w.busy_retries as f64);
        }
    }
    println!("| configuration | events/s, median (min–max) | ratio to the raw loop, paired runs, median (min–max) | writer: mean write transaction, ms | writer: SQLITE_BUSY retries (median) |");
    println!("|---|---|---|---|---|");
    println!(
        "| raw SQLite loop: claim 256, then per event BEGIN IMMEDIATE + write + ledger + mark + COMMIT | {} | 1.00 | — | — |",
        fmt(&Stats::of(raw), 0)
    );
    for ((kind, _, label), row) in configs.iter().zip(rows) {
        let ratio = Stats::of(row.ratio);
        println!(
            "| {}, {label} | {} | **{:.2}** ({:.2}–{:.2}) | {} | {:.0} |",
            kind.name(),
            fmt(&Stats::of(row.rate), 0),
            ratio.median,
            ratio.min,
            ratio.max,
            fmt(&Stats::of(row.txn_ms), 3),
            Stats::of(row.busy).median
        );
    }

    // Table 2: the host's commits while each drains a backlog.
    let backlog = template(dir.path(), "backlog.db", (writes * 20).max(n));
    println!();
    println!("| host commit latency ({writes} writes at 1/ms) | p50 ms | p99 ms | max ms | p99 ratio to no relay | events/s drained meanwhile |");
    println!("|---|---|---|---|---|---|");
    let host = |kind: Option<Kind>| -> (Vec<Duration>, f64) {
        let path = copy(&backlog);
        let handle = kind.map(|k| relay(&path, k, None).build().unwrap().start().unwrap());
        if let Some(h) = &handle {
            common::wait_for(
                "the relay to start draining",
                Duration::from_secs(60),
                || h.metrics().delivered > 0,
            );
        }
        let before = handle.as_ref().map_or(0, |h| h.metrics().delivered);
        let started = Instant::now();
        let lat = host_writes(&path, writes);
        let rate = handle.as_ref().map_or(0.0, |h| {
            (h.metrics().delivered - before) as f64 / started.elapsed().as_secs_f64()
        });
        if let Some(h) = handle {
            if !h.is_finished() {
                h.shutdown(Duration::from_secs(10)).unwrap();
            }
        }
        remove_db(&path);
        (lat, rate)
    };
    let mut rows: Vec<HostRow> = [
        ("no relay (baseline)", None),
        (Kind::Transactional.name(), Some(Kind::Transactional)),
        (Kind::Plain.name(), Some(Kind::Plain)),
    ]
    .into_iter()
    .map(|(label, kind)| HostRow {
        label,
        kind,
        p50: vec![],
        p99: vec![],
        max: vec![],
        ratio: vec![],
        rate: vec![],
    })
    .collect();
    for _ in 0..runs {
        // Each relay run is paired with a baseline run just before it.
        let (base, _) = host(None);
        let base_p99 = ms(percentile(&base, 99.0));
        for row in rows.iter_mut() {
            let (lat, rate) = match row.kind {
                None => (base.clone(), 0.0),
                Some(k) => host(Some(k)),
            };
            row.p50.push(ms(percentile(&lat, 50.0)));
            row.p99.push(ms(percentile(&lat, 99.0)));
            row.max.push(ms(*lat.last().unwrap()));
            row.ratio.push(ms(percentile(&lat, 99.0)) / base_p99);
            row.rate.push(rate);
        }
    }
    for row in rows {
        let rate = Stats::of(row.rate);
        println!(
            "| {} | {} | {} | {} | **{:.2}** | {} |",
            row.label,
            fmt(&Stats::of(row.p50), 3),
            fmt(&Stats::of(row.p99), 3),
            fmt(&Stats::of(row.max), 3),
            Stats::of(row.ratio).median,
            if row.kind.is_none() {
                "—".to_string()
            } else {
                fmt(&rate, 0)
            }
        );
    }
    println!("load average at end {}", common::load());
}
