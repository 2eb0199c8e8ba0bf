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

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::Result;
use outboxd::connection::ReadMode;
use outboxd::schema::MigrationReport;
use rusqlite::Connection;

use crate::exit::Failure;

/// Which file a path names: its device and inode. Read with stat(2) on the
/// path, never by opening the file (closing any descriptor of a database
/// would drop the locks SQLite holds on it in this process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileIdentity {
    dev: u64,
    ino: u64,
}

impl FileIdentity {
    /// The identity of the file `path` names now.
    pub(crate) fn of(path: &Path) -> std::io::Result<FileIdentity> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)?;
        Ok(FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
        })
    }

    /// Why `path` no longer names the file that had this identity (it was
    /// deleted, or another file was moved into its place), or None while it
    /// still does. Another failure to look (a permission taken away) is
    /// none: the file may well be there.
    pub(crate) fn gone_from(&self, path: &Path) -> Option<&'static str> {
        match FileIdentity::of(path) {
            Ok(now) if now == *self => None,
            Ok(_) => Some("was replaced by another file"),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("was deleted"),
            Err(_) => None,
        }
    }
}

/// The database this command opened (one per process), for [`no_space`].
static OPENED: OnceLock<PathBuf> = OnceLock::new();

/// The free space under which a failed write is put down to a full disk:
/// SQLite grows its files by tens of KiB at a time (the WAL index by
/// 32 KiB), so a little free space is as full as none.
const NEARLY_FULL: u64 = 1 << 20;

/// When `err` is SQLite failing to write (an I/O error, or "database or
/// disk is full") and the file system holding this command's database has
/// less than [`NEARLY_FULL`] free: what to say about it. SQLite's own text
/// ("disk I/O error") does not name the cause, and its OS error number is
/// gone with the connection; the file system says it instead.
pub(crate) fn no_space(err: &anyhow::Error) -> Option<String> {
    use rusqlite::ErrorCode as C;
    let write_failed = err.chain().any(|c| {
        c.downcast_ref::<rusqlite::Error>().is_some_and(|e| {
            matches!(
                e.sqlite_error_code(),
                Some(C::DiskFull | C::SystemIoFailure)
            )
        })
    });
    let db = OPENED.get()?;
    if !write_failed {
        return None;
    }
    let dir = match db.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let fs = rustix::fs::statvfs(dir).ok()?;
    // Root may use the blocks kept back for it; others may not.
    let blocks = if rustix::process::geteuid().is_root() {
        fs.f_bfree
    } else {
        fs.f_bavail
    };
    let free = blocks.saturating_mul(fs.f_frsize);
    (free < NEARLY_FULL).then(|| {
        format!(
            "no space left on device: the file system holding {} has {} KiB free; free \
             some space, then run the command again",
            db.display(),
            free >> 10
        )
    })
}

/// Creates or upgrades the schema (the file too, if missing).
pub(crate) fn migrate(path: &Path) -> Result<MigrationReport> {
    let _ = OPENED.set(path.to_path_buf());
    if let Some(dir) = missing_directory(path) {
        return Err(Failure::database(format!(
            "cannot create database {}: the directory {} does not exist; create it first \
             (outboxd creates the file, not its directory)",
            path.display(),
            dir.display()
        ))
        .into());
    }
    let mut conn = open_writable(path)?;
    Ok(outboxd::schema::migrate(&mut conn)?)
}

/// An existing, migrated database, for writing.
pub(crate) fn for_writing(path: &Path) -> Result<Connection> {
    for_reading(path)?;
    open_writable(path)
}

/// An existing, migrated database, read-only.
pub(crate) fn for_reading(path: &Path) -> Result<Connection> {
    let (conn, _) = for_inspection(path)?;
    outboxd::schema::ensure_current(&conn)?;
    Ok(conn)
}

/// An existing database, read-only, whatever its schema; and how it is read.
pub(crate) fn for_inspection(path: &Path) -> Result<(Connection, ReadMode)> {
    require_existing(path)?;
    Ok(outboxd::connection::open_read_only_with_mode(path)?)
}

/// A note for the operator when the database is read as an immutable
/// file (`ReadMode::Immutable`); None otherwise.
pub(crate) fn read_mode_note(mode: ReadMode) -> Option<&'static str> {
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
///
/// The check asks the kernel (access(2)) and never opens the file: this
/// process may hold SQLite connections to it (`run` serves the console
/// beside its relay), and closing any descriptor of a file releases every
/// POSIX lock the process holds on it, SQLite's included; a foreign
/// connection would then checkpoint and delete the WAL the relay is
/// writing (sqlite.org/howtocorrupt.html, section 2.2).
fn open_writable(path: &Path) -> Result<Connection> {
    if path.is_file() {
        if let Err(e) = rustix::fs::access(path, rustix::fs::Access::WRITE_OK) {
            if e == rustix::io::Errno::ACCESS || e == rustix::io::Errno::ROFS {
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

/// The database's directory, when it does not exist (then neither the file
/// nor `migrate` can be of use there).
fn missing_directory(path: &Path) -> Option<&Path> {
    path.parent()
        .filter(|dir| !dir.as_os_str().is_empty() && !dir.exists())
}

/// Refuses a database file that does not exist, for commands that must not
/// create one.
fn require_existing(path: &Path) -> Result<()> {
    let _ = OPENED.set(path.to_path_buf());
    if let Some(dir) = missing_directory(path) {
        return Err(Failure::database(format!(
            "cannot open database {}: the directory {} does not exist; check the path",
            path.display(),
            dir.display()
        ))
        .into());
    }
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
