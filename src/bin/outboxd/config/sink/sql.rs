//! `kind = "sql"`: SQL statements run for each event inside a transaction
//! on the relay's own database, committed with the consumer's progress:
//! exactly once (docs/exactly-once.md). The statements take named
//! parameters from the envelope (`outboxd::sinks::sql::PARAMETERS`).
//!
//! Whether each statement prepares against the database (its tables
//! exist, its parameters are known) cannot be known from the file alone:
//! [`check`] does that once the database is known, in `check-config` and
//! before `run` claims anything.

use std::path::Path;

use outboxd::sinks::{SqlSink, SqlSinkError};

use super::{RawSink, Sink};
use crate::cmd::support::count;
use crate::config::checker::Checker;
use crate::config::error::ConfigError;
use crate::config::Config;

/// The keys a sql sink takes.
pub(crate) const KEYS: &[&str] = &["kind", "statements"];

/// Builds a sql sink from its statements (not yet checked against a
/// database).
pub(crate) fn build(c: &Checker<'_>, at: &str, s: &RawSink) -> Result<Sink, ConfigError> {
    let statements = s.statements.as_ref().ok_or_else(|| {
        c.err(
            format!("{at}.statements"),
            "is missing; a sql sink needs statements = [\"INSERT INTO … VALUES (:event_id, …)\"]",
        )
    })?;
    let sink =
        SqlSink::new(statements.iter().cloned()).map_err(|e| c.err(field(at, &e), e.reason()))?;
    let description = format!(
        "sql, {} in the relay's database, exactly once",
        count(statements.len() as u64, "statement", "statements")
    );
    Ok(Sink::sql(sink, description))
}

/// `consumer[i].sink.statements[j]`, or `…statements` for the whole list.
fn field(at: &str, e: &SqlSinkError) -> String {
    match e.index() {
        Some(i) => format!("{at}.statements[{i}]"),
        None => format!("{at}.statements"),
    }
}

/// Prepares every sql sink's statements against the database `db`
/// (read-only; nothing runs). The first that does not prepare is an error
/// at its field, such as `consumer[2].sink.statements[1]`. A config
/// without sql sinks does not open the database.
pub(crate) fn check(config: &Config, db: &Path) -> Result<(), ConfigError> {
    let file = config.file.as_deref().unwrap_or(Path::new("(none)"));
    let err = |field: String, message: String| ConfigError {
        file: file.to_path_buf(),
        field,
        line: None,
        message,
    };
    let mut conn = None;
    for (i, consumer) in config.consumers.iter().enumerate() {
        let Some(sink) = consumer.sink.sql_statements() else {
            continue;
        };
        let at = format!("consumer[{i}].sink");
        if conn.is_none() {
            let opened = outboxd::connection::open_read_only(db).map_err(|e| {
                err(
                    format!("{at}.statements"),
                    format!(
                        "cannot be checked against the database {}: {e}; a sql sink's \
                         statements are prepared against the database's tables",
                        db.display()
                    ),
                )
            })?;
            conn = Some(opened);
        }
        let conn = conn.as_ref().expect("opened above");
        sink.check(conn).map_err(|e| {
            err(
                field(&at, &e),
                format!("{} (checked against {})", e.reason(), db.display()),
            )
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::super::tests::parse;
    use super::*;

    const SQL: &str =
        "[[consumer]]\nname = \"audit\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"sql\"\n";

    #[test]
    fn statements_are_required_and_transaction_control_is_refused_at_its_index() {
        let e = parse(SQL).unwrap_err();
        assert_eq!(e.field, "consumer[0].sink.statements");
        let e = parse(&format!("{SQL}statements = []\n")).unwrap_err();
        assert_eq!(e.field, "consumer[0].sink.statements");
        let e = parse(&format!(
            "{SQL}statements = [\"INSERT INTO a VALUES (1)\", \"COMMIT\"]\n"
        ))
        .unwrap_err();
        assert_eq!(e.field, "consumer[0].sink.statements[1]");
        assert!(e.message.contains("COMMIT is not allowed"), "{e}");
        let e = parse(&format!("{SQL}statements = [\"x\"]\npath = \"-\"\n")).unwrap_err();
        assert_eq!(e.field, "consumer[0].sink.path");
    }

    #[test]
    fn check_prepares_against_the_database_and_names_the_statement() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("app.db");
        let conn = outboxd::connection::open(&db).unwrap();
        conn.execute_batch("CREATE TABLE audit (id TEXT PRIMARY KEY)")
            .unwrap();
        let text = format!(
            "{}[[consumer]]\nname = \"b\"\ntypes = [\"*\"]\n[consumer.sink]\nkind = \"sql\"\n\
             statements = [\"INSERT INTO audit VALUES (:event_id)\", \"INSERT INTO nope VALUES (1)\"]\n",
            crate::config::tests::STDOUT
        );
        let config = parse(&text).unwrap();
        let e = check(&config, &db).unwrap_err();
        assert_eq!(e.field, "consumer[1].sink.statements[1]");
        assert!(e.message.contains("no such table: nope"), "{e}");
        conn.execute_batch("CREATE TABLE nope (x)").unwrap();
        check(&config, &db).unwrap();
        let e = check(&config, &dir.path().join("missing.db")).unwrap_err();
        assert_eq!(e.field, "consumer[1].sink.statements");
        assert!(e.message.contains("no such file"), "{e}");
    }
}
