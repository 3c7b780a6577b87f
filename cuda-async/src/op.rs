//! The `DeviceOp` trait and the `Op` wrapper every constructor returns. The execution entry
//! points are in [`crate::DeviceOpExt`] (`ext.rs`); `.await` is in `future.rs`.

use crate::context::ExecutionContext;
use crate::error::Result;

/// A lazy description of GPU work.
///
/// Building an op does no GPU work and no device allocation. [`DeviceOp::execute`] queues the
/// work on the context's stream and returns the output **without waiting**: the output may refer
/// to device memory whose contents the queued work is still computing. The execution entry points
/// ([`crate::DeviceOpExt::sync_on`], [`crate::DeviceOpExt::sync`], `.await`,
/// [`crate::DeviceOpExt::schedule`]) hand the output to the caller only after that work has
/// completed.
///
/// **An output must be sound to use as soon as `execute` returns.** Safe code reaches it then:
/// the closures of `map`, `inspect` and `then` receive it at enqueue time (and may send it away),
/// and [`crate::graph::CudaGraph::update`] returns it without waiting (found by review: the
/// entry points' wait is a convenience, not a guarantee an op may rely on). The buffers and
/// handles of this workspace meet that: every later device use is stream-ordered after the work,
/// and every host read waits for it. A user op whose output is a raw view of memory still being
/// written must wait inside `execute` or keep that view behind its own wait.
///
/// Implementations must queue all their work on `ctx.stream()` (or order other streams against
/// it), and must be `Send` so that futures holding them can move between executor threads.
///
/// # Examples
///
/// Ops compose lazily and run when asked:
///
/// ```no_run
/// # fn main() -> cuda_async::Result<()> {
/// use cuda_async::{memory, DeviceOpExt};
/// let op = memory::from_host(vec![1.0f32, 2.0, 3.0]) // nothing runs yet
///     .then(memory::dup)                              // a device copy of the upload
///     .then(memory::to_host);                         // back to pinned host memory
/// let host = op.sync()?;                              // runs, then waits
/// assert_eq!(host.as_slice()?, &[1.0, 2.0, 3.0]);
/// # Ok(()) }
/// ```
///
/// A user op queues its work on the context's stream (here through `cuda-core`):
///
/// ```no_run
/// use cuda_async::{DeviceOp, DeviceOpExt, ExecutionContext, Op, Result};
/// use cuda_core::DeviceBuffer;
///
/// struct Zero<'a>(&'a mut DeviceBuffer<f32>);
///
/// impl DeviceOp for Zero<'_> {
///     type Output = ();
///     fn execute(self, ctx: &ExecutionContext<'_>) -> Result<()> {
///         Ok(self.0.memset_zero(ctx.stream())?)
///     }
/// }
///
/// # fn main() -> cuda_async::Result<()> {
/// let s = cuda_core::Stream::new(&cuda_core::Device::new(0)?)?;
/// let mut buf = DeviceBuffer::filled(&s, 16, 1.0f32)?;
/// Zero(&mut buf).sync_on(&s)?;
/// # Ok(()) }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not GPU work: it does not implement `DeviceOp`",
    label = "expected an op (a `cuda_async` constructor, a combinator, a tuple of ops, or a type implementing `DeviceOp`)",
    note = "wrap a host value with `cuda_async::value(..)`; pass existing buffers as `&buf` / `&mut buf`"
)]
pub trait DeviceOp: Send {
    /// What the op produces.
    type Output: Send;

    /// Queues the op's work on `ctx.stream()` and returns its output. Called by the execution entry
    /// points, and by combinators executing their inner ops on the same context.
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<Self::Output>;
}

/// The wrapper that every op constructor and combinator of this crate returns. It implements
/// [`DeviceOp`] by delegation and [`IntoFuture`](std::future::IntoFuture), so `.await` works on
/// every op through this one impl (a blanket `IntoFuture` impl for all `DeviceOp`s is not allowed by
/// Rust's orphan rules). Wrap your own op types with [`Op::new`] (or
/// [`crate::DeviceOpExt::into_op`]) to await them.
///
/// ```no_run
/// # async fn demo() -> cuda_async::Result<()> {
/// use cuda_async::{memory, DeviceOpExt};
/// let v = memory::zeros::<f32>(1024).then(memory::to_host).await?;
/// assert!(v.as_slice()?.iter().all(|&x| x == 0.0));
/// # Ok(()) }
/// ```
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
