//! The `Module` trait (a graph-backed model: one forward pass, typically one replay) and its
//! `Replicable` marker.

use crate::Result;
use std::future::Future;

/// A model whose forward pass is (typically) one replay of a captured graph.
///
/// `forward` runs one pass and returns its output once complete; `forward_async` does the same as
/// a future that never blocks the executor (the replay is awaited). Implementations own their
/// graph, weights and activation buffers; `&mut self` serialises passes over them.
///
/// # Examples
///
/// A model whose forward pass is one replay: the input is copied into the graph's input buffer
/// (ordered before the replay), the replay runs, and the output buffer is downloaded into reused
/// page-locked memory (ordered after it). Nothing is allocated per pass, and the async path never
/// blocks the executor thread (no `to_vec` inside `forward_async`).
///
/// ```no_run
/// use cuda_async::staging::{download, upload, StagingPool};
/// use cuda_async::{memory, CudaGraph, DeviceOpExt, Module, Result};
/// use cuda_core::{DeviceBuffer, Stream};
///
/// struct Echo {
///     stream: Stream,
///     input: DeviceBuffer<f32>,
///     graph: CudaGraph<DeviceBuffer<f32>>, // its output: the buffer every replay writes
///     staging: StagingPool<f32>,
/// }
///
/// impl Echo {
///     fn new(stream: Stream, n: usize) -> Result<Self> {
///         let input = DeviceBuffer::zeros(&stream, n)?;
///         let output = DeviceBuffer::zeros(&stream, n)?;
///         let graph = memory::copy(&input, output).graph_on(&stream)?;
///         let staging = StagingPool::new(stream.device());
///         Ok(Echo { stream, input, graph, staging })
///     }
/// }
///
/// impl Module for Echo {
///     type Input = Vec<f32>;
///     type Output = Vec<f32>;
///     fn forward(&mut self, x: Vec<f32>) -> Result<Vec<f32>> {
///         upload(x, &mut self.input).sync_on(&self.stream)?; // ordered before the replay
///         self.graph.launch().sync_on(&self.stream)?;
///         Ok(self.graph.output().expect("recorded output").to_vec()?)
///     }
///     async fn forward_async(&mut self, x: Vec<f32>) -> Result<Vec<f32>> {
///         let mut host = self.staging.get(x.len())?;
///         upload(x, &mut self.input).on(&self.stream).await?;
///         self.graph.launch().on(&self.stream).await?; // never blocks the executor
///         let out = self.graph.output().expect("recorded output");
///         download(out, &mut host).on(&self.stream).await?;
///         Ok(host.as_slice()?.to_vec()) // `host` goes back to the pool
///     }
/// }
/// ```
///
/// To serve one model from many tasks through `&self`, wrap replicas in
/// [`crate::graph::Replicas`] (for modules that are also [`Replicable`]).
pub trait Module {
    /// What a pass consumes (e.g. a host batch).
    type Input;
    /// What a pass produces (e.g. host logits).
    type Output;

    /// Runs one forward pass and blocks until its result is ready.
    ///
    /// # Errors
    /// Whatever the implementation's ops and copies return.
    fn forward(&mut self, input: Self::Input) -> Result<Self::Output>;

    /// Runs one forward pass; the future resolves once the result is ready, without blocking the
    /// executor thread.
    ///
    /// # Errors
    /// As for [`Module::forward`].
    fn forward_async(&mut self, input: Self::Input) -> impl Future<Output = Result<Self::Output>> + Send;
}

/// A [`Module`] whose passes are independent of one another: a pass's output depends only on its
/// input and on what the module held before any pass (weights, configuration), never on what an
/// earlier pass left behind. Any replica then answers any input alike, which is what
/// [`crate::graph::Replicas`] assumes when it sends each pass to whichever replica is free; it
/// accepts only `Replicable` modules.
///
/// Do not implement it for a module that keeps state between passes. A decoder with a KV cache
/// (`models::llama::LlamaModel`) is the case in point: a sequence's steps must all run on the
/// replica that holds its cache, and `Replicas` would send them to any replica, where the step
/// would attend over another sequence's (or an empty) cache and answer wrongly without an error.
/// Serve such a module with one owner per replica that routes each sequence to its replica (e.g.
/// a task per model with a channel).
///
/// The trait is a promise the compiler cannot check, but breaking it is a logic error, not
/// undefined behaviour, so it is not `unsafe`.
///
/// ```
/// use cuda_async::graph::{Module, Replicable};
/// use cuda_async::Result;
///
/// /// Doubles its input: no state between passes.
/// struct Double;
///
/// impl Module for Double {
///     type Input = Vec<f32>;
///     type Output = Vec<f32>;
///     fn forward(&mut self, x: Vec<f32>) -> Result<Vec<f32>> {
///         Ok(x.into_iter().map(|v| 2.0 * v).collect())
///     }
///     async fn forward_async(&mut self, x: Vec<f32>) -> Result<Vec<f32>> {
///         self.forward(x)
///     }
/// }
///
/// impl Replicable for Double {}
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not `Replicable`: `Replicas` could run its passes on a replica that lacks \
               the state an earlier pass left",
    note = "implement `cuda_async::graph::Replicable` only for a module whose passes are \
            independent of one another (not, e.g., a decoder keeping per-sequence KV caches)"
)]
pub trait Replicable: Module {}
