//! `[log]`: level and format of the log on stderr.

use serde::Deserialize;

use super::{Checker, ConfigError};

/// The log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line.
    Json,
}

/// Logging settings from the `[log]` table; command-line flags win.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogSettings {
    /// A level or tracing filter directive, already checked to parse.
    pub level: Option<String>,
    /// The output format.
    pub format: Option<LogFormat>,
}

/// `[log]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLog {
    level: Option<String>,
    format: Option<LogFormat>,
}

/// Checks `[log]`.
pub fn check(c: &Checker<'_>, raw: RawLog) -> Result<LogSettings, ConfigError> {
    if let Some(level) = &raw.level {
        tracing_subscriber::EnvFilter::try_new(level).map_err(|e| {
            c.err(
                "log.level",
                format!(
                    "{level:?} is not a log level or filter ({e}); allowed: error, warn, \
                     info, debug, trace, or directives such as \"info,outboxd=debug\""
                ),
            )
        })?;
    }
    Ok(LogSettings {
        level: raw.level,
        format: raw.format,
    })
}
