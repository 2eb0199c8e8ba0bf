//! Transactional consumers (exactly once where the consumer lives in the
//! same file): the consumer's writes commit with its ledger entry under the
//! claim, or not at all. In-process and deterministic: gates hold a
//! delivery where the test needs it, and a second relay with its own
//! ManualClock takes a lease over. The kill -9 loops are in
//! tests/exactly_once.rs.

use crate::common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::relay::{stop, Gate, StartRelay, LONG};
use common::{event, wait_until, Recorder, TestDb};
use outboxd::{Delivery, Event, ManualClock, Outcome, RetryPolicy, Timestamp};
use rusqlite::{Connection, Transaction};

/// A database with an `effects` table: one row per write a consumer made.
fn db() -> TestDb {
    let db = TestDb::new();
    db.conn()
        .execute_batch(
            "CREATE TABLE effects (event_id TEXT NOT NULL, attempt INTEGER NOT NULL, by TEXT);
             CREATE TABLE counts (k TEXT PRIMARY KEY, n INTEGER NOT NULL);",
        )
        .unwrap();
    db
}

/// Writes one `effects` row for the delivery.
fn write_effect(tx: &Connection, d: &Delivery, by: &str) {
    tx.execute(
        "INSERT INTO effects (event_id, attempt, by) VALUES (?1, ?2, ?3)",
        rusqlite::params![d.envelope.event_id.to_string(), d.attempt, by],
    )
    .unwrap();
}

/// Adds one to the count of the payload's key `k`.
fn count(tx: &Connection, d: &Delivery) -> Outcome {
    let k: serde_json::Value = d.envelope.payload_as().unwrap();
    let k = k["k"].as_str().unwrap_or("none").to_string();
    match tx.execute(
        "INSERT INTO counts VALUES (?1, 1) ON CONFLICT (k) DO UPDATE SET n = n + 1",
        [k],
    ) {
        Ok(_) => Outcome::Delivered,
        Err(e) => Outcome::retry(e.to_string()),
    }
}

/// A transactional consumer that counts (see [`count`]) and how often its
/// function ran. Clones share the call count.
#[derive(Clone, Default)]
struct Counter(Arc<AtomicU32>);

impl Counter {
    fn calls(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
}

impl outboxd::TransactionalConsumer for Counter {
    fn deliver(&self, tx: &Transaction<'_>, d: &Delivery) -> Outcome {
        self.0.fetch_add(1, Ordering::SeqCst);
        count(tx, d)
    }
}

/// A relay's clock well past every lease a [`clock`] relay took.
fn later_clock() -> ManualClock {
    ManualClock::new(Timestamp::now().plus(Duration::from_secs(120)))
}

fn keyed(k: &str) -> Event {
    Event::new("a.b.v1", &serde_json::json!({ "k": k })).unwrap()
}

fn effects(db: &TestDb) -> Vec<(String, u32, String)> {
    let conn = db.conn();
    let mut stmt = conn
        .prepare("SELECT event_id, attempt, coalesce(by, '') FROM effects ORDER BY rowid")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn ledger(db: &TestDb, consumer: &str) -> i64 {
    db.scalar(&format!(
        "SELECT count(*) FROM delivered_events WHERE consumer = '{consumer}'"
    ))
}

fn status(db: &TestDb) -> String {
    db.scalar("SELECT status FROM event_outbox")
}

/// A clock a second ahead of the rows' `available_at`, so they are due.
fn clock() -> ManualClock {
    ManualClock::new(Timestamp::now().plus(Duration::from_secs(1)))
}

#[test]
fn a_delivered_transaction_commits_the_writes_with_one_ledger_entry() {
    let db = db();
    let other = Recorder::default();
    let relay = db
        .relay()
        .transactional_consumer("counter", ["a.b.v1"], Counter::default())
        .consumer("other", ["a.b.v1"], other.consumer())
        .workers(2)
        .started();
    let events: Vec<Event> = (0..50).map(|i| keyed(&format!("k{}", i % 5))).collect();
    db.enqueue(&events);
    relay.notify();
    wait_until("every event delivered", LONG, || {
        db.count("status = 'delivered'") == 50
    });
    let m = relay.metrics();
    stop(relay);
    for k in 0..5 {
        let n: i64 = db.scalar(&format!("SELECT n FROM counts WHERE k = 'k{k}'"));
        assert_eq!(n, 10, "key k{k}");
    }
    // One entry per event and consumer: the writer's own insert of the
    // transactional consumer's entry was a no-op, not a second row or a
    // conflict.
    assert_eq!(ledger(&db, "counter"), 50);
    assert_eq!(ledger(&db, "other"), 50);
    assert_eq!((m.errors, m.fenced_out, m.retried), (0, 0, 0));
    assert_eq!(m.per_consumer[0].delivered, 50);
}

#[test]
fn retry_poison_and_panic_leave_no_trace_of_the_consumers_writes() {
    let db = db();
    let clock = clock();
    let relay = db
        .relay()
        .transactional_consumer("flaky", ["a.*.v1"], |tx: &Transaction<'_>, d: &Delivery| {
            write_effect(tx, d, "flaky");
            match (d.envelope.event_type.as_str(), d.attempt) {
                ("a.retry.v1", 1) => Outcome::retry("not yet"),
                ("a.panic.v1", 1) => panic!("the consumer broke"),
                ("a.poison.v1", _) => Outcome::poison("never"),
                _ => Outcome::Delivered,
            }
        })
        .retry_policy(RetryPolicy::default().jitter(0.0))
        .clock(clock.clone())
        .started();
    let ids = db.enqueue(&[
        Event::new("a.retry.v1", &1).unwrap(),
        Event::new("a.panic.v1", &2).unwrap(),
        Event::new("a.poison.v1", &3).unwrap(),
    ]);
    relay.notify();
    wait_until("first attempts recorded", LONG, || {
        db.count("attempts = 1 AND claim_token IS NULL") == 2 && db.count("status = 'dead'") == 1
    });
    // The first attempts wrote, then failed: nothing of theirs remains.
    assert_eq!(effects(&db), vec![], "rolled-back writes are visible");
    assert_eq!(ledger(&db, "flaky"), 0);
    let reason: String =
        db.scalar("SELECT last_error FROM event_outbox WHERE event_type = 'a.panic.v1'");
    assert!(
        reason.contains("consumer panicked: the consumer broke"),
        "{reason}"
    );
    let reason: String =
        db.scalar("SELECT last_error FROM event_outbox WHERE event_type = 'a.poison.v1'");
    assert!(reason.contains("never"), "{reason}");

    // The retries are due after the policy's 30 s.
    clock.advance(Duration::from_secs(31));
    relay.notify();
    wait_until("the retries delivered", LONG, || {
        db.count("status = 'delivered'") == 2
    });
    stop(relay);
    let mut got = effects(&db);
    got.sort();
    let mut want = vec![
        (ids[0].to_string(), 2, "flaky".to_string()),
        (ids[1].to_string(), 2, "flaky".to_string()),
    ];
    want.sort();
    assert_eq!(got, want, "only the second attempts' writes remain");
    assert_eq!(ledger(&db, "flaky"), 2);
}

/// Where relay A's delivery is held while relay B takes the row over.
#[derive(Clone, Copy, PartialEq)]
enum Held {
    /// In a plain consumer that runs before the transactional one.
    Before,
    /// In a plain consumer that runs after it, once it has committed.
    After,
}

/// What each relay ran in [`takeover`].
struct Takeover {
    a_counter: Counter,
    b_counter: Counter,
    b_plain: Recorder,
}

/// Relay A delivers one event to `counter` (transactional) and `plain`,
/// and is held in `plain` (before or after `counter`, as `held` says).
/// Relay B, whose clock is past A's lease (A's clock stands still, so A
/// never heartbeats), takes the row over once A's lock file is gone, and
/// delivers it. Then A goes on,
/// and its late outcome is refused by the fence.
fn takeover(db: &TestDb, held: Held) -> Takeover {
    let gate = Gate::new();
    let a_counter = Counter::default();
    let g = gate.clone();
    let gated = move |_: &Delivery| {
        g.hold();
        Outcome::Delivered
    };
    let a = db.relay();
    let a = match held {
        Held::Before => a
            .consumer("plain", ["a.b.v1"], gated)
            .transactional_consumer("counter", ["a.b.v1"], a_counter.clone()),
        Held::After => a
            .transactional_consumer("counter", ["a.b.v1"], a_counter.clone())
            .consumer("plain", ["a.b.v1"], gated),
    };
    let a = a.workers(1).clock(clock()).started();
    db.enqueue(&[keyed("x")]);
    a.notify();
    gate.wait_started();
    let token_a: String = db.scalar("SELECT claim_token FROM event_outbox");
    // A is alive, so its lease stands whatever B's clock says
    // (docs/liveness.md); without its lock file it is judged by the time
    // rule, as a crashed relay of an older version is.
    std::fs::remove_file(common::peers::lock_file(&db.path, &token_a)).unwrap();
    let expected = i64::from(held == Held::After);
    assert_eq!(
        ledger(db, "counter"),
        expected,
        "A committed before `plain`"
    );
    assert_eq!(status(db), "pending");

    let (b_counter, b_plain) = (Counter::default(), Recorder::default());
    let b = db
        .relay()
        .transactional_consumer("counter", ["a.b.v1"], b_counter.clone())
        .consumer("plain", ["a.b.v1"], b_plain.consumer())
        .clock(later_clock())
        .started();
    b.notify();
    wait_until("B to deliver the row", LONG, || status(db) == "delivered");
    stop(b);
    assert_ne!(
        db.scalar::<Option<String>>("SELECT claim_token FROM event_outbox"),
        Some(token_a)
    );
    gate.open();
    wait_until("A's late outcome refused", LONG, || {
        a.metrics().fenced_out == 1
    });
    stop(a);
    assert_eq!(db.scalar::<i64>("SELECT n FROM counts WHERE k = 'x'"), 1);
    assert_eq!(ledger(db, "counter"), 1);
    Takeover {
        a_counter,
        b_counter,
        b_plain,
    }
}

#[test]
fn a_claim_taken_over_before_the_transaction_begins_commits_nothing() {
    let t = takeover(&db(), Held::Before);
    // A's consumer began after B had finished the row, found the claim
    // gone, and ran nothing.
    assert_eq!(t.a_counter.calls(), 0, "A ran the function");
    assert_eq!(t.b_counter.calls(), 1);
}

/// A crash between the consumer's commit and the writer's record is
/// played by relay A, held after its transactional consumer committed: B's
/// claim reads the ledger and does not run that consumer again.
#[test]
fn a_row_taken_over_after_the_consumers_commit_does_not_run_it_again() {
    let t = takeover(&db(), Held::After);
    assert_eq!(t.a_counter.calls(), 1);
    assert_eq!(t.b_counter.calls(), 0, "B ran the counter again");
    assert_eq!(
        t.b_plain.len(),
        1,
        "B ran the consumer that had not finished"
    );
}

#[test]
fn no_one_can_take_the_claim_while_the_function_runs() {
    let db = db();
    let gate = Gate::new();
    let g = gate.clone();
    let relay = db
        .relay()
        .transactional_consumer(
            "counter",
            ["a.b.v1"],
            move |tx: &Transaction<'_>, d: &Delivery| {
                let outcome = count(tx, d);
                g.hold();
                outcome
            },
        )
        .started();
    db.enqueue(&[keyed("x")]);
    relay.notify();
    gate.wait_started();
    // The function holds SQLite's write lock: a takeover (a write that
    // changes the token) cannot even start.
    let thief = Connection::open(&db.path).unwrap();
    thief.busy_timeout(Duration::ZERO).unwrap();
    let e = thief
        .execute("UPDATE event_outbox SET claim_token = 'thief'", [])
        .unwrap_err();
    assert_eq!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy),
        "{e}"
    );
    // Its writes are not visible before the commit.
    assert_eq!(db.scalar::<i64>("SELECT count(*) FROM counts"), 0);
    gate.open();
    wait_until("the row delivered", LONG, || status(&db) == "delivered");
    stop(relay);
    assert_eq!(db.scalar::<i64>("SELECT n FROM counts WHERE k = 'x'"), 1);
}

#[test]
fn two_rows_with_one_event_id_run_the_consumer_once() {
    let db = db();
    // A foreign producer wrote the same event twice (no idempotency key).
    let id = outboxd::EventId::new().to_string();
    db.conn()
        .execute(
            "INSERT INTO event_outbox (event_id, event_type, payload)
             VALUES (?1, 'a.b.v1', '{\"k\":\"x\"}'), (?1, 'a.b.v1', '{\"k\":\"x\"}')",
            [&id],
        )
        .unwrap();
    let relay = db
        .relay()
        .transactional_consumer("counter", ["a.b.v1"], Counter::default())
        .workers(2)
        .started();
    relay.notify();
    wait_until("both rows delivered", LONG, || {
        db.count("status = 'delivered'") == 2
    });
    stop(relay);
    // Both rows were claimed in one batch, before either had an entry; the
    // check inside the transaction runs the consumer for one of them only.
    assert_eq!(db.scalar::<i64>("SELECT n FROM counts WHERE k = 'x'"), 1);
    assert_eq!(ledger(&db, "counter"), 1);
}

#[test]
fn a_consumer_that_ends_the_transaction_itself_is_dead_lettered_with_nothing_written() {
    let db = db();
    let relay = db
        .relay()
        .transactional_consumer("rogue", ["a.*.v1"], |tx: &Transaction<'_>, d: &Delivery| {
            write_effect(tx, d, "before");
            let end = match d.envelope.event_type.as_str() {
                "a.commit.v1" => "COMMIT; BEGIN",
                _ => "ROLLBACK; BEGIN",
            };
            // The commit is vetoed (its error ignored here, as a careless
            // consumer would); the rollback succeeds. The write after it
            // runs in a transaction of the consumer's own (after ROLLBACK;
            // BEGIN), or on its own and is vetoed too (after the refused
            // COMMIT, BEGIN never ran).
            let _ = tx.execute_batch(end);
            let _ = tx.execute(
                "INSERT INTO effects (event_id, attempt, by) VALUES (?1, 1, 'after')",
                [d.envelope.event_id.to_string()],
            );
            Outcome::Delivered
        })
        .started();
    db.enqueue(&[
        Event::new("a.commit.v1", &1).unwrap(),
        Event::new("a.rollback.v1", &2).unwrap(),
    ]);
    relay.notify();
    wait_until("both dead-lettered", LONG, || {
        db.count("status = 'dead'") == 2
    });
    stop(relay);
    assert_eq!(effects(&db), vec![], "a write survived");
    assert_eq!(ledger(&db, "rogue"), 0);
    let reason: String = db.scalar("SELECT last_error FROM event_outbox LIMIT 1");
    assert!(
        reason.contains("ended outboxd's transaction itself"),
        "{reason}"
    );
}

#[test]
fn follow_up_events_enqueued_inside_commit_with_it_and_vanish_with_a_retry() {
    let db = db();
    let clock = clock();
    let downstream = Recorder::default();
    let relay = db
        .relay()
        .transactional_consumer("chain", ["a.b.v1"], |tx: &Transaction<'_>, d: &Delivery| {
            outboxd::enqueue(tx, &Event::new("a.followed.v1", &d.attempt).unwrap()).unwrap();
            if d.attempt == 1 {
                Outcome::retry("not yet")
            } else {
                Outcome::Delivered
            }
        })
        .consumer("downstream", ["a.followed.v1"], downstream.consumer())
        .retry_policy(RetryPolicy::default().jitter(0.0))
        .clock(clock.clone())
        .started();
    db.enqueue(&[event("a.b.v1", 1)]);
    relay.notify();
    wait_until("the first attempt recorded", LONG, || {
        db.count("attempts = 1 AND claim_token IS NULL") == 1
    });
    assert_eq!(db.count("event_type = 'a.followed.v1'"), 0);
    clock.advance(Duration::from_secs(31));
    relay.notify();
    wait_until("the follow-up delivered", LONG, || downstream.len() == 1);
    stop(relay);
    let attempt: i64 = db.scalar(
        "SELECT json_extract(payload, '$') FROM event_outbox WHERE event_type = 'a.followed.v1'",
    );
    assert_eq!(
        attempt, 2,
        "the follow-up of the rolled-back attempt survived"
    );
}

#[test]
fn savepoints_inside_the_function_are_its_own_business() {
    let db = db();
    let relay = db
        .relay()
        .transactional_consumer(
            "careful",
            ["a.b.v1"],
            |tx: &Transaction<'_>, d: &Delivery| {
                write_effect(tx, d, "kept");
                tx.execute_batch("SAVEPOINT try_it").unwrap();
                write_effect(tx, d, "undone");
                tx.execute_batch("ROLLBACK TO try_it; RELEASE try_it")
                    .unwrap();
                Outcome::Delivered
            },
        )
        .started();
    let ids = db.enqueue(&[event("a.b.v1", 1)]);
    relay.notify();
    wait_until("the row delivered", LONG, || status(&db) == "delivered");
    stop(relay);
    assert_eq!(effects(&db), vec![(ids[0].to_string(), 1, "kept".into())]);
    assert_eq!(ledger(&db, "careful"), 1);
}

/// Where it runs: on a worker thread, on a connection with
/// synchronous=FULL (the writer's is NORMAL). (That the write lock is held
/// meanwhile: no_one_can_take_the_claim_while_the_function_runs.)
#[test]
fn the_function_runs_on_a_worker_with_synchronous_full() {
    let db = db();
    let (seen_tx, seen) = crossbeam_channel::unbounded();
    let relay = db
        .relay()
        .transactional_consumer(
            "where",
            ["a.b.v1"],
            move |tx: &Transaction<'_>, _: &Delivery| {
                let sync: i64 = tx
                    .query_row("PRAGMA synchronous", [], |r| r.get(0))
                    .unwrap();
                let thread = std::thread::current().name().unwrap_or("").to_string();
                seen_tx.send((sync, thread)).unwrap();
                Outcome::Delivered
            },
        )
        .started();
    db.enqueue(&[event("a.b.v1", 1)]);
    relay.notify();
    let (sync, thread) = seen.recv_timeout(LONG).unwrap();
    stop(relay);
    assert_eq!(sync, 2, "synchronous=FULL");
    assert!(thread.starts_with("outboxd-worker-"), "{thread}");
}
