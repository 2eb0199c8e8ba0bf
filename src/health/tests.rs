use super::*;
use crate::capture::{CaptureSpec, Columns};
use crate::connection;
use rusqlite::params;

const T0: i64 = 1_764_487_080_000;

fn at(ms: i64) -> Timestamp {
    Timestamp::from_millis(T0 + ms)
}

fn migrated() -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = connection::open(dir.path().join("h.db")).unwrap();
    schema::migrate(&mut conn).unwrap();
    (dir, conn)
}

fn row(conn: &Connection, status: &str, available_at: i64) {
    conn.execute(
        "INSERT INTO event_outbox (event_type, status, available_at, finished_at)
         VALUES ('article.created.v1', ?1, ?2, ?3)",
        params![
            status,
            T0 + available_at,
            (status != "pending").then_some(T0)
        ],
    )
    .unwrap();
}

fn kinds(v: &Verdict) -> Vec<&'static str> {
    v.problems.iter().map(Problem::kind).collect()
}

#[test]
fn the_defaults_are_five_minutes_and_any_dead_letter() {
    let t = Thresholds::default();
    assert_eq!(t.stale_after, Duration::from_secs(300));
    assert_eq!(t.max_dead, Some(0));
    let (_dir, conn) = migrated();
    assert!(check(&conn, &t, at(0)).unwrap().is_healthy());
    row(&conn, "dead", -1_000);
    let v = check(&conn, &t, at(0)).unwrap();
    assert_eq!(kinds(&v), ["dead_letters"]);
    assert_eq!(
        v.problems[0],
        Problem::TooManyDead {
            dead: 1,
            max_dead: 0
        }
    );
    assert!(v.problems[0]
        .message()
        .contains("1 dead letter (more than 0)"));
}

#[test]
fn a_stale_due_event_and_dead_letters_over_the_limit() {
    let (_dir, conn) = migrated();
    row(&conn, "pending", -600_000);
    for _ in 0..3 {
        row(&conn, "dead", -1_000);
    }
    let v = check(&conn, &Thresholds::default(), at(0)).unwrap();
    assert_eq!(kinds(&v), ["stale", "dead_letters"]);
    assert!(v.has("stale") && !v.has("capture"));
    let relaxed = Thresholds::new(Duration::from_secs(601), Some(3));
    assert!(check(&conn, &relaxed, at(0)).unwrap().is_healthy());
    let json = serde_json::to_value(&v.problems[0]).unwrap();
    assert_eq!(json["kind"], "stale");
    assert_eq!(json["threshold"], "stale-after");
    assert!(json["message"].as_str().unwrap().contains("10m"), "{json}");
}

#[test]
fn a_dropped_capture_trigger_is_a_problem_and_a_broken_capture() {
    let (_dir, mut conn) = migrated();
    conn.execute_batch("CREATE TABLE pages (id INTEGER PRIMARY KEY, title TEXT)")
        .unwrap();
    let spec = CaptureSpec::new("pages", "page.{op}.v1", Columns::List(vec!["title".into()]));
    capture::apply(&mut conn, &[spec], at(0)).unwrap();
    let v = check(&conn, &Thresholds::default(), at(0)).unwrap();
    assert!(v.is_healthy(), "{v:?}");
    assert_eq!(
        v.captures,
        [CaptureState {
            name: "pages".into(),
            table: "pages".into(),
            capture: "page.{op}.v1".into(),
            intact: true,
            open_gaps: 0
        }]
    );
    let trigger: String = conn
        .query_row(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'pages' LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    conn.execute_batch(&format!("DROP TRIGGER \"{trigger}\""))
        .unwrap();
    let v = check(&conn, &Thresholds::default(), at(60_000)).unwrap();
    assert_eq!(kinds(&v), ["capture"]);
    assert!(!v.captures[0].intact);
    match &v.problems[0] {
        Problem::CaptureDrift {
            table,
            unseen_since,
            message,
            ..
        } => {
            assert_eq!((table.as_str(), *unseen_since), ("pages", at(0)));
            assert!(message.contains(&trigger), "{message}");
            assert!(message.contains("outboxd capture apply"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

/// A capture reinstalled after its triggers went missing leaves a gap: a
/// problem of its own (kind `capture_gap`) once the drift is gone, until a
/// snapshot covers it or it is acknowledged.
#[test]
fn a_capture_gap_is_a_problem_until_acknowledged() {
    let (_dir, mut conn) = migrated();
    conn.execute_batch("CREATE TABLE pages (id INTEGER PRIMARY KEY, title TEXT)")
        .unwrap();
    let spec = CaptureSpec::new("pages", "page.{op}.v1", Columns::List(vec!["title".into()]));
    capture::apply(&mut conn, std::slice::from_ref(&spec), at(0)).unwrap();
    conn.execute_batch("DROP TRIGGER outboxd_capture_insert_pages")
        .unwrap();
    let report = capture::apply(&mut conn, std::slice::from_ref(&spec), at(60_000)).unwrap();
    assert_eq!(report.gaps.len(), 1);
    let v = check(&conn, &Thresholds::default(), at(61_000)).unwrap();
    assert_eq!(kinds(&v), ["capture_gap"]);
    assert_eq!(v.captures[0].open_gaps, 1);
    assert!(v.captures[0].intact);
    let m = v.problems[0].message();
    assert!(
        m.contains(&at(0).to_string()) && m.contains(&at(60_000).to_string()),
        "{m}"
    );
    assert!(
        m.contains("(at most)") && m.contains("capture snapshot"),
        "{m}"
    );
    assert_eq!(v.problems[0].threshold(), "capture-gap");
    capture::ack(
        &conn,
        &capture::GapSelection::Capture("pages".into()),
        at(62_000),
    )
    .unwrap();
    assert!(check(&conn, &Thresholds::default(), at(63_000))
        .unwrap()
        .is_healthy());
}

#[test]
fn every_kind_is_listed() {
    let examples = [
        Problem::Stale {
            oldest_due_age: Duration::from_secs(1),
            stale_after: Duration::ZERO,
        },
        Problem::Undelivered {
            oldest_undelivered_age: Duration::from_secs(7200),
            max_undelivered_age: Duration::from_secs(3600),
        },
        Problem::TooManyDead {
            dead: 1,
            max_dead: 0,
        },
        Problem::ClockStep {
            lease: None,
            retry: Some(Duration::from_secs(1)),
            max_lease: Duration::ZERO,
            max_retry_wait: Duration::ZERO,
        },
        Problem::ImplausibleDelay { count: 2 },
        Problem::CaptureDrift {
            table: "t".into(),
            capture: "t.{op}.v1".into(),
            unseen_since: at(0),
            message: "m".into(),
        },
        Problem::CaptureGap {
            capture: "t".into(),
            table: "t".into(),
            gaps: 1,
            lost_after: at(0),
            lost_until: at(1),
        },
    ];
    let kinds: Vec<_> = examples.iter().map(Problem::kind).collect();
    assert_eq!(kinds, KINDS);
    assert!(examples.iter().all(|p| !p.to_string().is_empty()));
}
