//! The console in a real browser: headless Chromium (Debian's `chromium`)
//! driven over WebDriver (`chromedriver`), against the real binary.
//!
//! - the overview's figures equal `outboxd status --json`;
//! - a dead letter requeued from its page is delivered by the running relay;
//! - hostile tenant ids, keys and errors render as text and no script runs,
//!   while the same values on a control page without escaping do run (so the
//!   detector works);
//! - a form on another site cannot change anything, even with a valid CSRF
//!   token;
//! - every page is screenshotted to target/console-screenshots/.
//!
//! Outside CI a missing browser skips these tests (.ci/run installs it).

// The console is part of the binary (the `cli` feature).
#![cfg(feature = "cli")]

use crate::common;
use crate::common::console as console_support;

use std::path::PathBuf;
use std::time::Duration;

use common::http::{Answer, Receiver};
use console_support::{browser_available, get, screenshot_dir, spawn, wait_until, Browser};
use outboxd::{Event, Timestamp};
use rusqlite::params;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);

fn insert_dead(db: &common::TestDb, ty: &str, tenant: &str, key: Option<&str>, error: &str) -> i64 {
    let now = Timestamp::now().as_millis();
    let conn = db.conn();
    conn.execute(
        "INSERT INTO event_outbox (event_id, event_type, tenant_id, idempotency_key, payload,
             status, attempts, last_error, occurred_at, created_at, available_at, finished_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 'dead', 3, ?6, ?7, ?7, ?7, ?7)",
        params![
            outboxd::EventId::new().to_string(),
            ty,
            tenant,
            key,
            r#"{"title": "</pre><script>window.__xss=3</script>"}"#,
            error,
            now
        ],
    )
    .unwrap();
    conn.last_insert_rowid()
}

/// A config serving the console on port 0 (the test reads the port from
/// the log: `Running::console_address`).
fn run_config(db: &common::TestDb, sink: &str) -> PathBuf {
    db.write(
        "outboxd.toml",
        &format!("[http]\nlisten = \"127.0.0.1:0\"\n[alerts]\nmax_dead = 0\n{sink}"),
    )
}

fn jsonl_consumer(db: &common::TestDb) -> String {
    format!(
        "[[consumer]]\nname = \"search-index\"\ntypes = [\"article.*.v1\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = \"{}\"\n",
        db.file("out.jsonl").display()
    )
}

/// Loads `/` until it shows a status measured at or after `after` (ms).
fn overview_measured_after(b: &Browser, addr: &str, after: i64) {
    wait_until("an overview measured after the last change", WAIT, || {
        b.goto(&format!("http://{addr}/"));
        b.exec(
            "const e = document.getElementById('measured-at'); return e ? Number(e.dataset.ms) : 0",
        )
        .as_i64()
        .unwrap_or(0)
            >= after
    });
}

#[test]
fn overview_figures_equal_status_json_and_every_page_is_screenshotted() {
    if !browser_available() {
        return;
    }
    let db = common::TestDb::new();
    let config = run_config(&db, &jsonl_consumer(&db));
    let mut run = spawn(
        &db.path,
        &["run", "--config", config.to_str().unwrap()],
        &[],
    );
    let addr = run.console_address();
    let mut events: Vec<Event> = (0..7)
        .map(|n| common::event("article.created.v1", n))
        .collect();
    events.push(common::event("article.updated.v1", 99).delay(Duration::from_secs(3600)));
    db.enqueue(&events);
    insert_dead(
        &db,
        "order.placed.v1",
        "acme",
        None,
        "hook: 500 Internal Server Error",
    );
    insert_dead(
        &db,
        "order.placed.v1",
        "acme",
        None,
        "hook: timed out after 10s",
    );
    wait_until("7 delivered", WAIT, || {
        db.count("status = 'delivered'") == 7
    });
    let settled = Timestamp::now().as_millis();

    let status = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
        .args([
            "--db",
            db.path.to_str().unwrap(),
            "status",
            "--json",
            "--config",
            config.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let status: Value = serde_json::from_slice(&status.stdout)
        .or_else(|_| {
            // Before `status --config` exists, the same thresholds by flag.
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_outboxd"))
                .args([
                    "--db",
                    db.path.to_str().unwrap(),
                    "status",
                    "--json",
                    "--max-dead",
                    "0",
                ])
                .output()
                .unwrap();
            serde_json::from_slice(&out.stdout)
        })
        .unwrap();

    // The relay's counters (the chart's figures) follow its commits, which
    // the table shows first: wait until they count all seven too.
    wait_until("the relay's counters to show 7 delivered", WAIT, || {
        get(&addr, "/metrics")
            .body
            .contains("outboxd_events_delivered_total 7")
    });
    let b = Browser::start();
    overview_measured_after(&b, &addr, settled);
    let counts = &status["counts"];
    for (id, key) in [
        ("count-pending-due", "pending_due"),
        ("count-pending-delayed", "pending_delayed"),
        ("count-leased", "leased"),
        ("count-delivered", "delivered"),
        ("count-dead", "dead"),
    ] {
        assert_eq!(
            b.text(&format!("#{id}")),
            counts[key].to_string(),
            "{key}: status --json says {status}"
        );
    }
    assert_eq!(b.text("#leases-held"), status["leases_held"].to_string());
    assert_eq!(
        b.text("#leases-expired"),
        status["expired_leases"].to_string()
    );
    assert_eq!(status["oldest_due_age_ms"], Value::Null);
    assert_eq!(b.text("#oldest-due"), "none");
    assert_eq!(
        b.exec("return document.getElementById('health').dataset.healthy"),
        Value::String(status["healthy"].to_string())
    );
    assert_eq!(status["healthy"], false, "2 dead letters > max_dead 0");
    assert_eq!(
        b.exec("return document.querySelector('#health [data-threshold]').dataset.threshold"),
        status["problems"][0]["threshold"]
    );
    for (consumer, n) in status["delivered_by_consumer"].as_object().unwrap() {
        assert_eq!(
            b.text(&format!("tr[data-consumer='{consumer}'] td.delivered")),
            n.to_string()
        );
    }
    // The relay's own figures over the hour, whether or not the minute
    // turned (and its sample was taken) since the deliveries.
    assert_eq!(b.text("#hour-delivered"), "7");

    let shots = screenshot_dir();
    b.screenshot(&shots.join("overview.png"));
    let first_dead: i64 = db.scalar("SELECT min(id) FROM event_outbox WHERE status = 'dead'");
    for (name, path) in [
        ("events", "/events".to_string()),
        ("event", "/events/1".to_string()),
        ("dead", "/dead".to_string()),
        ("dead-letter", format!("/events/{first_dead}")),
        (
            "replay",
            "/replay?consumer=search-index&type=article.*.v1".to_string(),
        ),
        ("intents", "/intents".to_string()),
        ("capture", "/capture".to_string()),
    ] {
        b.goto(&format!("http://{addr}{path}"));
        b.screenshot(&shots.join(format!("{name}.png")));
    }
    // The replay page counted before offering to replay.
    b.goto(&format!(
        "http://{addr}/replay?consumer=search-index&type=article.*.v1"
    ));
    assert_eq!(b.text("#replay-count strong"), "7");
    b.goto(&format!("http://{addr}/dead"));
    b.click("button[value='requeue:all']");
    b.wait_url("the confirmation", |u| u.ends_with("/dead/confirm"));
    assert_eq!(
        b.exec("return document.getElementById('confirm-count').dataset.count"),
        Value::String("2".into())
    );
    b.screenshot(&shots.join("confirm.png"));
    assert_eq!(db.count("status = 'dead'"), 2, "confirming changes nothing");
    for name in [
        "overview",
        "events",
        "event",
        "dead",
        "dead-letter",
        "replay",
        "intents",
        "capture",
        "confirm",
    ] {
        let png = std::fs::read(shots.join(format!("{name}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "{name}.png is a PNG");
    }
}

#[test]
fn a_dead_letter_requeued_from_its_page_is_delivered_by_the_running_relay() {
    if !browser_available() {
        return;
    }
    let db = common::TestDb::new();
    // Poisons every event until the file `fixed` exists, then takes them.
    let script = db.write(
        "deliver.sh",
        &format!(
            "#!/bin/sh\nif [ -f '{dir}/fixed' ]; then cat >> '{dir}/got.jsonl'; echo >> '{dir}/got.jsonl'; exit 0; fi\nexit 3\n",
            dir = db.dir.path().display()
        ),
    );
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let sink = format!(
        "[[consumer]]\nname = \"billing\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"command\"\nprogram = \"{}\"\npoison_exit_code = 3\n",
        script.display()
    );
    let config = run_config(&db, &sink);
    let mut run = spawn(
        &db.path,
        &["run", "--config", config.to_str().unwrap()],
        &[],
    );
    let addr = run.console_address();
    let ids = db.enqueue(&[common::event("invoice.issued.v1", 1)]);
    wait_until("the event to be dead-lettered", WAIT, || {
        db.count("status = 'dead'") == 1
    });
    let row: i64 = db.scalar("SELECT id FROM event_outbox WHERE status = 'dead'");
    std::fs::write(db.file("fixed"), "").unwrap();

    let b = Browser::start();
    b.goto(&format!("http://{addr}/dead"));
    b.click(&format!("a[href='/events/{row}']"));
    b.wait_url("the event's page", |u| {
        u.ends_with(&format!("/events/{row}"))
    });
    b.click("button[value='requeue:selected']");
    b.wait_url("the confirmation", |u| u.ends_with("/dead/confirm"));
    assert_eq!(b.text("#confirm-count strong"), "1");
    b.click("#confirm");
    b.wait_url("the dead letters again", |u| u.contains("/dead?done="));
    assert!(b.text("#done").starts_with("Requeued 1"));
    wait_until("the relay to deliver the requeued event", WAIT, || {
        db.count("status = 'delivered'") == 1
    });
    let got = std::fs::read_to_string(db.file("got.jsonl")).unwrap();
    assert!(got.contains(&ids[0].to_string()), "{got}");
}

/// Serves `body` as HTML (no CSP, no escaping) to every request, on a
/// thread, until the process ends; its address.
fn control_server(body: String) -> String {
    let server = Receiver::start(move |_, _| {
        Answer::new("200 OK", &body).header("Content-Type", "text/html")
    });
    server.addr.to_string()
}

const SCRIPT_TENANT: &str = "<script>window.__xss=1</script>";
const IMG_KEY: &str = "\"><img src=x onerror=\"window.__xss=2\">";

#[test]
fn hostile_values_render_as_text_and_no_script_runs() {
    if !browser_available() {
        return;
    }
    let b = Browser::start();
    // The control: the same values written into a page unescaped do run,
    // so `window.__xss` would show a script that ran on the console.
    let control = control_server(format!(
        "<html><body><p>{SCRIPT_TENANT}</p><p title=\"{IMG_KEY}\"></p><p><b x=\"{IMG_KEY}\"></b></p></body></html>"
    ));
    b.goto(&format!("http://{control}/"));
    wait_until("the control page's injected script to run", WAIT, || {
        !b.exec("return window.__xss === undefined ? null : window.__xss")
            .is_null()
    });

    let db = common::TestDb::new();
    let error = format!("consumer said {SCRIPT_TENANT} and {IMG_KEY}");
    let row = insert_dead(
        &db,
        "article.created.v1",
        SCRIPT_TENANT,
        Some(IMG_KEY),
        &error,
    );
    let mut p = spawn(&db.path, &["console", "--http", "127.0.0.1:0"], &[]);
    let addr = p.console_address();
    for path in [format!("/events/{row}"), "/events".into(), "/dead".into()] {
        b.goto(&format!("http://{addr}{path}"));
        assert_eq!(
            b.exec("return [window.__xss === undefined, document.querySelectorAll('img, script').length]"),
            serde_json::json!([true, 0]),
            "{path}"
        );
        let tenant = b.text(".tenant");
        assert_eq!(tenant, SCRIPT_TENANT, "{path}: the tenant shows as text");
    }
    b.goto(&format!("http://{addr}/events/{row}"));
    assert_eq!(b.text("dd.key"), IMG_KEY);
    assert_eq!(b.text("#last-error"), error);
    assert!(b
        .text("#payload")
        .contains("</pre><script>window.__xss=3</script>"));
    b.screenshot(&screenshot_dir().join("hostile.png"));
}

#[test]
fn a_form_on_another_site_changes_nothing_even_with_the_csrf_token() {
    if !browser_available() {
        return;
    }
    let db = common::TestDb::new();
    insert_dead(&db, "order.placed.v1", "acme", None, "boom");
    let mut p = spawn(&db.path, &["console", "--http", "127.0.0.1:0"], &[]);
    let addr = p.console_address();
    // Even a token that leaked does not help a page on another origin.
    let token = console_support::csrf(&get(&addr, "/dead").body);
    let evil = control_server(format!(
        "<html><body>\
         <form id=with method=post action=\"http://{addr}/dead/apply\">\
           <input type=hidden name=op value=\"discard:all\"><input type=hidden name=csrf value=\"{token}\">\
           <button id=go-with type=submit>win a prize</button></form>\
         <form id=without method=post action=\"http://{addr}/dead/apply\">\
           <input type=hidden name=op value=\"discard:all\">\
           <button id=go-without type=submit>win another</button></form>\
         </body></html>"
    ));
    let b = Browser::start();
    for button in ["#go-with", "#go-without"] {
        b.goto(&format!("http://{evil}/"));
        b.click(button);
        b.wait_url("the console's answer", |u| {
            u.starts_with(&format!("http://{addr}/dead/apply"))
        });
        let source = b.source();
        assert!(source.contains("nothing was changed"), "{button}: {source}");
        assert_eq!(db.count("status = 'dead'"), 1, "{button} changed nothing");
    }
}

/// Writes the README's screenshot of the overview (scripts/console-screenshot.sh).
#[test]
#[ignore = "run by scripts/console-screenshot.sh"]
fn readme_screenshot() {
    let out = PathBuf::from(
        std::env::var("OUTBOXD_SCREENSHOT").unwrap_or_else(|_| "docs/console.png".into()),
    );
    assert!(
        browser_available(),
        "the screenshot needs chromium and chromedriver"
    );
    let db = common::TestDb::new();
    // An hour of traffic, written with its times, so the table-derived
    // chart of `outboxd console` has a shape.
    let now = Timestamp::now().as_millis();
    {
        let mut conn = db.conn();
        let tx = conn.transaction().unwrap();
        for minute in 0..60i64 {
            let at = now - (59 - minute) * 60_000;
            let wave = 20.0 + 14.0 * ((minute as f64) / 7.0).sin() + (minute % 5) as f64;
            for k in 0..wave as i64 {
                let t = at - k * 700;
                let (status, finished, err) = match k % 37 {
                    0 if minute % 3 == 0 => (
                        "dead",
                        Some(t + 9_000),
                        Some("webhook: 503 Service Unavailable (attempt 10 of 10)"),
                    ),
                    _ if minute > 57 && k % 4 == 0 => ("pending", None, None),
                    _ => ("delivered", Some(t + 300 + k * 10), None),
                };
                tx.execute(
                    "INSERT INTO event_outbox (event_id, event_type, tenant_id, payload, status,
                         attempts, last_error, occurred_at, created_at, available_at, finished_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?8, ?9)",
                    params![
                        outboxd::EventId::new().to_string(),
                        [
                            "article.created.v1",
                            "article.published.v1",
                            "order.placed.v1"
                        ][(k % 3) as usize],
                        ["acme", "globex", "initech"][(minute % 3) as usize],
                        format!("{{\"id\": {}}}", minute * 100 + k),
                        status,
                        if status == "dead" { 10 } else { 0 },
                        err,
                        t,
                        finished,
                    ],
                )
                .unwrap();
                if status == "delivered" {
                    let id = tx.last_insert_rowid();
                    for consumer in ["search-index", "webhook"] {
                        tx.execute(
                            "INSERT INTO delivered_events (event_key, consumer, outbox_id, delivered_at)
                             SELECT event_id, ?1, id, ?2 FROM event_outbox WHERE id = ?3",
                            params![consumer, t + 300, id],
                        )
                        .unwrap();
                    }
                }
            }
        }
        tx.commit().unwrap();
    }
    let config = db.write(
        "outboxd.toml",
        "[alerts]\nmax_dead = 100\n\
         [[consumer]]\nname = \"search-index\"\ntypes = [\"article.*.v1\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = \"-\"\n\
         [[consumer]]\nname = \"webhook\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = \"-\"\n",
    );
    let mut p = spawn(
        &db.path,
        &[
            "console",
            "--http",
            "127.0.0.1:0",
            "--config",
            config.to_str().unwrap(),
        ],
        &[],
    );
    let addr = p.console_address();
    let b = Browser::start();
    overview_measured_after(&b, &addr, now);
    b.goto(&format!("http://{addr}/"));
    b.screenshot(&out);
    eprintln!("wrote {}", out.display());
}
