//! The one place a command opens its database. Each command says what it
//! needs, and gets the checks that go with it, in the order that keeps a
//! database the command refuses exactly as it was:
//!
//! - [`migrate`] (`migrate`, `run`): the file is created if missing; a
//!   newer schema is refused before anything is written (`connection::open`
//!   reads the version before it switches the file to WAL).
//! - [`for_writing`] (commands that change rows): the file must exist and
//!   its schema be current, checked on a read-only connection first, since
//!   opening for writing switches the journal mode to WAL; and it must be
//!   writable.
//! - [`for_reading`] (commands that only read rows) and [`for_inspection`]
//!   (`status`, `doctor`: whatever schema is there): read-only, so they
//!   work on a file, or in a directory, this user may not write (see
//!   `outboxd::connection::ReadMode` for how, and its caveat).

use std::path::Path;

use anyhow::Result;
use outboxd::connection::ReadMode;
use outboxd::schema::MigrationReport;
use rusqlite::Connection;

use crate::exit::Failure;

/// Creates or upgrades the schema (the file too, if missing).
pub fn migrate(path: &Path) -> Result<MigrationReport> {
    let mut conn = open_writable(path)?;
    Ok(outboxd::schema::migrate(&mut conn)?)
}

/// An existing, migrated database, for writing.
pub fn for_writing(path: &Path) -> Result<Connection> {
    for_reading(path)?;
    open_writable(path)
}

/// An existing, migrated database, read-only.
pub fn for_reading(path: &Path) -> Result<Connection> {
    let (conn, _) = for_inspection(path)?;
    outboxd::schema::ensure_current(&conn)?;
    Ok(conn)
}

/// An existing database, read-only, whatever its schema; and how it is read.
pub fn for_inspection(path: &Path) -> Result<(Connection, ReadMode)> {
    require_existing(path)?;
    Ok(outboxd::connection::open_read_only_with_mode(path)?)
}

/// A note for the operator when the database is read as an immutable
/// file (`ReadMode::Immutable`); None otherwise.
pub fn read_mode_note(mode: ReadMode) -> Option<&'static str> {
    match mode {
        ReadMode::Shared => None,
        ReadMode::Immutable => Some(
            "read as an immutable file: this user cannot write the database's directory, \
             where SQLite keeps the WAL index, and no writer has it open; a write during \
             the read can show a mix of old and new, so read again if in doubt",
        ),
    }
}

/// Opens read-write with outboxd's settings, refusing a read-only file up
/// front with a clear message rather than failing on the first write. (As
/// root, permission bits do not stop writes, so a 0444 file is written
/// like any other.)
fn open_writable(path: &Path) -> Result<Connection> {
    if path.is_file() {
        if let Err(e) = std::fs::OpenOptions::new().write(true).open(path) {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                return Err(Failure::database(format!(
                    "cannot open database {}: the file is read-only; this command writes to \
                     it (`outboxd status` works on a read-only file)",
                    path.display()
                ))
                .into());
            }
        }
    }
    Ok(outboxd::connection::open(path)?)
}

/// Refuses a database file that does not exist, for commands that must not
/// create one.
fn require_existing(path: &Path) -> Result<()> {
    if !path.exists() {
        return Err(Failure::database(format!(
            "cannot open database {}: no such file; create it with `outboxd --db {} migrate`",
            path.display(),
            path.display()
        ))
        .into());
    }
    Ok(())
}
