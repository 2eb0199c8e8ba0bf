//! The path of one delivery: its subject checked against the stream's,
//! then published and its acknowledgement awaited.

use std::time::{Duration, Instant};

use async_nats::connection::State;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use tokio::runtime::Handle;

use super::stream::summary;
use super::{Shared, StreamState};
use crate::consumer::{Delivery, Outcome};
use crate::sinks::nats::message;
use crate::sinks::nats::subject::filter_covers;

/// The most often the stream's info is fetched again for subjects missing
/// from the cached list (a burst of such events makes one request, not one
/// each).
const REFRESH_AT_MOST_EVERY: Duration = Duration::from_secs(1);

impl Shared {
    /// Publishes one delivery and waits for its acknowledgement, on the
    /// calling (worker) thread; other workers' publishes share the
    /// connection meanwhile.
    pub(in crate::sinks::nats) fn publish(&self, handle: &Handle, d: &Delivery) -> Outcome {
        let subject = match self.template.render(d) {
            Ok(s) => s,
            Err(why) => return Outcome::poison(why),
        };
        let started = Instant::now();
        let taken = match &*self.state.read().unwrap_or_else(|p| p.into_inner()) {
            StreamState::Ready(s) => s.subjects.iter().any(|f| filter_covers(f, &subject)),
            // Not reached yet, or refused (a stream or permission removed
            // since the start): no event of this sink can go, so it waits.
            StreamState::Waiting(why) | StreamState::Refused(why) => {
                return Outcome::unavailable(why.clone())
            }
        };
        if !taken {
            if let Some(not_taken) = self.check_subject_again(handle, &subject, started) {
                return not_taken;
            }
        }
        if self.client.connection_state() != State::Connected {
            return Outcome::unavailable(format!(
                "not connected to NATS {}: reconnecting",
                self.servers
            ));
        }
        let headers = match message::headers(d) {
            Ok(h) => h,
            Err(why) => return Outcome::poison(why),
        };
        let body = match crate::sinks::buffer::envelope_json(&d.envelope) {
            Ok(body) => bytes::Bytes::from(body),
            Err(e) => return e.retry(),
        };
        let publish = PublishMessage::build().payload(body).headers(headers);
        // Queued on the connection without waiting for earlier publishes;
        // only this worker waits for this acknowledgement.
        // ack_timeout bounds the whole publish (queueing included), so a
        // delivery never outlives it: the relay's lease must only cover it.
        let result = handle.block_on(async {
            let publish = async { self.js.send_publish(subject.clone(), publish).await?.await };
            tokio::time::timeout(self.ack_timeout, publish)
                .await
                .unwrap_or_else(|_| Err(PublishError::new(PublishErrorKind::TimedOut)))
        });
        message::outcome(result, &subject, &self.stream, self.ack_timeout)
    }

    /// A subject missing from the stream's cached subjects: the operator
    /// may have widened them since the sink looked. Decides with the
    /// stream's info fetched again, at most every
    /// [`REFRESH_AT_MOST_EVERY`]: None when the fresh info takes the subject
    /// (publish it), poison when info fetched after this delivery began
    /// confirms that the stream does not take it, and a retry otherwise
    /// (the info is from before this delivery and was fetched too recently
    /// to ask again, or the stream did not answer): a subject is never
    /// refused on a cached list alone.
    fn check_subject_again(
        &self,
        handle: &Handle,
        subject: &str,
        started: Instant,
    ) -> Option<Outcome> {
        let mut refreshed = self.refreshed.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = refreshed.is_some_and(|at| at >= started);
        let recent = refreshed.is_some_and(|at| at.elapsed() < REFRESH_AT_MOST_EVERY);
        if !fresh && !recent {
            let info = handle.block_on(async {
                let lookup = async {
                    self.js
                        .get_stream(&self.stream)
                        .await
                        .map(|s| s.cached_info().clone())
                };
                tokio::time::timeout(self.ack_timeout, lookup).await
            });
            match info {
                Ok(Ok(info)) => {
                    let created = self.summary().is_some_and(|s| s.created);
                    let fetched = summary(&info, created);
                    if fetched.subjects != self.summary().map(|s| s.subjects).unwrap_or_default() {
                        tracing::info!(stream = %self.stream, subjects = ?fetched.subjects, "the NATS stream's subjects changed");
                    }
                    self.set(StreamState::Ready(fetched));
                    *refreshed = Some(Instant::now());
                }
                Ok(Err(e)) => {
                    return Some(Outcome::retry(format!(
                        "subject {subject} is not among the subjects stream {} took when last \
                         checked, and checking again failed: {e}",
                        self.stream
                    )))
                }
                Err(_) => {
                    return Some(Outcome::retry(format!(
                        "subject {subject} is not among the subjects stream {} took when last \
                         checked, and checking again got no answer within {:?}",
                        self.stream, self.ack_timeout
                    )))
                }
            }
        }
        let fresh = refreshed.is_some_and(|at| at >= started);
        let subjects = self.summary().map(|s| s.subjects).unwrap_or_default();
        if subjects.iter().any(|f| filter_covers(f, subject)) {
            return None;
        }
        Some(if fresh {
            Outcome::poison(format!(
                "subject {subject} is not taken by stream {} (its subjects, checked as this event \
                 was delivered: {}), so no stream would store it; add a subject matching it to \
                 the stream, then requeue the event",
                self.stream,
                subjects.join(", ")
            ))
        } else {
            Outcome::retry(format!(
                "subject {subject} is not taken by stream {} as checked under {REFRESH_AT_MOST_EVERY:?} \
                 ago (its subjects: {}); checking again on the next attempt",
                self.stream,
                subjects.join(", ")
            ))
        })
    }
}
