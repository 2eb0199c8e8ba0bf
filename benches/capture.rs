//! Capture overhead: a host transaction writing one row to a captured table,
//! against the same transaction on the same table without capture.
//!
//!   cargo bench --bench capture                       # 2,000 txns a run, 5 runs
//!   OUTBOXD_BENCH_TXNS=50 OUTBOXD_BENCH_RUNS=1 cargo bench --bench capture   # smoke
//!
//! Shapes, each with synchronous=FULL and NORMAL: an insert of a page whose
//! text is ASCII; the same with non-ASCII text (the event view then checks
//! the payload is UTF-8); an update of one captured column. The capture
//! copies four columns, with every operation (so REPLACE handling is on).
//! Runs alternate plain/captured on a fresh database each, and the ratio is
//! taken per pair of runs.
//!
//! Two one-off costs follow: opening a connection and running its first
//! statement (SQLite parses every trigger then), and preparing an insert
//! into the captured table (SQLite compiles the triggers it fires then).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{bench_dir, env_or, header, migrated, Stats};
use outboxd::capture::{CaptureSpec, Columns};
use rusqlite::{params, Connection};

const ASCII_BODY: &str = "A short page body, about three hundred bytes, as a CMS writes \
    when an editor saves a page: some markup, a <a href=\"/link\">link</a>, a list of \
    things and a closing sentence that ends the paragraph here.\nA second line.";
const GERMAN_BODY: &str = "Ein kurzer Seitentext mit Umlauten: Grüße aus Köln, schöne \
    Straßen, Brücken über den Fluss. Ähnlich lang wie der englische Text, rund dreihundert \
    Bytes, wie ein Redaktionssystem sie beim Speichern einer Seite schreibt.\nZweite Zeile.";

#[derive(Clone, Copy, PartialEq)]
enum Shape {
    InsertAscii,
    InsertNonAscii,
    Update,
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::InsertAscii => "insert, ASCII text",
            Shape::InsertNonAscii => "insert, non-ASCII text",
            Shape::Update => "update of one column",
        }
    }
}

fn spec() -> CaptureSpec {
    CaptureSpec::new(
        "pages",
        "page.{op}.v1",
        Columns::List(vec![
            "slug".into(),
            "title".into(),
            "body".into(),
            "status".into(),
        ]),
    )
}

fn setup(path: &Path, sync: &str, captured: bool) -> Connection {
    let mut conn = migrated(path, sync);
    conn.execute_batch(
        "CREATE TABLE pages (id INTEGER PRIMARY KEY, slug TEXT NOT NULL UNIQUE,
             title TEXT NOT NULL, body TEXT NOT NULL, status TEXT NOT NULL, views INTEGER);",
    )
    .unwrap();
    if captured {
        outboxd::capture::apply(&mut conn, &[spec()], outboxd::Timestamp::now()).unwrap();
    }
    conn
}

/// One host transaction writing one row.
#[inline(never)]
fn one_txn(conn: &mut Connection, shape: Shape, seq: i64) {
    let tx = conn.transaction().unwrap();
    match shape {
        Shape::InsertAscii | Shape::InsertNonAscii => {
            let body = if shape == Shape::InsertAscii {
                ASCII_BODY
            } else {
                GERMAN_BODY
            };
            tx.prepare_cached(
                "INSERT INTO pages (slug, title, body, status) VALUES (?1, ?2, ?3, 'draft')",
            )
            .unwrap()
            .execute(params![format!("page-{seq}"), "Hello, world", body])
            .unwrap();
        }
        Shape::Update => {
            tx.prepare_cached("UPDATE pages SET title = ?1 WHERE id = ?2")
                .unwrap()
                .execute(params![format!("Title {seq}"), 1 + seq.rem_euclid(100)])
                .unwrap();
        }
    }
    tx.commit().unwrap();
}

/// Time per transaction over `txns` transactions on a fresh database.
fn run(dir: &Path, captured: bool, shape: Shape, sync: &str, txns: usize) -> Duration {
    let path = dir.join(format!("capture-{}.db", ulid::Ulid::generate()));
    let mut conn = setup(&path, sync, captured);
    // Rows to update (in one transaction), then warm the statement caches
    // and the file.
    {
        let tx = conn.transaction().unwrap();
        for i in 1..=100 {
            tx.execute(
                "INSERT INTO pages (id, slug, title, body, status) VALUES (?1, ?2, 't', ?3, 'draft')",
                params![i, format!("seed-{i}"), ASCII_BODY],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }
    for i in 0..10 {
        one_txn(&mut conn, shape, -1000 - i);
    }
    let start = Instant::now();
    for i in 0..txns {
        one_txn(&mut conn, shape, i as i64);
    }
    let took = start.elapsed() / txns as u32;
    drop(conn);
    common::remove_db(&path);
    took
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Opening a connection and running a first statement (the schema, all
/// triggers included, is parsed then), and preparing an insert into the
/// captured table (the triggers it fires are compiled then): µs each.
fn one_off(dir: &Path, captured: bool, n: usize) -> (f64, f64) {
    let path = dir.join(format!("capture-{}.db", ulid::Ulid::generate()));
    drop(setup(&path, "FULL", captured));
    let start = Instant::now();
    for _ in 0..n {
        let conn = Connection::open(&path).unwrap();
        conn.query_row("SELECT count(*) FROM pages", [], |r| r.get::<_, i64>(0))
            .unwrap();
    }
    let open = micros(start.elapsed()) / n as f64;
    let conn = Connection::open(&path).unwrap();
    let start = Instant::now();
    for i in 0..n {
        // A different text each time: no statement cache helps.
        conn.prepare(&format!(
            "INSERT INTO pages (slug, title, body, status) VALUES ('p{i}', 't', 'b', 'draft')"
        ))
        .unwrap();
    }
    let prepare = micros(start.elapsed()) / n as f64;
    drop(conn);
    common::remove_db(&path);
    (open, prepare)
}

fn main() {
    let txns = env_or("OUTBOXD_BENCH_TXNS", 2000);
    let runs = env_or("OUTBOXD_BENCH_RUNS", 5);
    let dir = bench_dir();
    header(
        "capture",
        dir.path(),
        &format!("{txns} txns of one row, {runs} runs each side"),
    );
    println!("| synchronous | write | plain µs/txn (min–max) | captured µs/txn (min–max) | ratio captured/plain, median of paired runs (min–max) | load |");
    println!("|---|---|---|---|---|---|");
    for sync in ["FULL", "NORMAL"] {
        for shape in [Shape::InsertAscii, Shape::InsertNonAscii, Shape::Update] {
            let load = common::load();
            let (mut plain, mut ours, mut ratios) = (vec![], vec![], vec![]);
            for _ in 0..runs {
                plain.push(micros(run(dir.path(), false, shape, sync, txns)));
                ours.push(micros(run(dir.path(), true, shape, sync, txns)));
                ratios.push(ours[ours.len() - 1] / plain[plain.len() - 1]);
            }
            let (p, o, r) = (Stats::of(plain), Stats::of(ours), Stats::of(ratios));
            println!(
                "| {sync} | {} | {:.1} ({:.1}–{:.1}) | {:.1} ({:.1}–{:.1}) | **{:.2}** ({:.2}–{:.2}) | {load} |",
                shape.name(),
                p.median, p.min, p.max, o.median, o.min, o.max, r.median, r.min, r.max
            );
        }
    }
    let n = (txns / 4).max(10);
    let (mut open, mut prepare) = ((vec![], vec![]), (vec![], vec![]));
    for _ in 0..runs {
        let (o, p) = one_off(dir.path(), false, n);
        open.0.push(o);
        prepare.0.push(p);
        let (o, p) = one_off(dir.path(), true, n);
        open.1.push(o);
        prepare.1.push(p);
    }
    println!();
    println!("| one-off cost | plain µs (median) | captured µs (median) | extra µs |");
    println!("|---|---|---|---|");
    for (what, (plain, ours)) in [
        ("open + first statement", open),
        ("prepare an insert", prepare),
    ] {
        let (p, o) = (Stats::of(plain).median, Stats::of(ours).median);
        println!("| {what} | {p:.0} | {o:.0} | {:.0} |", o - p);
    }
}
