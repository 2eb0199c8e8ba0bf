//! A member's own lock file: held with `flock` for the member's whole
//! life, and beaten by a thread of its own that touches no SQLite lock, so
//! it keeps beating while the member waits for the database's write lock.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{RecvTimeoutError, Sender};
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
    stop: Option<Sender<()>>,
    beat: Option<JoinHandle<()>>,
}

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
            let (stop, stopped) = crossbeam_channel::bounded::<()>(0);
            let beat = std::thread::Builder::new()
                .name("outboxd-heartbeat".into())
                .spawn(move || beat(&file, lease, &stopped))?;
            return Ok(Member {
                name,
                path,
                stop: Some(stop),
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

    /// Leaves for good, removing the lock file: for an owner that knows no
    /// row still names it. (Without this, a peer removes the file once it
    /// has taken the rows over.)
    pub(crate) fn leave(mut self) {
        self.stop_beating();
        let _ = std::fs::remove_file(&self.path);
    }

    fn stop_beating(&mut self) {
        drop(self.stop.take());
        if let Some(beat) = self.beat.take() {
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
/// member stops it. A write that fails is tried again at the next beat:
/// peers only wait longer.
fn beat(file: &File, lease: Duration, stopped: &crossbeam_channel::Receiver<()>) {
    let mut count = 0u64;
    loop {
        match stopped.recv_timeout(beat_interval(lease)) {
            Err(RecvTimeoutError::Timeout) => {
                count = count.wrapping_add(1);
                if let Err(e) = file.write_all_at(&record(count, lease), 0) {
                    tracing::debug!(error = %e, "cannot write the heartbeat");
                }
            }
            Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}
