//! `--config FILE` (or `OUTBOXD_CONFIG`): one argument flattened into every
//! command that reads a config, and the one place that reads the file and
//! picks the database: --db or OUTBOXD_DB when given, else the config's
//! `database`, else the default.
//!
//! A command says what the config is for in its own words with
//! `#[command(mut_arg("config", |a| a.help("...")))]`, and makes it
//! required with `.required(true)`.

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::Global;
use crate::config::capture::CaptureConfig;
use crate::config::{Config, ConfigError, Summary};
use crate::exit::Failure;

/// `--config FILE`, or `OUTBOXD_CONFIG`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ConfigArg {
    /// The config file (outboxd.toml).
    #[arg(long = "config", env = "OUTBOXD_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Failure {
        Failure::config(e.to_string())
    }
}

impl ConfigArg {
    /// The file, when given.
    pub(crate) fn file(&self) -> Option<&Path> {
        self.config.as_deref()
    }

    /// The database and the config's settings (sinks not built: no secret
    /// needed, nothing created), for the operator commands.
    pub(crate) fn summary(&self, global: &Global) -> Result<(PathBuf, Option<Summary>)> {
        self.read(global, Config::load_without_sinks, |s| {
            s.database.as_deref()
        })
    }

    /// The whole config, sinks built (`also_secret`: variables named on the
    /// command line that hold secrets too), and the database.
    pub(crate) fn load(
        &self,
        global: &Global,
        also_secret: &[&str],
    ) -> Result<(PathBuf, Option<Config>)> {
        let load = |file: &Path| Config::load_with_secret_env(file, also_secret);
        self.read(global, load, |c| c.database.as_deref())
    }

    /// The config's `[[capture]]` entries and the database.
    pub(crate) fn captures(&self, global: &Global) -> Result<(PathBuf, Option<CaptureConfig>)> {
        self.read(global, Config::load_captures, |c| c.database.as_deref())
    }

    /// The file read with `read` (its error a config failure, exit 6), and
    /// the database: --db or OUTBOXD_DB, else the config's, else the default.
    fn read<T>(
        &self,
        global: &Global,
        read: impl FnOnce(&Path) -> Result<T, ConfigError>,
        database: impl Fn(&T) -> Option<&Path>,
    ) -> Result<(PathBuf, Option<T>)> {
        let config = match self.file() {
            Some(file) => Some(read(file).map_err(Failure::from)?),
            None => None,
        };
        let db = global.db_with_config(config.as_ref().and_then(database));
        Ok((db, config))
    }
}
