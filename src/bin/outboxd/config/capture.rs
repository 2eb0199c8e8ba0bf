//! `[[capture]]`: tables whose own inserts, updates and deletes become
//! events through triggers. `outboxd capture apply` installs them, `outboxd
//! run` watches them (docs/capture.md).
//!
//! ```toml
//! [[capture]]
//! table = "pages"
//! event_type = "page.{op}.v1"
//! columns = ["id", "title", "status"]
//! ```

use std::path::PathBuf;

use outboxd::capture::{CaptureError, CaptureSpec};

use super::checker::Checker;
use super::error::ConfigError;

/// One `[[capture]]` as written: the library's definition itself, which
/// refuses unknown keys.
pub(crate) type RawCapture = CaptureSpec;

/// Checks every `[[capture]]` for what needs no database: the event type
/// of each operation, the templates, that lists are not empty, that no
/// table is captured twice. Tables and columns are checked against the
/// database by `capture apply`.
pub(crate) fn check(
    c: &Checker<'_>,
    raw: Vec<RawCapture>,
) -> Result<Vec<CaptureSpec>, ConfigError> {
    for (i, spec) in raw.iter().enumerate() {
        spec.validate().map_err(|e| {
            let field = match &e {
                CaptureError::Invalid { field, .. } => field,
                CaptureError::EventType { .. } => "event_type",
                _ => "table",
            };
            c.err(format!("capture[{i}].{field}"), e.to_string())
        })?;
        if let Some(j) = raw[..i]
            .iter()
            .position(|o| o.table.eq_ignore_ascii_case(&spec.table))
        {
            return Err(c.err(
                format!("capture[{i}].table"),
                format!(
                    "{:?} is captured twice (capture[{j}] too); one entry per table",
                    spec.table
                ),
            ));
        }
    }
    Ok(raw)
}

/// What `outboxd capture` reads from a config: the database and the
/// captures. Consumers and sinks are neither required nor built, so a file
/// holding only `[[capture]]` entries works, and applying triggers needs no
/// webhook secret.
#[derive(Debug)]
pub(crate) struct CaptureConfig {
    /// The config file.
    pub(crate) file: PathBuf,
    /// Its `database`, resolved against its directory.
    pub(crate) database: Option<PathBuf>,
    /// Its `[[capture]]` entries.
    pub(crate) captures: Vec<CaptureSpec>,
}

#[cfg(test)]
mod tests {
    use super::super::tests::{parse, STDOUT};

    const PAGES: &str =
        "[[capture]]\ntable = \"pages\"\nevent_type = \"page.{op}.v1\"\ncolumns = [\"title\"]\n";

    #[test]
    fn captures_sit_beside_consumers() {
        let c = parse(&format!("{STDOUT}{PAGES}")).unwrap();
        assert_eq!(c.captures.len(), 1);
        assert_eq!(c.captures[0].table, "pages");
        assert!(c.captures[0].changed_only);
    }

    #[test]
    fn a_config_of_captures_alone_loads_for_the_capture_commands() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("capture.toml");
        std::fs::write(&file, format!("database = \"cms.db\"\n{PAGES}")).unwrap();
        let c = super::super::Config::load_captures(&file).unwrap();
        assert_eq!(c.database, Some(dir.path().join("cms.db")));
        assert_eq!(c.captures.len(), 1);
    }

    #[test]
    fn errors_name_the_entry_and_field() {
        let cases = [
            ("table = \"t\"\nevent_type = \"T.{op}.v1\"\ncolumns = \"*\"\n", "capture[0].event_type", "T.created.v1"),
            ("table = \"t\"\nevent_type = \"t.{op}.v1\"\n", "capture[0]", "columns"),
            ("table = \"t\"\nevent_type = \"t.{op}.v1\"\ncolumns = \"title\"\n", "capture[0].columns", "[\"title\"]"),
            ("table = \"t\"\nevent_type = \"t.{op}.v1\"\ncolumns = []\n", "capture[0].columns", "empty"),
            ("table = \"t\"\nevent_type = \"t.{op}.v1\"\ncolumns = \"*\"\noperations = [\"insrt\"]\n", "capture[0].operations", "insert"),
            ("table = \"t\"\nevent_type = \"t.{op}.v1\"\ncolumns = \"*\"\nwhen = 3\n", "capture[0].when", "condition"),
            ("table = \"t\"\nevent_type = \"t.{op}.v1\"\ncolumns = \"*\"\nordering_key = \"{a\"\n", "capture[0].ordering_key", "{a"),
            ("table = \"t\"\nevent_type = \"t.{op}.v1\"\ncolumns = \"*\"\ncolour = 1\n", "capture[0]", "colour"),
        ];
        for (entry, field, needle) in cases {
            let e = parse(&format!("{STDOUT}[[capture]]\n{entry}")).unwrap_err();
            assert!(e.field.starts_with(field), "{entry}: {e}");
            assert!(e.to_string().contains(needle), "{entry}: {e}");
        }
        let e = parse(&format!(
            "{STDOUT}{PAGES}{}",
            PAGES.replace("pages", "PAGES")
        ))
        .unwrap_err();
        assert_eq!(e.field, "capture[1].table");
        assert!(e.message.contains("twice"), "{e}");
    }
}
