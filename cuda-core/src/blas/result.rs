//! A thin result layer over the raw cuBLAS calls this crate makes, in the style of
//! [`crate::driver`]'s `result` layer: one function per `cudarc::cublas::sys` call, which passes
//! the out-parameters, checks the `cublasStatus_t` and returns the value or an
//! [`Error::Library`] (library `cuBLAS`, the status's name) naming what was being done. The safe
//! code of [`crate::blas`] calls only these.
//!
//! Every function except [`library_present`] needs `libcublas` to be loaded, which every caller
//! has established through `blas::load` (a [`crate::blas::Blas`] exists only after it).

use crate::error::{Error, Result};
use cudarc::cublas::sys;
use std::ffi::c_void;

/// cuBLAS's error for `during`.
fn status_error(status: sys::cublasStatus_t, during: &'static str) -> Error {
    Error::Library { library: "cuBLAS", status: format!("{status:?}"), during }
}

/// Turns a `cublasStatus_t` into `Ok(())` or an [`Error::Library`] naming `during`.
fn check(status: sys::cublasStatus_t, during: &'static str) -> Result<()> {
    if status == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(status_error(status, during))
    }
}

/// Whether `libcublas` can be loaded (cudarc's `is_culib_present`).
pub(super) fn library_present() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen the candidate names and closes them again.
    unsafe { sys::is_culib_present() }
}

/// `cublasCreate_v2`.
///
/// # Safety
/// `libcublas` must be loaded, and the context the handle is for must be current on the calling
/// thread (the handle belongs to it).
pub(super) unsafe fn create() -> Result<sys::cublasHandle_t> {
    let mut raw = std::ptr::null_mut();
    // SAFETY: cublasCreate writes a new handle for the current (primary) context into `raw`; the
    // library is loaded (caller).
    check(unsafe { sys::cublasCreate_v2(&mut raw) }, "creating a cuBLAS handle")?;
    Ok(raw)
}

/// `cublasSetStream_v2`.
///
/// # Safety
/// `handle` must be live and used by no other thread during the call; `stream` must be a live
/// stream of the handle's context.
pub(super) unsafe fn set_stream(handle: sys::cublasHandle_t, stream: sys::cudaStream_t) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::cublasSetStream_v2(handle, stream) }, "binding a cuBLAS handle to a stream")
}

/// `cublasSetWorkspace_v2`.
///
/// # Safety
/// `handle` must be live and used by no other thread during the call; `workspace` must be a
/// device allocation of the handle's device of at least `bytes` bytes that nothing else uses while
/// the work the handle queues with it may run.
pub(super) unsafe fn set_workspace(
    handle: sys::cublasHandle_t,
    workspace: *mut c_void,
    bytes: usize,
) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::cublasSetWorkspace_v2(handle, workspace, bytes) }, "setting the cuBLAS workspace")
}

/// `cublasGemmEx`: `C = alpha * op(A) · op(B) + beta * C`, column-major, on the handle's stream.
///
/// # Safety
/// `handle` must be live and used by no other thread during the call, bound to a live stream;
/// `alpha` and `beta` point to scalars of the compute type's scale type that live across the call;
/// `a`, `b` and `c` are device allocations of the handle's device holding the matrices that the
/// dimensions, leading dimensions, operations and data types describe, with `c` aliasing neither
/// input and not used concurrently until the queued product has run.
#[expect(clippy::too_many_arguments, reason = "one argument per parameter of cublasGemmEx")]
pub(super) unsafe fn gemm_ex(
    handle: sys::cublasHandle_t,
    transa: sys::cublasOperation_t,
    transb: sys::cublasOperation_t,
    m: i32,
    n: i32,
    k: i32,
    alpha: *const c_void,
    a: *const c_void,
    a_type: sys::cudaDataType,
    lda: i32,
    b: *const c_void,
    b_type: sys::cudaDataType,
    ldb: i32,
    beta: *const c_void,
    c: *mut c_void,
    c_type: sys::cudaDataType,
    ldc: i32,
    compute_type: sys::cublasComputeType_t,
    algo: sys::cublasGemmAlgo_t,
) -> Result<()> {
    // SAFETY: the caller's contract.
    let status = unsafe {
        sys::cublasGemmEx(
            handle,
            transa,
            transb,
            m,
            n,
            k,
            alpha,
            a,
            a_type,
            lda,
            b,
            b_type,
            ldb,
            beta,
            c,
            c_type,
            ldc,
            compute_type,
            algo,
        )
    };
    check(status, "a cuBLAS GEMM (cublasGemmEx)")
}
