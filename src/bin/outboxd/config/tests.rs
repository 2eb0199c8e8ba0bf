//! The loader's and the checks' tests; the sections test themselves.

use super::check::validate_in;
use super::checker::Checker;
use super::relay::DEFAULT_SHUTDOWN_GRACE;
use super::secrets::secret_env_vars;
use super::*;

pub(crate) fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("/etc/outboxd/outboxd.toml"))
}

/// [`parse`] with `vars` as the whole environment.
pub(crate) fn parse_with_env(text: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let file = Path::new("/etc/outboxd/outboxd.toml");
    let env = |var: &str| {
        vars.iter()
            .find(|(k, _)| *k == var)
            .map(|(_, v)| v.to_string())
            .ok_or(std::env::VarError::NotPresent)
    };
    validate_in(
        parse_raw(text, file)?,
        &Checker::with_env(file, &env),
        &secret_env_vars(text),
    )
}

pub(crate) const STDOUT: &str = "[[consumer]]\nname = \"out\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = \"-\"\n";

#[test]
fn a_minimal_config_takes_the_defaults() {
    let c = parse(STDOUT).unwrap();
    assert_eq!(c.consumers.len(), 1);
    assert_eq!(c.relay.lease, outboxd::relay::DEFAULT_LEASE);
    assert_eq!(c.relay.shutdown_grace, DEFAULT_SHUTDOWN_GRACE);
    assert!(c.purge.is_some());
    assert_eq!(c.metrics, None);
}

#[test]
fn a_config_without_consumers_says_in_one_sentence_what_to_add() {
    let shown = parse("[relay]\nworkers = 1\n").unwrap_err().to_string();
    assert_eq!(
        shown,
        "config /etc/outboxd/outboxd.toml: consumer: the config has no consumer; add a \
         [[consumer]] with a name, types and a [consumer.sink]"
    );
}

#[test]
fn errors_name_the_field_path_and_line() {
    let text = format!("{STDOUT}[[consumer]]\nname = \"b\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = 7\n");
    let e = parse(&text).unwrap_err();
    assert_eq!(e.field, "consumer[1].sink.path");
    assert_eq!(e.line, Some(12));
    let shown = e.to_string();
    assert!(
        shown.starts_with("config /etc/outboxd/outboxd.toml, line 12: consumer[1].sink.path: "),
        "{shown}"
    );
}

#[test]
fn type_errors_are_in_words_not_rust_types() {
    let cases = [
        (
            "[relay]\nworkers = \"two\"",
            "relay.workers",
            "expected a whole number from 1 to 1024, found the text \"two\"",
        ),
        (
            "[relay]\nworkers = 0",
            "relay.workers",
            "0 is out of range; expected a whole number from 1 to 1024",
        ),
        (
            "[retry]\nmax_attempts = 99999999999",
            "retry.max_attempts",
            "99999999999 is out of range; expected a whole number from 1 to 1000",
        ),
        (
            "[relay]\nworkers = 99999999999999999999",
            "relay.workers",
            "99999999999999999999 is out of range; expected a whole number from 1 to 1024",
        ),
        (
            "[retry]\nmax_attempts = -99999999999999999999",
            "retry.max_attempts",
            "-99999999999999999999 is out of range; expected a whole number from 1 to 1000",
        ),
        (
            "[alerts]\nmax_dead = 99999999999999999999",
            "alerts.max_dead",
            "99999999999999999999 is out of range; expected a whole number (0 or more)",
        ),
        (
            "[retry]\nmax_attempts = \"ten\"",
            "retry.max_attempts",
            "expected a whole number from 1 to 1000, found the text \"ten\"",
        ),
        (
            "[purge]\nbatch_size = -1",
            "purge.batch_size",
            "-1 is out of range; expected a whole number from 1 to 100000",
        ),
        (
            "[retry]\njitter = \"x\"",
            "retry.jitter",
            "expected a number, such as 0.5, found the text \"x\"",
        ),
        (
            "[alerts]\nmax_dead = 1.5",
            "alerts.max_dead",
            "expected a whole number (0 or more), found the number 1.5",
        ),
        (
            "[relay]\nlease = 30",
            "relay.lease",
            "expected a duration in quotes, such as \"30s\", found the whole number 30",
        ),
        (
            "[purge]\nenabled = 99999999999999999999",
            "purge.enabled",
            "expected true or false, found the whole number 99999999999999999999",
        ),
        (
            "[purge]\nenabled = 1",
            "purge.enabled",
            "expected true or false, found the whole number 1",
        ),
        (
            "relay = 3",
            "relay",
            "expected a table, found the whole number 3",
        ),
        (
            "database = []",
            "database",
            "expected text in quotes, found a list",
        ),
    ];
    for (section, field, want) in cases {
        let e = parse(&format!("{section}\n{STDOUT}")).unwrap_err();
        assert_eq!(e.field, field, "{e}");
        assert_eq!(e.message, want, "{e}");
    }
    let e = parse(&STDOUT.replace("path = \"-\"", "path = \"-\"\nfsync = \"yes\"")).unwrap_err();
    assert_eq!(e.message, "expected true or false, found the text \"yes\"");
    let e = parse(&STDOUT.replace("[\"*\"]", "\"*\"")).unwrap_err();
    assert_eq!(
        e.message,
        "expected a list, such as [\"a\", \"b\"], found the text \"*\""
    );
}

#[test]
fn setting_errors_echo_durations_in_the_units_people_write() {
    let cases = [
        (
            "[relay]\nlease = \"0s\"",
            "relay.lease",
            "0s is out of range; allowed: 1s to 10m",
        ),
        (
            "[relay]\npoll_interval = \"2m\"",
            "relay.poll_interval",
            "2m is out of range; allowed: 1ms to 1m",
        ),
        (
            "[purge]\ndelivered_retention = \"14d\"\ndedup_ttl = \"7d\"",
            "purge.dedup_ttl",
            "7d is shorter than purge.delivered_retention (14d); the dedup window must \
             cover every kept row",
        ),
        (
            "[retry]\ninitial = \"1h\"\nmax_delay = \"30m\"",
            "retry.max_delay",
            "30m is shorter than retry.initial (1h); allowed: retry.initial or longer",
        ),
        (
            "[retry]\nprobe_interval = \"1m\"\nprobe_max_interval = \"30s\"",
            "retry.probe_max_interval",
            "30s is out of range; allowed: retry.probe_interval (1m) to 7 days",
        ),
    ];
    for (section, field, want) in cases {
        let e = parse(&format!("{section}\n{STDOUT}")).unwrap_err();
        assert_eq!(e.field, field, "{e}");
        assert_eq!(e.message, want, "{e}");
    }
}

#[test]
fn common_slips_are_said_in_the_files_terms() {
    let e = parse("[consumer]\nname = \"c\"\ntypes = [\"*\"]\n").unwrap_err();
    assert_eq!(e.field, "consumer");
    assert!(e.message.contains("[[consumer]]"), "{e}");
    assert!(!e.message.contains("[\"a\", \"b\"]"), "{e}");
    let e = parse(&STDOUT.replace("path = \"-\"", "path = \"\"")).unwrap_err();
    assert_eq!(e.field, "consumer[0].sink.path");
    assert!(e.message.starts_with("is empty"), "{e}");
}

#[test]
fn unknown_keys_are_refused_with_the_allowed_ones() {
    let e = parse(&format!("{STDOUT}[relay]\nworkerz = 2\n")).unwrap_err();
    assert!(e.field.starts_with("relay"), "{e}");
    assert!(e.message.contains("workers"), "{e}");
}

#[test]
fn every_env_key_in_any_section_names_a_secret_variable() {
    let text = r#"
[http]
token_env = "HTTP_TOKEN"
[[consumer]]
name = "hook"
types = ["*"]
[consumer.sink]
kind = "webhook"
secret_env = "HOOK_SECRET"
secrets_env = ["HOOK_NEW", "HOOK_OLD"]
[[consumer]]
name = "bus"
types = ["*"]
[consumer.sink]
kind = "nats"
token_env = "NATS_TOKEN"
password_env = "NATS_PASSWORD"
[[consumer]]
name = "cmd"
types = ["*"]
[consumer.sink]
kind = "command"
clear_env = false
env = { PLAIN = "not-a-secret" }
"#;
    assert_eq!(
        secret_env_vars(text),
        [
            "HOOK_NEW",
            "HOOK_OLD",
            "HOOK_SECRET",
            "HTTP_TOKEN",
            "NATS_PASSWORD",
            "NATS_TOKEN"
        ]
    );
    assert!(secret_env_vars("not [toml").is_empty());
}

#[test]
fn relative_paths_follow_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let text = "database = \"app.db\"\n[[consumer]]\nname = \"f\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"jsonl\"\npath = \"out.jsonl\"\n";
    let c = Config::parse(text, &dir.path().join("o.toml")).unwrap();
    assert_eq!(c.database.unwrap(), dir.path().join("app.db"));
    assert!(dir.path().join("out.jsonl").exists());
}

// Config parsing, fuzzed with proptest (a cargo-fuzz target cannot reach
// a binary's modules): any text, and every field with any value, gives
// a config or an error that names the file, and never a panic.
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    const FIELDS: &[&str] = &[
        "database",
        "relay.workers",
        "relay.batch_size",
        "relay.lease",
        "relay.poll_interval",
        "relay.unrouted",
        "relay.shutdown_grace",
        "retry.initial",
        "retry.max_delay",
        "retry.max_attempts",
        "retry.jitter",
        "purge.enabled",
        "purge.delivered_retention",
        "purge.dedup_ttl",
        "purge.dead_retention",
        "purge.intent_retention",
        "purge.batch_size",
        "alerts.stale_after",
        "alerts.max_dead",
        "log.level",
        "log.format",
        "metrics.listen",
        "http.listen",
        "http.token_env",
        "http.read_only",
        "relay.no_such_key",
    ];

    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            "-?[0-9]{1,20}",
            "-?[0-9]{1,3}\\.[0-9]{1,3}",
            "\"[0-9]{0,6}(ms|s|m|h|d|x)?\"",
            "\"[ -~]{0,16}\"",
            Just("true".to_string()),
            Just("[]".to_string()),
            Just("{}".to_string()),
            Just("\"\"".to_string()),
        ]
    }

    fn check(text: &str) -> Result<(), TestCaseError> {
        let file = "/etc/outboxd/outboxd.toml";
        if let Err(e) = parse(text) {
            let msg = e.to_string();
            prop_assert!(msg.contains(file), "{msg}");
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn any_text_is_a_config_or_a_named_error(text in "\\PC{0,300}") {
            check(&text)?;
        }

        #[test]
        fn any_value_in_any_field_is_a_config_or_a_named_error(
            field in prop::sample::select(FIELDS), value in value()
        ) {
            let text = match field.split_once('.') {
                Some((table, key)) => format!("[{table}]\n{key} = {value}\n{STDOUT}"),
                None => format!("{field} = {value}\n{STDOUT}"),
            };
            check(&text)?;
        }
    }
}
