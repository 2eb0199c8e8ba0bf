//! Secrets from the environment: the one reader of `*_env` keys (the
//! sinks', the console's token), and the list of variables a config names
//! as secrets, which command sinks keep from their programs.

/// Where `*_env` keys are looked up.
pub(crate) type Env<'a> = &'a dyn Fn(&str) -> Result<String, std::env::VarError>;

/// The process's own environment, as an [`Env`].
pub(crate) fn process_env(var: &str) -> Result<String, std::env::VarError> {
    std::env::var(var)
}

/// An environment variable that should hold a secret does not. Never
/// holds the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SecretEnvError {
    /// The variable is not set.
    #[error("environment variable {var} is not set; set it to {what}")]
    NotSet {
        /// The variable.
        var: String,
        /// What it should hold.
        what: String,
    },
    /// Its value is not UTF-8.
    #[error("environment variable {var} is not valid UTF-8; set it to {what}")]
    NotUnicode {
        /// The variable.
        var: String,
        /// What it should hold.
        what: String,
    },
    /// Its value is empty or only whitespace.
    #[error("environment variable {var} is empty; set it to {what}")]
    Empty {
        /// The variable.
        var: String,
        /// What it should hold.
        what: String,
    },
}

/// A secret from the environment variable `var` as `env` looks it up
/// ([`process_env`], or a test's own), which should hold `what` (said in
/// the error): unset, non-UTF-8 and empty values are refused. The one
/// reader of secrets from the environment (the sinks' `*_env` keys, the
/// console's token).
pub(crate) fn secret_from_env(
    env: Env<'_>,
    var: &str,
    what: &str,
) -> Result<String, SecretEnvError> {
    let (var, what) = (var.to_string(), what.to_string());
    match env(&var) {
        Ok(value) if value.trim().is_empty() => Err(SecretEnvError::Empty { var, what }),
        Ok(value) => Ok(value),
        Err(std::env::VarError::NotPresent) => Err(SecretEnvError::NotSet { var, what }),
        Err(std::env::VarError::NotUnicode(_)) => Err(SecretEnvError::NotUnicode { var, what }),
    }
}

/// Every environment variable the config text names as holding a secret:
/// the value of every key whose name ends in `_env` (a variable's name, or
/// a list of them), in any section: `[http] token_env`, a webhook's
/// `secret_env` and `secrets_env`, nats' `token_env` and `password_env`,
/// and whatever such key a section adds later. Command sinks keep them all
/// from their programs. (The naming rule is the contract: a new key that
/// reads a secret from the environment is named `*_env`.) Text that does
/// not parse names none; the loader reports it.
pub(crate) fn secret_env_vars(text: &str) -> Vec<String> {
    fn walk(value: &toml::Value, key: Option<&str>, out: &mut Vec<String>) {
        let names_vars = key.is_some_and(|k| k.ends_with("_env"));
        match value {
            toml::Value::String(name) if names_vars => out.push(name.clone()),
            toml::Value::Array(items) => {
                for item in items {
                    walk(item, key, out);
                }
            }
            toml::Value::Table(table) => {
                for (k, v) in table {
                    walk(v, Some(k), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    if let Ok(table) = text.parse::<toml::Table>() {
        walk(&toml::Value::Table(table), None, &mut out);
    }
    out.sort();
    out.dedup();
    out
}
