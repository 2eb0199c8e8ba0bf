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
/// the event's `tenant_id` and `legacy` flag after the envelope's fields.
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
    delivery_fields: bool,
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
            delivery_fields: false,
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

    /// Adds `"tenant_id"` (a string, or null) and `"legacy"` (true for a
    /// row written without an event id) to each line, after the envelope's
    /// fields. Off by default: each line is then exactly an envelope (which
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

    /// The line written for one delivery, newline included.
    fn line(&self, delivery: &Delivery) -> Vec<u8> {
        let mut json = delivery.envelope.to_json();
        if self.delivery_fields {
            // The envelope is a JSON object: its last byte is its closing brace.
            json.pop();
            json.push_str(",\"tenant_id\":");
            json.push_str(
                &serde_json::to_string(&delivery.tenant_id).expect("a string always serializes"),
            );
            json.push_str(",\"legacy\":");
            json.push_str(if delivery.legacy { "true}" } else { "false}" });
        }
        let mut line = one_line(&json).into_bytes();
        line.push(b'\n');
        line
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
        match self.write_line(&self.line(delivery)) {
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

/// Valid JSON text re-encoded on one line: whitespace between tokens is
/// dropped, and the characters some readers take for line breaks (U+0085,
/// U+2028, U+2029; the others are control characters, which JSON strings
/// never hold raw) are escaped inside strings. Everything else is copied
/// as it is, so the value is unchanged (no number is re-parsed, no key
/// reordered). The input must be valid JSON, as an envelope always is.
fn one_line(json: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(json.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in json.chars() {
        if !in_string {
            match c {
                ' ' | '\t' | '\n' | '\r' => {}
                '"' => {
                    in_string = true;
                    out.push(c);
                }
                c => out.push(c),
            }
            continue;
        }
        match c {
            _ if escaped => {
                escaped = false;
                out.push(c);
            }
            '\\' => {
                escaped = true;
                out.push(c);
            }
            '"' => {
                in_string = false;
                out.push(c);
            }
            '\u{85}' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn one_line_keeps_the_value_and_drops_the_layout() {
        let pretty = "{\n  \"a b\" : [ 1 ,\t2.50e3 ],\r\n  \"s\": \"x \\\" \\n y\u{2028}z\u{85}\",\n  \"n\": 123456789012345678901234567890\n}";
        let line = one_line(pretty);
        assert_eq!(
            line,
            r#"{"a b":[1,2.50e3],"s":"x \" \n y\u2028z\u0085","n":123456789012345678901234567890}"#
        );
        let a: serde_json::Value = serde_json::from_str(pretty).unwrap();
        let b: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(a, b);
        // Compact JSON without those characters is left as it is.
        let compact = r#"{"id":7,"text":"caf\u00e9 ok","list":[true,false,null]}"#;
        assert_eq!(one_line(compact), compact);
    }
}
