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
//! packaging/outboxd.example.toml documents every key.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use outboxd::consumer::{Consumer, Delivery, Outcome};
use outboxd::purge::PurgePolicy;
use outboxd::relay::{RelayBuilder, UnroutedPolicy};
use outboxd::router::Pattern;
use outboxd::sinks::{CommandSink, JsonlSink, WebhookSink};
use outboxd::{Relay, RetryPolicy};
use serde::Deserialize;

use crate::args::parse_duration;

mod http;
pub use http::{HttpServe, HttpSettings};

/// How long in-flight deliveries may finish after SIGINT or SIGTERM, unless
/// configured. Below the packaged systemd unit's `TimeoutStopSec=40`.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// The longest shutdown grace accepted.
const MAX_SHUTDOWN_GRACE: Duration = Duration::from_secs(3600);

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

/// The `[relay]` settings (None: the library default).
#[derive(Debug, Clone, PartialEq)]
pub struct RelaySettings {
    /// Worker threads.
    pub workers: Option<usize>,
    /// Rows claimed per transaction.
    pub batch_size: Option<usize>,
    /// The lease of a claim.
    pub lease: Duration,
    /// How often an idle relay looks for other processes' commits.
    pub poll_interval: Option<Duration>,
    /// What to do with events no consumer takes.
    pub unrouted: UnroutedPolicy,
    /// How long in-flight deliveries may finish on shutdown.
    pub shutdown_grace: Duration,
}

/// The `[alerts]` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alerts {
    /// The age of the oldest due event that is logged as stale.
    pub stale_after: Duration,
    /// More dead letters than this are logged as a problem.
    pub max_dead: Option<u64>,
}

/// A constructed sink.
#[derive(Debug)]
pub enum Sink {
    /// JSON lines to stdout or a file.
    Jsonl {
        /// The sink.
        sink: JsonlSink,
        /// `stdout`, or the file and whether it is synced, for logs.
        target: String,
    },
    /// A child program per event.
    Command(CommandSink),
    /// A signed HTTP POST per event.
    Webhook(WebhookSink),
}

impl Sink {
    /// The longest one delivery may take, if the sink bounds it.
    pub fn time_limit(&self) -> Option<Duration> {
        match self {
            Sink::Jsonl { .. } => None,
            Sink::Command(c) => Some(c.time_limit()),
            Sink::Webhook(w) => Some(w.timeout()),
        }
    }

    /// A one-line description without secrets, for logs and check-config.
    pub fn describe(&self) -> String {
        match self {
            Sink::Jsonl { target, .. } => format!("jsonl {target}"),
            Sink::Command(c) => format!(
                "command {} (timeout {:?}, poison exit code {})",
                c.program().display(),
                c.time_limit(),
                c.poison_code()
            ),
            Sink::Webhook(w) => format!(
                "webhook {} (timeout {:?}, connect timeout {:?})",
                w.display_url(),
                w.timeout(),
                w.connect_timeout()
            ),
        }
    }
}

impl Consumer for Sink {
    fn deliver(&self, delivery: &Delivery) -> Outcome {
        match self {
            Sink::Jsonl { sink, .. } => sink.deliver(delivery),
            Sink::Command(s) => s.deliver(delivery),
            Sink::Webhook(s) => s.deliver(delivery),
        }
    }
}

/// One `[[consumer]]`, validated.
#[derive(Debug)]
pub struct ConsumerSpec {
    /// Its unique name (the key of its progress in the database).
    pub name: String,
    /// The event types or patterns it takes.
    pub types: Vec<String>,
    /// Its retry policy.
    pub retry: RetryPolicy,
    /// Its sink.
    pub sink: Sink,
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
    pub alerts: Alerts,
    /// Logging.
    pub log: LogSettings,
    /// Where to serve Prometheus metrics.
    pub metrics: Option<SocketAddr>,
    /// `[http]`: the console, metrics and health check.
    pub http: HttpSettings,
    /// The consumers, at least one.
    pub consumers: Vec<ConsumerSpec>,
}

impl Config {
    /// The configuration of `outboxd run` without `--config`: one consumer
    /// named `stdout` taking every event type, writing JSON lines to stdout.
    pub fn stdout_default() -> Config {
        Config {
            file: None,
            database: None,
            relay: RelaySettings {
                workers: None,
                batch_size: None,
                lease: outboxd::relay::DEFAULT_LEASE,
                poll_interval: None,
                unrouted: UnroutedPolicy::default(),
                shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            },
            retry: RetryPolicy::default(),
            purge: Some(PurgePolicy::default()),
            alerts: Alerts {
                stale_after: outboxd::relay::DEFAULT_STALE_AFTER,
                max_dead: None,
            },
            log: LogSettings::default(),
            metrics: None,
            http: HttpSettings::default(),
            consumers: vec![ConsumerSpec {
                name: "stdout".into(),
                types: vec!["*".into()],
                retry: RetryPolicy::default(),
                sink: Sink::Jsonl {
                    sink: JsonlSink::stdout(),
                    target: "stdout".into(),
                },
            }],
        }
    }

    /// Reads, parses and validates a config file.
    pub fn load(file: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(file).map_err(|e| ConfigError {
            file: file.to_path_buf(),
            field: String::new(),
            line: None,
            message: format!("cannot read the file: {e}"),
        })?;
        Config::parse(&text, file)
    }

    /// Parses and validates config text said to come from `file` (relative
    /// paths inside are resolved against its directory).
    pub fn parse(text: &str, file: &Path) -> Result<Config, ConfigError> {
        let raw = parse_raw(text, file)?;
        validate(raw, file)
    }

    /// A relay builder for `db` with every setting and consumer of this
    /// config. `build()` on it only fails for what [`Config::parse`] checked.
    pub fn relay_builder(self, db: &Path) -> RelayBuilder {
        let mut b = Relay::builder(db)
            .lease(self.relay.lease)
            .unrouted(self.relay.unrouted)
            .retry_policy(self.retry)
            .stale_after(self.alerts.stale_after)
            .purge(self.purge);
        if let Some(n) = self.relay.workers {
            b = b.workers(n);
        }
        if let Some(n) = self.relay.batch_size {
            b = b.batch_size(n);
        }
        if let Some(d) = self.relay.poll_interval {
            b = b.poll_interval(d);
        }
        for c in self.consumers {
            b = b
                .consumer(&c.name, &c.types, c.sink)
                .retry_policy_for(&c.name, c.retry);
        }
        b
    }
}

// ---------------------------------------------------------------------------
// Raw, as written.

/// A duration written as `500ms`, `30s`, `5m`, `2h` or `1d`.
#[derive(Debug, Clone, Copy)]
struct Dur(Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Dur, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s)
            .map(Dur)
            .map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    database: Option<PathBuf>,
    #[serde(default)]
    relay: RawRelay,
    retry: Option<RawRetry>,
    #[serde(default)]
    purge: RawPurge,
    #[serde(default)]
    alerts: RawAlerts,
    #[serde(default)]
    log: RawLog,
    #[serde(default)]
    metrics: RawMetrics,
    #[serde(default)]
    http: http::RawHttp,
    #[serde(default)]
    consumer: Vec<RawConsumer>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRelay {
    workers: Option<usize>,
    batch_size: Option<usize>,
    lease: Option<Dur>,
    poll_interval: Option<Dur>,
    unrouted: Option<Unrouted>,
    shutdown_grace: Option<Dur>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Unrouted {
    DeadLetter,
    Skip,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    initial: Option<Dur>,
    max_delay: Option<Dur>,
    max_attempts: Option<u32>,
    jitter: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPurge {
    enabled: Option<bool>,
    delivered_retention: Option<Dur>,
    dedup_ttl: Option<Dur>,
    dead_retention: Option<Dur>,
    intent_retention: Option<Dur>,
    batch_size: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAlerts {
    stale_after: Option<Dur>,
    max_dead: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLog {
    level: Option<String>,
    format: Option<LogFormat>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConsumer {
    name: String,
    types: Vec<String>,
    retry: Option<RawRetry>,
    sink: RawSink,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum SinkKind {
    Jsonl,
    Command,
    Webhook,
}

/// Every sink's keys in one table, so serde reports paths for all of them;
/// [`validate`] refuses a key the chosen kind does not use.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSink {
    kind: SinkKind,
    // jsonl
    path: Option<PathBuf>,
    fsync: Option<bool>,
    // command
    program: Option<String>,
    args: Option<Vec<String>>,
    poison_exit_code: Option<u8>,
    env: Option<BTreeMap<String, String>>,
    clear_env: Option<bool>,
    // command and webhook
    timeout: Option<Dur>,
    // webhook
    url: Option<String>,
    secret_env: Option<String>,
    secrets_env: Option<Vec<String>>,
    secret_file: Option<PathBuf>,
    connect_timeout: Option<Dur>,
    deny_private_addresses: Option<bool>,
    headers: Option<BTreeMap<String, String>>,
    max_response_bytes: Option<u64>,
}

const JSONL_KEYS: &[&str] = &["kind", "path", "fsync"];
const COMMAND_KEYS: &[&str] = &[
    "kind",
    "program",
    "args",
    "timeout",
    "poison_exit_code",
    "env",
    "clear_env",
];
const WEBHOOK_KEYS: &[&str] = &[
    "kind",
    "url",
    "secret_env",
    "secrets_env",
    "secret_file",
    "timeout",
    "connect_timeout",
    "deny_private_addresses",
    "headers",
    "max_response_bytes",
];

impl RawSink {
    /// The keys that are set.
    fn keys(&self) -> Vec<&'static str> {
        let mut k = vec!["kind"];
        let mut add = |set: bool, name| {
            if set {
                k.push(name)
            }
        };
        add(self.path.is_some(), "path");
        add(self.fsync.is_some(), "fsync");
        add(self.program.is_some(), "program");
        add(self.args.is_some(), "args");
        add(self.poison_exit_code.is_some(), "poison_exit_code");
        add(self.env.is_some(), "env");
        add(self.clear_env.is_some(), "clear_env");
        add(self.timeout.is_some(), "timeout");
        add(self.url.is_some(), "url");
        add(self.secret_env.is_some(), "secret_env");
        add(self.secrets_env.is_some(), "secrets_env");
        add(self.secret_file.is_some(), "secret_file");
        add(self.connect_timeout.is_some(), "connect_timeout");
        add(
            self.deny_private_addresses.is_some(),
            "deny_private_addresses",
        );
        add(self.headers.is_some(), "headers");
        add(self.max_response_bytes.is_some(), "max_response_bytes");
        k
    }
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
        ConfigError {
            file: file.to_path_buf(),
            field: if field == "." { String::new() } else { field },
            line: inner.span().map(|s| line_of(text, s.start)),
            message: inner.message().trim().to_string(),
        }
    })
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

struct Checker<'a> {
    file: &'a Path,
    dir: PathBuf,
}

impl Checker<'_> {
    fn err(&self, field: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_path_buf(),
            field: field.into(),
            line: None,
            message: message.into(),
        }
    }

    fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.dir.join(p)
        }
    }

    fn range<T: PartialOrd + fmt::Display + Copy>(
        &self,
        field: &str,
        v: Option<T>,
        lo: T,
        hi: T,
    ) -> Result<Option<T>, ConfigError> {
        match v {
            Some(x) if x < lo || x > hi => {
                Err(self.err(field, format!("{x} is out of range; allowed: {lo} to {hi}")))
            }
            other => Ok(other),
        }
    }

    fn retry(
        &self,
        prefix: &str,
        raw: &RawRetry,
        base: RetryPolicy,
    ) -> Result<RetryPolicy, ConfigError> {
        let mut p = base;
        if let Some(Dur(d)) = raw.initial {
            if d.is_zero() {
                return Err(self.err(
                    format!("{prefix}.initial"),
                    "must be longer than zero, such as 30s",
                ));
            }
            p = p.initial(d);
        }
        if let Some(Dur(d)) = raw.max_delay {
            p = p.max_delay(d);
        }
        if let Some(n) = self.range(&format!("{prefix}.max_attempts"), raw.max_attempts, 1, 1000)? {
            p = p.max_attempts(n);
        }
        if let Some(j) = raw.jitter {
            if !(0.0..=1.0).contains(&j) {
                return Err(self.err(
                    format!("{prefix}.jitter"),
                    format!("{j} is out of range; allowed: 0.0 to 1.0 (a fraction of the delay)"),
                ));
            }
            p = p.jitter(j);
        }
        p.validate().map_err(|e| match e {
            outboxd::Error::InvalidSetting { field, reason } => {
                let field = field.strip_prefix("retry.").unwrap_or(field);
                self.err(format!("{prefix}.{field}"), reason)
            }
            other => self.err(prefix, other.to_string()),
        })?;
        Ok(p)
    }
}

fn validate(raw: RawConfig, file: &Path) -> Result<Config, ConfigError> {
    let dir = file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let c = Checker { file, dir };

    let database = match &raw.database {
        Some(p) if p.as_os_str().is_empty() => {
            return Err(c.err("database", "is empty; give the SQLite file's path"))
        }
        Some(p) => Some(c.resolve(p)),
        None => None,
    };

    // [relay]
    let r = &raw.relay;
    let workers = c.range("relay.workers", r.workers, 1, 1024)?;
    let batch_size = c.range("relay.batch_size", r.batch_size, 1, 10_000)?;
    let lease = r.lease.map_or(outboxd::relay::DEFAULT_LEASE, |d| d.0);
    if lease < Duration::from_secs(1) {
        return Err(c.err(
            "relay.lease",
            format!("{lease:?} is too short; allowed: 1s or more"),
        ));
    }
    let poll_interval = r.poll_interval.map(|d| d.0);
    if let Some(d) = poll_interval {
        if d.is_zero() || d > Duration::from_secs(60) {
            return Err(c.err(
                "relay.poll_interval",
                format!("{d:?} is out of range; allowed: 1ms to 60s"),
            ));
        }
    }
    let shutdown_grace = r.shutdown_grace.map_or(DEFAULT_SHUTDOWN_GRACE, |d| d.0);
    if shutdown_grace > MAX_SHUTDOWN_GRACE {
        return Err(c.err(
            "relay.shutdown_grace",
            format!(
                "{shutdown_grace:?} is too long; allowed: up to 1h (and keep it below the \
                 service manager's stop timeout, 40s in the packaged systemd unit)"
            ),
        ));
    }
    let unrouted = match r.unrouted {
        None | Some(Unrouted::DeadLetter) => UnroutedPolicy::DeadLetter,
        Some(Unrouted::Skip) => UnroutedPolicy::Skip,
    };

    // [retry]
    let retry = match &raw.retry {
        Some(t) => c.retry("retry", t, RetryPolicy::default())?,
        None => RetryPolicy::default(),
    };

    // [purge]
    let p = &raw.purge;
    let purge = if p.enabled == Some(false) {
        None
    } else {
        let d = PurgePolicy::default();
        let batch_size = c
            .range("purge.batch_size", p.batch_size, 1, 100_000)?
            .unwrap_or(d.batch_size);
        let policy = PurgePolicy {
            delivered_retention: p.delivered_retention.map_or(d.delivered_retention, |x| x.0),
            dedup_ttl: p.dedup_ttl.map_or(d.dedup_ttl, |x| x.0),
            dead_retention: p.dead_retention.map(|x| x.0),
            intent_retention: p.intent_retention.map_or(d.intent_retention, |x| x.0),
            batch_size,
        };
        policy.validate().map_err(|e| match e {
            outboxd::Error::InvalidSetting { field, reason } => c.err(field, reason),
            other => c.err("purge", other.to_string()),
        })?;
        Some(policy)
    };

    // [alerts]
    let stale_after = raw
        .alerts
        .stale_after
        .map_or(outboxd::relay::DEFAULT_STALE_AFTER, |d| d.0);
    if stale_after.is_zero() {
        return Err(c.err("alerts.stale_after", "must be longer than zero, such as 5m"));
    }

    // [log]
    if let Some(level) = &raw.log.level {
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

    // [metrics]
    let metrics = match &raw.metrics.listen {
        None => None,
        Some(addr) => Some(resolve_listen(addr).map_err(|m| c.err("metrics.listen", m))?),
    };

    // [http]
    let http = raw.http.validate().map_err(|(f, m)| c.err(f, m))?;

    // [[consumer]]
    if raw.consumer.is_empty() {
        return Err(c.err(
            "consumer",
            "no [[consumer]] is configured; add at least one with a name, types and a \
             [consumer.sink]",
        ));
    }
    let mut names = std::collections::HashSet::new();
    let mut consumers = Vec::with_capacity(raw.consumer.len());
    for (i, rc) in raw.consumer.into_iter().enumerate() {
        let at = format!("consumer[{i}]");
        let name = &rc.name;
        if name.is_empty()
            || name.len() > 128
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        {
            return Err(c.err(
                format!("{at}.name"),
                format!(
                    "{name:?} is not allowed; use 1 to 128 characters of A-Z, a-z, 0-9, _, - and ."
                ),
            ));
        }
        if !names.insert(name.clone()) {
            return Err(c.err(
                format!("{at}.name"),
                format!("{name:?} is used by an earlier consumer; names must be unique"),
            ));
        }
        if rc.types.is_empty() {
            return Err(c.err(
                format!("{at}.types"),
                "is empty; list event types or patterns such as [\"article.*.v1\"] or [\"*\"]",
            ));
        }
        for (j, t) in rc.types.iter().enumerate() {
            Pattern::parse(t).map_err(|e| {
                let msg = match e {
                    outboxd::Error::InvalidSetting { reason, .. } => reason,
                    other => other.to_string(),
                };
                c.err(format!("{at}.types[{j}]"), msg)
            })?;
        }
        let sink = build_sink(&c, &format!("{at}.sink"), &rc.sink)?;
        if let Some(limit) = sink.time_limit() {
            if lease < limit {
                return Err(c.err(
                    format!("{at}.sink.timeout"),
                    format!(
                        "{limit:?} is longer than relay.lease ({lease:?}); a delivery could \
                         outlive its claim: set relay.lease to at least {limit:?} or shorten \
                         the timeout"
                    ),
                ));
            }
        }
        let base = match (&sink, &rc.retry) {
            (Sink::Webhook(_), _) => RetryPolicy::webhook(),
            _ => retry.clone(),
        };
        let consumer_retry = match &rc.retry {
            Some(t) => c.retry(&format!("{at}.retry"), t, base)?,
            None => base,
        };
        consumers.push(ConsumerSpec {
            name: rc.name,
            types: rc.types,
            retry: consumer_retry,
            sink,
        });
    }

    Ok(Config {
        file: Some(file.to_path_buf()),
        database,
        relay: RelaySettings {
            workers,
            batch_size,
            lease,
            poll_interval,
            unrouted,
            shutdown_grace,
        },
        retry,
        purge,
        alerts: Alerts {
            stale_after,
            max_dead: raw.alerts.max_dead,
        },
        log: LogSettings {
            level: raw.log.level,
            format: raw.log.format,
        },
        metrics,
        http,
        consumers,
    })
}

/// A listen address: `host:port` resolving to exactly one socket address
/// is expected; the first is taken.
pub fn resolve_listen(addr: &str) -> Result<SocketAddr, String> {
    let mut addrs = addr.to_socket_addrs().map_err(|e| {
        format!("{addr:?} is not an address to listen on ({e}); expected host:port such as 127.0.0.1:9464")
    })?;
    addrs.next().ok_or_else(|| {
        format!("{addr:?} resolves to no address; expected host:port such as 127.0.0.1:9464")
    })
}

fn build_sink(c: &Checker<'_>, at: &str, s: &RawSink) -> Result<Sink, ConfigError> {
    let (allowed, kind) = match s.kind {
        SinkKind::Jsonl => (JSONL_KEYS, "jsonl"),
        SinkKind::Command => (COMMAND_KEYS, "command"),
        SinkKind::Webhook => (WEBHOOK_KEYS, "webhook"),
    };
    if let Some(extra) = s.keys().into_iter().find(|k| !allowed.contains(k)) {
        return Err(c.err(
            format!("{at}.{extra}"),
            format!(
                "is not used by a {kind} sink; a {kind} sink takes: {}",
                allowed.join(", ")
            ),
        ));
    }
    let positive = |field: &str, d: Option<Dur>| -> Result<Option<Duration>, ConfigError> {
        match d {
            Some(Dur(d)) if d.is_zero() => Err(c.err(
                format!("{at}.{field}"),
                "must be longer than zero, such as 10s",
            )),
            other => Ok(other.map(|d| d.0)),
        }
    };
    match s.kind {
        SinkKind::Jsonl => {
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
                return Ok(Sink::Jsonl {
                    sink: JsonlSink::stdout(),
                    target: "stdout".into(),
                });
            }
            let file = c.resolve(path);
            let fsync = s.fsync.unwrap_or(false);
            let sink = JsonlSink::file(&file, fsync)
                .map_err(|e| c.err(format!("{at}.path"), e.to_string()))?;
            let target = format!("{}{}", file.display(), if fsync { " (fsync)" } else { "" });
            Ok(Sink::Jsonl { sink, target })
        }
        SinkKind::Command => {
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
            if let Some(t) = positive("timeout", s.timeout)? {
                sink = sink.timeout(t);
            }
            if let Some(code) = s.poison_exit_code {
                sink = sink.poison_exit_code(code);
            }
            if s.clear_env == Some(true) {
                sink = sink.env_clear();
            }
            for (k, v) in s.env.iter().flatten() {
                if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                    return Err(c.err(
                        format!("{at}.env.{k}"),
                        "names must be non-empty without = or NUL, values without NUL",
                    ));
                }
                sink = sink.env(k, v);
            }
            Ok(Sink::Command(sink))
        }
        SinkKind::Webhook => {
            let url = s.url.as_ref().ok_or_else(|| {
                c.err(
                    format!("{at}.url"),
                    "is missing; a webhook sink needs url = \"https://...\"",
                )
            })?;
            let mut b = WebhookSink::builder(url.clone());
            // Where each secret came from, in the order given to the builder,
            // so a malformed one is reported by its source, never its value.
            let mut sources: Vec<(String, String)> = Vec::new();
            let mut vars: Vec<(String, &String)> = Vec::new();
            if let Some(v) = &s.secret_env {
                vars.push((format!("{at}.secret_env"), v));
            }
            for (i, v) in s.secrets_env.iter().flatten().enumerate() {
                vars.push((format!("{at}.secrets_env[{i}]"), v));
            }
            for (field, var) in vars {
                let value = std::env::var(var).map_err(|e| {
                    let why = match e {
                        std::env::VarError::NotPresent => "is not set",
                        std::env::VarError::NotUnicode(_) => "is not valid UTF-8",
                    };
                    c.err(
                        &field,
                        format!(
                            "environment variable {var} {why}; set it to the signing secret \
                             (whsec_ followed by base64)"
                        ),
                    )
                })?;
                if value.trim().is_empty() {
                    return Err(c.err(
                        &field,
                        format!("environment variable {var} is empty; set it to the signing secret (whsec_…)"),
                    ));
                }
                b = b.secret(value);
                sources.push((field, format!("environment variable {var}")));
            }
            if let Some(p) = &s.secret_file {
                let path = c.resolve(p);
                let field = format!("{at}.secret_file");
                let value = std::fs::read_to_string(&path).map_err(|e| {
                    c.err(
                        &field,
                        format!("cannot read secret file {}: {e}", path.display()),
                    )
                })?;
                if value.trim().is_empty() {
                    return Err(c.err(&field, format!("secret file {} is empty", path.display())));
                }
                b = b.secret(value.trim().to_string());
                sources.push((field, format!("secret file {}", path.display())));
            }
            if sources.is_empty() {
                return Err(c.err(
                    format!("{at}.secret_env"),
                    "a webhook sink needs a signing secret: secret_env = \"VAR\", \
                     secrets_env = [\"NEW\", \"OLD\"] while rotating, or secret_file = \"path\"",
                ));
            }
            if let Some(t) = positive("timeout", s.timeout)? {
                b = b.timeout(t);
            }
            if let Some(t) = positive("connect_timeout", s.connect_timeout)? {
                b = b.connect_timeout(t);
            }
            if let Some(n) = s.max_response_bytes {
                if n == 0 {
                    return Err(c.err(
                        format!("{at}.max_response_bytes"),
                        "must be 1 or more, such as 65536",
                    ));
                }
                b = b.max_response_bytes(n);
            }
            if let Some(deny) = s.deny_private_addresses {
                b = b.deny_private_addresses(deny);
            }
            for (k, v) in s.headers.iter().flatten() {
                b = b.header(k, v);
            }
            let sink = b.build().map_err(|e| {
                use outboxd::sinks::WebhookError as W;
                let (field, source) = match &e {
                    W::InvalidUrl { .. } | W::UrlScheme { .. } | W::UrlHost { .. } => {
                        (format!("{at}.url"), None)
                    }
                    W::Header { .. } => (format!("{at}.headers"), None),
                    W::SecretPrefix { index }
                    | W::SecretBase64 { index }
                    | W::SecretLength { index, .. } => match sources.get(index - 1) {
                        Some((field, source)) => (field.clone(), Some(source.clone())),
                        None => (format!("{at}.secret_env"), None),
                    },
                    _ => (at.to_string(), None),
                };
                let message = match source {
                    Some(source) => format!("the secret in {source}: {e}"),
                    None => e.to_string(),
                };
                c.err(field, message)
            })?;
            Ok(Sink::Webhook(sink))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/outboxd/outboxd.toml"))
    }

    const STDOUT: &str = "[[consumer]]\nname = \"out\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = \"-\"\n";

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
    fn unknown_keys_are_refused_with_the_allowed_ones() {
        let e = parse(&format!("{STDOUT}[relay]\nworkerz = 2\n")).unwrap_err();
        assert!(e.field.starts_with("relay"), "{e}");
        assert!(e.message.contains("workers"), "{e}");
    }

    #[test]
    fn a_key_of_another_sink_kind_is_refused() {
        let e = parse(&format!("{STDOUT}url = \"http://x\"\n")).unwrap_err();
        assert_eq!(e.field, "consumer[0].sink.url");
        assert!(e.message.contains("path, fsync"), "{e}");
    }

    #[test]
    fn a_webhook_without_retry_table_retries_for_days_and_its_timeout_fits_the_lease() {
        std::env::set_var(
            "CONFIG_UNIT_SECRET",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        );
        let hook = "[[consumer]]\nname = \"h\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"webhook\"\nurl = \"https://example.com/\"\nsecret_env = \"CONFIG_UNIT_SECRET\"\n";
        let c = parse(&format!("[retry]\nmax_attempts = 3\n{hook}")).unwrap();
        assert_eq!(c.consumers[0].retry, RetryPolicy::webhook());
        let c = parse(&format!("{hook}[consumer.retry]\nmax_attempts = 3\n")).unwrap();
        assert_eq!(c.consumers[0].retry, RetryPolicy::webhook().max_attempts(3));
        let e = parse(&format!("[relay]\nlease = \"5s\"\n{hook}")).unwrap_err();
        assert_eq!(e.field, "consumer[0].sink.timeout");
        assert!(e.message.contains("30s") && e.message.contains("5s"), "{e}");
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
