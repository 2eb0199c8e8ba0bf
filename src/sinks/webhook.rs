//! The webhook sink: a signed HTTP POST per event, per [Standard Webhooks].
//!
//! Each request carries the envelope JSON as its body and these headers:
//!
//! | header | value |
//! |---|---|
//! | `webhook-id` | the event id: the same on every retry, so receivers can dedup on it |
//! | `webhook-timestamp` | when this attempt was sent, in Unix seconds |
//! | `webhook-signature` | `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, one per secret, space-separated |
//! | `content-type` | `application/json` |
//! | `outboxd-tenant-id` | the event's tenant, percent-encoded UTF-8 (letters, digits and `-._~` as they are); absent when the event has none |
//! | `outboxd-legacy` | `true` for a legacy row (written without an event id: its id is derived from the row, and it is not deduplicated); absent otherwise |
//!
//! The body is the envelope JSON with the payload's bytes as the producer
//! wrote them (whitespace included): the signature covers exactly those
//! bytes. The `outboxd-*` headers, like configured ones, are not signed.
//!
//! A replay (`outboxd replay`) delivers the same event again, so it carries
//! the same `webhook-id`: a receiver that drops ids it has already processed
//! drops a replay too. To replay into such a receiver, clear its record of
//! those ids first.
//!
//! The answer is the verdict: 2xx is delivered; 408, 425, 429, 5xx, network
//! errors and timeouts are retried (no sooner than a `Retry-After` says);
//! 410 and the other 4xx are poison, and so is a redirect, which is not
//! followed.
//!
//! A receiver checks a request with [`verify`] (and should refuse timestamps
//! more than a few minutes from its own clock, to stop replays):
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
//! [Standard Webhooks]: https://www.standardwebhooks.com/

use std::fmt;
use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use sha2::Sha256;
use ureq::http::{HeaderName, HeaderValue, StatusCode, Uri};
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{DefaultConnector, NextTimeout};

use crate::consumer::{Consumer, Delivery, Outcome};

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

/// Secret prefix required by Standard Webhooks.
const SECRET_PREFIX: &str = "whsec_";

/// The header carrying the event's tenant.
pub const TENANT_HEADER: &str = "outboxd-tenant-id";

/// The header marking a legacy row.
pub const LEGACY_HEADER: &str = "outboxd-legacy";

/// Headers the sink sets itself; configured headers may not replace them.
const RESERVED_HEADERS: [&str; 9] = [
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "content-type",
    "content-length",
    "host",
    "transfer-encoding",
    TENANT_HEADER,
    LEGACY_HEADER,
];

/// The log targets of the HTTP client (ureq) under this sink. At TRACE it
/// logs the request line with its query string and a dump of every byte
/// sent, credential headers and signatures included; up to DEBUG it hides
/// paths, queries and all but a few harmless headers. A host whose logger
/// records `log` or `tracing` events must keep these targets at DEBUG or
/// less, as the `outboxd` binary does whatever level it is given:
///
/// ```
/// use outboxd::sinks::webhook::is_http_client_log_target;
/// assert!(is_http_client_log_target("ureq_proto::util"));
/// assert!(is_http_client_log_target("ureq"));
/// assert!(!is_http_client_log_target("ureqx"));
/// assert!(!is_http_client_log_target("outboxd::sinks::webhook"));
/// ```
pub fn is_http_client_log_target(target: &str) -> bool {
    ["ureq", "ureq_proto"].iter().any(|t| {
        target
            .strip_prefix(t)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
    })
}

/// What replaces a configured secret found in a retry or poison reason.
const REDACTED: &str = "<redacted>";

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
}

/// A signature did not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignatureError {
    /// The header holds no `v1,` signature.
    #[error("the webhook-signature header holds no v1 signature")]
    Missing,
    /// No `v1,` signature matches the secret.
    #[error("no webhook signature matches (wrong secret, or the id, timestamp or body changed)")]
    Mismatch,
}

/// A Standard Webhooks secret: `whsec_` and the base64 of 24 to 64 random
/// bytes. Its bytes are the HMAC key. Debug output never shows it.
#[derive(Clone)]
pub struct WebhookSecret(Vec<u8>);

impl WebhookSecret {
    /// Parses `whsec_<base64>`.
    pub fn parse(s: &str) -> Result<WebhookSecret, WebhookError> {
        Self::parse_nth(s, 1)
    }

    fn parse_nth(s: &str, index: usize) -> Result<WebhookSecret, WebhookError> {
        let b64 = s
            .trim()
            .strip_prefix(SECRET_PREFIX)
            .ok_or(WebhookError::SecretPrefix { index })?;
        let bytes = BASE64
            .decode(b64)
            .map_err(|_| WebhookError::SecretBase64 { index })?;
        if !(24..=64).contains(&bytes.len()) {
            return Err(WebhookError::SecretLength {
                index,
                len: bytes.len(),
            });
        }
        Ok(WebhookSecret(bytes))
    }

    /// The key bytes (for [`sign`] and [`verify`]).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(<redacted>)")
    }
}

fn mac(secret: &[u8], id: &str, timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
    let mut mac =
        <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC accepts keys of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The Standard Webhooks signature of one request:
/// `v1,<base64(HMAC-SHA256(secret, "{id}.{timestamp}.{body}"))>`.
pub fn sign(secret: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let tag = mac(secret, id, timestamp, body).finalize().into_bytes();
    format!("v1,{}", BASE64.encode(tag))
}

/// Checks a `webhook-signature` header (one or more space-separated
/// `v1,<base64>` signatures; other versions are skipped) against one secret,
/// in constant time. `id`, `timestamp` and `body` are the request's
/// `webhook-id`, `webhook-timestamp` and raw body.
///
/// This does not look at the clock: a receiver should also refuse a
/// timestamp far from now (Standard Webhooks suggests 5 minutes).
pub fn verify(
    secret: &[u8],
    id: &str,
    timestamp: i64,
    body: &[u8],
    signature_header: &str,
) -> Result<(), SignatureError> {
    let expected = mac(secret, id, timestamp, body);
    let mut seen = false;
    for candidate in signature_header.split_ascii_whitespace() {
        let Some(b64) = candidate.strip_prefix("v1,") else {
            continue;
        };
        seen = true;
        if let Ok(tag) = BASE64.decode(b64) {
            if expected.clone().verify_slice(&tag).is_ok() {
                return Ok(());
            }
        }
    }
    Err(if seen {
        SignatureError::Mismatch
    } else {
        SignatureError::Missing
    })
}

/// True for addresses a webhook must not reach when
/// [`deny_private_addresses`](WebhookSinkBuilder::deny_private_addresses) is
/// on: unspecified, loopback, private (RFC 1918), shared (100.64/10),
/// link-local, unique-local (fc00::/7), site-local, multicast and broadcast,
/// also when written as IPv4-mapped, IPv4-compatible, NAT64 or 6to4 IPv6.
pub fn is_non_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4_non_public(v4),
        IpAddr::V6(v6) => v6_non_public(v6),
    }
}

fn v4_non_public(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_unspecified()
        || a == 0 // "this network", 0.0.0.0/8
        || ip.is_loopback()
        || ip.is_private()
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || ip.is_link_local()
        || (a == 192 && b == 0 && ip.octets()[2] == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || ip.is_multicast()
        || a >= 240 // reserved and broadcast
}

fn v6_non_public(ip: Ipv6Addr) -> bool {
    let seg = ip.segments();
    if let Some(v4) = ip.to_ipv4_mapped() {
        return v4_non_public(v4);
    }
    // IPv4-compatible (::a.b.c.d, deprecated) and NAT64 (64:ff9b::/96).
    if seg[..6] == [0; 6] || seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let o = ip.octets();
        return ip.is_unspecified()
            || ip.is_loopback()
            || v4_non_public(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
    }
    // 6to4 (2002::/16) carries an IPv4 address in bits 16..48.
    if seg[0] == 0x2002 {
        let o = ip.octets();
        return v4_non_public(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    ip.is_unspecified()
        || ip.is_loopback()
        || (seg[0] & 0xfe00) == 0xfc00 // unique local
        || (seg[0] & 0xffc0) == 0xfe80 // link-local
        || (seg[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || ip.is_multicast()
}

/// Builds a [`WebhookSink`]; [`build`](Self::build) validates everything.
///
/// ```
/// use std::time::Duration;
/// use outboxd::sinks::WebhookSink;
/// let sink = WebhookSink::builder("https://example.com/hooks")
///     .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
///     .connect_timeout(Duration::from_secs(5))
///     .timeout(Duration::from_secs(15))
///     .deny_private_addresses(true)
///     .header("x-tenant", "acme")
///     .build()?;
/// assert_eq!(sink.timeout(), Duration::from_secs(15));
/// assert!(WebhookSink::builder("ftp://example.com").secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").build().is_err());
/// # Ok::<(), outboxd::sinks::WebhookError>(())
/// ```
#[derive(Clone)]
pub struct WebhookSinkBuilder {
    url: String,
    secrets: Vec<String>,
    connect_timeout: Duration,
    timeout: Duration,
    max_response_bytes: u64,
    deny_private: bool,
    headers: Vec<(String, String)>,
}

impl WebhookSinkBuilder {
    /// Adds a signing secret (`whsec_<base64>`). Add the new one beside the
    /// old while rotating: each request then carries a signature per secret.
    pub fn secret(mut self, secret: impl Into<String>) -> Self {
        self.secrets.push(secret.into());
        self
    }

    /// The limit on DNS, TCP connect and TLS handshake. Default
    /// [`DEFAULT_CONNECT_TIMEOUT`].
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The limit on the whole request, response body included. Default
    /// [`DEFAULT_TIMEOUT`].
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How much of a response body is read. Default
    /// [`DEFAULT_MAX_RESPONSE_BYTES`].
    pub fn max_response_bytes(mut self, bytes: u64) -> Self {
        self.max_response_bytes = bytes;
        self
    }

    /// Refuses to connect to non-public addresses ([`is_non_public`]),
    /// checked on the addresses the host name resolves to, which are the
    /// ones dialled: no second lookup can rebind. For services whose tenants
    /// configure webhook URLs. Off by default.
    ///
    /// A URL whose host is already known to be refused (a non-public IP
    /// literal, `localhost` or a name under `.localhost`) fails
    /// [`build`](Self::build) with [`WebhookError::PrivateAddress`]; other
    /// names are checked when they resolve, at each delivery.
    pub fn deny_private_addresses(mut self, deny: bool) -> Self {
        self.deny_private = deny;
        self
    }

    /// Adds a header to every request (such as an `authorization` the
    /// receiver wants). The `webhook-*`, `content-type`, `content-length`,
    /// `host` and `transfer-encoding` headers are the sink's own.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Validates the configuration and builds the sink.
    pub fn build(self) -> Result<WebhookSink, WebhookError> {
        let shown = redact_url(&self.url);
        let uri: Uri = self
            .url
            .trim()
            .parse()
            .map_err(|e: ureq::http::uri::InvalidUri| WebhookError::InvalidUrl {
                url: shown.clone(),
                reason: e.to_string(),
            })?;
        match uri.scheme_str() {
            Some("http") | Some("https") => {}
            other => {
                return Err(WebhookError::UrlScheme {
                    url: shown,
                    scheme: other.unwrap_or("").to_string(),
                })
            }
        }
        let host = uri.host().unwrap_or("");
        if host.is_empty() {
            return Err(WebhookError::UrlHost { url: shown });
        }
        // The parser takes any digits as a port (and then reports none);
        // no connection could use one outside 1 to 65535.
        if let Some(port) = uri.authority().and_then(|a| port_text(a.as_str())) {
            if !matches!(port.parse::<u16>(), Ok(1..)) {
                return Err(WebhookError::InvalidUrl {
                    url: shown,
                    reason: format!("port {port} is out of range (1 to 65535)"),
                });
            }
        }
        if self.deny_private && names_non_public(host) {
            return Err(WebhookError::PrivateAddress {
                url: shown,
                host: host.to_string(),
            });
        }
        self.assemble(shown)
    }

    /// Builds the sink from a checked URL: everything but the URL checks.
    fn assemble(self, shown: String) -> Result<WebhookSink, WebhookError> {
        if self.secrets.is_empty() {
            return Err(WebhookError::NoSecret);
        }
        let secrets = self
            .secrets
            .iter()
            .enumerate()
            .map(|(i, s)| WebhookSecret::parse_nth(s, i + 1))
            .collect::<Result<Vec<_>, _>>()?;
        for (what, d) in [
            ("connect timeout", self.connect_timeout),
            ("timeout", self.timeout),
        ] {
            if d.is_zero() {
                return Err(WebhookError::Zero { what });
            }
        }
        if self.max_response_bytes == 0 {
            return Err(WebhookError::Zero {
                what: "max_response_bytes",
            });
        }
        let mut headers = Vec::with_capacity(self.headers.len());
        for (name, value) in &self.headers {
            let bad = |reason| WebhookError::Header {
                name: name.clone(),
                reason,
            };
            let hname = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| bad("not a valid header name"))?;
            if RESERVED_HEADERS.contains(&hname.as_str()) {
                return Err(bad("the sink sets this header itself"));
            }
            let mut hvalue = HeaderValue::from_str(value)
                .map_err(|_| bad("the value holds control characters or non-ASCII bytes"))?;
            hvalue.set_sensitive(true);
            headers.push((hname, hvalue));
        }

        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .max_redirects(0)
            // No proxy from the environment: the address guard must see the
            // address that is dialled, not a proxy's.
            .proxy(None)
            .timeout_resolve(Some(self.connect_timeout))
            .timeout_connect(Some(self.connect_timeout))
            .timeout_global(Some(self.timeout))
            .user_agent(concat!("outboxd/", env!("CARGO_PKG_VERSION")))
            .build();
        let resolver = GuardedResolver {
            inner: DefaultResolver::default(),
            deny_private: self.deny_private,
        };
        let agent = ureq::Agent::with_parts(config, DefaultConnector::default(), resolver);
        let redactor = Redactor::new(&self.url, &self.secrets, &self.headers);
        Ok(WebhookSink {
            agent,
            redactor,
            url: self.url.trim().to_string(),
            shown_url: shown,
            secrets,
            headers,
            connect_timeout: self.connect_timeout,
            timeout: self.timeout,
            max_response_bytes: self.max_response_bytes,
            deny_private: self.deny_private,
        })
    }
}

impl fmt::Debug for WebhookSinkBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Shown {
            name: "WebhookSinkBuilder",
            url: &redact_url(&self.url),
            secrets: self.secrets.len(),
            connect_timeout: self.connect_timeout,
            timeout: self.timeout,
            max_response_bytes: self.max_response_bytes,
            deny_private: self.deny_private,
            headers: self.headers.iter().map(|(k, _)| k.as_str()).collect(),
        }
        .fmt(f)
    }
}

/// What the builder's and the sink's `Debug` show, formatted in one place:
/// the URL without credentials or query, secrets only counted, headers by
/// name only (their values may be credentials).
struct Shown<'a> {
    name: &'static str,
    url: &'a str,
    secrets: usize,
    connect_timeout: Duration,
    timeout: Duration,
    max_response_bytes: u64,
    deny_private: bool,
    headers: Vec<&'a str>,
}

impl fmt::Debug for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(self.name)
            .field("url", &self.url)
            .field("secrets", &format_args!("<{} redacted>", self.secrets))
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("deny_private_addresses", &self.deny_private)
            .field("headers", &self.headers)
            .finish()
    }
}

/// POSTs each envelope to a URL, signed per Standard Webhooks (see the
/// [module docs](self)). Built with [`WebhookSink::builder`].
pub struct WebhookSink {
    agent: ureq::Agent,
    redactor: Redactor,
    url: String,
    shown_url: String,
    secrets: Vec<WebhookSecret>,
    headers: Vec<(HeaderName, HeaderValue)>,
    connect_timeout: Duration,
    timeout: Duration,
    max_response_bytes: u64,
    deny_private: bool,
}

impl WebhookSink {
    /// Starts a builder for a sink posting to `url`.
    pub fn builder(url: impl Into<String>) -> WebhookSinkBuilder {
        WebhookSinkBuilder {
            url: url.into(),
            secrets: Vec::new(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            timeout: DEFAULT_TIMEOUT,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            deny_private: false,
            headers: Vec::new(),
        }
    }

    /// The total timeout of one request (a relay's lease must be longer).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The URL, without credentials or query string (for logs).
    pub fn display_url(&self) -> &str {
        &self.shown_url
    }

    /// The `webhook-signature` header value for one request: one `v1,`
    /// signature per secret, space-separated.
    fn signature_header(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        self.secrets
            .iter()
            .map(|s| sign(s.as_bytes(), id, timestamp, body))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn post(&self, delivery: &Delivery) -> Outcome {
        let body = delivery.envelope.to_json();
        let id = delivery.envelope.event_id.to_string();
        let now = SystemTime::now();
        let timestamp = now
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let mut request = self
            .agent
            .post(&self.url)
            .header("content-type", "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string())
            .header(
                "webhook-signature",
                self.signature_header(&id, timestamp, body.as_bytes()),
            );
        if let Some(tenant) = &delivery.tenant_id {
            request = request.header(TENANT_HEADER, percent_encode(tenant));
        }
        if delivery.legacy {
            request = request.header(LEGACY_HEADER, "true");
        }
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        let mut response = match request.send(body.as_bytes()) {
            Ok(r) => r,
            Err(e) => return self.network_error(e),
        };
        let status = response.status().as_u16();
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let retry_after = header("retry-after");
        let location = header("location");
        let mut content = Vec::new();
        // A body cut short by a timeout still gives what arrived; the status
        // is the verdict either way.
        let _ = response
            .body_mut()
            .as_reader()
            .take(self.max_response_bytes)
            .read_to_end(&mut content);
        classify(
            status,
            retry_after.as_deref(),
            location.as_deref(),
            &content,
            now,
        )
    }

    fn network_error(&self, e: ureq::Error) -> Outcome {
        let url = &self.shown_url;
        match e {
            ureq::Error::Other(inner) => match inner.downcast_ref::<AddressRefused>() {
                Some(refused) => Outcome::poison(format!("cannot POST to {url}: {refused}")),
                None => Outcome::retry(format!("cannot POST to {url}: {inner}")),
            },
            ureq::Error::Timeout(which) => Outcome::retry(format!(
                "POST to {url} timed out ({which} timeout; connect {:?}, total {:?})",
                self.connect_timeout, self.timeout
            )),
            ureq::Error::HostNotFound => Outcome::retry(format!(
                "cannot POST to {url}: the host name did not resolve"
            )),
            other => Outcome::retry(format!("cannot POST to {url}: {other}")),
        }
    }
}

impl Consumer for WebhookSink {
    fn deliver(&self, delivery: &Delivery) -> Outcome {
        // A receiver may echo the request (its URL, an authorization header)
        // in its answer, and an error may quote the URL: the reason goes to
        // logs and dead letters, so configured secrets are cut out of it.
        match self.post(delivery) {
            Outcome::Retry { reason, after } => Outcome::Retry {
                reason: self.redactor.apply(reason),
                after,
            },
            Outcome::Poison { reason } => Outcome::Poison {
                reason: self.redactor.apply(reason),
            },
            delivered => delivered,
        }
    }
}

impl fmt::Debug for WebhookSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Shown {
            name: "WebhookSink",
            url: &self.shown_url,
            secrets: self.secrets.len(),
            connect_timeout: self.connect_timeout,
            timeout: self.timeout,
            max_response_bytes: self.max_response_bytes,
            deny_private: self.deny_private,
            headers: self.headers.iter().map(|(k, _)| k.as_str()).collect(),
        }
        .fmt(f)
    }
}

/// The verdict on one response.
fn classify(
    status: u16,
    retry_after: Option<&str>,
    location: Option<&str>,
    body: &[u8],
    now: SystemTime,
) -> Outcome {
    let reason = StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("");
    let snippet = super::bounded_text(body, BODY_SNIPPET_BYTES, false);
    let answered = if snippet.is_empty() {
        format!("the receiver answered {status} {reason}")
    } else {
        format!("the receiver answered {status} {reason}: {snippet}")
    };
    match status {
        200..=299 => Outcome::Delivered,
        300..=399 => Outcome::poison(format!(
            "the receiver answered {status} {reason}; redirects are not followed, update the URL to \
             Location: {}",
            location.unwrap_or("(none given)")
        )),
        408 | 425 | 429 | 500..=599 => match retry_after.and_then(|v| parse_retry_after(v, now)) {
            Some(after) => Outcome::retry_after(answered, after),
            None => Outcome::retry(answered),
        },
        400..=499 => Outcome::poison(answered),
        _ => Outcome::retry(answered),
    }
}

/// A `Retry-After` value: delay seconds, or an HTTP-date
/// (`Sun, 06 Nov 1994 08:49:37 GMT`). None when absent, unparseable or not
/// in the future; capped at [`MAX_RETRY_AFTER`].
fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    let after = if let Ok(secs) = value.parse::<u64>() {
        Duration::from_secs(secs)
    } else {
        let format = time::macros::format_description!(
            "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
        );
        let at = time::PrimitiveDateTime::parse(value, format)
            .ok()?
            .assume_utc();
        let at = SystemTime::from(at);
        at.duration_since(now).ok()?
    };
    (!after.is_zero()).then(|| after.min(MAX_RETRY_AFTER))
}

/// The URL with credentials and query string cut off, for messages and logs.
fn redact_url(url: &str) -> String {
    let url = url.trim();
    let without_query = url.split(['?', '#']).next().unwrap_or("");
    match without_query.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = match rest.find('/') {
                Some(i) => rest.split_at(i),
                None => (rest, ""),
            };
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{scheme}://{host}{path}")
        }
        None => without_query.to_string(),
    }
}

/// The port as written in a URL's authority (`user@host:port`, `[::1]:port`),
/// None when there is none or it is empty (the scheme's default).
fn port_text(authority: &str) -> Option<&str> {
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let after_host = host_port.rsplit_once(']').map_or(host_port, |(_, p)| p);
    after_host
        .rsplit_once(':')
        .map(|(_, port)| port)
        .filter(|p| !p.is_empty())
}

/// True when a URL's host is refused before any lookup: a non-public IP
/// literal, `localhost`, or a name under `.localhost` (RFC 6761 reserves
/// them for loopback).
fn names_non_public(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return is_non_public(ip);
    }
    let name = bare.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost")
}

/// A header value of any UTF-8 text: percent-encoded, with letters, digits
/// and `-._~` as they are (RFC 3986's unreserved characters), so that any
/// tenant id fits a header and decodes back unambiguously.
fn percent_encode(text: &str) -> String {
    /// Everything but RFC 3986's unreserved characters.
    const RESERVED: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    utf8_percent_encode(text, RESERVED).to_string()
}

/// True for a header whose value is a credential, by its name.
fn is_credential_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "auth",
        "token",
        "secret",
        "key",
        "password",
        "cookie",
        "session",
        "credential",
        "signature",
    ]
    .iter()
    .any(|word| name.contains(word))
}

/// The secrets of one sink's configuration, to cut out of every reason:
/// the URL's query string and each of its values, the URL's user and
/// password, each signing secret (whole, and its base64 part), and the
/// values of credential headers (whole, and the token after a scheme such
/// as `Bearer`).
struct Redactor {
    /// Longest first, so a whole query goes before its parts.
    needles: Vec<String>,
}

impl Redactor {
    /// Shorter strings are left alone: they are not secrets worth the name,
    /// and cutting them would garble ordinary words.
    const MIN_LEN: usize = 4;

    fn new(url: &str, secrets: &[String], headers: &[(String, String)]) -> Redactor {
        let mut needles: Vec<String> = Vec::new();
        let url = url.trim();
        if let Some((_, query)) = url.split_once('?') {
            let query = query.split('#').next().unwrap_or("");
            needles.push(query.to_string());
            for pair in query.split('&') {
                needles.push(pair.split_once('=').map_or(pair, |(_, v)| v).to_string());
            }
        }
        if let Some((_, rest)) = url.split_once("://") {
            let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
            if let Some((userinfo, _)) = authority.rsplit_once('@') {
                needles.push(userinfo.to_string());
                needles.extend(userinfo.split(':').map(str::to_string));
            }
        }
        for secret in secrets {
            let secret = secret.trim();
            needles.push(secret.to_string());
            if let Some(b64) = secret.strip_prefix(SECRET_PREFIX) {
                needles.push(b64.to_string());
            }
        }
        for (name, value) in headers {
            if is_credential_header(name) {
                needles.push(value.trim().to_string());
                if let Some(token) = value.split_whitespace().last() {
                    needles.push(token.to_string());
                }
            }
        }
        needles.retain(|n| n.len() >= Self::MIN_LEN);
        needles.sort_by_key(|n| std::cmp::Reverse(n.len()));
        needles.dedup();
        Redactor { needles }
    }

    fn apply(&self, mut text: String) -> String {
        for needle in &self.needles {
            if text.contains(needle.as_str()) {
                text = text.replace(needle.as_str(), REDACTED);
            }
        }
        text
    }
}

/// The resolver's refusal of a non-public address.
#[derive(Debug)]
struct AddressRefused {
    ip: IpAddr,
}

impl fmt::Display for AddressRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "refused to connect to {}: it is not a public address (loopback, private, \
             link-local or similar) and this webhook denies private addresses",
            self.ip
        )
    }
}

impl std::error::Error for AddressRefused {}

/// The default resolver, then a filter dropping non-public addresses when
/// asked. The connector dials only what this returns, so the check and the
/// connection see the same addresses.
#[derive(Debug)]
struct GuardedResolver {
    inner: DefaultResolver,
    deny_private: bool,
}

impl Resolver for GuardedResolver {
    fn resolve(
        &self,
        uri: &Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let resolved = self.inner.resolve(uri, config, timeout)?;
        if !self.deny_private {
            return Ok(resolved);
        }
        let mut kept = self.empty();
        let mut refused = None;
        for addr in resolved.iter() {
            if is_non_public(addr.ip()) {
                refused.get_or_insert(addr.ip());
            } else {
                kept.push(*addr);
            }
        }
        match refused {
            Some(ip) if kept.is_empty() => Err(ureq::Error::Other(Box::new(AddressRefused { ip }))),
            _ => Ok(kept),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_public_addresses() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "127.9.9.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "::",
            "::1",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "fec0::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::1",
        ] {
            assert!(is_non_public(ip.parse().unwrap()), "{ip} should be refused");
        }
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700:4700::1111",
            "::ffff:8.8.8.8",
            "2002:0808:0808::1",
        ] {
            assert!(
                !is_non_public(ip.parse().unwrap()),
                "{ip} should be allowed"
            );
        }
    }

    #[test]
    fn classify_statuses() {
        let now = SystemTime::now();
        assert_eq!(classify(200, None, None, b"", now), Outcome::Delivered);
        assert_eq!(classify(204, None, None, b"", now), Outcome::Delivered);
        for s in [408, 425, 429, 500, 502, 503, 599] {
            assert!(
                matches!(
                    classify(s, None, None, b"", now),
                    Outcome::Retry { after: None, .. }
                ),
                "{s}"
            );
        }
        for s in [400, 401, 403, 404, 410, 422] {
            assert!(
                matches!(classify(s, None, None, b"", now), Outcome::Poison { .. }),
                "{s}"
            );
        }
        let Outcome::Poison { reason } = classify(301, None, Some("https://new/"), b"", now) else {
            panic!("a redirect is poison");
        };
        assert!(reason.contains("Location: https://new/"), "{reason}");
        // Retry-After is honoured on retryable statuses only.
        assert_eq!(
            classify(503, Some("120"), None, b"busy", now),
            Outcome::retry_after(
                "the receiver answered 503 Service Unavailable: busy",
                Duration::from_secs(120)
            )
        );
        assert!(matches!(
            classify(400, Some("120"), None, b"", now),
            Outcome::Poison { .. }
        ));
    }

    #[test]
    fn retry_after_forms() {
        // 2026-11-30T07:18:00Z
        let now = UNIX_EPOCH + Duration::from_secs(1_796_023_080);
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(
            parse_retry_after("Mon, 30 Nov 2026 07:20:00 GMT", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            parse_retry_after("Mon, 30 Nov 2026 07:00:00 GMT", now),
            None
        );
        assert_eq!(parse_retry_after("0", now), None);
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("99999999", now), Some(MAX_RETRY_AFTER));
    }

    #[test]
    fn hosts_refused_before_any_lookup() {
        for host in [
            "127.0.0.1",
            "[::1]",
            "10.0.0.7",
            "[::ffff:192.168.1.1]",
            "localhost",
            "LocalHost.",
            "api.localhost",
            "0.0.0.0",
        ] {
            assert!(names_non_public(host), "{host}");
        }
        for host in [
            "example.com",
            "8.8.8.8",
            "[2606:4700::1]",
            "localhost.example.com",
        ] {
            assert!(!names_non_public(host), "{host}");
        }
    }

    #[test]
    fn delivery_time_guard_refuses_what_a_name_resolves_to() {
        // build() refuses localhost outright; assemble() skips that check so
        // the guard that runs at each delivery (after DNS) is tested alone.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        for url in [
            format!("http://localhost:{port}/ok"),
            format!("http://127.0.0.1:{port}/ok"),
            format!("http://[::ffff:127.0.0.1]:{port}/ok"),
        ] {
            let builder = WebhookSink::builder(&url)
                .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
                .deny_private_addresses(true);
            let shown = redact_url(&url);
            let sink = builder.assemble(shown).unwrap();
            let delivery = Delivery {
                envelope: crate::Envelope {
                    event_id: crate::EventId::new(),
                    event_type: crate::EventType::parse("a.b.v1").unwrap(),
                    event_version: 1,
                    causation_id: None,
                    correlation_id: None,
                    occurred_at: crate::Timestamp::from_millis(0),
                    payload: serde_json::value::RawValue::from_string("1".into()).unwrap(),
                },
                attempt: 1,
                consumer: "c".into(),
                legacy: false,
                tenant_id: None,
                ordering_key: None,
            };
            match sink.deliver(&delivery) {
                Outcome::Poison { reason } => {
                    assert!(reason.contains("refused to connect"), "{url}: {reason}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        // Nothing connected: the guard refused before dialling.
        assert_eq!(
            listener.accept().unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock
        );
    }

    #[test]
    fn tenant_ids_are_percent_encoded() {
        assert_eq!(percent_encode("acme-01_x.y~z"), "acme-01_x.y~z");
        assert_eq!(percent_encode("a b%c/é\n"), "a%20b%25c%2F%C3%A9%0A");
    }

    #[test]
    fn debug_shows_no_credential_of_the_builder_or_the_sink() {
        let builder =
            WebhookSink::builder("https://user:hunter22@hooks.example.com/in?token=qtok-1234")
                .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
                .header("Authorization", "Bearer htok-5678");
        let shown_builder = format!("{builder:?}");
        let sink = builder.build().unwrap();
        let shown_sink = format!("{sink:?}");
        for (name, shown) in [
            ("WebhookSinkBuilder", shown_builder),
            ("WebhookSink", shown_sink),
        ] {
            assert!(shown.starts_with(name), "{shown}");
            for secret in ["hunter22", "qtok-1234", "MfKQ9r8GKYq", "htok-5678"] {
                assert!(!shown.contains(secret), "{secret} in {shown}");
            }
            assert!(shown.contains("https://hooks.example.com/in"), "{shown}");
            assert!(shown.contains("<1 redacted>"), "{shown}");
            // The header by name (the sink keeps names lowercase).
            assert!(
                shown.to_ascii_lowercase().contains("\"authorization\""),
                "{shown}"
            );
        }
    }

    #[test]
    fn configured_secrets_are_cut_out_of_reasons() {
        let r = Redactor::new(
            "https://user:hunter22@h/p?token=qtok-1234&mode=x#frag",
            &["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_string()],
            &[
                ("Authorization".to_string(), "Bearer htok-5678".to_string()),
                ("x-source".to_string(), "outboxd".to_string()),
            ],
        );
        let reason = r.apply(
            "answered 500: you sent /p?token=qtok-1234&mode=x with Bearer htok-5678, \
             token qtok-1234, key MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw, pw hunter22, from outboxd"
                .to_string(),
        );
        for secret in ["qtok-1234", "htok-5678", "MfKQ9r8GKYq", "hunter22"] {
            assert!(!reason.contains(secret), "{secret} in {reason}");
        }
        // Ordinary header values and short query values stay.
        assert!(reason.ends_with("from outboxd"), "{reason}");
        assert!(reason.contains("/p?<redacted> with"), "{reason}");
    }

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            redact_url("https://user:pw@example.com:8443/a/b?token=x#f"),
            "https://example.com:8443/a/b"
        );
        assert_eq!(redact_url("http://h"), "http://h");
    }

    #[test]
    fn build_rejects_bad_config_without_leaking_secrets() {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let err = |b: WebhookSinkBuilder| b.build().unwrap_err().to_string();
        let e = err(WebhookSink::builder("ftp://h/x").secret(secret));
        assert!(e.contains("scheme \"ftp\""), "{e}");
        let e = err(WebhookSink::builder("not a url").secret(secret));
        assert!(e.contains("not valid"), "{e}");
        let e = err(WebhookSink::builder("/relative").secret(secret));
        assert!(e.contains("scheme"), "{e}");
        // A port no connection can use: refused now, not at every delivery.
        for (url, port) in [
            ("http://127.0.0.1:99999/", "99999"),
            ("https://h:65536/x", "65536"),
            ("http://h:0/", "0"),
            (
                "http://[::1]:123456789012345678901/",
                "123456789012345678901",
            ),
        ] {
            let e = err(WebhookSink::builder(url).secret(secret));
            assert!(
                e.contains("not valid") && e.contains(&format!("port {port} ")),
                "{url}: {e}"
            );
            assert!(e.contains("1 to 65535"), "{url}: {e}");
        }
        for url in ["http://h:65535/", "https://h:1/", "http://h/"] {
            assert!(
                WebhookSink::builder(url).secret(secret).build().is_ok(),
                "{url}"
            );
        }
        assert!(err(WebhookSink::builder("https://h/")).contains("no secret"));
        let e = err(WebhookSink::builder("https://h/").secret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"));
        assert!(e.contains("#1") && e.contains("whsec_"), "{e}");
        assert!(!e.contains("MfKQ9r8"), "{e}");
        let e = err(WebhookSink::builder("https://h/")
            .secret(secret)
            .secret("whsec_!!!notbase64"));
        assert!(e.contains("#2") && e.contains("base64"), "{e}");
        assert!(!e.contains("notbase64"), "{e}");
        let e = err(WebhookSink::builder("https://h/").secret("whsec_c2hvcnQ="));
        assert!(e.contains("5 bytes"), "{e}");
        let e = err(WebhookSink::builder("https://h/")
            .secret(secret)
            .header("webhook-id", "x"));
        assert!(e.contains("sets this header itself"), "{e}");
        let e = err(WebhookSink::builder("https://h/")
            .secret(secret)
            .header("bad name", "x"));
        assert!(e.contains("not a valid header name"), "{e}");
        let e = err(WebhookSink::builder("https://h/")
            .secret(secret)
            .timeout(Duration::ZERO));
        assert!(e.contains("timeout must be greater than zero"), "{e}");

        let builder = WebhookSink::builder("https://u:pw@h/?k=v").secret(secret);
        let debug = format!("{builder:?}");
        assert!(
            !debug.contains("MfKQ9r8") && !debug.contains("pw"),
            "{debug}"
        );
        let sink = builder.build().unwrap();
        let debug = format!("{sink:?}");
        assert!(
            !debug.contains("MfKQ9r8") && !debug.contains("pw"),
            "{debug}"
        );
        assert!(!format!("{:?}", WebhookSecret::parse(secret).unwrap()).contains("MfKQ9r8"));
    }
}
