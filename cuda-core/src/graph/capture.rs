//! Stream capture: beginning and ending captures, and the rules that keep captures sound. The
//! capture state of each stream lives behind its enqueue lock (`track::state`), with the rest of the
//! ordering protocol (`crate::track`), below memory and graphs.
//!
//! While a stream is being captured, work queued on it is recorded into a graph instead of run, and
//! a graph replays the recorded device addresses later, any number of times. So that safe code can
//! never replay into freed memory, race a replay, or lose work into someone else's graph:
//!
//! 1. **One lock per stream decides.** A stream's capture state lives behind its enqueue lock
//!    (`Stream::lock`). Beginning and ending a capture, and every enqueue and wait of this crate,
//!    happen under it: a capture cannot begin or end between an enqueue's check and the
//!    enqueue itself. The state belongs to the stream object, not to its raw handle, so a handle
//!    reused by the driver after a destroy never inherits a stale capture.
//! 2. **A capture belongs to its thread.** Only the thread that began a capture may queue work on
//!    the capturing stream or end the capture; any other thread's enqueue, wait or end is refused
//!    with [`Error::Capture`] (never "Ok but recorded into someone else's graph").
//! 3. **No forks.** A stream joins a capture only through a wait on an event recorded inside it.
//!    Every event remembers the capture its last record was made in (its *tag*), and
//!    [`Stream::wait_event`] / [`Stream::wait_stream`] refuse a wait that would pull another stream
//!    into a capture, or a capturing stream's wait on outside work. So the capturing stream is the
//!    only stream of its capture, and everything recorded went through its lock.
//! 4. **Everything recorded is kept.** Each use of a buffer recorded into the capture adds its
//!    [`Allocation`](crate::memory::Allocation) to the capture's [`KeepAlive`] set, which the graph and every executable graph
//!    made from it own: replays never touch freed memory. Frees of allocations homed on the
//!    capturing stream are deferred to the end of the capture (a free must never be recorded).
//! 5. **No blocking or allocation is recorded**: they are refused before the driver
//!    sees them, so the capture and the context stay usable. This includes page-locked host
//!    memory on the capturing thread (`PinnedBuffer::new`, a staged peer copy's bounce buffer):
//!    the capture gate knows each capture's thread (`driver::this_thread_captures`), and a
//!    page-locked buffer dropped there is freed later on the reaper thread.
//! 6. **Registered before begin, forgotten after end.** The state is set before
//!    `cuStreamBeginCapture` and cleared only once the driver has ended the capture; a failed end
//!    that leaves the driver capturing leaves the state in place.

use crate::driver::{self, result};
use crate::error::{Error, Result};
use crate::graph::{CaptureMode, CaptureStatus, Graph, KernelNode};
use crate::stream::Stream;
use crate::track::state::{Capture, Mode};
use crate::track::KeepAlive;
use cudarc::driver::sys;

impl Stream {
    /// Starts capturing the work queued on this stream into a graph instead of running it.
    ///
    /// Until [`Stream::end_capture`] (on this thread), only this thread may queue work on the
    /// stream; allocations, blocking copies, synchronisation and cross-stream waits on it
    /// are refused with [`Error::Capture`].
    ///
    /// # Errors
    /// [`Error::Capture`] if the stream is already being captured, or while another thread is in a
    /// [`Stream::synchronize`], [`Stream::query`] or blocking copy on it (such a call would break
    /// the capture; try again once it is done); driver errors.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{CaptureMode, Device, Stream};
    /// let s = Stream::new(&Device::new(0)?)?;
    /// s.begin_capture(CaptureMode::ThreadLocal)?;
    /// // ... queue kernels and copies between existing buffers on `s` ...
    /// let graph = s.end_capture()?;
    /// let exec = graph.instantiate(Default::default())?;
    /// exec.launch(&s)?;
    /// s.synchronize()?;
    /// # Ok(()) }
    /// ```
    pub fn begin_capture(&self, mode: CaptureMode) -> Result<()> {
        self.device().bind()?;
        // Counted in at the capture gate first, without the stream's lock (it may wait there for
        // a device-wide operation in flight, and must not hold up this stream's enqueues while
        // it does); counted out again if the capture does not begin.
        driver::capture_opened();
        let mut state = self.lock();
        if state.capture.is_some() {
            drop(state);
            driver::capture_closed();
            return Err(Error::Capture("beginning a capture on a stream that is already being captured"));
        }
        // A thread waiting on (or querying) the stream outside its lock would break the capture
        // and could lose its wait (see `Waiting`): refused until it is done.
        if self.has_waiters() {
            drop(state);
            driver::capture_closed();
            return Err(Error::Capture(
                "beginning a capture on a stream that another thread is waiting on (a synchronize, query or blocking copy)",
            ));
        }
        // Registered first (rule 6): no enqueue can slip between the driver's begin and ours.
        let cap = Box::new(Capture::new(KeepAlive::default()));
        self.set_capture_tag(cap.id);
        state.capture = Some(cap);
        // SAFETY: live stream; context bound.
        let res = unsafe { result::stream_begin_capture(self.raw(), mode.raw()) };
        if res.is_err() {
            state.capture = None;
            self.set_capture_tag(0);
            driver::capture_closed();
        }
        res
    }

    /// The id of the capture open on this stream through this crate (unique in the process, never
    /// reused), or `None` when none is. A caller that began a capture can check with it, before it
    /// ends the capture, that the capture open now is still its own: `cuda_async`'s
    /// `CudaGraph::scope` does (found by review: a closure that ended the scope's capture and
    /// began another one got a graph from the second, and parameter handles of nodes of the
    /// first, destroyed, graph).
    pub fn capture_id(&self) -> Option<u64> {
        self.lock().capture.as_ref().map(|c| c.id)
    }

    /// Ends the capture and returns the captured graph, which keeps every allocation the recorded
    /// work uses alive. If the capture was invalidated, the error says so
    /// (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`) and the stream is back to normal.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{CaptureMode, Device, DeviceBuffer};
    /// let s = Device::new(0)?.new_stream()?;
    /// let mut buf = DeviceBuffer::<u32>::zeros(&s, 256)?; // allocated before the capture
    /// s.begin_capture(CaptureMode::ThreadLocal)?;
    /// buf.fill(&s, 7)?; // recorded into the graph, not run
    /// let graph = s.end_capture()?;
    /// assert_eq!(graph.allocations().len(), 1); // the graph keeps `buf`'s memory alive
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Capture`] if the stream is not being captured through this crate, or if called on
    /// another thread than the one that began the capture (the capture then goes on); driver
    /// errors.
    pub fn end_capture(&self) -> Result<Graph> {
        self.device().bind()?;
        let mut state = self.lock();
        match &state.capture {
            None => return Err(Error::Capture("ending a capture on a stream that is not being captured")),
            Some(c) if !c.is_current_thread() => {
                return Err(Error::Capture("ending a capture from another thread than the one that began it"))
            }
            Some(_) => {}
        }
        // SAFETY: live stream.
        let (res, raw) = unsafe { result::stream_end_capture(self.raw()) };
        if res != sys::CUresult::CUDA_SUCCESS && still_capturing(self) {
            // The driver did not end it (rule 6): keep the state; the capture goes on.
            return Err(Error::driver(res, "ending stream capture"));
        }
        let Some(mut cap) = state.capture.take() else {
            return Err(Error::Capture("ending a capture on a stream that is not being captured"));
        };
        self.set_capture_tag(0);
        driver::capture_closed();
        cap.queue_deferred_frees(self.raw());
        drop(state);
        if res != sys::CUresult::CUDA_SUCCESS {
            if !raw.is_null() {
                // SAFETY: a graph handed back despite the error is ours to destroy.
                let _ = unsafe { result::graph_destroy(raw) };
            }
            // `cap` (and the allocations it kept) is dropped here, with no lock held.
            return Err(Error::driver(res, "ending stream capture"));
        }
        Ok(Graph::from_capture(raw, *self.device(), cap.keep))
    }

    /// The kernel node most recently captured on this stream, if the capture's current frontier is
    /// exactly one kernel node (e.g. right after a single kernel launch). Used to build parameter
    /// update handles.
    ///
    /// # Errors
    /// [`Error::Capture`] if another thread is capturing the stream; driver errors.
    pub fn last_captured_kernel_node(&self) -> Result<Option<KernelNode>> {
        self.device().bind()?;
        let mut state = self.lock();
        if let Mode::Eager = state.mode()? {
            return Ok(None);
        }
        // SAFETY: live stream.
        let (status, deps, n) = unsafe { result::stream_get_capture_frontier(self.raw()) }?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE || n != 1 || deps.is_null() {
            return Ok(None);
        }
        // SAFETY: the driver returned an array of `n == 1` nodes, valid until the next call on
        // this stream, which cannot happen while we hold its enqueue lock.
        let node = unsafe { *deps };
        // SAFETY: a live node of the capture graph.
        let ty = unsafe { result::graph_node_get_type(node) }?;
        Ok((ty == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL).then_some(KernelNode(node)))
    }

    /// Whether a capture started through this crate ([`Stream::begin_capture`]) is recording this
    /// stream (on any thread).
    pub fn is_being_captured(&self) -> bool {
        self.lock().capture.is_some()
    }

    /// The capture status of this stream, as the driver reports it.
    ///
    /// # Errors
    /// Driver errors.
    pub fn capture_status(&self) -> Result<CaptureStatus> {
        self.device().bind()?;
        // SAFETY: live stream.
        let st = unsafe { result::stream_is_capturing(self.raw()) }?;
        use sys::CUstreamCaptureStatus::*;
        Ok(match st {
            CU_STREAM_CAPTURE_STATUS_NONE => CaptureStatus::None,
            CU_STREAM_CAPTURE_STATUS_ACTIVE => CaptureStatus::Active,
            CU_STREAM_CAPTURE_STATUS_INVALIDATED => CaptureStatus::Invalidated,
        })
    }
}

/// Whether the driver still reports `s` as capturing (active or invalidated).
fn still_capturing(s: &Stream) -> bool {
    // SAFETY: live stream.
    let st = unsafe { result::stream_is_capturing(s.raw()) };
    st.is_ok_and(|st| st != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}
