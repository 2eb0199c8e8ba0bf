//! Tests of jsonl.rs.

use super::{still_linked, LogFile, OneLine};
use std::cell::Cell;
use std::io::Write;

/// `json` through [`OneLine`] in one piece.
fn one_line(json: &str) -> String {
    let mut out = OneLine::new(Vec::new());
    out.write_all(json.as_bytes()).unwrap();
    String::from_utf8(out.into_inner()).unwrap()
}

thread_local! {
    /// Directory syncs made on this thread.
    pub(super) static DIRECTORY_SYNCS: Cell<usize> = const { Cell::new(0) };
}

fn directory_syncs() -> usize {
    DIRECTORY_SYNCS.with(Cell::get)
}

/// A symbolic link to a file not there yet still works: the file is
/// created where the link points, as before.
#[cfg(unix)]
#[test]
fn a_link_to_a_file_not_there_yet_is_followed() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("real.jsonl");
    let link = dir.path().join("events.jsonl");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let mut log = LogFile::open(&link).unwrap();
    log.write_line(b"1\n", true).unwrap();
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "1\n");
}

/// With fsync, the first line into a file the sink created (at the
/// start, or at the path again after a rotation) syncs its directory
/// once; a file that was there already, or a sink without fsync, never.
#[test]
fn a_created_file_has_its_directory_synced_once_with_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let mut log = LogFile::open(&path).unwrap();
    assert_eq!(directory_syncs(), 0, "opening syncs nothing");
    log.write_line(b"1\n", true).unwrap();
    log.write_line(b"2\n", true).unwrap();
    assert_eq!(directory_syncs(), 1);

    // Rotated away: the next line creates the file again.
    std::fs::rename(&path, dir.path().join("events.jsonl.1")).unwrap();
    log.write_line(b"3\n", true).unwrap();
    log.write_line(b"4\n", true).unwrap();
    assert_eq!(directory_syncs(), 2);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "3\n4\n");

    // A file that exists already is not new.
    let mut again = LogFile::open(&path).unwrap();
    again.write_line(b"5\n", true).unwrap();
    assert_eq!(directory_syncs(), 2);

    // Without fsync, nothing is synced.
    let other = dir.path().join("other.jsonl");
    let mut quick = LogFile::open(&other).unwrap();
    quick.write_line(b"6\n", false).unwrap();
    assert_eq!(directory_syncs(), 2);
}

#[cfg(unix)]
#[test]
fn a_deleted_open_file_is_no_longer_linked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let file = std::fs::File::create(&path).unwrap();
    let moved = dir.path().join("events.jsonl.1");
    std::fs::rename(&path, &moved).unwrap();
    assert!(still_linked(&file).unwrap());
    std::fs::remove_file(&moved).unwrap();
    assert!(!still_linked(&file).unwrap());
}

#[test]
fn one_line_keeps_the_value_and_drops_the_layout() {
    let pretty = "{\n  \"a b\" : [ 1 ,\t2.50e3 ],\r\n  \"s\": \"x \\\" \\n y\u{2028}z\u{85}\",\n  \"n\": 123456789012345678901234567890\n}";
    let line = one_line(pretty);
    assert_eq!(
        line,
        r#"{"a b":[1,2.50e3],"s":"x \" \n y\u2028z\u0085","n":123456789012345678901234567890}"#
    );
    let a: serde_json::Value = serde_json::from_str(pretty).unwrap();
    let b: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(a, b);
    // Compact JSON without those characters is left as it is.
    let compact = r#"{"id":7,"text":"caf\u00e9 ok","list":[true,false,null]}"#;
    assert_eq!(one_line(compact), compact);
}

/// Cut into pieces anywhere (inside a character to escape, another
/// character of the same first bytes, an escape sequence), the text
/// comes out as it does in one piece.
#[test]
fn one_line_comes_out_alike_from_pieces_cut_anywhere() {
    let json = "{ \"a\\\"\u{2028}\" : [\"\u{85}é\u{2029}\u{20ac}\u{2000}\u{a9}\" ,\n 1 ] }";
    let whole = one_line(json);
    assert_eq!(
        whole,
        "{\"a\\\"\\u2028\":[\"\\u0085é\\u2029\u{20ac}\u{2000}\u{a9}\",1]}"
    );
    let bytes = json.as_bytes();
    for cut in 0..=bytes.len() {
        for second in cut..=bytes.len() {
            let mut out = OneLine::new(Vec::new());
            for piece in [&bytes[..cut], &bytes[cut..second], &bytes[second..]] {
                out.write_all(piece).unwrap();
            }
            let got = String::from_utf8(out.into_inner()).unwrap();
            assert_eq!(got, whole, "cut at {cut} and {second}");
        }
    }
}
