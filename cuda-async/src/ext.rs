//! `DeviceOpExt`: the execution entry points and combinator constructors of every op.

use crate::context::ExecutionContext;
use crate::error::Result;
use crate::op::{DeviceOp, Op};
use crate::runtime::{execute_locked, DeviceFuture};
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
    ///
    /// ```no_run
    /// # fn main() -> cuda_async::Result<()> {
    /// use cuda_async::{memory, DeviceOpExt};
    /// let s = cuda_core::Stream::new(&cuda_core::Device::new(0)?)?;
    /// let buf = memory::full(1 << 20, 2.5f32).sync_on(&s)?; // allocated and filled on `s`
    /// assert_eq!(buf.len(), 1 << 20);
    /// # Ok(()) }
    /// ```
    fn sync_on(self, stream: &Stream) -> Result<Self::Output> {
        let out = execute_locked(self, stream, "sync_on called inside another op's execution")?;
        stream.synchronize()?;
        Ok(out)
    }

    /// Runs the op on a stream chosen by the default policy and blocks until it has completed.
    ///
    /// # Errors
    /// As for [`DeviceOpExt::sync_on`], plus a scheduling error if the default policy has no
    /// stream (no GPU).
    ///
    /// ```no_run
    /// # fn main() -> cuda_async::Result<()> {
    /// use cuda_async::{memory, DeviceOpExt};
    /// let ones = memory::ones::<f64>(8).then(memory::to_host).sync()?;
    /// assert_eq!(ones.as_slice()?, &[1.0; 8]);
    /// # Ok(()) }
    /// ```
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
    /// and every host read waits for it), and so must every [`DeviceOp`]'s output (see the trait's
    /// docs: safe code reaches outputs at enqueue time through `map` closures and
    /// `CudaGraph::update` as well). The `unsafe` marks the entry point that, alone among the
    /// entry points, returns before the work is done: the caller states that it does not treat
    /// the output's *values* as final (e.g. host data it copies out of device memory itself)
    /// before `stream` has reached this point.
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
    ///
    /// ```no_run
    /// # async fn demo(s: cuda_core::Stream) -> cuda_async::Result<()> {
    /// use cuda_async::{memory, DeviceOpExt};
    /// let buf = memory::zeros::<u32>(256).on(&s).await?; // the executor thread never blocks
    /// # Ok(()) }
    /// ```
    fn on(self, stream: &Stream) -> DeviceFuture<Self> {
        DeviceFuture::on_stream(self, stream.clone())
    }

    /// Captures the op into a replayable graph on `stream` (nothing runs), with default
    /// [`CaptureOptions`](crate::CaptureOptions): the one-op shorthand of
    /// [`CudaGraph::scope`](crate::CudaGraph::scope)`(stream, |s| s.record(op))`.
    ///
    /// # Errors
    /// Capture errors (the stream is already being captured, or the op did something a capture
    /// refuses) and driver errors from instantiation.
    ///
    /// ```no_run
    /// # fn main() -> cuda_async::Result<()> {
    /// use cuda_async::{memory, DeviceOpExt};
    /// use cuda_core::{Device, DeviceBuffer, Stream};
    /// let s = Stream::new(&Device::new(0)?)?;
    /// let (src, dst) = (DeviceBuffer::filled(&s, 64, 1u32)?, DeviceBuffer::zeros(&s, 64)?);
    /// let graph = memory::copy(&src, dst).graph_on(&s)?; // recorded, not run
    /// graph.launch().sync_on(&s)?;                        // now it runs
    /// # Ok(()) }
    /// ```
    ///
    /// Only [`GraphNode`] ops can be recorded: an allocating op does not compile.
    ///
    /// ```compile_fail
    /// # fn main() -> cuda_async::Result<()> {
    /// use cuda_async::{memory, DeviceOpExt};
    /// let s = cuda_core::Stream::new(&cuda_core::Device::new(0)?)?;
    /// let graph = memory::zeros::<f32>(64).graph_on(&s)?; // error: `Full<f32>` is not a GraphNode
    /// # Ok(()) }
    /// ```
    fn graph_on(self, stream: &Stream) -> Result<crate::CudaGraph<Self::Output>>
    where
        Self: GraphNode,
    {
        crate::CudaGraph::scope(stream, |s| s.record(self))
    }

    /// Captures the op into a graph on a new stream of the default device (the graph's stream,
    /// where `update` runs; replays may run on any stream). A private stream, so that no other
    /// work can be queued on it while it is captured.
    fn graph(self) -> Result<crate::CudaGraph<Self::Output>>
    where
        Self: GraphNode,
    {
        let stream = Stream::new(&scheduling::default_device()?)?;
        crate::CudaGraph::scope(&stream, |s| s.record(self))
    }

    /// Wraps the op in [`Op`] so that it can be awaited directly.
    fn into_op(self) -> Op<Self> {
        Op(self)
    }

    /// Runs `f` on the output and then the op it returns, on the same stream, in order.
    ///
    /// ```no_run
    /// # fn main() -> cuda_async::Result<()> {
    /// use cuda_async::{memory, DeviceOpExt};
    /// // Allocate, then fill the new buffer: both on one stream, in order.
    /// let b = memory::zeros::<f32>(16).then(|b| memory::fill(b, 2.0)).sync()?;
    /// assert_eq!(b.to_vec()?, vec![2.0; 16]);
    /// # Ok(()) }
    /// ```
    fn then<F, B>(self, f: F) -> Op<crate::combinators::Then<Self, F>>
    where
        F: FnOnce(Self::Output) -> B + Send,
        B: DeviceOp,
    {
        Op(crate::combinators::Then::new(self, f))
    }

    /// Transforms the output on the host (at enqueue time, not after the GPU work).
    ///
    /// ```no_run
    /// # fn main() -> cuda_async::Result<()> {
    /// use cuda_async::{memory, DeviceOpExt};
    /// let len = memory::zeros::<f32>(100).map(|b| b.len()).sync()?;
    /// assert_eq!(len, 100);
    /// # Ok(()) }
    /// ```
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
    ///
    /// ```no_run
    /// # fn main() -> cuda_async::Result<()> {
    /// use cuda_async::{memory, DeviceOpExt, Op};
    /// use cuda_async::combinators::BoxedOp;
    /// let ops: Vec<Op<BoxedOp<'static, cuda_core::DeviceBuffer<f32>>>> =
    ///     vec![memory::zeros(4).boxed(), memory::ones(4).boxed()];
    /// let bufs = cuda_async::join_all(ops).sync()?;
    /// assert_eq!(bufs.len(), 2);
    /// # Ok(()) }
    /// ```
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
