//! The stream check: the stream is looked up (created when missing, if
//! allowed) and must take the subject template's subjects.

use async_nats::jetstream::context::{Context, GetStreamErrorKind};
use async_nats::jetstream::stream;

use super::Plan;
use crate::sinks::nats::subject::{filter_covers, filters_overlap};
use crate::sinks::nats::{CreateStream, NatsError, Storage, StreamSummary};

/// JetStream's "stream not found".
const STREAM_NOT_FOUND: u64 = 10059;
/// JetStream is not enabled, on the server or for the account.
const JETSTREAM_NOT_ENABLED: [u64; 2] = [10076, 10039];
/// The cluster cannot place the stream yet (no meta leader, peers missing).
const CLUSTER_NOT_READY: [u64; 3] = [10008, 10004, 10005];

/// Why the stream check did not pass.
pub(super) enum Check {
    /// A definite answer: the stream is missing, or takes none of the
    /// subjects, or cannot be created.
    Refused(NatsError),
    /// No answer (yet): ask again later.
    Unanswered(String),
}

/// Looks the stream up (creating it if allowed and missing) and checks that
/// it takes the template's subjects.
pub(super) async fn check_stream(
    js: &Context,
    plan: &Plan,
    create: bool,
) -> Result<StreamSummary, Check> {
    let filter = plan.template.filter();
    let (info, created) = match js.get_stream(&plan.stream).await {
        Ok(s) => (s.cached_info().clone(), false),
        Err(e) => {
            let code = match e.kind() {
                GetStreamErrorKind::JetStream(js_err) => Some(js_err.error_code().0),
                _ => None,
            };
            match (code, &plan.create_stream) {
                (Some(STREAM_NOT_FOUND), Some(spec)) if create => {
                    (create_stream(js, plan, spec, &filter).await?, true)
                }
                (Some(STREAM_NOT_FOUND), _) => {
                    return Err(Check::Refused(NatsError::StreamMissing {
                        stream: plan.stream.clone(),
                        subject: plan.template.to_string(),
                        filter,
                        servers: plan.shown.clone(),
                    }))
                }
                (Some(c), _) if JETSTREAM_NOT_ENABLED.contains(&c) => {
                    return Err(Check::Refused(NatsError::JetStreamDisabled {
                        servers: plan.shown.clone(),
                        reason: e.to_string(),
                    }))
                }
                _ => {
                    return Err(Check::Unanswered(format!(
                        "the JetStream API of {} did not answer the look-up of stream {}: {e} \
                         (is JetStream enabled, and a leader elected?)",
                        plan.shown, plan.stream
                    )))
                }
            }
        }
    };
    let subjects = info.config.subjects.clone();
    if !subjects.iter().any(|s| filter_covers(s, &filter)) {
        if subjects.iter().any(|s| filters_overlap(s, &filter)) {
            tracing::warn!(
                stream = %plan.stream,
                stream_subjects = ?subjects,
                subject = %plan.template,
                "the stream takes only some of the template's subjects; an event whose subject \
                 it does not take is dead-lettered once the stream's info, fetched again for it, \
                 confirms that (widen the stream's subjects: no restart needed)"
            );
        } else {
            return Err(Check::Refused(NatsError::StreamSubjects {
                stream: plan.stream.clone(),
                subject: plan.template.to_string(),
                filter,
                stream_subjects: subjects,
            }));
        }
    }
    Ok(summary(&info, created))
}

/// What the sink keeps of a stream's info.
pub(super) fn summary(info: &stream::Info, created: bool) -> StreamSummary {
    StreamSummary {
        name: info.config.name.clone(),
        subjects: info.config.subjects.clone(),
        duplicate_window: info.config.duplicate_window,
        replicas: info.config.num_replicas,
        storage: match info.config.storage {
            stream::StorageType::Memory => Storage::Memory,
            stream::StorageType::File => Storage::File,
        },
        messages: info.state.messages,
        created,
    }
}

async fn create_stream(
    js: &Context,
    plan: &Plan,
    spec: &CreateStream,
    filter: &str,
) -> Result<stream::Info, Check> {
    let config = stream::Config {
        name: plan.stream.clone(),
        subjects: vec![filter.to_string()],
        num_replicas: spec.replicas,
        duplicate_window: spec.duplicate_window,
        max_age: spec.max_age,
        storage: match spec.storage {
            Storage::File => stream::StorageType::File,
            Storage::Memory => stream::StorageType::Memory,
        },
        ..Default::default()
    };
    match js.create_stream(config).await {
        Ok(s) => {
            tracing::info!(stream = %plan.stream, subjects = filter, replicas = spec.replicas, "created the JetStream stream");
            Ok(s.cached_info().clone())
        }
        Err(e) => {
            use async_nats::jetstream::context::CreateStreamErrorKind as K;
            match e.kind() {
                K::JetStream(js_err) if !CLUSTER_NOT_READY.contains(&js_err.error_code().0) => {
                    Err(Check::Refused(NatsError::CreateStream {
                        stream: plan.stream.clone(),
                        reason: e.to_string(),
                    }))
                }
                _ => Err(Check::Unanswered(format!(
                    "cannot create stream {} yet: {e}",
                    plan.stream
                ))),
            }
        }
    }
}
