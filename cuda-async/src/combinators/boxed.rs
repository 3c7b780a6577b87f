//! `boxed`: type-erased ops.

use crate::{DeviceOp, ExecutionContext, Result};

trait DynOp<T>: Send {
    fn execute_boxed(self: Box<Self>, ctx: &ExecutionContext<'_>) -> Result<T>;
}

impl<O: DeviceOp> DynOp<O::Output> for O {
    fn execute_boxed(self: Box<Self>, ctx: &ExecutionContext<'_>) -> Result<O::Output> {
        (*self).execute(ctx)
    }
}

/// An op whose type is erased; only its output type is known. Built by
/// [`crate::DeviceOpExt::boxed`]. Useful to store ops of different types together or to return
/// them from branches.
pub struct BoxedOp<'a, T>(Box<dyn DynOp<T> + 'a>);

impl<'a, T: Send> BoxedOp<'a, T> {
    pub(crate) fn new<O: DeviceOp<Output = T> + 'a>(op: O) -> Self {
        BoxedOp(Box::new(op))
    }
}

impl<T: Send> DeviceOp for BoxedOp<'_, T> {
    type Output = T;
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<T> {
        self.0.execute_boxed(ctx)
    }
}
