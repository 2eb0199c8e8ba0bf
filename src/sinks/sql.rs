//! A transactional consumer made of SQL statements: each delivery runs
//! them, in order, inside the consumer's transaction on the relay's
//! database, with named parameters bound from the delivery. The `outboxd`
//! binary's `kind = "sql"` sink; a projection or an audit table kept
//! exactly once without writing Rust.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use outboxd::sinks::SqlSink;
//! let sink = SqlSink::new([
//!     "INSERT INTO audit (event_id, type, title)
//!      VALUES (:event_id, :event_type, json_extract(:payload, '$.title'))",
//! ])?;
//! let conn = rusqlite::Connection::open_in_memory()?;
//! conn.execute_batch("CREATE TABLE audit (event_id TEXT PRIMARY KEY, type TEXT, title TEXT)")?;
//! sink.check(&conn)?; // every statement prepares, every parameter is known
//! assert!(SqlSink::new(["COMMIT"]).is_err());
//! # Ok(()) }
//! ```

use rusqlite::types::{ToSqlOutput, Value, ValueRef};
use rusqlite::{Connection, ErrorCode, Transaction};

use super::buffer::envelope_json;
use crate::consumer::{Delivery, Outcome, TransactionalConsumer};
use crate::text::{clip, Keep};

/// The named parameters a statement may use, and what each is bound to.
/// A statement uses any of them, in any order, as often as it likes.
pub const PARAMETERS: &[(&str, &str)] = &[
    (":event_id", "the event id, a ULID as text"),
    (":event_type", "the event type, such as article.created.v1"),
    (":event_version", "the version, an integer (1 for …v1)"),
    (":tenant_id", "the tenant, text or NULL"),
    (":ordering_key", "the ordering key, text or NULL"),
    (":causation_id", "text or NULL"),
    (":correlation_id", "text or NULL"),
    (
        ":occurred_at",
        "when it happened, RFC 3339 UTC text as in the envelope (2026-11-30T07:18:00.000Z)",
    ),
    (
        ":occurred_at_ms",
        "when it happened, integer milliseconds since the Unix epoch",
    ),
    (
        ":payload",
        "the payload as JSON text, for json_extract(:payload, '$.id')",
    ),
    (":envelope", "the whole envelope as JSON text"),
    (":consumer", "the consumer's name"),
    (":attempt", "1 on the first try, 2 on the first retry, …"),
    (":legacy", "1 for a row without an event id, else 0"),
    (
        ":traceparent",
        "this attempt's W3C traceparent (a child of the producer's), text or NULL",
    ),
    (":tracestate", "the producer's W3C tracestate, text or NULL"),
];

/// Statements that would end or escape the consumer's transaction (or
/// leave the database's file set), refused by their first word.
const REFUSED: &[&str] = &[
    "BEGIN",
    "COMMIT",
    "END",
    "ROLLBACK",
    "SAVEPOINT",
    "RELEASE",
    "ATTACH",
    "DETACH",
    "VACUUM",
];

/// Longest SQLite message kept in an outcome's reason.
const MAX_REASON_BYTES: usize = 1024;

/// A statement list that cannot be used. [`index`](SqlSinkError::index)
/// says which statement, so a config can point at it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SqlSinkError {
    /// The list is empty.
    #[error("no statements; list at least one SQL statement")]
    NoStatements,
    /// One statement is unusable.
    #[error("statement {index}: {reason}")]
    Statement {
        /// Its position in the list, from 0.
        index: usize,
        /// What is wrong, and what to write instead.
        reason: String,
    },
}

impl SqlSinkError {
    /// The position of the statement at fault, if one is.
    pub fn index(&self) -> Option<usize> {
        match self {
            SqlSinkError::NoStatements => None,
            SqlSinkError::Statement { index, .. } => Some(*index),
        }
    }

    /// What is wrong, without the position.
    pub fn reason(&self) -> String {
        match self {
            SqlSinkError::NoStatements => self.to_string(),
            SqlSinkError::Statement { reason, .. } => reason.clone(),
        }
    }

    fn at(index: usize, reason: impl Into<String>) -> SqlSinkError {
        SqlSinkError::Statement {
            index,
            reason: reason.into(),
        }
    }
}

/// Runs its statements for each delivery, inside the transaction of a
/// [`TransactionalConsumer`]. Register it with
/// [`RelayBuilder::transactional_consumer`](crate::RelayBuilder::transactional_consumer).
///
/// | all statements succeed | a constraint fails, a value has the wrong type or is too big, SQLite's JSON functions cannot read a value | any other error |
/// |---|---|---|
/// | delivered (committed with the ledger entry) | poison (it would fail the same way on every try) | retry (a table a migration has not made yet, a full disk, out of memory) |
///
/// SQLite reads JSON nested at most 1,000 deep, where outboxd sets no
/// limit: a deeper payload given to `json_extract` is poison ("malformed
/// JSON"). The payload and the envelope are bound as borrowed text, of
/// which SQLite keeps one copy (and makes one more to read it as text),
/// released when the statement is done.
///
/// Every outcome but delivered rolls back all the statements. A
/// statement that may see an event again (a replay) should say what
/// happens then: `INSERT OR REPLACE`, `ON CONFLICT … DO UPDATE`.
#[derive(Debug, Clone)]
pub struct SqlSink {
    statements: Vec<String>,
}

impl SqlSink {
    /// A sink running `statements` in order. Refuses an empty list, an
    /// empty statement and transaction control (`BEGIN`, `COMMIT`,
    /// `SAVEPOINT`, `ATTACH`…): outboxd owns the transaction. Whether each
    /// statement prepares is checked against a database by [`check`](Self::check).
    pub fn new<I, S>(statements: I) -> Result<SqlSink, SqlSinkError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let statements: Vec<String> = statements.into_iter().map(Into::into).collect();
        if statements.is_empty() {
            return Err(SqlSinkError::NoStatements);
        }
        for (i, sql) in statements.iter().enumerate() {
            let Some(word) = first_word(sql) else {
                return Err(SqlSinkError::at(i, "is empty; write one SQL statement"));
            };
            if REFUSED.iter().any(|r| r.eq_ignore_ascii_case(&word)) {
                return Err(SqlSinkError::at(
                    i,
                    format!(
                        "{} is not allowed: outboxd runs the statements inside its own \
                         transaction and commits them with the consumer's progress",
                        word.to_ascii_uppercase()
                    ),
                ));
            }
        }
        Ok(SqlSink { statements })
    }

    /// The statements, in order.
    pub fn statements(&self) -> &[String] {
        &self.statements
    }

    /// Prepares every statement on `conn` (nothing is run): each must be
    /// one statement that compiles against this database's tables, and use
    /// only the named [`PARAMETERS`]. A read-only connection will do.
    pub fn check(&self, conn: &Connection) -> Result<(), SqlSinkError> {
        for (i, sql) in self.statements.iter().enumerate() {
            let stmt = conn.prepare(sql).map_err(|e| match e {
                rusqlite::Error::MultipleStatement => SqlSinkError::at(
                    i,
                    "holds more than one statement; list each statement as its own string",
                ),
                e => SqlSinkError::at(i, format!("does not prepare: {}", sqlite_message(&e))),
            })?;
            for p in 1..=stmt.parameter_count() {
                match stmt.parameter_name(p) {
                    Some(name) if known(name) => {}
                    Some(name) => {
                        return Err(SqlSinkError::at(
                            i,
                            format!("uses the unknown parameter {name}; {}", parameter_list()),
                        ))
                    }
                    None => {
                        return Err(SqlSinkError::at(
                            i,
                            format!(
                                "uses a positional parameter (?); use named ones: {}",
                                parameter_list()
                            ),
                        ))
                    }
                }
            }
        }
        Ok(())
    }

    fn run(&self, tx: &Transaction<'_>, d: &Delivery) -> Result<(), (usize, rusqlite::Error)> {
        let payload = d.envelope.payload.get();
        // Built once a statement asks for it, and once per delivery.
        let mut envelope = None;
        for (i, sql) in self.statements.iter().enumerate() {
            let at = |e| (i, e);
            let mut stmt = tx.prepare_cached(sql).map_err(at)?;
            let ran = bind_and_run(&mut stmt, d, payload, &mut envelope);
            // A cached statement keeps the values bound to it until they are
            // bound anew: the payload would stay in memory after the delivery.
            stmt.clear_bindings();
            ran.map_err(at)?;
        }
        Ok(())
    }
}

/// Binds the delivery's values to `stmt`'s parameters (the payload and the
/// envelope as borrowed text: SQLite makes the one copy it keeps) and runs
/// it to its end.
fn bind_and_run(
    stmt: &mut rusqlite::CachedStatement<'_>,
    d: &Delivery,
    payload: &str,
    envelope: &mut Option<String>,
) -> rusqlite::Result<()> {
    for p in 1..=stmt.parameter_count() {
        let name = stmt.parameter_name(p).unwrap_or("").to_string();
        if name == ":envelope" && envelope.is_none() {
            let json = envelope_json(&d.envelope).map_err(|e| {
                rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_NOMEM),
                    Some(e.to_string()),
                )
            })?;
            // serde_json writes UTF-8 only.
            *envelope = String::from_utf8(json).ok();
        }
        // An unknown name cannot pass `check`; bound as NULL if one
        // reaches here (a sink built without a check).
        let value = value_of(&name, d, payload, envelope.as_deref())
            .unwrap_or(ToSqlOutput::Owned(Value::Null));
        stmt.raw_bind_parameter(p, value)?;
    }
    // Rows a statement returns (RETURNING) are read and dropped.
    let mut rows = stmt.raw_query();
    while rows.next()?.is_some() {}
    Ok(())
}

impl TransactionalConsumer for SqlSink {
    fn deliver(&self, tx: &Transaction<'_>, delivery: &Delivery) -> Outcome {
        match self.run(tx, delivery) {
            Ok(()) => Outcome::Delivered,
            Err((i, e)) => {
                let reason = format!("statement {i}: {}", sqlite_message(&e));
                let reason = clip(&reason, MAX_REASON_BYTES, Keep::Head).into_owned();
                if never_succeeds(&e) {
                    Outcome::poison(reason)
                } else {
                    Outcome::retry(reason)
                }
            }
        }
    }
}

/// SQLite's messages for a JSON value given to its JSON functions that
/// they can never read (SQLITE_ERROR, the code of many other errors): text
/// that is not JSON to SQLite, which includes JSON nested deeper than its
/// 1,000 levels (valid to outboxd, which sets no depth limit), and values
/// JSON cannot hold.
const UNREADABLE_JSON: &[&str] = &[
    "malformed JSON",
    "JSON nested too deep",
    "JSON cannot hold BLOB values",
    "json_object() labels must be TEXT",
];

/// Whether the error says the statement can never succeed for this event:
/// a constraint fails, a value's type or size is refused, or SQLite's JSON
/// functions cannot read a value. Any other error may pass (a table a
/// migration has not made yet, a full disk, memory).
fn never_succeeds(e: &rusqlite::Error) -> bool {
    match e.sqlite_error_code() {
        Some(ErrorCode::ConstraintViolation | ErrorCode::TypeMismatch | ErrorCode::TooBig) => true,
        Some(ErrorCode::Unknown) => {
            let message = sqlite_message(e);
            UNREADABLE_JSON.iter().any(|m| message.contains(m))
        }
        _ => false,
    }
}

/// The value a named parameter is bound to; None for an unknown name.
fn value_of<'a>(
    name: &str,
    d: &'a Delivery,
    payload: &'a str,
    envelope: Option<&'a str>,
) -> Option<ToSqlOutput<'a>> {
    let env = &d.envelope;
    let borrowed = |s: &'a str| ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes()));
    let text = |s: &'a Option<String>| {
        s.as_deref()
            .map_or(ToSqlOutput::Owned(Value::Null), borrowed)
    };
    let owned = ToSqlOutput::Owned;
    Some(match name {
        ":event_id" => owned(Value::Text(env.event_id.to_string())),
        ":event_type" => borrowed(env.event_type.as_str()),
        ":event_version" => owned(Value::Integer(i64::from(env.event_version))),
        ":tenant_id" => text(&d.tenant_id),
        ":ordering_key" => text(&d.ordering_key),
        ":causation_id" => text(&env.causation_id),
        ":correlation_id" => text(&env.correlation_id),
        ":occurred_at" => owned(Value::Text(env.occurred_at.to_string())),
        ":occurred_at_ms" => owned(Value::Integer(env.occurred_at.as_millis())),
        ":payload" => borrowed(payload),
        ":envelope" => envelope.map_or(owned(Value::Null), borrowed),
        ":consumer" => borrowed(&d.consumer),
        ":attempt" => owned(Value::Integer(i64::from(d.attempt))),
        ":legacy" => owned(Value::Integer(i64::from(d.legacy))),
        ":traceparent" => d.trace.as_ref().map_or(owned(Value::Null), |t| {
            owned(Value::Text(t.traceparent.to_string()))
        }),
        ":tracestate" => match d.trace.as_ref().and_then(|t| t.tracestate.as_ref()) {
            Some(s) => borrowed(s.as_str()),
            None => owned(Value::Null),
        },
        _ => return None,
    })
}

fn known(name: &str) -> bool {
    PARAMETERS.iter().any(|(p, _)| *p == name)
}

fn parameter_list() -> String {
    let names: Vec<&str> = PARAMETERS.iter().map(|(p, _)| *p).collect();
    format!("allowed: {}", names.join(", "))
}

/// SQLite's own message, without rusqlite's wrapping.
fn sqlite_message(e: &rusqlite::Error) -> String {
    match e {
        rusqlite::Error::SqliteFailure(_, Some(msg)) => msg.clone(),
        e => e.to_string(),
    }
}

/// The first word of a statement, past whitespace and comments; None when
/// there is no word.
fn first_word(sql: &str) -> Option<String> {
    let mut rest = sql;
    loop {
        rest = rest.trim_start();
        if let Some(r) = rest.strip_prefix("--") {
            rest = r.split_once('\n').map_or("", |(_, after)| after);
        } else if let Some(r) = rest.strip_prefix("/*") {
            rest = r.split_once("*/").map_or("", |(_, after)| after);
        } else {
            break;
        }
    }
    let word: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect();
    (!word.is_empty()).then_some(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_word_skips_whitespace_and_comments() {
        assert_eq!(first_word("  insert into t"), Some("insert".into()));
        assert_eq!(
            first_word("-- why\n /* how */ COMMIT"),
            Some("COMMIT".into())
        );
        assert_eq!(first_word("/* only a comment */"), None);
        assert_eq!(first_word("   "), None);
    }

    #[test]
    fn transaction_control_and_empty_statements_are_refused_by_position() {
        for bad in [
            "commit",
            "  /* x */ ROLLBACK TO s",
            "savepoint a",
            "ATTACH 'x' AS y",
            "END",
        ] {
            let e = SqlSink::new(["INSERT INTO t VALUES (1)", bad]).unwrap_err();
            assert_eq!(e.index(), Some(1), "{bad}");
            assert!(e.reason().contains("is not allowed"), "{e}");
        }
        assert_eq!(SqlSink::new(["", "x"]).unwrap_err().index(), Some(0));
        assert_eq!(
            SqlSink::new(Vec::<String>::new()).unwrap_err(),
            SqlSinkError::NoStatements
        );
    }

    #[test]
    fn check_names_the_statement_and_what_is_wrong() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("CREATE TABLE t (a TEXT, b TEXT)")
            .unwrap();
        let ok = "INSERT INTO t VALUES (:event_id, json_extract(:payload, '$.x'))";
        let cases = [
            ("INSERT INTO nope VALUES (1)", "no such table: nope"),
            (
                "INSERT INTO t VALUES (:event_idd, 1)",
                "unknown parameter :event_idd",
            ),
            ("INSERT INTO t VALUES (?, 1)", "positional parameter"),
            (
                "INSERT INTO t VALUES (1, 2); INSERT INTO t VALUES (3, 4)",
                "more than one statement",
            ),
        ];
        for (bad, want) in cases {
            let e = SqlSink::new([ok, bad]).unwrap().check(&conn).unwrap_err();
            assert_eq!(e.index(), Some(1), "{bad}");
            assert!(e.reason().contains(want), "{bad}: {e}");
        }
        SqlSink::new([ok]).unwrap().check(&conn).unwrap();
        for (name, _) in PARAMETERS {
            SqlSink::new([format!("SELECT {name}")])
                .unwrap()
                .check(&conn)
                .unwrap();
        }
    }
}
