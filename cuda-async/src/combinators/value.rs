//! `value`: an op that produces a host value and queues no GPU work.

use crate::{DeviceOp, ExecutionContext, GraphNode, Op, Result};

/// An op that yields a value. See [`value`].
#[derive(Clone, Debug)]
pub struct Value<T>(T);

/// An op that queues no work and yields `v`. Useful to start chains and to pass existing buffers
/// (`&buf`, `&mut buf`, owned or `Arc`) where an op is expected.
pub fn value<T: Send>(v: T) -> Op<Value<T>> {
    Op(Value(v))
}

impl<T: Send> DeviceOp for Value<T> {
    type Output = T;
    #[inline]
    fn execute(self, _ctx: &ExecutionContext<'_>) -> Result<T> {
        Ok(self.0)
    }
}

// SAFETY: queues nothing at all.
unsafe impl<T: Send> GraphNode for Value<T> {}
