//! Devices and automatic context binding.
//!
//! Each device's *primary context* is retained the first time the device is opened and kept for
//! the rest of the process (as the CUDA runtime does). Every operation of this crate binds the
//! right context to the calling thread before it talks to the driver, so users never bind contexts
//! by hand and may use a device, stream or buffer from any thread (tokio workers included).

use crate::driver;
use crate::driver::result;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::sync::{Mutex, OnceLock};

/// A device attribute, as the driver names it (`CU_DEVICE_ATTRIBUTE_*`).
pub use sys::CUdevice_attribute as DeviceAttribute;

pub(crate) struct DeviceInner {
    ordinal: usize,
    cu_device: sys::CUdevice,
    ctx: sys::CUcontext,
    name: String,
    /// Untimed events ready for reuse (see `Event::pooled`).
    pub(crate) event_pool: Mutex<Vec<sys::CUevent>>,
}

// SAFETY: CUdevice is an integer and CUcontext an opaque handle that the driver allows any thread
// to use (binding it with cuCtxSetCurrent is thread-safe); DeviceInner is immutable after creation.
unsafe impl Send for DeviceInner {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for DeviceInner {}

/// A CUDA device with its retained primary context. Cheap to copy; equal when the ordinal is.
///
/// ```no_run
/// # fn main() -> cuda_core::Result<()> {
/// use cuda_core::Device;
/// let dev = Device::new(0)?;
/// let (major, minor) = dev.compute_capability()?;
/// println!("{}: sm_{major}{minor}, {} SMs", dev.name(), dev.multiprocessor_count()?);
/// let copy = dev; // a plain copy of the handle: the same device
/// assert_eq!(copy, Device::new(0)?);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy)]
pub struct Device {
    inner: &'static DeviceInner,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({}: {})", self.inner.ordinal, self.inner.name)
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.inner.ordinal == other.inner.ordinal
    }
}
impl Eq for Device {}

fn registry() -> Result<&'static [OnceLock<Result<&'static DeviceInner>>]> {
    static REG: OnceLock<Vec<OnceLock<Result<&'static DeviceInner>>>> = OnceLock::new();
    if let Some(r) = REG.get() {
        return Ok(r);
    }
    let n = driver::device_count()?;
    Ok(REG.get_or_init(|| (0..n).map(|_| OnceLock::new()).collect()))
}

impl Device {
    /// Opens device `ordinal`: retains its primary context (once per process) and binds it to the
    /// calling thread. Errors: no driver ([`Error::NoDriver`]), no device, or an ordinal out of
    /// range ([`Error::InvalidDevice`]).
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, Error};
    /// let dev = Device::new(0)?; // binds its primary context to this thread
    /// assert_eq!(dev.ordinal(), 0);
    /// // An ordinal past the last device is an error, not a panic.
    /// let n = Device::count()?;
    /// assert!(matches!(Device::new(n), Err(Error::InvalidDevice { .. })));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::NoDriver`] without a driver, [`Error::NoDevice`], [`Error::InvalidDevice`] for an
    /// ordinal out of range, driver errors retaining the primary context.
    pub fn new(ordinal: usize) -> Result<Device> {
        let reg = registry()?;
        let slot = reg.get(ordinal).ok_or(Error::InvalidDevice { ordinal, count: reg.len() })?;
        let inner = slot.get_or_init(|| open(ordinal)).clone()?;
        let dev = Device { inner };
        dev.bind()?;
        Ok(dev)
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// The device's name, e.g. `NVIDIA H100 80GB HBM3`.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The raw `CUdevice`.
    pub fn cu_device(&self) -> sys::CUdevice {
        self.inner.cu_device
    }

    pub(crate) fn inner(&self) -> &'static DeviceInner {
        self.inner
    }

    /// The raw primary context.
    pub fn cu_context(&self) -> sys::CUcontext {
        self.inner.ctx
    }

    /// Makes this device's primary context current on the calling thread if it is not already.
    /// Every operation of this crate calls it; users never need to.
    ///
    /// **Also on the calls that only use existing handles** (launches, graph launches and
    /// parameter updates, event and stream calls), although the driver runs those in their
    /// handles' context whatever is current: on driver 580 each of them succeeded and did its work
    /// with another live context current and with none (`scripts/dev/ctx_probe.cu`). Left out of
    /// those paths (tried in `86a4058`), the check saved about 10 ns a call and did not move the
    /// launch benchmark, while a thread whose current context was destroyed under it (cudarc's safe
    /// `CudaContext` bound on one thread and dropped on another) was not measured. With the check
    /// every call starts from this device's context, as the creating calls must. GPU tests:
    /// `gpu_interop::every_call_binds_while_another_context_is_current` (the device's context is
    /// current after each call) and `gpu_interop::calls_after_the_current_context_is_destroyed_elsewhere`.
    ///
    /// It asks the driver which context is current (one cheap call, a thread-local read in the
    /// driver) every time, trusting no record of its own: other code switches the thread's context
    /// behind this crate's back (cudarc's safe `CudaContext::new`, `bind_to_thread` and its `Drop`;
    /// NCCL through the CUDA runtime). Found by review: with a cached record, streams, events,
    /// modules and graphs created after such a switch landed in the other context, labelled as
    /// this device's (dangling once it was destroyed), and every later call on the thread failed
    /// until something rebound.
    ///
    /// # Errors
    /// Driver errors reading or setting the thread's current context.
    #[inline]
    pub fn bind(&self) -> Result<()> {
        // A context destroyed by another thread stays current here, and `cuCtxGetCurrent` fails
        // only when the driver is not initialised (CUDA driver API documentation): the read then
        // answers with the dead handle, and ours is set over it
        // (`gpu_interop::calls_after_the_current_context_is_destroyed_elsewhere`).
        let cur = result::ctx_get_current()?;
        if cur != self.inner.ctx {
            // SAFETY: the context is a retained primary context that lives for the process.
            unsafe { result::ctx_set_current(self.inner.ctx) }?;
        }
        Ok(())
    }

    /// [`Device::bind`] for a `Drop` implementation, which cannot return its error: `true` when
    /// the context is current; otherwise the error is counted in [`crate::drop_errors`] and the
    /// caller leaks what it would have destroyed (destroying it in another context could hit a
    /// handle of that context).
    #[inline]
    pub(crate) fn bind_in_drop(&self) -> bool {
        match self.bind() {
            Ok(()) => true,
            Err(e) => {
                crate::error::note_drop(Err(e));
                false
            }
        }
    }

    /// Reads any device attribute.
    ///
    /// # Errors
    /// Driver errors (e.g. an attribute this driver does not know).
    pub fn attribute(&self, attr: DeviceAttribute) -> Result<i32> {
        result::device_get_attribute(attr, self.inner.cu_device)
    }

    /// Compute capability as `(major, minor)`, e.g. `(9, 0)` for the H100.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// let dev = cuda_core::Device::new(0)?;
    /// let (major, minor) = dev.compute_capability()?;
    /// assert_eq!(dev.sm_arch()?, format!("sm_{major}{minor}")); // what NVRTC compiles for
    /// if (major, minor) >= (9, 0) {
    ///     println!("Hopper or newer: programmatic dependent launches overlap");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Driver errors reading the attributes.
    pub fn compute_capability(&self) -> Result<(u32, u32)> {
        use DeviceAttribute::*;
        Ok((
            self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32,
            self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32,
        ))
    }

    /// Number of streaming multiprocessors.
    ///
    /// # Errors
    /// Driver errors reading the attribute.
    pub fn multiprocessor_count(&self) -> Result<u32> {
        Ok(self.attribute(DeviceAttribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32)
    }

    /// Total device memory in bytes.
    ///
    /// # Errors
    /// Driver errors.
    pub fn total_memory(&self) -> Result<usize> {
        result::device_total_mem(self.inner.cu_device)
    }

    /// `(free, total)` device memory in bytes, as the driver sees it now.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// let dev = cuda_core::Device::new(0)?;
    /// let (free, total) = dev.memory_info()?;
    /// assert!(free <= total);
    /// println!("{} of {} MiB free", free >> 20, total >> 20);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Driver errors.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        // SAFETY: this device's context is current.
        unsafe { result::mem_get_info() }
    }

    /// Waits until all work on every stream of this device has finished.
    ///
    /// Never overlaps a stream capture: it is refused while any capture begun through this crate
    /// is open in the process, and no capture can begin until it returns (a capture beginning on
    /// another thread waits for it). The check and the synchronisation are one step, so a
    /// capture cannot begin in between (the driver does not support the overlap: see
    /// `driver::device_wide`).
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{CaptureMode, Device, Error};
    /// let dev = Device::new(0)?;
    /// let s = dev.new_stream()?;
    /// dev.synchronize()?; // nothing is being captured
    /// s.begin_capture(CaptureMode::ThreadLocal)?;
    /// assert!(matches!(dev.synchronize(), Err(Error::Capture(_))));
    /// s.end_capture()?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Capture`] while any capture is open in the process (a device-wide wait would
    /// wait on, and invalidate, the capture); driver errors of queued work (e.g. a kernel fault).
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        driver::device_wide("synchronizing the device while a stream capture is active", || {
            // SAFETY: this device's context is current; no capture is open (the gate).
            unsafe { result::ctx_synchronize() }
        })
    }

    /// Starts (`true`) or stops (`false`) data collection by an attached profiler for this
    /// device's context, so that a tool started with profiling off (`ncu --profile-from-start
    /// off`, Nsight Systems' `--capture-range=cudaProfilerApi`) records only the region in
    /// between. Without a profiler attached the calls do nothing.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// let d = cuda_core::Device::new(0)?;
    /// d.profile(true)?; // ... the work to profile ...
    /// d.profile(false)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Driver errors.
    pub fn profile(&self, on: bool) -> Result<()> {
        self.bind()?;
        // SAFETY: `bind` made this device's primary context current on this thread.
        unsafe { result::profiler(on) }
    }

    /// The `--gpu-architecture` value NVRTC should compile for, e.g. `sm_90`.
    ///
    /// # Errors
    /// Driver errors reading the compute capability.
    pub fn sm_arch(&self) -> Result<String> {
        let (major, minor) = self.compute_capability()?;
        Ok(format!("sm_{major}{minor}"))
    }
}

fn open(ordinal: usize) -> Result<&'static DeviceInner> {
    // The driver is initialised by registry(); the ordinal was checked against the count.
    let cu_device = result::device_get(ordinal as i32)?;
    let name = result::device_get_name(cu_device)?;
    // Never released: the primary context lives for the process, so every handle derived from it
    // stays valid.
    let ctx = result::device_primary_ctx_retain(cu_device)?;
    Ok(Box::leak(Box::new(DeviceInner { ordinal, cu_device, ctx, name, event_pool: Mutex::new(Vec::new()) })))
}
