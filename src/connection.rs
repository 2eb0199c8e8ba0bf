//! Opening and configuring SQLite connections the way outboxd needs them.
//!
//! Every connection outboxd opens gets [`configure`]d: WAL (checked, not
//! assumed), a busy timeout, a bounded WAL file, and `synchronous=FULL`.
//! A host that enqueues on its own connection should call [`configure`] on it
//! too: in WAL mode `synchronous=NORMAL` may lose acknowledged commits on
//! power loss (measured here: 440 of 905 simulated power cuts lost some).
//!
//! ```
//! # fn main() -> outboxd::Result<()> {
//! # let dir = tempfile::tempdir().unwrap();
//! let conn = rusqlite::Connection::open(dir.path().join("app.db")).unwrap();
//! outboxd::connection::configure(&conn)?;
//! let sync: i64 = conn.query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap();
//! assert_eq!(sync, 2); // FULL
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use rusqlite::types::Value;
use rusqlite::{Connection, OpenFlags};

use crate::error::{Error, Result};

/// How long a statement waits for another writer before SQLITE_BUSY.
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The size the WAL file is truncated back to after a checkpoint.
pub const DEFAULT_JOURNAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// The page cache, in KiB, of connections that only look at a few rows or
/// scan once ([`small_cache`]): a [`ConnectionManager::read_only`] pool's
/// connections, `outboxd run`'s capture watch. SQLite's default is 2,000
/// KiB per connection, and a connection keeps what it read until it
/// closes: the console's six pooled readers, each scanning the status
/// indexes of a large file, held up to 12 MB that way. Beside a relay the
/// cache buys a reader little anyway: SQLite empties a WAL reader's cache
/// at the start of any read transaction after another connection
/// committed, so it only serves repeat reads within one transaction, where
/// 64 pages hold the b-trees' upper levels.
pub const SMALL_CACHE_KIB: u32 = 256;

/// Opens (creating if needed) a database file read-write, [`configure`]s it
/// and registers `rarray` on it (see [`IdList`]).
/// A directory, a file that is not a database, or a file that cannot be
/// written is refused with an error naming the path.
pub fn open(path: impl AsRef<Path>) -> Result<Connection> {
    let path = path.as_ref();
    check_path(path)?;
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )
    .map_err(|e| open_error(path, e))?;
    // SQLite quietly falls back to read-only for a file it cannot write;
    // outboxd would then fail later, on its first write. Say so now.
    if conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false) {
        return Err(open_error(
            path,
            rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_READONLY),
                None,
            ),
        ));
    }
    // A database from a newer outboxd is refused before anything, even the
    // switch to WAL, writes to it.
    let version = crate::schema::version(&conn).map_err(|e| explain(path, &conn, e))?;
    if let Some(found) = version {
        if found > crate::schema::LATEST_VERSION {
            return Err(Error::SchemaTooNew {
                found,
                supported: crate::schema::LATEST_VERSION,
            });
        }
    }
    configure(&conn).map_err(|e| explain(path, &conn, e))?;
    rusqlite::vtab::array::load_module(&conn).map_err(Error::db("register rarray"))?;
    Ok(conn)
}

/// A list of row ids bound as one parameter, read in SQL as the table
/// `rarray(?)` (rusqlite's `array` module, which [`open`] registers): the
/// relay's writer reads, stamps and finishes a group of rows and writes
/// their ledger entries with one statement per group this way. Per row it
/// costs less than a JSON array through `json_each`, which SQLite parses
/// from text, and much less than one execution of a statement per row
/// (BENCHMARKS.md).
pub(crate) type IdList = Rc<Vec<Value>>;

/// The [`IdList`] of `ids`.
pub(crate) fn id_list(ids: impl IntoIterator<Item = i64>) -> IdList {
    Rc::new(ids.into_iter().map(Value::Integer).collect())
}

/// Opens an existing database for reading only (status, inspection). WAL is
/// not forced: a read-only connection cannot change the journal mode. See
/// [`open_read_only_with_mode`] for a database whose directory this user
/// cannot write.
pub fn open_read_only(path: impl AsRef<Path>) -> Result<Connection> {
    open_read_only_with_mode(path).map(|(conn, _)| conn)
}

/// How a read-only connection sees the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// Like any reader: through the WAL index (the `-shm` file), a
    /// consistent view of every committed transaction, safe beside writers.
    Shared,
    /// As an immutable file (SQLite's `immutable=1`): without locks and
    /// without the WAL. Used only when the WAL index cannot be created (the
    /// directory is not writable by this user) and no `-wal` file exists, so
    /// the database file holds every commit. SQLite then trusts that nothing
    /// writes the file meanwhile: a writer starting during the read can make
    /// it see a mix of old and new pages, or fail with "database disk image
    /// is malformed"; reading again is the remedy.
    Immutable,
}

/// [`open_read_only`], saying how the database is read.
///
/// A reader of a WAL database needs the `-shm` index beside it, and
/// creates it when it is missing. A user who may read the database but not
/// write its directory (an operator looking at a service's database) can
/// therefore read it only while the file exists, that is while a writer
/// has it open (SQLite keeps the file readable for the database's readers).
/// Otherwise, with no `-wal` file either, the database file alone holds
/// every commit, and it is opened as [`ReadMode::Immutable`]. A `-wal` file
/// without its index cannot be read this way: that is an error naming the
/// cause.
pub fn open_read_only_with_mode(path: impl AsRef<Path>) -> Result<(Connection, ReadMode)> {
    let path = path.as_ref();
    check_path(path)?;
    if !path.exists() {
        return Err(Error::Open {
            path: path.to_path_buf(),
            reason: "no such file".into(),
        });
    }
    match open_reader(path, ReadMode::Shared) {
        Ok(conn) => Ok((conn, ReadMode::Shared)),
        Err(e) if cannot_create_wal_index(path, &e) => {
            // Whether this user may read the file is asked of SQLite, never
            // of a descriptor opened beside it: closing that descriptor
            // would release every lock this process holds on the file
            // (another connection's too), and a foreign connection could
            // then checkpoint and delete a WAL still in use
            // (sqlite.org/howtocorrupt.html, section 2.2).
            let conn = open_reader(path, ReadMode::Immutable).map_err(|e| open_error(path, e))?;
            if sidecar(path, "-wal").exists() {
                return Err(Error::Open {
                    path: path.to_path_buf(),
                    reason: format!(
                        "it is a WAL database whose {} file holds commits, and reading them \
                         needs its index {}, which this user cannot create in {}; run as a \
                         user who may write that directory, or while a writer (outboxd run, \
                         the application) has the database open",
                        sidecar(path, "-wal").display(),
                        sidecar(path, "-shm").display(),
                        directory(path).display()
                    ),
                });
            }
            Ok((conn, ReadMode::Immutable))
        }
        Err(e) => Err(open_error(path, e)),
    }
}

/// A read-only connection, checked to read (so "not a database" shows here).
fn open_reader(path: &Path, mode: ReadMode) -> rusqlite::Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = match mode {
        ReadMode::Shared => Connection::open_with_flags(path, flags)?,
        ReadMode::Immutable => {
            Connection::open_with_flags(immutable_uri(path), flags | OpenFlags::SQLITE_OPEN_URI)?
        }
    };
    set_busy_handler(&conn).map_err(|e| match e {
        Error::Database { source, .. } => source,
        _ => rusqlite::Error::InvalidQuery,
    })?;
    conn.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(()))
        .map_err(|e| if storage_full(&conn) { disk_full() } else { e })?;
    Ok(conn)
}

/// True when the OS error behind the connection's last failure is "no
/// space left on device": SQLite reports it as a plain I/O error (such as
/// growing the WAL index), which does not say so.
fn storage_full(conn: &Connection) -> bool {
    // SAFETY: the handle is valid while `conn` lives, and is used on this
    // thread only.
    let errno = unsafe { rusqlite::ffi::sqlite3_system_errno(conn.handle()) };
    errno != 0 && std::io::Error::from_raw_os_error(errno).kind() == std::io::ErrorKind::StorageFull
}

/// SQLite's "database or disk is full", for an I/O error whose cause was
/// a full file system ([`storage_full`]).
fn disk_full() -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
        Some("no space left on device".into()),
    )
}

/// True when `e` may be SQLite failing to create the missing `-shm` WAL
/// index (the directory is not writable); the caller then learns whether
/// the file itself can be read by opening it as immutable.
fn cannot_create_wal_index(path: &Path, e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen)
    ) && !sidecar(path, "-shm").exists()
}

/// `app.db` + `-wal`: a file SQLite keeps beside the database.
fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn directory(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// `file:` URI of `path` with `immutable=1`; the path percent-encoded, so a
/// `?`, `#` or `%` in it is not read as URI syntax.
fn immutable_uri(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut uri = String::from("file:");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/._-~".contains(&b) {
            uri.push(b as char);
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push_str("?immutable=1");
    uri
}

/// Applies outboxd's connection settings: WAL journal (fails with
/// [`Error::NotWal`] if SQLite reports another mode), busy timeout,
/// `journal_size_limit`, and `synchronous=FULL`.
pub fn configure(conn: &Connection) -> Result<()> {
    set_busy_handler(conn)?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(Error::db("set journal_mode=WAL"))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::NotWal { got: mode });
    }
    conn.execute_batch(&format!(
        "PRAGMA synchronous = FULL; PRAGMA journal_size_limit = {DEFAULT_JOURNAL_SIZE_LIMIT};"
    ))
    .map_err(Error::db("apply connection settings"))?;
    Ok(())
}

/// Bounds `conn`'s page cache to [`SMALL_CACHE_KIB`], for a connection that
/// stays open but only looks at a few rows at a time or scans once.
pub fn small_cache(conn: &Connection) -> Result<()> {
    conn.execute_batch(&format!("PRAGMA cache_size = -{SMALL_CACHE_KIB}"))
        .map_err(Error::db("set a small page cache"))
}

/// Waits for a lock up to [`DEFAULT_BUSY_TIMEOUT`], trying again every
/// 0.1 ms for the first ten tries, then every millisecond or so.
///
/// SQLite's own busy timeout sleeps longer and longer between tries (up to
/// 100 ms), so a writer that has waited long polls rarely and keeps losing the
/// lock to writers that arrived later: under a relay draining at full speed
/// and three producers, one producer's commit waited 4.96 s against a 5 s
/// timeout. Short, jittered sleeps keep every waiter in the race.
pub(crate) fn set_busy_handler(conn: &Connection) -> Result<()> {
    // rusqlite's safe busy_handler wants `&mut Connection`, but configure()
    // takes the host's `&Connection`; the C API needs no exclusive access.
    // SAFETY: the handle is valid for the connection's lifetime, and the
    // callback is a plain function that ignores its user-data pointer.
    let rc = unsafe {
        rusqlite::ffi::sqlite3_busy_handler(
            conn.handle(),
            Some(busy_callback),
            std::ptr::null_mut(),
        )
    };
    if rc != rusqlite::ffi::SQLITE_OK {
        return Err(Error::Database {
            op: "set the busy handler",
            source: rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rc), None),
        });
    }
    Ok(())
}

extern "C" fn busy_callback(_: *mut std::ffi::c_void, attempt: std::ffi::c_int) -> std::ffi::c_int {
    std::ffi::c_int::from(busy_wait(attempt))
}

fn busy_wait(attempt: i32) -> bool {
    use std::cell::Cell;
    use std::time::Instant;
    thread_local! {
        // When the current wait began. A connection is used by one thread at
        // a time, and SQLite calls the handler on that thread.
        static WAIT_STARTED: Cell<Option<Instant>> = const { Cell::new(None) };
    }
    let now = Instant::now();
    let started = WAIT_STARTED.with(|s| {
        if attempt == 0 || s.get().is_none() {
            s.set(Some(now));
        }
        s.get().unwrap_or(now)
    });
    if now.duration_since(started) >= DEFAULT_BUSY_TIMEOUT {
        return false;
    }
    // Most waits are for one short transaction: try again soon at first,
    // then back off to about a millisecond.
    let micros = if attempt < 10 {
        100 + rand::random_range(0..100)
    } else {
        500 + rand::random_range(0..1000)
    };
    std::thread::sleep(Duration::from_micros(micros));
    true
}

fn check_path(path: &Path) -> Result<()> {
    if path.is_dir() {
        return Err(Error::Open {
            path: path.to_path_buf(),
            reason: "it is a directory; give the path of a database file".into(),
        });
    }
    Ok(())
}

fn open_error(path: &Path, e: rusqlite::Error) -> Error {
    use rusqlite::ErrorCode as C;
    let reason = match e.sqlite_error_code() {
        Some(C::NotADatabase) => "the file is not an SQLite database".to_string(),
        Some(C::CannotOpen) => format!("cannot open the file ({e}); check that its directory exists and is writable"),
        Some(C::ReadOnly) => "the file or its directory is read-only; outboxd needs to write the database, its -wal and its -shm files".to_string(),
        Some(C::PermissionDenied) => "permission denied".to_string(),
        Some(C::DiskFull) => "no space left on device; free some space on its file system".to_string(),
        _ => e.to_string(),
    };
    Error::Open {
        path: PathBuf::from(path),
        reason,
    }
}

/// Turns errors that really mean "this path is unusable" (a full file
/// system among them, asked of `conn`) into [`Error::Open`].
fn explain(path: &Path, conn: &Connection, e: Error) -> Error {
    match e {
        Error::Database { .. } if storage_full(conn) => open_error(path, disk_full()),
        Error::Database { source, .. }
            if matches!(
                source.sqlite_error_code(),
                Some(
                    rusqlite::ErrorCode::NotADatabase
                        | rusqlite::ErrorCode::ReadOnly
                        | rusqlite::ErrorCode::CannotOpen
                        | rusqlite::ErrorCode::PermissionDenied
                )
            ) =>
        {
            open_error(path, source)
        }
        other => other,
    }
}

/// An r2d2 connection manager for outboxd's read pool: each connection is
/// opened and [`configure`]d like [`open`]'s, or opened like
/// [`open_read_only`]'s, with a [`small_cache`], by a
/// [`ConnectionManager::read_only`] manager.
#[derive(Debug, Clone)]
pub struct ConnectionManager {
    path: PathBuf,
    read_only: bool,
}

impl ConnectionManager {
    /// A manager for the database at `path`.
    pub fn new(path: impl Into<PathBuf>) -> ConnectionManager {
        ConnectionManager {
            path: path.into(),
            read_only: false,
        }
    }

    /// A manager of read-only connections to the existing database at
    /// `path` (status, metrics, the console), each with a [`small_cache`]:
    /// a pool keeps its connections, and each would otherwise keep up to
    /// 2 MB of pages.
    pub fn read_only(path: impl Into<PathBuf>) -> ConnectionManager {
        ConnectionManager {
            path: path.into(),
            read_only: true,
        }
    }
}

impl r2d2::ManageConnection for ConnectionManager {
    type Connection = Connection;
    type Error = Error;

    fn connect(&self) -> Result<Connection> {
        if self.read_only {
            let conn = open_read_only(&self.path)?;
            small_cache(&conn)?;
            Ok(conn)
        } else {
            open(&self.path)
        }
    }

    fn is_valid(&self, conn: &mut Connection) -> Result<()> {
        conn.execute_batch("SELECT 1")
            .map_err(Error::db("check a pooled connection"))
    }

    fn has_broken(&self, _conn: &mut Connection) -> bool {
        false
    }
}

/// The lines of `EXPLAIN QUERY PLAN sql` with `params` bound, for tests
/// that check a statement searches an index rather than scanning a table.
#[cfg(test)]
pub(crate) fn query_plan(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Vec<String> {
    conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .unwrap()
        .query_map(params, |r| r.get(3))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_refuses_a_directory_and_a_non_database() {
        let dir = tempfile::tempdir().unwrap();
        let e = open(dir.path()).unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
        let junk = dir.path().join("junk.db");
        std::fs::write(&junk, vec![b'x'; 4096]).unwrap();
        let e = open(&junk).unwrap_err();
        assert!(e.to_string().contains("not an SQLite database"), "{e}");
    }

    #[test]
    fn open_sets_wal_and_full_sync() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open(dir.path().join("a.db")).unwrap();
        let mode: String = conn
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let sync: i64 = conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(sync, 2);
    }

    #[test]
    fn a_read_only_pool_keeps_a_small_cache_and_a_writing_one_the_default() {
        use r2d2::ManageConnection;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.db");
        let cache = |conn: &Connection| -> i64 {
            conn.query_row("PRAGMA cache_size", [], |r| r.get(0))
                .unwrap()
        };
        let writing = ConnectionManager::new(&path).connect().unwrap();
        assert_eq!(cache(&writing), -2000, "SQLite's default");
        let reading = ConnectionManager::read_only(&path).connect().unwrap();
        assert_eq!(cache(&reading), -i64::from(SMALL_CACHE_KIB));
    }

    #[test]
    fn open_refuses_a_newer_schema_before_switching_the_journal_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.db");
        let host = Connection::open(&path).unwrap();
        host.execute_batch(
            "CREATE TABLE outboxd_schema (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL);
             INSERT INTO outboxd_schema VALUES (999, 'future', 0);",
        )
        .unwrap();
        let e = open(&path).unwrap_err();
        assert!(matches!(e, Error::SchemaTooNew { found: 999, .. }), "{e}");
        let mode: String = host
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "delete", "the host's journal mode is untouched");
    }

    #[test]
    fn the_immutable_uri_escapes_what_uri_syntax_would_read() {
        assert_eq!(
            immutable_uri(Path::new("/srv/app data/a?b#c%d.db")),
            "file:/srv/app%20data/a%3Fb%23c%25d.db?immutable=1"
        );
        assert_eq!(
            immutable_uri(Path::new("app.db")),
            "file:app.db?immutable=1"
        );
    }

    #[test]
    fn configure_fails_loudly_when_wal_does_not_take() {
        // An in-memory database reports journal_mode=memory.
        let conn = Connection::open_in_memory().unwrap();
        let e = configure(&conn).unwrap_err();
        assert!(
            matches!(e, Error::NotWal { ref got } if got == "memory"),
            "{e}"
        );
    }
}
