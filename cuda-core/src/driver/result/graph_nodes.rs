//! Graph calls that add nodes (`cuGraphAdd*Node`).

use crate::error::{check, Result};
use cudarc::driver::sys;

/// Adds a node through `add` (one of the `cuGraphAdd*Node` calls, given the out-pointer, the
/// dependency array and its length), described as `during`.
///
/// # Safety
/// `add` must be a sound call of the driver for these arguments (live graph, `deps` nodes of it,
/// valid parameters).
unsafe fn add_node(
    deps: &[sys::CUgraphNode],
    during: &'static str,
    add: impl FnOnce(*mut sys::CUgraphNode, *const sys::CUgraphNode, usize) -> sys::CUresult,
) -> Result<sys::CUgraphNode> {
    let mut raw = std::ptr::null_mut();
    check(add(&mut raw, deps.as_ptr(), deps.len()), during)?;
    Ok(raw)
}

/// `cuGraphAddEmptyNode`.
///
/// # Safety
/// `graph` must be live and not used concurrently, `deps` nodes of it.
pub(crate) unsafe fn graph_add_empty_node(
    graph: sys::CUgraph,
    deps: &[sys::CUgraphNode],
) -> Result<sys::CUgraphNode> {
    // SAFETY: the caller's contract; valid out-pointer.
    unsafe { add_node(deps, "adding an empty node", |out, d, n| sys::cuGraphAddEmptyNode(out, graph, d, n)) }
}

/// `cuGraphAddMemsetNode`.
///
/// # Safety
/// As for [`graph_add_empty_node`]; `ctx` live; the memset must stay inside memory that is
/// allocated whenever the node runs.
pub(crate) unsafe fn graph_add_memset_node(
    graph: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    params: &sys::CUDA_MEMSET_NODE_PARAMS,
    ctx: sys::CUcontext,
) -> Result<sys::CUgraphNode> {
    // SAFETY: the caller's contract.
    unsafe {
        add_node(deps, "adding a memset node", |out, d, n| {
            sys::cuGraphAddMemsetNode(out, graph, d, n, params, ctx)
        })
    }
}

/// `cuGraphAddMemcpyNode`.
///
/// # Safety
/// As for [`graph_add_memset_node`], for both ranges of the copy.
pub(crate) unsafe fn graph_add_memcpy_node(
    graph: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    params: &sys::CUDA_MEMCPY3D,
    ctx: sys::CUcontext,
) -> Result<sys::CUgraphNode> {
    // SAFETY: the caller's contract.
    unsafe {
        add_node(deps, "adding a copy node", |out, d, n| {
            sys::cuGraphAddMemcpyNode(out, graph, d, n, params, ctx)
        })
    }
}

/// `cuGraphAddHostNode`.
///
/// # Safety
/// As for [`graph_add_empty_node`]; the callback and its data must be sound to call whenever the
/// node runs.
pub(crate) unsafe fn graph_add_host_node(
    graph: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    params: &sys::CUDA_HOST_NODE_PARAMS,
) -> Result<sys::CUgraphNode> {
    // SAFETY: the caller's contract.
    unsafe {
        add_node(deps, "adding a host node", |out, d, n| sys::cuGraphAddHostNode(out, graph, d, n, params))
    }
}

/// `cuGraphAddChildGraphNode` (the driver clones `child`).
///
/// # Safety
/// As for [`graph_add_empty_node`]; `child` live.
pub(crate) unsafe fn graph_add_child_graph_node(
    graph: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    child: sys::CUgraph,
) -> Result<sys::CUgraphNode> {
    // SAFETY: the caller's contract.
    unsafe {
        add_node(deps, "adding a child graph node", |out, d, n| {
            sys::cuGraphAddChildGraphNode(out, graph, d, n, child)
        })
    }
}

/// `cuGraphAddKernelNode_v2` (the driver copies the parameter values).
///
/// # Safety
/// As for [`graph_add_empty_node`]; `params` describes a kernel of the graph's device whose
/// parameter pointers are valid for the call and match its signature, and the kernel stays within
/// memory that is allocated whenever the node runs.
pub(crate) unsafe fn graph_add_kernel_node(
    graph: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    params: &sys::CUDA_KERNEL_NODE_PARAMS,
) -> Result<sys::CUgraphNode> {
    // SAFETY: the caller's contract.
    unsafe {
        add_node(deps, "adding a kernel node", |out, d, n| {
            sys::cuGraphAddKernelNode_v2(out, graph, d, n, params)
        })
    }
}

/// `cuGraphAddEventRecordNode`.
///
/// # Safety
/// As for [`graph_add_empty_node`]; `event` live whenever the node runs.
pub(crate) unsafe fn graph_add_event_record_node(
    graph: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    event: sys::CUevent,
) -> Result<sys::CUgraphNode> {
    // SAFETY: the caller's contract.
    unsafe {
        add_node(deps, "adding an event record node", |out, d, n| {
            sys::cuGraphAddEventRecordNode(out, graph, d, n, event)
        })
    }
}

/// `cuGraphAddEventWaitNode`.
///
/// # Safety
/// As for [`graph_add_event_record_node`].
pub(crate) unsafe fn graph_add_event_wait_node(
    graph: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    event: sys::CUevent,
) -> Result<sys::CUgraphNode> {
    // SAFETY: the caller's contract.
    unsafe {
        add_node(deps, "adding an event wait node", |out, d, n| {
            sys::cuGraphAddEventWaitNode(out, graph, d, n, event)
        })
    }
}

/// `cuGraphAddMemAllocNode`; the driver writes the address into `params.dptr`.
///
/// # Safety
/// As for [`graph_add_empty_node`].
pub(crate) unsafe fn graph_add_mem_alloc_node(
    graph: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    params: &mut sys::CUDA_MEM_ALLOC_NODE_PARAMS,
) -> Result<sys::CUgraphNode> {
    // SAFETY: the caller's contract; `params` is a valid in/out pointer.
    unsafe {
        add_node(deps, "adding a mem-alloc node", |out, d, n| {
            sys::cuGraphAddMemAllocNode(out, graph, d, n, params)
        })
    }
}

/// `cuGraphAddMemFreeNode` (the driver checks that `ptr` was allocated by a node of the graph).
///
/// # Safety
/// As for [`graph_add_empty_node`].
pub(crate) unsafe fn graph_add_mem_free_node(
    graph: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    ptr: sys::CUdeviceptr,
) -> Result<sys::CUgraphNode> {
    // SAFETY: the caller's contract.
    unsafe {
        add_node(deps, "adding a mem-free node", |out, d, n| {
            sys::cuGraphAddMemFreeNode(out, graph, d, n, ptr)
        })
    }
}

/// `cuGraphAddNode_v2` for a conditional node (no edge data); the driver writes the body graphs
/// into `params`.
///
/// # Safety
/// As for [`graph_add_empty_node`]; `params` a valid conditional node description.
pub(crate) unsafe fn graph_add_conditional_node(
    graph: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    params: &mut sys::CUgraphNodeParams,
) -> Result<sys::CUgraphNode> {
    let mut raw = std::ptr::null_mut();
    check(
        // SAFETY: the caller's contract; valid out-pointer.
        unsafe {
            sys::cuGraphAddNode_v2(&mut raw, graph, deps.as_ptr(), std::ptr::null(), deps.len(), params)
        },
        "adding a conditional node",
    )?;
    Ok(raw)
}
