//! Raw NVRTC compilation: CUDA C source to a CUBIN image for one architecture.

use crate::error::{Error, Result};
use cudarc::nvrtc::sys;
use std::ffi::{c_char, CStr, CString};
use std::sync::OnceLock;

fn nvrtc_check(res: sys::nvrtcResult, during: &'static str) -> Result<()> {
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

/// Loads NVRTC once; a missing library is [`Error::NvrtcMissing`], never a panic.
pub(crate) fn nvrtc_loaded() -> Result<()> {
    static LOADED: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen candidate names.
    if *LOADED.get_or_init(|| unsafe { sys::is_culib_present() }) {
        Ok(())
    } else {
        Err(Error::NvrtcMissing {
            library: "libnvrtc.so",
            searched: cudarc::get_lib_name_candidates("nvrtc").join(", "),
        })
    }
}

/// NVRTC's version as `(major, minor)`.
///
/// # Errors
/// [`Error::NvrtcMissing`] without `libnvrtc.so`; NVRTC errors.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    nvrtc_loaded()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: valid out-pointers; the library is loaded.
    nvrtc_check(unsafe { sys::nvrtcVersion(&mut major, &mut minor) }, "reading the NVRTC version")?;
    Ok((major, minor))
}

struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram and destroyed only here.
        unsafe { sys::nvrtcDestroyProgram(&mut self.0) };
    }
}

impl Program {
    fn read(
        &self,
        size: unsafe fn(sys::nvrtcProgram, *mut usize) -> sys::nvrtcResult,
        get: unsafe fn(sys::nvrtcProgram, *mut c_char) -> sys::nvrtcResult,
        during: &'static str,
    ) -> Result<Vec<u8>> {
        let mut n = 0usize;
        // SAFETY: live program; valid out-pointer.
        nvrtc_check(unsafe { size(self.0, &mut n) }, during)?;
        let mut out = vec![0u8; n];
        // SAFETY: `out` has exactly the size NVRTC reported.
        nvrtc_check(unsafe { get(self.0, out.as_mut_ptr().cast()) }, during)?;
        Ok(out)
    }
}

/// Compiles `source` (named `program` in diagnostics) to a CUBIN for `arch` (e.g. `sm_90`) with
/// extra NVRTC `options`. A compile error is [`Error::Compile`] carrying NVRTC's log.
///
/// ```no_run
/// # fn main() -> cuda_core::Result<()> {
/// use cuda_core::{nvrtc::compile_cubin, Error};
/// let src = r#"extern "C" __global__ void k(int* x) { *x = 1; }"#;
/// let cubin = compile_cubin("k.cu", src, "sm_90", &[])?; // needs libnvrtc, not a GPU
/// assert!(!cubin.is_empty());
/// match compile_cubin("bad.cu", "this is not CUDA", "sm_90", &[]) {
///     Err(Error::Compile { log, .. }) => assert!(log.contains("error")),
///     other => panic!("expected a compile error, got {other:?}"),
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::NvrtcMissing`]; [`Error::Compile`] with NVRTC's log; [`Error::InvalidArgument`] for a
/// source or name with a NUL byte; NVRTC errors.
pub fn compile_cubin(program: &str, source: &str, arch: &str, options: &[String]) -> Result<Vec<u8>> {
    nvrtc_loaded()?;
    let bad = |what: &str| Error::InvalidArgument(format!("{what} contains a NUL byte"));
    let src = CString::new(source).map_err(|_| bad("CUDA source"))?;
    let name = CString::new(program).map_err(|_| bad("program name"))?;
    let mut opts = vec![CString::new(format!("--gpu-architecture={arch}")).map_err(|_| bad("arch"))?];
    for o in options {
        opts.push(CString::new(o.as_str()).map_err(|_| bad("an NVRTC option"))?);
    }
    let opt_ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();

    let mut raw = std::ptr::null_mut();
    nvrtc_check(
        // SAFETY: NUL-terminated source and name that outlive the call; no headers.
        unsafe {
            sys::nvrtcCreateProgram(
                &mut raw,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        },
        "creating an NVRTC program",
    )?;
    let prog = Program(raw);
    // SAFETY: live program; `opt_ptrs` points to NUL-terminated strings that outlive the call.
    let res = unsafe { sys::nvrtcCompileProgram(prog.0, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
    if res == sys::nvrtcResult::NVRTC_ERROR_COMPILATION {
        let log = prog.read(sys::nvrtcGetProgramLogSize, sys::nvrtcGetProgramLog, "reading the NVRTC log")?;
        let log = String::from_utf8_lossy(&log).trim_end_matches('\0').trim_end().to_string();
        return Err(Error::Compile { program: program.to_string(), log });
    }
    nvrtc_check(res, "compiling CUDA C")?;
    prog.read(sys::nvrtcGetCUBINSize, sys::nvrtcGetCUBIN, "reading the compiled CUBIN")
}
