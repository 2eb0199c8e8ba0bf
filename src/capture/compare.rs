//! How the captures of a config compare with what is installed, and what
//! differs when they do not match.

use std::collections::BTreeMap;

use rusqlite::Connection;
use serde::Serialize;

use super::objects::recorded_objects;
use super::resolve::resolve;
use super::spec::{assign_names, CaptureSpec};
use crate::error::{Error, Result};
use crate::schema;

/// How a capture in a config compares with what is installed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ConfigMatch {
    /// Installed exactly as the config would install it now.
    Matches,
    /// Installed, but the config would install something else.
    Differs {
        /// What: the settings that changed (`columns: ["title"] → ["title",
        /// "status"]`), or the triggers that would change and why (a column
        /// added that `"*"` would now include, or this outboxd generates
        /// different SQL than the one that installed it).
        reason: String,
    },
    /// In the config, not installed.
    NotInstalled,
    /// In the config, but it cannot be installed as written (the table or a
    /// column is gone).
    Invalid {
        /// The error `capture apply` would report.
        error: String,
    },
    /// Installed, but not in the config.
    NotInConfig,
}

/// One capture's comparison.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Comparison {
    /// The capture's name.
    pub name: String,
    /// The table, as the config or the record spells it.
    pub table: String,
    /// How they compare.
    #[serde(flatten)]
    pub state: ConfigMatch,
}

/// The settings of `recorded` (a spec as JSON) that `now` sets otherwise,
/// as `key: old → new` joined by "; "; None when none do.
pub(crate) fn spec_difference(recorded: &str, now: &CaptureSpec) -> Option<String> {
    let old: BTreeMap<String, serde_json::Value> = serde_json::from_str(recorded).ok()?;
    let new: BTreeMap<String, serde_json::Value> =
        serde_json::from_value(serde_json::to_value(now).ok()?).ok()?;
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    let show = |v: Option<&serde_json::Value>| v.map_or("(default)".to_string(), |v| v.to_string());
    let diffs: Vec<String> = keys
        .into_iter()
        .filter(|k| old.get(*k) != new.get(*k))
        .map(|k| format!("{k}: {} → {}", show(old.get(k)), show(new.get(k))))
        .collect();
    (!diffs.is_empty()).then(|| diffs.join("; "))
}

/// Compares the captures of a config with what is recorded. Reads only.
pub fn compare(conn: &Connection, specs: &[CaptureSpec]) -> Result<Vec<Comparison>> {
    schema::ensure_current(conn)?;
    let mut specs = specs.to_vec();
    assign_names(&mut specs);
    // By lower-case name: (name, table, spec, objects).
    type Recorded = (String, String, String, BTreeMap<String, String>);
    let mut recorded: BTreeMap<String, Recorded> = BTreeMap::new();
    {
        let mut stmt = conn
            .prepare("SELECT name, table_name, spec FROM outboxd_capture")
            .map_err(Error::db("read the recorded captures"))?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                ))
            })
            .map_err(Error::db("read the recorded captures"))?;
        for row in rows {
            let (name, table, spec) = row.map_err(Error::db("read the recorded captures"))?;
            let objects = recorded_objects(conn, &name)?;
            recorded.insert(name.to_ascii_lowercase(), (name, table, spec, objects));
        }
    }
    let mut out = Vec::new();
    let mut seen = Vec::new();
    for spec in &specs {
        let plan = resolve(conn, spec);
        let name = match &plan {
            Ok(p) => p.name.clone(),
            Err(_) => spec.name().to_string(),
        };
        let lower = name.to_ascii_lowercase();
        seen.push(lower.clone());
        let state = match (plan, recorded.get(&lower)) {
            (Err(e), _) => ConfigMatch::Invalid {
                error: e.to_string(),
            },
            (Ok(_), None) => ConfigMatch::NotInstalled,
            (Ok(plan), Some((_, _, recorded_spec, triggers))) => {
                let wanted: BTreeMap<String, String> = plan
                    .triggers()
                    .into_iter()
                    .map(|t| (t.name, t.sql))
                    .collect();
                let settings = spec_difference(recorded_spec, &plan.spec);
                let differing: Vec<&String> = wanted
                    .keys()
                    .chain(triggers.keys())
                    .filter(|n| wanted.get(*n) != triggers.get(*n))
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .collect();
                match (settings, differing.is_empty()) {
                    (None, true) => ConfigMatch::Matches,
                    (Some(s), _) => ConfigMatch::Differs {
                        reason: format!("the config sets {s}"),
                    },
                    (None, false) => ConfigMatch::Differs {
                        reason: format!(
                            "the same settings, but trigger{} {} would change: the table changed \
                             since the capture was applied (its columns are now {}), or this \
                             outboxd writes different triggers",
                            if differing.len() == 1 { "" } else { "s" },
                            differing
                                .iter()
                                .map(|s| s.as_str())
                                .collect::<Vec<_>>()
                                .join(", "),
                            plan.table
                                .columns
                                .iter()
                                .map(|c| c.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    },
                }
            }
        };
        out.push(Comparison {
            name,
            table: spec.table.clone(),
            state,
        });
    }
    for (lower, (name, table, ..)) in &recorded {
        if !seen.contains(lower) {
            out.push(Comparison {
                name: name.clone(),
                table: table.clone(),
                state: ConfigMatch::NotInConfig,
            });
        }
    }
    Ok(out)
}
