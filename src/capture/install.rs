//! Installing and removing capture triggers, and recording what was
//! installed (`outboxd_capture`, `outboxd_capture_object`).

use std::collections::BTreeMap;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde::Serialize;

use super::generate::{event_objects, Plan, SqlObject, EVENT_VIEW, TRIGGER_PREFIX};
use super::resolve::resolve;
use super::spec::{CaptureSpec, Operation};
use super::sqltext::ident;
use super::CaptureError;
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::schema;

/// What [`apply`] did to one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    /// Its triggers were installed for the first time.
    Installed,
    /// Its triggers were replaced (the definition or the table changed, or
    /// they had drifted).
    Updated,
    /// Its triggers were already installed exactly as the definition says.
    Unchanged,
}

/// One table in an [`ApplyReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableChange {
    /// The table, as SQLite spells it.
    pub table: String,
    /// What happened.
    pub change: Change,
    /// The triggers it has now.
    pub triggers: Vec<String>,
}

/// What [`apply`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ApplyReport {
    /// One entry per captured table, in the order given.
    pub tables: Vec<TableChange>,
    /// Things that work, but not as one might assume (a REPLACE that
    /// deletes a row through an expression index makes no delete event).
    pub warnings: Vec<String>,
}

impl ApplyReport {
    /// True when nothing was written.
    pub fn unchanged(&self) -> bool {
        self.tables.iter().all(|t| t.change == Change::Unchanged)
    }
}

/// Installs (or updates) the triggers of every spec in one `BEGIN
/// IMMEDIATE` transaction, and records them. Idempotent: a capture already
/// installed as its spec says is left alone. Every spec is checked against
/// its table first; a table or column that does not exist, a key that is not
/// unique or a condition that does not compile is an error naming it, and
/// nothing is changed. Captures installed earlier but absent from `specs`
/// are kept (remove them with [`remove`]).
pub fn apply(conn: &mut Connection, specs: &[CaptureSpec], now: Timestamp) -> Result<ApplyReport> {
    schema::ensure_current(conn)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(Error::db("start installing capture triggers"))?;
    let mut plans: Vec<Plan> = Vec::new();
    for spec in specs {
        let plan = resolve(&tx, spec)?;
        if plans
            .iter()
            .any(|p| p.table.name.eq_ignore_ascii_case(&plan.table.name))
        {
            return Err(CaptureError::DuplicateTable {
                table: plan.table.name.clone(),
            }
            .into());
        }
        plans.push(plan);
    }
    let mut report = ApplyReport::default();
    if !plans.is_empty() && install(&tx, "", &event_objects())? {
        check_compiles(
            &tx,
            EVENT_VIEW,
            Operation::Insert,
            &format!("INSERT INTO {EVENT_VIEW} (event_type, payload) VALUES ('outboxd.check.v1', '{{}}')"),
        )?;
    }
    for plan in &plans {
        let triggers = plan.triggers();
        let spec_json = serde_json::to_string(&plan.spec).expect("a spec serializes");
        let recorded_spec: Option<String> = tx
            .query_row(
                "SELECT spec FROM outboxd_capture WHERE table_name = ?1",
                [&plan.table.name],
                |r| r.get(0),
            )
            .optional()
            .map_err(Error::db("read the recorded captures"))?;
        let changed = install(&tx, &plan.table.name, &triggers)?;
        if changed {
            compile_check(&tx, plan)?;
        }
        let change = match (&recorded_spec, changed) {
            (None, _) => Change::Installed,
            (Some(s), false) if *s == spec_json => Change::Unchanged,
            _ => Change::Updated,
        };
        tx.execute(
            "INSERT INTO outboxd_capture (table_name, spec, installed_at, verified_at)
             VALUES (?1, ?2, ?3, ?3)
             ON CONFLICT (table_name) DO UPDATE SET
                 spec = excluded.spec,
                 installed_at = CASE WHEN ?4 THEN excluded.installed_at ELSE installed_at END,
                 verified_at = excluded.verified_at",
            params![plan.table.name, spec_json, now.as_millis(), changed],
        )
        .map_err(Error::db("record a capture"))?;
        if plan.handles_replace() {
            for u in &plan.table.unmatched {
                report.warnings.push(format!(
                    "{}: unique index {} is {}: a REPLACE that deletes a row only through it makes \
                     no delete event",
                    plan.table.name, u.name, u.why
                ));
            }
        }
        report.tables.push(TableChange {
            table: plan.table.name.clone(),
            change,
            triggers: triggers.into_iter().map(|t| t.name).collect(),
        });
    }
    tx.commit()
        .map_err(Error::db("commit the capture triggers"))?;
    Ok(report)
}

/// Which captures [`remove`] takes away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removal {
    /// The capture of one table.
    Table(String),
    /// Every capture, and the shared event view and its trigger.
    All,
}

/// What [`remove`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RemoveReport {
    /// The tables no longer captured.
    pub tables: Vec<String>,
    /// The triggers dropped.
    pub triggers: Vec<String>,
}

/// Drops capture triggers and their records in one `BEGIN IMMEDIATE`
/// transaction. Removing the last capture also removes the shared event
/// view and its trigger. A table that is not captured is
/// [`Error::NotFound`].
pub fn remove(conn: &mut Connection, which: &Removal) -> Result<RemoveReport> {
    schema::ensure_current(conn)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(Error::db("start removing capture triggers"))?;
    let recorded: Vec<String> = {
        let mut stmt = tx
            .prepare("SELECT table_name FROM outboxd_capture ORDER BY table_name")
            .map_err(Error::db("read the recorded captures"))?;
        let rows = stmt
            .query_map([], |r| r.get(0))
            .map_err(Error::db("read the recorded captures"))?;
        rows.collect::<rusqlite::Result<_>>()
            .map_err(Error::db("read the recorded captures"))?
    };
    let installed = installed_objects(&tx)?;
    let on_a_table = |o: &Installed| o.kind == "trigger" && !is_shared(o);
    let mut report = RemoveReport::default();
    let tables: Vec<String> = match which {
        Removal::All => {
            let mut all = recorded.clone();
            for o in installed.values().filter(|o| on_a_table(o)) {
                if !all.iter().any(|a| a.eq_ignore_ascii_case(&o.on)) {
                    all.push(o.on.clone());
                }
            }
            all
        }
        Removal::Table(t) => {
            let on_table = recorded
                .iter()
                .find(|r| r.eq_ignore_ascii_case(t))
                .cloned()
                .or_else(|| {
                    installed
                        .values()
                        .filter(|o| on_a_table(o))
                        .map(|o| &o.on)
                        .find(|table| table.eq_ignore_ascii_case(t))
                        .cloned()
                });
            match on_table {
                Some(name) => vec![name],
                None => {
                    return Err(Error::NotFound {
                        what: format!("a capture of table {t:?}"),
                    })
                }
            }
        }
    };
    for table in &tables {
        report
            .triggers
            .extend(drop_objects(&tx, table, &installed)?);
        tx.execute("DELETE FROM outboxd_capture WHERE table_name = ?1", [table])
            .map_err(Error::db("forget a capture"))?;
        tx.execute(
            "DELETE FROM outboxd_capture_replaced WHERE table_name = ?1",
            [table],
        )
        .map_err(Error::db("forget a capture"))?;
        report.tables.push(table.clone());
    }
    let left: i64 = tx
        .query_row("SELECT count(*) FROM outboxd_capture", [], |r| r.get(0))
        .map_err(Error::db("read the recorded captures"))?;
    if left == 0 {
        report.triggers.extend(drop_objects(&tx, "", &installed)?);
    }
    tx.commit()
        .map_err(Error::db("commit removing capture triggers"))?;
    Ok(report)
}

/// The SQL a spec would install, checked against its table but not
/// installed: the shared event view and its trigger, then the table's
/// triggers.
pub fn preview(conn: &Connection, spec: &CaptureSpec) -> Result<Vec<SqlObject>> {
    let mut out = event_objects().to_vec();
    out.extend(resolve(conn, spec)?.triggers());
    Ok(out)
}

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
fn is_shared(o: &Installed) -> bool {
    [EVENT_VIEW, "event_outbox", "outboxd_capture_replaced"]
        .iter()
        .any(|v| o.on.eq_ignore_ascii_case(v))
}

/// The objects recorded for `table` ('' for the shared ones): name → SQL.
pub(crate) fn recorded_objects(conn: &Connection, table: &str) -> Result<BTreeMap<String, String>> {
    let mut stmt = conn
        .prepare("SELECT name, sql FROM outboxd_capture_object WHERE table_name = ?1")
        .map_err(Error::db("read the recorded capture triggers"))?;
    let rows = stmt
        .query_map([table], |r| Ok((r.get(0)?, r.get(1)?)))
        .map_err(Error::db("read the recorded capture triggers"))?;
    rows.collect::<rusqlite::Result<_>>()
        .map_err(Error::db("read the recorded capture triggers"))
}

/// Drops the objects of `table` ('' for the shared ones), recorded or
/// found on it, and their records. Returns their names.
fn drop_objects(
    conn: &Connection,
    table: &str,
    installed: &BTreeMap<String, Installed>,
) -> Result<Vec<String>> {
    let mut names: Vec<String> = recorded_objects(conn, table)?.into_keys().collect();
    for (name, o) in installed {
        let belongs = if table.is_empty() {
            is_shared(o)
        } else {
            o.kind == "trigger" && o.on.eq_ignore_ascii_case(table)
        };
        if belongs && !names.contains(name) {
            names.push(name.clone());
        }
    }
    // Triggers first: dropping a view drops its triggers with it.
    names.sort_by_key(|n| installed.get(n).is_some_and(|o| o.kind == "view"));
    for name in &names {
        let kind = match installed.get(name) {
            Some(o) if o.kind == "view" => "VIEW",
            _ => "TRIGGER",
        };
        conn.execute_batch(&format!("DROP {kind} IF EXISTS {}", ident(name)))
            .map_err(Error::db("drop a capture trigger"))?;
    }
    conn.execute(
        "DELETE FROM outboxd_capture_object WHERE table_name = ?1",
        [table],
    )
    .map_err(Error::db("forget a capture trigger"))?;
    Ok(names)
}

/// Makes `table`'s capture objects ('' for the shared ones) exactly
/// `wanted`; returns false when they already were (recorded and installed
/// as generated).
fn install(conn: &Connection, table: &str, wanted: &[SqlObject]) -> Result<bool> {
    let installed = installed_objects(conn)?;
    let recorded = recorded_objects(conn, table)?;
    let same = recorded.len() == wanted.len()
        && wanted.iter().all(|t| {
            recorded.get(&t.name) == Some(&t.sql)
                && installed
                    .get(&t.name)
                    .is_some_and(|o| o.kind == t.kind && o.sql == t.sql)
        })
        && (table.is_empty()
            || installed
                .values()
                .filter(|o| o.kind == "trigger" && o.on.eq_ignore_ascii_case(table))
                .count()
                == wanted.len());
    if same {
        return Ok(false);
    }
    drop_objects(conn, table, &installed)?;
    for t in wanted {
        conn.execute_batch(&t.sql).map_err(|e| {
            Error::from(CaptureError::DoesNotCompile {
                table: if table.is_empty() { EVENT_VIEW } else { table }.to_string(),
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
            "INSERT INTO outboxd_capture_object (name, type, table_name, sql) VALUES (?1, ?2, ?3, ?4)",
            params![t.name, t.kind, table, stored],
        )
        .map_err(Error::db("record a capture trigger"))?;
    }
    Ok(true)
}

/// Compiles a statement of each kind on the table without running it:
/// SQLite compiles triggers only then, so an error in one (a `when` naming a
/// column that does not exist, NEW in a delete's condition) would otherwise
/// surface as a failure of the host's next write.
fn compile_check(conn: &Connection, plan: &Plan) -> Result<()> {
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

fn check_compiles(conn: &Connection, table: &str, op: Operation, sql: &str) -> Result<()> {
    conn.prepare(sql).map(drop).map_err(|e| {
        CaptureError::DoesNotCompile {
            table: table.to_string(),
            operation: Some(op),
            message: e.to_string(),
        }
        .into()
    })
}
