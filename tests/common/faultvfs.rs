//! A fault-injecting SQLite VFS for tests: it wraps the default `unix` VFS,
//! counts write-side operations (xWrite, xSync, xTruncate) and can
//!
//! - fail the N-th operation of a class with a chosen error code, once or
//!   from then on (SQLite's own I/O-error loop);
//! - take a "power cut" snapshot of the database and its WAL just before
//!   the N-th operation, with a random subset of the writes not yet fsynced
//!   reverted (SQLite's crash tests; Jepsen's LazyFS does the same).
//!
//! Open a database through it with a URI: `file:/dir/db.sqlite?vfs=faulty`.
//! The state is process-global, so tests using it must run one at a time.
//! Nothing in the `extern "C"` functions may panic (that would abort), so
//! they never unwrap.
#![allow(dead_code)]

use rusqlite::ffi;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::size_of;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

/// The VFS name to put in a URI (`?vfs=faulty`).
pub const NAME: &str = "faulty";

/// Which operations a fault counts and fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// xWrite.
    Write,
    /// xSync.
    Sync,
}

/// A fault to inject.
#[derive(Debug, Clone, Copy)]
pub struct Fault {
    /// Which operations count.
    pub class: Class,
    /// Fail the `at`-th operation of the class (1-based) after `arm`.
    pub at: u64,
    /// Keep failing every later operation of the class too.
    pub persist: bool,
    /// The SQLite error code returned (SQLITE_IOERR_WRITE, SQLITE_FULL, ...).
    pub code: c_int,
}

/// A power cut to simulate.
#[derive(Debug, Clone)]
pub struct Crash {
    /// Snapshot just before the `at`-th write-side operation (any class).
    pub at: u64,
    /// The database file to snapshot (its `-wal` comes along).
    pub db: PathBuf,
    /// Where the snapshot goes (created).
    pub snap_dir: PathBuf,
    /// Probability that each un-fsynced write is lost (0 = a plain kill -9).
    pub lose_prob: f64,
    /// Seed of the choice of lost writes.
    pub seed: u64,
}

/// One write not yet made durable by an fsync: where, and what was there.
struct Unsynced {
    offset: i64,
    before: Vec<u8>,
    size_before: i64,
}

#[derive(Default)]
struct State {
    /// Write-side operations since `arm`: all, writes, syncs.
    ops: u64,
    writes: u64,
    syncs: u64,
    fault: Option<Fault>,
    fired: bool,
    faults_hit: u64,
    crash: Option<Crash>,
    crashed: bool,
    /// Interned paths of main database and WAL files; FFile keeps the index.
    paths: Vec<String>,
    /// Per interned path: its writes since its last successful fsync.
    unsynced: HashMap<usize, Vec<Unsynced>>,
    rng: u64,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);
/// Held across a whole write-side operation (check, bookkeeping, real I/O)
/// so a snapshot taken by another thread never sees half a write.
static IO: Mutex<()> = Mutex::new(());
static ORIG: AtomicPtr<ffi::sqlite3_vfs> = AtomicPtr::new(ptr::null_mut());

fn lock<T>(m: &'static Mutex<T>) -> MutexGuard<'static, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut g = lock(&STATE);
    f(g.get_or_insert_with(State::default))
}

/// Registers the VFS (once per process; later calls do nothing).
pub fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| unsafe {
        let orig = ffi::sqlite3_vfs_find(ptr::null());
        assert!(!orig.is_null(), "no default VFS");
        ORIG.store(orig, Ordering::SeqCst);
        let mut v: ffi::sqlite3_vfs = *orig;
        v.zName = c"faulty".as_ptr();
        // Our file struct is ours plus the real one right after it.
        v.szOsFile = (*orig).szOsFile + size_of::<FFile>() as c_int;
        v.xOpen = Some(x_open);
        v.xDelete = Some(x_delete);
        v.pNext = ptr::null_mut();
        let rc = ffi::sqlite3_vfs_register(Box::leak(Box::new(v)), 0);
        assert_eq!(rc, ffi::SQLITE_OK, "cannot register the fault VFS");
    });
}

/// A URI that opens `path` through this VFS.
pub fn uri(path: &Path) -> String {
    format!("file:{}?vfs={NAME}", path.display())
}

/// Resets the counters and the un-fsynced write log, and arms a fault or a
/// crash (or neither, to count the operations of a clean run).
pub fn arm(fault: Option<Fault>, crash: Option<Crash>) {
    let _io = lock(&IO);
    with(|s| {
        s.ops = 0;
        s.writes = 0;
        s.syncs = 0;
        s.fired = false;
        s.faults_hit = 0;
        s.fault = fault;
        s.rng = crash
            .as_ref()
            .map_or(1, |c| c.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        s.crash = crash;
        s.crashed = false;
        s.unsynced.clear();
    });
}

/// Turns every fault off (the counters keep counting).
pub fn disarm() {
    let _io = lock(&IO);
    with(|s| {
        s.fault = None;
        s.crash = None;
    });
}

/// (all write-side ops, xWrite ops, xSync ops) since `arm`.
pub fn counts() -> (u64, u64, u64) {
    with(|s| (s.ops, s.writes, s.syncs))
}

/// The number of write-side operations since `arm`.
pub fn ops() -> u64 {
    with(|s| s.ops)
}

/// True once the armed fault has fired.
pub fn fired() -> bool {
    with(|s| s.fired)
}

/// Operations failed by the fault so far.
pub fn faults_hit() -> u64 {
    with(|s| s.faults_hit)
}

/// True once the crash snapshot was taken.
pub fn crashed() -> bool {
    with(|s| s.crashed)
}

/// Counts one write-side operation of `class` and says whether it fails
/// (and with which code). Takes the crash snapshot when its turn comes.
fn gate(class: Option<Class>) -> Option<c_int> {
    with(|s| {
        s.ops += 1;
        let n = match class {
            Some(Class::Write) => {
                s.writes += 1;
                s.writes
            }
            Some(Class::Sync) => {
                s.syncs += 1;
                s.syncs
            }
            None => 0,
        };
        if s.crash.as_ref().is_some_and(|c| c.at == s.ops) && !s.crashed {
            snapshot(s);
            s.crashed = true;
        }
        let f = s.fault?;
        if class != Some(f.class) {
            return None;
        }
        if (s.fired && f.persist) || (!s.fired && n == f.at) {
            s.fired = true;
            s.faults_hit += 1;
            return Some(f.code);
        }
        None
    })
}

/// xorshift64: uniform in [0, 1).
fn random(s: &mut State) -> f64 {
    s.rng ^= s.rng << 13;
    s.rng ^= s.rng >> 7;
    s.rng ^= s.rng << 17;
    (s.rng >> 11) as f64 / (1u64 << 53) as f64
}

/// Copies the database and WAL as they are on disk now, then reverts each
/// un-fsynced write with probability `lose_prob`, latest first. A reverted
/// write that grew the file also shrinks it back (the size was not synced
/// either). Errors are ignored: the checker will find a missing snapshot.
fn snapshot(s: &mut State) {
    let Some(c) = s.crash.clone() else { return };
    let _ = std::fs::create_dir_all(&c.snap_dir);
    let mut wal = c.db.clone().into_os_string();
    wal.push("-wal");
    for src in [c.db.clone(), PathBuf::from(wal)] {
        let Some(name) = src.file_name() else {
            continue;
        };
        let dst = c.snap_dir.join(name);
        if std::fs::copy(&src, &dst).is_err() {
            continue;
        }
        let key = s.paths.iter().position(|p| Path::new(p) == src);
        let writes = key.and_then(|k| s.unsynced.remove(&k)).unwrap_or_default();
        let Ok(f) = std::fs::OpenOptions::new().write(true).open(&dst) else {
            continue;
        };
        let mut shrink_to: Option<i64> = None;
        for w in writes.iter().rev() {
            if random(s) < c.lose_prob {
                let _ = f.write_all_at(&w.before, w.offset as u64);
                shrink_to = Some(shrink_to.map_or(w.size_before, |m| m.min(w.size_before)));
            }
        }
        if let (Some(m), Ok(meta)) = (shrink_to, f.metadata()) {
            if (m as u64) < meta.len() {
                let _ = f.set_len(m as u64);
            }
        }
        // Put the log back: the live files go on after the snapshot.
        if let Some(k) = key {
            s.unsynced.insert(k, writes);
        }
    }
}

/// Our file: the sqlite3_file header, then a pointer to the real unix file
/// (which lives right after this struct in the same allocation), and the
/// interned path index (-1 for files the power-cut model ignores).
#[repr(C)]
struct FFile {
    base: ffi::sqlite3_file,
    real: *mut ffi::sqlite3_file,
    key: isize,
}

unsafe fn real(f: *mut ffi::sqlite3_file) -> *mut ffi::sqlite3_file {
    unsafe { (*(f as *mut FFile)).real }
}

unsafe fn methods(f: *mut ffi::sqlite3_file) -> &'static ffi::sqlite3_io_methods {
    unsafe { &*(*real(f)).pMethods }
}

unsafe fn key(f: *mut ffi::sqlite3_file) -> isize {
    unsafe { (*(f as *mut FFile)).key }
}

unsafe extern "C" fn x_close(f: *mut ffi::sqlite3_file) -> c_int {
    unsafe { (methods(f).xClose.unwrap_unchecked())(real(f)) }
}

unsafe extern "C" fn x_read(f: *mut ffi::sqlite3_file, b: *mut c_void, n: c_int, o: i64) -> c_int {
    unsafe { (methods(f).xRead.unwrap_unchecked())(real(f), b, n, o) }
}

unsafe extern "C" fn x_write(
    f: *mut ffi::sqlite3_file,
    b: *const c_void,
    n: c_int,
    o: i64,
) -> c_int {
    let _io = lock(&IO);
    if let Some(rc) = gate(Some(Class::Write)) {
        return rc;
    }
    unsafe {
        let m = methods(f);
        let k = key(f);
        if k >= 0 {
            // Remember what the write overwrites, for the power-cut model.
            let mut before = vec![0u8; n.max(0) as usize];
            let mut size: i64 = 0;
            (m.xFileSize.unwrap_unchecked())(real(f), &mut size);
            // A short read past the end zero-fills, which is what it was.
            (m.xRead.unwrap_unchecked())(real(f), before.as_mut_ptr() as *mut c_void, n, o);
            with(|s| {
                s.unsynced.entry(k as usize).or_default().push(Unsynced {
                    offset: o,
                    before,
                    size_before: size,
                })
            });
        }
        (m.xWrite.unwrap_unchecked())(real(f), b, n, o)
    }
}

unsafe extern "C" fn x_truncate(f: *mut ffi::sqlite3_file, size: i64) -> c_int {
    let _io = lock(&IO);
    if let Some(rc) = gate(None) {
        return rc;
    }
    unsafe {
        let k = key(f);
        if k >= 0 {
            // Simplification: a truncate counts as durable at once; writes
            // past the new end are gone, so there is nothing to revert.
            with(|s| {
                if let Some(w) = s.unsynced.get_mut(&(k as usize)) {
                    w.retain(|w| w.offset < size);
                }
            });
        }
        (methods(f).xTruncate.unwrap_unchecked())(real(f), size)
    }
}

unsafe extern "C" fn x_sync(f: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    let _io = lock(&IO);
    if let Some(rc) = gate(Some(Class::Sync)) {
        return rc;
    }
    unsafe {
        let rc = (methods(f).xSync.unwrap_unchecked())(real(f), flags);
        let k = key(f);
        if rc == ffi::SQLITE_OK && k >= 0 {
            with(|s| s.unsynced.remove(&(k as usize)));
        }
        rc
    }
}

unsafe extern "C" fn x_file_size(f: *mut ffi::sqlite3_file, p: *mut i64) -> c_int {
    unsafe { (methods(f).xFileSize.unwrap_unchecked())(real(f), p) }
}

unsafe extern "C" fn x_lock(f: *mut ffi::sqlite3_file, l: c_int) -> c_int {
    unsafe { (methods(f).xLock.unwrap_unchecked())(real(f), l) }
}

unsafe extern "C" fn x_unlock(f: *mut ffi::sqlite3_file, l: c_int) -> c_int {
    unsafe { (methods(f).xUnlock.unwrap_unchecked())(real(f), l) }
}

unsafe extern "C" fn x_check_reserved_lock(f: *mut ffi::sqlite3_file, p: *mut c_int) -> c_int {
    unsafe { (methods(f).xCheckReservedLock.unwrap_unchecked())(real(f), p) }
}

unsafe extern "C" fn x_file_control(f: *mut ffi::sqlite3_file, op: c_int, a: *mut c_void) -> c_int {
    unsafe { (methods(f).xFileControl.unwrap_unchecked())(real(f), op, a) }
}

unsafe extern "C" fn x_sector_size(f: *mut ffi::sqlite3_file) -> c_int {
    unsafe { (methods(f).xSectorSize.unwrap_unchecked())(real(f)) }
}

unsafe extern "C" fn x_device_characteristics(f: *mut ffi::sqlite3_file) -> c_int {
    unsafe { (methods(f).xDeviceCharacteristics.unwrap_unchecked())(real(f)) }
}

// The shared-memory methods are what WAL mode needs; forwarded untouched.
unsafe extern "C" fn x_shm_map(
    f: *mut ffi::sqlite3_file,
    i: c_int,
    size: c_int,
    extend: c_int,
    pp: *mut *mut c_void,
) -> c_int {
    unsafe { (methods(f).xShmMap.unwrap_unchecked())(real(f), i, size, extend, pp) }
}

unsafe extern "C" fn x_shm_lock(f: *mut ffi::sqlite3_file, o: c_int, n: c_int, fl: c_int) -> c_int {
    unsafe { (methods(f).xShmLock.unwrap_unchecked())(real(f), o, n, fl) }
}

unsafe extern "C" fn x_shm_barrier(f: *mut ffi::sqlite3_file) {
    unsafe { (methods(f).xShmBarrier.unwrap_unchecked())(real(f)) }
}

unsafe extern "C" fn x_shm_unmap(f: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    unsafe { (methods(f).xShmUnmap.unwrap_unchecked())(real(f), delete) }
}

unsafe extern "C" fn x_fetch(
    f: *mut ffi::sqlite3_file,
    o: i64,
    n: c_int,
    pp: *mut *mut c_void,
) -> c_int {
    unsafe { (methods(f).xFetch.unwrap_unchecked())(real(f), o, n, pp) }
}

unsafe extern "C" fn x_unfetch(f: *mut ffi::sqlite3_file, o: i64, p: *mut c_void) -> c_int {
    unsafe { (methods(f).xUnfetch.unwrap_unchecked())(real(f), o, p) }
}

static IO_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: Some(x_fetch),
    xUnfetch: Some(x_unfetch),
};

unsafe extern "C" fn x_open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    f: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    unsafe {
        let orig = ORIG.load(Ordering::SeqCst);
        let ff = f as *mut FFile;
        let realp = (f as *mut u8).add(size_of::<FFile>()) as *mut ffi::sqlite3_file;
        (*ff).real = realp;
        (*ff).key = -1;
        // NULL methods until the real open succeeds, so SQLite won't xClose.
        (*ff).base.pMethods = ptr::null();
        let rc = ((*orig).xOpen.unwrap_unchecked())(orig, name, realp, flags, out_flags);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        if !name.is_null() && flags & (ffi::SQLITE_OPEN_MAIN_DB | ffi::SQLITE_OPEN_WAL) != 0 {
            let path = CStr::from_ptr(name).to_string_lossy().into_owned();
            (*ff).key = with(|s| match s.paths.iter().position(|p| *p == path) {
                Some(i) => i as isize,
                None => {
                    s.paths.push(path);
                    s.paths.len() as isize - 1
                }
            });
        }
        (*ff).base.pMethods = &IO_METHODS;
        rc
    }
}

unsafe extern "C" fn x_delete(
    _vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    unsafe {
        let orig = ORIG.load(Ordering::SeqCst);
        let rc = ((*orig).xDelete.unwrap_unchecked())(orig, name, sync_dir);
        if !name.is_null() {
            // A deleted file's write log means nothing for the next file of
            // that name (a new WAL starts empty).
            let path = CStr::from_ptr(name).to_string_lossy().into_owned();
            with(|s| {
                if let Some(k) = s.paths.iter().position(|p| *p == path) {
                    s.unsynced.remove(&k);
                }
            });
        }
        rc
    }
}
