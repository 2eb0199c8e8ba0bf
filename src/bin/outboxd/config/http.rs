//! `[http]`: where the console, `/metrics` and `/healthz` are served, and who
//! may use them.
//!
//! ```toml
//! [http]
//! listen = "127.0.0.1:9464"   # or `outboxd run --http ADDR`
//! token_env = "OUTBOXD_HTTP_TOKEN"  # required for an address other than loopback
//! read_only = false           # true hides every action (requeue, discard, replay)
//! trust_forwarded_for = false # true behind a proxy: wrong tokens counted per X-Forwarded-For client
//! ```
//!
//! A loopback address needs no token: whoever can reach it is on the machine.
//! Any other address is refused unless a token is configured, so a console
//! that can requeue and replay is never opened to a network by accident. A
//! token shorter than [`MIN_TOKEN_LEN`] is refused; a weak one ([`weakness`])
//! starts with a warning in this release and is refused in the next.

use std::net::SocketAddr;

use serde::Deserialize;

use super::checker::Checker;
use super::error::ConfigError;
use super::metrics::resolve_listen;
use super::secrets::{process_env, secret_from_env, Env, SecretEnvError};

/// The shortest token accepted: shorter ones can be guessed.
pub(crate) const MIN_TOKEN_LEN: usize = 16;

/// A strong token has at least this many characters...
pub(crate) const STRONG_TOKEN_LEN: usize = 32;

/// ...at least this many distinct ones...
pub(crate) const STRONG_TOKEN_DISTINCT: usize = 10;

/// ...and no character repeated more than this many times in a row (so
/// the output of `openssl rand -hex 32` or `-base64 32` is strong).
pub(crate) const STRONG_TOKEN_RUN: usize = 4;

/// `[http]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHttp {
    listen: Option<String>,
    token_env: Option<String>,
    read_only: Option<bool>,
    trust_forwarded_for: Option<bool>,
}

/// `[http]`, validated. The address may still come from `--http`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct HttpSettings {
    /// `listen`: where to serve.
    pub(crate) listen: Option<SocketAddr>,
    /// `token_env`: the environment variable holding the token.
    pub(crate) token_env: Option<String>,
    /// `read_only`: hide every action.
    pub(crate) read_only: bool,
    /// `trust_forwarded_for`: count wrong tokens against the client a
    /// proxy in front names in `X-Forwarded-For`, not the socket's address.
    pub(crate) trust_forwarded_for: bool,
}

/// What a server needs to start: the address, the token (checked against
/// the address), the read-only switch and whom wrong tokens count against.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct HttpServe {
    /// The address to bind.
    pub(crate) listen: SocketAddr,
    /// The token a request must carry; None on loopback without one.
    pub(crate) token: Option<String>,
    /// Why the token is weak, to warn of at start.
    pub(crate) weak_token: Option<WeakToken>,
    /// Hide every action.
    pub(crate) read_only: bool,
    /// Count wrong tokens against the `X-Forwarded-For` client.
    pub(crate) trust_forwarded_for: bool,
}

/// Why a token is weak: guessable, though long enough to start with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Weakness {
    /// Fewer than [`STRONG_TOKEN_LEN`] characters.
    Short {
        /// Its characters.
        len: usize,
    },
    /// Fewer than [`STRONG_TOKEN_DISTINCT`] distinct characters.
    FewDistinct {
        /// Its distinct characters.
        distinct: usize,
    },
    /// One character more than [`STRONG_TOKEN_RUN`] times in a row.
    Run {
        /// The longest run.
        run: usize,
    },
}

impl std::fmt::Display for Weakness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Weakness::Short { len } => {
                write!(f, "it has {len} characters, fewer than {STRONG_TOKEN_LEN}")
            }
            Weakness::FewDistinct { distinct } => write!(
                f,
                "it uses {distinct} distinct characters, fewer than {STRONG_TOKEN_DISTINCT}"
            ),
            Weakness::Run { run } => write!(
                f,
                "it repeats one character {run} times in a row, more than {STRONG_TOKEN_RUN}"
            ),
        }
    }
}

/// Why `token` is weak, if it is: too short, too few distinct characters,
/// or a long run of one (`aaaa...`, `abababab...` and `0000...1` are all
/// guessable, however long).
pub(crate) fn weakness(token: &str) -> Option<Weakness> {
    let chars: Vec<char> = token.chars().collect();
    if chars.len() < STRONG_TOKEN_LEN {
        return Some(Weakness::Short { len: chars.len() });
    }
    let distinct = chars
        .iter()
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    if distinct < STRONG_TOKEN_DISTINCT {
        return Some(Weakness::FewDistinct { distinct });
    }
    let run = chars
        .chunk_by(|a, b| a == b)
        .map(<[char]>::len)
        .max()
        .unwrap_or(0);
    (run > STRONG_TOKEN_RUN).then_some(Weakness::Run { run })
}

/// A weak token and the variable holding it: the warning `run` and
/// `console` give at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WeakToken {
    /// The variable.
    pub(crate) var: String,
    /// Why it is weak.
    pub(crate) why: Weakness,
}

impl std::fmt::Display for WeakToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "WEAK CONSOLE TOKEN: the token in {} is weak ({}), so it can be guessed; the \
             console starts with it in this release, and the next release will refuse it: set \
             {} to a token such as the output of `openssl rand -hex 32`",
            self.var, self.why, self.var
        )
    }
}

impl std::fmt::Debug for HttpServe {
    // The token never reaches a log line or an error message.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpServe")
            .field("listen", &self.listen)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("weak_token", &self.weak_token)
            .field("read_only", &self.read_only)
            .field("trust_forwarded_for", &self.trust_forwarded_for)
            .finish()
    }
}

/// Why the console cannot be served as configured. [`HttpError::field`]
/// names the config key (the command-line flags map to the same keys).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HttpError {
    /// `token_env` (or `--http-token-env`) is no variable's name.
    #[error(
        "{name:?} is not an environment variable name; name the variable that holds the \
         token, such as OUTBOXD_HTTP_TOKEN"
    )]
    TokenEnvName {
        /// The name given.
        name: String,
    },
    /// The token's variable is unset, not UTF-8 or empty.
    #[error(transparent)]
    Token(#[from] SecretEnvError),
    /// The token is shorter than [`MIN_TOKEN_LEN`].
    #[error(
        "the environment variable {var} holds a token of {len} characters; set it to a \
         token of at least {MIN_TOKEN_LEN} (such as the output of `openssl rand -hex 32`)"
    )]
    TokenTooShort {
        /// The variable.
        var: String,
        /// The token's length.
        len: usize,
    },
    /// An address other than loopback without a token.
    #[error(
        "{addr} is not a loopback address, and anyone who can reach it could requeue, \
         discard and replay events; name an environment variable holding a token with \
         --http-token-env VAR (or [http] token_env in the config), or listen on 127.0.0.1"
    )]
    NeedsToken {
        /// The address.
        addr: SocketAddr,
    },
    /// The console and the legacy `[metrics] listen` on one address.
    #[error(
        "{addr} is both the metrics and the console address; the console serves /metrics \
         too, so drop metrics.listen (or --metrics)"
    )]
    SameAsMetrics {
        /// The address.
        addr: SocketAddr,
    },
}

impl HttpError {
    /// The config key the error is about.
    pub(crate) fn field(&self) -> &'static str {
        match self {
            HttpError::TokenEnvName { .. }
            | HttpError::Token(_)
            | HttpError::TokenTooShort { .. } => "http.token_env",
            HttpError::NeedsToken { .. } => "http.listen",
            HttpError::SameAsMetrics { .. } => "metrics.listen",
        }
    }
}

/// What the token's variable should hold, in errors.
fn token_wanted() -> String {
    format!(
        "a token of at least {MIN_TOKEN_LEN} characters (such as the output of \
         `openssl rand -hex 32`)"
    )
}

/// Checks `[http]`. The token is read and checked against the address here
/// too (so `check-config` reports a missing one), and again by
/// [`HttpSettings::serve`] once `--http` may have changed the address.
pub(crate) fn check(c: &Checker<'_>, raw: &RawHttp) -> Result<HttpSettings, ConfigError> {
    let listen = match &raw.listen {
        None => None,
        Some(a) => Some(resolve_listen(a).map_err(|m| c.err("http.listen", m))?),
    };
    let at = |e: HttpError| c.err(e.field(), e.to_string());
    if let Some(name) = &raw.token_env {
        check_token_env_name(name).map_err(at)?;
    }
    let settings = HttpSettings {
        listen,
        token_env: raw.token_env.clone(),
        read_only: raw.read_only.unwrap_or(false),
        trust_forwarded_for: raw.trust_forwarded_for.unwrap_or(false),
    };
    settings.serve_with(None, c.env_lookup()).map_err(at)?;
    Ok(settings)
}

/// Refuses the console and the legacy `[metrics] listen` on one address:
/// the console serves /metrics itself. The one check for `check-config`
/// and `run` (whose flags may give either address).
pub(crate) fn distinct_from_metrics(
    console: SocketAddr,
    metrics: Option<SocketAddr>,
) -> Result<(), HttpError> {
    match metrics {
        // Port 0 asks the system for a free port: two of them differ.
        Some(addr) if addr == console && addr.port() != 0 => Err(HttpError::SameAsMetrics { addr }),
        _ => Ok(()),
    }
}

/// Refuses what cannot be an environment variable's name (`http.token_env`
/// or `--http-token-env`).
pub(crate) fn check_token_env_name(name: &str) -> Result<(), HttpError> {
    if name.is_empty() || name.contains('=') || name.contains('\0') {
        return Err(HttpError::TokenEnvName {
            name: name.to_string(),
        });
    }
    Ok(())
}

impl HttpSettings {
    /// The server to start, with `listen` (from `--http`) winning over the
    /// section's address; None when neither gives one. Refuses an address
    /// other than loopback without a token, and a token variable that is
    /// unset or holds too short a token (read from the process's
    /// environment with [`secret_from_env`](crate::config::secrets::secret_from_env),
    /// like every secret).
    pub(crate) fn serve(&self, listen: Option<SocketAddr>) -> Result<Option<HttpServe>, HttpError> {
        self.serve_with(listen, &process_env)
    }

    /// [`serve`](Self::serve), the token's variable looked up in `env`.
    pub(crate) fn serve_with(
        &self,
        listen: Option<SocketAddr>,
        env: Env<'_>,
    ) -> Result<Option<HttpServe>, HttpError> {
        let Some(addr) = listen.or(self.listen) else {
            return Ok(None);
        };
        let mut weak_token = None;
        let token = match &self.token_env {
            None => None,
            Some(var) => {
                let value = secret_from_env(env, var, &token_wanted())?;
                let token = value.trim();
                if token.len() < MIN_TOKEN_LEN {
                    return Err(HttpError::TokenTooShort {
                        var: var.clone(),
                        len: token.len(),
                    });
                }
                weak_token = weakness(token).map(|why| WeakToken {
                    var: var.clone(),
                    why,
                });
                Some(token.to_string())
            }
        };
        if token.is_none() && !addr.ip().is_loopback() {
            return Err(HttpError::NeedsToken { addr });
        }
        Ok(Some(HttpServe {
            listen: addr,
            token,
            weak_token,
            read_only: self.read_only,
            trust_forwarded_for: self.trust_forwarded_for,
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
        let e = HttpSettings::default()
            .serve(Some("0.0.0.0:1".parse().unwrap()))
            .unwrap_err();
        assert_eq!(e.field(), "http.listen");
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
    fn the_token_is_read_like_every_secret_and_must_be_long() {
        let settings = HttpSettings {
            listen: Some("0.0.0.0:1".parse().unwrap()),
            token_env: Some("TOKEN".into()),
            ..HttpSettings::default()
        };
        let with = |value: &'static str| {
            let env = move |var: &str| match var {
                "TOKEN" => Ok(value.to_string()),
                _ => Err(std::env::VarError::NotPresent),
            };
            settings.serve_with(None, &env)
        };
        let e = with("   ").unwrap_err();
        assert!(
            matches!(e, HttpError::Token(SecretEnvError::Empty { .. })),
            "{e}"
        );
        assert_eq!(e.field(), "http.token_env");
        let e = with(" short ").unwrap_err();
        assert_eq!(
            e,
            HttpError::TokenTooShort {
                var: "TOKEN".into(),
                len: 5
            }
        );
        assert!(!e.to_string().contains("short "), "never the value: {e}");
        let serve = with(" 0123456789abcdef ").unwrap().unwrap();
        assert_eq!(serve.token.as_deref(), Some("0123456789abcdef"));
    }

    #[test]
    fn the_token_never_shows_in_debug_output() {
        let serve = HttpServe {
            listen: "127.0.0.1:1".parse().unwrap(),
            token: Some("very-secret-token-value".into()),
            weak_token: None,
            read_only: true,
            trust_forwarded_for: false,
        };
        let text = format!("{serve:?}");
        assert!(!text.contains("very-secret"), "{text}");
    }

    #[test]
    fn a_token_is_weak_by_length_distinct_characters_or_a_long_run() {
        let weak = [
            ("a".repeat(16), Weakness::Short { len: 16 }),
            (
                "0123456789abcdef0123456789abcde".into(),
                Weakness::Short { len: 31 },
            ),
            ("ab".repeat(32), Weakness::FewDistinct { distinct: 2 }),
            ("012345678".repeat(4), Weakness::FewDistinct { distinct: 9 }),
            (
                format!("0123456789{}abcdef", "x".repeat(16)),
                Weakness::Run { run: 16 },
            ),
            (
                format!("0123456789abcdef{}0123456789abc", "77777"),
                Weakness::Run { run: 5 },
            ),
        ];
        for (token, why) in weak {
            assert_eq!(weakness(&token), Some(why), "{token}");
        }
        // `openssl rand -hex 32` and `openssl rand -base64 32`, and runs of four.
        for strong in [
            "3f9c1e7a5b2d84f06c1a9e3b7d5f2c8a41e6b9d03c7f5a2e8b1d4c6f9a3e7b20",
            "q8ZJ0m3vX+Yt9wQbN2kR7cLhUe5sGfA1dPoVy4iWnTk=",
            "0000111122223333444455556666777788889999",
        ] {
            assert_eq!(weakness(strong), None, "{strong}");
        }
        // Characters, not bytes: é is one.
        assert_eq!(weakness(&"é".repeat(5)), Some(Weakness::Short { len: 5 }));
    }

    #[test]
    fn a_weak_token_starts_with_a_warning_naming_its_variable_never_its_value() {
        let settings = HttpSettings {
            listen: Some("0.0.0.0:1".parse().unwrap()),
            token_env: Some("TOKEN".into()),
            ..HttpSettings::default()
        };
        let env = |var: &str| match var {
            "TOKEN" => Ok("aaaaaaaaaaaaaaaa".to_string()),
            _ => Err(std::env::VarError::NotPresent),
        };
        let serve = settings.serve_with(None, &env).unwrap().unwrap();
        let weak = serve.weak_token.unwrap();
        let text = weak.to_string();
        assert!(text.contains("the token in TOKEN is weak"), "{text}");
        assert!(
            text.contains("it has 16 characters, fewer than 32"),
            "{text}"
        );
        assert!(text.contains("the next release will refuse it"), "{text}");
        assert!(!text.contains("aaaa"), "{text}");
    }

    #[test]
    fn trust_forwarded_for_is_read_and_off_by_default() {
        let text =
            format!("{STDOUT}[http]\nlisten = \"127.0.0.1:1\"\ntrust_forwarded_for = true\n");
        let settings = parse(&text).unwrap().http;
        assert!(settings.trust_forwarded_for);
        assert!(settings.serve(None).unwrap().unwrap().trust_forwarded_for);
        assert!(!http("127.0.0.1:1", None).unwrap().trust_forwarded_for);
        let e = parse(&format!("{STDOUT}[http]\ntrust_forwarded_for = \"yes\"\n")).unwrap_err();
        assert!(e.to_string().contains("trust_forwarded_for"), "{e}");
    }
}
