//! Start-up: the time from starting a relay to its first delivery, on a
//! file holding only 10,000 pending events (the baseline) and on one that
//! also holds 1,000,000 delivered rows and their `delivered_events` rows
//! (finished just now, so no purge removes them). Measured for the library
//! relay (from `Relay::builder` to the consumer's first call) and for the
//! `outboxd run` binary cargo built, or the one `OUTBOXD_BENCH_BIN` names
//! (from spawning it to the first line in its JSONL file: process start,
//! config, migration check, relay start). The binary's config sets
//! `[alerts] max_dead`, as packaging/outboxd.example.toml does: `run`
//! checks the dead letters at start and every 30 s.
//!
//!   cargo bench --bench startup          # 10,000 pending, 1,000,000 delivered, 5 runs
//!   OUTBOXD_BENCH_PENDING=100 OUTBOXD_BENCH_DELIVERED=5000 OUTBOXD_BENCH_RUNS=1 \
//!     cargo bench --bench startup        # smoke
//!
//! Each case is built once as a template (pending events through
//! `enqueue_many`, delivered rows with plain SQL) and every run starts on a
//! fresh copy of it, its pages in the page cache (the copy was just written).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{bench_dir, env_or, header, migrated, remove_db, wait_for, Stats};
use outboxd::{Delivery, Event, Outcome, Relay};

fn template(dir: &Path, name: &str, pending: usize, delivered: usize) -> PathBuf {
    let started = Instant::now();
    let path = dir.join(format!("{name}.db"));
    let mut conn = migrated(&path, "NORMAL");
    common::fill_delivered(&mut conn, delivered, "archive");
    let mut i = 0;
    while i < pending {
        let k = (pending - i).min(10_000);
        let events: Vec<Event> = (i..i + k)
            .map(|j| Event::new("bench.start.v1", &serde_json::json!({ "i": j })).unwrap())
            .collect();
        let tx = conn.transaction().unwrap();
        outboxd::enqueue_many(&tx, &events).unwrap();
        tx.commit().unwrap();
        i += k;
    }
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    eprintln!(
        "  template {name}: {pending} pending + {delivered} delivered in {:.1} s, {} MB",
        started.elapsed().as_secs_f64(),
        std::fs::metadata(&path).unwrap().len() / 1_000_000
    );
    path
}

fn copy_of(template: &Path) -> PathBuf {
    let copy = template.with_extension(format!("{}.db", ulid::Ulid::generate()));
    std::fs::copy(template, &copy).unwrap();
    copy
}

/// The library relay: `Relay::builder` to the consumer's first call.
fn library(template: &Path) -> Duration {
    let db = copy_of(template);
    let (tx, first) = crossbeam_channel::bounded(1);
    let started = Instant::now();
    let relay = Relay::builder(&db)
        .consumer("archive", ["bench.*"], move |_: &Delivery| {
            let _ = tx.try_send(Instant::now());
            Outcome::Delivered
        })
        .build()
        .unwrap()
        .start()
        .unwrap();
    let at = first
        .recv_timeout(Duration::from_secs(300))
        .expect("a first delivery");
    relay.shutdown(Duration::from_secs(10)).unwrap();
    remove_db(&db);
    at - started
}

/// `outboxd run` with one JSONL consumer: spawn to the first line.
fn binary(template: &Path) -> Duration {
    let db = copy_of(template);
    let dir = db.parent().unwrap();
    let out = db.with_extension("jsonl");
    let config = db.with_extension("toml");
    std::fs::write(
        &config,
        format!(
            "[alerts]\nmax_dead = 100\n\n[[consumer]]\nname = \"archive\"\ntypes = [\"bench.*\"]\n\
             [consumer.sink]\nkind = \"jsonl\"\npath = {:?}\n",
            out.to_str().unwrap()
        ),
    )
    .unwrap();
    let started = Instant::now();
    let mut child = Command::new(bin())
        .args(["--db", db.to_str().unwrap(), "run", "--config"])
        .arg(&config)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start outboxd run");
    wait_for("the first line", Duration::from_secs(300), || {
        std::fs::metadata(&out).is_ok_and(|m| m.len() > 0)
    });
    let took = started.elapsed();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_file(&config);
    remove_db(&db);
    took
}

/// The binary measured: `OUTBOXD_BENCH_BIN`, else the one cargo built.
fn bin() -> String {
    std::env::var("OUTBOXD_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_outboxd").into())
}

fn fmt(values: Vec<f64>) -> String {
    let s = Stats::of(values);
    format!("{:.0} ({:.0}–{:.0})", s.median, s.min, s.max)
}

fn main() {
    let pending = env_or("OUTBOXD_BENCH_PENDING", 10_000);
    let delivered = env_or("OUTBOXD_BENCH_DELIVERED", 1_000_000);
    let runs = env_or("OUTBOXD_BENCH_RUNS", 5);
    let dir = bench_dir();
    header(
        "startup",
        dir.path(),
        &format!(
            "{pending} pending, with and without {delivered} delivered rows, {runs} runs; binary {}",
            bin()
        ),
    );
    let empty = template(dir.path(), "empty", pending, 0);
    let full = template(dir.path(), "history", pending, delivered);
    println!(
        "\n| file | library: start to first delivery, ms median (min–max) | `outboxd run`: spawn to first line, ms |"
    );
    println!("|---|---|---|");
    for (name, t) in [
        (format!("{pending} pending"), &empty),
        (
            format!("{pending} pending + {delivered} delivered (and their ledger)"),
            &full,
        ),
    ] {
        let (mut lib, mut bin) = (vec![], vec![]);
        for _ in 0..runs {
            lib.push(library(t).as_secs_f64() * 1e3);
            bin.push(binary(t).as_secs_f64() * 1e3);
        }
        println!("| {name} | {} | {} |", fmt(lib), fmt(bin));
    }
    println!("\nload average at end: {}", common::load());
}
