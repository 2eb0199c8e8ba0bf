//! Logging in and out, and what a request without a session gets.

use std::time::{Duration, Instant};

use super::{page, refused, Visit};
use crate::console::auth::Refusal;
use crate::console::pages::{self, Nav};
use crate::console::server::{Method, Request, Response};

/// A request without a valid token or session: the login page for a page,
/// a 401 asking for the token otherwise.
pub(super) fn unauthenticated(app: &Visit, req: &Request) -> Response {
    let is_page =
        req.method == Method::Get && !matches!(req.path.as_str(), "/metrics" | "/healthz");
    if is_page {
        login_page(app, 401, None)
    } else {
        Response::text(
            401,
            "a token is required: Authorization: Bearer <token>, or log in at /login\n",
        )
        .with_header("WWW-Authenticate", "Bearer realm=\"outboxd\"".into())
    }
}

/// 429 for a peer locked out after wrong tokens, with when to try again.
pub(super) fn throttled(wait: Duration) -> Response {
    let secs = wait.as_secs().max(1);
    Response::text(
        429,
        format!(
            "too many wrong tokens from this address; token attempts are refused for {secs} s \
             more (the right token too)\n"
        ),
    )
    .with_header("Retry-After", secs.to_string())
}

/// `/login`, with why the last try failed (a console without a token has
/// nothing to log in to).
pub(super) fn login_page(app: &Visit, status: u16, error: Option<&str>) -> Response {
    if !app.auth.needs_token() {
        return Response::see_other("/");
    }
    page(app, status, "Log in", Nav::None, pages::login(error))
}

pub(super) fn login(app: &Visit, req: &Request) -> Response {
    // No session yet, so no CSRF token: the origin check holds.
    if let Err(refusal) = app.auth.check_origin(req) {
        return refused(app, refusal);
    }
    let form = req.form();
    let behind_tls = req.header("x-forwarded-proto") == Some("https");
    let given = form.get("token").unwrap_or("");
    match app.auth.login(req, given, behind_tls, Instant::now()) {
        Ok(cookie) => Response::see_other("/").with_header("Set-Cookie", cookie),
        Err(Refusal::Throttled(wait)) => {
            let secs = wait.as_secs().max(1);
            let why = format!(
                "Too many wrong tokens from this address: logging in is refused for {secs} s \
                 more, whatever the token."
            );
            login_page(app, 429, Some(&why)).with_header("Retry-After", secs.to_string())
        }
        Err(_) => login_page(app, 401, Some("That is not the token.")),
    }
}

/// Ends the session (its cookie opens nothing from now on) and clears the
/// browser's cookie.
pub(super) fn logout(app: &Visit, req: &Request) -> Response {
    let form = req.form();
    if let Err(refusal) = app.auth.check_post(req, &form, &app.access) {
        return refused(app, refusal);
    }
    Response::see_other("/login").with_header("Set-Cookie", app.auth.logout(&app.access))
}
