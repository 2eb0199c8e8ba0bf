//! The field path (`consumer[1].sink.path`) of the place in a config file
//! that an error points at. toml's errors carry the byte span of the value
//! (or key, or table) they are about; the path is found again from the
//! file's syntax tree, which spares wrapping the whole deserialisation in a
//! path-tracking deserializer (a second copy of every config type's code in
//! the binary).

use std::ops::Range;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// The path to the innermost key or value of `text` whose span holds
/// `offset`: keys joined by `.`, list items as `[i]`; empty for the top level
/// or a text that does not parse.
pub(super) fn at(text: &str, offset: usize) -> String {
    let Ok(root) = DeTable::parse(text) else {
        return String::new();
    };
    let mut path = String::new();
    table(root.get_ref(), offset, &mut path);
    path
}

/// Appends to `path` the deepest entry of `t` that holds `offset`. Every
/// entry is searched, not only one whose span holds it: a table written as
/// a `[header]` spans its header only, not the keys below it.
fn table(t: &DeTable<'_>, offset: usize, path: &mut String) -> bool {
    for (key, value) in t.iter() {
        let mut here = path.clone();
        if !here.is_empty() {
            here.push('.');
        }
        here.push_str(key.get_ref());
        if descend(value, offset, &mut here) || holds(&key.span(), offset) {
            *path = here;
            return true;
        }
    }
    false
}

fn descend(v: &Spanned<DeValue<'_>>, offset: usize, path: &mut String) -> bool {
    let inner = match v.get_ref() {
        DeValue::Table(t) => table(t, offset, path),
        DeValue::Array(items) => items.iter().enumerate().any(|(i, item)| {
            let mut here = format!("{path}[{i}]");
            if descend(item, offset, &mut here) {
                *path = here;
                true
            } else {
                false
            }
        }),
        _ => false,
    };
    inner || holds(&v.span(), offset)
}

fn holds(span: &Range<usize>, offset: usize) -> bool {
    span.contains(&offset) || (span.is_empty() && span.start == offset)
}

#[cfg(test)]
mod tests {
    use super::at;

    fn path_of(text: &str, needle: &str) -> String {
        at(text, text.find(needle).unwrap())
    }

    #[test]
    fn names_keys_tables_and_list_items() {
        let text = "database = \"a.db\"\n[relay]\nworkers = 2\n\
                    [[consumer]]\nname = \"a\"\n[consumer.sink]\nkind = \"jsonl\"\n\
                    [[consumer]]\nname = \"b\"\ntypes = [\"x\", 7]\n[consumer.sink]\npath = 9\n";
        assert_eq!(path_of(text, "\"a.db\""), "database");
        assert_eq!(path_of(text, "workers"), "relay.workers");
        assert_eq!(path_of(text, "2\n"), "relay.workers");
        assert_eq!(path_of(text, "\"a\""), "consumer[0].name");
        assert_eq!(path_of(text, "\"jsonl\""), "consumer[0].sink.kind");
        assert_eq!(path_of(text, "7]"), "consumer[1].types[1]");
        assert_eq!(path_of(text, "9"), "consumer[1].sink.path");
        assert_eq!(at("not = = toml", 3), "");
    }
}
