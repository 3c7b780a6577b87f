//! The `DeviceOp` trait and the `Op` wrapper every constructor returns. The execution entry
//! points are in [`crate::DeviceOpExt`] (`ext.rs`); `.await` is in `future.rs`.

use crate::context::ExecutionContext;
use crate::error::Result;

/// A lazy description of GPU work.
///
/// Building an op does no GPU work and no device allocation. [`DeviceOp::execute`] queues the
/// work on the context's stream and returns the output **without waiting**: the output may refer
/// to device memory whose contents the queued work is still computing. The execution entry points
/// ([`DeviceOpExt::sync_on`], [`DeviceOpExt::sync`], `.await`, [`DeviceOpExt::schedule`]) hand the
/// output to the caller only after that work has completed; only the `unsafe`
/// [`DeviceOpExt::async_on`] hands it out early.
///
/// Implementations must queue all their work on `ctx.stream()` (or order other streams against
/// it), and must be `Send` so that futures holding them can move between executor threads.
pub trait DeviceOp: Send {
    /// What the op produces.
    type Output: Send;

    /// Queues the op's work on `ctx.stream()` and returns its output. Called by the execution entry
    /// points, and by combinators executing their inner ops on the same context.
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<Self::Output>;
}

/// The wrapper that every op constructor and combinator of this crate returns. It implements
/// [`DeviceOp`] by delegation and [`IntoFuture`], so `.await` works on every op through this one
/// impl (a blanket `IntoFuture` impl for all `DeviceOp`s is not allowed by Rust's orphan rules).
/// Wrap your own op types with [`Op::new`] (or [`DeviceOpExt::into_op`]) to await them.
#[must_use = "ops are lazy: nothing runs until .sync(), .sync_on() or .await"]
#[derive(Clone, Debug)]
pub struct Op<T>(pub(crate) T);

impl<T: DeviceOp> Op<T> {
    /// Wraps an op.
    pub fn new(op: T) -> Self {
        Op(op)
    }

    /// Unwraps the inner op.
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T: DeviceOp> DeviceOp for Op<T> {
    type Output = T::Output;
    #[inline]
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<T::Output> {
        self.0.execute(ctx)
    }
}
