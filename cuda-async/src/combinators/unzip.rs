//! `unzip`: split an op with a pair output into two ops sharing one execution.

use super::Shared;
use crate::{DeviceOp, ExecutionContext, Op, Result};

/// The left half of [`crate::DeviceOpExt::unzip`].
pub struct UnzipLeft<O: DeviceOp>(Shared<O>);
/// The right half of [`crate::DeviceOpExt::unzip`].
pub struct UnzipRight<O: DeviceOp>(Shared<O>);

pub(crate) fn unzip<O, A, B>(op: O) -> (Op<UnzipLeft<O>>, Op<UnzipRight<O>>)
where
    O: DeviceOp<Output = (A, B)>,
    A: Send + Sync + Clone,
    B: Send + Sync + Clone,
{
    let s = Shared::new(op);
    (Op(UnzipLeft(s.clone())), Op(UnzipRight(s)))
}

impl<O, A, B> DeviceOp for UnzipLeft<O>
where
    O: DeviceOp<Output = (A, B)>,
    A: Send + Sync + Clone,
    B: Send + Sync + Clone,
{
    type Output = A;
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<A> {
        Ok(self.0.execute(ctx)?.0.clone())
    }
}

impl<O, A, B> DeviceOp for UnzipRight<O>
where
    O: DeviceOp<Output = (A, B)>,
    A: Send + Sync + Clone,
    B: Send + Sync + Clone,
{
    type Output = B;
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<B> {
        Ok(self.0.execute(ctx)?.1.clone())
    }
}
