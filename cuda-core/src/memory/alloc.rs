//! `Allocation`: shared ownership of one stream-ordered device allocation.

use super::pool::MemPool;
use crate::capture;
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
}

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Allocation({:#x} on {:?})", self.ptr, self.stream)
    }
}

impl Allocation {
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
        if capture::defer_free(&mut state, self.ptr) {
            return;
        }
        if self.stream.device().bind().is_ok() {
            free_raw(self.stream.raw(), self.ptr);
        }
    }
}

/// Frees `ptr` stream-ordered on `stream` (whose lock the caller holds, with the context bound);
/// errors cannot be reported from drop paths and are counted (`crate::error::drop_errors`).
pub(crate) fn free_raw(stream: sys::CUstream, ptr: sys::CUdeviceptr) {
    // SAFETY: the caller owns `ptr`, allocated stream-ordered on this device; the free is queued
    // after every use queued on (or joined to) `stream`.
    let res = unsafe { sys::cuMemFreeAsync(ptr, stream) };
    crate::error::note_drop_error(res, "freeing device memory (stream-ordered)");
}
