//! A thin result layer over the raw NVRTC calls this crate makes, in the style of
//! [`crate::driver`]'s `result` layer: one function per `cudarc::nvrtc::sys` call, which passes
//! the out-parameters, checks the `nvrtcResult` and returns the value or an [`Error::Nvrtc`]
//! (NVRTC's error string) naming what was being done. The safe code of [`crate::nvrtc`] calls
//! only these.
//!
//! Every function except [`library_present`] needs `libnvrtc` to be loaded, which every caller
//! has established through `compile::nvrtc_loaded`.

use crate::error::{Error, Result};
use cudarc::nvrtc::sys;
use std::ffi::{c_char, CStr};

/// Turns an `nvrtcResult` into `Ok(())` or an [`Error::Nvrtc`] naming `during`.
fn check(res: sys::nvrtcResult, during: &'static str) -> Result<()> {
    if res == sys::nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string for any code.
    let p = unsafe { sys::nvrtcGetErrorString(res) };
    let name = if p.is_null() {
        format!("{res:?}")
    } else {
        // SAFETY: non-null static C string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    };
    Err(Error::Nvrtc { name, during })
}

/// Whether `libnvrtc` can be loaded (cudarc's `is_culib_present`).
pub(super) fn library_present() -> bool {
    // SAFETY: only tries to dlopen candidate names.
    unsafe { sys::is_culib_present() }
}

/// `nvrtcVersion`, as `(major, minor)`.
///
/// # Safety
/// `libnvrtc` must be loaded.
pub(super) unsafe fn version() -> Result<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: valid out-pointers; the library is loaded (caller).
    check(unsafe { sys::nvrtcVersion(&mut major, &mut minor) }, "reading the NVRTC version")?;
    Ok((major, minor))
}

/// `nvrtcCreateProgram` with no headers.
///
/// # Safety
/// `libnvrtc` must be loaded. The caller owns the returned program and destroys it once
/// ([`destroy_program`]).
pub(super) unsafe fn create_program(source: &CStr, name: &CStr) -> Result<sys::nvrtcProgram> {
    let mut raw = std::ptr::null_mut();
    check(
        // SAFETY: NUL-terminated source and name that outlive the call; no headers; the library
        // is loaded (caller).
        unsafe {
            sys::nvrtcCreateProgram(
                &mut raw,
                source.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        },
        "creating an NVRTC program",
    )?;
    Ok(raw)
}

/// `nvrtcDestroyProgram`.
///
/// # Safety
/// `prog` must have come from [`create_program`] and not been destroyed; it is not used
/// afterwards.
pub(super) unsafe fn destroy_program(prog: &mut sys::nvrtcProgram) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::nvrtcDestroyProgram(prog) }, "destroying an NVRTC program")
}

/// What [`compile_program`] reports besides other NVRTC errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Compiled {
    /// The program compiled.
    Yes,
    /// `NVRTC_ERROR_COMPILATION`: the source did not compile; the program log says why.
    CompileError,
}

/// `nvrtcCompileProgram`. A compile error of the source is `Ok(Compiled::CompileError)`, every
/// other failure an [`Error::Nvrtc`].
///
/// # Safety
/// `prog` must be live; every pointer of `options` must point to a NUL-terminated string that
/// lives across the call.
pub(super) unsafe fn compile_program(prog: sys::nvrtcProgram, options: &[*const c_char]) -> Result<Compiled> {
    // More options than an `int` counts would be truncated (and the rest silently dropped).
    let n = i32::try_from(options.len())
        .map_err(|_| Error::InvalidArgument(format!("{} NVRTC options", options.len())))?;
    // SAFETY: the caller's contract; `n` is the length of `options`.
    let res = unsafe { sys::nvrtcCompileProgram(prog, n, options.as_ptr()) };
    if res == sys::nvrtcResult::NVRTC_ERROR_COMPILATION {
        return Ok(Compiled::CompileError);
    }
    check(res, "compiling CUDA C")?;
    Ok(Compiled::Yes)
}

/// `nvrtcGetProgramLogSize`: bytes of the log, its NUL included.
///
/// # Safety
/// `prog` must be live.
pub(super) unsafe fn program_log_size(prog: sys::nvrtcProgram) -> Result<usize> {
    let mut n = 0usize;
    // SAFETY: live program (caller); valid out-pointer.
    check(unsafe { sys::nvrtcGetProgramLogSize(prog, &mut n) }, "reading the NVRTC log")?;
    Ok(n)
}

/// `nvrtcGetProgramLog` into `out`.
///
/// # Safety
/// `prog` must be live, and `out` at least as long as [`program_log_size`] reported.
pub(super) unsafe fn program_log(prog: sys::nvrtcProgram, out: &mut [u8]) -> Result<()> {
    // SAFETY: the caller's contract: `out` has room for the whole log.
    check(unsafe { sys::nvrtcGetProgramLog(prog, out.as_mut_ptr().cast()) }, "reading the NVRTC log")
}

/// `nvrtcGetCUBINSize`.
///
/// # Safety
/// `prog` must be live.
pub(super) unsafe fn cubin_size(prog: sys::nvrtcProgram) -> Result<usize> {
    let mut n = 0usize;
    // SAFETY: live program (caller); valid out-pointer.
    check(unsafe { sys::nvrtcGetCUBINSize(prog, &mut n) }, "reading the compiled CUBIN")?;
    Ok(n)
}

/// `nvrtcGetCUBIN` into `out`.
///
/// # Safety
/// `prog` must be live, and `out` at least as long as [`cubin_size`] reported.
pub(super) unsafe fn cubin(prog: sys::nvrtcProgram, out: &mut [u8]) -> Result<()> {
    // SAFETY: the caller's contract: `out` has room for the whole CUBIN.
    check(unsafe { sys::nvrtcGetCUBIN(prog, out.as_mut_ptr().cast()) }, "reading the compiled CUBIN")
}
