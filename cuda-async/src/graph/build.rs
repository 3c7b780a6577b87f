//! Explicitly built graphs with typed ops as nodes, and graph memory pools.

use super::{record, CaptureOptions, CudaGraph, NEXT_ID};
use crate::{GraphNode, Result};
use cuda_core::{Device, Graph, GraphBody, Node, PoolStats, Stream};
use std::sync::atomic::Ordering;

/// Typed ops as nodes of explicitly built graphs.
pub trait GraphBodyExt {
    /// Adds `op` (any [`GraphNode`] op, e.g. a `kernels::ops` launcher) as a node depending on
    /// `deps`, and returns its output with the node. The op is recorded once (nothing runs); a
    /// single kernel becomes a kernel node, anything else a child-graph node. Buffers it uses are
    /// kept alive by the graph, exactly as for captured graphs.
    fn add_op<O: GraphNode>(&mut self, op: O, deps: &[Node]) -> Result<(O::Output, Node)>;

    /// Records everything `f` records (a capture scope, as in [`CudaGraph::scope`]) and adds it
    /// as one node (a kernel node if it is a single kernel, else a child graph) depending on `deps`:
    /// conditional bodies built by capture.
    fn add_recorded<T>(
        &mut self,
        deps: &[Node],
        f: impl FnOnce(&mut super::Scope<'_>) -> Result<T>,
    ) -> Result<(T, Node)>;
}

impl GraphBodyExt for GraphBody<'_> {
    fn add_op<O: GraphNode>(&mut self, op: O, deps: &[Node]) -> Result<(O::Output, Node)> {
        self.add_recorded(deps, |s| s.record(op))
    }

    fn add_recorded<T>(
        &mut self,
        deps: &[Node],
        f: impl FnOnce(&mut super::Scope<'_>) -> Result<T>,
    ) -> Result<(T, Node)> {
        // A private stream per recording: no other thread can queue work on it, and two threads
        // recording at once never share a capture.
        let stream = Stream::new(self.device())?;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let (graph, out) = record(&stream, &CaptureOptions::default(), id, f)?;
        let node = self.add_captured(&graph, deps)?;
        Ok((out, node))
    }
}

impl CudaGraph<()> {
    /// Instantiates and uploads an explicitly built `graph` on `stream` (where `update` runs).
    ///
    /// # Errors
    /// Driver errors from instantiation or upload.
    pub fn from_graph(stream: &Stream, graph: Graph, options: CaptureOptions) -> Result<Self> {
        Self::build(stream, options, graph, (), NEXT_ID.fetch_add(1, Ordering::Relaxed))
    }
}

impl<T> CudaGraph<T> {
    /// Applies an explicitly built graph of the same topology in place (`cuGraphExecUpdate`) and
    /// reports the driver's verdict: [`cuda_core::ExecUpdate::Updated`], or `Refused` naming why
    /// and which kind of node. On refusal nothing changes. Parameter handles stop working after an
    /// update.
    ///
    /// # Errors
    /// Driver errors other than the refusal (which is reported as `Ok(Refused)`).
    pub fn update_from(&mut self, graph: Graph) -> Result<cuda_core::ExecUpdate> {
        let verdict = self.exec.update(&graph)?;
        if verdict == cuda_core::ExecUpdate::Updated {
            self.graph = graph;
            self.id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        }
        Ok(verdict)
    }

    /// Joins this graph to `pool`: every later replay is ordered after every earlier replay of
    /// every graph of the pool (whatever streams and threads they run on), so the pool's graphs
    /// never run concurrently and may share graph-owned memory. The ordering is atomic: each
    /// replay's wait on the pool, launch and join back are queued under the pool stream's enqueue
    /// lock (`cuda-core`'s serial streams), so two threads' replays cannot both wait on the same
    /// earlier state.
    pub fn join_pool(&mut self, pool: &GraphPool) {
        self.exec.serialize_through(&pool.stream);
        self.pool = Some(pool.stream.clone());
    }
}

/// A set of graphs that are never replayed concurrently, so the device's graph memory (the memory
/// of mem-alloc nodes) can be shared between them: the peak is that of the largest, not the sum
/// (PyTorch's `graph_pool_handle`, flodl's `MemPoolId`). Graph memory returns to the device pool
/// when the graphs are dropped; [`GraphPool::trim`] gives it back to the system.
#[derive(Clone)]
pub struct GraphPool {
    stream: Stream,
}

impl GraphPool {
    /// A new pool on `device`.
    ///
    /// # Errors
    /// Driver errors creating the pool's stream.
    ///
    /// ```no_run
    /// # fn demo(mut a: cuda_async::CudaGraph<()>, mut b: cuda_async::CudaGraph<()>) -> cuda_async::Result<()> {
    /// let pool = cuda_async::GraphPool::new(&cuda_core::Device::new(0)?)?;
    /// a.join_pool(&pool);
    /// b.join_pool(&pool); // replays of `a` and `b` never overlap, from any thread or stream
    /// # Ok(()) }
    /// ```
    pub fn new(device: &Device) -> Result<Self> {
        Ok(GraphPool { stream: Stream::new(device)? })
    }

    /// Usage of the device's graph memory (current and high-water marks).
    pub fn stats(&self) -> Result<PoolStats> {
        Ok(self.stream.device().graph_mem_stats()?)
    }

    /// Resets the high-water marks.
    pub fn reset_high_water_marks(&self) -> Result<()> {
        Ok(self.stream.device().reset_graph_mem_high()?)
    }

    /// Returns unused graph memory to the system (`cuDeviceGraphMemTrim`).
    pub fn trim(&self) -> Result<()> {
        Ok(self.stream.device().graph_mem_trim()?)
    }
}
