//! `[[consumer]]`: who takes which event types, through which sink, with
//! which retry schedule. Names, types and retry policies are checked by the
//! library (`RelayBuilder::build`, see [`super::check_with_library`]); the
//! sinks are built here, after that check, so a config the library refuses
//! creates no file.

use outboxd::RetryPolicy;
use serde::Deserialize;

use super::checker::Checker;
use super::error::ConfigError;
use super::retry;
use super::sink::{self, RawSink, Sink};
use outboxd::clock::format_duration as human;

/// One `[[consumer]]`, validated.
#[derive(Debug)]
pub(crate) struct ConsumerSpec {
    /// Its unique name (the key of its progress in the database).
    pub(crate) name: String,
    /// The event types or patterns it takes.
    pub(crate) types: Vec<String>,
    /// Its retry policy.
    pub(crate) retry: RetryPolicy,
    /// Its sink.
    pub(crate) sink: Sink,
}

/// One `[[consumer]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConsumer {
    /// Its name.
    pub(crate) name: String,
    /// Its event types or patterns.
    pub(crate) types: Vec<String>,
    retry: Option<retry::RawRetry>,
    sink: RawSink,
}

impl RawConsumer {
    /// Its retry policy: its sink kind's own schedule (else `[retry]`, given
    /// as `default`), with its `[consumer.retry]` keys on top.
    pub(crate) fn retry_policy(&self, default: &RetryPolicy) -> RetryPolicy {
        let base = sink::default_retry(self.sink.kind).unwrap_or_else(|| default.clone());
        match &self.retry {
            Some(t) => retry::apply(t, base),
            None => base,
        }
    }
}

/// Builds every consumer's sink; a sink whose longest delivery outlasts the
/// `lease` is refused (the delivery could outlive its claim). Command sinks
/// keep `secret_vars` (the config's [`super::secrets::secret_env_vars`]) from their
/// programs.
pub(crate) fn build(
    c: &Checker<'_>,
    raw: Vec<RawConsumer>,
    lease: std::time::Duration,
    default_retry: &RetryPolicy,
    secret_vars: &[String],
) -> Result<Vec<ConsumerSpec>, ConfigError> {
    let mut consumers = Vec::with_capacity(raw.len());
    for (i, rc) in raw.into_iter().enumerate() {
        let at = format!("consumer[{i}]");
        let sink = sink::build(c, &format!("{at}.sink"), &rc.sink, secret_vars)?;
        if let Some(limit) = sink.time_limit() {
            if lease < limit {
                return Err(c.err(
                    format!("{at}.sink.{}", sink.time_limit_key()),
                    format!(
                        "{} is longer than relay.lease ({}); a delivery could outlive its \
                         claim: set relay.lease to at least {} or shorten the timeout",
                        human(limit),
                        human(lease),
                        human(limit)
                    ),
                ));
            }
        }
        consumers.push(ConsumerSpec {
            retry: rc.retry_policy(default_retry),
            name: rc.name,
            types: rc.types,
            sink,
        });
    }
    Ok(consumers)
}

#[cfg(test)]
mod tests {
    use super::super::tests::parse_with_env;
    use super::*;

    #[test]
    fn a_webhook_without_retry_table_retries_for_days_and_its_timeout_fits_the_lease() {
        let parse = |text: &str| {
            parse_with_env(
                text,
                &[(
                    "CONFIG_UNIT_SECRET",
                    "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                )],
            )
        };
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
