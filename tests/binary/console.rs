//! The console over HTTP, against the real binary: what it refuses (a POST
//! without the CSRF token or from another origin, a request without the
//! token, a non-loopback address without one, a foreign Host), what
//! `outboxd run --http` serves beside its relay, and pages over rows that
//! foreign producers wrote badly. The browser tests are in
//! tests/binary/console_browser.rs.

// The console is part of the binary (the `cli` feature).
#![cfg(feature = "cli")]

use crate::common;
use crate::common::console as console_support;

use std::time::Duration;

use common::bin::{code, Outboxd, Running};
use console_support::{csrf, form, get, post_form, request, spawn, wait_until};
use rusqlite::params;

const T0: i64 = 1_764_487_080_000;
const WAIT: Duration = Duration::from_secs(30);

/// Inserts `n` dead letters of `ty` as a relay would leave them.
fn dead_letters(db: &common::TestDb, ty: &str, n: usize) {
    let conn = db.conn();
    for i in 0..n {
        conn.execute(
            "INSERT INTO event_outbox (event_id, event_type, status, attempts, last_error,
                 occurred_at, created_at, available_at, finished_at)
             VALUES (?1, ?2, 'dead', 3, 'hook: 500 Internal Server Error', ?3, ?3, ?3, ?3)",
            params![outboxd::EventId::new().to_string(), ty, T0 + i as i64],
        )
        .unwrap();
    }
}

fn console(db: &common::TestDb, extra: &[&str], env: &[(&str, &str)]) -> (Running, String) {
    let mut args = vec!["console", "--http", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let mut p = spawn(&db.path, &args, env);
    let addr = p.console_address();
    (p, addr)
}

#[test]
fn a_post_without_the_csrf_token_or_from_another_origin_changes_nothing() {
    let db = common::TestDb::new();
    dead_letters(&db, "article.created.v1", 3);
    let (_p, addr) = console(&db, &[], &[]);
    let page = get(&addr, "/dead");
    assert_eq!(page.status, 200, "{}", page.body);
    let token = csrf(&page.body);
    let own = format!("http://{addr}");
    let dead = || db.count("status = 'dead'");

    type Attempt<'a> = (&'a str, Vec<(&'a str, &'a str)>, String);
    let attempts: [Attempt; 5] = [
        (
            "no token",
            vec![("Origin", own.as_str())],
            form(&[("op", "requeue:all")]),
        ),
        (
            "a wrong token",
            vec![("Origin", own.as_str())],
            form(&[("op", "requeue:all"), ("csrf", &"0".repeat(64))]),
        ),
        (
            "another origin",
            vec![("Origin", "http://evil.example")],
            form(&[("op", "requeue:all"), ("csrf", &token)]),
        ),
        (
            "no origin nor referer",
            vec![],
            form(&[("op", "requeue:all"), ("csrf", &token)]),
        ),
        (
            "a referer elsewhere",
            vec![("Referer", "http://evil.example/dead")],
            form(&[("op", "discard:all"), ("csrf", &token)]),
        ),
    ];
    for (case, headers, body) in &attempts {
        let mut h = headers.clone();
        h.push(("Content-Type", "application/x-www-form-urlencoded"));
        let r = request(&addr, "POST", "/dead/apply", &h, body);
        assert_eq!(r.status, 403, "{case}: {}", r.body);
        assert_eq!(dead(), 3, "{case} changed nothing");
    }
    // The control: the same POST from the console's own page is taken.
    let r = request(
        &addr,
        "POST",
        "/dead/apply",
        &[
            ("Origin", &own),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        &form(&[("op", "requeue:all"), ("csrf", &token)]),
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(notice_in(&r, "/dead"), "requeued:3");
    assert_eq!(dead(), 0);
    assert_eq!(db.count("status = 'pending' AND attempts = 0"), 3);
}

/// The notice an action's redirect to `path` carries: the Location is
/// `{path}?done=`, then the sealed value (`{time}.{notice}.{mac}`,
/// percent-encoded), whose notice this returns.
fn notice_in(reply: &console_support::Reply, path: &str) -> String {
    let location = reply.header("Location").expect("a redirect");
    let sealed = location
        .strip_prefix(&format!("{path}?done="))
        .unwrap_or_else(|| panic!("{location}"));
    let mut bytes = Vec::new();
    let mut rest = sealed.as_bytes();
    while let Some((&b, tail)) = rest.split_first() {
        if b == b'%' {
            let hex = std::str::from_utf8(&tail[..2]).unwrap();
            bytes.push(u8::from_str_radix(hex, 16).unwrap());
            rest = &tail[2..];
        } else {
            bytes.push(b);
            rest = tail;
        }
    }
    let sealed = String::from_utf8(bytes).unwrap();
    let (_, rest) = sealed.split_once('.').unwrap();
    rest.rsplit_once('.').unwrap().0.to_string()
}

#[test]
fn a_banner_shows_only_what_the_console_itself_did() {
    let db = common::TestDb::new();
    dead_letters(&db, "article.created.v1", 2);
    let (_p, addr) = console(&db, &[], &[]);
    let banner = |path: &str| {
        let page = get(&addr, path);
        assert_eq!(page.status, 200, "{path}: {}", page.body);
        page.body
            .split_once("id=\"done\">")
            .map(|(_, rest)| rest.split('<').next().unwrap().to_string())
    };
    // Links made elsewhere show no banner, whatever they claim.
    for forged in [
        "/dead?requeued=5",
        "/dead?discarded=5",
        "/dead?done=requeued+5",
        "/dead?done=requeued%3A5",
        "/dead?done=1764487080.requeued%3A5.00",
        "/replay?replayed=5&to=everyone",
        "/replay?done=replayed%3A5%3Aeveryone",
    ] {
        assert_eq!(banner(forged), None, "{forged}");
    }
    // The console's own redirect does, in its own words.
    let token = csrf(&get(&addr, "/dead").body);
    let r = post_form(
        &addr,
        "/dead/apply",
        &[("op", "requeue:all"), ("csrf", &token)],
    );
    assert_eq!(r.status, 303, "{}", r.body);
    let location = r.header("Location").unwrap().to_string();
    assert_eq!(
        banner(&location).as_deref(),
        Some("Requeued 2 dead letters; the relay delivers them now.")
    );
    // Its count changed, the seal no longer holds.
    let altered = location.replace("requeued%3A2", "requeued%3A9");
    assert_ne!(altered, location);
    assert_eq!(banner(&altered), None);
}

#[test]
fn the_confirmation_names_how_many_rows_each_action_changes() {
    let db = common::TestDb::new();
    dead_letters(&db, "article.created.v1", 4);
    dead_letters(&db, "order.placed.v1", 2);
    let (_p, addr) = console(&db, &[], &[]);
    let token = csrf(&get(&addr, "/dead").body);
    let own = format!("http://{addr}");
    let post = |path: &str, pairs: &[(&str, &str)]| {
        let mut pairs = pairs.to_vec();
        pairs.push(("csrf", &token));
        request(
            &addr,
            "POST",
            path,
            &[
                ("Origin", &own),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            &form(&pairs),
        )
    };
    let confirm = post(
        "/dead/confirm",
        &[("op", "discard:type"), ("type", "order.*.v1")],
    );
    assert!(
        confirm.body.contains("data-count=\"2\""),
        "{}",
        confirm.body
    );
    let all = post("/dead/confirm", &[("op", "requeue:all")]);
    assert!(all.body.contains("data-count=\"6\""), "{}", all.body);
    // Confirming asks; it changes nothing.
    assert_eq!(db.count("status = 'dead'"), 6);
    let r = post(
        "/dead/apply",
        &[("op", "discard:type"), ("type", "order.*.v1")],
    );
    assert_eq!(notice_in(&r, "/dead"), "discarded:2");
    assert_eq!(db.count("status = 'dead'"), 4);
    let one: i64 = db.scalar("SELECT min(id) FROM event_outbox WHERE status = 'dead'");
    let r = post(
        "/dead/apply",
        &[("op", "requeue:selected"), ("id", &one.to_string())],
    );
    assert_eq!(notice_in(&r, "/dead"), "requeued:1");
    assert_eq!(db.count("status = 'dead'"), 3);
}

#[test]
fn read_only_hides_every_action_and_refuses_posts() {
    let db = common::TestDb::new();
    dead_letters(&db, "article.created.v1", 2);
    let (_p, addr) = console(&db, &["--read-only"], &[]);
    let page = get(&addr, "/dead");
    assert_eq!(page.status, 200);
    assert!(!page.body.contains("method=\"post\""), "{}", page.body);
    let event = get(&addr, "/events/1");
    assert!(!event.body.contains("Requeue"), "{}", event.body);
    let r = request(
        &addr,
        "POST",
        "/dead/apply",
        &[("Origin", &format!("http://{addr}"))],
        &form(&[("op", "requeue:all")]),
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(db.count("status = 'dead'"), 2);
}

#[test]
fn a_non_loopback_address_needs_a_token_and_requests_without_it_get_401() {
    let db = common::TestDb::new();
    dead_letters(&db, "article.created.v1", 1);
    // Without a token, outboxd refuses to start (a config error).
    let any = "0.0.0.0:0";
    let mut p = spawn(&db.path, &["console", "--http", any], &[]);
    assert_eq!(
        p.wait(Duration::from_secs(30)).code(),
        Some(code::CONFIG),
        "{}",
        p.stderr()
    );
    assert!(
        p.stderr().contains("not a loopback address"),
        "{}",
        p.stderr()
    );
    assert!(
        p.stderr().contains("--http-token-env VAR"),
        "the message names the command-line way: {}",
        p.stderr()
    );

    // With one, every request needs it.
    let token = "s3cret-token-for-the-console-test";
    let config = db.write(
        "outboxd.toml",
        "[http]\ntoken_env = \"CONSOLE_TEST_TOKEN\"\n[[consumer]]\nname = \"out\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = \"-\"\n",
    );
    let mut p = spawn(
        &db.path,
        &[
            "console",
            "--http",
            any,
            "--config",
            config.to_str().unwrap(),
        ],
        &[("CONSOLE_TEST_TOKEN", token)],
    );
    let addr = p.console_address().replace("0.0.0.0", "127.0.0.1");
    for path in ["/", "/dead", "/events/1", "/metrics", "/healthz"] {
        let r = get(&addr, path);
        assert_eq!(r.status, 401, "{path}: {}", r.body);
        assert!(
            !r.body.contains("article.created.v1"),
            "{path} leaks: {}",
            r.body
        );
    }
    assert!(get(&addr, "/metrics").header("WWW-Authenticate").is_some());
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let bearer = format!("{scheme} {token}");
        let r = request(&addr, "GET", "/metrics", &[("Authorization", &bearer)], "");
        assert_eq!(r.status, 200, "{scheme}: {}", r.body);
    }
    let r = request(
        &addr,
        "GET",
        "/",
        &[("Authorization", "Bearer wrong-token-wrong-token")],
        "",
    );
    assert_eq!(r.status, 401);

    // Logging in once sets an HttpOnly, SameSite=Strict cookie with an expiry.
    let own = format!("http://{addr}");
    let post_login = |given: &str| {
        request(
            &addr,
            "POST",
            "/login",
            &[
                ("Origin", &own),
                ("Content-Type", "application/x-www-form-urlencoded"),
            ],
            &form(&[("token", given)]),
        )
    };
    assert_eq!(post_login("not-the-token-at-all").status, 401);
    let ok = post_login(token);
    assert_eq!(ok.status, 303, "{}", ok.body);
    let cookie = ok.header("Set-Cookie").unwrap().to_string();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        cookie.contains("; Max-Age=43200"),
        "a 12h session: {cookie}"
    );
    assert!(!cookie.contains(token), "the cookie never holds the token");
    let session = cookie.split(';').next().unwrap();
    let r = request(&addr, "GET", "/dead", &[("Cookie", session)], "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("article.created.v1"));
}

#[test]
fn run_takes_the_console_token_variable_from_the_command_line() {
    let db = common::TestDb::new();
    let token = "a-token-from-the-command-line-42";
    let mut p = spawn(
        &db.path,
        &[
            "run",
            "--http",
            "0.0.0.0:0",
            "--http-token-env",
            "RUN_TEST_TOKEN",
        ],
        &[("RUN_TEST_TOKEN", token)],
    );
    let addr = p.console_address().replace("0.0.0.0", "127.0.0.1");
    assert_eq!(get(&addr, "/healthz").status, 401);
    let bearer = format!("Bearer {token}");
    let r = request(&addr, "GET", "/healthz", &[("Authorization", &bearer)], "");
    assert_eq!(r.status, 200, "{}", r.body);
    // An unset variable is refused, naming it.
    let mut p = spawn(
        &db.path,
        &[
            "console",
            "--http",
            "127.0.0.1:0",
            "--http-token-env",
            "UNSET_TOKEN_VAR_9z",
        ],
        &[],
    );
    assert_eq!(p.wait(WAIT).code(), Some(code::CONFIG), "{}", p.stderr());
    assert!(
        p.stderr().contains("UNSET_TOKEN_VAR_9z is not set"),
        "{}",
        p.stderr()
    );
}

/// A line of /proc/PID/status, such as "Threads" or "VmRSS", as a number.
fn proc_status(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap()
}

fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Idle connections cost a socket each, not a thread: the server keeps a
/// bounded pool of threads and a cap on waiting connections, so memory
/// stays bounded however many clients connect (5,000 idle ones once made
/// 3,894 threads), and it answers again once they go. (That it answers
/// beside them all along is console_slow_clients.rs.)
#[test]
fn a_flood_of_idle_connections_keeps_threads_and_memory_bounded() {
    let db = common::TestDb::new();
    let (p, addr) = console(&db, &[], &[]);
    let pid = p.pid();
    assert_eq!(get(&addr, "/healthz").status, 200);
    let (threads, rss_kib, files) = (
        proc_status(pid, "Threads"),
        proc_status(pid, "VmRSS"),
        open_files(pid),
    );
    let target: std::net::SocketAddr = addr.parse().unwrap();
    // Up to 1,000, until the listen queue is full too (connects then time
    // out: three in a row end it).
    let mut idle = Vec::new();
    let mut failed = 0;
    while idle.len() < 1000 && failed < 3 {
        match std::net::TcpStream::connect_timeout(&target, Duration::from_millis(200)) {
            Ok(s) => {
                idle.push(s);
                failed = 0;
            }
            Err(_) => failed += 1,
        }
    }
    assert!(idle.len() >= 300, "only {} connected", idle.len());
    // The server has taken most of them (the baseline may count a
    // connection or a pooled file that has gone since), and measured then:
    // it closes each after the 2 s head timeout.
    let (mut threads_now, mut rss_now) = (0, 0);
    wait_until("the server to accept most of them", WAIT, || {
        (threads_now, rss_now) = (proc_status(pid, "Threads"), proc_status(pid, "VmRSS"));
        open_files(pid) >= files + 500
    });
    assert!(
        threads_now <= threads + 4,
        "threads grew from {threads} to {threads_now} with {} idle connections",
        idle.len()
    );
    assert!(
        rss_now < rss_kib + 32 * 1024,
        "memory grew from {rss_kib} KiB to {rss_now} KiB"
    );
    drop(idle);
    let mut status = 0;
    wait_until("the console to answer again", WAIT, || {
        status = get(&addr, "/healthz").status;
        status == 200
    });
}

/// SIGTERM while an action runs (a requeue of 100,000 dead letters) lets
/// it finish and answer before `outboxd console` exits.
#[test]
fn sigterm_lets_a_long_console_action_finish_and_answer() {
    let db = common::TestDb::new();
    const N: i64 = 100_000;
    db.conn()
        .execute(
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
             INSERT INTO event_outbox (event_type, status, attempts, last_error, finished_at)
             SELECT 'article.created.v1', 'dead', 3, 'poison', ?2 + i FROM n",
            rusqlite::params![N, T0],
        )
        .unwrap();
    let (mut p, addr) = console(&db, &[], &[]);
    let token = csrf(&get(&addr, "/dead").body);
    let post = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            post_form(
                &addr,
                "/dead/apply",
                &[("op", "requeue:all"), ("csrf", &token)],
            )
        })
    };
    // Its first batches are committed: the request is being answered.
    wait_until("the requeue to be under way", WAIT, || {
        db.count("status = 'dead'") < N
    });
    p.signal("-TERM");
    let reply = post.join().unwrap();
    assert_eq!(reply.status, 303, "{reply:?}");
    assert_eq!(notice_in(&reply, "/dead"), format!("requeued:{N}"));
    assert_eq!(p.wait(WAIT).code(), Some(code::OK), "{}", p.stderr());
    assert_eq!(db.count("status = 'dead'"), 0);
}

#[test]
fn a_foreign_host_name_is_refused_on_loopback() {
    let db = common::TestDb::new();
    let (_p, addr) = console(&db, &[], &[]);
    let r = request(
        &addr,
        "GET",
        "/",
        &[("Host", "rebound.evil.example:80")],
        "",
    );
    assert_eq!(r.status, 403, "{r:?}");
    let out = r.body;
    assert!(out.contains("DNS rebinding"), "{out}");
    assert!(
        out.contains(&format!("open the console at http://{addr}/")),
        "the address to use, not a placeholder: {out}"
    );
    assert_eq!(get(&addr, "/").status, 200);
}

/// Regression: with its database file deleted, or another file moved into
/// its place, `outboxd run` went on writing to the old file, which nobody
/// reads, and /healthz said healthy. Now it logs an error, /healthz turns
/// 503 while it stops, and it exits 3.
#[test]
fn a_database_file_deleted_or_replaced_under_run_turns_health_red_and_exits_3() {
    for how in ["was deleted", "was replaced by another file"] {
        let db = common::TestDb::new();
        // A delivery in flight holds the shutdown open until the test lets
        // it go: the time to read /healthz while outboxd stops.
        let hold = db.write(
            "hold.sh",
            "#!/bin/sh
touch \"$OUT/started\"
while [ ! -e \"$OUT/release\" ]; do sleep 0.05; done
",
        );
        std::fs::set_permissions(&hold, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let config = db.write(
            "outboxd.toml",
            &format!(
                "[http]\nlisten = \"127.0.0.1:0\"\n[[consumer]]\nname = \"hold\"\ntypes = [\"*\"]\n\
                 [consumer.sink]\nkind = \"command\"\nprogram = \"{}\"\nenv = {{ OUT = \"{}\" }}\n",
                hold.display(),
                db.dir.path().display()
            ),
        );
        db.enqueue(&[common::event("article.created.v1", 1)]);
        let mut p = spawn(
            &db.path,
            &[
                "run",
                "--config",
                config.to_str().unwrap(),
                "--shutdown-grace",
                "1m",
            ],
            &[],
        );
        let addr = p.console_address();
        wait_until("the delivery to start", WAIT, || {
            p.assert_alive();
            db.file("started").exists()
        });
        assert_eq!(get(&addr, "/healthz").status, 200);
        if how == "was deleted" {
            std::fs::remove_file(&db.path).unwrap();
        } else {
            let other = db.write("other.db", "");
            std::fs::rename(other, &db.path).unwrap();
        }
        let mut health = None;
        wait_until("/healthz to turn unhealthy", WAIT, || {
            p.assert_alive();
            let r = get(&addr, "/healthz");
            let red = r.status == 503;
            health = Some(r);
            red
        });
        let body = health.unwrap().body;
        assert!(
            body.contains(how) && body.contains("\"database\""),
            "{body}"
        );
        std::fs::write(db.file("release"), "").unwrap();
        let status = p.wait(WAIT);
        assert_eq!(status.code(), Some(code::DATABASE), "{}", p.stderr());
        let stderr = p.stderr();
        assert!(stderr.contains("ERROR") && stderr.contains(how), "{stderr}");
    }
}

/// The threads of process `pid` named `name`.
fn threads_named(pid: u32, name: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

/// Regression: `[metrics] listen` beside the console started a second
/// console app: its own read pool, status and overview threads, server.
/// Now one app and one server answer both addresses, each with its rules.
#[test]
fn the_console_and_the_metrics_address_share_one_app() {
    let db = common::TestDb::new();
    let token = "a-token-for-the-console-only-1234";
    let mut p = spawn(
        &db.path,
        &[
            "run",
            "--http",
            "127.0.0.1:0",
            "--http-token-env",
            "SHARE_TEST_TOKEN",
            "--metrics",
            "127.0.0.1:0",
        ],
        &[("SHARE_TEST_TOKEN", token)],
    );
    let console_addr = p.console_address();
    let metrics_addr = p.logged_address("address=Some(");
    // Each address keeps its rules: the console wants the token, the
    // metrics address serves counts to anyone and nothing else.
    assert_eq!(get(&console_addr, "/metrics").status, 401);
    let m = get(&metrics_addr, "/metrics");
    assert_eq!(m.status, 200);
    assert!(m.body.contains("outboxd_status_up 1"), "{}", m.body);
    assert_eq!(get(&metrics_addr, "/healthz").status, 200);
    assert_eq!(get(&metrics_addr, "/").status, 404);
    let bearer = format!("Bearer {token}");
    let r = request(&console_addr, "GET", "/", &[("Authorization", &bearer)], "");
    assert_eq!(r.status, 200);
    // One status measure, one overview measure, one server thread.
    for name in ["outboxd-status", "outboxd-overvie", "outboxd-http"] {
        assert_eq!(threads_named(p.pid(), name), 1, "threads named {name}");
    }
}

#[test]
fn run_serves_the_console_metrics_and_health_beside_its_relay() {
    let db = common::TestDb::new();
    let out = db.file("out.jsonl");
    let config = db.write(
        "outboxd.toml",
        &format!(
            "[http]\nlisten = \"127.0.0.1:0\"\n[alerts]\nmax_dead = 0\n[[consumer]]\nname = \"file\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = \"{}\"\n",
            out.display()
        ),
    );
    let mut run = spawn(
        &db.path,
        &["run", "--config", config.to_str().unwrap()],
        &[],
    );
    let addr = run.console_address();
    db.enqueue(&[
        common::event("article.created.v1", 1),
        common::event("article.created.v1", 2),
    ]);
    wait_until("2 delivered", WAIT, || {
        db.count("status = 'delivered'") == 2
    });
    let mut metrics = String::new();
    wait_until("the metrics to count both deliveries", WAIT, || {
        metrics = get(&addr, "/metrics").body;
        metrics.contains("outboxd_deliveries_total{consumer=\"file\",result=\"delivered\"} 2")
    });
    for name in [
        "outboxd_events{status=\"delivered\"} 2",
        "outboxd_status_up 1",
        "outboxd_events_delivered_total 2",
        "# TYPE outboxd_commits_total counter",
    ] {
        assert!(metrics.contains(name), "{name} missing in:\n{metrics}");
    }
    let health = get(&addr, "/healthz");
    assert_eq!(health.status, 200, "{}", health.body);
    let v: serde_json::Value = serde_json::from_str(&health.body).unwrap();
    assert_eq!(v["healthy"], true);
    assert_eq!(v["counts"]["delivered"], 2);

    // A dead letter crosses alerts.max_dead = 0: 503 with the problem.
    dead_letters(&db, "order.placed.v1", 1);
    let mut health = get(&addr, "/healthz");
    wait_until("the health check to see the dead letter", WAIT, || {
        health = get(&addr, "/healthz");
        health.status == 503
    });
    let v: serde_json::Value = serde_json::from_str(&health.body).unwrap();
    assert_eq!(v["healthy"], false);
    assert_eq!(v["problems"][0]["threshold"], "max-dead");
    let overview = get(&addr, "/");
    assert_eq!(overview.status, 200);
    assert!(
        overview.body.contains("data-threshold=\"max-dead\""),
        "{}",
        overview.body
    );
}

/// The figure in `<span id="ID">N</span>` of a page, if it shows one.
fn figure(html: &str, id: &str) -> Option<u64> {
    let start = html.find(&format!("id=\"{id}\">"))? + id.len() + 6;
    html[start..].split('<').next()?.trim().parse().ok()
}

/// The overview's chart over the table: deliveries made before a restart
/// of `outboxd run` are still in the hour after it.
#[test]
fn the_overview_chart_keeps_the_hour_across_a_restart_of_run() {
    let db = common::TestDb::new();
    let config = db.write(
        "outboxd.toml",
        &format!(
            "[http]\nlisten = \"127.0.0.1:0\"\n[[consumer]]\nname = \"file\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = \"{}\"\n",
            db.file("out.jsonl").display()
        ),
    );
    let run_args = ["run", "--config", config.to_str().unwrap()];
    let mut run = spawn(&db.path, &run_args, &[]);
    run.console_address();
    let events: Vec<_> = (0..5)
        .map(|n| common::event("article.created.v1", n))
        .collect();
    db.enqueue(&events);
    wait_until("5 delivered", WAIT, || {
        db.count("status = 'delivered'") == 5
    });
    run.signal("-TERM");
    assert!(run.wait(WAIT).success(), "{}", run.stderr());

    let mut run = spawn(&db.path, &run_args, &[]);
    let addr = run.console_address();
    let mut page = String::new();
    wait_until("the overview to show its chart", WAIT, || {
        page = get(&addr, "/").body;
        figure(&page, "hour-delivered").is_some()
    });
    assert_eq!(figure(&page, "hour-delivered"), Some(5), "{page}");
    assert_eq!(figure(&page, "hour-enqueued"), Some(5), "{page}");
    assert_eq!(figure(&page, "hour-retried"), Some(0), "{page}");
}

/// Without a config, `run --http`'s /healthz, `outboxd status` and
/// `outboxd console` give one verdict from the same thresholds (any dead
/// letter is a problem), with the same fields.
#[test]
fn health_under_run_status_and_the_console_agree_without_a_config() {
    let db = common::TestDb::new();
    dead_letters(&db, "order.placed.v1", 10);
    let mut run = spawn(&db.path, &["run", "--http", "127.0.0.1:0"], &[]);
    let run_addr = run.console_address();
    let (_console, console_addr) = console(&db, &[], &[]);

    let status = Outboxd::on(&db.path).json(&["status", "--json"], code::PROBLEMS);
    assert_eq!(status["healthy"], false, "{status}");
    assert_eq!(status["problems"][0]["threshold"], "max-dead", "{status}");
    for addr in [&run_addr, &console_addr] {
        let health = get(addr, "/healthz");
        assert_eq!(health.status, 503, "{addr}: {}", health.body);
        let v: serde_json::Value = serde_json::from_str(&health.body).unwrap();
        for field in ["healthy", "problems", "counts"] {
            assert_eq!(v[field], status[field], "{addr}: {field}: {v}");
        }
        let overview = get(addr, "/");
        assert!(
            overview.body.contains("data-threshold=\"max-dead\""),
            "{addr}: {}",
            overview.body
        );
    }
}

#[test]
fn pages_show_rows_that_foreign_producers_wrote_badly() {
    let db = common::TestDb::new();
    let conn = db.conn();
    // An integer tenant, a blob type, a payload that is not JSON, a
    // lower-case event id, and a payload over the page's cap.
    conn.execute(
        "INSERT INTO event_outbox (event_id, event_type, tenant_id, payload, status, finished_at, last_error)
         VALUES ('01jdq7x6zb5n4q2w8v1k3m9t0r', CAST('Bad Type' AS BLOB), 42, '{not json', 'dead', 1, 'invalid')",
        [],
    )
    .unwrap();
    let big = format!("{{\"x\":\"{}\"}}", "y".repeat(200_000));
    conn.execute(
        "INSERT INTO event_outbox (event_type, payload) VALUES ('article.created.v1', ?1)",
        [&big],
    )
    .unwrap();
    let (_p, addr) = console(&db, &[], &[]);
    for path in [
        "/",
        "/events",
        "/events?state=dead",
        "/dead",
        "/events/1",
        "/events/2",
        "/intents",
        "/capture",
        "/replay",
    ] {
        let r = get(&addr, path);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
    }
    let by_id = get(&addr, "/events/01JDQ7X6ZB5N4Q2W8V1K3M9T0R");
    assert_eq!(by_id.status, 200, "{}", by_id.body);
    assert!(by_id.body.contains("Bad Type"));
    assert!(
        by_id.body.contains("cannot build this event"),
        "{}",
        by_id.body
    );
    let big_page = get(&addr, "/events/2");
    assert!(big_page.body.len() < 100_000, "the payload is capped");
    assert!(big_page.body.contains("Showing the first 64 KiB"));
    assert_eq!(get(&addr, "/events/999").status, 404);
    assert_eq!(get(&addr, "/events?type=Bad").status, 400);
    assert_eq!(get(&addr, "/nope").status, 404);
}

/// A console action under `run` must not open the database file outside
/// SQLite: on Linux closing any descriptor of a file drops every POSIX lock
/// the process holds on it, the relay's too, and the next foreign
/// connection to close then checkpoints and deletes the WAL the relay is
/// still writing (sqlite.org/howtocorrupt.html, 2.2).
#[test]
fn a_console_requeue_under_run_keeps_the_relays_locks_and_its_wal() {
    let db = common::TestDb::new();
    dead_letters(&db, "article.created.v1", 1);
    let out = db.file("out.jsonl");
    let config = db.write(
        "outboxd.toml",
        &format!(
            "[[consumer]]\nname = \"file\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = \"{}\"\n",
            out.display()
        ),
    );
    let mut run = spawn(
        &db.path,
        &[
            "run",
            "--config",
            config.to_str().unwrap(),
            "--http",
            "127.0.0.1:0",
        ],
        &[],
    );
    let addr = run.console_address();
    let lines = || -> Vec<String> {
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    };
    let token = csrf(&get(&addr, "/dead").body);
    let r = post_form(
        &addr,
        "/dead/apply",
        &[("op", "requeue:all"), ("csrf", &token)],
    );
    assert_eq!(r.status, 303, "{}", r.body);
    wait_until("the requeued event delivered", WAIT, || lines().len() == 1);
    // Each look at the table is a foreign connection too.
    wait_until("the requeued event recorded as delivered", WAIT, || {
        db.count("status = 'delivered'") == 1
    });

    assert!(
        holds_a_lock_on(run.pid(), &db.path),
        "outboxd run lost its SQLite locks on the database:\n{}",
        std::fs::read_to_string("/proc/locks").unwrap()
    );
    // A foreign connection comes, reads and goes, as `sqlite3 app.db` would.
    // Through python3's sqlite3 (the system's SQLite): newer SQLites do not
    // checkpoint on close while another process maps the WAL index, so a
    // connection of this test's bundled SQLite would hide the damage.
    let foreign = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3, sys\n\
             c = sqlite3.connect(sys.argv[1])\n\
             c.execute('SELECT count(*) FROM event_outbox').fetchone()\n\
             c.close()",
        ])
        .arg(&db.path)
        .status()
        .unwrap();
    assert!(foreign.success());
    assert!(
        db.file("app.db-wal").exists(),
        "the WAL of the running relay was checkpointed and deleted by a foreign connection"
    );

    let id = db.enqueue(&[common::event("order.placed.v1", 7)])[0].to_string();
    wait_until("the new event delivered", WAIT, || {
        lines().iter().any(|l| l.contains(&id))
    });
    wait_until("the new event recorded as delivered", WAIT, || {
        db.count("status = 'delivered'") == 2
    });
    run.assert_alive();
    assert_eq!(run.stop().code(), Some(code::OK), "{}", run.stderr());
    assert_eq!(
        lines().iter().filter(|l| l.contains(&id)).count(),
        1,
        "delivered exactly once"
    );
    let check: String = db.scalar("PRAGMA integrity_check");
    assert_eq!(check, "ok");
}

/// True when process `pid` holds a POSIX lock on `path` (/proc/locks): an
/// SQLite connection in WAL mode keeps a shared lock on its database file
/// while it is open.
fn holds_a_lock_on(pid: u32, path: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let inode = std::fs::metadata(path).unwrap().ino();
    std::fs::read_to_string("/proc/locks")
        .unwrap()
        .lines()
        .any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(1) == Some(&"POSIX")
                && f.get(4) == Some(&pid.to_string().as_str())
                && f.get(5)
                    .and_then(|dev| dev.rsplit(':').next())
                    .is_some_and(|i| i == inode.to_string())
        })
}
