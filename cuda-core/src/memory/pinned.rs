//! `PinnedBuffer<T>`: page-locked host memory for truly asynchronous copies.

use super::buffer::DeviceBuffer;
use super::host_alloc::HostAlloc;
use super::repr::DeviceRepr;
use crate::device::Device;
use crate::driver::result;
use crate::error::{Error, Result};
use crate::event::{Event, PooledEvent};
use crate::stream::Stream;
use crate::track::order::{ordered_with, InCapture};
use crate::track::Access;
use cudarc::driver::sys;
use std::mem::size_of;

/// Page-locked host memory holding `len` elements of `T`.
///
/// Asynchronous copies to or from it return before the transfer is done. To keep that safe, the
/// buffer remembers the last transfer (an event); every host access ([`PinnedBuffer::as_slice`],
/// [`PinnedBuffer::as_mut_slice`]) first waits for it, and the drop of a buffer with a transfer
/// hands the free to a library thread (the reaper), after the transfer, so that a drop never
/// blocks. Safe code can therefore never see a half-written buffer, write into memory a copy is
/// still reading, or free it early.
///
/// ```no_run
/// # fn main() -> cuda_core::Result<()> {
/// use cuda_core::{Device, DeviceBuffer, PinnedBuffer};
/// let dev = Device::new(0)?;
/// let s = dev.new_stream()?;
/// let mut host = PinnedBuffer::from_slice(&dev, &[1.0f32, 2.0, 3.0])?;
/// let mut d = DeviceBuffer::<f32>::zeros(&s, 3)?;
/// host.copy_to_device_async(&s, &mut d)?; // returns before the transfer is done
/// host.as_mut_slice()?.fill(0.0); // waits for the transfer first
/// host.copy_from_device_async(&s, &d)?;
/// assert_eq!(host.as_slice()?, [1.0, 2.0, 3.0]); // waits for the copy back
/// # Ok(()) }
/// ```
pub struct PinnedBuffer<T: DeviceRepr> {
    ptr: *mut T,
    len: usize,
    device: Device,
    pending: Option<PooledEvent>,
}

// SAFETY: the buffer owns its host allocation; in-flight transfers are tracked by `pending` and
// waited for before any host access, so moving it between threads cannot create a data race.
unsafe impl<T: DeviceRepr> Send for PinnedBuffer<T> {}
// SAFETY: `&PinnedBuffer` gives read access only, after waiting for the pending transfer; new
// transfers need `&mut`.
unsafe impl<T: DeviceRepr> Sync for PinnedBuffer<T> {}

impl<T: DeviceRepr> PinnedBuffer<T> {
    /// Allocates page-locked memory for `len` elements, filled with `value`.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// let dev = cuda_core::Device::new(0)?;
    /// let buf = cuda_core::PinnedBuffer::new(&dev, 4096, 0u8)?;
    /// assert_eq!(buf.len(), 4096);
    /// assert!(buf.as_slice()?.iter().all(|&b| b == 0));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the size overflows; [`Error::Capture`] on a thread that has a
    /// stream capture open (the driver forbids a capturing thread page-locked allocation: it would
    /// fail and invalidate the capture); driver errors (e.g. out of page-locked memory).
    ///
    /// A buffer dropped on a thread that has a capture open, or with a transfer recorded, is freed
    /// later, on a library thread, after its pending transfer (if that thread cannot be started,
    /// the memory is leaked, never freed early).
    pub fn new(device: &Device, len: usize, value: T) -> Result<Self> {
        let bytes = len
            .checked_mul(size_of::<T>())
            .ok_or_else(|| Error::InvalidArgument(format!("{len} elements overflow")))?;
        let mut ptr = std::ptr::NonNull::<T>::dangling().as_ptr();
        if bytes > 0 {
            // Refused on a thread that has a capture open (see `HostAlloc`). The allocation is
            // owned by this buffer from here on (freed by its drop).
            let raw = HostAlloc::new(device, bytes, "allocating pinned host memory", FREEING)?;
            ptr = raw.ptr.cast();
            std::mem::forget(raw);
            for i in 0..len {
                // SAFETY: `ptr` is a fresh allocation of `len` elements, suitably aligned (the
                // driver returns page-aligned memory).
                unsafe { ptr.add(i).write(value) };
            }
        }
        Ok(PinnedBuffer { ptr, len, device: *device, pending: None })
    }

    /// Allocates page-locked memory holding a copy of `data`.
    ///
    /// # Errors
    /// As for [`PinnedBuffer::new`].
    pub fn from_slice(device: &Device, data: &[T]) -> Result<Self> {
        let Some(&first) = data.first() else {
            return Self::new(device, 0, unsafe_zero());
        };
        let mut b = Self::new(device, data.len(), first)?;
        b.as_mut_slice()?.copy_from_slice(data);
        Ok(b)
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn wait(&self) -> Result<()> {
        match &self.pending {
            Some(ev) => ev.synchronize(),
            None => Ok(()),
        }
    }

    /// The contents, after waiting for any transfer still in flight.
    ///
    /// # Errors
    /// Errors of the transfer waited for (a fault of the copy, or [`Error::Capture`] for a transfer
    /// recorded in a capture).
    pub fn as_slice(&self) -> Result<&[T]> {
        self.wait()?;
        // SAFETY: `ptr` holds `len` initialised elements and no transfer is in flight.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
    }

    /// The contents, mutable, after waiting for any transfer still in flight.
    ///
    /// # Errors
    /// As for [`PinnedBuffer::as_slice`].
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.wait()?;
        self.pending = None;
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }

    /// Queues an asynchronous copy of this buffer into `dst` on `stream` and returns at once.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`]; [`Error::DeviceMismatch`] for a device buffer of another device
    /// than the stream's; [`Error::Capture`] on a capturing stream; driver errors. The copy is
    /// queued behind the previous transfer of this buffer (on the GPU; on the host for a transfer
    /// on another device, whose errors are then returned here).
    pub fn copy_to_device_async(&mut self, stream: &Stream, dst: &mut DeviceBuffer<T>) -> Result<()> {
        const DURING: &str = "async copy pinned host to device";
        let (d, bytes) = (dst.device_ptr(), dst.size_bytes());
        self.transfer(stream, dst, Access::Write, DURING, |host, s| {
            // SAFETY: both ranges are live and exactly `bytes` long; `self` stays alive and
            // unwritten by the host until `pending` (recorded after the copy) completes.
            unsafe { result::memcpy_htod_async(d, host, bytes, s, DURING) }
        })
    }

    /// Queues an asynchronous copy of `src` into this buffer on `stream` and returns at once.
    /// The data is visible through [`PinnedBuffer::as_slice`], which waits for the copy.
    ///
    /// # Errors
    /// As for [`PinnedBuffer::copy_to_device_async`].
    pub fn copy_from_device_async(&mut self, stream: &Stream, src: &DeviceBuffer<T>) -> Result<()> {
        const DURING: &str = "async copy device to pinned host";
        let (d, bytes) = (src.device_ptr(), src.size_bytes());
        self.transfer(stream, src, Access::Read, DURING, |host, s| {
            // SAFETY: both ranges are live and exactly `bytes` long; the host cannot read or free
            // `self` before `pending` (recorded after the copy) completes.
            unsafe { result::memcpy_dtoh_async(host, d, bytes, s, DURING) }
        })
    }

    /// The shared part of both directions: checks, orders after the previous transfer, queues `copy`
    /// (which describes itself as `during` in its errors) ordered with `dev`'s other uses, and
    /// records the pending event — also when a join after the copy failed, so the host never
    /// touches memory a queued copy may still use.
    fn transfer(
        &mut self,
        stream: &Stream,
        dev: &DeviceBuffer<T>,
        access: Access,
        during: &'static str,
        copy: impl FnOnce(*mut std::ffi::c_void, sys::CUstream) -> Result<()>,
    ) -> Result<()> {
        if dev.len() != self.len {
            return Err(Error::LengthMismatch { during, expected: self.len, actual: dev.len() });
        }
        // A device buffer of another device than the stream's is refused, as the blocking copies
        // refuse it (found by review: the copy was queued on one device's stream with another
        // device's memory).
        if dev.device() != stream.device() {
            return Err(Error::DeviceMismatch {
                during,
                expected: stream.device().ordinal(),
                actual: dev.device().ordinal(),
            });
        }
        // No bytes (no elements, or a zero-sized `T`): no allocation, nothing to copy.
        if self.len == 0 || size_of::<T>() == 0 {
            return Ok(());
        }
        // A previous transfer may still use `self`; the stream order only covers `stream`. The new
        // copy waits for it on the GPU, behind the stream's queued work (found by review: a host
        // wait here made the next pass after a cancelled one block its executor thread for about
        // one pass). Host accesses and the drop wait for the new transfer, which comes after it.
        // An event of another device is waited for on the host.
        let prev = self.pending.as_ref().filter(|ev| ev.device() == stream.device());
        if prev.is_none() {
            self.wait()?;
        }
        stream.device().bind()?;
        let host = self.ptr.cast();
        let refuse = InCapture::Refuse("an async copy with pinned host memory on a stream being captured");
        let ev = Event::pooled(stream.device())?;
        let mut tracked = false;
        let queued = ordered_with(stream, &[(dev.allocation(), access)], refuse, || {
            if let Some(prev) = prev {
                stream.wait_unchecked(prev)?;
            }
            copy(host, stream.raw())?;
            // Recorded under the stream's lock, right behind the copy: the host waits for it before
            // touching `self`. Without it, wait for the copy here.
            match ev.record_locked(stream) {
                Ok(()) => tracked = true,
                Err(e) => {
                    // With the thread's capture mode relaxed: a thread capturing another stream
                    // must not lose this wait (the copy is queued).
                    stream.sync_for_copy()?;
                    return Err(e);
                }
            }
            Ok(())
        });
        if tracked {
            self.pending = Some(ev);
        }
        queued
    }
}

fn unsafe_zero<T: DeviceRepr>() -> T {
    // SAFETY: DeviceRepr types are valid for every bit pattern, all-zero included.
    unsafe { std::mem::zeroed() }
}

const FREEING: &str = "freeing page-locked host memory";

impl<T: DeviceRepr> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        // No allocation was made for zero bytes (no elements, or a zero-sized `T`: found by
        // review, a ZST buffer passed its dangling pointer to cuMemFreeHost).
        if self.len == 0 || size_of::<T>() == 0 {
            return;
        }
        // A thread with a capture open may neither wait for the transfer nor free page-locked
        // memory (the driver would fail both and invalidate the capture): the free goes to the
        // reaper thread, after the pending transfer.
        if crate::driver::this_thread_captures() {
            // SAFETY: allocated by cuMemHostAlloc (`new`), owned by this buffer, which is gone
            // after this drop.
            let owner = unsafe { HostAlloc::from_raw(self.ptr.cast(), self.device, FREEING) };
            owner.free_on_reaper(self.pending.take());
            return;
        }
        // A transfer recorded: the free goes to the reaper thread, after it, rather than waiting
        // here (found by review: a future cancelled by a timeout dropped its buffer on the
        // executor thread, which then waited out the rest of the stream's queued work, so the
        // timeout bounded nothing; and `cuMemFreeHost` itself may synchronise). An event whose
        // query already fails (a faulted copy, a record in a capture) takes the path below, which
        // leaks rather than frees.
        if self.pending.as_ref().is_some_and(|ev| ev.query().is_ok()) {
            // SAFETY: as above.
            let owner = unsafe { HostAlloc::from_raw(self.ptr.cast(), self.device, FREEING) };
            owner.free_on_reaper(self.pending.take());
            return;
        }
        // The memory must not be freed while a transfer still touches it: wait first. If the wait
        // or the context binding fails, leak the memory rather than risk freeing it early.
        if self.wait().is_ok() && self.device.bind_in_drop() {
            // SAFETY: allocated by cuMemHostAlloc; no transfer is in flight any more.
            let res = unsafe { result::mem_free_host(self.ptr.cast(), FREEING) };
            crate::error::note_drop(res);
        }
    }
}
