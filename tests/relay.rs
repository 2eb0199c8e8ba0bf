//! Black-box tests of the relay: each fails without the feature it names.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{event, wait_until, Recorder, TestDb};
use outboxd::relay::{RetryPolicy, UnroutedPolicy};
use outboxd::{Clock, Delivery, ManualClock, Outcome, Relay, Timestamp};

const LONG: Duration = Duration::from_secs(30);

#[test]
fn delivers_every_event_once_to_every_subscribed_consumer() {
    let db = TestDb::new();
    let (a, b, other) = (
        Recorder::default(),
        Recorder::default(),
        Recorder::default(),
    );
    let relay = Relay::builder(&db.path)
        .consumer("a", ["article.*.v1"], a.consumer())
        .consumer("b", ["*"], b.consumer())
        .consumer("v2only", ["*.v2"], other.consumer())
        .workers(2)
        .build()
        .unwrap()
        .start()
        .unwrap();
    let ids = db.enqueue(
        &(0..500)
            .map(|n| event("article.created.v1", n))
            .collect::<Vec<_>>(),
    );
    relay.notify();
    wait_until("all delivered", LONG, || {
        db.count("status = 'delivered'") == 500
    });
    relay.shutdown(LONG).unwrap();
    let mut got_a = a.ids();
    got_a.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(got_a, want, "consumer a saw each event exactly once");
    assert_eq!(b.len(), 500);
    assert_eq!(other.len(), 0, "a v2 consumer never sees v1 events");
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM delivered_events"),
        1000
    );
    assert_eq!(
        db.count("claim_token IS NOT NULL"),
        0,
        "nothing left leased"
    );
}

#[test]
fn a_retry_reruns_only_the_failed_consumer_after_backoff() {
    let db = TestDb::new();
    // A little ahead of the wall clock, so that events enqueued now are due.
    let clock = ManualClock::new(Timestamp::now().plus(Duration::from_secs(1)));
    let ok = Recorder::default();
    let flaky_calls = Arc::new(AtomicU32::new(0));
    let calls = flaky_calls.clone();
    let relay = Relay::builder(&db.path)
        .consumer("ok", ["a.b.v1"], ok.consumer())
        .consumer("flaky", ["a.b.v1"], move |d: &Delivery| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            assert_eq!(d.attempt, n + 1, "attempt counts the failures so far");
            if n == 0 {
                Outcome::retry("receiver down")
            } else {
                Outcome::Delivered
            }
        })
        .retry_policy(RetryPolicy::default().jitter(0.0))
        .clock(clock.clone())
        .build()
        .unwrap()
        .start()
        .unwrap();
    db.enqueue(&[event("a.b.v1", 1)]);
    relay.notify();
    wait_until("first attempt recorded", LONG, || {
        db.count("attempts = 1") == 1
    });
    assert_eq!(
        db.scalar::<String>("SELECT last_error FROM event_outbox"),
        "consumer flaky: receiver down"
    );
    let due: i64 = db.scalar("SELECT available_at FROM event_outbox");
    assert_eq!(
        due - clock.now().as_millis(),
        30_000,
        "first backoff is 30 s"
    );
    clock.advance(Duration::from_secs(31));
    wait_until("delivered after the retry", LONG, || {
        db.count("status = 'delivered'") == 1
    });
    relay.shutdown(LONG).unwrap();
    assert_eq!(ok.len(), 1, "the consumer that succeeded was not run again");
    assert_eq!(flaky_calls.load(Ordering::SeqCst), 2);
}

#[test]
fn poison_dead_letters_at_once_without_spending_an_attempt() {
    let db = TestDb::new();
    let relay = Relay::builder(&db.path)
        .consumer("strict", ["a.b.v1"], |_: &Delivery| {
            Outcome::poison("payload has no id")
        })
        .build()
        .unwrap()
        .start()
        .unwrap();
    db.enqueue(&[event("a.b.v1", 1)]);
    relay.notify();
    wait_until("dead letter", LONG, || db.count("status = 'dead'") == 1);
    relay.shutdown(LONG).unwrap();
    assert_eq!(db.count("attempts = 0"), 1);
    let reason: String = db.scalar("SELECT last_error FROM event_outbox");
    assert!(
        reason.contains("payload has no id") && reason.contains("strict"),
        "{reason}"
    );
}

#[test]
fn retries_end_in_a_dead_letter_with_the_last_reason() {
    let db = TestDb::new();
    // A little ahead of the wall clock, so that events enqueued now are due.
    let clock = ManualClock::new(Timestamp::now().plus(Duration::from_secs(1)));
    let relay = Relay::builder(&db.path)
        .consumer("down", ["a.b.v1"], |d: &Delivery| {
            Outcome::retry(format!("try {}", d.attempt))
        })
        .retry_policy(RetryPolicy::default().max_attempts(3).jitter(0.0))
        .clock(clock.clone())
        .build()
        .unwrap()
        .start()
        .unwrap();
    db.enqueue(&[event("a.b.v1", 1)]);
    relay.notify();
    for n in 1..3 {
        wait_until("a failed attempt", LONG, || {
            db.count(&format!("attempts = {n}")) == 1
        });
        clock.advance(Duration::from_secs(3600));
    }
    wait_until("dead letter", LONG, || db.count("status = 'dead'") == 1);
    relay.shutdown(LONG).unwrap();
    assert_eq!(db.count("attempts = 3"), 1);
    let reason: String = db.scalar("SELECT last_error FROM event_outbox");
    assert!(
        reason.contains("gave up after 3 attempts") && reason.contains("try 3"),
        "{reason}"
    );
}

#[test]
fn a_panicking_consumer_is_a_retry_and_the_relay_survives() {
    let db = TestDb::new();
    let good = Recorder::default();
    let relay = Relay::builder(&db.path)
        .consumer("boom", ["boom.it.v1"], |_: &Delivery| -> Outcome {
            panic!("kaboom")
        })
        .consumer("good", ["fine.it.v1"], good.consumer())
        .build()
        .unwrap()
        .start()
        .unwrap();
    db.enqueue(&[event("boom.it.v1", 1), event("fine.it.v1", 2)]);
    relay.notify();
    wait_until("retry recorded", LONG, || db.count("attempts = 1") == 1);
    wait_until("other event delivered", LONG, || good.len() == 1);
    relay.shutdown(LONG).unwrap();
    let reason: String = db.scalar("SELECT last_error FROM event_outbox WHERE attempts = 1");
    assert!(reason.contains("consumer panicked: kaboom"), "{reason}");
}

#[test]
fn unrouted_events_are_dead_lettered_or_skipped_by_policy() {
    for (policy, status) in [
        (UnroutedPolicy::DeadLetter, "dead"),
        (UnroutedPolicy::Skip, "delivered"),
    ] {
        let db = TestDb::new();
        let relay = Relay::builder(&db.path)
            .consumer("a", ["a.b.v1"], |_: &Delivery| Outcome::Delivered)
            .unrouted(policy)
            .build()
            .unwrap()
            .start()
            .unwrap();
        db.enqueue(&[event("nobody.wants.v1", 1)]);
        relay.notify();
        wait_until("unrouted handled", LONG, || {
            db.count(&format!("status = '{status}'")) == 1
        });
        relay.shutdown(LONG).unwrap();
        if status == "dead" {
            let reason: String = db.scalar("SELECT last_error FROM event_outbox");
            assert_eq!(reason, "no consumer takes event type nobody.wants.v1");
        }
    }
}

#[test]
fn build_rejects_bad_settings_with_the_field_name() {
    let noop = |_: &Delivery| Outcome::Delivered;
    let cases: Vec<(outboxd::RelayBuilder, &str)> = vec![
        (Relay::builder("x.db"), "consumers"),
        (
            Relay::builder("x.db")
                .consumer("a", ["a.b.v1"], noop)
                .workers(0),
            "workers",
        ),
        (
            Relay::builder("x.db")
                .consumer("a", ["a.b.v1"], noop)
                .batch_size(0),
            "batch_size",
        ),
        (
            Relay::builder("x.db")
                .consumer("a", ["a.b.v1"], noop)
                .lease(Duration::from_millis(10)),
            "lease",
        ),
        (
            Relay::builder("x.db").consumer("a", ["Bad"], noop),
            "event type pattern",
        ),
        (
            Relay::builder("x.db")
                .consumer("a", ["a.b.v1"], noop)
                .consumer("a", ["a.b.v1"], noop),
            "registered twice",
        ),
        (
            Relay::builder("x.db")
                .consumer("a", ["a.b.v1"], noop)
                .retry_policy_for("zz", RetryPolicy::default()),
            "zz",
        ),
    ];
    for (builder, needle) in cases {
        let err = builder.build().err().expect("build must fail").to_string();
        assert!(err.contains(needle), "{err:?} should mention {needle:?}");
    }
}

#[test]
fn shutdown_finishes_in_flight_deliveries_and_releases_the_rest() {
    let db = TestDb::new();
    let (started_tx, started) = crossbeam_channel::unbounded();
    let (go_tx, go) = crossbeam_channel::unbounded::<()>();
    let done = Recorder::default();
    let rec = done.consumer();
    let relay = Relay::builder(&db.path)
        .consumer("slow", ["a.b.v1"], move |d: &Delivery| {
            started_tx.send(()).unwrap();
            go.recv().unwrap();
            rec(d)
        })
        .workers(1)
        .build()
        .unwrap()
        .start()
        .unwrap();
    db.enqueue(&(0..5).map(|n| event("a.b.v1", n)).collect::<Vec<_>>());
    relay.notify();
    started.recv_timeout(LONG).unwrap();
    // One delivery is running; four are claimed and queued.
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        go_tx.send(()).unwrap();
    });
    relay.shutdown(LONG).unwrap();
    releaser.join().unwrap();
    assert_eq!(done.len(), 1, "only the started delivery ran");
    assert_eq!(
        db.count("status = 'delivered'"),
        1,
        "its outcome was recorded"
    );
    assert_eq!(
        db.count("status = 'pending' AND claim_token IS NULL"),
        4,
        "the rest were released"
    );
    assert_eq!(
        db.count("attempts > 0"),
        0,
        "released rows spent no attempt"
    );
}

#[test]
fn picks_up_a_commit_from_another_connection_without_notify() {
    let db = TestDb::new();
    let (tx, rx) = crossbeam_channel::unbounded();
    let relay = Relay::builder(&db.path)
        .consumer("a", ["a.b.v1"], move |d: &Delivery| {
            tx.send(d.envelope.event_id).unwrap();
            Outcome::Delivered
        })
        // A poll floor far above what the test allows: only data_version
        // can explain a fast pick-up.
        .poll_interval(Duration::from_millis(5))
        .housekeeping_interval(Duration::from_secs(3600))
        .build()
        .unwrap()
        .start()
        .unwrap();
    // Let the relay go idle first.
    std::thread::sleep(Duration::from_millis(50));
    let started = std::time::Instant::now();
    let id = db.enqueue(&[event("a.b.v1", 1)])[0];
    assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), id);
    let took = started.elapsed();
    relay.shutdown(LONG).unwrap();
    assert!(took < Duration::from_secs(1), "picked up in {took:?}");
}
