//! `outboxd run` facing a hostile machine, black-box on the real binary: a
//! memory limit with large foreign payloads among small events (issue
//! 11.3), a full disk when SIGTERM comes (11.5), a file with corrupt pages
//! (11.6), the system clock stepping back (11.9, with libfaketime).
//!
//! Each test skips itself, with a message, when the tool or the privilege
//! it needs is missing (`prlimit`; root to mount a tmpfs; `faketime`);
//! under `.ci/run` (OUTBOXD_CI=1) a missing tool fails it instead
//! (`common::missing`). Synchronisation is by
//! bounded polling of the database; `OUTBOXD_FULL=1` selects the long forms.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::bin::{code, Running, Sandbox, WAIT};
use common::event;
use outboxd::EventId;

fn full() -> bool {
    std::env::var_os("OUTBOXD_FULL").is_some()
}

/// A config with one JSON-lines consumer writing to `out.jsonl`, two
/// workers, and the given `[relay]` lines.
fn jsonl_config(sb: &Sandbox, name: &str, relay: &str) -> String {
    let text = format!(
        "database = \"app.db\"\n[relay]\nworkers = 2\n{relay}\n\
         [[consumer]]\nname = \"out\"\ntypes = [\"*\"]\n\
         [consumer.sink]\nkind = \"jsonl\"\npath = \"out.jsonl\"\n"
    );
    sb.write(name, &text).to_str().unwrap().to_string()
}

/// `outboxd run --config CONFIG`, through `runner` (such as prlimit).
fn run_through(sb: &Sandbox, runner: &[&str], config: &str) -> Running {
    let runner: Vec<std::ffi::OsString> = runner.iter().map(Into::into).collect();
    sb.outboxd()
        .through(&runner)
        .spawn(&["run", "--config", config])
}

/// The event ids in the JSON-lines output, in order.
fn delivered(sb: &Sandbox) -> Vec<String> {
    std::fs::read_to_string(sb.file("out.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["event_id"].as_str().unwrap().to_string()
        })
        .collect()
}

/// Waits until no row is pending, failing (with the relay's log) if the
/// relay exits first or does not get there in `timeout`.
fn wait_drained(sb: &Sandbox, relay: &mut Running, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while sb.count("status = 'pending'") > 0 {
        relay.assert_alive();
        assert!(
            Instant::now() < deadline,
            "rows still pending after {timeout:?}; log:\n{}",
            relay.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Inserts `n` rows whose payload is a JSON string of `bytes` bytes, as a
/// foreign producer could, and returns their ids.
fn large_rows(db: &Path, n: usize, bytes: u64) -> Vec<String> {
    let conn = outboxd::connection::open(db).unwrap();
    (0..n)
        .map(|_| {
            let id = EventId::new().to_string();
            conn.execute(
                "INSERT INTO event_outbox (event_id, event_type, payload)
                 VALUES (?1, 'big.blob.v1', '\"' || replace(hex(zeroblob(?2 / 2 - 1)), '0', 'x') || '\"')",
                rusqlite::params![id, bytes as i64],
            )
            .unwrap();
            id
        })
        .collect()
}

/// Issue 11.3: the claim read up to `batch_size` rows whole, so a few large
/// foreign payloads under a memory limit made every start abort in the
/// claim ("memory allocation of 50000002 bytes failed"), and nothing, not
/// even the small events beside them, was delivered. Now a relay under
/// `prlimit --as` dead-letters the payloads above `max_payload_bytes`
/// unread, with their size in the reason, and delivers the small ones;
/// requeued with the maximum raised, the large ones are delivered too, one
/// at a time within `batch_bytes`.
#[test]
fn large_payloads_among_small_ones_never_abort_a_relay_under_a_memory_limit() {
    if !common::available("prlimit", &["--version"]) {
        return;
    }
    // The address-space limits: the first is too small for a relay that
    // loads a batch of these payloads (on main it retried its claim with
    // SQLITE_NOMEM forever, delivering nothing), the second for one that
    // loads several (on main: "memory allocation failed", abort).
    // Each includes room for the glibc malloc arenas (64 MB of address
    // space per allocating thread) of the relay's thread watching the -wal
    // file (src/relay/wake.rs), of its checkpoint thread
    // (src/relay/checkpoint.rs) and of its heartbeat thread
    // (src/liveness/member.rs); a batch of these payloads needs several
    // times one arena's room.
    let (large, bytes, limits) = if full() {
        (8, 50_000_000, ["692000000", "892000000"])
    } else {
        (4, 40_000_000, ["592000000", "828000000"])
    };
    let sb = Sandbox::migrated();
    let mut small = sb.enqueue(&(0..5).map(|n| event("small.one.v1", n)).collect::<Vec<_>>());
    let big = large_rows(&sb.db(), large, bytes);
    small.extend(
        sb.enqueue(
            &(5..10)
                .map(|n| event("small.one.v1", n))
                .collect::<Vec<_>>(),
        ),
    );
    let as_limit = limits.map(|l| format!("--as={l}"));

    // The defaults: the large payloads are over max_payload_bytes.
    let config = jsonl_config(&sb, "default.toml", "");
    let mut relay = run_through(&sb, &["prlimit", &as_limit[0]], &config);
    wait_drained(&sb, &mut relay, WAIT * 3);
    assert!(relay.stop().success(), "{}", relay.stderr());
    let got = delivered(&sb);
    let small: Vec<String> = small.iter().map(|i| i.to_string()).collect();
    // Two workers and no ordering key: any order (a run delivered the
    // fourth after the ninth).
    let sorted = |ids: &[String]| {
        let mut ids = ids.to_vec();
        ids.sort();
        ids
    };
    assert_eq!(sorted(&got), sorted(&small), "the small events, each once");
    for id in &big {
        let reason: String = sb.scalar(&format!(
            "SELECT last_error FROM event_outbox WHERE event_id = '{id}' AND status = 'dead'"
        ));
        assert!(
            reason.contains(&format!("payload is {bytes} bytes")),
            "{reason}"
        );
    }

    // Requeued, with a maximum above them: delivered, one at a time.
    sb.ok(&["dead", "requeue", "--all"]);
    let config = jsonl_config(
        &sb,
        "raised.toml",
        &format!("max_payload_bytes = {}", bytes * 2),
    );
    let mut relay = run_through(&sb, &["prlimit", &as_limit[1]], &config);
    wait_drained(&sb, &mut relay, WAIT * 3);
    assert!(relay.stop().success(), "{}", relay.stderr());
    let got = delivered(&sb);
    assert_eq!(
        sorted(&got[small.len()..]),
        sorted(&big),
        "then the large ones, each once"
    );
    assert_eq!(
        sb.count("status = 'delivered'"),
        (small.len() + big.len()) as i64
    );
    println!(
        "# prlimit --as={}: {} small events delivered, {large} payloads of {bytes} bytes \
         dead-lettered unread; --as={}: delivered after a requeue with max_payload_bytes raised",
        limits[0],
        small.len(),
        limits[1]
    );
}

/// Fills the file system holding `dir` with a file there, until it refuses
/// to take more.
fn fill(dir: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(dir.join("filler")).unwrap();
    let block = vec![0u8; 64 * 1024];
    while f.write_all(&block).and_then(|()| f.sync_all()).is_ok() {}
}

/// Issue 11.5: SIGTERM while the outcomes of finished deliveries could not
/// be written (a full disk) exited 0, silently, leaving the rows leased;
/// after a restart every one was delivered again. Now shutdown keeps trying
/// within the grace period, then says at ERROR how many outcomes it could
/// not record, and `run` exits 3.
#[test]
fn sigterm_on_a_full_disk_says_how_many_outcomes_were_not_recorded_and_exits_3() {
    let sb = Sandbox::new();
    let mnt = sb.file("small");
    std::fs::create_dir_all(&mnt).unwrap();
    if !common::mount_tmpfs(&mnt, "4m", false) {
        println!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    }
    let _unmount = common::Mounted(mnt.clone());
    let db = mnt.join("app.db");
    let mut conn = outboxd::connection::open(&db).unwrap();
    outboxd::schema::migrate(&mut conn).unwrap();
    let tx = conn.transaction().unwrap();
    let events: Vec<_> = (0..3).map(|n| event("disk.full.v1", n)).collect();
    outboxd::enqueue_many(&tx, &events).unwrap();
    tx.commit().unwrap();
    // The consumer says it started, then waits for the gate (outside the
    // tmpfs, so it can be created on a full disk).
    let (started, gate) = (sb.file("started"), sb.file("gate"));
    let consumer = sb.script(
        "slow.sh",
        &format!(
            "cat >/dev/null\necho x >> {}\nwhile [ ! -e {} ]; do sleep 0.02; done",
            started.display(),
            gate.display()
        ),
    );
    let config = sb.write(
        "full.toml",
        &format!(
            "database = \"{}\"\n[relay]\nworkers = 3\n\
             [[consumer]]\nname = \"slow\"\ntypes = [\"*\"]\n\
             [consumer.sink]\nkind = \"command\"\nprogram = \"{}\"\n",
            db.display(),
            consumer.display()
        ),
    );
    let mut relay = sb.outboxd().without_db().spawn(&[
        "run",
        "--config",
        config.to_str().unwrap(),
        "--shutdown-grace",
        "2s",
    ]);
    common::wait_until("three deliveries to start", WAIT, || {
        relay.assert_alive();
        std::fs::read_to_string(&started).is_ok_and(|s| s.lines().count() == 3)
    });
    // Empty the WAL, so recording outcomes needs new space, and fill the disk.
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(conn);
    fill(&mnt);
    std::fs::write(&gate, "").unwrap();
    common::wait_until("the outcome writes to fail", WAIT, || {
        relay.assert_alive();
        relay.stderr().contains("cannot write to the database")
    });
    let status = relay.stop();
    let log = relay.stderr();
    assert_eq!(status.code(), Some(code::DATABASE), "{log}");
    let error = log
        .lines()
        .find(|l| l.contains("ERROR") && l.contains("could not record the outcomes"))
        .unwrap_or_else(|| panic!("no ERROR line counting the outcomes:\n{log}"));
    assert!(error.contains("outcomes=3"), "{error}");
    assert!(
        log.contains("outboxd: error:") && log.contains("will be delivered again"),
        "{log}"
    );
    // The rows are left leased, as the log says: nothing is lost.
    std::fs::remove_file(mnt.join("filler")).unwrap();
    assert_eq!(
        outboxd::connection::open(&db)
            .unwrap()
            .query_row(
                "SELECT count(*) FROM event_outbox WHERE status = 'pending' AND claim_token IS NOT NULL",
                [],
                |r| r.get::<_, i64>(0)
            )
            .unwrap(),
        3
    );
}

/// The leaf pages of a table, in page order (SQLite's dbstat table).
fn leaf_pages(conn: &rusqlite::Connection, table: &str) -> Vec<i64> {
    let mut stmt = conn
        .prepare("SELECT pageno FROM dbstat WHERE name = ?1 AND pagetype = 'leaf' ORDER BY pageno")
        .unwrap();
    stmt.query_map([table], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Issue 11.6: on a database with corrupt pages `outboxd run` retried
/// forever ("database disk image is malformed" every 5 s), exited 0 on
/// SIGTERM, and recorded the outcomes of the deliveries that did succeed
/// only at shutdown. Now it stops claiming, records what it can, logs what
/// `outboxd doctor` says, and exits 3 by itself; `status` and `doctor`
/// report the damage after it.
#[test]
fn a_relay_on_corrupt_pages_stops_records_what_it_can_and_exits_3() {
    let sb = Sandbox::migrated();
    let payload = "x".repeat(200);
    for chunk in 0..6 {
        let events: Vec<_> = (0..500)
            .map(|n| {
                outboxd::Event::new(
                    "corrupt.page.v1",
                    &serde_json::json!({ "n": chunk * 500 + n, "pad": payload }),
                )
                .unwrap()
            })
            .collect();
        sb.enqueue(&events);
    }
    let (pages, page_size) = {
        let conn = sb.conn();
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        let size: i64 = conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .unwrap();
        (leaf_pages(&conn, "event_outbox"), size)
    };
    // Two leaf pages two thirds of the way through the table: the rows
    // before them can be delivered, the claim that reaches them cannot.
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(sb.db())
            .unwrap();
        for page in &pages[pages.len() * 2 / 3..][..2] {
            f.seek(SeekFrom::Start(((page - 1) * page_size) as u64))
                .unwrap();
            f.write_all(&vec![0x55; page_size as usize]).unwrap();
        }
    }
    let config = jsonl_config(&sb, "c.toml", "");
    let mut relay = sb
        .outboxd()
        .without_db()
        .spawn(&["run", "--config", &config]);
    let status = relay.wait(WAIT);
    let log = relay.stderr();
    assert_eq!(status.code(), Some(code::DATABASE), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    let finding = log
        .lines()
        .find(|l| l.contains("ERROR") && l.contains("the database file is damaged"))
        .unwrap_or_else(|| panic!("no ERROR line with the damage:\n{log}"));
    assert!(finding.contains(".recover"), "{finding}");
    assert!(
        log.lines()
            .any(|l| l.starts_with("outboxd: error:") && l.contains("outboxd doctor")),
        "{log}"
    );
    // Every delivery made was recorded (those rows are on sound pages).
    let got = delivered(&sb);
    assert!(!got.is_empty(), "nothing was delivered before the damage");
    let conn = sb.conn();
    let unrecorded = got
        .iter()
        .filter(|id| {
            conn.query_row(
                "SELECT status FROM event_outbox WHERE event_id = ?1",
                [id],
                |r| r.get::<_, String>(0),
            )
            .map_or(true, |s| s != "delivered")
        })
        .count();
    assert_eq!(unrecorded, 0, "deliveries not recorded as such");
    // status and doctor keep saying so.
    let out = sb.run(&["status"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code::DATABASE), "{stderr}");
    assert!(stderr.contains("outboxd doctor"), "{stderr}");
    let doctor = sb.expect(&["doctor"], code::PROBLEMS);
    assert!(
        doctor.contains("ERROR") && doctor.contains("the database file is damaged"),
        "{doctor}"
    );
    println!(
        "# corrupt pages: {} events delivered and recorded before the damage; exit 3; \
         status exit 3, doctor exit 1",
        got.len()
    );
}

/// libfaketime, where Debian's `faketime` installs it for this machine's
/// architecture (.ci/run installs it).
pub(crate) fn libfaketime() -> std::path::PathBuf {
    Path::new("/usr/lib")
        .join(format!("{}-linux-gnu", std::env::consts::ARCH))
        .join("faketime/libfaketimeMT.so.1")
}

/// Runs `cmd` with its wall clock offset by what the file `offset` says
/// (`+0`, `-1h`…), read again at every look: the monotonic clock is left
/// alone, as a real step of the system clock leaves it.
pub(crate) fn faked(mut cmd: Command, offset: &Path) -> Command {
    cmd.env("LD_PRELOAD", libfaketime())
        .env("FAKETIME_TIMESTAMP_FILE", offset)
        .env("FAKETIME_NO_CACHE", "1")
        .env("DONT_FAKE_MONOTONIC", "1");
    cmd
}

/// Issue 11.9: after the system clock stepped back, leases and retries
/// waited for the size of the step, and `status`/`doctor` said healthy while
/// a lease ended an hour away. Through the binary under libfaketime: a retry
/// scheduled before a step of an hour is delivered at once; a live relay's
/// lease, an hour away after a step, is reported by `status` (exit 1,
/// "clock-step") and by `doctor`, and renewed within half a lease; a
/// crashed relay's lease left an hour away is taken over by the next relay
/// at once, its owner's lock being free.
#[test]
fn a_step_of_the_clock_back_leaves_no_lease_or_retry_waiting_and_is_reported() {
    if !libfaketime().exists() {
        common::missing("libfaketime is not installed (apt-get install faketime)");
        return;
    }
    let sb = Sandbox::migrated();
    let offset = sb.write("offset", "+0\n");
    let step = |to: &str| std::fs::write(&offset, format!("{to}\n")).unwrap();
    let (started, gate, flaky_done) = (sb.file("started"), sb.file("gate"), sb.file("flaky.done"));
    let hold = sb.script(
        "hold.sh",
        &format!(
            "cat >/dev/null\necho x >> {}\nwhile [ ! -e {} ]; do sleep 0.05; done",
            started.display(),
            gate.display()
        ),
    );
    let flaky = sb.script(
        "flaky.sh",
        &format!(
            "cat >/dev/null\n[ -e {0} ] && exit 0\ntouch {0}\nexit 1",
            flaky_done.display()
        ),
    );
    let config = sb.write(
        "clock.toml",
        &format!(
            "database = \"app.db\"\n[relay]\nlease = \"10s\"\n\
             [retry]\ninitial = \"2s\"\nmax_delay = \"2s\"\njitter = 0.0\n\
             [[consumer]]\nname = \"hold\"\ntypes = [\"clock.hold.v1\"]\n\
             [consumer.sink]\nkind = \"command\"\nprogram = \"{}\"\ntimeout = \"10s\"\n\
             [[consumer]]\nname = \"flaky\"\ntypes = [\"clock.retry.v1\"]\n\
             [consumer.sink]\nkind = \"command\"\nprogram = \"{}\"\ntimeout = \"10s\"\n",
            hold.display(),
            flaky.display()
        ),
    );
    let config = config.to_str().unwrap();
    let outboxd = |args: &[&str]| faked(sb.command(args), &offset);
    let relay = || Running::spawn(&mut outboxd(&["run", "--config", config]));
    let enqueue = |ty: &str| {
        let out = outboxd(&["enqueue", "--type", ty, "--payload", "{}"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let status = || {
        let out = outboxd(&["status", "--json", "--config", config])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (out.status.code(), v)
    };
    let clock_step = |v: &serde_json::Value| {
        v["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["threshold"] == "clock-step")
    };

    // A retry scheduled 2 s ahead; then the clock steps back an hour.
    let mut a = relay();
    enqueue("clock.retry.v1");
    common::wait_until("the first attempt to fail", WAIT, || {
        a.assert_alive();
        sb.count("attempts = 1") == 1
    });
    step("-1h");
    common::wait_until("the retry, at once rather than in an hour", WAIT, || {
        a.assert_alive();
        sb.count("status = 'delivered'") == 1
    });

    // A live relay holds a lease; the clock steps back another hour.
    enqueue("clock.hold.v1");
    common::wait_until("the delivery to start", WAIT, || {
        a.assert_alive();
        std::fs::read_to_string(&started).is_ok_and(|s| s.lines().count() == 1)
    });
    step("-2h");
    let (code, v) = status();
    assert_eq!(code, Some(code::PROBLEMS), "{v}");
    assert!(clock_step(&v), "{v}");
    let doctor = String::from_utf8(outboxd(&["doctor"]).output().unwrap().stdout).unwrap();
    assert!(
        doctor
            .lines()
            .any(|l| l.contains("warning") && l.contains("clock") && l.contains("stepped back")),
        "{doctor}"
    );
    common::wait_until("the relay to renew its lease", WAIT, || {
        a.assert_alive();
        !clock_step(&status().1)
    });

    // The relay dies holding it, and the clock steps back once more.
    a.kill9();
    step("-3h");
    assert!(clock_step(&status().1));
    std::fs::write(&gate, "").unwrap();
    let mut b = relay();
    common::wait_until("the next relay to take the lease over", WAIT, || {
        b.assert_alive();
        sb.count("status = 'delivered'") == 2
    });
    assert!(b.stop().success(), "{}", b.stderr());
    // A's lock is free: its lease is taken at once (docs/liveness.md),
    // not after the far-lease repair's wait.
    assert!(
        b.stderr()
            .contains("taking over the leases of a relay or sender that ended"),
        "{}",
        b.stderr()
    );
    let (code, v) = status();
    assert_eq!(code, Some(code::OK), "{v}");
}
