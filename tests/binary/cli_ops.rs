//! Runs the real `outboxd` binary's operator commands (status thresholds,
//! dead, replay, purge, doctor, intents) against states made with the
//! library, and checks their output, exit codes and effect on the database.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::bin::code::{CONFIG, INPUT, OK, PROBLEMS, USAGE};
use common::bin::Outboxd;
use common::{event, wait_until, TestDb};
use outboxd::intents::{self, IntentKey};
use outboxd::{Delivery, Outcome, Relay, Timestamp};
use rusqlite::{params, Connection};

const LONG: Duration = Duration::from_secs(30);
const MINUTE_MS: i64 = 60_000;
const DAY_MS: i64 = 86_400_000;

fn now_ms() -> i64 {
    Timestamp::now().as_millis()
}

/// Makes every pending row of these types dead, as the relay would.
fn kill(db: &TestDb, sql_where: &str) {
    db.conn()
        .execute(
            &format!(
                "UPDATE event_outbox SET status = 'dead', attempts = 3,
                        last_error = 'poison: bad payload', finished_at = ?1
                  WHERE status = 'pending' AND {sql_where}"
            ),
            [now_ms()],
        )
        .unwrap();
}

/// Two completed publish intents, comment/1 completed 40 days ago and
/// comment/2 just now.
fn completed_intents(conn: &Connection) {
    for k in ["comment/1", "comment/2"] {
        let key = IntentKey::system(k).unwrap();
        intents::send(
            conn,
            &key,
            |_| Ok::<_, String>(None),
            |_| Ok("posted".to_string()),
        )
        .unwrap();
    }
    conn.execute(
        "UPDATE publish_intents SET completed_at = ?1 WHERE idempotency_key = 'comment/1'",
        params![now_ms() - 40 * DAY_MS],
    )
    .unwrap();
}

/// Runs a relay with two consumers until every event is delivered.
fn deliver_all(db: &TestDb) {
    let total = db.count("1 = 1");
    let relay = Relay::builder(&db.path)
        .consumer("indexer", ["*"], |_: &Delivery| Outcome::Delivered)
        .consumer("audit", ["*"], |_: &Delivery| Outcome::Delivered)
        .build()
        .unwrap()
        .start()
        .unwrap();
    wait_until("every event delivered", LONG, || {
        db.count("status = 'delivered'") == total
    });
    relay.shutdown(LONG).unwrap();
}

fn ledger(db: &TestDb, consumer: &str) -> i64 {
    db.conn()
        .query_row(
            "SELECT count(*) FROM delivered_events WHERE consumer = ?1",
            [consumer],
            |r| r.get(0),
        )
        .unwrap()
}

#[test]
fn status_exits_1_over_the_stale_threshold_and_0_under_it() {
    let db = TestDb::new();
    let ten_minutes_ago = Timestamp::from_millis(now_ms() - 10 * MINUTE_MS);
    db.enqueue(&[event("order.paid.v1", 1).available_at(ten_minutes_ago)]);

    let text = Outboxd::on(&db.path).expect(&["status"], PROBLEMS);
    assert!(text.contains("stale-after"), "{text}");
    assert!(text.contains("more than 5m"), "{text}");
    let s = Outboxd::on(&db.path).json(&["status", "--json"], PROBLEMS);
    assert_eq!(s["healthy"], false, "{s}");
    assert_eq!(s["problems"][0]["threshold"], "stale-after", "{s}");
    assert_eq!(s["counts"]["pending_due"], 1, "{s}");

    let text = Outboxd::on(&db.path).expect(&["status", "--stale-after", "1h"], OK);
    assert!(text.contains("health:           ok"), "{text}");
    let s = Outboxd::on(&db.path).json(&["status", "--json", "--stale-after", "1h"], OK);
    assert_eq!(s["healthy"], true, "{s}");
    assert_eq!(s["problems"], serde_json::json!([]), "{s}");

    Outboxd::on(&db.path).fails(&["status", "--stale-after", "5 minutes"], USAGE, "5m");
}

/// Issue 11.8: an available_at written in microseconds is refused by the
/// schema at INSERT (and UPDATE); one already in the table (a database from
/// before the check, which schema version 5 moved to the last millisecond
/// of year 9999) is reported by `status` (exit 1) and `doctor`, where it
/// was "pending delayed" and healthy.
#[test]
fn status_and_doctor_report_an_event_delayed_by_more_than_a_year() {
    let db = TestDb::new();
    let micros = now_ms() * 1000;
    let refused = db
        .conn()
        .execute(
            "INSERT INTO event_outbox (event_type, available_at) VALUES ('order.paid.v1', ?1)",
            [micros],
        )
        .unwrap_err();
    assert!(
        refused.to_string().contains("not microseconds"),
        "{refused}"
    );
    db.enqueue(&[event("order.paid.v1", 1)]);
    db.conn()
        .execute(
            "UPDATE event_outbox SET available_at = ?1",
            [253_402_300_799_999_i64],
        )
        .unwrap();
    let text = Outboxd::on(&db.path).expect(&["status"], PROBLEMS);
    assert!(
        text.contains("implausible-delay: 1 event is delayed by more than a year")
            && text.contains("microseconds"),
        "{text}"
    );
    let s = Outboxd::on(&db.path).json(&["status", "--json"], PROBLEMS);
    assert_eq!(s["implausible_delays"], 1, "{s}");
    let doctor = Outboxd::on(&db.path).ok(&["doctor"]);
    assert!(
        doctor
            .lines()
            .any(|l| l.starts_with("warning") && l.contains("delayed-events")),
        "{doctor}"
    );
}

#[test]
fn status_exits_1_when_dead_letters_exceed_the_maximum() {
    let db = TestDb::new();
    db.enqueue(&[event("order.paid.v1", 1), event("order.paid.v1", 2)]);
    kill(&db, "1 = 1");

    let text = Outboxd::on(&db.path).expect(&["status"], PROBLEMS);
    assert!(text.contains("max-dead: 2 dead letters"), "{text}");
    assert!(!text.contains("stale-after"), "{text}");
    Outboxd::on(&db.path).expect(&["status", "--max-dead", "1"], PROBLEMS);
    let s = Outboxd::on(&db.path).json(&["status", "--json", "--max-dead", "2"], OK);
    assert_eq!(s["healthy"], true, "{s}");
}

/// Issue 10.14: `status --config` takes the config's [alerts] (and its
/// database); the flags win; the sinks are not built (no secret needed).
#[test]
fn status_takes_its_thresholds_from_the_config() {
    let db = TestDb::new();
    let ten_minutes_ago = Timestamp::from_millis(now_ms() - 10 * MINUTE_MS);
    db.enqueue(&[
        event("order.paid.v1", 1),
        event("order.paid.v1", 2),
        event("order.paid.v1", 3).available_at(ten_minutes_ago),
    ]);
    kill(&db, "json_extract(payload, '$.n') < 3");
    let config = |alerts: &str| {
        db.write(
            "outboxd.toml",
            &format!(
                "database = \"app.db\"\n[alerts]\n{alerts}\n\
                 [[consumer]]\nname = \"hook\"\ntypes = [\"*\"]\n\
                 [consumer.sink]\nkind = \"webhook\"\nurl = \"https://example.com/h\"\n\
                 secret_env = \"STATUS_TEST_UNSET_SECRET\"\n"
            ),
        )
    };
    // The database comes from the config: no --db.
    let status = |config: &std::path::Path, extra: &[&str], code: i32| {
        let mut args = vec!["status", "--config", config.to_str().unwrap()];
        args.extend_from_slice(extra);
        Outboxd::on(&db.path).without_db().expect(&args, code)
    };

    // Without a config: any dead letter, and 5 minutes, are the thresholds.
    let text = Outboxd::on(&db.path).expect(&["status"], PROBLEMS);
    assert!(
        text.contains("max-dead: 2 dead letters (more than 0)"),
        "{text}"
    );
    assert!(text.contains("stale-after"), "{text}");

    let generous = config("stale_after = \"1h\"\nmax_dead = 100");
    let text = status(&generous, &[], OK);
    assert!(text.contains("health:           ok"), "{text}");
    assert!(
        text.contains("dead:             2"),
        "the config's database: {text}"
    );
    // Flags win over the config.
    let text = status(&generous, &["--max-dead", "1"], PROBLEMS);
    assert!(
        text.contains("max-dead: 2 dead letters (more than 1)"),
        "{text}"
    );
    assert!(!text.contains("stale-after"), "{text}");
    status(&generous, &["--stale-after", "1m"], PROBLEMS);

    let strict = config("max_dead = 1");
    let s: serde_json::Value =
        serde_json::from_str(&status(&strict, &["--json"], PROBLEMS)).unwrap();
    let problems: Vec<&str> = s["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["threshold"].as_str().unwrap())
        .collect();
    assert_eq!(problems, ["stale-after", "max-dead"], "{s}");
    // No max_dead in the config: the default, any dead letter, as without one.
    let text = status(&config("stale_after = \"1h\""), &[], PROBLEMS);
    assert!(
        text.contains("max-dead: 2 dead letters (more than 0)"),
        "{text}"
    );
    // One dead letter, in the singular.
    kill(&db, "1 = 1");
    db.conn()
        .execute(
            "DELETE FROM event_outbox WHERE json_extract(payload, '$.n') > 1",
            [],
        )
        .unwrap();
    let text = Outboxd::on(&db.path).expect(&["status"], PROBLEMS);
    assert!(
        text.contains("max-dead: 1 dead letter (more than 0)"),
        "{text}"
    );
    // A config with a mistake is a config error, naming the field.
    let bad = db.write("bad.toml", "[alerts]\nstale_after = \"0s\"\n");
    Outboxd::on(&db.path).fails(
        &["status", "--config", bad.to_str().unwrap()],
        6,
        "alerts.stale_after",
    );
}

#[test]
fn dead_letters_poisoned_by_a_relay_are_listed_and_shown() {
    let db = TestDb::new();
    let ids = db.enqueue(&[event("order.paid.v1", 1), event("user.deleted.v1", 2)]);
    let relay = Relay::builder(&db.path)
        .consumer("strict", ["*"], |_: &Delivery| {
            Outcome::poison("the payload has no customer")
        })
        .build()
        .unwrap()
        .start()
        .unwrap();
    wait_until("two dead letters", LONG, || {
        db.count("status = 'dead'") == 2
    });
    relay.shutdown(LONG).unwrap();

    let text = Outboxd::on(&db.path).expect(&["dead", "list"], OK);
    assert!(text.contains("order.paid.v1"), "{text}");
    assert!(text.contains("user.deleted.v1"), "{text}");
    assert!(text.contains("the payload has no customer"), "{text}");
    let list = Outboxd::on(&db.path).json(&["dead", "list", "--json", "--limit", "1"], OK);
    assert_eq!(list["dead_letters"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(
        (&list["total"], &list["shown"]),
        (&2.into(), &1.into()),
        "{list}"
    );
    // The text says what the limit left out.
    let text = Outboxd::on(&db.path).expect(&["dead", "list", "--limit", "1"], OK);
    assert_eq!(text.lines().count(), 3, "header, one row, the rest: {text}");
    assert!(
        text.lines()
            .last()
            .unwrap()
            .starts_with("1 more not shown (the newest 1 of 2); use --limit 2"),
        "{text}"
    );
    let all = Outboxd::on(&db.path).expect(&["dead", "list"], OK);
    assert!(!all.contains("more not shown"), "{all}");

    // By event id and by row id: reason, attempts and payload.
    let text = Outboxd::on(&db.path).expect(&["dead", "show", &ids[0].to_string()], OK);
    assert!(text.contains("the payload has no customer"), "{text}");
    assert!(text.contains("attempts:"), "{text}");
    assert!(text.contains(r#"{"n":1}"#), "{text}");
    let row_id: i64 = db.scalar(&format!(
        "SELECT id FROM event_outbox WHERE event_id = '{}'",
        ids[1]
    ));
    let one = Outboxd::on(&db.path).json(&["dead", "show", &row_id.to_string(), "--json"], OK);
    assert_eq!(one["event_id"], ids[1].to_string(), "{one}");
    assert_eq!(one["payload"], r#"{"n":2}"#, "{one}");
    assert!(one["reason"].as_str().unwrap().contains("no customer"));

    // 10.15: an event id in lower case finds the row, whichever case the
    // producer stored it in (the SQL contract accepts lower case).
    let lower = ids[0].to_string().to_lowercase();
    let text = Outboxd::on(&db.path).expect(&["dead", "show", &lower], OK);
    assert!(text.contains(&ids[0].to_string()), "{text}");
    let foreign = "01jdq7x6zb5n4q2w8v1k3m9t0r";
    db.conn()
        .execute(
            "INSERT INTO event_outbox (event_id, event_type, payload, status, last_error, finished_at)
             VALUES (?1, 'order.paid.v1', 'null', 'dead', 'poison: legacy', 1)",
            [foreign],
        )
        .unwrap();
    for id in [foreign.to_string(), foreign.to_uppercase()] {
        let text = Outboxd::on(&db.path).expect(&["dead", "show", &id], OK);
        assert!(text.contains("poison: legacy"), "{id}: {text}");
    }

    // `dead list` shows a long reason's start, which says what happened,
    // cut at its end; `dead show` has it whole.
    db.conn()
        .execute(
            "UPDATE event_outbox SET last_error = ?1 WHERE event_id = ?2",
            [
                format!(
                    "webhook https://hooks.example.com/x answered 500: {} THE CAUSE",
                    "x".repeat(200)
                ),
                foreign.to_string(),
            ],
        )
        .unwrap();
    let text = Outboxd::on(&db.path).expect(&["dead", "list"], OK);
    let line = text.lines().find(|l| l.contains(foreign)).unwrap();
    assert!(line.ends_with("xxx…"), "{line}");
    assert!(
        line.contains("webhook https://hooks.example.com/x answered 500: xxx"),
        "{line}"
    );
    assert!(
        text.ends_with("`outboxd dead show ROW` shows a dead letter whole\n"),
        "{text}"
    );

    // Not found: a clear message and exit code 5.
    Outboxd::on(&db.path).fails(&["dead", "show", "999"], INPUT, "not found");
    Outboxd::on(&db.path).fails(&["dead", "show", "not-an-id"], INPUT, "not-an-id");
}

/// 10.15: `dead edit` repairs a row a producer wrote that the relay could
/// not read, checked as the relay checks a row, then requeues it; a repair
/// that leaves the row unreadable changes nothing.
/// Producer-written text with line breaks, ANSI escapes and a BEL is shown
/// escaped by `dead list` and `dead show` (one table row per dead letter,
/// nothing that drives the terminal), and an event id stored as a blob is
/// shown as invalid, in hex, not as a legacy row's "-".
#[test]
fn dead_list_and_show_escape_what_producers_wrote() {
    let db = TestDb::new();
    db.conn()
        .execute(
            "INSERT INTO event_outbox (event_id, event_type, tenant_id, status, attempts,
                 last_error, finished_at, payload)
             VALUES (CAST('01JDQ7X6ZB5N4Q2W8V1K3M9T0R' AS BLOB),
                     'order.placed.v1\n\x1b[31mFAKE ROW\x1b[0m', 't\x07nt', 'dead', 1,
                     'invalid row\n\x1b[2Jcleared', ?1, '{not json\x1b]0;title\x07')",
            [now_ms()],
        )
        .unwrap();
    let outboxd = Outboxd::on(&db.path);
    let controls = |s: &str| s.chars().filter(|c| c.is_control() && *c != '\n').count();

    let list = outboxd.ok(&["dead", "list"]);
    assert_eq!(
        list.lines().count(),
        3,
        "a header, one row, and a line saying that the id was cut:\n{list}"
    );
    assert_eq!(controls(&list), 0, "{list:?}");
    assert!(list.contains("\\u{1b}[31mFAKE ROW"), "{list}");

    let show = outboxd.ok(&["dead", "show", "1"]);
    assert_eq!(controls(&show), 0, "{show:?}");
    for line in show.lines().take(7) {
        assert!(
            line.starts_with(|c: char| c.is_ascii_lowercase()),
            "every line is a field of its own: {show}"
        );
    }
    let event_id = show.lines().find(|l| l.starts_with("event id:")).unwrap();
    assert!(
        event_id.contains("x'30314a44") && event_id.contains("invalid"),
        "{event_id}"
    );
    assert!(show.contains("t\\u{7}nt"), "{show}");
    assert!(show.contains("invalid row\\n\\u{1b}[2Jcleared"), "{show}");
}

/// `dead list` keeps its columns aligned whatever the producers wrote: a
/// long event id, type or reason is cut at its end (its start says what it
/// is), with a line pointing to `dead show`; --json has every value whole.
#[test]
fn dead_list_cuts_long_values_at_their_end_and_keeps_its_columns() {
    let db = TestDb::new();
    let long_type = format!("order.{}.v1", "x".repeat(300));
    let reason = format!(
        "invalid row: column created_at is {}, expected milliseconds since 1970",
        "9".repeat(120)
    );
    db.conn()
        .execute(
            "INSERT INTO event_outbox (event_id, event_type, payload, status, attempts,
                 last_error, finished_at)
             VALUES ('01M8TB0000000000000000000A', 'a.b.v1', '{}', 'dead', 1, 'poison: no', ?1),
                    ('not-a-ulid-but-a-very-long-malformed-event-id', ?2, '{}', 'dead', 12,
                     ?3, ?1)",
            params![now_ms(), long_type, reason],
        )
        .unwrap();
    let text = Outboxd::on(&db.path).expect(&["dead", "list"], OK);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    let (header, long, short) = (lines[0], lines[1], lines[2]);
    // Every column starts where its header does.
    for (name, in_long, in_short) in [
        ("EVENT ID", "not-a-ulid", "01M8TB"),
        ("TYPE", "order.xxx", "a.b.v1"),
        ("REASON", "invalid row", "poison: no"),
    ] {
        let col = header.find(name).unwrap();
        let at = |l: &str, s: &str| l[..l.find(s).unwrap()].chars().count();
        assert_eq!(at(long, in_long), col, "{name}:\n{text}");
        assert_eq!(at(short, in_short), col, "{name}:\n{text}");
    }
    assert!(long.contains("not-a-ulid-but-a-very-lon…"), "{long}");
    assert!(
        !long.contains(&"x".repeat(60)),
        "the type is bounded: {long}"
    );
    assert!(
        long.contains("invalid row: column created_at is 999") && long.ends_with("99…"),
        "the reason's start, cut at its end: {long}"
    );
    assert!(long.chars().count() < 200, "{long}");
    assert!(lines[3].contains("`outboxd dead show ROW`"), "{text}");

    // The JSON is the stored values, whole.
    let list = Outboxd::on(&db.path).json(&["dead", "list", "--json"], OK);
    let dead = list["dead_letters"].as_array().unwrap();
    assert_eq!(dead[0]["event_type"], long_type.as_str(), "{list}");
    assert_eq!(dead[0]["reason"], reason.as_str(), "{list}");
    assert_eq!(
        dead[0]["event_id"], "not-a-ulid-but-a-very-long-malformed-event-id",
        "{list}"
    );
    let show = Outboxd::on(&db.path).expect(&["dead", "show", "2"], OK);
    assert!(show.contains(&reason), "{show}");
}

#[test]
fn dead_edit_repairs_a_malformed_row_and_requeues_it() {
    let db = TestDb::new();
    db.conn()
        .execute(
            "INSERT INTO event_outbox (event_id, event_type, payload)
             VALUES ('not-a-ulid', 'order.placed', '{bad json')",
            [],
        )
        .unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let run_relay = |until: &str| {
        let seen = seen.clone();
        let relay = Relay::builder(&db.path)
            .consumer("indexer", ["*"], move |d: &Delivery| {
                seen.lock().unwrap().push(d.envelope.clone());
                Outcome::Delivered
            })
            .build()
            .unwrap()
            .start()
            .unwrap();
        wait_until(until, LONG, || db.count(until) == 1);
        relay.shutdown(LONG).unwrap();
    };
    run_relay("status = 'dead'");
    let reason: String = db.scalar("SELECT last_error FROM event_outbox");
    assert!(reason.contains("invalid event type"), "{reason}");

    let bin = Outboxd::on(&db.path);
    // Still unreadable (the id, the payload): refused, nothing changed.
    let err = bin.fails(
        &["dead", "edit", "1", "--type", "order.placed.v1"],
        INPUT,
        "not-a-ulid",
    );
    assert!(err.contains("invalid event id"), "{err}");
    let err = bin.fails(
        &[
            "dead",
            "edit",
            "1",
            "--type",
            "order.placed.v1",
            "--new-event-id",
        ],
        INPUT,
        "payload",
    );
    assert!(err.contains("JSON"), "{err}");
    assert_eq!(
        db.count("event_type = 'order.placed' AND event_id = 'not-a-ulid'"),
        1
    );
    // The flags are checked before the database is touched.
    bin.fails(
        &["dead", "edit", "1", "--type", "Order.Placed"],
        USAGE,
        "Order.Placed",
    );
    bin.fails(&["dead", "edit", "1"], USAGE, "--type");
    bin.fails(
        &["dead", "edit", "999", "--type", "a.b.v1"],
        INPUT,
        "not found",
    );
    bin.fails(
        &[
            "dead",
            "edit",
            "1",
            "--payload",
            "\"0123456789\"",
            "--max-payload-bytes",
            "8",
        ],
        INPUT,
        "payload is 12 bytes",
    );

    let out = bin.json(
        &[
            "dead",
            "edit",
            "1",
            "--type",
            "order.placed.v1",
            "--payload",
            "{\"id\": 7}",
            "--new-event-id",
            "--json",
        ],
        OK,
    );
    assert_eq!(out["event_type"], "order.placed.v1", "{out}");
    assert_eq!(out["requeued"], false, "{out}");
    assert_eq!(
        out["changed"],
        serde_json::json!(["event_id", "event_type", "payload"])
    );
    let id = out["event_id"].as_str().unwrap().to_string();
    outboxd::EventId::parse(&id).unwrap();
    assert_eq!(
        db.count("status = 'dead' AND event_version = 1"),
        1,
        "still dead"
    );
    // By its new event id, in lower case: requeue as it is repaired.
    let text = bin.expect(
        &[
            "dead",
            "fix",
            &id.to_lowercase(),
            "--causation-id",
            "cmd-1",
            "--requeue",
        ],
        OK,
    );
    assert!(text.contains("requeued"), "{text}");
    assert_eq!(db.count("status = 'pending' AND attempts = 0"), 1);

    run_relay("status = 'delivered'");
    let seen = seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].event_id.to_string(), id);
    assert_eq!(seen[0].causation_id.as_deref(), Some("cmd-1"));
    assert_eq!(seen[0].payload.get(), "{\"id\": 7}");
}

#[test]
fn dead_requeue_by_id_type_and_all() {
    let db = TestDb::new();
    let ids = db.enqueue(&[
        event("order.paid.v1", 1),
        event("order.paid.v1", 2),
        event("order.refunded.v1", 3),
        event("user.deleted.v1", 4),
        event("user.deleted.v1", 5),
    ]);
    kill(&db, "1 = 1");

    let out = Outboxd::on(&db.path).expect(&["dead", "requeue", &ids[3].to_string()], OK);
    assert_eq!(out, "requeued 1 dead letter\n");
    assert_eq!(
        db.count("status = 'pending' AND attempts = 0 AND finished_at IS NULL"),
        1
    );
    let out = Outboxd::on(&db.path).expect(&["dead", "requeue", "--type", "order.*.v1"], OK);
    assert_eq!(out, "requeued 3 dead letters\n");
    assert_eq!(db.count("status = 'dead'"), 1);
    Outboxd::on(&db.path).fails(&["dead", "requeue", "424242"], INPUT, "not found");
    Outboxd::on(&db.path).fails(&["dead", "requeue"], USAGE, "--all");
    Outboxd::on(&db.path).fails(&["dead", "requeue", "--type", "Order.*"], USAGE, "Order.*");
    let out = Outboxd::on(&db.path).expect(&["dead", "requeue", "--all"], OK);
    assert_eq!(out, "requeued 1 dead letter\n");
    assert_eq!(db.count("status = 'pending'"), 5);
}

#[test]
fn dead_discard_of_several_rows_needs_yes() {
    let db = TestDb::new();
    let ids = db.enqueue(&[
        event("order.paid.v1", 1),
        event("order.paid.v1", 2),
        event("user.deleted.v1", 3),
        event("user.deleted.v1", 4),
        event("audit.logged.v1", 5),
    ]);
    kill(&db, "1 = 1");

    // One row by id needs no confirmation.
    let out = Outboxd::on(&db.path).expect(&["dead", "discard", &ids[0].to_string()], OK);
    assert_eq!(out, "discarded 1 dead letter\n");
    assert_eq!(db.count("1 = 1"), 4);

    // Several rows without --yes: refused, nothing deleted.
    let err = Outboxd::on(&db.path).fails(&["dead", "discard", "--type", "user.*"], INPUT, "--yes");
    assert!(err.contains("2 dead letters"), "{err}");
    Outboxd::on(&db.path).fails(&["dead", "discard", "--all"], INPUT, "--yes");
    assert_eq!(db.count("status = 'dead'"), 4);

    // A pattern matching one row goes through without --yes.
    let out = Outboxd::on(&db.path).expect(&["dead", "discard", "--type", "audit.*"], OK);
    assert_eq!(out, "discarded 1 dead letter\n");
    let out = Outboxd::on(&db.path).expect(&["dead", "discard", "--type", "user.*", "--yes"], OK);
    assert_eq!(out, "discarded 2 dead letters\n");
    Outboxd::on(&db.path).fails(&["dead", "discard", "77777"], INPUT, "not found");
    let out = Outboxd::on(&db.path).expect(&["dead", "discard", "--all", "--yes"], OK);
    assert_eq!(out, "discarded 1 dead letter\n");
    assert_eq!(db.count("1 = 1"), 0);
}

/// A dead letter whose type is not text (bytes that are not UTF-8, as a
/// blob or as text) does not stop the bulk commands: it matches no --type
/// pattern, and --all includes it.
#[test]
fn dead_bulk_commands_act_around_a_type_that_is_not_text() {
    let db = TestDb::new();
    db.conn()
        .execute_batch(
            "INSERT INTO event_outbox (event_id, event_type, payload) VALUES
                 ('01M8TB0000000000000000000A', x'ff', '{}'),
                 ('01M8TB0000000000000000000B', CAST(x'fe6f' AS TEXT), '{}'),
                 ('01M8TB0000000000000000000C', 'order.placed.v1', 'bad'),
                 ('01M8TB0000000000000000000D', 'order.paid.v1', '{}');",
        )
        .unwrap();
    kill(&db, "1 = 1");
    let bin = Outboxd::on(&db.path);

    let out = bin.expect(&["dead", "requeue", "--type", "order.*.v1"], OK);
    assert_eq!(out, "requeued 2 dead letters\n");
    assert_eq!(
        db.count("status = 'pending' AND event_type LIKE 'order.%'"),
        2
    );
    kill(&db, "1 = 1");

    let err = bin.fails(&["dead", "discard", "--type", "order.*"], INPUT, "--yes");
    assert!(err.contains("2 dead letters"), "{err}");
    let out = bin.expect(&["dead", "requeue", "--all"], OK);
    assert_eq!(out, "requeued 4 dead letters\n");
    kill(&db, "1 = 1");

    let err = bin.fails(&["dead", "discard", "--all"], INPUT, "--yes");
    assert!(err.contains("4 dead letters"), "{err}");
    let out = bin.expect(&["dead", "discard", "--all", "--yes"], OK);
    assert_eq!(out, "discarded 4 dead letters\n");
    assert_eq!(db.count("1 = 1"), 0);
}

#[test]
fn replay_by_type_time_range_id_and_all() {
    let db = TestDb::new();
    let at = |s: &str| s.parse::<Timestamp>().unwrap();
    let ids = db.enqueue(&[
        event("article.created.v1", 1).occurred_at(at("2026-01-01T00:00:00Z")),
        event("article.created.v1", 2).occurred_at(at("2026-02-01T00:00:00Z")),
        event("article.deleted.v1", 3).occurred_at(at("2026-03-01T00:00:00Z")),
        event("user.created.v1", 4).occurred_at(at("2026-04-01T00:00:00Z")),
        event("user.created.v1", 5).occurred_at(at("2026-05-01T00:00:00Z")),
        event("user.created.v1", 6).occurred_at(at("2026-06-01T00:00:00Z")),
    ]);
    deliver_all(&db);
    assert_eq!((ledger(&db, "indexer"), ledger(&db, "audit")), (6, 6));

    // A time range: only February's event.
    let out = Outboxd::on(&db.path).run(&[
        "replay",
        "--consumer",
        "indexer",
        "--type",
        "article.*.v1",
        "--since",
        "2026-01-15T00:00:00Z",
        "--until",
        "2026-02-15T00:00:00Z",
    ]);
    assert_eq!(out.status.code(), Some(OK), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "replayed 1 event to consumer indexer\n"
    );
    assert!(out.stderr.is_empty(), "no progress bar off a terminal");
    let row_of = |i: usize| -> String {
        db.scalar(&format!(
            "SELECT status FROM event_outbox WHERE event_id = '{}'",
            ids[i]
        ))
    };
    assert_eq!(row_of(1), "pending");
    assert_eq!(db.count("status = 'pending'"), 1);
    assert_eq!((ledger(&db, "indexer"), ledger(&db, "audit")), (5, 6));

    // By type: the two other article events.
    let out = Outboxd::on(&db.path).expect(
        &["replay", "--consumer", "indexer", "--type", "article.*.v1"],
        OK,
    );
    assert_eq!(out, "replayed 2 events to consumer indexer\n");

    // By id, repeated.
    let out = Outboxd::on(&db.path).expect(
        &[
            "replay",
            "--consumer",
            "indexer",
            "--id",
            &ids[3].to_string(),
            "--id",
            &ids[4].to_string(),
        ],
        OK,
    );
    assert_eq!(out, "replayed 2 events to consumer indexer\n");
    assert_eq!(db.count("status = 'pending'"), 5);

    // Everything delivered to audit.
    let out = Outboxd::on(&db.path).expect(&["replay", "--consumer", "audit", "--all"], OK);
    assert_eq!(out, "replayed 6 events to consumer audit\n");
    assert_eq!((ledger(&db, "indexer"), ledger(&db, "audit")), (1, 0));

    // 10.13: a consumer the database does not know is an error listing the
    // ones it knows (audit has no deliveries left, but replays to it are
    // pending, so it is among them); with --config, the config's consumers
    // are known too.
    let pending = db.count("status = 'pending'");
    let err = Outboxd::on(&db.path).fails(
        &["replay", "--consumer", "indexr", "--all"],
        INPUT,
        "consumer \"indexr\" is not known",
    );
    assert!(err.contains("known consumers: audit, indexer"), "{err}");
    assert!(err.contains("--config FILE"), "{err}");
    assert_eq!(
        db.count("status = 'pending'"),
        pending,
        "nothing was replayed"
    );
    // A second replay to audit while the first is pending: audit is known
    // by the rows awaiting it, and nothing more is left to replay.
    let out = Outboxd::on(&db.path).expect(
        &["replay", "--consumer", "audit", "--type", "article.*.v1"],
        OK,
    );
    assert_eq!(out, "replayed 0 events to consumer audit\n");
    let config = db.write(
        "outboxd.toml",
        "[[consumer]]\nname = \"billing\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = \"billing.jsonl\"\n",
    );
    let c = config.to_str().unwrap();
    Outboxd::on(&db.path).fails(
        &["replay", "--consumer", "billing", "--all"],
        INPUT,
        "consumer \"billing\" is not known",
    );
    let out = Outboxd::on(&db.path).expect(
        &["replay", "--consumer", "billing", "--all", "--config", c],
        OK,
    );
    assert_eq!(out, "replayed 0 events to consumer billing\n");
    assert!(
        !db.file("billing.jsonl").exists(),
        "the config's sinks are not built"
    );

    // No filter and no --all, a bad id, a bad time, an empty range.
    Outboxd::on(&db.path).fails(&["replay", "--consumer", "audit"], USAGE, "--all");
    Outboxd::on(&db.path).fails(
        &["replay", "--consumer", "audit", "--all", "--type", "a.b.v1"],
        USAGE,
        "--all",
    );
    Outboxd::on(&db.path).fails(
        &["replay", "--consumer", "audit", "--id", "nope"],
        USAGE,
        "nope",
    );
    Outboxd::on(&db.path).fails(
        &["replay", "--consumer", "audit", "--since", "yesterday"],
        USAGE,
        "RFC 3339",
    );
    Outboxd::on(&db.path).fails(
        &[
            "replay",
            "--consumer",
            "audit",
            "--since",
            "2026-02-01T00:00:00Z",
            "--until",
            "2026-01-01T00:00:00Z",
        ],
        INPUT,
        "not before",
    );
}

/// Once a consumer's ledger entries are gone with no replay pending (a
/// purge removed them, or a relay delivered a replay's rows to the others
/// only), a replay to it says so rather than that no such consumer exists,
/// and points to --config; the exit code stays 5.
/// `replay --since/--until` take how long ago as well as RFC 3339, the
/// forms the console's replay form takes (`outboxd::clock::parse_time`).
#[test]
fn replay_since_takes_how_long_ago() {
    let db = TestDb::new();
    let ago = |minutes: i64| Timestamp::from_millis(now_ms() - minutes * MINUTE_MS);
    db.enqueue(&[
        event("article.created.v1", 1).occurred_at(ago(180)),
        event("article.created.v1", 2).occurred_at(ago(90)),
        event("article.created.v1", 3).occurred_at(ago(10)),
    ]);
    deliver_all(&db);
    let out = Outboxd::on(&db.path).expect(
        &[
            "replay",
            "--consumer",
            "indexer",
            "--since",
            "2h ago",
            "--until",
            "30m ago",
        ],
        OK,
    );
    assert_eq!(out, "replayed 1 event to consumer indexer\n");
    let out = Outboxd::on(&db.path).expect(&["replay", "--consumer", "audit", "--since", "1h"], OK);
    assert_eq!(out, "replayed 1 event to consumer audit\n");
    let err = Outboxd::on(&db.path).fails(
        &["replay", "--consumer", "audit", "--since", "an hour ago"],
        USAGE,
        "RFC 3339",
    );
    assert!(err.contains("2h ago"), "{err}");
}

#[test]
fn replay_to_a_consumer_whose_records_are_gone_says_why_it_is_unknown() {
    let db = TestDb::new();
    db.enqueue(&[event("a.b.v1", 1), event("a.c.v1", 2)]);
    let bin = Outboxd::on(&db.path);
    let err = bin.fails(&["replay", "--consumer", "j", "--all"], INPUT, "\"j\"");
    assert!(
        err.contains("no consumer has a delivery recorded or a replay pending"),
        "{err}"
    );
    assert!(!err.contains("no consumer is named"), "{err}");

    deliver_all(&db);
    let out = bin.expect(&["replay", "--consumer", "audit", "--type", "a.*.v1"], OK);
    assert_eq!(out, "replayed 2 events to consumer audit\n");
    // Pending: a second replay knows audit and finds nothing more.
    let out = bin.expect(&["replay", "--consumer", "audit", "--type", "a.*.v1"], OK);
    assert_eq!(out, "replayed 0 events to consumer audit\n");
    // The rows go back to delivered and audit's entries stay gone (as
    // after a purge of the ledger).
    db.conn()
        .execute_batch(
            "UPDATE event_outbox SET status = 'delivered', finished_at = 1,
                    replay_consumers = NULL, status_before_replay = NULL;",
        )
        .unwrap();
    let err = bin.fails(
        &["replay", "--consumer", "audit", "--type", "a.*.v1"],
        INPUT,
        "consumer \"audit\" is not known",
    );
    for said in [
        "no delivery to it",
        "purge or replay removed them",
        "known consumers: indexer",
        "--config FILE makes the configured consumers known",
    ] {
        assert!(err.contains(said), "{said}: {err}");
    }
}

#[test]
fn purge_dry_run_counts_and_purge_deletes() {
    let db = TestDb::new();
    db.enqueue(
        &(0..6)
            .map(|i| event("order.paid.v1", i))
            .collect::<Vec<_>>(),
    );
    deliver_all(&db);
    // Age three rows and their ledger entries past the default retentions,
    // and dead-letter one old pending row.
    db.enqueue(&[event("order.paid.v1", 99)]);
    kill(&db, "1 = 1");
    let old = now_ms() - 20 * DAY_MS;
    let conn = db.conn();
    conn.execute(
        "UPDATE event_outbox SET finished_at = ?1 WHERE id IN (1, 2, 3) OR status = 'dead'",
        [old],
    )
    .unwrap();
    conn.execute(
        "UPDATE delivered_events SET delivered_at = ?1 WHERE outbox_id IN (1, 2, 3)",
        [old],
    )
    .unwrap();
    completed_intents(&conn);
    drop(conn);

    let before = db.count("1 = 1");
    let out = Outboxd::on(&db.path).expect(&["purge", "--dry-run"], OK);
    assert!(out.contains("would delete 3 delivered events"), "{out}");
    assert!(out.contains("would delete 6 dedup entries"), "{out}");
    assert!(out.contains("kept every dead letter"), "{out}");
    // 10.15: purge says it deletes completed publish intents too.
    assert!(
        out.contains("would delete 1 completed publish intent (completed over 30d ago)"),
        "{out}"
    );
    let r = Outboxd::on(&db.path).json(
        &["purge", "--dry-run", "--json", "--dead-retention", "10d"],
        OK,
    );
    assert_eq!(
        (
            &r["delivered"],
            &r["dead"],
            &r["dedup_entries"],
            &r["intents"]
        ),
        (&3.into(), &1.into(), &6.into(), &1.into()),
        "{r}"
    );
    let r = Outboxd::on(&db.path).json(
        &["purge", "--dry-run", "--json", "--intent-retention", "1d"],
        OK,
    );
    assert_eq!(r["intents"], 1, "{r}");
    let r = Outboxd::on(&db.path).json(
        &["purge", "--dry-run", "--json", "--intent-retention", "0s"],
        OK,
    );
    assert_eq!(r["intents"], 2, "{r}");
    assert_eq!(db.count("1 = 1"), before, "a dry run deletes nothing");

    let out = Outboxd::on(&db.path).run(&["purge"]);
    assert_eq!(out.status.code(), Some(OK), "{out:?}");
    assert!(out.stderr.is_empty(), "no progress bar off a terminal");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("deleted 3 delivered events"), "{text}");
    assert!(
        text.contains("deleted 1 completed publish intent "),
        "{text}"
    );
    assert_eq!(db.scalar::<i64>("SELECT count(*) FROM publish_intents"), 1);
    assert_eq!(db.count("status = 'delivered'"), 3);
    assert_eq!(db.count("status = 'dead'"), 1, "dead letters are kept");
    assert_eq!(ledger(&db, "indexer") + ledger(&db, "audit"), 6);

    let out = Outboxd::on(&db.path).expect(&["purge", "--dead-retention", "10d"], OK);
    assert!(out.contains("deleted 1 dead letter "), "{out}");
    assert_eq!(db.count("status = 'dead'"), 0);

    // A dedup window shorter than the retention is refused, naming the
    // flags (not the config's fields) and the durations as written.
    let err = Outboxd::on(&db.path).fails(
        &["purge", "--delivered-retention", "2d", "--dedup-ttl", "1d"],
        INPUT,
        "--dedup-ttl: 1d is shorter than --delivered-retention (2d)",
    );
    assert!(!err.contains("purge.delivered_retention"), "{err}");
    Outboxd::on(&db.path).fails(
        &["purge", "--dedup-ttl", "1d"],
        INPUT,
        "--dedup-ttl: 1d is shorter than --delivered-retention (7d, its default)",
    );
    // 10.4: a retention so long that "now minus it" would wrap around into
    // the future (and purge everything) keeps everything.
    let out = Outboxd::on(&db.path).expect(
        &[
            "purge",
            "--delivered-retention",
            "200000000000d",
            "--dedup-ttl",
            "200000000000d",
            "--intent-retention",
            "200000000000d",
        ],
        OK,
    );
    assert!(out.contains("deleted 0 delivered events"), "{out}");
    assert_eq!(db.count("status = 'delivered'"), 3);
    assert_eq!(ledger(&db, "indexer") + ledger(&db, "audit"), 6);
    // A longer retention alone raises the default dedup window with it.
    let out = Outboxd::on(&db.path).expect(&["purge", "--delivered-retention", "30d"], OK);
    assert!(out.contains("dedup entries (over 30d ago)"), "{out}");
}

/// `purge --config` (or OUTBOXD_CONFIG) takes the database and the
/// retentions from the config's [purge], even when `enabled = false` turns
/// the relay's own purge off; the flags win over it; a dedup window the
/// config makes too short is refused naming the config's keys.
#[test]
fn purge_takes_its_database_and_retentions_from_the_config() {
    let db = TestDb::new();
    db.enqueue(
        &(0..4)
            .map(|i| event("order.paid.v1", i))
            .collect::<Vec<_>>(),
    );
    deliver_all(&db);
    // Rows 1 and 2 (and their ledger entries) finished 20 days ago, rows 3
    // and 4 ten days ago.
    let conn = db.conn();
    for (ids, days) in [("1, 2", 20), ("3, 4", 10)] {
        let at = now_ms() - days * DAY_MS;
        conn.execute(
            &format!("UPDATE event_outbox SET finished_at = ?1 WHERE id IN ({ids})"),
            [at],
        )
        .unwrap();
        conn.execute(
            &format!("UPDATE delivered_events SET delivered_at = ?1 WHERE outbox_id IN ({ids})"),
            [at],
        )
        .unwrap();
    }
    drop(conn);
    let config = |name: &str, purge: &str| {
        db.write(
            name,
            &format!(
                "database = \"app.db\"\n[purge]\n{purge}\n\
                 [[consumer]]\nname = \"out\"\ntypes = [\"*\"]\n\
                 [consumer.sink]\nkind = \"jsonl\"\npath = \"-\"\n"
            ),
        )
    };
    let counts = |r: &serde_json::Value| (r["delivered"].clone(), r["dedup_entries"].clone());

    // Without a config, the defaults (7d, 14d).
    let r = Outboxd::on(&db.path).json(&["purge", "--dry-run", "--json"], OK);
    assert_eq!(counts(&r), (4.into(), 4.into()), "{r}");

    // No --db: the database and the retentions are the config's.
    let file = config(
        "outboxd.toml",
        "enabled = false\ndelivered_retention = \"15d\"\ndedup_ttl = \"30d\"",
    );
    let c = file.to_str().unwrap();
    let purge = Outboxd::on(&db.path).without_db();
    let r = purge.json(&["purge", "--dry-run", "--json", "--config", c], OK);
    assert_eq!(counts(&r), (2.into(), 0.into()), "{r}");
    // A flag wins over the config.
    let r = purge.json(
        &[
            "purge",
            "--dry-run",
            "--json",
            "--config",
            c,
            "--delivered-retention",
            "1d",
        ],
        OK,
    );
    assert_eq!(counts(&r), (4.into(), 0.into()), "{r}");
    // OUTBOXD_CONFIG is the same as --config.
    let out = purge
        .command(&["purge"])
        .env("OUTBOXD_CONFIG", &file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(OK), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("deleted 2 delivered events (finished over 15d ago)"),
        "{text}"
    );
    assert!(
        text.contains("deleted 0 dedup entries (over 30d ago)"),
        "{text}"
    );
    assert_eq!(db.count("status = 'delivered'"), 2);

    // Without dedup_ttl in the config, a longer --delivered-retention
    // raises the dedup window with it, as without a config.
    let short = config("short.toml", "delivered_retention = \"10d\"");
    let r = purge.json(
        &[
            "purge",
            "--dry-run",
            "--json",
            "--config",
            short.to_str().unwrap(),
            "--delivered-retention",
            "25d",
        ],
        OK,
    );
    assert_eq!(counts(&r), (0.into(), 0.into()), "{r}");
    // A dedup window shorter than the delivered retention is refused,
    // naming where each came from.
    let c = file.to_str().unwrap();
    purge.fails(
        &["purge", "--config", c, "--dedup-ttl", "1d"],
        INPUT,
        "--dedup-ttl: 1d is shorter than the config's purge.delivered_retention (15d)",
    );
    purge.fails(
        &["purge", "--config", c, "--delivered-retention", "40d"],
        INPUT,
        "the config's purge.dedup_ttl: 30d is shorter than --delivered-retention (40d)",
    );
    // In the config itself, it is the config's error, as for `run`.
    let bad = config(
        "bad.toml",
        "delivered_retention = \"15d\"\ndedup_ttl = \"10d\"",
    );
    purge.fails(
        &["purge", "--config", bad.to_str().unwrap()],
        CONFIG,
        "purge.dedup_ttl: 10d is shorter than purge.delivered_retention (15d)",
    );
    // A config it cannot read is a config error, naming the file.
    let missing = db.path.with_file_name("missing.toml");
    purge.fails(
        &["purge", "--config", missing.to_str().unwrap()],
        CONFIG,
        "missing.toml",
    );
}

/// Every finding of `doctor --json`, by check name.
fn findings(v: &serde_json::Value) -> std::collections::BTreeMap<String, serde_json::Value> {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["check"].as_str().unwrap().to_string(), f.clone()))
        .collect()
}

#[test]
fn doctor_on_a_healthy_database_exits_0() {
    let db = TestDb::new();
    db.enqueue(&[event("order.paid.v1", 1)]);
    let text = Outboxd::on(&db.path).expect(&["doctor"], OK);
    assert!(text.contains("healthy: 0 errors, 0 warnings"), "{text}");
    let v = Outboxd::on(&db.path).json(&["doctor", "--json"], OK);
    assert_eq!(v["healthy"], true, "{v}");
    let f = findings(&v);
    for check in [
        "integrity",
        "schema",
        "journal-mode",
        "wal-size",
        "expired-leases",
        "stale-events",
        "dead-letters",
        "publish-intents",
    ] {
        assert_eq!(f[check]["severity"], "ok", "{check}: {v}");
    }
    assert_eq!(f["synchronous"]["severity"], "note", "{v}");
    Outboxd::on(&db.path).expect(&["doctor", "--quick"], OK);
}

/// `doctor --config` (or OUTBOXD_CONFIG) takes the config's database and
/// [alerts] stale_after, as `status` does; the flags win; a config it
/// cannot read is a "config" finding beside --db, else a config error.
#[test]
fn doctor_takes_its_database_and_stale_threshold_from_the_config() {
    let db = TestDb::new();
    let ten_minutes_ago = Timestamp::from_millis(now_ms() - 10 * MINUTE_MS);
    db.enqueue(&[event("order.paid.v1", 1).available_at(ten_minutes_ago)]);
    let config = db.write(
        "outboxd.toml",
        "database = \"app.db\"\n[alerts]\nstale_after = \"1h\"\n\
         [[consumer]]\nname = \"out\"\ntypes = [\"*\"]\n\
         [consumer.sink]\nkind = \"jsonl\"\npath = \"-\"\n",
    );
    let c = config.to_str().unwrap();
    // No --db: the database is the config's, not ./outboxd.db.
    let doctor = Outboxd::on(&db.path).without_db();
    let v = doctor.json(&["doctor", "--json", "--config", c], OK);
    assert!(v["database"].as_str().unwrap().ends_with("app.db"), "{v}");
    assert_eq!(findings(&v)["stale-events"]["severity"], "ok", "{v}");
    let out = doctor
        .command(&["doctor", "--json"])
        .env("OUTBOXD_CONFIG", &config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(OK), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(findings(&v)["stale-events"]["severity"], "ok", "{v}");
    // The flag wins over the config, and without one 5m is the threshold.
    let v = doctor.json(
        &["doctor", "--json", "--config", c, "--stale-after", "1m"],
        OK,
    );
    assert_eq!(findings(&v)["stale-events"]["severity"], "warning", "{v}");
    let v = Outboxd::on(&db.path).json(&["doctor", "--json"], OK);
    assert_eq!(findings(&v)["stale-events"]["severity"], "warning", "{v}");

    // A config that cannot be read: reported under "config" beside --db...
    let missing = db.path.with_file_name("missing.toml");
    let m = missing.to_str().unwrap();
    let v = Outboxd::on(&db.path).json(&["doctor", "--json", "--config", m], PROBLEMS);
    let f = findings(&v);
    assert_eq!(f["config"]["severity"], "error", "{v}");
    let message = f["config"]["message"].as_str().unwrap();
    assert!(message.contains("missing.toml"), "{v}");
    assert!(!f.contains_key("sink"), "{v}");
    // ...and without --db, where it alone could name the database, an error.
    doctor.fails(&["doctor", "--config", m], CONFIG, "missing.toml");
}

#[test]
fn doctor_reports_expired_leases_dead_letters_and_open_intents() {
    let db = TestDb::new();
    db.enqueue(&[event("order.paid.v1", 1), event("order.paid.v1", 2)]);
    kill(&db, "id = 2");
    let expired = now_ms() - 10 * MINUTE_MS;
    db.conn()
        .execute(
            "UPDATE event_outbox SET claim_token = 'dead-relay', lease_until = ?1,
                    available_at = ?1 WHERE id = 1",
            [expired],
        )
        .unwrap();
    let conn = db.conn();
    let failed = IntentKey::system("mail/1").unwrap();
    let _ = intents::send(
        &conn,
        &failed,
        |_| Ok::<_, String>(None),
        |_| Err("smtp said no".to_string()),
    );
    drop(conn);

    // Warnings only: exit 0, and each finding says what to do.
    let before = std::fs::read(&db.path).unwrap();
    let v = Outboxd::on(&db.path).json(&["doctor", "--json"], OK);
    let f = findings(&v);
    let leases = &f["expired-leases"];
    assert_eq!(leases["severity"], "warning", "{v}");
    assert!(leases["message"].as_str().unwrap().starts_with("1 event"));
    assert!(leases["action"].as_str().unwrap().contains("claimed again"));
    assert_eq!(f["stale-events"]["severity"], "warning", "{v}");
    assert_eq!(f["dead-letters"]["severity"], "warning", "{v}");
    assert!(f["dead-letters"]["action"]
        .as_str()
        .unwrap()
        .contains("outboxd dead list"));
    assert_eq!(f["publish-intents"]["severity"], "warning", "{v}");
    let text = Outboxd::on(&db.path).expect(&["doctor"], OK);
    assert!(text.contains("-> a relay died"), "{text}");
    assert_eq!(
        std::fs::read(&db.path).unwrap(),
        before,
        "doctor reads only"
    );
}

#[test]
fn doctor_reports_a_database_not_in_wal_mode() {
    let db = TestDb::new();
    let conn = Connection::open(&db.path).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode = DELETE", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "delete");
    drop(conn);

    let v = Outboxd::on(&db.path).json(&["doctor", "--json"], PROBLEMS);
    assert_eq!(v["healthy"], false, "{v}");
    let f = findings(&v);
    assert_eq!(f["journal-mode"]["severity"], "error", "{v}");
    assert!(f["journal-mode"]["message"]
        .as_str()
        .unwrap()
        .contains("delete"));
    assert!(f["journal-mode"]["action"]
        .as_str()
        .unwrap()
        .contains("outboxd migrate"));
    // Doctor did not switch it back: it only reads.
    let conn = Connection::open(&db.path).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "delete");
}

#[test]
fn doctor_reports_an_unmigrated_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.db");
    Connection::open(&path)
        .unwrap()
        .execute_batch("CREATE TABLE articles (id INTEGER PRIMARY KEY)")
        .unwrap();
    let v = Outboxd::on(&path).json(&["doctor", "--json"], PROBLEMS);
    let f = findings(&v);
    assert_eq!(f["schema"]["severity"], "error", "{v}");
    assert!(f["schema"]["action"]
        .as_str()
        .unwrap()
        .contains("outboxd migrate"));
    assert!(
        !f.contains_key("dead-letters"),
        "outbox checks need the schema"
    );
}

#[test]
fn doctor_reports_a_corrupt_database_without_panicking() {
    let db = TestDb::new();
    let events: Vec<_> = (0..2000)
        .map(|i| {
            outboxd::Event::new(
                "order.paid.v1",
                &serde_json::json!({ "n": i, "pad": "x".repeat(100) }),
            )
            .unwrap()
        })
        .collect();
    db.enqueue(&events);
    // Fold the WAL into the main file, so a copy of the file alone is whole.
    let conn = db.conn();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    let (root, page_size): (i64, i64) = (
        conn.query_row(
            "SELECT rootpage FROM sqlite_master WHERE name = 'event_outbox'",
            [],
            |r| r.get(0),
        )
        .unwrap(),
        conn.query_row("PRAGMA page_size", [], |r| r.get(0))
            .unwrap(),
    );
    drop(conn);
    let copy = db.dir.path().join("corrupt.db");
    let mut bytes = std::fs::read(&db.path).unwrap();
    // The table's root page: an invalid page type and garbage cell pointers.
    let start = ((root - 1) * page_size) as usize;
    for b in &mut bytes[start..start + 64] {
        *b ^= 0xA5;
    }
    std::fs::write(&copy, &bytes).unwrap();

    let v = Outboxd::on(&copy).json(&["doctor", "--json"], PROBLEMS);
    let f = findings(&v);
    assert_eq!(f["integrity"]["severity"], "error", "{v}");
    let message = f["integrity"]["message"].as_str().unwrap();
    assert!(
        message.contains("damaged") && !message.contains('\n'),
        "{v}"
    );
    assert!(f["integrity"]["action"]
        .as_str()
        .unwrap()
        .contains("backup"));
    let text = Outboxd::on(&copy).expect(&["doctor"], PROBLEMS);
    assert!(text.contains("damaged"), "{text}");
    assert!(text.contains("unhealthy"), "{text}");
}

#[test]
fn intents_list_shows_open_intents_and_purge_deletes_old_completed_ones() {
    let db = TestDb::new();
    let conn = db.conn();
    let pending = IntentKey::tenant("acme", "ticket/7").unwrap();
    intents::record(&conn, &pending).unwrap();
    let failed = IntentKey::system("mail/1").unwrap();
    let e = intents::send(
        &conn,
        &failed,
        |_| Ok::<_, String>(None),
        |_| Err("smtp said no".to_string()),
    );
    assert!(e.is_err());
    completed_intents(&conn);
    drop(conn);

    let text = Outboxd::on(&db.path).expect(&["intents", "list"], OK);
    assert!(text.contains("ticket/7"), "{text}");
    assert!(text.contains("acme"), "{text}");
    assert!(text.contains("smtp said no"), "{text}");
    assert!(
        !text.contains("comment/"),
        "completed ones are not open: {text}"
    );
    let list = Outboxd::on(&db.path).json(&["intents", "list", "--json"], OK);
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 2);
    let statuses: Vec<_> = list.iter().map(|i| i["status"].clone()).collect();
    assert!(statuses.contains(&"pending".into()), "{list:?}");
    assert!(statuses.contains(&"failed".into()), "{list:?}");
    assert!(list[0]["marker"]
        .as_str()
        .unwrap()
        .starts_with(intents::MARKER_PREFIX));

    let out = Outboxd::on(&db.path).expect(&["intents", "purge", "--older-than", "30d"], OK);
    assert!(out.starts_with("deleted 1 completed intent "), "{out}");
    let left: i64 = db.scalar("SELECT count(*) FROM publish_intents");
    assert_eq!(left, 3, "pending, failed and the recent completed one stay");
    Outboxd::on(&db.path).fails(&["intents", "purge"], USAGE, "--older-than");
}

#[test]
fn commands_refuse_an_unmigrated_database_and_a_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.db");
    for args in [
        &["dead", "list"][..],
        &["dead", "requeue", "--all"],
        &["replay", "--consumer", "c", "--all"],
        &["purge"],
        &["doctor"],
        &["intents", "list"],
    ] {
        Outboxd::on(&missing).fails(args, 3, "missing.db");
        assert!(!missing.exists(), "{args:?} created the file");
    }
    let host = dir.path().join("host.db");
    Connection::open(&host)
        .unwrap()
        .execute_batch("CREATE TABLE articles (id INTEGER PRIMARY KEY)")
        .unwrap();
    for args in [
        &["dead", "list"][..],
        &["dead", "discard", "--all", "--yes"],
        &["replay", "--consumer", "c", "--all"],
        &["purge"],
        &["purge", "--dry-run"],
        &["intents", "list"],
        &["intents", "purge", "--older-than", "1d"],
    ] {
        Outboxd::on(&host).fails(args, 4, "outboxd migrate");
    }
    // Nothing switched the host's file to WAL.
    let mode: String = Connection::open(&host)
        .unwrap()
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "delete");
}

#[test]
fn every_operator_command_has_help_with_an_example() {
    let db = TestDb::new();
    for cmd in [
        &["status"][..],
        &["dead"],
        &["dead", "list"],
        &["dead", "show"],
        &["dead", "requeue"],
        &["dead", "discard"],
        &["replay"],
        &["purge"],
        &["doctor"],
        &["intents"],
        &["intents", "list"],
        &["intents", "purge"],
    ] {
        let mut args = cmd.to_vec();
        args.push("--help");
        let help = Outboxd::on(&db.path).expect(&args, OK);
        assert!(help.contains("Example"), "{cmd:?} --help has no example");
        assert!(help.contains("outboxd --db app.db"), "{cmd:?} --help");
    }
    let help = Outboxd::on(&db.path).expect(&["dead", "discard", "--help"], OK);
    assert!(help.contains("--yes"), "{help}");
    assert!(help.contains("Exit code 5"), "{help}");
    let help = Outboxd::on(&db.path).expect(&["status", "--help"], OK);
    assert!(help.contains("Exits 0 when healthy and 1"), "{help}");
}

/// On a terminal, purge draws a progress line on stderr (`\r`-redrawn and
/// erased at the end). Runs under util-linux `script` for a pseudo-terminal.
#[test]
fn purge_shows_progress_on_a_terminal() {
    if !common::available("script", &["-qc", "true", "/dev/null"]) {
        return;
    }
    let db = TestDb::new();
    let conn = db.conn();
    conn.execute_batch(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2500)
         INSERT INTO event_outbox (event_type, status, finished_at)
         SELECT 'order.paid.v1', 'delivered', 1000 FROM n",
    )
    .unwrap();
    drop(conn);
    let line = format!("{} --db {} purge", common::bin::OUTBOXD, db.path.display());
    let out = Command::new("script")
        .args(["-qc", &line, "/dev/null"])
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\rpurging: 1000 delivered"), "{text:?}");
    assert!(text.contains("\r\x1b[K"), "the line is erased: {text:?}");
    assert!(text.contains("deleted 2500 delivered events"), "{text:?}");
    assert_eq!(db.count("1 = 1"), 0);
}
