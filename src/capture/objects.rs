//! The triggers and views a capture owns, as SQLite holds them and as
//! outboxd recorded them (`outboxd_capture_object`): reading, creating and
//! dropping them.

use std::collections::BTreeMap;

use rusqlite::{params, Connection, OptionalExtension};

use super::generate::{Plan, SqlObject, EVENT_VIEW, KINDS, TRIGGER_PREFIX};
use super::spec::Operation;
use super::sqltext::ident;
use super::CaptureError;
use crate::error::{Error, Result};

/// A trigger or view named like capture's, as sqlite_master holds it.
#[derive(Debug, Clone)]
pub(crate) struct Installed {
    /// `trigger` or `view`.
    pub kind: String,
    /// The table (or view) it is on; a view's own name for a view.
    pub on: String,
    /// Its SQL.
    pub sql: String,
}

/// Every trigger and view named like capture's, by name.
pub(crate) fn installed_objects(conn: &Connection) -> Result<BTreeMap<String, Installed>> {
    let mut stmt = conn
        .prepare(
            "SELECT name, type, tbl_name, sql FROM sqlite_master
             WHERE type IN ('trigger', 'view') AND substr(name, 1, ?1) = ?2",
        )
        .map_err(Error::db("read the installed capture triggers"))?;
    let rows = stmt
        .query_map(params![TRIGGER_PREFIX.len() as i64, TRIGGER_PREFIX], |r| {
            Ok((
                r.get(0)?,
                Installed {
                    kind: r.get(1)?,
                    on: r.get(2)?,
                    sql: r.get::<_, Option<String>>(3)?.unwrap_or_default(),
                },
            ))
        })
        .map_err(Error::db("read the installed capture triggers"))?;
    rows.collect::<rusqlite::Result<_>>()
        .map_err(Error::db("read the installed capture triggers"))
}

/// True for the shared view and triggers (on the view and on outboxd's own
/// tables, which cannot be captured).
pub(crate) fn is_shared(o: &Installed) -> bool {
    [EVENT_VIEW, "event_outbox", "outboxd_capture_replaced"]
        .iter()
        .any(|v| o.on.eq_ignore_ascii_case(v))
}

/// True when `name` is the name of one of the triggers capture `owner`
/// would install (`outboxd_capture_<kind>_<owner>`).
pub(crate) fn named_for(name: &str, owner: &str) -> bool {
    KINDS
        .iter()
        .any(|k| name.eq_ignore_ascii_case(&format!("{TRIGGER_PREFIX}{k}_{owner}")))
}

/// The objects recorded for capture `owner` ('' for the shared ones): name
/// → SQL.
pub(crate) fn recorded_objects(conn: &Connection, owner: &str) -> Result<BTreeMap<String, String>> {
    let mut stmt = conn
        .prepare("SELECT name, sql FROM outboxd_capture_object WHERE capture_name = ?1")
        .map_err(Error::db("read the recorded capture triggers"))?;
    let rows = stmt
        .query_map([owner], |r| Ok((r.get(0)?, r.get(1)?)))
        .map_err(Error::db("read the recorded capture triggers"))?;
    rows.collect::<rusqlite::Result<_>>()
        .map_err(Error::db("read the recorded capture triggers"))
}

/// Drops the objects of capture `owner` of `table` ('' and '' for the
/// shared ones), recorded or installed on the table under its names, and
/// their records. Returns their names.
pub(crate) fn drop_objects(
    conn: &Connection,
    owner: &str,
    table: &str,
    installed: &BTreeMap<String, Installed>,
) -> Result<Vec<String>> {
    let mut names: Vec<String> = recorded_objects(conn, owner)?.into_keys().collect();
    for (name, o) in installed {
        let belongs = if owner.is_empty() {
            is_shared(o)
        } else {
            o.kind == "trigger" && named_for(name, owner) && o.on.eq_ignore_ascii_case(table)
        };
        if belongs && !names.iter().any(|n| n.eq_ignore_ascii_case(name)) {
            names.push(name.clone());
        }
    }
    drop_named(conn, &names, installed)?;
    conn.execute(
        "DELETE FROM outboxd_capture_object WHERE capture_name = ?1",
        [owner],
    )
    .map_err(Error::db("forget a capture trigger"))?;
    Ok(names)
}

/// Drops the triggers and views called `names`.
pub(crate) fn drop_named(
    conn: &Connection,
    names: &[String],
    installed: &BTreeMap<String, Installed>,
) -> Result<()> {
    let mut names = names.to_vec();
    // Triggers first: dropping a view drops its triggers with it.
    names.sort_by_key(|n| installed.get(n).is_some_and(|o| o.kind == "view"));
    for name in &names {
        let kind = match installed.get(name) {
            Some(o) if o.kind == "view" => "VIEW",
            _ => "TRIGGER",
        };
        conn.execute(&format!("DROP {kind} IF EXISTS {}", ident(name)), [])
            .map_err(Error::db("drop a capture trigger"))?;
    }
    Ok(())
}

/// Which of capture `owner`'s recorded objects are not installed as
/// recorded: (missing, changed) names.
pub(crate) fn damaged(
    conn: &Connection,
    owner: &str,
    installed: &BTreeMap<String, Installed>,
) -> Result<(Vec<String>, Vec<String>)> {
    let mut missing = Vec::new();
    let mut changed = Vec::new();
    for (name, sql) in recorded_objects(conn, owner)? {
        match installed.get(&name) {
            None => missing.push(name),
            Some(o) if o.sql != sql => changed.push(name),
            Some(_) => {}
        }
    }
    Ok((missing, changed))
}

/// Makes the objects of capture `owner` of `table` ('' and '' for the
/// shared ones) exactly `wanted`; returns false when they already were
/// (recorded and installed as generated).
pub(crate) fn install(
    conn: &Connection,
    owner: &str,
    table: &str,
    wanted: &[SqlObject],
) -> Result<bool> {
    let installed = installed_objects(conn)?;
    let recorded = recorded_objects(conn, owner)?;
    let same = recorded.len() == wanted.len()
        && wanted.iter().all(|t| {
            recorded.get(&t.name) == Some(&t.sql)
                && installed
                    .get(&t.name)
                    .is_some_and(|o| o.kind == t.kind && o.sql == t.sql)
        })
        && (owner.is_empty()
            || installed
                .iter()
                .filter(|(n, o)| {
                    o.kind == "trigger" && named_for(n, owner) && o.on.eq_ignore_ascii_case(table)
                })
                .count()
                == wanted.len());
    if same {
        return Ok(false);
    }
    drop_objects(conn, owner, table, &installed)?;
    let label = if owner.is_empty() { EVENT_VIEW } else { owner };
    for t in wanted {
        // Not taken by an object capture does not own (what it owned was
        // dropped just now): a host's trigger, or one recorded for another
        // capture by an outboxd that named them differently.
        let taken: Option<String> = conn
            .query_row(
                "SELECT tbl_name FROM sqlite_master WHERE name = ?1 COLLATE NOCASE",
                [&t.name],
                |r| r.get(0),
            )
            .optional()
            .map_err(Error::db("look for a capture trigger's name"))?;
        if let Some(on) = taken {
            return Err(CaptureError::NameTaken {
                table: label.to_string(),
                name: t.name.clone(),
                on,
            }
            .into());
        }
        // One statement each: `execute` refuses SQL with a second statement
        // after the first (execute_batch would run it).
        conn.execute(&t.sql, []).map_err(|e| {
            Error::from(CaptureError::DoesNotCompile {
                table: label.to_string(),
                operation: None,
                message: e.to_string(),
            })
        })?;
        // Record the text as SQLite stores it, which is what drift checks
        // compare against.
        let stored: String = conn
            .query_row(
                "SELECT sql FROM sqlite_master WHERE type = ?1 AND name = ?2",
                [t.kind, &t.name],
                |r| r.get(0),
            )
            .map_err(Error::db("read back a capture trigger"))?;
        conn.execute(
            "INSERT INTO outboxd_capture_object (name, type, capture_name, sql) VALUES (?1, ?2, ?3, ?4)",
            params![t.name, t.kind, owner, stored],
        )
        .map_err(Error::db("record a capture trigger"))?;
    }
    Ok(true)
}

/// Compiles a statement of each kind on the table without running it:
/// SQLite compiles triggers only then, so an error in one (a `when` naming a
/// column that does not exist, NEW in a delete's condition) would otherwise
/// surface as a failure of the host's next write.
pub(crate) fn compile_check(conn: &Connection, plan: &Plan) -> Result<()> {
    let t = ident(&plan.table.name);
    let settable = plan
        .table
        .columns
        .iter()
        .find(|c| !c.generated)
        .map(|c| ident(&c.name))
        .expect("a table has a column that is not generated");
    check_compiles(
        conn,
        &plan.table.name,
        Operation::Insert,
        &format!("INSERT INTO {t} DEFAULT VALUES"),
    )?;
    check_compiles(
        conn,
        &plan.table.name,
        Operation::Update,
        &format!("UPDATE {t} SET {settable} = {settable}"),
    )?;
    check_compiles(
        conn,
        &plan.table.name,
        Operation::Delete,
        &format!("DELETE FROM {t}"),
    )
}

/// Prepares `sql` (runs nothing), or says the triggers do not compile.
pub(crate) fn check_compiles(
    conn: &Connection,
    table: &str,
    op: Operation,
    sql: &str,
) -> Result<()> {
    conn.prepare(sql).map(drop).map_err(|e| {
        CaptureError::DoesNotCompile {
            table: table.to_string(),
            operation: Some(op),
            message: e.to_string(),
        }
        .into()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_is_created_by_one_statement_and_never_more() {
        let mut conn = rusqlite::Connection::open_in_memory().unwrap();
        crate::schema::migrate(&mut conn).unwrap();
        conn.execute_batch("CREATE TABLE pages (id INTEGER PRIMARY KEY); CREATE TABLE victim (x)")
            .unwrap();
        let sneaky = SqlObject {
            name: "outboxd_capture_insert_pages".into(),
            kind: "trigger",
            table: "pages".into(),
            sql: "CREATE TRIGGER outboxd_capture_insert_pages AFTER INSERT ON pages BEGIN SELECT 1; END; \
                  DROP TABLE victim"
                .into(),
        };
        let e = install(&conn, "pages", "pages", &[sneaky]).unwrap_err();
        assert!(e.to_string().contains("pages"), "{e}");
        let victim: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE name = 'victim'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(victim, 1, "the second statement did not run");
    }
}
