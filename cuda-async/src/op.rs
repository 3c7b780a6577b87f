//! The `DeviceOp` trait, the `Op` wrapper every constructor returns, and the execution entry
//! points.

use crate::context::ExecutionContext;
use crate::error::Result;
use crate::future::DeviceFuture;
use crate::lock;
use crate::scheduling::{self, SchedulingPolicy};
use crate::GraphNode;
use cuda_core::Stream;
use std::sync::Arc;

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

impl<T: DeviceOp> std::future::IntoFuture for Op<T> {
    type Output = Result<T::Output>;
    type IntoFuture = DeviceFuture<T>;
    /// Runs on a stream chosen by the default policy of the default device, when first polled.
    fn into_future(self) -> DeviceFuture<T> {
        DeviceFuture::with_default_policy(self.0)
    }
}

/// Runs `op` on `stream` under the execution lock, without waiting.
#[inline]
pub(crate) fn execute_locked<O: DeviceOp>(op: O, stream: &Stream, entry: &'static str) -> Result<O::Output> {
    let _guard = lock::acquire(entry)?;
    op.execute(&ExecutionContext::new(stream))
}

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
