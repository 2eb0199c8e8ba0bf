//! The JSON-lines sink: one envelope per line, to stdout, a file or any writer.

use std::fmt;
use std::fs::{self, File, Metadata, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Serialize;

use super::buffer::{json_len, Buffer, OutOfMemory};
use crate::consumer::{Consumer, Delivery, Outcome};
use crate::envelope::Envelope;

/// The JSON-lines file could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JsonlError {
    /// Opening (or creating) the file failed.
    #[error("cannot open JSON-lines file {path}: {source} (it is created if missing; its directory must exist and be writable)")]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// Writes each envelope as one line of JSON and a newline, and reports
/// [`Outcome::Delivered`] only once the line is written and flushed (and,
/// with `fsync`, synced to disk). A failed write is a retry carrying the I/O
/// error.
///
/// Each event is exactly one line, whatever its payload looks like: the
/// envelope ([`Envelope::to_json`]) is re-encoded compactly, dropping the
/// whitespace between tokens that a pretty-printed payload (or any foreign
/// producer) stored, and writing U+0085, U+2028 and U+2029 inside strings as
/// `\u` escapes, since some readers (Python's `splitlines`, older
/// JavaScript) break lines at them. The JSON value is unchanged: the same
/// keys in the same order, the same numbers digit for digit, the same
/// strings. (The webhook and command sinks deliver the payload's bytes as
/// they were stored.)
///
/// With [`delivery_fields`](Self::delivery_fields), each line also carries
/// the event's `tenant_id` and `legacy` flag and the attempt's trace
/// context after the envelope's fields.
///
/// Deliveries from several worker threads are serialised by a mutex, so a
/// line never interleaves with another.
///
/// The line is re-encoded into one buffer reserved at the envelope's size
/// (the sink's one copy of the payload) and written with one call; a
/// buffer that cannot be had (out of memory) is a retry of that event.
///
/// A file sink survives log rotation. Before each line it checks (one
/// `stat`) that its path still names the open file; when the file was moved
/// away, deleted or replaced, it opens the path again, creating the file as
/// at the start, so the line goes to the file now at the path. A line
/// written just as the file is moved lands in the moved file (logrotate's
/// default `create` mode keeps it); one written to a file deleted in that
/// instant is detected after the write (the open file has no name left) and
/// retried into the new file, never reported delivered. While the path
/// cannot be opened (its directory is gone) each delivery is a retry saying
/// so. `copytruncate` keeps the same file: the sink appends (`O_APPEND`), so
/// after the truncation lines go to the start of the emptied file, but lines
/// written between logrotate's copy and its truncation are lost although
/// delivered; rotate by moving instead. (On Unix; elsewhere the file is only
/// reopened when its path is missing.)
///
/// ```
/// use outboxd::sinks::JsonlSink;
/// # let dir = tempfile::tempdir().unwrap();
/// let to_stdout = JsonlSink::stdout();
/// let to_file = JsonlSink::file(dir.path().join("events.jsonl"), true)?;
/// # Ok::<(), outboxd::sinks::JsonlError>(())
/// ```
///
/// [`Envelope::to_json`]: crate::envelope::Envelope::to_json
pub struct JsonlSink {
    target: Mutex<Target>,
    fsync: bool,
    delivery_fields: bool,
    label: String,
}

enum Target {
    Stdout,
    File(LogFile),
    Writer(Box<dyn Write + Send>),
}

impl JsonlSink {
    /// Writes to the process's standard output.
    pub fn stdout() -> JsonlSink {
        JsonlSink {
            target: Mutex::new(Target::Stdout),
            fsync: false,
            delivery_fields: false,
            label: "stdout".to_string(),
        }
    }

    /// Appends to `path`, creating it if missing. With `fsync`, each line is
    /// synced to disk (`sync_data`) before the delivery counts as done, and
    /// the first line into a file the sink created first syncs the file's
    /// directory, so the file's name survives a power cut too.
    /// When the file is moved away or deleted later (log rotation), the
    /// next line goes to a new file at `path` (see above).
    pub fn file(path: impl AsRef<Path>, fsync: bool) -> Result<JsonlSink, JsonlError> {
        let path = path.as_ref();
        let file = LogFile::open(path).map_err(|source| JsonlError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(JsonlSink {
            target: Mutex::new(Target::File(file)),
            fsync,
            delivery_fields: false,
            label: path.display().to_string(),
        })
    }

    /// Writes to any writer (a socket, a pipe, a buffer in a test). Each line
    /// is written and flushed before the delivery counts as done.
    pub fn to_writer(writer: impl Write + Send + 'static) -> JsonlSink {
        JsonlSink {
            target: Mutex::new(Target::Writer(Box::new(writer))),
            fsync: false,
            delivery_fields: false,
            label: "a writer".to_string(),
        }
    }

    /// Adds `"tenant_id"` (a string, or null), `"legacy"` (true for a
    /// row written without an event id), and, when the event has trace
    /// context, `"traceparent"` (this attempt's, a child of the producer's:
    /// [`crate::trace`]) and `"tracestate"` (when there is one) to each
    /// line, after the envelope's fields. Off by default: each line is then exactly an envelope (which
    /// [`Envelope`](crate::envelope::Envelope)'s deserializer, refusing
    /// unknown fields, reads back).
    ///
    /// ```
    /// use outboxd::sinks::JsonlSink;
    /// let sink = JsonlSink::stdout().delivery_fields(true);
    /// ```
    pub fn delivery_fields(mut self, on: bool) -> JsonlSink {
        self.delivery_fields = on;
        self
    }

    /// The line written for one delivery, newline included: re-encoded on
    /// its way into a buffer reserved at the envelope's size, the one copy
    /// of the payload this sink makes.
    fn line(&self, delivery: &Delivery) -> Result<Vec<u8>, OutOfMemory> {
        let envelope = &delivery.envelope;
        if !self.delivery_fields {
            return one_line_of(envelope);
        }
        one_line_of(&WithDeliveryFields {
            envelope,
            tenant_id: delivery.tenant_id.as_deref(),
            legacy: delivery.legacy,
            traceparent: delivery.trace.as_ref().map(|t| t.traceparent.to_string()),
            tracestate: delivery
                .trace
                .as_ref()
                .and_then(|t| Some(t.tracestate.as_ref()?.as_str())),
        })
    }

    fn write_line(&self, line: &[u8]) -> io::Result<()> {
        // A poisoned lock only means another delivery panicked mid-write; the
        // target itself is still usable.
        let mut target = self.target.lock().unwrap_or_else(|e| e.into_inner());
        match &mut *target {
            Target::Stdout => {
                let mut out = io::stdout().lock();
                out.write_all(line)?;
                out.flush()
            }
            Target::Writer(w) => {
                w.write_all(line)?;
                w.flush()
            }
            Target::File(f) => f.write_line(line, self.fsync),
        }
    }
}

/// The file a file sink appends to, and the path it keeps following.
struct LogFile {
    /// Absolute, so a later change of the working directory changes nothing.
    path: PathBuf,
    file: File,
    /// The open file's identity, to tell whether `path` still names it.
    id: FileId,
    /// A failed write may have left part of a line behind that could not be
    /// cut off again; the next line then starts on a fresh line.
    dirty: bool,
    /// The directory entry of the file is known to be on disk: false for a
    /// file this sink created until, with `fsync`, the first line written
    /// to it has synced its directory.
    entry_synced: bool,
}

impl LogFile {
    /// Opens `path` for appending, creating it if missing (mode 0666 less
    /// the umask), at the start and after each rotation alike.
    fn open(path: &Path) -> io::Result<LogFile> {
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let append = || {
            let mut o = OpenOptions::new();
            o.append(true);
            o
        };
        // Create it, or open the file that is there. Should that one be
        // gone by the open (removed in between, or a symbolic link to a file
        // not there yet), it is created as before and counted as created.
        let (file, created) = match append().create_new(true).open(&path) {
            Ok(file) => (file, true),
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
            Err(_) => match append().open(&path) {
                Ok(file) => (file, false),
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                Err(_) => (append().create(true).open(&path)?, true),
            },
        };
        let id = FileId::of(&file.metadata()?);
        Ok(LogFile {
            path,
            file,
            id,
            dirty: false,
            entry_synced: !created,
        })
    }

    /// Makes the open file the one at the path, reopening the path when it
    /// is missing or names another file, and returns the file's length.
    fn follow_path(&mut self) -> io::Result<Option<u64>> {
        if let Ok(m) = fs::metadata(&self.path) {
            if FileId::of(&m) == self.id {
                return Ok(Some(m.len()));
            }
        }
        *self = LogFile::open(&self.path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "the file was moved or deleted and cannot be created again: {e} (its directory must exist and be writable)"
                ),
            )
        })?;
        tracing::info!(
            path = %self.path.display(),
            "the JSON-lines file was moved or deleted; writing to a new file at its path"
        );
        Ok(self.file.metadata().map(|m| m.len()).ok())
    }

    fn write_line(&mut self, line: &[u8], fsync: bool) -> io::Result<()> {
        let mut before = self.follow_path()?;
        // Syncing a new file's data does not put its name on disk: after a
        // power cut the file, and every line synced into it, could be gone.
        // So the first line written to a file this sink created syncs its
        // directory first. As SQLite does for its journals, a directory that
        // cannot be opened or synced (no read permission, a file system
        // that refuses) is a warning, not a delivery that fails forever.
        if fsync && !self.entry_synced {
            if let Err(e) = sync_directory_of(&self.path) {
                tracing::warn!(path = %self.path.display(), error = %e,
                    "cannot sync the directory of the JSON-lines file; a power cut could lose the new file");
            }
            self.entry_synced = true;
        }
        if self.dirty {
            self.file.write_all(b"\n")?;
            self.dirty = false;
            before = self.file.metadata().map(|m| m.len()).ok();
        }
        let file = &mut self.file;
        let result = file.write_all(line).and_then(|()| file.flush());
        let result = match result {
            Ok(()) if fsync => file.sync_data(),
            other => other,
        };
        match result {
            // Deleted between the check and the write: the line is in a file
            // nobody can open any more. The retry writes it at the path.
            Ok(()) if !still_linked(file)? => Err(io::Error::new(
                io::ErrorKind::NotFound,
                "the file was deleted while the line was written; it is written again to a new file at the path",
            )),
            Ok(()) => Ok(()),
            Err(e) => {
                // Cut off a partial line so readers never see half an
                // envelope; when that fails too, start the next one afresh.
                // A file truncated meanwhile (copytruncate) is not lengthened.
                let cut = before.map(|len| {
                    file.metadata().is_ok_and(|m| m.len() >= len) && file.set_len(len).is_ok()
                });
                self.dirty = cut != Some(true);
                Err(e)
            }
        }
    }
}

/// What tells two files apart: device and inode on Unix. Elsewhere every
/// file looks alike, so a file is reopened only when its path is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    #[cfg(unix)]
    dev: u64,
    #[cfg(unix)]
    ino: u64,
}

impl FileId {
    fn of(m: &Metadata) -> FileId {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            FileId {
                dev: m.dev(),
                ino: m.ino(),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = m;
            FileId {}
        }
    }
}

/// Syncs the directory that holds `path`, so a file created there keeps
/// its name after a power cut. (Elsewhere than on Unix, a directory cannot
/// be opened to sync it; nothing is done.)
fn sync_directory_of(path: &Path) -> io::Result<()> {
    #[cfg(test)]
    tests::DIRECTORY_SYNCS.with(|n| n.set(n.get() + 1));
    #[cfg(unix)]
    {
        let dir = path.parent().unwrap_or(Path::new("/"));
        File::open(dir)?.sync_all()
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Ok(())
    }
}

/// Whether the open file still has a name (a deleted file has none).
fn still_linked(file: &File) -> io::Result<bool> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Ok(file.metadata()?.nlink() > 0)
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        Ok(true)
    }
}

impl Consumer for JsonlSink {
    fn deliver(&self, delivery: &Delivery) -> Outcome {
        let line = match self.line(delivery) {
            Ok(line) => line,
            Err(e) => return e.retry(),
        };
        match self.write_line(&line) {
            Ok(()) => Outcome::Delivered,
            Err(e) => Outcome::retry(format!("cannot write to {}: {e}", self.label)),
        }
    }
}

impl fmt::Debug for JsonlSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JsonlSink")
            .field("target", &self.label)
            .field("fsync", &self.fsync)
            .field("delivery_fields", &self.delivery_fields)
            .finish()
    }
}

/// An envelope with [`JsonlSink::delivery_fields`] after its own fields.
#[derive(Serialize)]
struct WithDeliveryFields<'a> {
    #[serde(flatten)]
    envelope: &'a Envelope,
    tenant_id: Option<&'a str>,
    legacy: bool,
    /// Left out when the event has no trace context: such lines are as
    /// they were before trace context existed.
    #[serde(skip_serializing_if = "Option::is_none")]
    traceparent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tracestate: Option<&'a str>,
}

/// `value`'s JSON re-encoded on one line ([`OneLine`]) and a newline, in
/// a buffer reserved at the size of its JSON (which the re-encoding keeps
/// or shortens, unless it escapes the characters below).
fn one_line_of(value: &impl Serialize) -> Result<Vec<u8>, OutOfMemory> {
    let bytes = json_len(value) + 1;
    let mut out = OneLine::new(Buffer::with_capacity(bytes)?);
    serde_json::to_writer(&mut out, value).map_err(|_| OutOfMemory { bytes })?;
    let mut line = out.into_inner();
    line.write_all(b"\n").map_err(|_| OutOfMemory { bytes })?;
    Ok(line.0)
}

/// Passes valid JSON text on re-encoded on one line: whitespace between
/// tokens is dropped, and the characters some readers take for line
/// breaks (U+0085, U+2028, U+2029; the others are control characters,
/// which JSON strings never hold raw) are escaped inside strings.
/// Everything else is copied as it is, so the value is unchanged (no
/// number is re-parsed, no key reordered). The input must be valid JSON,
/// as an envelope always is; it may come in pieces cut anywhere, even
/// inside a character.
struct OneLine<W> {
    out: W,
    in_string: bool,
    escaped: bool,
    /// The first bytes of a character that may be one to escape (C2 of
    /// U+0085, E2 80 of U+2028 and U+2029), held until the next byte says.
    held: [u8; 2],
    held_len: usize,
}

impl<W: Write> OneLine<W> {
    fn new(out: W) -> OneLine<W> {
        OneLine {
            out,
            in_string: false,
            escaped: false,
            held: [0; 2],
            held_len: 0,
        }
    }

    fn into_inner(self) -> W {
        self.out
    }

    fn filter(&mut self, buf: &[u8]) -> io::Result<()> {
        // Where the bytes copied as they are begin.
        let mut start = 0;
        for (i, &b) in buf.iter().enumerate() {
            if self.held_len > 0 {
                let escape: Option<&[u8]> = match (self.held_len, self.held[0], b) {
                    (1, 0xC2, 0x85) => Some(br"\u0085"),
                    (1, 0xE2, 0x80) => {
                        self.held = [0xE2, 0x80];
                        self.held_len = 2;
                        start = i + 1;
                        continue;
                    }
                    (2, _, 0xA8) => Some(br"\u2028"),
                    (2, _, 0xA9) => Some(br"\u2029"),
                    _ => None,
                };
                let held = std::mem::take(&mut self.held_len);
                if let Some(escape) = escape {
                    self.out.write_all(escape)?;
                    start = i + 1;
                    continue;
                }
                // Another character: its bytes go on as they are. This
                // byte continues it, so none of the rules below applies.
                self.out.write_all(&self.held[..held])?;
                start = i;
                continue;
            }
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                    continue;
                }
                match b {
                    b'\\' => self.escaped = true,
                    b'"' => self.in_string = false,
                    0xC2 | 0xE2 => {
                        self.out.write_all(&buf[start..i])?;
                        self.held = [b, 0];
                        self.held_len = 1;
                        start = i + 1;
                    }
                    _ => {}
                }
            } else {
                match b {
                    b' ' | b'\t' | b'\n' | b'\r' => {
                        self.out.write_all(&buf[start..i])?;
                        start = i + 1;
                    }
                    b'"' => self.in_string = true,
                    _ => {}
                }
            }
        }
        self.out.write_all(&buf[start..])
    }
}

impl<W: Write> Write for OneLine<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.filter(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
#[path = "jsonl_tests.rs"]
mod tests;
