//! Raw CUDA graph handles: stream capture, graphs, executable graphs.
//!
//! These are owned handles that clean up on drop. A graph made by stream capture through this crate
//! owns a reference to every [`Allocation`] its nodes use (see the `capture` registry), and so does
//! every executable graph made from it. That makes [`GraphExec::launch`] safe: a replay can never
//! run on freed memory, and each replay is joined to the home streams of those allocations like any
//! other use, so it is ordered with every other access to them and with their final free.

use crate::capture;
use crate::device::Device;
use crate::error::{check, Error, Result};
use crate::memory::{ordered_on, Allocation};
use crate::stream::Stream;
use cudarc::driver::sys;
use std::any::Any;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

mod build;
mod conditional;
mod dot;

pub use build::{GraphBody, GraphMem, Node, NodeType};
pub use conditional::{Conditional, ConditionalKind};

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
        check(unsafe { sys::cuStreamBeginCapture_v2(self.raw(), mode.raw()) }, "beginning stream capture")?;
        capture::register(self);
        Ok(())
    }

    /// Ends the capture and returns the captured graph. If the capture was invalidated, the error
    /// says so (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`) and the stream is back to normal.
    pub fn end_capture(&self) -> Result<Graph> {
        self.device().bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: live stream; valid out-pointer.
        let res = unsafe { sys::cuStreamEndCapture(self.raw(), &mut raw) };
        let record = capture::unregister(self);
        if res != sys::CUresult::CUDA_SUCCESS {
            if !raw.is_null() {
                // SAFETY: a graph handed back despite the error is ours to destroy.
                unsafe { sys::cuGraphDestroy(raw) };
            }
            return Err(Error::driver(res, "ending stream capture"));
        }
        let mut keep = Keep::default();
        for a in record.keep {
            keep.add_alloc(&a);
        }
        Ok(Graph { raw, device: *self.device(), id: next_id(), keep, bodies: 0, lock: Mutex::new(()) })
    }

    /// The kernel node most recently captured on this stream, if the capture's current frontier is
    /// exactly one kernel node (e.g. right after a single kernel launch). Used to build parameter
    /// update handles.
    pub fn last_captured_kernel_node(&self) -> Result<Option<KernelNode>> {
        self.device().bind()?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let (mut deps, mut n): (*const sys::CUgraphNode, usize) = (std::ptr::null(), 0);
        // SAFETY: live stream; valid out-pointers; unneeded outputs are null.
        check(
            unsafe {
                sys::cuStreamGetCaptureInfo_v3(
                    self.raw(),
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
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE || n != 1 || deps.is_null() {
            return Ok(None);
        }
        // SAFETY: the driver returned an array of `n == 1` nodes, valid until the next call on
        // this stream.
        let node = unsafe { *deps };
        let mut ty = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        // SAFETY: a live node of the capture graph.
        check(unsafe { sys::cuGraphNodeGetType(node, &mut ty) }, "reading a node type")?;
        Ok((ty == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL).then_some(KernelNode(node)))
    }

    /// Whether a capture started through this crate ([`Stream::begin_capture`]) is recording this
    /// stream. Cheap: one atomic load when no capture is active anywhere.
    pub fn is_being_captured(&self) -> bool {
        capture::is_capturing(self)
    }

    /// The capture status of this stream, as the driver reports it.
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

/// A kernel node of a [`Graph`] (a plain handle, valid while that graph lives).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelNode(sys::CUgraphNode);

// SAFETY: a node handle is an opaque pointer that the driver lets any thread use.
unsafe impl Send for KernelNode {}
// SAFETY: as above; the handle is immutable.
unsafe impl Sync for KernelNode {}

impl KernelNode {
    /// Whether this node launches `function`.
    ///
    /// # Safety
    /// The graph the node belongs to must be alive.
    pub unsafe fn launches(&self, function: &crate::Function) -> Result<bool> {
        // SAFETY: all-zero is valid for this struct of integers and pointers (no enums); the driver
        // fills it.
        let mut params: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
        // SAFETY: the caller guarantees the node is alive.
        check(
            unsafe { sys::cuGraphKernelNodeGetParams_v2(self.0, &mut params) },
            "reading kernel node parameters",
        )?;
        Ok(params.func == function.raw())
    }
}

/// What a graph keeps alive for as long as it, or an executable made from it, can run: every
/// allocation its nodes use, and host closures, events and child-graph bookkeeping.
#[derive(Default, Clone)]
pub(crate) struct Keep {
    pub(crate) allocs: Vec<Arc<Allocation>>,
    seen: HashSet<usize>,
    pub(crate) extras: Vec<Arc<dyn Any + Send + Sync>>,
}

impl Keep {
    pub(crate) fn add_alloc(&mut self, a: &Arc<Allocation>) {
        if a.ptr != 0 && self.seen.insert(Arc::as_ptr(a) as usize) {
            self.allocs.push(a.clone());
        }
    }

    pub(crate) fn merge(&mut self, other: &Keep) {
        for a in &other.allocs {
            self.add_alloc(a);
        }
        self.extras.extend(other.extras.iter().cloned());
    }
}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// An owned graph (`CUgraph`), destroyed on drop. It keeps every allocation its nodes use (nodes
/// recorded by stream capture through this crate, or added explicitly), plus the host closures and
/// events of its nodes.
pub struct Graph {
    raw: sys::CUgraph,
    device: Device,
    /// Identifies the graph in [`Node`] handles, so nodes of another graph are refused.
    id: u64,
    keep: Keep,
    /// How many conditional bodies were created (each gets its own node-id space).
    bodies: u64,
    /// Graph objects are not internally synchronised by the driver: `&self` calls take this.
    lock: Mutex<()>,
}

// SAFETY: graph handles may be moved between threads; all mutation goes through `&mut self`.
unsafe impl Send for Graph {}
// SAFETY: every driver call through `&Graph` (queries, instantiation, DOT export) holds
// `self.lock`, so the driver never sees concurrent calls on one graph; mutation needs `&mut`.
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
        Ok(Graph {
            raw,
            device: *device,
            id: next_id(),
            keep: Keep::default(),
            bodies: 0,
            lock: Mutex::new(()),
        })
    }

    /// The allocations this graph's nodes use (kept alive by the graph and its executables).
    pub fn allocations(&self) -> &[Arc<Allocation>] {
        &self.keep.allocs
    }

    /// The raw handle, valid while `self` lives.
    pub fn raw(&self) -> sys::CUgraph {
        self.raw
    }

    /// The device the graph was created for.
    pub fn device(&self) -> &Device {
        &self.device
    }

    pub(crate) fn guard(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Number of nodes.
    pub fn node_count(&self) -> Result<usize> {
        let _g = self.guard();
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
        let _g = self.guard();
        let mut raw = std::ptr::null_mut();
        // SAFETY: live graph; valid out-pointer.
        check(
            unsafe { sys::cuGraphInstantiateWithFlags(&mut raw, self.raw, flags.0) },
            "instantiating a graph",
        )?;
        let mut exec = GraphExec {
            raw,
            device: self.device,
            keep: Arc::new(Keep::default()),
            homes: Vec::new(),
            lock: Mutex::new(()),
        };
        exec.adopt(self);
        Ok(exec)
    }

    /// Instantiates and uploads to the device on `stream`, so the first launch pays no upload.
    pub fn instantiate_and_upload(&self, flags: InstantiateFlags, stream: &Stream) -> Result<GraphExec> {
        let exec = self.instantiate(InstantiateFlags(flags.0 & !InstantiateFlags::UPLOAD.0))?;
        exec.upload(stream)?;
        Ok(exec)
    }
}

/// An executable graph (`CUgraphExec`), destroyed on drop. The driver defers destruction of an
/// executable graph that is still running, and the allocations it keeps are freed stream-ordered
/// after the replays (each replay is joined to their home streams), so dropping it right after a
/// launch is safe.
pub struct GraphExec {
    raw: sys::CUgraphExec,
    device: Device,
    keep: Arc<Keep>,
    /// The distinct home streams of `keep`.
    homes: Vec<Stream>,
    /// Executable graphs are not internally synchronised by the driver: `&self` calls take this.
    lock: Mutex<()>,
}

/// The outcome of [`GraphExec::update`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecUpdate {
    /// The executable graph now runs the new graph's parameters (`cuGraphExecUpdate` succeeded).
    Updated,
    /// The driver refused the in-place update; the executable graph is unchanged. `reason` is the
    /// driver's `CUgraphExecUpdateResult` name (e.g. `CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED`)
    /// and `node_type` the type of the node that caused it, if the driver named one.
    Refused {
        /// Why, as the driver names it.
        reason: String,
        /// The offending node's type, if known.
        node_type: Option<String>,
    },
}

// SAFETY: executable graph handles may be used from any thread.
unsafe impl Send for GraphExec {}
// SAFETY: every driver call through `&GraphExec` (launch, upload, parameter updates) holds
// `self.lock`, so the driver never sees concurrent calls on one executable graph; `update` needs
// `&mut`.
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
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: live graph exec and stream.
        check(unsafe { sys::cuGraphUpload(self.raw, stream.raw()) }, "uploading a graph")
    }

    fn adopt(&mut self, graph: &Graph) {
        self.keep = Arc::new(graph.keep.clone());
        self.homes.clear();
        for a in graph.keep.allocs.iter() {
            if !self.homes.contains(a.home_stream()) {
                self.homes.push(a.home_stream().clone());
            }
        }
    }

    /// The allocations the executable graph keeps alive.
    pub fn allocations(&self) -> &[Arc<Allocation>] {
        &self.keep.allocs
    }

    /// Queues one replay of the graph on `stream`.
    ///
    /// Safe for graphs captured through this crate: every buffer the nodes use is kept alive by
    /// this executable graph, and the replay is ordered (joined) with all other uses of those
    /// buffers on their home streams, so it neither races other work nor outlives the memory.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        self.device.bind()?;
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let go = || {
            // SAFETY: live handles; every address in the graph belongs to an allocation in
            // `self.keep` (captured uses are recorded), which outlives this executable graph.
            check(unsafe { sys::cuGraphLaunch(self.raw, stream.raw()) }, "launching a graph")
        };
        if capture::any_active() {
            let uses: Vec<&Arc<Allocation>> = self.keep.allocs.iter().collect();
            ordered_on(stream, &uses, go)
        } else {
            crate::memory::join_homes(stream, self.homes.iter(), go)
        }
    }

    /// Updates this executable graph in place to the parameters of `graph`, which must have the
    /// same topology (`cuGraphExecUpdate`). On success the executable graph keeps `graph`'s
    /// allocations instead (replays already queued still hold theirs through the stream order).
    pub fn update(&mut self, graph: &Graph) -> Result<ExecUpdate> {
        self.device.bind()?;
        // SAFETY: all-zero is valid: `result` has a 0 variant (SUCCESS) and the rest are handles.
        let mut info: sys::CUgraphExecUpdateResultInfo = unsafe { std::mem::zeroed() };
        // SAFETY: live handles; valid out-pointer.
        let res = unsafe { sys::cuGraphExecUpdate_v2(self.raw, graph.raw, &mut info) };
        match res {
            sys::CUresult::CUDA_SUCCESS => {
                self.adopt(graph);
                Ok(ExecUpdate::Updated)
            }
            sys::CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE => {
                let node_type = (!info.errorNode.is_null()).then(|| {
                    let mut ty = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
                    // SAFETY: a node of `graph` or of this executable's graph, named by the driver.
                    unsafe { sys::cuGraphNodeGetType(info.errorNode, &mut ty) };
                    format!("{ty:?}")
                });
                Ok(ExecUpdate::Refused { reason: format!("{:?}", info.result), node_type })
            }
            e => Err(Error::driver(e, "updating an executable graph")),
        }
    }

    /// Replaces parameter `index` of kernel node `node` with `value` for future launches
    /// (`cuGraphExecKernelNodeSetParams`, one driver call); launches already queued are
    /// unaffected. `params` is the node's snapshot ([`KernelNode::read_params`]): every other
    /// parameter is set to its value there. The size of `T` is checked against the kernel's
    /// parameter list.
    ///
    /// # Safety
    /// `node` must be a kernel node of the graph this executable was instantiated from (or updated
    /// to), that graph must still be alive, and `params` must be `node`'s snapshot. The kernel must
    /// stay in bounds with the new value (never change a length or a pointer this way).
    pub unsafe fn set_kernel_param<T: crate::DeviceRepr>(
        &self,
        node: KernelNode,
        params: &KernelNodeParams,
        index: usize,
        value: T,
    ) -> Result<()> {
        match params.sizes.get(index) {
            Some(&size) if size == std::mem::size_of::<T>() => {}
            Some(&size) => {
                return Err(Error::InvalidArgument(format!(
                    "kernel parameter {index} is {size} bytes, not {} (type mismatch)",
                    std::mem::size_of::<T>()
                )))
            }
            None => {
                return Err(Error::InvalidArgument(format!(
                    "the kernel has {} parameters; there is no parameter {index}",
                    params.sizes.len()
                )))
            }
        }
        self.device.bind()?;
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut value = value;
        let mut stack = [std::ptr::null_mut::<std::ffi::c_void>(); 16];
        let mut heap;
        let ptrs: &mut [*mut std::ffi::c_void] = if params.ptrs.len() <= stack.len() {
            stack[..params.ptrs.len()].copy_from_slice(&params.ptrs);
            &mut stack[..params.ptrs.len()]
        } else {
            heap = params.ptrs.clone();
            &mut heap
        };
        ptrs[index] = (&mut value as *mut T).cast();
        let mut raw = params.raw;
        raw.kernelParams = ptrs.as_mut_ptr();
        raw.extra = std::ptr::null_mut();
        // SAFETY: live handles; `ptrs` holds one pointer per parameter (the snapshot's, into the
        // live template graph, plus `value`), all alive across the call, which copies the values.
        check(
            unsafe { sys::cuGraphExecKernelNodeSetParams_v2(self.raw, node.0, &raw) },
            "setting kernel node parameters",
        )
    }
}

/// A snapshot of a kernel node's launch description and parameter list, read once so that each
/// later parameter update costs one driver call. Its pointers refer to storage of the graph the
/// node belongs to.
pub struct KernelNodeParams {
    raw: sys::CUDA_KERNEL_NODE_PARAMS,
    ptrs: Vec<*mut std::ffi::c_void>,
    sizes: Vec<usize>,
}

// SAFETY: read-only data; the pointers are only handed back to the driver, never dereferenced here.
unsafe impl Send for KernelNodeParams {}
// SAFETY: as above.
unsafe impl Sync for KernelNodeParams {}

impl KernelNode {
    /// Reads the node's launch description and parameter sizes.
    ///
    /// # Safety
    /// The graph the node belongs to must be alive.
    pub unsafe fn read_params(&self) -> Result<KernelNodeParams> {
        // SAFETY: all-zero is valid for this struct of integers and pointers (no enums); the driver
        // fills it.
        let mut raw: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
        // SAFETY: the caller guarantees the node is alive.
        check(
            unsafe { sys::cuGraphKernelNodeGetParams_v2(self.0, &mut raw) },
            "reading kernel node parameters",
        )?;
        if raw.kernelParams.is_null() {
            return Err(Error::InvalidArgument("the kernel node has no parameter array".into()));
        }
        let sizes = param_sizes(raw.func);
        // SAFETY: the kernel has `sizes.len()` parameters (from the driver) and the node's array
        // holds one pointer per parameter.
        let ptrs = (0..sizes.len()).map(|i| unsafe { *raw.kernelParams.add(i) }).collect();
        Ok(KernelNodeParams { raw, ptrs, sizes })
    }
}

/// The byte size of each parameter of `func`, from `cuFuncGetParamInfo` (which fails past the
/// last parameter).
fn param_sizes(func: sys::CUfunction) -> Vec<usize> {
    let mut sizes = Vec::new();
    loop {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: a live function handle; valid out-pointers.
        let res = unsafe { sys::cuFuncGetParamInfo(func, sizes.len(), &mut offset, &mut size) };
        if res != sys::CUresult::CUDA_SUCCESS {
            return sizes;
        }
        sizes.push(size);
    }
}
