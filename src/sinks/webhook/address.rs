//! The guard against non-public addresses (SSRF): which addresses are
//! refused, the check of a URL's host before any lookup, and the resolver
//! that drops refused addresses before anything is dialled.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ureq::http::Uri;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

/// True for addresses a webhook must not reach when
/// [`deny_private_addresses`](super::WebhookSinkBuilder::deny_private_addresses) is
/// on: unspecified, loopback, private (RFC 1918), shared (100.64/10),
/// link-local, unique-local (fc00::/7), site-local, multicast and broadcast,
/// also when written as IPv4-mapped, IPv4-compatible, NAT64 or 6to4 IPv6.
pub fn is_non_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4_non_public(v4),
        IpAddr::V6(v6) => v6_non_public(v6),
    }
}

fn v4_non_public(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_unspecified()
        || a == 0 // "this network", 0.0.0.0/8
        || ip.is_loopback()
        || ip.is_private()
        || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
        || ip.is_link_local()
        || (a == 192 && b == 0 && ip.octets()[2] == 0) // IETF protocol assignments
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || ip.is_multicast()
        || a >= 240 // reserved and broadcast
}

fn v6_non_public(ip: Ipv6Addr) -> bool {
    let seg = ip.segments();
    if let Some(v4) = ip.to_ipv4_mapped() {
        return v4_non_public(v4);
    }
    // IPv4-compatible (::a.b.c.d, deprecated) and NAT64 (64:ff9b::/96).
    if seg[..6] == [0; 6] || seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        let o = ip.octets();
        return ip.is_unspecified()
            || ip.is_loopback()
            || v4_non_public(Ipv4Addr::new(o[12], o[13], o[14], o[15]));
    }
    // 6to4 (2002::/16) carries an IPv4 address in bits 16..48.
    if seg[0] == 0x2002 {
        let o = ip.octets();
        return v4_non_public(Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    ip.is_unspecified()
        || ip.is_loopback()
        || (seg[0] & 0xfe00) == 0xfc00 // unique local
        || (seg[0] & 0xffc0) == 0xfe80 // link-local
        || (seg[0] & 0xffc0) == 0xfec0 // site-local (deprecated)
        || ip.is_multicast()
}

/// True when a URL's host is refused before any lookup: a non-public IP
/// literal, `localhost`, or a name under `.localhost` (RFC 6761 reserves
/// them for loopback).
pub(super) fn names_non_public(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return is_non_public(ip);
    }
    let name = bare.trim_end_matches('.').to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost")
}

/// The resolver's refusal of a non-public address.
#[derive(Debug)]
pub(super) struct AddressRefused {
    ip: IpAddr,
}

impl fmt::Display for AddressRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "refused to connect to {}: it is not a public address (loopback, private, \
             link-local or similar) and this webhook denies private addresses",
            self.ip
        )
    }
}

impl std::error::Error for AddressRefused {}

/// The default resolver, then a filter dropping non-public addresses when
/// asked. The connector dials only what this returns, so the check and the
/// connection see the same addresses.
#[derive(Debug)]
pub(super) struct GuardedResolver {
    pub(super) inner: DefaultResolver,
    pub(super) deny_private: bool,
}

impl Resolver for GuardedResolver {
    fn resolve(
        &self,
        uri: &Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let resolved = self.inner.resolve(uri, config, timeout)?;
        if !self.deny_private {
            return Ok(resolved);
        }
        let mut kept = self.empty();
        let mut refused = None;
        for addr in resolved.iter() {
            if is_non_public(addr.ip()) {
                refused.get_or_insert(addr.ip());
            } else {
                kept.push(*addr);
            }
        }
        match refused {
            Some(ip) if kept.is_empty() => Err(ureq::Error::Other(Box::new(AddressRefused { ip }))),
            _ => Ok(kept),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::redact::redact_url;
    use super::super::WebhookSink;
    use super::*;
    use crate::consumer::{Consumer, Delivery, Outcome};

    #[test]
    fn non_public_addresses() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "127.9.9.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "255.255.255.255",
            "224.0.0.1",
            "::",
            "::1",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "fec0::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::1",
        ] {
            assert!(is_non_public(ip.parse().unwrap()), "{ip} should be refused");
        }
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700:4700::1111",
            "::ffff:8.8.8.8",
            "2002:0808:0808::1",
        ] {
            assert!(
                !is_non_public(ip.parse().unwrap()),
                "{ip} should be allowed"
            );
        }
    }

    #[test]
    fn hosts_refused_before_any_lookup() {
        for host in [
            "127.0.0.1",
            "[::1]",
            "10.0.0.7",
            "[::ffff:192.168.1.1]",
            "localhost",
            "LocalHost.",
            "api.localhost",
            "0.0.0.0",
        ] {
            assert!(names_non_public(host), "{host}");
        }
        for host in [
            "example.com",
            "8.8.8.8",
            "[2606:4700::1]",
            "localhost.example.com",
        ] {
            assert!(!names_non_public(host), "{host}");
        }
    }

    #[test]
    fn delivery_time_guard_refuses_what_a_name_resolves_to() {
        // build() refuses localhost outright; assemble() skips that check so
        // the guard that runs at each delivery (after DNS) is tested alone.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        for url in [
            format!("http://localhost:{port}/ok"),
            format!("http://127.0.0.1:{port}/ok"),
            format!("http://[::ffff:127.0.0.1]:{port}/ok"),
        ] {
            let builder = WebhookSink::builder(&url)
                .secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
                .deny_private_addresses(true);
            let shown = redact_url(&url);
            let sink = builder.assemble(shown).unwrap();
            let delivery = Delivery {
                envelope: crate::Envelope {
                    event_id: crate::EventId::new(),
                    event_type: crate::EventType::parse("a.b.v1").unwrap(),
                    event_version: 1,
                    causation_id: None,
                    correlation_id: None,
                    occurred_at: crate::Timestamp::from_millis(0),
                    payload: serde_json::value::RawValue::from_string("1".into()).unwrap(),
                },
                attempt: 1,
                consumer: "c".into(),
                legacy: false,
                tenant_id: None,
                ordering_key: None,
                trace: None,
                created_at: None,
            };
            match sink.deliver(&delivery) {
                Outcome::Poison { reason } => {
                    assert!(reason.contains("refused to connect"), "{url}: {reason}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
        // Nothing connected: the guard refused before dialling.
        assert_eq!(
            listener.accept().unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock
        );
    }
}
