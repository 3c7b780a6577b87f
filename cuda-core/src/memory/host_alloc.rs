//! One page-locked host allocation (`cuMemHostAlloc`), freed on drop: the bounce buffer of a staged
//! copy between devices, and the memory of a [`crate::PinnedBuffer`] whose drop is deferred.
//!
//! A thread with a capture open may make neither call (the driver counts both among the calls that
//! may synchronise implicitly: in the thread-local and global modes it fails them and invalidates
//! the capture). So [`HostAlloc::new`] refuses with [`Error::Capture`] on such a thread before the
//! driver sees the call, and [`HostAlloc::free_off_capturing_thread`] hands a free that such a
//! thread would make to the reaper thread.

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

    /// Frees the memory here, or, on a thread that has a capture open, on the reaper thread (once
    /// `pending`, the event behind the last copy that uses it, has completed). Without that check
    /// a capturing thread's free fails in the driver, invalidating its capture and leaking the
    /// memory.
    pub(crate) fn free_off_capturing_thread(self, pending: Option<PooledEvent>) {
        if !driver::this_thread_captures() {
            drop(pending);
            drop(self);
            return;
        }
        match pending {
            Some(ev) => crate::track::reaper::drop_after(Arc::new(ev), Box::new(self)),
            None => crate::track::reaper::drop_later(Box::new(self)),
        }
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
