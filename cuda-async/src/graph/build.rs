//! Explicitly built graphs with typed ops as nodes.

use super::{record, CaptureOptions, CudaGraph, NEXT_ID};
use crate::{GraphNode, Result};
use cuda_core::{Graph, GraphBody, Node, Stream};
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
            // Handles go stale before the old graph (and what it keeps) is dropped.
            self.id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
            self.graph = graph;
        }
        Ok(verdict)
    }
}
