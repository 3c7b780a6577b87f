//! `map`, `inspect` and `and_then_with_context`: host-side steps in a chain.
//!
//! Their closures run on the host **when the op is executed** (enqueue time), not after the GPU
//! work: they see handles (buffers, values), not finished results.

use crate::{DeviceOp, ExecutionContext, Result};

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
