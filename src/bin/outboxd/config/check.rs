//! What serde cannot check: ranges, unique names, the settings against
//! each other and against the library's own rules, then the sinks built.
//! Turns a [`RawConfig`] into a [`Config`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use outboxd::error::{Setting, SettingError};
use outboxd::purge::PurgePolicy;
use outboxd::relay::RelayBuilder;
use outboxd::status::Thresholds;
use outboxd::{Delivery, Outcome, Relay, RetryPolicy};

use super::checker::Checker;
use super::error::ConfigError;
use super::{alerts, capture, consumer, http, log, metrics, purge, relay, retry, tracing};
use super::{Config, HttpSettings, LogSettings, RawConfig, RelaySettings};

pub(super) fn validate(
    raw: RawConfig,
    file: &Path,
    secret_vars: &[String],
) -> Result<Config, ConfigError> {
    validate_in(raw, &Checker::new(file), secret_vars)
}

/// Checks `raw` with `c`; command sinks keep `secret_vars` (the config's
/// [`secret_env_vars`] and any given outside it) from their programs.
pub(super) fn validate_in(
    raw: RawConfig,
    c: &Checker<'_>,
    secret_vars: &[String],
) -> Result<Config, ConfigError> {
    let file = c.file;
    let s = check_settings(c, &raw)?;
    let captures = capture::check(c, raw.capture, s.relay.max_payload_bytes)?;
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
        tracing: s.tracing,
    })
}

/// A config's settings, checked: everything but the sinks.
pub(super) struct CheckedSettings {
    pub(super) database: Option<PathBuf>,
    pub(super) relay: RelaySettings,
    pub(super) retry: RetryPolicy,
    pub(super) purge: Option<PurgePolicy>,
    pub(super) alerts: Thresholds,
    pub(super) log: LogSettings,
    pub(super) metrics: Option<SocketAddr>,
    pub(super) http: HttpSettings,
    pub(super) tracing: Option<tracing::TracingSettings>,
}

/// Checks `database`: a path, resolved against the config's directory.
pub(super) fn database(
    c: &Checker<'_>,
    raw: &Option<PathBuf>,
) -> Result<Option<PathBuf>, ConfigError> {
    match raw {
        Some(p) if p.as_os_str().is_empty() => {
            Err(c.err("database", "is empty; give the SQLite file's path"))
        }
        Some(p) => Ok(Some(c.resolve(p))),
        None => Ok(None),
    }
}

pub(super) fn check_settings(
    c: &Checker<'_>,
    raw: &RawConfig,
) -> Result<CheckedSettings, ConfigError> {
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
    #[cfg(feature = "otlp")]
    let tracing = tracing::check(c, &raw.tracing)?;
    #[cfg(not(feature = "otlp"))]
    let tracing = None;
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
    Ok(CheckedSettings {
        database,
        relay,
        retry,
        purge,
        alerts,
        log,
        metrics,
        http,
        tracing,
    })
}

/// The relay-wide settings of a config, as the relay builder takes them.
pub(super) struct RelayWide<'a> {
    pub(super) relay: &'a RelaySettings,
    pub(super) retry: &'a RetryPolicy,
    pub(super) purge: &'a Option<PurgePolicy>,
    pub(super) alerts: &'a Thresholds,
}

impl RelayWide<'_> {
    /// `b` with every relay-wide setting applied.
    pub(super) fn apply(&self, b: RelayBuilder) -> RelayBuilder {
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
        | Setting::RetryJitter
        | Setting::RetryProbeInterval
        | Setting::RetryProbeMaxInterval => match consumer {
            Some(at) => format!("{at}.{name}"),
            None => name.to_string(),
        },
        // purge.dedup_ttl, purge.batch_size: the config's own names.
        _ => name.to_string(),
    };
    c.err(field, e.reason())
}
