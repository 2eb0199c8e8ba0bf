//! `kind = "command"`: a child program per event, the envelope on stdin.

use std::path::Path;

use outboxd::sinks::CommandSink;

use super::{positive, RawSink, Sink};
use crate::config::checker::Checker;
use crate::config::error::ConfigError;
use outboxd::clock::format_duration as human;

/// The keys a command sink takes.
pub(crate) const KEYS: &[&str] = &[
    "kind",
    "program",
    "args",
    "timeout",
    "poison_exit_code",
    "env",
    "clear_env",
];

/// Builds a command sink; a program that cannot be found or run is an
/// error at `program`. The program does not inherit `secret_vars`, the
/// variables the config reads secrets from.
pub(crate) fn build(
    c: &Checker<'_>,
    at: &str,
    s: &RawSink,
    secret_vars: &[String],
) -> Result<Sink, ConfigError> {
    let program = s.program.as_ref().ok_or_else(|| {
        c.err(
            format!("{at}.program"),
            "is missing; a command sink needs a program (a path, or a name looked up in PATH)",
        )
    })?;
    let resolved = if program.contains('/') {
        c.resolve(Path::new(program)).into_os_string()
    } else {
        program.into()
    };
    let mut sink = CommandSink::new(resolved, s.args.iter().flatten())
        .map_err(|e| c.err(format!("{at}.program"), e.to_string()))?;
    if let Some(t) = positive(c, at, "timeout", s.timeout)? {
        sink = sink.timeout(t);
    }
    if let Some(code) = s.poison_exit_code {
        sink = sink.poison_exit_code(code);
    }
    if s.clear_env == Some(true) {
        sink = sink.env_clear();
    }
    sink = sink.env_remove(secret_vars);
    for (k, v) in s.env.iter().flatten() {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(c.err(
                format!("{at}.env.{k}"),
                "names must be non-empty without = or NUL, values without NUL",
            ));
        }
        sink = sink.env(k, v);
    }
    let description = format!(
        "command {} (timeout {}, poison exit code {})",
        sink.program().display(),
        human(sink.time_limit()),
        sink.poison_code()
    );
    let limit = sink.time_limit();
    Ok(Sink::new(sink, description).with_time_limit(limit))
}
