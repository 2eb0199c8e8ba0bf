//! A [`CaptureSpec`] checked against its table: every name it uses exists,
//! the key is unique, the defaults are filled in.

use std::collections::BTreeMap;

use rusqlite::Connection;

use super::generate::Plan;
use super::spec::{template_parts, CaptureSpec, Columns, Operation, TemplatePart, When};
use super::sqltext::{check_expression, ident};
use super::table::Table;
use super::CaptureError;
use crate::error::Error;

/// Resolves a spec against the table it names, or says which name is wrong.
pub(crate) fn resolve(conn: &Connection, spec: &CaptureSpec) -> Result<Plan, Error> {
    spec.validate()?;
    let table = Table::read(conn, &spec.table)?;
    let column = |field: &'static str, name: &str| -> Result<String, Error> {
        table.column(name).map(|c| c.name.clone()).ok_or_else(|| {
            CaptureError::NoSuchColumn {
                table: table.name.clone(),
                field,
                column: name.to_string(),
            }
            .into()
        })
    };

    let columns: Vec<String> = match &spec.columns {
        Columns::All => table.columns.iter().map(|c| c.name.clone()).collect(),
        Columns::List(names) => {
            let mut out: Vec<String> = Vec::new();
            for n in names {
                let c = column("columns", n)?;
                if out.iter().any(|o| o.eq_ignore_ascii_case(&c)) {
                    return Err(CaptureError::Invalid {
                        table: table.name.clone(),
                        field: "columns",
                        reason: format!("{c:?} is listed twice"),
                    }
                    .into());
                }
                out.push(c);
            }
            out
        }
    };

    let is_rowid_name = |n: &str| {
        table
            .rowid
            .as_deref()
            .is_some_and(|r| r.eq_ignore_ascii_case(n))
    };
    let (key, key_is_rowid) = match &spec.key {
        Some(names) if names.len() == 1 && is_rowid_name(&names[0]) => {
            (vec![table.rowid.clone().expect("checked")], true)
        }
        Some(names) => {
            let mut key = Vec::new();
            for n in names {
                key.push(column("key", n)?);
            }
            let same = |cols: &[String]| {
                cols.len() == key.len()
                    && cols
                        .iter()
                        .all(|c| key.iter().any(|k| k.eq_ignore_ascii_case(c)))
            };
            let unique = same(&table.primary_key)
                || table
                    .unique
                    .iter()
                    .any(|u| same(&u.columns.iter().map(|(c, _)| c.clone()).collect::<Vec<_>>()));
            if !unique {
                return Err(CaptureError::KeyNotUnique {
                    table: table.name.clone(),
                    key: key.join(", "),
                }
                .into());
            }
            (key, false)
        }
        None if !table.primary_key.is_empty() => (table.primary_key.clone(), false),
        None => (
            vec![table
                .rowid
                .clone()
                .expect("a table without a primary key has a rowid")],
            true,
        ),
    };

    let tenant = match &spec.tenant_column {
        Some(t) => Some(column("tenant_column", t)?),
        None => None,
    };

    let ordering = template_parts(spec.ordering_key_template())
        .map_err(|reason| CaptureError::Invalid {
            table: table.name.clone(),
            field: "ordering_key",
            reason,
        })?
        .into_iter()
        .map(|p| match p {
            TemplatePart::Column(c) => column("ordering_key", &c).map(TemplatePart::Column),
            other => Ok(other),
        })
        .collect::<Result<Vec<_>, Error>>()?;

    let operations = spec.operations();
    if let Some(when) = &spec.when {
        check_when(conn, &table, when, &operations)?;
    }
    let mut event_types = BTreeMap::new();
    for op in &operations {
        event_types.insert(*op, spec.event_type_for(*op)?.to_string());
    }
    let name = spec.name.clone().unwrap_or_else(|| table.name.clone());
    let plan = Plan {
        spec: spec.clone(),
        name,
        table,
        columns,
        key,
        key_is_rowid,
        tenant,
        ordering,
        operations,
        event_types,
    };
    plan.check_bound().map_err(|reason| CaptureError::Invalid {
        table: plan.table.name.clone(),
        field: "max_payload_bytes",
        reason,
    })?;
    Ok(plan)
}

/// Checks every `when` condition before it is pasted into a trigger: each
/// is one expression that cannot reach outside its parentheses
/// ([`check_expression`]), and each condition of a captured operation
/// compiles as a condition on the rows that operation has (an insert has
/// only NEW, a delete only OLD). The check compiles a `SELECT` over the
/// table under those names and runs nothing; a text that makes more than
/// one statement is refused by rusqlite's `prepare` as well.
fn check_when(
    conn: &Connection,
    table: &Table,
    when: &When,
    captured: &[Operation],
) -> Result<(), Error> {
    for op in Operation::ALL {
        let Some(cond) = when.for_operation(op) else {
            continue;
        };
        let field = match when {
            When::All(_) => "when",
            When::PerOperation { .. } => match op {
                Operation::Insert => "when.insert",
                Operation::Update => "when.update",
                Operation::Delete => "when.delete",
            },
        };
        let invalid = |reason: String| CaptureError::Invalid {
            table: table.name.clone(),
            field,
            reason,
        };
        check_expression(cond).map_err(invalid)?;
        if !captured.contains(&op) {
            continue;
        }
        let t = ident(&table.name);
        let rows = match op {
            Operation::Insert => format!("{t} AS new"),
            Operation::Update => format!("{t} AS new, {t} AS old"),
            Operation::Delete => format!("{t} AS old"),
        };
        match conn.prepare(&format!("SELECT ({cond}) FROM {rows}")) {
            Ok(_) => {}
            Err(rusqlite::Error::MultipleStatement) => {
                return Err(invalid(
                    "it makes more than one statement: it must be one SQL condition".into(),
                )
                .into())
            }
            Err(e) => {
                return Err(CaptureError::DoesNotCompile {
                    table: table.name.clone(),
                    operation: Some(op),
                    message: e.to_string(),
                }
                .into())
            }
        }
    }
    Ok(())
}
