//! The library's integration tests, one test binary (tests/README.md): the
//! producer side, the relay, capture, publish intents, the sinks as library
//! consumers, the schema, and the model and property tests.
//!
//!   cargo test --test library                # all of them
//!   cargo test --test library relay::        # one file's tests

mod common;

#[path = "library/capture.rs"]
mod capture;
#[path = "library/capture_props.rs"]
mod capture_props;
#[path = "library/capture_snapshot.rs"]
mod capture_snapshot;
#[path = "library/concurrency.rs"]
mod concurrency;
#[path = "library/enqueue.rs"]
mod enqueue;
#[path = "library/intents.rs"]
mod intents;
#[path = "library/liveness.rs"]
mod liveness;
#[path = "library/migrations.rs"]
mod migrations;
#[path = "library/model.rs"]
mod model;
#[path = "library/operations.rs"]
mod operations;
#[path = "library/outage.rs"]
mod outage;
#[path = "library/relay.rs"]
mod relay;
#[path = "library/sinks.rs"]
mod sinks;
#[path = "library/sinks_permanent.rs"]
mod sinks_permanent;
#[path = "library/trace.rs"]
mod trace;
#[path = "library/transactional.rs"]
mod transactional;
