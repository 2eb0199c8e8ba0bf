//! The console's synchronous request and response, and how a response
//! becomes hyper's with the security headers every answer carries.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::Full;

use crate::console::form::Params;

/// The request methods the console answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Method {
    /// GET, and HEAD (answered as GET without the body).
    Get,
    /// POST.
    Post,
    /// Anything else.
    Other,
}

/// One request, read whole.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    /// The address the request came from (the socket's; a proxy's own
    /// address when one is in front).
    pub(crate) peer: SocketAddr,
    /// The method.
    pub(crate) method: Method,
    /// The path, percent-decoded, without the query.
    pub(crate) path: String,
    /// The query string (undecoded), without `?`.
    pub(crate) query: String,
    /// Headers, names in lower case.
    pub(crate) headers: Vec<(String, String)>,
    /// The body (at most [`HttpBounds::max_body`]).
    pub(crate) body: Vec<u8>,
}

impl Request {
    /// A test request.
    #[cfg(test)]
    pub(crate) fn new(method: Method, target: &str) -> Request {
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        Request {
            peer: ([127, 0, 0, 1], 40000).into(),
            method,
            path: crate::console::form::decode_path(path),
            query: query.to_string(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// The first value of a header (name in any case).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The query string's pairs, decoded.
    pub(crate) fn query_pairs(&self) -> Params {
        Params::parse(self.query.as_bytes())
    }

    /// The url-encoded form in the body, decoded.
    pub(crate) fn form(&self) -> Params {
        Params::parse(&self.body)
    }
}

/// One answer.
#[derive(Debug, Clone)]
pub(crate) struct Response {
    /// The status code.
    pub(crate) status: u16,
    /// The Content-Type.
    pub(crate) content_type: &'static str,
    /// Extra headers.
    pub(crate) headers: Vec<(&'static str, String)>,
    /// The body.
    pub(crate) body: Vec<u8>,
}

impl Response {
    /// An HTML page.
    pub(crate) fn html(status: u16, body: String) -> Response {
        Response {
            status,
            content_type: "text/html; charset=utf-8",
            headers: Vec::new(),
            body: body.into_bytes(),
        }
    }

    /// Plain text.
    pub(crate) fn text(status: u16, body: impl Into<String>) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            headers: Vec::new(),
            body: body.into().into_bytes(),
        }
    }

    /// A JSON document.
    pub(crate) fn json(status: u16, value: &serde_json::Value) -> Response {
        Response {
            status,
            content_type: "application/json",
            headers: Vec::new(),
            body: value.to_string().into_bytes(),
        }
    }

    /// A redirect after a POST (303: the browser follows with a GET).
    pub(crate) fn see_other(location: &str) -> Response {
        Response::text(303, "").with_header("Location", location.to_string())
    }

    /// Adds a header.
    pub(crate) fn with_header(mut self, name: &'static str, value: String) -> Response {
        self.headers.push((name, value));
        self
    }
}

/// The Content-Security-Policy of every response: no script at all, styles
/// only from the console's own stylesheet, forms only to the console, and
/// no framing. Even an injected `<script>` that escaped the templates could
/// not run.
pub(crate) const CSP: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
                       form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// hyper's response with the security headers every answer carries (hyper
/// sets its Content-Length, leaves the body out for HEAD and closes the
/// connection after a `Connection: close`).
pub(super) fn to_hyper(r: Response, keep_alive: bool) -> hyper::Response<Full<Bytes>> {
    let mut out = hyper::Response::new(Full::new(Bytes::from(r.body)));
    *out.status_mut() =
        hyper::StatusCode::from_u16(r.status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
    let headers = out.headers_mut();
    let fixed = [
        ("content-type", r.content_type),
        ("content-security-policy", CSP),
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "same-origin"),
        ("cache-control", "no-store"),
    ];
    for (name, value) in fixed {
        headers.insert(name, hyper::header::HeaderValue::from_static(value));
    }
    for (name, value) in r.headers {
        // Values are the console's own; a line break would end the header.
        let value: String = value.chars().filter(|c| !c.is_control()).collect();
        if let Ok(value) = hyper::header::HeaderValue::from_str(&value) {
            headers.append(name, value);
        }
    }
    if !keep_alive {
        headers.insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
    }
    out
}
