//! `inspect`: look at an op's output on the host and pass it on.
//!
//! The closure runs on the host **when the op is executed** (enqueue time), not after the GPU
//! work: it sees handles (buffers, values), not finished results.

use crate::{DeviceOp, ExecutionContext, GraphNode, Result};

/// Looks at an op's output and passes it on. Built by [`crate::DeviceOpExt::inspect`].
pub struct Inspect<A, F> {
    a: A,
    f: F,
}

impl<A, F> Inspect<A, F> {
    pub(crate) fn new(a: A, f: F) -> Self {
        Inspect { a, f }
    }
}

impl<A, F> DeviceOp for Inspect<A, F>
where
    A: DeviceOp,
    F: FnOnce(&A::Output) + Send,
{
    type Output = A::Output;
    #[inline]
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<A::Output> {
        let out = self.a.execute(ctx)?;
        (self.f)(&out);
        Ok(out)
    }
}

// SAFETY: runs the GraphNode `A`; the closure runs on the host and is given no stream.
unsafe impl<A, F> GraphNode for Inspect<A, F>
where
    A: GraphNode,
    F: FnOnce(&A::Output) + Send,
{
}
