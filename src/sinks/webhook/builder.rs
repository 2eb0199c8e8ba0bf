//! The sink's configuration: [`WebhookSinkBuilder`], which checks the URL,
//! the secrets, the headers and the bounds before the first delivery.

use std::fmt;
use std::time::Duration;

use ureq::http::{HeaderName, HeaderValue, Uri};
use ureq::unversioned::resolver::DefaultResolver;
use ureq::unversioned::transport::DefaultConnector;

use super::address::{names_non_public, GuardedResolver};
use super::redact::{redact_url, Redactor, Shown};
use super::signature::WebhookSecret;
use super::sink::WebhookSink;
use super::{
    WebhookError, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_TIMEOUT,
    LEGACY_HEADER, ORDERING_KEY_HEADER, TENANT_HEADER,
};

/// Headers the sink sets itself; configured headers may not replace them.
const RESERVED_HEADERS: [&str; 12] = [
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "content-type",
    "content-length",
    "host",
    "transfer-encoding",
    TENANT_HEADER,
    LEGACY_HEADER,
    ORDERING_KEY_HEADER,
    "traceparent",
    "tracestate",
];

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

    /// Refuses to connect to non-public addresses
    /// ([`is_non_public`](super::is_non_public)), checked on the addresses
    /// the host name resolves to, which are the ones dialled: no second
    /// lookup can rebind. For services whose tenants configure webhook URLs.
    /// Off by default.
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
    pub(super) fn assemble(self, shown: String) -> Result<WebhookSink, WebhookError> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
            .header("TraceParent", "00-x"));
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
