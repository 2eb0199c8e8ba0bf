//! `doctor`'s checks of the file itself: integrity, schema version,
//! journal mode, WAL size and the synchronous reminder.

use std::path::Path;

use outboxd::connection::ReadMode;
use outboxd::integrity::{self, Depth};
use outboxd::schema::LATEST_VERSION;
use rusqlite::Connection;

use crate::cmd::doctor::finding::{Finding, Severity};

/// Above this the WAL file is reported: a reader holding a snapshot keeps
/// checkpoints from resetting it. The same bound outboxd's connections set
/// as `journal_size_limit`.
const WAL_WARN_BYTES: u64 = outboxd::connection::DEFAULT_JOURNAL_SIZE_LIMIT as u64;

pub(super) fn integrity(conn: &Connection, quick: bool, db: &Path) -> Finding {
    const CHECK: &str = "integrity";
    let depth = if quick { Depth::Quick } else { Depth::Full };
    let damaged = |finding: String| {
        Finding::new(CHECK, Severity::Error, finding).action(integrity::advice(db))
    };
    match integrity::check(conn, depth) {
        Ok(found) if found.is_ok() => Finding::ok(
            CHECK,
            format!("no damage found (PRAGMA {})", depth.pragma()),
        ),
        Ok(found) => damaged(found.finding()),
        Err(e) => damaged(format!(
            "the database file is damaged (PRAGMA {}): {e}",
            depth.pragma()
        )),
    }
}

pub(super) fn schema(conn: &Connection) -> Finding {
    const CHECK: &str = "schema";
    match outboxd::schema::version(conn) {
        Err(e) => Finding::failed(CHECK, "read the schema version", e),
        Ok(None | Some(0)) => Finding::new(CHECK, Severity::Error, "no outboxd schema")
            .action("run `outboxd migrate` to create outboxd's tables"),
        Ok(Some(v)) if v < LATEST_VERSION => Finding::new(
            CHECK,
            Severity::Error,
            format!("schema v{v} is older than this binary's v{LATEST_VERSION}"),
        )
        .action("run `outboxd migrate` (with this binary) before starting the relay"),
        Ok(Some(v)) if v > LATEST_VERSION => Finding::new(
            CHECK,
            Severity::Error,
            format!("schema v{v} is newer than this binary's v{LATEST_VERSION}"),
        )
        .action("use the outboxd release that migrated this database, or a newer one"),
        Ok(Some(v)) => Finding::ok(CHECK, format!("schema v{v}, as this binary expects")),
    }
}

pub(super) fn journal_mode(conn: &Connection, mode: ReadMode) -> Finding {
    const CHECK: &str = "journal-mode";
    let found = match mode {
        ReadMode::Shared => conn.query_row("PRAGMA journal_mode", [], |r| r.get::<_, String>(0)),
        // An immutable connection reports "delete" whatever the file is:
        // the file header says (its read and write versions are 2 in WAL).
        ReadMode::Immutable => header_journal_mode(conn),
    };
    match found {
        Err(e) => Finding::failed(CHECK, "read the journal mode", e),
        Ok(mode) if mode.eq_ignore_ascii_case("wal") => Finding::ok(CHECK, "WAL"),
        Ok(mode) => Finding::new(
            CHECK,
            Severity::Error,
            format!(
                "journal mode is {mode}; outboxd needs WAL so the relay and the application \
                 do not block each other"
            ),
        )
        .action(
            "run `outboxd migrate` (it switches the file to WAL); if the mode stays, the file \
             system does not support WAL (a network share?), so move the database to a local \
             disk; make sure the application does not set another journal_mode",
        ),
    }
}

pub(super) fn wal_size(db: &Path) -> Finding {
    const CHECK: &str = "wal-size";
    let mut wal = db.as_os_str().to_owned();
    wal.push("-wal");
    match std::fs::metadata(&wal) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Finding::ok(
            CHECK,
            "no WAL file (nothing written since the last checkpoint)",
        ),
        Err(e) => Finding::failed(CHECK, "read the WAL file's size", e),
        Ok(m) if m.len() > WAL_WARN_BYTES => Finding::new(
            CHECK,
            Severity::Warning,
            format!(
                "the WAL file is {} MiB, above {} MiB: checkpoints cannot reset it; usually \
                 a reader is holding a snapshot (a long read transaction)",
                m.len() >> 20,
                WAL_WARN_BYTES >> 20
            ),
        )
        .action(format!(
            "find and end the long-running reader, then run \
             `sqlite3 {} 'PRAGMA wal_checkpoint(TRUNCATE)'`",
            db.display()
        )),
        Ok(m) => Finding::ok(CHECK, format!("the WAL file is {} KiB", m.len() >> 10)),
    }
}

/// "wal" when the database file's header says WAL (bytes 18 and 19, the
/// file format's write and read versions, are 2), else "delete".
///
/// The header is read through the connection's own file handle
/// (SQLITE_FCNTL_FILE_POINTER), never through a descriptor opened beside
/// it: closing that would release every POSIX lock this process holds on
/// the file (sqlite.org/howtocorrupt.html, section 2.2).
fn header_journal_mode(conn: &Connection) -> rusqlite::Result<String> {
    use rusqlite::ffi;
    let failed = |rc| rusqlite::Error::SqliteFailure(ffi::Error::new(rc), None);
    let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
    let mut header = [0u8; 20];
    // SAFETY: the handle is valid while `conn` lives and is used on this
    // thread only; FILE_POINTER writes one pointer to the main database's
    // open file, which stays open as long as the connection, and its
    // xRead reads at most `header.len()` bytes into `header`.
    let rc = unsafe {
        let rc = ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_FILE_POINTER,
            (&mut file as *mut *mut ffi::sqlite3_file).cast(),
        );
        if rc != ffi::SQLITE_OK {
            rc
        } else {
            match file
                .as_ref()
                .and_then(|f| f.pMethods.as_ref())
                .and_then(|m| m.xRead)
            {
                Some(read) => read(file, header.as_mut_ptr().cast(), header.len() as i32, 0),
                None => ffi::SQLITE_CANTOPEN,
            }
        }
    };
    match rc {
        ffi::SQLITE_OK => Ok(if header[18] == 2 && header[19] == 2 {
            "wal"
        } else {
            "delete"
        }
        .to_string()),
        // A file shorter than its header is not one SQLite would open.
        rc => Err(failed(rc)),
    }
}

/// `synchronous` belongs to each connection, not to the file, so doctor
/// cannot read the application's; it reminds instead.
pub(super) fn synchronous() -> Finding {
    Finding::new(
        "synchronous",
        Severity::Note,
        "synchronous is set per connection, so it cannot be read from the file: outboxd's \
         connections use FULL; in WAL mode NORMAL can lose commits already acknowledged on \
         power loss",
    )
    .action(
        "on the application's connection that enqueues, run `PRAGMA synchronous = FULL` \
         (or call outboxd::connection::configure)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_wal_file_is_a_warning_that_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("app.db");
        assert_eq!(wal_size(&db).severity, Severity::Ok, "no WAL file");
        let wal = std::fs::File::create(dir.path().join("app.db-wal")).unwrap();
        wal.set_len(WAL_WARN_BYTES).unwrap(); // sparse: costs no disk
        assert_eq!(wal_size(&db).severity, Severity::Ok, "at the bound");
        wal.set_len(WAL_WARN_BYTES + (1 << 20)).unwrap();
        let f = wal_size(&db);
        assert_eq!(f.severity, Severity::Warning);
        assert!(f.message.contains("65 MiB"), "{}", f.message);
        assert!(
            f.message.contains("a reader is holding a snapshot"),
            "{}",
            f.message
        );
        let action = f.action.unwrap();
        assert!(action.contains("wal_checkpoint(TRUNCATE)"), "{action}");
        assert!(action.contains("app.db"), "{action}");
    }

    /// True when this process holds a POSIX lock on `path` (/proc/locks).
    fn this_process_locks(path: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        let inode = std::fs::metadata(path).unwrap().ino().to_string();
        let pid = std::process::id().to_string();
        std::fs::read_to_string("/proc/locks")
            .unwrap()
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .any(|f| {
                f.get(1) == Some(&"POSIX")
                    && f.get(4) == Some(&pid.as_str())
                    && f.get(5).and_then(|d| d.rsplit(':').next()) == Some(inode.as_str())
            })
    }

    #[test]
    fn the_header_is_read_without_releasing_this_processs_locks() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("app.db");
        // A WAL connection keeps a shared lock on the file while open.
        let writer = outboxd::connection::open(&db).unwrap();
        writer.execute_batch("CREATE TABLE t (x)").unwrap();
        assert!(this_process_locks(&db), "the precondition: a lock is held");
        let uri = format!("file:{}?immutable=1", db.display());
        let flags =
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_URI;
        let immutable = Connection::open_with_flags(&uri, flags).unwrap();
        assert_eq!(header_journal_mode(&immutable).unwrap(), "wal");
        assert!(
            this_process_locks(&db),
            "reading the header released the writer's lock"
        );
        drop((immutable, writer));

        let rollback = dir.path().join("rollback.db");
        Connection::open(&rollback)
            .unwrap()
            .execute_batch("CREATE TABLE t (x)")
            .unwrap();
        let uri = format!("file:{}?immutable=1", rollback.display());
        let immutable = Connection::open_with_flags(&uri, flags).unwrap();
        assert_eq!(header_journal_mode(&immutable).unwrap(), "delete");
    }
}
