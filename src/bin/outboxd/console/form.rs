//! Queries and url-encoded forms, decoded and encoded by the
//! `form_urlencoded` crate; paths percent-decoded.

/// Decoded `a=b&c=d` pairs, in order; a name may repeat.
#[derive(Debug, Clone, Default)]
pub(crate) struct Params(pub(crate) Vec<(String, String)>);

impl Params {
    /// Parses `application/x-www-form-urlencoded` text (invalid UTF-8 is
    /// replaced, never refused).
    pub(crate) fn parse(s: &[u8]) -> Params {
        Params(form_urlencoded::parse(s).into_owned().collect())
    }

    /// The first value of `name`, None when absent; blank counts as absent.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
    }

    /// Every value of `name`.
    pub(crate) fn all(&self, name: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// `pairs` as a query string (without `?`), each value encoded.
pub(crate) fn query<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

/// Percent-decodes a URL's path (`+` is a space, as in the query, so a
/// path and a query value decode alike).
pub(crate) fn decode_path(s: &str) -> String {
    percent_encoding::percent_decode_str(&s.replace('+', " "))
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_decode_forms_and_repeat_names() {
        let p = Params::parse(b"a=1&id=3&id=4&t=article.%2A.v1&s=a+b&blank=&&bare");
        assert_eq!(p.get("t"), Some("article.*.v1"));
        assert_eq!(p.get("s"), Some("a b"));
        assert_eq!(p.all("id"), ["3", "4"]);
        assert_eq!(p.get("blank"), None);
        assert_eq!(p.all("bare"), [""]);
        let bad = Params::parse(b"x=%FF%FE&y=%zz");
        assert_eq!(bad.get("x"), Some("\u{fffd}\u{fffd}"));
        assert_eq!(bad.get("y"), Some("%zz"));
    }

    #[test]
    fn a_query_round_trips_odd_values() {
        let odd = "a b&c=d+e/%?#\u{e9}";
        let q = query([("v", odd), ("w", "")]);
        assert_eq!(q, "v=a+b%26c%3Dd%2Be%2F%25%3F%23%C3%A9&w=");
        assert_eq!(Params::parse(q.as_bytes()).get("v"), Some(odd));
        assert_eq!(decode_path("/events/a%20b+c"), "/events/a b c");
    }
}
