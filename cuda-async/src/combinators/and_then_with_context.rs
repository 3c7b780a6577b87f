//! `and_then_with_context`: a fallible host step with access to the execution context.
//!
//! The closure runs on the host **when the op is executed** (enqueue time), not after the GPU
//! work: it sees handles (buffers, values), not finished results.

use crate::{DeviceOp, ExecutionContext, Result};

/// A fallible step with access to the context. Built by
/// [`crate::DeviceOpExt::and_then_with_context`].
pub struct AndThenWithContext<A, F> {
    a: A,
    f: F,
}

impl<A, F> AndThenWithContext<A, F> {
    pub(crate) fn new(a: A, f: F) -> Self {
        AndThenWithContext { a, f }
    }
}

impl<A, F, U> DeviceOp for AndThenWithContext<A, F>
where
    A: DeviceOp,
    F: FnOnce(A::Output, &ExecutionContext<'_>) -> Result<U> + Send,
    U: Send,
{
    type Output = U;
    #[inline]
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<U> {
        let out = self.a.execute(ctx)?;
        (self.f)(out, ctx)
    }
}

// Not a `GraphNode`: the closure gets the context's stream and could queue anything on it.
