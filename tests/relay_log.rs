//! What the relay writes to its log, read back through a tracing subscriber
//! that writes to a buffer. A file of its own: the subscriber is global (the
//! writer logs from its own thread), installed once for the tests here,
//! which tell their lines apart by event or row id.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::faultvfs;
use common::relay::{Gate, StartRelay, LONG};
use common::{event, wait_until, TestDb};
use outboxd::relay::RetryPolicy;
use outboxd::{Delivery, ManualClock, Outcome, Relay, Timestamp};

/// The log lines, as text.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

/// The log of every test here (the subscriber is installed on first use).
fn log() -> &'static Captured {
    static LOG: OnceLock<Captured> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Captured::default();
        tracing::subscriber::set_global_default(
            tracing_subscriber::fmt()
                .with_writer(log.clone())
                .with_ansi(false)
                .with_max_level(tracing::Level::INFO)
                .finish(),
        )
        .unwrap();
        log
    })
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

/// Regression (issue 10, found running the binary): the last failed attempt
/// was logged as "delivery failed, will retry" and the dead letter that
/// followed was not logged at all. Now each failure says only that it
/// failed, a retry is logged when one is scheduled, and the give-up is a
/// WARN line with the reason the dead letter keeps.
#[test]
fn a_retry_that_spends_its_attempts_logs_the_give_up_with_the_reason() {
    let log = log();
    let db = TestDb::new();
    let relay = db
        .relay()
        .consumer("flaky", ["a.b.v1"], |_: &Delivery| {
            Outcome::retry("receiver down")
        })
        .retry_policy(
            RetryPolicy::default()
                .initial(Duration::from_millis(20))
                .max_attempts(2)
                .jitter(0.0),
        )
        .started();
    let id = db.enqueue(&[event("a.b.v1", 1)])[0];
    relay.notify();
    wait_until("dead-lettered", Duration::from_secs(30), || {
        db.count("status = 'dead'") == 1
    });
    relay.shutdown(Duration::from_secs(10)).unwrap();

    let text = log.text();
    let lines = |needle: &str| -> Vec<&str> {
        text.lines()
            .filter(|l| l.contains(&id.to_string()) && l.contains(needle))
            .collect()
    };
    assert_eq!(lines("delivery failed").len(), 2, "{text}");
    assert_eq!(
        lines("will retry").len(),
        1,
        "only the first failure is retried: {text}"
    );
    let gave_up = lines("giving up");
    assert_eq!(gave_up.len(), 1, "{text}");
    assert!(gave_up[0].contains("WARN"), "{}", gave_up[0]);
    let reason: String = db.scalar("SELECT last_error FROM event_outbox");
    assert_eq!(
        reason,
        "gave up after 2 attempts: consumer flaky: receiver down"
    );
    assert!(gave_up[0].contains(&reason), "{}", gave_up[0]);
}

/// Regression (issue 11.10): when a write transaction failed and was tried
/// again after half a lease, the retry extended the leases of the rows whose
/// outcomes it was recording in the same transaction, found their claims
/// already ended, and warned "lease lost to another relay" with no other
/// relay about. Now a transaction extends only the leases it keeps.
#[test]
fn a_retried_write_does_not_report_its_own_finished_rows_as_lost_leases() {
    let log = log();
    faultvfs::register();
    let db = TestDb::new();
    // A row id no other test here uses, to find this test's lines.
    db.conn()
        .execute(
            "INSERT OR REPLACE INTO sqlite_sequence (name, seq) VALUES ('event_outbox', 7770)",
            [],
        )
        .unwrap();
    let lease = Duration::from_secs(1);
    let clock = ManualClock::new(Timestamp::now().plus(Duration::from_secs(60)));
    let gate = Gate::new();
    let held = gate.clone();
    let relay = Relay::builder(faultvfs::uri(&db.path))
        .consumer("a", ["*"], move |_: &Delivery| {
            held.hold();
            Outcome::Delivered
        })
        .lease(lease)
        .clock(clock.clone())
        .purge(None)
        .started();
    db.enqueue(&[event("a.b.v1", 1)]);
    relay.notify();
    gate.wait_started();
    // The outcome's write fails until more than half the lease has run out.
    faultvfs::arm(
        Some(faultvfs::Fault {
            class: faultvfs::Class::Write,
            at: 1,
            persist: true,
            code: rusqlite::ffi::SQLITE_IOERR_WRITE,
        }),
        None,
    );
    gate.open();
    wait_until("the outcome's write to fail", LONG, || {
        relay.metrics().errors >= 1
    });
    clock.advance(lease * 6 / 10);
    faultvfs::disarm();
    wait_until("the outcome recorded", LONG, || {
        db.count("status = 'delivered'") == 1
    });
    relay.shutdown(LONG).unwrap();
    let text = log.text();
    let lost: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("row_id=7771") && l.contains("lease lost"))
        .collect();
    assert!(lost.is_empty(), "{lost:#?}");
    assert!(
        text.lines()
            .any(|l| l.contains("cannot write to the database")),
        "the write did fail: {text}"
    );
}

/// Issue 30 item 10: "a consumer is still running after the grace period"
/// was logged a few milliseconds into a 30 s grace. The writer judged a
/// worker ended by the outcomes channel closing, but a worker drops its
/// outcomes sender before its connection and the rest: one still closing
/// was taken for one stuck in a consumer. Many workers with transactional
/// sessions (a connection each to close), stopped many times.
#[test]
fn a_clean_shutdown_never_says_a_consumer_is_still_running() {
    let log = log();
    let db = TestDb::new();
    db.conn()
        .execute_batch("CREATE TABLE seen (id TEXT PRIMARY KEY)")
        .unwrap();
    for round in 0..20u64 {
        let relay = db
            .relay()
            .transactional_consumer(
                "t",
                ["a.b.v1"],
                |tx: &rusqlite::Transaction<'_>, d: &Delivery| {
                    tx.execute(
                        "INSERT INTO seen VALUES (?1)",
                        [d.envelope.event_id.to_string()],
                    )
                    .map_or_else(|e| Outcome::retry(e.to_string()), |_| Outcome::Delivered)
                },
            )
            .workers(16)
            .started();
        let events: Vec<_> = (0..32).map(|n| event("a.b.v1", round * 100 + n)).collect();
        db.enqueue(&events);
        relay.notify();
        wait_until("the round delivered", LONG, || {
            db.count("status = 'delivered'") == ((round + 1) * 32) as i64
        });
        relay.shutdown(LONG).unwrap();
    }
    let text = log.text();
    assert!(!text.contains("still running after the grace"), "{text}");
}

/// The lines of a delivery attempt carry the event's trace id; a row whose
/// stored traceparent is invalid is delivered, with a WARN line naming it.
#[test]
fn attempts_log_the_trace_id_and_an_invalid_traceparent_is_warned_about() {
    let log = log();
    let db = TestDb::new();
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    db.enqueue(&[event("a.b.v1", 1).traceparent(parent.parse().unwrap())]);
    let bad = "01JDQ8F6ZC1Y0D3W9N7K2M4P5Z";
    db.conn()
        .execute(
            "INSERT INTO event_outbox (event_id, event_type, payload, traceparent)
             VALUES (?1, 'a.b.v1', '{}', 'not a traceparent')",
            [bad],
        )
        .unwrap();
    let relay = db
        .relay()
        .consumer("c", ["a.b.v1"], |d: &Delivery| {
            if d.trace.is_some() {
                Outcome::retry("traced and refused")
            } else {
                Outcome::Delivered
            }
        })
        .retry_policy(RetryPolicy::default().max_attempts(1))
        .started();
    wait_until("both rows finished", LONG, || {
        db.count("status <> 'pending'") == 2
    });
    relay.shutdown(LONG).unwrap();
    let text = log.text();
    let failed = text
        .lines()
        .find(|l| l.contains("traced and refused"))
        .unwrap_or_else(|| panic!("no failure line in\n{text}"));
    assert!(
        failed.contains("trace_id=4bf92f3577b34da6a3ce929d0e0e4736"),
        "{failed}"
    );
    let warned = text
        .lines()
        .find(|l| l.contains("trace context is invalid") && l.contains(bad))
        .unwrap_or_else(|| panic!("no warning for {bad} in\n{text}"));
    assert!(warned.contains("WARN"), "{warned}");
    assert_eq!(db.count("status = 'delivered'"), 1);
}
