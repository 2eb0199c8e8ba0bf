//! `[consumer.sink]`: the sink a consumer delivers through, one file per
//! kind ([`jsonl`], [`command`], [`webhook`], [`sql`]).
//!
//! Every kind's keys live in one table, [`RawSink`], so serde reports the
//! field path and line of a wrong value whatever the kind; each kind lists
//! the keys it takes ([`jsonl::KEYS`]…) and a key of another kind is
//! refused by name.
//!
//! To add a kind: its keys in the `raw_sink!` list below, a variant in
//! [`SinkKind`], an arm in [`build`] and in [`default_retry`], and a file
//! here with its `KEYS` and a
//! `build(&Checker, at, &RawSink) -> Result<Sink, ConfigError>`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use outboxd::consumer::Consumer;
use outboxd::relay::RelayBuilder;
use outboxd::sinks::SqlSink;
use outboxd::RetryPolicy;
use serde::Deserialize;

use super::{Checker, ConfigError, Dur};

pub mod command;
pub mod jsonl;
pub mod sql;
pub mod webhook;

/// A constructed sink: the library consumer, and what the rest of the
/// binary needs to know about it.
pub struct Sink {
    consumer: Run,
    description: String,
    time_limit: Option<Duration>,
}

/// How the relay runs a sink.
enum Run {
    /// A plain consumer, on its own.
    Plain(Box<dyn Consumer>),
    /// A transactional consumer ([`sql`]), whose statements are checked
    /// against the database before the relay starts.
    Sql(SqlSink),
}

impl Sink {
    /// A sink delivering through `consumer`, described (without secrets) by
    /// `description`.
    pub fn new(consumer: impl Consumer, description: impl Into<String>) -> Sink {
        Sink {
            consumer: Run::Plain(Box::new(consumer)),
            description: description.into(),
            time_limit: None,
        }
    }

    /// A `sql` sink: its statements run as a transactional consumer.
    pub fn sql(sink: SqlSink, description: impl Into<String>) -> Sink {
        Sink {
            consumer: Run::Sql(sink),
            description: description.into(),
            time_limit: None,
        }
    }

    /// Registers the sink on `b` as the consumer `name` of `types`.
    pub fn register(self, b: RelayBuilder, name: &str, types: &[String]) -> RelayBuilder {
        match self.consumer {
            Run::Plain(c) => b.consumer(name, types, BoxedConsumer(c)),
            Run::Sql(s) => b.transactional_consumer(name, types, s),
        }
    }

    /// The statements of a `sql` sink, to check against the database.
    pub fn sql_statements(&self) -> Option<&SqlSink> {
        match &self.consumer {
            Run::Sql(s) => Some(s),
            Run::Plain(_) => None,
        }
    }

    /// The longest one delivery may take; the lease must cover it.
    pub fn with_time_limit(mut self, limit: Duration) -> Sink {
        self.time_limit = Some(limit);
        self
    }

    /// The longest one delivery may take, if the sink bounds it.
    pub fn time_limit(&self) -> Option<Duration> {
        self.time_limit
    }

    /// A one-line description without secrets, for logs and check-config.
    pub fn describe(&self) -> &str {
        &self.description
    }
}

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sink")
            .field("description", &self.description)
            .finish_non_exhaustive()
    }
}

/// A boxed consumer, registered as one.
struct BoxedConsumer(Box<dyn Consumer>);

impl Consumer for BoxedConsumer {
    fn deliver(&self, delivery: &outboxd::Delivery) -> outboxd::Outcome {
        self.0.deliver(delivery)
    }
}

/// The sink kinds, as written in `kind = "…"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SinkKind {
    /// JSON lines to stdout or a file.
    Jsonl,
    /// A child program per event.
    Command,
    /// A signed HTTP POST per event.
    Webhook,
    /// SQL statements run exactly once in the relay's database.
    Sql,
}

/// Declares [`RawSink`] with every kind's keys (all optional) and
/// `RawSink::keys`, the keys that are set, from one list.
macro_rules! raw_sink {
    ($($(#[$doc:meta])* $key:ident: $ty:ty,)*) => {
        /// `[consumer.sink]` as written: every kind's keys in one table, so
        /// serde reports paths for all of them; [`build`] refuses a key the
        /// chosen kind does not use.
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct RawSink {
            /// The kind.
            pub kind: SinkKind,
            $($(#[$doc])* pub $key: Option<$ty>,)*
        }

        impl RawSink {
            /// The keys that are set, `kind` first.
            fn keys(&self) -> Vec<&'static str> {
                let mut k = vec!["kind"];
                $(if self.$key.is_some() { k.push(stringify!($key)); })*
                k
            }
        }
    };
}

raw_sink! {
    // jsonl
    /// The file, or `-` for stdout.
    path: PathBuf,
    /// fsync after every line.
    fsync: bool,
    /// Add tenant_id and legacy to each line.
    delivery_fields: bool,
    // command
    /// The program to run.
    program: String,
    /// Its arguments.
    args: Vec<String>,
    /// The exit code that means poison.
    poison_exit_code: u8,
    /// Extra environment variables.
    env: BTreeMap<String, String>,
    /// Start from an empty environment.
    clear_env: bool,
    // command and webhook
    /// The longest one delivery may take.
    timeout: Dur,
    // webhook
    /// The URL to POST to.
    url: String,
    /// The variable holding the signing secret.
    secret_env: String,
    /// Variables holding the signing secrets while rotating.
    secrets_env: Vec<String>,
    /// A file holding the signing secret.
    secret_file: PathBuf,
    /// The TCP and TLS connect timeout.
    connect_timeout: Dur,
    /// Refuse private, loopback and link-local addresses.
    deny_private_addresses: bool,
    /// Extra request headers.
    headers: BTreeMap<String, String>,
    /// The most response bytes read.
    max_response_bytes: u64,
    // sql
    /// The SQL statements run for each event.
    statements: Vec<String>,
}

/// A kind's own retry schedule, used instead of `[retry]` (a consumer's
/// `[consumer.retry]` still applies on top): receivers behind a webhook may
/// be down for a day.
pub fn default_retry(kind: SinkKind) -> Option<RetryPolicy> {
    match kind {
        SinkKind::Webhook => Some(RetryPolicy::webhook()),
        SinkKind::Jsonl | SinkKind::Command | SinkKind::Sql => None,
    }
}

/// Every environment variable the config's sinks read a secret from. Each
/// command sink keeps them from its program; a kind that adds a `*_env`
/// secret key lists it here.
pub fn secret_env_vars<'a>(sinks: impl Iterator<Item = &'a RawSink>) -> Vec<String> {
    sinks
        .flat_map(|s| s.secret_env.iter().chain(s.secrets_env.iter().flatten()))
        .cloned()
        .collect()
}

/// Builds the sink at `at` (`consumer[0].sink`); `secret_vars` are the
/// config's [`secret_env_vars`].
pub fn build(
    c: &Checker<'_>,
    at: &str,
    s: &RawSink,
    secret_vars: &[String],
) -> Result<Sink, ConfigError> {
    let (allowed, kind) = match s.kind {
        SinkKind::Jsonl => (jsonl::KEYS, "jsonl"),
        SinkKind::Command => (command::KEYS, "command"),
        SinkKind::Webhook => (webhook::KEYS, "webhook"),
        SinkKind::Sql => (sql::KEYS, "sql"),
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
    match s.kind {
        SinkKind::Jsonl => jsonl::build(c, at, s),
        SinkKind::Command => command::build(c, at, s, secret_vars),
        SinkKind::Webhook => webhook::build(c, at, s),
        SinkKind::Sql => sql::build(c, at, s),
    }
}

/// A duration key that must be longer than zero, if set.
fn positive(
    c: &Checker<'_>,
    at: &str,
    field: &str,
    d: Option<Dur>,
) -> Result<Option<Duration>, ConfigError> {
    match d {
        Some(Dur(d)) if d.is_zero() => Err(c.err(
            format!("{at}.{field}"),
            "must be longer than zero, such as 10s",
        )),
        other => Ok(other.map(|d| d.0)),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{parse, STDOUT};

    #[test]
    fn a_key_of_another_sink_kind_is_refused() {
        let e = parse(&format!("{STDOUT}url = \"http://x\"\n")).unwrap_err();
        assert_eq!(e.field, "consumer[0].sink.url");
        assert!(e.message.contains("path, fsync"), "{e}");
    }
}
