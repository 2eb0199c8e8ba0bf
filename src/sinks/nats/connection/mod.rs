//! The sink's runtime, its connection and the stream check.
//!
//! [`Plan`] is a builder checked without a server. [`start`] starts the
//! runtime (one thread, `outboxd-nats`), connects, and checks the stream;
//! when the server cannot be reached it connects in the background instead,
//! and a task on the runtime checks the stream once connected. Until the
//! stream is checked, [`Shared::publish`] answers Retry at once, with the
//! reason.
//!
//! The parts: this file connects (the client's options, TLS and
//! credentials included, and its connection events) and runs the runtime;
//! `plan` checks the settings (`Plan::new`), `stream` checks or creates the
//! stream, and `publish` is the path of one delivery to its acknowledgement.

mod plan;
mod publish;
mod stream;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use async_nats::connection::State;
use async_nats::jetstream::context::{Context, ContextBuilder};
use async_nats::{Client, ConnectErrorKind, ConnectOptions, Event, ServerAddr};
use tokio::runtime::Runtime;
use tokio::sync::Notify;

use crate::sinks::nats::{CreateStream, NatsError, StreamSummary, SubjectTemplate};
use crate::sinks::reach::{self, Lookup, TlsMismatch};
use stream::{check_stream, Check};

/// How often a stream that was refused (missing, wrong subjects) is checked
/// again, so that fixing it on the server heals the sink without a restart.
const RECHECK_REFUSED: Duration = Duration::from_secs(10);

/// How often the check is tried again while the JetStream API does not
/// answer.
const RECHECK_UNANSWERED: Duration = Duration::from_secs(1);

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

    /// A connect error that says TLS cannot work, with the field to change.
    fn tls_mismatch(&self, e: &async_nats::ConnectError) -> Option<NatsError> {
        let (field, reason, fix) = match reach::tls_mismatch(e)? {
            TlsMismatch::Untrusted(r) => (
                "tls_ca_file",
                r,
                match &self.tls_ca_file {
                    Some(p) => format!(
                        "the CA in tls_ca_file ({}) does not sign the server's certificate: \
                         give the CA certificate that does",
                        p.display()
                    ),
                    None => "set tls_ca_file to the PEM file of the CA that signs the server's \
                             certificate"
                        .into(),
                },
            ),
            TlsMismatch::WrongName(r) => (
                "servers",
                r,
                "connect by a host name or address the server's certificate holds (its \
                 subject alternative names)"
                    .into(),
            ),
            TlsMismatch::Expired(r) => (
                "servers",
                r,
                "renew the server's certificate (or, if it is new, check this machine's clock)"
                    .into(),
            ),
            TlsMismatch::NotSpoken(r) if self.require_tls => (
                "require_tls",
                r,
                "require_tls is on but the server offers no TLS: enable TLS on the server (a \
                 tls block in its config), or set require_tls = false"
                    .into(),
            ),
            TlsMismatch::NotSpoken(r) => (
                "servers",
                r,
                "a tls:// URL but the server offers no TLS: enable TLS on the server, or use a \
                 nats:// URL"
                    .into(),
            ),
            TlsMismatch::Refused(r) => (
                "servers",
                r,
                "the server refused the handshake (it may require a client certificate, which \
                 outboxd does not send, or share no TLS version with it)"
                    .into(),
            ),
        };
        Some(NatsError::TlsMismatch {
            servers: self.shown.clone(),
            field,
            reason,
            fix,
        })
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

/// Connects without retrying and checks the stream, creating nothing. A
/// host name that does not exist and a TLS handshake that cannot succeed
/// are errors here (what no retry fixes); `start` leaves them to its
/// retries.
pub(super) fn probe(plan: Plan) -> Result<Option<StreamSummary>, NatsError> {
    for s in &plan.servers {
        if let Lookup::NoSuchHost(reason) = reach::lookup(s.host(), s.port()) {
            return Err(NatsError::NoSuchHost {
                url: format!("{}://{}:{}", s.scheme(), s.host(), s.port()),
                host: s.host().to_string(),
                reason,
            });
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(NatsError::Runtime)?;
    rt.block_on(async {
        let client = match plan.options(None).connect(plan.servers.clone()).await {
            Ok(c) => c,
            Err(e) => {
                return Err(plan
                    .fatal(&e)
                    .or_else(|| plan.tls_mismatch(&e))
                    .unwrap_or_else(|| NatsError::Unreachable {
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
    /// When the stream's info was last fetched again because a subject was
    /// not in its cached subjects (None: never). Held while fetching, so
    /// workers that miss at once share one fetch.
    refreshed: Mutex<Option<Instant>>,
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
        refreshed: Mutex::new(None),
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
}
