//! Whether the database file is damaged, in SQLite's own words, and what
//! to do about it. `outboxd doctor` reports it; the relay runs the quick
//! check when SQLite reports damage in the middle of its work
//! (SQLITE_CORRUPT or SQLITE_NOTADB), logs the same finding, and stops.
//!
//! ```
//! # fn main() -> outboxd::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! # let conn = outboxd::connection::open(dir.path().join("app.db"))?;
//! use outboxd::integrity::{check, Depth};
//! let found = check(&conn, Depth::Quick)?;
//! assert!(found.is_ok(), "{}", found.summary());
//! # Ok(()) }
//! ```

use std::path::Path;

use rusqlite::Connection;

use crate::error::{Error, Result};

// Whether a SQLite error says the file is damaged: it lives with the error
// type, which asks it too, and keeps its path here.
pub use crate::error::is_damage;

/// How thoroughly to look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// `PRAGMA quick_check`: every page, but not the indexes against
    /// their tables. Faster on a large file.
    Quick,
    /// `PRAGMA integrity_check`: everything SQLite can check.
    Full,
}

impl Depth {
    /// The pragma's name.
    pub fn pragma(self) -> &'static str {
        match self {
            Depth::Quick => "quick_check",
            Depth::Full => "integrity_check",
        }
    }
}

/// What SQLite's check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Integrity {
    /// The check that ran.
    pub depth: Depth,
    /// SQLite's messages, at most [`MAX_MESSAGES`]; empty when the file is
    /// sound.
    pub problems: Vec<String>,
}

/// The most messages a check collects: enough to judge the damage, short
/// enough to read.
pub const MAX_MESSAGES: usize = 20;

impl Integrity {
    /// True when SQLite found nothing wrong.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    /// The first few messages on one line (a message may span lines, and
    /// "*** in database main ***" is only a heading), or "ok".
    pub fn summary(&self) -> String {
        const SHOWN: usize = 5;
        let lines: Vec<&str> = self
            .problems
            .iter()
            .flat_map(|r| r.lines())
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("***"))
            .collect();
        if lines.is_empty() {
            return "ok".into();
        }
        let mut text = lines
            .iter()
            .take(SHOWN)
            .copied()
            .collect::<Vec<_>>()
            .join("; ");
        if lines.len() > SHOWN {
            text.push_str(&format!("; and {} more", lines.len() - SHOWN));
        }
        text
    }

    /// The finding as `outboxd doctor` states it.
    pub fn finding(&self) -> String {
        format!(
            "the database file is damaged (PRAGMA {}): {}",
            self.depth.pragma(),
            self.summary()
        )
    }
}

/// Runs SQLite's check. A file too damaged for the check to run at all is
/// reported as that error ([`Error::Database`], whose source
/// [`is_damage`] recognises).
pub fn check(conn: &Connection, depth: Depth) -> Result<Integrity> {
    let op = "check the database file's integrity";
    let rows = conn
        .prepare(&format!("PRAGMA {}({MAX_MESSAGES})", depth.pragma()))
        .and_then(|mut s| {
            s.query_map([], |r| r.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(Error::db(op))?;
    let sound = rows.len() == 1 && rows[0] == "ok";
    Ok(Integrity {
        depth,
        problems: if sound { Vec::new() } else { rows },
    })
}

/// What to do about a damaged file (`outboxd doctor`'s advice).
pub fn advice(db: &Path) -> String {
    format!(
        "stop the application and outboxd, keep a copy of the file, then restore the latest \
         backup, or salvage what is readable with `sqlite3 {} .recover | sqlite3 recovered.db`",
        db.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_fit_on_one_line() {
        let problems: Vec<String> =
            std::iter::once("*** in database main ***\nTree 3 page 3: bad".into())
                .chain((0..9).map(|i| format!("Page {i}: never used")))
                .collect();
        let found = Integrity {
            depth: Depth::Full,
            problems,
        };
        assert_eq!(
            found.summary(),
            "Tree 3 page 3: bad; Page 0: never used; Page 1: never used; \
             Page 2: never used; Page 3: never used; and 5 more"
        );
        assert!(found
            .finding()
            .starts_with("the database file is damaged (PRAGMA integrity_check): Tree 3"));
    }
}
