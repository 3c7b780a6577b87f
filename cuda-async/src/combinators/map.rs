//! `map`: transform an op's output on the host.
//!
//! The closure runs on the host **when the op is executed** (enqueue time), not after the GPU
//! work: it sees handles (buffers, values), not finished results.

use crate::{DeviceOp, ExecutionContext, GraphNode, Result};

/// Transforms an op's output. Built by [`crate::DeviceOpExt::map`].
pub struct Map<A, F> {
    a: A,
    f: F,
}

impl<A, F> Map<A, F> {
    pub(crate) fn new(a: A, f: F) -> Self {
        Map { a, f }
    }
}

impl<A, F, U> DeviceOp for Map<A, F>
where
    A: DeviceOp,
    F: FnOnce(A::Output) -> U + Send,
    U: Send,
{
    type Output = U;
    #[inline]
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<U> {
        Ok((self.f)(self.a.execute(ctx)?))
    }
}

// SAFETY: runs the GraphNode `A`; the closure runs on the host and is given no stream.
unsafe impl<A, F, U> GraphNode for Map<A, F>
where
    A: GraphNode,
    F: FnOnce(A::Output) -> U + Send,
    U: Send,
{
}
