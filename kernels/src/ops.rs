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

pub use crate::LinearShape;
use crate::{Element, Kernels};
use cuda_async::TunableParam;
use cuda_async::{
    BufferMut, BufferRef, DeviceError, DeviceOp, ExecutionContext, GraphNode, IntoBufferOp, Op,
};
use cuda_core::{DeviceBuffer, DeviceRepr, Stream};
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

/// `Ok` when `buf` lives on the device of `ctx`'s stream.
fn same_device<T: DeviceRepr>(
    op: &'static str,
    ctx: &ExecutionContext<'_>,
    buf: &DeviceBuffer<T>,
) -> cuda_async::Result<()> {
    if buf.device() == ctx.device() {
        return Ok(());
    }
    Err(cuda_core::Error::DeviceMismatch {
        during: op,
        expected: ctx.device().ordinal(),
        actual: buf.device().ordinal(),
    }
    .into())
}

/// Generates a launcher struct, its [`DeviceOp`] impl (execute inputs, then the output, in order;
/// check devices and lengths; launch; yield the output handle) and its conditional [`GraphNode`]
/// impl. Inside `check` and `launch`, inputs are `&DeviceBuffer<_>` and the output is
/// `&mut DeviceBuffer<_>`, bound to the field names.
macro_rules! launcher {
    (
        $(#[$meta:meta])*
        $name:ident {
            op: $opname:expr,
            params: { $($p:ident: $pty:ty),* $(,)? },
            inputs: { $($input:ident: $In:ident),* $(,)? },
            output: $out:ident: $Out:ident => DeviceBuffer<$OutElem:ty>,
            $(check: $check:expr,)?
            launch: |$k:ident, $s:ident| $launch:expr $(,)?
        }
    ) => {
        $(#[$meta])*
        ///
        /// Executing it runs the argument ops in argument order on the context's stream, checks
        /// devices and lengths (a mismatch is [`DeviceError::Shape`]) before launching anything,
        /// launches on that stream and yields the output argument's handle. A [`GraphNode`]
        /// exactly when every argument op is one.
        pub struct $name<T: Element, $($In,)* $Out> {
            $($p: $pty,)*
            $($input: $In,)*
            $out: $Out,
        }

        impl<T: Element, $($In,)* $Out> DeviceOp for $name<T, $($In,)* $Out>
        where
            $($In: DeviceOp, $In::Output: BufferRef<T>,)*
            $Out: DeviceOp,
            $Out::Output: BufferMut<$OutElem>,
        {
            type Output = $Out::Output;

            fn execute(self, ctx: &ExecutionContext<'_>) -> cuda_async::Result<$Out::Output> {
                let $name { $($p,)* $($input,)* $out } = self;
                $(let $input = $input.execute(ctx)?;)*
                let mut handle = $out.execute(ctx)?;
                {
                    $(let $input: &DeviceBuffer<T> = $input.buffer();)*
                    let $out: &mut DeviceBuffer<$OutElem> = handle.buffer_mut();
                    $(same_device($opname, ctx, $input)?;)*
                    same_device($opname, ctx, $out)?;
                    $($check?;)?
                    let ($k, $s): (&Kernels, &Stream) = (Kernels::get(ctx.device())?, ctx.stream());
                    $launch?;
                }
                Ok(handle)
            }
        }

        // SAFETY: a kernel launch (and, for `sum`, a memset of an existing buffer) allocates and
        // frees nothing and does not synchronise; the argument ops are GraphNodes.
        unsafe impl<T: Element, $($In,)* $Out> GraphNode for $name<T, $($In,)* $Out>
        where
            $($In: GraphNode, $In::Output: BufferRef<T>,)*
            $Out: GraphNode,
            $Out::Output: BufferMut<$OutElem>,
        {
        }
    };
}

launcher! {
    /// Sets every element of `dst` to `value`. Built by [`fill`].
    Fill {
        op: "fill",
        params: { value: T },
        inputs: {},
        output: dst: D => DeviceBuffer<T>,
        launch: |k, s| k.fill(s, dst, value),
    }
}

launcher! {
    /// `out[i] = alpha * x[i]`. Built by [`scale`].
    Scale {
        op: "scale",
        params: { alpha: T },
        inputs: { x: X },
        output: out: O => DeviceBuffer<T>,
        check: same_len("scale", &[x.len(), out.len()]),
        launch: |k, s| k.scale(s, x, alpha, out),
    }
}

launcher! {
    /// `out[i] = alpha[0] * x[i]` with the factor in device memory. Built by [`scale_by`].
    ScaleBy {
        op: "scale_by",
        params: { _t: PhantomData<fn() -> T> },
        inputs: { x: X, alpha: A },
        output: out: O => DeviceBuffer<T>,
        check: same_len("scale_by", &[x.len(), out.len()]).and_then(|_| one_element("scale_by", alpha.len())),
        launch: |k, s| k.scale_by(s, x, alpha, out),
    }
}

launcher! {
    /// `y[i] = alpha * x[i] + y[i]`. Built by [`axpy`].
    Axpy {
        op: "axpy",
        params: { alpha: T },
        inputs: { x: X },
        output: y: Y => DeviceBuffer<T>,
        check: same_len("axpy", &[x.len(), y.len()]),
        launch: |k, s| k.axpy(s, alpha, x, y),
    }
}

/// The launcher an elementwise binary op uses ([`Kernels::add`] or [`Kernels::mul`]).
type BinaryFn<T> =
    fn(&Kernels, &Stream, &DeviceBuffer<T>, &DeviceBuffer<T>, &mut DeviceBuffer<T>) -> cuda_core::Result<()>;

launcher! {
    /// `out[i] = a[i] ∘ b[i]` for an elementwise binary kernel `∘`. Built by [`add`] and [`mul`].
    Binary {
        op: name,
        params: { name: &'static str, kernel: BinaryFn<T> },
        inputs: { a: A, b: B },
        output: out: O => DeviceBuffer<T>,
        check: same_len(name, &[a.len(), b.len(), out.len()]),
        launch: |k, s| kernel(k, s, a, b, out),
    }
}

launcher! {
    /// `out[0] = sum(x)`, accumulated in `f64`. Built by [`sum`].
    Sum {
        op: "sum",
        params: { _t: PhantomData<fn() -> T> },
        inputs: { x: X },
        output: out: O => DeviceBuffer<f64>,
        check: one_element("sum", out.len()),
        launch: |k, s| k.sum(s, x, out),
    }
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

launcher! {
    /// A fully connected layer `y = act(x w^T + b)`. Built by [`linear`].
    Linear {
        op: "linear",
        params: { shape: LinearShape, _t: PhantomData<fn() -> T> },
        inputs: { x: X, w: W, b: B },
        output: y: Y => DeviceBuffer<T>,
        check: linear_lens(&shape, x.len(), w.len(), b.len(), y.len()),
        launch: |k, s| k.linear(s, x, w, b, y, shape),
    }
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
    Op::new(Linear {
        shape,
        _t: PhantomData,
        x: x.into_buffer_op(),
        w: w.into_buffer_op(),
        b: b.into_buffer_op(),
        y: y.into_buffer_op(),
    })
}

/// Sets every element of `dst` to `value` with the `fill` kernel, yielding `dst`'s handle.
///
/// `dst` must be writable (`&mut`, owned, or a lazy op yielding one of these). Executing runs the
/// `dst` op, then launches the kernel on the context's stream. A [`GraphNode`] when the `dst` op is.
pub fn fill<T: Element, D: IntoBufferOp<T>>(dst: D, value: T) -> Op<Fill<T, D::Op>>
where
    D::Out: BufferMut<T>,
{
    Op::new(Fill { value, dst: dst.into_buffer_op() })
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
    Op::new(Scale { alpha, x: x.into_buffer_op(), out: out.into_buffer_op() })
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
    Op::new(ScaleBy {
        _t: PhantomData,
        x: x.into_buffer_op(),
        alpha: alpha.into_buffer_op(),
        out: out.into_buffer_op(),
    })
}

// SAFETY (the three impls below): each launcher's last queued work is exactly one launch of its
// kernel (argument ops before it queue no kernel of their own in a `GraphNode` chain of values, and
// any they do queue comes first); the named parameter is a plain value factor or fill value of
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
    Op::new(Axpy { alpha, x: x.into_buffer_op(), y: y.into_buffer_op() })
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
    Op::new(Binary { name, kernel, a: a.into_buffer_op(), b: b.into_buffer_op(), out: out.into_buffer_op() })
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
    Op::new(Sum { _t: PhantomData, x: x.into_buffer_op(), out: out.into_buffer_op() })
}
