//! The context every section's `check` takes.

use std::path::{Path, PathBuf};

use super::error::ConfigError;
use super::secrets::{process_env, Env};

/// What every section's `check` needs: the file (for errors), its
/// directory (for relative paths) and the environment (for `*_env` keys:
/// the process's, or a unit test's own, so no test has to change the
/// process environment under the others' feet).
pub(crate) struct Checker<'a> {
    pub(super) file: &'a Path,
    dir: PathBuf,
    env: Env<'a>,
}

impl<'a> Checker<'a> {
    pub(super) fn new(file: &'a Path) -> Checker<'a> {
        Checker::with_env(file, &process_env)
    }

    pub(super) fn with_env(file: &'a Path, env: Env<'a>) -> Checker<'a> {
        let dir = file
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
        Checker { file, dir, env }
    }

    /// Where `*_env` keys are looked up (read them with
    /// [`super::secrets::secret_from_env`]).
    pub(crate) fn env_lookup(&self) -> Env<'a> {
        self.env
    }

    /// An error at `field` (a path such as `consumer[0].sink.url`).
    pub(crate) fn err(&self, field: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_path_buf(),
            field: field.into(),
            line: None,
            message: message.into(),
        }
    }

    /// A path from the config, resolved against the config file's directory.
    pub(crate) fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.dir.join(p)
        }
    }
}
