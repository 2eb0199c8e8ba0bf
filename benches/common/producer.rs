//! A paced producer for the pick-up benches: events at a steady rate on its
//! own connection, in this process or in a child (the bench binary run
//! again with [`ROLE`] set), reporting the wall-clock time of each commit.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use outboxd::Event;

use super::{env_or, sleep_until, wall_micros};

/// Set to `producer` in the child's environment.
pub const ROLE: &str = "OUTBOXD_BENCH_ROLE";
/// The database the child produces into.
const DB: &str = "OUTBOXD_BENCH_DB";
/// How many unmeasured events the child produces first.
const WARMUP: &str = "OUTBOXD_BENCH_WARMUP";

/// The payload: a sequence number, negative for warm-up events.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Seq {
    pub seq: i64,
}

/// The producer's `synchronous` setting: NORMAL by default, because on a
/// disk whose fsync takes milliseconds a FULL producer cannot keep up 1,000
/// commits a second (OUTBOXD_BENCH_PRODUCER_SYNC=FULL measures that case).
pub fn producer_sync() -> String {
    std::env::var("OUTBOXD_BENCH_PRODUCER_SYNC").unwrap_or_else(|_| "NORMAL".into())
}

/// True in the child process.
pub fn is_child() -> bool {
    std::env::var(ROLE).as_deref() == Ok("producer")
}

/// Produces `warmup + n` events of `event_type` at `rate` per second on its
/// own connection (outboxd's settings, synchronous as [`producer_sync`]),
/// calling `after_commit` after each; returns the wall-clock microseconds
/// right after each measured commit.
pub fn produce(
    path: &Path,
    event_type: &str,
    (warmup, n, rate): (usize, usize, usize),
    mut after_commit: impl FnMut(),
) -> Vec<i64> {
    let mut conn = outboxd::connection::open(path).unwrap();
    conn.execute_batch(&format!("PRAGMA synchronous = {}", producer_sync()))
        .unwrap();
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let start = Instant::now();
    let mut commits = Vec::with_capacity(n);
    for i in 0..(warmup + n) {
        sleep_until(start + interval * i as u32);
        let seq = i as i64 - warmup as i64;
        let tx = conn.transaction().unwrap();
        outboxd::enqueue(&tx, &Event::new(event_type, &Seq { seq }).unwrap()).unwrap();
        tx.commit().unwrap();
        let t = wall_micros();
        after_commit();
        if seq >= 0 {
            commits.push(t);
        }
    }
    commits
}

/// The child process's work: produce as its parent asked, then print one
/// commit time per line.
pub fn child_main(event_type: &str) {
    let path = std::env::var(DB).expect("OUTBOXD_BENCH_DB names the database");
    let shape = (
        env_or(WARMUP, 0),
        env_or("OUTBOXD_BENCH_EVENTS", 0),
        env_or("OUTBOXD_BENCH_RATE", 100),
    );
    let commits = produce(Path::new(&path), event_type, shape, || {});
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for t in commits {
        writeln!(out, "{t}").unwrap();
    }
}

/// Runs this bench binary again as the producer on `path` and returns the
/// wall-clock microseconds of its measured commits.
pub fn run_child(path: &Path, (warmup, n, rate): (usize, usize, usize)) -> Vec<i64> {
    let out = Command::new(std::env::current_exe().unwrap())
        .env(ROLE, "producer")
        .env(DB, path)
        .env(WARMUP, warmup.to_string())
        .env("OUTBOXD_BENCH_EVENTS", n.to_string())
        .env("OUTBOXD_BENCH_RATE", rate.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .expect("re-run this bench binary as the producer");
    assert!(out.status.success(), "the producer failed: {}", out.status);
    let commits: Vec<i64> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert_eq!(commits.len(), n, "the producer reported every commit");
    commits
}

/// Latencies (sorted) from commit times and consumer starts.
pub fn latencies(
    commits: &[i64],
    starts: crossbeam_channel::Receiver<(i64, i64)>,
) -> Vec<Duration> {
    let n = commits.len();
    let mut seen = vec![None; n];
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut got = 0;
    while got < n {
        let left = deadline.saturating_duration_since(Instant::now());
        let (seq, t) = starts
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("only {got} of {n} events reached the consumer in time"));
        if seq >= 0 && seen[seq as usize].is_none() {
            seen[seq as usize] = Some(t);
            got += 1;
        }
    }
    let mut lat: Vec<Duration> = commits
        .iter()
        .zip(seen)
        .map(|(&c, s)| Duration::from_micros((s.unwrap() - c).max(0) as u64))
        .collect();
    lat.sort();
    lat
}
