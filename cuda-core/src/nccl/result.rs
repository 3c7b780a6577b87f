//! A thin result layer over the raw NCCL calls this crate makes, in the style of
//! [`crate::driver`]'s `result` layer: one function per `cudarc::nccl::sys` call, which passes
//! the out-parameters, checks the `ncclResult_t` and returns the value or an [`Error::Library`]
//! (library `NCCL`, the status's name) naming what was being done. The safe code of
//! [`crate::nccl`] calls only these.
//!
//! - A function takes a `during` argument where callers describe the call differently; otherwise
//!   the description is fixed here.
//! - Every call forgets this thread's device binding afterwards (a call into NCCL may have
//!   switched the thread's current device through the CUDA runtime), failed or not.
//! - Every function except [`library_present`] needs `libnccl` to be loaded, which every caller
//!   has established through `nccl::library` (a communicator exists only after it).
//! - Functions for drop paths return `Result<()>` like the others; the callers ignore it, as the
//!   raw status used to be ignored.

use crate::error::{Error, Result};
use cudarc::nccl::sys;
use std::ffi::c_void;

/// NCCL's error for `during`.
fn status_error(status: sys::ncclResult_t, during: &'static str) -> Error {
    Error::Library { library: "NCCL", status: format!("{status:?}"), during }
}

/// Turns an `ncclResult_t` into `Ok(())` or an [`Error::Library`] naming `during`.
fn check(status: sys::ncclResult_t, during: &'static str) -> Result<()> {
    match status {
        sys::ncclResult_t::ncclSuccess => Ok(()),
        s => Err(status_error(s, during)),
    }
}

/// Whether `libnccl` can be loaded (cudarc's `is_culib_present`).
pub(super) fn library_present() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen the candidate names and closes them again.
    unsafe { sys::is_culib_present() }
}

/// `ncclGetVersion`: the raw version code.
///
/// # Safety
/// `libnccl` must be loaded.
pub(super) unsafe fn get_version() -> Result<i32> {
    let mut v = 0;
    // SAFETY: the library is present (caller); valid out-pointer.
    check(unsafe { sys::ncclGetVersion(&mut v) }, "reading the NCCL version")?;
    Ok(v)
}

/// `ncclCommInitAll`: one communicator per device of `devlist`, written to `comms`.
///
/// # Safety
/// `libnccl` must be loaded; `comms` and `devlist` hold `ndev` entries each, and `devlist` holds
/// valid, distinct device ordinals (of opened devices, whose primary contexts NCCL's runtime calls
/// will use). The caller owns the communicators written and finalizes and destroys them once.
pub(super) unsafe fn comm_init_all(comms: &mut [sys::ncclComm_t], ndev: i32, devlist: &[i32]) -> Result<()> {
    // SAFETY: the caller's contract.
    let res = unsafe { sys::ncclCommInitAll(comms.as_mut_ptr(), ndev, devlist.as_ptr()) };
    check(res, "creating NCCL communicators (ncclCommInitAll)")
}

/// `ncclGroupStart`.
///
/// # Safety
/// `libnccl` must be loaded; the caller ends the group ([`group_end`]) on this thread.
pub(super) unsafe fn group_start() -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::ncclGroupStart() }, "starting an NCCL group")
}

/// `ncclGroupEnd`: issues the calls queued since [`group_start`].
///
/// # Safety
/// A group started on this thread must be open, and every call queued in it must still satisfy
/// its own contract (its communicator, stream and buffers live).
pub(super) unsafe fn group_end() -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::ncclGroupEnd() }, "ending an NCCL group (launching its collectives)")
}

/// `ncclCommFinalize`: waits for the communicator's queued work (possibly inside a group).
///
/// # Safety
/// `comm` must be live and used by no other thread during the call, and by nothing but
/// [`comm_destroy`] afterwards.
pub(super) unsafe fn comm_finalize(comm: sys::ncclComm_t) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::ncclCommFinalize(comm) }, "finalizing an NCCL communicator")
}

/// `ncclCommDestroy`.
///
/// # Safety
/// `comm` must be live, owned by the caller and not used afterwards.
pub(super) unsafe fn comm_destroy(comm: sys::ncclComm_t) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::ncclCommDestroy(comm) }, "destroying an NCCL communicator")
}

/// `ncclAllReduce`.
///
/// # Safety
/// `comm` is a live communicator, used by no other thread during the call, of the device whose
/// stream `stream` is; `send` and `recv` are device allocations of that device holding `count`
/// elements of `dtype`, `recv` not aliasing `send` and neither used concurrently until the queued
/// collective has run.
#[expect(clippy::too_many_arguments, reason = "ncclAllReduce's parameters and a description")]
pub(super) unsafe fn all_reduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: sys::ncclDataType_t,
    op: sys::ncclRedOp_t,
    comm: sys::ncclComm_t,
    stream: sys::cudaStream_t,
    during: &'static str,
) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::ncclAllReduce(send, recv, count, dtype, op, comm, stream) }, during)
}

/// `ncclAllGather`.
///
/// # Safety
/// As for [`all_reduce`], with `send` holding `count` elements and `recv` `count` times the
/// communicator's size.
pub(super) unsafe fn all_gather(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: sys::ncclDataType_t,
    comm: sys::ncclComm_t,
    stream: sys::cudaStream_t,
    during: &'static str,
) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::ncclAllGather(send, recv, count, dtype, comm, stream) }, during)
}

/// `ncclReduceScatter`.
///
/// # Safety
/// As for [`all_reduce`], with `recv` holding `count` elements and `send` `count` times the
/// communicator's size.
#[expect(clippy::too_many_arguments, reason = "ncclReduceScatter's parameters and a description")]
pub(super) unsafe fn reduce_scatter(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: sys::ncclDataType_t,
    op: sys::ncclRedOp_t,
    comm: sys::ncclComm_t,
    stream: sys::cudaStream_t,
    during: &'static str,
) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::ncclReduceScatter(send, recv, count, dtype, op, comm, stream) }, during)
}

/// `ncclBroadcast`.
///
/// # Safety
/// As for [`all_reduce`], with `root` a rank of the communicator's group.
#[expect(clippy::too_many_arguments, reason = "ncclBroadcast's parameters and a description")]
pub(super) unsafe fn broadcast(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: sys::ncclDataType_t,
    root: i32,
    comm: sys::ncclComm_t,
    stream: sys::cudaStream_t,
    during: &'static str,
) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::ncclBroadcast(send, recv, count, dtype, root, comm, stream) }, during)
}
