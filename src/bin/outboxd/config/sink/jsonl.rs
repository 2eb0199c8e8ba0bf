//! `kind = "jsonl"`: one JSON line per event, to stdout or a file.

use outboxd::sinks::JsonlSink;

use super::{RawSink, Sink};
use crate::config::{Checker, ConfigError};

/// The keys a jsonl sink takes.
pub const KEYS: &[&str] = &["kind", "path", "fsync"];

/// The sink of `outboxd run` without a config: JSON lines on stdout.
pub fn stdout() -> Sink {
    Sink::new(JsonlSink::stdout(), "jsonl stdout")
}

/// Builds a jsonl sink.
pub fn build(c: &Checker<'_>, at: &str, s: &RawSink) -> Result<Sink, ConfigError> {
    let path = s.path.as_ref().ok_or_else(|| {
        c.err(
            format!("{at}.path"),
            "is missing; a jsonl sink needs path = \"-\" (stdout) or a file",
        )
    })?;
    if path.as_os_str() == "-" {
        if s.fsync == Some(true) {
            return Err(c.err(
                format!("{at}.fsync"),
                "cannot sync stdout; use fsync only with a file path",
            ));
        }
        return Ok(stdout());
    }
    let file = c.resolve(path);
    let fsync = s.fsync.unwrap_or(false);
    let sink =
        JsonlSink::file(&file, fsync).map_err(|e| c.err(format!("{at}.path"), e.to_string()))?;
    let target = format!("{}{}", file.display(), if fsync { " (fsync)" } else { "" });
    Ok(Sink::new(sink, format!("jsonl {target}")))
}
