//! check-config's look at the receiver: the host looked up, a TCP
//! connection, and for `https` a TLS handshake with the roots the
//! deliveries trust; never a request, so the receiver sees no event.
//!
//! What no retry can fix is an error (a host name that does not exist, a
//! certificate that is not trusted or not for the host, a port that does
//! not speak TLS); a receiver that is down or a resolver that does not
//! answer is an outage, reported as [`ReceiverCheck::Unreachable`].

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use ureq::http::Uri;

use super::address::is_non_public;
use super::{WebhookError, WebhookSink};
use crate::sinks::reach::{self, Lookup, TlsMismatch};

/// What a look at the receiver found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReceiverCheck {
    /// Connected, and for `https` the handshake completed: what was reached.
    Reached(String),
    /// Not reached now, which a retry may fix (refused, timed out, the
    /// resolver did not answer): why.
    Unreachable(String),
}

impl WebhookSink {
    /// Looks the receiver up, connects within the connect timeout, and for
    /// `https` completes a TLS handshake, then closes: no request is sent.
    /// An error is a configuration the deliveries could never get past.
    pub fn probe(&self) -> Result<ReceiverCheck, WebhookError> {
        let url = self.shown_url.clone();
        let uri: Uri = match self.url.parse() {
            Ok(u) => u,
            // The builder parsed it.
            Err(e) => return Ok(ReceiverCheck::Unreachable(format!("{url}: {e}"))),
        };
        let https = uri.scheme_str() == Some("https");
        let host = uri.host().unwrap_or_default().to_string();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let addrs = match reach::lookup(&host, port) {
            Lookup::Found(a) => a,
            Lookup::NoSuchHost(reason) => {
                return Err(WebhookError::NoSuchHost { url, host, reason })
            }
            Lookup::Failed(why) => {
                return Ok(ReceiverCheck::Unreachable(format!(
                    "cannot look up {host}: {why}"
                )))
            }
        };
        let addrs: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|a| !(self.deny_private && is_non_public(a.ip())))
            .collect();
        if addrs.is_empty() {
            return Err(WebhookError::PrivateAddress { url, host });
        }
        let mut last = String::new();
        let sock = addrs.iter().find_map(|a| {
            TcpStream::connect_timeout(a, self.connect_timeout)
                .map_err(|e| last = format!("cannot connect to {a}: {e}"))
                .ok()
        });
        let Some(mut sock) = sock else {
            return Ok(ReceiverCheck::Unreachable(last));
        };
        let peer = sock.peer_addr().map_or(host.clone(), |a| a.to_string());
        if !https {
            return Ok(ReceiverCheck::Reached(format!(
                "connected to {peer} (no request sent)"
            )));
        }
        let _ = sock.set_read_timeout(Some(self.connect_timeout));
        let _ = sock.set_write_timeout(Some(self.connect_timeout));
        match handshake(&mut sock, &host) {
            Ok(()) => Ok(ReceiverCheck::Reached(format!(
                "connected to {peer}, TLS handshake completed (no request sent)"
            ))),
            Err(e) => match reach::tls_mismatch(&e) {
                Some(m) => Err(tls_error(url, m)),
                None => Ok(ReceiverCheck::Unreachable(format!(
                    "TLS handshake with {peer}: {e}"
                ))),
            },
        }
    }
}

/// A client handshake with the roots, protocol versions and provider of
/// ureq's own TLS (its `rustls` feature), then close_notify.
fn handshake(sock: &mut TcpStream, host: &str) -> std::io::Result<()> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(rustls::ALL_VERSIONS)
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let name =
        rustls::pki_types::ServerName::try_from(bare.to_string()).map_err(std::io::Error::other)?;
    let mut conn =
        rustls::ClientConnection::new(Arc::new(config), name).map_err(std::io::Error::other)?;
    while conn.is_handshaking() {
        conn.complete_io(sock)?;
    }
    conn.send_close_notify();
    let _ = conn.write_tls(sock);
    let _ = sock.flush();
    Ok(())
}

fn tls_error(url: String, m: TlsMismatch) -> WebhookError {
    let (reason, fix) = match m {
        TlsMismatch::Untrusted(r) => (
            r,
            "outboxd trusts the public CAs bundled with it (the Mozilla roots), and the \
             receiver's certificate is not signed by one: give the receiver a certificate from \
             a public CA, or put a TLS proxy with one in front of it",
        ),
        TlsMismatch::WrongName(r) => (
            r,
            "the certificate does not name this host: use a host name the certificate holds \
             (its subject alternative names) in url",
        ),
        TlsMismatch::Expired(r) => (
            r,
            "renew the receiver's certificate (or, if it is new, check this machine's clock)",
        ),
        TlsMismatch::NotSpoken(r) => (
            r,
            "the receiver does not speak TLS on that port: use http:// in url, or the port \
             where it serves https",
        ),
        TlsMismatch::Refused(r) => (
            r,
            "the receiver refused the handshake (it may want a client certificate, which \
             outboxd does not send, or share no TLS version with it)",
        ),
    };
    WebhookError::Tls { url, reason, fix }
}
