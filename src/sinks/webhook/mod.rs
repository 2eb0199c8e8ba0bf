//! The webhook sink: a signed HTTP POST per event, per [Standard Webhooks].
//!
//! The body is the envelope JSON with the payload's bytes as the producer
//! wrote them, signed in `webhook-signature` together with `webhook-id` (the
//! event id, the same on every retry and replay) and `webhook-timestamp`;
//! the unsigned [`TENANT_HEADER`] and [`LEGACY_HEADER`] carry the tenant and
//! the legacy flag. The answer is the verdict: 2xx is delivered; 408, 425, 429,
//! 5xx, network errors and timeouts are retried (no sooner than a
//! `Retry-After` says); 410 and the other 4xx are poison, and so is a
//! redirect, which is not followed. docs/webhooks.md is the receiver's
//! guide: every header, checking a signature in any language, replays.
//!
//! A receiver in Rust checks a request with [`verify`]:
//!
//! ```
//! use outboxd::sinks::webhook::{sign, verify, WebhookSecret};
//! let secret = WebhookSecret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")?;
//! let body = br#"{"event_id":"01JDQ8F6ZC1Y0D3W9N7K2M4P5R"}"#;
//! let header = sign(secret.as_bytes(), "01JDQ8F6ZC1Y0D3W9N7K2M4P5R", 1_764_487_080, body);
//! assert!(verify(secret.as_bytes(), "01JDQ8F6ZC1Y0D3W9N7K2M4P5R", 1_764_487_080, body, &header).is_ok());
//! assert!(verify(secret.as_bytes(), "01JDQ8F6ZC1Y0D3W9N7K2M4P5R", 1_764_487_081, body, &header).is_err());
//! # Ok::<(), outboxd::sinks::WebhookError>(())
//! ```
//!
//! The parts: `signature` (signing and checking), `address` (the guard
//! against private addresses), `redact` (secrets kept out of reasons and
//! `Debug`), `builder` (the configuration, checked), `sink` (the request
//! and the verdict on its answer) and `probe` (check-config's look at the
//! receiver: a connection and a TLS handshake, no request).
//!
//! [Standard Webhooks]: https://www.standardwebhooks.com/

mod address;
mod builder;
mod probe;
mod redact;
mod signature;
mod sink;

use std::time::Duration;

pub use address::is_non_public;
pub use builder::WebhookSinkBuilder;
pub use probe::ReceiverCheck;
pub use redact::is_http_client_log_target;
pub use signature::{sign, verify, SignatureError, WebhookSecret};
pub use sink::WebhookSink;

/// Connect timeout (DNS, TCP and TLS) unless configured.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Total timeout of one request, from DNS to the end of the response, unless
/// configured.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// How much of a response body is read, unless configured; the rest is
/// ignored.
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 64 * 1024;

/// How much of a response body goes into a retry or poison reason.
pub const BODY_SNIPPET_BYTES: usize = 512;

/// The longest `Retry-After` honoured; a receiver asking for more gets this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// The header carrying the event's tenant.
pub const TENANT_HEADER: &str = "outboxd-tenant-id";

/// The longest [`TENANT_HEADER`] value sent. A tenant id whose
/// percent-encoded form is longer makes the event poison: the HTTP
/// client's buffer for a request's head (128 KiB) could never send it, and
/// HTTP servers commonly take 8 to 16 KiB of headers in all.
pub const MAX_TENANT_HEADER_BYTES: usize = 64 * 1024;
/// The header carrying the event's ordering key (percent-encoded like the
/// tenant): a receiver orders or groups by it (a captured row's
/// `{table}:{key}`) without parsing the payload.
pub const ORDERING_KEY_HEADER: &str = "outboxd-ordering-key";

/// The header marking a legacy row.
pub const LEGACY_HEADER: &str = "outboxd-legacy";

/// A webhook sink's configuration is wrong. No message ever contains a
/// secret.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebhookError {
    /// The URL does not parse.
    #[error("webhook URL {url} is not valid: {reason}")]
    InvalidUrl {
        /// The URL without credentials or query.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The URL's scheme is not http or https.
    #[error("webhook URL {url} has scheme {scheme:?}; only http and https are allowed")]
    UrlScheme {
        /// The URL without credentials or query.
        url: String,
        /// The scheme found ("" when there is none).
        scheme: String,
    },
    /// The URL has no host.
    #[error("webhook URL {url} has no host; expected such as https://example.com/hooks")]
    UrlHost {
        /// The URL without credentials or query.
        url: String,
    },
    /// The URL names a loopback, private or otherwise non-public address
    /// (or `localhost`) although the sink denies private addresses.
    #[error(
        "webhook URL {url} names {host}, which is not a public address, and \
         deny_private_addresses is on: every delivery would be refused; give a public \
         address or turn deny_private_addresses off"
    )]
    PrivateAddress {
        /// The URL without credentials or query.
        url: String,
        /// The host as written in the URL.
        host: String,
    },
    /// No secret was configured.
    #[error(
        "the webhook has no secret; receivers cannot verify unsigned requests \
         (give a whsec_ secret)"
    )]
    NoSecret,
    /// A secret lacks the `whsec_` prefix.
    #[error("webhook secret #{index} does not start with \"whsec_\"; expected whsec_ followed by base64")]
    SecretPrefix {
        /// Which secret (1 for the first configured).
        index: usize,
    },
    /// A secret's part after `whsec_` is not standard base64.
    #[error(
        "webhook secret #{index} is not valid base64 after \"whsec_\" (standard alphabet, padded)"
    )]
    SecretBase64 {
        /// Which secret (1 for the first configured).
        index: usize,
    },
    /// A secret decodes to too few or too many bytes.
    #[error("webhook secret #{index} decodes to {len} bytes; Standard Webhooks secrets are 24 to 64 bytes")]
    SecretLength {
        /// Which secret (1 for the first configured).
        index: usize,
        /// The decoded length.
        len: usize,
    },
    /// A configured header has a bad name or value, or is one the sink sets.
    #[error("webhook header {name:?} cannot be used: {reason}")]
    Header {
        /// The header name as given.
        name: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A timeout or bound is zero.
    #[error("webhook {what} must be greater than zero")]
    Zero {
        /// Which setting.
        what: &'static str,
    },
    /// The URL's host name does not exist (only from
    /// [`WebhookSink::probe`]): no delivery can reach it.
    #[error(
        "webhook URL {url}: host {host} does not exist ({reason}); correct the host name in url"
    )]
    NoSuchHost {
        /// The URL without credentials or query.
        url: String,
        /// The host as written in the URL.
        host: String,
        /// The resolver's answer.
        reason: String,
    },
    /// The TLS handshake with the receiver cannot succeed (only from
    /// [`WebhookSink::probe`]): its certificate is not trusted or not for
    /// the host, or it does not speak TLS on that port.
    #[error("webhook URL {url}: TLS with the receiver cannot work: {reason}; {fix}")]
    Tls {
        /// The URL without credentials or query.
        url: String,
        /// What the handshake said.
        reason: String,
        /// What to change.
        fix: &'static str,
    },
}

/// docs/webhooks.md's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/webhooks.md")]
pub struct WebhooksDoctests;
