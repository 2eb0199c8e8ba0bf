//! The JSON-lines sink: one envelope per line, to stdout, a file or any writer.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::consumer::{Consumer, Delivery, Outcome};

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

/// Writes each envelope as one line of JSON ([`Envelope::to_json`] and a
/// newline), and reports [`Outcome::Delivered`] only once the line is
/// written and flushed (and, with `fsync`, synced to disk). A failed write
/// is a retry carrying the I/O error.
///
/// Deliveries from several worker threads are serialised by a mutex, so a
/// line never interleaves with another.
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
    label: String,
}

enum Target {
    Stdout,
    File {
        file: File,
        /// A failed write may have left part of a line behind that could not
        /// be cut off again; the next line then starts on a fresh line.
        dirty: bool,
    },
    Writer(Box<dyn Write + Send>),
}

impl JsonlSink {
    /// Writes to the process's standard output.
    pub fn stdout() -> JsonlSink {
        JsonlSink {
            target: Mutex::new(Target::Stdout),
            fsync: false,
            label: "stdout".to_string(),
        }
    }

    /// Appends to `path`, creating it if missing. With `fsync`, each line is
    /// synced to disk (`sync_data`) before the delivery counts as done.
    pub fn file(path: impl AsRef<Path>, fsync: bool) -> Result<JsonlSink, JsonlError> {
        let path = path.as_ref();
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| JsonlError::Open {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(JsonlSink {
            target: Mutex::new(Target::File { file, dirty: false }),
            fsync,
            label: path.display().to_string(),
        })
    }

    /// Writes to any writer (a socket, a pipe, a buffer in a test). Each line
    /// is written and flushed before the delivery counts as done.
    pub fn to_writer(writer: impl Write + Send + 'static) -> JsonlSink {
        JsonlSink {
            target: Mutex::new(Target::Writer(Box::new(writer))),
            fsync: false,
            label: "a writer".to_string(),
        }
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
            Target::File { file, dirty } => {
                if *dirty {
                    file.write_all(b"\n")?;
                    *dirty = false;
                }
                let before = file.metadata().map(|m| m.len()).ok();
                let result = file.write_all(line).and_then(|()| file.flush());
                let result = match result {
                    Ok(()) if self.fsync => file.sync_data(),
                    other => other,
                };
                if result.is_err() {
                    // Cut off a partial line so readers never see half an
                    // envelope; when that fails too, start the next one afresh.
                    let cut = before.map(|len| file.set_len(len).is_ok());
                    *dirty = cut != Some(true);
                }
                result
            }
        }
    }
}

impl Consumer for JsonlSink {
    fn deliver(&self, delivery: &Delivery) -> Outcome {
        let mut line = delivery.envelope.to_json().into_bytes();
        line.push(b'\n');
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
            .finish()
    }
}
