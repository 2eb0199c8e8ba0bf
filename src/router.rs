//! Which consumers take which event types: the patterns consumers subscribe
//! with, the table the relay routes each claimed row by, and what happens to
//! a row no consumer takes ([`UnroutedPolicy`]) or that cannot be delivered
//! at all (an invalid row).

use std::collections::HashMap;
use std::sync::Arc;

use crate::envelope::EventType;

/// An event-type pattern: an exact type (`article.created.v1`) or one with
/// `*` segments. A `*` stands for one or more whole segments, so
/// `article.*.v1` takes every v1 article event and `*.v2` every v2 event;
/// a lone `*` takes everything.
///
/// ```
/// use outboxd::router::Pattern;
/// let p = Pattern::parse("article.*.v1").unwrap();
/// assert!(p.matches("article.created.v1"));
/// assert!(p.matches("article.comment.added.v1"));
/// assert!(!p.matches("article.created.v2"));
/// assert!(Pattern::parse("*.v2").unwrap().matches("user.deleted.v2"));
/// assert!(Pattern::parse("Article.*").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    text: String,
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Any,
}

/// A pattern that is not valid, or that no valid event type could match.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("event type pattern {pattern:?}: {reason}")]
pub struct PatternError {
    pattern: String,
    reason: String,
}

impl PatternError {
    /// The pattern as given.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// What is wrong, and how to write it instead.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

impl Pattern {
    /// Parses a pattern: dot-separated segments, each `*` or lowercase
    /// a-z, 0-9 and `_`. A pattern that no valid event type can match (one
    /// that ends in a literal other than a version, such as
    /// `article.created`, or one too short for a domain, a verb and a
    /// version) is refused with the fix, since it would silently take
    /// nothing.
    ///
    /// ```
    /// use outboxd::router::Pattern;
    /// let e = Pattern::parse("article.created").unwrap_err();
    /// assert!(e.reason().contains("article.created.v1 or article.created.*"), "{e}");
    /// ```
    pub fn parse(s: &str) -> Result<Pattern, PatternError> {
        let bad = |reason: &str| PatternError {
            pattern: s.to_string(),
            reason: reason.to_string(),
        };
        let malformed = |reason: &str| {
            bad(&format!(
                "{reason}; use an event type such as article.created.v1, \
                 or * for one or more segments (article.*.v1, *.v2, *)"
            ))
        };
        if s.is_empty() {
            return Err(malformed("it is empty"));
        }
        let mut segments = Vec::new();
        for seg in s.split('.') {
            if seg == "*" {
                if segments.last() == Some(&Segment::Any) {
                    return Err(malformed("two * in a row"));
                }
                segments.push(Segment::Any);
            } else if !seg.is_empty()
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            {
                segments.push(Segment::Literal(seg.to_string()));
            } else {
                return Err(malformed(
                    "a segment is empty or has a character other than a-z, 0-9, _",
                ));
            }
        }
        // Every event type ends in a version (v1, v2…) and has a domain and
        // a verb before it: a pattern that cannot end in one, or cannot be
        // three segments long, matches nothing.
        if let Some(Segment::Literal(last)) = segments.last() {
            if !is_version(last) {
                return Err(bad(&format!(
                    "it can never match: an event type ends in its version; add a version: \
                     {s}.v1 or {s}.*"
                )));
            }
        }
        if segments.len() < 3 && !segments.contains(&Segment::Any) {
            return Err(bad(
                "it can never match: an event type has a domain, a verb and a version \
                 (article.created.v1); use all three, or * for any of them (*.v1)",
            ));
        }
        Ok(Pattern {
            text: s.to_string(),
            segments,
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// True when the event type matches.
    pub fn matches(&self, event_type: &str) -> bool {
        let parts: Vec<&str> = event_type.split('.').collect();
        match_from(&self.segments, &parts)
    }
}

/// `v` and a number of 1 or more without leading zeros, as event types end.
fn is_version(segment: &str) -> bool {
    segment.strip_prefix('v').is_some_and(|d| {
        !d.is_empty() && !d.starts_with('0') && d.bytes().all(|b| b.is_ascii_digit())
    })
}

fn match_from(pattern: &[Segment], parts: &[&str]) -> bool {
    match pattern.split_first() {
        None => parts.is_empty(),
        Some((Segment::Literal(l), rest)) => {
            parts.first() == Some(&l.as_str()) && match_from(rest, &parts[1..])
        }
        // One or more segments: try every split.
        Some((Segment::Any, rest)) => (1..=parts.len()).any(|n| match_from(rest, &parts[n..])),
    }
}

impl std::fmt::Display for Pattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

/// True when one of `patterns` matches `event_type`: the one rule by which
/// an event type reaches a consumer (the relay's routing table and
/// [`Subscriptions`] both ask it).
fn takes(patterns: &[Pattern], event_type: &str) -> bool {
    patterns.iter().any(|p| p.matches(event_type))
}

/// A consumer's name and the patterns it subscribes with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    /// The consumer's name.
    pub name: String,
    /// The event types or patterns it takes.
    pub patterns: Vec<Pattern>,
}

impl Subscription {
    /// True when the consumer takes `event_type`.
    pub fn takes(&self, event_type: &str) -> bool {
        takes(&self.patterns, event_type)
    }
}

/// Which consumers take which event types, outside a relay (an operator's
/// console, a report): the consumers in order, each with its patterns,
/// routed by the rule the relay routes by.
///
/// ```
/// use outboxd::router::Subscriptions;
/// let subs = Subscriptions::parse([
///     ("search", vec!["article.*.v1"]),
///     ("audit", vec!["*"]),
/// ])?;
/// let to: Vec<&str> = subs.consumers_for("article.created.v1").collect();
/// assert_eq!(to, ["search", "audit"]);
/// let e = Subscriptions::parse([("x", vec!["a.b.v1", "Bad"])]).unwrap_err();
/// assert_eq!((e.consumer(), e.index()), (0, 1));
/// # Ok::<(), outboxd::router::SubscriptionError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subscriptions {
    consumers: Vec<Subscription>,
}

/// A consumer's type pattern that does not parse: which consumer (its
/// position), which of its types, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("consumer {name:?}: {source}")]
pub struct SubscriptionError {
    consumer: usize,
    index: usize,
    name: String,
    source: PatternError,
}

impl SubscriptionError {
    /// The consumer's position in the list given.
    pub fn consumer(&self) -> usize {
        self.consumer
    }

    /// The pattern's position in that consumer's types.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Why the pattern was refused.
    pub fn pattern_error(&self) -> &PatternError {
        &self.source
    }
}

impl Subscriptions {
    /// Parses each consumer's types, in order; the first that does not
    /// parse is an error naming its consumer and position.
    pub fn parse<N, T, S>(
        consumers: impl IntoIterator<Item = (N, T)>,
    ) -> Result<Subscriptions, SubscriptionError>
    where
        N: Into<String>,
        T: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut parsed = Vec::new();
        for (consumer, (name, types)) in consumers.into_iter().enumerate() {
            let name = name.into();
            let mut patterns = Vec::new();
            for (index, t) in types.into_iter().enumerate() {
                match Pattern::parse(t.as_ref()) {
                    Ok(p) => patterns.push(p),
                    Err(source) => {
                        return Err(SubscriptionError {
                            consumer,
                            index,
                            name,
                            source,
                        })
                    }
                }
            }
            parsed.push(Subscription { name, patterns });
        }
        Ok(Subscriptions { consumers: parsed })
    }

    /// The names of the consumers that take `event_type`, in order.
    pub fn consumers_for<'a>(&'a self, event_type: &'a str) -> impl Iterator<Item = &'a str> {
        self.consumers
            .iter()
            .filter(move |s| s.takes(event_type))
            .map(|s| s.name.as_str())
    }

    /// The consumers' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.consumers.iter().map(|s| s.name.as_str())
    }

    /// The position of the consumer `name`, if it is one.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.consumers.iter().position(|s| s.name == name)
    }

    /// Each consumer, in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Subscription> {
        self.consumers.iter()
    }

    /// How many consumers there are.
    pub fn len(&self) -> usize {
        self.consumers.len()
    }

    /// True when there are no consumers.
    pub fn is_empty(&self) -> bool {
        self.consumers.is_empty()
    }
}

/// What to do with an event no consumer subscribes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnroutedPolicy {
    /// Dead-letter it, saying no consumer takes its type (the default: it is
    /// never dropped silently, and a consumer added later can requeue it).
    #[default]
    DeadLetter,
    /// Mark it delivered and log it at INFO.
    Skip,
}

/// The relay's routing table: each consumer's patterns (by the consumer's
/// index), and the consumers each event type seen so far routes to.
pub(crate) struct Routes {
    patterns: Vec<Vec<Pattern>>,
    unrouted: UnroutedPolicy,
    cache: HashMap<String, Arc<[usize]>>,
}

/// The most event types the routing cache remembers before it starts over
/// (types are few in practice; the bound only stops a hostile producer from
/// growing it without end).
const MAX_CACHED_TYPES: usize = 10_000;

/// What the relay does with one claimed (valid) row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Dispatch {
    /// Run these consumers (indexes).
    Deliver(Vec<usize>),
    /// Mark it delivered without running anything.
    Finish(Finish),
    /// Dead-letter it, spending no attempt: no consumer takes its type
    /// (the reason says so).
    Unrouted(String),
}

/// Why a row is finished without a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// Every consumer it routes to has it already (dedup).
    AlreadyDelivered,
    /// No consumer takes its type, and the policy is [`UnroutedPolicy::Skip`].
    SkippedUnrouted,
    /// A replay asked for consumers none of which takes it here (renamed or
    /// removed since): the row gets its status back.
    NoReplayedConsumer,
}

impl Routes {
    /// A table for consumers whose patterns are given in consumer order.
    pub(crate) fn new(patterns: Vec<Vec<Pattern>>, unrouted: UnroutedPolicy) -> Routes {
        Routes {
            patterns,
            unrouted,
            cache: HashMap::new(),
        }
    }

    /// The consumers (indexes) an event type routes to, remembered per type.
    pub(crate) fn consumers_for(&mut self, event_type: &str) -> Arc<[usize]> {
        if let Some(r) = self.cache.get(event_type) {
            return r.clone();
        }
        let r: Arc<[usize]> = self
            .patterns
            .iter()
            .enumerate()
            .filter(|(_, ps)| takes(ps, event_type))
            .map(|(i, _)| i)
            .collect();
        if self.cache.len() >= MAX_CACHED_TYPES {
            self.cache.clear();
        }
        self.cache.insert(event_type.to_string(), r.clone());
        r
    }

    /// Decides what to do with a claimed row: its event type, the consumers
    /// that have its event already (the ledger), and the consumers a replay
    /// asked for (None: all). `name` gives a consumer's name by index.
    pub(crate) fn dispatch<'a>(
        &mut self,
        event_type: &EventType,
        delivered_to: &[String],
        replay: Option<&[String]>,
        name: impl Fn(usize) -> &'a str,
    ) -> Dispatch {
        let routed = self.consumers_for(event_type.as_str());
        let in_scope = |i: usize| replay.is_none_or(|scope| scope.iter().any(|s| s == name(i)));
        if replay.is_some() && !routed.iter().any(|&i| in_scope(i)) {
            return Dispatch::Finish(Finish::NoReplayedConsumer);
        }
        if routed.is_empty() {
            return match self.unrouted {
                UnroutedPolicy::DeadLetter => {
                    Dispatch::Unrouted(format!("no consumer takes event type {event_type}"))
                }
                UnroutedPolicy::Skip => Dispatch::Finish(Finish::SkippedUnrouted),
            };
        }
        let mut missing = crate::dedup::missing(&routed, delivered_to, &name);
        missing.retain(|&i| in_scope(i));
        if missing.is_empty() {
            Dispatch::Finish(Finish::AlreadyDelivered)
        } else {
            Dispatch::Deliver(missing)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        let m = |p: &str, t: &str| Pattern::parse(p).unwrap().matches(t);
        assert!(m("a.b.v1", "a.b.v1"));
        assert!(!m("a.b.v1", "a.b.v2"));
        assert!(m("*", "a.b.v1"));
        assert!(m("a.*", "a.b.v1"));
        assert!(!m("a.*", "a"));
        assert!(m("*.v1", "x.y.z.v1"));
        assert!(!m("*.b.v1", "b.v1"));
        for bad in ["", "a..b", "A.b", "a.**.b", "a.*.*.v1", "a b"] {
            assert!(Pattern::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_pattern_that_can_never_match_is_refused_with_the_fix() {
        let e = Pattern::parse("article.created").unwrap_err();
        assert!(
            e.reason()
                .contains("add a version: article.created.v1 or article.created.*"),
            "{e}"
        );
        for never in ["article", "*.created", "a.b.v0", "a.b.v01", "a.v1", "v1"] {
            assert!(Pattern::parse(never).is_err(), "{never:?}");
        }
        for fine in ["*", "a.*", "*.v1", "a.*.v2", "a.b.v10", "*.b.v1"] {
            assert!(Pattern::parse(fine).is_ok(), "{fine:?}");
        }
    }

    fn ty(event_type: &str) -> EventType {
        EventType::parse(event_type).unwrap()
    }

    fn routes(unrouted: UnroutedPolicy) -> Routes {
        let p = |s: &str| Pattern::parse(s).unwrap();
        Routes::new(
            vec![
                vec![p("a.*.v1")],
                vec![p("*")],
                vec![p("b.x.v1"), p("*.v2")],
            ],
            unrouted,
        )
    }

    const NAMES: [&str; 3] = ["first", "all", "third"];

    #[test]
    fn routes_each_type_to_every_consumer_whose_pattern_matches() {
        let mut r = routes(UnroutedPolicy::DeadLetter);
        assert_eq!(&*r.consumers_for("a.b.v1"), [0, 1]);
        assert_eq!(&*r.consumers_for("b.x.v1"), [1, 2]);
        assert_eq!(&*r.consumers_for("c.d.v2"), [1, 2]);
        assert_eq!(&*r.consumers_for("a.b.v1"), [0, 1], "cached");
        let d = r.dispatch(&ty("a.b.v1"), &[], None, |i| NAMES[i]);
        assert_eq!(d, Dispatch::Deliver(vec![0, 1]));
    }

    #[test]
    fn dispatch_skips_the_consumers_the_ledger_has_and_finishes_a_row_all_have() {
        let mut r = routes(UnroutedPolicy::DeadLetter);
        let env = ty("a.b.v1");
        let done = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            r.dispatch(&env, &done(&["all"]), None, |i| NAMES[i]),
            Dispatch::Deliver(vec![0])
        );
        assert_eq!(
            r.dispatch(&env, &done(&["all", "first", "gone"]), None, |i| NAMES[i]),
            Dispatch::Finish(Finish::AlreadyDelivered)
        );
    }

    #[test]
    fn a_replay_runs_only_the_consumers_it_names() {
        let mut r = routes(UnroutedPolicy::DeadLetter);
        let env = ty("a.b.v1");
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // "first" has no entry (added since, or its entry is gone): a replay
        // for "all" runs "all" alone.
        let scope = names(&["all"]);
        assert_eq!(
            r.dispatch(&env, &[], Some(&scope), |i| NAMES[i]),
            Dispatch::Deliver(vec![1])
        );
        // Named, but it has the event already (replayed twice): nothing runs.
        assert_eq!(
            r.dispatch(&env, &names(&["all"]), Some(&scope), |i| NAMES[i]),
            Dispatch::Finish(Finish::AlreadyDelivered)
        );
        // A name no consumer here has: the row gets its status back.
        assert_eq!(
            r.dispatch(&env, &[], Some(&names(&["gone"])), |i| NAMES[i]),
            Dispatch::Finish(Finish::NoReplayedConsumer)
        );
    }

    #[test]
    fn an_unrouted_event_follows_the_policy() {
        let only = |unrouted| Routes::new(vec![vec![Pattern::parse("a.*.v1").unwrap()]], unrouted);
        let env = ty("nobody.wants.v1");
        assert_eq!(
            only(UnroutedPolicy::DeadLetter).dispatch(&env, &[], None, |_| "a"),
            Dispatch::Unrouted("no consumer takes event type nobody.wants.v1".into())
        );
        assert_eq!(
            only(UnroutedPolicy::Skip).dispatch(&env, &[], None, |_| "a"),
            Dispatch::Finish(Finish::SkippedUnrouted)
        );
    }
}
