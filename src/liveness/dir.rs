//! The lock directory: `<database>-outboxd/` beside the database's
//! canonical path, so every process that opens the database by any path
//! (a symlink, a relative path) finds the same one.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The lock directory of the database at `db`, created if missing with the
/// mode and group of the database's directory (so every user that may
/// write the database may also take part). None for an in-memory
/// database, which no other process can see.
pub(crate) fn lock_dir(db: &Path) -> io::Result<Option<PathBuf>> {
    if db.as_os_str().is_empty() || db == Path::new(":memory:") {
        return Ok(None);
    }
    let db = db.canonicalize()?;
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push("-outboxd");
    let dir = db.with_file_name(name);
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.is_dir() => return Ok(Some(dir)),
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} is not a directory", dir.display()),
            ));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let parent = db.parent().unwrap_or(Path::new("/")).metadata()?;
    let mode = parent.mode() & 0o7777;
    match std::fs::DirBuilder::new().mode(mode).create(&dir) {
        Ok(()) => {
            // The umask took bits away; the group may differ from the
            // directory's unless it is setgid. Neither failure stops us:
            // the directory works for this user either way.
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode));
            let _ = std::os::unix::fs::chown(&dir, None, Some(parent.gid()));
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    Ok(Some(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_directory_whatever_the_path_with_the_databases_directorys_mode() {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o770)).unwrap();
        std::fs::write(d.path().join("app.db"), b"").unwrap();
        std::os::unix::fs::symlink(d.path().join("app.db"), d.path().join("link.db")).unwrap();
        let a = lock_dir(&d.path().join("app.db")).unwrap().unwrap();
        let b = lock_dir(&d.path().join("link.db")).unwrap().unwrap();
        assert_eq!(a, b);
        assert_eq!(a.file_name().unwrap(), "app.db-outboxd");
        assert_eq!(a.metadata().unwrap().mode() & 0o7777, 0o770);
        assert_eq!(lock_dir(Path::new(":memory:")).unwrap(), None);
    }
}
