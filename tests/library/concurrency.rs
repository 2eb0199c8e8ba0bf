//! Several relays on one file, in one process and in several processes:
//! every (event, consumer) pair is delivered exactly once, and SQLITE_BUSY
//! never shows as a failure.

use crate::common;

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{event, wait_until, TestDb};
use outboxd::{Delivery, Outcome, Relay};

const EVENTS: usize = 20_000;
const RELAYS: usize = 6;
const LONG: Duration = Duration::from_secs(240);

fn enqueue_all(db: &TestDb) {
    for chunk in (0..EVENTS as u64).collect::<Vec<_>>().chunks(1000) {
        db.enqueue(
            &chunk
                .iter()
                .map(|&n| event("load.test.v1", n))
                .collect::<Vec<_>>(),
        );
    }
}

#[test]
fn six_relays_in_one_process_deliver_each_pair_exactly_once() {
    let db = TestDb::new();
    enqueue_all(&db);
    let counts: Arc<Mutex<HashMap<(String, String), u32>>> = Arc::default();
    let relays: Vec<_> = (0..RELAYS)
        .map(|_| {
            let mut b = Relay::builder(&db.path).workers(2).batch_size(64);
            for name in ["a", "b"] {
                let c = counts.clone();
                b = b.consumer(name, ["load.*"], move |d: &Delivery| {
                    *c.lock()
                        .unwrap()
                        .entry((d.consumer.clone(), d.envelope.event_id.to_string()))
                        .or_default() += 1;
                    Outcome::Delivered
                });
            }
            b.build().unwrap().start().unwrap()
        })
        .collect();
    wait_until("all delivered", LONG, || {
        db.count("status = 'delivered'") == EVENTS as i64
    });
    let mut busy = 0;
    let mut errors = 0;
    for r in relays {
        let m = r.metrics();
        busy += m.busy_retries;
        errors += m.errors;
        assert_eq!(m.retried + m.dead_lettered, 0, "no delivery failed");
        r.shutdown(Duration::from_secs(10)).unwrap();
    }
    let counts = counts.lock().unwrap();
    assert_eq!(counts.len(), 2 * EVENTS, "every pair delivered");
    let doubles = counts.values().filter(|&&n| n > 1).count();
    assert_eq!(doubles, 0, "no pair delivered twice");
    assert_eq!(errors, 0);
    println!("six in-process relays: {busy} busy retries, 0 failures");
}

/// The body of one relay process of the test below, not a test of its own:
/// ignored in a normal run (so it is never reported as passing), the test
/// starts this binary with `--ignored --exact child_relay_process` and the
/// variables that say what to do.
#[test]
#[ignore = "a child process of six_relay_processes_on_one_file_deliver_each_pair_exactly_once, not a test"]
fn child_relay_process() {
    let (Ok(db), Ok(out)) = (
        std::env::var("OUTBOXD_TEST_CHILD_DB"),
        std::env::var("OUTBOXD_TEST_CHILD_OUT"),
    ) else {
        panic!(
            "child_relay_process is a helper process, not a test: \
             six_relay_processes_on_one_file_deliver_each_pair_exactly_once starts it"
        );
    };
    let file = Arc::new(Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&out)
            .unwrap(),
    ));
    let mut b = Relay::builder(&db).workers(2).batch_size(64);
    for name in ["a", "b"] {
        let f = file.clone();
        b = b.consumer(name, ["load.*"], move |d: &Delivery| {
            writeln!(f.lock().unwrap(), "{} {}", d.consumer, d.envelope.event_id).unwrap();
            Outcome::Delivered
        });
    }
    let relay = b.build().unwrap().start().unwrap();
    let conn = outboxd::connection::open(&db).unwrap();
    wait_until("all delivered", LONG, || {
        conn.query_row(
            "SELECT count(*) FROM event_outbox WHERE status = 'delivered'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
            == EVENTS as i64
    });
    let m = relay.metrics();
    relay.shutdown(Duration::from_secs(10)).unwrap();
    writeln!(
        file.lock().unwrap(),
        "# busy={} errors={} retried={} dead={}",
        m.busy_retries,
        m.errors,
        m.retried,
        m.dead_lettered
    )
    .unwrap();
}

#[test]
fn six_relay_processes_on_one_file_deliver_each_pair_exactly_once() {
    let db = TestDb::new();
    enqueue_all(&db);
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..RELAYS)
        .map(|i| {
            let out = db.dir.path().join(format!("child-{i}.log"));
            let child = std::process::Command::new(&exe)
                .args([
                    "--ignored",
                    "--exact",
                    common::test_name(module_path!(), "child_relay_process").as_str(),
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("OUTBOXD_TEST_CHILD_DB", &db.path)
                .env("OUTBOXD_TEST_CHILD_OUT", &out)
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap();
            (child, out)
        })
        .collect();
    let mut counts: HashMap<String, u32> = HashMap::new();
    for (mut child, out) in children {
        assert!(child.wait().unwrap().success(), "a relay process failed");
        for line in std::fs::read_to_string(out).unwrap().lines() {
            if let Some(stats) = line.strip_prefix("# ") {
                assert!(stats.contains("errors=0 retried=0 dead=0"), "{stats}");
                println!("relay process: {stats}");
            } else {
                *counts.entry(line.to_string()).or_default() += 1;
            }
        }
    }
    assert_eq!(counts.len(), 2 * EVENTS, "every pair delivered");
    let doubles: Vec<_> = counts.iter().filter(|&(_, &n)| n > 1).collect();
    assert!(doubles.is_empty(), "pairs delivered twice: {doubles:?}");
}
