//! One page-locked host allocation (`cuMemHostAlloc`), freed on drop: the bounce buffer of a staged
//! copy between devices, and the memory of a [`crate::PinnedBuffer`] whose drop is deferred.
//!
//! A thread with a capture open may make neither call (the driver counts both among the calls that
//! may synchronise implicitly: in the thread-local and global modes it fails them and invalidates
//! the capture). So [`HostAlloc::new`] refuses with [`Error::Capture`] on such a thread before the
//! driver sees the call, and [`HostAlloc::free_on_reaper`] hands a free that such a thread would
//! make to the reaper thread. The crate's captures are thread-local (`CaptureMode::Global` is
//! begun in the thread-local mode), so no capture of this crate forbids these calls to other
//! threads. A capture in relaxed mode would allow them; it is refused all the same (one rule).

use crate::device::Device;
use crate::driver::{self, result};
use crate::error::{Error, Result};
use crate::event::PooledEvent;
use cudarc::driver::sys;
use std::sync::Arc;

/// Page-locked host memory of `bytes` bytes (more than 0), portable to every context.
pub(crate) struct HostAlloc {
    pub(crate) ptr: *mut std::ffi::c_void,
    device: Device,
    during_free: &'static str,
}

// SAFETY: the pointer is owned; it is only handed to the driver by its owner's copies, and freed
// once, on drop, after every copy using it has completed (the owners' contracts).
unsafe impl Send for HostAlloc {}

impl HostAlloc {
    /// Allocates `bytes` (more than 0) page-locked bytes; `during` names the allocation in errors,
    /// `during_free` the free.
    ///
    /// # Errors
    /// [`Error::Capture`] if the calling thread has a capture open; driver errors.
    pub(crate) fn new(
        device: &Device,
        bytes: usize,
        during: &'static str,
        during_free: &'static str,
    ) -> Result<HostAlloc> {
        if driver::this_thread_captures() {
            return Err(Error::Capture(during));
        }
        device.bind()?;
        // SAFETY: context bound. Portable, so any context may use it.
        let ptr = unsafe { result::mem_host_alloc(bytes, sys::CU_MEMHOSTALLOC_PORTABLE, during) }?;
        Ok(HostAlloc { ptr, device: *device, during_free })
    }

    /// Takes ownership of `ptr`, allocated by `cuMemHostAlloc` on `device` and owned by nobody
    /// else from now on.
    ///
    /// # Safety
    /// As stated: `ptr` came from `cuMemHostAlloc`, and only the returned value frees it.
    pub(crate) unsafe fn from_raw(
        ptr: *mut std::ffi::c_void,
        device: Device,
        during_free: &'static str,
    ) -> Self {
        HostAlloc { ptr, device, during_free }
    }

    /// Frees the memory on the reaper thread, once `pending` (the event behind the last transfer
    /// that uses it) has completed: for a drop on a thread that has a capture open, whose own free
    /// would fail in the driver, invalidating its capture and leaking the memory. The caller
    /// decided that once (a second check could disagree: another thread may end the capture in
    /// between, and a free here would not wait for `pending`). If the reaper thread is not
    /// available, the memory is leaked, never freed here.
    pub(crate) fn free_on_reaper(self, pending: Option<PooledEvent>) {
        crate::track::reaper::drop_elsewhere(pending.map(Arc::new), Box::new(self));
    }
}

impl Drop for HostAlloc {
    fn drop(&mut self) {
        if self.device.bind_in_drop() {
            // SAFETY: allocated by cuMemHostAlloc; the owner drops this only once no queued copy
            // uses it.
            let res = unsafe { result::mem_free_host(self.ptr, self.during_free) };
            crate::error::note_drop(res);
        }
    }
}
