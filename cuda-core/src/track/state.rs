//! The state behind a stream's enqueue lock: whether (and by which thread) the stream is being
//! captured, what the capture keeps alive and which frees it deferred, and the checks every enqueue
//! makes against it. The rules these implement are stated in the `graph::capture` module, which
//! begins and ends captures. The capture's keep-alive set is held here as its concrete type
//! ([`KeepAlive`]): it sits in this folder with the allocations and streams it names.

use super::keep::KeepAlive;
use super::Stream;
use crate::driver::{self, result};
use crate::error::{Error, Result};
use crate::event::PooledEvent;
use cudarc::driver::sys;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard};
use std::thread::ThreadId;

fn next_capture_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// An open capture of one stream.
pub(crate) struct Capture {
    /// Identifies the capture in event tags (never 0).
    pub(crate) id: u64,
    /// The thread that began it: the only one that may enqueue on the stream or end it.
    thread: ThreadId,
    /// What the recorded work uses. Every capture is begun with an empty one
    /// (`Stream::begin_capture`).
    pub(crate) keep: KeepAlive,
    /// Frees of allocations homed on the stream, dropped during the capture, with the events of
    /// their uses on other streams that the free must wait for.
    deferred: Vec<(sys::CUdeviceptr, Vec<Arc<PooledEvent>>)>,
}

impl Capture {
    /// A capture begun by the calling thread, keeping `keep`.
    pub(crate) fn new(keep: KeepAlive) -> Capture {
        Capture { id: next_capture_id(), thread: std::thread::current().id(), keep, deferred: Vec::new() }
    }

    /// How many handles of `s` (the captured stream) only this capture's keep-alive set holds (the
    /// home-stream handles of allocations only the capture keeps): see `Stream`'s drop.
    pub(crate) fn refs_to(&self, s: &Stream) -> usize {
        self.keep.refs_of_capture(s)
    }

    /// Whether the calling thread began this capture.
    pub(crate) fn is_current_thread(&self) -> bool {
        self.thread == std::thread::current().id()
    }

    /// Queues the frees deferred during the capture on `stream` (the captured stream, whose lock
    /// the caller holds, with the context bound), each after the events it waits for.
    pub(crate) fn queue_deferred_frees(&mut self, stream: sys::CUstream) {
        for (ptr, waits) in self.deferred.drain(..) {
            free_after(stream, ptr, &waits);
        }
    }
}

/// The state behind a stream's enqueue lock.
#[derive(Default)]
pub(crate) struct StreamState {
    pub(crate) capture: Option<Box<Capture>>,
}

/// How an enqueue may proceed on a stream, given its state.
pub(crate) enum Mode<'a> {
    /// Not capturing: run (and join across streams) as usual.
    Eager,
    /// Captured by this thread: record the uses into this set, make no
    /// cross-stream joins.
    Captured(&'a mut KeepAlive),
}

impl StreamState {
    /// How an enqueue on this stream proceeds. Errors if another thread is capturing it.
    #[inline]
    pub(crate) fn mode(&mut self) -> Result<Mode<'_>> {
        match &mut self.capture {
            None => Ok(Mode::Eager),
            Some(c) if c.thread == std::thread::current().id() => Ok(Mode::Captured(&mut c.keep)),
            Some(_) => Err(Error::Capture("queueing work on a stream that another thread is capturing")),
        }
    }
}

/// Fails with [`Error::Capture`] naming `what` if the stream whose state this is is capturing.
#[inline]
pub(crate) fn refuse_if_capturing(state: &StreamState, what: &'static str) -> Result<()> {
    match state.capture {
        Some(_) => Err(Error::Capture(what)),
        None => Ok(()),
    }
}

/// Checks a wait of the stream with `state` on an event tagged `tag` (the capture id of its last
/// record, 0 if it was recorded eagerly). Rule 3 of the `capture` module docs.
pub(crate) fn check_wait(state: &StreamState, tag: u64) -> Result<()> {
    match (&state.capture, tag) {
        (None, 0) => Ok(()),
        (None, _) => Err(Error::Capture(
            "waiting on an event recorded inside a stream capture would fork the capture onto this stream",
        )),
        (Some(c), _) if c.thread != std::thread::current().id() => {
            Err(Error::Capture("waiting on a stream that another thread is capturing"))
        }
        (Some(c), t) if t == c.id => Ok(()),
        (Some(_), _) => {
            Err(Error::Capture("a capturing stream can only wait on events recorded in its own capture"))
        }
    }
}

/// The enqueue locks of several streams, taken in increasing [`Stream::id`] order (so two threads
/// locking overlapping sets never deadlock), each stream once.
pub(crate) struct Locked<'a> {
    guards: Vec<(&'a Stream, MutexGuard<'a, StreamState>)>,
}

impl<'a> Locked<'a> {
    pub(crate) fn new(streams: impl IntoIterator<Item = &'a Stream>) -> Self {
        let mut set: Vec<&'a Stream> = Vec::with_capacity(4);
        for s in streams {
            if !set.contains(&s) {
                set.push(s);
            }
        }
        set.sort_by_key(|s| s.id());
        Locked { guards: set.into_iter().map(|s| (s, s.lock())).collect() }
    }

    /// The state of `s`, which must be one of the locked streams.
    pub(crate) fn state(&mut self, s: &Stream) -> &mut StreamState {
        let i = self.guards.iter().position(|(g, _)| *g == s).unwrap_or(0);
        &mut self.guards[i].1
    }
}

/// If the stream with `state` is capturing, remembers `ptr` (and the events its free must wait
/// for) to free after the capture and returns `None`; otherwise hands `waits` back.
pub(crate) fn defer_free(
    state: &mut StreamState,
    ptr: sys::CUdeviceptr,
    waits: Vec<Arc<PooledEvent>>,
) -> Option<Vec<Arc<PooledEvent>>> {
    match &mut state.capture {
        Some(c) => {
            c.deferred.push((ptr, waits));
            None
        }
        None => Some(waits),
    }
}

/// Ends a capture abandoned by the drop of its stream: the graph is discarded and the deferred
/// frees are queued (or leaked if the driver is still capturing, which only happens when the last
/// handle is dropped on another thread than the capturing one). Returns what the capture kept, to
/// be dropped by the caller once no lock is held.
///
/// With `keep_if_still` (a handle other than the stream's last one is being dropped), a capture
/// the driver did not end stays recorded in `state` and `None` is returned: the crate's state then
/// never says "not capturing" of a stream the driver still captures, so a handle that still
/// reaches the stream (one cloned meanwhile from a kept allocation's) gets `Error::Capture` for
/// its enqueues rather than having them recorded, unrun, into a capture nobody can end.
pub(crate) fn abandon(
    raw: sys::CUstream,
    state: &mut StreamState,
    keep_if_still: bool,
) -> Option<Box<Capture>> {
    let mut cap = state.capture.take()?;
    // SAFETY: live stream handle (destroyed only after this).
    let (res, graph) = unsafe { result::stream_end_capture(raw) };
    // Counted out of the capture gate only once the driver has ended it: a capture the driver
    // still holds (the last handle dropped on another thread than the capturing one) stays
    // counted, so device-wide operations stay refused rather than overlap it (`driver::device_wide`).
    let still = {
        // SAFETY: live stream handle.
        let st = unsafe { result::stream_is_capturing(raw) };
        st.is_ok_and(|st| st != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    };
    if !still {
        driver::capture_closed_by(cap.thread);
    }
    if !graph.is_null() {
        // SAFETY: a graph handed back to us is ours to destroy; nothing else refers to it.
        let _ = unsafe { result::graph_destroy(graph) };
    }
    if still && keep_if_still {
        crate::error::note_drop_error(res, "ending the capture of a dropped stream handle (it goes on)");
        state.capture = Some(cap);
        return None;
    }
    if res == sys::CUresult::CUDA_SUCCESS || res == sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED {
        cap.queue_deferred_frees(raw);
    } else {
        crate::error::note_drop_error(
            res,
            "ending the capture of a dropped stream (its deferred frees leak)",
        );
        cap.deferred.clear();
    }
    Some(cap)
}

/// Frees `ptr` on `stream` after the events `waits` (uses on other streams) have completed; see
/// [`free_raw`]. If a wait cannot be queued, the memory is leaked rather than freed early. Here
/// rather than with allocations because a stream's own drop queues the frees its capture deferred.
pub(crate) fn free_after(stream: sys::CUstream, ptr: sys::CUdeviceptr, waits: &[Arc<PooledEvent>]) {
    for ev in waits {
        const DURING: &str = "ordering a free after a use on another stream (leaked)";
        // Like every wait of the crate, never on an event recorded inside a capture (these are
        // eager marks of uses; one that is not is leaked rather than waited on).
        let tag = ev.lock_tag();
        if *tag != 0 {
            crate::error::note_drop(Err(Error::Capture(DURING)));
            return;
        }
        // SAFETY: live stream (its lock is held by the caller) and live event.
        let res = unsafe { result::stream_wait_event(stream, ev.raw(), DURING) };
        drop(tag);
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
