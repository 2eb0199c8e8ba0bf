//! `outboxd.toml` → a validated [`Config`], sinks constructed.
//!
//! Parsing and checking happen in two steps. serde (with
//! `deny_unknown_fields` everywhere, wrapped by `serde_path_to_error`) turns
//! the text into raw structs, so a typo or a wrong type is reported with
//! its field path (`consumer[1].sink.url`). [`validate`] then checks what
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
//! [`sink`].
//!
//! To add a section (`[http]`, `[[capture]]`): a file here with its raw
//! struct (`#[serde(deny_unknown_fields)]`) and a `check(&Checker, &Raw…)`,
//! a field in [`RawConfig`] and in [`Config`], and one line in [`validate`].
//! To add a sink kind, see [`sink`].
//!
//! packaging/outboxd.example.toml documents every key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use outboxd::error::{Setting, SettingError};
use outboxd::purge::PurgePolicy;
use outboxd::relay::RelayBuilder;
use outboxd::status::Thresholds;
use outboxd::{Delivery, Outcome, Relay, RetryPolicy};
use serde::Deserialize;

use crate::args::parse_duration;

pub mod alerts;
pub mod capture;
pub mod consumer;
pub mod http;
pub mod log;
pub mod metrics;
pub mod purge;
pub mod relay;
pub mod retry;
pub mod sink;

pub use consumer::ConsumerSpec;
pub use http::{HttpServe, HttpSettings};
pub use log::{LogFormat, LogSettings};
pub use metrics::resolve_listen;
pub use relay::RelaySettings;

/// A config file is unusable: which file, which field, what is wrong and
/// what is allowed. Never holds a secret's value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.render())]
pub struct ConfigError {
    /// The config file.
    pub file: PathBuf,
    /// The field path, such as `consumer[1].sink.url`; empty for a syntax
    /// error outside any field.
    pub field: String,
    /// The line the problem is on, when the parser knows it.
    pub line: Option<usize>,
    /// What is wrong and what is allowed.
    pub message: String,
}

impl ConfigError {
    fn render(&self) -> String {
        let mut s = format!("config {}", self.file.display());
        if let Some(line) = self.line {
            s.push_str(&format!(", line {line}"));
        }
        if !self.field.is_empty() {
            s.push_str(&format!(": {}", self.field));
        }
        s.push_str(": ");
        s.push_str(&self.message);
        s
    }
}

/// A validated configuration, sinks built.
#[derive(Debug)]
pub struct Config {
    /// The config file, None for the built-in default.
    pub file: Option<PathBuf>,
    /// The database (resolved against the config's directory).
    pub database: Option<PathBuf>,
    /// Relay tuning.
    pub relay: RelaySettings,
    /// The retry policy of consumers without their own.
    pub retry: RetryPolicy,
    /// The relay's TTL purge; None when disabled.
    pub purge: Option<PurgePolicy>,
    /// Alert thresholds.
    pub alerts: Thresholds,
    /// Logging.
    pub log: LogSettings,
    /// Where to serve Prometheus metrics.
    pub metrics: Option<SocketAddr>,
    /// `[http]`: the console, metrics and health check.
    pub http: HttpSettings,
    /// The consumers, at least one.
    pub consumers: Vec<ConsumerSpec>,
    /// The tables whose writes become events (`[[capture]]`).
    pub captures: Vec<outboxd::capture::CaptureSpec>,
}

impl Config {
    /// The configuration of `outboxd run` without `--config`: one consumer
    /// named `stdout` taking every event type, writing JSON lines to stdout.
    pub fn stdout_default() -> Config {
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
        }
    }

    /// Reads, parses and validates a config file.
    pub fn load(file: &Path) -> Result<Config, ConfigError> {
        Config::load_with_secret_env(file, &[])
    }

    /// [`Config::load`], where `also_secret` names environment variables
    /// given outside the file that hold secrets too (`--http-token-env`):
    /// command sinks keep them from their programs as they keep the file's
    /// own ([`secret_env_vars`]).
    pub fn load_with_secret_env(file: &Path, also_secret: &[&str]) -> Result<Config, ConfigError> {
        Config::parse_with_secret_env(&read(file)?, file, also_secret)
    }

    /// Parses and validates config text said to come from `file` (relative
    /// paths inside are resolved against its directory).
    #[cfg(test)]
    pub fn parse(text: &str, file: &Path) -> Result<Config, ConfigError> {
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
    /// config. `build()` on it only fails for what [`Config::parse`] checked.
    pub fn relay_builder(self, db: &Path) -> RelayBuilder {
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
                .register(b, &c.name, &c.types)
                .retry_policy_for(&c.name, c.retry);
        }
        b
    }

    /// Checks what only the database can tell: that every `sql` sink's
    /// statements prepare against `db` ([`sink::sql::check`]). Opens the
    /// database read-only, and only when there is a sql sink.
    pub fn check_database(&self, db: &Path) -> Result<(), ConfigError> {
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

/// A duration written as `500ms`, `30s`, `5m`, `2h` or `1d`.
#[derive(Debug, Clone, Copy)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Dur, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Dur;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a duration in quotes, such as \"30s\"")
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Dur, E> {
                parse_duration(s).map(Dur).map_err(E::custom)
            }
        }
        d.deserialize_str(Visitor)
    }
}

/// A whole number from `LO` to `HI` (`u64::MAX`: no upper bound), the
/// range the setting allows (the library's constants): a wrong type or a
/// number outside it is refused while parsing, with the line, in the
/// setting's own range ("expected a whole number from 1 to 1000"), not the
/// range of the Rust type that holds it.
#[derive(Debug, Clone, Copy)]
pub struct Whole<const LO: u64, const HI: u64>(pub u64);

impl<const LO: u64, const HI: u64> Whole<LO, HI> {
    /// The value as a `usize` (every bound outboxd uses fits in one).
    pub fn get(self) -> usize {
        usize::try_from(self.0).unwrap_or(usize::MAX)
    }
}

impl<'de, const LO: u64, const HI: u64> Deserialize<'de> for Whole<LO, HI> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor<const LO: u64, const HI: u64>;
        impl<const LO: u64, const HI: u64> serde::de::Visitor<'_> for Visitor<LO, HI> {
            type Value = Whole<LO, HI>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                if HI == u64::MAX {
                    write!(f, "a whole number ({LO} or more)")
                } else {
                    write!(f, "a whole number from {LO} to {HI}")
                }
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Self::Value, E> {
                if (LO..=HI).contains(&n) {
                    Ok(Whole(n))
                } else {
                    Err(E::invalid_value(serde::de::Unexpected::Unsigned(n), &self))
                }
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Self::Value, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(E::invalid_value(serde::de::Unexpected::Signed(n), &self)),
                }
            }
            // TOML hands over a number past 64 bits as 128 bits: out of
            // range, said with the number as written.
            fn visit_i128<E: serde::de::Error>(self, n: i128) -> Result<Self::Value, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(too_large(n, &self)),
                }
            }
            fn visit_u128<E: serde::de::Error>(self, n: u128) -> Result<Self::Value, E> {
                match u64::try_from(n) {
                    Ok(n) => self.visit_u64(n),
                    Err(_) => Err(too_large(n, &self)),
                }
            }
        }
        fn too_large<E: serde::de::Error>(
            n: impl std::fmt::Display,
            expected: &dyn serde::de::Expected,
        ) -> E {
            let found = format!("integer `{n}`");
            E::invalid_value(serde::de::Unexpected::Other(&found), expected)
        }
        d.deserialize_u64(Visitor::<LO, HI>)
    }
}

/// The whole file as written: one field per section.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
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
}

fn parse_raw(text: &str, file: &Path) -> Result<RawConfig, ConfigError> {
    let syntax = |e: toml::de::Error| ConfigError {
        file: file.to_path_buf(),
        field: String::new(),
        line: e.span().map(|s| line_of(text, s.start)),
        message: e.message().trim().to_string(),
    };
    let de = toml::Deserializer::parse(text).map_err(syntax)?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.message().trim();
        // `[consumer]` (one pair of brackets) is a table where a list of
        // tables is wanted: the usual slip, said in TOML's terms.
        let message = if field == "consumer" && message.starts_with("invalid type: map") {
            "is a single table; write each consumer as [[consumer]] (two pairs of brackets: \
             one table per consumer), and its sink as [consumer.sink]"
                .to_string()
        } else {
            in_words(message)
        };
        ConfigError {
            file: file.to_path_buf(),
            field: if field == "." { String::new() } else { field },
            line: inner.span().map(|s| line_of(text, s.start)),
            message,
        }
    })
}

/// serde's "invalid type: integer `3`, expected usize" in words a person
/// who writes TOML reads: "expected a whole number (0 or more), found 3".
/// Other messages (unknown field, missing field, unknown variant) already
/// are, and pass through.
fn in_words(message: &str) -> String {
    let (rest, is_value) = match (
        message.strip_prefix("invalid type: "),
        message.strip_prefix("invalid value: "),
    ) {
        (Some(rest), _) => (rest, false),
        (None, Some(rest)) => (rest, true),
        _ => return message.to_string(),
    };
    let Some((found, expected)) = rest.rsplit_once(", expected ") else {
        return message.to_string();
    };
    // A number past 64 bits reaches serde as 128 bits, "integer `N` as
    // i128": for a whole-number setting, a value out of range.
    let wide = found
        .strip_suffix(" as i128")
        .or_else(|| found.strip_suffix(" as u128"));
    let found = wide.unwrap_or(found);
    let whole = |lo: &str, hi: &str| format!("a whole number from {lo} to {hi}");
    let want = match expected {
        "u8" => whole("0", "255"),
        "u16" => whole("0", "65535"),
        "u32" => whole("0", "4294967295"),
        "u64" | "usize" => "a whole number (0 or more)".to_string(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number".to_string(),
        "f32" | "f64" => "a number, such as 0.5".to_string(),
        "a boolean" => "true or false".to_string(),
        "a string" | "path string" => "text in quotes".to_string(),
        "a sequence" => "a list, such as [\"a\", \"b\"]".to_string(),
        "a map" => "a table, such as { name = \"value\" }".to_string(),
        s if s.starts_with("struct ") => "a table".to_string(),
        other => other.to_string(),
    };
    let number = |s: &str| {
        s.strip_suffix('`')
            .and_then(|s| s.split_once(" `"))
            .map(|(_, n)| n.to_string())
    };
    if is_value || (wide.is_some() && want.starts_with("a whole number")) {
        if let Some(n) = found
            .starts_with("integer `")
            .then(|| number(found))
            .flatten()
        {
            return format!("{n} is out of range; expected {want}");
        }
    }
    let found = match found {
        "sequence" => "a list".to_string(),
        "map" => "a table".to_string(),
        f if f.starts_with("integer `") => {
            format!("the whole number {}", number(f).unwrap_or_default())
        }
        f if f.starts_with("floating point `") => {
            format!("the number {}", number(f).unwrap_or_default())
        }
        f if f.starts_with("boolean `") => number(f).unwrap_or_default(),
        f => match f.strip_prefix("string ") {
            Some(text) => format!("the text {text}"),
            None => f.to_string(),
        },
    };
    format!("expected {want}, found {found}")
}

/// The 1-based line holding byte `offset`.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

// ---------------------------------------------------------------------------
// Validation.

/// Where `*_env` keys are looked up.
pub type Env<'a> = &'a dyn Fn(&str) -> Result<String, std::env::VarError>;

/// The process's own environment, as an [`Env`].
pub fn process_env(var: &str) -> Result<String, std::env::VarError> {
    std::env::var(var)
}

/// What every section's `check` needs: the file (for errors), its
/// directory (for relative paths) and the environment (for `*_env` keys:
/// the process's, or a unit test's own, so no test has to change the
/// process environment under the others' feet).
pub struct Checker<'a> {
    file: &'a Path,
    dir: PathBuf,
    env: Env<'a>,
}

impl<'a> Checker<'a> {
    fn new(file: &'a Path) -> Checker<'a> {
        Checker::with_env(file, &process_env)
    }

    fn with_env(file: &'a Path, env: Env<'a>) -> Checker<'a> {
        let dir = file
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        Checker { file, dir, env }
    }

    /// Where `*_env` keys are looked up (read them with
    /// [`secret_from_env`]).
    pub fn env_lookup(&self) -> Env<'a> {
        self.env
    }

    /// An error at `field` (a path such as `consumer[0].sink.url`).
    pub fn err(&self, field: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_path_buf(),
            field: field.into(),
            line: None,
            message: message.into(),
        }
    }

    /// A path from the config, resolved against the config file's directory.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.dir.join(p)
        }
    }
}

/// An environment variable that should hold a secret does not. Never
/// holds the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretEnvError {
    /// The variable is not set.
    #[error("environment variable {var} is not set; set it to {what}")]
    NotSet {
        /// The variable.
        var: String,
        /// What it should hold.
        what: String,
    },
    /// Its value is not UTF-8.
    #[error("environment variable {var} is not valid UTF-8; set it to {what}")]
    NotUnicode {
        /// The variable.
        var: String,
        /// What it should hold.
        what: String,
    },
    /// Its value is empty or only whitespace.
    #[error("environment variable {var} is empty; set it to {what}")]
    Empty {
        /// The variable.
        var: String,
        /// What it should hold.
        what: String,
    },
}

/// A secret from the environment variable `var` as `env` looks it up
/// ([`process_env`], or a test's own), which should hold `what` (said in
/// the error): unset, non-UTF-8 and empty values are refused. The one
/// reader of secrets from the environment (the sinks' `*_env` keys, the
/// console's token).
pub fn secret_from_env(env: Env<'_>, var: &str, what: &str) -> Result<String, SecretEnvError> {
    let (var, what) = (var.to_string(), what.to_string());
    match env(&var) {
        Ok(value) if value.trim().is_empty() => Err(SecretEnvError::Empty { var, what }),
        Ok(value) => Ok(value),
        Err(std::env::VarError::NotPresent) => Err(SecretEnvError::NotSet { var, what }),
        Err(std::env::VarError::NotUnicode(_)) => Err(SecretEnvError::NotUnicode { var, what }),
    }
}

/// Every environment variable the config text names as holding a secret:
/// the value of every key whose name ends in `_env` (a variable's name, or
/// a list of them), in any section: `[http] token_env`, a webhook's
/// `secret_env` and `secrets_env`, nats' `token_env` and `password_env`,
/// and whatever such key a section adds later. Command sinks keep them all
/// from their programs. (The naming rule is the contract: a new key that
/// reads a secret from the environment is named `*_env`.) Text that does
/// not parse names none; [`parse_raw`] reports it.
pub fn secret_env_vars(text: &str) -> Vec<String> {
    fn walk(value: &toml::Value, key: Option<&str>, out: &mut Vec<String>) {
        let names_vars = key.is_some_and(|k| k.ends_with("_env"));
        match value {
            toml::Value::String(name) if names_vars => out.push(name.clone()),
            toml::Value::Array(items) => {
                for item in items {
                    walk(item, key, out);
                }
            }
            toml::Value::Table(table) => {
                for (k, v) in table {
                    walk(v, Some(k), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Ok(table) = text.parse::<toml::Table>() {
        walk(&toml::Value::Table(table), None, &mut out);
    }
    out.sort();
    out.dedup();
    out
}

fn validate(raw: RawConfig, file: &Path, secret_vars: &[String]) -> Result<Config, ConfigError> {
    validate_in(raw, &Checker::new(file), secret_vars)
}

/// Checks `raw` with `c`; command sinks keep `secret_vars` (the config's
/// [`secret_env_vars`] and any given outside it) from their programs.
fn validate_in(
    raw: RawConfig,
    c: &Checker<'_>,
    secret_vars: &[String],
) -> Result<Config, ConfigError> {
    let file = c.file;
    let s = check_settings(c, &raw)?;
    let captures = capture::check(c, raw.capture)?;
    let consumers = consumer::build(c, raw.consumer, s.relay.lease, &s.retry, secret_vars)?;
    Ok(Config {
        file: Some(file.to_path_buf()),
        database: s.database,
        relay: s.relay,
        retry: s.retry,
        purge: s.purge,
        alerts: s.alerts,
        log: s.log,
        metrics: s.metrics,
        http: s.http,
        consumers,
        captures,
    })
}

/// What the operator commands (`status`, `replay`, `purge`…) take from a config
/// file, read by [`Config::load_without_sinks`].
#[derive(Debug, Clone)]
pub struct Summary {
    /// The database, when the file names one.
    pub database: Option<PathBuf>,
    /// The `[alerts]` thresholds.
    pub alerts: Thresholds,
    /// The consumers' names.
    pub consumers: Vec<String>,
    /// The event types (or patterns) each consumer takes, in the same order.
    pub consumer_types: Vec<Vec<String>>,
    /// `[http]`.
    pub http: HttpSettings,
    /// `[log]`.
    pub log: LogSettings,
    /// `[purge]`'s retentions (whether or not `enabled = false` turns the
    /// relay's own purge off).
    pub purge: purge::Retentions,
}

impl Config {
    /// Reads a config file for an operator command: checked as
    /// `check-config` checks it, except that its sinks are not built, so no
    /// secret needs to be set and no file is created.
    pub fn load_without_sinks(file: &Path) -> Result<Summary, ConfigError> {
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

/// A config's settings, checked: everything but the sinks.
struct Settings {
    database: Option<PathBuf>,
    relay: RelaySettings,
    retry: RetryPolicy,
    purge: Option<PurgePolicy>,
    alerts: Thresholds,
    log: LogSettings,
    metrics: Option<SocketAddr>,
    http: HttpSettings,
}

/// Checks `database`: a path, resolved against the config's directory.
fn database(c: &Checker<'_>, raw: &Option<PathBuf>) -> Result<Option<PathBuf>, ConfigError> {
    match raw {
        Some(p) if p.as_os_str().is_empty() => {
            Err(c.err("database", "is empty; give the SQLite file's path"))
        }
        Some(p) => Ok(Some(c.resolve(p))),
        None => Ok(None),
    }
}

fn check_settings(c: &Checker<'_>, raw: &RawConfig) -> Result<Settings, ConfigError> {
    let database = database(c, &raw.database)?;
    let relay = relay::check(c, &raw.relay)?;
    let retry = raw.retry.as_ref().map_or_else(RetryPolicy::default, |t| {
        retry::apply(t, RetryPolicy::default())
    });
    let purge = purge::policy(&raw.purge);
    // A lease or retry further ahead than these settings put them is a
    // clock step (status --config judges by them).
    let longest_retry_wait = raw
        .consumer
        .iter()
        .map(|rc| rc.retry_policy(&retry).longest_wait())
        .max()
        .unwrap_or_else(|| retry.longest_wait());
    let alerts = alerts::thresholds(&raw.alerts).relay_settings(relay.lease, longest_retry_wait);
    let log = log::check(c, &raw.log)?;
    let metrics = metrics::check(c, &raw.metrics)?;
    let http = http::check(c, &raw.http)?;
    if let Some(console) = http.listen {
        http::distinct_from_metrics(console, metrics)
            .map_err(|e| c.err(e.field(), e.to_string()))?;
    }
    let settings = RelayWide {
        relay: &relay,
        retry: &retry,
        purge: &purge,
        alerts: &alerts,
    };
    check_with_library(c, &settings, &raw.consumer)?;
    Ok(Settings {
        database,
        relay,
        retry,
        purge,
        alerts,
        log,
        metrics,
        http,
    })
}

/// The relay-wide settings of a config, as the relay builder takes them.
struct RelayWide<'a> {
    relay: &'a RelaySettings,
    retry: &'a RetryPolicy,
    purge: &'a Option<PurgePolicy>,
    alerts: &'a Thresholds,
}

impl RelayWide<'_> {
    /// `b` with every relay-wide setting applied.
    fn apply(&self, b: RelayBuilder) -> RelayBuilder {
        let mut b = b
            .lease(self.relay.lease)
            .unrouted(self.relay.unrouted)
            .retry_policy(self.retry.clone())
            .stale_after(self.alerts.stale_after)
            .purge(self.purge.clone());
        if let Some(n) = self.relay.workers {
            b = b.workers(n);
        }
        if let Some(n) = self.relay.batch_size {
            b = b.batch_size(n);
        }
        if let Some(n) = self.relay.batch_bytes {
            b = b.batch_bytes(n);
        }
        if let Some(n) = self.relay.max_payload_bytes {
            b = b.max_payload_bytes(n);
        }
        if let Some(d) = self.relay.poll_interval {
            b = b.poll_interval(d);
        }
        b
    }
}

/// Lets the library judge the settings and the consumers' names, types and
/// retry policies (the rules live in `RelayBuilder::build` alone), before
/// any sink is built: a relay is built, not started, with a stand-in
/// consumer for each, and its error is reported at the config's field.
fn check_with_library(
    c: &Checker<'_>,
    settings: &RelayWide<'_>,
    consumers: &[consumer::RawConsumer],
) -> Result<(), ConfigError> {
    // `build` does not open the database; the path is never used.
    let mut b = settings.apply(Relay::builder("outboxd.db"));
    for rc in consumers {
        let stand_in = |_: &Delivery| Outcome::Delivered;
        b = b
            .consumer(&rc.name, &rc.types, stand_in)
            .retry_policy_for(&rc.name, rc.retry_policy(settings.retry));
    }
    match b.build() {
        Ok(_) => Ok(()),
        Err(outboxd::Error::InvalidSetting(e)) => Err(setting_error(c, &e)),
        // `build` documents no other error; should one come, it is about
        // the relay's settings as a whole, and said at that section.
        Err(other) => Err(c.err(
            "relay",
            format!("the relay refused these settings: {other}"),
        )),
    }
}

/// The library's verdict on a setting, at the config field that holds it.
fn setting_error(c: &Checker<'_>, e: &SettingError) -> ConfigError {
    let consumer = e.consumer_position().map(|p| format!("consumer[{p}]"));
    let name = e.setting().as_str();
    let field = match e.setting() {
        Setting::Workers
        | Setting::BatchSize
        | Setting::BatchBytes
        | Setting::MaxPayloadBytes
        | Setting::Lease
        | Setting::PollInterval => format!("relay.{name}"),
        Setting::StaleAfter => format!("alerts.{name}"),
        // The library's reason speaks of registering; a config adds a block.
        Setting::Consumers => {
            return c.err(
                "consumer",
                "the config has no consumer; add a [[consumer]] with a name, types and a \
                 [consumer.sink]",
            )
        }
        Setting::ConsumerName => format!("{}.name", consumer.unwrap_or_default()),
        Setting::ConsumerTypes => match e.index() {
            Some(i) => format!("{}.types[{i}]", consumer.unwrap_or_default()),
            None => format!("{}.types", consumer.unwrap_or_default()),
        },
        Setting::RetryInitial
        | Setting::RetryMaxDelay
        | Setting::RetryMaxAttempts
        | Setting::RetryJitter => match consumer {
            Some(at) => format!("{at}.{name}"),
            None => name.to_string(),
        },
        // purge.dedup_ttl, purge.batch_size: the config's own names.
        _ => name.to_string(),
    };
    c.err(field, e.reason())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::relay::DEFAULT_SHUTDOWN_GRACE;
    use super::*;

    pub(crate) fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/outboxd/outboxd.toml"))
    }

    /// [`parse`] with `vars` as the whole environment.
    pub(crate) fn parse_with_env(text: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let file = Path::new("/etc/outboxd/outboxd.toml");
        let env = |var: &str| {
            vars.iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| v.to_string())
                .ok_or(std::env::VarError::NotPresent)
        };
        validate_in(
            parse_raw(text, file)?,
            &Checker::with_env(file, &env),
            &secret_env_vars(text),
        )
    }

    pub(crate) const STDOUT: &str = "[[consumer]]\nname = \"out\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = \"-\"\n";

    #[test]
    fn a_minimal_config_takes_the_defaults() {
        let c = parse(STDOUT).unwrap();
        assert_eq!(c.consumers.len(), 1);
        assert_eq!(c.relay.lease, outboxd::relay::DEFAULT_LEASE);
        assert_eq!(c.relay.shutdown_grace, DEFAULT_SHUTDOWN_GRACE);
        assert!(c.purge.is_some());
        assert_eq!(c.metrics, None);
    }

    #[test]
    fn a_config_without_consumers_says_in_one_sentence_what_to_add() {
        let shown = parse("[relay]\nworkers = 1\n").unwrap_err().to_string();
        assert_eq!(
            shown,
            "config /etc/outboxd/outboxd.toml: consumer: the config has no consumer; add a \
             [[consumer]] with a name, types and a [consumer.sink]"
        );
    }

    #[test]
    fn errors_name_the_field_path_and_line() {
        let text = format!("{STDOUT}[[consumer]]\nname = \"b\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = 7\n");
        let e = parse(&text).unwrap_err();
        assert_eq!(e.field, "consumer[1].sink.path");
        assert_eq!(e.line, Some(12));
        let shown = e.to_string();
        assert!(
            shown.starts_with("config /etc/outboxd/outboxd.toml, line 12: consumer[1].sink.path: "),
            "{shown}"
        );
    }

    #[test]
    fn type_errors_are_in_words_not_rust_types() {
        let cases = [
            (
                "[relay]\nworkers = \"two\"",
                "relay.workers",
                "expected a whole number from 1 to 1024, found the text \"two\"",
            ),
            (
                "[relay]\nworkers = 0",
                "relay.workers",
                "0 is out of range; expected a whole number from 1 to 1024",
            ),
            (
                "[retry]\nmax_attempts = 99999999999",
                "retry.max_attempts",
                "99999999999 is out of range; expected a whole number from 1 to 1000",
            ),
            (
                "[relay]\nworkers = 99999999999999999999",
                "relay.workers",
                "99999999999999999999 is out of range; expected a whole number from 1 to 1024",
            ),
            (
                "[retry]\nmax_attempts = -99999999999999999999",
                "retry.max_attempts",
                "-99999999999999999999 is out of range; expected a whole number from 1 to 1000",
            ),
            (
                "[alerts]\nmax_dead = 99999999999999999999",
                "alerts.max_dead",
                "99999999999999999999 is out of range; expected a whole number (0 or more)",
            ),
            (
                "[retry]\nmax_attempts = \"ten\"",
                "retry.max_attempts",
                "expected a whole number from 1 to 1000, found the text \"ten\"",
            ),
            (
                "[purge]\nbatch_size = -1",
                "purge.batch_size",
                "-1 is out of range; expected a whole number from 1 to 100000",
            ),
            (
                "[retry]\njitter = \"x\"",
                "retry.jitter",
                "expected a number, such as 0.5, found the text \"x\"",
            ),
            (
                "[alerts]\nmax_dead = 1.5",
                "alerts.max_dead",
                "expected a whole number (0 or more), found the number 1.5",
            ),
            (
                "[relay]\nlease = 30",
                "relay.lease",
                "expected a duration in quotes, such as \"30s\", found the whole number 30",
            ),
            (
                "[purge]\nenabled = 99999999999999999999",
                "purge.enabled",
                "expected true or false, found the whole number 99999999999999999999",
            ),
            (
                "[purge]\nenabled = 1",
                "purge.enabled",
                "expected true or false, found the whole number 1",
            ),
            (
                "relay = 3",
                "relay",
                "expected a table, found the whole number 3",
            ),
            (
                "database = []",
                "database",
                "expected text in quotes, found a list",
            ),
        ];
        for (section, field, want) in cases {
            let e = parse(&format!("{section}\n{STDOUT}")).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert_eq!(e.message, want, "{e}");
        }
        let e =
            parse(&STDOUT.replace("path = \"-\"", "path = \"-\"\nfsync = \"yes\"")).unwrap_err();
        assert_eq!(e.message, "expected true or false, found the text \"yes\"");
        let e = parse(&STDOUT.replace("[\"*\"]", "\"*\"")).unwrap_err();
        assert_eq!(
            e.message,
            "expected a list, such as [\"a\", \"b\"], found the text \"*\""
        );
    }

    #[test]
    fn setting_errors_echo_durations_in_the_units_people_write() {
        let cases = [
            (
                "[relay]\nlease = \"0s\"",
                "relay.lease",
                "0s is out of range; allowed: 1s to 10m",
            ),
            (
                "[relay]\npoll_interval = \"2m\"",
                "relay.poll_interval",
                "2m is out of range; allowed: 1ms to 1m",
            ),
            (
                "[purge]\ndelivered_retention = \"14d\"\ndedup_ttl = \"7d\"",
                "purge.dedup_ttl",
                "7d is shorter than purge.delivered_retention (14d); the dedup window must \
                 cover every kept row",
            ),
            (
                "[retry]\ninitial = \"1h\"\nmax_delay = \"30m\"",
                "retry.max_delay",
                "30m is shorter than retry.initial (1h); allowed: retry.initial or longer",
            ),
        ];
        for (section, field, want) in cases {
            let e = parse(&format!("{section}\n{STDOUT}")).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert_eq!(e.message, want, "{e}");
        }
    }

    #[test]
    fn common_slips_are_said_in_the_files_terms() {
        let e = parse("[consumer]\nname = \"c\"\ntypes = [\"*\"]\n").unwrap_err();
        assert_eq!(e.field, "consumer");
        assert!(e.message.contains("[[consumer]]"), "{e}");
        assert!(!e.message.contains("[\"a\", \"b\"]"), "{e}");
        let e = parse(&STDOUT.replace("path = \"-\"", "path = \"\"")).unwrap_err();
        assert_eq!(e.field, "consumer[0].sink.path");
        assert!(e.message.starts_with("is empty"), "{e}");
    }

    #[test]
    fn unknown_keys_are_refused_with_the_allowed_ones() {
        let e = parse(&format!("{STDOUT}[relay]\nworkerz = 2\n")).unwrap_err();
        assert!(e.field.starts_with("relay"), "{e}");
        assert!(e.message.contains("workers"), "{e}");
    }

    #[test]
    fn every_env_key_in_any_section_names_a_secret_variable() {
        let text = r#"
[http]
token_env = "HTTP_TOKEN"
[[consumer]]
name = "hook"
types = ["*"]
[consumer.sink]
kind = "webhook"
secret_env = "HOOK_SECRET"
secrets_env = ["HOOK_NEW", "HOOK_OLD"]
[[consumer]]
name = "bus"
types = ["*"]
[consumer.sink]
kind = "nats"
token_env = "NATS_TOKEN"
password_env = "NATS_PASSWORD"
[[consumer]]
name = "cmd"
types = ["*"]
[consumer.sink]
kind = "command"
clear_env = false
env = { PLAIN = "not-a-secret" }
"#;
        assert_eq!(
            secret_env_vars(text),
            [
                "HOOK_NEW",
                "HOOK_OLD",
                "HOOK_SECRET",
                "HTTP_TOKEN",
                "NATS_PASSWORD",
                "NATS_TOKEN"
            ]
        );
        assert!(secret_env_vars("not [toml").is_empty());
    }

    #[test]
    fn relative_paths_follow_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let text = "database = \"app.db\"\n[[consumer]]\nname = \"f\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = \"out.jsonl\"\n";
        let c = Config::parse(text, &dir.path().join("o.toml")).unwrap();
        assert_eq!(c.database.unwrap(), dir.path().join("app.db"));
        assert!(dir.path().join("out.jsonl").exists());
    }

    // Config parsing, fuzzed with proptest (a cargo-fuzz target cannot reach
    // a binary's modules): any text, and every field with any value, gives
    // a config or an error that names the file, and never a panic.
    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        const FIELDS: &[&str] = &[
            "database",
            "relay.workers",
            "relay.batch_size",
            "relay.lease",
            "relay.poll_interval",
            "relay.unrouted",
            "relay.shutdown_grace",
            "retry.initial",
            "retry.max_delay",
            "retry.max_attempts",
            "retry.jitter",
            "purge.enabled",
            "purge.delivered_retention",
            "purge.dedup_ttl",
            "purge.dead_retention",
            "purge.intent_retention",
            "purge.batch_size",
            "alerts.stale_after",
            "alerts.max_dead",
            "log.level",
            "log.format",
            "metrics.listen",
            "http.listen",
            "http.token_env",
            "http.read_only",
            "relay.no_such_key",
        ];

        fn value() -> impl Strategy<Value = String> {
            prop_oneof![
                "-?[0-9]{1,20}",
                "-?[0-9]{1,3}\\.[0-9]{1,3}",
                "\"[0-9]{0,6}(ms|s|m|h|d|x)?\"",
                "\"[ -~]{0,16}\"",
                Just("true".to_string()),
                Just("[]".to_string()),
                Just("{}".to_string()),
                Just("\"\"".to_string()),
            ]
        }

        fn check(text: &str) -> Result<(), TestCaseError> {
            let file = "/etc/outboxd/outboxd.toml";
            if let Err(e) = parse(text) {
                let msg = e.to_string();
                prop_assert!(msg.contains(file), "{msg}");
            }
            Ok(())
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn any_text_is_a_config_or_a_named_error(text in "\\PC{0,300}") {
                check(&text)?;
            }

            #[test]
            fn any_value_in_any_field_is_a_config_or_a_named_error(
                field in prop::sample::select(FIELDS), value in value()
            ) {
                let text = match field.split_once('.') {
                    Some((table, key)) => format!("[{table}]\n{key} = {value}\n{STDOUT}"),
                    None => format!("{field} = {value}\n{STDOUT}"),
                };
                check(&text)?;
            }
        }
    }
}
