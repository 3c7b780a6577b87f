//! `Launcher`: a kernel vouched for once, launched as typed lazy ops.

use super::args::{Elems, InputBufs, IntoInputs, IntoOutputs, OutputBufs, ParamList, Scalars};
use super::Kernel;
use crate::{DeviceError, DeviceOp, ExecutionContext, GraphNode, Op, Result};
use cuda_core::LaunchConfig;
use std::marker::PhantomData;
use std::sync::Arc;

/// What a launcher's check function sees: the lengths (in elements) of the input and output
/// buffers, in argument order, and the scalars of the launch.
#[derive(Debug)]
pub struct Lens<'a, P> {
    /// The input buffers' lengths.
    pub inputs: &'a [usize],
    /// The output buffers' lengths.
    pub outputs: &'a [usize],
    /// The scalar parameters.
    pub scalars: &'a P,
}

/// A check function: accepts a launch's lengths and scalars with the launch shape to use, or
/// refuses them with a message (reported as [`DeviceError::Shape`], and nothing is launched).
pub type Check<P> = dyn Fn(&Lens<'_, P>) -> std::result::Result<LaunchConfig, String> + Send + Sync;

/// A [`Kernel`] that its author vouched for ([`Kernel::vouch`]): its parameters are, in this order,
/// the input buffers (element types `EI`, a tuple such as `(f32, f32)`), the output buffers
/// (`EO`) and the scalars (`P`, a tuple of [`cuda_core::DeviceRepr`] values such as `(f32, u64)`),
/// each buffer passed as its device address (`const T*` for inputs, `T*` for outputs).
///
/// Cloning is cheap (the kernel and the check function are shared). [`Launcher::op`] builds the
/// lazy op of one launch, safely.
pub struct Launcher<EI, EO, P> {
    kernel: Kernel,
    check: Arc<Check<P>>,
    _e: PhantomData<fn() -> (EI, EO)>,
}

impl<EI, EO, P> Clone for Launcher<EI, EO, P> {
    fn clone(&self) -> Self {
        Launcher { kernel: self.kernel.clone(), check: self.check.clone(), _e: PhantomData }
    }
}

impl Kernel {
    /// Vouches for the kernel: its C signature is `(inputs.., outputs.., scalars..)` as typed by
    /// `EI`, `EO` and `P`, and `check` says which lengths it may be launched on, with which shape.
    /// Every launch through the returned [`Launcher`] is then safe.
    ///
    /// ```no_run
    /// use cuda_async::kernel::{Kernel, Launcher, Lens};
    /// use cuda_core::LaunchConfig;
    /// # let k = Kernel::from_ptx("", "twice");
    /// // `twice(const float* x, float* y, unsigned long long n)` writes y[i] = 2 x[i] for i < n.
    /// // SAFETY: the signature is (input f32, output f32, u64); for the lengths `check` accepts
    /// // (x and y of n elements each), `twice` reads only x[..n] and writes only y[..n].
    /// let twice: Launcher<(f32,), (f32,), (u64,)> = unsafe {
    ///     k.vouch(|l: &Lens<'_, (u64,)>| {
    ///         let n = l.scalars.0;
    ///         if l.inputs != [n as usize] || l.outputs != [n as usize] {
    ///             return Err(format!("x and y must hold {n} elements; got {:?}, {:?}", l.inputs, l.outputs));
    ///         }
    ///         Ok(LaunchConfig::for_elements(n as usize, 256))
    ///     })
    /// };
    /// ```
    ///
    /// Launching needs this promise: a kernel cannot be turned into a launcher without it.
    ///
    /// ```compile_fail,E0133
    /// # use cuda_async::kernel::{Kernel, Launcher};
    /// # let k = Kernel::from_ptx("", "twice");
    /// // error[E0133]: call to unsafe function `Kernel::vouch` is unsafe
    /// let twice: Launcher<(f32,), (f32,), (u64,)> =
    ///     k.vouch(|_: &_| Ok(cuda_core::LaunchConfig::for_elements(1, 1)));
    /// ```
    ///
    /// # Safety
    /// For every launch whose lengths and scalars `check` accepts with `Ok(cfg)`, launching the
    /// kernel with the shape `cfg`, the buffers' device addresses and the scalars:
    /// - matches its C signature: one parameter per input, output and scalar, in that order, with
    ///   the layouts of `EI`, `EO` and `P`;
    /// - **reads only the declared inputs and outputs, and writes only the declared outputs**, each
    ///   within its length (no index at or past it, 64-bit offsets where lengths can pass 2^32);
    /// - touches no other memory, allocates nothing, does not synchronise with the host, and
    ///   terminates.
    ///
    /// The rest is enforced: inputs can only be read-only arguments, outputs need `&mut` or owned
    /// handles (never `&` or `Arc`), two outputs cannot alias (the same `&mut` twice does not
    /// compile), lengths are checked before every launch, devices are checked, and every buffer's
    /// uses are ordered across streams and kept alive by graphs that recorded the launch.
    pub unsafe fn vouch<EI: Elems, EO: Elems, P>(
        &self,
        check: impl Fn(&Lens<'_, P>) -> std::result::Result<LaunchConfig, String> + Send + Sync + 'static,
    ) -> Launcher<EI, EO, P>
    where
        P: Scalars,
    {
        Launcher { kernel: self.clone(), check: Arc::new(check), _e: PhantomData }
    }
}

impl<EI: Elems, EO: Elems, P: Scalars> Launcher<EI, EO, P> {
    /// The kernel.
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// One launch as a lazy op over `inputs` (a tuple of [`crate::IntoBufferOp`]s, e.g. `(&x,)`,
    /// or `()`), `outputs` (a tuple of writable ones, e.g. `(&mut y,)`) and `scalars`, yielding the
    /// output handles.
    ///
    /// Executing it runs the input ops, then the output ops, in argument order on the context's
    /// stream; checks that every buffer is on the stream's device ([`cuda_core::Error::DeviceMismatch`]
    /// otherwise) and asks the check function for the launch shape ([`DeviceError::Shape`] if it
    /// refuses); loads the kernel on first use per device; and launches it on the stream, ordered
    /// after the earlier conflicting uses of every buffer on any stream. Nothing is launched on an
    /// error. A [`GraphNode`] exactly when every argument op is one.
    pub fn op<A, B>(&self, inputs: A, outputs: B, scalars: P) -> LaunchOpOf<EI, EO, A, B, P>
    where
        A: IntoInputs<EI>,
        B: IntoOutputs<EO>,
    {
        Op::new(LaunchOp {
            launcher: self.clone(),
            inputs: inputs.into_inputs(),
            outputs: outputs.into_outputs(),
            scalars,
        })
    }
}

/// The op [`Launcher::op`] returns for the argument tuples `A` (inputs) and `B` (outputs).
pub type LaunchOpOf<EI, EO, A, B, P> =
    Op<LaunchOp<EI, EO, <A as IntoInputs<EI>>::Op, <B as IntoOutputs<EO>>::Op, P>>;

/// One launch of a vouched-for kernel. Built by [`Launcher::op`].
pub struct LaunchOp<EI, EO, I, O, P> {
    launcher: Launcher<EI, EO, P>,
    inputs: I,
    outputs: O,
    scalars: P,
}

impl<EI, EO, I, O, P> DeviceOp for LaunchOp<EI, EO, I, O, P>
where
    EI: Elems,
    EO: Elems,
    I: DeviceOp,
    I::Output: InputBufs<EI>,
    O: DeviceOp,
    O::Output: OutputBufs<EO>,
    P: Scalars,
{
    type Output = O::Output;

    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<O::Output> {
        let LaunchOp { launcher, inputs, outputs, scalars } = self;
        let ins = inputs.execute(ctx)?;
        let mut outs = outputs.execute(ctx)?;
        {
            const OP: &str = "a user kernel";
            let mut list = ParamList::default();
            ins.push_params(&mut list);
            let n_in = list.params.len();
            outs.push_params(&mut list);
            list.check_devices(OP, ctx)?;
            let lens: Vec<usize> = list.buffers().map(|b| b.len).collect();
            let (inputs, outputs) = lens.split_at(n_in);
            let name = launcher.kernel.name();
            let cfg = (launcher.check)(&Lens { inputs, outputs, scalars: &scalars })
                .map_err(|e| DeviceError::shape(OP, format!("{name}: {e}")))?;
            scalars.push_params(&mut list);
            let f = launcher.kernel.function(ctx.device())?;
            // SAFETY: `Kernel::vouch`'s caller promised that, for lengths and scalars its check
            // accepts (just checked, giving `cfg`), the kernel's signature is (inputs, outputs,
            // scalars) as pushed here in order, and that it reads only these buffers and writes
            // only the outputs, within their lengths. Outputs are passed as their handles'
            // `buffer_mut` borrows (exclusive, so distinct from each other and from every input),
            // with write access, inputs with read access, for ordering and keep-alive.
            unsafe { f.launch(ctx.stream(), cfg, list)? };
        }
        Ok(outs)
    }
}

// SAFETY: the op queues one kernel launch between existing buffers (the vouched kernel allocates
// nothing and does not synchronise); loading the kernel happens on the host, outside the stream;
// the argument ops are GraphNodes.
unsafe impl<EI, EO, I, O, P> GraphNode for LaunchOp<EI, EO, I, O, P>
where
    EI: Elems,
    EO: Elems,
    I: GraphNode,
    I::Output: InputBufs<EI>,
    O: GraphNode,
    O::Output: OutputBufs<EO>,
    P: Scalars,
{
}
