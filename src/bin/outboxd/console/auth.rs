//! Who may use the console, and which POSTs are the operator's own.
//!
//! - **Token.** On an address other than loopback a token is required
//!   (`[http] token_env`). It is given once on the login page, which sets an
//!   HttpOnly, SameSite=Strict session cookie that lasts
//!   [`SESSION_LIFETIME`], or with every request as
//!   `Authorization: Bearer <token>` (Prometheus, scripts). The cookie holds
//!   its issue time and an HMAC (keyed with the token) of it, never the token
//!   itself: an older cookie is refused, whatever the browser kept. Every
//!   comparison is constant-time.
//! - **Banners.** The message an action shows after its redirect ("Requeued
//!   5 dead letters") travels in the URL sealed with a key of this process
//!   ([`Auth::seal_notice`]): a link someone else made cannot put words in
//!   the console's mouth.
//! - **Host.** On loopback, a request must name a loopback host: a page
//!   from another site whose name resolves to 127.0.0.1 (DNS rebinding)
//!   cannot read the console.
//! - **CSRF.** Every state change is a POST that carries the console's CSRF
//!   token (random per process, written into each form) and comes from the
//!   console's own origin: the `Origin` (else `Referer`) names the `Host`, or
//!   the `X-Forwarded-Host` of a reverse proxy in front (either scheme).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hmac::Mac;
use outboxd::Timestamp;
use subtle::ConstantTimeEq;

use super::form::Params;
use super::server::Request;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "outboxd_session";

/// The form field carrying the CSRF token.
pub(crate) const CSRF_FIELD: &str = "csrf";

/// How long a login lasts: the cookie's Max-Age, and the oldest issue time
/// a cookie may carry.
pub(crate) const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// How long a banner's sealed value is shown: long enough to follow the
/// redirect (and reload), not to be passed around.
pub(crate) const NOTICE_LIFETIME: Duration = Duration::from_secs(10 * 60);

/// How far ahead of this clock an issue time may be (clocks of one machine
/// agree; this only forgives a step of the wall clock).
const FUTURE_SKEW: Duration = Duration::from_secs(60);

/// The console's access rules.
pub(crate) struct Auth {
    token: Option<Token>,
    csrf: String,
    /// Seals the banners' values (random per process).
    notice_key: [u8; 32],
    loopback: bool,
    /// The address bound, named in the refusal of a foreign Host.
    bound: SocketAddr,
}

struct Token {
    secret: String,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No valid token or session (401).
    Unauthenticated,
    /// A bad Host, Origin or CSRF token (403), with the reason.
    Forbidden(String),
}

impl Auth {
    /// The rules for a server bound to `bind`, with the token (if any).
    pub(crate) fn new(token: Option<String>, bind: SocketAddr) -> Auth {
        Auth {
            token: token.map(|secret| Token { secret }),
            csrf: hex(&rand::random::<[u8; 32]>()),
            notice_key: rand::random::<[u8; 32]>(),
            loopback: bind.ip().is_loopback(),
            bound: bind,
        }
    }

    /// The CSRF token to write into forms.
    pub(crate) fn csrf(&self) -> &str {
        &self.csrf
    }

    /// True when requests need a token (a login is offered).
    pub(crate) fn needs_token(&self) -> bool {
        self.token.is_some()
    }

    /// Checks the Host (loopback only) and the token or a session cookie
    /// issued at most [`SESSION_LIFETIME`] before `now`.
    pub(crate) fn admit(&self, req: &Request, now: Timestamp) -> Result<(), Refusal> {
        if self.loopback {
            let host = req.header("host").unwrap_or("");
            if !is_loopback_host(host) {
                return Err(Refusal::Forbidden(format!(
                    "the Host header names {host:?}, not this machine; open the console at \
                     http://{}/ (other names are refused against DNS rebinding)",
                    self.bound
                )));
            }
        }
        let Some(token) = &self.token else {
            return Ok(());
        };
        // The scheme is case-insensitive (RFC 7235): "bearer" is "Bearer".
        let bearer = req
            .header("authorization")
            .and_then(|v| v.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .is_some_and(|(_, given)| eq(given.trim(), &token.secret));
        let cookie = req
            .header("cookie")
            .and_then(|c| cookie_value(c, COOKIE))
            .and_then(|given| {
                unseal(
                    token.secret.as_bytes(),
                    "session",
                    given,
                    now,
                    SESSION_LIFETIME,
                )
            })
            .is_some();
        if bearer || cookie {
            Ok(())
        } else {
            Err(Refusal::Unauthenticated)
        }
    }

    /// Checks that a POST comes from the console's own pages: the same
    /// origin, and the CSRF token in the form.
    pub(crate) fn check_post(&self, req: &Request, form: &Params) -> Result<(), Refusal> {
        // The console's own authority: the Host, or the one a reverse proxy
        // in front of it was asked for (a page on another site can set
        // neither on a form it makes the browser send).
        let ours: Vec<&str> = [req.header("host"), req.header("x-forwarded-host")]
            .into_iter()
            .flatten()
            .filter(|h| !h.is_empty())
            .collect();
        let authority = |url: &str| -> Option<String> {
            let rest = url
                .strip_prefix("http://")
                .or_else(|| url.strip_prefix("https://"))?;
            Some(rest.split('/').next().unwrap_or("").to_string())
        };
        let sender = match (req.header("origin"), req.header("referer")) {
            (Some(origin), _) => authority(origin),
            (None, Some(referer)) => authority(referer),
            (None, None) => None,
        };
        let same_origin = sender.is_some_and(|s| ours.iter().any(|h| *h == s));
        if !same_origin {
            return Err(Refusal::Forbidden(
                "this form was not sent from the console's own pages (Origin check); \
                 nothing was changed"
                    .into(),
            ));
        }
        match form.get(CSRF_FIELD) {
            Some(given) if eq(given, &self.csrf) => Ok(()),
            _ => Err(Refusal::Forbidden(
                "the form's CSRF token is missing or out of date (outboxd restarted?); \
                 reload the page and try again; nothing was changed"
                    .into(),
            )),
        }
    }

    /// The Set-Cookie value logging in with `given` at `now`, or None when
    /// it is not the token. `secure` (a TLS proxy in front) adds `Secure`.
    pub(crate) fn login(&self, given: &str, secure: bool, now: Timestamp) -> Option<String> {
        let token = self.token.as_ref()?;
        eq(given.trim(), &token.secret).then(|| {
            format!(
                "{COOKIE}={}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict{}",
                seal(token.secret.as_bytes(), "session", now, ""),
                SESSION_LIFETIME.as_secs(),
                if secure { "; Secure" } else { "" }
            )
        })
    }

    /// `notice` (what an action did, in the server's own terms) sealed at
    /// `now`, for the URL an action redirects to.
    pub(crate) fn seal_notice(&self, notice: &str, now: Timestamp) -> String {
        seal(&self.notice_key, "notice", now, notice)
    }

    /// The notice a [`seal_notice`](Self::seal_notice) value carries, if
    /// this process sealed it at most [`NOTICE_LIFETIME`] before `now`.
    pub(crate) fn open_notice<'a>(&self, value: &'a str, now: Timestamp) -> Option<&'a str> {
        unseal(&self.notice_key, "notice", value, now, NOTICE_LIFETIME)
    }

    /// The Set-Cookie value that logs out.
    pub(crate) fn logout(&self) -> String {
        format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
    }
}

/// Constant-time equality (the length is not secret).
fn eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// `payload` with its issue time, signed: `{unix seconds}.{payload}.{mac}`
/// (`{unix seconds}.{mac}` when `payload` is empty), the mac an HMAC-SHA256
/// keyed with `key` over `purpose`, the time and the payload, in hex.
fn seal(key: &[u8], purpose: &str, issued: Timestamp, payload: &str) -> String {
    let secs = issued.as_millis().div_euclid(1000);
    let mac = hex(&hmac(key, sealed_text(purpose, secs, payload).as_bytes()));
    if payload.is_empty() {
        format!("{secs}.{mac}")
    } else {
        format!("{secs}.{payload}.{mac}")
    }
}

/// The payload of a [`seal`] value when its mac is right for `key` and
/// `purpose`, and it was issued no more than `lifetime` before `now` (nor
/// more than a minute after).
fn unseal<'a>(
    key: &[u8],
    purpose: &str,
    value: &'a str,
    now: Timestamp,
    lifetime: Duration,
) -> Option<&'a str> {
    let (secs, rest) = value.split_once('.')?;
    let (payload, mac) = rest.rsplit_once('.').unwrap_or(("", rest));
    let secs: i64 = secs.parse().ok()?;
    let want = hex(&hmac(key, sealed_text(purpose, secs, payload).as_bytes()));
    if !eq(mac, &want) {
        return None;
    }
    let issued = Timestamp::from_millis(secs.checked_mul(1000)?);
    let fresh = issued <= now.plus(FUTURE_SKEW) && now.since(issued) <= lifetime;
    fresh.then_some(payload)
}

/// What a [`seal`] mac covers; the purpose keeps a value sealed for one use
/// from passing for another.
fn sealed_text(purpose: &str, secs: i64, payload: &str) -> String {
    format!("outboxd console {purpose} v2\n{secs}\n{payload}")
}

fn hmac(key: &[u8], msg: &[u8]) -> Vec<u8> {
    let mut mac = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(key)
        .expect("HMAC accepts keys of any length");
    mac.update(msg);
    mac.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn cookie_value<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header
        .split(';')
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// `localhost`, `127.x.y.z` or `[::1]`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::server::Method;

    const TOKEN: &str = "0123456789abcdef-token";
    const NOW: Timestamp = Timestamp::from_millis(1_764_500_000_000);

    fn req(headers: &[(&str, &str)]) -> Request {
        let mut r = Request::new(Method::Get, "/");
        r.headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        r
    }

    #[test]
    fn loopback_without_a_token_admits_loopback_hosts_only() {
        let auth = Auth::new(None, "127.0.0.1:9464".parse().unwrap());
        for host in [
            "127.0.0.1:9464",
            "localhost:9464",
            "[::1]:9464",
            "localhost",
        ] {
            assert_eq!(auth.admit(&req(&[("host", host)]), NOW), Ok(()), "{host}");
        }
        for host in ["evil.example:9464", "", "127.0.0.1.evil.example"] {
            assert!(matches!(
                auth.admit(&req(&[("host", host)]), NOW),
                Err(Refusal::Forbidden(_))
            ));
        }
    }

    #[test]
    fn a_token_is_taken_as_bearer_or_session_cookie() {
        let auth = Auth::new(Some(TOKEN.into()), "0.0.0.0:9464".parse().unwrap());
        let host = ("host", "10.1.2.3:9464");
        let admit = |headers: &[(&str, &str)]| auth.admit(&req(headers), NOW);
        assert_eq!(admit(&[host]), Err(Refusal::Unauthenticated));
        let bearer = format!("Bearer {TOKEN}");
        assert_eq!(admit(&[host, ("authorization", &bearer)]), Ok(()));
        assert_eq!(
            admit(&[host, ("authorization", "Bearer wrong")]),
            Err(Refusal::Unauthenticated)
        );
        assert!(auth.login("wrong", false, NOW).is_none());
        assert!(auth.login(TOKEN, true, NOW).unwrap().ends_with("; Secure"));
        let set = auth.login(TOKEN, false, NOW).unwrap();
        assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict"));
        assert!(!set.contains(TOKEN), "the cookie does not carry the token");
        let value = set.split(';').next().unwrap();
        assert_eq!(admit(&[host, ("cookie", &format!("a=b; {value}"))]), Ok(()));
        for forged in [
            "outboxd_session=00",
            "outboxd_session=",
            "outboxd_session=1.2.3",
        ] {
            assert_eq!(
                admit(&[host, ("cookie", forged)]),
                Err(Refusal::Unauthenticated),
                "{forged}"
            );
        }
    }

    #[test]
    fn a_session_cookie_expires_after_its_lifetime() {
        let auth = Auth::new(Some(TOKEN.into()), "0.0.0.0:9464".parse().unwrap());
        let set = auth.login(TOKEN, false, NOW).unwrap();
        assert!(
            set.contains(&format!("; Max-Age={}", SESSION_LIFETIME.as_secs())),
            "{set}"
        );
        let cookie = set.split(';').next().unwrap().to_string();
        let at = |t: Timestamp| auth.admit(&req(&[("host", "h"), ("cookie", &cookie)]), t);
        let second = Duration::from_secs(1);
        assert_eq!(at(NOW.plus(SESSION_LIFETIME)), Ok(()));
        assert_eq!(
            at(NOW.plus(SESSION_LIFETIME + second)),
            Err(Refusal::Unauthenticated),
            "a cookie older than its lifetime is refused, whatever the browser kept"
        );
        assert_eq!(
            at(NOW.minus(FUTURE_SKEW + second)),
            Err(Refusal::Unauthenticated),
            "issued in the future"
        );
        // The issue time is under the mac: moving it forward breaks it.
        let value = cookie.strip_prefix("outboxd_session=").unwrap();
        let (secs, mac) = value.split_once('.').unwrap();
        let later: i64 = secs.parse::<i64>().unwrap() + SESSION_LIFETIME.as_secs() as i64;
        let moved = format!("outboxd_session={later}.{mac}");
        let later_now = NOW.plus(SESSION_LIFETIME + second);
        assert_eq!(
            auth.admit(&req(&[("host", "h"), ("cookie", &moved)]), later_now),
            Err(Refusal::Unauthenticated)
        );
        // Another token's console does not take it.
        let other = Auth::new(
            Some("another-token-0123456".into()),
            "0.0.0.0:1".parse().unwrap(),
        );
        assert_eq!(
            other.admit(&req(&[("host", "h"), ("cookie", &cookie)]), NOW),
            Err(Refusal::Unauthenticated)
        );
    }

    #[test]
    fn only_notices_this_process_sealed_are_opened() {
        let auth = Auth::new(None, "127.0.0.1:9464".parse().unwrap());
        let sealed = auth.seal_notice("replayed:5:search.index", NOW);
        assert_eq!(
            auth.open_notice(&sealed, NOW),
            Some("replayed:5:search.index")
        );
        assert_eq!(
            auth.open_notice(&sealed, NOW.plus(NOTICE_LIFETIME + Duration::from_secs(1))),
            None
        );
        let other = Auth::new(None, "127.0.0.1:9464".parse().unwrap());
        assert_eq!(other.open_notice(&sealed, NOW), None, "another key");
        let (head, mac) = sealed.rsplit_once('.').unwrap();
        let forged = format!("{}.{mac}", head.replace(":5:", ":500:"));
        assert_eq!(auth.open_notice(&forged, NOW), None);
        for junk in ["", "requeued+5", "1.2", "x.y.z"] {
            assert_eq!(auth.open_notice(junk, NOW), None, "{junk}");
        }
        // A session cookie is no notice, even under the same key.
        let key = [7u8; 32];
        let cookie = seal(&key, "session", NOW, "");
        assert_eq!(unseal(&key, "notice", &cookie, NOW, NOTICE_LIFETIME), None);
    }

    #[test]
    fn a_post_needs_the_same_origin_and_the_csrf_token() {
        let auth = Auth::new(None, "127.0.0.1:9464".parse().unwrap());
        let good = Params(vec![(CSRF_FIELD.into(), auth.csrf().into())]);
        let host = ("host", "127.0.0.1:9464");
        let origin = ("origin", "http://127.0.0.1:9464");
        assert_eq!(auth.check_post(&req(&[host, origin]), &good), Ok(()));
        let referer = ("referer", "http://127.0.0.1:9464/dead");
        assert_eq!(auth.check_post(&req(&[host, referer]), &good), Ok(()));
        for headers in [
            vec![host],
            vec![host, ("origin", "http://evil.example")],
            vec![host, ("origin", "null")],
            vec![host, ("referer", "http://127.0.0.1:9464.evil/")],
        ] {
            assert!(
                auth.check_post(&req(&headers), &good).is_err(),
                "{headers:?}"
            );
        }
        // Behind a TLS proxy that passes its own name.
        let proxied = [
            ("host", "127.0.0.1:9464"),
            ("x-forwarded-host", "console.example.com"),
            ("origin", "https://console.example.com"),
        ];
        assert_eq!(auth.check_post(&req(&proxied), &good), Ok(()));
        let stale = Params(vec![(CSRF_FIELD.into(), "0".repeat(64))]);
        assert!(auth.check_post(&req(&[host, origin]), &stale).is_err());
        assert!(auth
            .check_post(&req(&[host, origin]), &Params::default())
            .is_err());
    }
}
