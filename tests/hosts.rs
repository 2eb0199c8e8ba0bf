//! outboxd with the programs around it, one test binary (tests/README.md):
//! Python, PHP and Django hosts writing through capture and the SQL
//! contract, and real `nats-server`s behind the NATS sink.
//!
//!   cargo test --test hosts                  # all of them
//!   cargo test --test hosts nats_e2e::

mod common;
/// examples/nats_consumer.rs, whose test is in nats_sink.rs (its `main`
/// unused here).
#[cfg(feature = "nats")]
#[path = "../examples/nats_consumer.rs"]
#[allow(dead_code)]
mod nats_consumer;

#[path = "hosts/capture_django.rs"]
mod capture_django;
#[path = "hosts/capture_hosts.rs"]
mod capture_hosts;
#[path = "hosts/nats_e2e.rs"]
mod nats_e2e;
#[path = "hosts/nats_sink.rs"]
mod nats_sink;
#[path = "hosts/reach_errors.rs"]
mod reach_errors;
#[path = "hosts/sql_contract.rs"]
mod sql_contract;
