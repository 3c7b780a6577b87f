//! `DeviceBuffer<T>`: typed device memory, allocated and freed stream-ordered.

use super::repr::DeviceRepr;
use crate::device::Device;
use crate::driver::result;
use crate::error::{Error, Result};
use crate::stream::Stream;
use crate::track::order::{ordered_on, ordered_with, InCapture};
use crate::track::Access;
use crate::track::Allocation;
use crate::track::MemPool;
use cudarc::driver::sys;
use std::marker::PhantomData;
use std::mem::size_of;
use std::sync::Arc;

/// A typed allocation of `len` elements of `T` in device memory.
///
/// Guarantees:
/// - It is allocated stream-ordered on its *home stream* (`cuMemAllocAsync` or
///   `cuMemAllocFromPoolAsync`) and freed stream-ordered on the same stream when dropped
///   (`cuMemFreeAsync`), so the free runs after every use queued before the drop.
/// - Every use is ordered against the earlier conflicting uses, on any stream (a read after the
///   last write, a write after the last write and the reads since: see [`crate::memory`]), and the
///   free waits for every use on other streams. Dropping never blocks the host.
/// - It keeps its home stream (and pool, if any) alive.
/// - Graphs that recorded work on it keep the memory alive (through its [`Allocation`]) for as
///   long as they can replay, even after the buffer itself is dropped.
///
/// ```no_run
/// # fn main() -> cuda_core::Result<()> {
/// use cuda_core::{Device, DeviceBuffer};
/// let s = Device::new(0)?.new_stream()?;
/// let a = DeviceBuffer::from_host(&s, &[1i32, 2, 3, 4])?;
/// let mut b = DeviceBuffer::<i32>::zeros(&s, 4)?;
/// b.copy_from_device(&s, &a)?; // ordered after the upload
/// drop(a); // freed on `s` after the copy; never blocks
/// assert_eq!(b.to_vec()?, [1, 2, 3, 4]);
/// # Ok(()) }
/// ```
pub struct DeviceBuffer<T: DeviceRepr> {
    ptr: sys::CUdeviceptr,
    len: usize,
    alloc: Arc<Allocation>,
    _marker: PhantomData<T>,
}

// SAFETY: the buffer owns its device memory; access to it goes through `&`/`&mut` like any owned
// value, and T: Send + Sync.
unsafe impl<T: DeviceRepr> Send for DeviceBuffer<T> {}
// SAFETY: `&DeviceBuffer` only allows reads (copies out, read-only kernel arguments).
unsafe impl<T: DeviceRepr> Sync for DeviceBuffer<T> {}

impl<T: DeviceRepr> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer<{}>[{}] @ {:#x}", std::any::type_name::<T>(), self.len, self.ptr)
    }
}

fn byte_len<T>(len: usize) -> Result<usize> {
    len.checked_mul(size_of::<T>())
        .ok_or_else(|| Error::InvalidArgument(format!("{len} elements overflow the address space")))
}

impl<T: DeviceRepr> DeviceBuffer<T> {
    /// Allocates `len` elements on `stream` from the device's current memory pool, without
    /// initialising them.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, DeviceBuffer};
    /// let s = Device::new(0)?.new_stream()?;
    /// // SAFETY: the fill below writes every element before anything reads the buffer.
    /// let mut buf = unsafe { DeviceBuffer::<u32>::uninit(&s, 1024)? };
    /// buf.fill(&s, 3)?;
    /// assert_eq!(buf.to_vec()?, vec![3; 1024]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    /// The contents are indeterminate until written; reading them back yields arbitrary (but valid,
    /// see [`DeviceRepr`]) values. Marked unsafe so that uninitialised reads are a visible choice.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the size overflows; [`Error::Capture`] on a capturing stream;
    /// driver errors (e.g. out of memory).
    pub unsafe fn uninit(stream: &Stream, len: usize) -> Result<Self> {
        Self::alloc_impl(stream, len, None)
    }

    /// Like [`DeviceBuffer::uninit`] but from `pool`.
    ///
    /// # Safety
    /// As for [`DeviceBuffer::uninit`].
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] for a pool of another device; as for [`DeviceBuffer::uninit`].
    pub unsafe fn uninit_in(pool: &MemPool, stream: &Stream, len: usize) -> Result<Self> {
        if pool.device() != stream.device() {
            return Err(Error::DeviceMismatch {
                during: "allocating from a memory pool",
                expected: pool.device().ordinal(),
                actual: stream.device().ordinal(),
            });
        }
        Self::alloc_impl(stream, len, Some(pool.clone()))
    }

    fn alloc_impl(stream: &Stream, len: usize, pool: Option<MemPool>) -> Result<Self> {
        let bytes = byte_len::<T>(len)?;
        let mut ptr = 0;
        if bytes > 0 {
            stream.device().bind()?;
            let state = stream.lock();
            crate::track::state::refuse_if_capturing(
                &state,
                "allocating device memory on a stream being captured",
            )?;
            // SAFETY: live stream (and pool) of the bound context.
            let res = unsafe {
                match &pool {
                    Some(p) => result::mem_alloc_from_pool_async(bytes, p.raw(), stream.raw()),
                    None => result::mem_alloc_async(bytes, stream.raw()),
                }
            };
            drop(state);
            ptr = res?;
        }
        let alloc = Arc::new(Allocation::new(ptr, stream.clone(), pool));
        Ok(DeviceBuffer { ptr, len, alloc, _marker: PhantomData })
    }

    /// Allocates `len` zeroed elements on `stream`.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, DeviceBuffer};
    /// let s = Device::new(0)?.new_stream()?;
    /// let z = DeviceBuffer::<f32>::zeros(&s, 1024)?;
    /// assert_eq!((z.len(), z.size_bytes()), (1024, 4096));
    /// assert!(z.to_vec()?.iter().all(|&v| v == 0.0));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`DeviceBuffer::uninit`] and [`DeviceBuffer::memset_zero`].
    pub fn zeros(stream: &Stream, len: usize) -> Result<Self> {
        // SAFETY: every byte is written by the memset queued right after on the same stream.
        let mut buf = unsafe { Self::uninit(stream, len)? };
        buf.memset_zero(stream)?;
        Ok(buf)
    }

    /// Allocates and fills with `value` (for element sizes 1, 2, 4 and 8 bytes; others are an
    /// [`Error::InvalidArgument`]).
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, DeviceBuffer, Error};
    /// let s = Device::new(0)?.new_stream()?;
    /// let x = DeviceBuffer::filled(&s, 4, half::bf16::ONE)?;
    /// assert_eq!(x.to_vec()?, [half::bf16::ONE; 4]);
    /// // 16-byte elements cannot be filled by the driver's memsets:
    /// assert!(matches!(DeviceBuffer::filled(&s, 4, 1u128), Err(Error::InvalidArgument(_))));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`DeviceBuffer::uninit`] and [`DeviceBuffer::fill`].
    pub fn filled(stream: &Stream, len: usize, value: T) -> Result<Self> {
        // SAFETY: every element is written by the fill queued right after on the same stream.
        let mut buf = unsafe { Self::uninit(stream, len)? };
        buf.fill(stream, value)?;
        Ok(buf)
    }

    /// Allocates on `stream` and copies `data` into it. Returns once `data` has been staged, so
    /// the slice may be changed or dropped right away.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, DeviceBuffer};
    /// let s = Device::new(0)?.new_stream()?;
    /// let mut host = vec![1.0f32; 256];
    /// let d = DeviceBuffer::from_host(&s, &host)?;
    /// host.fill(0.0); // fine: `from_host` returned once `host` was staged
    /// assert_eq!(d.to_vec()?, vec![1.0; 256]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`DeviceBuffer::uninit`] and [`DeviceBuffer::copy_from_host`].
    pub fn from_host(stream: &Stream, data: &[T]) -> Result<Self> {
        // SAFETY: every element is written by the copy queued right after on the same stream.
        let mut buf = unsafe { Self::uninit(stream, data.len())? };
        buf.copy_from_host(stream, data)?;
        Ok(buf)
    }

    /// A buffer of `len` elements over an existing allocation (`crate::interop`). The caller
    /// guarantees that `alloc` spans `len` elements of `T`, suitably aligned.
    pub(crate) fn from_allocation(alloc: Arc<Allocation>, len: usize) -> Self {
        DeviceBuffer { ptr: alloc.ptr, len, alloc, _marker: PhantomData }
    }

    /// The allocation, taken out of the buffer (`crate::interop`'s hand-back).
    pub(crate) fn into_allocation(self) -> Arc<Allocation> {
        self.alloc
    }

    /// Number of elements.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    #[inline]
    pub fn size_bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// The raw device address (0 for an empty buffer). Valid until the buffer is dropped and the
    /// free has run on the home stream.
    #[inline]
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// A reference to the stored device address, for passing as a kernel parameter.
    #[inline]
    pub(crate) fn device_ptr_ref(&self) -> &sys::CUdeviceptr {
        &self.ptr
    }

    /// The home stream: the stream it was allocated on and will be freed on.
    #[inline]
    pub fn home_stream(&self) -> &Stream {
        &self.alloc.stream
    }

    /// The shared allocation behind the buffer (what graphs keep alive).
    #[inline]
    pub fn allocation(&self) -> &Arc<Allocation> {
        &self.alloc
    }

    /// The device that holds the memory.
    #[inline]
    pub fn device(&self) -> &Device {
        self.alloc.stream.device()
    }

    fn check_device(&self, stream: &Stream, during: &'static str) -> Result<()> {
        if stream.device() != self.device() {
            return Err(Error::DeviceMismatch {
                during,
                expected: self.device().ordinal(),
                actual: stream.device().ordinal(),
            });
        }
        Ok(())
    }

    fn check_len(&self, len: usize, during: &'static str) -> Result<()> {
        if len != self.len {
            return Err(Error::LengthMismatch { during, expected: self.len, actual: len });
        }
        Ok(())
    }

    /// Queues a copy of `data` into the buffer on `stream`, and returns once the driver no longer
    /// reads `data`, so `data` may be reused immediately: ordinary (pageable) memory is staged by
    /// the driver before it returns; from memory the driver knows (page-locked, registered or
    /// managed, e.g. a [`crate::PinnedBuffer`]'s slice), which it copies asynchronously, this waits
    /// for the copy (and the work queued before it on `stream`). Lengths must match.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, DeviceBuffer, PinnedBuffer};
    /// let dev = Device::new(0)?;
    /// let s = dev.new_stream()?;
    /// let mut d = DeviceBuffer::<u32>::zeros(&s, 3)?;
    /// let mut host = PinnedBuffer::from_slice(&dev, &[1u32, 2, 3])?;
    /// d.copy_from_host(&s, host.as_slice()?)?; // page-locked: waits for the copy
    /// host.as_mut_slice()?.fill(0); // cannot change what was copied
    /// assert_eq!(d.to_vec()?, [1, 2, 3]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::LengthMismatch`], [`Error::DeviceMismatch`]; [`Error::Capture`] on a capturing
    /// stream (a pageable copy cannot be recorded) or another thread's capture; driver errors
    /// (for memory the driver knows, including faults of earlier work reported by the wait).
    pub fn copy_from_host(&mut self, stream: &Stream, data: &[T]) -> Result<()> {
        self.check_len(data.len(), "copying host to device")?;
        self.check_device(stream, "copying host to device")?;
        if self.size_bytes() == 0 {
            return Ok(());
        }
        stream.device().bind()?;
        // Both ends of the range: a registration may cover part of an allocation.
        let first = data.as_ptr().cast::<u8>();
        let last = first.wrapping_add(self.size_bytes() - 1);
        let asynchronous = result::host_memory_known_to_driver(first.cast())
            || result::host_memory_known_to_driver(last.cast());
        let refuse = InCapture::Refuse("a copy from pageable host memory on a stream being captured");
        let mut waiting = None;
        ordered_with(stream, &[(&self.alloc, Access::Write)], refuse, || {
            // SAFETY: `data` is a live slice of exactly size_bytes() bytes; for pageable memory the
            // driver stages it before returning, and for memory it knows we wait below before
            // returning. The destination is our allocation.
            let queued = unsafe {
                result::memcpy_htod_async(
                    self.ptr,
                    data.as_ptr().cast(),
                    self.size_bytes(),
                    stream.raw(),
                    "copying host to device",
                )
            };
            // Counted in as a waiter under the lock: no capture can begin before the wait.
            if asynchronous {
                waiting = Some(stream.waiting_locked());
            }
            queued
        })?;
        match waiting {
            Some(_waiting) => stream.sync_for_copy(),
            None => Ok(()),
        }
    }

    /// Copies the buffer into `out`, blocking until the copy (and all earlier work on `stream`)
    /// is complete. Lengths must match.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, DeviceBuffer, Error};
    /// let s = Device::new(0)?.new_stream()?;
    /// let d = DeviceBuffer::from_host(&s, &[1u8, 2, 3])?;
    /// let mut out = [0u8; 3];
    /// d.copy_to_host(&s, &mut out)?; // returns once the copy is done
    /// assert_eq!(out, [1, 2, 3]);
    /// let mut short = [0u8; 2];
    /// assert!(matches!(d.copy_to_host(&s, &mut short), Err(Error::LengthMismatch { .. })));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::LengthMismatch`], [`Error::DeviceMismatch`]; [`Error::Capture`] on a capturing
    /// stream; driver errors, including faults of earlier work reported by the wait.
    pub fn copy_to_host(&self, stream: &Stream, out: &mut [T]) -> Result<()> {
        self.check_len(out.len(), "copying device to host")?;
        // SAFETY: `out` is a live exclusive slice of exactly `len` elements.
        unsafe { self.copy_to_host_ptr(stream, out.as_mut_ptr()) }
    }

    /// # Safety
    /// `out` must be valid for writes of `self.len()` elements and not accessed until this returns.
    unsafe fn copy_to_host_ptr(&self, stream: &Stream, out: *mut T) -> Result<()> {
        self.check_device(stream, "copying device to host")?;
        if self.len == 0 {
            return Ok(());
        }
        stream.device().bind()?;
        let refuse = InCapture::Refuse("a blocking copy to the host on a stream being captured");
        let mut waiting = None;
        let queued = ordered_with(stream, &[(&self.alloc, Access::Read)], refuse, || {
            // SAFETY: the caller guarantees `out` is writable for size_bytes() bytes; we synchronize
            // below before returning, so the driver's write is complete when the caller resumes.
            let queued = unsafe {
                result::memcpy_dtoh_async(
                    out.cast(),
                    self.ptr,
                    self.size_bytes(),
                    stream.raw(),
                    "copying device to host",
                )
            };
            // Counted in as a waiter under the lock (`Waiting`): no capture of `stream` can begin
            // before the wait below, so it cannot fail for a capture while the driver may still
            // write into `out` (page-locked memory is written asynchronously).
            waiting = Some(stream.waiting_locked());
            queued
        });
        // Wait outside the locks (other threads' uses need not wait for our host wait), and only if
        // the copy was queued: `out` must not be released while the driver may still write into it.
        queued?;
        let done = stream.sync_for_copy();
        drop(waiting);
        done
    }

    /// Copies the whole buffer to a new `Vec`, blocking, ordered on the home stream.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, DeviceBuffer};
    /// let s = Device::new(0)?.new_stream()?;
    /// let d = DeviceBuffer::filled(&s, 3, 7u16)?;
    /// assert_eq!(d.to_vec()?, vec![7, 7, 7]); // waits for the fill, then copies
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`DeviceBuffer::copy_to_host`].
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut out = Vec::with_capacity(self.len);
        // SAFETY: the spare capacity holds `len` elements; the copy writes all of them before we
        // set the length, and on error the Vec stays empty.
        unsafe {
            self.copy_to_host_ptr(&self.alloc.stream, out.as_mut_ptr())?;
            out.set_len(self.len);
        }
        Ok(out)
    }

    /// Queues a device-to-device copy of `src` into `self` on `stream`. Lengths must match.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, DeviceBuffer};
    /// let dev = Device::new(0)?;
    /// let (s1, s2) = (dev.new_stream()?, dev.new_stream()?);
    /// let src = DeviceBuffer::from_host(&s1, &[1.0f32, 2.0])?;
    /// let mut dst = DeviceBuffer::<f32>::zeros(&s2, 2)?;
    /// dst.copy_from_device(&s2, &src)?; // on `s2`, ordered after the upload on `s1`
    /// assert_eq!(dst.to_vec()?, [1.0, 2.0]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::LengthMismatch`], [`Error::DeviceMismatch`]; [`Error::Capture`] (another thread's
    /// capture, or a home stream captured from here); driver errors.
    pub fn copy_from_device(&mut self, stream: &Stream, src: &DeviceBuffer<T>) -> Result<()> {
        self.check_len(src.len, "copying device to device")?;
        self.check_device(stream, "copying device to device")?;
        src.check_device(stream, "copying device to device")?;
        if self.len == 0 {
            return Ok(());
        }
        stream.device().bind()?;
        ordered_on(stream, &[(&self.alloc, Access::Write), (&src.alloc, Access::Read)], || {
            // SAFETY: two distinct live allocations (`&mut self` excludes aliasing `src`) of
            // size_bytes() bytes each; ordering against both home streams is handled above.
            unsafe { result::memcpy_dtod_async(self.ptr, src.ptr, self.size_bytes(), stream.raw()) }
        })
    }

    /// Queues zeroing of every byte on `stream`.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`]; [`Error::Capture`] as for [`DeviceBuffer::copy_from_device`];
    /// driver errors.
    pub fn memset_zero(&mut self, stream: &Stream) -> Result<()> {
        self.check_device(stream, "memset")?;
        if self.len == 0 {
            return Ok(());
        }
        stream.device().bind()?;
        ordered_on(stream, &[(&self.alloc, Access::Write)], || {
            // SAFETY: our allocation of size_bytes() bytes.
            unsafe { result::memset_d8_async(self.ptr, 0, self.size_bytes(), stream.raw(), "memset") }
        })
    }

    /// Queues setting every element to `value` on `stream`. Element sizes of 1, 2, 4 or 8 bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for element sizes other than 1, 2, 4 and 8 bytes; as for
    /// [`DeviceBuffer::memset_zero`].
    pub fn fill(&mut self, stream: &Stream, value: T) -> Result<()> {
        self.check_device(stream, "fill")?;
        if self.len == 0 {
            return Ok(());
        }
        let (ptr, len, s) = (self.ptr, self.len, stream.raw());
        stream.device().bind()?;
        ordered_on(stream, &[(&self.alloc, Access::Write)], || {
            // SAFETY: (all arms) writes exactly len elements of size_of::<T>() bytes inside our
            // allocation; reading `value`'s bytes as an integer of the same size is sound for POD.
            unsafe {
                match size_of::<T>() {
                    1 => result::memset_d8_async(
                        ptr,
                        std::mem::transmute_copy::<T, u8>(&value),
                        len,
                        s,
                        "fill",
                    ),
                    2 => result::memset_d16_async(
                        ptr,
                        std::mem::transmute_copy::<T, u16>(&value),
                        len,
                        s,
                        "fill",
                    ),
                    4 => result::memset_d32_async(
                        ptr,
                        std::mem::transmute_copy::<T, u32>(&value),
                        len,
                        s,
                        "fill",
                    ),
                    8 => {
                        // Two strided 32-bit memsets: the low words, then the high words.
                        let bits = std::mem::transmute_copy::<T, u64>(&value);
                        result::memset_d2d32_async(ptr, 8, bits as u32, 1, len, s, "fill")?;
                        result::memset_d2d32_async(ptr + 4, 8, (bits >> 32) as u32, 1, len, s, "fill")
                    }
                    n => Err(Error::InvalidArgument(format!(
                        "fill supports element sizes 1, 2, 4 and 8 bytes, not {n}"
                    ))),
                }
            }
        })
    }
}
