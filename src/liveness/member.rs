//! A member's own lock file: held with `flock` for the member's whole
//! life, and beaten by a thread of its own that touches no SQLite lock, so
//! it keeps beating while the member waits for the database's write lock.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::fs::{flock, FlockOperation};

use super::lock_file;

/// What a lock file holds, in this order, each a little-endian u64: the
/// heartbeat count, the member's lease in milliseconds, its process id.
pub(super) const RECORD_LEN: usize = 24;

/// How often a member with lease `lease` beats: often enough that a peer
/// waiting ten leases sees many beats, seldom enough to cost nothing.
pub(super) fn beat_interval(lease: Duration) -> Duration {
    (lease / 20).clamp(Duration::from_millis(5), Duration::from_secs(1))
}

/// This process's part in the liveness protocol for one relay or one
/// sender. Dropping it stops the heartbeat and closes the file, which frees
/// the lock: peers then take its leases at once and remove the file.
#[derive(Debug)]
pub(crate) struct Member {
    name: String,
    path: PathBuf,
    stop: Arc<AtomicBool>,
    beat: Option<JoinHandle<()>>,
}

/// The heartbeat thread's stack: it calls nothing deep.
const BEAT_STACK: usize = 64 * 1024;

impl Member {
    /// Creates a lock file of a new name in `dir` and holds it. The file is
    /// made under a temporary name, locked, and renamed into place, so no
    /// peer ever finds a `.lock` file that is not held yet. Opened
    /// close-on-exec (std always does), so a command sink's child never
    /// holds it.
    pub(crate) fn join(dir: &Path, lease: Duration) -> io::Result<Member> {
        let mode = dir.metadata()?.mode() & 0o666;
        loop {
            let name = ulid::Ulid::generate().to_string();
            let path = dir.join(lock_file(&name));
            let new = dir.join(format!("{name}.new"));
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&new)?;
            flock(&file, FlockOperation::NonBlockingLockExclusive)?;
            let _ = file.set_permissions(std::fs::Permissions::from_mode(mode | 0o600));
            file.write_all_at(&record(0, lease), 0)?;
            // A peer sweeping leftovers may have removed the file between
            // its creation and the lock: start over under a new name.
            match std::fs::rename(&new, &path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
            let stop = Arc::new(AtomicBool::new(false));
            let stopped = stop.clone();
            let beat = std::thread::Builder::new()
                .name("outboxd-heartbeat".into())
                .stack_size(BEAT_STACK)
                .spawn(move || beat(&file, lease, &stopped))?;
            return Ok(Member {
                name,
                path,
                stop,
                beat: Some(beat),
            });
        }
    }

    /// The member's name, which its claim tokens carry.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// A new claim token of this member.
    pub(crate) fn token(&self) -> String {
        super::token(&self.name)
    }

    /// The directory of the lock file.
    pub(crate) fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("/"))
    }

    /// The lock file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Leaves for good, removing the lock file: for an owner that knows no
    /// row still names it. (Without this, a peer removes the file once it
    /// has taken the rows over.)
    pub(crate) fn leave(mut self) {
        self.stop_beating();
        let _ = std::fs::remove_file(&self.path);
    }

    fn stop_beating(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(beat) = self.beat.take() {
            beat.thread().unpark();
            let _ = beat.join();
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop_beating();
    }
}

fn record(count: u64, lease: Duration) -> [u8; RECORD_LEN] {
    let mut r = [0u8; RECORD_LEN];
    r[..8].copy_from_slice(&count.to_le_bytes());
    let lease_ms = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX);
    r[8..16].copy_from_slice(&lease_ms.to_le_bytes());
    r[16..].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
    r
}

/// The heartbeat thread: owns the file (and with it the lock) until the
/// member stops it. It allocates nothing, so glibc gives it no malloc
/// arena of its own (64 MB of address space, which a process under an
/// address-space cap may not have). A write that fails is tried again at
/// the next beat: peers only wait longer.
fn beat(file: &File, lease: Duration, stopped: &AtomicBool) {
    let mut count = 0u64;
    let interval = beat_interval(lease);
    let mut next = Instant::now() + interval;
    while !stopped.load(Ordering::Acquire) {
        let now = Instant::now();
        if now < next {
            // Woken early by the member's stop, or spuriously.
            std::thread::park_timeout(next - now);
            continue;
        }
        next = now + interval;
        count = count.wrapping_add(1);
        let _ = file.write_all_at(&record(count, lease), 0);
    }
}
