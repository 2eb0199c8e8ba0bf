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

use outboxd::capture::{assign_names, CaptureError, CaptureSpec};

use super::checker::Checker;
use super::error::ConfigError;

/// One `[[capture]]` as written: the library's definition itself, which
/// refuses unknown keys.
pub(crate) type RawCapture = CaptureSpec;

/// Checks every `[[capture]]` for what needs no database: the event type
/// of each operation, the templates, that lists are not empty, that no two
/// captures have one name (a table's second capture without a name is
/// `<table>-2`). Its `max_payload_bytes` may not exceed the relay's
/// (`relay_max`, default 16 MiB), which it defaults to: capture never writes
/// a payload the relay would refuse. Tables and columns are checked
/// against the database by `check-config` and `capture apply`.
pub(crate) fn check(
    c: &Checker<'_>,
    mut raw: Vec<RawCapture>,
    relay_max: Option<u64>,
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
    }
    assign_names(&mut raw);
    for (i, spec) in raw.iter().enumerate() {
        if let Some(j) = raw[..i]
            .iter()
            .position(|o| o.name().eq_ignore_ascii_case(spec.name()))
        {
            return Err(c.err(
                format!("capture[{i}].name"),
                format!(
                    "{:?} is the name of capture[{j}] too; give each capture its own name",
                    spec.name()
                ),
            ));
        }
    }
    let relay = relay_max.unwrap_or(outboxd::limits::DEFAULT_MAX_PAYLOAD_BYTES);
    for (i, spec) in raw.iter_mut().enumerate() {
        match spec.max_payload_bytes {
            Some(n) if n > relay => {
                return Err(c.err(
                    format!("capture[{i}].max_payload_bytes"),
                    format!(
                        "{n} is more than the relay's max_payload_bytes ({relay}{}): the relay \
                         would dead-letter the larger events; lower it, or raise [relay] \
                         max_payload_bytes",
                        if relay_max.is_none() {
                            ", its default"
                        } else {
                            ""
                        }
                    ),
                ))
            }
            None if relay < outboxd::capture::MIN_MAX_PAYLOAD_BYTES => {
                return Err(c.err(
                    format!("capture[{i}].max_payload_bytes"),
                    format!(
                        "the relay's max_payload_bytes ({relay}) is below the smallest payload \
                         bound a capture can keep ({}): raise [relay] max_payload_bytes",
                        outboxd::capture::MIN_MAX_PAYLOAD_BYTES
                    ),
                ))
            }
            None if relay < spec.payload_bound() => spec.max_payload_bytes = Some(relay),
            _ => {}
        }
    }
    Ok(raw)
}

/// Checks each capture against the database as `capture apply` would
/// (its table and columns exist, its `when` compiles), reading only: the
/// error names the entry and its field. Run by `check-config`, with or
/// without --offline (the systemd unit's ExecStartPre), since a capture of a
/// table the host has not created yet cannot work; the host's own
/// migrations come first.
pub(crate) fn check_database(
    file: &std::path::Path,
    captures: &[CaptureSpec],
    db: &std::path::Path,
) -> Result<(), ConfigError> {
    if captures.is_empty() {
        return Ok(());
    }
    let c = Checker::new(file);
    let conn = if db.exists() {
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| c.err("database", format!("cannot open {}: {e}", db.display())))?
    } else {
        return Err(c.err(
            "capture[0].table",
            format!(
                "the database {} does not exist, so capture {} cannot be checked: run the host's \
                 own migrations first (they create the captured tables)",
                db.display(),
                captures[0].name()
            ),
        ));
    };
    for (i, spec) in captures.iter().enumerate() {
        if let Err(e) = outboxd::capture::check(&conn, spec) {
            let field = match &e {
                outboxd::Error::Capture(CaptureError::NoSuchColumn { field, .. }) => field,
                outboxd::Error::Capture(CaptureError::Invalid { field, .. }) => field,
                outboxd::Error::Capture(CaptureError::DoesNotCompile { .. }) => "when",
                outboxd::Error::Capture(CaptureError::KeyNotUnique { .. }) => "key",
                _ => "table",
            };
            return Err(c.err(
                format!("capture[{i}].{field}"),
                format!("capture {}: {e}", spec.name()),
            ));
        }
    }
    Ok(())
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

    /// Several captures of one table: the first is known by the table's
    /// name, the next ones by `<table>-2`… unless they are given one.
    #[test]
    fn captures_of_one_table_get_names() {
        let published = PAGES.replace("[[capture]]\n", "[[capture]]\nname = \"page-published\"\n");
        let c = parse(&format!("{STDOUT}{PAGES}{PAGES}{published}")).unwrap();
        let names: Vec<&str> = c.captures.iter().map(|s| s.name()).collect();
        assert_eq!(names, ["pages", "pages-2", "page-published"]);
    }

    /// A capture's payload bound follows the relay's, and may not exceed it.
    #[test]
    fn the_payload_bound_agrees_with_the_relay() {
        let c = parse(&format!("{STDOUT}{PAGES}")).unwrap();
        assert_eq!(c.captures[0].payload_bound(), 16 << 20);
        let lower = format!("{STDOUT}[relay]\nmax_payload_bytes = 1000000\n{PAGES}");
        assert_eq!(
            parse(&lower).unwrap().captures[0].payload_bound(),
            1_000_000
        );
        let over = format!("{lower}max_payload_bytes = 2000000\n");
        let e = parse(&over).unwrap_err();
        assert_eq!(e.field, "capture[0].max_payload_bytes");
        assert!(
            e.message.contains("relay's max_payload_bytes (1000000)"),
            "{e}"
        );
        let e = parse(&format!("{STDOUT}{PAGES}max_payload_bytes = 17000000\n")).unwrap_err();
        assert!(e.message.contains("its default"), "{e}");
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
        let named = PAGES.replace("[[capture]]\n", "[[capture]]\nname = \"x\"\n");
        let e = parse(&format!("{STDOUT}{named}{named}")).unwrap_err();
        assert_eq!(e.field, "capture[1].name");
        assert!(e.message.contains("name of capture[0]"), "{e}");
    }
}
