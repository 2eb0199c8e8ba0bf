//! Standard Webhooks signing: the secrets, [`sign`] for the sink and
//! [`verify`] for receivers.

use std::fmt;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::WebhookError;

/// Secret prefix required by Standard Webhooks.
pub(super) const SECRET_PREFIX: &str = "whsec_";

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

    pub(super) fn parse_nth(s: &str, index: usize) -> Result<WebhookSecret, WebhookError> {
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
