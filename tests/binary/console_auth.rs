//! The console's authentication against the real binary: wrong tokens
//! throttled and logged per peer, sessions that end on logout and at a
//! restart, CSRF tokens tied to their session, none on the login form, and
//! the warning a weak token gives at start.

// The console is part of the binary (the `cli` feature).
#![cfg(feature = "cli")]

use crate::common;
use crate::common::console as console_support;

use std::time::Duration;

use common::bin::Running;
use console_support::{csrf, get, post_form_with, request, spawn, wait_until, Reply};

const WAIT: Duration = Duration::from_secs(30);

/// A strong token: the output of `openssl rand -hex 32`.
const TOKEN: &str = "3f9c1e7a5b2d84f06c1a9e3b7d5f2c8a41e6b9d03c7f5a2e8b1d4c6f9a3e7b20";

/// `outboxd console` on 0.0.0.0 with `token` in its variable and `extra`
/// lines in `[http]`; the address to reach it at.
fn console(db: &common::TestDb, token: &str, extra: &str) -> (Running, String) {
    let config = db.write(
        "outboxd.toml",
        &format!(
            "[http]\ntoken_env = \"CONSOLE_AUTH_TOKEN\"\n{extra}\
             [[consumer]]\nname = \"out\"\ntypes = [\"*\"]\n\
             [consumer.sink]\nkind = \"jsonl\"\npath = \"-\"\n"
        ),
    );
    let mut p = spawn(
        &db.path,
        &[
            "console",
            "--http",
            "0.0.0.0:0",
            "--config",
            config.to_str().unwrap(),
        ],
        &[("CONSOLE_AUTH_TOKEN", token)],
    );
    let addr = p.console_address().replace("0.0.0.0", "127.0.0.1");
    (p, addr)
}

/// POST /login with `given`, from the console's own page, with `headers`.
fn login(addr: &str, given: &str, headers: &[(&str, &str)]) -> Reply {
    post_form_with(addr, "/login", headers, &[("token", given)])
}

/// The `name=value` a login's Set-Cookie sets.
fn session_cookie(reply: &Reply) -> String {
    assert_eq!(reply.status, 303, "{}", reply.body);
    let set = reply.header("Set-Cookie").expect("a session cookie");
    set.split(';').next().unwrap().to_string()
}

/// A form POSTed from the console's own page with `cookie`.
fn post_as(addr: &str, cookie: &str, path: &str, pairs: &[(&str, &str)]) -> Reply {
    post_form_with(addr, path, &[("Cookie", cookie)], pairs)
}

fn get_as(addr: &str, cookie: &str, path: &str) -> Reply {
    request(addr, "GET", path, &[("Cookie", cookie)], "")
}

#[test]
fn wrong_tokens_are_logged_and_then_refused_for_that_peer_even_the_right_one() {
    let db = common::TestDb::new();
    let (p, addr) = console(&db, TOKEN, "");
    // A session opened before the guessing goes on through it.
    let before = session_cookie(&login(&addr, TOKEN, &[]));
    for i in 0..5 {
        let r = login(&addr, &format!("guess-number-{i}"), &[]);
        assert_eq!(r.status, 401, "guess {i}: {}", r.body);
    }
    let r = login(&addr, TOKEN, &[]);
    assert_eq!(r.status, 429, "{}", r.body);
    let retry: u64 = r.header("Retry-After").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert!(r.body.contains("Too many wrong tokens"), "{}", r.body);
    let bearer = format!("Bearer {TOKEN}");
    let r = request(&addr, "GET", "/metrics", &[("Authorization", &bearer)], "");
    assert_eq!(r.status, 429, "a bearer from that peer too: {}", r.body);
    // X-Forwarded-For is not trusted here: a forged one changes nothing.
    let r = login(&addr, TOKEN, &[("X-Forwarded-For", "203.0.113.9")]);
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(get_as(&addr, &before, "/dead").status, 200);
    // Each wrong token is logged naming the peer, and so is the lockout.
    wait_until("the lockout logged", WAIT, || {
        p.stderr()
            .contains("token attempts from 127.0.0.1 are refused")
    });
    let log = p.stderr();
    let wrong: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("a wrong token from 127.0.0.1"))
        .collect();
    assert_eq!(wrong.len(), 5, "{log}");
    assert!(wrong[4].contains("(5 in a row)"), "{log}");
    assert!(
        !log.contains("guess-number"),
        "never the token given: {log}"
    );
}

#[test]
fn behind_a_trusted_proxy_wrong_tokens_count_against_the_forwarded_client() {
    let db = common::TestDb::new();
    let (p, addr) = console(&db, TOKEN, "trust_forwarded_for = true\n");
    let from = |client: &'static str| [("X-Forwarded-For", client)];
    for _ in 0..5 {
        assert_eq!(login(&addr, "wrong", &from("198.51.100.7")).status, 401);
    }
    assert_eq!(login(&addr, TOKEN, &from("198.51.100.7")).status, 429);
    // Another client behind the same proxy (the same socket address).
    let other = login(&addr, TOKEN, &from("198.51.100.8"));
    assert_eq!(other.status, 303, "{}", other.body);
    wait_until("the lockout logged", WAIT, || {
        p.stderr()
            .contains("token attempts from 198.51.100.7 are refused")
    });
}

#[test]
fn logging_out_ends_the_session_and_a_restart_ends_them_all() {
    let db = common::TestDb::new();
    let (mut p, addr) = console(&db, TOKEN, "");
    let cookie = session_cookie(&login(&addr, TOKEN, &[]));
    let page = get_as(&addr, &cookie, "/dead");
    assert_eq!(page.status, 200, "{}", page.body);
    let r = post_as(&addr, &cookie, "/logout", &[("csrf", &csrf(&page.body))]);
    assert_eq!(r.status, 303, "{}", r.body);
    assert!(r.header("Set-Cookie").unwrap().contains("Max-Age=0"));
    // The old cookie, kept by whoever had it, opens nothing.
    for path in ["/", "/dead", "/events/1"] {
        let r = get_as(&addr, &cookie, path);
        assert_eq!(r.status, 401, "{path}: {}", r.body);
        assert!(
            r.body.contains("action=\"/login\""),
            "the login page: {}",
            r.body
        );
    }
    assert_eq!(get_as(&addr, &cookie, "/metrics").status, 401);

    // A session still open when outboxd restarts ends with it.
    let cookie = session_cookie(&login(&addr, TOKEN, &[]));
    assert_eq!(get_as(&addr, &cookie, "/dead").status, 200);
    p.stop();
    let (_p, addr) = console(&db, TOKEN, "");
    assert_eq!(get_as(&addr, &cookie, "/dead").status, 401);
}

#[test]
fn a_csrf_token_from_another_session_is_refused_and_the_login_form_has_none() {
    let db = common::TestDb::new();
    let conn = db.conn();
    conn.execute(
        "INSERT INTO event_outbox (event_id, event_type, status, attempts, last_error,
             occurred_at, created_at, available_at, finished_at)
         VALUES (?1, 'article.created.v1', 'dead', 3, 'boom', 1, 1, 1, 1)",
        [outboxd::EventId::new().to_string()],
    )
    .unwrap();
    let (_p, addr) = console(&db, TOKEN, "");
    let login_page = get(&addr, "/login");
    assert_eq!(login_page.status, 200);
    assert!(
        !login_page.body.contains("name=\"csrf\""),
        "no CSRF token for a visitor: {}",
        login_page.body
    );
    assert!(!login_page.body.contains("action=\"/logout\""));
    let (a, b) = (
        session_cookie(&login(&addr, TOKEN, &[])),
        session_cookie(&login(&addr, TOKEN, &[])),
    );
    let (csrf_a, csrf_b) = (
        csrf(&get_as(&addr, &a, "/dead").body),
        csrf(&get_as(&addr, &b, "/dead").body),
    );
    assert_ne!(csrf_a, csrf_b, "a token per session");
    // Session b sends a form with session a's token, then with its own.
    let requeue_as_b = |token: &str| {
        post_as(
            &addr,
            &b,
            "/dead/apply",
            &[("op", "requeue:all"), ("csrf", token)],
        )
    };
    let r = requeue_as_b(&csrf_a);
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(db.count("status = 'dead'"), 1, "nothing changed");
    let r = requeue_as_b(&csrf_b);
    assert_eq!(r.status, 303, "its own token is taken: {}", r.body);
    assert_eq!(db.count("status = 'dead'"), 0);
}

#[test]
fn a_weak_token_starts_with_a_loud_warning_and_a_strong_one_without() {
    let db = common::TestDb::new();
    let weak = "a".repeat(16);
    let (mut p, addr) = console(&db, &weak, "");
    let bearer = format!("Bearer {weak}");
    let r = request(&addr, "GET", "/healthz", &[("Authorization", &bearer)], "");
    assert_eq!(r.status, 200, "it starts, for this release: {}", r.body);
    let log = p.stderr();
    let line = log
        .lines()
        .find(|l| l.contains("WEAK CONSOLE TOKEN"))
        .unwrap_or_else(|| panic!("no warning: {log}"));
    for part in [
        "WARN",
        "the token in CONSOLE_AUTH_TOKEN is weak (it has 16 characters, fewer than 32)",
        "the next release will refuse it",
        "openssl rand -hex 32",
    ] {
        assert!(line.contains(part), "{part:?} in {line}");
    }
    assert!(!log.contains(&weak), "never the token: {log}");
    p.stop();

    // `openssl rand -hex 32` and `openssl rand -base64 32` output.
    for strong in [TOKEN, "q8ZJ0m3vX+Yt9wQbN2kR7cLhUe5sGfA1dPoVy4iWnTk="] {
        let (mut p, _addr) = console(&db, strong, "");
        assert!(!p.stderr().contains("WEAK"), "{strong}: {}", p.stderr());
        p.stop();
    }
}
