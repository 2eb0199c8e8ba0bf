//! Subjects: the template each event's subject is rendered from, and the
//! NATS subject rules (what may be published, which filters take it).
//!
//! A subject is tokens separated by `.`; a token is never empty and holds
//! no whitespace. A stream's subjects are filters in which a `*` token
//! matches any one token and a final `>` any one or more.

use std::fmt;

use crate::consumer::Delivery;

/// The subject template used unless configured.
pub const DEFAULT_SUBJECT: &str = "events.{event_type}";

/// What `{tenant}` renders to for an event without a tenant.
pub(crate) const NO_TENANT: &str = "_";

/// A subject template: literal text and the placeholders `{event_type}`
/// (`article.created.v1`, three or more tokens), `{domain}` (the event
/// type's first segment, `article`) and `{tenant}` (the event's tenant id,
/// or `_` without one).
///
/// ```
/// use outboxd::sinks::nats::SubjectTemplate;
/// let t = SubjectTemplate::parse("tenants.{tenant}.{event_type}")?;
/// assert_eq!(t.filter(), "tenants.*.>");
/// assert!(SubjectTemplate::parse("events.{type}").is_err());
/// # Ok::<(), outboxd::sinks::nats::SubjectTemplateError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectTemplate {
    text: String,
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    EventType,
    Domain,
    Tenant,
}

/// A subject template was refused: the template and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("subject template {template:?} {reason}; placeholders: {{event_type}}, {{domain}}, {{tenant}}, such as \"events.{{event_type}}\"")]
pub struct SubjectTemplateError {
    /// The template as given.
    pub template: String,
    /// What is wrong with it.
    pub reason: String,
}

impl SubjectTemplate {
    /// Parses and checks a template: known placeholders only, and every
    /// rendering a valid subject.
    pub fn parse(template: &str) -> Result<SubjectTemplate, SubjectTemplateError> {
        let fail = |reason: String| SubjectTemplateError {
            template: template.to_string(),
            reason,
        };
        let mut parts = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            match rest.find(['{', '}']) {
                None => {
                    parts.push(Part::Literal(rest.to_string()));
                    break;
                }
                Some(i) if rest.as_bytes()[i] == b'}' => {
                    return Err(fail("has a } without its {".into()))
                }
                Some(i) => {
                    if i > 0 {
                        parts.push(Part::Literal(rest[..i].to_string()));
                    }
                    let close = rest[i..]
                        .find('}')
                        .ok_or_else(|| fail("has a { without its }".into()))?;
                    let name = &rest[i + 1..i + close];
                    parts.push(match name {
                        "event_type" => Part::EventType,
                        "domain" => Part::Domain,
                        "tenant" => Part::Tenant,
                        other => {
                            return Err(fail(format!("has an unknown placeholder {{{other}}}")))
                        }
                    });
                    rest = &rest[i + close + 1..];
                }
            }
        }
        if parts.is_empty() {
            return Err(fail("is empty".into()));
        }
        let t = SubjectTemplate {
            text: template.to_string(),
            parts,
        };
        // Placeholders always render to valid tokens, so checking one
        // rendering checks the literal text around them.
        let sample = t.render_parts("a.b.v1", "a", "t");
        check_subject(&sample)
            .map_err(|why| fail(format!("does not give a valid subject: {why}")))?;
        Ok(t)
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The subject of one delivery, or why it has none: a tenant id that is
    /// not one subject token (it holds `.`, whitespace, `*` or `>`).
    pub fn render(&self, delivery: &Delivery) -> Result<String, String> {
        let event_type = delivery.envelope.event_type.as_str();
        let domain = event_type.split('.').next().unwrap_or(event_type);
        let tenant = delivery.tenant_id.as_deref().unwrap_or(NO_TENANT);
        if self.parts.contains(&Part::Tenant) {
            check_token(tenant).map_err(|why| {
                format!(
                    "tenant id {:?} cannot be a subject token ({why}), so subject template \
                     {:?} gives no subject for it",
                    shorten(tenant),
                    self.text
                )
            })?;
        }
        let subject = self.render_parts(event_type, domain, tenant);
        check_subject(&subject).map_err(|why| {
            format!(
                "subject {:?} is not a valid NATS subject: {why}",
                shorten(&subject)
            )
        })?;
        Ok(subject)
    }

    fn render_parts(&self, event_type: &str, domain: &str, tenant: &str) -> String {
        let mut s = String::with_capacity(self.text.len() + event_type.len());
        for p in &self.parts {
            match p {
                Part::Literal(l) => s.push_str(l),
                Part::EventType => s.push_str(event_type),
                Part::Domain => s.push_str(domain),
                Part::Tenant => s.push_str(tenant),
            }
        }
        s
    }

    /// The narrowest filter that takes every subject this template renders:
    /// a token with `{domain}` or `{tenant}` becomes `*`, and everything
    /// from the token holding `{event_type}` (three or more tokens) becomes
    /// `>`. The subject of a stream created for this sink.
    pub fn filter(&self) -> String {
        // Mark placeholders with characters a valid literal never holds.
        let marked = self.render_parts("\u{1}", "\u{2}", "\u{2}");
        let mut tokens = Vec::new();
        for token in marked.split('.') {
            if token.contains('\u{1}') {
                tokens.push(">");
                break;
            }
            tokens.push(if token.contains('\u{2}') { "*" } else { token });
        }
        tokens.join(".")
    }
}

impl fmt::Display for SubjectTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Checks a subject to publish to: non-empty tokens without whitespace,
/// and no wildcard token.
pub(crate) fn check_subject(subject: &str) -> Result<(), String> {
    if subject.is_empty() {
        return Err("it is empty".into());
    }
    for token in subject.split('.') {
        check_token(token)?;
    }
    Ok(())
}

fn check_token(token: &str) -> Result<(), String> {
    if token.is_empty() {
        return Err("it has an empty token (a leading, trailing or double '.')".into());
    }
    if token.contains('.') {
        return Err("it holds a '.'".into());
    }
    if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("it holds whitespace or a control character".into());
    }
    if token.contains(['*', '>']) {
        return Err("it holds a wildcard character ('*' or '>')".into());
    }
    Ok(())
}

/// True when `filter` (a stream subject, with `*` and `>` wildcards) takes
/// `subject` (literal tokens, or a filter: then every subject it takes).
pub(crate) fn filter_covers(filter: &str, subject: &str) -> bool {
    let mut f = filter.split('.');
    let mut s = subject.split('.');
    loop {
        match (f.next(), s.next()) {
            (None, None) => return true,
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(t)) if t != ">" => {}
            (Some(a), Some(b)) if a == b && a != ">" => {}
            _ => return false,
        }
    }
}

/// True when some subject is taken by both filters.
pub(crate) fn filters_overlap(a: &str, b: &str) -> bool {
    let mut x = a.split('.');
    let mut y = b.split('.');
    loop {
        match (x.next(), y.next()) {
            (None, None) => return true,
            (Some(">"), Some(_)) | (Some(_), Some(">")) => return true,
            (Some(p), Some(q)) if p == q || p == "*" || q == "*" => {}
            _ => return false,
        }
    }
}

/// Long producer-written text cut for a dead letter's reason.
fn shorten(s: &str) -> String {
    crate::text::clip(s, 120, crate::text::Keep::Head).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{Envelope, EventId, EventType};
    use proptest::prelude::*;

    fn delivery(ty: &str, tenant: Option<&str>) -> Delivery {
        Delivery {
            envelope: Envelope {
                event_id: EventId::new(),
                event_type: EventType::parse(ty).unwrap(),
                event_version: EventType::parse(ty).unwrap().version(),
                causation_id: None,
                correlation_id: None,
                occurred_at: crate::Timestamp::from_millis(0),
                payload: serde_json::value::RawValue::from_string("{}".into()).unwrap(),
            },
            attempt: 1,
            consumer: "nats".into(),
            legacy: false,
            tenant_id: tenant.map(str::to_string),
            ordering_key: None,
            trace: None,
            created_at: None,
        }
    }

    #[test]
    fn renders_each_placeholder() {
        let t = SubjectTemplate::parse("x.{tenant}.{domain}.{event_type}").unwrap();
        let d = delivery("article.created.v1", Some("acme"));
        assert_eq!(t.render(&d).unwrap(), "x.acme.article.article.created.v1");
        let d = delivery("article.created.v1", None);
        assert_eq!(t.render(&d).unwrap(), "x._.article.article.created.v1");
        let t = SubjectTemplate::parse(DEFAULT_SUBJECT).unwrap();
        assert_eq!(t.render(&d).unwrap(), "events.article.created.v1");
    }

    #[test]
    fn a_tenant_that_is_not_one_token_has_no_subject() {
        let t = SubjectTemplate::parse("t.{tenant}.{event_type}").unwrap();
        for bad in ["a.b", "a b", "*", "x>", ""] {
            let e = t.render(&delivery("a.b.v1", Some(bad))).unwrap_err();
            assert!(e.contains("tenant id"), "{bad:?}: {e}");
        }
        // A template without {tenant} does not care.
        let t = SubjectTemplate::parse("t.{event_type}").unwrap();
        assert!(t.render(&delivery("a.b.v1", Some("a b"))).is_ok());
    }

    #[test]
    fn refuses_bad_templates_with_the_reason() {
        for (bad, why) in [
            ("", "is empty"),
            ("events.{type}", "unknown placeholder {type}"),
            ("events.{event_type", "without its }"),
            ("events}.x", "without its {"),
            ("events..{event_type}", "empty token"),
            ("events.{event_type}.", "empty token"),
            ("events.*.{event_type}", "wildcard"),
            ("events.>", "wildcard"),
            ("ev ents.{event_type}", "whitespace"),
        ] {
            let e = SubjectTemplate::parse(bad).unwrap_err();
            assert!(e.to_string().contains(why), "{bad:?}: {e}");
        }
        // A constant subject is allowed.
        assert!(SubjectTemplate::parse("all.events").is_ok());
    }

    #[test]
    fn filter_is_the_narrowest_covering_filter() {
        for (t, f) in [
            ("events.{event_type}", "events.>"),
            ("{tenant}.{event_type}", "*.>"),
            ("t-{tenant}.{domain}.x", "*.*.x"),
            ("a.{event_type}.z", "a.>"),
            ("ev_{event_type}", ">"),
            ("fixed", "fixed"),
        ] {
            assert_eq!(SubjectTemplate::parse(t).unwrap().filter(), f, "{t}");
        }
    }

    #[test]
    fn filter_matching() {
        assert!(filter_covers("events.>", "events.a.b.v1"));
        assert!(!filter_covers("events.>", "events"));
        assert!(filter_covers("events.*.b.v1", "events.a.b.v1"));
        assert!(!filter_covers("events.*", "events.a.b"));
        assert!(filter_covers(">", "a"));
        assert!(filter_covers("events.>", "events.*.>"));
        assert!(!filter_covers("events.*.>", "events.>"));
        assert!(!filter_covers("events.a.>", "events.*.>"));
        assert!(filter_covers("*.*", "a.*"));
        assert!(filters_overlap("events.a.>", "events.*.>"));
        assert!(filters_overlap("events.*", "*.x"));
        assert!(!filters_overlap("events.a", "events.b"));
        assert!(!filters_overlap("a.b", "a.b.c"));
    }

    proptest! {
        /// Whatever its event type and tenant, a delivery's subject is valid
        /// and taken by the template's filter, or it has a reason.
        #[test]
        fn rendered_subjects_are_valid_and_covered(
            names in proptest::collection::vec("[a-z0-9_]{1,6}", 2..4),
            tenant in proptest::option::of("\\PC{0,8}"),
            template in prop_oneof![
                Just("events.{event_type}"),
                Just("{tenant}.{domain}.{event_type}"),
                Just("t.{tenant}.x"),
                Just("{domain}-{tenant}.{event_type}"),
            ],
        ) {
            let ty = format!("{}.v1", names.join("."));
            let t = SubjectTemplate::parse(template).unwrap();
            match t.render(&delivery(&ty, tenant.as_deref())) {
                Ok(s) => {
                    prop_assert!(check_subject(&s).is_ok());
                    prop_assert!(filter_covers(&t.filter(), &s), "{} does not take {}", t.filter(), s);
                }
                Err(why) => prop_assert!(why.contains("tenant id")),
            }
        }
    }
}
