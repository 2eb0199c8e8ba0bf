//! Who may use the console, and which POSTs are the operator's own.
//!
//! - **Token.** On an address other than loopback a token is required
//!   (`[http] token_env`). It is given once on the login page, which opens
//!   a session (`sessions`: a random id in an HttpOnly, SameSite=Strict
//!   cookie that lasts [`SESSION_LIFETIME`], kept in memory, ended by
//!   logging out or a restart), or with every request as
//!   `Authorization: Bearer <token>` (Prometheus, scripts). Every comparison
//!   is constant-time.
//! - **Wrong tokens** (at the login, or as a bearer) are logged naming the
//!   peer and throttled per peer (`throttle`): after a few, that peer's
//!   token attempts are refused (429) for a while, the right token too. A
//!   session already open goes on. The peer is the socket's address, or,
//!   with `[http] trust_forwarded_for = true` (behind a proxy that sets it),
//!   the last address of `X-Forwarded-For`, the one the proxy saw.
//! - **Banners.** The message an action shows after its redirect ("Requeued
//!   5 dead letters") travels in the URL sealed with a key of this process
//!   ([`Auth::seal_notice`]): a link someone else made cannot put words in
//!   the console's mouth.
//! - **Host.** On loopback, a request must name a loopback host: a page
//!   from another site whose name resolves to 127.0.0.1 (DNS rebinding)
//!   cannot read the console.
//! - **CSRF.** Every state change is a POST that comes from the console's
//!   own origin (the `Origin`, else `Referer`, names the `Host`, or the
//!   `X-Forwarded-Host` of a reverse proxy in front, either scheme) and
//!   carries the CSRF token of its session, written into its forms. The
//!   login form carries none (there is no session yet; the origin check
//!   holds), a bearer request needs none (no browser sends the header on
//!   its own), and a console without a token, which has no sessions and
//!   lets whoever reaches it act, has one token for the process.

mod seal;
mod sessions;
mod throttle;

pub(crate) use sessions::{Session, SESSION_LIFETIME};

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outboxd::Timestamp;
use subtle::ConstantTimeEq;

use super::form::Params;
use super::server::Request;
use seal::{hex, seal, unseal};
use sessions::Sessions;
use throttle::{Peer, Throttle};

/// The session cookie's name.
pub(crate) const COOKIE: &str = "outboxd_session";

/// The form field carrying the CSRF token.
pub(crate) const CSRF_FIELD: &str = "csrf";

/// How long a banner's sealed value is shown: long enough to follow the
/// redirect (and reload), not to be passed around.
pub(crate) const NOTICE_LIFETIME: Duration = Duration::from_secs(10 * 60);

/// The console's access rules.
pub(crate) struct Auth {
    token: Option<String>,
    /// The CSRF token of a console without a token (no sessions there).
    open_csrf: String,
    /// Seals the banners' values (random per process).
    notice_key: [u8; 32],
    loopback: bool,
    /// The address bound, named in the refusal of a foreign Host.
    bound: SocketAddr,
    /// Count wrong tokens against the `X-Forwarded-For` client.
    trust_forwarded_for: bool,
    sessions: Sessions,
    throttle: Throttle,
}

/// Who is asking, once admitted.
#[derive(Debug, Clone)]
pub(crate) enum Access {
    /// Anyone: the console has no token.
    Anyone,
    /// A request carrying the token.
    Bearer,
    /// A logged-in browser.
    Session(Arc<Session>),
    /// Not logged in: only the login page and the stylesheet.
    Visitor,
}

impl Access {
    /// True for a logged-in browser (offered to log out).
    pub(crate) fn logged_in(&self) -> bool {
        matches!(self, Access::Session(_))
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No valid token or session (401).
    Unauthenticated,
    /// A bad Host, Origin or CSRF token (403), with the reason.
    Forbidden(String),
    /// Too many wrong tokens from this peer (429): try again after this.
    Throttled(Duration),
}

impl Auth {
    /// The rules for a server bound to `bind`, with the token (if any).
    pub(crate) fn new(token: Option<String>, bind: SocketAddr, trust_forwarded_for: bool) -> Auth {
        Auth {
            token,
            open_csrf: hex(&rand::random::<[u8; 32]>()),
            notice_key: rand::random::<[u8; 32]>(),
            loopback: bind.ip().is_loopback(),
            bound: bind,
            trust_forwarded_for,
            sessions: Sessions::default(),
            throttle: Throttle::default(),
        }
    }

    /// The CSRF token to write into the forms of a page for `access`.
    pub(crate) fn csrf<'a>(&'a self, access: &'a Access) -> &'a str {
        match access {
            Access::Anyone => &self.open_csrf,
            Access::Session(s) => &s.csrf,
            Access::Bearer | Access::Visitor => "",
        }
    }

    /// True when requests need a token (a login is offered).
    pub(crate) fn needs_token(&self) -> bool {
        self.token.is_some()
    }

    /// Checks the Host (loopback only), then the bearer token (throttled
    /// per peer) or the session cookie.
    pub(crate) fn admit(&self, req: &Request, now: Instant) -> Result<Access, Refusal> {
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
            return Ok(Access::Anyone);
        };
        // The scheme is case-insensitive (RFC 7235): "bearer" is "Bearer".
        let bearer = req
            .header("authorization")
            .and_then(|v| v.trim().split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"));
        if let Some((_, given)) = bearer {
            return self
                .try_token(req, token, given, now)
                .map(|()| Access::Bearer);
        }
        req.header("cookie")
            .and_then(|c| cookie_value(c, COOKIE))
            .and_then(|id| self.sessions.find(id, now))
            .map(Access::Session)
            .ok_or(Refusal::Unauthenticated)
    }

    /// Checks that a POST comes from the console's own pages: the same
    /// origin, and the CSRF token of `access` in the form.
    pub(crate) fn check_post(
        &self,
        req: &Request,
        form: &Params,
        access: &Access,
    ) -> Result<(), Refusal> {
        self.check_origin(req)?;
        let want = match access {
            Access::Bearer => return Ok(()),
            Access::Visitor => return Err(Refusal::Unauthenticated),
            Access::Anyone | Access::Session(_) => self.csrf(access),
        };
        match form.get(CSRF_FIELD) {
            Some(given) if eq(given, want) => Ok(()),
            _ => Err(Refusal::Forbidden(
                "the form's CSRF token is missing or not this session's (logged out, or \
                 outboxd restarted?); reload the page and try again; nothing was changed"
                    .into(),
            )),
        }
    }

    /// Checks that a form was sent from the console's own pages: the
    /// `Origin` (else `Referer`) names the console's authority.
    pub(crate) fn check_origin(&self, req: &Request) -> Result<(), Refusal> {
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
        if sender.is_some_and(|s| ours.iter().any(|h| *h == s)) {
            Ok(())
        } else {
            Err(Refusal::Forbidden(
                "this form was not sent from the console's own pages (Origin check); \
                 nothing was changed"
                    .into(),
            ))
        }
    }

    /// Logs in with `given`: the Set-Cookie value of a new session, or why
    /// not (a wrong token, counted against the peer; a peer locked out).
    /// `secure` (a TLS proxy in front) adds `Secure`.
    pub(crate) fn login(
        &self,
        req: &Request,
        given: &str,
        secure: bool,
        now: Instant,
    ) -> Result<String, Refusal> {
        let token = self.token.as_ref().ok_or(Refusal::Unauthenticated)?;
        self.try_token(req, token, given, now)?;
        let (id, _) = self.sessions.start(now);
        tracing::info!(peer = %self.peer(req), "console: logged in");
        Ok(format!(
            "{COOKIE}={id}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict{}",
            SESSION_LIFETIME.as_secs(),
            if secure { "; Secure" } else { "" }
        ))
    }

    /// Ends the session of `access` (if any); the Set-Cookie value that
    /// clears the browser's cookie too.
    pub(crate) fn logout(&self, access: &Access) -> String {
        if let Access::Session(session) = access {
            self.sessions.end(session);
        }
        format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
    }

    /// `given` against the token, unless the peer is locked out; a wrong
    /// one is counted and logged, naming the peer.
    fn try_token(
        &self,
        req: &Request,
        token: &str,
        given: &str,
        now: Instant,
    ) -> Result<(), Refusal> {
        let peer = self.peer(req);
        if let Err(locked) = self.throttle.check(peer, now) {
            if locked.first {
                tracing::warn!(
                    %peer,
                    socket = %req.peer,
                    retry_after_s = locked.retry_after.as_secs(),
                    "console: token attempts from {peer} are refused for {} s more, after {} \
                     wrong tokens in a row",
                    locked.retry_after.as_secs(),
                    locked.failures,
                );
            }
            return Err(Refusal::Throttled(locked.retry_after));
        }
        if eq(given.trim(), token) {
            self.throttle.succeeded(peer);
            return Ok(());
        }
        let failed = self.throttle.failed(peer, now);
        let path = req.path.as_str();
        match failed.lockout {
            None => tracing::warn!(
                %peer,
                socket = %req.peer,
                failures = failed.failures,
                path,
                "console: a wrong token from {peer} ({} in a row)",
                failed.failures
            ),
            Some(lockout) => tracing::warn!(
                %peer,
                socket = %req.peer,
                failures = failed.failures,
                path,
                lockout_s = lockout.as_secs(),
                "console: a wrong token from {peer} ({} in a row); its token attempts are \
                 refused for {} s",
                failed.failures,
                lockout.as_secs()
            ),
        }
        Err(Refusal::Unauthenticated)
    }

    /// Who wrong tokens are counted against: the socket's address, or the
    /// client the proxy in front names when it is trusted to.
    fn peer(&self, req: &Request) -> Peer {
        let forwarded = self
            .trust_forwarded_for
            .then(|| forwarded_client(req))
            .flatten();
        Peer::of(forwarded.unwrap_or(req.peer.ip()))
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
}

/// The address the proxy in front added to `X-Forwarded-For`: the last of
/// the last such header (those before it are the client's own word).
fn forwarded_client(req: &Request) -> Option<IpAddr> {
    let (_, value) = req
        .headers
        .iter()
        .rev()
        .find(|(n, _)| n.eq_ignore_ascii_case("x-forwarded-for"))?;
    let last = value.rsplit(',').next()?.trim();
    last.parse::<IpAddr>()
        .ok()
        .or_else(|| last.parse::<SocketAddr>().ok().map(|a| a.ip()))
        .or_else(|| last.strip_prefix('[')?.strip_suffix(']')?.parse().ok())
}

/// Constant-time equality (the length is not secret).
fn eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
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
mod tests;
