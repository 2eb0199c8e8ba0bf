//! A destination that is down is an outage, not failed events: however
//! long it lasts, no attempt is spent and nothing is dead-lettered, the
//! other consumers of the same events go on, and the backlog goes out once
//! it answers again.
#![cfg(feature = "sinks")]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use outboxd::sinks::{JsonlSink, WebhookSink};
use outboxd::RetryPolicy;

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
    // Each event is turned away more often than its attempts allow.
    let turned_away = (EVENTS * 3 * 2) as usize;
    wait_until(
        "the receiver to turn the events away 6 times each",
        LONG,
        || server.requests().len() >= turned_away,
    );
    assert_eq!(db.count("status = 'dead'"), 0, "nothing dead-lettered");
    assert_eq!(db.count("attempts > 0"), 0, "no attempt spent");
    assert_eq!(db.count("status = 'pending'"), EVENTS as i64);
    let reason: String = db.scalar("SELECT last_error FROM event_outbox LIMIT 1");
    assert!(
        reason.contains("unavailable") && reason.contains("503"),
        "{reason}"
    );

    down.store(false, Ordering::SeqCst);
    wait_until("the backlog to be delivered", LONG, || {
        db.count("status = 'delivered'") == EVENTS as i64
    });
    stop(relay);
    let answered: std::collections::BTreeSet<String> = server
        .requests()
        .iter()
        .filter_map(|r| r.header("webhook-id").map(str::to_string))
        .collect();
    assert_eq!(
        answered.len(),
        EVENTS as usize,
        "every event reached the receiver"
    );
    assert_eq!(
        lines(&file),
        EVENTS as usize,
        "the jsonl consumer got each once"
    );
}
