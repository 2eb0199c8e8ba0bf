//! outboxd's tables in the host's database: embedded migrations, applied in
//! order, forward only, and recorded in outboxd's own `outboxd_schema` table
//! (never `PRAGMA user_version`, which belongs to the host).
//!
//! ```
//! # fn main() -> outboxd::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! let mut conn = outboxd::connection::open(dir.path().join("app.db"))?;
//! let report = outboxd::schema::migrate(&mut conn)?;
//! assert_eq!(report.to, outboxd::schema::LATEST_VERSION);
//! outboxd::schema::ensure_current(&conn)?;
//! # Ok(()) }
//! ```

use rusqlite::{Connection, OptionalExtension, TransactionBehavior};

use crate::clock::Timestamp;
use crate::error::{Error, Result};

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Its version, from the file name's number.
    pub version: u32,
    /// Its name, from the file name.
    pub name: &'static str,
    /// The SQL it runs.
    pub sql: &'static str,
}

/// Every migration, in order. Versions are 1, 2, 3… with no gaps (a test
/// checks it against the files in `migrations/`).
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("../../migrations/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "intent_leases",
        sql: include_str!("../../migrations/0002_intent_leases.sql"),
    },
    Migration {
        version: 3,
        name: "capture",
        sql: include_str!("../../migrations/0003_capture.sql"),
    },
    Migration {
        version: 4,
        name: "replay_scope_and_units",
        sql: include_str!("../../migrations/0004_replay_scope_and_units.sql"),
    },
    Migration {
        version: 5,
        name: "time_bound_as_check",
        sql: include_str!("../../migrations/0005_time_bound_as_check.sql"),
    },
    Migration {
        version: 6,
        name: "event_id_nocase",
        sql: include_str!("../../migrations/0006_event_id_nocase.sql"),
    },
    Migration {
        version: 7,
        name: "checks_without_functions",
        sql: include_str!("../../migrations/0007_checks_without_functions.sql"),
    },
    Migration {
        version: 8,
        name: "capture_names_gaps_snapshots",
        sql: include_str!("../../migrations/0008_capture_names_gaps_snapshots.sql"),
    },
    Migration {
        version: 9,
        name: "trace_context",
        sql: include_str!("../../migrations/0009_trace_context.sql"),
    },
];

/// A fresh database at the latest schema in a temporary directory, for
/// unit tests (the directory goes when the first value is dropped).
#[cfg(test)]
pub(crate) fn test_db() -> (tempfile::TempDir, rusqlite::Connection) {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = crate::connection::open(dir.path().join("test.db")).unwrap();
    migrate(&mut conn).unwrap();
    (dir, conn)
}

/// The newest schema version this build knows.
pub const LATEST_VERSION: u32 = MIGRATIONS[MIGRATIONS.len() - 1].version;

/// The table where outboxd records its own schema version.
pub const VERSION_TABLE: &str = "outboxd_schema";

/// What [`migrate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// The version found before migrating (0: no outboxd tables).
    pub from: u32,
    /// The version after.
    pub to: u32,
}

impl MigrationReport {
    /// True when nothing needed doing.
    pub fn was_current(&self) -> bool {
        self.from == self.to
    }
}

/// Brings the database to [`LATEST_VERSION`]. Each migration runs in its own
/// `BEGIN IMMEDIATE` transaction that re-reads the version first, so running
/// it twice, or from two processes at once, applies each migration once. A
/// database whose schema is newer than this build is refused before anything
/// is written.
pub fn migrate(conn: &mut Connection) -> Result<MigrationReport> {
    migrate_up_to(conn, LATEST_VERSION)
}

/// [`migrate`], stopping at `target` (tests build older schemas with it).
pub(crate) fn migrate_up_to(conn: &mut Connection, target: u32) -> Result<MigrationReport> {
    let from = version(conn)?.unwrap_or(0);
    if from > LATEST_VERSION {
        return Err(Error::SchemaTooNew {
            found: from,
            supported: LATEST_VERSION,
        });
    }
    loop {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(Error::db("start a migration"))?;
        tx.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (
                 version    INTEGER PRIMARY KEY,
                 name       TEXT    NOT NULL,
                 applied_at INTEGER NOT NULL
             )"
        ))
        .map_err(Error::db("create the schema version table"))?;
        // Re-read under the write lock: another process may have migrated.
        let current = version(&tx)?.unwrap_or(0);
        if current > LATEST_VERSION {
            return Err(Error::SchemaTooNew {
                found: current,
                supported: LATEST_VERSION,
            });
        }
        let next = MIGRATIONS
            .iter()
            .find(|m| m.version == current + 1 && m.version <= target);
        let Some(next) = next else {
            tx.commit().map_err(Error::db("finish migrating"))?;
            return Ok(MigrationReport { from, to: current });
        };
        tx.execute_batch(next.sql)
            .map_err(Error::db("apply a schema migration"))?;
        tx.execute(
            &format!("INSERT INTO {VERSION_TABLE} (version, name, applied_at) VALUES (?1, ?2, ?3)"),
            rusqlite::params![next.version, next.name, Timestamp::now().as_millis()],
        )
        .map_err(Error::db("record a schema migration"))?;
        tx.commit()
            .map_err(Error::db("commit a schema migration"))?;
        tracing::info!(
            version = next.version,
            name = next.name,
            "applied migration"
        );
    }
}

/// The outboxd schema version recorded in the database, or None when it has
/// no outboxd tables. Reads only.
pub fn version(conn: &Connection) -> Result<Option<u32>> {
    let exists: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)",
            [VERSION_TABLE],
            |r| r.get(0),
        )
        .map_err(Error::db("read the schema version"))?;
    if !exists {
        return Ok(None);
    }
    conn.query_row(
        &format!("SELECT max(version) FROM {VERSION_TABLE}"),
        [],
        |r| r.get::<_, Option<u32>>(0),
    )
    .optional()
    .map(Option::flatten)
    .map_err(Error::db("read the schema version"))
}

/// Fails unless the database is at exactly [`LATEST_VERSION`]: the check the
/// relay and every operator command make before touching outboxd's tables.
pub fn ensure_current(conn: &Connection) -> Result<()> {
    match version(conn)? {
        None | Some(0) => Err(Error::NotMigrated),
        Some(v) if v > LATEST_VERSION => Err(Error::SchemaTooNew {
            found: v,
            supported: LATEST_VERSION,
        }),
        Some(v) if v < LATEST_VERSION => Err(Error::SchemaOutdated {
            found: v,
            expected: LATEST_VERSION,
        }),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests;
