//! `bench-graph`: the cost of `cuda-async`'s CUDA graphs (`CudaGraph::scope`, replays as ops,
//! `.await` of a replay, parameter handles) over the same graphs built and launched through raw
//! driver calls, side by side in one process.
//!
//! A tiny kernel (`x[i] = 0.999f * x[i] + 1.0f` over 32 floats, one block of 32 threads) is
//! compiled once with cuda-core's NVRTC and loaded twice: with raw `cuModuleLoadData` for the
//! baseline, and with `Module::from_cubin` for the framework, where a small custom op, [`Tiny`]
//! (a `DeviceOp` and a `GraphNode`), launches it. Raw graphs are made with
//! `cuStreamBeginCapture_v2` / `cuLaunchKernel` / `cuStreamEndCapture` /
//! `cuGraphInstantiateWithFlags` / `cuGraphUpload` and replayed with `cuGraphLaunch`; framework
//! graphs with `CudaGraph::scope` recording `Tiny`s, replayed with `graph.launch()`. Every graph is
//! a linear chain of launches on one buffer unless said otherwise.
//!
//! 1. Replay of graphs of 10, 100 and 1,000 tiny kernels: M/N (M = 100,000 kernels) replays queued
//!    back to back (`unsafe { graph.launch().async_on(&s) }` vs `cuGraphLaunch`), then one
//!    synchronize; µs per kernel (goal ≤ 1.02× raw).
//! 2. Host cost of one launch call of the 10-kernel graph of 1: the time of the call alone
//!    (`unsafe { graph.launch().async_on(&s) }` vs `cuGraphLaunch`), median over C (10,000) calls,
//!    with a synchronize every 100 calls outside the timed region so that the queue never fills; µs
//!    per call (goal ≤ raw + 0.3 µs).
//! 3. Capture + instantiate + upload of a 1,000-node graph (`CudaGraph::scope` vs the raw
//!    sequence, upload on both sides, not waited for); destruction is outside the timed region; ms
//!    per graph (goal ≤ 1.2×).
//! 4. 100 tiny kernels (one per buffer, 100 buffers): `graph.launch().sync_on(&s)` of a graph of
//!    the 100 `Tiny`s vs the same 100 `Tiny`s run eagerly as `join_all(..).sync_on(&s)`; µs per
//!    round trip (goal: speedup eager/graph ≥ 2.5×, i.e. ratio graph/eager ≤ 0.4).
//! 5. `.await` of a replay of a 1-kernel graph on a current-thread tokio runtime
//!    (`graph.launch().on(&s).await`) vs raw `cuGraphLaunch` + `cuStreamSynchronize`; µs per round
//!    trip (goal ≤ 1.25×).
//! 6. Kernel-parameter update through a handle: a graph of 100 `kernels::ops::scale(&x, a, &mut
//!    y_i)` nodes (100 output buffers of 256 floats), each recorded with `record_param`;
//!    `graph.set_param(&h, v)` for all 100 handles, S (100) sweeps per repeat, vs raw
//!    `cuGraphExecKernelNodeSetParams_v2` with cached node parameters on the same graph built raw
//!    from the same kernel source; µs per node (goal ≤ 1.5 µs per node, absolute).
//!
//! Every measurement warms up, then repeats R times alternating which side goes first; medians are
//! compared. Afterwards every tiny-kernel buffer of both sides is copied back and checked against a
//! host reference for the number of kernels that ran on it, and for 6 each output is checked to be
//! `v_i * x` after setting distinct factors and replaying once (on both sides).
//!
//! `cargo run --release -p cuda-async-examples --bin bench-graph -- [--repeats R]
//! [--replay-kernels M] [--calls C] [--sync-every E] [--captures K] [--capture-nodes L]
//! [--iters I] [--roundtrips T] [--sweeps S] [--json PATH]`

use cuda_async::graph::ParamHandle;
use cuda_async::{CudaGraph, DeviceError, DeviceOp, DeviceOpExt, ExecutionContext, GraphNode};
use cuda_async_examples::bench::{self, Json, OptSpec, Options, Report, Row, SplitMix64, JSON_OPT};
use cuda_core::nvrtc::KernelCache;
use cuda_core::{Device, DeviceBuffer, Error, Function, LaunchConfig, Module, Stream};
use cudarc::driver::sys;
use kernels::Kernels;
use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;
use tokio::runtime::Runtime;

/// The kernel both sides launch. One block of 32 threads over 32 floats.
const SRC: &str = r#"extern "C" __global__ void tiny(float* x, float a, unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = a * x[i] + 1.0f;
}
"#;
const KERNEL: &CStr = c"tiny";
/// The raw side's copy of `kernels`' `scale_f32(const float* x, float alpha, float* out, n)`.
const SCALE_KERNEL: &CStr = c"scale_f32";
const ELEMS: usize = 32;
/// `x <- a*x + 1` with `a < 1` converges to `1 / (1 - a)` = 1000: values stay finite for any number
/// of launches.
const SCALE: f32 = 0.999;
const CFG: LaunchConfig = LaunchConfig { grid: (1, 1, 1), block: (ELEMS as u32, 1, 1), shared_mem_bytes: 0 };

/// Graph sizes of 1.
const SIZES: [usize; 3] = [10, 100, 1000];
/// Index in [`SIZES`] of the graph measurement 2 launches (10 kernels).
const HOST_COST_SIZE: usize = 0;
/// Kernels (and buffers) of measurement 4.
const WIDE: usize = 100;
/// Nodes (and output buffers) of measurement 6.
const PARAM_NODES: usize = 100;
/// Elements of `x` and of every output of 6.
const PARAM_ELEMS: usize = 256;

const GOAL_REPLAY: f64 = 1.02;
const GOAL_HOST_EXTRA_US: f64 = 0.3;
const GOAL_CAPTURE: f64 = 1.2;
const GOAL_SPEEDUP: f64 = 2.5;
const GOAL_AWAIT: f64 = 1.25;
const GOAL_SET_PARAM_US: f64 = 1.5;

const SPEC: &[OptSpec] = &[
    OptSpec {
        name: "--repeats",
        value: "R",
        help: "repeats of every measurement; medians are reported (default 9)",
    },
    OptSpec {
        name: "--replay-kernels",
        value: "M",
        help: "kernels per repeat for 1: M/N replays of the N-kernel graph (default 100000)",
    },
    OptSpec { name: "--calls", value: "C", help: "timed launch calls per repeat for 2 (default 10000)" },
    OptSpec {
        name: "--sync-every",
        value: "E",
        help: "synchronize (untimed) after every E launch calls in 2 (default 100)",
    },
    OptSpec { name: "--captures", value: "K", help: "captures per repeat for 3 (default 10)" },
    OptSpec { name: "--capture-nodes", value: "L", help: "kernels per captured graph in 3 (default 1000)" },
    OptSpec { name: "--iters", value: "I", help: "round trips per repeat for 4 (default 500)" },
    OptSpec { name: "--roundtrips", value: "T", help: "awaited round trips per repeat for 5 (default 2000)" },
    OptSpec {
        name: "--sweeps",
        value: "S",
        help: "sweeps over all 100 parameter handles per repeat for 6 (default 100)",
    },
    JSON_OPT,
];

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-graph: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Turns a cuda-core error into a message naming what was being done.
fn ctx(what: &'static str) -> impl FnOnce(Error) -> String {
    move |e| format!("{what}: {e}")
}

/// Turns a cuda-async error into a message naming what was being done.
fn dctx(what: &'static str) -> impl FnOnce(DeviceError) -> String {
    move |e| format!("{what}: {e}")
}

// ---------------------------------------------------------------------------------------------
// The framework's op
// ---------------------------------------------------------------------------------------------

/// One launch of the tiny kernel on a buffer, as a `cuda-async` op.
struct Tiny<'a> {
    func: &'a Function,
    buf: &'a mut DeviceBuffer<f32>,
}

impl DeviceOp for Tiny<'_> {
    type Output = ();

    #[inline]
    fn execute(self, ctx: &ExecutionContext<'_>) -> cuda_async::Result<()> {
        let n = self.buf.len() as u64;
        // SAFETY: `tiny(float* x, float a, unsigned long long n)` takes exactly
        // (&mut DeviceBuffer<f32>, f32, u64) in this order and layout. It writes x[i] only for
        // i < n = self.buf.len() (and i < 32, the block size), through the exclusive `&mut`
        // buffer; `Function::launch` orders the launch after the buffer's earlier uses if its home
        // stream is not ctx.stream(), and while capturing records the buffer's allocation so that
        // the graph keeps it alive.
        unsafe { self.func.launch(ctx.stream(), CFG, (self.buf, SCALE, n)) }?;
        Ok(())
    }
}

// SAFETY: `execute` queues exactly one kernel launch on an existing buffer, through
// `Function::launch` (which records the buffer with the capture): it allocates nothing, frees
// nothing, adds no host callback and does not synchronise, so it can be recorded and replayed.
unsafe impl GraphNode for Tiny<'_> {}

/// A framework buffer with the number of kernels that have run on it (for the correctness check).
struct Counted {
    buf: DeviceBuffer<f32>,
    launches: u64,
}

/// The framework side's buffers, function and stream. Field order is drop order: the buffers'
/// frees are queued first, then the function (and its module) go, then the stream. (The graphs
/// are locals of `run`, dropped before this.)
struct Fw {
    /// One per [`SIZES`] entry: 1, and 2 with the first.
    sized: Vec<Counted>,
    /// 3 (captured, never run).
    capture: Counted,
    /// 4: [`WIDE`] buffers.
    wide: Vec<Counted>,
    /// 5.
    single: Counted,
    /// 6: the input and the [`PARAM_NODES`] outputs.
    px: DeviceBuffer<f32>,
    pys: Vec<DeviceBuffer<f32>>,
    func: Function,
    stream: Stream,
}

impl Fw {
    fn new(dev: &Device, image: &[u8], init: &[f32], px: &[f32]) -> Result<Fw, String> {
        let module = Module::from_cubin(dev, image).map_err(ctx("Module::from_cubin"))?;
        let func = module.function("tiny").map_err(ctx("Module::function"))?;
        let stream = Stream::new(dev).map_err(ctx("Stream::new"))?;
        let counted = || {
            DeviceBuffer::from_host(&stream, init)
                .map(|buf| Counted { buf, launches: 0 })
                .map_err(ctx("DeviceBuffer::from_host"))
        };
        let sized = SIZES.iter().map(|_| counted()).collect::<Result<Vec<_>, _>>()?;
        let capture = counted()?;
        let wide = (0..WIDE).map(|_| counted()).collect::<Result<Vec<_>, _>>()?;
        let single = counted()?;
        let px_buf = DeviceBuffer::from_host(&stream, px).map_err(ctx("DeviceBuffer::from_host (x of 6)"))?;
        let pys = (0..PARAM_NODES)
            .map(|_| {
                DeviceBuffer::zeros(&stream, px.len()).map_err(ctx("DeviceBuffer::zeros (outputs of 6)"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        stream.synchronize().map_err(ctx("Stream::synchronize after the uploads"))?;
        Ok(Fw { sized, capture, wide, single, px: px_buf, pys, func, stream })
    }
}

/// Records `n` `Tiny`s on `c`'s buffer into a new graph (capture, instantiate, upload).
fn fw_chain_graph(
    func: &Function,
    stream: &Stream,
    c: &mut Counted,
    n: usize,
) -> Result<CudaGraph<()>, String> {
    CudaGraph::scope(stream, |sc| {
        for _ in 0..n {
            sc.record(Tiny { func, buf: &mut c.buf })?;
        }
        Ok(())
    })
    .map_err(dctx("CudaGraph::scope (chain of Tiny)"))
}

// ---------------------------------------------------------------------------------------------
// Raw driver side
// ---------------------------------------------------------------------------------------------

/// `Ok` for `CUDA_SUCCESS`, else a message with the driver's name and description of the error.
#[inline]
fn ck(r: sys::CUresult, what: &'static str) -> Result<(), String> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(raw_error(r, what))
    }
}

#[cold]
fn raw_error(r: sys::CUresult, what: &'static str) -> String {
    let mut p: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: only called after a raw driver call returned, so the driver library is loaded (raw
    // calls happen only after `Device::new` succeeded). cuGetErrorString stores a pointer to a
    // static NUL-terminated string, or leaves ours null for an unknown code; we check both.
    let desc = unsafe {
        if sys::cuGetErrorString(r, &mut p) == sys::CUresult::CUDA_SUCCESS && !p.is_null() {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        } else {
            "no description".to_string()
        }
    };
    format!("{what} failed: {r:?} ({}): {desc}", r as u32)
}

/// A raw graph and its executable, destroyed on drop (or by [`RawGraph::destroy`]).
struct RawGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

impl RawGraph {
    /// Destroys both handles, reporting the first failure. Idempotent.
    fn destroy(&mut self) -> Result<(), String> {
        let mut first = Ok(());
        if !self.exec.is_null() {
            // SAFETY: our executable graph; the driver defers destruction past in-flight launches.
            first = ck(unsafe { sys::cuGraphExecDestroy(self.exec) }, "cuGraphExecDestroy");
            self.exec = std::ptr::null_mut();
        }
        if !self.graph.is_null() {
            // SAFETY: our graph; executables made from it are independent of it.
            let r = ck(unsafe { sys::cuGraphDestroy(self.graph) }, "cuGraphDestroy");
            self.graph = std::ptr::null_mut();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl Drop for RawGraph {
    fn drop(&mut self) {
        let _ = self.destroy();
    }
}

/// One kernel node of the raw graph of 6, with its parameters cached for updates.
struct RawParamNode {
    node: sys::CUgraphNode,
    /// The node's parameters as read once after capture (function, grid, block...).
    base: sys::CUDA_KERNEL_NODE_PARAMS,
    x: sys::CUdeviceptr,
    out: sys::CUdeviceptr,
    n: u64,
}

/// The baseline: raw handles, created and destroyed by hand. `bufs` are tiny-kernel buffers of
/// ELEMS floats with their launch counts; `px`/`pys` the input and outputs of 6.
struct Raw {
    dev: Device,
    tiny_module: sys::CUmodule,
    tiny: sys::CUfunction,
    scale_module: sys::CUmodule,
    scale: sys::CUfunction,
    stream: sys::CUstream,
    bufs: Vec<sys::CUdeviceptr>,
    launches: Vec<u64>,
    px: sys::CUdeviceptr,
    pys: Vec<sys::CUdeviceptr>,
}

/// Indices of the raw side's tiny-kernel buffers: one per [`SIZES`] entry (1 and 2), one for 3,
/// one for 5.
struct RawLayout;

impl RawLayout {
    const SIZED: usize = 0;
    const CAPTURE: usize = SIZES.len();
    const SINGLE: usize = SIZES.len() + 1;
    const LEN: usize = SIZES.len() + 2;
}

/// Loads a CUBIN into the current context.
fn load_module(image: &[u8], name: &CStr) -> Result<(sys::CUmodule, sys::CUfunction), String> {
    // The driver reads the image in place and may assume ELF alignment: copy it to u64s.
    let aligned: Vec<u64> = image
        .chunks(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_ne_bytes(w)
        })
        .collect();
    if aligned.is_empty() {
        return Err("empty CUBIN image".into());
    }
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `aligned` holds the complete CUBIN (its ELF header gives the size) at an 8-byte
    // aligned address and lives across the call; the context is current; valid out-pointer.
    ck(unsafe { sys::cuModuleLoadData(&mut module, aligned.as_ptr().cast()) }, "cuModuleLoadData")?;
    let mut func: sys::CUfunction = std::ptr::null_mut();
    // SAFETY: live module, NUL-terminated name, valid out-pointer.
    let r = ck(unsafe { sys::cuModuleGetFunction(&mut func, module, name.as_ptr()) }, "cuModuleGetFunction");
    if let Err(e) = r {
        // SAFETY: our module, unused.
        unsafe { sys::cuModuleUnload(module) };
        return Err(e);
    }
    Ok((module, func))
}

impl Raw {
    /// Loads both images in the device's primary context, creates a non-blocking stream, allocates
    /// the buffers and uploads `init` into each tiny-kernel buffer and `px` into the input of 6
    /// (its outputs are zeroed). On error, whatever was created is released (by `Drop`).
    fn new(
        dev: &Device,
        tiny_image: &[u8],
        scale_image: &[u8],
        init: &[f32],
        px: &[f32],
    ) -> Result<Raw, String> {
        if init.len() != ELEMS {
            return Err(format!("raw upload: expected {ELEMS} floats, got {}", init.len()));
        }
        dev.bind().map_err(ctx("binding the primary context for the raw side"))?;
        let mut side = Raw {
            dev: *dev,
            tiny_module: std::ptr::null_mut(),
            tiny: std::ptr::null_mut(),
            scale_module: std::ptr::null_mut(),
            scale: std::ptr::null_mut(),
            stream: std::ptr::null_mut(),
            bufs: Vec::with_capacity(RawLayout::LEN),
            launches: vec![0; RawLayout::LEN],
            px: 0,
            pys: Vec::with_capacity(PARAM_NODES),
        };
        (side.tiny_module, side.tiny) = load_module(tiny_image, KERNEL)?;
        (side.scale_module, side.scale) = load_module(scale_image, SCALE_KERNEL)?;
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: valid out-pointer; the context is current.
        ck(unsafe { sys::cuStreamCreate(&mut side.stream, flags) }, "cuStreamCreate")?;
        for _ in 0..RawLayout::LEN {
            let p = side.alloc_upload(init)?;
            side.bufs.push(p);
        }
        side.px = side.alloc_upload(px)?;
        let zeros = vec![0f32; px.len()];
        for _ in 0..PARAM_NODES {
            let p = side.alloc_upload(&zeros)?;
            side.pys.push(p);
        }
        // Pageable host-to-device copies may return before the DMA has finished, and they run on
        // the legacy stream, which our non-blocking stream does not wait for: wait for the context.
        // SAFETY: the context is current.
        ck(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")?;
        Ok(side)
    }

    /// Allocates a buffer for `data` and copies `data` into it. The allocation is freed by
    /// `close` only if the caller stores it in `bufs`, `px` or `pys` (it does so right away).
    fn alloc_upload(&self, data: &[f32]) -> Result<sys::CUdeviceptr, String> {
        let bytes = std::mem::size_of_val(data);
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; the context is current.
        ck(unsafe { sys::cuMemAlloc_v2(&mut p, bytes) }, "cuMemAlloc_v2")?;
        // SAFETY: `p` is our allocation of `bytes` bytes; `data` is a live slice of that size.
        let r = ck(unsafe { sys::cuMemcpyHtoD_v2(p, data.as_ptr().cast(), bytes) }, "cuMemcpyHtoD_v2");
        if let Err(e) = r {
            // SAFETY: our allocation, unused by any queued work.
            unsafe { sys::cuMemFree_v2(p) };
            return Err(e);
        }
        Ok(p)
    }

    /// Queues one launch of the tiny kernel on buffer `k` (not counted: during a capture it only
    /// records).
    #[inline]
    fn enqueue_tiny(&self, k: usize) -> Result<(), String> {
        let mut x = self.bufs[k];
        let mut a = SCALE;
        let mut n = ELEMS as u64;
        let mut params: [*mut c_void; 3] = [
            (&mut x as *mut sys::CUdeviceptr).cast(),
            (&mut a as *mut f32).cast(),
            (&mut n as *mut u64).cast(),
        ];
        let (g, b) = (CFG.grid, CFG.block);
        // SAFETY: `params` points to three live locals laid out as the kernel's
        // (float*, float, unsigned long long); the kernel writes x[i] only for i < n = ELEMS, the
        // size of the allocation; live function and stream of the current context.
        ck(
            unsafe {
                sys::cuLaunchKernel(
                    self.tiny,
                    g.0,
                    g.1,
                    g.2,
                    b.0,
                    b.1,
                    b.2,
                    CFG.shared_mem_bytes,
                    self.stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel",
        )
    }

    /// Queues `out = alpha * x` (the scale kernel, `kernels`' launch configuration) on `out`.
    fn enqueue_scale(&self, cfg: LaunchConfig, out: sys::CUdeviceptr, alpha: f32) -> Result<(), String> {
        let (mut x, mut a, mut o, mut n) = (self.px, alpha, out, PARAM_ELEMS as u64);
        let mut params: [*mut c_void; 4] = [
            (&mut x as *mut sys::CUdeviceptr).cast(),
            (&mut a as *mut f32).cast(),
            (&mut o as *mut sys::CUdeviceptr).cast(),
            (&mut n as *mut u64).cast(),
        ];
        let (g, b) = (cfg.grid, cfg.block);
        // SAFETY: `params` points to four live locals laid out as `scale_f32(const float* x,
        // float alpha, float* out, unsigned long long n)`; the kernel reads x[0..n] and writes
        // out[0..n] (grid-stride), and both allocations hold PARAM_ELEMS = n floats; live function
        // and stream of the current context.
        ck(
            unsafe {
                sys::cuLaunchKernel(
                    self.scale,
                    g.0,
                    g.1,
                    g.2,
                    b.0,
                    b.1,
                    b.2,
                    cfg.shared_mem_bytes,
                    self.stream,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel (scale)",
        )
    }

    /// Captures what `record` queues on the stream into a graph (thread-local mode, like the
    /// framework's default), instantiates it (no flags) and uploads it on the stream (not waited
    /// for).
    fn capture(&self, record: impl FnOnce(&Raw) -> Result<(), String>) -> Result<RawGraph, String> {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: our live stream of the current context.
        ck(unsafe { sys::cuStreamBeginCapture_v2(self.stream, mode) }, "cuStreamBeginCapture_v2")?;
        let recorded = record(self);
        let mut g = RawGraph { graph: std::ptr::null_mut(), exec: std::ptr::null_mut() };
        // SAFETY: our capturing stream; valid out-pointer. Always called, so the stream leaves
        // capture mode even if `record` failed.
        let ended = ck(unsafe { sys::cuStreamEndCapture(self.stream, &mut g.graph) }, "cuStreamEndCapture");
        recorded?;
        ended?;
        // SAFETY: our live graph; valid out-pointer.
        ck(
            unsafe { sys::cuGraphInstantiateWithFlags(&mut g.exec, g.graph, 0) },
            "cuGraphInstantiateWithFlags",
        )?;
        // SAFETY: our live executable graph and stream.
        ck(unsafe { sys::cuGraphUpload(g.exec, self.stream) }, "cuGraphUpload")?;
        Ok(g)
    }

    /// Captures `n` tiny launches on buffer `k`.
    fn chain_graph(&self, k: usize, n: usize) -> Result<RawGraph, String> {
        self.capture(|r| (0..n).try_for_each(|_| r.enqueue_tiny(k)))
    }

    #[inline]
    fn graph_launch(&self, g: &RawGraph) -> Result<(), String> {
        // SAFETY: our live executable graph and stream; every buffer its nodes use is ours and
        // outlives it (freed only in `close`, after synchronizing and after the graphs are gone).
        ck(unsafe { sys::cuGraphLaunch(g.exec, self.stream) }, "cuGraphLaunch")
    }

    #[inline]
    fn sync(&self) -> Result<(), String> {
        // SAFETY: our live stream of the current context.
        ck(unsafe { sys::cuStreamSynchronize(self.stream) }, "cuStreamSynchronize")
    }

    /// Waits for the stream, then copies `len` floats back from `ptr`.
    fn download(&self, ptr: sys::CUdeviceptr, len: usize) -> Result<Vec<f32>, String> {
        self.dev.bind().map_err(ctx("binding the primary context"))?;
        self.sync()?;
        let mut out = vec![0f32; len];
        // SAFETY: `out` holds `len` floats; `ptr` is one of our allocations of `len` floats (the
        // callers pass matching lengths); the work that writes it (on our stream) has completed.
        ck(
            unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), ptr, std::mem::size_of_val(&out[..])) },
            "cuMemcpyDtoH_v2",
        )?;
        Ok(out)
    }

    /// The kernel nodes of `g` (the raw graph of 6), each with its parameters read once.
    fn param_nodes(&self, g: &RawGraph) -> Result<Vec<RawParamNode>, String> {
        let mut count = 0usize;
        // SAFETY: our live graph; a null array asks for the count only.
        ck(unsafe { sys::cuGraphGetNodes(g.graph, std::ptr::null_mut(), &mut count) }, "cuGraphGetNodes")?;
        let mut nodes: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); count];
        // SAFETY: `nodes` has room for `count` handles.
        ck(unsafe { sys::cuGraphGetNodes(g.graph, nodes.as_mut_ptr(), &mut count) }, "cuGraphGetNodes")?;
        nodes.truncate(count);
        let mut out = Vec::with_capacity(count);
        for node in nodes {
            let mut ty = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            // SAFETY: a live node of our graph; valid out-pointer.
            ck(unsafe { sys::cuGraphNodeGetType(node, &mut ty) }, "cuGraphNodeGetType")?;
            if ty != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
                return Err(format!("raw graph of 6: unexpected node type {ty:?}"));
            }
            // SAFETY: zeroed is valid for this plain C struct; the driver fills it.
            let mut base: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
            // SAFETY: a live kernel node of our graph; valid out-pointer.
            ck(
                unsafe { sys::cuGraphKernelNodeGetParams_v2(node, &mut base) },
                "cuGraphKernelNodeGetParams_v2",
            )?;
            if base.func != self.scale || base.kernelParams.is_null() {
                return Err("raw graph of 6: a node is not the scale kernel with parameters".into());
            }
            // SAFETY: the node launches `scale_f32(const float*, float, float*, unsigned long
            // long)`, so its parameter array holds four pointers to values of those types, owned
            // by the (live) graph; we copy the values out.
            let (x, out_ptr, n) = unsafe {
                let p = base.kernelParams;
                (
                    *(*p.add(0) as *const sys::CUdeviceptr),
                    *(*p.add(2) as *const sys::CUdeviceptr),
                    *(*p.add(3) as *const u64),
                )
            };
            base.kernelParams = std::ptr::null_mut();
            base.extra = std::ptr::null_mut();
            out.push(RawParamNode { node, base, x, out: out_ptr, n });
        }
        Ok(out)
    }

    /// Sets the factor of node `p` of the executable `g` to `alpha`
    /// (`cuGraphExecKernelNodeSetParams_v2` with the cached parameters).
    #[inline]
    fn set_alpha(&self, g: &RawGraph, p: &RawParamNode, alpha: f32) -> Result<(), String> {
        let (mut x, mut a, mut o, mut n) = (p.x, alpha, p.out, p.n);
        let mut ptrs: [*mut c_void; 4] = [
            (&mut x as *mut sys::CUdeviceptr).cast(),
            (&mut a as *mut f32).cast(),
            (&mut o as *mut sys::CUdeviceptr).cast(),
            (&mut n as *mut u64).cast(),
        ];
        let mut params = p.base;
        params.kernelParams = ptrs.as_mut_ptr();
        // SAFETY: live executable graph and a kernel node of the graph it was instantiated from;
        // the parameter array points to four live locals of the kernel's types, and only the
        // factor differs from the captured values (same buffers, same length). The driver copies
        // the values during the call.
        ck(
            unsafe { sys::cuGraphExecKernelNodeSetParams_v2(g.exec, p.node, &params) },
            "cuGraphExecKernelNodeSetParams_v2",
        )
    }

    /// Synchronizes and releases every handle, reporting the first failure (but releasing the
    /// rest regardless). Idempotent: released handles are cleared. Raw graphs must be destroyed
    /// before (they are locals declared after `Raw`, so they also drop first on an early error).
    fn close(&mut self) -> Result<(), String> {
        self.dev.bind().map_err(ctx("binding the primary context to release raw handles"))?;
        let mut first: Result<(), String> = Ok(());
        let mut keep = |r: Result<(), String>| {
            if first.is_ok() {
                first = r;
            }
        };
        if !self.stream.is_null() {
            // SAFETY: our live stream; the context is current.
            keep(ck(unsafe { sys::cuStreamSynchronize(self.stream) }, "cuStreamSynchronize"));
        }
        let px = std::mem::take(&mut self.px);
        for p in self.bufs.drain(..).chain(self.pys.drain(..)).chain((px != 0).then_some(px)) {
            // SAFETY: our allocation; the only stream that used it has been synchronized above.
            keep(ck(unsafe { sys::cuMemFree_v2(p) }, "cuMemFree_v2"));
        }
        if !self.stream.is_null() {
            // SAFETY: our stream; nothing uses it afterwards (cleared below).
            keep(ck(unsafe { sys::cuStreamDestroy_v2(self.stream) }, "cuStreamDestroy_v2"));
            self.stream = std::ptr::null_mut();
        }
        for (module, func) in
            [(&mut self.tiny_module, &mut self.tiny), (&mut self.scale_module, &mut self.scale)]
        {
            if !module.is_null() {
                // SAFETY: our module; every launch of its kernels was on our stream, synchronized
                // above, and the graphs that used them are gone; the function handle is cleared.
                keep(ck(unsafe { sys::cuModuleUnload(*module) }, "cuModuleUnload"));
                *module = std::ptr::null_mut();
                *func = std::ptr::null_mut();
            }
        }
        first
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        // Only reached with live handles on an early error; the explicit close() reports errors.
        let _ = self.close();
    }
}

// ---------------------------------------------------------------------------------------------
// 1: replay throughput
// ---------------------------------------------------------------------------------------------

/// Raw: `replays` launches of `g` (an `nodes`-kernel chain on buffer `k`), then one synchronize;
/// µs per kernel.
fn raw_replays(raw: &mut Raw, g: &RawGraph, k: usize, nodes: usize, replays: usize) -> Result<f64, String> {
    raw.sync()?;
    let t = Instant::now();
    for _ in 0..replays {
        raw.graph_launch(g)?;
    }
    raw.sync()?;
    let us = t.elapsed().as_secs_f64() * 1e6 / (replays * nodes).max(1) as f64;
    raw.launches[k] += (replays * nodes) as u64;
    Ok(us)
}

/// Framework: `replays` times `graph.launch().async_on(&stream)`, then one synchronize; µs per
/// kernel.
fn fw_replays(
    graph: &CudaGraph<()>,
    stream: &Stream,
    c: &mut Counted,
    nodes: usize,
    replays: usize,
) -> Result<f64, String> {
    stream.synchronize().map_err(ctx("Stream::synchronize"))?;
    let t = Instant::now();
    for _ in 0..replays {
        // SAFETY: the output is `()`: nothing refers to results the GPU has not finished; the
        // buffer the replay writes is read only through `to_vec`, which waits for its home stream.
        unsafe { graph.launch().async_on(stream) }.map_err(dctx("graph.launch().async_on"))?;
    }
    stream.synchronize().map_err(ctx("Stream::synchronize"))?;
    let us = t.elapsed().as_secs_f64() * 1e6 / (replays * nodes).max(1) as f64;
    c.launches += (replays * nodes) as u64;
    Ok(us)
}

// ---------------------------------------------------------------------------------------------
// 2: host cost of one launch call
// ---------------------------------------------------------------------------------------------

/// Raw: `calls` timed `cuGraphLaunch` calls of `g` (a `nodes`-kernel chain on buffer `k`), with
/// an untimed synchronize every `sync_every`; median µs per call.
fn raw_host_cost(
    raw: &mut Raw,
    g: &RawGraph,
    (k, nodes): (usize, usize),
    calls: usize,
    sync_every: usize,
) -> Result<f64, String> {
    raw.sync()?;
    let mut samples = Vec::with_capacity(calls);
    for i in 0..calls {
        let t = Instant::now();
        let r = raw.graph_launch(g);
        samples.push(t.elapsed().as_secs_f64() * 1e6);
        r?;
        if (i + 1) % sync_every == 0 {
            raw.sync()?;
        }
    }
    raw.sync()?;
    raw.launches[k] += (calls * nodes) as u64;
    Ok(bench::median(&samples))
}

/// Framework: `calls` timed `unsafe { graph.launch().async_on(&stream) }` calls, with an untimed
/// synchronize every `sync_every`; median µs per call.
fn fw_host_cost(
    graph: &CudaGraph<()>,
    stream: &Stream,
    (c, nodes): (&mut Counted, usize),
    calls: usize,
    sync_every: usize,
) -> Result<f64, String> {
    stream.synchronize().map_err(ctx("Stream::synchronize"))?;
    let mut samples = Vec::with_capacity(calls);
    for i in 0..calls {
        let t = Instant::now();
        // SAFETY: as in `fw_replays`: the output is `()`, the buffer is only read by `to_vec`.
        let r = unsafe { graph.launch().async_on(stream) };
        samples.push(t.elapsed().as_secs_f64() * 1e6);
        r.map_err(dctx("graph.launch().async_on"))?;
        if (i + 1) % sync_every == 0 {
            stream.synchronize().map_err(ctx("Stream::synchronize"))?;
        }
    }
    stream.synchronize().map_err(ctx("Stream::synchronize"))?;
    c.launches += (calls * nodes) as u64;
    Ok(bench::median(&samples))
}

// ---------------------------------------------------------------------------------------------
// 3: capture + instantiate + upload
// ---------------------------------------------------------------------------------------------

/// Raw: `captures` times capture `nodes` tiny launches on buffer `k`, instantiate and upload
/// (timed), then synchronize and destroy (untimed); ms per graph.
fn raw_capture_cost(raw: &Raw, k: usize, nodes: usize, captures: usize) -> Result<f64, String> {
    let mut total = 0.0;
    for _ in 0..captures {
        raw.sync()?;
        let t = Instant::now();
        let mut g = raw.chain_graph(k, nodes)?;
        total += t.elapsed().as_secs_f64();
        raw.sync()?;
        g.destroy()?;
    }
    Ok(total * 1e3 / captures.max(1) as f64)
}

/// Framework: `captures` times `CudaGraph::scope` recording `nodes` `Tiny`s on `c`'s buffer
/// (timed: capture, instantiate, upload), then synchronize and drop (untimed); ms per graph.
fn fw_capture_cost(
    func: &Function,
    stream: &Stream,
    c: &mut Counted,
    nodes: usize,
    captures: usize,
) -> Result<f64, String> {
    let mut total = 0.0;
    for _ in 0..captures {
        stream.synchronize().map_err(ctx("Stream::synchronize"))?;
        let t = Instant::now();
        let graph = fw_chain_graph(func, stream, c, nodes)?;
        total += t.elapsed().as_secs_f64();
        stream.synchronize().map_err(ctx("Stream::synchronize"))?;
        drop(graph);
    }
    Ok(total * 1e3 / captures.max(1) as f64)
}

// ---------------------------------------------------------------------------------------------
// 4: graph replay vs eager ops
// ---------------------------------------------------------------------------------------------

/// `iters` times `graph.launch().sync_on(&stream)` of the graph of one `Tiny` per buffer of
/// `bufs`; µs per round trip.
fn fw_graph_round_trips(
    graph: &CudaGraph<()>,
    stream: &Stream,
    bufs: &mut [Counted],
    iters: usize,
) -> Result<f64, String> {
    stream.synchronize().map_err(ctx("Stream::synchronize"))?;
    let t = Instant::now();
    for _ in 0..iters {
        graph.launch().sync_on(stream).map_err(dctx("graph.launch().sync_on"))?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / iters.max(1) as f64;
    for c in bufs {
        c.launches += iters as u64;
    }
    Ok(us)
}

/// `iters` times `join_all` of one `Tiny` per buffer of `bufs`, `.sync_on(&stream)`; µs per
/// round trip.
fn fw_eager_round_trips(
    func: &Function,
    stream: &Stream,
    bufs: &mut [Counted],
    iters: usize,
) -> Result<f64, String> {
    stream.synchronize().map_err(ctx("Stream::synchronize"))?;
    let t = Instant::now();
    for _ in 0..iters {
        cuda_async::join_all(bufs.iter_mut().map(|c| Tiny { func, buf: &mut c.buf }))
            .sync_on(stream)
            .map_err(dctx("join_all(Tiny..).sync_on"))?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / iters.max(1) as f64;
    for c in bufs {
        c.launches += iters as u64;
    }
    Ok(us)
}

// ---------------------------------------------------------------------------------------------
// 5: awaited replay
// ---------------------------------------------------------------------------------------------

/// Raw: `n` times (`cuGraphLaunch` of the 1-kernel graph `g` on buffer `k`; synchronize); µs per
/// round trip.
fn raw_graph_round_trips(raw: &mut Raw, g: &RawGraph, k: usize, n: usize) -> Result<f64, String> {
    raw.sync()?;
    let t = Instant::now();
    for _ in 0..n {
        raw.graph_launch(g)?;
        raw.sync()?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64;
    raw.launches[k] += n as u64;
    Ok(us)
}

/// Framework: `n` times `graph.launch().on(&stream).await` inside `rt.block_on`; µs per round
/// trip.
fn fw_await_replays(
    rt: &Runtime,
    graph: &CudaGraph<()>,
    stream: &Stream,
    c: &mut Counted,
    n: usize,
) -> Result<f64, String> {
    stream.synchronize().map_err(ctx("Stream::synchronize"))?;
    let us = rt
        .block_on(async {
            let t = Instant::now();
            for _ in 0..n {
                graph.launch().on(stream).await?;
            }
            Ok::<f64, DeviceError>(t.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64)
        })
        .map_err(dctx("awaiting graph.launch().on(&stream)"))?;
    c.launches += n as u64;
    Ok(us)
}

// ---------------------------------------------------------------------------------------------
// 6: parameter updates
// ---------------------------------------------------------------------------------------------

/// The factor of sweep `s` (changes every sweep, so that every update changes the value).
fn sweep_factor(s: usize) -> f32 {
    1.0 + (s % 8) as f32 * 0.125
}

/// The distinct factor node `i` gets for the correctness check (exact in binary).
fn check_factor(i: usize) -> f32 {
    1.0 + i as f32 / 64.0
}

/// Raw: `sweeps` times set the factor of every node; µs per node.
fn raw_set_params(raw: &Raw, g: &RawGraph, nodes: &[RawParamNode], sweeps: usize) -> Result<f64, String> {
    let t = Instant::now();
    for s in 0..sweeps {
        let v = sweep_factor(s);
        for p in nodes {
            raw.set_alpha(g, p, v)?;
        }
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / (sweeps * nodes.len()).max(1) as f64)
}

/// Framework: `sweeps` times `graph.set_param(&h, v)` for every handle; µs per node.
fn fw_set_params<T>(
    graph: &CudaGraph<T>,
    handles: &[ParamHandle<f32>],
    sweeps: usize,
) -> Result<f64, String> {
    let t = Instant::now();
    for s in 0..sweeps {
        let v = sweep_factor(s);
        for h in handles {
            graph.set_param(h, v).map_err(dctx("CudaGraph::set_param"))?;
        }
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / (sweeps * handles.len()).max(1) as f64)
}

/// Checks `got == v * x` elementwise (relative 1e-6); `what` names the buffer.
fn check_scaled(what: &str, x: &[f32], v: f32, got: &[f32]) -> Result<(), String> {
    if got.len() != x.len() {
        return Err(format!("{what}: {} values, expected {}", got.len(), x.len()));
    }
    for (i, (&xi, &g)) in x.iter().zip(got).enumerate() {
        let e = v * xi;
        if !g.is_finite() || ((g - e) / e).abs() > 1e-6 {
            return Err(format!("{what}: [{i}] = {g}, expected {v} * {xi} = {e}"));
        }
    }
    Ok(())
}

/// Framework: sets node `i`'s factor to `check_factor(i)`, replays once (`sync_on`), and checks
/// every output.
fn fw_check_params<T: Sync>(
    graph: &CudaGraph<T>,
    handles: &[ParamHandle<f32>],
    fw: &Fw,
    x: &[f32],
) -> Result<(), String> {
    for (i, h) in handles.iter().enumerate() {
        graph.set_param(h, check_factor(i)).map_err(dctx("CudaGraph::set_param"))?;
    }
    graph.launch().sync_on(&fw.stream).map_err(dctx("graph.launch().sync_on (6)"))?;
    for (i, y) in fw.pys.iter().enumerate() {
        let got = y.to_vec().map_err(ctx("DeviceBuffer::to_vec (6)"))?;
        check_scaled(&format!("framework output {i} of 6"), x, check_factor(i), &got)?;
    }
    Ok(())
}

/// Raw: sets the factor of the node writing output `i` to `check_factor(i)`, replays once,
/// synchronizes, and checks every output.
fn raw_check_params(raw: &Raw, g: &RawGraph, nodes: &[RawParamNode], x: &[f32]) -> Result<(), String> {
    let index: HashMap<sys::CUdeviceptr, usize> = raw.pys.iter().enumerate().map(|(i, &p)| (p, i)).collect();
    if nodes.len() != raw.pys.len() {
        return Err(format!("raw graph of 6: {} nodes for {} outputs", nodes.len(), raw.pys.len()));
    }
    for p in nodes {
        let i = *index.get(&p.out).ok_or("raw graph of 6: a node writes an unknown buffer")?;
        raw.set_alpha(g, p, check_factor(i))?;
    }
    raw.graph_launch(g)?;
    raw.sync()?;
    for (i, &y) in raw.pys.iter().enumerate() {
        let got = raw.download(y, x.len())?;
        check_scaled(&format!("raw output {i} of 6"), x, check_factor(i), &got)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Correctness of the tiny-kernel buffers
// ---------------------------------------------------------------------------------------------

/// `x <- fma(a, x, 1)` `launches` times on the host (stops early at the fixed point).
fn host_reference(init: &[f32], launches: u64) -> Vec<f32> {
    init.iter()
        .map(|&x0| {
            let mut x = x0;
            for _ in 0..launches {
                let next = SCALE.mul_add(x, 1.0);
                if next == x {
                    break;
                }
                x = next;
            }
            x
        })
        .collect()
}

/// Host references by launch count, computed once each.
#[derive(Default)]
struct References(HashMap<u64, Vec<f32>>);

impl References {
    fn get(&mut self, init: &[f32], launches: u64) -> &[f32] {
        self.0.entry(launches).or_insert_with(|| host_reference(init, launches))
    }
}

/// Checks one buffer: finite, changed (if launched), and within 1e-3 (relative) of the host
/// reference. Returns the largest relative difference.
fn check_buffer(
    what: &str,
    init: &[f32],
    got: &[f32],
    launches: u64,
    refs: &mut References,
) -> Result<f64, String> {
    if got.len() != init.len() {
        return Err(format!("{what}: {} values, expected {}", got.len(), init.len()));
    }
    if let Some(i) = got.iter().position(|v| !v.is_finite()) {
        return Err(format!("{what}: non-finite value {} at [{i}]", got[i]));
    }
    if launches > 0 {
        if let Some(i) = (0..got.len()).find(|&i| got[i] == init[i]) {
            return Err(format!(
                "{what}: value [{i}] = {} still equals its initial value after {launches} launches",
                got[i]
            ));
        }
    }
    let expect = refs.get(init, launches);
    let max_rel = expect
        .iter()
        .zip(got)
        .map(|(&e, &g)| ((g as f64 - e as f64) / e as f64).abs())
        .fold(0.0f64, f64::max);
    if max_rel.is_nan() || max_rel > 1e-3 {
        return Err(format!(
            "{what}: differs from the host reference for {launches} launches by up to {max_rel:.3e} (relative)"
        ));
    }
    Ok(max_rel)
}

/// Copies every tiny-kernel buffer of both sides back and checks it; returns a one-line summary.
fn check_tiny(init: &[f32], fw: &Fw, raw: &Raw) -> Result<String, String> {
    fw.stream.synchronize().map_err(ctx("Stream::synchronize before the check"))?;
    let mut refs = References::default();
    let (mut n, mut launches, mut worst) = (0usize, 0u64, 0.0f64);
    let groups: [(&str, Vec<&Counted>); 4] = [
        ("framework sized", fw.sized.iter().collect()),
        ("framework capture", vec![&fw.capture]),
        ("framework wide", fw.wide.iter().collect()),
        ("framework single", vec![&fw.single]),
    ];
    for (what, bufs) in groups {
        for (k, c) in bufs.into_iter().enumerate() {
            let got = c.buf.to_vec().map_err(ctx("DeviceBuffer::to_vec"))?;
            let what = format!("{what} buffer {k}");
            worst = worst.max(check_buffer(&what, init, &got, c.launches, &mut refs)?);
            n += 1;
            launches += c.launches;
        }
    }
    for (k, &p) in raw.bufs.iter().enumerate() {
        let got = raw.download(p, ELEMS)?;
        let what = format!("raw buffer {k}");
        worst = worst.max(check_buffer(&what, init, &got, raw.launches[k], &mut refs)?);
        n += 1;
        launches += raw.launches[k];
    }
    Ok(format!(
        "{n} tiny-kernel buffers, {launches} kernels in all, every buffer finite, changed (if run), and \
         within {worst:.1e} (relative) of the host reference for its kernel count"
    ))
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

struct Params {
    repeats: usize,
    replay_kernels: usize,
    calls: usize,
    sync_every: usize,
    captures: usize,
    capture_nodes: usize,
    iters: usize,
    round_trips: usize,
    sweeps: usize,
}

fn run() -> Result<(), String> {
    let opts = Options::from_env(SPEC)?;
    if opts.help_requested() {
        print!(
            "{}",
            bench::usage(
                "bench-graph",
                "Compares cuda-async CUDA graphs (scope, replay, .await, parameter handles) with raw CUDA \
                 driver graph calls.",
                SPEC
            )
        );
        return Ok(());
    }
    let p = Params {
        repeats: opts.count_or("--repeats", 9, 1)?,
        replay_kernels: opts.count_or("--replay-kernels", 100_000, 1)?,
        calls: opts.count_or("--calls", 10_000, 1)?,
        sync_every: opts.count_or("--sync-every", 100, 1)?,
        captures: opts.count_or("--captures", 10, 1)?,
        capture_nodes: opts.count_or("--capture-nodes", 1_000, 1)?,
        iters: opts.count_or("--iters", 500, 1)?,
        round_trips: opts.count_or("--roundtrips", 2_000, 1)?,
        sweeps: opts.count_or("--sweeps", 100, 1)?,
    };
    let json_path = opts.get("--json").map(PathBuf::from);

    // Classify "no GPU here" clearly before anything else touches the driver.
    match cuda_core::gpu_available() {
        Ok(_) => {}
        Err(e @ Error::NoDriver { .. }) => return Err(format!("no CUDA driver: {e}")),
        Err(e @ Error::NoDevice { .. }) => return Err(format!("no CUDA device: {e}")),
        Err(e) => return Err(format!("the CUDA driver is unusable: {e}")),
    }
    let dev = Device::new(0).map_err(ctx("opening device 0"))?;
    cuda_async::scheduling::set_default_device(0).map_err(dctx("setting the default device"))?;
    let (drv_major, drv_minor) = cuda_core::driver_version().map_err(ctx("reading the driver version"))?;
    let arch = dev.sm_arch().map_err(ctx("reading the compute capability"))?;
    let (nvrtc_major, nvrtc_minor) = cuda_core::nvrtc::nvrtc_version().map_err(ctx("loading NVRTC"))?;
    let mut rng = SplitMix64::from_time();
    let seed = rng.state();
    println!(
        "bench-graph: {} ({arch}), driver CUDA {drv_major}.{drv_minor}, NVRTC {nvrtc_major}.{nvrtc_minor}",
        dev.name()
    );

    // Kernels must not compile during a capture: load `kernels`' modules now.
    let kern = Kernels::get(&dev).map_err(ctx("Kernels::get (compiling the kernels crate)"))?;
    let tiny = KernelCache::memory_only()
        .compile(&dev, "tiny.cu", SRC, &[])
        .map_err(ctx("compiling the tiny kernel with NVRTC"))?;
    let scale_src = KernelCache::global()
        .compile(&dev, "elementwise.cu", kernels::ELEMENTWISE_SRC, &["-std=c++17".to_string()])
        .map_err(ctx("compiling the elementwise kernels for the raw side with NVRTC"))?;
    let init: Vec<f32> = (0..ELEMS).map(|_| rng.f32_in(0.5, 1.5)).collect();
    let px: Vec<f32> = (0..PARAM_ELEMS).map(|_| rng.f32_in(0.5, 1.5)).collect();

    let mut raw = Raw::new(&dev, &tiny.image, &scale_src.image, &init, &px)?;
    let mut fw = Fw::new(&dev, &tiny.image, &init, &px)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("building the current-thread tokio runtime: {e}"))?;
    let r = p.repeats;

    // Graphs of 1 and 2 (locals declared after `raw` and `fw`: dropped before them).
    let raw_sized = SIZES
        .iter()
        .enumerate()
        .map(|(i, &n)| raw.chain_graph(RawLayout::SIZED + i, n))
        .collect::<Result<Vec<_>, _>>()?;
    let fw_sized = {
        let Fw { sized, func, stream, .. } = &mut fw;
        SIZES
            .iter()
            .zip(sized.iter_mut())
            .map(|(&n, c)| fw_chain_graph(func, stream, c, n))
            .collect::<Result<Vec<_>, _>>()?
    };
    for (g, &n) in fw_sized.iter().zip(&SIZES) {
        let nodes = g.graph().node_count().map_err(ctx("Graph::node_count"))?;
        if nodes != n {
            return Err(format!("the framework graph of {n} Tiny has {nodes} nodes"));
        }
    }

    // 1. Replay throughput.
    let mut rows1 = Vec::new();
    for (i, &n) in SIZES.iter().enumerate() {
        let replays = (p.replay_kernels / n).max(1);
        println!("1: {replays} replays of the {n}-kernel graph per repeat, {r} repeats");
        let k = RawLayout::SIZED + i;
        let (rg, fg) = (&raw_sized[i], &fw_sized[i]);
        let warm = (replays / 10).max(1);
        raw_replays(&mut raw, rg, k, n, warm)?;
        fw_replays(fg, &fw.stream, &mut fw.sized[i], n, warm)?;
        let (raw1, fw1) = {
            let Fw { sized, stream, .. } = &mut fw;
            let c = &mut sized[i];
            bench::alternating(
                r,
                || raw_replays(&mut raw, rg, k, n, replays),
                || fw_replays(fg, stream, &mut *c, n, replays),
            )?
        };
        rows1.push(
            Row::compare(&format!("1 replay, {n}-kernel graph"), "us/kernel", raw1, fw1, Some(GOAL_REPLAY))
                .with_note(format!(
                    "{replays} replays queued back to back then one synchronize; framework: unsafe \
                     graph.launch().async_on(&s); raw: cuGraphLaunch"
                )),
        );
    }

    // 2. Host cost of one launch call.
    let n2 = SIZES[HOST_COST_SIZE];
    println!(
        "2: host cost of one launch call of the {n2}-kernel graph, {} calls per repeat, synchronize every {}",
        p.calls, p.sync_every
    );
    let (rg2, fg2, k2) =
        (&raw_sized[HOST_COST_SIZE], &fw_sized[HOST_COST_SIZE], RawLayout::SIZED + HOST_COST_SIZE);
    let warm2 = (p.calls / 10).max(1);
    raw_host_cost(&mut raw, rg2, (k2, n2), warm2, p.sync_every)?;
    fw_host_cost(fg2, &fw.stream, (&mut fw.sized[HOST_COST_SIZE], n2), warm2, p.sync_every)?;
    let (raw2, fw2) = {
        let Fw { sized, stream, .. } = &mut fw;
        let c = &mut sized[HOST_COST_SIZE];
        bench::alternating(
            r,
            || raw_host_cost(&mut raw, rg2, (k2, n2), p.calls, p.sync_every),
            || fw_host_cost(fg2, stream, (&mut *c, n2), p.calls, p.sync_every),
        )?
    };

    // 3. Capture + instantiate + upload.
    println!("3: {} captures of {} kernels per repeat", p.captures, p.capture_nodes);
    let kc = RawLayout::CAPTURE;
    raw_capture_cost(&raw, kc, p.capture_nodes, 1)?;
    fw_capture_cost(&fw.func, &fw.stream, &mut fw.capture, p.capture_nodes, 1)?;
    let (raw3, fw3) = {
        let Fw { capture, func, stream, .. } = &mut fw;
        bench::alternating(
            r,
            || raw_capture_cost(&raw, kc, p.capture_nodes, p.captures),
            || fw_capture_cost(func, stream, capture, p.capture_nodes, p.captures),
        )?
    };

    // 4. Graph replay vs eager ops.
    println!(
        "4: {WIDE} tiny kernels (one per buffer), graph vs eager join_all, {} round trips per repeat",
        p.iters
    );
    let fw_wide = {
        let Fw { wide, func, stream, .. } = &mut fw;
        CudaGraph::scope(stream, |sc| {
            for c in wide.iter_mut() {
                sc.record(Tiny { func, buf: &mut c.buf })?;
            }
            Ok(())
        })
        .map_err(dctx("CudaGraph::scope (100 Tiny on 100 buffers)"))?
    };
    let warm4 = (p.iters / 10).max(1);
    let (eager4, graph4) = {
        let Fw { wide, func, stream, .. } = &mut fw;
        fw_eager_round_trips(func, stream, wide, warm4)?;
        fw_graph_round_trips(&fw_wide, stream, wide, warm4)?;
        let wide = std::cell::RefCell::new(wide);
        bench::alternating(
            r,
            || fw_eager_round_trips(func, stream, &mut wide.borrow_mut()[..], p.iters),
            || fw_graph_round_trips(&fw_wide, stream, &mut wide.borrow_mut()[..], p.iters),
        )?
    };

    // 5. .await of a replay.
    println!(
        "5: awaited replays of a 1-kernel graph on a current-thread runtime, {} per repeat",
        p.round_trips
    );
    let ks = RawLayout::SINGLE;
    let raw_one = raw.chain_graph(ks, 1)?;
    let fw_one = fw_chain_graph(&fw.func, &fw.stream, &mut fw.single, 1)?;
    let warm5 = (p.round_trips / 10).max(1);
    raw_graph_round_trips(&mut raw, &raw_one, ks, warm5)?;
    fw_await_replays(&rt, &fw_one, &fw.stream, &mut fw.single, warm5)?;
    let (raw5, fw5) = {
        let Fw { single, stream, .. } = &mut fw;
        bench::alternating(
            r,
            || raw_graph_round_trips(&mut raw, &raw_one, ks, p.round_trips),
            || fw_await_replays(&rt, &fw_one, stream, single, p.round_trips),
        )?
    };

    // 6. Parameter updates through handles.
    println!("6: {} sweeps over {PARAM_NODES} scale-node parameters per repeat", p.sweeps);
    let cfg6 = kern.config(PARAM_ELEMS);
    let raw_params = raw.capture(|rw| rw.pys.iter().try_for_each(|&y| rw.enqueue_scale(cfg6, y, 1.0)))?;
    let raw_nodes = raw.param_nodes(&raw_params)?;
    let (fw_params, handles) = {
        let Fw { px: x, pys, stream, .. } = &mut fw;
        let mut g = CudaGraph::scope(stream, |sc| {
            let mut hs = Vec::with_capacity(pys.len());
            for y in pys.iter_mut() {
                let (_, h) = sc.record_param(kernels::ops::scale(&*x, 1.0f32, y))?;
                hs.push(h);
            }
            Ok(hs)
        })
        .map_err(dctx("CudaGraph::scope (100 scale nodes with record_param)"))?;
        let hs = g.take_output().ok_or("the graph of 6 has no output")?;
        (g, hs)
    };
    if handles.len() != PARAM_NODES || raw_nodes.len() != PARAM_NODES {
        return Err(format!(
            "6: expected {PARAM_NODES} nodes, got {} handles and {} raw nodes",
            handles.len(),
            raw_nodes.len()
        ));
    }
    let warm6 = (p.sweeps / 10).max(1);
    raw_set_params(&raw, &raw_params, &raw_nodes, warm6)?;
    fw_set_params(&fw_params, &handles, warm6)?;
    let (raw6, fw6) = bench::alternating(
        r,
        || raw_set_params(&raw, &raw_params, &raw_nodes, p.sweeps),
        || fw_set_params(&fw_params, &handles, p.sweeps),
    )?;

    // Correctness: 6 (set distinct factors, replay once, compare), then the tiny buffers.
    let check6 = fw_check_params(&fw_params, &handles, &fw, &px)
        .and_then(|()| raw_check_params(&raw, &raw_params, &raw_nodes, &px))
        .map(|()| {
            format!(
                "{PARAM_NODES} outputs per side equal v_i * x after setting distinct factors and one replay"
            )
        });
    let check_tiny = check_tiny(&init, &fw, &raw);
    let correctness = match (&check_tiny, &check6) {
        (Ok(a), Ok(b)) => Ok(format!("ok: {a}; {b}")),
        (Err(e), _) | (_, Err(e)) => Err(e.clone()),
    };

    // Release: graphs first (framework graphs queue nothing; raw graphs before the raw modules).
    fw.stream.synchronize().map_err(ctx("Stream::synchronize before releasing"))?;
    drop((fw_sized, fw_wide, fw_one, fw_params));
    for mut g in raw_sized.into_iter().chain([raw_one, raw_params]) {
        raw.sync()?;
        g.destroy()?;
    }
    raw.close()?;

    // Report.
    let mut report = Report::new("bench-graph");
    report.meta("date_utc", bench::utc_now());
    report.meta("gpu", dev.name());
    report.meta("arch", arch.as_str());
    report.meta("driver_cuda_version", format!("{drv_major}.{drv_minor}"));
    report.meta("nvidia_kernel_module", bench::nvidia_kernel_module_version());
    report.meta("nvrtc_version", format!("{nvrtc_major}.{nvrtc_minor}"));
    report.meta("repeats", r);
    report.meta("replay_kernels", p.replay_kernels);
    report.meta("calls", p.calls);
    report.meta("sync_every", p.sync_every);
    report.meta("captures", p.captures);
    report.meta("capture_nodes", p.capture_nodes);
    report.meta("iters", p.iters);
    report.meta("roundtrips", p.round_trips);
    report.meta("sweeps", p.sweeps);
    report.meta("capture_mode", "ThreadLocal, instantiate flags 0, upload after instantiate (both sides)");
    report.meta("seed", format!("{seed:#018x}"));

    report.rows.extend(rows1);
    let diff2 = bench::median(&fw2) - bench::median(&raw2);
    report.rows.push(
        Row::compare_within(
            &format!("2 launch call, {n2}-kernel graph"),
            "us/call",
            raw2,
            fw2,
            GOAL_HOST_EXTRA_US,
        )
        .with_note(format!(
            "host time of the call only, median of {} calls per repeat, untimed synchronize every {}; framework \
             - raw = {diff2:.3} us (goal <= {GOAL_HOST_EXTRA_US} us; the ratio goal is (raw + 0.3) / raw)",
            p.calls, p.sync_every
        )),
    );
    report.rows.push(
        Row::compare(
            &format!("3 capture+instantiate+upload, {} nodes", p.capture_nodes),
            "ms/graph",
            raw3,
            fw3,
            Some(GOAL_CAPTURE),
        )
        .with_note(format!(
            "CudaGraph::scope recording {n} Tiny vs cuStreamBeginCapture_v2 + {n} cuLaunchKernel + \
             cuStreamEndCapture + cuGraphInstantiateWithFlags + cuGraphUpload; destruction untimed; {} per repeat",
            p.captures,
            n = p.capture_nodes
        )),
    );
    let speedup = bench::median(&eager4) / bench::median(&graph4);
    report.rows.push(
        Row::compare(&format!("4 {WIDE} kernels: graph vs eager"), "us/iter", eager4, graph4, Some(1.0 / GOAL_SPEEDUP))
            .with_note(format!(
                "raw column = eager join_all of {WIDE} Tiny .sync_on(&s); framework column = \
                 graph.launch().sync_on(&s) of the same {WIDE} Tiny captured; speedup eager/graph = {speedup:.2}x \
                 (goal >= {GOAL_SPEEDUP}x, i.e. ratio <= {})",
                1.0 / GOAL_SPEEDUP
            )),
    );
    report.rows.push(
        Row::compare("5 await replay, 1-kernel graph", "us/iter", raw5, fw5, Some(GOAL_AWAIT)).with_note(
            "graph.launch().on(&s).await on a current-thread tokio runtime vs cuGraphLaunch + cuStreamSynchronize",
        ),
    );
    let fw6_for_budget = fw6.clone();
    report.rows.push(
        Row::compare(&format!("6 set_param, {PARAM_NODES} scale nodes"), "us/node", raw6, fw6, None)
            .with_note(
            "diagnostic: graph.set_param(&h, v) vs cuGraphExecKernelNodeSetParams_v2 with parameters cached \
             after capture",
        ),
    );
    report.rows.push(
        Row::within_budget("6 set_param vs budget", "us/node", fw6_for_budget, GOAL_SET_PARAM_US).with_note(
            format!(
                "absolute goal: framework <= {GOAL_SET_PARAM_US} us per node; the raw column holds the budget, not \
                 a measurement"
            ),
        ),
    );
    report.meta("m2_framework_minus_raw_us", diff2);
    report.meta("m4_speedup_eager_over_graph", speedup);
    report.meta(
        "correctness",
        match &correctness {
            Ok(s) => Json::from(s.as_str()),
            Err(e) => Json::from(format!("FAILED: {e}")),
        },
    );

    print!("{}", report.table());
    println!("goals met: {}", if report.all_met() { "yes" } else { "NO" });
    if let Some(path) = &json_path {
        report.write_json(path)?;
        println!("wrote {}", path.display());
    }
    drop(fw);
    dev.synchronize().map_err(ctx("final device synchronize"))?;
    correctness.map(|s| println!("correctness: {s}")).map_err(|e| format!("correctness check failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_reference_converges_and_stays_finite() {
        let init = [0.5f32, 1.0, 1.4999];
        assert_eq!(host_reference(&init, 1)[1], SCALE.mul_add(1.0, 1.0));
        let far = host_reference(&init, 10_000_000);
        assert!(far.iter().all(|v| v.is_finite() && (*v - 1000.0).abs() < 1.0));
    }

    #[test]
    fn check_buffer_catches_problems() {
        let init = vec![1.0f32; ELEMS];
        let mut refs = References::default();
        let out = host_reference(&init, 5);
        assert!(check_buffer("t", &init, &out, 5, &mut refs).is_ok());
        assert!(check_buffer("t", &init, &out, 50, &mut refs).is_err());
        assert!(check_buffer("t", &init, &init, 5, &mut refs).is_err());
        let mut bad = out.clone();
        bad[3] = f32::NAN;
        assert!(check_buffer("t", &init, &bad, 5, &mut refs).is_err());
    }

    #[test]
    fn scaled_check_and_factors() {
        let x = [0.5f32, 1.25];
        assert!(check_scaled("t", &x, 2.0, &[1.0, 2.5]).is_ok());
        assert!(check_scaled("t", &x, 2.0, &[1.0, 2.6]).is_err());
        assert!(check_scaled("t", &x, 2.0, &[0.0, 0.0]).is_err());
        assert!(check_scaled("t", &x, 2.0, &[1.0]).is_err());
        let f: Vec<f32> = (0..PARAM_NODES).map(check_factor).collect();
        assert!(f.windows(2).all(|w| w[0] < w[1]));
        assert!((0..16).map(sweep_factor).all(|v| (1.0..2.0).contains(&v)));
    }

    #[test]
    fn raw_layout_is_disjoint() {
        assert_eq!(RawLayout::SIZED, 0);
        assert_eq!(RawLayout::CAPTURE, 3);
        assert_eq!(RawLayout::SINGLE, 4);
        assert_eq!(RawLayout::LEN, 5);
    }
}
