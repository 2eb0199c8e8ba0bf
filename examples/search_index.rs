//! ADR-0009's search index, kept exactly once: an SQLite FTS5 full-text
//! index of articles, maintained by a transactional consumer from the
//! article events the application commits with its rows; rebuilt by a
//! replay of that consumer (ADR-0009's reindex); and checked against the
//! article rows by a verification that lists every difference (ADR-0009's
//! "search results confirmed against the database").
//!
//! ```text
//! cargo run --example search_index
//! ```
//!
//! `cargo test` runs it too (the test at the end), so it cannot rot.
//! docs/exactly-once.md walks through it.

use std::error::Error;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use outboxd::replay::{replay, ReplayFilter};
use outboxd::{enqueue, Delivery, Event, Outcome, Relay, Timestamp};
use rusqlite::{params, Connection, Transaction};
use serde::{Deserialize, Serialize};

/// The consumer's name: the key of its progress in `delivered_events`.
const INDEXER: &str = "search-index";

/// The application's table and the index derived from it.
const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS articles (
        id       INTEGER PRIMARY KEY,
        title    TEXT NOT NULL,
        body     TEXT NOT NULL,
        revision INTEGER NOT NULL
    );
    -- rowid = the article's id; revision is stored, not indexed.
    CREATE VIRTUAL TABLE IF NOT EXISTS article_search
        USING fts5(title, body, revision UNINDEXED);";

// ---------------------------------------------------------------------------
// The application: each write commits its row and its event together.

/// What article.created.v1 and article.updated.v1 carry.
#[derive(Debug, Serialize, Deserialize)]
struct ArticleChanged {
    id: i64,
    title: String,
    body: String,
    revision: i64,
}

/// What article.deleted.v1 carries.
#[derive(Debug, Serialize, Deserialize)]
struct ArticleDeleted {
    id: i64,
}

/// Every event of one article shares its ordering key, so the indexer sees
/// them in commit order (an update never overtakes its create).
fn article_event(event_type: &str, id: i64, payload: &impl Serialize) -> outboxd::Result<Event> {
    Ok(Event::new(event_type, payload)?.ordering_key(format!("article:{id}")))
}

fn create_article(conn: &mut Connection, title: &str, body: &str) -> Result<i64, Box<dyn Error>> {
    let tx = conn.transaction()?;
    tx.execute(
        "INSERT INTO articles (title, body, revision) VALUES (?1, ?2, 1)",
        params![title, body],
    )?;
    let id = tx.last_insert_rowid();
    let changed = ArticleChanged {
        id,
        title: title.into(),
        body: body.into(),
        revision: 1,
    };
    enqueue(&tx, &article_event("article.created.v1", id, &changed)?)?;
    tx.commit()?;
    Ok(id)
}

fn update_article(
    conn: &mut Connection,
    id: i64,
    title: &str,
    body: &str,
) -> Result<(), Box<dyn Error>> {
    let tx = conn.transaction()?;
    let revision: i64 = tx.query_row(
        "UPDATE articles SET title = ?2, body = ?3, revision = revision + 1 WHERE id = ?1
         RETURNING revision",
        params![id, title, body],
        |r| r.get(0),
    )?;
    let changed = ArticleChanged {
        id,
        title: title.into(),
        body: body.into(),
        revision,
    };
    enqueue(&tx, &article_event("article.updated.v1", id, &changed)?)?;
    tx.commit()?;
    Ok(())
}

fn delete_article(conn: &mut Connection, id: i64) -> Result<(), Box<dyn Error>> {
    let tx = conn.transaction()?;
    tx.execute("DELETE FROM articles WHERE id = ?1", [id])?;
    enqueue(
        &tx,
        &article_event("article.deleted.v1", id, &ArticleDeleted { id })?,
    )?;
    tx.commit()?;
    Ok(())
}

// ---------------------------------------------------------------------------
// The indexer: a transactional consumer. Its writes to article_search
// commit with its progress row, or not at all.

fn index(tx: &Transaction<'_>, d: &Delivery) -> Outcome {
    let applied = match d.envelope.event_type.as_str() {
        "article.created.v1" | "article.updated.v1" => {
            match d.envelope.payload_as::<ArticleChanged>() {
                Ok(a) => tx
                    .execute("DELETE FROM article_search WHERE rowid = ?1", [a.id])
                    .and_then(|_| {
                        tx.execute(
                            "INSERT INTO article_search (rowid, title, body, revision)
                         VALUES (?1, ?2, ?3, ?4)",
                            params![a.id, a.title, a.body, a.revision],
                        )
                    }),
                Err(e) => return Outcome::poison(format!("not an article: {e}")),
            }
        }
        "article.deleted.v1" => match d.envelope.payload_as::<ArticleDeleted>() {
            Ok(a) => tx.execute("DELETE FROM article_search WHERE rowid = ?1", [a.id]),
            Err(e) => return Outcome::poison(format!("not an article id: {e}")),
        },
        other => return Outcome::poison(format!("the indexer does not know {other}")),
    };
    match applied {
        Ok(_) => Outcome::Delivered,
        // The transaction is rolled back; the event is tried again.
        Err(e) => Outcome::retry(format!("cannot index: {e}")),
    }
}

// ---------------------------------------------------------------------------
// Search, confirmed against the rows; verification; rebuild.

/// Articles matching an FTS5 query, best first. Each hit is joined with
/// its row, so an index that lags (a pending event, a rebuild under way)
/// can return fewer hits, never an article that is gone.
fn search(conn: &Connection, query: &str) -> rusqlite::Result<Vec<(i64, String)>> {
    let mut stmt = conn.prepare(
        "SELECT a.id, a.title FROM article_search s JOIN articles a ON a.id = s.rowid
          WHERE article_search MATCH ?1 ORDER BY s.rank",
    )?;
    let hits = stmt.query_map([query], |r| Ok((r.get(0)?, r.get(1)?)))?;
    hits.collect()
}

/// One way the index disagrees with the article rows.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Difference {
    /// The article exists; the index has no entry for it.
    Missing { id: i64 },
    /// The index has an entry for an article that does not exist.
    Orphan { id: i64 },
    /// The entry's title, body or revision is not the article's.
    Stale {
        id: i64,
        indexed_revision: i64,
        revision: i64,
    },
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Difference::Missing { id } => write!(f, "article {id}: not in the index"),
            Difference::Orphan { id } => write!(f, "article {id}: in the index, but deleted"),
            Difference::Stale {
                id,
                indexed_revision,
                revision,
            } => write!(
                f,
                "article {id}: the index holds revision {indexed_revision}'s text, the row is revision {revision}"
            ),
        }
    }
}

/// Compares the whole index with the article rows and lists every
/// difference, by article id. Run it in one read transaction (a snapshot)
/// while the relay is idle, or expect the differences of events still in
/// flight.
fn verify(conn: &Connection) -> rusqlite::Result<Vec<Difference>> {
    let ids = |sql: &str| -> rusqlite::Result<Vec<i64>> {
        let mut stmt = conn.prepare(sql)?;
        let ids = stmt.query_map([], |r| r.get(0))?;
        ids.collect()
    };
    let mut out = Vec::new();
    for id in ids("SELECT a.id FROM articles a
                    WHERE NOT EXISTS (SELECT 1 FROM article_search s WHERE s.rowid = a.id)")?
    {
        out.push(Difference::Missing { id });
    }
    for id in ids("SELECT s.rowid FROM article_search s
                    WHERE NOT EXISTS (SELECT 1 FROM articles a WHERE a.id = s.rowid)")?
    {
        out.push(Difference::Orphan { id });
    }
    let mut stale = conn.prepare(
        "SELECT a.id, s.revision, a.revision FROM articles a JOIN article_search s ON s.rowid = a.id
          WHERE s.title IS NOT a.title OR s.body IS NOT a.body OR s.revision IS NOT a.revision",
    )?;
    for row in stale.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))? {
        let (id, indexed_revision, revision) = row?;
        out.push(Difference::Stale {
            id,
            indexed_revision,
            revision,
        });
    }
    out.sort_by_key(|d| match d {
        Difference::Missing { id } | Difference::Orphan { id } | Difference::Stale { id, .. } => {
            *id
        }
    });
    Ok(out)
}

/// ADR-0009's reindex: empty the index, then replay every event delivered
/// to the indexer. The relay delivers them again, in commit order per
/// article, and the index is rebuilt from the events. Returns how many
/// events were replayed. (Events purged by the TTL purge cannot be
/// replayed: see docs/exactly-once.md for a rebuild that does not need
/// them.)
fn rebuild(conn: &mut Connection) -> Result<u64, Box<dyn Error>> {
    conn.execute("DELETE FROM article_search", [])?;
    Ok(replay(conn, &ReplayFilter::new(INDEXER), Timestamp::now())?)
}

/// Waits until the relay has nothing left to deliver.
fn drained(conn: &Connection) -> Result<(), Box<dyn Error>> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = outboxd::status::status(conn, Timestamp::now())?;
        if s.counts.pending_due + s.counts.pending_delayed + s.counts.leased == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("the relay did not drain the outbox within 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

// ---------------------------------------------------------------------------
// The walk-through.

/// What the walk-through found at each step.
#[derive(Debug)]
struct Report {
    articles: i64,
    differences_after_delivery: Vec<Difference>,
    differences_after_damage: Vec<Difference>,
    replayed: u64,
    differences_after_rebuild: Vec<Difference>,
    hits: Vec<(i64, String)>,
    dead: u64,
}

fn run(db: &Path, out: &mut impl Write) -> Result<Report, Box<dyn Error>> {
    let mut conn = outboxd::connection::open(db)?;
    outboxd::schema::migrate(&mut conn)?;
    conn.execute_batch(SCHEMA)?;

    let relay = Relay::builder(db)
        .transactional_consumer(
            INDEXER,
            [
                "article.created.v1",
                "article.updated.v1",
                "article.deleted.v1",
            ],
            index,
        )
        .build()?
        .start()?;

    // The application writes: 30 articles, 10 of them edited, 6 deleted.
    let mut ids = Vec::new();
    for n in 0..30 {
        let topic = ["sqlite", "rust", "outbox"][n % 3];
        ids.push(create_article(
            &mut conn,
            &format!("Notes on {topic}, part {n}"),
            &format!("Part {n} of a series about {topic}."),
        )?);
    }
    for &id in ids.iter().step_by(3) {
        update_article(
            &mut conn,
            id,
            &format!("Revised article {id}"),
            "Now about transactions.",
        )?;
    }
    for &id in ids.iter().skip(1).step_by(5) {
        delete_article(&mut conn, id)?;
    }
    relay.notify();
    drained(&conn)?;
    let articles: i64 = conn.query_row("SELECT count(*) FROM articles", [], |r| r.get(0))?;
    let differences_after_delivery = verify(&conn)?;
    writeln!(
        out,
        "{articles} articles; the index differs from them in {} places",
        differences_after_delivery.len()
    )?;
    let hits = search(&conn, "rust")?;
    writeln!(
        out,
        "search \"rust\": {} hits, first {:?}",
        hits.len(),
        hits.first()
    )?;

    // The index is damaged behind the relay's back (a restore from an
    // older backup, a bug, someone's DELETE): the verification says where.
    conn.execute_batch(&format!(
        "DELETE FROM article_search WHERE rowid IN ({}, {});
         UPDATE article_search SET title = 'old title', revision = 0 WHERE rowid = {};
         INSERT INTO article_search (rowid, title, body, revision) VALUES ({}, 'deleted long ago', '', 1);",
        ids[2], ids[5], ids[8], ids[1]
    ))?;
    let differences_after_damage = verify(&conn)?;
    writeln!(
        out,
        "after damage, {} differences:",
        differences_after_damage.len()
    )?;
    for d in &differences_after_damage {
        writeln!(out, "  {d}")?;
    }

    // ADR-0009's reindex: a replay of the indexer rebuilds it.
    let replayed = rebuild(&mut conn)?;
    relay.notify();
    drained(&conn)?;
    let differences_after_rebuild = verify(&conn)?;
    writeln!(
        out,
        "rebuilt by replaying {replayed} events; the index differs in {} places",
        differences_after_rebuild.len()
    )?;
    let dead = outboxd::status::status(&conn, Timestamp::now())?
        .counts
        .dead;
    relay.shutdown(Duration::from_secs(10))?;
    Ok(Report {
        articles,
        differences_after_delivery,
        differences_after_damage,
        replayed,
        differences_after_rebuild,
        hits,
        dead,
    })
}

impl Report {
    /// True when each step showed what it is for: an exact index after
    /// delivery and after the rebuild, the damage found, nothing dead.
    fn as_expected(&self) -> bool {
        self.articles > 0
            && !self.hits.is_empty()
            && self.differences_after_delivery.is_empty()
            && !self.differences_after_damage.is_empty()
            && self.replayed > 0
            && self.differences_after_rebuild.is_empty()
            && self.dead == 0
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("articles.db");
    let report = run(&db, &mut std::io::stdout())?;
    if !report.as_expected() {
        return Err(format!("the walk-through went wrong: {report:?}").into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_matches_the_articles_after_delivery_and_after_a_rebuild() {
        let dir = tempfile::tempdir().unwrap();
        let mut printed = Vec::new();
        let r = run(&dir.path().join("articles.db"), &mut printed).unwrap();
        let printed = String::from_utf8(printed).unwrap();
        assert!(r.as_expected(), "{r:?}");
        assert_eq!(r.articles, 24, "{printed}");
        assert_eq!(r.differences_after_delivery, vec![], "{printed}");
        assert_eq!(r.dead, 0);
        // "rust" is the topic of articles 2, 5, 8, … 29, none revised;
        // 2 and 17 are deleted, so they are no hit.
        let ids: Vec<i64> = r.hits.iter().map(|(id, _)| *id).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(sorted, [5, 8, 11, 14, 20, 23, 26, 29], "{printed}");
        // The damage is found, each place exactly once, by article id.
        assert_eq!(
            r.differences_after_damage,
            vec![
                Difference::Orphan { id: 2 },
                Difference::Missing { id: 3 },
                Difference::Missing { id: 6 },
                Difference::Stale {
                    id: 9,
                    indexed_revision: 0,
                    revision: 1
                },
            ],
            "{printed}"
        );
        // 30 creates, 10 updates, 6 deletes were delivered; all replayed.
        assert_eq!(r.replayed, 46);
        assert_eq!(r.differences_after_rebuild, vec![], "{printed}");
    }
}
