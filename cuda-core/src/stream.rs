//! Streams: ordered queues of device work.
//!
//! **Drop:** dropping the last handle to a stream calls `cuStreamDestroy`, which returns at once;
//! the driver releases the stream after the work already queued on it has finished. Dropping a
//! stream therefore never blocks and never cancels queued work. Buffers keep their allocation
//! stream alive (they hold a handle), so stream-ordered frees always have a live stream.
//!
//! **The enqueue lock.** Every stream has one mutex, held by every operation of this crate that
//! queues work on the stream, waits on it, or changes its capture state (see `capture.rs`).
//! The check "is this stream being captured, and by whom" and the enqueue that depends on it are
//! therefore one atomic step: no other thread can begin or end a capture in between.

use crate::capture::StreamState;
use crate::device::Device;
use crate::driver::result;
use crate::error::{Error, Result};
use crate::event::Event;
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};

struct StreamInner {
    device: Device,
    raw: sys::CUstream,
    /// The enqueue lock and the capture state it guards (see the module docs).
    state: Mutex<StreamState>,
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
        let abandoned = crate::capture::abandon(self.raw, state);
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
    inner: Arc<StreamInner>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stream({:p} on device {})", self.inner.raw, self.inner.device.ordinal())
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}
impl Eq for Stream {}

impl Device {
    /// The range of stream priorities `(least, greatest)`; numerically lower is higher priority
    /// (e.g. `(0, -5)`).
    ///
    /// # Errors
    /// Driver errors.
    pub fn stream_priority_range(&self) -> Result<(i32, i32)> {
        self.bind()?;
        // SAFETY: context bound.
        unsafe { result::ctx_get_stream_priority_range() }
    }

    /// Creates a new non-blocking stream with the default priority.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// let dev = cuda_core::Device::new(0)?;
    /// let s = dev.new_stream()?;
    /// assert_eq!(s.device(), &dev);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`Stream::new`].
    pub fn new_stream(&self) -> Result<Stream> {
        Stream::new(self)
    }
}

impl Stream {
    /// Creates a non-blocking stream with the default priority.
    ///
    /// # Errors
    /// Driver errors creating the stream.
    pub fn new(device: &Device) -> Result<Stream> {
        Self::with_priority(device, 0)
    }

    /// Creates a non-blocking stream with `priority`, which must lie in
    /// [`Device::stream_priority_range`] (an error otherwise, rather than the driver's silent clamp).
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, Stream};
    /// let dev = Device::new(0)?;
    /// let (_least, greatest) = dev.stream_priority_range()?;
    /// let urgent = Stream::with_priority(&dev, greatest)?; // scheduled ahead of default-priority work
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a priority outside [`Device::stream_priority_range`]; driver
    /// errors.
    pub fn with_priority(device: &Device, priority: i32) -> Result<Stream> {
        device.bind()?;
        if priority != 0 {
            let (least, greatest) = device.stream_priority_range()?;
            if priority > least || priority < greatest {
                return Err(Error::InvalidArgument(format!(
                    "stream priority {priority} outside the device's range [{greatest}, {least}]"
                )));
            }
        }
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: context bound.
        let raw = unsafe { result::stream_create_with_priority(flags, priority) }?;
        Ok(Stream {
            inner: Arc::new(StreamInner { device: *device, raw, state: Mutex::new(StreamState::default()) }),
        })
    }

    /// The device this stream belongs to.
    #[inline]
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// Takes this stream's enqueue lock (see the module docs). Never held while blocking on the
    /// GPU, while dropping an allocation, or while taking the lock of a stream with a lower
    /// [`Stream::id`] (locks of several streams are taken in increasing id order).
    pub(crate) fn lock(&self) -> MutexGuard<'_, StreamState> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A stable identity for lock ordering.
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// The raw handle. Valid as long as any clone of this `Stream` lives.
    #[inline]
    pub fn raw(&self) -> sys::CUstream {
        self.inner.raw
    }

    /// Blocks the calling thread until all work queued on this stream has finished, and reports
    /// any asynchronous error of that work.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, DeviceBuffer};
    /// let s = Device::new(0)?.new_stream()?;
    /// let mut buf = DeviceBuffer::<u8>::zeros(&s, 64 << 20)?;
    /// buf.fill(&s, 0xff)?; // returns before the memset has run
    /// s.synchronize()?; // now it has; a fault of the queued work would be reported here
    /// assert!(s.query()?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Capture`] if the stream is being captured (nothing would ever complete); a driver
    /// error of the work (e.g. a kernel fault).
    pub fn synchronize(&self) -> Result<()> {
        // Checked under the lock, waited for outside it (other threads may keep queueing work).
        crate::capture::refuse_if_capturing(&self.lock(), "synchronizing a stream that is being captured")?;
        self.sync_unchecked()
    }

    /// `cuStreamSynchronize` without the capture check (callers have made it).
    pub(crate) fn sync_unchecked(&self) -> Result<()> {
        self.inner.device.bind()?;
        // SAFETY: live stream handle; context bound.
        unsafe { result::stream_synchronize(self.raw()) }
    }

    /// Non-blocking: `true` if all queued work has finished, `false` if some is still running.
    ///
    /// # Errors
    /// [`Error::Capture`] while the stream is being captured (a query would invalidate the
    /// capture); a driver error of the work.
    pub fn query(&self) -> Result<bool> {
        crate::capture::refuse_if_capturing(&self.lock(), "querying a stream that is being captured")?;
        self.inner.device.bind()?;
        // SAFETY: live stream handle; context bound.
        unsafe { result::stream_query(self.raw()) }
    }

    /// Makes all work queued on this stream after this call wait until `event` has completed.
    /// Does not block the host.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, Event};
    /// let dev = Device::new(0)?;
    /// let (producer, consumer) = (dev.new_stream()?, dev.new_stream()?);
    /// // ... queue work on `producer` ...
    /// let ready = Event::pooled(&dev)?;
    /// ready.record(&producer)?;
    /// consumer.wait_event(&ready)?; // later work on `consumer` runs after it; the host never blocks
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Capture`] when the wait would join two worlds that must stay apart: `event` was
    /// last recorded inside a stream capture and this stream is not that capture's stream (the wait
    /// would fork the capture onto this stream, behind the keep-alive bookkeeping), or this stream
    /// is being captured and `event` was not recorded in its capture. Also when another thread is
    /// capturing this stream.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{CaptureMode, Device, Error, Event, Stream};
    /// let dev = Device::new(0)?;
    /// let (capturing, other) = (Stream::new(&dev)?, Stream::new(&dev)?);
    /// capturing.begin_capture(CaptureMode::ThreadLocal)?;
    /// let ev = Event::new(&dev, false)?;
    /// ev.record(&capturing)?;
    /// // Forking the capture onto `other` is refused:
    /// assert!(matches!(other.wait_event(&ev), Err(Error::Capture(_))));
    /// capturing.end_capture()?;
    /// # Ok(()) }
    /// ```
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        let state = self.lock();
        let tag = event.lock_tag();
        crate::capture::check_wait(&state, *tag)?;
        self.wait_unchecked(event)
    }

    /// `cuStreamWaitEvent` without checks; the caller holds the locks and made them.
    pub(crate) fn wait_unchecked(&self, event: &Event) -> Result<()> {
        self.inner.device.bind()?;
        // SAFETY: live stream and event handles; context bound.
        unsafe { result::stream_wait_event(self.raw(), event.raw(), "making a stream wait on an event") }
    }

    /// Orders all work queued on `self` after this call behind all work queued on `other` so far.
    /// A no-op when both are the same stream.
    ///
    /// # Errors
    /// [`Error::Capture`] if either stream is being captured (a cross-stream dependency would fork
    /// or break the capture); driver errors.
    pub fn wait_stream(&self, other: &Stream) -> Result<()> {
        if self == other {
            return Ok(());
        }
        let mut locked = crate::capture::Locked::new([self, other]);
        for s in [self, other] {
            crate::capture::refuse_if_capturing(
                locked.state(s),
                "a cross-stream wait involving a stream that is being captured",
            )?;
        }
        crate::memory::join_unchecked(self, other)
    }

    /// Queues work of another CUDA library (cuBLAS, cuBLASLt, NCCL, ...) on this stream, ordered
    /// like a kernel launch with every other use of the buffers whose allocations are in `uses`
    /// (each with how the work touches it), or, while this thread captures the stream, recorded
    /// (the graph keeps the allocations alive). `f` receives the raw stream handle.
    ///
    /// # Errors
    /// [`Error::Capture`] if another thread is capturing the stream or a home stream of `uses` is
    /// being captured from here; the error `f` returns; driver errors of the joins.
    ///
    /// # Safety
    /// `f` must only queue asynchronous work on the given raw stream, and that work must touch
    /// device memory only inside the allocations listed in `uses`, write only those listed as
    /// [`crate::memory::Access::Write`], and write only memory the caller holds exclusively (e.g.
    /// through `&mut DeviceBuffer`). It runs while this crate holds
    /// the enqueue locks of the streams involved: it must not call methods of this crate on streams,
    /// events or buffers (that would deadlock), must not drop buffers, must not synchronise or
    /// block, and must not allocate or free stream-ordered memory on the stream.
    pub unsafe fn enqueue_external<R>(
        &self,
        uses: &[(&Arc<crate::memory::Allocation>, crate::memory::Access)],
        f: impl FnOnce(sys::CUstream) -> Result<R>,
    ) -> Result<R> {
        if let Some((a, _)) = uses.iter().find(|(a, _)| a.home_stream().device() != self.device()) {
            return Err(Error::DeviceMismatch {
                during: "queueing library work with a buffer of another device",
                expected: self.device().ordinal(),
                actual: a.home_stream().device().ordinal(),
            });
        }
        self.inner.device.bind()?;
        let raw = self.raw();
        crate::memory::ordered_on(self, uses, || f(raw))
    }

    /// Queues `f` to run on a driver thread once all earlier work on this stream has finished.
    ///
    /// # Safety
    /// `f` must not call any CUDA API function (the driver forbids it from host callbacks: it may
    /// deadlock or fail), neither when it runs nor when it and what it captured are dropped (also
    /// on the driver's thread: do not capture buffers, streams or events), and must not block for
    /// long, since it stalls the stream.
    ///
    /// # Errors
    /// [`Error::Capture`] on a capturing stream; driver errors.
    pub unsafe fn launch_host_fn<F: FnOnce() + Send + 'static>(&self, f: F) -> Result<()> {
        /// # Safety
        /// `data` must be a `Box<F>` leaked by `launch_host_fn` and handed to the driver once; the
        /// driver calls this exactly once for it, which takes the box back.
        unsafe extern "C" fn trampoline<F: FnOnce() + Send + 'static>(data: *mut c_void) {
            // SAFETY: `data` is the Box<F> leaked below, handed to the driver exactly once; the
            // driver calls this trampoline exactly once for it.
            let f = unsafe { Box::from_raw(data as *mut F) };
            // A panic must not unwind into the driver's C frame.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        }
        // Captured, the callback would be replayed after its box was consumed by the first run.
        let state = self.lock();
        crate::capture::refuse_if_capturing(&state, "a host function on a stream being captured")?;
        self.inner.device.bind()?;
        let data = Box::into_raw(Box::new(f)) as *mut c_void;
        // SAFETY: live stream; the trampoline matches CUhostFn and owns `data` once it runs.
        let res = unsafe { result::launch_host_func(self.raw(), Some(trampoline::<F>), data) };
        drop(state);
        if res.is_err() {
            // SAFETY: the driver refused the callback, so it will never run: reclaim the box
            // (dropped with no lock held: it may own buffers whose drop queues a free).
            drop(unsafe { Box::from_raw(data as *mut F) });
        }
        res
    }

    /// Queues `f` to run on a driver thread once all earlier work on this stream has finished
    /// **or failed**: unlike [`Stream::launch_host_fn`], the callback also runs when the context has
    /// hit an error, and receives the status, so a waiter can never hang on a dead stream.
    ///
    /// # Safety
    /// As for [`Stream::launch_host_fn`]: `f` must not call CUDA and must return quickly.
    /// [`StreamStatus::into_result`] calls CUDA, so call it outside the callback.
    ///
    /// # Errors
    /// [`Error::Capture`] on a capturing stream; driver errors.
    pub unsafe fn add_callback<F: FnOnce(StreamStatus) + Send + 'static>(&self, f: F) -> Result<()> {
        /// # Safety
        /// `data` must be a `Box<F>` leaked by `add_callback` and handed to the driver once; the
        /// driver calls this exactly once for it (with the stream's status), which takes the box
        /// back.
        unsafe extern "C" fn trampoline<F: FnOnce(StreamStatus) + Send + 'static>(
            _stream: sys::CUstream,
            status: sys::CUresult,
            data: *mut c_void,
        ) {
            // SAFETY: `data` is the Box<F> leaked below; the driver calls this exactly once for it.
            let f = unsafe { Box::from_raw(data as *mut F) };
            let status = StreamStatus(status);
            // A panic must not unwind into the driver's C frame.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || f(status)));
        }
        let state = self.lock();
        crate::capture::refuse_if_capturing(&state, "a stream callback on a stream being captured")?;
        self.inner.device.bind()?;
        let data = Box::into_raw(Box::new(f)) as *mut c_void;
        // SAFETY: live stream; the trampoline matches CUstreamCallback and owns `data` once it
        // runs.
        let res = unsafe { result::stream_add_callback(self.raw(), Some(trampoline::<F>), data) };
        drop(state);
        if res.is_err() {
            // SAFETY: the driver refused the callback, so it will never run: reclaim the box
            // (dropped with no lock held: it may own buffers whose drop queues a free).
            drop(unsafe { Box::from_raw(data as *mut F) });
        }
        res
    }
}

/// The status a stream callback receives: success, or the error of earlier work on the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamStatus(sys::CUresult);

impl StreamStatus {
    /// Whether the earlier work succeeded.
    pub fn is_ok(self) -> bool {
        self.0 == sys::CUresult::CUDA_SUCCESS
    }

    /// The status as a `Result` naming `during`. Calls into the driver for the error's name, so
    /// never call it from inside the callback itself.
    ///
    /// # Errors
    /// The driver error of the status, naming `during`.
    pub fn into_result(self, during: &'static str) -> Result<()> {
        crate::error::check(self.0, during)
    }

    /// The raw code, e.g. to store in an atomic from inside the callback.
    pub fn code(self) -> u32 {
        self.0 as u32
    }

    /// Rebuilds a status from [`StreamStatus::code`]; unknown codes become `CUDA_ERROR_UNKNOWN`.
    pub fn from_code(code: u32) -> StreamStatus {
        if code == 0 {
            return StreamStatus(sys::CUresult::CUDA_SUCCESS);
        }
        // Only codes that came from `code()` are expected; compare against the known values.
        StreamStatus(
            KNOWN.iter().copied().find(|r| *r as u32 == code).unwrap_or(sys::CUresult::CUDA_ERROR_UNKNOWN),
        )
    }
}

use sys::CUresult as R;
/// Error codes a stream callback may plausibly report (asynchronous kernel and copy failures).
const KNOWN: &[R] = &[
    R::CUDA_ERROR_ILLEGAL_ADDRESS,
    R::CUDA_ERROR_LAUNCH_FAILED,
    R::CUDA_ERROR_LAUNCH_TIMEOUT,
    R::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
    R::CUDA_ERROR_ILLEGAL_INSTRUCTION,
    R::CUDA_ERROR_MISALIGNED_ADDRESS,
    R::CUDA_ERROR_INVALID_PC,
    R::CUDA_ERROR_HARDWARE_STACK_ERROR,
    R::CUDA_ERROR_ASSERT,
    R::CUDA_ERROR_OUT_OF_MEMORY,
    R::CUDA_ERROR_ECC_UNCORRECTABLE,
    R::CUDA_ERROR_CONTEXT_IS_DESTROYED,
    R::CUDA_ERROR_UNKNOWN,
];
