//! The one error type of `cuda-core`.

use cudarc::driver::sys;
use std::ffi::CStr;

/// Everything that can go wrong in `cuda-core`. No function of this crate panics on a driver
/// failure or on bad input: each returns one of these.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The CUDA driver library (`libcuda.so`) could not be loaded: no NVIDIA driver is installed.
    #[error("the CUDA driver library ({library}) could not be loaded: is an NVIDIA driver installed? searched: {searched}")]
    NoDriver {
        /// The library that was looked for.
        library: &'static str,
        /// The file names that were tried.
        searched: String,
    },
    /// The driver loaded but reports no CUDA device.
    #[error("no CUDA device found ({reason})")]
    NoDevice {
        /// What the driver said.
        reason: String,
    },
    /// A device ordinal outside `0..count`.
    #[error("invalid device ordinal {ordinal}: this machine has {count} CUDA device(s)")]
    InvalidDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices there are.
        count: usize,
    },
    /// A driver call returned an error.
    #[error("{name} ({code}) while {during}: {description}")]
    Driver {
        /// The driver's name for the error, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        name: &'static str,
        /// The raw `CUresult` value.
        code: u32,
        /// The driver's description of the error.
        description: &'static str,
        /// What was being done.
        during: &'static str,
    },
    /// NVRTC (`libnvrtc.so`) could not be loaded; kernel compilation is unavailable, everything
    /// else keeps working.
    #[error("NVRTC ({library}) could not be loaded, so CUDA C cannot be compiled at run time; install the CUDA toolkit or the `nvidia-cuda-nvrtc` wheel and put its lib folder on LD_LIBRARY_PATH (searched: {searched})")]
    NvrtcMissing {
        /// The library that was looked for.
        library: &'static str,
        /// The file names that were tried.
        searched: String,
    },
    /// An NVRTC call failed.
    #[error("NVRTC error {name} while {during}")]
    Nvrtc {
        /// NVRTC's name for the error.
        name: String,
        /// What was being done.
        during: &'static str,
    },
    /// CUDA C source failed to compile; `log` is NVRTC's program log.
    #[error("CUDA C compilation of `{program}` failed:\n{log}")]
    Compile {
        /// The program name given to NVRTC.
        program: String,
        /// NVRTC's log.
        log: String,
    },
    /// Two lengths that must agree (e.g. source and destination of a copy) do not.
    #[error("length mismatch while {during}: expected {expected} elements, got {actual}")]
    LengthMismatch {
        /// What was being done.
        during: &'static str,
        /// The length required.
        expected: usize,
        /// The length given.
        actual: usize,
    },
    /// An argument that no call could accept (e.g. a zero block size, a size overflow).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// An operation that cannot be part of a stream capture was attempted on a capturing stream
    /// (an allocation, a blocking or pageable copy, a synchronisation). Refused
    /// before the driver sees it, so the capture and the context stay usable.
    #[error("not allowed during stream capture: {0}")]
    Capture(&'static str),
    /// A CUDA library other than the driver and NVRTC (e.g. `libcublas.so`) could not be loaded.
    #[error("{library} could not be loaded; install it (CUDA toolkit or the matching `nvidia-*` wheel) and put its lib folder on LD_LIBRARY_PATH (searched: {searched})")]
    LibraryMissing {
        /// The library that was looked for.
        library: &'static str,
        /// The file names that were tried.
        searched: String,
    },
    /// A call into a CUDA library other than the driver (cuBLAS, ...) failed.
    #[error("{library} error {status} while {during}")]
    Library {
        /// The library, e.g. `cuBLAS`.
        library: &'static str,
        /// The library's status name, e.g. `CUBLAS_STATUS_NOT_SUPPORTED`.
        status: String,
        /// What was being done.
        during: &'static str,
    },
    /// Two objects that must live on the same device do not.
    #[error("device mismatch while {during}: device {expected} vs device {actual}")]
    DeviceMismatch {
        /// What was being done.
        during: &'static str,
        /// The device required.
        expected: usize,
        /// The device given.
        actual: usize,
    },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The driver's `CUresult` name, if this is a driver error.
    pub fn driver_error_name(&self) -> Option<&'static str> {
        match self {
            Error::Driver { name, .. } => Some(name),
            _ => None,
        }
    }

    /// Builds the error for a failed driver call.
    pub(crate) fn driver(code: sys::CUresult, during: &'static str) -> Self {
        let mut name_ptr = std::ptr::null();
        let mut desc_ptr = std::ptr::null();
        if !LIBRARY_LOADED.load(std::sync::atomic::Ordering::Acquire) {
            // Never reached in practice (every driver call follows a successful load), but the
            // name lookup below would need the library.
            return Error::Driver {
                name: "CUDA_ERROR_UNKNOWN_CODE",
                code: code as u32,
                description: "driver not loaded",
                during,
            };
        }
        // SAFETY: cuGetErrorName/String write a pointer to a static, NUL-terminated string owned by
        // the driver (or leave ours null for unknown codes); we only read it after checking.
        let (name, description) = unsafe {
            sys::cuGetErrorName(code, &mut name_ptr);
            sys::cuGetErrorString(code, &mut desc_ptr);
            (static_cstr(name_ptr), static_cstr(desc_ptr))
        };
        Error::Driver {
            name: name.unwrap_or("CUDA_ERROR_UNKNOWN_CODE"),
            code: code as u32,
            description: description.unwrap_or("no description"),
            during,
        }
    }
}

/// # Safety
/// `p` is null or points to a NUL-terminated string that lives for the rest of the process.
unsafe fn static_cstr(p: *const std::ffi::c_char) -> Option<&'static str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller guarantees a static NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

/// Whether the driver library has been found, so its functions (the error-name lookups below) may be
/// called. Set by `driver::init`; kept here so that this module depends on nothing else of the
/// crate.
static LIBRARY_LOADED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Records that the driver library is loaded (called once by `driver::init`).
pub(crate) fn mark_library_loaded() {
    LIBRARY_LOADED.store(true, std::sync::atomic::Ordering::Release);
}

static DROP_ERRORS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static LAST_DROP_ERROR: std::sync::Mutex<Option<(u32, &'static str)>> = std::sync::Mutex::new(None);

/// How many errors were discarded by `Drop` implementations (which cannot return them: destroying
/// a stream or event, freeing memory, ...), with the last one's `CUresult` code and what was being
/// done. A drop path that leaks what it would have released because a capture is open (freeing
/// into the capture would invalidate it or record a foreign free) and reports it here is counted
/// too (one does not: a page-locked buffer dropped on a capturing thread while the reaper thread
/// cannot be started is leaked uncounted), under
/// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` (900), the code the driver gives such a call, and any
/// other error that is not the driver's under `CUDA_ERROR_UNKNOWN` (999). Zero in a healthy process;
/// a growing count points at a broken context, or at buffers dropped during captures.
pub fn drop_errors() -> (u64, Option<(u32, &'static str)>) {
    let last = *LAST_DROP_ERROR.lock().unwrap_or_else(|e| e.into_inner());
    (DROP_ERRORS.load(std::sync::atomic::Ordering::Relaxed), last)
}

/// Records a driver error that a drop path cannot return (see [`drop_errors`]).
pub(crate) fn note_drop_error(code: sys::CUresult, during: &'static str) {
    if code != sys::CUresult::CUDA_SUCCESS {
        count_drop_error(code as u32, during);
    }
}

/// Records the error that a drop path cannot return (see [`drop_errors`]): every error is counted.
/// Found on the GPU: only driver errors were, so the leaks that drop paths report as
/// [`Error::Capture`] (a wrapped cudarc slice, a free ordered behind a use recorded in a capture)
/// went uncounted, against their documentation.
pub(crate) fn note_drop(res: Result<()>) {
    match res {
        Ok(()) => {}
        Err(Error::Driver { code, during, .. }) => count_drop_error(code, during),
        Err(Error::Capture(during)) => {
            count_drop_error(sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED as u32, during)
        }
        Err(_) => count_drop_error(
            sys::CUresult::CUDA_ERROR_UNKNOWN as u32,
            "a drop path's error that is not the driver's",
        ),
    }
}

fn count_drop_error(code: u32, during: &'static str) {
    DROP_ERRORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    *LAST_DROP_ERROR.lock().unwrap_or_else(|e| e.into_inner()) = Some((code, during));
}

/// Turns a `CUresult` into `Ok(())` or an [`Error::Driver`] naming `during`.
#[inline]
pub(crate) fn check(code: sys::CUresult, during: &'static str) -> Result<()> {
    if code == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::driver(code, during))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every error of a drop path is counted, a leak refused during a capture too (it was not:
    /// `gpu_interop::refused_slice_is_not_freed_into_cudarcs_capture` failed on the GPU).
    #[test]
    fn drop_paths_count_every_error() {
        let (before, _) = drop_errors();
        note_drop(Err(Error::Capture("leaking a test value during a capture")));
        let (after, last) = drop_errors();
        assert_eq!(after - before, 1);
        assert_eq!(
            last,
            Some((
                sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED as u32,
                "leaking a test value during a capture"
            ))
        );
        note_drop(Err(Error::InvalidArgument("not the driver's".into())));
        note_drop(Ok(()));
        let (end, last) = drop_errors();
        assert_eq!(end - after, 1);
        assert_eq!(last.map(|l| l.0), Some(sys::CUresult::CUDA_ERROR_UNKNOWN as u32));
    }
}
