//! Stream progress counters: a cheap way for the host to learn that a stream's work up to a point
//! has completed, without a driver call per check.
//!
//! Each stream that asks for one gets a 64-bit **slot** in page-locked host memory mapped into the
//! device. `Stream::mark_progress` queues
//! `cuStreamWriteValue64(slot, n)` with the next number `n` of that slot and returns a
//! [`ProgressMark`]; the GPU performs the write when all work queued before it on the stream has
//! completed (the default write carries a system-scope memory fence). Checking a mark is then one
//! atomic load: [`ProgressMark::is_reached`] is `slot >= n`.
//!
//! **Why a mark can be trusted.** Values written to a slot only grow:
//! * numbers are handed out and their writes queued under the stream's enqueue lock, so the writes
//!   of one stream are queued (and, the stream being ordered, performed) in increasing order;
//! * marking is refused on a stream that is being captured (under the same lock), so no graph can
//!   hold a write that a later replay would repeat with an old number;
//! * a slot goes to another stream only once its value has caught up with the last number issued
//!   on it (no write of the old stream is still in flight), and numbering continues from there.
//!   A slot whose last write never lands (its stream faulted) is never reused.
//!
//! What a mark cannot tell is that the work *failed*: after a fault the write is never performed.
//! Callers that must not wait forever keep an event behind the same work and query it now and
//! then (the completion engine of `cuda-async` does).
//!
//! The slots' memory is never freed (a page per 512 streams alive at once), so a mark stays valid
//! after its stream is gone.

use crate::device::{Device, DeviceAttribute};
use crate::driver::result;
use crate::error::{Error, Result};
use crate::per_device::PerDevice;
use cudarc::driver::sys;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Slots per page-locked page.
const SLOTS_PER_PAGE: usize = 4096 / 8;

/// A point in a stream's work: reached once all work queued on the stream before
/// `Stream::mark_progress` has completed.
///
/// ```no_run
/// # fn main() -> cuda_core::Result<()> {
/// use cuda_core::{DeviceBuffer, Device, Stream};
/// let s = Stream::new(&Device::new(0)?)?;
/// let x = DeviceBuffer::<f32>::zeros(&s, 1 << 20)?;
/// let mark = s.mark_progress()?;
/// while !mark.is_reached() {
///     std::hint::spin_loop(); // one load per check, no driver call
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Copy)]
pub struct ProgressMark {
    slot: &'static AtomicU64,
    seq: u64,
}

impl ProgressMark {
    /// `true` once the work queued before the mark has completed (an Acquire load).
    #[inline]
    pub fn is_reached(&self) -> bool {
        self.slot.load(Ordering::Acquire) >= self.seq
    }

    /// The slot this mark reads: marks of the same stream share one, so a caller tracking many
    /// marks can read each slot once and compare every mark of that stream with the value.
    #[inline]
    pub fn slot_id(&self) -> usize {
        std::ptr::from_ref(self.slot) as usize
    }

    /// The number the mark waits for; marks of one slot are reached in increasing order.
    #[inline]
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// The value of this mark's slot now (Acquire), to compare with the `seq` of its marks.
    #[inline]
    pub fn slot_value(&self) -> u64 {
        self.slot.load(Ordering::Acquire)
    }
}

impl std::fmt::Debug for ProgressMark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProgressMark(#{} of slot {:#x}, reached: {})", self.seq, self.slot_id(), self.is_reached())
    }
}

/// One stream's counter: its slot and the last number handed out on it.
pub(crate) struct Slot {
    pool: &'static SlotPool,
    cell: &'static AtomicU64,
    dptr: sys::CUdeviceptr,
    /// The last number issued (advanced only under the owning stream's enqueue lock).
    issued: AtomicU64,
}

impl Slot {
    /// A slot for a stream of `device`: [`Error::InvalidArgument`] where the device cannot write
    /// values from a stream; driver errors allocating the page-locked memory.
    pub(crate) fn new(device: &Device) -> Result<Slot> {
        let pool = SLOTS.get_or_try_init(device, || SlotPool::new(device))?;
        let (cell, dptr, issued) = pool.take(device)?;
        Ok(Slot { pool, cell, dptr, issued: AtomicU64::new(issued) })
    }

    /// Queues the write of the next number on `raw` and returns its mark.
    ///
    /// # Safety
    /// `raw` is the live stream this slot belongs to, its device's context is bound, and the caller
    /// holds that stream's enqueue lock and has checked that it is not being captured.
    pub(crate) unsafe fn issue(&self, raw: sys::CUstream) -> Result<ProgressMark> {
        let seq = self.issued.load(Ordering::Relaxed) + 1;
        // SAFETY: a live stream with its context bound (caller's contract); `dptr` is the device
        // address of our slot in mapped page-locked memory, which is never freed, 8-byte aligned.
        unsafe { result::stream_write_value64(raw, self.dptr, seq) }?;
        // Only after the write was queued: a failed enqueue leaves no number that never lands.
        self.issued.store(seq, Ordering::Relaxed);
        Ok(ProgressMark { slot: self.cell, seq })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.pool.give_back(self.cell, self.dptr, *self.issued.get_mut());
    }
}

/// The slots of one device: pages of mapped page-locked memory, slots free for reuse, and slots
/// whose last writes may still be in flight.
struct SlotPool {
    inner: Mutex<PoolInner>,
}

#[derive(Default)]
struct PoolInner {
    free: Vec<(&'static AtomicU64, sys::CUdeviceptr, u64)>,
    /// Given back with `issued` numbers: reusable once the slot's value reaches it.
    draining: Vec<(&'static AtomicU64, sys::CUdeviceptr, u64)>,
}

// SAFETY: the raw device addresses are plain integers naming memory that is never freed; the
// cells are atomics. Nothing here is tied to a thread.
unsafe impl Send for PoolInner {}

static SLOTS: PerDevice<SlotPool> = PerDevice::new();

impl SlotPool {
    fn new(device: &Device) -> Result<SlotPool> {
        if device.attribute(DeviceAttribute::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS)? == 0 {
            return Err(Error::InvalidArgument(format!(
                "device {} cannot write 64-bit values from a stream (no stream progress marks)",
                device.ordinal()
            )));
        }
        Ok(SlotPool { inner: Mutex::new(PoolInner::default()) })
    }

    fn take(&self, device: &Device) -> Result<(&'static AtomicU64, sys::CUdeviceptr, u64)> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let inner = &mut *inner;
        // Slots whose writes have all landed become free again.
        let mut i = 0;
        while i < inner.draining.len() {
            let (cell, _, issued) = inner.draining[i];
            if cell.load(Ordering::Acquire) >= issued {
                inner.free.push(inner.draining.swap_remove(i));
            } else {
                i += 1;
            }
        }
        if inner.free.is_empty() {
            inner.free.extend(new_page(device)?);
        }
        inner.free.pop().ok_or_else(|| Error::InvalidArgument("no progress slot".into()))
    }

    fn give_back(&self, cell: &'static AtomicU64, dptr: sys::CUdeviceptr, issued: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        inner.draining.push((cell, dptr, issued));
    }
}

/// A fresh page of zeroed slots, mapped into `device`'s address space. Never freed.
fn new_page(device: &Device) -> Result<Vec<(&'static AtomicU64, sys::CUdeviceptr, u64)>> {
    // Page-locked allocation is refused to a thread with a capture open (see
    // `driver::this_thread_captures`): the caller gets an error, the capture stays valid.
    if crate::driver::this_thread_captures() {
        return Err(Error::Capture("allocating progress counters while this thread captures a stream"));
    }
    device.bind()?;
    let bytes = SLOTS_PER_PAGE * 8;
    let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
    // SAFETY: the device's context is bound.
    let host = unsafe { result::mem_host_alloc(bytes, flags, "allocating progress counters") }?;
    // SAFETY: `host` was just allocated with DEVICEMAP; context bound.
    let dptr = match unsafe { result::mem_host_get_device_pointer(host) } {
        Ok(dptr) => dptr,
        Err(e) => {
            // SAFETY: our allocation, never shared, no transfer uses it.
            crate::error::note_drop(unsafe {
                result::mem_free_host(host, "freeing unmapped progress counters")
            });
            return Err(e);
        }
    };
    let cells = host.cast::<AtomicU64>();
    // SAFETY: `host` is a page-aligned allocation of `bytes` bytes that is never freed, so it may be
    // viewed as a `'static` array of `SLOTS_PER_PAGE` atomics; zero-initialise them before any
    // reference exists. The GPU writes into it only through marks issued later.
    let slots = unsafe {
        std::ptr::write_bytes(cells, 0, SLOTS_PER_PAGE);
        std::slice::from_raw_parts(cells.cast_const(), SLOTS_PER_PAGE)
    };
    Ok(slots.iter().enumerate().map(|(i, cell)| (cell, dptr + 8 * i as u64, 0)).collect())
}
