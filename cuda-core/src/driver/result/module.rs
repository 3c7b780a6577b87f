//! Module, function and kernel-launch calls.

use crate::error::{check, Result};
use cudarc::driver::sys;
use std::ffi::{c_void, CStr};

/// `cuModuleLoadData`.
///
/// # Safety
/// `image` must be a NUL-terminated PTX string or a binary image (aligned as the driver reads its
/// headers) that lives across the call; a context must be current (the module belongs to it).
pub(crate) unsafe fn module_load_data(image: *const c_void) -> Result<sys::CUmodule> {
    let mut raw = std::ptr::null_mut();
    // SAFETY: the caller's contract; the driver copies what it needs.
    check(unsafe { sys::cuModuleLoadData(&mut raw, image) }, "loading a module")?;
    Ok(raw)
}

/// `cuModuleUnload`.
///
/// # Safety
/// The caller owns `module`; no launch from it may be queued or running, and no function handle
/// from it is used afterwards.
pub(crate) unsafe fn module_unload(module: sys::CUmodule) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::cuModuleUnload(module) }, "unloading a module")
}

/// `cuModuleGetFunction`.
///
/// # Safety
/// `module` must be live.
pub(crate) unsafe fn module_get_function(module: sys::CUmodule, name: &CStr) -> Result<sys::CUfunction> {
    let mut raw = std::ptr::null_mut();
    check(
        // SAFETY: live module (caller); NUL-terminated name; valid out-pointer.
        unsafe { sys::cuModuleGetFunction(&mut raw, module, name.as_ptr()) },
        "looking up a kernel in a module",
    )?;
    Ok(raw)
}

/// `cuFuncGetAttribute`.
///
/// # Safety
/// `func` must be live.
pub(crate) unsafe fn func_get_attribute(
    attr: sys::CUfunction_attribute,
    func: sys::CUfunction,
) -> Result<i32> {
    let mut v = 0;
    // SAFETY: valid out-pointer and live function (caller).
    check(unsafe { sys::cuFuncGetAttribute(&mut v, attr, func) }, "reading a kernel attribute")?;
    Ok(v)
}

/// `cuLaunchKernel` (no `extra` array).
///
/// # Safety
/// `func` and `stream` must be live, with the context current; `params` holds one valid pointer
/// per kernel parameter, matching the kernel's signature; the kernel must stay within memory that
/// is allocated and not used concurrently until it has run.
pub(crate) unsafe fn launch_kernel(
    func: sys::CUfunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_mem_bytes: u32,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<()> {
    // SAFETY: the caller's contract.
    let res = unsafe {
        sys::cuLaunchKernel(
            func,
            grid.0,
            grid.1,
            grid.2,
            block.0,
            block.1,
            block.2,
            shared_mem_bytes,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    check(res, "launching a kernel")
}

/// `cuLaunchKernelEx` (no `extra` array), for a programmatic dependent launch.
///
/// # Safety
/// As for [`launch_kernel`], with `config` (and the attributes it points to) valid across the call
/// and the kernel's contract for the attributes upheld (with programmatic stream serialization,
/// the kernel waits for the earlier grid before touching memory).
pub(crate) unsafe fn launch_kernel_ex(
    config: &sys::CUlaunchConfig,
    func: sys::CUfunction,
    params: &mut [*mut c_void],
) -> Result<()> {
    // SAFETY: the caller's contract.
    let res = unsafe { sys::cuLaunchKernelEx(config, func, params.as_mut_ptr(), std::ptr::null_mut()) };
    check(res, "launching a kernel (programmatic dependent launch)")
}
