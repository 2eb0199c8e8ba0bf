//! Latency from commit to consumer start: p50, p99 and max over N events
//! produced at a steady rate, with the producer in the same process (it
//! calls `RelayHandle::notify` after each commit) and in another process
//! (this bench binary re-executed as the producer; the relay hears of its
//! commits through its watch on the -wal file, see src/relay/wake.rs, and
//! benches/idle.rs for the comparison with the old 5 ms poll).
//!
//!   cargo bench --bench latency                       # 10,000 events at 1,000/s, 5 runs
//!   OUTBOXD_BENCH_RATE=200 OUTBOXD_BENCH_EVENTS=2000 cargo bench --bench latency   # 200/s
//!   OUTBOXD_BENCH_EVENTS=200 OUTBOXD_BENCH_RUNS=1 cargo bench --bench latency   # smoke
//!
//! The producer commits with synchronous=NORMAL unless
//! OUTBOXD_BENCH_PRODUCER_SYNC=FULL (see `producer_sync`).
//!
//! Latency is the consumer's wall clock when its closure starts minus the
//! producer's wall clock right after `commit()` returned (sent beside the
//! events: in-process through memory, cross-process on the child's stdout
//! at the end), so it excludes the commit's own fsync. The reference row is
//! a bare crossbeam channel hop between two threads at the same rate: the
//! floor of any in-process hand-off on this machine.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::producer::{self, latencies, producer_sync, Seq};
use common::{bench_dir, env_or, header, ms, percentile, sleep_until, wall_micros, Stats};
use outboxd::{Delivery, Outcome, Relay, RelayHandle};

const WARMUP: usize = 100;
const EVENT_TYPE: &str = "bench.latency.v1";

/// Produces in this process, notifying the relay after each commit when
/// given its handle.
fn produce(path: &Path, n: usize, rate: usize, notify: Option<&RelayHandle>) -> Vec<i64> {
    producer::produce(path, EVENT_TYPE, (WARMUP, n, rate), || {
        if let Some(h) = notify {
            h.notify();
        }
    })
}

/// Starts a relay whose consumer reports (seq, start wall micros).
fn start_relay(path: &Path) -> (RelayHandle, crossbeam_channel::Receiver<(i64, i64)>) {
    let (tx, rx) = crossbeam_channel::unbounded();
    let handle = Relay::builder(path)
        .consumer("latency", ["bench.*"], move |d: &Delivery| {
            let t = wall_micros();
            let seq = d.envelope.payload_as::<Seq>().unwrap().seq;
            let _ = tx.send((seq, t));
            Outcome::Delivered
        })
        .build()
        .unwrap()
        .start()
        .unwrap();
    (handle, rx)
}

fn fresh_db(dir: &Path) -> std::path::PathBuf {
    let path = dir.join(format!("latency-{}.db", ulid::Ulid::generate()));
    let mut conn = outboxd::connection::open(&path).unwrap();
    outboxd::schema::migrate(&mut conn).unwrap();
    path
}

fn in_process(dir: &Path, n: usize, rate: usize) -> (Vec<Duration>, f64) {
    let path = fresh_db(dir);
    let (handle, starts) = start_relay(&path);
    let commits = produce(&path, n, rate, Some(&handle));
    let rate = achieved(&commits);
    let lat = latencies(&commits, starts);
    handle.shutdown(Duration::from_secs(10)).unwrap();
    (lat, rate)
}

fn cross_process(dir: &Path, n: usize, rate: usize) -> (Vec<Duration>, f64) {
    let path = fresh_db(dir);
    let (handle, starts) = start_relay(&path);
    let commits = producer::run_child(&path, (WARMUP, n, rate));
    let rate = achieved(&commits);
    let lat = latencies(&commits, starts);
    handle.shutdown(Duration::from_secs(10)).unwrap();
    (lat, rate)
}

/// The reference: wall clock sent over a crossbeam channel to a thread
/// blocked in `recv`, at the same rate.
fn channel_hop(n: usize, rate: usize) -> (Vec<Duration>, f64) {
    let (tx, rx) = crossbeam_channel::unbounded::<i64>();
    let receiver = std::thread::spawn(move || {
        let mut lat = Vec::with_capacity(n);
        while let Ok(sent) = rx.recv() {
            lat.push(Duration::from_micros((wall_micros() - sent).max(0) as u64));
        }
        lat
    });
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let start = Instant::now();
    let mut sent = Vec::with_capacity(n);
    for i in 0..(WARMUP + n) {
        sleep_until(start + interval * i as u32);
        let t = wall_micros();
        tx.send(t).unwrap();
        if i >= WARMUP {
            sent.push(t);
        }
    }
    drop(tx);
    let mut lat = receiver.join().unwrap();
    lat.drain(..WARMUP);
    lat.sort();
    (lat, achieved(&sent))
}

/// Events per second the producer really achieved.
fn achieved(times: &[i64]) -> f64 {
    let span = (times[times.len() - 1] - times[0]).max(1) as f64 / 1e6;
    (times.len() - 1).max(1) as f64 / span
}

struct Row {
    p50: Vec<f64>,
    p99: Vec<f64>,
    max: Vec<f64>,
    rate: Vec<f64>,
}

impl Row {
    fn new() -> Row {
        Row {
            p50: vec![],
            p99: vec![],
            max: vec![],
            rate: vec![],
        }
    }

    fn add(&mut self, (sorted, rate): (Vec<Duration>, f64)) {
        let sorted = &sorted;
        self.rate.push(rate);
        self.p50.push(ms(percentile(sorted, 50.0)));
        self.p99.push(ms(percentile(sorted, 99.0)));
        self.max.push(ms(*sorted.last().unwrap()));
    }
}

fn fmt(s: Stats) -> String {
    format!("{:.3} ({:.3}–{:.3})", s.median, s.min, s.max)
}

fn main() {
    if producer::is_child() {
        producer::child_main(EVENT_TYPE);
        return;
    }
    let n = env_or("OUTBOXD_BENCH_EVENTS", 10_000);
    let runs = env_or("OUTBOXD_BENCH_RUNS", 5);
    let rate = env_or("OUTBOXD_BENCH_RATE", 1000);
    let dir = bench_dir();
    header(
        "latency",
        dir.path(),
        &format!("{n} events at {rate}/s per run (after {WARMUP} warm-up events), {runs} runs, default relay settings, producer synchronous={}", producer_sync()),
    );
    let (mut hop, mut inp, mut xp) = (Row::new(), Row::new(), Row::new());
    let load = common::load();
    for _ in 0..runs {
        hop.add(channel_hop(n, rate));
        inp.add(in_process(dir.path(), n, rate));
        xp.add(cross_process(dir.path(), n, rate));
    }
    let hop_p99 = Stats::of(hop.p99.clone()).median;
    println!("| path | producer rate/s achieved | p50 ms (min–max over runs) | p99 ms | max ms | target p99 | p99 ratio to channel hop |");
    println!("|---|---|---|---|---|---|---|");
    for (name, row, target) in [
        ("reference: bare crossbeam channel hop", hop, "—"),
        (
            "outboxd, producer in process (notify)",
            inp,
            "p50 ≤ 0.2 ms, p99 ≤ 1 ms",
        ),
        (
            "outboxd, producer in another process (-wal watch)",
            xp,
            "p99 ≤ 6 ms",
        ),
    ] {
        let p99 = Stats::of(row.p99);
        println!(
            "| {name} | {:.0} | {} | {} | {} | {target} | {:.0} |",
            Stats::of(row.rate).median,
            fmt(Stats::of(row.p50)),
            fmt(p99),
            fmt(Stats::of(row.max)),
            p99.median / hop_p99
        );
    }
    println!("load average at start: {load}, at end: {}", common::load());
}
