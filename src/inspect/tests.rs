use rusqlite::{params, Connection};

use super::*;
use crate::router::{Pattern, Subscriptions};
use crate::EventId;

const T0: i64 = 1_764_487_080_000;

fn db() -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = crate::connection::open(dir.path().join("q.db")).unwrap();
    crate::schema::migrate(&mut conn).unwrap();
    (dir, conn)
}

fn insert(conn: &Connection, ty: &str, status: &str, at: i64, tenant: Option<&str>) -> i64 {
    conn.execute(
        "INSERT INTO event_outbox (event_id, event_type, tenant_id, status, occurred_at,
             created_at, available_at, finished_at, attempts)
         VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?5, ?6, ?7)",
        params![
            EventId::new().to_string(),
            ty,
            tenant,
            status,
            at,
            (status != "pending").then_some(at + 10),
            i64::from(status == "dead") * 3,
        ],
    )
    .unwrap();
    conn.last_insert_rowid()
}

/// Every plan step over an outboxd table must be a SEARCH (an index or
/// key range) or a walk of the partial index that holds pending rows
/// only; a SCAN of a table or of a whole index is refused. (Run with
/// --nocapture to see the plans.)
#[test]
fn no_page_query_scans_a_whole_table() {
    let (_dir, conn) = db();
    for (name, sql) in all_statements() {
        let n = conn.prepare(&sql).unwrap().parameter_count();
        let args: Vec<rusqlite::types::Value> =
            (0..n).map(|_| rusqlite::types::Value::Integer(1)).collect();
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let plan: Vec<String> = stmt
            .query_map(rusqlite::params_from_iter(args), |r| r.get(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        println!("{name}: {plan:?}");
        for step in &plan {
            let bounded = step.starts_with("SEARCH")
                || step.contains("USING INDEX event_outbox_due")
                // Sorting what a bounded step found.
                || step.starts_with("USE TEMP B-TREE")
                || step.starts_with("SCAN sqlite_sequence")
                || step == "SCAN CONSTANT ROW"
                || step.starts_with("SCALAR SUBQUERY");
            assert!(bounded, "{name}: {step}\nin {plan:?}");
        }
    }
}

#[test]
fn events_page_by_key_with_filters() {
    let (_dir, conn) = db();
    let now = Timestamp::from_millis(T0 + 1_000_000);
    let mut ids = Vec::new();
    for i in 0..120 {
        let ty = if i % 2 == 0 {
            "article.created.v1"
        } else {
            "order.placed.v1"
        };
        let status = if i % 3 == 0 { "dead" } else { "delivered" };
        ids.push(insert(
            &conn,
            ty,
            status,
            T0 + i,
            Some(if i % 4 == 0 { "acme" } else { "b" }),
        ));
    }
    let all = events_page(&conn, &EventFilter::default(), now).unwrap();
    assert_eq!(all.rows.len(), PAGE);
    assert_eq!(all.rows[0].id, ids[119], "newest first");
    let next = events_page(
        &conn,
        &EventFilter {
            before: all.next_before,
            ..EventFilter::default()
        },
        now,
    )
    .unwrap();
    assert_eq!(next.rows[0].id, ids[119 - PAGE]);
    let filter = EventFilter {
        state: Some(StateFilter::Dead),
        event_type: Some(Pattern::parse("article.*").unwrap()),
        tenant: Some("acme".into()),
        ..EventFilter::default()
    };
    let page = events_page(&conn, &filter, now).unwrap();
    // i % 3 == 0, even, i % 4 == 0: i % 12 == 0 → 10 rows.
    assert_eq!(page.rows.len(), 10);
    assert_eq!(page.next_before, None, "the walk reached the first row");
    assert!(page.rows.iter().all(|r| r.status == "dead"));
}

/// "What happened to page 42?": the events of one captured row, by its
/// ordering key or its payload's key (issue 33, item 7).
#[test]
fn events_are_found_by_ordering_key_and_by_key() {
    let (_dir, conn) = db();
    let now = Timestamp::from_millis(T0 + 1000);
    for (payload, key) in [
        (
            r#"{"op":"c","table":"cms_page","key":{"id":42}}"#,
            "cms_page:42",
        ),
        (
            r#"{"op":"c","table":"cms_page","key":{"id":7}}"#,
            "cms_page:7",
        ),
        (
            r#"{"op":"u","table":"cms_page","key":{"id":42}}"#,
            "cms_page:42",
        ),
        ("not json", "x"),
    ] {
        conn.execute(
            "INSERT INTO event_outbox (event_type, payload, ordering_key, occurred_at) VALUES ('page.x.v1', ?1, ?2, ?3)",
            params![payload, key, T0],
        )
        .unwrap();
    }
    let by = |f: EventFilter| -> Vec<i64> {
        events_page(&conn, &f, now)
            .unwrap()
            .rows
            .iter()
            .map(|r| r.id)
            .collect()
    };
    let okey = by(EventFilter {
        ordering_key: Some("cms_page:42".into()),
        ..EventFilter::default()
    });
    assert_eq!(okey.len(), 2);
    let key = by(EventFilter {
        key: Some("42".into()),
        ..EventFilter::default()
    });
    assert_eq!(key, okey);
}

#[test]
fn consumer_filter_reads_the_ledger() {
    let (_dir, conn) = db();
    let now = Timestamp::from_millis(T0 + 1000);
    let a = insert(&conn, "article.created.v1", "delivered", T0, None);
    let b = insert(&conn, "article.created.v1", "dead", T0, None);
    let key: String = conn
        .query_row(
            "SELECT event_id FROM event_outbox WHERE id = ?1",
            [a],
            |r| r.get(0),
        )
        .unwrap();
    conn.execute(
        "INSERT INTO delivered_events VALUES (?1, 'hook', ?2, ?3)",
        params![key, a, T0],
    )
    .unwrap();
    let f = |missing| EventFilter {
        consumer: Some("hook".into()),
        missing,
        ..EventFilter::default()
    };
    let done = events_page(&conn, &f(false), now).unwrap();
    assert_eq!(done.rows.iter().map(|r| r.id).collect::<Vec<_>>(), [a]);
    let missing = events_page(&conn, &f(true), now).unwrap();
    assert_eq!(missing.rows.iter().map(|r| r.id).collect::<Vec<_>>(), [b]);
    let subs = Subscriptions::parse([("hook", ["*"]), ("other", ["order.*"])]).unwrap();
    let backlog = consumer_backlog(&conn, &subs).unwrap();
    assert_eq!(backlog.per_consumer, [(0, 1), (0, 0)]);
    assert!(!backlog.truncated);
}

#[test]
fn event_detail_by_row_or_event_id_in_any_case() {
    let (_dir, conn) = db();
    let id = insert(&conn, "article.created.v1", "pending", T0, Some("<script>"));
    let event_id: String = conn
        .query_row(
            "SELECT event_id FROM event_outbox WHERE id = ?1",
            [id],
            |r| r.get(0),
        )
        .unwrap();
    let by_row = find_event(&conn, &id.to_string()).unwrap().unwrap();
    assert_eq!(by_row.row.tenant.as_deref(), Some("<script>"));
    assert_eq!(by_row.payload, "null");
    assert_eq!(by_row.envelope_error, None);
    let lower = find_event(&conn, &event_id.to_ascii_lowercase())
        .unwrap()
        .unwrap();
    assert_eq!(lower.row.id, id);
    assert!(find_event(&conn, "999").unwrap().is_none());
    assert!(find_event(&conn, "not-an-id").unwrap().is_none());
}

#[test]
fn dead_pages_follow_the_finished_index() {
    let (_dir, conn) = db();
    // Few distinct times, so a page ends inside a run of equal ones.
    for i in 0..70 {
        insert(&conn, "article.created.v1", "dead", T0 + i / 30, None);
        insert(&conn, "order.placed.v1", "delivered", T0 + i / 30, None);
    }
    let first = dead_page(&conn, None, None).unwrap();
    assert_eq!(first.rows.len(), PAGE);
    let second = dead_page(&conn, None, first.next).unwrap();
    assert_eq!(second.rows.len(), 20);
    assert_eq!(second.next, None);
    let mut seen: Vec<i64> = first
        .rows
        .iter()
        .chain(&second.rows)
        .map(|r| r.id)
        .collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 70, "every dead letter once");
    assert!(first.rows[0].finished_at >= second.rows[0].finished_at);
}

#[test]
fn minute_counts_come_from_the_table() {
    let (_dir, conn) = db();
    let since = T0;
    insert(&conn, "a.b.v1", "delivered", T0 - 3_600_000, None); // too old
    insert(&conn, "a.b.v1", "delivered", T0 + 1_000, None);
    insert(&conn, "a.b.v1", "dead", T0 + 61_000, None);
    insert(&conn, "a.b.v1", "pending", T0 + 62_000, None);
    let rows = minute_counts(&conn, since).unwrap();
    let m0 = T0 / 60_000;
    let get = |m: i64| {
        rows.iter()
            .find(|c| c.minute == m)
            .copied()
            .unwrap_or_default()
    };
    assert_eq!((get(m0).enqueued, get(m0).delivered), (1, 1));
    assert_eq!((get(m0 + 1).enqueued, get(m0 + 1).dead), (2, 1));
    assert_eq!(enqueued_total(&conn).unwrap(), 4);
}
