//! `KernelOp`: the generic lazy op around a launch closure (what `kernels` builds on).

use super::args::{Elems, InputBufs, IntoInputs, IntoOutputs, OutputBufs, ParamList};
use crate::{DeviceOp, ExecutionContext, GraphNode, Op, Result};
use std::marker::PhantomData;

/// The launch step of a [`KernelOp`]: queues work on `ctx.stream()` given the executed input
/// buffers (`(&DeviceBuffer<_>, ..)`) and output buffers (`(&mut DeviceBuffer<_>, ..)`).
/// Implemented by every matching closure; implement it on a named type to name the op's type.
/// What it may do is the promise of [`KernelOp::new`].
pub trait LaunchFn<EI: Elems, EO: Elems, IH: InputBufs<EI>, OH: OutputBufs<EO>>: Send {
    /// Queues the work (see [`KernelOp::new`]'s safety section for what it may queue).
    ///
    /// # Errors
    /// Whatever the launch reports; a length mismatch should be [`crate::DeviceError::Shape`].
    fn launch<'a>(
        self,
        ctx: &ExecutionContext<'_>,
        inputs: EI::Refs<'a>,
        outputs: EO::Muts<'a>,
    ) -> Result<()>;
}

impl<EI, EO, IH, OH, F> LaunchFn<EI, EO, IH, OH> for F
where
    EI: Elems,
    EO: Elems,
    IH: InputBufs<EI>,
    OH: OutputBufs<EO>,
    F: for<'a> FnOnce(&ExecutionContext<'_>, EI::Refs<'a>, EO::Muts<'a>) -> Result<()> + Send,
{
    fn launch<'a>(
        self,
        ctx: &ExecutionContext<'_>,
        inputs: EI::Refs<'a>,
        outputs: EO::Muts<'a>,
    ) -> Result<()> {
        self(ctx, inputs, outputs)
    }
}

/// A lazy op that executes its input argument ops, then its output argument ops (in argument
/// order, on the context's stream), checks that every buffer lives on the stream's device, runs
/// its launch closure with `(&DeviceBuffer, ..)` inputs and `(&mut DeviceBuffer, ..)` outputs, and
/// yields the output handles (so chains continue). Built by [`KernelOp::new`]; a [`GraphNode`]
/// exactly when every argument op is one.
///
/// For a kernel of your own from CUDA C, PTX or a cubin, the typed [`super::Launcher`] is simpler:
/// it builds this op for you and passes the buffers and scalars to the kernel itself.
pub struct KernelOp<EI, EO, I, O, F> {
    name: &'static str,
    inputs: I,
    outputs: O,
    launch: F,
    _e: PhantomData<fn() -> (EI, EO)>,
}

impl<EI, EO, I, O, F> KernelOp<EI, EO, I, O, F>
where
    EI: Elems,
    EO: Elems,
    I: DeviceOp,
    I::Output: InputBufs<EI>,
    O: DeviceOp,
    O::Output: OutputBufs<EO>,
    F: LaunchFn<EI, EO, I::Output, O::Output>,
{
    /// An op named `name` (in its errors) over `inputs` (a tuple of [`crate::IntoBufferOp`]s, e.g.
    /// `(&x, &w)`, or `()`), `outputs` (a tuple of writable ones, e.g. `(&mut y,)`) and `launch`,
    /// which queues the work on `ctx.stream()` given the executed buffers.
    ///
    /// ```no_run
    /// # fn main() -> cuda_async::Result<()> {
    /// use cuda_async::kernel::KernelOp;
    /// use cuda_async::{DeviceError, DeviceOpExt};
    /// use cuda_core::{DeviceBuffer, Function, LaunchConfig};
    /// # let f: Function = todo!();
    /// # let (x, mut y): (DeviceBuffer<f32>, DeviceBuffer<f32>) = todo!();
    /// // `twice(const float* x, float* y, unsigned long long n)`: y[i] = 2 x[i] for i < n.
    /// // SAFETY: the closure only launches `twice`, which reads only x[..n] and writes only y[..n],
    /// // after checking that both hold n elements; it allocates nothing and does not synchronise.
    /// // This block also covers the closure's `f.launch`: the arguments match the C signature.
    /// let op = unsafe {
    ///     KernelOp::new("twice", (&x,), (&mut y,), move |ctx, (x,), (y,)| {
    ///         if x.len() != y.len() {
    ///             return Err(DeviceError::shape("twice", "x and y differ in length"));
    ///         }
    ///         let n = x.len() as u64;
    ///         f.launch(ctx.stream(), LaunchConfig::for_elements(x.len(), 256), (x, y, n))?;
    ///         Ok(())
    ///     })
    /// };
    /// let (y,) = op.sync()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    /// This is the promise the op's guarantees rest on. When `launch` runs it must:
    /// - queue work only on `ctx.stream()` (cross-stream ordering of the buffers is then done by
    ///   `cuda-core`'s launch and copy paths), and only kernel launches, memsets and copies;
    /// - read only the input buffers and write only the output buffers it is given, within their
    ///   lengths (checking those lengths itself first, returning an error otherwise);
    /// - allocate and free no device memory on the stream, and not synchronise or block the host,
    ///   so that the op is a sound [`GraphNode`] whenever its argument ops are.
    ///
    /// Writing through an input, or two outputs aliasing, is refused by the types already: inputs
    /// come as `&DeviceBuffer`, outputs need `&mut` or owned handles (never `&` or `Arc`), and the
    /// borrow checker refuses the same `&mut` twice:
    ///
    /// ```compile_fail,E0499
    /// # use cuda_async::kernel::KernelOp;
    /// # use cuda_core::DeviceBuffer;
    /// # fn f(y: &mut DeviceBuffer<f32>) {
    /// // error[E0499]: cannot borrow `*y` as mutable more than once at a time
    /// let op = unsafe { KernelOp::new("two", (), (&mut *y, &mut *y), |_, (), (_, _)| Ok(())) };
    /// # drop(op); }
    /// ```
    pub unsafe fn new<A, B>(name: &'static str, inputs: A, outputs: B, launch: F) -> Op<Self>
    where
        A: IntoInputs<EI, Op = I, Handles = I::Output>,
        B: IntoOutputs<EO, Op = O, Handles = O::Output>,
        F: for<'a> FnOnce(
                &ExecutionContext<'_>,
                <EI as Elems>::Refs<'a>,
                <EO as Elems>::Muts<'a>,
            ) -> Result<()>
            + Send,
    {
        // SAFETY: the caller makes `with_launch`'s promise, which is this function's.
        unsafe { Self::with_launch(name, inputs, outputs, launch) }
    }

    /// [`KernelOp::new`] with a named launch type (a [`LaunchFn`]) instead of a closure, for an op
    /// type that must be nameable (e.g. to implement a trait such as
    /// [`crate::TunableParam`] on a newtype around it).
    ///
    /// # Safety
    /// As for [`KernelOp::new`].
    pub unsafe fn with_launch<A, B>(name: &'static str, inputs: A, outputs: B, launch: F) -> Op<Self>
    where
        A: IntoInputs<EI, Op = I, Handles = I::Output>,
        B: IntoOutputs<EO, Op = O, Handles = O::Output>,
    {
        Op::new(KernelOp {
            name,
            inputs: inputs.into_inputs(),
            outputs: outputs.into_outputs(),
            launch,
            _e: PhantomData,
        })
    }
}

impl<EI, EO, I, O, F> DeviceOp for KernelOp<EI, EO, I, O, F>
where
    EI: Elems,
    EO: Elems,
    I: DeviceOp,
    I::Output: InputBufs<EI>,
    O: DeviceOp,
    O::Output: OutputBufs<EO>,
    F: LaunchFn<EI, EO, I::Output, O::Output>,
{
    type Output = O::Output;

    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<O::Output> {
        let KernelOp { name, inputs, outputs, launch, _e } = self;
        let ins = inputs.execute(ctx)?;
        let mut outs = outputs.execute(ctx)?;
        {
            let mut list = ParamList::default();
            ins.push_params(&mut list);
            outs.push_params(&mut list);
            list.check_devices(name, ctx)?;
        }
        launch.launch(ctx, ins.refs(), outs.muts())?;
        Ok(outs)
    }
}

// SAFETY: `KernelOp::new`'s caller promised that the closure queues only launches, memsets and
// copies between the existing buffers it is given (no allocation, free or synchronisation); the
// argument ops are GraphNodes.
unsafe impl<EI, EO, I, O, F> GraphNode for KernelOp<EI, EO, I, O, F>
where
    EI: Elems,
    EO: Elems,
    I: GraphNode,
    I::Output: InputBufs<EI>,
    O: GraphNode,
    O::Output: OutputBufs<EO>,
    F: LaunchFn<EI, EO, I::Output, O::Output>,
{
}
