//! Raw NVRTC compilation: CUDA C source to a CUBIN image for one architecture.

use super::result::{self, Compiled};
use crate::error::{Error, Result};
use cudarc::nvrtc::sys;
use std::ffi::{c_char, CString};
use std::sync::OnceLock;

/// Loads NVRTC once; a missing library is [`Error::NvrtcMissing`], never a panic.
pub(crate) fn nvrtc_loaded() -> Result<()> {
    static LOADED: OnceLock<bool> = OnceLock::new();
    if *LOADED.get_or_init(result::library_present) {
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
    // SAFETY: the library is loaded.
    unsafe { result::version() }
}

struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram and destroyed only here. An error cannot be
        // returned from a drop and is ignored.
        let _ = unsafe { result::destroy_program(&mut self.0) };
    }
}

impl Program {
    fn read(
        &self,
        size: unsafe fn(sys::nvrtcProgram) -> Result<usize>,
        get: unsafe fn(sys::nvrtcProgram, &mut [u8]) -> Result<()>,
    ) -> Result<Vec<u8>> {
        // SAFETY: live program.
        let n = unsafe { size(self.0) }?;
        let mut out = vec![0u8; n];
        // SAFETY: live program; `out` has exactly the size NVRTC reported.
        unsafe { get(self.0, &mut out) }?;
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

    // SAFETY: the library is loaded; the program is owned by `prog`, which destroys it once.
    let prog = Program(unsafe { result::create_program(&src, &name) }?);
    // SAFETY: live program; `opt_ptrs` points to NUL-terminated strings that outlive the call.
    if unsafe { result::compile_program(prog.0, &opt_ptrs) }? == Compiled::CompileError {
        let log = prog.read(result::program_log_size, result::program_log)?;
        let log = String::from_utf8_lossy(&log).trim_end_matches('\0').trim_end().to_string();
        return Err(Error::Compile { program: program.to_string(), log });
    }
    prog.read(result::cubin_size, result::cubin)
}
