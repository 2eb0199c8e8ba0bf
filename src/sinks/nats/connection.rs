//! The sink's runtime, its connection and the stream check.
//!
//! [`Plan`] is a builder checked without a server. [`start`] starts the
//! runtime (one thread, `outboxd-nats`), connects, and checks the stream;
//! when the server cannot be reached it connects in the background instead,
//! and a task on the runtime checks the stream once connected. Until the
//! stream is checked, [`Shared::publish`] answers Retry at once, with the
//! reason.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_nats::connection::State;
use async_nats::jetstream::context::{
    Context, ContextBuilder, GetStreamErrorKind, PublishError, PublishErrorKind,
};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream;
use async_nats::{Client, ConnectErrorKind, ConnectOptions, Event, ServerAddr};
use tokio::runtime::{Handle, Runtime};
use tokio::sync::Notify;

use super::subject::{filter_covers, filters_overlap};
use super::{
    message, CreateStream, NatsAuth, NatsError, NatsSinkBuilder, Storage, StreamSummary,
    SubjectTemplate,
};
use crate::consumer::{Delivery, Outcome};

/// How often a stream that was refused (missing, wrong subjects) is checked
/// again, so that fixing it on the server heals the sink without a restart.
const RECHECK_REFUSED: Duration = Duration::from_secs(10);

/// How often the check is tried again while the JetStream API does not
/// answer.
const RECHECK_UNANSWERED: Duration = Duration::from_secs(1);

/// JetStream's "stream not found".
const STREAM_NOT_FOUND: u64 = 10059;
/// JetStream is not enabled, on the server or for the account.
const JETSTREAM_NOT_ENABLED: [u64; 2] = [10076, 10039];
/// The cluster cannot place the stream yet (no meta leader, peers missing).
const CLUSTER_NOT_READY: [u64; 3] = [10008, 10004, 10005];

/// Credentials, read and parsed.
#[derive(Clone)]
enum Credentials {
    None,
    Token(String),
    UserPassword(String, String),
    /// The creds file's text.
    Creds(String),
    /// The seed.
    Nkey(String),
}

/// A builder with everything checked that needs no server.
pub(super) struct Plan {
    servers: Vec<ServerAddr>,
    shown: String,
    stream: String,
    template: SubjectTemplate,
    credentials: Credentials,
    auth_field: &'static str,
    tls_ca_file: Option<PathBuf>,
    require_tls: bool,
    ack_timeout: Duration,
    connect_timeout: Duration,
    create_stream: Option<CreateStream>,
}

impl Plan {
    pub(super) fn new(b: &NatsSinkBuilder) -> Result<Plan, NatsError> {
        if b.servers.is_empty() {
            return Err(NatsError::NoServers);
        }
        let mut servers = Vec::with_capacity(b.servers.len());
        for url in &b.servers {
            servers.push(server_addr(url)?);
        }
        let shown = servers
            .iter()
            .map(|s| format!("{}://{}:{}", s.scheme(), s.host(), s.port()))
            .collect::<Vec<_>>()
            .join(",");
        check_stream_name(&b.stream)?;
        let template = SubjectTemplate::parse(&b.subject)?;
        let positive = |field, d: Duration| {
            if d.is_zero() || d > Duration::from_secs(3600) {
                Err(NatsError::Setting {
                    field,
                    reason: format!("{d:?} is out of range; allowed: 1ms to 1h"),
                })
            } else {
                Ok(d)
            }
        };
        let ack_timeout = positive("ack_timeout", b.ack_timeout)?;
        let connect_timeout = positive("connect_timeout", b.connect_timeout)?;
        if let Some(c) = &b.create_stream {
            check_create(c)?;
        }
        if let Some(path) = &b.tls_ca_file {
            let pem = read_file("tls_ca_file", "CA certificate file", path)?;
            if !pem.contains("-----BEGIN CERTIFICATE-----") {
                return Err(NatsError::File {
                    field: "tls_ca_file",
                    what: "CA certificate file",
                    path: path.clone(),
                    reason: "it holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
                });
            }
        }
        let credentials = credentials(&b.auth)?;
        Ok(Plan {
            servers,
            shown,
            stream: b.stream.clone(),
            template,
            credentials,
            auth_field: b.auth.field(),
            tls_ca_file: b.tls_ca_file.clone(),
            require_tls: b.require_tls,
            ack_timeout,
            connect_timeout,
            create_stream: b.create_stream.clone(),
        })
    }

    /// The client's options. `connected`, when given, is woken on every
    /// (re)connection, and connection changes are logged.
    fn options(&self, connected: Option<Arc<Notify>>) -> ConnectOptions {
        let mut o = match &self.credentials {
            Credentials::None => ConnectOptions::new(),
            Credentials::Token(t) => ConnectOptions::with_token(t.clone()),
            Credentials::UserPassword(u, p) => {
                ConnectOptions::with_user_and_password(u.clone(), p.clone())
            }
            Credentials::Creds(text) => {
                ConnectOptions::with_credentials(text).expect("parsed in Plan::new")
            }
            Credentials::Nkey(seed) => ConnectOptions::with_nkey(seed.clone()),
        };
        o = o
            .name("outboxd")
            .connection_timeout(self.connect_timeout)
            .require_tls(self.require_tls)
            // Publishes only; no subscription of ours may drop messages.
            .no_echo();
        if let Some(ca) = &self.tls_ca_file {
            o = o.add_root_certificates(ca.clone());
        }
        if let Some(notify) = connected {
            let servers = self.shown.clone();
            o = o.event_callback(move |event| {
                let notify = notify.clone();
                let servers = servers.clone();
                async move { on_event(event, &servers, &notify) }
            });
        }
        o
    }

    fn context(&self, client: Client, timeout: Duration) -> Context {
        ContextBuilder::new()
            .timeout(timeout)
            .ack_timeout(timeout)
            .build(client)
    }

    /// A connect error as the error to report, or None when the servers
    /// merely could not be reached (worth waiting for).
    fn fatal(&self, e: &async_nats::ConnectError) -> Option<NatsError> {
        match e.kind() {
            ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => {
                Some(NatsError::Authorization {
                    servers: self.shown.clone(),
                    field: self.auth_field,
                    reason: e.to_string(),
                })
            }
            ConnectErrorKind::Tls => Some(NatsError::Tls {
                servers: self.shown.clone(),
                reason: e.to_string(),
            }),
            _ => None,
        }
    }
}

fn on_event(event: Event, servers: &str, connected: &Notify) {
    match event {
        Event::Connected => {
            tracing::info!(servers, "connected to NATS");
            // notify_one keeps a permit when no one waits yet, so the
            // stream check cannot miss a connection.
            connected.notify_one();
        }
        Event::Disconnected => tracing::warn!(
            servers,
            "lost the connection to NATS; reconnecting, deliveries are retried meanwhile"
        ),
        Event::ServerError(e) => tracing::error!(servers, error = %e, "NATS server error"),
        Event::ClientError(e) => tracing::warn!(servers, error = %e, "NATS client error"),
        Event::LameDuckMode => {
            tracing::warn!(servers, "a NATS server is shutting down (lame duck mode)")
        }
        other => tracing::debug!(servers, event = %other, "NATS connection event"),
    }
}

fn server_addr(url: &str) -> Result<ServerAddr, NatsError> {
    let fail = |reason: String| NatsError::Server {
        url: url.split('@').next_back().unwrap_or(url).to_string(),
        reason,
    };
    if !url.contains("://") {
        return Err(fail(
            "is not a URL; write nats://host:port or tls://host:port".into(),
        ));
    }
    let addr: ServerAddr = url
        .parse()
        .map_err(|e: std::io::Error| fail(e.to_string()))?;
    if !matches!(addr.scheme(), "nats" | "tls") {
        return Err(fail(format!(
            "scheme {}:// is not supported; use nats:// or tls://",
            addr.scheme()
        )));
    }
    if addr.has_user_pass() || addr.username().is_some() {
        return Err(fail(
            "holds credentials; give them with user + password, a token, a creds file or an \
             NKey seed file, never in the URL"
                .into(),
        ));
    }
    if addr.host().is_empty() {
        return Err(fail("has no host".into()));
    }
    Ok(addr)
}

fn check_stream_name(name: &str) -> Result<(), NatsError> {
    let fail = |reason| {
        Err(NatsError::StreamName {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() {
        return fail("it is empty");
    }
    if name.len() > 255 {
        return fail("it is longer than 255 bytes");
    }
    if name
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
    {
        return fail("it holds whitespace, a control character, or one of . * > / \\");
    }
    Ok(())
}

fn check_create(c: &CreateStream) -> Result<(), NatsError> {
    let bad = |field, reason: String| Err(NatsError::Setting { field, reason });
    if !(1..=5).contains(&c.replicas) {
        return bad(
            "create_stream.replicas",
            format!("{} is out of range; allowed: 1 to 5", c.replicas),
        );
    }
    if c.duplicate_window.is_zero() {
        return bad(
            "create_stream.duplicate_window",
            "must be longer than zero, such as 2m".into(),
        );
    }
    if !c.max_age.is_zero() && c.duplicate_window > c.max_age {
        return bad(
            "create_stream.duplicate_window",
            format!(
                "{:?} is longer than create_stream.max_age ({:?}); JetStream cannot remember \
                 an id longer than it keeps the message",
                c.duplicate_window, c.max_age
            ),
        );
    }
    Ok(())
}

fn read_file(field: &'static str, what: &'static str, path: &PathBuf) -> Result<String, NatsError> {
    std::fs::read_to_string(path).map_err(|e| NatsError::File {
        field,
        what,
        path: path.clone(),
        reason: e.to_string(),
    })
}

fn credentials(auth: &NatsAuth) -> Result<Credentials, NatsError> {
    let empty = |field, what: &str| NatsError::Credential {
        field,
        reason: format!("the {what} is empty"),
    };
    Ok(match auth {
        NatsAuth::None => Credentials::None,
        NatsAuth::Token(t) if t.trim().is_empty() => return Err(empty("token", "token")),
        NatsAuth::Token(t) => Credentials::Token(t.trim().to_string()),
        NatsAuth::UserPassword { user, .. } if user.is_empty() => {
            return Err(empty("user", "user name"))
        }
        NatsAuth::UserPassword { password, .. } if password.is_empty() => {
            return Err(empty("password", "password"))
        }
        NatsAuth::UserPassword { user, password } => {
            Credentials::UserPassword(user.clone(), password.clone())
        }
        NatsAuth::CredsFile(path) => {
            let text = read_file("creds_file", "credentials file", path)?;
            ConnectOptions::with_credentials(&text).map_err(|e| NatsError::File {
                field: "creds_file",
                what: "credentials file",
                path: path.clone(),
                reason: format!("{e} (expected a user JWT and NKey seed, as `nsc` writes them)"),
            })?;
            Credentials::Creds(text)
        }
        NatsAuth::NkeySeedFile(path) => {
            let seed = read_file("nkey_seed_file", "NKey seed file", path)?
                .trim()
                .to_string();
            nkeys::KeyPair::from_seed(&seed).map_err(|e| NatsError::File {
                field: "nkey_seed_file",
                what: "NKey seed file",
                path: path.clone(),
                reason: format!("it holds no valid NKey seed (SU…): {e}"),
            })?;
            Credentials::Nkey(seed)
        }
    })
}

/// Why the stream check did not pass.
enum Check {
    /// A definite answer: the stream is missing, or takes none of the
    /// subjects, or cannot be created.
    Refused(NatsError),
    /// No answer (yet): ask again later.
    Unanswered(String),
}

/// Looks the stream up (creating it if allowed and missing) and checks that
/// it takes the template's subjects.
async fn check_stream(js: &Context, plan: &Plan, create: bool) -> Result<StreamSummary, Check> {
    let filter = plan.template.filter();
    let (info, created) = match js.get_stream(&plan.stream).await {
        Ok(s) => (s.cached_info().clone(), false),
        Err(e) => {
            let code = match e.kind() {
                GetStreamErrorKind::JetStream(js_err) => Some(js_err.error_code().0),
                _ => None,
            };
            match (code, &plan.create_stream) {
                (Some(STREAM_NOT_FOUND), Some(spec)) if create => {
                    (create_stream(js, plan, spec, &filter).await?, true)
                }
                (Some(STREAM_NOT_FOUND), _) => {
                    return Err(Check::Refused(NatsError::StreamMissing {
                        stream: plan.stream.clone(),
                        subject: plan.template.to_string(),
                        filter,
                        servers: plan.shown.clone(),
                    }))
                }
                (Some(c), _) if JETSTREAM_NOT_ENABLED.contains(&c) => {
                    return Err(Check::Refused(NatsError::JetStreamDisabled {
                        servers: plan.shown.clone(),
                        reason: e.to_string(),
                    }))
                }
                _ => {
                    return Err(Check::Unanswered(format!(
                        "the JetStream API of {} did not answer the look-up of stream {}: {e} \
                         (is JetStream enabled, and a leader elected?)",
                        plan.shown, plan.stream
                    )))
                }
            }
        }
    };
    let subjects = info.config.subjects.clone();
    if !subjects.iter().any(|s| filter_covers(s, &filter)) {
        if subjects.iter().any(|s| filters_overlap(s, &filter)) {
            tracing::warn!(
                stream = %plan.stream,
                stream_subjects = ?subjects,
                subject = %plan.template,
                "the stream takes only some of the template's subjects; events whose subject \
                 it does not take are dead-lettered"
            );
        } else {
            return Err(Check::Refused(NatsError::StreamSubjects {
                stream: plan.stream.clone(),
                subject: plan.template.to_string(),
                filter,
                stream_subjects: subjects,
            }));
        }
    }
    Ok(StreamSummary {
        name: info.config.name.clone(),
        subjects,
        duplicate_window: info.config.duplicate_window,
        replicas: info.config.num_replicas,
        storage: match info.config.storage {
            stream::StorageType::Memory => Storage::Memory,
            stream::StorageType::File => Storage::File,
        },
        messages: info.state.messages,
        created,
    })
}

async fn create_stream(
    js: &Context,
    plan: &Plan,
    spec: &CreateStream,
    filter: &str,
) -> Result<stream::Info, Check> {
    let config = stream::Config {
        name: plan.stream.clone(),
        subjects: vec![filter.to_string()],
        num_replicas: spec.replicas,
        duplicate_window: spec.duplicate_window,
        max_age: spec.max_age,
        storage: match spec.storage {
            Storage::File => stream::StorageType::File,
            Storage::Memory => stream::StorageType::Memory,
        },
        ..Default::default()
    };
    match js.create_stream(config).await {
        Ok(s) => {
            tracing::info!(stream = %plan.stream, subjects = filter, replicas = spec.replicas, "created the JetStream stream");
            Ok(s.cached_info().clone())
        }
        Err(e) => {
            use async_nats::jetstream::context::CreateStreamErrorKind as K;
            match e.kind() {
                K::JetStream(js_err) if !CLUSTER_NOT_READY.contains(&js_err.error_code().0) => {
                    Err(Check::Refused(NatsError::CreateStream {
                        stream: plan.stream.clone(),
                        reason: e.to_string(),
                    }))
                }
                _ => Err(Check::Unanswered(format!(
                    "cannot create stream {} yet: {e}",
                    plan.stream
                ))),
            }
        }
    }
}

/// Connects without retrying and checks the stream, creating nothing.
pub(super) fn probe(plan: Plan) -> Result<Option<StreamSummary>, NatsError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(NatsError::Runtime)?;
    rt.block_on(async {
        let client = match plan.options(None).connect(plan.servers.clone()).await {
            Ok(c) => c,
            Err(e) => {
                return Err(plan.fatal(&e).unwrap_or_else(|| NatsError::Unreachable {
                    servers: plan.shown.clone(),
                    reason: e.to_string(),
                }))
            }
        };
        let js = plan.context(client, plan.connect_timeout);
        match check_stream(&js, &plan, false).await {
            Ok(summary) => Ok(Some(summary)),
            Err(Check::Refused(NatsError::StreamMissing { .. }))
                if plan.create_stream.is_some() =>
            {
                Ok(None)
            }
            Err(Check::Refused(e)) => Err(e),
            Err(Check::Unanswered(reason)) => Err(NatsError::JetStreamUnavailable {
                servers: plan.shown.clone(),
                reason,
            }),
        }
    })
}

/// The stream as the sink sees it.
enum StreamState {
    /// Not checked yet: why.
    Waiting(String),
    /// Checked.
    Ready(StreamSummary),
    /// Refused (missing, wrong subjects): the message.
    Refused(String),
}

/// What the sink's deliveries and its background task share.
pub(super) struct Shared {
    pub(super) servers: String,
    pub(super) stream: String,
    pub(super) template: SubjectTemplate,
    pub(super) ack_timeout: Duration,
    client: Client,
    js: Context,
    state: RwLock<StreamState>,
}

/// Starts the runtime and connects; see the module docs.
pub(super) fn start(plan: Plan) -> Result<(Runtime, Arc<Shared>), NatsError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("outboxd-nats")
        .enable_all()
        .build()
        .map_err(NatsError::Runtime)?;
    // async-nats spawns tasks when a JetStream context is built.
    let _runtime = rt.enter();
    let connected = Arc::new(Notify::new());
    let options = plan.options(Some(connected.clone()));
    let (client, state) = match rt.block_on(options.connect(plan.servers.clone())) {
        Ok(client) => {
            let js = plan.context(client.clone(), plan.connect_timeout);
            match rt.block_on(check_stream(&js, &plan, true)) {
                Ok(summary) => (client, StreamState::Ready(summary)),
                Err(Check::Refused(e)) => return Err(e),
                Err(Check::Unanswered(why)) => {
                    tracing::warn!(reason = %why, "cannot check the NATS stream yet; deliveries are retried until it can be checked");
                    (client, StreamState::Waiting(why))
                }
            }
        }
        Err(e) => {
            if let Some(fatal) = plan.fatal(&e) {
                return Err(fatal);
            }
            tracing::warn!(
                servers = %plan.shown,
                error = %e,
                "cannot connect to NATS; starting anyway: connecting in the background, \
                 deliveries to this consumer are retried until connected"
            );
            let client = rt
                .block_on(
                    plan.options(Some(connected.clone()))
                        .retry_on_initial_connect()
                        .connect(plan.servers.clone()),
                )
                .map_err(|e| NatsError::Unreachable {
                    servers: plan.shown.clone(),
                    reason: e.to_string(),
                })?;
            let why = format!("not connected to NATS {} yet: {e}", plan.shown);
            (client, StreamState::Waiting(why))
        }
    };
    let waiting = matches!(state, StreamState::Waiting(_));
    let shared = Arc::new(Shared {
        servers: plan.shown.clone(),
        stream: plan.stream.clone(),
        template: plan.template.clone(),
        ack_timeout: plan.ack_timeout,
        js: plan.context(client.clone(), plan.ack_timeout),
        client,
        state: RwLock::new(state),
    });
    if waiting {
        rt.spawn(keep_checking(shared.clone(), plan, connected));
    }
    Ok((rt, shared))
}

/// Checks the stream once connected, until it passes.
async fn keep_checking(shared: Arc<Shared>, plan: Plan, connected: Arc<Notify>) {
    let js = plan.context(shared.client.clone(), plan.connect_timeout);
    loop {
        if shared.client.connection_state() != State::Connected {
            connected.notified().await;
            continue;
        }
        match check_stream(&js, &plan, true).await {
            Ok(summary) => {
                tracing::info!(stream = %summary.name, subjects = ?summary.subjects, "NATS stream checked; delivering");
                shared.set(StreamState::Ready(summary));
                return;
            }
            Err(Check::Refused(e)) => {
                tracing::error!(error = %e, "the NATS stream is not usable; deliveries are retried until it is fixed");
                shared.set(StreamState::Refused(e.to_string()));
                tokio::time::sleep(RECHECK_REFUSED).await;
            }
            Err(Check::Unanswered(why)) => {
                shared.set(StreamState::Waiting(why));
                tokio::time::sleep(RECHECK_UNANSWERED).await;
            }
        }
    }
}

impl Shared {
    fn set(&self, state: StreamState) {
        *self.state.write().unwrap_or_else(|p| p.into_inner()) = state;
    }

    pub(super) fn summary(&self) -> Option<StreamSummary> {
        match &*self.state.read().unwrap_or_else(|p| p.into_inner()) {
            StreamState::Ready(s) => Some(s.clone()),
            _ => None,
        }
    }

    /// Publishes one delivery and waits for its acknowledgement, on the
    /// calling (worker) thread; other workers' publishes share the
    /// connection meanwhile.
    pub(super) fn publish(&self, handle: &Handle, d: &Delivery) -> Outcome {
        let subject = match self.template.render(d) {
            Ok(s) => s,
            Err(why) => return Outcome::poison(why),
        };
        match &*self.state.read().unwrap_or_else(|p| p.into_inner()) {
            StreamState::Ready(s) => {
                if !s.subjects.iter().any(|f| filter_covers(f, &subject)) {
                    return Outcome::poison(format!(
                        "subject {subject} is not taken by stream {} (its subjects: {}), so \
                         no stream would store the event",
                        self.stream,
                        s.subjects.join(", ")
                    ));
                }
            }
            StreamState::Waiting(why) | StreamState::Refused(why) => {
                return Outcome::retry(why.clone())
            }
        }
        if self.client.connection_state() != State::Connected {
            return Outcome::retry(format!(
                "not connected to NATS {}: reconnecting",
                self.servers
            ));
        }
        let headers = match message::headers(d) {
            Ok(h) => h,
            Err(why) => return Outcome::poison(why),
        };
        let body = bytes::Bytes::from(d.envelope.to_json());
        let publish = PublishMessage::build().payload(body).headers(headers);
        // Queued on the connection without waiting for earlier publishes;
        // only this worker waits for this acknowledgement.
        // ack_timeout bounds the whole publish (queueing included), so a
        // delivery never outlives it: the relay's lease must only cover it.
        let result = handle.block_on(async {
            let publish = async { self.js.send_publish(subject.clone(), publish).await?.await };
            tokio::time::timeout(self.ack_timeout, publish)
                .await
                .unwrap_or_else(|_| Err(PublishError::new(PublishErrorKind::TimedOut)))
        });
        message::outcome(result, &subject, &self.stream, self.ack_timeout)
    }
}
