//! Building graphs node by node.
//!
//! [`Graph::builder`] (and each conditional body) hands out a [`GraphBody`] to which nodes are
//! added with explicit dependencies. Every node that touches device memory takes the buffer itself,
//! so its allocation joins the graph's keep-alive set (like captured work); host closures and
//! events are kept alive by the graph too. Nodes are plain handles that remember which graph (or
//! body) they belong to: a dependency on a node of another graph is an error, not a dangling
//! handle.

use super::Graph;
use crate::device::Device;
use crate::driver::result;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::launch::{KernelArgs, LaunchConfig};
use crate::memory::{DeviceBuffer, DeviceRepr};
use crate::module::Function;
use crate::track::{Access, Allocation, KeepAlive};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

/// Why an event node naming an event recorded inside a capture is refused.
const EVENT_IN_CAPTURE: &str =
    "an event node naming an event last recorded inside a stream capture (it belongs to that capture)";

/// A node of a graph or of a conditional body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node {
    pub(crate) raw: sys::CUgraphNode,
    pub(crate) owner: (u64, u64),
}

// SAFETY: a node handle is an opaque pointer that the driver lets any thread use; it is only ever
// passed back to the graph it came from (checked by `owner`).
unsafe impl Send for Node {}
// SAFETY: as above; immutable.
unsafe impl Sync for Node {}

/// The type of a node (`CUgraphNodeType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeType {
    /// A kernel launch.
    Kernel,
    /// A memory copy.
    Memcpy,
    /// A memset.
    Memset,
    /// A host function.
    Host,
    /// A child graph.
    ChildGraph,
    /// An empty node (a barrier).
    Empty,
    /// Waits for an event.
    EventWait,
    /// Records an event.
    EventRecord,
    /// Allocates graph-owned memory.
    MemAlloc,
    /// Frees graph-owned memory.
    MemFree,
    /// A conditional (IF / WHILE) node.
    Conditional,
    /// Anything else, with the driver's raw value.
    Other(u32),
}

impl NodeType {
    pub(crate) fn from_raw(t: sys::CUgraphNodeType) -> NodeType {
        use sys::CUgraphNodeType::*;
        match t {
            CU_GRAPH_NODE_TYPE_KERNEL => NodeType::Kernel,
            CU_GRAPH_NODE_TYPE_MEMCPY => NodeType::Memcpy,
            CU_GRAPH_NODE_TYPE_MEMSET => NodeType::Memset,
            CU_GRAPH_NODE_TYPE_HOST => NodeType::Host,
            CU_GRAPH_NODE_TYPE_GRAPH => NodeType::ChildGraph,
            CU_GRAPH_NODE_TYPE_EMPTY => NodeType::Empty,
            CU_GRAPH_NODE_TYPE_WAIT_EVENT => NodeType::EventWait,
            CU_GRAPH_NODE_TYPE_EVENT_RECORD => NodeType::EventRecord,
            CU_GRAPH_NODE_TYPE_MEM_ALLOC => NodeType::MemAlloc,
            CU_GRAPH_NODE_TYPE_MEM_FREE => NodeType::MemFree,
            CU_GRAPH_NODE_TYPE_CONDITIONAL => NodeType::Conditional,
            other => NodeType::Other(other as u32),
        }
    }
}

/// Device memory owned by a graph: allocated by a mem-alloc node and valid only between that node
/// and the matching mem-free node within each replay. It has no host-side owner; use it only as a
/// raw kernel argument of nodes ordered between the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphMem {
    /// The device address (fixed for the graph's lifetime).
    pub ptr: sys::CUdeviceptr,
    /// Its size in bytes.
    pub bytes: usize,
}

/// Adds nodes to a graph or to a conditional body. Obtained from [`Graph::builder`] or inside
/// [`GraphBody::add_if`] / [`GraphBody::add_while`].
///
/// ```no_run
/// # fn main() -> cuda_core::Result<()> {
/// use cuda_core::{Device, DeviceBuffer, Graph};
/// let dev = Device::new(0)?;
/// let s = dev.new_stream()?;
/// let (mut a, mut b) = (DeviceBuffer::<u32>::zeros(&s, 64)?, DeviceBuffer::<u32>::zeros(&s, 64)?);
/// let mut graph = Graph::new(&dev)?;
/// let mut body = graph.builder();
/// let set = body.add_memset(&mut a, 5, &[])?;
/// body.add_copy(&a, &mut b, &[set])?; // `b = a` once the memset has run
/// assert_eq!(graph.node_count()?, 2);
/// graph.instantiate(Default::default())?.launch(&s)?;
/// assert_eq!(b.to_vec()?, vec![5; 64]);
/// # Ok(()) }
/// ```
pub struct GraphBody<'g> {
    pub(crate) raw: sys::CUgraph,
    pub(crate) owner: (u64, u64),
    pub(crate) device: Device,
    pub(crate) keep: &'g mut KeepAlive,
    pub(crate) bodies: &'g mut u64,
    pub(crate) access: &'g mut NodeAccessMap,
}

/// For each graph or conditional body (by body index), for each allocation (by identity): the
/// node that last wrote it and the nodes that read it since. Every new node that touches an
/// allocation gets dependency edges on the earlier nodes it conflicts with (a write after the last
/// write and the reads since, a read after the last write), so two nodes touching one buffer are
/// never left unordered: safe code cannot build a graph that races itself.
#[derive(Default)]
pub(crate) struct NodeAccessMap {
    by_body: HashMap<u64, HashMap<usize, NodeUses>>,
    /// The edges added implicitly (so an explicit `add_dependencies` of the same edge is a no-op
    /// rather than a driver error).
    implicit: std::collections::HashSet<(usize, usize)>,
    /// Set when the uses of existing nodes could not be read: nodes touching buffers are refused.
    poisoned: bool,
    /// Set when a conditional node was removed (its body failed, or it could not be ordered): its
    /// conditional handle has no node any more, which the driver refuses at instantiation, so
    /// the graph is refused with a clear error before that (see [`NodeAccessMap::usable`]). Set
    /// too when a node that could not be ordered could not be removed (the driver refuses to
    /// remove nodes from a graph with memory nodes): it would race the nodes it conflicts with.
    orphaned_handle: bool,
    /// Set when a conditional handle was created in the graph or one of its bodies: such a graph
    /// is not embedded in another (see [`NodeAccessMap::embeddable`]).
    has_handles: bool,
}

#[derive(Default)]
struct NodeUses {
    /// The last write (one node; for a graph made by stream capture, every sink node of it).
    writes: Vec<sys::CUgraphNode>,
    reads: Vec<sys::CUgraphNode>,
}

// SAFETY: node handles are opaque pointers only handed back to the driver for the graph that owns
// them, whose mutation is serialised by `&mut Graph`.
unsafe impl Send for NodeAccessMap {}
// SAFETY: as above; `&NodeAccessMap` exposes nothing.
unsafe impl Sync for NodeAccessMap {}

impl NodeAccessMap {
    /// A map for a graph whose nodes already use `allocs` (a captured graph): every later node
    /// touching one of them is ordered after all of the graph's sink nodes.
    pub(crate) fn seeded(graph: sys::CUgraph, allocs: &[Arc<Allocation>]) -> Result<Self> {
        let mut map = NodeAccessMap::default();
        if allocs.is_empty() {
            return Ok(map);
        }
        // SAFETY: live graph, not used concurrently (`&mut Graph`).
        let nodes = unsafe { result::graph_get_nodes(graph, "listing graph nodes") }?;
        // SAFETY: as above.
        let (from, _to) = unsafe { result::graph_get_edges(graph) }?;
        let sinks: Vec<sys::CUgraphNode> = nodes.into_iter().filter(|nd| !from.contains(nd)).collect();
        let body = map.by_body.entry(0).or_default();
        for a in allocs {
            body.insert(key(a), NodeUses { writes: sinks.clone(), reads: Vec::new() });
        }
        Ok(map)
    }

    /// `Ok` unless the graph created conditional handles. A copy of its nodes in another graph
    /// (`add_child`, `add_captured`) would keep its set-conditional kernels, which would then set
    /// a handle of this graph from the other one (found by review: undefined for the driver, at
    /// best another graph's loop condition).
    pub(crate) fn embeddable(&self) -> Result<()> {
        if self.has_handles {
            return Err(Error::InvalidArgument(
                "a graph with conditional handles cannot be embedded in another graph (its set-conditional nodes would set this graph's handles)".into(),
            ));
        }
        Ok(())
    }

    /// A map that refuses every node touching a buffer.
    pub(crate) fn poisoned() -> Self {
        NodeAccessMap { poisoned: true, ..Default::default() }
    }

    /// `Ok` unless a conditional node was removed from the graph (see `orphaned_handle`).
    pub(crate) fn usable(&self) -> Result<()> {
        if self.orphaned_handle {
            return Err(Error::InvalidArgument(
                "a conditional node of this graph was removed (its body failed), or a node could not be ordered: \
                 the graph cannot be instantiated or nested; build it again"
                    .into(),
            ));
        }
        Ok(())
    }

    /// The allocations touched in body `body` (by identity).
    pub(crate) fn touched(&self, body: u64) -> Vec<usize> {
        self.by_body.get(&body).map(|m| m.keys().copied().collect()).unwrap_or_default()
    }
}

impl Graph {
    /// A builder that adds nodes to this graph.
    pub fn builder(&mut self) -> GraphBody<'_> {
        if self.access.is_none() {
            // Nodes added to a captured graph are ordered after the captured work on the same
            // buffers; if the graph cannot be read (a driver error), every node touching a buffer
            // is refused instead.
            let seeded = NodeAccessMap::seeded(self.raw, &self.keep.allocs)
                .unwrap_or_else(|_| NodeAccessMap::poisoned());
            self.access = Some(seeded);
        }
        GraphBody {
            raw: self.raw,
            owner: (self.id, 0),
            device: self.device,
            keep: &mut self.keep,
            bodies: &mut self.bodies,
            access: self.access.get_or_insert_with(NodeAccessMap::poisoned),
        }
    }

    /// All nodes of the graph (top level; conditional bodies and child graphs not expanded).
    ///
    /// # Errors
    /// Driver errors listing the nodes.
    pub fn nodes(&self) -> Result<Vec<Node>> {
        let _g = self.guard();
        self.nodes_locked()
    }

    /// [`Graph::nodes`] for a caller that holds the graph's lock.
    fn nodes_locked(&self) -> Result<Vec<Node>> {
        // SAFETY: live graph, used under its lock (held by the caller).
        let n = unsafe { result::graph_node_count(self.raw, "counting graph nodes") }?;
        // SAFETY: as above.
        let raw = unsafe { result::graph_get_nodes_up_to(self.raw, n, "listing graph nodes") }?;
        Ok(raw.into_iter().map(|raw| Node { raw, owner: (self.id, 0) }).collect())
    }

    /// The type of each top-level node, in [`Graph::nodes`] order.
    ///
    /// # Errors
    /// Driver errors listing the nodes or reading their types.
    pub fn node_types(&self) -> Result<Vec<NodeType>> {
        // One lock across the listing and the reads: reading a node reads its graph, and the
        // driver does not synchronise calls on one graph (found by review: the reads ran unlocked
        // beside another thread's `instantiate` of the same `&Graph`).
        let _g = self.guard();
        self.nodes_locked()?.iter().map(node_type).collect()
    }
}

/// The type of `node`.
pub(crate) fn node_type(node: &Node) -> Result<NodeType> {
    // SAFETY: a live node (nodes are only handed out while their graph lives and is borrowed).
    let t = unsafe { result::graph_node_get_type(node.raw) }?;
    Ok(NodeType::from_raw(t))
}

impl<'g> GraphBody<'g> {
    /// The device of the graph.
    pub fn device(&self) -> &Device {
        &self.device
    }

    pub(crate) fn dep(&self, d: &Node) -> Result<sys::CUgraphNode> {
        if d.owner == self.owner {
            Ok(d.raw)
        } else {
            Err(Error::InvalidArgument("a dependency belongs to another graph or body".into()))
        }
    }

    fn deps(&self, deps: &[Node]) -> Result<Vec<sys::CUgraphNode>> {
        deps.iter().map(|d| self.dep(d)).collect()
    }

    fn node(&self, raw: sys::CUgraphNode) -> Node {
        Node { raw, owner: self.owner }
    }

    /// Adds a node through `f` (one of the `driver::result::graph_add_*` calls, given the raw
    /// dependencies, checked to belong to this body).
    fn add(
        &mut self,
        deps: &[Node],
        f: impl FnOnce(&[sys::CUgraphNode]) -> Result<sys::CUgraphNode>,
    ) -> Result<Node> {
        let deps = self.deps(deps)?;
        self.device.bind()?;
        let raw = f(&deps)?;
        Ok(self.node(raw))
    }

    /// Adds a node like [`GraphBody::add`], then orders it after every earlier node of this body
    /// that conflicts with its `uses` (identity of an allocation, how the node touches it), and
    /// records the uses.
    fn add_using(
        &mut self,
        deps: &[Node],
        uses: &[(usize, Access)],
        f: impl FnOnce(&[sys::CUgraphNode]) -> Result<sys::CUgraphNode>,
    ) -> Result<Node> {
        let node = self.add(deps, f)?;
        if let Err(e) = self.order_after_conflicts(node.raw, deps, uses) {
            self.remove_unordered(node.raw);
            return Err(e);
        }
        Ok(node)
    }

    /// Makes the graph refuse instantiation and nesting (see `NodeAccessMap::usable`).
    pub(crate) fn mark_has_handles(&mut self) {
        self.access.has_handles = true;
    }

    pub(crate) fn mark_orphaned_handle(&mut self) {
        self.access.orphaned_handle = true;
    }

    /// Removes a node that was added but could not be ordered after the earlier nodes that
    /// conflict with it (found by review: left in the graph, it raced them). Its implicit edges
    /// are forgotten too (a later node could get the same handle). If the driver cannot remove
    /// it, no node touching buffers is accepted any more.
    pub(crate) fn remove_unordered(&mut self, node: sys::CUgraphNode) {
        // SAFETY: a live node of this body's graph.
        if unsafe { result::graph_node_get_type(node) }
            .is_ok_and(|t| t == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL)
        {
            self.access.orphaned_handle = true;
        }
        self.access.implicit.retain(|&(_, to)| to != node as usize);
        // SAFETY: a live node of this body's graph, added by this builder, whose handle the
        // callers drop without using it again.
        if unsafe { result::graph_destroy_node(node) }.is_err() {
            self.access.poisoned = true;
            self.access.orphaned_handle = true;
        }
    }

    /// The implicit edges of [`NodeAccessMap`] for `node`, then the record of its uses.
    pub(crate) fn order_after_conflicts(
        &mut self,
        node: sys::CUgraphNode,
        explicit: &[Node],
        uses: &[(usize, Access)],
    ) -> Result<()> {
        // Only buffers' uses are unknown in a poisoned map; conditional handles (odd keys) are
        // created by the builder, so all their uses are in the map.
        if self.access.poisoned && uses.iter().any(|(k, _)| k & 1 == 0) {
            return Err(Error::InvalidArgument(
                "the graph's existing buffer uses could not be read: nodes touching buffers are refused"
                    .into(),
            ));
        }
        let map = self.access.by_body.entry(self.owner.1).or_default();
        let mut before: Vec<sys::CUgraphNode> = Vec::new();
        for (key, kind) in uses {
            let u = map.entry(*key).or_default();
            before.extend(u.writes.iter().copied());
            if *kind == Access::Write {
                before.extend(u.reads.iter().copied());
            }
        }
        before.retain(|n| *n != node && !explicit.iter().any(|d| d.raw == *n));
        // Never ask for an edge already added (the driver refuses a duplicate edge).
        before.retain(|b| !self.access.implicit.contains(&(*b as usize, node as usize)));
        before.sort();
        before.dedup();
        if !before.is_empty() && !explicit.is_empty() {
            // Leave out edges that the explicit dependencies already imply.
            let reached = ancestors_among(explicit.iter().map(|d| d.raw).collect(), &before)?;
            before.retain(|n| !reached.contains(n));
        }
        if !before.is_empty() {
            for b in &before {
                self.access.implicit.insert((*b as usize, node as usize));
            }
            let to = vec![node; before.len()];
            let during = "ordering a node after earlier uses of its buffers";
            // SAFETY: live graph; `before` and `node` are nodes of this body, the earlier ones
            // added before `node` (so no cycle); equal lengths.
            unsafe { result::graph_add_dependencies(self.raw, &before, &to, during) }?;
        }
        for (key, kind) in uses {
            let u = map.entry(*key).or_default();
            match kind {
                Access::Write => {
                    u.writes = vec![node];
                    u.reads.clear();
                }
                Access::Read => u.reads.push(node),
            }
        }
        Ok(())
    }

    /// An empty node: a barrier joining `deps`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a dependency of another graph or body; driver errors.
    pub fn add_empty(&mut self, deps: &[Node]) -> Result<Node> {
        let g = self.raw;
        // SAFETY: live graph; `deps` are nodes of it (checked); valid out-pointer.
        self.add(deps, |d| unsafe { result::graph_add_empty_node(g, d) })
    }

    /// Sets every element of `dst` to `value` (element sizes 1, 2 or 4 bytes). An empty `dst`
    /// gives an empty node joining `deps`.
    pub fn add_memset<T: DeviceRepr>(
        &mut self,
        dst: &mut DeviceBuffer<T>,
        value: T,
        deps: &[Node],
    ) -> Result<Node> {
        let size = std::mem::size_of::<T>();
        let bits = match size {
            // SAFETY: reading the value's bytes as an integer of the same size (T is POD).
            1 => (unsafe { std::mem::transmute_copy::<T, u8>(&value) }) as u32,
            // SAFETY: as above, 2 bytes.
            2 => (unsafe { std::mem::transmute_copy::<T, u16>(&value) }) as u32,
            // SAFETY: as above, 4 bytes.
            4 => unsafe { std::mem::transmute_copy::<T, u32>(&value) },
            n => {
                return Err(Error::InvalidArgument(format!(
                    "memset nodes take 1-, 2- or 4-byte elements, not {n}"
                )))
            }
        };
        self.check_device(dst.device())?;
        if dst.is_empty() {
            // Nothing to set (and the driver refuses a memset node of width 0): a barrier joining
            // `deps`, as the eager memsets skip empty buffers.
            return self.add_empty(deps);
        }
        self.keep.add_alloc(dst.allocation());
        let p = sys::CUDA_MEMSET_NODE_PARAMS {
            dst: dst.device_ptr(),
            pitch: 0,
            value: bits,
            elementSize: size as u32,
            width: dst.len(),
            height: 1,
        };
        let (g, ctx) = (self.raw, self.device.cu_context());
        let uses = [(key(dst.allocation()), Access::Write)];
        // SAFETY: live graph and context; the memset covers exactly `dst`'s elements, which stay
        // allocated while the graph can run (kept above).
        self.add_using(deps, &uses, |d| unsafe { result::graph_add_memset_node(g, d, &p, ctx) })
    }

    /// Copies `src` into `dst` (device to device; lengths must match). Buffers of no bytes give
    /// an empty node joining `deps`.
    pub fn add_copy<T: DeviceRepr>(
        &mut self,
        src: &DeviceBuffer<T>,
        dst: &mut DeviceBuffer<T>,
        deps: &[Node],
    ) -> Result<Node> {
        if src.len() != dst.len() {
            return Err(Error::LengthMismatch {
                during: "adding a copy node",
                expected: dst.len(),
                actual: src.len(),
            });
        }
        self.check_device(src.device())?;
        self.check_device(dst.device())?;
        if dst.size_bytes() == 0 {
            // Nothing to copy (and the driver refuses a copy node of width 0): a barrier joining
            // `deps`, as the eager copies skip empty buffers.
            return self.add_empty(deps);
        }
        self.keep.add_alloc(src.allocation());
        self.keep.add_alloc(dst.allocation());
        // Every field spelled out: the memory-type enums have no zero value, so zeroing the struct
        // would be undefined behaviour.
        let p = sys::CUDA_MEMCPY3D {
            srcXInBytes: 0,
            srcY: 0,
            srcZ: 0,
            srcLOD: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: src.device_ptr(),
            srcArray: std::ptr::null_mut(),
            reserved0: std::ptr::null_mut(),
            srcPitch: 0,
            srcHeight: 0,
            dstXInBytes: 0,
            dstY: 0,
            dstZ: 0,
            dstLOD: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: dst.device_ptr(),
            dstArray: std::ptr::null_mut(),
            reserved1: std::ptr::null_mut(),
            dstPitch: 0,
            dstHeight: 0,
            WidthInBytes: src.size_bytes(),
            Height: 1,
            Depth: 1,
        };
        let (g, ctx) = (self.raw, self.device.cu_context());
        let uses = [(key(src.allocation()), Access::Read), (key(dst.allocation()), Access::Write)];
        // SAFETY: live graph and context; both ranges are exactly size_bytes() and stay allocated.
        self.add_using(deps, &uses, |d| unsafe { result::graph_add_memcpy_node(g, d, &p, ctx) })
    }

    /// Runs `f` on a driver thread each time the node is reached in a replay. `f` is owned by the
    /// graph and its executables, and released only after the last replay that can call it has
    /// completed (see [`crate::graph::GraphExec`]), so it never dangles. A panic inside it is caught (and
    /// lost).
    ///
    /// # Safety
    /// `f` runs inside a CUDA driver callback: it must not call any CUDA API function (directly,
    /// or by dropping or using values of this crate that do, e.g. buffers, streams, events), and it
    /// must return promptly, since the graph's later nodes wait for it. The driver forbids CUDA
    /// calls there: it may deadlock or fail.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    /// let dev = cuda_core::Device::new(0)?;
    /// let mut graph = cuda_core::Graph::new(&dev)?;
    /// let hits = Arc::new(AtomicUsize::new(0));
    /// let h = hits.clone();
    /// // SAFETY: the closure only touches an atomic: no CUDA call, returns at once.
    /// unsafe { graph.builder().add_host(move || { h.fetch_add(1, Ordering::Relaxed); }, &[])? };
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`GraphBody::add_empty`].
    pub unsafe fn add_host<F: Fn() + Send + Sync + 'static>(&mut self, f: F, deps: &[Node]) -> Result<Node> {
        /// # Safety
        /// `data` must point to an `F` that is alive for the duration of the call (the graph's
        /// keep-alive set owns it for as long as any replay can reach the node).
        unsafe extern "C" fn trampoline<F: Fn() + Send + Sync + 'static>(data: *mut c_void) {
            // SAFETY: per this function's contract, `data` points to a live `F`.
            let f = unsafe { &*(data as *const F) };
            // A panic must not unwind out of this `extern "C"` function (an abort).
            crate::catch::catch_all(f);
        }
        let f = Arc::new(f);
        let p = sys::CUDA_HOST_NODE_PARAMS {
            fn_: Some(trampoline::<F>),
            userData: Arc::as_ptr(&f) as *mut c_void,
        };
        self.keep.add_extra(f);
        let g = self.raw;
        // SAFETY: live graph; the callback and its data outlive every replay (kept above).
        self.add(deps, |d| unsafe { result::graph_add_host_node(g, d, &p) })
    }

    /// Embeds a copy of `child` (e.g. a captured graph) as one node. The child's buffers, closures
    /// and events are kept alive by this graph too.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] for a child of another device; [`Error::InvalidArgument`] for a
    /// child that created conditional handles (its set-conditional nodes would set its handles
    /// from this graph) or whose conditional node was removed; errors of the implicit ordering; as
    /// for [`GraphBody::add_empty`].
    pub fn add_child(&mut self, child: &Graph, deps: &[Node]) -> Result<Node> {
        self.check_device(&child.device)?;
        child.usable()?;
        child.embeddable()?;
        self.keep.merge(&child.keep);
        let (g, c) = (self.raw, child.raw);
        // The child may write anything it keeps.
        let uses: Vec<(usize, Access)> = child.keep.allocs.iter().map(|a| (key(a), Access::Write)).collect();
        // The driver clones the child: under the child's lock, as every call on a `&Graph` (other
        // threads may use it; found by review).
        let _child = child.guard();
        // SAFETY: live graphs (the child under its lock); the driver clones the child.
        self.add_using(deps, &uses, |d| unsafe { result::graph_add_child_graph_node(g, d, c) })
    }

    /// Adds the work of `graph` (typically captured from one op): as a kernel node when it consists
    /// of exactly one kernel node (its parameters are copied), otherwise as a child-graph node. Its
    /// buffers, closures and events are kept alive by this graph.
    ///
    /// # Errors
    /// As for [`GraphBody::add_child`].
    pub fn add_captured(&mut self, graph: &Graph, deps: &[Node]) -> Result<Node> {
        self.check_device(&graph.device)?;
        graph.usable()?;
        graph.embeddable()?;
        let lock = graph.guard();
        let nodes = graph.nodes_locked()?;
        if let [only] = nodes.as_slice() {
            if node_type(only)? == NodeType::Kernel {
                // SAFETY: a live kernel node of `graph`, read under its lock (held until the
                // driver has copied the parameters into this graph's new node).
                let p = unsafe { result::graph_kernel_node_get_params(only.raw) }?;
                self.keep.merge(&graph.keep);
                let g = self.raw;
                let uses: Vec<(usize, Access)> =
                    graph.keep.allocs.iter().map(|a| (key(a), Access::Write)).collect();
                // SAFETY: live graph; `p` describes a kernel node of the same device whose parameter
                // values the driver copies; the memory they refer to is kept alive (merged above).
                return self.add_using(deps, &uses, |d| unsafe { result::graph_add_kernel_node(g, d, &p) });
            }
        }
        drop(lock);
        self.add_child(graph, deps)
    }

    /// Records `event` when the node is reached (the event is kept alive by the graph).
    ///
    /// # Errors
    /// [`Error::Capture`] if `event` was last recorded inside a stream capture (it belongs to that
    /// capture; re-record it outside one first); otherwise as for [`GraphBody::add_empty`].
    pub fn add_event_record(&mut self, event: &Arc<Event>, deps: &[Node]) -> Result<Node> {
        if *event.lock_tag() != 0 {
            return Err(Error::Capture(EVENT_IN_CAPTURE));
        }
        self.keep.add_event(event);
        let (g, e) = (self.raw, event.raw());
        // SAFETY: live graph and event (kept above).
        self.add(deps, |d| unsafe { result::graph_add_event_record_node(g, d, e) })
    }

    /// Waits for `event` before the node's dependents run (the event is kept alive by the graph).
    ///
    /// An event recorded inside a stream capture is refused here, and an event recorded inside one
    /// after the node was added makes [`Graph::instantiate`] and [`crate::GraphExec::launch`]
    /// refuse: a wait on it would pull the launch into the capture.
    ///
    /// # Errors
    /// [`Error::Capture`] if `event` was last recorded inside a stream capture; otherwise as for
    /// [`GraphBody::add_empty`].
    pub fn add_event_wait(&mut self, event: &Arc<Event>, deps: &[Node]) -> Result<Node> {
        if *event.lock_tag() != 0 {
            return Err(Error::Capture(EVENT_IN_CAPTURE));
        }
        self.keep.add_event(event);
        let (g, e) = (self.raw, event.raw());
        // SAFETY: live graph and event (kept above).
        self.add(deps, |d| unsafe { result::graph_add_event_wait_node(g, d, e) })
    }

    /// A kernel node launching `f` with `cfg` and `args`. Buffers among `args` are kept alive by
    /// the graph.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, DeviceBuffer, Graph, LaunchConfig};
    /// let dev = Device::new(0)?;
    /// let s = dev.new_stream()?;
    /// let src = r#"extern "C" __global__ void inc(int* x) { x[threadIdx.x] += 1; }"#;
    /// let inc = dev.compile_module("inc.cu", src, &[])?.function("inc")?;
    /// let mut x = DeviceBuffer::<i32>::zeros(&s, 32)?;
    /// let mut graph = Graph::new(&dev)?;
    /// let mut b = graph.builder();
    /// let set = b.add_memset(&mut x, 41, &[])?;
    /// // SAFETY: the argument matches `inc(int*)`; its 32 threads touch x[0..32] only.
    /// unsafe { b.add_kernel(&inc, LaunchConfig::for_elements(32, 32), (&mut x,), &[set])? };
    /// graph.instantiate(Default::default())?.launch(&s)?;
    /// assert_eq!(x.to_vec()?, vec![42; 32]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    /// As for [`Function::launch`]: the arguments must match the kernel's signature and the kernel
    /// must stay within the memory it is given, for every replay. Raw addresses (e.g. a
    /// [`GraphMem`]) must be valid whenever the node runs.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] for a kernel or buffer of another device; otherwise as for
    /// [`GraphBody::add_empty`].
    pub unsafe fn add_kernel<A: KernelArgs>(
        &mut self,
        f: &Function,
        cfg: LaunchConfig,
        args: A,
        deps: &[Node],
    ) -> Result<Node> {
        // SAFETY: the caller's contract.
        unsafe { self.add_kernel_using(f, cfg, args, deps, &[]) }
    }

    /// [`GraphBody::add_kernel`] with `extra` uses (keys of [`NodeAccessMap`], e.g. a conditional
    /// handle's) ordered with the buffers' in one pass (found by review: ordered in a second pass,
    /// an edge the first had added was asked for again, which the driver refuses).
    ///
    /// # Safety
    /// As for [`GraphBody::add_kernel`].
    pub(crate) unsafe fn add_kernel_using<A: KernelArgs>(
        &mut self,
        f: &Function,
        cfg: LaunchConfig,
        args: A,
        deps: &[Node],
        extra: &[(usize, Access)],
    ) -> Result<Node> {
        self.check_device(f.device())?;
        let g = self.raw;
        args.with_params(|ptrs, allocs| {
            // Buffers of another device are refused as `Function::launch` refuses them: the
            // kernel would address memory this device has no access to (found by review: the
            // safe `add_set_conditional` took a flag buffer of another device).
            if let Some((a, _)) =
                allocs.iter().flatten().find(|(a, _)| a.home_stream().device() != &self.device)
            {
                return Err(Error::DeviceMismatch {
                    during: "adding a kernel node with a buffer of another device",
                    expected: self.device.ordinal(),
                    actual: a.home_stream().device().ordinal(),
                });
            }
            for (a, _) in allocs.iter().flatten() {
                self.keep.add_alloc(a);
            }
            self.keep.add_function(f);
            let uses: Vec<(usize, Access)> =
                allocs.iter().flatten().map(|(a, k)| (key(a), *k)).chain(extra.iter().copied()).collect();
            let mut p: sys::CUDA_KERNEL_NODE_PARAMS = crate::zeroed::Zeroable::zeroed();
            p.func = f.raw();
            (p.gridDimX, p.gridDimY, p.gridDimZ) = cfg.grid;
            (p.blockDimX, p.blockDimY, p.blockDimZ) = cfg.block;
            p.sharedMemBytes = cfg.shared_mem_bytes;
            p.kernelParams = ptrs.as_mut_ptr();
            // SAFETY: live graph; the parameter values are copied by the driver during the call;
            // the caller upholds the kernel contract.
            self.add_using(deps, &uses, |d| unsafe { result::graph_add_kernel_node(g, d, &p) })
        })
    }

    /// Allocates `bytes` of graph-owned device memory when the node runs (a mem-alloc node). Free
    /// it with [`GraphBody::add_mem_free`] in the same graph.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero bytes; as for [`GraphBody::add_empty`].
    pub fn add_mem_alloc(&mut self, bytes: usize, deps: &[Node]) -> Result<(Node, GraphMem)> {
        if bytes == 0 {
            return Err(Error::InvalidArgument("a mem-alloc node needs at least one byte".into()));
        }
        let mut p: sys::CUDA_MEM_ALLOC_NODE_PARAMS = crate::zeroed::Zeroable::zeroed();
        p.poolProps.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        p.poolProps.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        p.poolProps.location.id = self.device.ordinal() as i32;
        p.bytesize = bytes;
        let g = self.raw;
        // SAFETY: live graph; valid params; the driver writes the address into `p.dptr`.
        let node = self.add(deps, |d| unsafe { result::graph_add_mem_alloc_node(g, d, &mut p) })?;
        Ok((node, GraphMem { ptr: p.dptr, bytes }))
    }

    /// Frees graph-owned memory (a mem-free node).
    ///
    /// `unsafe` because the builder cannot see which nodes use a [`GraphMem`] (only raw kernel
    /// arguments of [`GraphBody::add_kernel`] do): a free ordered before one of them, or not
    /// ordered against it, frees the memory under a running kernel. Found by review: safe, it let
    /// safe code break the promise that `add_kernel`'s caller made (that the address is valid
    /// whenever the node runs).
    ///
    /// ```compile_fail,E0133
    /// # fn demo(b: &mut cuda_core::GraphBody<'_>) -> cuda_core::Result<()> {
    /// let (alloc, mem) = b.add_mem_alloc(1024, &[])?;
    /// b.add_mem_free(mem, &[alloc])?; // error: call to unsafe function
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    /// `mem` comes from [`GraphBody::add_mem_alloc`] of this graph, is freed once, and every node
    /// that uses it is among `deps` or ordered before one of them.
    ///
    /// # Errors
    /// Driver errors (memory not allocated by a node of this graph, or freed twice); as for
    /// [`GraphBody::add_empty`].
    pub unsafe fn add_mem_free(&mut self, mem: GraphMem, deps: &[Node]) -> Result<Node> {
        let g = self.raw;
        // SAFETY: live graph; the driver validates that `mem` was allocated by a node of this
        // graph; the caller orders every use of it before the free.
        self.add(deps, |d| unsafe { result::graph_add_mem_free_node(g, d, mem.ptr) })
    }

    /// Adds edges: each `to[i]` depends on `from[i]`.
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] for lists of different lengths; [`Error::InvalidArgument`] for
    /// nodes of another graph or body; driver errors (e.g. an edge that would close a cycle).
    pub fn add_dependencies(&mut self, from: &[Node], to: &[Node]) -> Result<()> {
        if from.len() != to.len() {
            return Err(Error::LengthMismatch {
                during: "adding dependencies",
                expected: from.len(),
                actual: to.len(),
            });
        }
        let (mut f, mut t) = (self.deps(from)?, self.deps(to)?);
        // Edges the builder already added implicitly are not added again.
        let keep: Vec<bool> = f
            .iter()
            .zip(&t)
            .map(|(a, b)| !self.access.implicit.contains(&(*a as usize, *b as usize)))
            .collect();
        let mut k = keep.iter();
        f.retain(|_| *k.next().unwrap_or(&true));
        let mut k = keep.iter();
        t.retain(|_| *k.next().unwrap_or(&true));
        if f.is_empty() {
            return Ok(());
        }
        // SAFETY: live graph; nodes of it (checked); equal lengths.
        unsafe { result::graph_add_dependencies(self.raw, &f, &t, "adding graph dependencies") }
    }

    fn check_device(&self, d: &Device) -> Result<()> {
        if *d != self.device {
            return Err(Error::DeviceMismatch {
                during: "adding a graph node",
                expected: self.device.ordinal(),
                actual: d.ordinal(),
            });
        }
        Ok(())
    }
}

/// Which of `targets` are ancestors of (or equal to) a node of `start`, found by walking
/// dependencies backwards until every target is found or the ancestors are exhausted.
fn ancestors_among(
    start: Vec<sys::CUgraphNode>,
    targets: &[sys::CUgraphNode],
) -> Result<Vec<sys::CUgraphNode>> {
    let mut found = Vec::new();
    let mut seen: std::collections::HashSet<usize> = std::collections::HashSet::new();
    let mut stack = start;
    while let Some(n) = stack.pop() {
        if !seen.insert(n as usize) {
            continue;
        }
        if targets.contains(&n) && !found.contains(&n) {
            found.push(n);
            if found.len() == targets.len() {
                break;
            }
        }
        // SAFETY: a live node of the graph being built.
        let deps = unsafe { result::graph_node_get_dependencies(n) }?;
        stack.extend(deps);
    }
    Ok(found)
}

/// The identity of an allocation in a [`NodeAccessMap`] (the graph keeps the allocation alive, so
/// the address is not reused while the map exists).
pub(crate) fn key(a: &Arc<Allocation>) -> usize {
    Arc::as_ptr(a) as usize
}
