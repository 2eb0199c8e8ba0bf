//! Values signed with a key of this process and an issue time: the banner
//! an action shows after its redirect travels in the URL sealed, so a link
//! someone else made cannot put words in the console's mouth.

use std::time::Duration;

use hmac::Mac;
use outboxd::Timestamp;

use super::eq;

/// How far ahead of this clock an issue time may be (clocks of one machine
/// agree; this only forgives a step of the wall clock).
pub(super) const FUTURE_SKEW: Duration = Duration::from_secs(60);

/// `payload` with its issue time, signed: `{unix seconds}.{payload}.{mac}`
/// (`{unix seconds}.{mac}` when `payload` is empty), the mac an HMAC-SHA256
/// keyed with `key` over `purpose`, the time and the payload, in hex.
pub(super) fn seal(key: &[u8], purpose: &str, issued: Timestamp, payload: &str) -> String {
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
pub(super) fn unseal<'a>(
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

/// Lower-case hex.
pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_sealed_for_one_purpose_does_not_open_for_another() {
        let now = Timestamp::from_millis(1_764_500_000_000);
        let key = [7u8; 32];
        let sealed = seal(&key, "session", now, "");
        assert_eq!(
            unseal(&key, "session", &sealed, now, Duration::from_secs(1)),
            Some("")
        );
        assert_eq!(
            unseal(&key, "notice", &sealed, now, Duration::from_secs(600)),
            None
        );
    }
}
