//! Liveness: whether the owner of a lease is still alive, judged without
//! any clock shared between processes (docs/liveness.md has the argument).
//!
//! Every process that leases rows (each [`Relay`](crate::relay::Relay)
//! value, each [`Intents`](crate::intents::Intents) value) is a
//! [`Member`]: it holds `flock` on a lock file of its own, in a directory
//! beside the database ([`dir`]), for its whole life, and a thread of its
//! own counts a heartbeat in that file. Its claim tokens name it
//! ([`token`]). Whoever wants a leased row asks [`Peers`]: a lease whose
//! owner's lock is free is taken at once; one whose owner holds its lock
//! only once its heartbeat has not moved for ten of the longer lease, on
//! the asker's monotonic clock; a lease whose token names no lock file (an
//! older relay, a file removed) is judged by its end time, as before.
//!
//! The SQL that takes rows over stays with each table's owner
//! ([`claim`](crate::relay) for `event_outbox`, the intents store for
//! `publish_intents`).

mod dir;
mod member;
mod peers;

pub(crate) use dir::lock_dir;
pub(crate) use member::Member;
pub(crate) use peers::{Peers, Verdict};

/// How long a name is: a ULID's 26 characters.
const NAME_LEN: usize = 26;

/// A claim token of member `name`: `<name>:<ulid>`, a fresh ULID for each
/// claim, so two claims of one member still fence each other.
pub(crate) fn token(name: &str) -> String {
    format!("{name}:{}", ulid::Ulid::generate())
}

/// The member a claim token names, or None for a token of an older relay
/// (a bare ULID) or a foreign one: those are judged by the time rule.
pub(crate) fn owner_of(token: &str) -> Option<&str> {
    let (name, _) = token.split_once(':')?;
    (name.len() == NAME_LEN && name.bytes().all(|b| b.is_ascii_alphanumeric())).then_some(name)
}

/// The file name of member `name`'s lock file (in [`lock_dir`]).
fn lock_file(name: &str) -> String {
    format!("{name}.lock")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_its_owner_and_an_old_one_names_none() {
        let name = ulid::Ulid::generate().to_string();
        let t = token(&name);
        assert_eq!(owner_of(&t), Some(&*name));
        assert_ne!(t, token(&name));
        assert_eq!(owner_of(&ulid::Ulid::generate().to_string()), None);
        assert_eq!(owner_of("../../etc:x"), None);
        assert_eq!(owner_of(""), None);
    }
}
