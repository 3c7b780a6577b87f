//! Data movement into existing buffers, and a pool of page-locked staging buffers.
//!
//! Serving code moves the same shapes every step. Allocating page-locked memory per transfer
//! (`cuMemHostAlloc`, tens of microseconds) dominates small steps, so these ops copy into buffers
//! that already exist, and [`StagingPool`] hands out page-locked buffers that return to the pool
//! when dropped:
//! - [`upload`]: host slice → existing device buffer (the driver stages pageable memory);
//! - [`upload_pinned`]: page-locked buffer → existing device buffer, asynchronously;
//! - [`download`]: device buffer → existing page-locked buffer, asynchronously (reading the
//!   buffer on the host waits for the copy, so an early read is never torn).
//!
//! All three are ordered with every other use of the device buffer (`cuda-core`'s access
//! tracking). They are not [`crate::GraphNode`]s: host transfers cannot be part of a graph (put the
//! copy before or after the replay instead).

use crate::args::{BufferMut, BufferRef, IntoBufferOp};
use crate::{DeviceOp, ExecutionContext, Op, Result};
use cuda_core::{Device, DeviceRepr, PinnedBuffer};
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

/// Copies host data into an existing device buffer. See [`upload`].
pub struct Upload<T, S, D> {
    src: S,
    dst: D,
    _t: PhantomData<fn() -> T>,
}

/// Copies `src` (any `AsRef<[T]>`: a `Vec`, a slice) into the existing buffer `dst` (same length),
/// yielding `dst`. `src` is free again once the op's `execute` returns: the driver stages pageable
/// host data before the call returns. From page-locked memory (a [`Staged`] buffer's slice, a
/// `PinnedBuffer`'s), which the driver copies asynchronously, `execute` waits for the copy and the
/// work queued before it on the stream (`DeviceBuffer::copy_from_host`), blocking the thread that
/// polls the op: use [`upload_pinned`] for page-locked sources.
///
/// ```no_run
/// # fn demo(s: &cuda_core::Stream, x: &mut cuda_core::DeviceBuffer<f32>) -> cuda_async::Result<()> {
/// use cuda_async::{staging, DeviceOpExt};
/// staging::upload(vec![1.0f32; 1024], x).sync_on(s)?;
/// # Ok(()) }
/// ```
pub fn upload<T: DeviceRepr, S: AsRef<[T]> + Send, D: IntoBufferOp<T>>(
    src: S,
    dst: D,
) -> Op<Upload<T, S, D::Op>>
where
    D::Out: BufferMut<T>,
{
    Op(Upload { src, dst: dst.into_buffer_op(), _t: PhantomData })
}

impl<T: DeviceRepr, S: AsRef<[T]> + Send, D> DeviceOp for Upload<T, S, D>
where
    D: DeviceOp,
    D::Output: BufferMut<T>,
{
    type Output = D::Output;
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<D::Output> {
        let mut dst = self.dst.execute(ctx)?;
        dst.buffer_mut().copy_from_host(ctx.stream(), self.src.as_ref())?;
        Ok(dst)
    }
}

/// Copies a page-locked buffer into an existing device buffer asynchronously. See
/// [`upload_pinned`].
pub struct UploadPinned<'p, T: DeviceRepr, D> {
    src: &'p mut PinnedBuffer<T>,
    dst: D,
}

/// Copies the page-locked `src` into the existing buffer `dst` (same length) without blocking the
/// host, yielding `dst`. `src` stays borrowed until the op has executed; a later host access to it
/// waits for the copy.
pub fn upload_pinned<'p, T: DeviceRepr, D: IntoBufferOp<T>>(
    src: &'p mut PinnedBuffer<T>,
    dst: D,
) -> Op<UploadPinned<'p, T, D::Op>>
where
    D::Out: BufferMut<T>,
{
    Op(UploadPinned { src, dst: dst.into_buffer_op() })
}

impl<T: DeviceRepr, D> DeviceOp for UploadPinned<'_, T, D>
where
    D: DeviceOp,
    D::Output: BufferMut<T>,
{
    type Output = D::Output;
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<D::Output> {
        let mut dst = self.dst.execute(ctx)?;
        self.src.copy_to_device_async(ctx.stream(), dst.buffer_mut())?;
        Ok(dst)
    }
}

/// Copies a device buffer into an existing page-locked buffer asynchronously. See [`download`].
pub struct Download<'p, T: DeviceRepr, S> {
    src: S,
    dst: &'p mut PinnedBuffer<T>,
}

/// Copies `src` into the existing page-locked `dst` (same length) without blocking the host,
/// yielding `src`. Once the op has completed (`.await`, `sync_on`), `dst.as_slice()` returns at
/// once; before, it waits for the copy.
///
/// ```no_run
/// # async fn demo(s: &cuda_core::Stream, y: &cuda_core::DeviceBuffer<f32>) -> cuda_async::Result<()> {
/// use cuda_async::{staging::{download, StagingPool}, DeviceOpExt};
/// let pool = StagingPool::<f32>::new(&cuda_core::Device::new(0)?);
/// let mut host = pool.get(y.len())?; // reused page-locked memory
/// download(y, &mut host).on(s).await?;
/// let first = host.as_slice()?[0];
/// # Ok(()) }
/// ```
pub fn download<'p, T: DeviceRepr, S: IntoBufferOp<T>>(
    src: S,
    dst: &'p mut PinnedBuffer<T>,
) -> Op<Download<'p, T, S::Op>> {
    Op(Download { src: src.into_buffer_op(), dst })
}

impl<T: DeviceRepr, S> DeviceOp for Download<'_, T, S>
where
    S: DeviceOp,
    S::Output: BufferRef<T>,
{
    type Output = S::Output;
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<S::Output> {
        let src = self.src.execute(ctx)?;
        self.dst.copy_from_device_async(ctx.stream(), src.buffer())?;
        Ok(src)
    }
}

/// A pool of page-locked buffers of element type `T` on one device, by length. [`StagingPool::get`]
/// reuses a returned buffer of that length or allocates one; the [`Staged`] guard returns it to the
/// pool when dropped (at most `max_per_len` are kept per length; a transfer still in flight is
/// waited for by the next host access, never cut short). Cloning the pool shares it.
#[derive(Clone)]
pub struct StagingPool<T: DeviceRepr> {
    inner: Arc<PoolInner<T>>,
}

struct PoolInner<T: DeviceRepr> {
    device: Device,
    free: Mutex<HashMap<usize, Vec<PinnedBuffer<T>>>>,
    max_per_len: usize,
}

impl<T: DeviceRepr> StagingPool<T> {
    /// A pool on `device` keeping up to 8 idle buffers per length.
    pub fn new(device: &Device) -> Self {
        Self::with_capacity(device, 8)
    }

    /// A pool keeping up to `max_per_len` idle buffers per length.
    pub fn with_capacity(device: &Device, max_per_len: usize) -> Self {
        StagingPool {
            inner: Arc::new(PoolInner { device: *device, free: Mutex::new(HashMap::new()), max_per_len }),
        }
    }

    /// A page-locked buffer of `len` elements (contents unspecified: whatever the last user left,
    /// or zeros), returned to the pool when the guard is dropped.
    ///
    /// # Errors
    /// Page-locked allocation errors (`cuMemHostAlloc`) when the pool has no buffer of that length.
    pub fn get(&self, len: usize) -> Result<Staged<T>> {
        let reused =
            self.inner.free.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&len).and_then(Vec::pop);
        let buf = match reused {
            Some(b) => b,
            // SAFETY: DeviceRepr types are valid for every bit pattern, all-zero included.
            None => PinnedBuffer::new(&self.inner.device, len, unsafe { std::mem::zeroed() })?,
        };
        Ok(Staged { buf: Some(buf), pool: self.inner.clone() })
    }

    /// How many idle buffers the pool holds.
    pub fn idle(&self) -> usize {
        self.inner.free.lock().unwrap_or_else(|e| e.into_inner()).values().map(Vec::len).sum()
    }
}

/// A page-locked buffer on loan from a [`StagingPool`]; dereferences to [`PinnedBuffer`].
pub struct Staged<T: DeviceRepr> {
    buf: Option<PinnedBuffer<T>>,
    pool: Arc<PoolInner<T>>,
}

impl<T: DeviceRepr> std::ops::Deref for Staged<T> {
    type Target = PinnedBuffer<T>;
    fn deref(&self) -> &PinnedBuffer<T> {
        self.buf.as_ref().expect("present until drop")
    }
}

impl<T: DeviceRepr> std::ops::DerefMut for Staged<T> {
    fn deref_mut(&mut self) -> &mut PinnedBuffer<T> {
        self.buf.as_mut().expect("present until drop")
    }
}

impl<T: DeviceRepr> Drop for Staged<T> {
    fn drop(&mut self) {
        let Some(buf) = self.buf.take() else { return };
        let mut free = self.pool.free.lock().unwrap_or_else(|e| e.into_inner());
        let list = free.entry(buf.len()).or_default();
        let surplus = if list.len() < self.pool.max_per_len {
            list.push(buf);
            None
        } else {
            Some(buf)
        };
        drop(free);
        // A surplus buffer is freed outside the lock: its drop waits for its transfer.
        drop(surplus);
    }
}
