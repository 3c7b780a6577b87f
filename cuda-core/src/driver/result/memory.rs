//! Memory calls: stream-ordered allocation and free, copies, memsets, page-locked host memory and
//! memory pools.

use crate::error::{check, Result};
use cudarc::driver::sys;
use std::ffi::c_void;

/// `cuMemAllocAsync`.
///
/// # Safety
/// `stream` must be live with its context current.
pub(crate) unsafe fn mem_alloc_async(bytes: usize, stream: sys::CUstream) -> Result<sys::CUdeviceptr> {
    let mut ptr = 0;
    check(
        // SAFETY: valid out-pointer, live stream of the bound context (caller).
        unsafe { sys::cuMemAllocAsync(&mut ptr, bytes, stream) },
        "allocating device memory (stream-ordered)",
    )?;
    Ok(ptr)
}

/// `cuMemAllocFromPoolAsync`.
///
/// # Safety
/// `pool` and `stream` must be live, with the stream's context current.
pub(crate) unsafe fn mem_alloc_from_pool_async(
    bytes: usize,
    pool: sys::CUmemoryPool,
    stream: sys::CUstream,
) -> Result<sys::CUdeviceptr> {
    let mut ptr = 0;
    check(
        // SAFETY: valid out-pointer, live pool and stream of the bound context (caller).
        unsafe { sys::cuMemAllocFromPoolAsync(&mut ptr, bytes, pool, stream) },
        "allocating device memory (stream-ordered)",
    )?;
    Ok(ptr)
}

/// `cuMemFreeAsync`.
///
/// # Safety
/// The caller owns `ptr`, allocated stream-ordered on the stream's device, and no work may use it
/// after the work queued on (or joined to) `stream` so far; `stream` must be live.
pub(crate) unsafe fn mem_free_async(ptr: sys::CUdeviceptr, stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller's contract: the free is queued after every use.
    check(unsafe { sys::cuMemFreeAsync(ptr, stream) }, "freeing device memory (stream-ordered)")
}

/// Whether the driver knows the host address `ptr`: page-locked, registered or managed memory, to
/// and from which the driver's async copies are fully asynchronous.
///
/// Asked with `cuPointerGetAttributes` (plural) for `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`: for an
/// address the driver does not know (ordinary pageable memory, which it stages before
/// `cuMemcpyHtoDAsync` returns) it answers `CUDA_SUCCESS` with the type left 0 (CUDA driver API
/// documentation: "the attributes are assigned default NULL values"), where the singular
/// `cuPointerGetAttribute` answers `CUDA_ERROR_INVALID_VALUE`, an API error that
/// compute-sanitizer reports on every pageable copy. `false` only for that answer: any failure
/// counts as known (the caller then waits, which is always safe).
pub(crate) fn host_memory_known_to_driver(ptr: *const c_void) -> bool {
    let mut ty: u32 = 0;
    let mut attr = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    let mut data = [(&mut ty as *mut u32).cast::<c_void>()];
    // SAFETY: one attribute, whose value (`CUmemorytype`, a u32) goes to the live `ty` through
    // `data`; the driver only reads the address `ptr` as a number.
    let r = unsafe { sys::cuPointerGetAttributes(1, &mut attr, data.as_mut_ptr(), ptr as sys::CUdeviceptr) };
    r != sys::CUresult::CUDA_SUCCESS || ty != 0
}

/// `cuMemcpyHtoDAsync_v2`, described as `during`.
///
/// # Safety
/// `src` must be readable for `bytes` bytes until the copy has run (pageable memory: until this
/// returns, the driver stages it), `dst` a live device range of `bytes` bytes, `stream` live with
/// its context current, and the copy ordered against other uses of both ranges.
pub(crate) unsafe fn memcpy_htod_async(
    dst: sys::CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    stream: sys::CUstream,
    during: &'static str,
) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src, bytes, stream) }, during)
}

/// `cuMemcpyDtoHAsync_v2`, described as `during`.
///
/// # Safety
/// `dst` must be writable for `bytes` bytes and not otherwise accessed until the copy has run,
/// `src` a live device range of `bytes` bytes, `stream` live with its context current, and the copy
/// ordered against other uses of `src`.
pub(crate) unsafe fn memcpy_dtoh_async(
    dst: *mut c_void,
    src: sys::CUdeviceptr,
    bytes: usize,
    stream: sys::CUstream,
    during: &'static str,
) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::cuMemcpyDtoHAsync_v2(dst, src, bytes, stream) }, during)
}

/// `cuMemcpyDtoDAsync_v2`.
///
/// # Safety
/// `dst` and `src` must be live, non-overlapping device ranges of `bytes` bytes, `stream` live with
/// its context current, and the copy ordered against other uses of both.
pub(crate) unsafe fn memcpy_dtod_async(
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream) }, "copying device to device")
}

/// `cuMemcpyPeerAsync`.
///
/// # Safety
/// As for [`memcpy_dtod_async`], with each range a live allocation of the device whose (live)
/// context is named, and `stream` a stream of the destination's device.
pub(crate) unsafe fn memcpy_peer_async(
    dst: sys::CUdeviceptr,
    dst_ctx: sys::CUcontext,
    src: sys::CUdeviceptr,
    src_ctx: sys::CUcontext,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<()> {
    check(
        // SAFETY: the caller's contract.
        unsafe { sys::cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, bytes, stream) },
        "copying between devices (cuMemcpyPeerAsync)",
    )
}

/// `cuMemsetD8Async`: `count` bytes, described as `during`.
///
/// # Safety
/// `dst` must be a live device range of `count` bytes, `stream` live with its context current,
/// and the memset ordered against other uses of the range.
pub(crate) unsafe fn memset_d8_async(
    dst: sys::CUdeviceptr,
    value: u8,
    count: usize,
    stream: sys::CUstream,
    during: &'static str,
) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::cuMemsetD8Async(dst, value, count, stream) }, during)
}

/// `cuMemsetD16Async`: `count` 16-bit elements, described as `during`.
///
/// # Safety
/// As for [`memset_d8_async`], for `count` 2-byte elements.
pub(crate) unsafe fn memset_d16_async(
    dst: sys::CUdeviceptr,
    value: u16,
    count: usize,
    stream: sys::CUstream,
    during: &'static str,
) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::cuMemsetD16Async(dst, value, count, stream) }, during)
}

/// `cuMemsetD32Async`: `count` 32-bit elements, described as `during`.
///
/// # Safety
/// As for [`memset_d8_async`], for `count` 4-byte elements.
pub(crate) unsafe fn memset_d32_async(
    dst: sys::CUdeviceptr,
    value: u32,
    count: usize,
    stream: sys::CUstream,
    during: &'static str,
) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::cuMemsetD32Async(dst, value, count, stream) }, during)
}

/// `cuMemsetD2D32Async`: `height` rows of `width` 32-bit elements, rows `pitch` bytes apart,
/// described as `during`.
///
/// # Safety
/// As for [`memset_d8_async`], for every element written (inside one live device range).
pub(crate) unsafe fn memset_d2d32_async(
    dst: sys::CUdeviceptr,
    pitch: usize,
    value: u32,
    width: usize,
    height: usize,
    stream: sys::CUstream,
    during: &'static str,
) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::cuMemsetD2D32Async(dst, pitch, value, width, height, stream) }, during)
}

/// `cuMemHostAlloc`: `bytes` of page-locked host memory, described as `during`.
///
/// # Safety
/// A context must be current on the calling thread.
pub(crate) unsafe fn mem_host_alloc(bytes: usize, flags: u32, during: &'static str) -> Result<*mut c_void> {
    let mut ptr = std::ptr::null_mut();
    // SAFETY: valid out-pointer; context bound (caller).
    check(unsafe { sys::cuMemHostAlloc(&mut ptr, bytes, flags) }, during)?;
    Ok(ptr)
}

/// `cuMemFreeHost`, described as `during`.
///
/// # Safety
/// `ptr` must have been allocated by `cuMemHostAlloc`, and no queued transfer may still use it.
pub(crate) unsafe fn mem_free_host(ptr: *mut c_void, during: &'static str) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::cuMemFreeHost(ptr) }, during)
}

/// `cuMemHostGetDevicePointer_v2`: the device address of mapped page-locked memory.
///
/// # Safety
/// `host` must come from `cuMemHostAlloc` with `CU_MEMHOSTALLOC_DEVICEMAP`; a context current.
pub(crate) unsafe fn mem_host_get_device_pointer(host: *mut c_void) -> Result<sys::CUdeviceptr> {
    let mut dptr = 0;
    check(
        // SAFETY: valid out-pointer; mapped allocation and bound context (caller).
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dptr, host, 0) },
        "mapping page-locked memory into the device",
    )?;
    Ok(dptr)
}

/// `cuMemPoolCreate`.
pub(crate) fn mem_pool_create(props: &sys::CUmemPoolProps) -> Result<sys::CUmemoryPool> {
    let mut raw = std::ptr::null_mut();
    // SAFETY: valid props (a reference) and out-pointer.
    check(unsafe { sys::cuMemPoolCreate(&mut raw, props) }, "creating a memory pool")?;
    Ok(raw)
}

/// `cuMemPoolDestroy`. The driver defers the release while frees are still pending.
///
/// # Safety
/// The caller created `pool` and nothing uses it afterwards.
pub(crate) unsafe fn mem_pool_destroy(pool: sys::CUmemoryPool) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::cuMemPoolDestroy(pool) }, "destroying a memory pool")
}

/// `cuDeviceGetDefaultMemPool`.
pub(crate) fn device_get_default_mem_pool(dev: sys::CUdevice) -> Result<sys::CUmemoryPool> {
    let mut raw = std::ptr::null_mut();
    check(
        // SAFETY: valid out-pointer and device.
        unsafe { sys::cuDeviceGetDefaultMemPool(&mut raw, dev) },
        "getting the default memory pool",
    )?;
    Ok(raw)
}

/// `cuMemPoolSetAttribute` for an attribute that takes a `cuuint64_t`, described as `during`.
///
/// # Safety
/// `pool` must be live and `attr` an attribute of type `cuuint64_t`.
pub(crate) unsafe fn mem_pool_set_attribute_u64(
    pool: sys::CUmemoryPool,
    attr: sys::CUmemPool_attribute,
    value: u64,
    during: &'static str,
) -> Result<()> {
    let mut v = value;
    // SAFETY: these attributes take a cuuint64_t; we pass a pointer to one.
    check(unsafe { sys::cuMemPoolSetAttribute(pool, attr, (&mut v as *mut u64).cast()) }, during)
}

/// `cuMemPoolGetAttribute` for an attribute of type `cuuint64_t`.
///
/// # Safety
/// `pool` must be live and `attr` an attribute of type `cuuint64_t`.
pub(crate) unsafe fn mem_pool_get_attribute_u64(
    pool: sys::CUmemoryPool,
    attr: sys::CUmemPool_attribute,
) -> Result<u64> {
    let mut v = 0u64;
    check(
        // SAFETY: these attributes are cuuint64_t; valid out-pointer.
        unsafe { sys::cuMemPoolGetAttribute(pool, attr, (&mut v as *mut u64).cast()) },
        "reading a memory pool attribute",
    )?;
    Ok(v)
}

/// `cuMemPoolTrimTo`.
///
/// # Safety
/// `pool` must be live.
pub(crate) unsafe fn mem_pool_trim_to(pool: sys::CUmemoryPool, keep_bytes: usize) -> Result<()> {
    // SAFETY: live pool (caller).
    check(unsafe { sys::cuMemPoolTrimTo(pool, keep_bytes) }, "trimming a memory pool")
}
