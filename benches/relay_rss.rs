//! Peak memory of the library relay (BENCHMARKS.md, "Memory and size"):
//! a relay with one no-op consumer draining a backlog, in a process of its
//! own, so the peak resident set (`VmHWM`) is the relay's and not the
//! bench's set-up.
//!
//!   cargo bench --bench relay_rss                                  # 1,000,000 events
//!   OUTBOXD_BENCH_EVENTS=20000 cargo bench --bench relay_rss       # smoke
//!
//! The parent fills a migrated database on disk with plain SQL (as
//! `scripts/bench-rss.sh` does for `outboxd run`: `{"i":n}` payloads, one
//! transaction), then runs this bench binary again as the relay's process.
//! That child reads its own `/proc/self/status`, starts the relay (default
//! settings, one consumer returning `Delivered`), and waits for its stdin
//! to close. The parent polls the pending count on its own connection
//! until nothing is pending, closes the child's stdin, and prints what the
//! child measured: the resident set before the relay started (the bench
//! binary's own code and libraries), the peak (`VmHWM`), its anonymous and
//! file-backed parts at the end, and SQLite's own allocations (in use at
//! the end and at their high-water mark, `sqlite3_memory_highwater`), and
//! the CPU time and read system calls the process used. OUTBOXD_BENCH_WORKERS sets the worker
//! count (default: the relay's).

mod common;

use std::io::{BufRead, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{bench_dir, env_or, header};
use outboxd::{Delivery, Outcome, Relay};

/// Set to `relay` in the child's environment.
const ROLE: &str = "OUTBOXD_BENCH_ROLE";
/// The database the child drains.
const DB: &str = "OUTBOXD_BENCH_DB";

fn main() {
    if std::env::var(ROLE).as_deref() == Ok("relay") {
        child_main();
        return;
    }
    let n = env_or("OUTBOXD_BENCH_EVENTS", 1_000_000);
    let dir = bench_dir();
    header(
        "relay_rss",
        dir.path(),
        &format!("library relay, one no-op consumer, draining {n} events"),
    );
    let path = dir.path().join("rss.db");
    fill(&path, n);

    let started = Instant::now();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env(ROLE, "relay")
        .env(DB, &path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("re-run this bench binary as the relay's process");
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut before = String::new();
    out.read_line(&mut before).unwrap();
    let check = rusqlite::Connection::open(&path).unwrap();
    check.busy_timeout(Duration::from_secs(5)).unwrap();
    while pending(&check) > 0 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the relay's process exited early"
        );
        // Polling, not synchronisation: how often the peak is looked at
        // does not change it (the child's VmHWM is the kernel's).
        std::thread::sleep(Duration::from_millis(100));
    }
    let drained = started.elapsed();
    drop(child.stdin.take());
    let mut after = String::new();
    out.read_to_string(&mut after).unwrap();
    assert!(
        child.wait().unwrap().success(),
        "the relay's process failed"
    );
    common::assert_all_delivered(&check, n);
    println!(
        "| library relay, {n} events | before start: {} | {} | drained in {:.1} s | load {} |",
        before.trim(),
        after.trim(),
        drained.as_secs_f64(),
        common::load()
    );
}

/// `n` due events, committed in one transaction with plain SQL (valid
/// ULIDs: `01J` and 23 digits): `{"i":n}`, padded with `pad` more bytes
/// when OUTBOXD_BENCH_PAD is set.
fn fill(path: &Path, n: usize) {
    let conn = common::migrated(path, "NORMAL");
    let pad = env_or("OUTBOXD_BENCH_PAD", 0);
    conn.execute_batch(&format!(
        "BEGIN;
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n})
         INSERT INTO event_outbox (event_id, event_type, event_version, payload)
         SELECT printf('01J%023d', x), 'bench.rss.v1', 1,
                '{{\"i\":' || x || iif({pad} > 0, ',\"pad\":\"' || printf('%.*c', {pad}, 'x') || '\"', '') || '}}'
           FROM c;
         COMMIT;
         PRAGMA wal_checkpoint(TRUNCATE);"
    ))
    .unwrap();
}

fn pending(conn: &rusqlite::Connection) -> i64 {
    conn.query_row(
        "SELECT count(*) FROM event_outbox WHERE status = 'pending'",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

/// The relay's process: one line with its resident set before the relay
/// starts, then (once stdin closes and the relay has stopped) one line
/// with the peak and what it is made of.
fn child_main() {
    let path = std::env::var(DB).expect("OUTBOXD_BENCH_DB names the database");
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", kb(&status("VmRSS"))).unwrap();
    stdout.flush().unwrap();
    let mut b =
        Relay::builder(&path).consumer("noop", ["bench.*"], |_: &Delivery| Outcome::Delivered);
    if let Ok(w) = std::env::var("OUTBOXD_BENCH_WORKERS") {
        b = b.workers(w.parse().expect("OUTBOXD_BENCH_WORKERS: a number"));
    }
    let relay = b.build().unwrap().start().unwrap();
    // Until the parent has seen the backlog drained.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    let (anon, file) = (status("RssAnon"), status("RssFile"));
    let threads = status("Threads");
    // SAFETY: both read SQLite's global memory counters; no pointers.
    let (sqlite_used, sqlite_peak) = unsafe {
        (
            rusqlite::ffi::sqlite3_memory_used(),
            rusqlite::ffi::sqlite3_memory_highwater(0),
        )
    };
    relay.shutdown(Duration::from_secs(10)).unwrap();
    writeln!(
        stdout,
        "peak RSS {} | at the end: anon {}, file {}, {threads} threads | SQLite {} in use, {} at most | CPU {:.1} s, {} read and {} write calls",
        kb(&status("VmHWM")),
        kb(&anon),
        kb(&file),
        bytes(sqlite_used),
        bytes(sqlite_peak),
        cpu_seconds(),
        io_calls("syscr"),
        io_calls("syscw"),
    )
    .unwrap();
}

/// The read or write system calls this process made (`syscr`, `syscw` in
/// `/proc/self/io`): what a smaller page cache costs shows here first, as
/// SQLite reading again pages it has let go of, or writing dirty pages to
/// the WAL before the commit (a cache spill).
fn io_calls(field: &str) -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap();
    io.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(": "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/io"))
}

/// User and system CPU time of this process so far, from
/// `/proc/self/stat` (fields 14 and 15, in clock ticks of 1/100 s): less
/// moved by other work on the machine than the drain's wall time.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // The command name (field 2) may hold spaces; count after its ')'.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// A field of `/proc/self/status` ("12345 kB", "6").
fn status(field: &str) -> String {
    let text = std::fs::read_to_string("/proc/self/status").unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
        .trim()
        .to_string()
}

/// "12345 kB" as "12.1 MB (12,345 kB)".
fn kb(field: &str) -> String {
    let kb: f64 = field
        .trim_end_matches(" kB")
        .parse()
        .unwrap_or_else(|_| panic!("{field}: expected kB"));
    format!("{:.1} MB ({} kB)", kb / 1024.0, kb as u64)
}

fn bytes(n: i64) -> String {
    format!("{:.2} MB", n as f64 / 1024.0 / 1024.0)
}
