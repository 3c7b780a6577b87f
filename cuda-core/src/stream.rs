//! Streams: ordered queues of device work.
//!
//! **Drop:** dropping the last handle to a stream calls `cuStreamDestroy`, which returns at once;
//! the driver releases the stream after the work already queued on it has finished. Dropping a
//! stream therefore never blocks and never cancels queued work. Buffers keep their allocation
//! stream alive (they hold a handle), so stream-ordered frees always have a live stream.

use crate::device::Device;
use crate::error::{check, Error, Result};
use crate::event::Event;
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};

struct StreamInner {
    device: Device,
    raw: sys::CUstream,
    /// Held while work that uses buffers homed on this stream is being queued (see
    /// `memory::order`): it makes each such use one atomic step in this stream's order.
    uses: Mutex<()>,
}

// SAFETY: a CUstream may be used from any thread; the driver serialises enqueues internally.
unsafe impl Send for StreamInner {}
// SAFETY: as above; the handle is immutable after creation.
unsafe impl Sync for StreamInner {}

impl Drop for StreamInner {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: we own the handle and nothing uses it after the last Arc is gone. The driver
            // defers the release until queued work is complete. An error cannot be reported here.
            unsafe { sys::cuStreamDestroy_v2(self.raw) };
        }
    }
}

/// A non-blocking CUDA stream (it does not synchronise with the legacy default stream).
/// Cloning gives another handle to the same stream; two handles are equal when they name the same
/// stream.
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
    pub fn stream_priority_range(&self) -> Result<(i32, i32)> {
        self.bind()?;
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: valid out-pointers; context bound.
        check(
            unsafe { sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) },
            "reading the stream priority range",
        )?;
        Ok((least, greatest))
    }

    /// Creates a new non-blocking stream with the default priority.
    pub fn new_stream(&self) -> Result<Stream> {
        Stream::new(self)
    }
}

impl Stream {
    /// Creates a non-blocking stream with the default priority.
    pub fn new(device: &Device) -> Result<Stream> {
        Self::with_priority(device, 0)
    }

    /// Creates a non-blocking stream with `priority`, which must lie in
    /// [`Device::stream_priority_range`] (an error otherwise, rather than the driver's silent clamp).
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
        let mut raw = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: valid out-pointer; context bound.
        check(unsafe { sys::cuStreamCreateWithPriority(&mut raw, flags, priority) }, "creating a stream")?;
        Ok(Stream { inner: Arc::new(StreamInner { device: *device, raw, uses: Mutex::new(()) }) })
    }

    /// The device this stream belongs to.
    #[inline]
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// Locks this stream as a *home* stream while a use of its buffers is queued.
    pub(crate) fn lock_uses(&self) -> MutexGuard<'_, ()> {
        self.inner.uses.lock().unwrap_or_else(|e| e.into_inner())
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
    pub fn synchronize(&self) -> Result<()> {
        crate::capture::refuse_if_capturing(self, "synchronizing a stream that is being captured")?;
        self.inner.device.bind()?;
        // SAFETY: live stream handle; context bound.
        check(unsafe { sys::cuStreamSynchronize(self.raw()) }, "synchronizing a stream")
    }

    /// Non-blocking: `true` if all queued work has finished, `false` if some is still running.
    pub fn query(&self) -> Result<bool> {
        self.inner.device.bind()?;
        // SAFETY: live stream handle; context bound.
        match unsafe { sys::cuStreamQuery(self.raw()) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(Error::driver(e, "querying a stream")),
        }
    }

    /// Makes all work queued on this stream after this call wait until `event` has completed.
    /// Does not block the host.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.inner.device.bind()?;
        // SAFETY: live stream and event handles; context bound.
        check(
            unsafe { sys::cuStreamWaitEvent(self.raw(), event.raw(), 0) },
            "making a stream wait on an event",
        )
    }

    /// Orders all work queued on `self` after this call behind all work queued on `other` so far.
    /// A no-op when both are the same stream.
    pub fn wait_stream(&self, other: &Stream) -> Result<()> {
        if self == other {
            return Ok(());
        }
        let ev = Event::pooled(other.device())?;
        ev.record(other)?;
        self.wait_event(&ev)
    }

    /// Queues `f` to run on a driver thread once all earlier work on this stream has finished.
    ///
    /// # Safety
    /// `f` must not call any CUDA API function (the driver forbids it from host callbacks: it may
    /// deadlock or fail) and must not block for long, since it stalls the stream.
    pub unsafe fn launch_host_fn<F: FnOnce() + Send + 'static>(&self, f: F) -> Result<()> {
        unsafe extern "C" fn trampoline<F: FnOnce() + Send + 'static>(data: *mut c_void) {
            // SAFETY: `data` is the Box<F> leaked below, handed to the driver exactly once; the
            // driver calls this trampoline exactly once for it.
            let f = unsafe { Box::from_raw(data as *mut F) };
            // A panic must not unwind into the driver's C frame.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        }
        // Captured, the callback would be replayed after its box was consumed by the first run.
        crate::capture::refuse_if_capturing(self, "a host function on a stream being captured")?;
        self.inner.device.bind()?;
        let data = Box::into_raw(Box::new(f)) as *mut c_void;
        // SAFETY: live stream; the trampoline matches CUhostFn and owns `data` once it runs.
        let res = unsafe { sys::cuLaunchHostFunc(self.raw(), Some(trampoline::<F>), data) };
        if res != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: the driver refused the callback, so it will never run: reclaim the box.
            drop(unsafe { Box::from_raw(data as *mut F) });
            return Err(Error::driver(res, "queueing a host function"));
        }
        Ok(())
    }

    /// Queues `f` to run on a driver thread once all earlier work on this stream has finished
    /// **or failed**: unlike [`Stream::launch_host_fn`], the callback also runs when the context has
    /// hit an error, and receives the status, so a waiter can never hang on a dead stream.
    ///
    /// # Safety
    /// As for [`Stream::launch_host_fn`]: `f` must not call CUDA and must return quickly.
    /// [`StreamStatus::into_result`] calls CUDA, so call it outside the callback.
    pub unsafe fn add_callback<F: FnOnce(StreamStatus) + Send + 'static>(&self, f: F) -> Result<()> {
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
        crate::capture::refuse_if_capturing(self, "a stream callback on a stream being captured")?;
        self.inner.device.bind()?;
        let data = Box::into_raw(Box::new(f)) as *mut c_void;
        // SAFETY: live stream; the trampoline matches CUstreamCallback and owns `data` once it
        // runs; flags must be 0.
        let res = unsafe { sys::cuStreamAddCallback(self.raw(), Some(trampoline::<F>), data, 0) };
        if res != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: the driver refused the callback, so it will never run: reclaim the box.
            drop(unsafe { Box::from_raw(data as *mut F) });
            return Err(Error::driver(res, "queueing a stream callback"));
        }
        Ok(())
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
