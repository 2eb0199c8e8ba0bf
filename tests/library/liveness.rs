//! Leases judged by liveness (issue 30 items 1-3, docs/liveness.md): a
//! lease whose owner holds its lock file and beats stands whatever the
//! clocks say; one whose owner ended is taken at once; one whose owner
//! stopped beating, after ten leases; one that names no lock file (an older
//! relay's) by its end time. Other relays and senders are real `Relay` and
//! `Intents` values in this process, or played by the test's own lock
//! files (common::peers).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common;
use common::peers::{lock_dir, Peer};
use common::relay::{stop, Gate, StartRelay, LONG};
use common::{event, wait_until, Recorder, TestDb};
use outboxd::intents::{IntentError, IntentKey, Intents};
use outboxd::{Delivery, ManualClock, Outcome, Timestamp};
use rusqlite::params;

const HOUR: Duration = Duration::from_secs(3600);

/// Leases every pending row under `token`, ending at `until`.
fn lease_all(db: &TestDb, token: &str, until: Timestamp) {
    db.conn()
        .execute(
            "UPDATE event_outbox SET claim_token = ?1, lease_until = ?2, available_at = ?2
              WHERE status = 'pending'",
            params![token, until.as_millis()],
        )
        .unwrap();
}

/// Item 1: relay B's clock is an hour ahead (a step forward) while relay
/// A, in the same process, delivers: A's lease looks an hour expired to B,
/// yet B passes it over, and the event is delivered once.
#[test]
fn two_relays_in_one_process_never_take_a_live_lease_when_the_clock_steps_forward() {
    let db = TestDb::new();
    let gate = Gate::new();
    let (a_got, b_got) = (Recorder::default(), Recorder::default());
    let (g, a_rec) = (gate.clone(), a_got.consumer());
    let a = db
        .relay()
        .consumer("c", ["a.b.v1"], move |d: &Delivery| {
            g.hold();
            a_rec(d)
        })
        .workers(1)
        .started();
    db.enqueue(&[event("a.b.v1", 1)]);
    a.notify();
    gate.wait_started();

    let b = db
        .relay()
        .consumer("c", ["a.b.v1"], b_got.consumer())
        .clock(ManualClock::new(Timestamp::now().plus(HOUR)))
        .started();
    b.notify();
    wait_until("B to claim a few times", LONG, || b.metrics().commits >= 3);
    assert_eq!(b_got.len(), 0, "B took a live relay's lease");
    gate.open();
    wait_until("A's delivery recorded", LONG, || {
        db.count("status = 'delivered'") == 1
    });
    stop(a);
    stop(b);
    assert_eq!((a_got.len(), b_got.len()), (1, 0));
}

/// A relay that ended (kill -9 leaves its lock file, its lock free): its
/// leases, ten minutes from their end, are taken at once, and its lock
/// file is removed once nothing names it.
#[test]
fn the_leases_of_a_relay_that_ended_are_taken_at_once_and_its_file_removed() {
    let db = TestDb::new();
    let ids = db.enqueue(&[event("a.b.v1", 1), event("a.b.v1", 2)]);
    let dead = Peer::ended(&db.path);
    lease_all(
        &db,
        &dead.token(),
        Timestamp::now().plus(Duration::from_secs(600)),
    );
    let got = Recorder::default();
    let relay = db
        .relay()
        .consumer("c", ["a.b.v1"], got.consumer())
        .started();
    wait_until("the dead relay's rows delivered", LONG, || {
        db.count("status = 'delivered'") == 2
    });
    let file = lock_dir(&db.path).join(format!("{}.lock", dead.name));
    wait_until("its lock file removed", LONG, || !file.exists());
    stop(relay);
    assert_eq!(got.ids(), ids);
}

/// A relay that holds its lock but does not beat (SIGSTOP, a hang): its
/// lease, expired by the clock, stands until ten leases pass without a
/// beat on the claimer's monotonic clock; then it is taken (the one
/// repeat without a crash, docs/liveness.md).
#[test]
fn a_stopped_relays_leases_are_taken_only_after_ten_leases_without_a_beat() {
    let db = TestDb::new();
    let stopped_ids = db.enqueue(&[event("a.b.v1", 1)]);
    let stopped = Peer::stopped(&db.path);
    // Its lease has ended by the clock already.
    lease_all(
        &db,
        &stopped.token(),
        Timestamp::from_millis(Timestamp::now().as_millis() - 1000),
    );
    let got = Recorder::default();
    let relay = db
        .relay()
        .consumer("c", ["a.b.v1"], got.consumer())
        .lease(Duration::from_secs(1))
        .started();
    let control = db.enqueue(&[event("a.b.v1", 2)]);
    relay.notify();
    wait_until("the control event delivered", LONG, || got.len() == 1);
    assert_eq!(
        got.ids(),
        control,
        "the stopped relay's lease was taken early"
    );
    wait_until(
        "the stopped relay's row taken after ten leases",
        LONG,
        || got.len() == 2,
    );
    stop(relay);
    assert_eq!(got.ids()[1..], stopped_ids[..]);
    drop(stopped);
}

/// A rolling upgrade: rows leased by an older relay (a bare ULID token,
/// no lock file) end by their end time, as that relay expects, and are not
/// taken before it.
#[test]
fn an_older_relays_leases_end_by_their_time() {
    let db = TestDb::new();
    let now = Timestamp::now();
    let expired = db.enqueue(&[event("a.b.v1", 1)]);
    lease_all(&db, &ulid::Ulid::generate().to_string(), now);
    let current = db.enqueue(&[event("a.b.v1", 2)]);
    db.conn()
        .execute(
            "UPDATE event_outbox SET claim_token = ?1, lease_until = ?2, available_at = ?2
              WHERE status = 'pending' AND claim_token IS NULL",
            params![
                ulid::Ulid::generate().to_string(),
                now.plus(Duration::from_secs(600)).as_millis()
            ],
        )
        .unwrap();
    let got = Recorder::default();
    let relay = db
        .relay()
        .consumer("c", ["a.b.v1"], got.consumer())
        .started();
    let control = db.enqueue(&[event("a.b.v1", 3)]);
    relay.notify();
    wait_until("the expired and the control events", LONG, || {
        got.len() == 2
    });
    stop(relay);
    assert_eq!(got.ids(), [expired[0], control[0]]);
    assert_eq!(
        db.count(&format!(
            "status = 'pending' AND event_id = '{}'",
            current[0]
        )),
        1
    );
}

/// Item 3: a host holds `BEGIN IMMEDIATE` for three leases while two relays
/// deliver: neither can record, both leases run out by the clock, and
/// still no event is delivered twice.
#[test]
fn a_host_holding_the_write_lock_for_three_leases_makes_no_repeat_with_two_relays() {
    const EVENTS: u64 = 200;
    let db = TestDb::new();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let relay = |name: &'static str| {
        let seen = seen.clone();
        db.relay()
            .consumer("c", ["a.b.v1"], move |d: &Delivery| {
                // Deliveries take a while, so some are in flight when the
                // host takes the lock.
                std::thread::sleep(Duration::from_millis(5));
                seen.lock().unwrap().push((name, d.envelope.event_id));
                Outcome::Delivered
            })
            .lease(Duration::from_secs(1))
            .workers(4)
            .started()
    };
    let events: Vec<_> = (0..EVENTS).map(|n| event("a.b.v1", n)).collect();
    db.enqueue(&events);
    let (a, b) = (relay("a"), relay("b"));
    wait_until("some deliveries", LONG, || seen.lock().unwrap().len() >= 20);
    let host = db.conn();
    host.execute_batch("BEGIN IMMEDIATE").unwrap();
    // The attack's own length: three leases under the lock.
    std::thread::sleep(Duration::from_secs(3));
    host.execute_batch("COMMIT").unwrap();
    wait_until("every event delivered", LONG, || {
        db.count("status = 'delivered'") == EVENTS as i64
    });
    stop(a);
    stop(b);
    let seen = seen.lock().unwrap();
    let distinct: HashSet<_> = seen.iter().map(|(_, id)| *id).collect();
    assert_eq!(distinct.len(), EVENTS as usize);
    assert_eq!(seen.len(), EVENTS as usize, "delivered twice");
}

/// Item 2: two senders, the clock stepped forward an hour while the first
/// posts: the second waits for the live sender, and the intent is posted
/// once.
#[test]
fn two_senders_post_once_when_the_clock_steps_forward() {
    let db = TestDb::new();
    let clock = ManualClock::new(Timestamp::now());
    let lease = Duration::from_secs(60);
    let (a, b) = (
        Intents::new().clock(clock.clone()).lease(lease).unwrap(),
        Intents::new().clock(clock.clone()).lease(lease).unwrap(),
    );
    let key = IntentKey::system("ticket/1").unwrap();
    let posts = Mutex::new(0);
    let post = |m: &str| {
        *posts.lock().unwrap() += 1;
        Ok::<_, String>(m.to_owned())
    };
    let (ca, cb) = (db.conn(), db.conn());
    let sent = a
        .send(
            &ca,
            &key,
            |_| Ok::<_, String>(None),
            |m| {
                clock.advance(HOUR);
                let e = b.send(&cb, &key, |_| Ok(None), post).unwrap_err();
                assert!(matches!(e, IntentError::InFlight { .. }), "{e}");
                post(m)
            },
        )
        .unwrap();
    assert!(sent.posted());
    assert_eq!(*posts.lock().unwrap(), 1);
}

/// A sender that ended with its claim standing (kill -9): the next sender
/// takes the claim at once, an hour before its end, and looks up first.
#[test]
fn a_sender_that_ended_leaves_its_claim_to_the_next_at_once() {
    let db = TestDb::new();
    let key = IntentKey::system("ticket/2").unwrap();
    let conn = db.conn();
    outboxd::intents::record(&conn, &key).unwrap();
    let dead = Peer::ended(&db.path);
    conn.execute(
        "UPDATE publish_intents SET attempts = 1, claim_token = ?1, lease_until = ?2",
        params![dead.token(), Timestamp::now().plus(HOUR).as_millis()],
    )
    .unwrap();
    let looked = Mutex::new(false);
    let sent = Intents::new()
        .send(
            &conn,
            &key,
            |_| {
                *looked.lock().unwrap() = true;
                Ok::<_, String>(None)
            },
            |m| Ok(m.to_owned()),
        )
        .unwrap();
    assert!(sent.posted() && *looked.lock().unwrap());
    assert_eq!(sent.intent.attempts, 2);
}
