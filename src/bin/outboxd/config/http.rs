//! `[http]`: where the console, `/metrics` and `/healthz` are served, and who
//! may use them.
//!
//! ```toml
//! [http]
//! listen = "127.0.0.1:9464"   # or `outboxd run --http ADDR`
//! token_env = "OUTBOXD_HTTP_TOKEN"  # required for an address other than loopback
//! read_only = false           # true hides every action (requeue, discard, replay)
//! ```
//!
//! A loopback address needs no token: whoever can reach it is on the machine.
//! Any other address is refused unless a token is configured, so a console
//! that can requeue and replay is never opened to a network by accident.

use std::net::SocketAddr;

use serde::Deserialize;

use super::{resolve_listen, Checker, ConfigError};

/// The shortest token accepted: shorter ones can be guessed.
pub const MIN_TOKEN_LEN: usize = 16;

/// `[http]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttp {
    listen: Option<String>,
    token_env: Option<String>,
    read_only: Option<bool>,
}

/// `[http]`, validated. The address may still come from `--http`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpSettings {
    /// `listen`: where to serve.
    pub listen: Option<SocketAddr>,
    /// `token_env`: the environment variable holding the token.
    pub token_env: Option<String>,
    /// `read_only`: hide every action.
    pub read_only: bool,
}

/// What a server needs to start: the address, the token (checked against
/// the address) and the read-only switch.
#[derive(Clone, PartialEq, Eq)]
pub struct HttpServe {
    /// The address to bind.
    pub listen: SocketAddr,
    /// The token a request must carry; None on loopback without one.
    pub token: Option<String>,
    /// Hide every action.
    pub read_only: bool,
}

impl std::fmt::Debug for HttpServe {
    // The token never reaches a log line or an error message.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpServe")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("read_only", &self.read_only)
            .finish()
    }
}

/// Checks `[http]`. The token is read and checked against the address here
/// too (so `check-config` reports a missing one), and again by
/// [`HttpSettings::serve`] once `--http` may have changed the address.
pub fn check(c: &Checker<'_>, raw: &RawHttp) -> Result<HttpSettings, ConfigError> {
    let listen = match &raw.listen {
        None => None,
        Some(a) => Some(resolve_listen(a).map_err(|m| c.err("http.listen", m))?),
    };
    if let Some(name) = &raw.token_env {
        check_token_env_name(name).map_err(|m| c.err("http.token_env", m))?;
    }
    let settings = HttpSettings {
        listen,
        token_env: raw.token_env.clone(),
        read_only: raw.read_only.unwrap_or(false),
    };
    settings.serve(None).map_err(|(field, m)| c.err(field, m))?;
    Ok(settings)
}

/// Refuses the console and the legacy `[metrics] listen` on one address:
/// the console serves /metrics itself. The one check for `check-config`
/// and `run` (whose flags may give either address). An error is (field,
/// message).
pub fn distinct_from_metrics(
    console: SocketAddr,
    metrics: Option<SocketAddr>,
) -> Result<(), (&'static str, String)> {
    match metrics {
        Some(m) if m == console => Err((
            "metrics.listen",
            format!(
                "{m} is both the metrics and the console address; the console serves \
                 /metrics too, so drop metrics.listen (or --metrics)"
            ),
        )),
        _ => Ok(()),
    }
}

/// Refuses what cannot be an environment variable's name (`http.token_env`
/// or `--http-token-env`).
pub fn check_token_env_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains('=') || name.contains('\0') {
        return Err(format!(
            "{name:?} is not an environment variable name; name the variable that \
             holds the token, such as OUTBOXD_HTTP_TOKEN"
        ));
    }
    Ok(())
}

impl HttpSettings {
    /// The server to start, with `listen` (from `--http`) winning over the
    /// section's address; None when neither gives one. Refuses an address
    /// other than loopback without a token, and a token variable that is
    /// unset or too short. An error is (field, message).
    pub fn serve(
        &self,
        listen: Option<SocketAddr>,
    ) -> Result<Option<HttpServe>, (&'static str, String)> {
        let Some(addr) = listen.or(self.listen) else {
            return Ok(None);
        };
        let token = match &self.token_env {
            None => None,
            Some(name) => {
                let value = std::env::var(name).unwrap_or_default();
                if value.trim().len() < MIN_TOKEN_LEN {
                    return Err((
                        "http.token_env",
                        format!(
                            "the environment variable {name} is {}; set it to a token of at \
                             least {MIN_TOKEN_LEN} characters (such as the output of \
                             `openssl rand -hex 32`)",
                            if value.is_empty() {
                                "not set"
                            } else {
                                "too short"
                            }
                        ),
                    ));
                }
                Some(value.trim().to_string())
            }
        };
        if token.is_none() && !addr.ip().is_loopback() {
            return Err((
                "http.listen",
                format!(
                    "{addr} is not a loopback address, and anyone who can reach it could \
                     requeue, discard and replay events; name an environment variable holding \
                     a token with --http-token-env VAR (or [http] token_env in the config), \
                     or listen on 127.0.0.1"
                ),
            ));
        }
        Ok(Some(HttpServe {
            listen: addr,
            token,
            read_only: self.read_only,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::{parse, STDOUT};

    fn http(listen: &str, token_env: Option<&str>) -> Result<HttpSettings, ConfigError> {
        let mut text = format!("{STDOUT}[http]\nlisten = \"{listen}\"\n");
        if let Some(t) = token_env {
            text.push_str(&format!("token_env = \"{t}\"\n"));
        }
        parse(&text).map(|c| c.http)
    }

    #[test]
    fn loopback_needs_no_token() {
        let s = http("127.0.0.1:9464", None).unwrap();
        let serve = s.serve(None).unwrap().unwrap();
        assert_eq!(serve.listen.to_string(), "127.0.0.1:9464");
        assert!(serve.token.is_none() && !serve.read_only);
        let serve = s.serve(Some("[::1]:1".parse().unwrap())).unwrap().unwrap();
        assert_eq!(serve.listen.to_string(), "[::1]:1", "--http wins");
        assert_eq!(parse(STDOUT).unwrap().http, HttpSettings::default());
    }

    #[test]
    fn another_address_without_a_token_is_refused() {
        let e = http("0.0.0.0:9464", None).unwrap_err();
        assert_eq!(e.field, "http.listen");
        assert!(e.message.contains("not a loopback address"), "{e}");
        // An address from the command line is checked the same way.
        let (field, _) = HttpSettings::default()
            .serve(Some("0.0.0.0:1".parse().unwrap()))
            .unwrap_err();
        assert_eq!(field, "http.listen");
    }

    #[test]
    fn the_token_variable_must_hold_a_long_token() {
        let e = http("0.0.0.0:9464", Some("OUTBOXD_TEST_HTTP_TOKEN_UNSET_7f3a")).unwrap_err();
        assert_eq!(e.field, "http.token_env");
        assert!(e.message.contains("not set"), "{e}");
        let e = http("127.0.0.1:1", Some("A=B")).unwrap_err();
        assert_eq!(e.field, "http.token_env");
    }

    #[test]
    fn the_token_never_shows_in_debug_output() {
        let serve = HttpServe {
            listen: "127.0.0.1:1".parse().unwrap(),
            token: Some("very-secret-token-value".into()),
            read_only: true,
        };
        let text = format!("{serve:?}");
        assert!(!text.contains("very-secret"), "{text}");
    }
}
