//! Secrets kept out of what the sink shows: the reasons it gives (for logs
//! and dead letters), its `Debug`, and the HTTP client's own log lines.

use std::fmt;
use std::time::Duration;

use super::signature::SECRET_PREFIX;

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

/// What the builder's and the sink's `Debug` show, formatted in one place:
/// the URL without credentials or query, secrets only counted, headers by
/// name only (their values may be credentials).
pub(super) struct Shown<'a> {
    pub(super) name: &'static str,
    pub(super) url: &'a str,
    pub(super) secrets: usize,
    pub(super) connect_timeout: Duration,
    pub(super) timeout: Duration,
    pub(super) max_response_bytes: u64,
    pub(super) deny_private: bool,
    pub(super) headers: Vec<&'a str>,
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

/// The URL with credentials and query string cut off, for messages and logs.
pub(super) fn redact_url(url: &str) -> String {
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
pub(super) struct Redactor {
    /// Longest first, so a whole query goes before its parts.
    needles: Vec<String>,
}

impl Redactor {
    /// Shorter strings are left alone: they are not secrets worth the name,
    /// and cutting them would garble ordinary words.
    const MIN_LEN: usize = 4;

    pub(super) fn new(url: &str, secrets: &[String], headers: &[(String, String)]) -> Redactor {
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

    pub(super) fn apply(&self, mut text: String) -> String {
        for needle in &self.needles {
            if text.contains(needle.as_str()) {
                text = text.replace(needle.as_str(), REDACTED);
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::super::WebhookSink;
    use super::*;

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
}
