//! Idle cost and wake-up (BENCHMARKS.md, "Idle cost and wake-up").
//!
//! 1. **Idle `outboxd run`**: two relays of the `outboxd` binary that cargo
//!    built, each on its own database with a JSONL consumer, idle side by
//!    side for the same time: one with the default settings (a watch on the
//!    `-wal` file, poll floor 1 s), one with `poll_interval = "5ms"`, which
//!    is what every relay did before the watch (it read `data_version`
//!    every 5 ms; an idle relay's watch never fires, so the watch changes
//!    nothing in that row). CPU time is the sum of the process's threads'
//!    run time (`/proc/PID/task/*/schedstat`), RSS from `/proc/PID/status`
//!    at the end.
//! 2. **Cross-process pick-up**: a library relay in this process, and this
//!    bench binary re-executed as a producer committing events at a steady
//!    rate (never calling `notify`); latency is the consumer's wall clock
//!    when its closure starts minus the producer's right after `commit()`
//!    returned. With the watch (the default) and without it
//!    (`watch_wal(false)`, `poll_interval` 5 ms: the relay before the watch).
//!
//!   cargo bench --bench idle                                   # 10 min idle, 3 runs of pick-up
//!   OUTBOXD_BENCH_IDLE_SECS=2 OUTBOXD_BENCH_EVENTS=50 OUTBOXD_BENCH_RUNS=1 cargo bench --bench idle  # smoke
//!
//! The producer commits with synchronous=NORMAL unless
//! OUTBOXD_BENCH_PRODUCER_SYNC=FULL.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::producer::{self, producer_sync, Seq};
use common::{bench_dir, env_or, header, ms, percentile, wait_for, wall_micros, Stats};
use outboxd::{Delivery, Event, Outcome, Relay, RelayHandle};

const WARMUP: usize = 20;
/// The relay before the file watch polled this often.
const OLD_POLL: Duration = Duration::from_millis(5);

fn fresh_db(dir: &Path, name: &str) -> PathBuf {
    let path = dir.join(format!("{name}-{}.db", ulid::Ulid::generate()));
    let mut conn = outboxd::connection::open(&path).unwrap();
    outboxd::schema::migrate(&mut conn).unwrap();
    path
}

fn enqueue_one(path: &Path, seq: i64) {
    let mut conn = outboxd::connection::open(path).unwrap();
    let tx = conn.transaction().unwrap();
    outboxd::enqueue(&tx, &Event::new("bench.idle.v1", &Seq { seq }).unwrap()).unwrap();
    tx.commit().unwrap();
}

// ---------------------------------------------------------------------------
// 1. Idle `outboxd run`.

struct Run {
    child: Child,
    out: PathBuf,
}

impl Run {
    /// Starts `outboxd run` on a fresh database with one JSONL consumer,
    /// `relay` lines added to its `[relay]` table, and waits until it has
    /// delivered one event (so it is past start-up).
    fn start(dir: &Path, name: &str, relay: &str) -> Run {
        let db = fresh_db(dir, name);
        let out = dir.join(format!("{name}.jsonl"));
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(
            &config,
            format!(
                "[relay]\n{relay}\n\n[[consumer]]\nname = \"archive\"\ntypes = [\"bench.*\"]\n\
                 [consumer.sink]\nkind = \"jsonl\"\npath = {:?}\n",
                out.to_str().unwrap()
            ),
        )
        .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_outboxd"))
            .args(["--db", db.to_str().unwrap(), "run", "--config"])
            .arg(&config)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start outboxd run");
        enqueue_one(&db, 0);
        wait_for(
            &format!("{name}: the first delivery"),
            Duration::from_secs(60),
            || std::fs::read_to_string(&out).is_ok_and(|s| s.lines().count() == 1),
        );
        Run { child, out }
    }

    /// Nanoseconds on a CPU, summed over the process's threads.
    fn cpu_nanos(&self) -> u64 {
        let tasks = format!("/proc/{}/task", self.child.id());
        std::fs::read_dir(&tasks)
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
            .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .sum()
    }

    /// A field of /proc/PID/status in kB (VmRSS, VmHWM).
    fn status_kb(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.out);
    }
}

fn idle(dir: &Path, secs: u64) {
    let modes = [
        ("default: -wal watch, poll floor 1 s", ""),
        (
            "poll_interval = \"5ms\" (the relay before the watch)",
            "poll_interval = \"5ms\"",
        ),
    ];
    let runs: Vec<Run> = modes
        .iter()
        .enumerate()
        .map(|(i, (_, relay))| Run::start(dir, &format!("idle{i}"), relay))
        .collect();
    let before: Vec<u64> = runs.iter().map(Run::cpu_nanos).collect();
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let wall = started.elapsed().as_secs_f64();
    println!(
        "\nIdle `outboxd run` ({} binary), {wall:.0} s idle, side by side:\n",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    println!("| relay | CPU s over the idle time | % of a core | CPU s per hour | RSS MB (peak) |");
    println!("|---|---|---|---|---|");
    for (((name, _), run), cpu0) in modes.iter().zip(&runs).zip(before) {
        let cpu = (run.cpu_nanos() - cpu0) as f64 / 1e9;
        println!(
            "| {name} | {cpu:.3} | {:.4} | {:.2} | {:.1} ({:.1}) |",
            100.0 * cpu / wall,
            cpu * 3600.0 / wall,
            run.status_kb("VmRSS") as f64 / 1024.0,
            run.status_kb("VmHWM") as f64 / 1024.0,
        );
    }
}

// ---------------------------------------------------------------------------
// 2. Cross-process pick-up.

/// One run: (sorted latencies, wake-ups of the writer are not counted).
fn pick_up(dir: &Path, n: usize, rate: usize, watch: bool) -> Vec<Duration> {
    let path = fresh_db(dir, "pickup");
    let (tx, starts) = crossbeam_channel::unbounded();
    let mut builder = Relay::builder(&path)
        .consumer("pickup", ["bench.*"], move |d: &Delivery| {
            let t = wall_micros();
            let _ = tx.send((d.envelope.payload_as::<Seq>().unwrap().seq, t));
            Outcome::Delivered
        })
        .watch_wal(watch);
    if !watch {
        builder = builder.poll_interval(OLD_POLL);
    }
    let relay: RelayHandle = builder.build().unwrap().start().unwrap();
    let commits = producer::run_child(&path, (WARMUP, n, rate));
    let lat = producer::latencies(&commits, starts);
    relay.shutdown(Duration::from_secs(10)).unwrap();
    lat
}

fn fmt(s: Stats) -> String {
    format!("{:.3} ({:.3}–{:.3})", s.median, s.min, s.max)
}

fn pick_ups(dir: &Path, n: usize, runs: usize) {
    println!(
        "\nCross-process pick-up, {n} events per run (after {WARMUP} warm-up), {runs} runs, \
         producer synchronous={}; ms, median (min–max over runs):\n",
        producer_sync()
    );
    println!("| producer rate/s | relay | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|");
    for rate in [100, 1000] {
        for (watch, name) in [
            (false, "no watch, poll 5 ms (before)"),
            (true, "-wal watch, floor 1 s (default)"),
        ] {
            let (mut p50, mut p99, mut max) = (vec![], vec![], vec![]);
            for _ in 0..runs {
                let lat = pick_up(dir, n, rate, watch);
                p50.push(ms(percentile(&lat, 50.0)));
                p99.push(ms(percentile(&lat, 99.0)));
                max.push(ms(*lat.last().unwrap()));
            }
            println!(
                "| {rate} | {name} | {} | {} | {} |",
                fmt(Stats::of(p50)),
                fmt(Stats::of(p99)),
                fmt(Stats::of(max))
            );
        }
    }
}

fn main() {
    if producer::is_child() {
        producer::child_main("bench.idle.v1");
        return;
    }
    let secs = env_or("OUTBOXD_BENCH_IDLE_SECS", 600) as u64;
    let n = env_or("OUTBOXD_BENCH_EVENTS", 2_000);
    let runs = env_or("OUTBOXD_BENCH_RUNS", 3);
    let dir = bench_dir();
    header(
        "idle",
        dir.path(),
        &format!("{secs} s idle; pick-up of {n} events at 100/s and 1,000/s, {runs} runs"),
    );
    if std::env::var_os("OUTBOXD_BENCH_SKIP_IDLE").is_none() {
        idle(dir.path(), secs);
    }
    pick_ups(dir.path(), n, runs);
    println!("\nload average at end: {}", common::load());
}
