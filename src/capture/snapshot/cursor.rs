//! Where a snapshot stopped: the key of the last row it read (the rowid, or
//! a WITHOUT ROWID table's primary key), kept as JSON in its record.

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::ToSql;
use serde::{Deserialize, Serialize};

/// One value of a cursor, with its SQLite type (a text key need not be
/// UTF-8, so it is kept as bytes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) enum KeyValue {
    /// NULL (never in a primary key SQLite enforces, but kept exact).
    #[serde(rename = "n")]
    Null,
    /// An INTEGER.
    #[serde(rename = "i")]
    Integer(i64),
    /// A REAL.
    #[serde(rename = "r")]
    Real(f64),
    /// A TEXT, as bytes in hex.
    #[serde(rename = "t")]
    Text(String),
    /// A BLOB, in hex.
    #[serde(rename = "b")]
    Blob(String),
}

impl KeyValue {
    /// The value SQLite returned.
    pub(crate) fn read(v: ValueRef<'_>) -> KeyValue {
        match v {
            ValueRef::Null => KeyValue::Null,
            ValueRef::Integer(i) => KeyValue::Integer(i),
            ValueRef::Real(f) => KeyValue::Real(f),
            ValueRef::Text(t) => KeyValue::Text(hex(t)),
            ValueRef::Blob(b) => KeyValue::Blob(hex(b)),
        }
    }
}

/// The bytes of a text or blob value (kept in hex in the JSON).
pub(crate) struct Bound(Bind);

enum Bind {
    Null,
    Integer(i64),
    Real(f64),
    Text(Vec<u8>),
    Blob(Vec<u8>),
}

impl Bound {
    pub(crate) fn of(v: &KeyValue) -> Bound {
        Bound(match v {
            KeyValue::Null => Bind::Null,
            KeyValue::Integer(i) => Bind::Integer(*i),
            KeyValue::Real(f) => Bind::Real(*f),
            KeyValue::Text(h) => Bind::Text(unhex(h)),
            KeyValue::Blob(h) => Bind::Blob(unhex(h)),
        })
    }
}

impl ToSql for Bound {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match &self.0 {
            Bind::Null => ValueRef::Null,
            Bind::Integer(i) => ValueRef::Integer(*i),
            Bind::Real(f) => ValueRef::Real(*f),
            Bind::Text(t) => ValueRef::Text(t),
            Bind::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02X}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_goes_through_json_and_back() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        for sql in [
            "1",
            "-9223372036854775808",
            "1.5",
            "'héllo'",
            "x'00FF'",
            "CAST(x'FF00' AS TEXT)",
            "NULL",
        ] {
            let (v, t): (KeyValue, String) = conn
                .query_row(&format!("SELECT {sql}, typeof({sql})"), [], |r| {
                    Ok((KeyValue::read(r.get_ref(0)?), r.get(1)?))
                })
                .unwrap();
            let json = serde_json::to_string(&v).unwrap();
            let back: KeyValue = serde_json::from_str(&json).unwrap();
            assert_eq!(back, v);
            let same: bool = conn
                .query_row(
                    &format!("SELECT ?1 IS {sql} AND typeof(?1) = ?2"),
                    rusqlite::params![Bound::of(&back), t],
                    |r| r.get(0),
                )
                .unwrap();
            assert!(same, "{sql} came back as it was");
        }
    }
}
