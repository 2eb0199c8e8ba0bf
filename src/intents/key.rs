//! Which intent: the scope and idempotency key, and the marker derived from
//! them that a post embeds so a retry can find its output.

use std::fmt;

use sha2::{Digest, Sha256};

use super::{IntentError, IntentResult};

/// The prefix of every marker.
pub const MARKER_PREFIX: &str = "outboxd-intent-";

/// Which intent: an idempotency key in the system scope or in a tenant's.
/// The same key in two scopes names two intents.
///
/// ```
/// use outboxd::intents::IntentKey;
/// let a = IntentKey::tenant("acme", "welcome-mail/42").unwrap();
/// let b = IntentKey::tenant("globex", "welcome-mail/42").unwrap();
/// assert_ne!(a.marker(), b.marker());
/// assert!(a.marker().starts_with("outboxd-intent-"));
/// assert!(!a.marker().contains(':'));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IntentKey {
    pub(super) tenant: Option<String>,
    pub(super) key: String,
}

impl IntentKey {
    /// A key in a tenant's scope, or the system scope for `None`. The key
    /// must not be empty; a tenant, when given, must not be empty either
    /// (use `None` for the system scope). Any other characters are allowed.
    pub fn new(tenant: Option<&str>, key: impl Into<String>) -> IntentResult<IntentKey> {
        let key = key.into();
        if key.is_empty() {
            return Err(IntentError::InvalidKey {
                reason: "the idempotency key is empty; give a non-empty key that names the write \
                         (such as comment/<event id>)"
                    .into(),
            });
        }
        if tenant == Some("") {
            return Err(IntentError::InvalidKey {
                reason: format!(
                    "the tenant of key {key:?} is empty; give a tenant id, or no tenant for the system scope"
                ),
            });
        }
        Ok(IntentKey {
            tenant: tenant.map(str::to_string),
            key,
        })
    }

    /// A key in the system scope (no tenant).
    pub fn system(key: impl Into<String>) -> IntentResult<IntentKey> {
        IntentKey::new(None, key)
    }

    /// A key in a tenant's scope.
    pub fn tenant(tenant: &str, key: impl Into<String>) -> IntentResult<IntentKey> {
        IntentKey::new(Some(tenant), key)
    }

    /// The tenant, or `None` for the system scope.
    pub fn tenant_id(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// The idempotency key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The marker a post embeds so a retry can find its output:
    /// `outboxd-intent-` and 64 lowercase hex digits of a SHA-256 over the
    /// scope and key. It uses only `a-z`, `0-9` and single `-`, so it fits
    /// an HTML comment, a header value, a metadata field or a queue job id.
    /// It is stable across versions and machines, and different for every
    /// (scope, key): the hash input length-prefixes each part, so tenant
    /// `a:b` with key `c` and tenant `a` with key `b:c` differ.
    ///
    /// A [`send`](super::send) uses the marker stored with the intent, which
    /// is this one for every intent this version records.
    pub fn marker(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"outboxd publish intent v1\0");
        match &self.tenant {
            None => h.update([0u8]),
            Some(t) => {
                h.update([1u8]);
                h.update((t.len() as u64).to_be_bytes());
                h.update(t.as_bytes());
            }
        }
        h.update((self.key.len() as u64).to_be_bytes());
        h.update(self.key.as_bytes());
        let digest = h.finalize();
        let mut out = String::with_capacity(MARKER_PREFIX.len() + 64);
        out.push_str(MARKER_PREFIX);
        for b in digest.iter() {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }
}

impl fmt::Display for IntentKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tenant {
            Some(t) => write!(f, "intent {:?} of tenant {t:?}", self.key),
            None => write!(f, "intent {:?} (system)", self.key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_is_stable_and_colon_free() {
        let m = IntentKey::tenant("acme", "comment/1").unwrap().marker();
        assert_eq!(m.len(), MARKER_PREFIX.len() + 64);
        assert!(m
            .trim_start_matches(MARKER_PREFIX)
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert!(!m.contains("--"), "fits an HTML comment");
        // Pinned (computed independently): a marker already embedded in
        // posted outputs must be found by every later version.
        assert_eq!(
            IntentKey::system("k").unwrap().marker(),
            "outboxd-intent-43e88af8faad6221e5d5cfde6793acb9f559b9375e9adfd2389e2a9bb086f734"
        );
        assert_eq!(
            m,
            "outboxd-intent-2c22f0ea03391ec46f65e3a44de0128229022352173e123614c99a3900f0e55e"
        );
    }

    #[test]
    fn marker_parts_cannot_run_together() {
        let m = |t: Option<&str>, k: &str| IntentKey::new(t, k).unwrap().marker();
        assert_ne!(m(Some("a:b"), "c"), m(Some("a"), "b:c"));
        assert_ne!(m(Some("ab"), "c"), m(Some("a"), "bc"));
        assert_ne!(m(None, "k"), m(Some("system"), "k"));
        assert_ne!(m(None, "k"), m(Some("\0"), "k"));
    }

    #[test]
    fn empty_keys_and_tenants_are_refused() {
        assert!(matches!(
            IntentKey::system(""),
            Err(IntentError::InvalidKey { .. })
        ));
        let e = IntentKey::tenant("", "k").unwrap_err();
        assert!(e.to_string().contains("system scope"), "{e}");
    }
}
