//! `outboxd run` end to end: the real binary, real sinks (a local HTTP
//! receiver that checks signatures, real child programs, files, stdout),
//! signals, foreign producers writing while it delivers, and every config
//! mistake refused before anything is claimed.
//!
//! Synchronisation is by bounded polling of the database, the output or the
//! receiver's log; never by fixed sleeps.

// The library's sinks (webhook signatures) are checked directly too.
#![cfg(feature = "sinks")]

use crate::common;

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use outboxd::sinks::webhook::{verify, WebhookSecret};
use outboxd::{Event, EventId};
use serde_json::Value;

use common::bin::{code, Outboxd, Running, Sandbox, WAIT};
use common::http::{get, try_request, Answer, Receiver, Request};
use common::{available, wait_until};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const OLD_SECRET: &str = "whsec_dGhpcyBpcyB0aGUgb2xkIHNlY3JldCBrZXkgISE=";

// ---------------------------------------------------------------------------
// Helpers.

/// (status, attempts, last_error) of one event.
fn row(sb: &Sandbox, id: EventId) -> (String, i64, Option<String>) {
    sb.conn()
        .query_row(
            "SELECT status, attempts, last_error FROM event_outbox WHERE event_id = ?",
            [id.to_string()],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap()
}

fn event(ty: &str, payload: Value) -> Event {
    Event::new(ty, &payload).unwrap()
}

/// Nothing may be left leased once outboxd has exited.
fn assert_nothing_leased(sb: &Sandbox) {
    assert_eq!(
        sb.count("claim_token IS NOT NULL OR lease_until IS NOT NULL"),
        0,
        "rows left leased"
    );
}

// ---------------------------------------------------------------------------
// Default run: JSON lines on stdout.

#[test]
fn default_run_writes_each_event_as_a_json_line_to_stdout() {
    // No --db: ./outboxd.db in the working directory is created and migrated.
    let dir = tempfile::tempdir().unwrap();
    let mut run = Outboxd::on(dir.path().join("unused.db"))
        .without_db()
        .spawn(&["--log-format", "json", "run"]);
    run.wait_started();
    let db = dir.path().join("outboxd.db");
    assert!(db.is_file());

    let mut conn = outboxd::connection::open(&db).unwrap();
    let tx = conn.transaction().unwrap();
    let ids: Vec<EventId> = outboxd::enqueue_many(
        &tx,
        &[
            event("article.created.v1", serde_json::json!({"id": 1})),
            event(
                "article.updated.v2",
                serde_json::json!({"id": 2, "text": "café"}),
            ),
            event("user.signed_up.v1", Value::Null),
        ],
    )
    .unwrap()
    .iter()
    .map(|e| e.event_id())
    .collect();
    tx.commit().unwrap();

    wait_until("3 lines on stdout", WAIT, || {
        run.stdout().lines().count() >= 3
    });
    let status = run.stop();
    assert!(status.success(), "{status}: {}", run.stderr());

    let lines: Vec<Value> = run
        .stdout()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    let seen: Vec<String> = lines
        .iter()
        .map(|v| v["event_id"].as_str().unwrap().to_string())
        .collect();
    for id in &ids {
        assert!(seen.contains(&id.to_string()), "{id} not in {seen:?}");
    }
    let updated = lines
        .iter()
        .find(|v| v["event_type"] == "article.updated.v2")
        .unwrap();
    assert_eq!(updated["payload"]["text"], "café");
    // --log-format json: every stderr line is a JSON object.
    for line in run.stderr().lines() {
        let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v.get("level").is_some(), "{line}");
    }
    let delivered: i64 = conn
        .query_row(
            "SELECT count(*) FROM event_outbox WHERE status = 'delivered' AND claim_token IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(delivered, 3);
}

// ---------------------------------------------------------------------------
// Webhooks against a local receiver.

/// What the receiver saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    id: String,
    mode: String,
    signed_new: bool,
    signed_old: bool,
    at: Instant,
}

impl Seen {
    fn of(r: &Request) -> Seen {
        let id = r.header("webhook-id").unwrap_or_default().to_string();
        let ts: i64 = r
            .header("webhook-timestamp")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let sig = r.header("webhook-signature").unwrap_or_default();
        let check = |s: &str| {
            verify(
                WebhookSecret::parse(s).unwrap().as_bytes(),
                &id,
                ts,
                &r.body,
                sig,
            )
            .is_ok()
        };
        let envelope: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
        Seen {
            mode: envelope["payload"]["mode"]
                .as_str()
                .unwrap_or("ok")
                .to_string(),
            signed_new: check(SECRET),
            signed_old: check(OLD_SECRET),
            at: r.at,
            id,
        }
    }
}

/// A webhook receiver. The payload's `mode` decides the answer: `ok` 200;
/// `fail_once` 500 then 200; `retry_after` 429 with Retry-After: 1 then
/// 200; `gone` 410; `slow_once` answers the first request after 3 s (past
/// the sink's timeout), then 200.
fn webhook_receiver() -> Receiver {
    Receiver::start(|req, earlier| {
        let this = Seen::of(req);
        let first = !earlier.iter().any(|e| Seen::of(e).id == this.id);
        match this.mode.as_str() {
            "fail_once" if first => Answer::new("500 Internal Server Error", "ok"),
            "retry_after" if first => {
                Answer::new("429 Too Many Requests", "ok").header("Retry-After", "1")
            }
            "gone" => Answer::new("410 Gone", "ok"),
            "slow_once" if first => {
                thread::sleep(Duration::from_secs(3));
                Answer::new("200 OK", "ok")
            }
            _ => Answer::new("200 OK", "ok"),
        }
    })
}

/// What `rx` saw of event `id`'s requests.
fn requests_for(rx: &Receiver, id: EventId) -> Vec<Seen> {
    let id = id.to_string();
    rx.requests()
        .iter()
        .map(Seen::of)
        .filter(|s| s.id == id)
        .collect()
}

#[test]
fn webhook_deliveries_are_signed_retried_and_dead_lettered_by_status() {
    let sb = Sandbox::migrated();
    let rx = webhook_receiver();
    let config = sb.write(
        "outboxd.toml",
        &format!(
            r#"
[[consumer]]
name = "hook"
types = ["order.*.v1"]
retry = {{ initial = "100ms", max_delay = "2s", max_attempts = 4, jitter = 0.0 }}
[consumer.sink]
kind = "webhook"
url = "{url}"
secrets_env = ["HOOK_SECRET_NEW", "HOOK_SECRET_OLD"]
timeout = "1s"
connect_timeout = "1s"
"#,
            url = rx.url("/hooks")
        ),
    );
    let mut cmd = sb.command(&["run", "--config", config.to_str().unwrap()]);
    cmd.env("HOOK_SECRET_NEW", SECRET)
        .env("HOOK_SECRET_OLD", OLD_SECRET);
    let mut run = Running::spawn(&mut cmd);
    run.wait_started();

    let modes = ["ok", "fail_once", "retry_after", "gone", "slow_once"];
    let events: Vec<Event> = modes
        .iter()
        .map(|m| event("order.placed.v1", serde_json::json!({ "mode": m })))
        .collect();
    let ids = sb.enqueue(&events);
    let id = |mode: &str| ids[modes.iter().position(|m| *m == mode).unwrap()];
    wait_until("every event to be finished", WAIT, || {
        sb.count("status IN ('delivered', 'dead')") == 5
    });
    let status = run.stop();
    assert!(status.success(), "{status}: {}", run.stderr());
    assert_nothing_leased(&sb);

    for m in ["ok", "fail_once", "retry_after", "slow_once"] {
        let (st, _, err) = row(&sb, id(m));
        assert_eq!(st, "delivered", "{m}: {err:?}");
    }
    assert_eq!(requests_for(&rx, id("ok")).len(), 1);
    assert_eq!(
        requests_for(&rx, id("fail_once")).len(),
        2,
        "500 is retried"
    );
    assert_eq!(
        requests_for(&rx, id("slow_once")).len(),
        2,
        "a timeout is retried"
    );
    let ra = requests_for(&rx, id("retry_after"));
    assert_eq!(ra.len(), 2, "429 is retried");
    assert!(
        ra[1].at.duration_since(ra[0].at) >= Duration::from_millis(950),
        "Retry-After: 1 is honoured over the 100ms backoff (up to max_delay 2s): {:?}",
        ra[1].at.duration_since(ra[0].at)
    );
    let (st, _, err) = row(&sb, id("gone"));
    assert_eq!(st, "dead");
    assert!(err.unwrap().contains("410"));
    assert_eq!(requests_for(&rx, id("gone")).len(), 1, "410 is not retried");

    // Every request carried a signature per secret (rotation), and the id
    // stayed the event id across retries.
    let seen: Vec<Seen> = rx.requests().iter().map(Seen::of).collect();
    assert_eq!(seen.len(), 1 + 2 + 2 + 1 + 2);
    for s in seen.iter() {
        assert!(s.signed_new && s.signed_old, "{s:?}");
        assert!(modes.contains(&s.mode.as_str()));
    }
    assert!(!run.stderr().contains(SECRET) && !run.stderr().contains(OLD_SECRET));
}

// ---------------------------------------------------------------------------
// Child programs.

#[test]
fn command_sink_runs_programs_and_reads_their_exit_codes() {
    let sb = Sandbox::migrated();
    let out = sb.file("received");
    std::fs::create_dir(&out).unwrap();
    sb.script(
        "ok.sh",
        &format!(
            "cat > '{}'/\"$OUTBOXD_EVENT_ID.json\"\necho \"$OUTBOXD_EVENT_TYPE $OUTBOXD_ATTEMPT $GREETING\" > '{}'/\"$OUTBOXD_EVENT_ID.env\"",
            out.display(),
            out.display()
        ),
    );
    sb.script("fail.sh", "echo 'boom: the index is down' >&2\nexit 3");
    sb.script("hang.sh", "exec sleep 30");
    sb.script("poison.sh", "echo 'not an order' >&2\nexit 65");
    let consumer = |name: &str, ty: &str, extra: &str| {
        format!(
            r#"
[[consumer]]
name = "{name}"
types = ["{ty}"]
[consumer.sink]
kind = "command"
program = "./{name}.sh"
timeout = "500ms"
{extra}
"#
        )
    };
    let config = sb.write(
        "outboxd.toml",
        &format!(
            "[retry]\ninitial = \"100ms\"\nmax_delay = \"100ms\"\nmax_attempts = 2\njitter = 0.0\n{}{}{}{}",
            consumer("ok", "job.ok.v1", "env = { GREETING = \"hello\" }"),
            consumer("fail", "job.fail.v1", ""),
            consumer("hang", "job.hang.v1", ""),
            consumer("poison", "job.poison.v1", "poison_exit_code = 65"),
        ),
    );
    let mut run = sb.spawn(&["run", "--config", config.to_str().unwrap()]);
    run.wait_started();
    let ids = sb.enqueue(&[
        event("job.ok.v1", serde_json::json!({"n": 1})),
        event("job.fail.v1", serde_json::json!({"n": 2})),
        event("job.hang.v1", serde_json::json!({"n": 3})),
        event("job.poison.v1", serde_json::json!({"n": 4})),
    ]);
    wait_until("every event to be finished", WAIT, || {
        sb.count("status IN ('delivered', 'dead')") == 4
    });
    let status = run.stop();
    assert!(status.success(), "{status}: {}", run.stderr());
    assert_nothing_leased(&sb);

    let (st, _, _) = row(&sb, ids[0]);
    assert_eq!(st, "delivered");
    let stdin: Value = serde_json::from_str(
        &std::fs::read_to_string(out.join(format!("{}.json", ids[0]))).unwrap(),
    )
    .unwrap();
    assert_eq!(stdin["event_id"], ids[0].to_string());
    assert_eq!(stdin["payload"]["n"], 1);
    let env = std::fs::read_to_string(out.join(format!("{}.env", ids[0]))).unwrap();
    assert_eq!(env.trim(), "job.ok.v1 1 hello");

    let (st, attempts, err) = row(&sb, ids[1]);
    assert_eq!(
        (st.as_str(), attempts),
        ("dead", 2),
        "failing program: {err:?}"
    );
    assert!(err.unwrap().contains("boom: the index is down"));

    let (st, attempts, err) = row(&sb, ids[2]);
    assert_eq!(
        (st.as_str(), attempts),
        ("dead", 2),
        "hanging program: {err:?}"
    );
    assert!(err.unwrap().contains("500ms"), "the timeout is the reason");

    let (st, _, err) = row(&sb, ids[3]);
    assert_eq!(st, "dead", "poison: {err:?}");
    let err = err.unwrap();
    assert!(err.contains("65") && err.contains("not an order"), "{err}");
}

#[test]
fn jsonl_file_sink_appends_one_line_per_event() {
    let sb = Sandbox::migrated();
    let config = sb.write(
        "outboxd.toml",
        r#"
[[consumer]]
name = "archive"
types = ["article.*.v1"]
[consumer.sink]
kind = "jsonl"
path = "events.jsonl"
fsync = true
"#,
    );
    let mut run = sb.spawn(&["run", "--config", config.to_str().unwrap()]);
    run.wait_started();
    let events: Vec<Event> = (0..5)
        .map(|n| event("article.created.v1", serde_json::json!({ "n": n })))
        .collect();
    let ids = sb.enqueue(&events);
    let file = sb.file("events.jsonl");
    let lines = || {
        std::fs::read_to_string(&file)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    wait_until("5 lines in events.jsonl", WAIT, || lines().len() == 5);
    wait_until("5 delivered", WAIT, || {
        sb.count("status = 'delivered'") == 5
    });
    assert!(run.stop().success());
    // Workers run in parallel: without an ordering key, lines may come in
    // any order, but each event is there exactly once.
    let mut got: Vec<String> = lines()
        .iter()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["event_id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    got.sort();
    let mut want: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    want.sort();
    assert_eq!(got, want);
    assert!(
        run.stdout().is_empty(),
        "nothing on stdout with a file sink"
    );
}

// ---------------------------------------------------------------------------
// Signals.

#[test]
fn sigterm_mid_run_finishes_in_flight_work_and_leaves_nothing_leased() {
    let sb = Sandbox::migrated();
    sb.script("slow.sh", "sleep 0.3");
    let config = sb.write(
        "outboxd.toml",
        r#"
[relay]
workers = 2
[[consumer]]
name = "slow"
types = ["*"]
[consumer.sink]
kind = "command"
program = "./slow.sh"
"#,
    );
    let mut run = sb.spawn(&["run", "--config", config.to_str().unwrap()]);
    run.wait_started();
    let events: Vec<Event> = (0..20)
        .map(|n| event("job.run.v1", serde_json::json!({ "n": n })))
        .collect();
    sb.enqueue(&events);
    wait_until("a first delivery", WAIT, || {
        sb.count("status = 'delivered'") >= 1
    });
    let status = run.stop();
    assert_eq!(status.code(), Some(0), "{}", run.stderr());
    assert_nothing_leased(&sb);
    let delivered = sb.count("status = 'delivered'");
    assert!(
        delivered < 20,
        "stopped mid-run, yet all {delivered} were delivered"
    );
    assert_eq!(sb.count("status = 'pending'"), 20 - delivered);
    assert_eq!(sb.count("status = 'dead'"), 0);
}

/// 10.4: a `[purge] delivered_retention` so large that "now minus it" once
/// wrapped around into the future (and purged every delivered row and its
/// dedup entries) keeps every row. The relay's housekeeping (a purge batch,
/// then the stale check) runs as it starts; a row due an hour ago behind
/// one of its ordering key held by another relay's live lease (so never
/// claimed here) makes the stale check log, which shows the tick, purge
/// included, has run. The control, a 1s retention, shows this test sees a
/// purge when there is one.
#[test]
fn a_huge_delivered_retention_in_the_config_purges_nothing() {
    for (retention, purged) in [("200000000000d", false), ("1s", true)] {
        let sb = Sandbox::migrated();
        sb.enqueue(&[
            event("order.placed.v1", Value::Null),
            event("order.placed.v1", Value::Null),
            event("order.placed.v1", Value::Null).ordering_key("k"),
            event("order.placed.v1", Value::Null).ordering_key("k"),
        ]);
        let now = outboxd::Timestamp::now().as_millis();
        let (day_ago, hour_ago, in_an_hour) = (now - 86_400_000, now - 3_600_000, now + 3_600_000);
        sb.conn()
            .execute_batch(&format!(
                "UPDATE event_outbox SET status = 'delivered', finished_at = {day_ago} WHERE id < 3;
                 UPDATE event_outbox SET claim_token = 'another-relay', lease_until = {in_an_hour},
                        available_at = {in_an_hour} WHERE id = 3;
                 UPDATE event_outbox SET available_at = {hour_ago} WHERE id = 4;"
            ))
            .unwrap();
        let config = sb.write(
            "outboxd.toml",
            &format!(
                "database = \"app.db\"\n\
                 [purge]\ndelivered_retention = \"{retention}\"\ndedup_ttl = \"{retention}\"\n\
                 [alerts]\nstale_after = \"1s\"\n{BASE_CONSUMER}"
            ),
        );
        let mut run = sb.spawn(&["run", "--config", config.to_str().unwrap()]);
        wait_until("the first housekeeping tick", WAIT, || {
            run.assert_alive();
            run.stderr().contains("stale events")
        });
        assert!(run.stop().success());
        let old_left = sb.count(&format!("status = 'delivered' AND finished_at = {day_ago}"));
        assert_eq!(
            old_left,
            if purged { 0 } else { 2 },
            "retention {retention}"
        );
    }
}

/// `[alerts] max_dead` is checked as the relay starts (then every 30 s),
/// with the same words as `status`.
#[test]
fn run_logs_dead_letters_over_alerts_max_dead() {
    let sb = Sandbox::migrated();
    sb.enqueue(&[
        event("order.placed.v1", Value::Null),
        event("order.placed.v1", Value::Null),
    ]);
    sb.conn()
        .execute(
            "UPDATE event_outbox SET status = 'dead', finished_at = 1",
            [],
        )
        .unwrap();
    let config = sb.write(
        "outboxd.toml",
        &format!("database = \"app.db\"\n[alerts]\nmax_dead = 1\n{BASE_CONSUMER}"),
    );
    let mut run = sb.spawn(&["run", "--config", config.to_str().unwrap()]);
    run.wait_started();
    wait_until("the dead-letter alert", WAIT, || {
        run.stderr().contains("2 dead letters (more than 1)")
    });
    assert!(run.stop().success());
}

/// A thread the system will not start (here: every thread asks for a
/// 128 TiB stack, through std's RUST_MIN_STACK) is outboxd's failure, exit
/// 7, not bad input (5) or the database (3); nothing is claimed.
#[test]
fn a_thread_that_cannot_start_exits_7() {
    let sb = Sandbox::migrated();
    sb.enqueue(&[event("order.placed.v1", Value::Null)]);
    let out = sb
        .command(&["run"])
        .env("RUST_MIN_STACK", (1u64 << 47).to_string())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code::INTERNAL), "{stderr}");
    assert!(
        stderr.contains("cannot install the SIGINT/SIGTERM handler"),
        "{stderr}"
    );
    assert!(
        stderr
            .lines()
            .last()
            .unwrap()
            .starts_with("outboxd: error: "),
        "{stderr}"
    );
    assert_eq!(sb.count("status = 'pending' AND claim_token IS NULL"), 1);
    let help = sb.ok(&["--help"]);
    assert!(help.contains("7  internal error"), "{help}");
}

#[test]
fn a_second_signal_exits_at_once() {
    let sb = Sandbox::migrated();
    let started = sb.file("started");
    sb.script(
        "hang.sh",
        &format!("touch '{}'\nexec sleep 60", started.display()),
    );
    let config = sb.write(
        "outboxd.toml",
        r#"
[relay]
lease = "2m"
shutdown_grace = "50s"
[[consumer]]
name = "hang"
types = ["*"]
[consumer.sink]
kind = "command"
program = "./hang.sh"
timeout = "90s"
"#,
    );
    let mut run = sb.spawn(&["run", "--config", config.to_str().unwrap()]);
    run.wait_started();
    sb.enqueue(&[event("job.run.v1", Value::Null)]);
    wait_until("the program to start", WAIT, || started.exists());
    run.signal("-TERM");
    wait_until("the shutdown to begin", WAIT, || {
        run.stderr().contains("signal received")
    });
    run.signal("-INT");
    // A bounded wait far below the 50 s grace and the 60 s program: an
    // exit within it is the second signal's doing.
    let status = run.wait(Duration::from_secs(10));
    assert_eq!(status.code(), Some(130), "{}", run.stderr());
}

// ---------------------------------------------------------------------------
// Foreign producers.

#[test]
fn python_and_php_producers_write_while_run_delivers() {
    let sb = Sandbox::migrated();
    sb.conn()
        .execute_batch(
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, ref TEXT NOT NULL UNIQUE, total_cents INTEGER NOT NULL)",
        )
        .unwrap();
    let mut run = sb.spawn(&["run"]);
    run.wait_started();
    let contract = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/contract");
    let mut expected = 0;
    let mut producers = Vec::new();
    if available("python3", &["-c", "import sqlite3"]) {
        producers.push(("python3", contract.join("producer.py")));
        // And a stream of small transactions while the relay drains.
        let loop_script = sb.write(
            "loop.py",
            r#"
import json, sqlite3, sys
c = sqlite3.connect(sys.argv[1], timeout=10.0, isolation_level=None)
c.execute("PRAGMA busy_timeout = 10000")
for n in range(40):
    c.execute("BEGIN IMMEDIATE")
    c.execute("INSERT INTO event_outbox (event_type, payload) VALUES (?, ?)",
              ("loop.tick.v1", json.dumps({"n": n})))
    c.execute("COMMIT")
"#,
        );
        producers.push(("python3", loop_script));
        expected += 3 + 40;
    }
    if available(
        "php",
        &[
            "-r",
            "exit(class_exists('PDO') && in_array('sqlite', PDO::getAvailableDrivers()) ? 0 : 1);",
        ],
    ) {
        producers.push(("php", contract.join("producer.php")));
        expected += 3;
    }
    let handles: Vec<_> = producers
        .into_iter()
        .map(|(program, script)| {
            let db = sb.db();
            thread::spawn(move || {
                let out = Command::new(program)
                    .arg(&script)
                    .arg(&db)
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "{program} {}: {}",
                    script.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    wait_until("every produced event on stdout", WAIT, || {
        run.stdout().lines().count() >= expected
    });
    assert!(run.stop().success());
    assert_nothing_leased(&sb);
    assert_eq!(sb.count("status = 'delivered'") as usize, expected);
    for line in run.stdout().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        assert!(v["event_type"].is_string(), "{line}");
    }
}

// ---------------------------------------------------------------------------
// Bad configuration, refused before anything is claimed.

const BASE_CONSUMER: &str = "[[consumer]]\nname = \"out\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = \"-\"\n";

/// Runs `outboxd run --config` and `check-config` on `toml`; both must exit
/// 6 naming `field`, and the pending event must stay unclaimed.
fn assert_refused(sb: &Sandbox, case: &str, toml: &str, field: &str, extra_env: &[(&str, &str)]) {
    let config = sb.write("bad.toml", toml);
    let c = config.to_str().unwrap();
    for args in [
        vec!["run", "--config", c],
        vec!["check-config", "--config", c],
    ] {
        let mut cmd = sb.command(&args);
        for (k, v) in extra_env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(code::CONFIG),
            "{case} ({}): {stderr}",
            args[0]
        );
        assert!(
            stderr.contains(&format!(": {field}: ")) && stderr.contains("bad.toml"),
            "{case} ({}): expected the field {field} in: {stderr}",
            args[0]
        );
        assert_eq!(stderr.lines().count(), 1, "{case}: one line: {stderr}");
        // In words for the person who wrote the file, not Rust's types.
        for rust in [
            "usize",
            "u8",
            "u32",
            "u64",
            "f64",
            "struct ",
            "Raw",
            "path string",
        ] {
            assert!(!stderr.contains(rust), "{case}: {rust:?} in: {stderr}");
        }
        assert!(out.stdout.is_empty(), "{case}: nothing on stdout");
    }
    assert_eq!(
        sb.count("status = 'pending' AND attempts = 0 AND claim_token IS NULL"),
        1,
        "{case}: the event was touched"
    );
}

#[test]
fn every_config_mistake_names_its_field_and_claims_nothing() {
    let sb = Sandbox::migrated();
    sb.enqueue(&[event("order.placed.v1", Value::Null)]);
    sb.script("ok.sh", "exit 0");
    sb.write("not-executable.sh", "#!/bin/sh\nexit 0\n");
    let section = |s: &str| format!("{s}\n{BASE_CONSUMER}");
    let sink = |body: &str| {
        format!("[[consumer]]\nname = \"c\"\ntypes = [\"*\"]\n[consumer.sink]\n{body}\n")
    };
    let hook = |extra: &str| {
        sink(&format!(
            "kind = \"webhook\"\nurl = \"https://example.com/h\"\nsecret_env = \"E2E_SECRET\"\n{extra}"
        ))
    };
    let cases: Vec<(&str, String, &str)> = vec![
        ("database of the wrong type", section("database = 7"), "database"),
        ("unknown top-level key", section("databse = \"x.db\""), "databse"),
        ("workers zero", section("[relay]\nworkers = 0"), "relay.workers"),
        ("workers text", section("[relay]\nworkers = \"two\""), "relay.workers"),
        ("batch size too big", section("[relay]\nbatch_size = 20000"), "relay.batch_size"),
        ("lease too short", section("[relay]\nlease = \"500ms\""), "relay.lease"),
        ("lease without unit", section("[relay]\nlease = \"30\""), "relay.lease"),
        ("poll interval too long", section("[relay]\npoll_interval = \"2m\""), "relay.poll_interval"),
        ("unrouted policy", section("[relay]\nunrouted = \"drop\""), "relay.unrouted"),
        ("shutdown grace", section("[relay]\nshutdown_grace = \"2h\""), "relay.shutdown_grace"),
        ("unknown relay key", section("[relay]\nworkerz = 2"), "relay.workerz"),
        ("retry initial zero", section("[retry]\ninitial = \"0s\""), "retry.initial"),
        ("retry max delay short", section("[retry]\ninitial = \"1m\"\nmax_delay = \"30s\""), "retry.max_delay"),
        ("retry attempts zero", section("[retry]\nmax_attempts = 0"), "retry.max_attempts"),
        ("retry attempts negative", section("[retry]\nmax_attempts = -1"), "retry.max_attempts"),
        ("retry jitter", section("[retry]\njitter = 2.0"), "retry.jitter"),
        ("purge enabled", section("[purge]\nenabled = \"yes\""), "purge.enabled"),
        ("purge dedup ttl", section("[purge]\ndelivered_retention = \"30d\"\ndedup_ttl = \"1d\""), "purge.dedup_ttl"),
        ("purge batch", section("[purge]\nbatch_size = 0"), "purge.batch_size"),
        ("purge dead retention", section("[purge]\ndead_retention = \"forever\""), "purge.dead_retention"),
        ("stale after zero", section("[alerts]\nstale_after = \"0s\""), "alerts.stale_after"),
        ("max dead negative", section("[alerts]\nmax_dead = -1"), "alerts.max_dead"),
        ("log level", section("[log]\nlevel = \"lo=ud=\""), "log.level"),
        ("log level that is no level", section("[log]\nlevel = \"verbose\""), "log.level"),
        ("log format", section("[log]\nformat = \"xml\""), "log.format"),
        ("metrics address", section("[metrics]\nlisten = \"nowhere\""), "metrics.listen"),
        ("console and metrics on one address", section("[http]\nlisten = \"127.0.0.1:19464\"\n[metrics]\nlisten = \"127.0.0.1:19464\""), "metrics.listen"),
        ("no consumer", "[relay]\nworkers = 1\n".into(), "consumer"),
        ("consumer name", sink("kind = \"jsonl\"\npath = \"-\"").replace("\"c\"", "\"bad name\""), "consumer[0].name"),
        ("duplicate name", format!("{BASE_CONSUMER}{BASE_CONSUMER}"), "consumer[1].name"),
        ("no types", sink("kind = \"jsonl\"\npath = \"-\"").replace("[\"*\"]", "[]"), "consumer[0].types"),
        ("bad pattern", sink("kind = \"jsonl\"\npath = \"-\"").replace("[\"*\"]", "[\"ok.created.v1\", \"Bad..Type\"]"), "consumer[0].types[1]"),
        ("pattern without a version", sink("kind = \"jsonl\"\npath = \"-\"").replace("[\"*\"]", "[\"article.created\"]"), "consumer[0].types[0]"),
        ("poison code text", sink("kind = \"command\"\nprogram = \"./ok.sh\"\npoison_exit_code = \"x\""), "consumer[0].sink.poison_exit_code"),
        ("relay not a table", "relay = 3\n".into(), "relay"),
        ("consumer retry", sink("kind = \"jsonl\"\npath = \"-\"").replace("[consumer.sink]", "retry = { max_attempts = 0 }\n[consumer.sink]"), "consumer[0].retry.max_attempts"),
        ("missing sink", "[[consumer]]\nname = \"c\"\ntypes = [\"*\"]\n".into(), "consumer[0]"),
        ("sink kind", sink("kind = \"kafka\""), "consumer[0].sink.kind"),
        ("unknown sink key", sink("kind = \"jsonl\"\npath = \"-\"\nrotate = true"), "consumer[0].sink.rotate"),
        ("key of another kind", sink("kind = \"jsonl\"\npath = \"-\"\nurl = \"http://x\""), "consumer[0].sink.url"),
        ("jsonl without path", sink("kind = \"jsonl\""), "consumer[0].sink.path"),
        ("fsync on stdout", sink("kind = \"jsonl\"\npath = \"-\"\nfsync = true"), "consumer[0].sink.fsync"),
        ("jsonl in a missing directory", sink("kind = \"jsonl\"\npath = \"no/such/dir/e.jsonl\""), "consumer[0].sink.path"),
        ("command without program", sink("kind = \"command\""), "consumer[0].sink.program"),
        ("missing program", sink("kind = \"command\"\nprogram = \"./no-such-program\""), "consumer[0].sink.program"),
        ("program not in PATH", sink("kind = \"command\"\nprogram = \"no-such-program-e2e\""), "consumer[0].sink.program"),
        ("program not executable", sink("kind = \"command\"\nprogram = \"./not-executable.sh\""), "consumer[0].sink.program"),
        ("command timeout zero", sink("kind = \"command\"\nprogram = \"./ok.sh\"\ntimeout = \"0s\""), "consumer[0].sink.timeout"),
        ("poison code range", sink("kind = \"command\"\nprogram = \"./ok.sh\"\npoison_exit_code = 300"), "consumer[0].sink.poison_exit_code"),
        ("env key", sink("kind = \"command\"\nprogram = \"./ok.sh\"\nenv = { \"A=B\" = \"x\" }"), "consumer[0].sink.env.A=B"),
        ("timeout past the lease", format!("[relay]\nlease = \"10s\"\n{}", sink("kind = \"command\"\nprogram = \"./ok.sh\"\ntimeout = \"1m\"")), "consumer[0].sink.timeout"),
        ("webhook without url", sink("kind = \"webhook\"\nsecret_env = \"E2E_SECRET\""), "consumer[0].sink.url"),
        ("bad url", sink("kind = \"webhook\"\nurl = \"http://exa mple.com\"\nsecret_env = \"E2E_SECRET\""), "consumer[0].sink.url"),
        ("url scheme", sink("kind = \"webhook\"\nurl = \"ftp://example.com/h\"\nsecret_env = \"E2E_SECRET\""), "consumer[0].sink.url"),
        ("url port out of range", sink("kind = \"webhook\"\nurl = \"http://127.0.0.1:99999/\"\nsecret_env = \"E2E_SECRET\""), "consumer[0].sink.url"),
        ("no secret", sink("kind = \"webhook\"\nurl = \"https://example.com/h\""), "consumer[0].sink.secret_env"),
        ("missing secret variable", hook("").replace("E2E_SECRET", "E2E_UNSET_SECRET"), "consumer[0].sink.secret_env"),
        ("missing rotated secret", sink("kind = \"webhook\"\nurl = \"https://example.com/h\"\nsecrets_env = [\"E2E_SECRET\", \"E2E_UNSET_SECRET\"]"), "consumer[0].sink.secrets_env[1]"),
        ("secret_env and secret_file", hook("secret_file = \"hook.secret\""), "consumer[0].sink.secret_file"),
        ("secret_env and secrets_env", hook("secrets_env = [\"E2E_SECRET\"]"), "consumer[0].sink.secrets_env"),
        ("missing secret file", sink("kind = \"webhook\"\nurl = \"https://example.com/h\"\nsecret_file = \"no-such.secret\""), "consumer[0].sink.secret_file"),
        ("webhook timeout past the lease", hook("timeout = \"31s\""), "consumer[0].sink.timeout"),
        ("webhook connect timeout", hook("connect_timeout = \"0s\""), "consumer[0].sink.connect_timeout"),
        ("reserved header", hook("headers = { \"webhook-id\" = \"x\" }"), "consumer[0].sink.headers"),
        ("response bound", hook("max_response_bytes = 0"), "consumer[0].sink.max_response_bytes"),
        ("deny private type", hook("deny_private_addresses = \"yes\""), "consumer[0].sink.deny_private_addresses"),
        // A loopback URL under deny_private_addresses would be refused on every
        // delivery; it is refused at start-up instead (tests/binary/sinks_e2e.rs has more).
        ("deny private loopback", sink("kind = \"webhook\"\nurl = \"http://127.0.0.1:9/h\"\nsecret_env = \"E2E_SECRET\"\ndeny_private_addresses = true"), "consumer[0].sink.url"),
        // A sql sink's statements are prepared against the database.
        ("sql without statements", sink("kind = \"sql\""), "consumer[0].sink.statements"),
        ("sql transaction control", sink("kind = \"sql\"\nstatements = [\"COMMIT\"]"), "consumer[0].sink.statements[0]"),
        ("sql missing table", format!("{BASE_CONSUMER}{}", sink("kind = \"sql\"\nstatements = [\"SELECT :event_id\", \"INSERT INTO nope VALUES (:event_id)\"]")), "consumer[1].sink.statements[1]"),
        ("sql unknown parameter", sink("kind = \"sql\"\nstatements = [\"SELECT :event_idd\"]"), "consumer[0].sink.statements[0]"),
        ("sql two statements in one", sink("kind = \"sql\"\nstatements = [\"SELECT 1; SELECT 2\"]"), "consumer[0].sink.statements[0]"),
    ];
    for (case, toml, field) in &cases {
        assert_refused(&sb, case, toml, field, &[("E2E_SECRET", SECRET)]);
    }

    // A malformed secret is named by its variable, never shown.
    let leaky = "whsec_SUPERSECRETVALUE!!";
    assert_refused(
        &sb,
        "malformed secret",
        &hook(""),
        "consumer[0].sink.secret_env",
        &[("E2E_SECRET", leaky)],
    );
    assert_refused(
        &sb,
        "malformed rotated secret",
        &sink("kind = \"webhook\"\nurl = \"https://example.com/h\"\nsecrets_env = [\"E2E_SECRET\", \"E2E_LEAKY\"]"),
        "consumer[0].sink.secrets_env[1]",
        &[("E2E_SECRET", SECRET), ("E2E_LEAKY", leaky)],
    );
    let out = sb
        .command(&[
            "check-config",
            "--config",
            sb.file("bad.toml").to_str().unwrap(),
        ])
        .env("E2E_SECRET", SECRET)
        .env("E2E_LEAKY", leaky)
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stderr).contains("SUPERSECRET"));

    // A pattern that can never match a valid type is refused with the fix.
    let config = sb.write(
        "bad.toml",
        &sink("kind = \"jsonl\"\npath = \"-\"").replace("[\"*\"]", "[\"article.created\"]"),
    );
    let out = sb.run(&["check-config", "--config", config.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("article.created.v1 or article.created.*"),
        "{stderr}"
    );

    // A TOML syntax error names the line.
    let config = sb.write("bad.toml", "[relay\nworkers = 1\n");
    let out = sb.run(&["run", "--config", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(code::CONFIG));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("line 1"),
        "{out:?}"
    );
    // A missing file.
    let out = sb.run(&["run", "--config", "no-such.toml"]);
    assert_eq!(out.status.code(), Some(code::CONFIG));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such.toml"));
}

#[test]
fn check_config_summarises_a_good_file_and_db_overrides_the_config() {
    let sb = Sandbox::migrated();
    let config = sb.write(
        "outboxd.toml",
        &format!(
            "database = \"from-config.db\"\n[http]\nlisten = \"127.0.0.1:19465\"\nread_only = true\n{BASE_CONSUMER}"
        ),
    );
    let c = config.to_str().unwrap();
    let out = sb
        .outboxd()
        .without_db()
        .run(&["check-config", "--config", c]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ok"), "{text}");
    assert!(
        text.contains(&sb.file("from-config.db").display().to_string()),
        "the config's database, relative to the config: {text}"
    );
    assert!(text.contains("consumer out <- *: jsonl stdout"), "{text}");
    assert!(
        text.contains("console:   http://127.0.0.1:19465/ (with /metrics and /healthz), read-only"),
        "{text}"
    );
    // --db given: it wins.
    let out = sb.run(&["check-config", "--config", c]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&sb.db().display().to_string()), "{text}");
    assert!(!text.contains("from-config.db"), "{text}");
}

// ---------------------------------------------------------------------------
// Metrics.

#[test]
fn a_metrics_address_in_use_is_a_config_error() {
    let sb = Sandbox::migrated();
    sb.enqueue(&[event("order.placed.v1", Value::Null)]);
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = sb.run(&["run", "--metrics", &addr]);
    assert_eq!(out.status.code(), Some(code::CONFIG), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot serve metrics on {addr}")),
        "{stderr}"
    );
    assert_eq!(
        sb.count("status = 'pending' AND attempts = 0 AND claim_token IS NULL"),
        1
    );
}

#[test]
fn the_console_and_metrics_on_one_address_from_flags_is_a_config_error() {
    let sb = Sandbox::migrated();
    sb.enqueue(&[event("order.placed.v1", Value::Null)]);
    let err = sb.fails(
        &[
            "run",
            "--http",
            "127.0.0.1:19466",
            "--metrics",
            "127.0.0.1:19466",
        ],
        code::CONFIG,
        "metrics.listen: 127.0.0.1:19466 is both the metrics and the console address",
    );
    assert!(err.contains("--metrics"), "{err}");
}

#[test]
fn the_metrics_endpoint_serves_prometheus_text() {
    let sb = Sandbox::migrated();
    let config = sb.write(
        "outboxd.toml",
        &format!("[metrics]\nlisten = \"127.0.0.1:0\"\n{BASE_CONSUMER}"),
    );
    let mut run = sb.spawn(&["run", "--config", config.to_str().unwrap()]);
    run.wait_started();
    let addr = run.logged_address("address=Some(");
    sb.enqueue(&[
        event("order.placed.v1", Value::Null),
        event("order.placed.v1", Value::Null),
    ]);
    wait_until("2 delivered", WAIT, || {
        sb.count("status = 'delivered'") == 2
    });
    let mut reply = None;
    wait_until("the metrics to count both deliveries", WAIT, || {
        reply = try_request(&addr, "GET", "/metrics", &[], "").ok();
        reply.as_ref().is_some_and(|r| {
            r.body
                .contains("outboxd_deliveries_total{consumer=\"out\",result=\"delivered\"} 2")
        })
    });
    let reply = reply.unwrap();
    assert_eq!(reply.status, 200, "{reply:?}");
    assert!(
        reply
            .header("content-type")
            .is_some_and(|v| v.starts_with("text/plain; version=0.0.4")),
        "{reply:?}"
    );
    let body = reply.body;
    for name in [
        "outboxd_events{status=\"delivered\"} 2",
        "outboxd_events{status=\"pending_due\"} 0",
        "outboxd_events{status=\"dead\"} 0",
        "outboxd_status_up 1",
        "outboxd_oldest_due_age_seconds 0",
        "outboxd_deliveries_total{consumer=\"out\",result=\"retry\"} 0",
        "outboxd_events_delivered_total 2",
        "# TYPE outboxd_retries_total counter",
        "# TYPE outboxd_dead_letters_total counter",
        "# TYPE outboxd_claim_seconds_total counter",
        "# TYPE outboxd_commit_seconds_total counter",
        "# TYPE outboxd_commits_total counter",
        "# TYPE outboxd_leases_expired gauge",
    ] {
        assert!(body.contains(name), "{name} missing in:\n{body}");
    }
    assert_eq!(get(&addr, "/nope").status, 404);
    assert!(run.stop().success());
}
