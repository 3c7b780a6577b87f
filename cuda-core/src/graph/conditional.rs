//! Conditional nodes (IF and WHILE), CUDA 12.4+.
//!
//! A [`Conditional`] is a handle created with the graph (or body) that will hold the conditional
//! node. The condition is set on the device: kernels compiled by NVRTC write the wanted value
//! (0 or not) into an ordinary `DeviceBuffer<u32>`, and a set-conditional node
//! ([`GraphBody::add_set_conditional`]) placed after them applies it with
//! `cudaGraphSetConditional`. That one kernel is compiled offline with nvcc against the device
//! runtime (`scripts/build-set-conditional.sh`) and embedded, because NVRTC alone cannot link the
//! device runtime. The handle can also be passed directly as a kernel argument (it implements
//! [`KernelParam`]) to kernels built with the device runtime.

use super::build::{GraphBody, Node};
use crate::driver::result;
use crate::error::{Error, Result};
use crate::launch::{KernelParam, LaunchConfig};
use crate::memory::DeviceBuffer;
use crate::module::{CudaModule, Function};
use cudarc::driver::sys;
use std::ffi::c_void;

/// The set-conditional kernel, built by `scripts/build-set-conditional.sh`.
const SET_CONDITIONAL_FATBIN: &[u8] = include_bytes!("../../cuda/set_conditional.fatbin");

/// IF runs its body once when the condition is non-zero; WHILE runs it as long as the condition
/// is non-zero when checked (before each iteration), with no iteration cap: a WHILE body that
/// never clears its condition loops forever (see [`GraphBody::add_while`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionalKind {
    /// Run the body once if the condition is set.
    If,
    /// Run the body while the condition is set.
    While,
}

/// A conditional handle (`CUgraphConditionalHandle`) of one graph or body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conditional {
    handle: sys::CUgraphConditionalHandle,
    owner: (u64, u64),
}

impl Conditional {
    /// The raw handle value (what `cudaGraphSetConditional` takes on the device).
    pub fn raw(&self) -> u64 {
        self.handle
    }

    /// The handle's key in the builder's record of uses (`build::NodeAccessMap`), so that the
    /// nodes that set it and the conditional node that reads it are ordered as a buffer's writers
    /// and readers are (found by review: only buffers were tracked, and an IF node whose
    /// set-conditional node was not listed among its dependencies read the handle before it was
    /// set). Odd, so never an allocation's key (an `Arc`'s address, which is even).
    pub(crate) fn access_key(&self) -> usize {
        ((self.handle as usize) << 1) | 1
    }
}

// SAFETY: the kernel receives the handle by value, a 64-bit integer; it refers to no memory.
unsafe impl KernelParam for Conditional {
    fn param_ptr(&self) -> *mut c_void {
        &self.handle as *const u64 as *mut c_void
    }
}

fn set_conditional_function(device: &crate::device::Device) -> Result<Function> {
    // The module must outlive every graph that uses it: kept (with the function) for the process.
    static F: crate::per_device::PerDevice<Function> = crate::per_device::PerDevice::new();
    F.get_or_try_init(device, || {
        CudaModule::from_cubin(device, SET_CONDITIONAL_FATBIN)?.function("cuda_async_set_conditional")
    })
    .cloned()
}

fn require_driver() -> Result<()> {
    let v = crate::driver::driver_version()?;
    if v < (12, 4) {
        return Err(Error::InvalidArgument(format!(
            "conditional graph nodes need a CUDA 12.4 or newer driver; this one supports CUDA {}.{}",
            v.0, v.1
        )));
    }
    Ok(())
}

impl<'g> GraphBody<'g> {
    /// Creates a conditional handle for a node of this graph (or body). `default` sets the value
    /// the condition takes at the start of every replay (`None`: left as the last replay set it,
    /// initially 0).
    ///
    /// # Errors
    /// Driver errors; an error on drivers older than CUDA 12.4.
    pub fn conditional(&mut self, default: Option<bool>) -> Result<Conditional> {
        require_driver()?;
        self.device.bind()?;
        let (value, flags) = match default {
            Some(v) => (v as u32, sys::CU_GRAPH_COND_ASSIGN_DEFAULT),
            None => (0, 0),
        };
        // SAFETY: live graph (borrowed mutably through this body) and context.
        let handle = unsafe {
            result::graph_conditional_handle_create(self.raw, self.device.cu_context(), value, flags)
        }?;
        self.mark_has_handles();
        Ok(Conditional { handle, owner: self.owner })
    }

    /// Adds an IF or WHILE node on `cond` and fills its body with `body`. Nodes of the body belong
    /// to the body (they cannot depend on nodes outside it); buffers, closures and events used in
    /// the body are kept alive by the whole graph.
    ///
    /// The body closure may use any error type that a `cuda_core::Error` converts into, so layers
    /// above can add their own ops inside bodies (name it with a turbofish when inference needs
    /// it: `add_while::<DeviceError>(..)`).
    pub fn add_conditional<E: From<Error>>(
        &mut self,
        cond: &Conditional,
        kind: ConditionalKind,
        deps: &[Node],
        body: impl FnOnce(&mut GraphBody<'_>) -> std::result::Result<(), E>,
    ) -> std::result::Result<Node, E> {
        let (raw, body_graph) = self.add_conditional_node(cond, kind, deps)?;
        *self.bodies += 1;
        let owner = (self.owner.0, *self.bodies);
        let mut b = GraphBody {
            raw: body_graph,
            owner,
            device: self.device,
            keep: self.keep,
            bodies: self.bodies,
            access: self.access,
        };
        // A body that fails leaves no node behind: the conditional node (with its partial body)
        // is removed, as a node that could not be ordered is (found by review: left in the graph
        // without the parent's implicit edges, the body's writes raced the parent's nodes). The
        // same for a body that panics (found by review: a caller that catches the panic could go
        // on building and launch the graph with the node unordered); the panic then goes on.
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&mut b)));
        if !matches!(run, Ok(Ok(()))) {
            // Marked whatever the driver answers about the node's type (see `remove_unordered`).
            self.mark_orphaned_handle();
            self.remove_unordered(raw);
            match run {
                Err(panic) => std::panic::resume_unwind(panic),
                Ok(Err(e)) => return Err(e),
                Ok(Ok(())) => {}
            }
        }
        // The node as a whole may write everything its body touches: order it after the parent's
        // earlier conflicting nodes.
        let mut uses: Vec<(usize, crate::memory::Access)> =
            self.access.touched(owner.1).into_iter().map(|k| (k, crate::memory::Access::Write)).collect();
        // ... and after the nodes that set its handle (unless its body sets it too: a write).
        if !uses.iter().any(|(k, _)| *k == cond.access_key()) {
            uses.push((cond.access_key(), crate::memory::Access::Read));
        }
        if let Err(e) = self.order_after_conflicts(raw, deps, &uses) {
            self.mark_orphaned_handle();
            self.remove_unordered(raw);
            return Err(e.into());
        }
        Ok(Node { raw, owner: self.owner })
    }

    /// Adds the conditional node; returns it and its body graph (owned by the node).
    fn add_conditional_node(
        &mut self,
        cond: &Conditional,
        kind: ConditionalKind,
        deps: &[Node],
    ) -> Result<(sys::CUgraphNode, sys::CUgraph)> {
        if cond.owner != self.owner {
            return Err(Error::InvalidArgument(
                "the conditional handle belongs to another graph or body".into(),
            ));
        }
        require_driver()?;
        let deps_raw: Vec<sys::CUgraphNode> = deps.iter().map(|d| self.dep(d)).collect::<Result<_>>()?;
        self.device.bind()?;
        let mut p: sys::CUgraphNodeParams = crate::zeroed::Zeroable::zeroed();
        p.type_ = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_CONDITIONAL;
        p.__bindgen_anon_1.conditional = sys::CUDA_CONDITIONAL_NODE_PARAMS {
            handle: cond.handle,
            type_: match kind {
                ConditionalKind::If => sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_IF,
                ConditionalKind::While => sys::CUgraphConditionalNodeType::CU_GRAPH_COND_TYPE_WHILE,
            },
            size: 1,
            // Output: the driver points this at its own array of body graphs.
            phGraph_out: std::ptr::null_mut(),
            ctx: self.device.cu_context(),
        };
        // SAFETY: live graph; `deps_raw` are nodes of it; `p` is a valid conditional description.
        let raw = unsafe { result::graph_add_conditional_node(self.raw, &deps_raw, &mut p) }?;
        // SAFETY: on success the driver set `phGraph_out` to its array of `size == 1` body graphs,
        // owned by the node (alive as long as the graph).
        let body_graph = unsafe {
            let arr = p.__bindgen_anon_1.conditional.phGraph_out;
            if arr.is_null() {
                return Err(Error::InvalidArgument("the driver returned no body graph".into()));
            }
            *arr
        };
        Ok((raw, body_graph))
    }

    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, DeviceBuffer, Error, Graph};
    /// let dev = Device::new(0)?;
    /// let s = dev.new_stream()?;
    /// let flag = DeviceBuffer::from_host(&s, &[0u32])?; // written by kernels in real use
    /// let mut x = DeviceBuffer::<u32>::zeros(&s, 16)?;
    /// let mut graph = Graph::new(&dev)?;
    /// let mut b = graph.builder();
    /// let cond = b.conditional(None)?;
    /// let set = b.add_set_conditional(&cond, &flag, &[])?; // cond = flag[0] != 0, on the device
    /// b.add_if::<Error>(&cond, &[set], |body| body.add_memset(&mut x, 1, &[]).map(drop))?;
    /// graph.instantiate(Default::default())?.launch(&s)?;
    /// assert_eq!(x.to_vec()?, vec![0; 16]); // flag[0] == 0: the body was skipped
    /// # Ok(()) }
    /// ```
    /// [`GraphBody::add_conditional`] with [`ConditionalKind::If`].
    pub fn add_if<E: From<Error>>(
        &mut self,
        cond: &Conditional,
        deps: &[Node],
        body: impl FnOnce(&mut GraphBody<'_>) -> std::result::Result<(), E>,
    ) -> std::result::Result<Node, E> {
        self.add_conditional(cond, ConditionalKind::If, deps, body)
    }

    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, DeviceBuffer, Error, Graph, LaunchConfig};
    /// let dev = Device::new(0)?;
    /// let s = dev.new_stream()?;
    /// let src = r#"extern "C" __global__ void step(int* n, unsigned* go) { *n -= 1; *go = *n > 0; }"#;
    /// let step = dev.compile_module("step.cu", src, &[])?.function("step")?;
    /// let (mut n, mut go) = (DeviceBuffer::from_host(&s, &[5i32])?, DeviceBuffer::<u32>::zeros(&s, 1)?);
    /// let mut graph = Graph::new(&dev)?;
    /// let mut b = graph.builder();
    /// let cond = b.conditional(Some(true))?; // set at the start of every replay
    /// b.add_while::<Error>(&cond, &[], |body| {
    ///     // SAFETY: matches `step(int*, unsigned*)`; one thread touches n[0] and go[0] only.
    ///     let k = unsafe { body.add_kernel(&step, LaunchConfig::for_elements(1, 1), (&mut n, &mut go), &[])? };
    ///     body.add_set_conditional(&cond, &go, &[k]).map(drop) // loop while n > 0
    /// })?;
    /// graph.instantiate(Default::default())?.launch(&s)?;
    /// assert_eq!(n.to_vec()?, [0]);
    /// # Ok(()) }
    /// ```
    /// [`GraphBody::add_conditional`] with [`ConditionalKind::While`].
    ///
    /// # Termination is the caller's
    /// The body runs for as long as the condition is non-zero when checked. A WHILE node whose
    /// body never clears its condition (no `add_set_conditional` that can write 0, or a flag that
    /// never becomes 0) runs forever, like `loop {}` in Rust: a replay never completes, so a
    /// `launch` followed by a synchronisation, or an await of the replay, never returns. The library
    /// does not cap the number of iterations (a cap would silently change what the graph
    /// computes) and cannot detect such a loop; it is a hang the caller writes, not one the
    /// library causes (see the README's promise). It is not undefined behaviour: memory stays
    /// sound, and the process can still be ended.
    pub fn add_while<E: From<Error>>(
        &mut self,
        cond: &Conditional,
        deps: &[Node],
        body: impl FnOnce(&mut GraphBody<'_>) -> std::result::Result<(), E>,
    ) -> std::result::Result<Node, E> {
        self.add_conditional(cond, ConditionalKind::While, deps, body)
    }

    /// A node that sets `cond` to `flag[0] != 0` on the device when it runs. `cond` may belong to
    /// this body or to an enclosing graph (a WHILE body sets its own loop's condition this way).
    pub fn add_set_conditional(
        &mut self,
        cond: &Conditional,
        flag: &DeviceBuffer<u32>,
        deps: &[Node],
    ) -> Result<Node> {
        if cond.owner.0 != self.owner.0 {
            return Err(Error::InvalidArgument("the conditional handle belongs to another graph".into()));
        }
        if flag.len() != 1 {
            return Err(Error::LengthMismatch {
                during: "adding a set-conditional node",
                expected: 1,
                actual: flag.len(),
            });
        }
        let f = set_conditional_function(&self.device)?;
        let cfg = LaunchConfig { grid: (1, 1, 1), block: (1, 1, 1), shared_mem_bytes: 0 };
        // The handle is written: ordered after the earlier nodes that set or read it.
        let write = [(cond.access_key(), crate::memory::Access::Write)];
        // SAFETY: matches `cuda_async_set_conditional(cudaGraphConditionalHandle, const unsigned*)`:
        // a 64-bit handle of this graph and a 1-element u32 buffer (kept alive by the graph); the
        // kernel reads flag[0] only.
        unsafe { self.add_kernel_using(&f, cfg, (*cond, flag), deps, &write) }
    }
}
