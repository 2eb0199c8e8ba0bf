//! `outboxd migrate`: create or upgrade outboxd's tables.

use std::io::Write;

use anyhow::Result;
use outboxd::schema::LATEST_VERSION;

use super::{open_for_writing, Global};
use crate::exit::Exit;

/// Shown under `outboxd migrate --help`.
pub const EXAMPLES: &str = "\
Adds outboxd's tables beside the application's own; never touches the
application's tables or PRAGMA user_version. Safe to run twice, and from two
processes at once. Creates the database file if it does not exist.

Example:
  outboxd --db app.db migrate";

/// `outboxd migrate` takes no options of its own.
#[derive(Debug, clap::Args)]
pub struct Args {}

/// Migrates the database to the newest schema this binary knows.
pub fn exec(global: &Global, _args: &Args) -> Result<Exit> {
    if global.db.is_file() {
        // Refuse a newer schema on a read-only connection: opening for
        // writing may switch the journal mode to WAL, and a database this
        // binary does not understand must be left exactly as it is.
        let found = outboxd::schema::version(&outboxd::connection::open_read_only(&global.db)?)?;
        if let Some(found) = found.filter(|v| *v > LATEST_VERSION) {
            return Err(outboxd::Error::SchemaTooNew {
                found,
                supported: LATEST_VERSION,
            }
            .into());
        }
    }
    let mut conn = open_for_writing(&global.db)?;
    let report = outboxd::schema::migrate(&mut conn)?;
    let mut out = std::io::stdout().lock();
    if report.was_current() {
        writeln!(out, "already at v{}", report.to)?;
    } else {
        writeln!(out, "migrated from v{} to v{}", report.from, report.to)?;
    }
    Ok(Exit::Ok)
}
