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
        if capture::defer_free_if_capturing(&self.stream, self.ptr) {
            return;
        }
        free_async(&self.stream, self.ptr);
    }
}

/// Frees `ptr` stream-ordered on `stream`; errors cannot be reported from drop paths.
pub(crate) fn free_async(stream: &Stream, ptr: sys::CUdeviceptr) {
    if stream.device().bind().is_ok() {
        // SAFETY: the caller owns `ptr`, allocated stream-ordered on this device; the free is
        // queued after every use queued on (or joined to) `stream`.
        unsafe { sys::cuMemFreeAsync(ptr, stream.raw()) };
    }
}
