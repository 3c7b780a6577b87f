//! CUDA graphs from ops: capture, scopes, replay as an awaitable op, updates, and `Module`.
//!
//! Safety comes from the layers below: every buffer a captured node uses is kept alive by the
//! executable graph (`cuda-core`'s capture registry), each replay is joined to the home streams of
//! those buffers like any other use, allocations, frees and synchronisation are refused
//! on a capturing stream, and only [`GraphNode`] ops can be recorded. See
//! `docs/guide.md`, "Graphs", for the numbered argument and the tests behind each point.

mod build;
mod launch;
mod model;
mod options;
mod params;
mod pool;
mod replicas;
mod scope;

pub use build::GraphBodyExt;
pub use launch::Launch;
pub use model::{Module, Replicable};
pub use options::CaptureOptions;
pub use params::{DeviceScalar, ParamHandle, TunableParam};
pub use pool::GraphPool;
pub use replicas::Replicas;
pub(crate) use scope::record;
pub use scope::Scope;

use crate::runtime::execute_locked;
use crate::{DeviceError, DeviceOp, GraphNode, Op, Result};
use cuda_core::{ExecUpdate, Graph, GraphExec, Stream};
use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A captured, instantiated and uploaded CUDA graph, with the output of the recording.
///
/// Guarantees (see the module docs): replays cannot run on freed memory, do not race other uses of
/// the buffers they touch, and are ordered with [`CudaGraph::update`]s and with host reads of those
/// buffers, on whatever stream each runs.
pub struct CudaGraph<T> {
    pub(crate) exec: GraphExec,
    graph: Graph,
    stream: Stream,
    options: CaptureOptions,
    output: Option<T>,
    pub(crate) replays: AtomicU64,
    id: u64,
    /// The pool streams every replay is serialised through: one per [`GraphPool`] joined, kept
    /// for the executable graphs built later (found by review: only the last pool joined was
    /// kept, so a rebuild by `recapture` or `reset_and_recapture` dropped the earlier pools'
    /// ordering).
    pub(crate) pools: Vec<Stream>,
}

impl<T> std::fmt::Debug for CudaGraph<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaGraph")
            .field("stream", &self.stream)
            .field("replays", &self.replays())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Which path [`CudaGraph::recapture`] took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecapturePath {
    /// The topology was unchanged: the executable graph was updated in place (`cuGraphExecUpdate`).
    Updated,
    /// The executable graph was instantiated anew; `reason` says why the update was refused (or
    /// that a reset was asked for).
    Reinstantiated {
        /// Why the in-place update was not used.
        reason: String,
    },
}

impl<T> CudaGraph<T> {
    pub(crate) fn build(
        stream: &Stream,
        options: CaptureOptions,
        graph: Graph,
        output: T,
        id: u64,
    ) -> Result<Self> {
        let exec = graph.instantiate_and_upload(options.flags, stream)?;
        Ok(CudaGraph {
            exec,
            graph,
            stream: stream.clone(),
            options,
            output: Some(output),
            replays: AtomicU64::new(0),
            id,
            pools: Vec::new(),
        })
    }

    /// Instantiates and uploads `graph` with this graph's options, serialised through its pools.
    fn instantiate(&self, graph: &Graph) -> Result<GraphExec> {
        let mut exec = graph.instantiate_and_upload(self.options.flags, &self.stream)?;
        for p in &self.pools {
            exec.serialize_through(p);
        }
        Ok(exec)
    }

    /// Captures everything `f` records into one graph on `stream` (modelled on
    /// `std::thread::scope`), then instantiates and uploads it. `f` gets a [`Scope`]; its return
    /// value becomes the graph's output. This is the one way to capture: with options (capture
    /// mode, instantiate flags, warm-up runs), the same call is
    /// [`CaptureOptions::new()...scope(stream, f)`](CaptureOptions::scope), as
    /// `std::thread::Builder` is to `std::thread::spawn`; a single op is captured with
    /// [`op.graph_on(&stream)`](crate::DeviceOpExt::graph_on).
    ///
    /// While `f` runs, nested `sync`/`sync_on`/`.await`/captures on this thread are errors
    /// ([`DeviceError::Lock`]); other threads keep running their own work, but their work on
    /// `stream`, or on buffers homed on it, is refused with a capture error until the scope ends
    /// (never a wait, so a scope that waits for another thread cannot deadlock). Waits that would
    /// fork the capture onto another stream are refused too. If `f` returns an error or panics, the
    /// capture is ended and discarded, and the stream and context stay usable.
    ///
    /// # Errors
    /// The error `f` returns; capture errors (e.g. `stream` is already being captured, or another
    /// thread is in a synchronize, query or blocking copy on it: try again once that is done);
    /// driver errors from ending, instantiating or uploading the graph.
    ///
    /// ```no_run
    /// # fn main() -> cuda_async::Result<()> {
    /// use cuda_async::{memory, CudaGraph, DeviceOpExt};
    /// use cuda_core::{Device, DeviceBuffer, Stream};
    /// let dev = Device::new(0)?;
    /// let s = Stream::new(&dev)?;
    /// let input = DeviceBuffer::from_host(&s, &[1.0f32; 1024])?;
    /// let (mid, out) = (DeviceBuffer::<f32>::zeros(&s, 1024)?, DeviceBuffer::<f32>::zeros(&s, 1024)?);
    /// let mut graph = CudaGraph::scope(&s, |scope| {
    ///     let mid = scope.record(memory::copy(&input, mid))?;
    ///     scope.record(memory::copy(&mid, out)).map(|out| (mid, out))
    /// })?;
    /// graph.launch().sync_on(&s)?; // input -> mid -> out, as one replay
    /// let (_mid, out) = graph.take_output().unwrap();
    /// assert_eq!(out.to_vec()?, vec![1.0; 1024]);
    /// # Ok(()) }
    /// ```
    pub fn scope(stream: &Stream, f: impl FnOnce(&mut Scope<'_>) -> Result<T>) -> Result<Self> {
        CaptureOptions::new().scope(stream, f)
    }

    /// Queues one replay on `stream` and returns without waiting. Safe: a replay yields nothing
    /// to the host, its buffers are kept alive by the graph, and every later use of them (reads
    /// included) is ordered after it.
    ///
    /// # Errors
    /// [`DeviceError::Lock`] inside another op's execution; capture errors (another thread is
    /// capturing `stream`, or a buffer's home stream is being captured); driver errors.
    ///
    /// ```no_run
    /// # fn demo(graph: &cuda_async::CudaGraph<()>, s: &cuda_core::Stream) -> cuda_async::Result<()> {
    /// for _ in 0..100 {
    ///     graph.enqueue(s)?; // no host wait between replays
    /// }
    /// s.synchronize()?;
    /// # Ok(()) }
    /// ```
    pub fn enqueue(&self, stream: &Stream) -> Result<()>
    where
        T: Sync,
    {
        execute_locked(self.launch(), stream, "CudaGraph::enqueue inside another op's execution")
    }

    /// One replay as an op. It borrows the graph, so it cannot outlive it.
    ///
    /// ```no_run
    /// # async fn demo(graph: cuda_async::CudaGraph<()>) -> cuda_async::Result<()> {
    /// graph.launch().await?; // awaited from an async task: the executor thread never blocks
    /// # Ok(()) }
    /// ```
    ///
    /// The replay borrows the graph, so it cannot outlive it:
    ///
    /// ```compile_fail
    /// # fn demo(s: &cuda_core::Stream, b: &mut cuda_core::DeviceBuffer<f32>) -> cuda_async::Result<()> {
    /// use cuda_async::{memory, DeviceOpExt};
    /// let replay = {
    ///     let graph = memory::fill(b, 1.0f32).graph_on(s)?;
    ///     graph.launch() // error: `graph` does not live long enough
    /// };
    /// replay.sync_on(s)?;
    /// # Ok(()) }
    /// ```
    pub fn launch(&self) -> Op<Launch<'_, T>>
    where
        T: Sync,
    {
        Op::new(Launch { graph: self })
    }

    /// Takes the output of the recording (e.g. handles to the graph's output buffers).
    pub fn take_output(&mut self) -> Option<T> {
        self.output.take()
    }

    /// The output of the recording, if not taken.
    pub fn output(&self) -> Option<&T> {
        self.output.as_ref()
    }

    /// Executes `op` (typically a copy into one of the graph's input buffers) on the graph's
    /// stream without waiting. Like every buffer use, it is ordered after replays already queued and
    /// before replays queued later, whichever streams they run on.
    ///
    /// # Errors
    /// The op's errors; [`DeviceError::Lock`] inside another op's execution.
    ///
    /// ```no_run
    /// # fn demo(s: &cuda_core::Stream) -> cuda_async::Result<()> {
    /// use cuda_async::{memory, CudaGraph, DeviceOpExt};
    /// use cuda_core::DeviceBuffer;
    /// let mut input = DeviceBuffer::zeros(s, 4)?;
    /// let output = DeviceBuffer::zeros(s, 4)?;
    /// let graph = memory::copy(&input, output).graph_on(s)?;
    /// graph.update(memory::copy(&DeviceBuffer::from_host(s, &[1.0f32; 4])?, &mut input))?;
    /// graph.launch().sync_on(s)?; // sees the new input
    /// # Ok(()) }
    /// ```
    pub fn update<O: DeviceOp>(&self, op: O) -> Result<O::Output> {
        execute_locked(op, &self.stream, "CudaGraph::update inside another op's execution")
    }

    /// How many replays have been queued.
    pub fn replays(&self) -> u64 {
        self.replays.load(Ordering::Relaxed)
    }

    /// The stream the graph was captured on (where `update` runs).
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The captured graph (for introspection: node count, DOT export).
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Sets a tunable kernel parameter for future replays (`cuGraphExecKernelNodeSetParams`);
    /// replays already queued are unaffected. The handle must come from this graph's current
    /// capture.
    ///
    /// # Errors
    /// [`DeviceError::Misuse`] for a handle of another graph or of an earlier capture; driver
    /// errors (e.g. a size mismatch the driver detects).
    pub fn set_param<P: cuda_core::DeviceRepr>(&self, handle: &ParamHandle<P>, value: P) -> Result<()> {
        if handle.graph_id != self.id {
            return Err(DeviceError::Misuse(
                "the parameter handle belongs to another graph or capture".into(),
            ));
        }
        // SAFETY: the handle was made by `Scope::record_param` during this graph's current capture
        // (same id), so `node` is a kernel node of `self.graph`, which is alive and is the graph
        // `self.exec` was instantiated from. `TunableParam` guarantees parameter `index` has type
        // `P` and accepts any value; the driver also checks the size.
        unsafe { self.exec.set_kernel_param(&self.graph, handle.node, &handle.params, handle.index, value)? };
        Ok(())
    }

    /// Records `op` again and applies it: in place with `cuGraphExecUpdate` when the topology is
    /// unchanged, otherwise by instantiating anew. Returns which path was taken. Parameter handles
    /// of the previous capture stop working either way.
    ///
    /// # Errors
    /// As for [`CudaGraph::scope`].
    pub fn recapture<O: GraphNode<Output = T>>(&mut self, op: O) -> Result<RecapturePath> {
        self.recapture_scope(|s| s.record(op))
    }

    /// [`CudaGraph::recapture`] with a scope closure.
    ///
    /// # Errors
    /// As for [`CudaGraph::scope`].
    pub fn recapture_scope(&mut self, f: impl FnOnce(&mut Scope<'_>) -> Result<T>) -> Result<RecapturePath> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let (graph, output) = record(&self.stream, &self.options, id, f)?;
        let path = match self.exec.update(&graph)? {
            ExecUpdate::Updated => {
                // Node handles of the new graph do not name the executable's nodes: invalidate.
                self.id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
                RecapturePath::Updated
            }
            ExecUpdate::Refused { reason, node_type } => {
                self.exec = self.instantiate(&graph)?;
                self.id = id;
                let at = node_type.map(|t| format!(" at a {t} node")).unwrap_or_default();
                RecapturePath::Reinstantiated { reason: format!("{reason}{at}") }
            }
        };
        // The old graph and output (user code in their `Drop`s) go after both are replaced.
        let old = (std::mem::replace(&mut self.graph, graph), self.output.replace(output));
        drop(old);
        Ok(path)
    }

    /// Drops the executable graph and captures `op` anew, always instantiating (flodl's `reset`
    /// followed by a capture). Parameter handles of the previous capture stop working.
    ///
    /// # Errors
    /// As for [`CudaGraph::scope`].
    pub fn reset_and_recapture<O: GraphNode<Output = T>>(&mut self, op: O) -> Result<()> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let (graph, output) = record(&self.stream, &self.options, id, |s| s.record(op))?;
        self.exec = self.instantiate(&graph)?;
        // The id, the graph and the output are replaced before the old ones are dropped: their
        // `Drop`s can run user code, and if one panics, handles of the destroyed graph must
        // already be stale (found by review: with the id set last, they passed `set_param`'s
        // check and named freed nodes).
        self.id = id;
        let old = (std::mem::replace(&mut self.graph, graph), self.output.replace(output));
        drop(old);
        Ok(())
    }
}
