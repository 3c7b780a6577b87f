//! The kernels as lazy [`cuda_async`] ops: `fill`, `scale`, `axpy`, `add`, `mul`, `sum` and
//! `linear`.
//!
//! Every launcher takes its buffers as [`IntoBufferOp`] arguments: `&DeviceBuffer<T>`,
//! `&mut DeviceBuffer<T>`, an owned `DeviceBuffer<T>`, an `Arc<DeviceBuffer<T>>`, or a lazy op
//! producing one of these (e.g. [`cuda_async::memory::zeros`]). Inputs need [`BufferRef`]; outputs
//! need [`BufferMut`], so an `Arc` or a `&` cannot be written to — that does not compile.
//!
//! Guarantees of every op built here, when executed:
//! - the argument ops are executed **in argument order**, on the context's stream, before the
//!   launch; the op itself then queues only the kernel launch (and, for [`sum`], a memset of
//!   `out`), plus `cuda-core`'s event waits for buffers whose home is another stream;
//! - devices and lengths are checked after the argument ops and before the launch: a mismatch
//!   is [`DeviceError::Shape`] (or [`cuda_core::Error::DeviceMismatch`] for a buffer of another
//!   device than the stream's), and nothing is launched;
//! - the output argument's handle is yielded (the `&mut`, the owned buffer, or the lazy op's
//!   output), so chains continue: `ops::axpy(2.0, &x, zeros(n)).then(|y| ops::scale(y, ..))`;
//! - an op is a [`GraphNode`] exactly when every argument op is one: a launch allocates nothing,
//!   but a lazy allocating argument (e.g. `zeros(n)`) makes the whole op a non-`GraphNode`.
//!
//! Kernels are compiled (or read from the cache) on first use per device by [`Kernels::get`]; run
//! one op before recording a graph to keep compilation out of the recording.
//!
//! Every op here is built on the public [`cuda_async::kernel::KernelOp`] (the same API a user of
//! this framework has for kernels of their own): argument execution in order, device checks,
//! read/write access tracking and the conditional `GraphNode` come from there; this file only
//! adds each op's length checks and launch, in a named [`LaunchFn`] type so that the op types can
//! be named (and implement [`TunableParam`]).

pub use crate::LinearShape;
use crate::{Element, Kernels};
use cuda_async::combinators::Value;
use cuda_async::kernel::{KernelOp, LaunchFn};
use cuda_async::TunableParam;
use cuda_async::{
    BufferMut, BufferRef, DeviceError, DeviceOp, ExecutionContext, GraphNode, IntoBufferOp, Op,
};
use cuda_core::{DeviceBuffer, Stream};
use std::marker::PhantomData;

/// `Ok` when all `lens` agree, else a [`DeviceError::Shape`] naming `op` and every length.
fn same_len(op: &'static str, lens: &[usize]) -> cuda_async::Result<()> {
    match lens.split_first() {
        Some((&n, rest)) if rest.iter().any(|&l| l != n) => {
            Err(DeviceError::shape(op, format!("argument lengths differ: {lens:?}")))
        }
        _ => Ok(()),
    }
}

/// `Ok` when an output that must hold exactly one element does, else a [`DeviceError::Shape`].
fn one_element(op: &'static str, len: usize) -> cuda_async::Result<()> {
    if len == 1 {
        return Ok(());
    }
    Err(DeviceError::shape(op, format!("a one-element argument holds {len} elements")))
}

/// The kernels of `ctx`'s device.
fn kernels<'s>(ctx: &ExecutionContext<'s>) -> cuda_async::Result<(&'static Kernels, &'s Stream)> {
    Ok((Kernels::get(ctx.device())?, ctx.stream()))
}

/// An op of this file: a newtype over the public [`KernelOp`] (inputs `$In`, one output `$Out`
/// of element `$OutElem`, launch `$L`) yielding the output's handle rather than a 1-tuple.
macro_rules! kernel_op {
    (
        $(#[$meta:meta])*
        $name:ident [$($In:ident),*] => $Out:ident: $OutElem:ty, $L:ty
    ) => {
        $(#[$meta])*
        ///
        /// Executing it runs the argument ops in argument order on the context's stream, checks
        /// devices and lengths (a mismatch is [`DeviceError::Shape`]) before launching anything,
        /// launches on that stream and yields the output argument's handle. A [`GraphNode`]
        /// exactly when every argument op is one.
        pub struct $name<T: Element, $($In,)* $Out>(
            KernelOp<($(kernel_op!(@t $In),)*), ($OutElem,), kernel_op!(@ops $($In),*), ($Out,), $L>,
        );

        impl<T: Element, $($In,)* $Out> DeviceOp for $name<T, $($In,)* $Out>
        where
            $($In: DeviceOp, $In::Output: BufferRef<T>,)*
            $Out: DeviceOp,
            $Out::Output: BufferMut<$OutElem>,
        {
            type Output = $Out::Output;

            fn execute(self, ctx: &ExecutionContext<'_>) -> cuda_async::Result<$Out::Output> {
                let (out,) = self.0.execute(ctx)?;
                Ok(out)
            }
        }

        // SAFETY: delegates to the `KernelOp`, a GraphNode when its argument ops are.
        unsafe impl<T: Element, $($In,)* $Out> GraphNode for $name<T, $($In,)* $Out>
        where
            $($In: GraphNode, $In::Output: BufferRef<T>,)*
            $Out: GraphNode,
            $Out::Output: BufferMut<$OutElem>,
        {
        }
    };
    (@t $In:ident) => { T };
    (@ops) => { Op<Value<()>> };
    (@ops $($In:ident),+) => { ($($In,)+) };
}

/// The launch of [`Fill`].
pub struct FillLaunch<T>(T);
impl<T: Element, H: BufferMut<T>> LaunchFn<(), (T,), (), (H,)> for FillLaunch<T> {
    fn launch(
        self,
        ctx: &ExecutionContext<'_>,
        (): (),
        (dst,): (&mut DeviceBuffer<T>,),
    ) -> cuda_async::Result<()> {
        let (k, s) = kernels(ctx)?;
        Ok(k.fill(s, dst, self.0)?)
    }
}
kernel_op! {
    /// Sets every element of `dst` to `value`. Built by [`fill`].
    Fill [] => D: T, FillLaunch<T>
}

/// The launch of [`Scale`].
pub struct ScaleLaunch<T>(T);
impl<T: Element, X: BufferRef<T>, O: BufferMut<T>> LaunchFn<(T,), (T,), (X,), (O,)> for ScaleLaunch<T> {
    fn launch<'a>(
        self,
        ctx: &ExecutionContext<'_>,
        (x,): (&'a DeviceBuffer<T>,),
        (out,): (&'a mut DeviceBuffer<T>,),
    ) -> cuda_async::Result<()> {
        same_len("scale", &[x.len(), out.len()])?;
        let (k, s) = kernels(ctx)?;
        Ok(k.scale(s, x, self.0, out)?)
    }
}
kernel_op! {
    /// `out[i] = alpha * x[i]`. Built by [`scale`].
    Scale [X] => O: T, ScaleLaunch<T>
}

/// The launch of [`ScaleBy`].
pub struct ScaleByLaunch<T>(PhantomData<fn() -> T>);
impl<T: Element, X: BufferRef<T>, A: BufferRef<T>, O: BufferMut<T>> LaunchFn<(T, T), (T,), (X, A), (O,)>
    for ScaleByLaunch<T>
{
    fn launch<'a>(
        self,
        ctx: &ExecutionContext<'_>,
        (x, alpha): (&'a DeviceBuffer<T>, &'a DeviceBuffer<T>),
        (out,): (&'a mut DeviceBuffer<T>,),
    ) -> cuda_async::Result<()> {
        same_len("scale_by", &[x.len(), out.len()]).and_then(|_| one_element("scale_by", alpha.len()))?;
        let (k, s) = kernels(ctx)?;
        Ok(k.scale_by(s, x, alpha, out)?)
    }
}
kernel_op! {
    /// `out[i] = alpha[0] * x[i]` with the factor in device memory. Built by [`scale_by`].
    ScaleBy [X, A] => O: T, ScaleByLaunch<T>
}

/// The launch of [`Axpy`].
pub struct AxpyLaunch<T>(T);
impl<T: Element, X: BufferRef<T>, Y: BufferMut<T>> LaunchFn<(T,), (T,), (X,), (Y,)> for AxpyLaunch<T> {
    fn launch<'a>(
        self,
        ctx: &ExecutionContext<'_>,
        (x,): (&'a DeviceBuffer<T>,),
        (y,): (&'a mut DeviceBuffer<T>,),
    ) -> cuda_async::Result<()> {
        same_len("axpy", &[x.len(), y.len()])?;
        let (k, s) = kernels(ctx)?;
        Ok(k.axpy(s, self.0, x, y)?)
    }
}
kernel_op! {
    /// `y[i] = alpha * x[i] + y[i]`. Built by [`axpy`].
    Axpy [X] => Y: T, AxpyLaunch<T>
}

/// The launcher an elementwise binary op uses ([`Kernels::add`] or [`Kernels::mul`]).
type BinaryFn<T> =
    fn(&Kernels, &Stream, &DeviceBuffer<T>, &DeviceBuffer<T>, &mut DeviceBuffer<T>) -> cuda_core::Result<()>;

/// The launch of [`Binary`]: the op's name and its kernel.
pub struct BinaryLaunch<T: Element> {
    name: &'static str,
    kernel: BinaryFn<T>,
}
impl<T: Element, A: BufferRef<T>, B: BufferRef<T>, O: BufferMut<T>> LaunchFn<(T, T), (T,), (A, B), (O,)>
    for BinaryLaunch<T>
{
    fn launch<'a>(
        self,
        ctx: &ExecutionContext<'_>,
        (a, b): (&'a DeviceBuffer<T>, &'a DeviceBuffer<T>),
        (out,): (&'a mut DeviceBuffer<T>,),
    ) -> cuda_async::Result<()> {
        same_len(self.name, &[a.len(), b.len(), out.len()])?;
        let (k, s) = kernels(ctx)?;
        Ok((self.kernel)(k, s, a, b, out)?)
    }
}
kernel_op! {
    /// `out[i] = a[i] ∘ b[i]` for an elementwise binary kernel `∘`. Built by [`add`] and [`mul`].
    Binary [A, B] => O: T, BinaryLaunch<T>
}

/// The launch of [`Sum`].
pub struct SumLaunch<T>(PhantomData<fn() -> T>);
impl<T: Element, X: BufferRef<T>, O: BufferMut<f64>> LaunchFn<(T,), (f64,), (X,), (O,)> for SumLaunch<T> {
    fn launch<'a>(
        self,
        ctx: &ExecutionContext<'_>,
        (x,): (&'a DeviceBuffer<T>,),
        (out,): (&'a mut DeviceBuffer<f64>,),
    ) -> cuda_async::Result<()> {
        one_element("sum", out.len())?;
        let (k, s) = kernels(ctx)?;
        Ok(k.sum(s, x, out)?)
    }
}
kernel_op! {
    /// `out[0] = sum(x)`, accumulated in `f64`. Built by [`sum`].
    Sum [X] => O: f64, SumLaunch<T>
}

/// `Ok` when the four buffers of a linear layer have the lengths `shape` requires, else a
/// [`DeviceError::Shape`] naming every length.
fn linear_lens(shape: &LinearShape, x: usize, w: usize, b: usize, y: usize) -> cuda_async::Result<()> {
    let want = shape.lens().map_err(|e| DeviceError::shape("linear", e.to_string()))?;
    if (want.x, want.w, want.b, want.y) == (x, w, b, y) {
        return Ok(());
    }
    Err(DeviceError::shape(
        "linear",
        format!(
            "{shape:?} needs x, w, b, y of {}, {}, {}, {} elements; got {x}, {w}, {b}, {y}",
            want.x, want.w, want.b, want.y
        ),
    ))
}

/// The launch of [`Linear`].
pub struct LinearLaunch<T>(LinearShape, PhantomData<fn() -> T>);
impl<T: Element, X: BufferRef<T>, W: BufferRef<T>, B: BufferRef<T>, Y: BufferMut<T>>
    LaunchFn<(T, T, T), (T,), (X, W, B), (Y,)> for LinearLaunch<T>
{
    fn launch<'a>(
        self,
        ctx: &ExecutionContext<'_>,
        (x, w, b): (&'a DeviceBuffer<T>, &'a DeviceBuffer<T>, &'a DeviceBuffer<T>),
        (y,): (&'a mut DeviceBuffer<T>,),
    ) -> cuda_async::Result<()> {
        let shape = self.0;
        linear_lens(&shape, x.len(), w.len(), b.len(), y.len())?;
        let (k, s) = kernels(ctx)?;
        Ok(k.linear(s, x, w, b, y, shape)?)
    }
}
kernel_op! {
    /// A fully connected layer `y = act(x w^T + b)`. Built by [`linear`].
    Linear [X, W, B] => Y: T, LinearLaunch<T>
}

/// The op [`linear`] returns for the arguments `X`, `W`, `B` and `Y`.
pub type LinearOp<T, X, W, B, Y> = Op<
    Linear<
        T,
        <X as IntoBufferOp<T>>::Op,
        <W as IntoBufferOp<T>>::Op,
        <B as IntoBufferOp<T>>::Op,
        <Y as IntoBufferOp<T>>::Op,
    >,
>;

/// A fully connected layer, yielding `y`'s handle: `y[r, o] = act(b[o] + sum_i x[r, i] * w[o, i])`
/// for `r < shape.batch`, `o < shape.out_dim`, with `act` = ReLU when `shape.relu`, else the
/// identity (see [`Kernels::linear`]). Row-major `x[batch][in_dim]`, `w[out_dim][in_dim]`
/// (PyTorch's `nn.Linear` layout), `b[out_dim]`, `y[batch][out_dim]`; accumulates in `T`.
///
/// `y` must be writable (`&mut`, owned, or a lazy op yielding one of these); every element of it
/// is overwritten, so it need not be initialised to anything in particular. Executing runs the `x`,
/// `w`, `b` and `y` ops in that order, checks `x.len() == batch * in_dim`,
/// `w.len() == out_dim * in_dim`, `b.len() == out_dim` and `y.len() == batch * out_dim` (else
/// [`DeviceError::Shape`], and nothing is launched) and launches one kernel on the context's
/// stream. A [`GraphNode`] when all four argument ops are, e.g. over borrowed buffers:
/// `scope.record(ops::linear(&x, &w, &b, &mut y, shape))`.
pub fn linear<T, X, W, B, Y>(x: X, w: W, b: B, y: Y, shape: LinearShape) -> LinearOp<T, X, W, B, Y>
where
    T: Element,
    X: IntoBufferOp<T>,
    W: IntoBufferOp<T>,
    B: IntoBufferOp<T>,
    Y: IntoBufferOp<T>,
    Y::Out: BufferMut<T>,
{
    // SAFETY: the launch checks the four lengths against `shape`, then queues only the `linear`
    // kernel, which reads x, w and b and writes y within those lengths; it allocates nothing and
    // does not synchronise.
    let op = unsafe { KernelOp::with_launch("linear", (x, w, b), (y,), LinearLaunch(shape, PhantomData)) };
    Op::new(Linear(op.into_inner()))
}

/// Sets every element of `dst` to `value` with the `fill` kernel, yielding `dst`'s handle.
///
/// `dst` must be writable (`&mut`, owned, or a lazy op yielding one of these). Executing runs the
/// `dst` op, then launches the kernel on the context's stream. A [`GraphNode`] when the `dst` op is.
pub fn fill<T: Element, D: IntoBufferOp<T>>(dst: D, value: T) -> Op<Fill<T, D::Op>>
where
    D::Out: BufferMut<T>,
{
    // SAFETY: the launch queues only the `fill` kernel, which writes dst[..dst.len()] and reads
    // nothing; it allocates nothing and does not synchronise.
    let op = unsafe { KernelOp::with_launch("fill", (), (dst,), FillLaunch(value)) };
    Op::new(Fill(op.into_inner()))
}

/// `out[i] = alpha * x[i]`, yielding `out`'s handle.
///
/// Executing runs the `x` op, then the `out` op, checks `x.len() == out.len()` (else
/// [`DeviceError::Shape`]) and launches on the context's stream. A [`GraphNode`] when both argument
/// ops are.
pub fn scale<T: Element, X: IntoBufferOp<T>, O: IntoBufferOp<T>>(
    x: X,
    alpha: T,
    out: O,
) -> Op<Scale<T, X::Op, O::Op>>
where
    O::Out: BufferMut<T>,
{
    // SAFETY: the launch checks x.len() == out.len() = n, then queues only the `scale` kernel,
    // which reads x[..n] and writes out[..n]; it allocates nothing and does not synchronise.
    let op = unsafe { KernelOp::with_launch("scale", (x,), (out,), ScaleLaunch(alpha)) };
    Op::new(Scale(op.into_inner()))
}

/// The op [`scale_by`] returns.
pub type ScaleByOp<T, X, A, O> =
    Op<ScaleBy<T, <X as IntoBufferOp<T>>::Op, <A as IntoBufferOp<T>>::Op, <O as IntoBufferOp<T>>::Op>>;

/// `out[i] = alpha[0] * x[i]` with the factor read from device memory when the kernel runs — e.g. a
/// [`cuda_async::DeviceScalar`], so a captured graph follows [`cuda_async::DeviceScalar::set`]
/// without recapture. `alpha` must hold exactly one element (else [`DeviceError::Shape`]).
pub fn scale_by<T: Element, X: IntoBufferOp<T>, A: IntoBufferOp<T>, O: IntoBufferOp<T>>(
    x: X,
    alpha: A,
    out: O,
) -> ScaleByOp<T, X, A, O>
where
    O::Out: BufferMut<T>,
{
    // SAFETY: the launch checks x.len() == out.len() = n and alpha.len() == 1, then queues only
    // the `scale_by` kernel, which reads alpha[0] and x[..n] and writes out[..n]; it allocates
    // nothing and does not synchronise.
    let op = unsafe { KernelOp::with_launch("scale_by", (x, alpha), (out,), ScaleByLaunch(PhantomData)) };
    Op::new(ScaleBy(op.into_inner()))
}

// SAFETY (the three impls below): each launcher's last queued work is exactly one launch of its
// kernel, also for no elements (`Kernels::fill`, `scale` and `axpy` launch a grid that does
// nothing then, rather than skip; argument ops' launches come before it); the named parameter is a plain value factor or fill value of
// type `T` in the kernel's signature (`fill_T(out, value, n)`: 1; `scale_T(x, alpha, out, n)`: 1;
// `axpy_T(alpha, x, y, n)`: 0) and no value of it can make the kernel leave its bounds.
macro_rules! tunable {
    ($name:ident [$($a:ident: $bound:ident),*], $index:expr, $field:ident) => {
        // SAFETY: see above; `$field` is the kernel this launcher launches last.
        unsafe impl<T: Element, $($a),*> TunableParam for $name<T, $($a),*>
        where
            $($a: GraphNode, $a::Output: $bound<T>,)*
        {
            type Param = T;
            const INDEX: usize = $index;
            fn function(device: &cuda_core::Device) -> cuda_async::Result<cuda_core::Function> {
                Ok(T::kernels(Kernels::get(device)?).$field.clone())
            }
        }
    };
}
tunable!(Fill [D: BufferMut], 1, fill);
tunable!(Scale [X: BufferRef, O: BufferMut], 1, scale);
tunable!(Axpy [X: BufferRef, Y: BufferMut], 0, axpy);

/// `y[i] = alpha * x[i] + y[i]` (in place in `y`), yielding `y`'s handle.
///
/// Executing runs the `x` op, then the `y` op, checks `x.len() == y.len()` (else
/// [`DeviceError::Shape`]) and launches on the context's stream. A [`GraphNode`] when both argument
/// ops are.
pub fn axpy<T: Element, X: IntoBufferOp<T>, Y: IntoBufferOp<T>>(
    alpha: T,
    x: X,
    y: Y,
) -> Op<Axpy<T, X::Op, Y::Op>>
where
    Y::Out: BufferMut<T>,
{
    // SAFETY: the launch checks x.len() == y.len() = n, then queues only the `axpy` kernel, which
    // reads x[..n] and y[..n] and writes y[..n]; it allocates nothing and does not synchronise.
    let op = unsafe { KernelOp::with_launch("axpy", (x,), (y,), AxpyLaunch(alpha)) };
    Op::new(Axpy(op.into_inner()))
}

/// The op [`add`] and [`mul`] return for the arguments `A`, `B` and `O`.
pub type BinaryOp<T, A, B, O> =
    Op<Binary<T, <A as IntoBufferOp<T>>::Op, <B as IntoBufferOp<T>>::Op, <O as IntoBufferOp<T>>::Op>>;

/// `out[i] = a[i] + b[i]`, yielding `out`'s handle.
///
/// Executing runs the `a`, `b` and `out` ops in that order, checks that the three lengths agree
/// (else [`DeviceError::Shape`]) and launches on the context's stream. A [`GraphNode`] when all
/// argument ops are.
pub fn add<T, A, B, O>(a: A, b: B, out: O) -> BinaryOp<T, A, B, O>
where
    T: Element,
    A: IntoBufferOp<T>,
    B: IntoBufferOp<T>,
    O: IntoBufferOp<T>,
    O::Out: BufferMut<T>,
{
    binary("add", Kernels::add::<T>, a, b, out)
}

/// `out[i] = a[i] * b[i]`, yielding `out`'s handle.
///
/// Same guarantees as [`add`].
pub fn mul<T, A, B, O>(a: A, b: B, out: O) -> BinaryOp<T, A, B, O>
where
    T: Element,
    A: IntoBufferOp<T>,
    B: IntoBufferOp<T>,
    O: IntoBufferOp<T>,
    O::Out: BufferMut<T>,
{
    binary("mul", Kernels::mul::<T>, a, b, out)
}

fn binary<T, A, B, O>(name: &'static str, kernel: BinaryFn<T>, a: A, b: B, out: O) -> BinaryOp<T, A, B, O>
where
    T: Element,
    A: IntoBufferOp<T>,
    B: IntoBufferOp<T>,
    O: IntoBufferOp<T>,
    O::Out: BufferMut<T>,
{
    // SAFETY: the launch checks that a, b and out all hold n elements, then queues only `kernel`
    // (`add` or `mul`), which reads a[..n] and b[..n] and writes out[..n]; it allocates nothing and
    // does not synchronise.
    let op = unsafe { KernelOp::with_launch(name, (a, b), (out,), BinaryLaunch { name, kernel }) };
    Op::new(Binary(op.into_inner()))
}

/// `out[0] = sum(x)`, accumulated in `f64` (order of additions unspecified), yielding `out`'s
/// handle.
///
/// `out` must be a writable `f64` buffer of exactly one element (else [`DeviceError::Shape`]); its
/// previous content is overwritten (a memset to zero, then the reduction, both on the context's
/// stream). Executing runs the `x` op, then the `out` op. A [`GraphNode`] when both argument ops
/// are.
pub fn sum<T: Element, X: IntoBufferOp<T>, O: IntoBufferOp<f64>>(x: X, out: O) -> Op<Sum<T, X::Op, O::Op>>
where
    O::Out: BufferMut<f64>,
{
    // SAFETY: the launch checks out.len() == 1, then queues a memset of `out` and the `sum` kernel,
    // which reads x[..x.len()] and adds into out[0]; it allocates nothing and does not synchronise.
    let op = unsafe { KernelOp::with_launch("sum", (x,), (out,), SumLaunch(PhantomData)) };
    Op::new(Sum(op.into_inner()))
}
