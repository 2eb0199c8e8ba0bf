//! What a captured table looks like: its columns, keys and UNIQUE
//! constraints, read from SQLite's own catalogue.

use rusqlite::{Connection, OptionalExtension};

use super::CaptureError;
use crate::error::Error;

/// One column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Column {
    /// Its name as declared.
    pub name: String,
    /// True for a generated column (VIRTUAL or STORED).
    pub generated: bool,
}

/// A UNIQUE constraint (or the primary key) a conflicting `INSERT OR
/// REPLACE` resolves by deleting the other row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unique {
    /// The index's name (`sqlite_autoindex_…` for a constraint).
    pub name: String,
    /// Its columns with the collation each compares by.
    pub columns: Vec<(String, String)>,
}

/// A UNIQUE index outboxd cannot match a replaced row through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unmatched {
    /// The index's name.
    pub name: String,
    /// Why: "on an expression", "partial", "on a generated column".
    pub why: &'static str,
}

/// A table as capture sees it.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    /// The name as SQLite stores it (the case the table was created with).
    pub name: String,
    /// Every column in declaration order (hidden columns of virtual tables
    /// excepted).
    pub columns: Vec<Column>,
    /// The primary key's columns in key order; empty when it has none.
    pub primary_key: Vec<String>,
    /// The name that reaches the rowid (`rowid`, `_rowid_` or `oid`, the
    /// first not taken by a column); None for WITHOUT ROWID.
    pub rowid: Option<String>,
    /// UNIQUE constraints and indexes on plain columns (the primary key of a
    /// WITHOUT ROWID table, or a non-INTEGER one, among them).
    pub unique: Vec<Unique>,
    /// UNIQUE indexes a replaced row cannot be matched through.
    pub unmatched: Vec<Unmatched>,
}

impl Table {
    /// Reads a table of the main database. The name is matched as SQLite
    /// matches it (ignoring ASCII case).
    pub fn read(conn: &Connection, name: &str) -> Result<Table, Error> {
        let found: Option<(String, String, Option<String>)> = conn
            .query_row(
                "SELECT type, name, sql FROM sqlite_master
                 WHERE name = ?1 COLLATE NOCASE AND type IN ('table', 'view')",
                [name],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
            .map_err(Error::db("read the captured table's definition"))?;
        let Some((kind, canonical, sql)) = found else {
            return Err(CaptureError::NoSuchTable {
                table: name.to_string(),
            }
            .into());
        };
        let refuse = |why: &str| -> Error {
            CaptureError::Unsupported {
                table: canonical.clone(),
                reason: why.to_string(),
            }
            .into()
        };
        if kind == "view" {
            return Err(refuse("it is a view; capture the tables it reads"));
        }
        if sql.as_deref().is_some_and(|s| {
            s.trim_start()
                .to_ascii_uppercase()
                .starts_with("CREATE VIRTUAL")
        }) {
            return Err(refuse("it is a virtual table, which cannot have triggers"));
        }
        if canonical.to_ascii_lowercase().starts_with("sqlite_") {
            return Err(refuse("it is one of SQLite's own tables"));
        }
        if super::OWN_TABLES
            .iter()
            .any(|t| t.eq_ignore_ascii_case(&canonical))
            || canonical.to_ascii_lowercase().starts_with("outboxd_")
        {
            return Err(refuse("it is one of outboxd's own tables"));
        }

        let without_rowid: bool = conn
            .query_row(
                "SELECT wr FROM pragma_table_list WHERE schema = 'main' AND name = ?1",
                [&canonical],
                |r| r.get(0),
            )
            .map_err(Error::db("read the captured table's definition"))?;

        let mut columns = Vec::new();
        let mut pk: Vec<(i64, String)> = Vec::new();
        {
            let mut stmt = conn
                .prepare("SELECT name, pk, hidden FROM pragma_table_xinfo(?1) ORDER BY cid")
                .map_err(Error::db("read the captured table's columns"))?;
            let mut rows = stmt
                .query([&canonical])
                .map_err(Error::db("read the captured table's columns"))?;
            while let Some(r) = rows
                .next()
                .map_err(Error::db("read the captured table's columns"))?
            {
                let name: String = r.get(0).map_err(Error::db("read a column name"))?;
                let in_pk: i64 = r.get(1).map_err(Error::db("read a column"))?;
                let hidden: i64 = r.get(2).map_err(Error::db("read a column"))?;
                if hidden == 1 {
                    continue; // a virtual table's hidden column
                }
                if in_pk > 0 {
                    pk.push((in_pk, name.clone()));
                }
                columns.push(Column {
                    name,
                    generated: hidden >= 2,
                });
            }
        }
        pk.sort();
        let primary_key: Vec<String> = pk.into_iter().map(|(_, n)| n).collect();
        let rowid = if without_rowid {
            None
        } else {
            let alias = ["rowid", "_rowid_", "oid"]
                .into_iter()
                .find(|alias| !columns.iter().any(|c| c.name.eq_ignore_ascii_case(alias)));
            match alias {
                Some(a) => Some(a.to_string()),
                None => return Err(refuse(
                    "its columns named rowid, _rowid_ and oid hide the rowid, which capture needs",
                )),
            }
        };

        let mut unique = Vec::new();
        let mut unmatched = Vec::new();
        let indexes: Vec<(String, bool)> = {
            let mut stmt = conn
                .prepare(
                    "SELECT name, partial FROM pragma_index_list(?1) WHERE \"unique\" ORDER BY seq",
                )
                .map_err(Error::db("read the captured table's indexes"))?;
            let rows = stmt
                .query_map([&canonical], |r| Ok((r.get(0)?, r.get::<_, bool>(1)?)))
                .map_err(Error::db("read the captured table's indexes"))?;
            rows.collect::<rusqlite::Result<_>>()
                .map_err(Error::db("read the captured table's indexes"))?
        };
        for (index, partial) in indexes {
            let mut cols = Vec::new();
            let mut expression = false;
            {
                let mut stmt = conn
                    .prepare("SELECT cid, name, coll FROM pragma_index_xinfo(?1) WHERE key ORDER BY seqno")
                    .map_err(Error::db("read a unique index"))?;
                let mut rows = stmt
                    .query([&index])
                    .map_err(Error::db("read a unique index"))?;
                while let Some(r) = rows.next().map_err(Error::db("read a unique index"))? {
                    let cid: i64 = r.get(0).map_err(Error::db("read a unique index"))?;
                    let name: Option<String> =
                        r.get(1).map_err(Error::db("read a unique index"))?;
                    let coll: Option<String> =
                        r.get(2).map_err(Error::db("read a unique index"))?;
                    match name {
                        Some(n) if cid >= 0 => {
                            cols.push((n, coll.unwrap_or_else(|| "BINARY".into())))
                        }
                        _ => expression = true,
                    }
                }
            }
            let on_generated = cols.iter().any(|(n, _)| {
                columns
                    .iter()
                    .any(|c| c.generated && c.name.eq_ignore_ascii_case(n))
            });
            let why = if expression {
                Some("on an expression")
            } else if partial {
                Some("partial (it has a WHERE)")
            } else if on_generated {
                Some("on a generated column")
            } else {
                None
            };
            match why {
                Some(why) => unmatched.push(Unmatched { name: index, why }),
                None => unique.push(Unique {
                    name: index,
                    columns: cols,
                }),
            }
        }
        Ok(Table {
            name: canonical,
            columns,
            primary_key,
            rowid,
            unique,
            unmatched,
        })
    }

    /// The column called `name` (ignoring ASCII case, as SQLite does).
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns
            .iter()
            .find(|c| c.name.eq_ignore_ascii_case(name))
    }
}
