//! `[metrics]`: where to serve Prometheus metrics.

use std::net::{SocketAddr, ToSocketAddrs};

use serde::Deserialize;

use super::checker::Checker;

use super::error::ConfigError;

/// `[metrics]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMetrics {
    listen: Option<String>,
}

/// Checks `[metrics]`: the address to listen on, if any.
pub(crate) fn check(c: &Checker<'_>, raw: &RawMetrics) -> Result<Option<SocketAddr>, ConfigError> {
    match &raw.listen {
        None => Ok(None),
        Some(addr) => Ok(Some(
            resolve_listen(addr).map_err(|m| c.err("metrics.listen", m))?,
        )),
    }
}

/// A listen address: `host:port` resolving to exactly one socket address
/// is expected; the first is taken.
pub(crate) fn resolve_listen(addr: &str) -> Result<SocketAddr, String> {
    let mut addrs = addr.to_socket_addrs().map_err(|e| {
        format!("{addr:?} is not an address to listen on ({e}); expected host:port such as 127.0.0.1:9464")
    })?;
    addrs.next().ok_or_else(|| {
        format!("{addr:?} resolves to no address; expected host:port such as 127.0.0.1:9464")
    })
}
