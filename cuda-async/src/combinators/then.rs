//! `then`: sequence two ops on one stream.

use crate::{DeviceOp, ExecutionContext, GraphNode, Result};

/// Runs `A`, passes its output to `F`, then runs the op `F` returns, on the same stream (so in
/// order). Built by [`crate::DeviceOpExt::then`].
pub struct Then<A, F> {
    a: A,
    f: F,
}

impl<A, F> Then<A, F> {
    pub(crate) fn new(a: A, f: F) -> Self {
        Then { a, f }
    }
}

impl<A, F, B> DeviceOp for Then<A, F>
where
    A: DeviceOp,
    F: FnOnce(A::Output) -> B + Send,
    B: DeviceOp,
{
    type Output = B::Output;
    #[inline]
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<B::Output> {
        let out = self.a.execute(ctx)?;
        (self.f)(out).execute(ctx)
    }
}

// SAFETY: runs `A`, then the op `F` returns, both GraphNodes; the closure itself runs on the host
// and is given no stream.
unsafe impl<A, F, B> GraphNode for Then<A, F>
where
    A: GraphNode,
    F: FnOnce(A::Output) -> B + Send,
    B: GraphNode,
{
}
