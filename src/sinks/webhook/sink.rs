//! The sink itself: the signed request, the verdict on its answer
//! (`Retry-After` included) and on a network error.

use std::fmt;
use std::io::Read;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use ureq::http::{HeaderName, HeaderValue, StatusCode};
use ureq::Timeout;

use super::address::AddressRefused;
use super::redact::{Redactor, Shown};
use super::signature::{sign, WebhookSecret};
use super::{
    BODY_SNIPPET_BYTES, LEGACY_HEADER, MAX_RETRY_AFTER, MAX_TENANT_HEADER_BYTES,
    ORDERING_KEY_HEADER, TENANT_HEADER,
};
use crate::consumer::{Consumer, Delivery, Outcome};

/// POSTs each envelope to a URL, signed per Standard Webhooks (see the
/// [module docs](super)). Built with [`WebhookSink::builder`].
pub struct WebhookSink {
    pub(super) agent: ureq::Agent,
    pub(super) redactor: Redactor,
    pub(super) url: String,
    pub(super) shown_url: String,
    pub(super) secrets: Vec<WebhookSecret>,
    pub(super) headers: Vec<(HeaderName, HeaderValue)>,
    pub(super) connect_timeout: Duration,
    pub(super) timeout: Duration,
    pub(super) max_response_bytes: u64,
    pub(super) deny_private: bool,
}

impl WebhookSink {
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
        let tenant = delivery.tenant_id.as_deref().map(percent_encode);
        let ordering_key = delivery.ordering_key.as_deref().map(percent_encode);
        for (header, what, value) in [
            (TENANT_HEADER, "tenant id", &tenant),
            (ORDERING_KEY_HEADER, "ordering key", &ordering_key),
        ] {
            if let Some(value) = value.as_ref().filter(|v| v.len() > MAX_TENANT_HEADER_BYTES) {
                return Outcome::poison(format!(
                    "the {what} makes a {header} header of {} bytes, more than the \
                     {MAX_TENANT_HEADER_BYTES} a request carries (HTTP servers commonly take 8 to \
                     16 KiB of headers in all)",
                    value.len()
                ));
            }
        }
        let body = match crate::sinks::buffer::envelope_json(&delivery.envelope) {
            Ok(body) => body,
            Err(e) => return e.retry(),
        };
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
                self.signature_header(&id, timestamp, &body),
            );
        if let Some(tenant) = tenant {
            request = request.header(TENANT_HEADER, tenant);
        }
        if let Some(key) = ordering_key {
            request = request.header(ORDERING_KEY_HEADER, key);
        }
        if delivery.legacy {
            request = request.header(LEGACY_HEADER, "true");
        }
        // Outside the signature, which covers id.timestamp.body only.
        for (name, value) in delivery.trace.iter().flat_map(|t| t.fields()) {
            request = request.header(name, value);
        }
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        let mut response = match request.send(&body[..]) {
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
            // Before the request was sent: the receiver is out of reach.
            ureq::Error::Timeout(which @ (Timeout::Resolve | Timeout::Connect)) => {
                Outcome::unavailable(format!(
                    "POST to {url} timed out ({which} timeout; connect {:?}, total {:?})",
                    self.connect_timeout, self.timeout
                ))
            }
            ureq::Error::Timeout(which) => Outcome::retry(format!(
                "POST to {url} timed out ({which} timeout; connect {:?}, total {:?})",
                self.connect_timeout, self.timeout
            )),
            // A name that does not exist is refused by check-config and at
            // start; at run time a failed lookup is the resolver's outage.
            ureq::Error::HostNotFound => Outcome::unavailable(format!(
                "cannot POST to {url}: the host name did not resolve"
            )),
            ureq::Error::Io(e) if unreachable(&e) => {
                Outcome::unavailable(format!("cannot POST to {url}: {e}"))
            }
            // A refused TLS handshake (a rotated certificate) stops every
            // event alike: check-config names it, health shows the pause.
            e @ (ureq::Error::ConnectionFailed | ureq::Error::Tls(_) | ureq::Error::Rustls(_)) => {
                Outcome::unavailable(format!("cannot POST to {url}: {e}"))
            }
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
            Outcome::Unavailable { reason, after } => Outcome::Unavailable {
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

/// An I/O error that says the receiver could not be reached or dropped
/// the connection: an outage, not this event's failure.
fn unreachable(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused
            | ConnectionReset
            | ConnectionAborted
            | NotConnected
            | BrokenPipe
            | TimedOut
            | HostUnreachable
            | NetworkUnreachable
            | AddrNotAvailable
    )
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
    let snippet = crate::sinks::bounded_text(body, BODY_SNIPPET_BYTES, false);
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
        429 | 502..=504 => match retry_after.and_then(|v| parse_retry_after(v, now)) {
            Some(after) => Outcome::unavailable_after(answered, after),
            None => Outcome::unavailable(answered),
        },
        408 | 425 | 500..=599 => match retry_after.and_then(|v| parse_retry_after(v, now)) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_statuses() {
        let now = SystemTime::now();
        assert_eq!(classify(200, None, None, b"", now), Outcome::Delivered);
        assert_eq!(classify(204, None, None, b"", now), Outcome::Delivered);
        for s in [408, 425, 500, 501, 505, 599] {
            assert!(
                matches!(
                    classify(s, None, None, b"", now),
                    Outcome::Retry { after: None, .. }
                ),
                "{s}"
            );
        }
        for s in [429, 502, 503, 504] {
            assert!(
                matches!(
                    classify(s, None, None, b"", now),
                    Outcome::Unavailable { after: None, .. }
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
            Outcome::unavailable_after(
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
    fn tenant_ids_are_percent_encoded() {
        assert_eq!(percent_encode("acme-01_x.y~z"), "acme-01_x.y~z");
        assert_eq!(percent_encode("a b%c/é\n"), "a%20b%25c%2F%C3%A9%0A");
    }
}
