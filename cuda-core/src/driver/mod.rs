//! Loading and initialising the CUDA driver.
//!
//! The driver library is loaded at run time (cudarc's dynamic loading), so this crate builds and
//! links on machines with no CUDA installation. The first call that needs the driver loads it and
//! calls `cuInit`; the outcome (success or a clear [`Error::NoDriver`]) is remembered for the rest
//! of the process.

use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};

pub(crate) mod result;

/// Loads the driver and runs `cuInit(0)` once per process. Every entry point of this crate that
/// talks to the driver goes through here first, so a missing driver is an error, never a panic.
static INIT: OnceLock<Result<()>> = OnceLock::new();

pub(crate) fn init() -> Result<()> {
    INIT.get_or_init(|| {
        // SAFETY: is_culib_present only tries to dlopen candidate names and closes them again.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::NoDriver {
                library: "libcuda.so",
                searched: cudarc::get_lib_name_candidates("cuda").join(", "),
            });
        }
        crate::error::mark_library_loaded();
        result::init()
    })
    .clone()
}

/// The number of CUDA devices. An error if the driver is missing or fails to initialise; `Ok(0)`
/// is never returned by the driver in practice (it reports `CUDA_ERROR_NO_DEVICE` from `cuInit`),
/// but callers should treat it as "no GPU" too.
///
/// # Errors
/// [`Error::NoDriver`] without a driver; [`Error::NoDevice`] when the driver reports none; driver
/// errors of `cuInit`.
pub fn device_count() -> Result<usize> {
    init().map_err(no_device)?;
    let n = result::device_get_count().map_err(no_device)?;
    Ok(n as usize)
}

/// `CUDA_ERROR_NO_DEVICE` from the driver becomes [`Error::NoDevice`].
fn no_device(e: Error) -> Error {
    match e {
        Error::Driver { name: "CUDA_ERROR_NO_DEVICE", description, .. } => {
            Error::NoDevice { reason: description.into() }
        }
        e => e,
    }
}

/// The CUDA version the installed driver supports, as `(major, minor)`, e.g. `(13, 0)` for
/// driver 580.
///
/// # Errors
/// [`Error::NoDriver`] without a driver; driver errors.
pub fn driver_version() -> Result<(u32, u32)> {
    init()?;
    let v = result::driver_get_version()?;
    Ok(((v / 1000) as u32, ((v % 1000) / 10) as u32))
}

/// The oldest driver CUDA version this build supports: cudarc's `cuda-13000` bindings, so a
/// driver of the R580 branch or newer.
pub const MIN_DRIVER_CUDA_VERSION: (u32, u32) = (13, 0);

/// The capture gate: how many stream captures begun through this crate are open, and how many
/// device-wide operations are in flight, process-wide. Kept here, below every module that needs
/// it.
///
/// **Why.** A device-wide operation (`cuCtxSynchronize`, enabling peer access) that overlaps a
/// stream capture on another thread is not something the driver supports: measured on the H100
/// (driver 580), `Device::synchronize` on one thread while another begins and ends captures in a
/// loop crashed the process with SIGSEGV inside libcuda within a second, when the old check (one
/// atomic load, then the call) let a capture begin between the check and the synchronisation.
/// So the two never overlap: a device-wide operation runs only while no capture is open (it is
/// refused otherwise: waiting could deadlock on a capture of its own thread), and a capture waits
/// to begin while a device-wide operation is in flight (those only wait for queued GPU work).
///
/// The gate also knows which thread began each open capture (`capturing`, one entry per capture),
/// so that calls the driver forbids a capturing thread to make (page-locked allocation and its
/// free) are refused or deferred before the driver sees them: [`this_thread_captures`].
struct Gate {
    open_captures: usize,
    device_wide: usize,
    capturing: Vec<std::thread::ThreadId>,
}

static GATE: Mutex<Gate> = Mutex::new(Gate { open_captures: 0, device_wide: 0, capturing: Vec::new() });
static GATE_FREE: Condvar = Condvar::new();

fn gate() -> MutexGuard<'static, Gate> {
    GATE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Counts a capture of the calling thread in (before the driver is asked to begin it), first
/// waiting for any device-wide operation in flight to finish.
pub(crate) fn capture_opened() {
    let mut g = gate();
    while g.device_wide > 0 {
        g = GATE_FREE.wait(g).unwrap_or_else(|p| p.into_inner());
    }
    g.open_captures += 1;
    g.capturing.push(std::thread::current().id());
}

/// Counts a capture of the calling thread out (once the driver has ended it, or refused to begin
/// it).
pub(crate) fn capture_closed() {
    capture_closed_by(std::thread::current().id());
}

/// Counts out a capture that `thread` began (the drop of its stream's last handle may end it on
/// another thread).
pub(crate) fn capture_closed_by(thread: std::thread::ThreadId) {
    let mut g = gate();
    g.open_captures = g.open_captures.saturating_sub(1);
    if let Some(i) = g.capturing.iter().position(|t| *t == thread) {
        g.capturing.swap_remove(i);
    }
}

/// Whether the calling thread has a capture open (begun through this crate and not yet ended). The
/// driver forbids such a thread calls that may synchronise implicitly, page-locked allocation and
/// its free among them (in the thread-local and global modes the call fails and invalidates the
/// capture): `PinnedBuffer::new` and the staged peer copy refuse with `Error::Capture` first, and a
/// page-locked buffer dropped on such a thread is freed later, on the reaper thread.
pub(crate) fn this_thread_captures() -> bool {
    let me = std::thread::current().id();
    gate().capturing.contains(&me)
}

/// Runs `f`, a device-wide driver operation, with no capture open anywhere in the process and
/// none able to begin until it returns.
///
/// Errors: [`Error::Capture`] naming `what` if a capture is open; the error of `f`.
pub(crate) fn device_wide<R>(what: &'static str, f: impl FnOnce() -> Result<R>) -> Result<R> {
    {
        let mut g = gate();
        if g.open_captures > 0 {
            return Err(Error::Capture(what));
        }
        g.device_wide += 1;
    }
    // Leaves the gate even if `f` panics.
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            let mut g = gate();
            g.device_wide -= 1;
            if g.device_wide == 0 {
                GATE_FREE.notify_all();
            }
        }
    }
    let _leave = Leave;
    f()
}

/// Sets the calling thread's stream-capture interaction mode to *relaxed*
/// (`cuThreadExchangeStreamCaptureMode`), so that other threads' `CaptureMode::Global`
/// captures do not make this thread's event queries and waits fail. For library-owned threads
/// that only query and wait on events that no capture records into (completion and reaper
/// threads). Errors are ignored: the mode is an optimisation of availability, not of safety.
pub fn relax_thread_capture_mode() {
    if init().is_err() {
        return;
    }
    let _ =
        result::thread_exchange_stream_capture_mode(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED);
}

/// Whether a usable GPU is present: the driver loads, initialises, and reports at least one
/// device. Returns the device count or the reason there is none.
///
/// # Errors
/// The reason there is no usable GPU: [`Error::NoDriver`], [`Error::NoDevice`] or a driver error.
pub fn gpu_available() -> Result<usize> {
    match device_count() {
        Ok(0) => Err(Error::NoDevice { reason: "the driver reports 0 devices".into() }),
        Ok(n) => Ok(n),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gate knows which thread each open capture belongs to: the capturing thread sees its
    /// capture, another thread does not, and a capture counted out on another thread (the drop of
    /// a stream's last handle there) is no longer the first thread's. Device-wide operations are
    /// refused while any capture is open. (The only test of this crate that opens the gate, so the
    /// process-wide counts are its own.)
    #[test]
    fn gate_tracks_capturing_threads() {
        assert!(!this_thread_captures());
        capture_opened();
        assert!(this_thread_captures());
        assert!(matches!(device_wide("test", || Ok(())), Err(Error::Capture("test"))));
        let me = std::thread::current().id();
        std::thread::spawn(move || {
            assert!(!this_thread_captures(), "another thread's capture is not this one's");
            capture_closed_by(me);
        })
        .join()
        .unwrap();
        assert!(!this_thread_captures());
        assert!(device_wide("test", || Ok(())).is_ok());
        // Two captures of one thread: open until both are closed.
        capture_opened();
        capture_opened();
        capture_closed();
        assert!(this_thread_captures());
        capture_closed();
        assert!(!this_thread_captures());
    }
}
