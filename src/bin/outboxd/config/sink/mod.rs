//! `[consumer.sink]`: the sink a consumer delivers through, one file per
//! kind ([`jsonl`], [`command`], [`webhook`], [`nats`], [`sql`]).
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

use super::checker::Checker;
use super::error::ConfigError;
use super::values::{Dur, Whole};
use super::RelaySettings;

pub(crate) mod command;
pub(crate) mod jsonl;
pub(crate) mod nats;
pub(crate) mod sql;
pub(crate) mod webhook;

/// A kind's connection step, run by `outboxd run` before the relay starts,
/// with the consumer's name, its retry policy and the relay's settings (the
/// lease, the pause a dedup window allows for): an error stops the start-up.
pub(crate) type StartHook =
    Box<dyn Fn(&str, &RetryPolicy, &RelaySettings) -> Result<(), ConfigError> + Send + Sync>;

/// A kind's look at its destination (reachable, set up to take the events),
/// for check-config and doctor, with the same arguments: an error is a
/// config error; the findings are notes and warnings.
pub(crate) type ProbeHook = Box<
    dyn Fn(&str, &RetryPolicy, &RelaySettings) -> Result<Vec<SinkFinding>, ConfigError>
        + Send
        + Sync,
>;

/// What a [`ProbeHook`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SinkFinding {
    /// A warning (something to change), or else a note.
    pub(crate) warning: bool,
    /// What was found, with the numbers, and what to do.
    pub(crate) message: String,
}

/// A constructed sink: the library consumer, and what the rest of the
/// binary needs to know about it.
pub(crate) struct Sink {
    consumer: Run,
    description: String,
    time_limit: Option<Duration>,
    time_limit_key: &'static str,
    start: Option<StartHook>,
    probe: Option<ProbeHook>,
}

/// Where `run` records a span per delivery attempt: the OTLP exporter of
/// `[tracing]` (feature `otlp`), when one is configured.
#[cfg(feature = "otlp")]
pub(crate) type Spans<'a> = Option<&'a crate::otlp::Exporter>;
/// Where `run` records a span per delivery attempt: nowhere, in a build
/// without the `otlp` feature.
#[cfg(not(feature = "otlp"))]
pub(crate) type Spans<'a> = Option<&'a std::convert::Infallible>;

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
    pub(crate) fn new(consumer: impl Consumer, description: impl Into<String>) -> Sink {
        Sink::of(Run::Plain(Box::new(consumer)), description.into())
    }

    /// A `sql` sink: its statements run as a transactional consumer.
    pub(crate) fn sql(sink: SqlSink, description: impl Into<String>) -> Sink {
        Sink::of(Run::Sql(sink), description.into())
    }

    fn of(consumer: Run, description: String) -> Sink {
        Sink {
            consumer,
            description,
            time_limit: None,
            time_limit_key: "timeout",
            start: None,
            probe: None,
        }
    }

    /// Registers the sink on `b` as the consumer `name` of `types`, each
    /// attempt a span of `spans` when there is one.
    pub(crate) fn register(
        self,
        b: RelayBuilder,
        name: &str,
        types: &[String],
        spans: Spans<'_>,
    ) -> RelayBuilder {
        match (self.consumer, spans) {
            #[cfg(feature = "otlp")]
            (Run::Plain(c), Some(e)) => b.consumer(name, types, e.traced(BoxedConsumer(c))),
            #[cfg(feature = "otlp")]
            (Run::Sql(s), Some(e)) => b.transactional_consumer(name, types, e.traced(s)),
            (Run::Plain(c), _) => b.consumer(name, types, BoxedConsumer(c)),
            (Run::Sql(s), _) => b.transactional_consumer(name, types, s),
        }
    }

    /// The statements of a `sql` sink, to check against the database.
    pub(crate) fn sql_statements(&self) -> Option<&SqlSink> {
        match &self.consumer {
            Run::Sql(s) => Some(s),
            Run::Plain(_) => None,
        }
    }

    /// The key that sets the time limit, when it is not `timeout`.
    #[cfg_attr(not(feature = "nats"), allow(dead_code))] // only nats uses it so far
    pub(crate) fn with_time_limit_key(mut self, key: &'static str) -> Sink {
        self.time_limit_key = key;
        self
    }

    /// A connection step for `outboxd run` (see [`StartHook`]).
    #[cfg_attr(not(feature = "nats"), allow(dead_code))] // only nats uses it so far
    pub(crate) fn with_start(mut self, hook: StartHook) -> Sink {
        self.start = Some(hook);
        self
    }

    /// A look at the destination for check-config and doctor.
    pub(crate) fn with_probe(mut self, hook: ProbeHook) -> Sink {
        self.probe = Some(hook);
        self
    }

    /// The key that sets the time limit (`timeout`, `ack_timeout`).
    pub(crate) fn time_limit_key(&self) -> &'static str {
        self.time_limit_key
    }

    /// Runs the kind's connection step for `consumer`, if it has one.
    pub(crate) fn start(
        &self,
        consumer: &str,
        retry: &RetryPolicy,
        relay: &RelaySettings,
    ) -> Result<(), ConfigError> {
        self.start
            .as_ref()
            .map_or(Ok(()), |f| f(consumer, retry, relay))
    }

    /// Looks at the destination of `consumer`, if the kind can (nothing
    /// otherwise).
    pub(crate) fn probe(
        &self,
        consumer: &str,
        retry: &RetryPolicy,
        relay: &RelaySettings,
    ) -> Result<Vec<SinkFinding>, ConfigError> {
        self.probe
            .as_ref()
            .map_or(Ok(Vec::new()), |f| f(consumer, retry, relay))
    }

    /// The longest one delivery may take; the lease must cover it.
    pub(crate) fn with_time_limit(mut self, limit: Duration) -> Sink {
        self.time_limit = Some(limit);
        self
    }

    /// The longest one delivery may take, if the sink bounds it.
    pub(crate) fn time_limit(&self) -> Option<Duration> {
        self.time_limit
    }

    /// A one-line description without secrets, for logs and check-config.
    pub(crate) fn describe(&self) -> &str {
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
pub(crate) enum SinkKind {
    /// JSON lines to stdout or a file.
    Jsonl,
    /// A child program per event.
    Command,
    /// A signed HTTP POST per event.
    Webhook,
    /// A message per event on a NATS JetStream stream.
    Nats,
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
        pub(crate) struct RawSink {
            /// The kind.
            pub(crate) kind: SinkKind,
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
    max_response_bytes: Whole<1, { u64::MAX }>,
    // nats
    /// The NATS server URLs.
    servers: Vec<String>,
    /// The subject template.
    subject: String,
    /// The JetStream stream.
    stream: String,
    /// A NATS credentials (.creds) file.
    creds_file: PathBuf,
    /// The variable holding a NATS token.
    token_env: String,
    /// The NATS user name.
    user: String,
    /// The variable holding the NATS user's password.
    password_env: String,
    /// A file holding an NKey seed.
    nkey_seed_file: PathBuf,
    /// The CA certificates that sign the NATS servers' certificates.
    tls_ca_file: PathBuf,
    /// Refuse a NATS connection without TLS.
    require_tls: bool,
    /// How long a publish waits for JetStream's acknowledgement.
    ack_timeout: Dur,
    /// Create the stream when it is missing.
    create_stream: nats::RawCreateStream,
    // sql
    /// The SQL statements run for each event.
    statements: Vec<String>,
}

/// A kind's own retry schedule, used instead of `[retry]` (a consumer's
/// `[consumer.retry]` still applies on top): receivers behind a webhook may
/// be down for a day.
pub(crate) fn default_retry(kind: SinkKind) -> Option<RetryPolicy> {
    match kind {
        SinkKind::Webhook => Some(RetryPolicy::webhook()),
        SinkKind::Jsonl | SinkKind::Command | SinkKind::Nats | SinkKind::Sql => None,
    }
}

/// Builds the sink at `at` (`consumer[0].sink`); `secret_vars` are the
/// config's [`super::super::secrets::secret_env_vars`].
pub(crate) fn build(
    c: &Checker<'_>,
    at: &str,
    s: &RawSink,
    secret_vars: &[String],
) -> Result<Sink, ConfigError> {
    let (allowed, kind) = match s.kind {
        SinkKind::Jsonl => (jsonl::KEYS, "jsonl"),
        SinkKind::Command => (command::KEYS, "command"),
        SinkKind::Webhook => (webhook::KEYS, "webhook"),
        SinkKind::Nats => (nats::KEYS, "nats"),
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
        SinkKind::Nats => nats::build(c, at, s),
        SinkKind::Sql => sql::build(c, at, s),
    }
}

/// A secret from the environment variable `var`, which the key at `field`
/// names ([`crate::config::secrets::secret_from_env`], its error at `field`).
fn env_secret(c: &Checker<'_>, field: &str, var: &str, what: &str) -> Result<String, ConfigError> {
    super::secrets::secret_from_env(c.env_lookup(), var, what)
        .map_err(|e| c.err(field, e.to_string()))
}

/// At most one of `keys` (each with whether it is set): the second one set
/// is an error at `{at}.{second}` saying that the first is set too, then
/// `one_of`, which lists the choices. Which would win, or whether both
/// apply, is nothing a reader of the file should have to guess.
fn at_most_one(
    c: &Checker<'_>,
    at: &str,
    keys: &[(&str, bool)],
    one_of: &str,
) -> Result<(), ConfigError> {
    let mut set = keys.iter().filter(|(_, on)| *on).map(|(key, _)| key);
    match (set.next(), set.next()) {
        (Some(first), Some(second)) => Err(c.err(
            format!("{at}.{second}"),
            format!("{first} is set too; {one_of}"),
        )),
        _ => Ok(()),
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

    #[test]
    fn a_second_choice_of_one_at_most_is_named_with_the_first() {
        let hook =
            "[[consumer]]\nname = \"h\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"webhook\"\n\
                    url = \"https://example.com/hook\"\n";
        let e = parse(&format!(
            "{hook}secret_env = \"A\"\nsecret_file = \"s\"\nsecrets_env = [\"B\"]\n"
        ))
        .unwrap_err();
        assert_eq!(e.field, "consumer[0].sink.secrets_env");
        assert!(
            e.message
                .starts_with("secret_env is set too; give exactly one of"),
            "{e}"
        );
    }
}
