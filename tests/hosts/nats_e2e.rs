//! `kind = "nats"` through the real binary, against real `nats-server`s
//! (tests/common/nats_server.rs), each on free loopback ports with
//! JetStream on a temp dir:
//!
//! - N events become exactly N messages: unique Nats-Msg-Id, bodies equal to
//!   the envelopes (the JSONL sink's lines);
//! - `kill -9` of outboxd ten times mid-run, then a clean run: still exactly
//!   N messages (the broker's duplicate window absorbed the repeats);
//! - nats-server stopped for 10 s mid-run and restarted: retried, none
//!   lost, none dead, status showed the retries, outboxd healthy after;
//! - a 3-node JetStream cluster, stream of 3 replicas, its leader killed
//!   mid-run: none lost, publishing continues;
//! - no server at start-up: outboxd starts, logs it, another consumer
//!   delivers meanwhile, and the events reach NATS once it is up;
//! - a missing stream, refused credentials, a bad subject template: exit 6
//!   naming the field;
//! - no log level prints the NATS token or password.
//!
//! Each scenario runs on Debian's nats-server and on the current release
//! (tests/common/nats_versions.rs), the cluster one on the current release
//! only (Debian's 2.9 loses acknowledged messages after a leader change).
//!
//! N is 2,000 in CI, 20,000 under scripts/soak.sh (`OUTBOXD_FULL=1`), or
//! `OUTBOXD_NATS_EVENTS`. Synchronisation is by bounded polling of the database, the
//! stream or the log, never by fixed sleeps (the 10 s outage is the
//! scenario's length, not a wait for something).
#![cfg(feature = "nats")]

use crate::common;
use crate::common::nats_server;
use crate::common::nats_versions;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::thread;
use std::time::{Duration, Instant};

use common::bin::{Outboxd, Running, WAIT};
use common::{wait_until, TestDb};
use nats_server::{Auth, Cluster, NatsServer, Settings, StreamAdmin};
use outboxd::{Envelope, Event};

const CONFIG_EXIT: i32 = 6;

/// Events per scenario: `OUTBOXD_NATS_EVENTS`, else 20,000 under
/// `OUTBOXD_FULL=1` (scripts/soak.sh), else 2,000.
fn events_n() -> usize {
    let full = std::env::var("OUTBOXD_FULL").is_ok_and(|v| v == "1");
    std::env::var("OUTBOXD_NATS_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if full { 20_000 } else { 2_000 })
}

// ---------------------------------------------------------------------------
// Helpers.

/// `outboxd --db DB ARGS` with a clean environment (tests/common/bin.rs).
fn outboxd(db: &TestDb, args: &[&str]) -> Command {
    Outboxd::on(db.db()).command(args)
}

/// `outboxd [FLAGS] run --config CONFIG` with `env`, started.
fn start(db: &TestDb, config: &Path, flags: &[&str], env: &[(&str, &str)]) -> Running {
    let mut args = flags.to_vec();
    args.extend(["run", "--config", config.to_str().unwrap()]);
    let mut run = Running::spawn(outboxd(db, &args).envs(env.iter().copied()));
    run.wait_started();
    run
}

/// Polls `cond` until it holds, failing if outboxd exits meanwhile.
fn wait_for(run: &mut Running, what: &str, mut cond: impl FnMut() -> bool) {
    wait_until(what, WAIT, || {
        run.assert_alive();
        cond()
    });
}

/// A nats consumer (and, with `jsonl`, a JSONL consumer writing
/// `events.jsonl`) in a config with a short lease and retries, so a crash
/// or an outage costs seconds.
fn config(db: &TestDb, servers: &[String], sink_extra: &str, jsonl: bool) -> PathBuf {
    let servers: Vec<String> = servers.iter().map(|s| format!("{s:?}")).collect();
    let mut text = format!(
        "[relay]\nworkers = 16\nlease = \"3s\"\nshutdown_grace = \"5s\"\n\
         [retry]\ninitial = \"500ms\"\nmax_delay = \"2s\"\nmax_attempts = 200\n\
         [[consumer]]\nname = \"nats\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"nats\"\n\
         servers = [{}]\nstream = \"EVENTS\"\nack_timeout = \"2s\"\nconnect_timeout = \"1s\"\n{sink_extra}",
        servers.join(", ")
    );
    if jsonl {
        text.push_str(
            "[[consumer]]\nname = \"file\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"jsonl\"\n\
             path = \"events.jsonl\"\n",
        );
    }
    db.write("outboxd.toml", &text)
}

/// Enqueues `n` events, a quarter with a tenant and ids, in transactions of
/// 1,000.
fn enqueue(db: &TestDb, n: usize) {
    let all: Vec<Event> = (0..n as u64)
        .map(|i| {
            let e = common::event("article.created.v1", i);
            if i % 4 == 0 {
                e.tenant("acme").correlation_id(format!("req-{i}"))
            } else {
                e
            }
        })
        .collect();
    for chunk in all.chunks(1_000) {
        db.enqueue(chunk);
    }
}

fn delivered_to(db: &TestDb, consumer: &str) -> i64 {
    db.scalar(&format!(
        "SELECT count(*) FROM delivered_events WHERE consumer = '{consumer}'"
    ))
}

/// The stream holds exactly `n` messages, one per event id, each body an
/// envelope whose Nats-Msg-Id is its event id; returns the bodies.
fn assert_exactly(admin: &StreamAdmin, n: usize) -> HashSet<String> {
    assert_eq!(admin.count("EVENTS"), n as u64, "messages in the stream");
    let messages = admin.read_all("EVENTS");
    let mut ids = HashSet::new();
    let mut bodies = HashSet::new();
    for m in &messages {
        let body = String::from_utf8(m.body.clone()).unwrap();
        let env: Envelope = serde_json::from_str(&body).unwrap();
        let id = m.header("Nats-Msg-Id").expect("a message id");
        assert_eq!(id, env.event_id.to_string());
        assert!(ids.insert(id.to_string()), "message id {id} twice");
        bodies.insert(body);
    }
    assert_eq!(ids.len(), n);
    bodies
}

/// A server with the stream EVENTS taking `events.>`, and the test's own
/// client to it.
fn server_with_stream() -> (NatsServer, StreamAdmin) {
    let server = NatsServer::start();
    let admin = StreamAdmin::connect(&[server.url()]);
    admin.create("EVENTS", &["events.>"], 1);
    (server, admin)
}

fn check_config(db: &TestDb, config: &Path) -> Output {
    outboxd(db, &["check-config", "--config", config.to_str().unwrap()])
        .output()
        .unwrap()
}

// ---------------------------------------------------------------------------
// Scenarios.

#[test]
fn every_event_becomes_exactly_one_message_with_the_envelope_as_body() {
    nats_versions::each(|| {
        let n = events_n();
        let (server, admin) = server_with_stream();
        let db = TestDb::new();
        enqueue(&db, n);
        let cfg = config(&db, &[server.url()], "", true);
        let mut run = start(&db, &cfg, &[], &[]);
        wait_for(&mut run, "every event delivered to both consumers", || {
            db.count("status = 'delivered'") == n as i64
        });
        assert!(run.stop().success());
        let bodies = assert_exactly(&admin, n);
        let lines: HashSet<String> = std::fs::read_to_string(db.file("events.jsonl"))
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        assert_eq!(
            bodies, lines,
            "the bodies are the envelopes the JSONL sink wrote"
        );
    });
}

#[test]
fn kill_9_ten_times_mid_run_still_gives_exactly_one_message_per_event() {
    nats_versions::each(|| {
        let n = events_n();
        let (server, admin) = server_with_stream();
        let db = TestDb::new();
        enqueue(&db, n);
        let cfg = config(&db, &[server.url()], "", false);
        let published = admin.count_published("events.>");
        let step = (n / 12).max(1) as i64;
        for kill in 0..10 {
            let before = delivered_to(&db, "nats");
            if before >= n as i64 {
                break;
            }
            let mut run = start(&db, &cfg, &[], &[]);
            // Killed while it publishes: some messages are in the stream whose
            // outcome was never recorded, and the next run publishes them again.
            wait_for(&mut run, &format!("progress before kill {kill}"), || {
                delivered_to(&db, "nats") >= (before + step).min(n as i64)
            });
            run.kill9();
        }
        let mut run = start(&db, &cfg, &[], &[]);
        wait_for(&mut run, "every event delivered after the kills", || {
            db.count("status = 'delivered'") == n as i64
        });
        assert!(run.stop().success());
        assert_eq!(db.count("status <> 'delivered'"), 0);
        assert_exactly(&admin, n);
        // Subscriptions see every publish: the kills made outboxd publish some
        // events twice, and the stream kept one of each.
        let published = published.load(std::sync::atomic::Ordering::Relaxed);
        println!("{n} events, {published} publishes, {n} messages stored");
        assert!(
            published >= n as u64,
            "{published} publishes for {n} events"
        );
    });
}

#[test]
fn a_server_stopped_for_ten_seconds_is_retried_and_nothing_is_lost() {
    nats_versions::each(|| {
        let n = events_n();
        let mut server = NatsServer::start();
        StreamAdmin::connect(&[server.url()]).create("EVENTS", &["events.>"], 1);
        let db = TestDb::new();
        enqueue(&db, n);
        let cfg = config(&db, &[server.url()], "", false);
        let mut run = start(&db, &cfg, &[], &[]);
        wait_for(&mut run, "a third delivered", || {
            delivered_to(&db, "nats") >= n as i64 / 3
        });
        server.stop();
        let outage = Instant::now();
        // While it is down, status shows the events waiting for their retry.
        wait_until("status to show retries", WAIT, || {
            let out = outboxd(&db, &["status", "--json"]).output().unwrap();
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            v["counts"]["pending_delayed"].as_i64().unwrap() > 0
        });
        thread::sleep(Duration::from_secs(10).saturating_sub(outage.elapsed()));
        run.assert_alive();
        assert!(
            delivered_to(&db, "nats") < n as i64,
            "the outage came mid-run: events were waiting when the server came back"
        );
        server.start_again();
        wait_for(&mut run, "every event delivered after the restart", || {
            db.count("status = 'delivered'") == n as i64
        });
        assert_eq!(db.count("status = 'dead'"), 0, "nothing dead-lettered");
        let retried: i64 = db.scalar("SELECT count(*) FROM event_outbox WHERE attempts > 0");
        assert!(retried > 0, "some events were retried");
        let health = outboxd(&db, &["status"]).output().unwrap();
        assert!(
            health.status.success(),
            "{}",
            String::from_utf8_lossy(&health.stdout)
        );
        assert!(
            run.stderr().contains("lost the connection to NATS"),
            "{}",
            run.stderr()
        );
        assert!(run.stop().success());
        let admin = StreamAdmin::connect(&[server.url()]);
        assert_exactly(&admin, n);
        let later = admin
            .read_all("EVENTS")
            .iter()
            .filter(|m| m.header("Outboxd-Attempt") != Some("1"))
            .count();
        assert!(
            later > 0,
            "retried events reached the stream on a later attempt"
        );
    });
}

#[test]
fn a_cluster_node_killed_mid_run_loses_nothing_and_publishing_continues() {
    nats_versions::current_only(|| {
        let n = events_n();
        let mut cluster = Cluster::start(3);
        let urls = cluster.urls();
        let db = TestDb::new();
        enqueue(&db, n);
        let cfg = config(&db, &urls, "create_stream = { replicas = 3 }\n", false);
        let mut run = start(&db, &cfg, &[], &[]);
        let admin = StreamAdmin::connect(&urls);
        wait_for(&mut run, "a third delivered", || {
            delivered_to(&db, "nats") >= n as i64 / 3
        });
        // Kill the stream's leader: the hardest node to lose.
        let leader = admin.leader("EVENTS").expect("the stream has a leader");
        let victim = cluster.nodes.iter_mut().find(|s| s.name == leader).unwrap();
        victim.kill();
        let at_kill = delivered_to(&db, "nats");
        wait_for(&mut run, "every event delivered after the kill", || {
            db.count("status = 'delivered'") == n as i64
        });
        assert!(delivered_to(&db, "nats") > at_kill, "publishing continued");
        assert_eq!(db.count("status = 'dead'"), 0);
        assert!(run.stop().success());
        wait_until("the stream to answer with a new leader", WAIT, || {
            admin.try_count("EVENTS").is_some()
        });
        assert_exactly(&admin, n);
    });
}

#[test]
fn no_server_at_start_up_is_waited_for_without_holding_other_consumers_back() {
    nats_versions::each(|| {
        let n = events_n();
        let mut server = NatsServer::prepare(Settings::default());
        let db = TestDb::new();
        enqueue(&db, n);
        let cfg = config(
            &db,
            &[server.url()],
            "create_stream = { replicas = 1 }\n",
            true,
        );
        let mut run = start(&db, &cfg, &[], &[]);
        assert!(
            run.stderr().contains("cannot connect to NATS"),
            "{}",
            run.stderr()
        );
        wait_until(
            "the JSONL consumer to deliver everything meanwhile",
            WAIT,
            || {
                run.assert_alive();
                delivered_to(&db, "file") == n as i64
            },
        );
        assert_eq!(delivered_to(&db, "nats"), 0);
        server.start_again();
        wait_for(&mut run, "every event delivered once NATS is up", || {
            db.count("status = 'delivered'") == n as i64
        });
        assert!(run.stop().success());
        assert_exactly(&StreamAdmin::connect(&[server.url()]), n);
    });
}

#[test]
fn a_missing_stream_refused_credentials_and_a_bad_template_are_errors_naming_the_field() {
    nats_versions::each(|| {
        let server = NatsServer::with(Settings {
            auth: Auth::Token("the-right-token".into()),
            ..Settings::default()
        });
        let db = TestDb::new();
        let run_fails = |cfg: &Path, var: (&str, &str), field: &str, needles: &[&str]| {
            let out = outboxd(&db, &["run", "--config", cfg.to_str().unwrap()])
                .env(var.0, var.1)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(CONFIG_EXIT), "{err}");
            assert!(err.contains(field), "{field} not named in: {err}");
            for n in needles {
                assert!(err.contains(n), "{n:?} missing from: {err}");
            }
            assert!(
                !err.contains("wrong-token") && !err.contains("the-right-token"),
                "{err}"
            );
            err.to_string()
        };
        // Refused credentials.
        let cfg = config(
            &db,
            &[server.url()],
            "token_env = \"E2E_NATS_TOKEN\"\n",
            false,
        );
        run_fails(
            &cfg,
            ("E2E_NATS_TOKEN", "wrong-token"),
            "consumer[0].sink.token_env",
            &["refused"],
        );
        // The right ones, and no stream: the stream and the subject are named.
        let err = run_fails(
            &cfg,
            ("E2E_NATS_TOKEN", "the-right-token"),
            "consumer[0].sink.stream",
            &["EVENTS", "events.{event_type}", "create_stream"],
        );
        assert!(!err.contains("outboxd running"), "{err}");
        let out = check_config(&db, &cfg);
        assert_eq!(
            out.status.code(),
            Some(CONFIG_EXIT),
            "check-config: the token is not set"
        );
        // A bad subject template, found without any server.
        let cfg = config(&db, &[server.url()], "subject = \"events.{type}\"\n", false);
        run_fails(
            &cfg,
            ("UNUSED", ""),
            "consumer[0].sink.subject",
            &["{type}"],
        );
        let out = check_config(&db, &cfg);
        assert_eq!(out.status.code(), Some(CONFIG_EXIT));
        assert!(String::from_utf8_lossy(&out.stderr).contains("consumer[0].sink.subject"));
        // check-config with a good config: the stream is probed and the
        // duplicate window compared with the retry schedule.
        let server = NatsServer::start();
        StreamAdmin::connect(&[server.url()]).create("EVENTS", &["events.>"], 1);
        let cfg = config(&db, &[server.url()], "", false);
        let out = check_config(&db, &cfg);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("stream EVENTS takes events.>"), "{text}");
        assert!(
            text.contains("warning: stream EVENTS forgets message ids after 2m"),
            "{text}"
        );
        let out = outboxd(&db, &["doctor", "--config", cfg.to_str().unwrap()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("duplicate_window"), "{text}");
    });
}

#[test]
fn no_log_level_prints_the_nats_credentials() {
    nats_versions::each(|| {
        const TOKEN: &str = "NatsToken-Zq81Lp0Xv-secret";
        let server = NatsServer::with(Settings {
            auth: Auth::Token(TOKEN.into()),
            ..Settings::default()
        });
        let admin = StreamAdmin::connect_with(
            &[server.url()],
            async_nats::ConnectOptions::with_token(TOKEN.into()),
        );
        admin.create("EVENTS", &["events.>"], 1);
        let db = TestDb::new();
        enqueue(&db, 20);
        let cfg = config(
            &db,
            &[server.url()],
            "token_env = \"E2E_NATS_TOKEN\"\n",
            false,
        );
        let mut run = start(
            &db,
            &cfg,
            &["--log-level", "trace"],
            &[("E2E_NATS_TOKEN", TOKEN)],
        );
        wait_for(&mut run, "the events delivered", || {
            db.count("status = 'delivered'") == 20
        });
        let log = run.stderr();
        assert!(run.stop().success());
        assert!(
            log.contains("CONNECT"),
            "the client's trace is in the log: {log}"
        );
        assert!(
            !log.contains(&TOKEN[..12]),
            "the token is in the log:\n{log}"
        );
    });
}
