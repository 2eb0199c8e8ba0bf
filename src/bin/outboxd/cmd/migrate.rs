//! `outboxd migrate`: create or upgrade outboxd's tables.

use std::io::Write;

use super::{database, Global};
use crate::exit::Exit;
use anyhow::Result;

/// Shown under `outboxd migrate --help`.
pub(crate) const EXAMPLES: &str = "\
Adds outboxd's tables beside the application's own; never touches the
application's tables or PRAGMA user_version. Safe to run twice, and from two
processes at once. Creates the database file if it does not exist.

Example:
  outboxd --db app.db migrate";

/// `outboxd migrate` takes no options of its own.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {}

/// Migrates the database to the newest schema this binary knows.
pub(crate) fn exec(global: &Global, _args: &Args) -> Result<Exit> {
    let report = database::migrate(&global.db)?;
    let mut out = std::io::stdout().lock();
    if report.was_current() {
        writeln!(out, "already at v{}", report.to)?;
    } else {
        writeln!(out, "migrated from v{} to v{}", report.from, report.to)?;
    }
    Ok(Exit::Ok)
}
