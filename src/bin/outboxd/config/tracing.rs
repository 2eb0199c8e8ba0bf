//! `[tracing]`: `run`'s spans, one per delivery attempt, exported over
//! OTLP/HTTP (protobuf) to a collector: the `otlp` feature. A build
//! without it does not parse the section (an unknown field, refused with
//! [`WITHOUT_OTLP`]), so that the default binary carries none of its code.

#[cfg(feature = "otlp")]
use std::collections::BTreeMap;
#[cfg(feature = "otlp")]
use std::time::Duration;

#[cfg(feature = "otlp")]
use serde::Deserialize;

#[cfg(feature = "otlp")]
use super::checker::Checker;
#[cfg(feature = "otlp")]
use super::error::ConfigError;
#[cfg(feature = "otlp")]
use super::values::{Dur, Whole};

/// A build without the `otlp` feature has no settings to export with.
#[cfg(not(feature = "otlp"))]
pub(crate) type TracingSettings = std::convert::Infallible;

/// Why a build without the `otlp` feature refuses `[tracing]` (the
/// section is not parsed there, so that the default binary carries none of
/// its code).
#[cfg_attr(feature = "otlp", allow(dead_code))]
pub(crate) const WITHOUT_OTLP: &str = "needs the `otlp` feature, which this build of outboxd \
     leaves out; build with `cargo build --release --features otlp` or remove the section";

/// `[tracing]`, checked: where and how to export.
#[cfg(feature = "otlp")]
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct TracingSettings {
    /// The URL spans are POSTed to (`…/v1/traces`).
    pub(crate) endpoint: String,
    /// The resource's attributes, `service.name` first.
    pub(crate) resource: Vec<(String, String)>,
    /// The collector's auth header: its name and value (from the
    /// environment; never logged).
    pub(crate) auth: Option<(String, String)>,
    /// The most spans waiting for export; more are dropped and counted.
    pub(crate) queue: usize,
    /// The time limit of one export request.
    pub(crate) timeout: Duration,
}

/// Without the auth header's value.
#[cfg(feature = "otlp")]
impl std::fmt::Debug for TracingSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TracingSettings")
            .field("endpoint", &self.endpoint)
            .field("resource", &self.resource)
            .field("auth_header", &self.auth.as_ref().map(|(name, _)| name))
            .field("queue", &self.queue)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// The default bound of spans waiting for export.
#[cfg(feature = "otlp")]
pub(crate) const DEFAULT_QUEUE: usize = 2048;

/// `[tracing]` as written.
#[cfg(feature = "otlp")]
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTracing {
    otlp_endpoint: Option<String>,
    service_name: Option<String>,
    #[serde(default)]
    resource_attributes: BTreeMap<String, String>,
    auth_header: Option<String>,
    auth_header_env: Option<String>,
    queue: Option<Whole<1, 1_000_000>>,
    timeout: Option<Dur>,
}

/// Checks `[tracing]`: `None` without an `otlp_endpoint`.
#[cfg(feature = "otlp")]
pub(crate) fn check(
    c: &Checker<'_>,
    raw: &RawTracing,
) -> Result<Option<TracingSettings>, ConfigError> {
    let Some(endpoint) = &raw.otlp_endpoint else {
        if raw.auth_header_env.is_some() || raw.service_name.is_some() {
            return Err(c.err(
                "tracing",
                "has settings but no otlp_endpoint; set otlp_endpoint (such as \
                 \"http://localhost:4318/v1/traces\") or remove the section",
            ));
        }
        return Ok(None);
    };
    let url = endpoint.trim();
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        return Err(c.err(
            "tracing.otlp_endpoint",
            format!("{url:?} is not an http:// or https:// URL"),
        ));
    };
    // A bare collector address gets OTLP/HTTP's path for traces.
    let endpoint = match rest.find('/') {
        None => format!("{url}/v1/traces"),
        Some(i) if &rest[i..] == "/" => format!("{url}v1/traces"),
        Some(_) => url.to_string(),
    };
    let service = raw.service_name.clone().unwrap_or_else(|| "outboxd".into());
    if service.trim().is_empty() {
        return Err(c.err("tracing.service_name", "is empty"));
    }
    let mut resource = vec![("service.name".to_string(), service)];
    for (k, v) in &raw.resource_attributes {
        if k == "service.name" {
            return Err(c.err(
                "tracing.resource_attributes",
                "sets service.name; use tracing.service_name",
            ));
        }
        resource.push((k.clone(), v.clone()));
    }
    let auth = match &raw.auth_header_env {
        None => None,
        Some(var) => {
            let name = raw
                .auth_header
                .clone()
                .unwrap_or_else(|| "authorization".into());
            if ureq::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(c.err("tracing.auth_header", "is not a valid header name"));
            }
            let value = super::secrets::secret_from_env(
                c.env_lookup(),
                var,
                "the collector's auth header value (such as \"Bearer …\")",
            )
            .map_err(|e| c.err("tracing.auth_header_env", e.to_string()))?;
            Some((name, value))
        }
    };
    Ok(Some(TracingSettings {
        endpoint,
        resource,
        auth,
        queue: raw.queue.map_or(DEFAULT_QUEUE, |q| q.get()),
        timeout: raw.timeout.map_or(Duration::from_secs(10), |d| d.0),
    }))
}

#[cfg(test)]
mod tests {
    use super::super::tests::{parse_with_env, STDOUT};

    fn tracing(section: &str) -> String {
        format!("{STDOUT}[tracing]\n{section}")
    }

    /// A build without the feature refuses to be asked to export.
    #[cfg(not(feature = "otlp"))]
    #[test]
    fn an_endpoint_needs_the_otlp_feature() {
        let e = parse_with_env(&tracing("otlp_endpoint = \"http://c:4318\"\n"), &[]).unwrap_err();
        assert_eq!(e.field, "tracing");
        assert!(e.message.contains("`otlp` feature"), "{e}");
        assert_eq!(e.line, Some(7), "{e}");
    }

    #[cfg(feature = "otlp")]
    #[test]
    fn the_endpoint_resource_and_auth_header_are_checked() {
        let c = parse_with_env(
            &tracing(
                "otlp_endpoint = \"http://c:4318\"\nservice_name = \"shop\"\n\
                 resource_attributes = { \"host.name\" = \"a\" }\nauth_header_env = \"T\"\n",
            ),
            &[("T", "Bearer s3cret-value")],
        )
        .unwrap();
        let t = c.tracing.unwrap();
        assert_eq!(t.endpoint, "http://c:4318/v1/traces");
        assert_eq!(t.resource[0], ("service.name".into(), "shop".into()));
        assert_eq!(t.resource[1], ("host.name".into(), "a".into()));
        assert_eq!(
            t.auth,
            Some(("authorization".into(), "Bearer s3cret-value".into()))
        );
        assert!(!format!("{t:?}").contains("s3cret"), "{t:?}");
        let kept = parse_with_env(&tracing("otlp_endpoint = \"https://c/x/v1/traces\"\n"), &[]);
        assert_eq!(
            kept.unwrap().tracing.unwrap().endpoint,
            "https://c/x/v1/traces"
        );
        for (section, field) in [
            ("otlp_endpoint = \"c:4318\"\n", "tracing.otlp_endpoint"),
            ("otlp_endpoint = \"http://c\"\nauth_header_env = \"NOPE\"\n", "tracing.auth_header_env"),
            ("service_name = \"x\"\n", "tracing"),
            (
                "otlp_endpoint = \"http://c\"\nresource_attributes = { \"service.name\" = \"x\" }\n",
                "tracing.resource_attributes",
            ),
        ] {
            let e = parse_with_env(&tracing(section), &[]).unwrap_err();
            assert_eq!(e.field, field, "{section}: {e}");
        }
    }
}
