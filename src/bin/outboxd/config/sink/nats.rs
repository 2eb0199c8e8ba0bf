//! `kind = "nats"`: one message per event on a NATS JetStream stream
//! ([`outboxd::sinks::nats`]).
//!
//! The config is checked without a server. Connecting (and checking the
//! stream, or creating it) is the sink's start hook, run by `outboxd run`
//! before the relay starts; check-config and doctor probe the stream and
//! compare its duplicate window with the consumer's retry schedule.
//! Credentials come from the environment or files, never from the config.

use serde::Deserialize;

use crate::config::values::Dur;

/// The keys a nats sink takes.
pub(crate) const KEYS: &[&str] = &[
    "kind",
    "servers",
    "subject",
    "stream",
    "creds_file",
    "token_env",
    "user",
    "password_env",
    "nkey_seed_file",
    "tls_ca_file",
    "require_tls",
    "ack_timeout",
    "connect_timeout",
    "create_stream",
];

/// `create_stream = { … }` as written.
#[derive(Debug, Deserialize)]
#[cfg_attr(not(feature = "nats"), allow(dead_code))]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCreateStream {
    replicas: Option<usize>,
    duplicate_window: Option<Dur>,
    max_age: Option<Dur>,
    storage: Option<RawStorage>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawStorage {
    File,
    Memory,
}

/// Without the `nats` feature, a nats sink is refused by name.
#[cfg(not(feature = "nats"))]
pub(crate) fn build(
    c: &crate::config::Checker<'_>,
    at: &str,
    _s: &super::RawSink,
) -> Result<super::Sink, crate::config::ConfigError> {
    Err(c.err(
        format!("{at}.kind"),
        "\"nats\" needs an outboxd built with the nats feature (the default build has it)",
    ))
}

#[cfg(feature = "nats")]
pub(crate) use with_nats::build;

#[cfg(feature = "nats")]
mod with_nats {
    use std::sync::{Arc, OnceLock};
    use std::time::Duration;

    use outboxd::consumer::{Consumer, Delivery, Outcome};
    use outboxd::sinks::nats::{
        CreateStream, DuplicateWindowCheck, NatsAuth, NatsError, NatsSink, NatsSinkBuilder,
        Storage, DEFAULT_ACK_TIMEOUT, DEFAULT_DUPLICATE_WINDOW,
    };
    use outboxd::RetryPolicy;

    use super::{RawCreateStream, RawStorage};
    use crate::config::checker::Checker;
    use crate::config::error::ConfigError;
    use crate::config::sink::{at_most_one, env_secret, positive, RawSink, Sink, SinkFinding};
    use crate::config::RelaySettings;
    use outboxd::clock::format_duration as human;

    /// Builds a nats sink: every key checked, credentials read, nothing
    /// connected yet.
    pub(crate) fn build(c: &Checker<'_>, at: &str, s: &RawSink) -> Result<Sink, ConfigError> {
        let servers = match &s.servers {
            Some(list) if !list.is_empty() => list.clone(),
            _ => {
                return Err(c.err(
                    format!("{at}.servers"),
                    "is missing; a nats sink needs servers = [\"nats://127.0.0.1:4222\"] \
                     (nats:// or tls:// URLs, one or more)",
                ))
            }
        };
        let stream = s.stream.clone().ok_or_else(|| {
            c.err(
                format!("{at}.stream"),
                "is missing; name the JetStream stream that takes the events, such as \
                 stream = \"EVENTS\"",
            )
        })?;
        let mut b = NatsSink::builder(servers.clone(), stream.clone()).auth(auth(c, at, s)?);
        if let Some(t) = &s.subject {
            b = b.subject(t.clone());
        }
        if let Some(p) = &s.tls_ca_file {
            b = b.tls_ca_file(c.resolve(p));
        }
        if let Some(r) = s.require_tls {
            b = b.require_tls(r);
        }
        let ack_timeout =
            positive(c, at, "ack_timeout", s.ack_timeout)?.unwrap_or(DEFAULT_ACK_TIMEOUT);
        b = b.ack_timeout(ack_timeout);
        if let Some(t) = positive(c, at, "connect_timeout", s.connect_timeout)? {
            b = b.connect_timeout(t);
        }
        let create = match &s.create_stream {
            Some(raw) => Some(create_spec(c, at, raw)?),
            None => None,
        };
        b = b.create_stream(create.clone());
        let window_given = s
            .create_stream
            .as_ref()
            .is_some_and(|raw| raw.duplicate_window.is_some());
        let errors = Errors {
            proto: c.err(at, ""),
            at: at.to_string(),
            servers: servers.clone(),
        };
        b.validate().map_err(|e| errors.of(&e))?;

        let description = format!(
            "nats {} stream {stream} subject {} (ack timeout {}{})",
            servers.join(","),
            s.subject
                .as_deref()
                .unwrap_or(outboxd::sinks::nats::DEFAULT_SUBJECT),
            outboxd::clock::format_duration(ack_timeout),
            if create.is_some() {
                ", creates the stream if missing"
            } else {
                ""
            }
        );
        let lazy = Arc::new(Lazy {
            builder: b,
            sink: OnceLock::new(),
            errors,
            ack_timeout,
            create: create.map(|spec| (spec, window_given)),
        });
        let (start, probe) = (lazy.clone(), lazy.clone());
        Ok(Sink::new(NatsConsumer(lazy), description)
            .with_time_limit(ack_timeout)
            .with_time_limit_key("ack_timeout")
            .with_start(Box::new(move |consumer, retry, relay| {
                start.start(consumer, retry, relay)
            }))
            .with_probe(Box::new(move |consumer, retry, relay| {
                probe.probe(consumer, retry, relay)
            })))
    }

    /// The credentials: at most one way, secrets from the environment or
    /// files.
    fn auth(c: &Checker<'_>, at: &str, s: &RawSink) -> Result<NatsAuth, ConfigError> {
        at_most_one(
            c,
            at,
            &[
                ("creds_file", s.creds_file.is_some()),
                ("token_env", s.token_env.is_some()),
                ("user", s.user.is_some() || s.password_env.is_some()),
                ("nkey_seed_file", s.nkey_seed_file.is_some()),
            ],
            "use one way to authenticate: creds_file, token_env, user + password_env, or \
             nkey_seed_file",
        )?;
        if let Some(p) = &s.creds_file {
            return Ok(NatsAuth::CredsFile(c.resolve(p)));
        }
        if let Some(p) = &s.nkey_seed_file {
            return Ok(NatsAuth::NkeySeedFile(c.resolve(p)));
        }
        if let Some(var) = &s.token_env {
            let token = env_secret(c, &format!("{at}.token_env"), var, "the NATS token")?;
            return Ok(NatsAuth::Token(token));
        }
        match (&s.user, &s.password_env) {
            (None, None) => Ok(NatsAuth::None),
            (Some(_), None) => Err(c.err(
                format!("{at}.password_env"),
                "is missing; user needs password_env, the environment variable holding \
                 the password",
            )),
            (None, Some(_)) => Err(c.err(
                format!("{at}.user"),
                "is missing; password_env needs the user it is the password of",
            )),
            (Some(user), Some(var)) => {
                if user.is_empty() {
                    return Err(c.err(format!("{at}.user"), "is empty; give the NATS user name"));
                }
                let password = env_secret(
                    c,
                    &format!("{at}.password_env"),
                    var,
                    "the NATS user's password",
                )?;
                Ok(NatsAuth::UserPassword {
                    user: user.clone(),
                    password,
                })
            }
        }
    }

    fn create_spec(
        c: &Checker<'_>,
        at: &str,
        raw: &RawCreateStream,
    ) -> Result<CreateStream, ConfigError> {
        let at = format!("{at}.create_stream");
        let d = CreateStream::default();
        // The library checks the ranges (replicas 1 to 5, the window
        // against max_age); its errors name these keys.
        Ok(CreateStream {
            replicas: raw.replicas.unwrap_or(d.replicas),
            duplicate_window: positive(c, &at, "duplicate_window", raw.duplicate_window)?
                .unwrap_or(d.duplicate_window),
            max_age: raw.max_age.map_or(d.max_age, |x| x.0),
            storage: match raw.storage {
                None | Some(RawStorage::File) => Storage::File,
                Some(RawStorage::Memory) => Storage::Memory,
            },
        })
    }

    /// Turns the library's errors into config errors at the key they are
    /// about.
    struct Errors {
        /// An error at the sink (for the file).
        proto: ConfigError,
        at: String,
        servers: Vec<String>,
    }

    impl Errors {
        /// `servers[i]` for the first server `is` picks, else `servers`.
        fn server_field(&self, is: impl Fn(&str) -> bool) -> String {
            match self.servers.iter().position(|s| is(s)) {
                Some(i) => format!("{}.servers[{i}]", self.at),
                None => format!("{}.servers", self.at),
            }
        }

        fn of(&self, e: &NatsError) -> ConfigError {
            let at = &self.at;
            let mut message = e.to_string();
            let field = match e {
                NatsError::Server { url, .. } => self.server_field(|s| s.ends_with(url.as_str())),
                NatsError::NoSuchHost { host, .. } => {
                    self.server_field(|s| s.contains(&format!("//{host}")))
                }
                _ => match e.field() {
                    "token" => format!("{at}.token_env"),
                    "password" => format!("{at}.password_env"),
                    "auth" => {
                        message.push_str(
                            "; the server wants credentials: set creds_file, token_env, \
                             user + password_env, or nkey_seed_file",
                        );
                        at.clone()
                    }
                    "runtime" => at.clone(),
                    key => format!("{at}.{key}"),
                },
            };
            ConfigError {
                field,
                message,
                ..self.proto.clone()
            }
        }
    }

    /// The sink, connected by the start hook.
    struct Lazy {
        builder: NatsSinkBuilder,
        sink: OnceLock<NatsSink>,
        errors: Errors,
        ack_timeout: Duration,
        /// `create_stream`, if the sink may create the stream, and whether
        /// its `duplicate_window` was given (else it is sized here).
        create: Option<(CreateStream, bool)>,
    }

    impl Lazy {
        /// How `create_stream` makes the stream for `consumer`: without a
        /// `duplicate_window`, with the one its repeats need (None: the
        /// sink creates no stream), and the note saying so.
        fn creation(
            &self,
            consumer: &str,
            retry: &RetryPolicy,
            relay: &RelaySettings,
        ) -> Option<(CreateStream, Option<String>)> {
            let (spec, given) = self.create.clone()?;
            if given {
                return Some((spec, None));
            }
            let horizon = DuplicateWindowCheck::new(
                retry,
                relay.lease,
                self.ack_timeout,
                DEFAULT_DUPLICATE_WINDOW,
            )
            .horizon();
            let pause = relay.max_pause_for_dedup;
            // Whole minutes up, so the figure shown is the sum of the two
            // shown beside it.
            let needed = horizon.saturating_add(pause).as_secs().div_ceil(60) * 60;
            let mut window = Duration::from_secs(needed);
            let mut capped = String::new();
            if !spec.max_age.is_zero() && window > spec.max_age {
                window = spec.max_age;
                capped = format!(
                    ", cut to create_stream.max_age ({}): a repeat after that is stored twice",
                    human(spec.max_age)
                );
            }
            let note = format!(
                "stream {stream} is created with duplicate window {} (create_stream sets no \
                 duplicate_window): consumer {consumer} may publish an event again up to {} \
                 after its first publish (its retry schedule, ack_timeout and relay.lease), \
                 plus relay.max_pause_for_dedup {}{capped}. The cost: JetStream keeps the id of \
                 every message published within the window in the server's memory for that \
                 long: at 100 events a second, {} ids (set create_stream.duplicate_window, or \
                 shorten the schedule or max_pause_for_dedup, to hold fewer)",
                human(window),
                outboxd::clock::format_duration_at_least(horizon),
                human(pause),
                100 * window.as_secs(),
                stream = self.builder.stream_name(),
            );
            Some((
                CreateStream {
                    duplicate_window: window,
                    ..spec
                },
                Some(note),
            ))
        }

        fn start(
            &self,
            consumer: &str,
            retry: &RetryPolicy,
            relay: &RelaySettings,
        ) -> Result<(), ConfigError> {
            if self.sink.get().is_some() {
                return Ok(());
            }
            let creation = self.creation(consumer, retry, relay);
            let note = creation.as_ref().and_then(|(_, n)| n.clone());
            let sink = self
                .builder
                .clone()
                .create_stream(creation.map(|(spec, _)| spec))
                .build()
                .map_err(|e| self.errors.of(&e))?;
            match sink.stream() {
                Some(s) => {
                    if let (true, Some(note)) = (s.created, &note) {
                        tracing::info!(consumer, "{note}");
                    }
                    let check = DuplicateWindowCheck::new(
                        retry,
                        relay.lease,
                        self.ack_timeout,
                        s.duplicate_window,
                    );
                    if let Some(w) = check.warning(&s.name, consumer) {
                        tracing::warn!(consumer, "{w}");
                    }
                }
                None => tracing::info!(
                    consumer,
                    "the stream's duplicate window is checked against the retry schedule by \
                     `outboxd doctor --config` once NATS is reachable"
                ),
            }
            let _ = self.sink.set(sink);
            Ok(())
        }

        fn probe(
            &self,
            consumer: &str,
            retry: &RetryPolicy,
            relay: &RelaySettings,
        ) -> Result<Vec<SinkFinding>, ConfigError> {
            let note = |message: String| SinkFinding {
                warning: false,
                message,
            };
            let warn = |message: String| SinkFinding {
                warning: true,
                message,
            };
            let stream = self.builder.stream_name();
            let creation = self.creation(consumer, retry, relay);
            let create_window = creation.as_ref().map(|(spec, _)| spec.duplicate_window);
            let mut found = Vec::new();
            let window = match self.builder.probe() {
                Ok(Some(s)) => {
                    found.push(note(s.to_string()));
                    Some(s.duplicate_window)
                }
                Ok(None) => {
                    found.push(note(format!(
                        "stream {stream} does not exist yet; `outboxd run` creates it \
                         (create_stream)"
                    )));
                    if let Some((_, Some(sized))) = &creation {
                        found.push(note(sized.clone()));
                    }
                    create_window
                }
                Err(
                    e @ (NatsError::Unreachable { .. } | NatsError::JetStreamUnavailable { .. }),
                ) => {
                    found.push(warn(format!(
                        "{e}; the stream was not checked (outboxd run starts anyway and \
                         retries until it is reachable)"
                    )));
                    create_window
                }
                Err(e) => return Err(self.errors.of(&e)),
            };
            let check = DuplicateWindowCheck::new(
                retry,
                relay.lease,
                self.ack_timeout,
                window.unwrap_or(DEFAULT_DUPLICATE_WINDOW),
            );
            if let Some(w) = check.warning(stream, consumer) {
                found.push(warn(match window {
                    Some(_) => w,
                    None => format!("assuming JetStream's default duplicate window: {w}"),
                }));
            }
            Ok(found)
        }
    }

    /// The consumer the relay holds: the sink once started.
    struct NatsConsumer(Arc<Lazy>);

    impl Consumer for NatsConsumer {
        fn deliver(&self, delivery: &Delivery) -> Outcome {
            match self.0.sink.get() {
                Some(sink) => sink.deliver(delivery),
                None => {
                    Outcome::retry("the NATS sink is not connected: its start-up step has not run")
                }
            }
        }
    }
}

#[cfg(all(test, feature = "nats"))]
mod tests {
    use crate::config::tests::{parse, parse_with_env};

    const HEAD: &str =
        "[[consumer]]\nname = \"bus\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"nats\"\n";

    fn nats(keys: &str) -> Result<crate::config::Config, crate::config::ConfigError> {
        parse(&format!("{HEAD}{keys}"))
    }

    fn field(keys: &str) -> String {
        nats(keys).unwrap_err().field
    }

    const OK: &str = "servers = [\"nats://127.0.0.1:4222\"]\nstream = \"EVENTS\"\n";

    #[test]
    fn a_full_sink_parses_without_connecting() {
        let c = parse_with_env(
            &format!(
                "{HEAD}{OK}subject = \"events.{{tenant}}.{{event_type}}\"\ntoken_env = \"CONFIG_UNIT_NATS_TOKEN\"\n\
                 ack_timeout = \"2s\"\nconnect_timeout = \"1s\"\nrequire_tls = false\n\
                 create_stream = {{ replicas = 3, duplicate_window = \"10m\", max_age = \"1d\", storage = \"memory\" }}\n"
            ),
            &[("CONFIG_UNIT_NATS_TOKEN", "t0ken")],
        )
        .unwrap();
        let d = c.consumers[0].sink.describe();
        assert!(
            d.contains("stream EVENTS") && d.contains("events.{tenant}.{event_type}"),
            "{d}"
        );
        assert!(!d.contains("t0ken"), "{d}");
        assert_eq!(
            c.consumers[0].sink.time_limit(),
            Some(std::time::Duration::from_secs(2))
        );
    }

    #[test]
    fn each_mistake_is_named_by_its_key() {
        assert_eq!(field("stream = \"EVENTS\"\n"), "consumer[0].sink.servers");
        assert_eq!(
            field("servers = [\"nats://127.0.0.1:4222\"]\n"),
            "consumer[0].sink.stream"
        );
        assert_eq!(
            field("servers = [\"nats://a:4222\", \"http://b\"]\nstream = \"EVENTS\"\n"),
            "consumer[0].sink.servers[1]"
        );
        assert_eq!(
            field(&format!("{OK}subject = \"events.{{nope}}\"\n")),
            "consumer[0].sink.subject"
        );
        assert_eq!(
            field(&format!("{OK}token_env = \"CONFIG_UNIT_NATS_UNSET\"\n")),
            "consumer[0].sink.token_env"
        );
        assert_eq!(
            field(&format!("{OK}user = \"u\"\n")),
            "consumer[0].sink.password_env"
        );
        assert_eq!(
            field(&format!(
                "{OK}creds_file = \"a.creds\"\nnkey_seed_file = \"a.nk\"\n"
            )),
            "consumer[0].sink.nkey_seed_file"
        );
        assert_eq!(
            field(&format!("{OK}creds_file = \"missing.creds\"\n")),
            "consumer[0].sink.creds_file"
        );
        assert_eq!(
            field(&format!("{OK}create_stream = {{ replicas = 9 }}\n")),
            "consumer[0].sink.create_stream.replicas"
        );
        assert_eq!(
            field(&format!("{OK}create_stream = {{ storage = \"tape\" }}\n")),
            "consumer[0].sink.create_stream.storage"
        );
        assert_eq!(
            field(&format!("{OK}url = \"http://x\"\n")),
            "consumer[0].sink.url"
        );
        let e = parse(&format!(
            "[relay]\nlease = \"2s\"\n{HEAD}{OK}ack_timeout = \"5s\"\n"
        ))
        .unwrap_err();
        assert_eq!(e.field, "consumer[0].sink.ack_timeout");
    }
}
