//! `Allocation`: shared ownership of one stream-ordered device allocation.

use super::access::AccessState;
use super::pool::MemPool;
use crate::capture;
use crate::driver::result;
use crate::event::PooledEvent;
use crate::stream::Stream;
use cudarc::driver::sys;

/// One device allocation with its home stream. A [`crate::DeviceBuffer`] holds it in an `Arc`;
/// executable graphs hold further `Arc`s of every allocation their nodes use, so the memory lives
/// as long as any graph that can touch it. The last owner frees it stream-ordered on the home
/// stream (every use on another stream has been joined back to it), or, if the home stream is
/// being captured at that moment, right after the capture ends (a free must never be recorded
/// into a graph).
pub struct Allocation {
    pub(crate) ptr: sys::CUdeviceptr,
    pub(crate) stream: Stream,
    pub(crate) _pool: Option<MemPool>,
    /// What a new use must wait for; only touched under the home stream's enqueue lock.
    access: std::sync::Mutex<AccessState>,
    /// Whether `access` holds any mark of another stream (a foreign write or reads). While it does
    /// not, a use on the home stream has nothing to wait for and skips `access` entirely. Only
    /// read or written under the home stream's enqueue lock (which orders it), hence `Relaxed`.
    pub(crate) foreign: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Allocation({:#x} on {:?})", self.ptr, self.stream)
    }
}

impl Allocation {
    pub(crate) fn new(ptr: sys::CUdeviceptr, stream: Stream, pool: Option<MemPool>) -> Allocation {
        Allocation { ptr, stream, _pool: pool, access: Default::default(), foreign: Default::default() }
    }

    /// The access state (see `memory::access`). The caller holds the home stream's lock.
    pub(crate) fn access(&self) -> std::sync::MutexGuard<'_, AccessState> {
        self.access.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The device address (0 for an empty allocation).
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The home stream: where the memory was allocated and will be freed.
    pub fn home_stream(&self) -> &Stream {
        &self.stream
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        // Under the home stream's lock: a capture cannot begin between the check and the free.
        let mut state = self.stream.lock();
        let access = std::mem::take(&mut *self.access());
        let waits: Vec<_> = access.all_marks().cloned().collect();
        let Some(waits) = capture::defer_free(&mut state, self.ptr, waits) else {
            return;
        };
        if self.stream.device().bind().is_ok() {
            // The free waits for every use on other streams, then runs in the home stream's order.
            free_after(self.stream.raw(), self.ptr, &waits);
        }
    }
}

/// Frees `ptr` on `stream` after the events `waits` (uses on other streams) have completed; see
/// [`free_raw`]. If a wait cannot be queued, the memory is leaked rather than freed early.
pub(crate) fn free_after(
    stream: sys::CUstream,
    ptr: sys::CUdeviceptr,
    waits: &[std::sync::Arc<PooledEvent>],
) {
    for ev in waits {
        const DURING: &str = "ordering a free after a use on another stream (leaked)";
        // SAFETY: live stream (its lock is held by the caller) and live event.
        let res = unsafe { result::stream_wait_event(stream, ev.raw(), DURING) };
        if res.is_err() {
            crate::error::note_drop(res);
            return;
        }
    }
    free_raw(stream, ptr);
}

/// Frees `ptr` stream-ordered on `stream` (whose lock the caller holds, with the context bound);
/// errors cannot be reported from drop paths and are counted (`crate::error::drop_errors`).
pub(crate) fn free_raw(stream: sys::CUstream, ptr: sys::CUdeviceptr) {
    // SAFETY: the caller owns `ptr`, allocated stream-ordered on this device; the free is queued
    // after every use queued on (or joined to) `stream`.
    crate::error::note_drop(unsafe { result::mem_free_async(ptr, stream) });
}
