//! `[log]`: level and format of the log on stderr.

use serde::Deserialize;

use super::checker::Checker;

use super::error::ConfigError;

/// The log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub(crate) enum LogFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line.
    Json,
}

/// Logging settings from the `[log]` table; command-line flags win.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LogSettings {
    /// A level or tracing filter directive, already checked to parse.
    pub(crate) level: Option<String>,
    /// The output format.
    pub(crate) format: Option<LogFormat>,
}

/// `[log]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLog {
    level: Option<String>,
    format: Option<LogFormat>,
}

/// The log levels, as written.
const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Checks a log level or filter (`--log-level`, `[log] level`): one of the
/// levels, or comma-separated directives each of which is a level or
/// `target=level` (`info,outboxd=debug`). tracing would take a bare word
/// (`verbose`) as a target at every level, silently; a typo is refused.
///
/// The reason does not repeat the value (clap's message for `--log-level`
/// shows it already): "not a log level or filter; allowed: …".
pub(crate) fn check_level(level: &str) -> Result<(), String> {
    let allowed = "allowed: error, warn, info, debug, trace, off, or directives such as \
                   info,outboxd=debug";
    let directives: Vec<&str> = level.split(',').map(str::trim).collect();
    for d in &directives {
        let level_part = match d.rsplit_once('=') {
            Some((target, lvl)) if !target.is_empty() => lvl,
            _ => d,
        };
        if !LEVELS.contains(&level_part.to_ascii_lowercase().as_str()) {
            return Err(if directives.len() == 1 {
                format!("not a log level or filter; {allowed}")
            } else {
                format!("not a log level or filter ({d:?} is not one); {allowed}")
            });
        }
    }
    filter(level)
        .map(drop)
        .map_err(|e| format!("not a log level or filter ({e}); {allowed}"))
}

/// The filter a level or directive list (`info,outboxd=debug`) describes:
/// a default level and `target=level` pairs, the form RUST_LOG takes here
/// (span and field filters are not supported: their regex engine would
/// cost the static binary more than the rest of logging).
pub(crate) fn filter(
    level: &str,
) -> Result<tracing_subscriber::filter::Targets, tracing_subscriber::filter::ParseError> {
    level.parse()
}

/// Checks `[log]`.
pub(crate) fn check(c: &Checker<'_>, raw: &RawLog) -> Result<LogSettings, ConfigError> {
    if let Some(level) = &raw.level {
        check_level(level).map_err(|m| c.err("log.level", format!("{level:?} is {m}")))?;
    }
    Ok(LogSettings {
        level: raw.level.clone(),
        format: raw.format,
    })
}

#[cfg(test)]
mod tests {
    use super::check_level;

    #[test]
    fn levels_and_target_directives_pass_and_typos_do_not() {
        for ok in [
            "info",
            "DEBUG",
            "off",
            "info,outboxd=debug",
            "outboxd::relay=trace",
        ] {
            assert_eq!(check_level(ok), Ok(()), "{ok}");
        }
        for bad in [
            "verbose",
            "info,verbose",
            "outboxd=loud",
            "",
            "=info",
            "lo=ud=",
        ] {
            let e = check_level(bad).unwrap_err();
            assert!(e.contains("allowed: error, warn"), "{bad}: {e}");
        }
    }
}
