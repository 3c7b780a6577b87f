//! Driver, device and context calls.

use crate::error::{check, Result};
use cudarc::driver::sys;

/// `cuInit(0)`.
pub(crate) fn init() -> Result<()> {
    // SAFETY: cuInit has no preconditions; the library is known to load.
    check(unsafe { sys::cuInit(0) }, "initialising the CUDA driver (cuInit)")
}

/// `cuProfilerStart` (`start`) or `cuProfilerStop`: starts or stops collection by an attached
/// profiler in the current context.
///
/// # Safety
/// A context is current on the calling thread.
pub(crate) unsafe fn profiler(start: bool) -> Result<()> {
    // SAFETY: the caller made a context current; the calls take no arguments.
    let r = unsafe {
        if start {
            sys::cuProfilerStart()
        } else {
            sys::cuProfilerStop()
        }
    };
    check(
        r,
        if start {
            "starting the profiler (cuProfilerStart)"
        } else {
            "stopping the profiler (cuProfilerStop)"
        },
    )
}

/// `cuDeviceGetCount`.
pub(crate) fn device_get_count() -> Result<i32> {
    let mut n = 0;
    // SAFETY: the driver is initialised and `n` is a valid out-pointer.
    check(unsafe { sys::cuDeviceGetCount(&mut n) }, "counting devices")?;
    Ok(n)
}

/// `cuDriverGetVersion`.
pub(crate) fn driver_get_version() -> Result<i32> {
    let mut v = 0;
    // SAFETY: valid out-pointer, driver initialised.
    check(unsafe { sys::cuDriverGetVersion(&mut v) }, "reading the driver version")?;
    Ok(v)
}

/// `cuThreadExchangeStreamCaptureMode`: sets the calling thread's capture interaction mode to
/// `mode` and returns the previous one.
pub(crate) fn thread_exchange_stream_capture_mode(
    mode: sys::CUstreamCaptureMode,
) -> Result<sys::CUstreamCaptureMode> {
    let mut mode = mode;
    check(
        // SAFETY: valid in/out pointer; the call only changes this thread's capture interaction
        // mode.
        unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) },
        "exchanging the thread's capture mode",
    )?;
    Ok(mode)
}

/// `cuDeviceGet`.
pub(crate) fn device_get(ordinal: i32) -> Result<sys::CUdevice> {
    let mut cu_device = 0;
    // SAFETY: driver initialised; an ordinal out of range is a driver error; out-pointer valid.
    check(unsafe { sys::cuDeviceGet(&mut cu_device, ordinal) }, "getting a device handle")?;
    Ok(cu_device)
}

/// `cuDeviceGetName`, as an owned string.
pub(crate) fn device_get_name(dev: sys::CUdevice) -> Result<String> {
    let mut buf = [0 as std::ffi::c_char; 256];
    check(
        // SAFETY: the buffer is 256 bytes and we pass its length; the driver NUL-terminates.
        unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, dev) },
        "reading the device name",
    )?;
    // SAFETY: NUL-terminated by the driver within the buffer (the last byte stays 0 at worst).
    Ok(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

/// `cuDevicePrimaryCtxRetain`. The retain is never released by this crate: the primary context
/// lives for the process, so every handle derived from it stays valid.
pub(crate) fn device_primary_ctx_retain(dev: sys::CUdevice) -> Result<sys::CUcontext> {
    let mut ctx = std::ptr::null_mut();
    // SAFETY: a device handle (an invalid one is a driver error) and a valid out-pointer.
    check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) }, "retaining the primary context")?;
    Ok(ctx)
}

/// `cuDeviceGetAttribute`.
pub(crate) fn device_get_attribute(attr: sys::CUdevice_attribute, dev: sys::CUdevice) -> Result<i32> {
    let mut v = 0;
    check(
        // SAFETY: valid out-pointer and device handle.
        unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) },
        "reading a device attribute",
    )?;
    Ok(v)
}

/// `cuDeviceTotalMem_v2`.
pub(crate) fn device_total_mem(dev: sys::CUdevice) -> Result<usize> {
    let mut bytes = 0;
    check(
        // SAFETY: valid out-pointer and device handle.
        unsafe { sys::cuDeviceTotalMem_v2(&mut bytes, dev) },
        "reading total device memory",
    )?;
    Ok(bytes)
}

/// `cuDeviceCanAccessPeer`.
pub(crate) fn device_can_access_peer(dev: sys::CUdevice, peer: sys::CUdevice) -> Result<bool> {
    let mut can = 0;
    check(
        // SAFETY: valid out-pointer; both handles come from opened devices.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, dev, peer) },
        "asking whether a device can access a peer's memory",
    )?;
    Ok(can != 0)
}

/// `cuCtxGetCurrent`.
pub(crate) fn ctx_get_current() -> Result<sys::CUcontext> {
    let mut cur = std::ptr::null_mut();
    // SAFETY: valid out-pointer; cuCtxGetCurrent only reads thread-local driver state.
    check(unsafe { sys::cuCtxGetCurrent(&mut cur) }, "reading the current context")?;
    Ok(cur)
}

/// `cuCtxSetCurrent`.
///
/// # Safety
/// `ctx` must be a live context (this crate only passes retained primary contexts, which live for
/// the process).
pub(crate) unsafe fn ctx_set_current(ctx: sys::CUcontext) -> Result<()> {
    // SAFETY: the caller guarantees a live context.
    check(unsafe { sys::cuCtxSetCurrent(ctx) }, "binding the device's context")
}

/// `cuMemGetInfo_v2`: `(free, total)` bytes of the current context's device.
///
/// # Safety
/// A context must be current on the calling thread.
pub(crate) unsafe fn mem_get_info() -> Result<(usize, usize)> {
    let (mut free, mut total) = (0, 0);
    // SAFETY: valid out-pointers; the caller made a context current.
    check(unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) }, "reading free memory")?;
    Ok((free, total))
}

/// `cuCtxSynchronize`.
///
/// # Safety
/// A context must be current on the calling thread.
pub(crate) unsafe fn ctx_synchronize() -> Result<()> {
    // SAFETY: the caller made a context current.
    check(unsafe { sys::cuCtxSynchronize() }, "synchronizing the device")
}

/// `cuCtxGetStreamPriorityRange`: `(least, greatest)`.
///
/// # Safety
/// A context must be current on the calling thread.
pub(crate) unsafe fn ctx_get_stream_priority_range() -> Result<(i32, i32)> {
    let (mut least, mut greatest) = (0, 0);
    check(
        // SAFETY: valid out-pointers; the caller made a context current.
        unsafe { sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) },
        "reading the stream priority range",
    )?;
    Ok((least, greatest))
}

/// `cuCtxEnablePeerAccess(peer, 0)`; `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED` counts as success.
///
/// # Safety
/// The context that gains access must be current on the calling thread, and `peer` must be a
/// live context (a retained primary context).
pub(crate) unsafe fn ctx_enable_peer_access(peer: sys::CUcontext) -> Result<()> {
    // SAFETY: the caller made the accessing context current and guarantees `peer` lives; flags
    // must be 0.
    match unsafe { sys::cuCtxEnablePeerAccess(peer, 0) } {
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
        e => Err(crate::error::Error::driver(e, "enabling peer access between two devices")),
    }
}
