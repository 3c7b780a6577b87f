//! Stream, event and stream-capture calls.

use crate::error::{check, Error, Result};
use cudarc::driver::sys;

/// `cuStreamCreateWithPriority`.
///
/// # Safety
/// A context must be current on the calling thread (the stream belongs to it).
pub(crate) unsafe fn stream_create_with_priority(flags: u32, priority: i32) -> Result<sys::CUstream> {
    let mut raw = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the caller made a context current.
    check(unsafe { sys::cuStreamCreateWithPriority(&mut raw, flags, priority) }, "creating a stream")?;
    Ok(raw)
}

/// `cuStreamDestroy_v2`. The driver releases the stream once its queued work has finished.
///
/// # Safety
/// The caller owns `stream` and nothing uses it afterwards.
pub(crate) unsafe fn stream_destroy(stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller owns the handle and drops every use of it.
    check(unsafe { sys::cuStreamDestroy_v2(stream) }, "destroying a stream")
}

/// `cuStreamSynchronize`.
///
/// # Safety
/// `stream` must be live, with its context current.
pub(crate) unsafe fn stream_synchronize(stream: sys::CUstream) -> Result<()> {
    // SAFETY: live stream handle; context bound (caller).
    check(unsafe { sys::cuStreamSynchronize(stream) }, "synchronizing a stream")
}

/// `cuStreamQuery`: `true` if all queued work has finished, `false` if some is still running.
///
/// # Safety
/// `stream` must be live, with its context current.
pub(crate) unsafe fn stream_query(stream: sys::CUstream) -> Result<bool> {
    // SAFETY: live stream handle; context bound (caller).
    match unsafe { sys::cuStreamQuery(stream) } {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        e => Err(Error::driver(e, "querying a stream")),
    }
}

/// `cuStreamWaitEvent(stream, event, 0)`, described as `during`.
///
/// # Safety
/// `stream` and `event` must be live handles of the current context (or of contexts the driver
/// lets wait on each other).
pub(crate) unsafe fn stream_wait_event(
    stream: sys::CUstream,
    event: sys::CUevent,
    during: &'static str,
) -> Result<()> {
    // SAFETY: live stream and event handles (caller); flags must be 0.
    check(unsafe { sys::cuStreamWaitEvent(stream, event, 0) }, during)
}

/// `cuStreamBeginCapture_v2`.
///
/// # Safety
/// `stream` must be live with its context current.
pub(crate) unsafe fn stream_begin_capture(
    stream: sys::CUstream,
    mode: sys::CUstreamCaptureMode,
) -> Result<()> {
    // SAFETY: live stream; context bound (caller).
    check(unsafe { sys::cuStreamBeginCapture_v2(stream, mode) }, "beginning stream capture")
}

/// `cuStreamEndCapture`, raw: the code (callers tell an invalidated capture from other failures,
/// and whether the driver is still capturing) and the graph, which the driver may hand back
/// (owned by the caller) even with an error.
///
/// # Safety
/// `stream` must be live.
pub(crate) unsafe fn stream_end_capture(stream: sys::CUstream) -> (sys::CUresult, sys::CUgraph) {
    let mut graph = std::ptr::null_mut();
    // SAFETY: live stream; valid out-pointer.
    let res = unsafe { sys::cuStreamEndCapture(stream, &mut graph) };
    (res, graph)
}

/// `cuStreamIsCapturing`.
///
/// # Safety
/// `stream` must be live.
pub(crate) unsafe fn stream_is_capturing(stream: sys::CUstream) -> Result<sys::CUstreamCaptureStatus> {
    let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: live stream; valid out-pointer.
    check(unsafe { sys::cuStreamIsCapturing(stream, &mut st) }, "querying capture status")?;
    Ok(st)
}

/// `cuStreamGetCaptureInfo_v3`, reading the capture status and the current frontier of
/// dependencies: `(status, nodes, count)`. The node array belongs to the driver and is valid until
/// the next driver call on `stream`.
///
/// # Safety
/// `stream` must be live.
pub(crate) unsafe fn stream_get_capture_frontier(
    stream: sys::CUstream,
) -> Result<(sys::CUstreamCaptureStatus, *const sys::CUgraphNode, usize)> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let (mut deps, mut n): (*const sys::CUgraphNode, usize) = (std::ptr::null(), 0);
    check(
        // SAFETY: live stream; valid out-pointers; unneeded outputs are null.
        unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                stream,
                &mut status,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut deps,
                std::ptr::null_mut(),
                &mut n,
            )
        },
        "reading capture info",
    )?;
    Ok((status, deps, n))
}

/// `cuStreamWriteValue64_v2` with the default flags (ordered after the stream's earlier work,
/// with a system-scope memory fence before the write).
///
/// # Safety
/// `stream` must be live with its context current; `addr` an 8-byte aligned device address of
/// memory that outlives the write.
pub(crate) unsafe fn stream_write_value64(
    stream: sys::CUstream,
    addr: sys::CUdeviceptr,
    value: u64,
) -> Result<()> {
    let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
    check(
        // SAFETY: the caller's contract.
        unsafe { sys::cuStreamWriteValue64_v2(stream, addr, value, flags) },
        "marking stream progress",
    )
}

/// `cuEventCreate`.
///
/// # Safety
/// A context must be current on the calling thread (the event belongs to it).
pub(crate) unsafe fn event_create(flags: u32) -> Result<sys::CUevent> {
    let mut raw = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the caller made a context current.
    check(unsafe { sys::cuEventCreate(&mut raw, flags) }, "creating an event")?;
    Ok(raw)
}

/// `cuEventDestroy_v2`. The driver defers the release of a pending event.
///
/// # Safety
/// The caller owns `event` and nothing uses it afterwards.
pub(crate) unsafe fn event_destroy(event: sys::CUevent) -> Result<()> {
    // SAFETY: the caller owns the handle and drops every use of it.
    check(unsafe { sys::cuEventDestroy_v2(event) }, "destroying an event")
}

/// `cuEventRecord`.
///
/// # Safety
/// `event` and `stream` must be live handles of the same context.
pub(crate) unsafe fn event_record(event: sys::CUevent, stream: sys::CUstream) -> Result<()> {
    // SAFETY: live event and stream of the same context (caller).
    check(unsafe { sys::cuEventRecord(event, stream) }, "recording an event")
}

/// `cuEventQuery`: `true` once the recorded work has completed.
///
/// # Safety
/// `event` must be live.
pub(crate) unsafe fn event_query(event: sys::CUevent) -> Result<bool> {
    // SAFETY: live event (caller).
    match unsafe { sys::cuEventQuery(event) } {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        e => Err(Error::driver(e, "querying an event")),
    }
}

/// `cuEventSynchronize`.
///
/// # Safety
/// `event` must be live.
pub(crate) unsafe fn event_synchronize(event: sys::CUevent) -> Result<()> {
    // SAFETY: live event (caller).
    check(unsafe { sys::cuEventSynchronize(event) }, "synchronizing an event")
}

/// `cuEventElapsedTime_v2`, in milliseconds.
///
/// # Safety
/// `start` and `end` must be live events.
pub(crate) unsafe fn event_elapsed_time(start: sys::CUevent, end: sys::CUevent) -> Result<f32> {
    let mut ms = 0.0f32;
    check(
        // SAFETY: live events (caller); valid out-pointer.
        unsafe { sys::cuEventElapsedTime_v2(&mut ms, start, end) },
        "reading elapsed time between events",
    )?;
    Ok(ms)
}
