//! The connections waiting for a request head: new ones, and kept-alive
//! ones between two requests. They cost a socket and a small task each, so
//! they are capped on their own ([`HttpBounds::max_waiting`]), apart from
//! the requests being answered; at the cap a new connection closes the one
//! that has waited longest, so slow or idle clients, however many, can
//! never keep a new client out. Each also ends at the head timeout.
//!
//! [`HttpBounds::max_waiting`]: super::HttpBounds::max_waiting

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

/// The waiting connections, oldest first.
pub(super) struct Lobby {
    cap: usize,
    /// Each waiting connection's seat by its ticket (tickets only grow, so
    /// the first is the one that has waited longest).
    waiting: Mutex<(u64, BTreeMap<u64, Arc<Seat>>)>,
}

/// One connection's place in the [`Lobby`].
#[derive(Default)]
pub(super) struct Seat {
    /// Its ticket while it waits, 0 otherwise (changed under the lobby's
    /// lock).
    ticket: AtomicU64,
    /// Set when the lobby closed it to make room.
    closed: AtomicBool,
    /// Woken then: the connection's task drops the connection.
    pub(super) close: Notify,
}

impl Lobby {
    /// A lobby of at most `cap` waiting connections (at least one).
    pub(super) fn new(cap: usize) -> Lobby {
        Lobby {
            cap: cap.max(1),
            waiting: Mutex::new((0, BTreeMap::new())),
        }
    }

    fn lock(&self) -> MutexGuard<'_, (u64, BTreeMap<u64, Arc<Seat>>)> {
        // Nothing panics under the lock; a poisoned one is whole.
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Seats a connection that now waits for a request head; at the cap,
    /// the one that has waited longest is told to close first.
    pub(super) fn enter(&self, seat: &Arc<Seat>) {
        let mut guard = self.lock();
        let (last, waiting) = &mut *guard;
        if seat.ticket.load(Ordering::Relaxed) != 0 || seat.closed.load(Ordering::Relaxed) {
            return;
        }
        if waiting.len() >= self.cap {
            if let Some((_, oldest)) = waiting.pop_first() {
                oldest.ticket.store(0, Ordering::Relaxed);
                oldest.closed.store(true, Ordering::Relaxed);
                oldest.close.notify_one();
            }
        }
        *last += 1;
        seat.ticket.store(*last, Ordering::Relaxed);
        waiting.insert(*last, seat.clone());
    }

    /// Unseats a connection (its head has arrived, or it ends); false when
    /// the lobby has closed it to make room (its request is not answered).
    pub(super) fn leave(&self, seat: &Seat) -> bool {
        let mut guard = self.lock();
        let ticket = seat.ticket.swap(0, Ordering::Relaxed);
        if ticket != 0 {
            guard.1.remove(&ticket);
        }
        !seat.closed.load(Ordering::Relaxed)
    }

    /// How many connections wait.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.lock().1.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_connection_waiting_longest_is_closed() {
        let lobby = Lobby::new(2);
        let seats: Vec<Arc<Seat>> = (0..4).map(|_| Arc::default()).collect();
        lobby.enter(&seats[0]);
        lobby.enter(&seats[1]);
        assert_eq!(lobby.len(), 2);
        // The first leaves (its head arrived) and comes back after its
        // answer: now the second has waited longest.
        assert!(lobby.leave(&seats[0]));
        lobby.enter(&seats[0]);
        lobby.enter(&seats[2]);
        assert_eq!(lobby.len(), 2);
        assert!(!lobby.leave(&seats[1]), "closed to make room");
        assert!(lobby.leave(&seats[0]) && lobby.leave(&seats[2]));
        // A closed seat is not seated again (its connection is ending).
        lobby.enter(&seats[1]);
        assert_eq!(lobby.len(), 0);
    }
}
