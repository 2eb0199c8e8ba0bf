//! Reaching a destination, as check-config looks at it: a failure no retry
//! can fix (the host name does not exist, a certificate that cannot be
//! trusted, TLS wanted by one side and not spoken by the other) told from
//! an outage (a resolver that does not answer, a refused connection, a
//! timeout), which a retry can. Shared by the webhook and NATS sinks.

use std::error::Error;
use std::net::{SocketAddr, ToSocketAddrs};

/// The answer to a host name's lookup.
#[derive(Debug)]
pub(crate) enum Lookup {
    /// Its addresses.
    Found(Vec<SocketAddr>),
    /// The name does not exist (NXDOMAIN) or has no address: a
    /// configuration error. The resolver's words.
    NoSuchHost(String),
    /// No answer (SERVFAIL, a timeout, no resolver reached): an outage.
    Failed(String),
}

/// The resolver's words for a name that does not exist or has no address
/// (glibc's EAI_NONAME and EAI_NODATA, musl's, the BSDs'): std's lookup
/// error carries nothing but this text. A temporary failure (EAI_AGAIN,
/// SERVFAIL or a timeout) reads differently and stays an outage.
const NO_SUCH_HOST: [&str; 4] = [
    "Name or service not known",
    "No address associated with hostname",
    "Name does not resolve",
    "nodename nor servname provided",
];

/// Looks `host` up (an IP literal, with or without brackets, is its own
/// address).
pub(crate) fn lookup(host: &str, port: u16) -> Lookup {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match (bare, port).to_socket_addrs() {
        Ok(addrs) => {
            let found: Vec<SocketAddr> = addrs.collect();
            if found.is_empty() {
                Lookup::NoSuchHost("the name has no address".into())
            } else {
                Lookup::Found(found)
            }
        }
        Err(e) => lookup_error(e.to_string()),
    }
}

/// A failed lookup by the resolver's words.
fn lookup_error(text: String) -> Lookup {
    if NO_SUCH_HOST.iter().any(|t| text.contains(t)) {
        Lookup::NoSuchHost(text)
    } else {
        Lookup::Failed(text)
    }
}

/// A TLS handshake that cannot succeed however often it is tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TlsMismatch {
    /// The peer's certificate is not signed by a CA this side trusts.
    Untrusted(String),
    /// The certificate is not for the host connected to.
    WrongName(String),
    /// The certificate has expired or is not valid yet.
    Expired(String),
    /// The peer answered something that is not TLS: it does not speak TLS
    /// on that port.
    NotSpoken(String),
    /// The peer refused the handshake (an alert: it wants a client
    /// certificate, or shares no protocol version or cipher).
    Refused(String),
}

/// The mismatch behind a failed connection, if its error chain holds a
/// TLS error that says one (an `io::Error`'s inner error is looked into:
/// its `source` skips it).
pub(crate) fn tls_mismatch(err: &(dyn Error + 'static)) -> Option<TlsMismatch> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(t) = e.downcast_ref::<rustls::Error>() {
            return classify(t);
        }
        if let Some(inner) = e
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if let Some(found) = tls_mismatch(inner) {
                return Some(found);
            }
        }
        next = e.source();
    }
    None
}

fn classify(e: &rustls::Error) -> Option<TlsMismatch> {
    use rustls::CertificateError as C;
    let text = e.to_string();
    Some(match e {
        rustls::Error::InvalidCertificate(c) => match c {
            C::NotValidForName | C::NotValidForNameContext { .. } => TlsMismatch::WrongName(text),
            C::Expired
            | C::ExpiredContext { .. }
            | C::NotValidYet
            | C::NotValidYetContext { .. } => TlsMismatch::Expired(text),
            _ => TlsMismatch::Untrusted(text),
        },
        rustls::Error::InvalidMessage(_) => TlsMismatch::NotSpoken(text),
        rustls::Error::AlertReceived(_)
        | rustls::Error::PeerIncompatible(_)
        | rustls::Error::NoCertificatesPresented => TlsMismatch::Refused(text),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ip_literal_is_found_without_a_resolver() {
        assert!(matches!(lookup("127.0.0.1", 80), Lookup::Found(_)));
        assert!(matches!(lookup("[::1]", 80), Lookup::Found(_)));
    }

    #[test]
    fn only_a_name_that_does_not_exist_is_a_configuration_error() {
        let gai = |detail: &str| format!("failed to lookup address information: {detail}");
        for permanent in [
            "Name or service not known",
            "No address associated with hostname",
        ] {
            assert!(matches!(
                lookup_error(gai(permanent)),
                Lookup::NoSuchHost(_)
            ));
        }
        // EAI_AGAIN: SERVFAIL, a timeout, no resolver reached.
        let again = gai("Temporary failure in name resolution");
        assert!(matches!(lookup_error(again), Lookup::Failed(_)));
    }

    #[test]
    fn a_certificate_error_inside_an_io_error_is_found() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, tls);
        assert!(matches!(tls_mismatch(&io), Some(TlsMismatch::Untrusted(_))));
        let not_tls = rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, not_tls);
        assert!(matches!(tls_mismatch(&io), Some(TlsMismatch::NotSpoken(_))));
        // A reset connection is an outage.
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(tls_mismatch(&reset), None);
    }
}
