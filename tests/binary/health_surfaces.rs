//! One health verdict on six surfaces: for a database with one kind of
//! problem (dead letters over the threshold, a stale due event, an event
//! retrying for over an hour, a dropped capture trigger) or none, `status` (text and `--json`), `doctor`,
//! `/healthz`, the console's overview, `/metrics`'s problem gauges and
//! `run`'s alert log all say the same: healthy or not, and which kinds.
//!
//! Every surface is read from the real binary, with the same config file
//! (no `[alerts]`: the defaults, stale after 5m, undelivered after 1h and
//! any dead letter).

use std::collections::BTreeSet;
use std::time::Duration;

use outboxd::capture::{CaptureSpec, Columns};
use outboxd::Timestamp;

use crate::common::bin::{code, Running, Sandbox};
use crate::common::http::get;
use crate::common::{event, wait_until};

/// Every problem kind, as `/metrics` labels them.
const KINDS: [&str; 6] = [
    "stale",
    "undelivered",
    "dead_letters",
    "clock_step",
    "implausible_delay",
    "capture",
];

/// The kind of a problem named by its threshold (the text surfaces).
fn kind_of(threshold: &str) -> &'static str {
    match threshold {
        "stale-after" => "stale",
        "max-undelivered-age" => "undelivered",
        "max-dead" => "dead_letters",
        "clock-step" => "clock_step",
        "implausible-delay" => "implausible_delay",
        "capture" => "capture",
        other => panic!("unknown threshold {other:?}"),
    }
}

type Kinds = BTreeSet<String>;

fn kinds<'a>(names: impl IntoIterator<Item = &'a str>) -> Kinds {
    names.into_iter().map(str::to_string).collect()
}

/// The kinds of a JSON problem list (`[{"kind": …}]`).
fn json_kinds(problems: &serde_json::Value) -> Kinds {
    let list = problems.as_array().expect("a problem list");
    kinds(list.iter().map(|p| p["kind"].as_str().unwrap()))
}

/// A config every surface reads: a file sink, and a lease long enough for
/// the stale scenario's foreign lease to be no clock step.
fn config(sb: &Sandbox) -> String {
    let out = sb.file("out.jsonl");
    let text = format!(
        "database = \"app.db\"\n[relay]\nlease = \"10m\"\n\
         [[consumer]]\nname = \"file\"\ntypes = [\"*\"]\n\
         [consumer.sink]\nkind = \"jsonl\"\npath = \"{}\"\n",
        out.display()
    );
    sb.write("outboxd.toml", &text)
        .to_str()
        .unwrap()
        .to_string()
}

/// What each surface says: (surface, healthy, kinds).
fn surfaces(sb: &Sandbox, config: &str) -> Vec<(&'static str, bool, Kinds)> {
    let mut said = Vec::new();

    // `status`, text: exit 1 and "  threshold: message" lines on problems.
    let out = sb.run(&["status", "--config", config]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let code = out.status.code().unwrap();
    assert!(code == code::OK || code == code::PROBLEMS, "{text}");
    let listed =
        text.split_once("health:           PROBLEMS\n")
            .map_or(Kinds::new(), |(_, rest)| {
                kinds(rest.lines().map(|l| {
                    let threshold = l.trim_start().split(':').next().unwrap();
                    kind_of(threshold)
                }))
            });
    assert_eq!(
        code == code::OK,
        text.contains("health:           ok"),
        "{text}"
    );
    said.push(("status", code == code::OK, listed));

    // `status --json`.
    let out = sb.run(&["status", "--json", "--config", config]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code() == Some(code::OK), v["healthy"] == true);
    said.push((
        "status --json",
        v["healthy"].as_bool().unwrap(),
        json_kinds(&v["problems"]),
    ));

    // `doctor --json`: its health verdict.
    let out = sb.run(&["doctor", "--json", "--config", config]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    said.push((
        "doctor",
        v["health"]["healthy"].as_bool().expect("doctor's health"),
        json_kinds(&v["health"]["problems"]),
    ));

    // `run --http`: /healthz, the overview, /metrics and the alert log.
    let mut run: Running = sb.spawn(&["run", "--config", config, "--http", "127.0.0.1:0"]);
    let addr = run.console_address();
    run.wait_started();

    let live = get(&addr, "/livez");
    assert_eq!((live.status, live.body.as_str()), (200, "alive\n"));

    let healthz = get(&addr, "/healthz");
    let v: serde_json::Value = serde_json::from_str(&healthz.body).unwrap();
    assert_eq!(healthz.status == 200, v["healthy"] == true, "{v}");
    said.push((
        "/healthz",
        healthz.status == 200,
        json_kinds(&v["problems"]),
    ));

    let page = get(&addr, "/").body;
    let healthy = page.contains("id=\"health\" data-healthy=\"true\"");
    let listed = page
        .split("data-threshold=\"")
        .skip(1)
        .map(|rest| kind_of(rest.split('"').next().unwrap()));
    said.push(("console overview", healthy, kinds(listed)));

    let metrics = get(&addr, "/metrics").body;
    let mut crossed = Kinds::new();
    for kind in KINDS {
        let gauge = format!("outboxd_health_problem{{kind=\"{kind}\"}} ");
        let line = metrics
            .lines()
            .find(|l| l.starts_with(&gauge))
            .unwrap_or_else(|| panic!("no {gauge}in {metrics}"));
        if line.ends_with(" 1") {
            crossed.insert(kind.to_string());
        }
    }
    said.push(("/metrics", crossed.is_empty(), crossed));

    // The alert log: a WARN line per kind crossed, or "health: ok".
    let mut logged = Kinds::new();
    wait_until("run's alert log", Duration::from_secs(30), || {
        let log = run.stderr();
        logged = log
            .lines()
            .filter(|l| l.contains("health: ") && l.contains("problem="))
            .filter_map(|l| l.split("problem=").nth(1))
            .map(|rest| {
                let v = rest.trim_start_matches('"');
                v.split(|c: char| c == '"' || c.is_whitespace())
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect();
        !logged.is_empty() || log.contains("health: ok")
    });
    said.push(("run's alert log", logged.is_empty(), logged));
    assert!(run.stop().success());
    said
}

/// Asserts every surface says `healthy` and lists exactly `expected`.
fn assert_agree(sb: &Sandbox, config: &str, expected: &[&str]) {
    let expected = kinds(expected.iter().copied());
    let said = surfaces(sb, config);
    for (surface, healthy, found) in &said {
        assert_eq!(
            (*healthy, found),
            (expected.is_empty(), &expected),
            "{surface} disagrees: {said:?}"
        );
    }
    assert_eq!(said.len(), 7);
}

#[test]
fn a_healthy_database_is_healthy_everywhere() {
    let sb = Sandbox::migrated();
    let config = config(&sb);
    assert_agree(&sb, &config, &[]);
}

/// A config without `[alerts]` gets the defaults: any dead letter is a
/// problem (0.1 said "health: ok" with a config, PROBLEMS without).
#[test]
fn a_dead_letter_is_a_problem_everywhere() {
    let sb = Sandbox::migrated();
    sb.enqueue(&[event("order.paid.v1", 1)]);
    sb.conn()
        .execute(
            "UPDATE event_outbox SET status = 'dead', finished_at = 1",
            [],
        )
        .unwrap();
    let config = config(&sb);
    assert_agree(&sb, &config, &["dead_letters"]);
}

/// An event due for 10 minutes, held back by an earlier event of its
/// ordering key that a relay elsewhere holds (so the one `run` starts does
/// not deliver it during the test).
#[test]
fn a_stale_due_event_is_a_problem_everywhere() {
    let sb = Sandbox::migrated();
    sb.enqueue(&[event("order.paid.v1", 1), event("order.paid.v1", 2)]);
    let now = Timestamp::now();
    let lease_end = now.plus(Duration::from_secs(300)).as_millis();
    let conn = sb.conn();
    conn.execute(
        "UPDATE event_outbox SET ordering_key = 'order-1', available_at = ?1",
        [now.minus(Duration::from_secs(600)).as_millis()],
    )
    .unwrap();
    // A claim sets the token and moves available_at to the lease's end.
    conn.execute(
        "UPDATE event_outbox SET claim_token = 'elsewhere', lease_until = ?1,
                available_at = ?1 WHERE id = (SELECT min(id) FROM event_outbox)",
        [lease_end],
    )
    .unwrap();
    drop(conn);
    let config = config(&sb);
    assert_agree(&sb, &config, &["stale"]);
}

/// An event written two hours ago whose consumer keeps failing: it waits
/// for its next retry, so it is not due and not stale, and health said ok
/// with thousands of such events.
#[test]
fn an_event_retrying_for_hours_is_a_problem_everywhere() {
    let sb = Sandbox::migrated();
    sb.enqueue(&[event("order.paid.v1", 1)]);
    let now = Timestamp::now();
    sb.conn()
        .execute(
            "UPDATE event_outbox SET created_at = ?1, attempts = 3,
                    last_error = 'the receiver answered 500', available_at = ?2",
            [
                now.minus(Duration::from_secs(2 * 3600)).as_millis(),
                now.plus(Duration::from_secs(600)).as_millis(),
            ],
        )
        .unwrap();
    let config = config(&sb);
    assert_agree(&sb, &config, &["undelivered"]);
}

/// A capture whose trigger a host migration dropped: `status` said so, and
/// /healthz answered 200 and the console "No threshold is crossed".
#[test]
fn a_dropped_capture_trigger_is_a_problem_everywhere() {
    let sb = Sandbox::migrated();
    let mut conn = sb.conn();
    conn.execute_batch("CREATE TABLE pages (id INTEGER PRIMARY KEY, title TEXT)")
        .unwrap();
    let spec = CaptureSpec::new("pages", "page.{op}.v1", Columns::All);
    outboxd::capture::apply(&mut conn, &[spec], Timestamp::now()).unwrap();
    conn.execute_batch("DROP TRIGGER outboxd_capture_update_pages")
        .unwrap();
    drop(conn);
    let config = config(&sb);
    assert_agree(&sb, &config, &["capture"]);

    // /metrics says which capture, per database and table.
    let mut run = sb.spawn(&["run", "--config", &config, "--http", "127.0.0.1:0"]);
    let addr = run.console_address();
    let metrics = get(&addr, "/metrics").body;
    assert!(
        metrics.contains(
            "outboxd_capture_intact{database=\"app\",table=\"pages\",capture=\"page.{op}.v1\"} 0\n"
        ),
        "{metrics}"
    );
    assert!(run.stop().success());
}
