//! The NATS JetStream sink: each event becomes one message on a stream, so
//! services on any machine can consume it from there.
//!
//! The body is the envelope JSON, byte for byte what the webhook and
//! JSON-lines sinks deliver ([`Envelope::to_json`]); the `Nats-Msg-Id`
//! header is the event id (for a legacy row, [`EventId::for_legacy_row`]),
//! the same on every retry, so JetStream drops a repeat within the stream's
//! duplicate window, and `Outboxd-*` headers carry the rest of the envelope.
//! An event is delivered once JetStream acknowledged it; no acknowledgement
//! within `ack_timeout`, no connection or no responders is a retry; an
//! invalid subject, one the stream is confirmed not to take, or a message
//! too large is poison. docs/nats.md has every header and outcome, how the
//! cached stream subjects are checked again, and an example.
//!
//! [`NatsSinkBuilder::build`] connects and checks the stream: a missing one
//! (unless `create_stream` is set), one that takes none of the template's
//! subjects, or refused credentials are errors; a server that cannot be
//! reached is not (the sink connects in the background and retries its
//! deliveries meanwhile). The sink owns a one-thread tokio runtime for the
//! connection; each relay worker blocks on its own publish
//! ([`Handle::block_on`]), queued on the shared connection without waiting
//! for the others, so the relay's worker count is the number of publishes
//! in flight. Nothing async leaves this module.
//!
//! [`Handle::block_on`]: tokio::runtime::Handle::block_on
//! [`Envelope::to_json`]: crate::envelope::Envelope::to_json
//! [`EventId::for_legacy_row`]: crate::envelope::EventId::for_legacy_row

mod connection;
mod message;
mod subject;
mod window;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use subject::{SubjectTemplate, SubjectTemplateError, DEFAULT_SUBJECT};
pub use window::{DuplicateWindowCheck, DEFAULT_DUPLICATE_WINDOW};

use crate::consumer::{Consumer, Delivery, Outcome};
use connection::Shared;

/// docs/nats.md's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/nats.md")]
pub struct NatsDoctests;

/// How long a publish waits for JetStream's acknowledgement, unless
/// configured.
pub const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// How long connecting to one server may take, unless configured.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How the sink proves who it is. Secrets are given as values (the binary
/// reads them from the environment or a file, never from its config).
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum NatsAuth {
    /// No credentials.
    #[default]
    None,
    /// A token.
    Token(String),
    /// A user name and password.
    UserPassword {
        /// The user.
        user: String,
        /// The password.
        password: String,
    },
    /// A `.creds` file (a user JWT and its NKey seed), as `nsc` writes it.
    CredsFile(PathBuf),
    /// A file holding an NKey seed (`SU…`).
    NkeySeedFile(PathBuf),
}

impl NatsAuth {
    /// The builder field this method is set by, for error messages.
    fn field(&self) -> &'static str {
        match self {
            NatsAuth::None => "auth",
            NatsAuth::Token(_) => "token",
            NatsAuth::UserPassword { .. } => "password",
            NatsAuth::CredsFile(_) => "creds_file",
            NatsAuth::NkeySeedFile(_) => "nkey_seed_file",
        }
    }
}

impl fmt::Debug for NatsAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NatsAuth::None => f.write_str("None"),
            NatsAuth::Token(_) => f.write_str("Token(<redacted>)"),
            NatsAuth::UserPassword { user, .. } => {
                write!(f, "UserPassword {{ user: {user:?}, password: <redacted> }}")
            }
            NatsAuth::CredsFile(p) => f.debug_tuple("CredsFile").field(p).finish(),
            NatsAuth::NkeySeedFile(p) => f.debug_tuple("NkeySeedFile").field(p).finish(),
        }
    }
}

/// Where a created stream keeps its messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Storage {
    /// On disk (survives a server restart).
    #[default]
    File,
    /// In memory.
    Memory,
}

/// How to create the stream when it is missing.
#[derive(Debug, Clone, PartialEq)]
pub struct CreateStream {
    /// Copies of each message, on that many servers (1 to 5).
    pub replicas: usize,
    /// How long JetStream remembers a message id to drop a repeat.
    pub duplicate_window: Duration,
    /// How long messages are kept; zero keeps them until other limits.
    pub max_age: Duration,
    /// File or memory.
    pub storage: Storage,
}

impl Default for CreateStream {
    /// One replica, the default duplicate window, no age limit, on file.
    fn default() -> Self {
        CreateStream {
            replicas: 1,
            duplicate_window: DEFAULT_DUPLICATE_WINDOW,
            max_age: Duration::ZERO,
            storage: Storage::File,
        }
    }
}

/// What the server says about the sink's stream.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSummary {
    /// The stream's name.
    pub name: String,
    /// The subjects (filters) it takes.
    pub subjects: Vec<String>,
    /// How long it remembers message ids.
    pub duplicate_window: Duration,
    /// Its replicas.
    pub replicas: usize,
    /// Its storage.
    pub storage: Storage,
    /// Messages it holds.
    pub messages: u64,
    /// True when the sink created it just now.
    pub created: bool,
}

impl fmt::Display for StreamSummary {
    /// `stream EVENTS takes events.> (12 messages, 3 replicas, file storage,
    /// duplicate window 2m)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stream {} takes {} ({} messages, {} replica{}, {} storage, duplicate window {})",
            self.name,
            self.subjects.join(", "),
            self.messages,
            self.replicas,
            if self.replicas == 1 { "" } else { "s" },
            match self.storage {
                Storage::File => "file",
                Storage::Memory => "memory",
            },
            window::human(self.duplicate_window)
        )
    }
}

/// A NATS sink could not be set up. Each variant names the builder field it
/// is about ([`NatsError::field`]); none holds a secret.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsError {
    /// No server was given.
    #[error("no NATS server given; list one or more URLs such as nats://127.0.0.1:4222")]
    NoServers,
    /// A server URL is not usable.
    #[error("NATS server {url:?}: {reason}")]
    Server {
        /// The URL as given (credentials, if any, cut out).
        url: String,
        /// Why.
        reason: String,
    },
    /// The subject template is not usable.
    #[error(transparent)]
    Subject(#[from] SubjectTemplateError),
    /// The stream name is not a JetStream stream name.
    #[error("stream name {name:?} is not allowed: {reason}")]
    StreamName {
        /// The name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// A setting is out of range.
    #[error("{field}: {reason}")]
    Setting {
        /// The field.
        field: &'static str,
        /// What is allowed.
        reason: String,
    },
    /// A credentials or certificate file could not be read or parsed.
    #[error("cannot use {what} {path}: {reason}")]
    File {
        /// The builder field.
        field: &'static str,
        /// What the file is ("credentials file").
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A credential given as a value is empty or malformed.
    #[error("the {field} is unusable: {reason}")]
    Credential {
        /// The builder field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The server refused the credentials.
    #[error("NATS server {servers} refused the credentials ({field}): {reason}")]
    Authorization {
        /// The servers.
        servers: String,
        /// The builder field of the credentials used.
        field: &'static str,
        /// The server's answer.
        reason: String,
    },
    /// TLS could not be set up with the server.
    #[error("cannot set up TLS with NATS server {servers}: {reason} (check tls_ca_file, require_tls and the tls:// URL)")]
    Tls {
        /// The servers.
        servers: String,
        /// Why.
        reason: String,
    },
    /// A server's host name does not exist (only from
    /// [`NatsSinkBuilder::probe`]).
    #[error("NATS server {url}: host {host} does not exist ({reason}); correct the host name")]
    NoSuchHost {
        /// The server, as `scheme://host:port`.
        url: String,
        /// Its host.
        host: String,
        /// The resolver's answer.
        reason: String,
    },
    /// The TLS handshake cannot succeed (only from
    /// [`NatsSinkBuilder::probe`]): the server's certificate is not
    /// trusted or not for the host, or one side wants TLS and the other
    /// does not speak it.
    #[error("TLS with NATS server {servers} cannot work: {reason}; {fix}")]
    TlsMismatch {
        /// The servers.
        servers: String,
        /// The builder field to change.
        field: &'static str,
        /// What the handshake said.
        reason: String,
        /// What to change.
        fix: String,
    },
    /// No server could be reached (only from [`NatsSinkBuilder::probe`];
    /// [`NatsSinkBuilder::build`] keeps trying in the background instead).
    #[error("cannot connect to NATS server {servers}: {reason}")]
    Unreachable {
        /// The servers.
        servers: String,
        /// Why.
        reason: String,
    },
    /// The JetStream API did not answer (only from
    /// [`NatsSinkBuilder::probe`]).
    #[error("the JetStream API of {servers} did not answer: {reason}")]
    JetStreamUnavailable {
        /// The servers.
        servers: String,
        /// Why.
        reason: String,
    },
    /// The stream does not exist and `create_stream` is not set.
    #[error(
        "stream {stream} does not exist on {servers}, so no stream takes subject {subject:?}; \
         create it (nats stream add {stream} --subjects '{filter}') or set create_stream"
    )]
    StreamMissing {
        /// The stream.
        stream: String,
        /// The subject template.
        subject: String,
        /// The filter that takes every subject of the template.
        filter: String,
        /// The servers.
        servers: String,
    },
    /// The stream takes none of the template's subjects.
    #[error(
        "stream {stream} takes subjects {stream_subjects:?}, none of which match subject \
         {subject:?} (every subject of it matches {filter:?}); add {filter:?} to the stream's \
         subjects or change the subject template"
    )]
    StreamSubjects {
        /// The stream.
        stream: String,
        /// The subject template.
        subject: String,
        /// The filter that takes every subject of the template.
        filter: String,
        /// The stream's subjects.
        stream_subjects: Vec<String>,
    },
    /// The stream was missing and could not be created.
    #[error("cannot create stream {stream}: {reason}")]
    CreateStream {
        /// The stream.
        stream: String,
        /// The server's answer.
        reason: String,
    },
    /// JetStream is not enabled for the account on the server.
    #[error("JetStream is not enabled on {servers} (or not for this account): {reason}")]
    JetStreamDisabled {
        /// The servers.
        servers: String,
        /// The server's answer.
        reason: String,
    },
    /// The sink's runtime could not be started.
    #[error("cannot start the NATS sink's runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

impl NatsError {
    /// The builder field the error is about: `servers`, `subject`,
    /// `stream`, `token`, `password`, `creds_file`, `nkey_seed_file`,
    /// `tls_ca_file`, `create_stream`, `ack_timeout`, `connect_timeout`…
    pub fn field(&self) -> &'static str {
        match self {
            NatsError::NoServers
            | NatsError::Server { .. }
            | NatsError::NoSuchHost { .. }
            | NatsError::Unreachable { .. }
            | NatsError::JetStreamUnavailable { .. }
            | NatsError::JetStreamDisabled { .. } => "servers",
            NatsError::Subject(_) => "subject",
            NatsError::StreamName { .. }
            | NatsError::StreamMissing { .. }
            | NatsError::StreamSubjects { .. } => "stream",
            NatsError::Setting { field, .. }
            | NatsError::File { field, .. }
            | NatsError::Credential { field, .. }
            | NatsError::Authorization { field, .. }
            | NatsError::TlsMismatch { field, .. } => field,
            NatsError::Tls { .. } => "tls_ca_file",
            NatsError::CreateStream { .. } => "create_stream",
            NatsError::Runtime(_) => "runtime",
        }
    }
}

/// Builds a [`NatsSink`]; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct NatsSinkBuilder {
    servers: Vec<String>,
    stream: String,
    subject: String,
    auth: NatsAuth,
    tls_ca_file: Option<PathBuf>,
    require_tls: bool,
    ack_timeout: Duration,
    connect_timeout: Duration,
    create_stream: Option<CreateStream>,
}

impl NatsSinkBuilder {
    /// The subject template (default [`DEFAULT_SUBJECT`]).
    pub fn subject(mut self, template: impl Into<String>) -> Self {
        self.subject = template.into();
        self
    }

    /// The credentials (default none).
    pub fn auth(mut self, auth: NatsAuth) -> Self {
        self.auth = auth;
        self
    }

    /// A PEM file of the certificate authorities that sign the servers'
    /// certificates (added to the system's roots).
    pub fn tls_ca_file(mut self, path: impl AsRef<Path>) -> Self {
        self.tls_ca_file = Some(path.as_ref().to_path_buf());
        self
    }

    /// Refuse a connection without TLS (default: TLS when the URL is
    /// `tls://` or the server requires it).
    pub fn require_tls(mut self, required: bool) -> Self {
        self.require_tls = required;
        self
    }

    /// How long a publish waits for its acknowledgement (default
    /// [`DEFAULT_ACK_TIMEOUT`]); a relay's lease must be longer.
    pub fn ack_timeout(mut self, d: Duration) -> Self {
        self.ack_timeout = d;
        self
    }

    /// How long connecting to one server may take (default
    /// [`DEFAULT_CONNECT_TIMEOUT`]).
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Create the stream like this when it is missing (default: a missing
    /// stream is an error).
    pub fn create_stream(mut self, spec: Option<CreateStream>) -> Self {
        self.create_stream = spec;
        self
    }

    /// The stream's name.
    pub fn stream_name(&self) -> &str {
        &self.stream
    }

    /// Checks everything that needs no server: the URLs, the template, the
    /// stream name, the ranges, and that credential and certificate files
    /// can be read and parsed.
    pub fn validate(&self) -> Result<(), NatsError> {
        connection::Plan::new(self).map(|_| ())
    }

    /// Connects (within `connect_timeout`, without retrying) and checks the
    /// stream, creating nothing. `Ok(None)` when the stream is missing and
    /// `create_stream` would create it.
    pub fn probe(&self) -> Result<Option<StreamSummary>, NatsError> {
        connection::probe(connection::Plan::new(self)?)
    }

    /// Validates, connects and checks (or creates) the stream; see the
    /// [module docs](self) for what fails here and what is retried later.
    pub fn build(self) -> Result<NatsSink, NatsError> {
        let plan = connection::Plan::new(&self)?;
        let (runtime, shared) = connection::start(plan)?;
        Ok(NatsSink {
            shared,
            runtime: Some(runtime),
        })
    }
}

/// Publishes each event to a JetStream stream and reports it delivered once
/// JetStream acknowledged it. Built with [`NatsSink::builder`]; see the
/// [module docs](self).
pub struct NatsSink {
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl NatsSink {
    /// Starts a builder for the given servers (`nats://host:port` or
    /// `tls://host:port`) and stream.
    pub fn builder<I, S>(servers: I, stream: impl Into<String>) -> NatsSinkBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        NatsSinkBuilder {
            servers: servers.into_iter().map(Into::into).collect(),
            stream: stream.into(),
            subject: DEFAULT_SUBJECT.to_string(),
            auth: NatsAuth::None,
            tls_ca_file: None,
            require_tls: false,
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            create_stream: None,
        }
    }

    /// How long a publish waits for its acknowledgement.
    pub fn ack_timeout(&self) -> Duration {
        self.shared.ack_timeout
    }

    /// The stream as last checked, None until the sink has connected and
    /// checked it.
    pub fn stream(&self) -> Option<StreamSummary> {
        self.shared.summary()
    }

    /// A one-line description without secrets, for logs.
    pub fn describe(&self) -> String {
        format!(
            "nats {} stream {} subject {} (ack timeout {:?})",
            self.shared.servers, self.shared.stream, self.shared.template, self.shared.ack_timeout
        )
    }
}

impl Consumer for NatsSink {
    fn deliver(&self, delivery: &Delivery) -> Outcome {
        let handle = self
            .runtime
            .as_ref()
            .expect("the runtime lives until drop")
            .handle();
        self.shared.publish(handle, delivery)
    }
}

impl Drop for NatsSink {
    fn drop(&mut self) {
        // Every delivery has returned by now (the relay is done with the
        // sink), so nothing waits on the runtime: do not let a stuck socket
        // hold the process.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(1));
        }
    }
}

impl fmt::Debug for NatsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsSink")
            .field("servers", &self.shared.servers)
            .field("stream", &self.shared.stream)
            .field("subject", &self.shared.template.as_str())
            .field("ack_timeout", &self.shared.ack_timeout)
            .finish_non_exhaustive()
    }
}
