//! Host impact: the commit latency of a host writing one row per millisecond
//! on its own connection (outboxd's settings: WAL, synchronous=FULL) while the
//! relay drains a large backlog at full speed, against the same host on the
//! same database with no relay running.
//!
//!   cargo bench --bench host_impact     # 5,000 host writes, 500,000-event backlog, 5 runs
//!   OUTBOXD_BENCH_WRITES=300 OUTBOXD_BENCH_BACKLOG=50000 OUTBOXD_BENCH_RUNS=1 \
//!     cargo bench --bench host_impact                                       # smoke
//!
//! A host write is `BEGIN; INSERT one row; COMMIT` (a deferred transaction,
//! rusqlite's default), timed from BEGIN to the return of COMMIT, so it
//! includes waiting for the write lock (busy timeout) and any WAL
//! auto-checkpoint the host's commit runs. Writes are paced at one per
//! millisecond; a late write starts at once. Each run copies a template
//! database holding the backlog; runs alternate without/with the relay.
//!
//! Diagnosis: OUTBOXD_BENCH_PURGE=off runs the relay without its
//! housekeeping purge; OUTBOXD_BENCH_HOST_AUTOCHECKPOINT=N sets the host connection's
//! `wal_autocheckpoint` (0: the host never checkpoints; SQLite's default is
//! 1000 pages, so whichever connection commits past it copies the WAL back).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{bench_dir, env_or, header, migrated, ms, percentile, remove_db, sleep_until, Stats};
use outboxd::{Delivery, Event, Outcome, Relay};

/// Commit latencies (sorted) of `n` paced host writes.
fn host_writes(path: &Path, n: usize) -> Vec<Duration> {
    let mut conn = outboxd::connection::open(path).unwrap();
    if let Ok(n) = std::env::var("OUTBOXD_BENCH_HOST_AUTOCHECKPOINT") {
        let n: u32 = n.parse().expect("OUTBOXD_BENCH_HOST_AUTOCHECKPOINT: pages");
        conn.execute_batch(&format!("PRAGMA wal_autocheckpoint = {n}"))
            .unwrap();
    }
    let mut lat = Vec::with_capacity(n);
    let start = Instant::now();
    for i in 0..n {
        sleep_until(start + Duration::from_millis(i as u64));
        let t0 = Instant::now();
        let tx = conn.transaction().unwrap();
        tx.prepare_cached("INSERT INTO host_rows (body, at) VALUES (?1, ?2)")
            .unwrap()
            .execute(rusqlite::params![
                "an order line of the host application",
                i as i64
            ])
            .unwrap();
        tx.commit().unwrap();
        lat.push(t0.elapsed());
    }
    lat.sort();
    lat
}

struct Row {
    p50: Vec<f64>,
    p99: Vec<f64>,
    max: Vec<f64>,
}

impl Row {
    fn add(&mut self, sorted: &[Duration]) {
        self.p50.push(ms(percentile(sorted, 50.0)));
        self.p99.push(ms(percentile(sorted, 99.0)));
        self.max.push(ms(*sorted.last().unwrap()));
    }
}

fn fmt(v: &[f64]) -> String {
    let s = Stats::of(v.to_vec());
    format!("{:.3} ({:.3}–{:.3})", s.median, s.min, s.max)
}

fn main() {
    let writes = env_or("OUTBOXD_BENCH_WRITES", 5000);
    let backlog = env_or("OUTBOXD_BENCH_BACKLOG", 500_000);
    let runs = env_or("OUTBOXD_BENCH_RUNS", 5);
    let dir = bench_dir();
    header(
        "host_impact",
        dir.path(),
        &format!("{writes} host writes at 1/ms, backlog {backlog} due events, {runs} runs; relay defaults, 1 no-op consumer, purge {}", common::purge_label()),
    );

    let template = dir.path().join("template.db");
    {
        let mut conn = migrated(&template, "NORMAL");
        conn.execute_batch(
            "CREATE TABLE host_rows (id INTEGER PRIMARY KEY, body TEXT NOT NULL, at INTEGER NOT NULL)",
        )
        .unwrap();
        let mut i = 0;
        while i < backlog {
            let k = (backlog - i).min(10_000);
            let events: Vec<Event> = (i..i + k)
                .map(|j| Event::new("bench.backlog.v1", &serde_json::json!({ "i": j })).unwrap())
                .collect();
            let tx = conn.transaction().unwrap();
            outboxd::enqueue_many(&tx, &events).unwrap();
            tx.commit().unwrap();
            i += k;
        }
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .unwrap();
    }

    let new = || Row {
        p50: vec![],
        p99: vec![],
        max: vec![],
    };
    let (mut alone, mut busy) = (new(), new());
    let mut ratios = vec![];
    let mut drained_during = vec![];
    let load = common::load();
    for _ in 0..runs {
        let path = dir
            .path()
            .join(format!("host-{}.db", ulid::Ulid::generate()));
        std::fs::copy(&template, &path).unwrap();
        let a = host_writes(&path, writes);
        remove_db(&path);

        std::fs::copy(&template, &path).unwrap();
        let handle = Relay::builder(&path)
            .consumer("c0", ["bench.*"], |_: &Delivery| Outcome::Delivered)
            .purge(common::purge_policy())
            .build()
            .unwrap()
            .start()
            .unwrap();
        // Start the host once the relay is draining.
        common::wait_for(
            "the relay to start draining",
            Duration::from_secs(60),
            || handle.metrics().delivered > 0,
        );
        let before = handle.metrics().delivered;
        let b = host_writes(&path, writes);
        let during = handle.metrics().delivered - before;
        if handle.metrics().delivered >= backlog as u64 {
            // Not a failure (CI runs smoke sizes), but the figure is wrong.
            eprintln!(
                "warning: the backlog ran out while the host wrote, so the relay was idle \
                 part of the time: raise OUTBOXD_BENCH_BACKLOG"
            );
        }
        handle.shutdown(Duration::from_secs(10)).unwrap();
        remove_db(&path);

        ratios.push(ms(percentile(&b, 99.0)) / ms(percentile(&a, 99.0)));
        drained_during.push(during as f64 / (writes as f64 / 1000.0));
        alone.add(&a);
        busy.add(&b);
    }
    println!("| host commit latency | p50 ms (min–max over runs) | p99 ms | max ms | p99 ratio to no relay, paired runs (min–max) |");
    println!("|---|---|---|---|---|");
    println!(
        "| no relay (baseline) | {} | {} | {} | 1.00 |",
        fmt(&alone.p50),
        fmt(&alone.p99),
        fmt(&alone.max)
    );
    let r = Stats::of(ratios);
    let d = Stats::of(drained_during);
    println!(
        "| relay draining (≈{:.0} events/s meanwhile, {:.0}–{:.0}) | {} | {} | {} | **{:.2}** ({:.2}–{:.2}) |",
        d.median,
        d.min,
        d.max,
        fmt(&busy.p50),
        fmt(&busy.p99),
        fmt(&busy.max),
        r.median,
        r.min,
        r.max
    );
    println!(
        "targets: p99 ratio ≤ 2, p99 < 5 ms; load average at start {load}, at end {}",
        common::load()
    );
}
