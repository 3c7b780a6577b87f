//! Raw CUDA graph handles: stream capture, graphs, executable graphs.
//!
//! These are owned handles that clean up on drop. They know nothing of the memory a graph's nodes
//! use, so launching an executable graph is `unsafe` here; the `cuda-async` crate builds the safe
//! layer (graphs that own or keep alive everything they touch).

use crate::device::Device;
use crate::error::{check, Error, Result};
use crate::stream::Stream;
use cudarc::driver::sys;

/// How a stream capture interacts with other threads' CUDA calls (`CUstreamCaptureMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureMode {
    /// Potentially unsafe calls (e.g. synchronous allocation) from any thread fail while this
    /// capture is active. The safest mode.
    Global,
    /// Only the capturing thread's potentially unsafe calls fail.
    ThreadLocal,
    /// No calls are prohibited; the caller takes care.
    Relaxed,
}

impl CaptureMode {
    fn raw(self) -> sys::CUstreamCaptureMode {
        use sys::CUstreamCaptureMode::*;
        match self {
            CaptureMode::Global => CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

/// Whether a stream is capturing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureStatus {
    /// Not capturing.
    None,
    /// Capturing.
    Active,
    /// Capturing, but an illegal operation invalidated the capture; it must be ended.
    Invalidated,
}

/// Flags for [`Graph::instantiate`] (`CUgraphInstantiate_flags`), combinable with `|`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InstantiateFlags(pub u64);

impl InstantiateFlags {
    /// No flags.
    pub const NONE: Self = Self(0);
    /// Free graph-allocated memory that is still unfreed when the graph is launched again.
    pub const AUTO_FREE_ON_LAUNCH: Self = Self(1);
    /// Upload the graph to the device as part of instantiation (needs an upload stream).
    pub const UPLOAD: Self = Self(2);
    /// Allow launching the graph from the device.
    pub const DEVICE_LAUNCH: Self = Self(4);
    /// Use the per-node priorities instead of the launch stream's.
    pub const USE_NODE_PRIORITY: Self = Self(8);
}

impl std::ops::BitOr for InstantiateFlags {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

impl Stream {
    /// Starts capturing the work queued on this stream into a graph instead of running it.
    pub fn begin_capture(&self, mode: CaptureMode) -> Result<()> {
        self.device().bind()?;
        // SAFETY: live stream.
        check(unsafe { sys::cuStreamBeginCapture_v2(self.raw(), mode.raw()) }, "beginning stream capture")
    }

    /// Ends the capture and returns the captured graph. If the capture was invalidated, the error
    /// says so (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`) and the stream is back to normal.
    pub fn end_capture(&self) -> Result<Graph> {
        self.device().bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: live stream; valid out-pointer.
        let res = unsafe { sys::cuStreamEndCapture(self.raw(), &mut raw) };
        if res != sys::CUresult::CUDA_SUCCESS {
            if !raw.is_null() {
                // SAFETY: a graph handed back despite the error is ours to destroy.
                unsafe { sys::cuGraphDestroy(raw) };
            }
            return Err(Error::driver(res, "ending stream capture"));
        }
        Ok(Graph { raw, device: *self.device() })
    }

    /// The capture status of this stream.
    pub fn capture_status(&self) -> Result<CaptureStatus> {
        self.device().bind()?;
        let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: live stream; valid out-pointer.
        check(unsafe { sys::cuStreamIsCapturing(self.raw(), &mut st) }, "querying capture status")?;
        use sys::CUstreamCaptureStatus::*;
        Ok(match st {
            CU_STREAM_CAPTURE_STATUS_NONE => CaptureStatus::None,
            CU_STREAM_CAPTURE_STATUS_ACTIVE => CaptureStatus::Active,
            CU_STREAM_CAPTURE_STATUS_INVALIDATED => CaptureStatus::Invalidated,
        })
    }
}

/// An owned graph (`CUgraph`), destroyed on drop.
pub struct Graph {
    raw: sys::CUgraph,
    device: Device,
}

// SAFETY: graph handles may be moved between threads; all mutation goes through `&mut self`.
unsafe impl Send for Graph {}
// SAFETY: `&Graph` only allows read-only queries and instantiation, which the driver allows
// concurrently with other readers.
unsafe impl Sync for Graph {}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: we own the graph; executable graphs made from it are independent of it.
        unsafe { sys::cuGraphDestroy(self.raw) };
    }
}

impl Graph {
    /// Creates an empty graph.
    pub fn new(device: &Device) -> Result<Graph> {
        device.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer; flags must be 0.
        check(unsafe { sys::cuGraphCreate(&mut raw, 0) }, "creating a graph")?;
        Ok(Graph { raw, device: *device })
    }

    /// The raw handle, valid while `self` lives.
    pub fn raw(&self) -> sys::CUgraph {
        self.raw
    }

    /// The device the graph was created for.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Number of nodes.
    pub fn node_count(&self) -> Result<usize> {
        let mut n = 0usize;
        // SAFETY: a null node array asks for the count only.
        check(
            unsafe { sys::cuGraphGetNodes(self.raw, std::ptr::null_mut(), &mut n) },
            "counting graph nodes",
        )?;
        Ok(n)
    }

    /// Instantiates an executable graph. With [`InstantiateFlags::UPLOAD`], use
    /// [`Graph::instantiate_and_upload`] instead (the driver needs a stream for it).
    pub fn instantiate(&self, flags: InstantiateFlags) -> Result<GraphExec> {
        if flags.0 & InstantiateFlags::UPLOAD.0 != 0 {
            return Err(Error::InvalidArgument(
                "InstantiateFlags::UPLOAD needs a stream: use instantiate_and_upload".into(),
            ));
        }
        self.device.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: live graph; valid out-pointer.
        check(
            unsafe { sys::cuGraphInstantiateWithFlags(&mut raw, self.raw, flags.0) },
            "instantiating a graph",
        )?;
        Ok(GraphExec { raw, device: self.device })
    }

    /// Instantiates and uploads to the device on `stream`, so the first launch pays no upload.
    pub fn instantiate_and_upload(&self, flags: InstantiateFlags, stream: &Stream) -> Result<GraphExec> {
        let exec = self.instantiate(InstantiateFlags(flags.0 & !InstantiateFlags::UPLOAD.0))?;
        exec.upload(stream)?;
        Ok(exec)
    }
}

/// An executable graph (`CUgraphExec`), destroyed on drop. The driver defers destruction of an
/// executable graph that is still running, so dropping it right after a launch is safe.
pub struct GraphExec {
    raw: sys::CUgraphExec,
    device: Device,
}

// SAFETY: executable graph handles may be used from any thread.
unsafe impl Send for GraphExec {}
// SAFETY: launches of one executable graph from several threads are serialised by the driver.
unsafe impl Sync for GraphExec {}

impl Drop for GraphExec {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: we own it; an in-flight launch is completed before the driver frees it.
            unsafe { sys::cuGraphExecDestroy(self.raw) };
        }
    }
}

impl GraphExec {
    /// The raw handle, valid while `self` lives.
    pub fn raw(&self) -> sys::CUgraphExec {
        self.raw
    }

    /// Uploads the executable graph to the device on `stream` (ahead of the first launch).
    pub fn upload(&self, stream: &Stream) -> Result<()> {
        self.device.bind()?;
        // SAFETY: live graph exec and stream.
        check(unsafe { sys::cuGraphUpload(self.raw, stream.raw()) }, "uploading a graph")
    }

    /// Queues one replay of the graph on `stream`.
    ///
    /// # Safety
    /// Every device address baked into the graph's nodes must still point to live memory of the
    /// right size when the replay runs, and nothing else may access that memory concurrently.
    pub unsafe fn launch(&self, stream: &Stream) -> Result<()> {
        self.device.bind()?;
        // SAFETY: live handles; the caller upholds the memory contract.
        check(unsafe { sys::cuGraphLaunch(self.raw, stream.raw()) }, "launching a graph")
    }
}
