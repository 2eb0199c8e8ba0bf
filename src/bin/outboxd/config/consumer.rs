//! `[[consumer]]`: who takes which event types, through which sink, with
//! which retry schedule.

use outboxd::router::Pattern;
use outboxd::RetryPolicy;
use serde::Deserialize;

use super::relay::RelaySettings;
use super::sink::{self, RawSink, Sink};
use super::{retry, Checker, ConfigError};

/// One `[[consumer]]`, validated.
#[derive(Debug)]
pub struct ConsumerSpec {
    /// Its unique name (the key of its progress in the database).
    pub name: String,
    /// The event types or patterns it takes.
    pub types: Vec<String>,
    /// Its retry policy.
    pub retry: RetryPolicy,
    /// Its sink.
    pub sink: Sink,
}

/// One `[[consumer]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConsumer {
    name: String,
    types: Vec<String>,
    retry: Option<retry::RawRetry>,
    sink: RawSink,
}

/// Checks every `[[consumer]]` and builds its sink. `relay` bounds the
/// sinks' timeouts; `retry` is the `[retry]` policy of consumers whose
/// sink kind has no schedule of its own.
pub fn check(
    c: &Checker<'_>,
    raw: Vec<RawConsumer>,
    relay: &RelaySettings,
    retry: &RetryPolicy,
) -> Result<Vec<ConsumerSpec>, ConfigError> {
    if raw.is_empty() {
        return Err(c.err(
            "consumer",
            "no [[consumer]] is configured; add at least one with a name, types and a \
             [consumer.sink]",
        ));
    }
    let lease = relay.lease;
    let mut names = std::collections::HashSet::new();
    let mut consumers = Vec::with_capacity(raw.len());
    let secret_vars = sink::secret_env_vars(raw.iter().map(|rc| &rc.sink));
    for (i, rc) in raw.into_iter().enumerate() {
        let at = format!("consumer[{i}]");
        let name = &rc.name;
        if name.is_empty()
            || name.len() > 128
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
        {
            return Err(c.err(
                format!("{at}.name"),
                format!(
                    "{name:?} is not allowed; use 1 to 128 characters of A-Z, a-z, 0-9, _, - and ."
                ),
            ));
        }
        if !names.insert(name.clone()) {
            return Err(c.err(
                format!("{at}.name"),
                format!("{name:?} is used by an earlier consumer; names must be unique"),
            ));
        }
        if rc.types.is_empty() {
            return Err(c.err(
                format!("{at}.types"),
                "is empty; list event types or patterns such as [\"article.*.v1\"] or [\"*\"]",
            ));
        }
        for (j, t) in rc.types.iter().enumerate() {
            Pattern::parse(t).map_err(|e| {
                let msg = match e {
                    outboxd::Error::InvalidSetting { reason, .. } => reason,
                    other => other.to_string(),
                };
                c.err(format!("{at}.types[{j}]"), msg)
            })?;
        }
        let sink = sink::build(c, &format!("{at}.sink"), &rc.sink, &secret_vars)?;
        if let Some(limit) = sink.time_limit() {
            if lease < limit {
                return Err(c.err(
                    format!("{at}.sink.timeout"),
                    format!(
                        "{limit:?} is longer than relay.lease ({lease:?}); a delivery could \
                         outlive its claim: set relay.lease to at least {limit:?} or shorten \
                         the timeout"
                    ),
                ));
            }
        }
        let base = sink.default_retry().unwrap_or_else(|| retry.clone());
        let consumer_retry = match &rc.retry {
            Some(t) => retry::check(c, &format!("{at}.retry"), t, base)?,
            None => base,
        };
        consumers.push(ConsumerSpec {
            name: rc.name,
            types: rc.types,
            retry: consumer_retry,
            sink,
        });
    }
    Ok(consumers)
}

#[cfg(test)]
mod tests {
    use super::super::tests::parse;
    use super::*;

    #[test]
    fn a_webhook_without_retry_table_retries_for_days_and_its_timeout_fits_the_lease() {
        std::env::set_var(
            "CONFIG_UNIT_SECRET",
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        );
        let hook = "[[consumer]]\nname = \"h\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"webhook\"\nurl = \"https://example.com/\"\nsecret_env = \"CONFIG_UNIT_SECRET\"\n";
        let c = parse(&format!("[retry]\nmax_attempts = 3\n{hook}")).unwrap();
        assert_eq!(c.consumers[0].retry, RetryPolicy::webhook());
        let c = parse(&format!("{hook}[consumer.retry]\nmax_attempts = 3\n")).unwrap();
        assert_eq!(c.consumers[0].retry, RetryPolicy::webhook().max_attempts(3));
        let e = parse(&format!("[relay]\nlease = \"5s\"\n{hook}")).unwrap_err();
        assert_eq!(e.field, "consumer[0].sink.timeout");
        assert!(e.message.contains("30s") && e.message.contains("5s"), "{e}");
    }
}
