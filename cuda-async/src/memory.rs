//! Memory as ops: stream-ordered allocation, transfers and copies.
//!
//! `zeros`, `ones`, `full`, `from_host`, `to_host` and `dup` allocate, so they are **not**
//! [`GraphNode`]s. `copy` (between existing buffers) and `fill` (of an existing buffer) are.
//! `copy_peer` (between buffers of two devices) is not: it may bounce through host memory on two
//! streams, which a capture cannot hold.
//!
//! Every op here fails with the `cuda-core` error of the allocation or copy it queues (out of
//! memory, a capturing stream, a length mismatch) when executed; building one never fails.
//!
//! ```no_run
//! # fn main() -> cuda_async::Result<()> {
//! use cuda_async::{memory, zip, DeviceOpExt};
//! let x = memory::from_host(vec![1.0f32, 2.0, 3.0]);
//! let y = memory::full(3, 0.5f32);
//! let (x, mut y) = zip!(x, y).sync()?;
//! memory::copy(&x, &mut y).sync()?;                 // y = x
//! memory::fill(&mut y, 7.0f32).sync()?;              // y = 7
//! let back = memory::to_host(&y).sync()?;            // pinned host copy
//! assert_eq!(back.as_slice()?, &[7.0; 3]);
//! let z = memory::dup(&x).sync()?;                   // a new buffer equal to x
//! assert_eq!(z.to_vec()?, vec![1.0, 2.0, 3.0]);
//! # Ok(()) }
//! ```

use crate::args::{BufferMut, BufferRef, IntoBufferOp};
use crate::{DeviceError, DeviceOp, ExecutionContext, GraphNode, Op, Result};
use cuda_core::{DeviceBuffer, DeviceRepr, PinnedBuffer};
use std::marker::PhantomData;

/// Numeric element types with a one (for [`ones`]).
pub trait One: DeviceRepr {
    /// The value 1.
    const ONE: Self;
}
macro_rules! one {
    ($($t:ty = $v:expr),*) => {$( impl One for $t { const ONE: Self = $v; } )*};
}
one!(f32 = 1.0, f64 = 1.0, i8 = 1, u8 = 1, i16 = 1, u16 = 1, i32 = 1, u32 = 1, i64 = 1, u64 = 1);

/// Allocates `len` elements set to `value`. See [`full`], [`zeros`], [`ones`].
pub struct Full<T> {
    len: usize,
    value: Option<T>,
}

/// A new buffer of `len` elements set to `value` (element sizes 1, 2, 4, 8 bytes).
pub fn full<T: DeviceRepr>(len: usize, value: T) -> Op<Full<T>> {
    Op(Full { len, value: Some(value) })
}

/// A new buffer of `len` zeros.
pub fn zeros<T: DeviceRepr>(len: usize) -> Op<Full<T>> {
    Op(Full { len, value: None })
}

/// A new buffer of `len` ones.
pub fn ones<T: One>(len: usize) -> Op<Full<T>> {
    full(len, T::ONE)
}

impl<T: DeviceRepr> DeviceOp for Full<T> {
    type Output = DeviceBuffer<T>;
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<DeviceBuffer<T>> {
        Ok(match self.value {
            Some(v) => DeviceBuffer::filled(ctx.stream(), self.len, v)?,
            None => DeviceBuffer::zeros(ctx.stream(), self.len)?,
        })
    }
}

/// Uploads host data into a new buffer. See [`from_host`].
pub struct FromHost<T, D> {
    data: D,
    _t: PhantomData<fn() -> T>,
}

/// A new buffer holding a copy of `data` (a `Vec<T>`, `&[T]`, or anything `AsRef<[T]>`). The data
/// is staged by the driver when the op executes, so borrowed data is free again right after.
pub fn from_host<T: DeviceRepr, D: AsRef<[T]> + Send>(data: D) -> Op<FromHost<T, D>> {
    Op(FromHost { data, _t: PhantomData })
}

impl<T: DeviceRepr, D: AsRef<[T]> + Send> DeviceOp for FromHost<T, D> {
    type Output = DeviceBuffer<T>;
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<DeviceBuffer<T>> {
        Ok(DeviceBuffer::from_host(ctx.stream(), self.data.as_ref())?)
    }
}

/// Downloads a buffer into new pinned host memory. See [`to_host`].
pub struct ToHost<T, A> {
    src: A,
    _t: PhantomData<fn() -> T>,
}

/// Copies a buffer into a new [`PinnedBuffer`] without blocking the host. Reading it
/// (`as_slice`) waits for the copy, so even an early read is never torn; after `.await` or
/// `sync` it is complete.
pub fn to_host<T: DeviceRepr, A: IntoBufferOp<T>>(src: A) -> Op<ToHost<T, A::Op>> {
    Op(ToHost { src: src.into_buffer_op(), _t: PhantomData })
}

impl<T: DeviceRepr, A> DeviceOp for ToHost<T, A>
where
    A: DeviceOp,
    A::Output: BufferRef<T>,
{
    type Output = PinnedBuffer<T>;
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<PinnedBuffer<T>> {
        let src = self.src.execute(ctx)?;
        let src = src.buffer();
        let mut host = PinnedBuffer::new(ctx.device(), src.len(), zero())?;
        host.copy_from_device_async(ctx.stream(), src)?;
        Ok(host)
    }
}

fn zero<T: DeviceRepr>() -> T {
    // SAFETY: DeviceRepr types are valid for every bit pattern, all-zero included.
    unsafe { std::mem::zeroed() }
}

/// Copies one buffer into another existing one. See [`copy`].
pub struct CopyBuffer<T, S, D> {
    src: S,
    dst: D,
    _t: PhantomData<fn() -> T>,
}

/// Copies `src` into `dst` (same length), yielding `dst`. Allocates nothing: a [`GraphNode`] when
/// both arguments are.
pub fn copy<T: DeviceRepr, S: IntoBufferOp<T>, D: IntoBufferOp<T>>(
    src: S,
    dst: D,
) -> Op<CopyBuffer<T, S::Op, D::Op>>
where
    D::Out: BufferMut<T>,
{
    Op(CopyBuffer { src: src.into_buffer_op(), dst: dst.into_buffer_op(), _t: PhantomData })
}

impl<T: DeviceRepr, S, D> DeviceOp for CopyBuffer<T, S, D>
where
    S: DeviceOp,
    S::Output: BufferRef<T>,
    D: DeviceOp,
    D::Output: BufferMut<T>,
{
    type Output = D::Output;
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<D::Output> {
        let src = self.src.execute(ctx)?;
        let mut dst = self.dst.execute(ctx)?;
        let (s, d) = (src.buffer(), dst.buffer_mut());
        if s.len() != d.len() {
            return Err(DeviceError::shape(
                "copy",
                format!("source has {} elements, destination {}", s.len(), d.len()),
            ));
        }
        d.copy_from_device(ctx.stream(), s)?;
        Ok(dst)
    }
}

// SAFETY: a device-to-device copy between existing buffers; argument ops are GraphNodes.
unsafe impl<T: DeviceRepr, S, D> GraphNode for CopyBuffer<T, S, D>
where
    S: GraphNode,
    S::Output: BufferRef<T>,
    D: GraphNode,
    D::Output: BufferMut<T>,
{
}

/// Sets every element of an existing buffer. See [`fill`].
pub struct Fill<T, D> {
    dst: D,
    value: T,
}

/// Sets every element of `dst` to `value` (a memset; element sizes 1, 2, 4, 8), yielding `dst`.
/// A [`GraphNode`] when the argument is.
pub fn fill<T: DeviceRepr, D: IntoBufferOp<T>>(dst: D, value: T) -> Op<Fill<T, D::Op>>
where
    D::Out: BufferMut<T>,
{
    Op(Fill { dst: dst.into_buffer_op(), value })
}

impl<T: DeviceRepr, D> DeviceOp for Fill<T, D>
where
    D: DeviceOp,
    D::Output: BufferMut<T>,
{
    type Output = D::Output;
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<D::Output> {
        let mut dst = self.dst.execute(ctx)?;
        dst.buffer_mut().fill(ctx.stream(), self.value)?;
        Ok(dst)
    }
}

// SAFETY: a memset of an existing buffer; the argument op is a GraphNode.
unsafe impl<T: DeviceRepr, D> GraphNode for Fill<T, D>
where
    D: GraphNode,
    D::Output: BufferMut<T>,
{
}

/// Duplicates a buffer into a new one. See [`dup`].
pub struct Dup<T, A> {
    src: A,
    _t: PhantomData<fn() -> T>,
}

/// A new buffer holding a copy of `src` (allocates: not a [`GraphNode`]).
pub fn dup<T: DeviceRepr, A: IntoBufferOp<T>>(src: A) -> Op<Dup<T, A::Op>> {
    Op(Dup { src: src.into_buffer_op(), _t: PhantomData })
}

impl<T: DeviceRepr, A> DeviceOp for Dup<T, A>
where
    A: DeviceOp,
    A::Output: BufferRef<T>,
{
    type Output = DeviceBuffer<T>;
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<DeviceBuffer<T>> {
        let src = self.src.execute(ctx)?;
        let src = src.buffer();
        // SAFETY: fully written by the copy queued right after on the same stream.
        let mut out = unsafe { DeviceBuffer::uninit(ctx.stream(), src.len())? };
        out.copy_from_device(ctx.stream(), src)?;
        Ok(out)
    }
}

/// Copies a buffer of any device into an existing one. See [`copy_peer`].
pub struct CopyPeer<T, S, D> {
    src: S,
    dst: D,
    _t: PhantomData<fn() -> T>,
}

/// Copies `src`, a buffer of **any** device, into `dst` (same length), yielding `dst`; the op must
/// run on a stream of `dst`'s device. Direct between devices with peer access, through page-locked
/// host memory otherwise, a device-to-device copy on one device (see
/// [`cuda_core::DeviceBuffer::copy_from_peer`]); ordered with both buffers' other uses on both
/// devices. Not a [`GraphNode`]: refused on a capturing stream.
///
/// ```no_run
/// # fn main() -> cuda_async::Result<()> {
/// use cuda_async::{memory, DeviceOpExt};
/// use cuda_core::{Device, DeviceBuffer};
/// let (s0, s1) = (Device::new(0)?.new_stream()?, Device::new(1)?.new_stream()?);
/// let a = DeviceBuffer::from_host(&s0, &[1.0f32, 2.0])?;
/// let mut b = DeviceBuffer::<f32>::zeros(&s1, 2)?;
/// memory::copy_peer(&a, &mut b).sync_on(&s1)?;
/// assert_eq!(b.to_vec()?, vec![1.0, 2.0]);
/// # Ok(()) }
/// ```
pub fn copy_peer<T: DeviceRepr, S: IntoBufferOp<T>, D: IntoBufferOp<T>>(
    src: S,
    dst: D,
) -> Op<CopyPeer<T, S::Op, D::Op>>
where
    D::Out: BufferMut<T>,
{
    Op(CopyPeer { src: src.into_buffer_op(), dst: dst.into_buffer_op(), _t: PhantomData })
}

impl<T: DeviceRepr, S, D> DeviceOp for CopyPeer<T, S, D>
where
    S: DeviceOp,
    S::Output: BufferRef<T>,
    D: DeviceOp,
    D::Output: BufferMut<T>,
{
    type Output = D::Output;
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<D::Output> {
        let src = self.src.execute(ctx)?;
        let mut dst = self.dst.execute(ctx)?;
        let (s, d) = (src.buffer(), dst.buffer_mut());
        if s.len() != d.len() {
            return Err(DeviceError::shape(
                "copy_peer",
                format!("source has {} elements, destination {}", s.len(), d.len()),
            ));
        }
        d.copy_from_peer(ctx.stream(), s)?;
        Ok(dst)
    }
}
