//! Process faults, black-box, on the real `outboxd` binary: kill -9 of the
//! relay and of a producer at random points, a relay frozen (SIGSTOP) past
//! its lease while another takes its rows over, six relay processes on one
//! file, and an operator purging, replaying and requeueing beside three
//! relays and two producers.
//!
//! Deliveries are recorded durably by the consumers themselves: JSON-lines
//! sinks with `fsync = true`, one file per consumer and relay process, so a
//! line exists only if the relay was told "delivered" or was about to be.
//! The checker uses Jepsen's total-queue vocabulary: an event is
//! **acknowledged** once its producer's COMMIT returned; **lost** if
//! acknowledged and never delivered to some consumer; **unexpected** if
//! delivered but never enqueued; **recovered** if its enqueue was not
//! acknowledged (the producer died first) and it was delivered anyway; a
//! **duplicate** is a second delivery of one event to one consumer.
//!
//! Synchronisation is by bounded polling of the database or the logs; the
//! random delays before each kill are the nemesis, not synchronisation.
//! `OUTBOXD_FULL=1` selects the long forms.

mod common;

use std::collections::{HashMap, HashSet};
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use common::bin::{Outboxd, Running, Sandbox};
use common::wait_until;
use outboxd::Event;
use rand::RngExt;
use rusqlite::Connection;

const WAIT: Duration = Duration::from_secs(120);

/// Set (to the database) in the environment of this binary when the kill
/// test starts it as its producer process.
const PRODUCER_DB: &str = "OUTBOXD_PF_PRODUCER_DB";
/// How many events that producer commits before it exits.
const PRODUCER_EVENTS: &str = "OUTBOXD_PF_PRODUCER_EVENTS";

/// This suite's own `main` (harness = false in Cargo.toml): the same binary
/// is either the kill test's producer process (when started with
/// [`PRODUCER_DB`] set), or the test runner, with libtest's command line.
/// The tests run one at a time: each starts several processes, and the
/// machine may have two cores.
fn main() -> ExitCode {
    if let Some(db) = std::env::var_os(PRODUCER_DB) {
        producer(Path::new(&db));
        return ExitCode::SUCCESS;
    }
    common::run_one_at_a_time(&[
        (
            "kill_9_of_relay_and_producer_loses_nothing_and_duplicates_only_in_flight",
            kill_9_of_relay_and_producer_loses_nothing_and_duplicates_only_in_flight,
        ),
        (
            "a_relay_frozen_past_its_lease_has_its_late_outcome_refused_by_the_token_fence",
            a_relay_frozen_past_its_lease_has_its_late_outcome_refused_by_the_token_fence,
        ),
        (
            "six_relay_processes_deliver_every_event_once_without_busy_failures",
            six_relay_processes_deliver_every_event_once_without_busy_failures,
        ),
        (
            "purge_replay_and_requeue_beside_three_relays_repeat_no_other_consumer",
            purge_replay_and_requeue_beside_three_relays_repeat_no_other_consumer,
        ),
    ])
}

fn full() -> bool {
    std::env::var_os("OUTBOXD_FULL").is_some()
}

// ---------------------------------------------------------------------------
// Helpers.

/// Every event id in the table.
fn ids_in_db(sb: &Sandbox) -> HashSet<String> {
    let conn = sb.conn();
    let mut stmt = conn.prepare("SELECT event_id FROM event_outbox").unwrap();
    stmt.query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn integrity(sb: &Sandbox) -> String {
    sb.scalar("PRAGMA integrity_check")
}

/// Files in the sandbox whose names start with `prefix`.
fn files(sb: &Sandbox, prefix: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(sb.dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect();
    files.sort();
    files
}

/// `outboxd run --config FILE` (the config names the database), its stderr
/// appended to `log`.
fn relay(config: &Path, log: PathBuf) -> Running {
    let mut cmd =
        Outboxd::on(config)
            .without_db()
            .command(&["run", "--config", config.to_str().unwrap()]);
    Running::spawn_logging(cmd.stdout(Stdio::null()), log)
}

/// SIGTERM, and expect a clean exit.
fn stop(p: &mut Running) {
    let status = p.stop();
    assert!(
        status.success(),
        "outboxd exited with {status} after SIGTERM; log:\n{}",
        p.stderr()
    );
}

/// A counter from the relay's Prometheus endpoint (the config must set
/// `metrics.listen`; the bound address is read from the log).
fn metric(p: &Running, name: &str) -> u64 {
    use std::io::Read;
    let log = p.stderr();
    let addr = log
        .split("address=Some(")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .unwrap_or_else(|| panic!("no metrics address in the log:\n{log}"));
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {name} in the metrics:\n{text}")) as u64
}

/// A config with two JSON-lines consumers, `alpha` and `beta`, writing to
/// `alpha.<tag>.jsonl` and `beta.<tag>.jsonl`, and the given `[relay]` lines.
fn two_jsonl_consumers(relay: &str, tag: &str, fsync: bool) -> String {
    let mut text = format!(
        "database = \"app.db\"\n\
         [relay]\n{relay}\n\
         [retry]\ninitial = \"100ms\"\nmax_delay = \"1s\"\nmax_attempts = 1000\n\
         [purge]\nenabled = false\n"
    );
    for name in ["alpha", "beta"] {
        text.push_str(&format!(
            "[[consumer]]\nname = \"{name}\"\ntypes = [\"*\"]\n\
             [consumer.sink]\nkind = \"jsonl\"\npath = \"{name}.{tag}.jsonl\"\nfsync = {fsync}\n"
        ));
    }
    text
}

/// What the JSON-lines files of one consumer hold.
#[derive(Default)]
struct Deliveries {
    /// Deliveries per event id.
    count: HashMap<String, u32>,
    /// A last line cut short by a kill inside `write(2)`; the relay was never
    /// told it was delivered, so it counts as nothing.
    torn: u32,
    /// Events one relay process delivered twice to this consumer (each
    /// process writes its own file): a duplicate no kill explains.
    within_one_process: u32,
}

impl Deliveries {
    fn read(files: &[PathBuf]) -> Deliveries {
        let mut d = Deliveries::default();
        for file in files {
            let text = fs::read_to_string(file).unwrap();
            let mut lines: Vec<&str> = text.split('\n').collect();
            let last = lines.pop().unwrap_or("");
            if !last.is_empty() {
                d.torn += 1;
            }
            let mut seen = HashSet::new();
            for line in lines {
                let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| {
                    panic!(
                        "{}: a line that is not an envelope ({e}): {line:?}",
                        file.display()
                    )
                });
                let id = v["event_id"].as_str().unwrap().to_string();
                if !seen.insert(id.clone()) {
                    d.within_one_process += 1;
                }
                *d.count.entry(id).or_default() += 1;
            }
        }
        d
    }

    fn ids(&self) -> HashSet<String> {
        self.count.keys().cloned().collect()
    }

    /// Second and later deliveries of an event.
    fn duplicates(&self) -> u64 {
        self.count.values().map(|c| u64::from(c - 1)).sum()
    }
}

// ---------------------------------------------------------------------------
// 1. kill -9 of the relay and the producer.

/// The producer process of the kill test (this binary, started with
/// [`PRODUCER_DB`] set): commits 1–4 events per transaction and prints
/// `ack <id>` for each only after COMMIT returned, with a pause of 0–10 ms
/// between transactions, until it has committed [`PRODUCER_EVENTS`] events
/// or is killed.
fn producer(db: &Path) {
    let max: usize = std::env::var(PRODUCER_EVENTS)
        .expect("the number of events to produce")
        .parse()
        .unwrap();
    let mut conn = outboxd::connection::open(db).unwrap();
    let mut rng = rand::rng();
    let mut out = std::io::stdout().lock();
    let (mut n, mut txn) = (0, 0);
    while n < max {
        // Each event names its transaction and the transaction's size, so
        // the checker can tell a partial transaction.
        let size = rng.random_range(1..=4);
        let txn_id = format!("{}-{txn}", std::process::id());
        txn += 1;
        let events: Vec<Event> = (0..size)
            .map(|i| {
                let payload = serde_json::json!({ "n": n + i, "txn": txn_id, "size": size });
                Event::new("kill.test.v1", &payload).unwrap()
            })
            .collect();
        let ids = commit(&mut conn, &events);
        let mut acks = String::new();
        for id in &ids {
            acks.push_str(&format!("ack {id}\n"));
        }
        // One write(2) per transaction: its acks appear whole or not at all.
        out.write_all(acks.as_bytes()).unwrap();
        out.flush().unwrap();
        n += ids.len();
        // Load shaping, not synchronisation: a host commits now and then,
        // which keeps the event count (and the final drain) modest.
        std::thread::sleep(Duration::from_millis(rng.random_range(0..=10)));
    }
}

/// Enqueues events in one transaction, the host's way; their ids once
/// COMMIT returned (acknowledged).
fn commit(conn: &mut Connection, events: &[Event]) -> Vec<String> {
    let tx = conn.transaction().unwrap();
    let ids = outboxd::enqueue_many(&tx, events)
        .unwrap()
        .iter()
        .map(|e| e.event_id().to_string())
        .collect();
    tx.commit().unwrap();
    ids
}

/// Rows a relay claims at once and the most deliveries it has in flight:
/// `max(batch_size, 2 × workers)` with the settings of the kill test.
const IN_FLIGHT: u64 = 16;

fn kill_9_of_relay_and_producer_loses_nothing_and_duplicates_only_in_flight() {
    let sb = Sandbox::migrated();
    let rounds = if full() { 1000 } else { 100 };
    let relay_settings = "workers = 2\nbatch_size = 16\nlease = \"1s\"\npoll_interval = \"5ms\"\n\
                          shutdown_grace = \"5s\"";
    let exe = std::env::current_exe().unwrap();
    let mut rng = rand::rng();
    let (mut relay_kills, mut producer_kills, mut producers) = (0u64, 0u64, 0u64);
    let mut producer: Option<Running> = None;
    let started = Instant::now();

    for round in 0..rounds {
        if producer.as_mut().is_none_or(|p| p.exited()) {
            let out = File::create(sb.file(&format!("acked.{producers:05}.txt"))).unwrap();
            let mut cmd = Command::new(&exe);
            cmd.env(PRODUCER_DB, sb.db())
                .env(PRODUCER_EVENTS, "1000")
                .stdout(out);
            producer = Some(Running::spawn_logging(&mut cmd, sb.file("producer.log")));
            producers += 1;
        }
        let config = sb.write(
            "kill.toml",
            &two_jsonl_consumers(relay_settings, &format!("{round:05}"), true),
        );
        let log = sb.file(&format!("relay.{round:05}.log"));
        let mut relay = relay(&config, log);
        // Even rounds count the delay from the spawn (the kill may fall into
        // start-up and migration), odd rounds from the moment the relay runs
        // (the kill falls among claims, deliveries and outcome commits).
        if round % 2 == 1 {
            wait_until("the relay to start", WAIT, || {
                assert!(!relay.exited(), "a relay exited; log:\n{}", relay.stderr());
                relay.stderr().contains("outboxd running")
            });
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(2..=50)));
        if round % 2 == 1 {
            if let Some(mut p) = producer.take() {
                if !p.exited() {
                    p.kill9();
                    producer_kills += 1;
                }
            }
        }
        if !relay.exited() {
            relay.kill9();
            relay_kills += 1;
        } else {
            panic!("a relay exited on its own; log:\n{}", relay.stderr());
        }
    }
    if let Some(mut p) = producer.take() {
        p.kill9();
        producer_kills += 1;
    }
    let delivered_in_loop: usize = files(&sb, "alpha.")
        .iter()
        .chain(files(&sb, "beta.").iter())
        .map(|f| fs::read_to_string(f).unwrap().lines().count())
        .sum();
    let loop_took = started.elapsed();

    // The final drain: one relay, no kills, until nothing is pending (leases
    // of killed relays expire after 1 s).
    let config = sb.write(
        "final.toml",
        &two_jsonl_consumers(relay_settings, "final", true),
    );
    let mut relay = relay(&config, sb.file("relay.log"));
    wait_until("the final relay to drain the outbox", WAIT, || {
        assert!(
            !relay.exited(),
            "the final relay exited; log:\n{}",
            relay.stderr()
        );
        // Running first: the killed relays may have delivered everything
        // already (their leases are taken at once), and a SIGTERM before the
        // relay has its handler ends it by the signal.
        relay.stderr().contains("outboxd running")
            && sb.scalar::<i64>("SELECT count(*) FROM event_outbox WHERE status <> 'delivered'")
                == 0
    });
    stop(&mut relay);

    // The checker.
    let mut acked = HashSet::new();
    for file in files(&sb, "acked.") {
        let text = fs::read_to_string(&file).unwrap();
        acked.extend(
            text.lines()
                .filter_map(|l| l.strip_prefix("ack "))
                .map(str::to_string),
        );
    }
    let in_db = ids_in_db(&sb);
    let alpha = Deliveries::read(&files(&sb, "alpha."));
    let beta = Deliveries::read(&files(&sb, "beta."));
    let enqueued: HashSet<String> = acked.union(&in_db).cloned().collect();
    let mut lost = HashSet::new();
    let mut unexpected = HashSet::new();
    let mut undelivered = 0;
    for d in [&alpha, &beta] {
        let ids = d.ids();
        lost.extend(acked.difference(&ids).cloned());
        unexpected.extend(ids.difference(&enqueued).cloned());
        undelivered += in_db.difference(&ids).count();
    }
    let recovered = in_db.difference(&acked).count();
    let missing_from_db = acked.difference(&in_db).count();
    let (dup_alpha, dup_beta) = (alpha.duplicates(), beta.duplicates());
    let integrity = integrity(&sb);
    let partial: i64 = sb.scalar(
        "SELECT count(*) FROM (SELECT json_extract(payload, '$.txn') AS t, count(*) AS n, \
         max(json_extract(payload, '$.size')) AS size FROM event_outbox GROUP BY t) \
         WHERE n <> size",
    );
    println!(
        "# kill -9: {relay_kills} relay kills + {producer_kills} producer kills \
         ({producers} producer processes) in {:.1} s; {} lines delivered during the loop",
        loop_took.as_secs_f64(),
        delivered_in_loop
    );
    println!(
        "# events: acked={} recovered={recovered} (indeterminate, delivered anyway) \
         in_db={}; lost={} unexpected={} duplicated={} (alpha {dup_alpha}, beta {dup_beta}; \
         bound {} per consumer) partial_transactions={partial} torn_lines={} \
         integrity={integrity}",
        acked.len(),
        in_db.len(),
        lost.len(),
        unexpected.len(),
        dup_alpha + dup_beta,
        relay_kills * IN_FLIGHT,
        alpha.torn + beta.torn
    );
    assert!(!acked.is_empty(), "the producer never committed anything");
    assert!(
        delivered_in_loop > 0,
        "nothing was delivered before the final drain: the kills came too early to test anything"
    );
    assert_eq!(integrity, "ok");
    assert_eq!(partial, 0, "a producer transaction is in the table in part");
    assert_eq!(
        missing_from_db, 0,
        "acknowledged events missing from the table"
    );
    assert!(lost.is_empty(), "lost: {lost:?}");
    assert!(unexpected.is_empty(), "unexpected: {unexpected:?}");
    assert_eq!(
        undelivered, 0,
        "events in the table not delivered to every consumer"
    );
    assert!(dup_alpha <= relay_kills * IN_FLIGHT && dup_beta <= relay_kills * IN_FLIGHT);
    assert_eq!(
        alpha.within_one_process + beta.within_one_process,
        0,
        "a relay process delivered an event twice to one consumer: a duplicate without a kill"
    );
}

// ---------------------------------------------------------------------------
// 2. A relay frozen past its lease.

/// A `command` consumer program: logs `$RELAY start <id>`, waits (bounded)
/// until the file `$GATE` exists, logs `$RELAY done <id>`, exits 0.
const GATED_CONSUMER: &str = "#!/bin/sh\n\
printf '%s start %s\\n' \"$RELAY\" \"$OUTBOXD_EVENT_ID\" >> \"$LOG\"\n\
i=0\n\
while [ ! -e \"$GATE\" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done\n\
printf '%s done %s\\n' \"$RELAY\" \"$OUTBOXD_EVENT_ID\" >> \"$LOG\"\n";

fn gated_config(relay: &str, gate: &Path, log: &Path) -> String {
    format!(
        "database = \"app.db\"\n\
         [relay]\nworkers = 1\nbatch_size = 1\nlease = \"2s\"\npoll_interval = \"5ms\"\n\
         shutdown_grace = \"5s\"\n\
         [purge]\nenabled = false\n\
         [metrics]\nlisten = \"127.0.0.1:0\"\n\
         [[consumer]]\nname = \"slow\"\ntypes = [\"*\"]\n\
         [consumer.sink]\nkind = \"command\"\nprogram = \"./gated.sh\"\ntimeout = \"2s\"\n\
         env = {{ RELAY = \"{relay}\", GATE = \"{}\", LOG = \"{}\" }}\n",
        gate.display(),
        log.display()
    )
}

/// True when a write transaction can start within 200 ms: no process holds
/// SQLite's write lock (the relay's own transactions take milliseconds).
fn write_lock_is_free(db: &Path) -> bool {
    let conn = Connection::open(db).unwrap();
    conn.busy_timeout(Duration::from_millis(200)).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE; ROLLBACK").is_ok()
}

/// True when every thread of `pid` is stopped (state T in /proc).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks
        .map(|t| t.unwrap().path().join("stat"))
        .all(|stat| state(&stat) == Some('T'))
}

/// True once every child process of `pid` has exited (is a zombie its
/// parent has not reaped yet, or is gone). Children are found by their
/// parent pid in `/proc/*/stat` (`/proc/<pid>/task/*/children` needs a
/// kernel option that CI machines may not have).
fn children_exited(pid: u32) -> bool {
    let procs = fs::read_dir("/proc").unwrap();
    procs
        .filter_map(|e| fs::read_to_string(e.ok()?.path().join("stat")).ok())
        .filter_map(|stat| {
            // After the command name (in parentheses): state, then parent pid.
            let mut rest = stat.rsplit_once(')')?.1.split_whitespace();
            let state = rest.next()?.chars().next()?;
            let ppid: u32 = rest.next()?.parse().ok()?;
            (ppid == pid).then_some(state)
        })
        .all(|state| state == 'Z')
}

/// A process's or thread's state letter, from its `stat` file.
fn state(stat: &Path) -> Option<char> {
    let s = fs::read_to_string(stat).ok()?;
    // The state follows the command name, which is in parentheses.
    s.rsplit_once(')')?.1.trim_start().chars().next()
}

fn a_relay_frozen_past_its_lease_has_its_late_outcome_refused_by_the_token_fence() {
    let rounds: u32 = if full() { 40 } else { 2 };
    let mut refreezes = 0;
    let started = Instant::now();
    for round in 0..rounds {
        refreezes += lease_takeover(round % 2 == 0);
    }
    println!(
        "# lease takeover: {rounds} rounds ({} with A's late outcome a success, {} a timeout), \
         every one refused by the fence; {refreezes} re-freezes out of a write transaction; \
         {:.1} s",
        rounds.div_ceil(2),
        rounds / 2,
        started.elapsed().as_secs_f64()
    );
}

/// One takeover. With `late_success`, A's consumer finishes while A is
/// frozen, so A's late outcome is a success; otherwise the consumer is still
/// waiting when A resumes, A's timeout (long past) kills it, and the late
/// outcome is a retry. Returns how often A had to be re-frozen.
fn lease_takeover(late_success: bool) -> u32 {
    let sb = Sandbox::migrated();
    let script = sb.write("gated.sh", GATED_CONSUMER);
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let consumer_log = sb.file("consumer.log");
    let (gate_a, gate_b) = (sb.file("gate-a"), sb.file("gate-b"));
    File::create(&gate_b).unwrap(); // B's deliveries finish at once
    let config_a = sb.write("a.toml", &gated_config("A", &gate_a, &consumer_log));
    let config_b = sb.write("b.toml", &gated_config("B", &gate_b, &consumer_log));

    let id = {
        let mut conn = sb.conn();
        let tx = conn.transaction().unwrap();
        let id = outboxd::enqueue(&tx, &Event::new("lease.test.v1", &1).unwrap())
            .unwrap()
            .event_id()
            .to_string();
        tx.commit().unwrap();
        id
    };
    let row =
        |sql: &str| -> Option<String> { sb.scalar(&format!("{sql} WHERE event_id = '{id}'")) };
    let consumer_says = |what: &str| {
        fs::read_to_string(&consumer_log)
            .unwrap_or_default()
            .contains(&format!("{what} {id}"))
    };

    // A claims the event and is inside the delivery, holding the lease.
    let mut a = relay(&config_a, sb.file("a.log"));
    wait_until("relay A to start delivering", WAIT, || {
        assert!(!a.exited(), "relay A exited; log:\n{}", a.stderr());
        consumer_says("A start")
    });
    // A started its consumer (and its 2 s timeout) before this moment.
    let a_delivering_since = Instant::now();
    let token_a = row("SELECT claim_token FROM event_outbox").expect("A holds a claim");
    // Freeze A between its transactions. Frozen inside one, A would hold
    // SQLite's write lock, which no lease can take away: every writer (B
    // and the host alike) would wait for it. So: stop, probe the lock,
    // and if A holds it, let A run a moment and stop it again.
    let mut refreezes = 0;
    loop {
        a.signal("-STOP");
        // SIGSTOP lands on each thread on its own; a thread inside a system
        // call runs on until it returns.
        wait_until("every thread of A to stop", WAIT, || {
            all_threads_stopped(a.pid())
        });
        if write_lock_is_free(&sb.db()) {
            break;
        }
        refreezes += 1;
        assert!(refreezes < 100, "A always held the write lock when stopped");
        a.signal("-CONT");
        std::thread::sleep(Duration::from_millis(rand::rng().random_range(1..=20)));
    }

    // B takes the row over once A, frozen, has not beaten its lock file for
    // ten leases of B's monotonic clock (docs/liveness.md): A's lease ran
    // out by the clock long before, but A still holds its lock.
    let b_started = Instant::now();
    let mut b = relay(&config_b, sb.file("b.log"));
    wait_until("relay B to take A's row over", WAIT, || {
        if b.exited() {
            let inode = |p: &Path| {
                use std::os::unix::fs::MetadataExt;
                fs::metadata(p).map(|m| m.ino()).unwrap_or(0)
            };
            let (db_ino, shm_ino) = (inode(&sb.db()), inode(&sb.file("app.db-shm")));
            let locks: Vec<String> = fs::read_to_string("/proc/locks")
                .unwrap()
                .lines()
                .filter(|l| {
                    l.split_whitespace().nth(5).is_some_and(|f| {
                        f.ends_with(&format!(":{db_ino}")) || f.ends_with(&format!(":{shm_ino}"))
                    })
                })
                .map(str::to_string)
                .collect();
            panic!(
                "relay B exited after {:?} (write lock free now: {}); A pid {} state {:?}; \
                 test pid {}; db ino {db_ino} shm ino {shm_ino}; locks:\n{}\nlog:\n{}",
                b_started.elapsed(),
                write_lock_is_free(&sb.db()),
                a.pid(),
                fs::read_to_string(format!("/proc/{}/stat", a.pid()))
                    .unwrap_or_default()
                    .split_whitespace()
                    .nth(2)
                    .map(str::to_string),
                std::process::id(),
                locks.join("\n"),
                b.stderr()
            );
        }
        let status = row("SELECT status FROM event_outbox").unwrap();
        let token = row("SELECT claim_token FROM event_outbox");
        status == "delivered" || token.is_some_and(|t| t != token_a)
    });
    // Not before ten of the 2 s leases: B's wait starts after b_started.
    assert!(
        b_started.elapsed() >= Duration::from_secs(20),
        "B took a frozen relay's lease after {:?}, before ten leases without a beat",
        b_started.elapsed()
    );
    wait_until("relay B to deliver the event", WAIT, || {
        row("SELECT status FROM event_outbox").unwrap() == "delivered"
    });
    assert!(consumer_says("B done"));
    stop(&mut b);
    let finished_by_b: Option<String> = row("SELECT CAST(finished_at AS TEXT) FROM event_outbox");
    let attempts_by_b: Option<String> = row("SELECT CAST(attempts AS TEXT) FROM event_outbox");

    // A wakes up; its delivery ends and its outcome must be refused.
    // For a late success the gate opens while A is frozen; otherwise it
    // stays shut and A, once resumed, finds its timeout long past and kills
    // the consumer.
    if late_success {
        File::create(&gate_a).unwrap();
        wait_until("A's consumer to finish", WAIT, || consumer_says("A done"));
        // Its last line is written just before it exits: A, resumed before
        // the exit, would find its timeout past and a child still running.
        wait_until("A's consumer to exit", WAIT, || children_exited(a.pid()));
    } else {
        wait_until("A's consumer timeout to pass", WAIT, || {
            a_delivering_since.elapsed() > Duration::from_millis(2100)
        });
    }
    a.signal("-CONT");
    wait_until("relay A to refuse its late outcome", WAIT, || {
        assert!(!a.exited(), "relay A exited; log:\n{}", a.stderr());
        a.stderr()
            .contains("outcome refused: the lease passed to another relay")
    });
    // The counter moves once the refusing transaction commits, just after
    // the log line.
    wait_until("A to count the refused outcome", WAIT, || {
        metric(&a, "outboxd_fenced_out_total") >= 1
    });
    let fenced = metric(&a, "outboxd_fenced_out_total");
    stop(&mut a);

    let timed_out = a.stderr().contains("timed out after 2s and was killed");
    assert_eq!(
        timed_out,
        !late_success,
        "A's late outcome was not the one expected; A's log:\n{}",
        a.stderr()
    );
    assert_eq!(fenced, 1, "A's outboxd_fenced_out_total");
    assert_eq!(row("SELECT status FROM event_outbox").unwrap(), "delivered");
    assert_eq!(row("SELECT claim_token FROM event_outbox"), None);
    assert_eq!(
        row("SELECT CAST(finished_at AS TEXT) FROM event_outbox"),
        finished_by_b,
        "A's late outcome changed the row B finished"
    );
    assert_eq!(
        row("SELECT CAST(attempts AS TEXT) FROM event_outbox"),
        attempts_by_b
    );
    assert_eq!(
        sb.scalar::<i64>(&format!(
            "SELECT count(*) FROM delivered_events WHERE event_key = '{id}' AND consumer = 'slow'"
        )),
        1
    );
    assert_eq!(integrity(&sb), "ok");
    refreezes
}

// ---------------------------------------------------------------------------
// 3. Six relay processes on one file.

fn six_relay_processes_deliver_every_event_once_without_busy_failures() {
    const RELAYS: usize = 6;
    let events = if full() { 100_000 } else { 20_000 };
    let sb = Sandbox::migrated();
    {
        let mut conn = sb.conn();
        for chunk in 0..events / 1000 {
            let batch: Vec<Event> = (0..1000)
                .map(|i| {
                    Event::new("six.test.v1", &serde_json::json!({ "n": chunk * 1000 + i }))
                        .unwrap()
                })
                .collect();
            let tx = conn.transaction().unwrap();
            outboxd::enqueue_many(&tx, &batch).unwrap();
            tx.commit().unwrap();
        }
    }
    let started = Instant::now();
    let mut relays: Vec<Running> = (0..RELAYS)
        .map(|i| {
            let config = sb.write(
                &format!("six.{i}.toml"),
                &(two_jsonl_consumers("workers = 2\nlease = \"30s\"", &format!("{i}"), false)
                    + "[metrics]\nlisten = \"127.0.0.1:0\"\n"),
            );
            relay(&config, sb.file(&format!("six.{i}.log")))
        })
        .collect();
    wait_until(
        "six relays to deliver everything",
        Duration::from_secs(600),
        || {
            for r in relays.iter_mut() {
                assert!(!r.exited(), "a relay exited; log:\n{}", r.stderr());
            }
            sb.scalar::<i64>("SELECT count(*) FROM event_outbox WHERE status <> 'delivered'") == 0
        },
    );
    let took = started.elapsed();
    // SQLITE_BUSY the relays met and retried (never an event failure).
    let busy_retries: u64 = relays
        .iter()
        .map(|r| metric(r, "outboxd_busy_retries_total"))
        .sum();
    for r in relays.iter_mut() {
        stop(r);
    }

    let in_db = ids_in_db(&sb);
    assert_eq!(in_db.len(), events);
    let mut doubles = 0;
    let mut per_relay = vec![0usize; RELAYS];
    for name in ["alpha", "beta"] {
        let files = files(&sb, &format!("{name}."));
        for (i, f) in files.iter().enumerate() {
            per_relay[i] += fs::read_to_string(f).unwrap().lines().count();
        }
        let d = Deliveries::read(&files);
        assert_eq!(d.torn, 0);
        assert_eq!(d.within_one_process, 0);
        assert_eq!(
            d.ids(),
            in_db,
            "consumer {name} did not get exactly the enqueued events"
        );
        doubles += d.duplicates();
    }
    let mut bad_lines = Vec::new();
    for r in &relays {
        for line in r.stderr().lines() {
            let lower = line.to_lowercase();
            if line.contains("ERROR") || lower.contains("locked") || lower.contains("busy") {
                bad_lines.push(line.to_string());
            }
        }
    }
    let out = sb.run(&["status", "--json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "status --json: {e}; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    println!(
        "# six relays: {events} events × 2 consumers in {:.1} s; deliveries per relay {per_relay:?}; \
         double deliveries {doubles}; SQLITE_BUSY met and retried {busy_retries}; \
         error/busy log lines {}; dead {}",
        took.as_secs_f64(),
        bad_lines.len(),
        status["counts"]["dead"]
    );
    assert_eq!(doubles, 0);
    assert!(
        bad_lines.is_empty(),
        "error or busy lines in the logs: {bad_lines:#?}"
    );
    assert_eq!(status["counts"]["dead"], 0, "status: {status}");
    assert!(
        per_relay.iter().filter(|&&n| n > 0).count() > 1,
        "only one relay delivered anything: {per_relay:?}"
    );
    assert_eq!(integrity(&sb), "ok");
}

// ---------------------------------------------------------------------------
// 4. Operators at work: purge, replay and requeue while three relays deliver.

/// Event types of the soak, and how its consumers treat them: `once` and
/// `replayed` take every type; `poison` rejects every `soak.poison.v1`
/// (so those events end dead, and `dead requeue` brings them back); `flaky`
/// fails half of its `soak.flaky.v1` deliveries (so those retry).
const SOAK_TYPES: [&str; 3] = ["soak.ok.v1", "soak.poison.v1", "soak.flaky.v1"];

/// One relay of the soak: four consumers, `once.<i>.jsonl` and
/// `replayed.<i>.jsonl` for the two that are counted.
fn soak_config(sb: &Sandbox, i: usize) -> PathBuf {
    let poison = sb.script("poison.sh", "cat >/dev/null\nexit 65");
    let flaky = sb.script(
        "flaky.sh",
        "cat >/dev/null\n[ $(( $(od -An -N1 -tu1 /dev/urandom) % 2 )) -eq 0 ]",
    );
    let mut text = String::from(
        "database = \"app.db\"\n\
         [relay]\nworkers = 2\nbatch_size = 16\nlease = \"10s\"\n\
         [retry]\ninitial = \"200ms\"\nmax_delay = \"1s\"\nmax_attempts = 1000\njitter = 0.0\n\
         [purge]\nenabled = false\n",
    );
    for name in ["once", "replayed"] {
        text.push_str(&format!(
            "[[consumer]]\nname = \"{name}\"\ntypes = [\"*\"]\n\
             [consumer.sink]\nkind = \"jsonl\"\npath = \"{name}.{i}.jsonl\"\n"
        ));
    }
    for (name, ty, program) in [
        ("poison", SOAK_TYPES[1], &poison),
        ("flaky", SOAK_TYPES[2], &flaky),
    ] {
        text.push_str(&format!(
            "[[consumer]]\nname = \"{name}\"\ntypes = [\"{ty}\"]\n\
             [consumer.sink]\nkind = \"command\"\nprogram = \"{}\"\ntimeout = \"5s\"\n",
            program.display()
        ));
    }
    sb.write(&format!("soak.{i}.toml"), &text)
}

/// Issue 11.1: three relays deliver what two producers commit while an
/// operator loop purges with a 2-second retention and dedup TTL, replays
/// every event of consumer `replayed`, and requeues every dead letter.
/// Without a crash, consumer `once` must get every acknowledged event
/// exactly once (replays name only `replayed`), and `replayed` at least once.
fn purge_replay_and_requeue_beside_three_relays_repeat_no_other_consumer() {
    const RELAYS: usize = 3;
    let run_for = Duration::from_secs(if full() { 120 } else { 15 });
    let sb = Sandbox::migrated();
    let configs: Vec<PathBuf> = (0..RELAYS).map(|i| soak_config(&sb, i)).collect();
    let mut relays: Vec<Running> = configs
        .iter()
        .enumerate()
        .map(|(i, c)| relay(c, sb.file(&format!("soak.{i}.log"))))
        .collect();
    let deadline = Instant::now() + run_for;
    let producers: Vec<_> = (0..2)
        .map(|_| {
            let db = sb.db();
            std::thread::spawn(move || {
                let mut conn = outboxd::connection::open(&db).unwrap();
                let mut rng = rand::rng();
                let mut acked = Vec::new();
                while Instant::now() < deadline {
                    let events: Vec<Event> = (0..rng.random_range(1..=3))
                        .map(|_| {
                            let ty = match rng.random_range(0..10) {
                                0 => SOAK_TYPES[1],
                                1 => SOAK_TYPES[2],
                                _ => SOAK_TYPES[0],
                            };
                            Event::new(ty, &serde_json::json!({ "n": acked.len() })).unwrap()
                        })
                        .collect();
                    acked.extend(commit(&mut conn, &events));
                    // Load shaping, not synchronisation.
                    std::thread::sleep(Duration::from_millis(rng.random_range(0..=10)));
                }
                acked
            })
        })
        .collect();
    // The operator: purge, replay, requeue, again and again.
    let mut ops = [0u32; 3];
    while Instant::now() < deadline {
        let config = configs[0].to_str().unwrap();
        sb.ok(&[
            "replay",
            "--consumer",
            "replayed",
            "--all",
            "--config",
            config,
        ]);
        ops[0] += 1;
        std::thread::sleep(Duration::from_millis(300));
        sb.ok(&["purge", "--delivered-retention", "2s", "--dedup-ttl", "2s"]);
        ops[1] += 1;
        sb.ok(&["dead", "requeue", "--all"]);
        ops[2] += 1;
        std::thread::sleep(Duration::from_millis(300));
    }
    let acked: HashSet<String> = producers
        .into_iter()
        .flat_map(|p| p.join().unwrap())
        .collect();
    wait_until("the relays to finish every pending event", WAIT, || {
        for r in relays.iter_mut() {
            assert!(!r.exited(), "a relay exited; log:\n{}", r.stderr());
        }
        sb.scalar::<i64>("SELECT count(*) FROM event_outbox WHERE status = 'pending'") == 0
    });
    for r in relays.iter_mut() {
        stop(r);
    }
    let once = Deliveries::read(&files(&sb, "once."));
    let replayed = Deliveries::read(&files(&sb, "replayed."));
    let lost_once = acked.difference(&once.ids()).count();
    let lost_replayed = acked.difference(&replayed.ids()).count();
    let twice: Vec<&String> = once
        .count
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(id, _)| id)
        .collect();
    println!(
        "# operators beside three relays for {}s: {} events acknowledged; {} replays, {} purges, \
         {} requeues; consumer once: {} events delivered more than once ({} extra deliveries), \
         {} lost; consumer replayed: {} deliveries, {} lost",
        run_for.as_secs(),
        acked.len(),
        ops[0],
        ops[1],
        ops[2],
        twice.len(),
        once.duplicates(),
        lost_once,
        replayed.count.values().map(|n| u64::from(*n)).sum::<u64>(),
        lost_replayed,
    );
    assert_eq!(lost_once + lost_replayed, 0, "events lost");
    assert!(
        twice.is_empty(),
        "consumer once got {} events more than once without a crash, such as {:?}",
        twice.len(),
        twice.iter().take(3).collect::<Vec<_>>()
    );
    assert_eq!(integrity(&sb), "ok");
}
