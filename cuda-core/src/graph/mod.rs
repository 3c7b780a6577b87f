//! Raw CUDA graph handles: stream capture, graphs, executable graphs.
//!
//! These are owned handles that clean up on drop. A graph made by stream capture through this crate
//! owns a reference to every [`Allocation`] its nodes use (see the `capture` registry), and so does
//! every executable graph made from it. That makes [`GraphExec::launch`] safe: a replay can never
//! run on freed memory, and each replay is joined to the home streams of those allocations like any
//! other use, so it is ordered with every other access to them and with their final free.

use crate::device::Device;
use crate::driver::result;
use crate::error::{Error, Result};
use crate::event::{Event, PooledEvent};
use crate::stream::Stream;
use crate::track::{ordered, Access, Allocation, InCapture, KeepAlive};
use cudarc::driver::sys;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

mod build;
mod capture;
mod conditional;
mod dot;
mod memory;

pub use build::{GraphBody, GraphMem, Node, NodeType};
pub use conditional::{Conditional, ConditionalKind};

/// How a stream capture interacts with the capturing thread's other CUDA calls
/// (`CUstreamCaptureMode`).
///
/// **`Global` is captured as `ThreadLocal`.** The driver's global mode makes "potentially unsafe"
/// calls fail on *every* thread while the capture runs, and that check races the capture's begin
/// and end: measured on the H100 (driver 580), `cuStreamSynchronize`, `cuGraphInstantiateWithFlags`
/// and a loop creating, trimming and destroying memory pools on one thread while another thread
/// began and ended global-mode captures
/// crashed the process (SIGSEGV inside libcuda) within seconds (`gpu_capture_races`,
/// `capture-race-probe`). What global mode guards against — another thread's call that would
/// synchronize with, or enqueue onto, the capturing stream — this crate refuses anyway: streams
/// are non-blocking, and every enqueue, wait and synchronisation of a capturing stream by another
/// thread is refused with [`crate::Error::Capture`]. So `Global` keeps its meaning for this crate's
/// API and never puts the driver into global mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureMode {
    /// Captured as [`CaptureMode::ThreadLocal`] (see the type docs): other threads' work on the
    /// capturing stream is refused by this crate; the driver is not put into global mode.
    Global,
    /// Only the capturing thread's potentially unsafe calls fail.
    ThreadLocal,
    /// No calls are prohibited; the caller takes care.
    Relaxed,
}

impl CaptureMode {
    pub(crate) fn raw(self) -> sys::CUstreamCaptureMode {
        use sys::CUstreamCaptureMode::*;
        match self {
            // Never the driver's global mode (see the type docs).
            CaptureMode::Global | CaptureMode::ThreadLocal => CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
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

/// A kernel node of a [`Graph`] (a plain handle, valid while that graph lives).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelNode(pub(crate) sys::CUgraphNode);

// SAFETY: a node handle is an opaque pointer that the driver lets any thread use.
unsafe impl Send for KernelNode {}
// SAFETY: as above; the handle is immutable.
unsafe impl Sync for KernelNode {}

impl KernelNode {
    /// Whether this node launches `function`.
    ///
    /// # Safety
    /// The graph the node belongs to must be alive.
    ///
    /// # Errors
    /// Driver errors reading the node.
    pub unsafe fn launches(&self, function: &crate::module::Function) -> Result<bool> {
        // SAFETY: the caller guarantees the node is alive.
        let params = unsafe { result::graph_kernel_node_get_params(self.0) }?;
        Ok(params.func == function.raw())
    }
}

fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Why a graph with an event node naming an event recorded inside a capture is not instantiated
/// or launched.
const EVENT_NODE_IN_CAPTURE: &str =
    "a graph whose event node names an event last recorded inside a stream capture (it belongs to that capture)";

/// An owned graph (`CUgraph`), destroyed on drop. It keeps every allocation its nodes use (nodes
/// recorded by stream capture through this crate, or added explicitly), plus the host closures and
/// events of its nodes.
///
/// ```no_run
/// # fn main() -> cuda_core::Result<()> {
/// use cuda_core::{CaptureMode, Device, DeviceBuffer};
/// let s = Device::new(0)?.new_stream()?;
/// let mut x = DeviceBuffer::<u32>::zeros(&s, 256)?; // allocate before capturing
/// s.begin_capture(CaptureMode::ThreadLocal)?;
/// x.fill(&s, 7)?; // recorded, not run
/// let graph = s.end_capture()?;
/// assert_eq!(graph.node_count()?, 1);
/// let exec = graph.instantiate(Default::default())?;
/// exec.launch(&s)?;
/// assert_eq!(x.to_vec()?, vec![7; 256]); // ordered after the replay
/// # Ok(()) }
/// ```
pub struct Graph {
    raw: sys::CUgraph,
    device: Device,
    /// Identifies the graph in [`Node`] handles, so nodes of another graph are refused.
    id: u64,
    keep: KeepAlive,
    /// How many conditional bodies were created (each gets its own node-id space).
    bodies: u64,
    /// Buffer uses of the nodes added so far, for implicit ordering (see `build::NodeAccessMap`);
    /// `None` until first needed for a graph made by stream capture.
    access: Option<build::NodeAccessMap>,
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
        crate::error::note_drop(unsafe { result::graph_destroy(self.raw) });
    }
}

impl Graph {
    /// A graph ended by a capture, keeping what the capture recorded.
    pub(crate) fn from_capture(raw: sys::CUgraph, device: Device, keep: KeepAlive) -> Graph {
        // The buffer uses of the captured nodes are read when the graph is first built on (see
        // `Graph::builder`), so a capture costs nothing extra.
        Graph { raw, device, id: next_id(), keep, bodies: 0, access: None, lock: Mutex::new(()) }
    }

    /// Creates an empty graph.
    ///
    /// # Errors
    /// Driver errors creating the graph.
    pub fn new(device: &Device) -> Result<Graph> {
        device.bind()?;
        let raw = result::graph_create()?;
        Ok(Graph {
            raw,
            device: *device,
            id: next_id(),
            keep: KeepAlive::default(),
            bodies: 0,
            access: Some(Default::default()),
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

    /// `Ok` unless building removed a conditional node, whose handle the driver would then
    /// refuse (see `GraphBody::add_if`).
    pub(crate) fn usable(&self) -> Result<()> {
        self.access.as_ref().map_or(Ok(()), build::NodeAccessMap::usable)
    }

    /// `Ok` unless the graph created conditional handles (see `NodeAccessMap::embeddable`).
    pub(crate) fn embeddable(&self) -> Result<()> {
        self.access.as_ref().map_or(Ok(()), build::NodeAccessMap::embeddable)
    }

    /// Number of nodes.
    ///
    /// # Errors
    /// Driver errors.
    pub fn node_count(&self) -> Result<usize> {
        let _g = self.guard();
        // SAFETY: live graph, used under its lock.
        unsafe { result::graph_node_count(self.raw, "counting graph nodes") }
    }

    /// Instantiates an executable graph. With [`InstantiateFlags::UPLOAD`], use
    /// [`Graph::instantiate_and_upload`] instead (the driver needs a stream for it).
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, Graph, InstantiateFlags};
    /// let dev = Device::new(0)?;
    /// let mut graph = Graph::new(&dev)?;
    /// graph.builder().add_empty(&[])?;
    /// let exec = graph.instantiate(InstantiateFlags::NONE)?;
    /// drop(graph); // an executable graph does not need its graph
    /// exec.launch(&dev.new_stream()?)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for [`InstantiateFlags::UPLOAD`] (use `instantiate_and_upload`);
    /// driver errors (e.g. an invalid graph).
    pub fn instantiate(&self, flags: InstantiateFlags) -> Result<GraphExec> {
        if flags.0 & InstantiateFlags::UPLOAD.0 != 0 {
            return Err(Error::InvalidArgument(
                "InstantiateFlags::UPLOAD needs a stream: use instantiate_and_upload".into(),
            ));
        }
        self.usable()?;
        self.device.bind()?;
        let _g = self.guard();
        // Held across the instantiation: no event of an event node may belong to a capture.
        let _events = self.keep.lock_events(EVENT_NODE_IN_CAPTURE)?;
        // SAFETY: live graph, used under its lock.
        let raw = unsafe { result::graph_instantiate(self.raw, flags.0) }?;
        let keep = Arc::new(self.keep.clone());
        Ok(GraphExec { raw, device: self.device, keep, lock: Mutex::new(ExecState { last: None }) })
    }

    /// Instantiates and uploads to the device on `stream`, so the first launch pays no upload.
    ///
    /// # Errors
    /// As for [`Graph::instantiate`] and [`GraphExec::upload`].
    pub fn instantiate_and_upload(&self, flags: InstantiateFlags, stream: &Stream) -> Result<GraphExec> {
        let exec = self.instantiate(InstantiateFlags(flags.0 & !InstantiateFlags::UPLOAD.0))?;
        exec.upload(stream)?;
        Ok(exec)
    }
}

/// An executable graph (`CUgraphExec`), destroyed on drop.
///
/// **Lifetimes.** It owns (shares) its graph's keep-alive set (allocations, host closures, events, serial streams). The allocations in it are freed
/// stream-ordered after every replay (each replay is joined to their home streams). Host-node
/// closures and events are not stream-ordered: an executable graph holding any records an event
/// behind each replay, and when it is dropped or updated they are released only once the last
/// replay queued before has completed (on the `cuda-core-reaper` thread). The driver defers the
/// destruction of an executable graph that is still running. So dropping it right after a launch
/// is safe.
///
/// ```no_run
/// # fn main() -> cuda_core::Result<()> {
/// use cuda_core::{CaptureMode, Device, DeviceBuffer, InstantiateFlags};
/// let s = Device::new(0)?.new_stream()?;
/// let mut x = DeviceBuffer::<f32>::zeros(&s, 1024)?;
/// s.begin_capture(CaptureMode::ThreadLocal)?;
/// x.fill(&s, 1.0)?;
/// let exec = s.end_capture()?.instantiate_and_upload(InstantiateFlags::NONE, &s)?;
/// drop(x); // the executable graph keeps the memory alive: replays stay safe
/// for _ in 0..100 {
///     exec.launch(&s)?;
/// }
/// s.synchronize()?;
/// # Ok(()) }
/// ```
pub struct GraphExec {
    raw: sys::CUgraphExec,
    device: Device,
    keep: Arc<KeepAlive>,
    /// Executable graphs are not internally synchronised by the driver: `&self` calls take this.
    lock: Mutex<ExecState>,
}

struct ExecState {
    /// An event behind the last eager replay, when `keep` holds anything not stream-ordered.
    last: Option<Arc<PooledEvent>>,
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
        if self.device.bind_in_drop() {
            // SAFETY: we own it; the driver completes an in-flight launch before freeing it.
            crate::error::note_drop(unsafe { result::graph_exec_destroy(self.raw) });
        }
        let last = self.lock.get_mut().unwrap_or_else(|e| e.into_inner()).last.take();
        if let Some(ev) = last {
            let keep = std::mem::take(&mut self.keep);
            crate::track::reaper::drop_after(ev, Box::new(keep));
        }
    }
}

impl GraphExec {
    /// The raw handle, valid while `self` lives.
    pub fn raw(&self) -> sys::CUgraphExec {
        self.raw
    }

    fn state(&self) -> MutexGuard<'_, ExecState> {
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Uploads the executable graph to the device on `stream` (ahead of the first launch).
    ///
    /// # Errors
    /// [`Error::Capture`] if `stream` is being captured; driver errors.
    pub fn upload(&self, stream: &Stream) -> Result<()> {
        self.device.bind()?;
        let _g = self.state();
        let state = stream.lock();
        crate::track::state::refuse_if_capturing(&state, "uploading a graph on a stream being captured")?;
        // SAFETY: live graph exec and stream, used under the exec's lock; context bound.
        unsafe { result::graph_upload(self.raw, stream.raw()) }
    }

    /// The allocations the executable graph keeps alive.
    pub fn allocations(&self) -> &[Arc<Allocation>] {
        &self.keep.allocs
    }

    /// Orders every later replay after everything queued on `stream` so far, and `stream` after
    /// each replay, as if `stream` were the home stream of one more buffer. Graphs serialised
    /// through one stream never run concurrently (a graph pool).
    pub fn serialize_through(&mut self, stream: &Stream) {
        let mut keep = (*self.keep).clone();
        keep.add_serial(stream);
        self.keep = Arc::new(keep);
    }

    /// Queues one replay of the graph on `stream`.
    ///
    /// Safe for graphs captured or built through this crate: every buffer the nodes use is kept
    /// alive by this executable graph, and the replay is ordered (joined) with all other uses of
    /// those buffers on their home streams, so it neither races other work nor outlives the memory.
    /// On a stream this thread is capturing, the replay is recorded as a child graph and the
    /// capture keeps everything this graph keeps.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] for a stream of another device; [`Error::Capture`] if another
    /// thread is capturing `stream` or a home stream is being captured; driver errors.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        if stream.device() != &self.device {
            return Err(Error::DeviceMismatch {
                during: "launching a graph",
                expected: self.device.ordinal(),
                actual: stream.device().ordinal(),
            });
        }
        self.device.bind()?;
        let mut st = self.state();
        // A replay may write every allocation it keeps.
        let uses: Vec<(&Arc<Allocation>, Access)> =
            self.keep.allocs.iter().map(|a| (a, Access::Write)).collect();
        let serial: Vec<&Stream> = self.keep.serial.iter().collect();
        let track = self.keep.has_extras();
        let ev = if track { Some(Event::pooled(&self.device)?) } else { None };
        let captured = Cell::new(false);
        let recorded = Cell::new(false);
        ordered(
            stream,
            &uses,
            &serial,
            InCapture::Record,
            |k| {
                k.merge(&self.keep);
                captured.set(true);
            },
            || {
                // Held across the launch (after the stream locks, the crate's lock order): no
                // event of an event node may belong to a capture.
                let _events = self.keep.lock_events(EVENT_NODE_IN_CAPTURE)?;
                // SAFETY: live handles; every address in the graph belongs to an allocation in
                // `self.keep`, which outlives every replay (see the type docs).
                unsafe { result::graph_launch(self.raw, stream.raw()) }?;
                if let (Some(ev), false) = (&ev, captured.get()) {
                    match ev.record_locked(stream) {
                        Ok(()) => recorded.set(true),
                        // Without the event the extras could be released too early: wait instead.
                        Err(e) => {
                            stream.sync_for_copy()?;
                            return Err(e);
                        }
                    }
                }
                Ok(())
            },
        )?;
        if let (Some(ev), true) = (ev, recorded.get()) {
            st.last = Some(Arc::new(ev));
        }
        Ok(())
    }

    /// Updates this executable graph in place to the parameters of `graph`, which must have the
    /// same topology (`cuGraphExecUpdate`). On success the executable graph keeps `graph`'s
    /// allocations instead (replays already queued still hold theirs through the stream order).
    ///
    /// # Errors
    /// Driver errors other than the refusal, which is `Ok(ExecUpdate::Refused { .. })`.
    pub fn update(&mut self, graph: &Graph) -> Result<ExecUpdate> {
        graph.usable()?;
        self.device.bind()?;
        let verdict = {
            // The driver reads `graph`: under its lock, as every call on a `&Graph` (found by
            // review: other threads may use it meanwhile).
            let _g = graph.guard();
            // SAFETY: live handles; `&mut self` excludes concurrent use of the executable graph,
            // and the template graph is used under its lock.
            unsafe { result::graph_exec_update(self.raw, graph.raw) }?.map(|info| {
                let node_type = (!info.errorNode.is_null()).then(|| {
                    // SAFETY: a node of `graph` or of this executable's graph, named by the
                    // driver; `graph` is still locked.
                    let ty = unsafe { result::graph_node_get_type(info.errorNode) }
                        .unwrap_or(sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY);
                    format!("{ty:?}")
                });
                ExecUpdate::Refused { reason: format!("{:?}", info.result), node_type }
            })
        };
        match verdict {
            None => {
                let mut keep = graph.keep.clone();
                for st in &self.keep.serial {
                    keep.add_serial(st);
                }
                let old = std::mem::replace(&mut self.keep, Arc::new(keep));
                // Replays queued before still use what the old set kept: release it after them.
                if let Some(ev) = self.state().last.clone() {
                    crate::track::reaper::drop_after(ev, Box::new(old));
                }
                Ok(ExecUpdate::Updated)
            }
            Some(refused) => Ok(refused),
        }
    }

    /// Replaces parameter `index` of kernel node `node` with `value` for future launches
    /// (`cuGraphExecKernelNodeSetParams`, one driver call); launches already queued are
    /// unaffected. `params` is the node's snapshot ([`KernelNode::read_params`]): every other
    /// parameter is set to its value there. The size of `T` is checked against the kernel's
    /// parameter list.
    ///
    /// `graph` is used under its lock for the call (the driver reads the node, and so its graph).
    ///
    /// # Safety
    /// `graph` must be the graph this executable was instantiated from (or updated to), `node` one
    /// of its kernel nodes, and `params` `node`'s snapshot. The kernel must stay in bounds with the
    /// new value (never change a length or a pointer this way).
    pub unsafe fn set_kernel_param<T: crate::memory::DeviceRepr>(
        &self,
        graph: &Graph,
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
        // Lock order: the graph, then the executable's state (no path takes them the other way).
        let _graph = graph.guard();
        let _g = self.state();
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
        unsafe { result::graph_exec_kernel_node_set_params(self.raw, node.0, &raw) }
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
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a node without a parameter array; driver errors.
    pub unsafe fn read_params(&self) -> Result<KernelNodeParams> {
        // SAFETY: the caller guarantees the node is alive.
        let raw = unsafe { result::graph_kernel_node_get_params(self.0) }?;
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
    // SAFETY: a live function handle.
    while let Some(size) = unsafe { result::func_get_param_size(func, sizes.len()) } {
        sizes.push(size);
    }
    sizes
}
