//! Graph calls: graphs, their nodes and edges, executable graphs, and graph memory.

use crate::error::{check, Error, Result};
use cudarc::driver::sys;

/// `cuGraphCreate(.., 0)`.
pub(crate) fn graph_create() -> Result<sys::CUgraph> {
    let mut raw = std::ptr::null_mut();
    // SAFETY: valid out-pointer; flags must be 0.
    check(unsafe { sys::cuGraphCreate(&mut raw, 0) }, "creating a graph")?;
    Ok(raw)
}

/// `cuGraphDestroy`.
///
/// # Safety
/// The caller owns `graph` and nothing uses it afterwards (executable graphs made from it are
/// independent of it).
pub(crate) unsafe fn graph_destroy(graph: sys::CUgraph) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::cuGraphDestroy(graph) }, "destroying a graph")
}

/// The number of top-level nodes of `graph` (`cuGraphGetNodes` with a null array), described as
/// `during`.
///
/// # Safety
/// `graph` must be live and not used concurrently.
pub(crate) unsafe fn graph_node_count(graph: sys::CUgraph, during: &'static str) -> Result<usize> {
    let mut n = 0usize;
    // SAFETY: live graph (caller); a null node array asks for the count only.
    check(unsafe { sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n) }, during)?;
    Ok(n)
}

/// At most `n` top-level nodes of `graph` (`cuGraphGetNodes`), described as `during`.
///
/// # Safety
/// As for [`graph_node_count`].
pub(crate) unsafe fn graph_get_nodes_up_to(
    graph: sys::CUgraph,
    n: usize,
    during: &'static str,
) -> Result<Vec<sys::CUgraphNode>> {
    let mut n = n;
    let mut nodes = vec![std::ptr::null_mut(); n];
    // SAFETY: live graph (caller); `nodes` has room for `n` nodes; the driver writes at most `n`
    // and updates `n`.
    check(unsafe { sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n) }, during)?;
    nodes.truncate(n);
    Ok(nodes)
}

/// Every top-level node of `graph` (its count, then the nodes), described as `during`.
///
/// # Safety
/// As for [`graph_node_count`].
pub(crate) unsafe fn graph_get_nodes(
    graph: sys::CUgraph,
    during: &'static str,
) -> Result<Vec<sys::CUgraphNode>> {
    // SAFETY: the caller's contract.
    let n = unsafe { graph_node_count(graph, during) }?;
    // SAFETY: the caller's contract.
    unsafe { graph_get_nodes_up_to(graph, n, during) }
}

/// Every edge of `graph` as `(from, to)` lists (`cuGraphGetEdges_v2`).
///
/// # Safety
/// As for [`graph_node_count`].
pub(crate) unsafe fn graph_get_edges(
    graph: sys::CUgraph,
) -> Result<(Vec<sys::CUgraphNode>, Vec<sys::CUgraphNode>)> {
    let mut e = 0usize;
    check(
        // SAFETY: live graph (caller); null arrays ask for the edge count.
        unsafe {
            sys::cuGraphGetEdges_v2(
                graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut e,
            )
        },
        "listing graph edges",
    )?;
    let (mut from, mut to) = (vec![std::ptr::null_mut(); e], vec![std::ptr::null_mut(); e]);
    // Edge data is read (and ignored): without an array for it the driver refuses graphs with
    // programmatic edges (`CUDA_ERROR_LOSSY_QUERY`), which `launch_overlapped` captures.
    let mut data = vec![NO_EDGE_DATA; e];
    if e > 0 {
        check(
            // SAFETY: the three arrays have room for `e` edges.
            unsafe {
                sys::cuGraphGetEdges_v2(graph, from.as_mut_ptr(), to.as_mut_ptr(), data.as_mut_ptr(), &mut e)
            },
            "listing graph edges",
        )?;
    }
    from.truncate(e);
    to.truncate(e);
    Ok((from, to))
}

/// Room for one edge's data (a default edge); what the driver writes there is not used.
const NO_EDGE_DATA: sys::CUgraphEdgeData =
    sys::CUgraphEdgeData { from_port: 0, to_port: 0, type_: 0, reserved: [0; 5] };

/// The nodes `node` depends on (`cuGraphNodeGetDependencies_v2`).
///
/// # Safety
/// `node` must be a live node of a graph that is not used concurrently.
pub(crate) unsafe fn graph_node_get_dependencies(node: sys::CUgraphNode) -> Result<Vec<sys::CUgraphNode>> {
    let mut k = 0usize;
    check(
        // SAFETY: a live node (caller); a null array asks for the count.
        unsafe {
            sys::cuGraphNodeGetDependencies_v2(node, std::ptr::null_mut(), std::ptr::null_mut(), &mut k)
        },
        "reading node dependencies",
    )?;
    if k == 0 {
        return Ok(Vec::new());
    }
    let mut deps = vec![std::ptr::null_mut(); k];
    let mut data = vec![NO_EDGE_DATA; k]; // as in `graph_get_edges`
    check(
        // SAFETY: `deps` and `data` have room for `k` nodes.
        unsafe { sys::cuGraphNodeGetDependencies_v2(node, deps.as_mut_ptr(), data.as_mut_ptr(), &mut k) },
        "reading node dependencies",
    )?;
    deps.truncate(k);
    Ok(deps)
}

/// `cuGraphNodeGetType`.
///
/// # Safety
/// `node` must be a live node.
pub(crate) unsafe fn graph_node_get_type(node: sys::CUgraphNode) -> Result<sys::CUgraphNodeType> {
    let mut t = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    // SAFETY: a live node (caller); valid out-pointer.
    check(unsafe { sys::cuGraphNodeGetType(node, &mut t) }, "reading a node type")?;
    Ok(t)
}

/// `cuGraphDestroyNode`: removes a node (and, for a conditional node, its body) with its edges.
///
/// # Safety
/// `node` must be a live node of a graph that is not used concurrently, and no handle to it may
/// be used afterwards.
pub(crate) unsafe fn graph_destroy_node(node: sys::CUgraphNode) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::cuGraphDestroyNode(node) }, "removing a graph node that could not be ordered")
}

/// `cuGraphAddDependencies_v2`: each `to[i]` depends on `from[i]` (no edge data), described as
/// `during`.
///
/// # Safety
/// `graph` must be live and not used concurrently; `from` and `to` nodes of it, of equal lengths.
pub(crate) unsafe fn graph_add_dependencies(
    graph: sys::CUgraph,
    from: &[sys::CUgraphNode],
    to: &[sys::CUgraphNode],
    during: &'static str,
) -> Result<()> {
    debug_assert_eq!(from.len(), to.len());
    check(
        // SAFETY: the caller's contract; the lengths are the caller's (equal).
        unsafe {
            sys::cuGraphAddDependencies_v2(graph, from.as_ptr(), to.as_ptr(), std::ptr::null(), from.len())
        },
        during,
    )
}

/// `cuGraphConditionalHandleCreate`.
///
/// # Safety
/// `graph` must be live and not used concurrently, `ctx` live.
pub(crate) unsafe fn graph_conditional_handle_create(
    graph: sys::CUgraph,
    ctx: sys::CUcontext,
    default: u32,
    flags: u32,
) -> Result<sys::CUgraphConditionalHandle> {
    let mut handle = 0;
    check(
        // SAFETY: the caller's contract; valid out-pointer.
        unsafe { sys::cuGraphConditionalHandleCreate(&mut handle, graph, ctx, default, flags) },
        "creating a conditional handle",
    )?;
    Ok(handle)
}

/// `cuGraphKernelNodeGetParams_v2`. The parameter pointers refer to storage of the node's graph.
///
/// # Safety
/// `node` must be a live kernel node.
pub(crate) unsafe fn graph_kernel_node_get_params(
    node: sys::CUgraphNode,
) -> Result<sys::CUDA_KERNEL_NODE_PARAMS> {
    let mut params: sys::CUDA_KERNEL_NODE_PARAMS = crate::zeroed::Zeroable::zeroed();
    check(
        // SAFETY: a live node (caller); valid out-pointer.
        unsafe { sys::cuGraphKernelNodeGetParams_v2(node, &mut params) },
        "reading kernel node parameters",
    )?;
    Ok(params)
}

/// The byte size of parameter `index` of `func` (`cuFuncGetParamInfo`), `None` past the last one
/// (where the driver fails).
///
/// # Safety
/// `func` must be a live function handle.
pub(crate) unsafe fn func_get_param_size(func: sys::CUfunction, index: usize) -> Option<usize> {
    let (mut offset, mut size) = (0usize, 0usize);
    // SAFETY: a live function handle (caller); valid out-pointers.
    let res = unsafe { sys::cuFuncGetParamInfo(func, index, &mut offset, &mut size) };
    (res == sys::CUresult::CUDA_SUCCESS).then_some(size)
}

/// `cuGraphInstantiateWithFlags`.
///
/// # Safety
/// `graph` must be live and not used concurrently.
pub(crate) unsafe fn graph_instantiate(graph: sys::CUgraph, flags: u64) -> Result<sys::CUgraphExec> {
    let mut raw = std::ptr::null_mut();
    check(
        // SAFETY: live graph (caller); valid out-pointer.
        unsafe { sys::cuGraphInstantiateWithFlags(&mut raw, graph, flags) },
        "instantiating a graph",
    )?;
    Ok(raw)
}

/// `cuGraphExecDestroy`. The driver completes an in-flight launch before freeing it.
///
/// # Safety
/// The caller owns `exec` and nothing uses it afterwards.
pub(crate) unsafe fn graph_exec_destroy(exec: sys::CUgraphExec) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::cuGraphExecDestroy(exec) }, "destroying an executable graph")
}

/// `cuGraphUpload`.
///
/// # Safety
/// `exec` and `stream` must be live, with the context current, and `exec` not used concurrently.
pub(crate) unsafe fn graph_upload(exec: sys::CUgraphExec, stream: sys::CUstream) -> Result<()> {
    // SAFETY: live graph exec and stream (caller).
    check(unsafe { sys::cuGraphUpload(exec, stream) }, "uploading a graph")
}

/// `cuGraphLaunch`.
///
/// # Safety
/// As for [`graph_upload`]; every address the graph uses must stay valid until the replay has run.
pub(crate) unsafe fn graph_launch(exec: sys::CUgraphExec, stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller's contract.
    check(unsafe { sys::cuGraphLaunch(exec, stream) }, "launching a graph")
}

/// `cuGraphExecUpdate_v2`: `Ok(None)` when updated, `Ok(Some(info))` when the driver refused the
/// update (`CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE`, the executable graph unchanged), other failures
/// as errors.
///
/// # Safety
/// `exec` and `graph` must be live and not used concurrently.
pub(crate) unsafe fn graph_exec_update(
    exec: sys::CUgraphExec,
    graph: sys::CUgraph,
) -> Result<Option<sys::CUgraphExecUpdateResultInfo>> {
    let mut info: sys::CUgraphExecUpdateResultInfo = crate::zeroed::Zeroable::zeroed();
    // SAFETY: live handles (caller); valid out-pointer.
    match unsafe { sys::cuGraphExecUpdate_v2(exec, graph, &mut info) } {
        sys::CUresult::CUDA_SUCCESS => Ok(None),
        sys::CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE => Ok(Some(info)),
        e => Err(Error::driver(e, "updating an executable graph")),
    }
}

/// `cuGraphExecKernelNodeSetParams_v2`.
///
/// # Safety
/// `exec` must be live and not used concurrently, `node` a kernel node of the graph it was
/// instantiated from, and `params` a valid description whose parameter pointers are valid for the
/// call (the driver copies the values).
pub(crate) unsafe fn graph_exec_kernel_node_set_params(
    exec: sys::CUgraphExec,
    node: sys::CUgraphNode,
    params: &sys::CUDA_KERNEL_NODE_PARAMS,
) -> Result<()> {
    check(
        // SAFETY: the caller's contract.
        unsafe { sys::cuGraphExecKernelNodeSetParams_v2(exec, node, params) },
        "setting kernel node parameters",
    )
}

/// `cuGraphDebugDotPrint`.
///
/// # Safety
/// `graph` must be live and not used concurrently.
pub(crate) unsafe fn graph_debug_dot_print(
    graph: sys::CUgraph,
    path: &std::ffi::CStr,
    flags: u32,
) -> Result<()> {
    // SAFETY: live graph (caller); NUL-terminated path.
    check(unsafe { sys::cuGraphDebugDotPrint(graph, path.as_ptr(), flags) }, "writing a DOT file")
}

/// `cuDeviceGetGraphMemAttribute` for an attribute of type `cuuint64_t`.
pub(crate) fn device_get_graph_mem_attribute(
    dev: sys::CUdevice,
    attr: sys::CUgraphMem_attribute,
) -> Result<u64> {
    let mut v = 0u64;
    check(
        // SAFETY: these attributes are cuuint64_t; valid out-pointer and device.
        unsafe { sys::cuDeviceGetGraphMemAttribute(dev, attr, (&mut v as *mut u64).cast()) },
        "reading graph memory usage",
    )?;
    Ok(v)
}

/// `cuDeviceSetGraphMemAttribute` to 0, which resets a high-water mark attribute.
pub(crate) fn device_reset_graph_mem_attribute(
    dev: sys::CUdevice,
    attr: sys::CUgraphMem_attribute,
) -> Result<()> {
    let mut zero = 0u64;
    check(
        // SAFETY: these attributes take a cuuint64_t that must be 0 (reset).
        unsafe { sys::cuDeviceSetGraphMemAttribute(dev, attr, (&mut zero as *mut u64).cast()) },
        "resetting graph memory high-water marks",
    )
}

/// `cuDeviceGraphMemTrim`.
pub(crate) fn device_graph_mem_trim(dev: sys::CUdevice) -> Result<()> {
    // SAFETY: valid device.
    check(unsafe { sys::cuDeviceGraphMemTrim(dev) }, "trimming graph memory")
}
