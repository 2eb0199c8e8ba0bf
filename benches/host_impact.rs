//! Host impact: the commit latency of a host writing one row per millisecond
//! on its own connection (outboxd's settings: WAL, synchronous=FULL) while the
//! relay drains a large backlog at full speed, against the same host on the
//! same database with no relay running.
//!
//!   cargo bench --bench host_impact     # 5,000 host writes, 500,000-event backlog, 5 runs
//!   OUTBOXD_BENCH_WRITES=300 OUTBOXD_BENCH_BACKLOG=50000 OUTBOXD_BENCH_RUNS=1 \
//!     cargo bench --bench host_impact                                       # smoke
//!
//! A host write is `common::host_writes`'s (shared with
//! benches/transactional.rs): `BEGIN; INSERT one row; COMMIT`, timed from
//! BEGIN to the return of COMMIT, so it includes waiting for the write lock
//! (busy timeout) and any WAL auto-checkpoint the host's commit runs,
//! paced at one per millisecond (a late write starts at once). Each run copies a template
//! database holding the backlog; runs alternate without/with the relay.
//!
//! Diagnosis: OUTBOXD_BENCH_PURGE=off runs the relay without its
//! housekeeping purge; OUTBOXD_BENCH_HOST_AUTOCHECKPOINT=N sets the host connection's
//! `wal_autocheckpoint` (0: the host never checkpoints; SQLite's default is
//! 1000 pages, so whichever connection commits past it copies the WAL back).
//!
//! OUTBOXD_BENCH_BESIDE=raw drains beside the host with a bare loop instead
//! of the relay: the relay's write pattern under contention with none of its
//! work around it. Each transaction (BEGIN IMMEDIATE, synchronous=NORMAL)
//! finishes the rows of the one before with their ledger rows and claims
//! the next 16 (the relay's contended group), then the loop leaves the lock
//! free for 1 ms (its contended pause). The host's figures beside it are
//! the floor of that pattern on the machine, whatever the relay does.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use common::{bench_dir, env_or, header, host_writes, migrated, ms, percentile, remove_db, Stats};
use outboxd::{Delivery, Outcome, Relay, RelayHandle};
use rusqlite::TransactionBehavior;

/// What drains beside the host (OUTBOXD_BENCH_BESIDE).
enum Beside {
    Relay(RelayHandle),
    Raw {
        stop: Arc<AtomicBool>,
        delivered: Arc<AtomicU64>,
        thread: JoinHandle<()>,
    },
}

impl Beside {
    fn start(path: &Path, raw: bool) -> Beside {
        if !raw {
            return Beside::Relay(
                Relay::builder(path)
                    .consumer("c0", ["bench.*"], |_: &Delivery| Outcome::Delivered)
                    .purge(common::purge_policy())
                    .build()
                    .unwrap()
                    .start()
                    .unwrap(),
            );
        }
        let (stop, delivered) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let conn = outboxd::connection::open(path).unwrap();
        conn.execute_batch("PRAGMA synchronous = NORMAL").unwrap();
        let thread = {
            let (stop, delivered) = (stop.clone(), delivered.clone());
            std::thread::spawn(move || raw_drain(conn, &stop, &delivered))
        };
        Beside::Raw {
            stop,
            delivered,
            thread,
        }
    }

    fn delivered(&self) -> u64 {
        match self {
            Beside::Relay(h) => h.metrics().delivered,
            Beside::Raw { delivered, .. } => delivered.load(Ordering::Relaxed),
        }
    }

    fn stop(self) {
        match self {
            Beside::Relay(h) => h.shutdown(Duration::from_secs(10)).unwrap(),
            Beside::Raw { stop, thread, .. } => {
                stop.store(true, Ordering::Relaxed);
                thread.join().unwrap();
            }
        }
    }
}

/// The bare loop of OUTBOXD_BENCH_BESIDE=raw (see the top of this file).
fn raw_drain(mut conn: rusqlite::Connection, stop: &AtomicBool, delivered: &AtomicU64) {
    let consumers = ["c0".to_string()];
    let mut claimed: Vec<(i64, String)> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let now = outboxd::Timestamp::now().as_millis();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        common::raw_finish(
            &tx,
            claimed.iter().map(|(id, key)| (*id, key.as_str())),
            &consumers,
            now,
        );
        let finished = claimed.len() as u64;
        claimed = common::raw_claim_up_to(&tx, now, 16);
        tx.commit().unwrap();
        delivered.fetch_add(finished, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(1));
    }
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
    let raw = match std::env::var("OUTBOXD_BENCH_BESIDE").as_deref() {
        Err(_) | Ok("relay") => false,
        Ok("raw") => true,
        Ok(other) => panic!("OUTBOXD_BENCH_BESIDE={other}: expected relay or raw"),
    };
    let dir = bench_dir();
    header(
        "host_impact",
        dir.path(),
        &format!(
            "{writes} host writes at 1/ms, backlog {backlog} due events, {runs} runs; {}",
            if raw {
                "beside them the bare loop (16 rows a transaction, 1 ms pause)".to_string()
            } else {
                format!(
                    "relay defaults, 1 no-op consumer, purge {}",
                    common::purge_label()
                )
            }
        ),
    );

    let template = dir.path().join("template.db");
    {
        let mut conn = migrated(&template, "NORMAL");
        conn.execute_batch(common::HOST_ROWS).unwrap();
        common::enqueue_backlog(&mut conn, backlog, "bench.backlog.v1");
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
        let beside = Beside::start(&path, raw);
        // Start the host once the relay is draining.
        common::wait_for(
            "the relay to start draining",
            Duration::from_secs(60),
            || beside.delivered() > 0,
        );
        let before = beside.delivered();
        let b = host_writes(&path, writes);
        let during = beside.delivered() - before;
        if beside.delivered() >= backlog as u64 {
            // Not a failure (CI runs smoke sizes), but the figure is wrong.
            eprintln!(
                "warning: the backlog ran out while the host wrote, so the relay was idle \
                 part of the time: raise OUTBOXD_BENCH_BACKLOG"
            );
        }
        beside.stop();
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
        "| {} draining (≈{:.0} events/s meanwhile, {:.0}–{:.0}) | {} | {} | {} | **{:.2}** ({:.2}–{:.2}) |",
        if raw { "bare loop" } else { "relay" },
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
        "targets: p99 ratio ≤ 2, no commit over 50 ms (issue 12); load average at start {load}, at end {}",
        common::load()
    );
}
