//! The console's capture page (issue 33, item 7): each capture's name,
//! columns, drift and open gaps; a snapshot started from it, its progress;
//! and "what happened to page 1?" found by ordering key and by key on
//! /events.

#![cfg(feature = "cli")]

use crate::common;
use crate::common::console as console_support;

use std::time::Duration;

use console_support::{csrf, get, post_form, spawn, wait_until};
use outboxd::capture::{self, CaptureSpec, Columns};
use outboxd::Timestamp;

#[test]
fn the_capture_page_shows_gaps_and_starts_a_snapshot_that_covers_them() {
    let db = common::TestDb::new();
    let mut conn = db.conn();
    conn.execute_batch(
        "CREATE TABLE pages (id INTEGER PRIMARY KEY, title TEXT, body TEXT);
         INSERT INTO pages (title) VALUES ('one'), ('two'), ('three');",
    )
    .unwrap();
    let spec = CaptureSpec::new("pages", "page.{op}.v1", Columns::List(vec!["title".into()]));
    capture::apply(&mut conn, std::slice::from_ref(&spec), Timestamp::now()).unwrap();
    conn.execute_batch(
        "DROP TRIGGER outboxd_capture_update_pages; UPDATE pages SET title = 'uno' WHERE id = 1",
    )
    .unwrap();
    capture::apply(&mut conn, std::slice::from_ref(&spec), Timestamp::now()).unwrap();

    let mut p = spawn(&db.path, &["console", "--http", "127.0.0.1:0"], &[]);
    let addr = p.console_address();
    let page = get(&addr, "/capture");
    assert_eq!(page.status, 200, "{}", page.body);
    for needle in [
        "id=\"gaps\"",
        "intact; 1 open gap",
        ">title<",
        "Start snapshot",
    ] {
        assert!(page.body.contains(needle), "{needle} in {}", page.body);
    }
    let r = post_form(
        &addr,
        "/capture/snapshot",
        &[("capture", "pages"), ("csrf", &csrf(&page.body))],
    );
    assert_eq!(r.status, 303, "{}", r.body);
    let banner = get(&addr, r.header("Location").unwrap());
    assert!(
        banner.body.contains("Started a snapshot of capture pages"),
        "{}",
        banner.body
    );
    wait_until("the snapshot completed", Duration::from_secs(30), || {
        get(&addr, "/capture").body.contains(">completed<")
    });
    let page = get(&addr, "/capture");
    assert!(!page.body.contains("open gap"), "covered: {}", page.body);
    assert!(page.body.contains("by console"), "{}", page.body);

    // What happened to page 1: its r event, by ordering key and by key.
    for query in ["/events?ordering_key=pages%3A1", "/events?key=1"] {
        let found = get(&addr, query);
        assert_eq!(found.status, 200, "{}", found.body);
        assert!(
            found.body.contains("page.snapshot.v1"),
            "{query}: {}",
            found.body
        );
        assert!(
            !found.body.contains("page.snapshot_started.v1"),
            "{query}: {}",
            found.body
        );
    }
    let none = get(&addr, "/events?ordering_key=pages%3A99");
    assert!(!none.body.contains("page.snapshot.v1"), "{}", none.body);
    drop(p);
}
