//! Host functions and callbacks queued on a stream, and the status a callback receives.

use super::Stream;
use crate::driver::result;
use crate::error::Result;
use crate::track::state::refuse_if_capturing;
use cudarc::driver::sys;
use std::ffi::c_void;

impl Stream {
    /// Queues `f` to run on a driver thread once all earlier work on this stream has finished.
    ///
    /// # Safety
    /// `f` must not call any CUDA API function (the driver forbids it from host callbacks: it may
    /// deadlock or fail), neither when it runs nor when it and what it captured are dropped (also
    /// on the driver's thread: do not capture buffers, streams or events), and must not block for
    /// long, since it stalls the stream.
    ///
    /// # Errors
    /// [`Error::Capture`](crate::error::Error::Capture) on a capturing stream; driver errors.
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
        refuse_if_capturing(&state, "a host function on a stream being captured")?;
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
    /// [`Error::Capture`](crate::error::Error::Capture) on a capturing stream; driver errors.
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
        refuse_if_capturing(&state, "a stream callback on a stream being captured")?;
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
