//! Lock files of other relays or senders, played by the test
//! (docs/liveness.md describes the files): one that ended (its file left,
//! its lock free), one stopped (its lock held, its heartbeat still), and
//! the name of a live one's file, to remove it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};

/// The lock directory of the database at `db`.
pub fn lock_dir(db: &Path) -> PathBuf {
    let db = db.canonicalize().unwrap();
    let mut name = db.file_name().unwrap().to_os_string();
    name.push("-outboxd");
    db.with_file_name(name)
}

/// The lock file a claim token names.
pub fn lock_file(db: &Path, token: &str) -> PathBuf {
    lock_dir(db).join(format!("{}.lock", &token[..26]))
}

/// A peer played by the test: a lock file of its own, held or not.
pub struct Peer {
    pub name: String,
    _file: File,
}

impl Peer {
    /// One that ended: its file is there, its lock free.
    pub fn ended(db: &Path) -> Peer {
        Peer::new(db, false)
    }

    /// One stopped (SIGSTOP, hung): its lock held for as long as the value
    /// lives, its heartbeat never moving.
    pub fn stopped(db: &Path) -> Peer {
        Peer::new(db, true)
    }

    fn new(db: &Path, held: bool) -> Peer {
        let dir = lock_dir(db);
        std::fs::create_dir_all(&dir).unwrap();
        let name = ulid::Ulid::generate().to_string();
        let file = File::create(dir.join(format!("{name}.lock"))).unwrap();
        // Count 0, lease 1 s, pid 0.
        let mut record = [0u8; 24];
        record[8..16].copy_from_slice(&1000u64.to_le_bytes());
        file.write_all_at(&record, 0).unwrap();
        if held {
            flock(&file, FlockOperation::NonBlockingLockExclusive).unwrap();
        }
        Peer { name, _file: file }
    }

    /// A claim token of this peer.
    pub fn token(&self) -> String {
        format!("{}:{}", self.name, ulid::Ulid::generate())
    }
}
