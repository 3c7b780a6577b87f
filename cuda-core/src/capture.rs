//! The registry of stream captures started through this crate.
//!
//! While a stream is being captured, work queued on it is recorded into a graph instead of run, and
//! a graph replays the recorded device addresses later, any number of times. So that safe code
//! can never replay into freed memory, this registry:
//! - collects an owning reference to every [`Allocation`] used by work queued on the capturing
//!   stream (the graph keeps them: see [`crate::Graph`]);
//! - refuses allocations, blocking copies, host callbacks and synchronisation on the capturing
//!   stream with [`Error::Capture`] before the driver sees them (they would invalidate the capture
//!   or bake in memory that dies);
//! - defers the free of an allocation whose home stream is capturing to the end of the capture;
//! - skips cross-stream joins while capturing (they would pull other streams into the capture);
//!   the joins happen at every replay instead.
//!
//! When no capture is active (the common case), every check is one relaxed atomic load.

use crate::error::{Error, Result};
use crate::memory::Allocation;
use crate::stream::Stream;
use cudarc::driver::sys;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

#[derive(Default)]
pub(crate) struct Record {
    pub(crate) keep: Vec<Arc<Allocation>>,
    seen: std::collections::HashSet<usize>,
    deferred: Vec<sys::CUdeviceptr>,
}

static ACTIVE: AtomicUsize = AtomicUsize::new(0);

fn registry() -> &'static Mutex<HashMap<usize, Record>> {
    static R: OnceLock<Mutex<HashMap<usize, Record>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

fn key(s: &Stream) -> usize {
    s.raw() as usize
}

fn lock() -> std::sync::MutexGuard<'static, HashMap<usize, Record>> {
    registry().lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `stream` is being captured through this crate.
#[inline]
pub(crate) fn is_capturing(stream: &Stream) -> bool {
    ACTIVE.load(Ordering::Acquire) != 0 && lock().contains_key(&key(stream))
}

/// Whether any capture is active.
#[inline]
pub(crate) fn any_active() -> bool {
    ACTIVE.load(Ordering::Acquire) != 0
}

/// Fails with [`Error::Capture`] naming `what` if `stream` is capturing.
#[inline]
pub(crate) fn refuse_if_capturing(stream: &Stream, what: &'static str) -> Result<()> {
    if is_capturing(stream) {
        Err(Error::Capture(what))
    } else {
        Ok(())
    }
}

pub(crate) fn register(stream: &Stream) {
    lock().insert(key(stream), Record::default());
    ACTIVE.fetch_add(1, Ordering::AcqRel);
}

/// Ends the registration and returns what was recorded; the deferred frees are queued now.
pub(crate) fn unregister(stream: &Stream) -> Record {
    let rec = lock().remove(&key(stream));
    let Some(mut rec) = rec else { return Record::default() };
    ACTIVE.fetch_sub(1, Ordering::AcqRel);
    for ptr in rec.deferred.drain(..) {
        crate::memory::free_async(stream, ptr);
    }
    rec
}

/// The outcome of [`note_uses`]: whether cross-stream joins should be made.
pub(crate) enum Uses {
    /// `on` is capturing: uses were recorded, no joins.
    Captured,
    /// Nothing is capturing that matters: join as usual.
    Normal,
}

/// Records the allocations used by work about to be queued on `on`. Errors if an allocation's
/// home stream is being captured while `on` is a different stream (joining would drag `on` into
/// that capture).
pub(crate) fn note_uses(on: &Stream, allocs: &[&Arc<Allocation>]) -> Result<Uses> {
    if !any_active() {
        return Ok(Uses::Normal);
    }
    let mut reg = lock();
    if let Some(rec) = reg.get_mut(&key(on)) {
        for a in allocs {
            if a.ptr != 0 && rec.seen.insert(Arc::as_ptr(a) as usize) {
                rec.keep.push(Arc::clone(a));
            }
        }
        return Ok(Uses::Captured);
    }
    if allocs.iter().any(|a| a.stream != *on && reg.contains_key(&key(&a.stream))) {
        return Err(Error::Capture(
            "using a buffer from another stream while its home stream is being captured",
        ));
    }
    Ok(Uses::Normal)
}

/// If `stream` is capturing, remembers `ptr` to free after the capture and returns `true`.
pub(crate) fn defer_free_if_capturing(stream: &Stream, ptr: sys::CUdeviceptr) -> bool {
    if !any_active() {
        return false;
    }
    match lock().get_mut(&key(stream)) {
        Some(rec) => {
            rec.deferred.push(ptr);
            true
        }
        None => false,
    }
}
