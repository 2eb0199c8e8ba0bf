//! Black-box tests of the relay: each fails without the feature it names.

use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::relay::{stop, Gate, StartRelay, LONG};
use common::{event, wait_until, Recorder, TestDb};
use outboxd::error::Setting;
use outboxd::purge::PurgePolicy;
use outboxd::relay::{RetryPolicy, UnroutedPolicy, MAX_BATCH_SIZE, MAX_WORKERS};
use outboxd::{Clock, Delivery, Error, EventId, ManualClock, Outcome, Relay, Timestamp};

#[test]
fn delivers_every_event_once_to_every_subscribed_consumer() {
    let db = TestDb::new();
    let (a, b, other) = (
        Recorder::default(),
        Recorder::default(),
        Recorder::default(),
    );
    let relay = db
        .relay()
        .consumer("a", ["article.*.v1"], a.consumer())
        .consumer("b", ["*"], b.consumer())
        .consumer("v2only", ["*.v2"], other.consumer())
        .workers(2)
        .started();
    let ids = db.enqueue(
        &(0..500)
            .map(|n| event("article.created.v1", n))
            .collect::<Vec<_>>(),
    );
    relay.notify();
    wait_until("all delivered", LONG, || {
        db.count("status = 'delivered'") == 500
    });
    stop(relay);
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
    retry_reruns_only_the_failed_consumer(|db| {
        db.enqueue(&[event("a.b.v1", 1)]);
    });
}

/// The same for rows a foreign producer wrote: an event id in lower case
/// and a legacy row without one. The relay records the succeeded consumer
/// under the key it made for the row, and the retry's claim looks it up
/// in SQL: both must be the one key.
#[test]
fn a_retry_of_a_foreign_row_reruns_only_the_failed_consumer() {
    for event_id in [Some(EventId::new().to_string().to_lowercase()), None] {
        retry_reruns_only_the_failed_consumer(|db| {
            insert_foreign(db, &event_id);
        });
    }
}

/// Two consumers of one row, one failing its first attempt: after the
/// backoff only that one runs again.
fn retry_reruns_only_the_failed_consumer(insert: impl FnOnce(&TestDb)) {
    let db = TestDb::new();
    // A little ahead of the wall clock, so that events enqueued now are due.
    let clock = ManualClock::new(Timestamp::now().plus(Duration::from_secs(1)));
    let ok = Recorder::default();
    let flaky_calls = Arc::new(AtomicU32::new(0));
    let calls = flaky_calls.clone();
    let relay = db
        .relay()
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
        .started();
    insert(&db);
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
    stop(relay);
    assert_eq!(ok.len(), 1, "the consumer that succeeded was not run again");
    assert_eq!(flaky_calls.load(Ordering::SeqCst), 2);
}

#[test]
fn poison_dead_letters_at_once_without_spending_an_attempt() {
    let db = TestDb::new();
    let relay = db
        .relay()
        .consumer("strict", ["a.b.v1"], |_: &Delivery| {
            Outcome::poison("payload has no id")
        })
        .started();
    db.enqueue(&[event("a.b.v1", 1)]);
    relay.notify();
    wait_until("dead letter", LONG, || db.count("status = 'dead'") == 1);
    stop(relay);
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
    let relay = db
        .relay()
        .consumer("down", ["a.b.v1"], |d: &Delivery| {
            Outcome::retry(format!("try {}", d.attempt))
        })
        .retry_policy(RetryPolicy::default().max_attempts(3).jitter(0.0))
        .clock(clock.clone())
        .started();
    db.enqueue(&[event("a.b.v1", 1)]);
    relay.notify();
    for n in 1..3 {
        wait_until("a failed attempt", LONG, || {
            db.count(&format!("attempts = {n}")) == 1
        });
        clock.advance(Duration::from_secs(3600));
    }
    wait_until("dead letter", LONG, || db.count("status = 'dead'") == 1);
    stop(relay);
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
    let relay = db
        .relay()
        .consumer("boom", ["boom.it.v1"], |_: &Delivery| -> Outcome {
            panic!("kaboom")
        })
        .consumer("good", ["fine.it.v1"], good.consumer())
        .started();
    db.enqueue(&[event("boom.it.v1", 1), event("fine.it.v1", 2)]);
    relay.notify();
    wait_until("retry recorded", LONG, || db.count("attempts = 1") == 1);
    wait_until("other event delivered", LONG, || good.len() == 1);
    stop(relay);
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
        let relay = db
            .relay()
            .consumer("a", ["a.b.v1"], |_: &Delivery| Outcome::Delivered)
            .unrouted(policy)
            .started();
        db.enqueue(&[event("nobody.wants.v1", 1)]);
        relay.notify();
        wait_until("unrouted handled", LONG, || {
            db.count(&format!("status = '{status}'")) == 1
        });
        stop(relay);
        if status == "dead" {
            let reason: String = db.scalar("SELECT last_error FROM event_outbox");
            assert_eq!(reason, "no consumer takes event type nobody.wants.v1");
        }
    }
}

/// The builder is the one validator: each bad setting comes back as a
/// typed [`SettingError`] naming the setting, and for a consumer's own
/// setting the consumer (and the bad pattern's position), so a caller maps
/// it to its own field without reading the message.
#[test]
fn build_rejects_bad_settings_naming_the_setting_and_the_consumer() {
    let noop = |_: &Delivery| Outcome::Delivered;
    let one = || Relay::builder("x.db").consumer("a", ["a.b.v1"], noop);
    let quick = RetryPolicy::default().jitter(0.0);
    let no_batch = PurgePolicy::default().batch_size(0);
    type Case = (
        outboxd::RelayBuilder,
        Setting,
        Option<&'static str>,
        Option<usize>,
    );
    let cases: Vec<Case> = vec![
        (Relay::builder("x.db"), Setting::Consumers, None, None),
        (one().workers(0), Setting::Workers, None, None),
        (one().workers(MAX_WORKERS + 1), Setting::Workers, None, None),
        (one().batch_size(0), Setting::BatchSize, None, None),
        (
            one().batch_size(MAX_BATCH_SIZE + 1),
            Setting::BatchSize,
            None,
            None,
        ),
        (one().batch_bytes(0), Setting::BatchBytes, None, None),
        (
            one().max_payload_bytes(0),
            Setting::MaxPayloadBytes,
            None,
            None,
        ),
        (
            one().max_payload_bytes(outboxd::relay::MAX_PAYLOAD_BYTES + 1),
            Setting::MaxPayloadBytes,
            None,
            None,
        ),
        (
            one().lease(Duration::from_millis(10)),
            Setting::Lease,
            None,
            None,
        ),
        (
            one().poll_interval(Duration::ZERO),
            Setting::PollInterval,
            None,
            None,
        ),
        (
            one().flush_interval(Duration::MAX),
            Setting::FlushInterval,
            None,
            None,
        ),
        (
            one().housekeeping_interval(Duration::MAX),
            Setting::HousekeepingInterval,
            None,
            None,
        ),
        (
            one().stale_after(Duration::ZERO),
            Setting::StaleAfter,
            None,
            None,
        ),
        (
            one().retry_policy(quick.clone().max_attempts(0)),
            Setting::RetryMaxAttempts,
            None,
            None,
        ),
        (
            one().purge(Some(no_batch)),
            Setting::PurgeBatchSize,
            None,
            None,
        ),
        (
            Relay::builder("x.db")
                .consumer("a", ["a.b.v1"], noop)
                .consumer("b", ["a.b.v1", "Bad"], noop),
            Setting::ConsumerTypes,
            Some("b"),
            Some(1),
        ),
        (
            Relay::builder("x.db").consumer("a", ["article.created"], noop),
            Setting::ConsumerTypes,
            Some("a"),
            Some(0),
        ),
        (
            Relay::builder("x.db").consumer("a", Vec::<String>::new(), noop),
            Setting::ConsumerTypes,
            Some("a"),
            None,
        ),
        (
            Relay::builder("x.db").consumer("a b", ["a.b.v1"], noop),
            Setting::ConsumerName,
            Some("a b"),
            None,
        ),
        (
            one().consumer("a", ["a.b.v1"], noop),
            Setting::ConsumerName,
            Some("a"),
            None,
        ),
        (
            one().retry_policy_for("zz", RetryPolicy::default()),
            Setting::RetryPolicyFor,
            Some("zz"),
            None,
        ),
        (
            one().retry_policy_for("a", quick.clone().initial(Duration::ZERO)),
            Setting::RetryInitial,
            Some("a"),
            None,
        ),
        (
            one().retry_policy_for("a", quick.clone().jitter(2.0)),
            Setting::RetryJitter,
            Some("a"),
            None,
        ),
    ];
    for (builder, setting, consumer, index) in cases {
        let err = builder.build().err().expect("build must fail");
        let Error::InvalidSetting(e) = &err else {
            panic!("{err} is not a setting error")
        };
        assert_eq!(
            (e.setting(), e.consumer(), e.index()),
            (setting, consumer, index),
            "{err}"
        );
        assert!(err.to_string().contains(setting.as_str()), "{err}");
        assert!(!e.reason().is_empty());
    }
    // A duplicate name points at the second registration.
    let Err(Error::InvalidSetting(e)) = one().consumer("a", ["a.b.v1"], noop).build() else {
        panic!("a duplicate name must fail")
    };
    assert_eq!(e.consumer_position(), Some(1));
    assert!(e.reason().contains("registered twice"), "{e}");
}

#[test]
fn shutdown_finishes_in_flight_deliveries_and_releases_the_rest() {
    let db = TestDb::new();
    let gate = Gate::new();
    let done = Recorder::default();
    let (held, rec) = (gate.clone(), done.consumer());
    let relay = db
        .relay()
        .consumer("slow", ["a.b.v1"], move |d: &Delivery| {
            held.hold();
            rec(d)
        })
        .workers(1)
        .started();
    db.enqueue(&(0..5).map(|n| event("a.b.v1", n)).collect::<Vec<_>>());
    relay.notify();
    gate.wait_started();
    // One delivery is running; four are claimed and queued. The running
    // one may finish once the shutdown has handed the four queued back.
    let path = db.path.clone();
    let releaser = std::thread::spawn(move || {
        let conn = outboxd::connection::open(&path).unwrap();
        wait_until("queued rows released", LONG, || {
            conn.query_row(
                "SELECT count(*) FROM event_outbox WHERE claim_token IS NULL",
                [],
                |r| r.get::<_, i64>(0),
            )
            .unwrap()
                == 4
        });
        gate.open();
    });
    stop(relay);
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

/// Waits until the relay has made its first write transaction (the claim
/// every relay makes when it starts): from then on, with no notify and
/// housekeeping an hour away, only `PRAGMA data_version` can make it claim
/// again.
fn wait_idle(relay: &outboxd::RelayHandle) {
    wait_until("the relay's first claim", LONG, || {
        relay.metrics().commits >= 1
    });
}

#[test]
fn picks_up_a_commit_from_another_process() {
    if !common::available("python3", &["--version"]) {
        return;
    }
    let db = TestDb::new();
    let (tx, rx) = crossbeam_channel::unbounded();
    let relay = db
        .relay()
        .consumer("a", ["*"], move |d: &Delivery| {
            tx.send(d.envelope.event_type.to_string()).unwrap();
            Outcome::Delivered
        })
        .housekeeping_interval(Duration::from_secs(3600))
        .started();
    wait_idle(&relay);
    let status = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys\n\
             c = sqlite3.connect(sys.argv[1])\n\
             c.execute(\"INSERT INTO event_outbox (event_type, payload) VALUES ('other.process.v1', '{}')\")\n\
             c.commit()",
        ])
        .arg(&db.path)
        .status()
        .unwrap();
    assert!(status.success());
    // The other process has committed and exited: from here only the
    // watch on the -wal file (or the 1 s poll floor) can tell the relay
    // (how soon is benches' business).
    assert_eq!(rx.recv_timeout(LONG).unwrap(), "other.process.v1");
    stop(relay);
}

#[test]
fn picks_up_a_commit_from_another_connection_without_notify() {
    let db = TestDb::new();
    let (tx, rx) = crossbeam_channel::unbounded();
    let relay = db
        .relay()
        .consumer("a", ["a.b.v1"], move |d: &Delivery| {
            tx.send(d.envelope.event_id).unwrap();
            Outcome::Delivered
        })
        .housekeeping_interval(Duration::from_secs(3600))
        .started();
    wait_idle(&relay);
    let id = db.enqueue(&[event("a.b.v1", 1)])[0];
    assert_eq!(rx.recv_timeout(LONG).unwrap(), id);
    stop(relay);
}

#[test]
fn a_second_row_with_a_delivered_event_id_is_not_delivered_again() {
    let db = TestDb::new();
    let rec = Recorder::default();
    let first = event("a.b.v1", 1);
    let twin = event("a.b.v1", 1).event_id(first.id());
    db.enqueue(&[first]);
    let relay = db
        .relay()
        .consumer("a", ["a.b.v1"], rec.consumer())
        .started();
    relay.notify();
    wait_until("first delivered", LONG, || {
        db.count("status = 'delivered'") == 1
    });
    db.enqueue(&[twin]);
    relay.notify();
    wait_until("twin settled", LONG, || {
        db.count("status = 'delivered'") == 2
    });
    stop(relay);
    assert_eq!(rec.len(), 1, "the consumer saw the event id once");
}

#[test]
fn legacy_rows_are_delivered_with_a_stable_id_and_no_dedup() {
    let db = TestDb::new();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    let conn = db.conn();
    for _ in 0..2 {
        conn.execute(
            "INSERT INTO event_outbox (event_type, payload) VALUES ('legacy.thing.v1', '{\"x\":1}')",
            [],
        )
        .unwrap();
    }
    let relay = db
        .relay()
        .consumer("a", ["legacy.*"], move |d: &Delivery| {
            s.lock().unwrap().push((d.envelope.event_id, d.legacy));
            Outcome::Delivered
        })
        .started();
    wait_until("both delivered", LONG, || {
        db.count("status = 'delivered'") == 2
    });
    stop(relay);
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 2, "identical legacy rows are both delivered");
    assert!(seen.iter().all(|(_, legacy)| *legacy));
    assert_ne!(seen[0].0, seen[1].0, "each legacy row has its own id");
    let keys: Vec<String> = conn
        .prepare("SELECT event_key FROM delivered_events ORDER BY outbox_id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(keys, ["#1", "#2"], "progress is kept per row");
}

#[test]
fn malformed_rows_are_dead_lettered_with_their_reason_and_good_rows_go_on() {
    let db = TestDb::new();
    let conn = db.conn();
    let good: Vec<_> = (0..1000).map(|n| event("a.b.v1", n)).collect();
    let bad: &[(&str, &str)] = &[
        ("INSERT INTO event_outbox (event_type, payload) VALUES ('a.b.v1', '{not json')", "payload is not valid JSON"),
        ("INSERT INTO event_outbox (event_type, payload) VALUES ('Not A Type', '{}')", "invalid event type"),
        ("INSERT INTO event_outbox (event_type, event_version, payload) VALUES ('a.b.v2', 1, '{}')", "event_version 1 does not match"),
        ("INSERT INTO event_outbox (event_type, payload) VALUES ('a.b.v1', X'FFFE')", "payload is not valid UTF-8"),
        ("INSERT INTO event_outbox (event_id, event_type, payload) VALUES ('nope', 'a.b.v1', '{}')", "invalid event id"),
        ("INSERT INTO event_outbox (event_type, payload) VALUES (X'C0', '{}')", "event_type is not valid UTF-8"),
        ("INSERT INTO event_outbox (event_type, payload, tenant_id) VALUES ('a.b.v1', '{}', X'6163FF')", "tenant_id is not valid UTF-8"),
    ];
    db.enqueue(&good[..500]);
    for (sql, _) in bad {
        conn.execute(sql, []).unwrap();
    }
    db.enqueue(&good[500..]);
    let rec = Recorder::default();
    let relay = db.relay().consumer("a", ["*"], rec.consumer()).started();
    wait_until("all settled", LONG, || db.count("status = 'pending'") == 0);
    stop(relay);
    assert_eq!(rec.len(), 1000, "every good row delivered");
    assert_eq!(db.count("status = 'dead'"), bad.len() as i64);
    for (sql, needle) in bad {
        let n = db.count(&format!(
            "status = 'dead' AND instr(last_error, '{needle}') > 0"
        ));
        assert_eq!(
            n, 1,
            "row from {sql:?} should be dead with a reason containing {needle:?}"
        );
    }
}

#[test]
fn ordering_keys_hold_commit_order_under_four_workers_with_retries() {
    let db = TestDb::new();
    let order = Arc::new(std::sync::Mutex::new(std::collections::HashMap::<
        String,
        Vec<u64>,
    >::new()));
    let busy = Arc::new(std::sync::Mutex::new(
        std::collections::HashSet::<String>::new(),
    ));
    let (o, b) = (order.clone(), busy.clone());
    let relay = db
        .relay()
        .consumer("ordered", ["a.b.v1"], move |d: &Delivery| {
            let key = d.ordering_key.clone().unwrap_or_default();
            assert!(
                b.lock().unwrap().insert(key.clone()),
                "two deliveries of key {key} at once"
            );
            let n: u64 = d.envelope.payload_as::<serde_json::Value>().unwrap()["n"]
                .as_u64()
                .unwrap();
            // Every third event fails its first attempt.
            let outcome = if n % 3 == 0 && d.attempt == 1 {
                Outcome::retry("first try fails")
            } else {
                o.lock().unwrap().entry(key.clone()).or_default().push(n);
                Outcome::Delivered
            };
            b.lock().unwrap().remove(&key);
            outcome
        })
        .workers(4)
        .retry_policy(
            RetryPolicy::default()
                .initial(Duration::from_millis(1))
                .max_delay(Duration::from_millis(5))
                .jitter(0.0),
        )
        .started();
    let events: Vec<_> = (0..200)
        .map(|n| event("a.b.v1", n).ordering_key(format!("k{}", n % 5)))
        .collect();
    db.enqueue(&events);
    relay.notify();
    wait_until("all delivered", LONG, || {
        db.count("status = 'delivered'") == 200
    });
    stop(relay);
    let order = order.lock().unwrap();
    assert_eq!(order.len(), 5);
    for (key, seq) in order.iter() {
        let mut sorted = seq.clone();
        sorted.sort();
        assert_eq!(seq, &sorted, "key {key} delivered out of commit order");
        assert_eq!(seq.len(), 40);
    }
}

#[test]
fn an_expired_lease_of_a_crashed_relay_is_claimed_again() {
    let db = TestDb::new();
    let clock = ManualClock::new(Timestamp::now().plus(Duration::from_secs(1)));
    db.enqueue(&[event("a.b.v1", 1)]);
    // A relay claimed the row and died.
    let until = clock.now().plus(Duration::from_secs(30)).as_millis();
    db.conn()
        .execute(
            "UPDATE event_outbox SET claim_token = 'crashed', lease_until = ?1, available_at = ?1",
            [until],
        )
        .unwrap();
    let rec = Recorder::default();
    let relay = db
        .relay()
        .consumer("a", ["a.b.v1"], rec.consumer())
        .clock(clock.clone())
        .started();
    // Let it look at least twice while the lease lives.
    let commits = relay.metrics().commits;
    relay.notify();
    wait_until("a claim attempt", LONG, || {
        relay.metrics().commits > commits
    });
    relay.notify();
    wait_until("another claim attempt", LONG, || {
        relay.metrics().commits > commits + 1
    });
    assert_eq!(rec.len(), 0, "a live lease is respected");
    clock.advance(Duration::from_secs(31));
    wait_until("delivered after expiry", LONG, || rec.len() == 1);
    stop(relay);
    assert_eq!(db.count("status = 'delivered'"), 1);
}

#[test]
fn a_worker_whose_lease_was_taken_over_cannot_record_its_outcome() {
    let db = TestDb::new();
    let gate = Gate::new();
    let held = gate.clone();
    let relay = db
        .relay()
        .consumer("slow", ["a.b.v1"], move |_: &Delivery| {
            held.hold();
            Outcome::Delivered
        })
        .started();
    db.enqueue(&[event("a.b.v1", 1)]);
    relay.notify();
    gate.wait_started();
    // Another relay takes the row over (as after an expired lease).
    db.conn()
        .execute("UPDATE event_outbox SET claim_token = 'new-owner'", [])
        .unwrap();
    gate.open();
    wait_until("outcome fenced out", LONG, || {
        relay.metrics().fenced_out == 1
    });
    stop(relay);
    assert_eq!(
        db.count("status = 'pending' AND claim_token = 'new-owner'"),
        1
    );
    assert_eq!(db.scalar::<i64>("SELECT count(*) FROM delivered_events"), 0);
}

#[test]
fn long_deliveries_extend_their_lease_by_heartbeat() {
    let db = TestDb::new();
    let gate = Gate::new();
    let held = gate.clone();
    let relay = db
        .relay()
        .consumer("slow", ["a.b.v1"], move |_: &Delivery| {
            held.hold();
            Outcome::Delivered
        })
        .lease(Duration::from_secs(1))
        .started();
    db.enqueue(&[event("a.b.v1", 1)]);
    relay.notify();
    gate.wait_started();
    let first: i64 = db.scalar("SELECT lease_until FROM event_outbox");
    wait_until("lease extended twice", LONG, || {
        db.scalar::<Option<i64>>("SELECT lease_until FROM event_outbox")
            .unwrap_or(0)
            > first + 900
    });
    gate.open();
    wait_until("delivered", LONG, || db.count("status = 'delivered'") == 1);
    let fenced = relay.metrics().fenced_out;
    stop(relay);
    assert_eq!(
        fenced, 0,
        "the heartbeat kept the lease: the outcome was accepted"
    );
}

#[test]
fn the_stale_alert_counts_old_due_events_but_not_delayed_ones() {
    let db = TestDb::new();
    let (go_tx, go) = crossbeam_channel::unbounded::<()>();
    let relay = db
        .relay()
        .consumer("blocked", ["a.b.v1"], move |_: &Delivery| {
            let _ = go.recv();
            Outcome::Delivered
        })
        .stale_after(Duration::from_secs(60))
        .housekeeping_interval(Duration::from_millis(20))
        .started();
    let ten_min_ago = Timestamp::now().as_millis() - 600_000;
    db.enqueue(&[
        // Taken at once and blocked: holds its key.
        event("a.b.v1", 1).ordering_key("k"),
        // Due ten minutes ago but waiting behind the first: stale.
        event("a.b.v1", 2)
            .ordering_key("k")
            .available_at(Timestamp::from_millis(ten_min_ago)),
        // Delayed on purpose: never stale.
        event("a.b.v1", 3)
            .ordering_key("later")
            .delay(Duration::from_secs(3600)),
    ]);
    relay.notify();
    wait_until("stale alert", LONG, || relay.metrics().stale_events == 1);
    assert!(relay.metrics().oldest_due_ms >= 600_000);
    drop(go_tx);
    stop(relay);
}

#[test]
fn dedup_holds_for_an_event_id_written_in_lower_case() {
    let db = TestDb::new();
    let rec = Recorder::default();
    let first = event("a.b.v1", 1);
    let id = first.id();
    db.enqueue(&[first]);
    let relay = db
        .relay()
        .consumer("a", ["a.b.v1"], rec.consumer())
        .started();
    relay.notify();
    wait_until("first delivered", LONG, || {
        db.count("status = 'delivered'") == 1
    });
    // A foreign producer re-sends the same event, spelling its id in lower case.
    insert_foreign(&db, id.to_string().to_lowercase());
    relay.notify();
    wait_until("twin settled", LONG, || {
        db.count("status = 'delivered'") == 2
    });
    stop(relay);
    assert_eq!(rec.len(), 1, "the consumer saw the event once");
}

/// Regression: rows the claim finishes itself (a twin whose consumers all
/// have its event, a dead letter) can release rows the same claim passed
/// over, and the relay claimed again only after the next commit to the
/// file. Three rows of one event: the second, finished as already
/// delivered, released the third, which then waited for a commit that
/// never came.
#[test]
fn three_rows_of_one_event_are_all_finished_without_another_commit() {
    let db = TestDb::new();
    let rec = Recorder::default();
    let id = outboxd::EventId::new().to_string();
    for spelling in [id.clone(), id.to_lowercase(), id.clone()] {
        insert_foreign(&db, spelling);
    }
    let relay = db.relay().consumer("a", ["*"], rec.consumer()).started();
    wait_until("all three rows finished", LONG, || {
        db.count("status = 'delivered'") == 3
    });
    stop(relay);
    assert_eq!(rec.len(), 1, "the consumer saw the event once");
}

/// Regression: the first row of an ordering key dead-lettered by the claim
/// itself (no consumer for its type, or an invalid type) held the key's
/// later rows back until the next commit to the file.
#[test]
fn an_ordering_key_goes_on_past_a_row_the_claim_dead_letters() {
    for first_type in ["other.thing.v1", "Bad.x.v1"] {
        let db = TestDb::new();
        let rec = Recorder::default();
        for event_type in [first_type, "a.b.v1", "a.b.v1"] {
            db.conn()
                .execute(
                    "INSERT INTO event_outbox (event_id, event_type, payload, ordering_key)
                     VALUES (?1, ?2, '{}', 'k')",
                    [outboxd::EventId::new().to_string(), event_type.to_string()],
                )
                .unwrap();
        }
        let relay = db
            .relay()
            .consumer("a", ["a.*.v1"], rec.consumer())
            .started();
        wait_until("the key's later rows delivered", LONG, || {
            db.count("status = 'delivered'") == 2
        });
        stop(relay);
        assert_eq!(db.count("status = 'dead'"), 1, "{first_type}");
        assert_eq!(rec.len(), 2, "{first_type}");
    }
}

/// Inserts a row of type `a.b.v1` as a foreign producer writes it, with
/// `event_id` as given (any spelling, or NULL for a legacy row).
fn insert_foreign(db: &TestDb, event_id: impl rusqlite::ToSql) {
    db.conn()
        .execute(
            "INSERT INTO event_outbox (event_id, event_type, payload) VALUES (?1, 'a.b.v1', '{}')",
            [event_id],
        )
        .unwrap();
}

/// Deliveries per (consumer, event id) of a recorder.
fn per_id(rec: &Recorder) -> std::collections::HashMap<outboxd::EventId, usize> {
    let mut n = std::collections::HashMap::new();
    for id in rec.ids() {
        *n.entry(id).or_default() += 1;
    }
    n
}

/// Regression (issue 11.4): two rows carrying one event id, both committed
/// before either was claimed, were claimed in one batch and both delivered
/// to every consumer (the ledger had no entry yet for either). Now the
/// second waits until the first is finished, and then finds its consumers
/// in the ledger. The second spells the id in lower case, as a foreign
/// producer may.
#[test]
fn two_rows_of_one_event_in_one_batch_reach_each_consumer_once() {
    let db = TestDb::new();
    let (a, b) = (Recorder::default(), Recorder::default());
    let first = event("a.b.v1", 1);
    let id = first.id();
    db.enqueue(&[first, event("a.b.v1", 2)]);
    insert_foreign(&db, id.to_string().to_lowercase());
    let relay = db
        .relay()
        .consumer("a", ["*"], a.consumer())
        .consumer("b", ["*"], b.consumer())
        .batch_size(16)
        .started();
    wait_until("all three rows finished", LONG, || {
        db.count("status = 'delivered'") == 3
    });
    stop(relay);
    for (name, rec) in [("a", &a), ("b", &b)] {
        assert_eq!(per_id(rec)[&id], 1, "consumer {name} got the event twice");
        assert_eq!(rec.len(), 2, "consumer {name}");
    }
}

/// Issue 11.4, the same with two relays: the first claims its batch and
/// holds it in delivery; the second relay's batch may not take the twin
/// rows meanwhile.
#[test]
fn two_rows_of_one_event_in_two_relays_batches_reach_each_consumer_once() {
    const EVENTS: usize = 8;
    let db = TestDb::new();
    let originals: Vec<_> = (0..EVENTS as u64).map(|n| event("a.b.v1", n)).collect();
    let twins: Vec<_> = originals
        .iter()
        .map(|e| event("a.b.v1", 0).event_id(e.id()))
        .collect();
    db.enqueue(&originals);
    db.enqueue(&twins);
    // Relay 1 claims the first batch (the originals) and its consumer
    // waits until the test lets every delivery go at once.
    let (go_tx, go) = crossbeam_channel::bounded::<()>(0);
    let (a1, a2) = (Recorder::default(), Recorder::default());
    let record_a1 = a1.consumer();
    let first = db
        .relay()
        .consumer("a", ["*"], move |d: &Delivery| {
            let _ = go.recv(); // returns once the sender is dropped
            record_a1(d)
        })
        .batch_size(EVENTS)
        .workers(EVENTS)
        .started();
    wait_until("relay 1 to claim its batch", LONG, || {
        db.count("claim_token IS NOT NULL") >= EVENTS as i64
    });
    let second = db
        .relay()
        .consumer("a", ["*"], a2.consumer())
        .batch_size(EVENTS)
        .started();
    wait_until("relay 2 to make its first claim", LONG, || {
        second.metrics().commits > 0
    });
    let leased_while_both_ran = db.count("claim_token IS NOT NULL");
    drop(go_tx);
    wait_until("every row finished", LONG, || {
        db.count("status = 'delivered'") == 2 * EVENTS as i64
    });
    stop(first);
    stop(second);
    let mut all = per_id(&a1);
    for (id, n) in per_id(&a2) {
        *all.entry(id).or_default() += n;
    }
    assert_eq!(
        leased_while_both_ran, EVENTS as i64,
        "relay 2 claimed twins while relay 1 held their originals"
    );
    assert_eq!(all.len(), EVENTS);
    assert!(
        all.values().all(|n| *n == 1),
        "an event reached consumer a twice: {all:?}"
    );
}

/// Regression (issue 11.10): after a long reader ended, the WAL that had
/// grown behind it stayed at its peak size until the next write (and then
/// shrank only to `journal_size_limit`). Now an idle relay truncates it.
#[test]
fn an_idle_relay_truncates_a_wal_that_a_long_reader_let_grow() {
    let db = TestDb::new();
    let relay = db
        .relay()
        .consumer("a", ["*"], |_: &Delivery| Outcome::Delivered)
        .housekeeping_interval(Duration::from_millis(50))
        .purge(None)
        .started();
    let wal = db.file("app.db-wal");
    let wal_size = || std::fs::metadata(&wal).map_or(0, |m| m.len());
    // A reader holds a snapshot while thousands of events go through.
    let reader = db.conn();
    let snapshot = reader.unchecked_transaction().unwrap();
    let _: i64 = snapshot
        .query_row("SELECT count(*) FROM event_outbox", [], |r| r.get(0))
        .unwrap();
    let pad = "x".repeat(1000);
    for chunk in 0..5u64 {
        let events: Vec<_> = (0..1000)
            .map(|n| {
                outboxd::Event::new(
                    "a.b.v1",
                    &serde_json::json!({ "n": chunk * 1000 + n, "pad": pad }),
                )
                .unwrap()
            })
            .collect();
        db.enqueue(&events);
        relay.notify();
    }
    wait_until("every event delivered", LONG, || {
        db.count("status = 'delivered'") == 5000
    });
    let peak = wal_size();
    assert!(peak > 8 << 20, "the WAL grew to {peak} bytes only");
    snapshot.finish().unwrap();
    drop(reader);
    wait_until("the WAL truncated", LONG, || wal_size() == 0);
    stop(relay);
}
