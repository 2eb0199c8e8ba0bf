//! The registered consumers, as the workers run them.

use super::availability::Availability;
use super::RetryPolicy;
use crate::consumer::{Consumer, TransactionalConsumer};

/// A registered consumer, as the workers run it.
pub(crate) struct ConsumerEntry {
    pub name: String,
    pub consumer: ConsumerKind,
    pub retry: RetryPolicy,
    /// Whether its destination answers, as its outcomes say.
    pub availability: std::sync::Arc<Availability>,
}

/// How a consumer is run.
pub(crate) enum ConsumerKind {
    /// On its own: [`Consumer::deliver`].
    Plain(Box<dyn Consumer>),
    /// Inside a transaction on the worker's connection ([`transactional`](super::transactional)).
    Transactional(Box<dyn TransactionalConsumer>),
}
