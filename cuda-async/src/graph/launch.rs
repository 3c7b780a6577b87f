//! `Launch`: a replay of a graph as a `DeviceOp`.

use super::CudaGraph;
use crate::{DeviceOp, ExecutionContext, Result};
use std::sync::atomic::Ordering;

/// One replay of a [`CudaGraph`], built by [`CudaGraph::launch`]. It borrows the graph, so it
/// cannot outlive it. It can run on any stream (`.sync_on(&s)`, `.sync()`, `.await`, or inside a
/// `then` chain); the replay is ordered with every other use of the buffers it touches.
pub struct Launch<'g, T> {
    pub(crate) graph: &'g CudaGraph<T>,
}

impl<T: Sync> DeviceOp for Launch<'_, T> {
    type Output = ();
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<()> {
        self.graph.exec.launch(ctx.stream())?;
        self.graph.replays.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
