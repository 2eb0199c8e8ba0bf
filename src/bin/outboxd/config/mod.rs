//! `outboxd.toml` → a validated [`Config`], sinks constructed.
//!
//! Parsing and checking happen in two steps. serde (with
//! `deny_unknown_fields` everywhere) turns the text into raw structs, and a
//! typo or a wrong type is reported with its field path
//! (`consumer[1].sink.url`, found from the error's position: [`field_path`]). `check` then checks what
//! serde cannot: ranges, unique consumer names, event-type patterns, the
//! lease against every sink's timeout, and builds each sink, which finds a
//! missing program, a bad URL or a missing secret. Every failure is one
//! [`ConfigError`] naming the file, the field and what is allowed, before
//! the database is touched.
//!
//! Relative paths (the database, a JSONL file, a command program written
//! with a `/`, a secret file) are resolved against the config file's
//! directory, so a service's working directory does not matter.
//!
//! # Layout
//!
//! One file per section of the config, each holding the section's raw form
//! (as written, `Raw*`), its validated form, and the `check` that turns one
//! into the other: [`relay`], [`retry`], [`purge`], [`alerts`], [`log`],
//! [`metrics`], [`http`], [`consumer`], [`capture`] and, one file per kind,
//! [`sink`]. Beside them: this file, the loader (read, parse, the raw
//! file); `check` (the settings together, then the sinks); `checker` (what
//! every section's check takes); `error`, `values` (durations, bounded
//! numbers) and `secrets` (`*_env` keys).
//!
//! To add a section (`[http]`, `[[capture]]`): a file here with its raw
//! struct (`#[serde(deny_unknown_fields)]`) and a `check(&Checker, &Raw…)`,
//! a field in [`RawConfig`] and in [`Config`], and one line in `check`.
//! To add a sink kind, see [`sink`].
//!
//! packaging/outboxd.example.toml documents every key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use outboxd::purge::PurgePolicy;
use outboxd::relay::RelayBuilder;
use outboxd::status::Thresholds;
use outboxd::{Relay, RetryPolicy};
use serde::Deserialize;

pub(crate) mod alerts;
pub(crate) mod capture;
mod check;
mod checker;
pub(crate) mod consumer;
mod error;
mod field_path;
pub(crate) mod http;
pub(crate) mod log;
pub(crate) mod metrics;
pub(crate) mod purge;
pub(crate) mod relay;
pub(crate) mod retry;
mod secrets;
pub(crate) mod sink;
pub(crate) mod tracing;
mod values;

use check::{check_settings, validate, RelayWide};
use checker::Checker;
pub(crate) use consumer::ConsumerSpec;
pub(crate) use error::ConfigError;
use error::{in_words, line_of};
pub(crate) use http::{HttpServe, HttpSettings};
pub(crate) use log::{LogFormat, LogSettings};
pub(crate) use metrics::resolve_listen;
pub(crate) use relay::RelaySettings;
use secrets::secret_env_vars;

/// A validated configuration, sinks built.
#[derive(Debug)]
pub(crate) struct Config {
    /// The config file, None for the built-in default.
    pub(crate) file: Option<PathBuf>,
    /// The database (resolved against the config's directory).
    pub(crate) database: Option<PathBuf>,
    /// Relay tuning.
    pub(crate) relay: RelaySettings,
    /// The retry policy of consumers without their own.
    pub(crate) retry: RetryPolicy,
    /// The relay's TTL purge; None when disabled.
    pub(crate) purge: Option<PurgePolicy>,
    /// Alert thresholds.
    pub(crate) alerts: Thresholds,
    /// Logging.
    pub(crate) log: LogSettings,
    /// Where to serve Prometheus metrics.
    pub(crate) metrics: Option<SocketAddr>,
    /// `[http]`: the console, metrics and health check.
    pub(crate) http: HttpSettings,
    /// The consumers, at least one.
    pub(crate) consumers: Vec<ConsumerSpec>,
    /// The tables whose writes become events (`[[capture]]`).
    pub(crate) captures: Vec<outboxd::capture::CaptureSpec>,
    /// `[tracing]`: where `run` exports its spans; None when it does not
    /// (always, in a build without the `otlp` feature).
    #[cfg_attr(not(feature = "otlp"), allow(dead_code))]
    pub(crate) tracing: Option<tracing::TracingSettings>,
}

impl Config {
    /// The configuration of `outboxd run` without `--config`: one consumer
    /// named `stdout` taking every event type, writing JSON lines to stdout.
    pub(crate) fn stdout_default() -> Config {
        Config {
            file: None,
            database: None,
            relay: RelaySettings::default(),
            retry: RetryPolicy::default(),
            purge: Some(PurgePolicy::default()),
            alerts: alerts::without_config(),
            log: LogSettings::default(),
            metrics: None,
            http: HttpSettings::default(),
            consumers: vec![ConsumerSpec {
                name: "stdout".into(),
                types: vec!["*".into()],
                retry: RetryPolicy::default(),
                sink: sink::jsonl::stdout(false),
            }],
            captures: Vec::new(),
            tracing: None,
        }
    }

    /// Reads, parses and validates a config file.
    pub(crate) fn load(file: &Path) -> Result<Config, ConfigError> {
        Config::load_with_secret_env(file, &[])
    }

    /// [`Config::load`], where `also_secret` names environment variables
    /// given outside the file that hold secrets too (`--http-token-env`):
    /// command sinks keep them from their programs as they keep the file's
    /// own ([`secret_env_vars`]).
    pub(crate) fn load_with_secret_env(
        file: &Path,
        also_secret: &[&str],
    ) -> Result<Config, ConfigError> {
        Config::parse_with_secret_env(&read(file)?, file, also_secret)
    }

    /// Parses and validates config text said to come from `file` (relative
    /// paths inside are resolved against its directory).
    #[cfg(test)]
    pub(crate) fn parse(text: &str, file: &Path) -> Result<Config, ConfigError> {
        Config::parse_with_secret_env(text, file, &[])
    }

    fn parse_with_secret_env(
        text: &str,
        file: &Path,
        also_secret: &[&str],
    ) -> Result<Config, ConfigError> {
        let raw = parse_raw(text, file)?;
        let mut secret_vars = secret_env_vars(text);
        secret_vars.extend(also_secret.iter().map(|v| v.to_string()));
        validate(raw, file, &secret_vars)
    }

    /// A relay builder for `db` with every setting and consumer of this
    /// config, each attempt a span of `spans` when there is one. `build()`
    /// on it only fails for what [`Config::parse`] checked.
    pub(crate) fn relay_builder(self, db: &Path, spans: sink::Spans<'_>) -> RelayBuilder {
        let settings = RelayWide {
            relay: &self.relay,
            retry: &self.retry,
            purge: &self.purge,
            alerts: &self.alerts,
        };
        let mut b = settings.apply(Relay::builder(db));
        for c in self.consumers {
            b = c
                .sink
                .register(b, &c.name, &c.types, spans)
                .retry_policy_for(&c.name, c.retry);
        }
        b
    }

    /// Checks what only the database can tell: that every `sql` sink's
    /// statements prepare against `db` ([`sink::sql::check`]). Opens the
    /// database read-only, and only when there is a sql sink.
    pub(crate) fn check_database(&self, db: &Path) -> Result<(), ConfigError> {
        sink::sql::check(self, db)
    }
}

fn read(file: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(file).map_err(|e| ConfigError {
        file: file.to_path_buf(),
        field: String::new(),
        line: None,
        message: format!("cannot read the file: {e}"),
    })
}

// ---------------------------------------------------------------------------
// Raw, as written.

/// The whole file as written: one field per section.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    database: Option<PathBuf>,
    #[serde(default)]
    relay: relay::RawRelay,
    retry: Option<retry::RawRetry>,
    #[serde(default)]
    purge: purge::RawPurge,
    #[serde(default)]
    alerts: alerts::RawAlerts,
    #[serde(default)]
    log: log::RawLog,
    #[serde(default)]
    metrics: metrics::RawMetrics,
    #[serde(default)]
    http: http::RawHttp,
    #[serde(default)]
    consumer: Vec<consumer::RawConsumer>,
    #[serde(default)]
    capture: Vec<capture::RawCapture>,
    /// Only in a build with the `otlp` feature: without it `[tracing]` is
    /// an unknown field, refused with a word about the feature.
    #[cfg(feature = "otlp")]
    #[serde(default)]
    tracing: tracing::RawTracing,
}

fn parse_raw(text: &str, file: &Path) -> Result<RawConfig, ConfigError> {
    let syntax = |e: toml::de::Error| ConfigError {
        file: file.to_path_buf(),
        field: String::new(),
        line: e.span().map(|s| line_of(text, s.start)),
        message: e.message().trim().to_string(),
    };
    let de = toml::Deserializer::parse(text).map_err(syntax)?;
    RawConfig::deserialize(de).map_err(|e| {
        let line = e.span().map(|s| line_of(text, s.start));
        let field = e
            .span()
            .map_or_else(String::new, |s| field_path::at(text, s.start));
        let message = e.message().trim();
        // `[consumer]` (one pair of brackets) is a table where a list of
        // tables is wanted: the usual slip, said in TOML's terms.
        let message = if field == "consumer" && message.starts_with("invalid type: map") {
            "is a single table; write each consumer as [[consumer]] (two pairs of brackets: \
             one table per consumer), and its sink as [consumer.sink]"
                .to_string()
        } else if cfg!(not(feature = "otlp"))
            && field == "tracing"
            && message.starts_with("unknown field")
        {
            tracing::WITHOUT_OTLP.to_string()
        } else {
            in_words(message)
        };
        ConfigError {
            file: file.to_path_buf(),
            field,
            line,
            message,
        }
    })
}

/// What the operator commands (`status`, `replay`, `purge`…) take from a config
/// file, read by [`Config::load_without_sinks`].
#[derive(Debug, Clone)]
pub(crate) struct Summary {
    /// The database, when the file names one.
    pub(crate) database: Option<PathBuf>,
    /// The `[alerts]` thresholds.
    pub(crate) alerts: Thresholds,
    /// The consumers' names.
    pub(crate) consumers: Vec<String>,
    /// The event types (or patterns) each consumer takes, in the same order.
    pub(crate) consumer_types: Vec<Vec<String>>,
    /// `[http]`.
    pub(crate) http: HttpSettings,
    /// `[log]`.
    pub(crate) log: LogSettings,
    /// `[purge]`'s retentions (whether or not `enabled = false` turns the
    /// relay's own purge off).
    pub(crate) purge: purge::Retentions,
}

impl Config {
    /// Reads a config file for an operator command: checked as
    /// `check-config` checks it, except that its sinks are not built, so no
    /// secret needs to be set and no file is created.
    pub(crate) fn load_without_sinks(file: &Path) -> Result<Summary, ConfigError> {
        let text = read(file)?;
        let raw = parse_raw(&text, file)?;
        let s = check_settings(&Checker::new(file), &raw)?;
        Ok(Summary {
            database: s.database,
            alerts: s.alerts,
            consumers: raw.consumer.iter().map(|c| c.name.clone()).collect(),
            consumer_types: raw.consumer.iter().map(|c| c.types.clone()).collect(),
            http: s.http,
            log: s.log,
            purge: purge::retentions(&raw.purge),
        })
    }
}

impl Config {
    /// Reads the captures of a config file ([`capture::CaptureConfig`]).
    pub(crate) fn load_captures(file: &Path) -> Result<capture::CaptureConfig, ConfigError> {
        let raw = parse_raw(&read(file)?, file)?;
        let c = Checker::new(file);
        Ok(capture::CaptureConfig {
            file: file.to_path_buf(),
            database: check::database(&c, &raw.database)?,
            captures: capture::check(&c, raw.capture, raw.relay.max_payload_bytes)?,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests;
