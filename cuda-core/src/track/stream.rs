//! The core of a stream: its handle, its enqueue lock and the capture state behind it, and the
//! drops that end an abandoned capture. Defined here, with the protocol, because the state names the
//! capture's typed keep-alive set, which names allocations, which name their home stream; the
//! public methods of [`Stream`] live in `crate::stream`.

use super::state::{self, StreamState};
use crate::device::Device;
use crate::driver::result;
use cudarc::driver::sys;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

pub(crate) struct StreamInner {
    pub(crate) device: Device,
    pub(crate) raw: sys::CUstream,
    /// The enqueue lock and the capture state it guards (see the module docs).
    pub(crate) state: Mutex<StreamState>,
    /// The progress counter, made on the first [`Stream::mark_progress`].
    pub(crate) progress: OnceLock<crate::progress::Slot>,
    /// The id of the capture open on this stream (0: none): a copy of `state.capture`'s id, written
    /// only under the enqueue lock, so that code holding the lock deep inside an enqueue can read
    /// it without the state (see [`Stream::capture_tag`]).
    pub(crate) capture_id: AtomicU64,
    /// Threads in a driver call that waits on or queries this stream outside its enqueue lock
    /// (synchronize, query, the wait of a blocking copy): counted in under the lock by
    /// [`Stream::waiting_locked`]. A capture is not begun while one is in flight (see
    /// [`Waiting`]).
    pub(crate) waiters: AtomicUsize,
}

// SAFETY: a CUstream may be used from any thread; the driver serialises enqueues internally.
unsafe impl Send for StreamInner {}
// SAFETY: as above; the handle is immutable after creation.
unsafe impl Sync for StreamInner {}

impl Drop for StreamInner {
    fn drop(&mut self) {
        if self.device.bind().is_err() {
            return;
        }
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        // A capture still open on the last handle is abandoned: end it (discarding the graph), and
        // queue the frees it deferred. What it kept alive is released after this (no lock held).
        let abandoned = state::abandon(self.raw, state, false);
        self.capture_id.store(0, Ordering::Relaxed);
        // SAFETY: we own the handle and nothing uses it after the last Arc is gone. The driver
        // defers the release until queued work is complete. An error cannot be reported here.
        crate::error::note_drop(unsafe { result::stream_destroy(self.raw) });
        drop(abandoned);
    }
}

/// A non-blocking CUDA stream (it does not synchronise with the legacy default stream).
/// Cloning gives another handle to the same stream; two handles are equal when they name the same
/// stream.
///
/// ```no_run
/// # fn main() -> cuda_core::Result<()> {
/// use cuda_core::{Device, DeviceBuffer, Stream};
/// let s = Stream::new(&Device::new(0)?)?;
/// let x = DeviceBuffer::from_host(&s, &[1u32, 2, 3])?; // queued on `s`
/// let handle = s.clone(); // another handle to the same stream
/// assert_eq!(handle, s);
/// handle.synchronize()?; // waits for the copy
/// assert!(s.query()?); // nothing left to run
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Stream {
    pub(crate) inner: Arc<StreamInner>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({:p} on device {})", self.inner.raw, self.inner.device.ordinal())
    }
}

/// Dropping the last handle a user can reach of a stream that is being captured abandons the
/// capture (as the drop of the stream itself would): the capture keeps the allocations its work
/// used, and each allocation keeps a handle of its home stream, so a capturing stream whose work
/// used its own buffers would otherwise be kept alive by its own capture — a capture nobody can
/// end, left open in the driver for the rest of the process (the thread's calls that a capture
/// forbids would fail, and device-wide operations would stay refused). Checked with one atomic
/// load when no capture is open.
impl Drop for Stream {
    fn drop(&mut self) {
        if self.capture_tag() == 0 {
            return;
        }
        // Bound as on every path (the calls below use only this stream's handle, which the driver
        // runs in its own context, so a failed bind leaves them to that).
        self.inner.device.bind_in_drop();
        let abandoned = {
            let mut st = self.lock();
            // Counted under the lock, in the same critical section as the capture's own count, so
            // that no enqueue (which takes the lock) lands between the two readings. A clone made
            // meanwhile from a kept allocation's handle (`DeviceBuffer::home_stream`) can still
            // race this; the capture is then abandoned while that handle lives: its later work runs
            // eagerly and its `end_capture` fails with `Error::Capture` (and if the driver did not
            // end the capture, the state keeps it: see `state::abandon`).
            let others = Arc::strong_count(&self.inner) - 1;
            match st.capture.as_ref() {
                Some(cap) if cap.refs_to(self) == others => {}
                _ => return,
            }
            let Some(cap) = state::abandon(self.raw(), &mut st, true) else {
                return; // the driver still captures: the state says so too
            };
            self.set_capture_tag(0);
            cap
        };
        // What the capture kept is dropped with no lock held (allocations queue their frees on
        // this stream; the last handle then destroys it).
        drop(abandoned);
    }
}

/// A thread counted in as waiting on (or querying) a stream outside its enqueue lock, until this
/// guard drops. **Why:** a wait is made without the lock so that other threads may keep queueing
/// work, but `cuStreamSynchronize` or `cuStreamQuery` on a stream that is being captured fails
/// and invalidates the capture. Without the count, a capture begun by another thread between the
/// waiter's check (under the lock) and its driver call would be broken, and a blocking copy whose
/// wait failed that way would return while the driver may still write into the caller's memory
/// (page-locked destinations are written asynchronously). So the waiter is counted in under the
/// lock, in the same critical section as its check that no capture is open, and
/// `Stream::begin_capture` refuses (with `Error::Capture`) while the count is not zero: a wait
/// never meets a capture of its stream. The count is decremented after the driver call returns
/// (Release; `begin_capture` reads it with Acquire under the lock), so a capture that sees zero
/// begins after every counted wait has left the driver.
pub(crate) struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}
impl Eq for Stream {}

impl Stream {
    /// Takes this stream's enqueue lock (see the module docs). Never held while blocking on the
    /// GPU, while dropping an allocation, or while taking the lock of a stream with a lower
    /// [`Stream::id`] (locks of several streams are taken in increasing id order).
    pub(crate) fn lock(&self) -> MutexGuard<'_, StreamState> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The id of the capture open on this stream (0: none). Meaningful to a caller that holds
    /// the enqueue lock (it cannot change then); every event record reads it, so an event recorded
    /// inside a capture is tagged with it whichever path recorded it (see `capture` rule 3).
    #[inline]
    pub(crate) fn capture_tag(&self) -> u64 {
        self.inner.capture_id.load(Ordering::Relaxed)
    }

    /// Counts the calling thread in as about to wait on (or query) this stream outside its enqueue
    /// lock. Call it with the lock held and the stream not capturing; the wait or query must be
    /// made before the returned guard is dropped.
    pub(crate) fn waiting_locked(&self) -> Waiting<'_> {
        self.inner.waiters.fetch_add(1, Ordering::Relaxed);
        Waiting(&self.inner.waiters)
    }

    /// Whether a thread is in a wait or query on this stream outside its lock (see [`Waiting`]).
    /// Meaningful with the enqueue lock held: no new waiter can be counted in then.
    pub(crate) fn has_waiters(&self) -> bool {
        self.inner.waiters.load(Ordering::Acquire) > 0
    }

    /// Sets [`Stream::capture_tag`]; called only with the enqueue lock held, wherever the state's
    /// capture is set or cleared.
    #[inline]
    pub(crate) fn set_capture_tag(&self, id: u64) {
        self.inner.capture_id.store(id, Ordering::Relaxed);
    }

    /// A stable identity for lock ordering.
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }
}
