//! NATS throughput: a full outbox relayed into a local single-node
//! JetStream stream on file storage, against a bare async-nats program
//! publishing the same messages (same bodies, same headers) with the same
//! number of publishes in flight, each acknowledgement awaited, in the same
//! run and against the same server.
//!
//!   cargo bench --bench nats                                      # 20,000 events, 5 runs
//!   OUTBOXD_BENCH_EVENTS=2000 OUTBOXD_BENCH_RUNS=1 cargo bench --bench nats   # smoke
//!   OUTBOXD_BENCH_WORKERS=8,32,64 cargo bench --bench nats        # in flight
//!
//! Two baselines. "tasks": W tasks on one runtime thread, each publishing
//! its share and awaiting each acknowledgement before its next publish (W in
//! flight, the most an async program gets from W outstanding acks). "threads":
//! W threads doing the same through `Handle::block_on`, which is how the
//! relay's W workers drive the sink. The ratio is the relay's median over
//! the faster baseline's median. The last column is the same relay with a
//! consumer that does nothing, on the same events: the relay's own ceiling
//! (SQLite claims and group commits) at that moment.

mod common;
#[path = "../tests/common/nats_server.rs"]
mod nats_server;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, message::PublishMessage as Publish};
use async_nats::HeaderMap;
use common::{env_or, Stats};
use nats_server::{NatsServer, StreamAdmin};
use outboxd::sinks::nats::NatsSink;
use outboxd::{Envelope, Event, EventId, EventType, Relay, Timestamp};

const STREAM: &str = "BENCH";

/// The events of one run, as enqueued and as the envelopes the relay will
/// build from them (so the baseline publishes the same bytes).
struct Batch {
    events: Vec<Event>,
    messages: Vec<(HeaderMap, bytes::Bytes)>,
}

fn batch(n: usize) -> Batch {
    let ty = EventType::parse("bench.published.v1").unwrap();
    let occurred = Timestamp::from_millis(1_764_487_080_123);
    let mut events = Vec::with_capacity(n);
    let mut messages = Vec::with_capacity(n);
    for i in 0..n {
        let id = EventId::new();
        let payload = format!(r#"{{"i":{i},"title":"an article of ordinary length"}}"#);
        events.push(
            Event::from_json(ty.as_str(), payload.clone())
                .unwrap()
                .event_id(id)
                .occurred_at(occurred),
        );
        let env = Envelope {
            event_id: id,
            event_type: ty.clone(),
            event_version: 1,
            causation_id: None,
            correlation_id: None,
            occurred_at: occurred,
            payload: serde_json::value::RawValue::from_string(payload).unwrap(),
        };
        let mut h = HeaderMap::new();
        h.insert("Nats-Msg-Id", id.to_string());
        h.insert("Outboxd-Event-Type", ty.as_str());
        h.insert("Outboxd-Event-Version", "1");
        h.insert("Outboxd-Attempt", "1");
        messages.push((h, bytes::Bytes::from(env.to_json())));
    }
    Batch { events, messages }
}

fn prepare_db(dir: &Path, events: &[Event]) -> PathBuf {
    let path = dir.join(format!("nats-{}.db", ulid::Ulid::generate()));
    let mut conn = common::migrated(&path, "NORMAL");
    for chunk in events.chunks(10_000) {
        let tx = conn.transaction().unwrap();
        outboxd::enqueue_many(&tx, chunk).unwrap();
        tx.commit().unwrap();
    }
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    path
}

/// A fresh, empty stream for each run.
fn fresh_stream(admin: &StreamAdmin) {
    admin.delete(STREAM);
    admin.create(STREAM, &["bench.>"], 1);
}

fn subject() -> &'static str {
    "bench.bench.published.v1"
}

/// W tasks on one runtime thread, each awaiting every acknowledgement.
fn bare_tasks(url: &str, b: &Batch, w: usize) -> Duration {
    let rt = nats_server::runtime();
    rt.block_on(async {
        let client = async_nats::connect(url).await.unwrap();
        let js = jetstream::new(client);
        let messages = Arc::new(b.messages.clone());
        let start = Instant::now();
        let tasks: Vec<_> = (0..w)
            .map(|k| {
                let js = js.clone();
                let messages = messages.clone();
                tokio::spawn(async move {
                    for (h, body) in messages.iter().skip(k).step_by(w) {
                        let p = Publish::build().headers(h.clone()).payload(body.clone());
                        js.send_publish(subject(), p).await.unwrap().await.unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        start.elapsed()
    })
}

/// W threads, each publishing through `Handle::block_on` as the relay's
/// workers drive the sink.
fn bare_threads(url: &str, b: &Batch, w: usize) -> Duration {
    let rt = nats_server::runtime();
    let js = rt.block_on(async { jetstream::new(async_nats::connect(url).await.unwrap()) });
    let handle = rt.handle().clone();
    let start = Instant::now();
    std::thread::scope(|s| {
        for k in 0..w {
            let (js, handle) = (js.clone(), handle.clone());
            let messages = &b.messages;
            s.spawn(move || {
                for (h, body) in messages.iter().skip(k).step_by(w) {
                    let p = Publish::build().headers(h.clone()).payload(body.clone());
                    handle
                        .block_on(async { js.send_publish(subject(), p).await?.await })
                        .unwrap();
                }
            });
        }
    });
    start.elapsed()
}

/// outboxd's relay with the NATS sink (or, without `url`, a consumer that
/// does nothing: the relay's own ceiling) and W workers, from the first
/// claim until no event is pending.
fn relay(url: Option<&str>, db: &Path, n: usize, w: usize) -> Duration {
    let builder = Relay::builder(db);
    let builder = match url {
        Some(url) => builder.consumer(
            "nats",
            ["*"],
            NatsSink::builder([url], STREAM)
                .subject("bench.{event_type}")
                .build()
                .unwrap(),
        ),
        None => builder.consumer("noop", ["*"], |_: &outboxd::Delivery| {
            outboxd::Outcome::Delivered
        }),
    };
    common::drain_timed(db, builder.workers(w).build().unwrap(), n)
}

fn main() {
    let n = env_or("OUTBOXD_BENCH_EVENTS", 20_000);
    let runs = env_or("OUTBOXD_BENCH_RUNS", 5);
    let workers: Vec<usize> = std::env::var("OUTBOXD_BENCH_WORKERS")
        .unwrap_or_else(|_| "8,32,64".into())
        .split(',')
        .map(|s| s.trim().parse().expect("OUTBOXD_BENCH_WORKERS: numbers"))
        .collect();
    let dir = common::bench_dir();
    let server = NatsServer::start();
    let admin = StreamAdmin::connect(&[server.url()]);
    let url = server.url();
    common::header(
        "nats",
        dir.path(),
        &format!("{n} events of ~170 bytes into a single-node JetStream stream on file storage, {runs} runs each"),
    );
    println!("| in flight (workers) | bare, tasks: msgs/s | bare, threads: msgs/s | outboxd relay: events/s (min–max) | ratio to the faster bare | relay, no-op consumer: events/s |");
    println!("|---|---|---|---|---|---|");
    for &w in &workers {
        let (mut tasks, mut threads, mut relayed, mut noop) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            // Interleaved, so a change of load hits all three alike.
            let b = batch(n);
            fresh_stream(&admin);
            tasks.push(n as f64 / bare_tasks(&url, &b, w).as_secs_f64());
            assert_eq!(admin.count(STREAM), n as u64);
            fresh_stream(&admin);
            threads.push(n as f64 / bare_threads(&url, &b, w).as_secs_f64());
            fresh_stream(&admin);
            let db = prepare_db(dir.path(), &b.events);
            relayed.push(n as f64 / relay(Some(&url), &db, n, w).as_secs_f64());
            assert_eq!(admin.count(STREAM), n as u64);
            common::remove_db(&db);
            let db = prepare_db(dir.path(), &b.events);
            noop.push(n as f64 / relay(None, &db, n, w).as_secs_f64());
            common::remove_db(&db);
        }
        let (t, th, r) = (Stats::of(tasks), Stats::of(threads), Stats::of(relayed));
        let best = t.median.max(th.median);
        println!(
            "| {w} | {:.0} | {:.0} | {:.0} ({:.0}–{:.0}) | {:.2} | {:.0} |",
            t.median,
            th.median,
            r.median,
            r.min,
            r.max,
            r.median / best,
            Stats::of(noop).median
        );
    }
    println!("load average at end {}", common::load());
}
