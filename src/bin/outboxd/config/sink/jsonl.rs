//! `kind = "jsonl"`: one JSON line per event, to stdout or a file.

use outboxd::sinks::JsonlSink;

use super::{RawSink, Sink};
use crate::config::checker::Checker;
use crate::config::error::ConfigError;

/// The keys a jsonl sink takes.
pub(crate) const KEYS: &[&str] = &["kind", "path", "fsync", "delivery_fields"];

/// JSON lines on stdout: the sink of `outboxd run` without a config (no
/// delivery fields), and of `path = "-"`.
pub(crate) fn stdout(delivery_fields: bool) -> Sink {
    Sink::new(
        JsonlSink::stdout().delivery_fields(delivery_fields),
        describe("stdout", delivery_fields),
    )
}

/// "jsonl TARGET", and whether lines carry the delivery fields.
fn describe(target: &str, delivery_fields: bool) -> String {
    let fields = if delivery_fields {
        " with tenant_id and legacy"
    } else {
        ""
    };
    format!("jsonl {target}{fields}")
}

/// Builds a jsonl sink.
pub(crate) fn build(c: &Checker<'_>, at: &str, s: &RawSink) -> Result<Sink, ConfigError> {
    let delivery_fields = s.delivery_fields == Some(true);
    let path = s.path.as_ref().ok_or_else(|| {
        c.err(
            format!("{at}.path"),
            "is missing; a jsonl sink needs path = \"-\" (stdout) or a file",
        )
    })?;
    if path.as_os_str().is_empty() {
        return Err(c.err(
            format!("{at}.path"),
            "is empty; give path = \"-\" (stdout) or a file",
        ));
    }
    if path.as_os_str() == "-" {
        if s.fsync == Some(true) {
            return Err(c.err(
                format!("{at}.fsync"),
                "cannot sync stdout; use fsync only with a file path",
            ));
        }
        return Ok(stdout(delivery_fields));
    }
    let file = c.resolve(path);
    let fsync = s.fsync.unwrap_or(false);
    let sink = JsonlSink::file(&file, fsync)
        .map_err(|e| c.err(format!("{at}.path"), e.to_string()))?
        .delivery_fields(delivery_fields);
    let target = format!("{}{}", file.display(), if fsync { " (fsync)" } else { "" });
    Ok(Sink::new(sink, describe(&target, delivery_fields)))
}
