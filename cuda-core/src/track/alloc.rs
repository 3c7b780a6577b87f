//! `Allocation`: shared ownership of one stream-ordered device allocation.

use super::access::AccessState;
use super::pool::MemPool;
use super::state::{defer_free, free_after};
use super::stream::Stream;
use cudarc::driver::sys;

/// One device allocation with its home stream. A [`crate::memory::DeviceBuffer`] holds it in an `Arc`;
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
    /// For memory this crate did not allocate (`crate::interop`): what owns it (dropped once every
    /// use has completed, instead of a free), and whether it is external at all.
    external: Option<std::sync::Mutex<Option<Box<dyn std::any::Any + Send>>>>,
}

impl std::fmt::Debug for Allocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Allocation({:#x} on {:?})", self.ptr, self.stream)
    }
}

impl Allocation {
    pub(crate) fn new(ptr: sys::CUdeviceptr, stream: Stream, pool: Option<MemPool>) -> Allocation {
        Allocation {
            ptr,
            stream,
            _pool: pool,
            access: Default::default(),
            foreign: Default::default(),
            external: None,
        }
    }

    /// Memory at `ptr` that this crate does not own: never freed here; `owner` is dropped (on the
    /// reaper thread) once every use queued before the last handle's drop has completed. See
    /// `crate::interop` for the caller's contract.
    pub(crate) fn external(
        ptr: sys::CUdeviceptr,
        stream: Stream,
        owner: Box<dyn std::any::Any + Send>,
    ) -> Allocation {
        let mut a = Allocation::new(ptr, stream, None);
        a.external = Some(std::sync::Mutex::new(Some(owner)));
        a
    }

    /// Takes the owner of external memory out if `accept` says yes to it (for `crate::interop`'s
    /// hand-back), leaving an allocation whose drop releases nothing. `None` for memory this crate
    /// allocated, an owner `accept` refuses, or one already taken.
    pub(crate) fn take_owner_if(
        &self,
        accept: impl FnOnce(&(dyn std::any::Any + Send)) -> bool,
    ) -> Option<Box<dyn std::any::Any + Send>> {
        let mut owner = self.external.as_ref()?.lock().unwrap_or_else(|e| e.into_inner());
        if !accept(owner.as_deref()?) {
            return None;
        }
        owner.take()
    }

    /// An event on the home stream behind every use of this allocation (on any stream) queued so
    /// far. Used by `crate::interop` before memory goes back to its foreign owner.
    ///
    /// # Errors
    /// [`crate::Error::Capture`] while the home stream is captured; driver errors.
    pub(crate) fn event_after_uses(&self) -> crate::Result<crate::event::PooledEvent> {
        let state = self.stream.lock();
        super::state::refuse_if_capturing(&state, "handing wrapped memory back to its owner")?;
        self.stream.device().bind()?;
        for ev in self.access().all_marks() {
            self.stream.wait_unchecked(ev)?;
        }
        let ev = crate::event::Event::pooled(self.stream.device())?;
        ev.record_locked(&self.stream)?;
        Ok(ev)
    }

    /// The access state (see `track::access`). The caller holds the home stream's lock.
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
        if let Some(owner) = self.external.take() {
            let owner = owner.into_inner().unwrap_or_else(|e| e.into_inner());
            if let Some(owner) = owner {
                // Not ours to free: the owner goes once every use has completed; if that cannot be
                // ordered (a capture, a driver error), it is leaked rather than released early.
                match self.event_after_uses() {
                    Ok(ev) => super::reaper::drop_after(std::sync::Arc::new(ev), owner),
                    Err(e) => {
                        std::mem::forget(owner);
                        crate::error::note_drop(Err(e));
                    }
                }
            }
            return;
        }
        if self.ptr == 0 {
            return;
        }
        // Declared before the lock guard, so dropped after it: its marks may hold the last handles
        // of their streams (see `order::Retired`; found by review: dropped under the home
        // stream's lock, they could deadlock).
        let access: super::access::AccessState;
        // Under the home stream's lock: a capture cannot begin between the check and the free.
        let mut state = self.stream.lock();
        access = std::mem::take(&mut *self.access());
        let waits: Vec<_> = access.all_marks().cloned().collect();
        let Some(waits) = defer_free(&mut state, self.ptr, waits) else {
            return;
        };
        if self.stream.device().bind_in_drop() {
            // The free waits for every use on other streams, then runs in the home stream's order.
            free_after(self.stream.raw(), self.ptr, &waits);
        }
    }
}
