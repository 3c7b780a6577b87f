//! The `Module` trait: graph-backed inference.

use crate::Result;
use std::future::Future;

/// A model whose forward pass is (typically) one replay of a captured graph.
///
/// `forward` runs one pass and returns its output once complete; `forward_async` does the same as
/// a future that never blocks the executor (the replay is awaited). Implementations own their
/// graph, weights and activation buffers; `&mut self` serialises passes over them.
pub trait Module {
    /// What a pass consumes (e.g. a host batch).
    type Input;
    /// What a pass produces (e.g. host logits).
    type Output;

    /// Runs one forward pass and blocks until its result is ready.
    fn forward(&mut self, input: Self::Input) -> Result<Self::Output>;

    /// Runs one forward pass; the future resolves once the result is ready, without blocking the
    /// executor thread.
    fn forward_async(&mut self, input: Self::Input) -> impl Future<Output = Result<Self::Output>> + Send;
}
