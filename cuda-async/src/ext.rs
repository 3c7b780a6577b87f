//! `DeviceOpExt`: the execution entry points and combinator constructors of every op.

use crate::context::ExecutionContext;
use crate::error::Result;
use crate::future::DeviceFuture;
use crate::lock::execute_locked;
use crate::op::{DeviceOp, Op};
use crate::scheduling::{self, SchedulingPolicy};
use crate::GraphNode;
use cuda_core::Stream;
use std::sync::Arc;

/// The function [`DeviceOpExt::first`] maps with.
pub type FirstFn<T> = fn(T) -> <T as crate::combinators::TupleOutput>::First;
/// The function [`DeviceOpExt::last`] maps with.
pub type LastFn<T> = fn(T) -> <T as crate::combinators::TupleOutput>::Last;

/// Execution entry points and combinators, for every [`DeviceOp`].
pub trait DeviceOpExt: DeviceOp + Sized {
    /// Runs the op on `stream` and blocks until its work has completed.
    /// Errors: the op's own errors, a driver error from the synchronize (e.g. a kernel fault), or
    /// [`crate::DeviceError::Lock`] when called from inside another op's execution.
    fn sync_on(self, stream: &Stream) -> Result<Self::Output> {
        let out = execute_locked(self, stream, "sync_on called inside another op's execution")?;
        stream.synchronize()?;
        Ok(out)
    }

    /// Runs the op on a stream chosen by the default policy and blocks until it has completed.
    fn sync(self) -> Result<Self::Output> {
        let stream = scheduling::default_policy()?.next_stream()?;
        let out = execute_locked(self, &stream, "sync called inside another op's execution")?;
        stream.synchronize()?;
        Ok(out)
    }

    /// Queues the op on `stream` and returns its output at once, without waiting.
    ///
    /// # Safety
    /// The output may refer to results the GPU has not finished computing. The ops and buffers of
    /// this workspace stay sound anyway (every later device use is stream-ordered after the work
    /// and every host read waits for it), but a user-defined [`DeviceOp`] may rely on its output
    /// not being used before completion, which this entry point does not guarantee. The caller must
    /// not let such an output be used before `stream` has reached this point.
    unsafe fn async_on(self, stream: &Stream) -> Result<Self::Output> {
        execute_locked(self, stream, "async_on called inside another op's execution")
    }

    /// A future that runs the op on a stream chosen by `policy` when first polled and resolves
    /// once the work has completed, without blocking the executor thread.
    fn schedule(self, policy: &Arc<dyn SchedulingPolicy>) -> DeviceFuture<Self> {
        DeviceFuture::with_policy(self, policy.clone())
    }

    /// A future that runs the op on `stream` when first polled and resolves once its work has
    /// completed, without blocking the executor thread.
    fn on(self, stream: &Stream) -> DeviceFuture<Self> {
        DeviceFuture::on_stream(self, stream.clone())
    }

    /// Captures the op into a replayable graph on `stream` (nothing runs). See
    /// [`crate::CudaGraph::capture`].
    fn graph_on(self, stream: &Stream) -> Result<crate::CudaGraph<Self::Output>>
    where
        Self: GraphNode,
    {
        crate::CudaGraph::capture(stream, self)
    }

    /// Captures the op into a graph on a new stream of the default device (the graph's stream,
    /// where `update` runs; replays may run on any stream). A private stream, so that no other
    /// work can be queued on it while it is captured.
    fn graph(self) -> Result<crate::CudaGraph<Self::Output>>
    where
        Self: GraphNode,
    {
        let stream = Stream::new(&scheduling::default_device()?)?;
        crate::CudaGraph::capture(&stream, self)
    }

    /// Wraps the op in [`Op`] so that it can be awaited directly.
    fn into_op(self) -> Op<Self> {
        Op(self)
    }

    /// Runs `f` on the output and then the op it returns, on the same stream, in order.
    fn then<F, B>(self, f: F) -> Op<crate::combinators::Then<Self, F>>
    where
        F: FnOnce(Self::Output) -> B + Send,
        B: DeviceOp,
    {
        Op(crate::combinators::Then::new(self, f))
    }

    /// Transforms the output on the host (at enqueue time, not after the GPU work).
    fn map<F, U>(self, f: F) -> Op<crate::combinators::Map<Self, F>>
    where
        F: FnOnce(Self::Output) -> U + Send,
        U: Send,
    {
        Op(crate::combinators::Map::new(self, f))
    }

    /// Looks at the output on the host (at enqueue time) and passes it on.
    fn inspect<F>(self, f: F) -> Op<crate::combinators::Inspect<Self, F>>
    where
        F: FnOnce(&Self::Output) + Send,
    {
        Op(crate::combinators::Inspect::new(self, f))
    }

    /// Like [`DeviceOpExt::map`], with access to the execution context (stream, device) and able
    /// to fail.
    fn and_then_with_context<F, U>(self, f: F) -> Op<crate::combinators::AndThenWithContext<Self, F>>
    where
        F: FnOnce(Self::Output, &ExecutionContext<'_>) -> Result<U> + Send,
        U: Send,
    {
        Op(crate::combinators::AndThenWithContext::new(self, f))
    }

    /// A clone-able handle that runs the op at most once; every clone yields an `Arc` of the
    /// output. See [`crate::combinators::Shared`].
    fn shared(self) -> Op<crate::combinators::Shared<Self>>
    where
        Self: 'static,
        Self::Output: Sync,
    {
        Op(crate::combinators::Shared::new(self))
    }

    /// Erases the op's type.
    fn boxed<'a>(self) -> Op<crate::combinators::BoxedOp<'a, Self::Output>>
    where
        Self: 'a,
    {
        Op(crate::combinators::BoxedOp::new(self))
    }

    /// The first element of a tuple output.
    fn first(self) -> Op<crate::combinators::Map<Self, FirstFn<Self::Output>>>
    where
        Self::Output: crate::combinators::TupleOutput,
    {
        Op(crate::combinators::Map::new(self, <Self::Output as crate::combinators::TupleOutput>::first))
    }

    /// The last element of a tuple output.
    fn last(self) -> Op<crate::combinators::Map<Self, LastFn<Self::Output>>>
    where
        Self::Output: crate::combinators::TupleOutput,
    {
        Op(crate::combinators::Map::new(self, <Self::Output as crate::combinators::TupleOutput>::last))
    }

    /// Splits an op with a pair output into two ops that share one execution.
    fn unzip<A, B>(
        self,
    ) -> (Op<crate::combinators::UnzipLeft<Self>>, Op<crate::combinators::UnzipRight<Self>>)
    where
        Self: DeviceOp<Output = (A, B)> + 'static,
        A: Send + Sync + Clone,
        B: Send + Sync + Clone,
    {
        crate::combinators::unzip(self)
    }
}

impl<T: DeviceOp> DeviceOpExt for T {}
