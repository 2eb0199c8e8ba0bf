//! Operator operations: dead letters, replay, purge.

use crate::common;

use std::time::Duration;

use common::relay::StartRelay;
use common::{event, wait_until, Recorder, TestDb};
use outboxd::dead_letter::{self, Selector};
use outboxd::purge::{purge, purge_dry_run, PurgePolicy};
use outboxd::replay::{replay, ReplayFilter};
use outboxd::router::Pattern;
use outboxd::{Delivery, Outcome, Timestamp};

const LONG: Duration = Duration::from_secs(30);

/// Dead-letters `n` events of each type by running a relay whose consumer
/// poisons everything.
fn dead_letters(db: &TestDb, types: &[&str], n: u64) {
    let events: Vec<_> = types
        .iter()
        .flat_map(|t| (0..n).map(move |i| event(t, i)))
        .collect();
    db.enqueue(&events);
    let relay = db
        .relay()
        .consumer("strict", ["*"], |_: &Delivery| {
            Outcome::poison("bad payload")
        })
        .started();
    wait_until("dead letters", LONG, || {
        db.count("status = 'dead'") == events.len() as i64
    });
    relay.shutdown(LONG).unwrap();
}

#[test]
fn dead_letters_can_be_listed_shown_requeued_and_discarded() {
    let db = TestDb::new();
    dead_letters(&db, &["order.paid.v1", "user.deleted.v1"], 3);
    let mut conn = db.conn();
    let list = dead_letter::list(&conn, 100).unwrap();
    assert_eq!(list.len(), 6);
    assert!(list[0].reason.as_deref().unwrap().contains("bad payload"));

    let one = dead_letter::show(&conn, &list[0].row_id.to_string()).unwrap();
    assert_eq!(one.payload.as_deref(), Some(r#"{"n":2}"#));
    let by_event_id = dead_letter::show(&conn, list[0].event_id.as_deref().unwrap()).unwrap();
    assert_eq!(by_event_id.row_id, one.row_id);
    assert!(matches!(
        dead_letter::show(&conn, "999"),
        Err(outboxd::Error::NotFound { .. })
    ));

    let now = Timestamp::now();
    let n = dead_letter::requeue(
        &mut conn,
        &Selector::Type(Pattern::parse("order.*").unwrap()),
        now,
    )
    .unwrap();
    assert_eq!(n, 3);
    assert_eq!(
        db.count("status = 'pending' AND attempts = 0 AND finished_at IS NULL"),
        3
    );
    let user = list
        .iter()
        .find(|d| d.event_type == "user.deleted.v1")
        .unwrap();
    let n = dead_letter::requeue(&mut conn, &Selector::One(user.row_id.to_string()), now).unwrap();
    assert_eq!(n, 1);
    assert!(dead_letter::requeue(&mut conn, &Selector::One("424242".into()), now).is_err());
    let n = dead_letter::discard(&mut conn, &Selector::All).unwrap();
    assert_eq!(n, 2);
    assert_eq!(db.count("status = 'dead'"), 0);
    assert_eq!(
        db.count("status = 'pending'"),
        4,
        "discard never touches pending rows"
    );

    // Requeued events are delivered once a consumer takes them.
    let rec = Recorder::default();
    let relay = db
        .relay()
        .consumer("fixed", ["*"], rec.consumer())
        .started();
    wait_until("requeued delivered", LONG, || rec.len() == 4);
    relay.shutdown(LONG).unwrap();
}

#[test]
fn replay_delivers_again_to_one_consumer_only() {
    let db = TestDb::new();
    let ids = db.enqueue(&[event("a.b.v1", 1), event("a.b.v1", 2), event("c.d.v1", 3)]);
    let (a, b) = (Recorder::default(), Recorder::default());
    let start = || {
        db.relay()
            .consumer("a", ["*"], a.consumer())
            .consumer("b", ["*"], b.consumer())
            .started()
    };
    let relay = start();
    wait_until("delivered", LONG, || db.count("status = 'delivered'") == 3);
    relay.shutdown(LONG).unwrap();

    let mut conn = db.conn();
    let filter = ReplayFilter::new("a").event_type(Pattern::parse("a.*").unwrap());
    assert_eq!(replay(&mut conn, &filter, Timestamp::now()).unwrap(), 2);
    // A name the database has never seen is an error naming the known ones
    // (a typo would otherwise replay nothing, successfully)...
    let typo = replay(&mut conn, &ReplayFilter::new("c"), Timestamp::now()).unwrap_err();
    let outboxd::Error::UnknownConsumer { name, known } = &typo else {
        panic!("expected UnknownConsumer, got {typo}")
    };
    assert_eq!(
        (name.as_str(), known.as_slice()),
        ("c", &["a".to_string(), "b".to_string()][..])
    );
    assert!(typo.to_string().contains("known consumers: a, b"), "{typo}");
    // ...unless the caller knows it (a configured consumer with no deliveries yet).
    let configured = ReplayFilter::new("c").known_consumers(["a", "b", "c"]);
    assert_eq!(replay(&mut conn, &configured, Timestamp::now()).unwrap(), 0);
    let by_id = ReplayFilter::new("b").ids([ids[2]]);
    assert_eq!(replay(&mut conn, &by_id, Timestamp::now()).unwrap(), 1);
    let relay = start();
    wait_until("replayed", LONG, || {
        db.count("status = 'delivered'") == 3 && a.len() == 5 && b.len() == 4
    });
    relay.shutdown(LONG).unwrap();
    let a_ids = a.ids();
    assert_eq!(a_ids.iter().filter(|i| **i == ids[0]).count(), 2);
    assert_eq!(
        a_ids.iter().filter(|i| **i == ids[2]).count(),
        1,
        "c.d not replayed to a"
    );
    assert_eq!(b.ids().iter().filter(|i| **i == ids[2]).count(), 2);
}

/// Regression (issue 11.1): a replay put the row back for every consumer
/// without a ledger entry, so a consumer added since the delivery got the
/// event too, and a replayed dead letter ran the consumer that had rejected
/// it again (and left the dead letters if it now passed). Now the replay
/// runs the consumer it names, and the row gets its status back.
#[test]
fn a_replay_runs_only_the_named_consumer_and_a_dead_letter_stays_dead() {
    let db = TestDb::new();
    let ids = db.enqueue(&[event("a.b.v1", 1), event("bad.b.v1", 2)]);
    let (a, newcomer, strict) = (
        Recorder::default(),
        Recorder::default(),
        Recorder::default(),
    );
    let strict_seen = strict.seen.clone();
    let relay = db
        .relay()
        .consumer("a", ["*"], a.consumer())
        .consumer("strict", ["bad.*"], move |d: &Delivery| {
            strict_seen
                .lock()
                .unwrap()
                .push((d.envelope.event_id, d.attempt));
            Outcome::poison("bad payload")
        })
        .started();
    wait_until("one delivered, one dead", LONG, || {
        db.count("status = 'delivered'") == 1 && db.count("status = 'dead'") == 1
    });
    relay.shutdown(LONG).unwrap();

    let filter = ReplayFilter::new("a");
    assert_eq!(
        replay(&mut db.conn(), &filter, Timestamp::now()).unwrap(),
        2
    );
    // The next relay has a consumer more, which takes every type.
    let relay = db
        .relay()
        .consumer("a", ["*"], a.consumer())
        .consumer("newcomer", ["*"], newcomer.consumer())
        .consumer("strict", ["bad.*"], strict.consumer())
        .started();
    wait_until("the replays", LONG, || {
        db.count("status = 'pending'") == 0 && a.len() == 4
    });
    relay.shutdown(LONG).unwrap();
    assert_eq!(newcomer.len(), 0, "a replay to a ran newcomer too");
    assert_eq!(strict.len(), 1, "a replay to a ran strict again");
    assert_eq!(db.count("status = 'delivered'"), 1);
    let dead = outboxd::dead_letter::show(&db.conn(), &ids[1].to_string()).unwrap();
    assert!(
        dead.reason.unwrap().contains("bad payload"),
        "the dead letter keeps its reason"
    );
    assert_eq!(
        db.count("replay_consumers IS NOT NULL OR status_before_replay IS NOT NULL"),
        0
    );
}

#[test]
fn purge_removes_only_what_is_past_retention_and_never_pending_or_dead() {
    let db = TestDb::new();
    db.enqueue(&(0..10).map(|n| event("a.b.v1", n)).collect::<Vec<_>>());
    let conn = db.conn();
    let day = 86_400_000i64;
    let now = Timestamp::now().as_millis();
    // Rows 1-4 delivered 8 days ago, 5-6 delivered yesterday, 7-8 dead 30
    // days ago, 9-10 pending (enqueued long ago).
    conn.execute_batch(&format!(
        "UPDATE event_outbox SET status = 'delivered', finished_at = {} WHERE id <= 4;
         UPDATE event_outbox SET status = 'delivered', finished_at = {} WHERE id IN (5, 6);
         UPDATE event_outbox SET status = 'dead', finished_at = {} WHERE id IN (7, 8);
         UPDATE event_outbox SET created_at = 0, available_at = {} WHERE id IN (9, 10);
         INSERT INTO delivered_events SELECT event_id, 'a', id, finished_at FROM event_outbox WHERE status = 'delivered';
         UPDATE delivered_events SET delivered_at = {} WHERE outbox_id = 1;",
        now - 8 * day,
        now - day,
        now - 30 * day,
        now + day,
        now - 15 * day,
    ))
    .unwrap();
    let mut policy = PurgePolicy::default().batch_size(3);
    let mut conn = db.conn();
    let dry = purge_dry_run(&conn, &policy, Timestamp::now()).unwrap();
    assert_eq!((dry.delivered, dry.dead, dry.dedup_entries), (4, 0, 1));
    assert_eq!(db.count("1 = 1"), 10, "a dry run deletes nothing");
    let report = purge(&mut conn, &policy, Timestamp::now()).unwrap();
    assert_eq!(report, dry, "batches of 3 add up to the dry run");
    assert_eq!(db.count("status = 'delivered'"), 2);
    assert_eq!(
        db.count("status = 'dead'"),
        2,
        "dead letters are kept by default"
    );
    assert_eq!(db.count("status = 'pending'"), 2);
    policy.dead_retention = Some(Duration::from_secs(7 * 86_400));
    let report = purge(&mut conn, &policy, Timestamp::now()).unwrap();
    assert_eq!(report.dead, 2);
    assert_eq!(
        db.count("status = 'pending'"),
        2,
        "pending rows are never purged"
    );

    policy.dedup_ttl = Duration::from_secs(86_400);
    let e = purge(&mut conn, &policy, Timestamp::now()).unwrap_err();
    assert!(e.to_string().contains("purge.dedup_ttl"), "{e}");
}

#[test]
fn purge_removes_completed_intents_past_their_retention_and_keeps_open_ones() {
    use outboxd::intents::{self, IntentKey};
    let db = TestDb::new();
    let conn = db.conn();
    for key in ["old", "recent"] {
        let k = IntentKey::system(key).unwrap();
        intents::send(
            &conn,
            &k,
            |_| Ok::<_, String>(None),
            |_| Ok("posted".into()),
        )
        .unwrap();
    }
    intents::record(&conn, &IntentKey::system("open").unwrap()).unwrap();
    let old = Timestamp::now().as_millis() - 40 * 86_400_000;
    conn.execute(
        "UPDATE publish_intents SET completed_at = ?1 WHERE idempotency_key = 'old'",
        [old],
    )
    .unwrap();
    let mut conn = db.conn();
    let report = purge(&mut conn, &PurgePolicy::default(), Timestamp::now()).unwrap();
    assert_eq!(report.intents, 1);
    let left: Vec<String> = conn
        .prepare("SELECT idempotency_key FROM publish_intents ORDER BY idempotency_key")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(left, ["open", "recent"]);
}
