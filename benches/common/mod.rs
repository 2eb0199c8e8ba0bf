//! Helpers shared by the `harness = false` benches: settings from the
//! environment, a temp dir on a real disk, run statistics and percentiles.
//!
//! Each bench includes this file with `mod common;`; not every bench uses
//! every helper.
#![allow(dead_code)]

pub mod producer;

use std::path::{Path, PathBuf};
use std::time::Duration;

/// A setting from the environment (so CI can run a tiny smoke size), or
/// its default.
pub fn env_or(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?}: expected a whole number")),
        Err(_) => default,
    }
}

/// The filesystem type holding `path`, from /proc/mounts (longest mount
/// point that is a prefix of the path).
pub fn fs_type(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let mut best: Option<(usize, String)> = None;
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 3 || !path.starts_with(f[1]) {
            continue;
        }
        if best.as_ref().is_none_or(|(len, _)| f[1].len() > *len) {
            best = Some((f[1].len(), f[2].to_string()));
        }
    }
    best.map_or_else(|| "unknown".into(), |(_, t)| t)
}

/// A temp dir for the databases: under `OUTBOXD_BENCH_DIR` if set, else the
/// system temp dir unless that is a tmpfs (which never fsyncs and would
/// flatter every figure), else the current directory.
pub fn bench_dir() -> tempfile::TempDir {
    let base: PathBuf = match std::env::var_os("OUTBOXD_BENCH_DIR") {
        Some(d) => d.into(),
        None => {
            let tmp = std::env::temp_dir();
            if fs_type(&tmp) == "tmpfs" {
                PathBuf::from(".")
            } else {
                tmp
            }
        }
    };
    let dir = tempfile::Builder::new()
        .prefix("outboxd-bench-")
        .tempdir_in(&base)
        .expect("a temp dir for the bench databases");
    let fs = fs_type(dir.path());
    if fs == "tmpfs" {
        eprintln!(
            "warning: {} is on tmpfs: figures will not include real fsyncs",
            dir.path().display()
        );
    }
    dir
}

/// The 1-minute load average, to record beside each table (other work on
/// the machine moves every figure).
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// One line saying where and under what load a table was measured.
pub fn header(name: &str, dir: &Path, what: &str) {
    println!(
        "{name}: {what}; databases in {} ({}), WAL; load average at start {}",
        dir.display(),
        fs_type(dir),
        load()
    );
}

/// Median, min and max of a set of runs.
#[derive(Debug, Clone, Copy)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Stats {
    /// The statistics of `values` (at least one).
    pub fn of(mut values: Vec<f64>) -> Stats {
        assert!(!values.is_empty(), "no runs");
        values.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let n = values.len();
        let median = if n % 2 == 1 {
            values[n / 2]
        } else {
            (values[n / 2 - 1] + values[n / 2]) / 2.0
        };
        Stats {
            median,
            min: values[0],
            max: values[n - 1],
        }
    }
}

/// The `p`-th percentile (0..=100) of sorted durations, nearest rank.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    assert!(!sorted.is_empty(), "no samples");
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Milliseconds with three decimals.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Sleeps until `deadline` (pacing a producer, not synchronising threads).
pub fn sleep_until(deadline: std::time::Instant) {
    let now = std::time::Instant::now();
    if deadline > now {
        std::thread::sleep(deadline - now);
    }
}

/// Microseconds since the Unix epoch by the wall clock, comparable across
/// processes on one machine.
pub fn wall_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_micros() as i64
}

/// Waits until `done()` holds, polling every millisecond, or panics after
/// `limit` naming `what`.
pub fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A migrated database at `path`, opened with outboxd's settings, with
/// `synchronous` set as given ("FULL" or "NORMAL").
pub fn migrated(path: &Path, synchronous: &str) -> rusqlite::Connection {
    let mut conn = outboxd::connection::open(path).expect("open the bench database");
    outboxd::schema::migrate(&mut conn).expect("migrate the bench database");
    conn.execute_batch(&format!("PRAGMA synchronous = {synchronous}"))
        .expect("set synchronous");
    conn
}

/// The relay's purge policy: the default, or none when
/// OUTBOXD_BENCH_PURGE=off (to measure what the housekeeping purge costs).
pub fn purge_policy() -> Option<outboxd::purge::PurgePolicy> {
    match std::env::var("OUTBOXD_BENCH_PURGE").as_deref() {
        Ok("off") => None,
        _ => Some(outboxd::purge::PurgePolicy::default()),
    }
}

/// "default" or "off": the purge the benches' relays run, for table headers.
pub fn purge_label() -> &'static str {
    if purge_policy().is_some() {
        "default"
    } else {
        "off"
    }
}

/// Copies a template database to `to` and writes the copy to disk before
/// returning, as a file at rest would be. Without the sync the copy's
/// pages stay dirty in the page cache, and the first fsync SQLite makes
/// on the file (the relay's first WAL checkpoint) writes the whole copy:
/// on a 1.5 GB file that was the fixed cost of several hundred
/// milliseconds the first scale runs charged to the relay.
pub fn copy_at_rest(template: &Path, to: &Path) {
    std::fs::copy(template, to).expect("copy the template database");
    std::fs::File::open(to)
        .and_then(|f| f.sync_all())
        .expect("write the copy to disk");
}

/// Deletes a database file and its -wal and -shm files, if present.
pub fn remove_db(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

/// The host's table the benches write to: `CREATE TABLE host_rows (…)`.
pub const HOST_ROWS: &str =
    "CREATE TABLE host_rows (id INTEGER PRIMARY KEY, body TEXT NOT NULL, at INTEGER NOT NULL)";

/// Commit latencies (sorted) of `n` host writes paced at one per
/// millisecond (a late write starts at once), on a connection of the
/// host's own with outboxd's settings (WAL, synchronous=FULL). A write is
/// `BEGIN; INSERT one row into host_rows; COMMIT` (a deferred transaction,
/// rusqlite's default), timed from BEGIN to the return of COMMIT, so it
/// includes waiting for the write lock and any WAL auto-checkpoint the
/// commit runs. OUTBOXD_BENCH_HOST_AUTOCHECKPOINT=N sets the connection's
/// `wal_autocheckpoint`.
pub fn host_writes(path: &Path, n: usize) -> Vec<Duration> {
    let mut conn = outboxd::connection::open(path).unwrap();
    if let Ok(n) = std::env::var("OUTBOXD_BENCH_HOST_AUTOCHECKPOINT") {
        let n: u32 = n.parse().expect("OUTBOXD_BENCH_HOST_AUTOCHECKPOINT: pages");
        conn.execute_batch(&format!("PRAGMA wal_autocheckpoint = {n}"))
            .unwrap();
    }
    let mut lat = Vec::with_capacity(n);
    let start = std::time::Instant::now();
    for i in 0..n {
        sleep_until(start + Duration::from_millis(i as u64));
        let t0 = std::time::Instant::now();
        let tx = conn.transaction().unwrap();
        tx.prepare_cached("INSERT INTO host_rows (body, at) VALUES (?1, ?2)")
            .unwrap()
            .execute(rusqlite::params![
                "an order line of the host application",
                i as i64
            ])
            .unwrap();
        tx.commit().unwrap();
        lat.push(t0.elapsed());
    }
    lat.sort();
    lat
}

/// Commits `n` due events of `event_type` (payload `{"i": n}`), 10,000 per
/// transaction.
pub fn enqueue_backlog(conn: &mut rusqlite::Connection, n: usize, event_type: &str) {
    let mut i = 0;
    while i < n {
        let k = (n - i).min(10_000);
        let events: Vec<outboxd::Event> = (i..i + k)
            .map(|j| outboxd::Event::new(event_type, &serde_json::json!({ "i": j })).unwrap())
            .collect();
        let tx = conn.transaction().unwrap();
        outboxd::enqueue_many(&tx, &events).unwrap();
        tx.commit().unwrap();
        i += k;
    }
}

/// The raw loops' claim (benches/transactional.rs): up to 256 due rows,
/// stamped with the token `b` and a 30 s lease, in one
/// `UPDATE … RETURNING`; their (id, event_id).
pub fn raw_claim(conn: &rusqlite::Connection, now: i64) -> Vec<(i64, String)> {
    raw_claim_up_to(conn, now, 256)
}

/// [`raw_claim`] of up to `limit` rows (benches/host_impact.rs). The limit
/// is in the SQL text: SQLite prepares a statement whose LIMIT is a bound
/// parameter again at every execution.
pub fn raw_claim_up_to(conn: &rusqlite::Connection, now: i64, limit: usize) -> Vec<(i64, String)> {
    conn.prepare_cached(&format!(
        "UPDATE event_outbox SET claim_token = 'b', lease_until = ?1 + 30000, available_at = ?1 + 30000
          WHERE id IN (SELECT id FROM event_outbox WHERE status = 'pending' AND available_at <= ?1
                        ORDER BY available_at, id LIMIT {limit})
          RETURNING id, event_id"
    ))
    .unwrap()
    .query_map([now], |r| Ok((r.get(0)?, r.get(1)?)))
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

/// The raw loops' finish (benches/drain.rs, benches/host_impact.rs): each
/// (id, event key) row claimed with the token `b` marked delivered, and
/// one ledger row for each of `consumers`.
pub fn raw_finish<'a>(
    conn: &rusqlite::Connection,
    rows: impl IntoIterator<Item = (i64, &'a str)>,
    consumers: &[String],
    now: i64,
) {
    let mut finish = conn
        .prepare_cached(
            "UPDATE event_outbox SET status = 'delivered', finished_at = ?2,
                    claim_token = NULL, lease_until = NULL
              WHERE id = ?1 AND claim_token = 'b'",
        )
        .unwrap();
    let mut ledger = conn
        .prepare_cached(
            "INSERT OR IGNORE INTO delivered_events (event_key, consumer, outbox_id, delivered_at)
             VALUES (?1, ?2, ?3, ?4)",
        )
        .unwrap();
    for (id, key) in rows {
        finish.execute(rusqlite::params![id, now]).unwrap();
        for name in consumers {
            ledger
                .execute(rusqlite::params![key, name, id, now])
                .unwrap();
        }
    }
}

/// Inserts `n` delivered rows (finished just now, so the relay's purge
/// leaves them alone) and one `delivered_events` row each for `consumer`,
/// with plain SQL, 500,000 rows per transaction.
pub fn fill_delivered(conn: &mut rusqlite::Connection, n: usize, consumer: &str) {
    let now = outboxd::Timestamp::now().as_millis();
    let chunk = 500_000;
    let mut done = 0;
    while done < n {
        let k = (n - done).min(chunk);
        let tx = conn.transaction().unwrap();
        let before: i64 = tx
            .query_row("SELECT coalesce(max(id), 0) FROM event_outbox", [], |r| {
                r.get(0)
            })
            .unwrap();
        tx.execute(
            "WITH RECURSIVE c(x) AS (SELECT ?1 UNION ALL SELECT x + 1 FROM c WHERE x < ?2)
             INSERT INTO event_outbox (event_id, event_type, event_version, payload,
                                       occurred_at, created_at, available_at, status, finished_at)
             SELECT printf('00000000000000%012d', x), 'bench.old.v1', 1, '{\"i\":' || x || '}',
                    ?3, ?3, ?3, 'delivered', ?3
               FROM c",
            rusqlite::params![done as i64 + 1, (done + k) as i64, now],
        )
        .unwrap();
        tx.execute(
            "INSERT INTO delivered_events (event_key, consumer, outbox_id, delivered_at)
             SELECT event_id, ?2, id, finished_at FROM event_outbox WHERE id > ?1",
            rusqlite::params![before, consumer],
        )
        .unwrap();
        tx.commit().unwrap();
        done += k;
    }
}

/// Starts `relay` on `path`, waits until no event is pending (an O(1) probe
/// of the due index, every 2 ms, so watching costs the relay nothing
/// measurable), stops it, checks that all `n` events were delivered (none
/// dead), and returns the time from start to drained.
pub fn drain_timed(path: &Path, relay: outboxd::Relay, n: usize) -> Duration {
    let check = rusqlite::Connection::open(path).unwrap();
    let start = std::time::Instant::now();
    let handle = relay.start().unwrap();
    let pending = || -> bool {
        check
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM event_outbox WHERE status = 'pending')",
                [],
                |r| r.get(0),
            )
            .unwrap()
    };
    while pending() {
        std::thread::sleep(Duration::from_millis(2));
    }
    let took = start.elapsed();
    handle.shutdown(Duration::from_secs(10)).unwrap();
    assert_all_delivered(&check, n);
    took
}

/// Checks that the database `check` reads holds `n` delivered events.
pub fn assert_all_delivered(check: &rusqlite::Connection, n: usize) {
    let delivered: i64 = check
        .query_row(
            "SELECT count(*) FROM event_outbox WHERE status = 'delivered'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(delivered as usize, n, "every event delivered, none dead");
}
