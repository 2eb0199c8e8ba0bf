//! Installing and removing capture triggers, and recording what was
//! installed (`outboxd_capture`, `outboxd_capture_object`) and what a
//! reinstall ended (`outboxd_capture_gap`).

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use serde::Serialize;

use super::gap::{self, Gap, GapEnd};
use super::generate::{event_objects, Plan, EVENT_VIEW};
use super::objects::{
    check_compiles, compile_check, damaged, drop_named, drop_objects, install, installed_objects,
    is_shared, named_for, recorded_objects,
};
use super::resolve::resolve;
use super::spec::{CaptureSpec, Operation};
use super::CaptureError;
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::schema;

/// What [`apply`] did to one capture.
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

/// One capture in an [`ApplyReport`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct TableChange {
    /// The capture's name.
    pub name: String,
    /// The table, as SQLite spells it.
    pub table: String,
    /// What happened.
    pub change: Change,
    /// The triggers it has now.
    pub triggers: Vec<String>,
    /// The triggers that were missing before and are back now.
    pub reinstalled: Vec<String>,
    /// The triggers that had been rewritten (by an `ALTER TABLE`) and were
    /// replaced.
    pub replaced: Vec<String>,
    /// Why it was updated, when it was: the settings that changed.
    pub reason: Option<String>,
}

/// What [`apply`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct ApplyReport {
    /// One entry per capture, in the order given.
    pub tables: Vec<TableChange>,
    /// The shared view and its triggers, when they were installed or
    /// reinstalled (None: already installed as they should be).
    pub shared: Option<Change>,
    /// The gaps this apply ended (triggers that were missing): writes made
    /// while they were may not have become events.
    pub gaps: Vec<Gap>,
    /// Things that work, but not as one might assume (a REPLACE that
    /// deletes a row through an expression index makes no delete event).
    pub warnings: Vec<String>,
}

impl ApplyReport {
    /// True when nothing was written.
    pub fn unchanged(&self) -> bool {
        self.shared.is_none() && self.tables.iter().all(|t| t.change == Change::Unchanged)
    }
}

/// Installs (or updates) the triggers of every spec in one `BEGIN
/// IMMEDIATE` transaction, and records them. Idempotent: a capture already
/// installed as its spec says is left alone. Every spec is checked against
/// its table first; a table or column that does not exist, a key that is not
/// unique or a condition that does not compile is an error naming it, and
/// nothing is changed. Captures installed earlier but absent from `specs`
/// are kept (remove them with [`remove`]). Names are assigned as
/// [`assign_names`](super::assign_names) does; two captures with one name
/// are an error. A capture whose triggers were missing gets a gap record
/// (ended by `apply`).
pub fn apply(conn: &mut Connection, specs: &[CaptureSpec], now: Timestamp) -> Result<ApplyReport> {
    apply_as(conn, specs, now, GapEnd::Apply)
}

/// [`apply`], recording the gaps it ends as ended by `by` (`run`'s
/// `auto_repair` says [`GapEnd::Repair`]).
pub fn apply_as(
    conn: &mut Connection,
    specs: &[CaptureSpec],
    now: Timestamp,
    by: GapEnd,
) -> Result<ApplyReport> {
    schema::ensure_current(conn)?;
    let mut specs = specs.to_vec();
    super::spec::assign_names(&mut specs);
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(Error::db("start installing capture triggers"))?;
    let mut plans: Vec<Plan> = Vec::new();
    for spec in &specs {
        let plan = resolve(&tx, spec)?;
        if plans
            .iter()
            .any(|p| p.name.eq_ignore_ascii_case(&plan.name))
        {
            return Err(CaptureError::DuplicateName {
                table: plan.table.name.clone(),
                name: plan.name.clone(),
            }
            .into());
        }
        plans.push(plan);
    }
    let mut report = ApplyReport::default();
    if !plans.is_empty() {
        let had = !recorded_objects(&tx, "")?.is_empty();
        if install(&tx, "", "", &event_objects())? {
            check_compiles(
                &tx,
                EVENT_VIEW,
                Operation::Insert,
                &format!("INSERT INTO {EVENT_VIEW} (event_type, payload) VALUES ('outboxd.check.v1', '{{}}')"),
            )?;
            report.shared = Some(if had {
                Change::Updated
            } else {
                Change::Installed
            });
        }
    }
    for plan in &plans {
        let triggers = plan.triggers();
        let spec_json = serde_json::to_string(&plan.spec).expect("a spec serializes");
        let recorded: Option<(String, i64)> = tx
            .query_row(
                "SELECT spec, verified_at FROM outboxd_capture WHERE name = ?1",
                [&plan.name],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .map_err(Error::db("read the recorded captures"))?;
        let installed = installed_objects(&tx)?;
        let (missing, replaced) = damaged(&tx, &plan.name, &installed)?;
        let changed = install(&tx, &plan.name, &plan.table.name, &triggers)?;
        if changed {
            compile_check(&tx, plan)?;
        }
        let change = match (&recorded, changed) {
            (None, _) => Change::Installed,
            (Some((s, _)), false) if *s == spec_json => Change::Unchanged,
            _ => Change::Updated,
        };
        let reason = match &recorded {
            Some((s, _)) if change == Change::Updated => {
                super::compare::spec_difference(s, &plan.spec)
                    .map(|d| format!("the config sets {d}"))
                    .or_else(|| {
                        (missing.is_empty() && replaced.is_empty()).then(|| {
                            "the table changed, or this outboxd writes different triggers".into()
                        })
                    })
            }
            _ => None,
        };
        if let (Some((_, verified_at)), false) = (&recorded, missing.is_empty()) {
            report.gaps.push(gap::record(
                &tx,
                &plan.name,
                &plan.table.name,
                Timestamp::from_millis(*verified_at),
                now,
                by,
            )?);
        }
        tx.execute(
            "INSERT INTO outboxd_capture (name, table_name, spec, installed_at, verified_at)
             VALUES (?1, ?2, ?3, ?4, ?4)
             ON CONFLICT (name) DO UPDATE SET
                 table_name = excluded.table_name,
                 spec = excluded.spec,
                 installed_at = CASE WHEN ?5 THEN excluded.installed_at ELSE installed_at END,
                 verified_at = excluded.verified_at",
            params![
                plan.name,
                plan.table.name,
                spec_json,
                now.as_millis(),
                changed
            ],
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
            name: plan.name.clone(),
            table: plan.table.name.clone(),
            change,
            triggers: triggers.into_iter().map(|t| t.name).collect(),
            reinstalled: if changed { missing } else { Vec::new() },
            replaced: if changed { replaced } else { Vec::new() },
            reason,
        });
    }
    tx.commit()
        .map_err(Error::db("commit the capture triggers"))?;
    Ok(report)
}

/// Checks one capture against its table as [`apply`] would (the table and
/// every column it names exist, the key is unique, each `when` compiles,
/// the size bound can hold its payload), changing nothing and needing no
/// outboxd table: what `check-config` runs.
pub fn check(conn: &Connection, spec: &CaptureSpec) -> Result<()> {
    resolve(conn, spec).map(drop)
}

/// Which captures [`remove`] takes away.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Removal {
    /// Every capture of one table.
    Table(String),
    /// One capture, by name.
    Capture(String),
    /// Every capture, and the shared event view and its trigger.
    All,
}

/// What [`remove`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RemoveReport {
    /// The captures removed, by name.
    pub tables: Vec<String>,
    /// The triggers dropped.
    pub triggers: Vec<String>,
}

/// Drops capture triggers and their records in one `BEGIN IMMEDIATE`
/// transaction. Removing the last capture also removes the shared event
/// view and its trigger. A table or name that is not captured is
/// [`Error::NotFound`].
pub fn remove(conn: &mut Connection, which: &Removal) -> Result<RemoveReport> {
    schema::ensure_current(conn)?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(Error::db("start removing capture triggers"))?;
    let recorded: Vec<(String, String)> = {
        let mut stmt = tx
            .prepare("SELECT name, table_name FROM outboxd_capture ORDER BY name")
            .map_err(Error::db("read the recorded captures"))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(Error::db("read the recorded captures"))?;
        rows.collect::<rusqlite::Result<_>>()
            .map_err(Error::db("read the recorded captures"))?
    };
    let installed = installed_objects(&tx)?;
    let mut report = RemoveReport::default();
    // Triggers named like capture's on the tables concerned that no
    // recorded capture owns (installed by an older outboxd): dropped too.
    let strays = |table: Option<&str>| -> Vec<String> {
        installed
            .iter()
            .filter(|(_, o)| o.kind == "trigger" && !is_shared(o))
            .filter(|(_, o)| table.is_none_or(|t| o.on.eq_ignore_ascii_case(t)))
            .filter(|(n, _)| !recorded.iter().any(|(name, _)| named_for(n, name)))
            .map(|(n, _)| n.clone())
            .collect()
    };
    let (names, stray): (Vec<String>, Vec<String>) = match which {
        Removal::All => (recorded.iter().map(|r| r.0.clone()).collect(), strays(None)),
        Removal::Table(t) => {
            let names: Vec<String> = recorded
                .iter()
                .filter(|(_, tb)| tb.eq_ignore_ascii_case(t))
                .map(|r| r.0.clone())
                .collect();
            let stray = strays(Some(t));
            if names.is_empty() && stray.is_empty() {
                return Err(Error::NotFound {
                    what: format!("a capture of table {t:?}"),
                });
            }
            (names, stray)
        }
        Removal::Capture(c) => match recorded.iter().find(|r| r.0.eq_ignore_ascii_case(c)) {
            Some(r) => (vec![r.0.clone()], Vec::new()),
            None => {
                return Err(Error::NotFound {
                    what: format!("a capture named {c:?}"),
                })
            }
        },
    };
    for name in &names {
        let table = recorded
            .iter()
            .find(|r| r.0 == *name)
            .map_or("", |r| r.1.as_str());
        report
            .triggers
            .extend(drop_objects(&tx, name, table, &installed)?);
        for sql in [
            "DELETE FROM outboxd_capture WHERE name = ?1",
            "DELETE FROM outboxd_capture_replaced WHERE table_name = ?1",
        ] {
            tx.execute(sql, [name])
                .map_err(Error::db("forget a capture"))?;
        }
        report.tables.push(name.clone());
    }
    drop_named(&tx, &stray, &installed)?;
    report.triggers.extend(stray);
    let left: i64 = tx
        .query_row("SELECT count(*) FROM outboxd_capture", [], |r| r.get(0))
        .map_err(Error::db("read the recorded captures"))?;
    if left == 0 {
        report
            .triggers
            .extend(drop_objects(&tx, "", "", &installed)?);
    }
    tx.commit()
        .map_err(Error::db("commit removing capture triggers"))?;
    Ok(report)
}
