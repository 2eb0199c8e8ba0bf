//! Memory per delivery (issue 30.4), black-box on the real binary: the
//! peak resident memory (VmHWM) of `outboxd run` delivering a payload at
//! `max_payload_bytes` through each sink, and `outboxd run` under
//! `prlimit --as` with payloads sized against the room the cap leaves.
//! Every run has `MALLOC_ARENA_MAX=2` (glibc's per-thread arenas otherwise
//! reserve 64 MB of address space each). A memory cgroup is not used: the
//! only one here is the machine's own.
//!
//! The peak is measured from a baseline taken after a warm-up (small
//! events and a 4 MiB payload, which fill SQLite's page caches), by
//! resetting the peak (`/proc/PID/clear_refs`) and reading VmHWM once the
//! large payload and the events behind it are delivered.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::bin::{Running, Sandbox, WAIT};
use common::http::{Answer, Receiver};
use outboxd::EventId;
use rusqlite::Connection;

/// The default `relay.max_payload_bytes`: payloads at the limit.
const AT_THE_LIMIT: u64 = 16 << 20;

/// What a large row adds besides its copies: SQLite's page caches (2 MiB
/// a connection) fill with its pages as they are read and written.
const PAGE_CACHES: u64 = 4 << 20;

/// A field of /proc/PID/status, in bytes.
fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    let kb: u64 = line.trim().trim_end_matches(" kB").parse().unwrap();
    kb * 1024
}

/// Inserts a row on `key` (None: no ordering key) whose payload is a JSON
/// string of exactly `bytes` bytes (an even number), as a foreign producer
/// could; returns its event id.
fn insert(conn: &Connection, ty: &str, key: Option<&str>, bytes: u64) -> String {
    let id = EventId::new().to_string();
    conn.execute(
        "INSERT INTO event_outbox (event_id, event_type, payload, ordering_key)
         VALUES (?1, ?2, '\"' || replace(hex(zeroblob((?3 - 2) / 2)), '0', 'x') || '\"', ?4)",
        rusqlite::params![id, ty, bytes as i64, key],
    )
    .unwrap();
    id
}

/// `n` small events on `key`.
fn small(conn: &Connection, key: Option<&str>, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| insert(conn, "small.one.v1", key, 16))
        .collect()
}

fn open(sb: &Sandbox) -> Connection {
    outboxd::connection::open(sb.db()).unwrap()
}

/// `outboxd run --config CONFIG` with `MALLOC_ARENA_MAX=2`, under
/// `prlimit --as=CAP` when a cap is given.
fn start(sb: &Sandbox, config: &Path, cap: Option<u64>) -> Running {
    let args = ["run", "--config", config.to_str().unwrap()];
    let mut cmd = match cap {
        Some(cap) => {
            let runner = ["prlimit".into(), format!("--as={cap}").into()];
            sb.outboxd().through(&runner).command(&args)
        }
        None => sb.command(&args),
    };
    cmd.env("MALLOC_ARENA_MAX", "2");
    Running::spawn(&mut cmd)
}

fn status(sb: &Sandbox, id: &str) -> (String, i64, String) {
    sb.conn()
        .query_row(
            "SELECT status, attempts, coalesce(last_error, '') FROM event_outbox WHERE event_id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap()
}

/// Waits until `done`, failing with the relay's log if it exits first (an
/// abort) or `timeout` passes.
fn wait_for(
    relay: &mut Running,
    what: &str,
    timeout: Duration,
    mut done: impl FnMut(&Running) -> bool,
) {
    let deadline = Instant::now() + timeout;
    while !done(relay) {
        relay.assert_alive();
        assert!(
            Instant::now() < deadline,
            "{what}: not within {timeout:?}; log:\n{}",
            relay.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A config with one consumer `out` taking every event into `sink` (the
/// `[consumer.sink]` table's lines), two workers, a quick retry, and the
/// given `[relay]` lines.
fn config(sb: &Sandbox, relay: &str, sink: &str) -> std::path::PathBuf {
    sb.write(
        "outboxd.toml",
        &format!(
            "database = \"app.db\"\n[relay]\nworkers = 2\n{relay}\n\
             [retry]\ninitial = \"1s\"\nmax_attempts = 2\n\
             [[consumer]]\nname = \"out\"\ntypes = [\"*\"]\n[consumer.sink]\n{sink}\n"
        ),
    )
}

const JSONL: &str = "kind = \"jsonl\"\npath = \"out.jsonl\"";
const SQL_TABLE: &str = "CREATE TABLE seen (event_id TEXT PRIMARY KEY, n INTEGER)";

/// The sinks measured: nats only where nats-server runs.
fn sink_names() -> Vec<&'static str> {
    let mut names = vec!["jsonl", "command", "webhook", "sql"];
    if nats_server_runs() {
        names.push("nats");
    }
    names
}

#[cfg(feature = "nats")]
fn nats_server_runs() -> bool {
    common::available(common::nats_server::server_binary(), &["--version"])
}

#[cfg(not(feature = "nats"))]
fn nats_server_runs() -> bool {
    false
}

/// Sink `name`'s `[consumer.sink]` lines, and what it needs running beside
/// it (a receiver, a server) for as long as it runs.
fn sink(sb: &Sandbox, name: &str) -> (String, Box<dyn std::any::Any>) {
    match name {
        "jsonl" => (JSONL.into(), Box::new(())),
        "command" => (
            "kind = \"command\"\nprogram = \"/bin/sh\"\nargs = [\"-c\", \"cat > /dev/null\"]"
                .into(),
            Box::new(()),
        ),
        "webhook" => {
            let receiver = Receiver::start(|_, _| Answer::new("200 OK", ""));
            sb.write("hook.secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
            let lines = format!(
                "kind = \"webhook\"\nurl = \"{}\"\nsecret_file = \"hook.secret\"",
                receiver.url("/hook")
            );
            (lines, Box::new(receiver))
        }
        "sql" => {
            sb.conn().execute_batch(SQL_TABLE).unwrap();
            (
                "kind = \"sql\"\nstatements = [\"INSERT OR REPLACE INTO seen VALUES (:event_id, \
                 length(:payload))\"]"
                    .into(),
                Box::new(()),
            )
        }
        #[cfg(feature = "nats")]
        "nats" => {
            use common::nats_server::{NatsServer, Settings};
            let server = NatsServer::with(Settings {
                max_payload: Some(32 << 20),
                ..Settings::default()
            });
            let lines = format!(
                "kind = \"nats\"\nservers = [\"{}\"]\nstream = \"EVENTS\"\n\
                 create_stream = {{ storage = \"memory\" }}\nack_timeout = \"20s\"",
                server.url()
            );
            (lines, Box::new(server))
        }
        other => unreachable!("no sink {other}"),
    }
}

/// Issue 30.4: one 15 MB payload made the jsonl sink peak at ~10x its size
/// (the envelope, a clone per consumer, the line, its re-encoding and the
/// newline's doubling, beside the row's own copies). Now each sink holds a
/// payload at the limit in at most 3x its size: the row's one copy, the
/// sink's (reserved at its size, fallibly), and for the sql sink SQLite's
/// two (the bound value, and its text with the terminating NUL rusqlite
/// does not bind), plus [`PAGE_CACHES`].
#[test]
fn every_sink_delivers_a_payload_at_the_limit_in_at_most_three_times_its_size() {
    let mut worst = 0.0f64;
    for name in sink_names() {
        let sb = Sandbox::migrated();
        let (lines, _beside) = sink(&sb, name);
        let config = config(&sb, "", &lines);
        let db = open(&sb);
        let mut warm = small(&db, Some("warm"), 3);
        warm.push(insert(&db, "warm.up.v1", Some("warm"), 4 << 20));
        let mut relay = start(&sb, &config, None);
        let delivered = |ids: &[String]| ids.iter().all(|id| status(&sb, id).0 == "delivered");
        wait_for(&mut relay, "the warm-up delivered", WAIT, |_| {
            delivered(&warm)
        });
        let pid = relay.pid();
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5").unwrap();
        let baseline = status_bytes(pid, "VmHWM");

        let mut ids = vec![insert(&db, "big.one.v1", Some("big"), AT_THE_LIMIT)];
        ids.extend(small(&db, Some("big"), 3));
        wait_for(
            &mut relay,
            "the payload at the limit delivered",
            WAIT,
            |_| delivered(&ids),
        );
        let peak = status_bytes(pid, "VmHWM");
        assert!(relay.stop().success(), "{}", relay.stderr());
        let ratio = (peak - baseline) as f64 / AT_THE_LIMIT as f64;
        println!(
            "# {name}: payload {AT_THE_LIMIT} bytes: baseline {} MB, peak {} MB, {ratio:.2}x the payload",
            baseline >> 20,
            peak >> 20
        );
        assert!(
            peak - baseline <= 3 * AT_THE_LIMIT + PAGE_CACHES,
            "{name}: a payload of {AT_THE_LIMIT} bytes took {ratio:.2}x its size (baseline \
             {baseline}, peak {peak})"
        );
        worst = worst.max(ratio);
    }
    println!("# worst: {worst:.2}x");
}

/// A relay under `prlimit --as`, warmed up by a few small events, and the
/// address space its cap leaves: the cap is the address space the same
/// relay holds when unlimited (measured first) plus `extra`.
fn capped(sb: &Sandbox, config: &Path, extra: u64) -> (Running, u64) {
    let warm = small(&open(sb), Some("warm"), 2);
    let delivered = |ids: &[String]| ids.iter().all(|id| status(sb, id).0 == "delivered");
    let mut free = start(sb, config, None);
    wait_for(&mut free, "the warm-up delivered", WAIT, |_| {
        delivered(&warm)
    });
    let unlimited = status_bytes(free.pid(), "VmSize");
    assert!(free.stop().success(), "{}", free.stderr());
    let cap = unlimited + extra;
    let warm = small(&open(sb), Some("warm"), 2);
    let mut relay = start(sb, config, Some(cap));
    wait_for(
        &mut relay,
        "the warm-up delivered under the cap",
        WAIT,
        |_| delivered(&warm),
    );
    let room = cap.saturating_sub(status_bytes(relay.pid(), "VmSize"));
    (relay, room)
}

/// An even number of bytes: `room` divided by `by`.
fn sized(room: u64, by: f64) -> u64 {
    ((room as f64 / by) as u64) & !1
}

/// Eight small events, a large payload of `bytes`, five small ones, all
/// on `key`, in one transaction (the relay sees them at once).
fn queue(sb: &Sandbox, key: Option<&str>, bytes: u64) -> (Vec<String>, String, Vec<String>) {
    let mut conn = open(sb);
    let tx = conn.transaction().unwrap();
    let before = small(&tx, key, 8);
    let big = insert(&tx, "big.one.v1", key, bytes);
    let after = small(&tx, key, 5);
    tx.commit().unwrap();
    (before, big, after)
}

/// Issue 30.4: under `prlimit --as` a 15 MB payload made every start of
/// `outboxd run` abort ("memory allocation of 30000360 bytes failed"), a
/// crash loop under systemd's Restart=. With a cap leaving room for 3.5x a
/// payload (where it needed 5x and more), the relay delivers it and the
/// events behind it, and never aborts.
#[test]
fn under_an_address_space_cap_a_relay_delivers_a_payload_that_aborted_it_before() {
    if !common::available("prlimit", &["--version"]) {
        return;
    }
    let sb = Sandbox::migrated();
    let config = config(&sb, "max_payload_bytes = 1000000000", JSONL);
    let (mut relay, room) = capped(&sb, &config, 240 << 20);
    let bytes = sized(room, 3.5);
    let (before, big, after) = queue(&sb, Some("k"), bytes);
    let all: Vec<&String> = before.iter().chain([&big]).chain(&after).collect();
    wait_for(&mut relay, "every event delivered", WAIT * 2, |_| {
        all.iter().all(|id| status(&sb, id).0 == "delivered")
    });
    assert!(relay.stop().success(), "{}", relay.stderr());
    println!(
        "# prlimit --as, {} MB of room: a payload of {bytes} bytes and the 13 events around it \
         delivered",
        room >> 20
    );
}

/// Issue 30.4: under a cap too tight for SQLite to rewrite a claimed row
/// (which it does whole, needing twice its payload), the writer failed its
/// claim with "out of memory" every 5 s, and the outcomes of the events it
/// had delivered, recorded in the same transaction, were never written:
/// delivered events stayed leased. Here 8 small events are claimed and
/// delivered slowly, and the large row comes while they run (with a
/// `batch_bytes` that takes it beside them), so their outcomes come in
/// while the writer claims it. Now the transactions between the failed
/// claims record them; the relay stays up, and says why the rest waits
/// (every row due after the large one: the claim takes rows in due order).
#[test]
fn under_a_cap_too_small_to_claim_a_payload_the_relay_records_what_it_delivered() {
    if !common::available("prlimit", &["--version"]) {
        return;
    }
    let sb = Sandbox::migrated();
    let slow = "kind = \"command\"\nprogram = \"/bin/sh\"\n\
                args = [\"-c\", \"sleep 3; cat > /dev/null\"]";
    let relay_lines = "max_payload_bytes = 1000000000\nbatch_bytes = 1000000000";
    let config = config(&sb, relay_lines, slow);
    let (mut relay, room) = capped(&sb, &config, 120 << 20);
    let bytes = sized(room, 1.4);
    let conn = open(&sb);
    let before = small(&conn, None, 8);
    wait_for(&mut relay, "the 8 small events claimed", WAIT, |_| {
        sb.count("claim_token IS NOT NULL AND event_type = 'small.one.v1'") == 8
    });
    let big = insert(&conn, "big.one.v1", None, bytes);
    wait_for(&mut relay, "the 8 events before it recorded", WAIT, |_| {
        before.iter().all(|id| status(&sb, id).0 == "delivered")
    });
    let lines = |relay: &Running| relay.stderr().matches("cannot claim events").count();
    wait_for(&mut relay, "the failed claim logged twice", WAIT, |relay| {
        lines(relay) >= 2
    });
    assert_eq!(status(&sb, &big).0, "pending");
    relay.stop();
    assert!(
        relay
            .stderr()
            .contains("cannot claim events: out of memory")
            && !relay.stderr().contains("memory allocation"),
        "{}",
        relay.stderr()
    );
    println!(
        "# prlimit --as, {} MB of room, a payload of {bytes} bytes: the 8 events before it \
         delivered and recorded, the claim retried ({} times logged), no abort",
        room >> 20,
        lines(&relay)
    );
}

/// Issue 30.4: memory exhaustion is an error for that event. A sql sink
/// whose statement reads the payload with SQLite's JSON functions needs
/// about 5x it (SQLite's bound copy, its text, its cache's copy and the
/// parsed form, beside the relay's); under a cap leaving room for 3x (and
/// so for the claim's 2x) the delivery fails with SQLITE_NOMEM, is
/// retried, dead-lettered saying so, and the events behind it go on. (It
/// was dead-lettered at once as "the consumer ended outboxd's transaction
/// itself": SQLite had rolled the transaction back on its own.)
#[test]
fn a_sql_delivery_out_of_memory_under_a_cap_is_retried_then_dead_lettered_saying_so() {
    if !common::available("prlimit", &["--version"]) {
        return;
    }
    let sb = Sandbox::migrated();
    sb.conn().execute_batch(SQL_TABLE).unwrap();
    let sql = "kind = \"sql\"\nstatements = [\"INSERT OR REPLACE INTO seen VALUES (:event_id, \
               json_type(:payload))\"]";
    let config = config(&sb, "max_payload_bytes = 1000000000", sql);
    let (mut relay, room) = capped(&sb, &config, 240 << 20);
    let bytes = sized(room, 3.0);
    let (before, big, after) = queue(&sb, Some("k"), bytes);
    let finished = |ids: &[String]| ids.iter().all(|id| status(&sb, id).0 != "pending");
    wait_for(&mut relay, "every event finished", WAIT * 2, |_| {
        finished(&before) && finished(&after) && status(&sb, &big).0 != "pending"
    });
    assert!(relay.stop().success(), "{}", relay.stderr());
    let (state, _, reason) = status(&sb, &big);
    assert_eq!(state, "dead", "{reason}");
    assert!(
        reason.contains("gave up after 2 attempts") && reason.contains("out of memory"),
        "{reason}"
    );
    for id in before.iter().chain(&after) {
        assert_eq!(status(&sb, id).0, "delivered");
    }
    println!(
        "# prlimit --as, {} MB of room, a payload of {bytes} bytes through json_type(:payload): \
         retried, dead-lettered with \"{reason}\"; the 13 events around it delivered",
        room >> 20
    );
}
