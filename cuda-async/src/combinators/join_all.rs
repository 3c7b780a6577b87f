//! `join_all`: a vector of ops of one type, run in order on one stream.

use crate::{DeviceOp, ExecutionContext, GraphNode, Op, Result};

/// Runs every op of a vector in order. See [`join_all`].
pub struct JoinAll<O>(Vec<O>);

/// Joins any number of ops of one type into an op yielding the `Vec` of their outputs.
///
/// ```no_run
/// # fn main() -> cuda_async::Result<()> {
/// use cuda_async::{join_all, memory, DeviceOpExt};
/// let bufs = join_all((0..4).map(|i| memory::full(16, i as f32))).sync()?;
/// assert_eq!(bufs.len(), 4);
/// # Ok(()) }
/// ```
pub fn join_all<O: DeviceOp>(ops: impl IntoIterator<Item = O>) -> Op<JoinAll<O>> {
    Op(JoinAll(ops.into_iter().collect()))
}

impl<O: DeviceOp> DeviceOp for JoinAll<O> {
    type Output = Vec<O::Output>;
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<Vec<O::Output>> {
        self.0.into_iter().map(|op| op.execute(ctx)).collect()
    }
}

// SAFETY: runs GraphNodes in order.
unsafe impl<O: GraphNode> GraphNode for JoinAll<O> {}
