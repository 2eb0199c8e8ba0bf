//! A destination that is down is an outage, not failed events: however
//! long it lasts, no attempt is spent and nothing is dead-lettered, the
//! other consumers of the same events go on, and the backlog goes out once
//! it answers again.
#![cfg(feature = "sinks")]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outboxd::consumer::{Delivery, Outcome};
use outboxd::sinks::{JsonlSink, WebhookSink};
use outboxd::{EventId, RetryPolicy};

use crate::common::http::{Answer, Receiver};
use crate::common::relay::{stop, StartRelay, LONG};
use crate::common::{event, wait_until, TestDb};

const EVENTS: u64 = 20;

fn lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

#[test]
fn a_receiver_down_longer_than_the_retry_schedule_loses_and_dead_letters_nothing() {
    let down = Arc::new(AtomicBool::new(true));
    let server = Receiver::start({
        let down = down.clone();
        move |_, _| match down.load(Ordering::SeqCst) {
            true => Answer::new("503 Service Unavailable", "maintenance"),
            false => Answer::new("200 OK", "thanks"),
        }
    });
    let db = TestDb::new();
    let file = db.file("events.jsonl");
    // The whole schedule, 3 attempts 20 ms apart, is spent in 40 ms; the
    // probes back off from 10 ms to 40 ms.
    let ms = Duration::from_millis;
    let schedule = RetryPolicy::default()
        .initial(ms(20))
        .max_delay(ms(20))
        .max_attempts(3)
        .jitter(0.0)
        .probe_interval(ms(10))
        .probe_max_interval(ms(40));
    let hook = WebhookSink::builder(server.url("/in"))
        .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        .build()
        .unwrap();
    let relay = db
        .relay()
        .retry_policy(schedule)
        .poll_interval(ms(10))
        .consumer("hook", ["article.created.v1"], hook)
        .consumer(
            "file",
            ["article.created.v1"],
            JsonlSink::file(&file, false).unwrap(),
        )
        .started();
    let events: Vec<_> = (0..EVENTS)
        .map(|n| event("article.created.v1", n))
        .collect();
    db.enqueue(&events);

    // The jsonl consumer of the same events keeps delivering.
    wait_until("the jsonl consumer to have every event", LONG, || {
        lines(&file) == EVENTS as usize
    });
    // New events while it is down: the jsonl consumer has them too.
    let more: Vec<_> = (EVENTS..2 * EVENTS)
        .map(|n| event("article.created.v1", n))
        .collect();
    db.enqueue(&more);
    wait_until("the jsonl consumer to have the new events", LONG, || {
        lines(&file) == 2 * EVENTS as usize
    });
    // The receiver is probed for longer than the whole schedule, many times over.
    let turned_away = (EVENTS * 3 * 2) as usize;
    wait_until(
        "the receiver to turn the events away 6 times each",
        LONG,
        || server.requests().len() >= turned_away,
    );
    assert_eq!(db.count("status = 'dead'"), 0, "nothing dead-lettered");
    assert_eq!(db.count("attempts > 0"), 0, "no attempt spent");
    assert_eq!(db.count("status = 'pending'"), 2 * EVENTS as i64);
    let reason: String = db.scalar("SELECT last_error FROM event_outbox LIMIT 1");
    assert!(
        reason.contains("unavailable") && reason.contains("503"),
        "{reason}"
    );

    down.store(false, Ordering::SeqCst);
    wait_until("the backlog to be delivered", LONG, || {
        db.count("status = 'delivered'") == 2 * EVENTS as i64
    });
    stop(relay);
    let answered: std::collections::BTreeSet<String> = server
        .requests()
        .iter()
        .filter_map(|r| r.header("webhook-id").map(str::to_string))
        .collect();
    assert_eq!(
        answered.len(),
        2 * EVENTS as usize,
        "every event reached the receiver"
    );
    assert_eq!(
        lines(&file),
        2 * EVENTS as usize,
        "the jsonl consumer got each once"
    );
}

/// A consumer whose destination is down while `down` is set; it records
/// the events it was run for.
#[derive(Clone, Default)]
struct Flaky {
    down: Arc<AtomicBool>,
    /// An event (by its `n`) that finds the destination unavailable always.
    cursed: Arc<Mutex<Option<u64>>>,
    tried: Arc<Mutex<Vec<(EventId, bool)>>>,
    delivered: Arc<Mutex<Vec<(String, u64)>>>,
}

impl Flaky {
    fn consumer(&self) -> impl Fn(&Delivery) -> Outcome + Send + Sync + 'static {
        let f = self.clone();
        move |d: &Delivery| {
            let n = d.envelope.payload_as::<serde_json::Value>().unwrap()["n"]
                .as_u64()
                .unwrap();
            let down = f.down.load(Ordering::SeqCst);
            f.tried.lock().unwrap().push((d.envelope.event_id, down));
            if down || *f.cursed.lock().unwrap() == Some(n) {
                return Outcome::unavailable("connection refused");
            }
            let key = d.ordering_key.clone().unwrap_or_default();
            f.delivered.lock().unwrap().push((key, n));
            Outcome::Delivered
        }
    }

    /// Distinct events run while down, and runs while down.
    fn tried_while_down(&self) -> (usize, usize) {
        let tried = self.tried.lock().unwrap();
        let down: Vec<_> = tried.iter().filter(|(_, d)| *d).map(|(id, _)| id).collect();
        let distinct: std::collections::BTreeSet<_> = down.iter().collect();
        (distinct.len(), down.len())
    }
}

/// A relay with `workers` and one consumer, whose destination is down.
/// Held events would wait an hour (`max_delay`): only the resumption brings
/// them back.
fn paused(workers: usize) -> (Flaky, TestDb, outboxd::RelayHandle) {
    let flaky = Flaky::default();
    flaky.down.store(true, Ordering::SeqCst);
    let db = TestDb::new();
    let schedule = RetryPolicy::default()
        .max_attempts(1)
        .probe_interval(Duration::from_millis(10))
        .probe_max_interval(Duration::from_millis(20));
    let relay = db
        .relay()
        .retry_policy(schedule)
        .workers(workers)
        .poll_interval(Duration::from_millis(10))
        .consumer("hook", ["article.created.v1"], flaky.consumer())
        .started();
    (flaky, db, relay)
}

#[test]
fn a_paused_consumer_is_probed_with_one_event_and_resumes_its_backlog_at_once() {
    let (flaky, db, relay) = paused(2);
    let events: Vec<_> = (0..EVENTS * 10)
        .map(|n| event("article.created.v1", n))
        .collect();
    db.enqueue(&events);
    // Every event has been claimed and recorded once.
    wait_until("every event to be held", LONG, || {
        db.count("last_error IS NULL") == 0
    });
    let (distinct, runs) = flaky.tried_while_down();
    // The workers' first events, then one probe at a time: not one run per
    // event (a relay that ran the consumer for each would have 200 here).
    assert!(
        runs < 100,
        "{distinct} events of 200 run in {runs} runs while down"
    );
    assert_eq!(db.count("status = 'dead' OR attempts > 0"), 0);
    let held: String =
        db.scalar("SELECT last_error FROM event_outbox WHERE last_error LIKE '%paused%' LIMIT 1");
    assert!(held.contains("connection refused"), "{held}");
    let hook = &relay.metrics().per_consumer[0];
    assert!(!hook.available && hook.unavailable_ms > 0, "{hook:?}");

    flaky.down.store(false, Ordering::SeqCst);
    wait_until("the backlog to be delivered", LONG, || {
        db.count("status = 'delivered'") == EVENTS as i64 * 10
    });
    let hook = &relay.metrics().per_consumer[0];
    assert!(hook.available && hook.unavailable_ms == 0, "{hook:?}");
    stop(relay);
}

#[test]
fn ordering_keys_held_by_a_pause_resume_in_order() {
    let (flaky, db, relay) = paused(4);
    let events: Vec<_> = (0..EVENTS * 5)
        .map(|n| event("article.created.v1", n).ordering_key(format!("k{}", n % 5)))
        .collect();
    db.enqueue(&events);
    wait_until("10 probes", LONG, || flaky.tried_while_down().1 >= 10);
    flaky.down.store(false, Ordering::SeqCst);
    wait_until("every key's events to be delivered", LONG, || {
        db.count("status = 'delivered'") == EVENTS as i64 * 5
    });
    stop(relay);
    let delivered = flaky.delivered.lock().unwrap().clone();
    for k in 0..5 {
        let key = format!("k{k}");
        let ns: Vec<u64> = delivered
            .iter()
            .filter(|(c, _)| *c == key)
            .map(|(_, n)| *n)
            .collect();
        let expected: Vec<u64> = (0..EVENTS * 5).filter(|n| n % 5 == k).collect();
        assert_eq!(ns, expected, "key {key} in commit order, each once");
    }
}

#[test]
fn one_event_that_always_finds_the_destination_unavailable_cannot_keep_it_paused() {
    let (flaky, db, relay) = paused(1);
    // Event 0 is the first probe, and stays unavailable when the rest is up.
    *flaky.cursed.lock().unwrap() = Some(0);
    let events: Vec<_> = (0..EVENTS)
        .map(|n| event("article.created.v1", n))
        .collect();
    db.enqueue(&events);
    wait_until("5 probes", LONG, || flaky.tried_while_down().1 >= 5);
    flaky.down.store(false, Ordering::SeqCst);
    // The probes rotate over the held events: another one gets through and
    // resumes the consumer (held events would wait an hour otherwise).
    wait_until("every other event to be delivered", LONG, || {
        db.count("status = 'delivered'") == EVENTS as i64 - 1
    });
    assert_eq!(db.count("status = 'dead' OR attempts > 0"), 0);
    stop(relay);
}
