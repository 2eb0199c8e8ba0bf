//! `kind = "webhook"`: a signed HTTP POST per event (Standard Webhooks).

use outboxd::consumer::{Consumer, Delivery};
use outboxd::sinks::webhook::ReceiverCheck;
use outboxd::sinks::WebhookSink;

use super::{at_most_one, env_secret, positive, RawSink, Sink, SinkFinding};
use crate::config::checker::Checker;
use crate::config::error::ConfigError;
use outboxd::clock::format_duration as human;

/// The keys a webhook sink takes.
pub(crate) const KEYS: &[&str] = &[
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

/// Builds a webhook sink, reading its secrets; a malformed secret is
/// reported by where it came from, never by its value.
pub(crate) fn build(c: &Checker<'_>, at: &str, s: &RawSink) -> Result<Sink, ConfigError> {
    let url = s.url.as_ref().ok_or_else(|| {
        c.err(
            format!("{at}.url"),
            "is missing; a webhook sink needs url = \"https://...\"",
        )
    })?;
    at_most_one(
        c,
        at,
        &[
            ("secret_env", s.secret_env.is_some()),
            ("secrets_env", s.secrets_env.is_some()),
            ("secret_file", s.secret_file.is_some()),
        ],
        "give exactly one of secret_env, secrets_env (several secrets while rotating) and \
         secret_file",
    )?;
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
        let value = env_secret(
            c,
            &field,
            var,
            "the signing secret (whsec_ followed by base64)",
        )?;
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
    if let Some(t) = positive(c, at, "timeout", s.timeout)? {
        b = b.timeout(t);
    }
    if let Some(t) = positive(c, at, "connect_timeout", s.connect_timeout)? {
        b = b.connect_timeout(t);
    }
    if let Some(n) = s.max_response_bytes {
        b = b.max_response_bytes(n.0);
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
            W::InvalidUrl { .. }
            | W::UrlScheme { .. }
            | W::UrlHost { .. }
            | W::PrivateAddress { .. }
            | W::NoSuchHost { .. }
            | W::Tls { .. } => (format!("{at}.url"), None),
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
    let description = format!(
        "webhook {} (timeout {}, connect timeout {})",
        sink.display_url(),
        human(sink.timeout()),
        human(sink.connect_timeout())
    );
    let limit = sink.timeout();
    let sink = std::sync::Arc::new(sink);
    let (deliver, probe) = (sink.clone(), sink);
    let errors = c.err(format!("{at}.url"), "");
    Ok(
        Sink::new(move |d: &Delivery| deliver.deliver(d), description)
            .with_time_limit(limit)
            .with_probe(Box::new(move |_, _, _| {
                look(&probe).map_err(|e| ConfigError {
                    message: e.to_string(),
                    ..errors.clone()
                })
            })),
    )
}

/// check-config's look at the receiver: a connection, and for https a TLS
/// handshake, never a request. An unreachable receiver is a warning.
fn look(sink: &WebhookSink) -> Result<Vec<SinkFinding>, outboxd::sinks::WebhookError> {
    Ok(vec![match sink.probe()? {
        ReceiverCheck::Reached(what) => SinkFinding {
            warning: false,
            message: what,
        },
        ReceiverCheck::Unreachable(why) => SinkFinding {
            warning: true,
            message: format!(
                "{why}; the receiver was not checked (outboxd run starts anyway and retries \
                 until it answers)"
            ),
        },
    }])
}
