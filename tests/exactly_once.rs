//! Exactly once under kill -9: a relay process running a transactional
//! consumer that adds one to a per-key counter for each event is killed
//! again and again; afterwards every counter equals the number of
//! committed events of its key. A plain consumer in the same processes,
//! doing the same count in a transaction of its own, shows the repeats
//! that at-least-once delivery allows (counted and reported). Once with
//! the library (this binary re-executed as the relay process), once with
//! the real `outboxd run` and a `sql` sink.
//!
//! The test is the producer: each round it commits a batch of events (so
//! every event is acknowledged), starts a relay, waits until the relay has
//! delivered something of the round, lets it run 0–15 ms more and kills it.
//! Those delays are the nemesis, not synchronisation; every wait is a
//! bounded poll. After the loop one relay drains the rest, and the checker
//! compares.
//!
//! `OUTBOXD_FULL=1` selects the long form (200 kills each, not 30).

mod common;

use std::collections::{BTreeMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::bin::{Outboxd, Running, Sandbox};
use common::wait_until;
use outboxd::{Delivery, Event, Outcome, Relay, RetryPolicy};
use rand::RngExt;
use rusqlite::{Connection, Transaction};

const WAIT: Duration = Duration::from_secs(120);

/// Set (to the database) in the environment of this binary when the kill
/// test starts it as its relay process.
const RELAY_DB: &str = "OUTBOXD_EO_RELAY_DB";
/// Set when that relay process should stop by itself once nothing is
/// pending (the final drain).
const RELAY_DRAIN: &str = "OUTBOXD_EO_DRAIN";

/// Keys the events count under.
const KEYS: usize = 10;
/// Events committed per round.
const PER_ROUND: usize = 40;

/// This suite's own `main` (harness = false in Cargo.toml): the same binary
/// is either the library test's relay process (when started with
/// [`RELAY_DB`] set) or the test runner.
fn main() -> ExitCode {
    if let Some(db) = std::env::var_os(RELAY_DB) {
        relay_process(Path::new(&db), std::env::var_os(RELAY_DRAIN).is_some());
        return ExitCode::SUCCESS;
    }
    common::run_one_at_a_time(&[
        (
            "kill_9_of_a_library_relay_leaves_every_transactional_count_exact",
            kill_9_of_a_library_relay_leaves_every_transactional_count_exact,
        ),
        (
            "kill_9_of_outboxd_run_with_a_sql_sink_leaves_every_count_exact",
            kill_9_of_outboxd_run_with_a_sql_sink_leaves_every_count_exact,
        ),
    ])
}

fn rounds() -> usize {
    if std::env::var_os("OUTBOXD_FULL").is_some() {
        200
    } else {
        30
    }
}

/// The counter tables: `exact` (the transactional consumer, or the sql
/// sink) and `plain` (the library test's plain consumer).
const TABLES: &str = "CREATE TABLE exact (k TEXT PRIMARY KEY, n INTEGER NOT NULL);
                      CREATE TABLE plain (k TEXT PRIMARY KEY, n INTEGER NOT NULL);";

/// Adds one to `table`'s counter of the payload's key.
const BUMP: &str = "INSERT INTO {table} (k, n) VALUES (json_extract(:payload, '$.k'), 1)
                    ON CONFLICT (k) DO UPDATE SET n = n + 1";

fn bump(conn: &Connection, table: &str, d: &Delivery) -> rusqlite::Result<()> {
    conn.prepare_cached(&BUMP.replace("{table}", table))?
        .execute(rusqlite::named_params! { ":payload": d.envelope.payload.get() })?;
    Ok(())
}

/// The library test's relay process: `exact` is a transactional consumer,
/// `plain` counts in a transaction of its own on its own connection. Runs
/// until killed, or with `drain` until nothing is pending.
fn relay_process(db: &Path, drain: bool) {
    let plain_conn = Mutex::new(outboxd::connection::open(db).unwrap());
    let relay = Relay::builder(db)
        .transactional_consumer(
            "exact",
            ["count.*.v1"],
            |tx: &Transaction<'_>, d: &Delivery| match bump(tx, "exact", d) {
                Ok(()) => Outcome::Delivered,
                Err(e) => Outcome::retry(e.to_string()),
            },
        )
        .consumer("plain", ["count.*.v1"], move |d: &Delivery| {
            let mut conn = plain_conn.lock().unwrap();
            let counted = conn.transaction().and_then(|tx| {
                bump(&tx, "plain", d)?;
                tx.commit()
            });
            match counted {
                Ok(()) => Outcome::Delivered,
                Err(e) => Outcome::retry(e.to_string()),
            }
        })
        .workers(2)
        .batch_size(16)
        .lease(Duration::from_secs(1))
        .poll_interval(Duration::from_millis(5))
        .retry_policy(
            RetryPolicy::default()
                .initial(Duration::from_millis(100))
                .max_delay(Duration::from_secs(1))
                .max_attempts(1000),
        )
        .build()
        .unwrap()
        .start()
        .unwrap();
    eprintln!("outboxd running (library relay process)");
    let check = outboxd::connection::open(db).unwrap();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let left: i64 = check
            .query_row(
                "SELECT count(*) FROM event_outbox WHERE status <> 'delivered'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        if drain && left == 0 {
            break;
        }
    }
    relay.shutdown(Duration::from_secs(10)).unwrap();
}

/// What a kill loop did and found.
struct Figures {
    kills: u32,
    events: usize,
    /// Rows for which a killed relay had committed the exact consumer's
    /// transaction but never recorded the row's outcome: each one's
    /// re-claim had to skip that consumer.
    committed_unrecorded: usize,
    took: Duration,
}

/// Commits `PER_ROUND` events with random keys; adds them to `expected`.
fn produce(sb: &Sandbox, expected: &mut BTreeMap<String, i64>) {
    let mut rng = rand::rng();
    let events: Vec<Event> = (0..PER_ROUND)
        .map(|_| {
            let k = format!("k{}", rng.random_range(0..KEYS));
            *expected.entry(k.clone()).or_default() += 1;
            let e = Event::new("count.up.v1", &serde_json::json!({ "k": k })).unwrap();
            // A quarter of them keep their key's order as well.
            if rng.random_range(0..4) == 0 {
                e.ordering_key(&k)
            } else {
                e
            }
        })
        .collect();
    let mut conn = sb.conn();
    let tx = conn.transaction().unwrap();
    outboxd::enqueue_many(&tx, &events).unwrap();
    tx.commit().unwrap();
}

/// Ledger entries of `consumer`.
fn entries(sb: &Sandbox, consumer: &str) -> i64 {
    sb.scalar(&format!(
        "SELECT count(*) FROM delivered_events WHERE consumer = '{consumer}'"
    ))
}

/// The kill loop: each round produces, starts a relay with `start(round)`,
/// waits for it to deliver something to `exact`, and kills it 0–15 ms
/// later. Then `start(final)` drains; `drained(relay)` ends that relay once
/// nothing is pending.
fn kill_loop(
    sb: &Sandbox,
    expected: &mut BTreeMap<String, i64>,
    mut start: impl FnMut(Option<usize>) -> Running,
    drained: impl FnOnce(Running),
) -> Figures {
    let mut rng = rand::rng();
    let started = Instant::now();
    let mut kills = 0;
    let mut committed_unrecorded = HashSet::new();
    for round in 0..rounds() {
        produce(sb, expected);
        let before = entries(sb, "exact");
        let mut relay = start(Some(round));
        wait_until("the relay to deliver something", WAIT, || {
            relay.assert_alive();
            entries(sb, "exact") > before
        });
        std::thread::sleep(Duration::from_millis(rng.random_range(0..=15)));
        relay.assert_alive();
        relay.kill9();
        kills += 1;
        let conn = sb.conn();
        let mut stmt = conn
            .prepare(
                "SELECT o.id FROM event_outbox o
                  WHERE o.status = 'pending' AND o.claim_token IS NOT NULL
                    AND EXISTS (SELECT 1 FROM delivered_events d
                                 WHERE d.consumer = 'exact' AND d.event_key = upper(o.event_id))",
            )
            .unwrap();
        let rows = stmt.query_map([], |r| r.get::<_, i64>(0)).unwrap();
        committed_unrecorded.extend(rows.map(Result::unwrap));
    }
    let took = started.elapsed();
    let relay = start(None);
    wait_until("the final relay to drain the outbox", WAIT, || {
        sb.scalar::<i64>("SELECT count(*) FROM event_outbox WHERE status <> 'delivered'") == 0
    });
    drained(relay);
    Figures {
        kills,
        events: expected.values().sum::<i64>() as usize,
        committed_unrecorded: committed_unrecorded.len(),
        took,
    }
}

/// A counter table as key → count.
fn counts(sb: &Sandbox, table: &str) -> BTreeMap<String, i64> {
    let conn = sb.conn();
    let mut stmt = conn
        .prepare(&format!("SELECT k, n FROM {table} ORDER BY k"))
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The checks both tests share: every exact count is the number of
/// committed events of its key, one ledger entry per event, every row
/// delivered, the file intact.
fn check_exact(sb: &Sandbox, expected: &BTreeMap<String, i64>, f: &Figures) {
    assert_eq!(
        &counts(sb, "exact"),
        expected,
        "a transactional count is not the number of committed events of its key"
    );
    assert_eq!(entries(sb, "exact"), f.events as i64);
    assert_eq!(sb.count("status = 'delivered'"), f.events as i64);
    assert_eq!(sb.scalar::<String>("PRAGMA integrity_check"), "ok");
    assert!(
        f.committed_unrecorded > 0,
        "no kill fell between the transactional consumer's commit and the relay's record \
         of the row: the run did not test what it is for"
    );
}

fn kill_9_of_a_library_relay_leaves_every_transactional_count_exact() {
    let sb = Sandbox::migrated();
    sb.conn().execute_batch(TABLES).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut expected = BTreeMap::new();
    let relay = |round: Option<usize>| {
        let mut cmd = Command::new(&exe);
        cmd.env(RELAY_DB, sb.db()).stdout(Stdio::null());
        if round.is_none() {
            cmd.env(RELAY_DRAIN, "1");
        }
        Running::spawn_logging(&mut cmd, sb.file("relay.log"))
    };
    let f = kill_loop(&sb, &mut expected, relay, |mut r| {
        let status = r.wait(WAIT);
        assert!(
            status.success(),
            "the draining relay failed:\n{}",
            r.stderr()
        );
    });

    let plain = counts(&sb, "plain");
    let repeats: i64 = expected
        .iter()
        .map(|(k, n)| {
            let got = plain.get(k).copied().unwrap_or(0);
            assert!(
                got >= *n,
                "the plain consumer lost events of {k}: {got} < {n}"
            );
            got - n
        })
        .sum();
    println!(
        "# library relay, kill -9: {} kills in {:.1} s, {} events over {KEYS} keys; \
         exact counts: all equal to the committed events; the exact consumer's commits \
         left unrecorded by a kill (re-claims that skipped it): {}; plain consumer's \
         repeats (at least once): {repeats}",
        f.kills,
        f.took.as_secs_f64(),
        f.events,
        f.committed_unrecorded
    );
    check_exact(&sb, &expected, &f);
    assert_eq!(entries(&sb, "plain"), f.events as i64);
    assert!(
        repeats > 0,
        "the plain consumer never repeated a delivery: no kill fell in its window, so the \
         run shows nothing about the difference"
    );
}

fn kill_9_of_outboxd_run_with_a_sql_sink_leaves_every_count_exact() {
    let sb = Sandbox::migrated();
    sb.conn().execute_batch(TABLES).unwrap();
    let mut expected = BTreeMap::new();
    let config = |tag: &str| -> PathBuf {
        sb.write(
            &format!("{tag}.toml"),
            &format!(
                "database = \"app.db\"\n\
                 [relay]\nworkers = 2\nbatch_size = 16\nlease = \"1s\"\npoll_interval = \"5ms\"\n\
                 [retry]\ninitial = \"100ms\"\nmax_delay = \"1s\"\nmax_attempts = 1000\n\
                 [purge]\nenabled = false\n\
                 [[consumer]]\nname = \"exact\"\ntypes = [\"count.*.v1\"]\n\
                 [consumer.sink]\nkind = \"sql\"\nstatements = [\"\"\"{}\"\"\"]\n\
                 [[consumer]]\nname = \"lines\"\ntypes = [\"count.*.v1\"]\n\
                 [consumer.sink]\nkind = \"jsonl\"\npath = \"lines.{tag}.jsonl\"\nfsync = true\n",
                BUMP.replace("{table}", "exact")
            ),
        )
    };
    let relay = |round: Option<usize>| {
        let tag = round.map_or("final".to_string(), |r| format!("{r:05}"));
        let file = config(&tag);
        let mut cmd =
            Outboxd::on(&file)
                .without_db()
                .command(&["run", "--config", file.to_str().unwrap()]);
        let mut r = Running::spawn_logging(cmd.stdout(Stdio::null()), sb.file("outboxd.log"));
        r.wait_started();
        r
    };
    let f = kill_loop(&sb, &mut expected, relay, |mut r| {
        let status = r.stop();
        assert!(status.success(), "outboxd failed:\n{}", r.stderr());
    });

    // The JSON-lines consumer beside it: at least once.
    let mut lines: BTreeMap<String, u32> = BTreeMap::new();
    for entry in fs::read_dir(sb.dir.path()).unwrap() {
        let path = entry.unwrap().path();
        if !path.to_string_lossy().ends_with(".jsonl") {
            continue;
        }
        for line in fs::read_to_string(&path).unwrap().lines() {
            // A line cut short by a kill was never reported delivered.
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
                *lines
                    .entry(v["event_id"].as_str().unwrap().to_string())
                    .or_default() += 1;
            }
        }
    }
    let repeats: u32 = lines.values().map(|n| n - 1).sum();
    println!(
        "# outboxd run with a sql sink, kill -9: {} kills in {:.1} s, {} events over {KEYS} \
         keys; sql sink counts: all equal to the committed events; its commits left \
         unrecorded by a kill: {}; the JSON-lines consumer's repeats (at least once): {repeats}",
        f.kills,
        f.took.as_secs_f64(),
        f.events,
        f.committed_unrecorded
    );
    check_exact(&sb, &expected, &f);
    assert_eq!(lines.len(), f.events, "the JSON-lines consumer lost events");
}
