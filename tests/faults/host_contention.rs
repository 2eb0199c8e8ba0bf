//! Host contention: three producer processes commit one event per
//! transaction (the host's usual pattern: `conn.transaction()`, enqueue,
//! commit) with outboxd's connection settings (busy_timeout 5 s), while a
//! relay in this process drains at full speed. The relay keeps its write
//! transactions short, so producers never see SQLITE_BUSY, and every event
//! is delivered exactly once.

use crate::common;

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{wait_until, TestDb};
use outboxd::{Delivery, Event, Outcome, Relay};

const PRODUCERS: usize = 3;
const LONG: Duration = Duration::from_secs(300);

fn per_producer() -> usize {
    if std::env::var_os("OUTBOXD_FULL").is_some() {
        10_000
    } else {
        2_000
    }
}

/// The body of one producer process of the test below, not a test of its
/// own: ignored in a normal run (so it is never reported as passing), the
/// test starts this binary with `--ignored --exact child_producer_process`
/// and the variables that say what to do. Prints one `# ` line with its
/// counts.
#[test]
#[ignore = "a child process of three_producer_processes_see_no_busy_while_the_relay_drains, not a test"]
fn child_producer_process() {
    let (Ok(db), Ok(me)) = (
        std::env::var("OUTBOXD_TEST_PRODUCER_DB"),
        std::env::var("OUTBOXD_TEST_PRODUCER_ID"),
    ) else {
        panic!(
            "child_producer_process is a helper process, not a test: \
             three_producer_processes_see_no_busy_while_the_relay_drains starts it"
        );
    };
    let n: usize = std::env::var("OUTBOXD_TEST_PRODUCER_EVENTS")
        .unwrap()
        .parse()
        .unwrap();
    let mut conn = outboxd::connection::open(&db).unwrap();
    let (mut acked, mut busy, mut other) = (0u64, 0u64, 0u64);
    let mut worst = (Duration::ZERO, 0);
    let mut slow = 0u64;
    for i in 0..n {
        let event = Event::new("host.wrote.v1", &serde_json::json!({"p": me, "i": i})).unwrap();
        let started = Instant::now();
        let result = conn
            .transaction()
            .map_err(|e| (e.sqlite_error_code(), e.to_string()))
            .and_then(|tx| {
                outboxd::enqueue(&tx, &event).map_err(|e| {
                    let code = match &e {
                        outboxd::Error::Database { source, .. } => source.sqlite_error_code(),
                        _ => None,
                    };
                    (code, e.to_string())
                })?;
                tx.commit()
                    .map_err(|e| (e.sqlite_error_code(), e.to_string()))
            });
        let took = started.elapsed();
        if took > Duration::from_millis(100) {
            slow += 1;
        }
        worst = worst.max((took, i));
        match result {
            Ok(()) => acked += 1,
            Err((Some(rusqlite::ErrorCode::DatabaseBusy), msg)) => {
                busy += 1;
                eprintln!("producer {me}: {msg}");
            }
            Err((_, msg)) => {
                other += 1;
                eprintln!("producer {me}: {msg}");
            }
        }
    }
    println!(
        "# producer={me} acked={acked} busy={busy} errors={other} \
         slow_commits_over_100ms={slow} worst_commit_ms={} (transaction {})",
        worst.0.as_millis(),
        worst.1
    );
}

/// Reads `key=value` out of a producer's `# ` line.
fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

#[test]
fn three_producer_processes_see_no_busy_while_the_relay_drains() {
    let db = TestDb::new();
    let seen: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let s = seen.clone();
    let relay = Relay::builder(&db.path)
        .consumer("sink", ["host.*"], move |d: &Delivery| {
            *s.lock()
                .unwrap()
                .entry(d.envelope.event_id.to_string())
                .or_default() += 1;
            Outcome::Delivered
        })
        .workers(2)
        .build()
        .unwrap()
        .start()
        .unwrap();

    let n = per_producer();
    let exe = std::env::current_exe().unwrap();
    let started = Instant::now();
    let children: Vec<_> = (0..PRODUCERS)
        .map(|i| {
            Command::new(&exe)
                .args([
                    "--ignored",
                    "--exact",
                    common::test_name(module_path!(), "child_producer_process").as_str(),
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("OUTBOXD_TEST_PRODUCER_DB", &db.path)
                .env("OUTBOXD_TEST_PRODUCER_ID", i.to_string())
                .env("OUTBOXD_TEST_PRODUCER_EVENTS", n.to_string())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let (mut acked, mut busy, mut errors) = (0, 0, 0);
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "a producer process failed");
        let text = String::from_utf8_lossy(&out.stdout);
        // libtest prints "test name ... " before the line, without a newline.
        let line = text
            .lines()
            .find_map(|l| l.find("# producer=").map(|at| &l[at..]))
            .expect("the producer reports its counts");
        println!("{line}");
        acked += field(line, "acked");
        busy += field(line, "busy");
        errors += field(line, "errors");
    }
    let produced_in = started.elapsed();
    wait_until("every event delivered", LONG, || {
        db.count("status = 'delivered'") == acked as i64
    });
    let m = relay.metrics();
    relay.shutdown(Duration::from_secs(10)).unwrap();
    println!(
        "{PRODUCERS} producers x {n} events in {:.1}s: {busy} SQLITE_BUSY, {errors} other errors; \
         relay: {} commits, {} busy retries",
        produced_in.as_secs_f64(),
        m.commits,
        m.busy_retries
    );
    assert_eq!(busy, 0, "producers saw SQLITE_BUSY");
    assert_eq!(errors, 0, "producers saw errors");
    assert_eq!(acked, (PRODUCERS * n) as u64);
    assert_eq!(db.count("1 = 1"), acked as i64, "one row per acked event");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len() as u64, acked, "every event delivered");
    let twice = seen.values().filter(|&&c| c > 1).count();
    assert_eq!(twice, 0, "no event delivered twice");
}
