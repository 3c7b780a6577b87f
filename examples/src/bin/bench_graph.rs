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
use cuda_async::{CudaGraph, DeviceError, DeviceOpExt};
use cuda_async_examples::bench::{self, ctx, OptSpec, Options, Row, SplitMix64, JSON_OPT};
use cuda_async_examples::raw::{
    self, ck, Counted, FirstError, RawBuffer, RawGraph, RawModule, Tiny, TinyChecker, TinyFunction,
    TinyImage, TinyRaw, TINY_ELEMS,
};
use cuda_core::nvrtc::KernelCache;
use cuda_core::{Device, DeviceBuffer, LaunchConfig, Stream};
use cudarc::driver::sys;
use kernels::Kernels;
use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::process::ExitCode;
use std::time::Instant;
use tokio::runtime::Runtime;

/// The raw side's copy of `kernels`' `scale_f32(const float* x, float alpha, float* out, n)`.
const SCALE_KERNEL: &CStr = c"scale_f32";

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
    bench::main_with("bench-graph", run)
}

// ---------------------------------------------------------------------------------------------
// The framework side
// ---------------------------------------------------------------------------------------------

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
    func: TinyFunction,
    stream: Stream,
}

impl Fw {
    fn new(dev: &Device, image: &TinyImage, init: &[f32], px: &[f32]) -> Result<Fw, String> {
        let func = image.load(dev)?;
        let stream = Stream::new(dev).map_err(ctx("Stream::new"))?;
        let counted = || {
            DeviceBuffer::from_host(&stream, init).map(Counted::new).map_err(ctx("DeviceBuffer::from_host"))
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
    func: &TinyFunction,
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
    .map_err(ctx("CudaGraph::scope (chain of Tiny)"))
}

// ---------------------------------------------------------------------------------------------
// Raw driver side
// ---------------------------------------------------------------------------------------------

/// One kernel node of the raw graph of 6, with its parameters cached for updates.
struct RawParamNode {
    node: sys::CUgraphNode,
    /// The node's parameters as read once after capture (function, grid, block...).
    base: sys::CUDA_KERNEL_NODE_PARAMS,
    x: sys::CUdeviceptr,
    out: sys::CUdeviceptr,
    n: u64,
}

/// The baseline: the tiny kernel's raw side (buffers laid out by [`RawLayout`]), and the scale
/// kernel loaded from `kernels`' source with the input and outputs of 6. Field order is drop order:
/// `tiny` synchronizes the stream before anything is released. Raw graphs must be destroyed before
/// (they are locals declared after `Raw`, so they also drop first on an early error).
struct Raw {
    tiny: TinyRaw,
    scale_module: RawModule,
    scale: sys::CUfunction,
    px: RawBuffer,
    pys: Vec<RawBuffer>,
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

impl Raw {
    /// Loads both images in the device's primary context, creates a non-blocking stream, allocates
    /// the buffers and uploads `init` into each tiny-kernel buffer and `px` into the input of 6
    /// (its outputs are zeroed). On error, whatever was created is released.
    fn new(
        dev: &Device,
        tiny_image: &TinyImage,
        scale_image: &[u8],
        init: &[f32],
        px: &[f32],
    ) -> Result<Raw, String> {
        let tiny = TinyRaw::new(dev, tiny_image, RawLayout::LEN, init)?;
        let scale_module = RawModule::load(dev, scale_image)?;
        let scale = scale_module.function(SCALE_KERNEL)?;
        let px_buf = RawBuffer::from_host(dev, px)?;
        let zeros = vec![0f32; px.len()];
        let pys =
            (0..PARAM_NODES).map(|_| RawBuffer::from_host(dev, &zeros)).collect::<Result<Vec<_>, _>>()?;
        // Pageable host-to-device copies may return before the DMA has finished, and they run on
        // the legacy stream, which our non-blocking stream does not wait for: wait for the context.
        raw::ctx_synchronize()?;
        Ok(Raw { tiny, scale_module, scale, px: px_buf, pys })
    }

    /// Queues `out = alpha * x` (the scale kernel, `kernels`' launch configuration) on `out`.
    fn enqueue_scale(&self, cfg: LaunchConfig, out: &RawBuffer, alpha: f32) -> Result<(), String> {
        let (mut x, mut a, mut o, mut n) = (self.px.ptr(), alpha, out.ptr(), PARAM_ELEMS as u64);
        let mut params: [*mut c_void; 4] = [
            (&mut x as *mut sys::CUdeviceptr).cast(),
            (&mut a as *mut f32).cast(),
            (&mut o as *mut sys::CUdeviceptr).cast(),
            (&mut n as *mut u64).cast(),
        ];
        // SAFETY: `params` points to four live locals laid out as `scale_f32(const float* x,
        // float alpha, float* out, unsigned long long n)`; the kernel reads x[0..n] and writes
        // out[0..n] (grid-stride), and both allocations hold PARAM_ELEMS = n floats and stay
        // allocated until `close` (after the graphs are gone); live function and stream of the
        // current context.
        unsafe {
            raw::launch_kernel(self.scale, cfg, self.tiny.stream(), &mut params, "cuLaunchKernel (scale)")
        }
    }

    /// Captures what `record` queues on the stream into a graph, instantiates and uploads it.
    fn capture(&self, record: impl FnOnce(&Raw) -> Result<(), String>) -> Result<RawGraph, String> {
        RawGraph::capture(self.tiny.stream(), || record(self))
    }

    /// Captures `n` tiny launches on buffer `k`.
    fn chain_graph(&self, k: usize, n: usize) -> Result<RawGraph, String> {
        self.capture(|r| (0..n).try_for_each(|_| r.tiny.enqueue(k)))
    }

    #[inline]
    fn graph_launch(&self, g: &RawGraph) -> Result<(), String> {
        // SAFETY: `g` is one of our graphs, destroyed only after its last launch; every buffer its
        // nodes use is ours and outlives it (freed only in `close`, after synchronizing and after
        // the graphs are gone).
        unsafe { g.launch(self.tiny.stream()) }
    }

    #[inline]
    fn sync(&self) -> Result<(), String> {
        self.tiny.sync()
    }

    /// The kernel nodes of `g` (the raw graph of 6), each with its parameters read once.
    fn param_nodes(&self, g: &RawGraph) -> Result<Vec<RawParamNode>, String> {
        let mut count = 0usize;
        // SAFETY: our live graph; a null array asks for the count only.
        ck(unsafe { sys::cuGraphGetNodes(g.graph(), std::ptr::null_mut(), &mut count) }, "cuGraphGetNodes")?;
        let mut nodes: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); count];
        // SAFETY: `nodes` has room for `count` handles.
        ck(unsafe { sys::cuGraphGetNodes(g.graph(), nodes.as_mut_ptr(), &mut count) }, "cuGraphGetNodes")?;
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
            unsafe { sys::cuGraphExecKernelNodeSetParams_v2(g.exec(), p.node, &params) },
            "cuGraphExecKernelNodeSetParams_v2",
        )
    }

    /// Synchronizes and releases every handle, reporting the first failure (but releasing the
    /// rest regardless). Idempotent. Raw graphs must be destroyed before.
    fn close(&mut self) -> Result<(), String> {
        let mut first = FirstError::default();
        first.keep(self.tiny.sync());
        first.keep(self.px.close());
        for y in &mut self.pys {
            first.keep(y.close());
        }
        first.keep(self.tiny.close());
        first.keep(self.scale_module.close());
        self.scale = std::ptr::null_mut();
        first.result()
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
    raw.tiny.add_launches(k, (replays * nodes) as u64);
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
        unsafe { graph.launch().async_on(stream) }.map_err(ctx("graph.launch().async_on"))?;
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
    raw.tiny.add_launches(k, (calls * nodes) as u64);
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
        r.map_err(ctx("graph.launch().async_on"))?;
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
    func: &TinyFunction,
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

/// `iters` times `round_trip(bufs)` (which runs one kernel on each buffer of `bufs` and waits for
/// it), with the stream idle at the start; µs per round trip.
fn fw_round_trips(
    stream: &Stream,
    bufs: &mut [Counted],
    iters: usize,
    mut round_trip: impl FnMut(&mut [Counted]) -> Result<(), String>,
) -> Result<f64, String> {
    stream.synchronize().map_err(ctx("Stream::synchronize"))?;
    let t = Instant::now();
    for _ in 0..iters {
        round_trip(&mut *bufs)?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / iters.max(1) as f64;
    for c in bufs {
        c.launches += iters as u64;
    }
    Ok(us)
}

/// `iters` times `graph.launch().sync_on(&stream)` of the graph of one `Tiny` per buffer of
/// `bufs`; µs per round trip.
fn fw_graph_round_trips(
    graph: &CudaGraph<()>,
    stream: &Stream,
    bufs: &mut [Counted],
    iters: usize,
) -> Result<f64, String> {
    fw_round_trips(stream, bufs, iters, |_| {
        graph.launch().sync_on(stream).map_err(ctx("graph.launch().sync_on"))
    })
}

/// `iters` times `join_all` of one `Tiny` per buffer of `bufs`, `.sync_on(&stream)`; µs per
/// round trip.
fn fw_eager_round_trips(
    func: &TinyFunction,
    stream: &Stream,
    bufs: &mut [Counted],
    iters: usize,
) -> Result<f64, String> {
    fw_round_trips(stream, bufs, iters, |bufs| {
        cuda_async::join_all(bufs.iter_mut().map(|c| Tiny { func, buf: &mut c.buf }))
            .sync_on(stream)
            .map(drop)
            .map_err(ctx("join_all(Tiny..).sync_on"))
    })
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
    raw.tiny.add_launches(k, n as u64);
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
        .map_err(ctx("awaiting graph.launch().on(&stream)"))?;
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
            graph.set_param(h, v).map_err(ctx("CudaGraph::set_param"))?;
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
        graph.set_param(h, check_factor(i)).map_err(ctx("CudaGraph::set_param"))?;
    }
    graph.launch().sync_on(&fw.stream).map_err(ctx("graph.launch().sync_on (6)"))?;
    for (i, y) in fw.pys.iter().enumerate() {
        let got = y.to_vec().map_err(ctx("DeviceBuffer::to_vec (6)"))?;
        check_scaled(&format!("framework output {i} of 6"), x, check_factor(i), &got)?;
    }
    Ok(())
}

/// Raw: sets the factor of the node writing output `i` to `check_factor(i)`, replays once,
/// synchronizes, and checks every output.
fn raw_check_params(raw: &Raw, g: &RawGraph, nodes: &[RawParamNode], x: &[f32]) -> Result<(), String> {
    let index: HashMap<sys::CUdeviceptr, usize> =
        raw.pys.iter().enumerate().map(|(i, y)| (y.ptr(), i)).collect();
    if nodes.len() != raw.pys.len() {
        return Err(format!("raw graph of 6: {} nodes for {} outputs", nodes.len(), raw.pys.len()));
    }
    for p in nodes {
        let i = *index.get(&p.out).ok_or("raw graph of 6: a node writes an unknown buffer")?;
        raw.set_alpha(g, p, check_factor(i))?;
    }
    raw.graph_launch(g)?;
    raw.sync()?;
    for (i, y) in raw.pys.iter().enumerate() {
        let got = raw.tiny.download(y)?;
        check_scaled(&format!("raw output {i} of 6"), x, check_factor(i), &got)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Correctness of the tiny-kernel buffers
// ---------------------------------------------------------------------------------------------

/// Copies every tiny-kernel buffer of both sides back and checks it; returns a one-line summary.
fn check_tiny(init: &[f32], fw: &Fw, raw: &Raw) -> Result<String, String> {
    fw.stream.synchronize().map_err(ctx("Stream::synchronize before the check"))?;
    let mut c = TinyChecker::new(init);
    c.check_counted("framework sized", &fw.sized)?;
    c.check_counted("framework capture", [&fw.capture])?;
    c.check_counted("framework wide", &fw.wide)?;
    c.check_counted("framework single", [&fw.single])?;
    c.check_raw(&raw.tiny)?;
    Ok(format!(
        "{} tiny-kernel buffers, {} kernels in all, every buffer finite, changed (if run), and \
         within {:.1e} (relative) of the host reference for its kernel count",
        c.buffers, c.launches, c.worst
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
    let about = "Compares cuda-async CUDA graphs (scope, replay, .await, parameter handles) with raw CUDA \
                 driver graph calls.";
    let Some(opts) = Options::from_env_or_usage("bench-graph", about, SPEC)? else {
        return Ok(());
    };
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
    let json_path = opts.json_path();

    let (dev, gpu) = bench::open_gpu("bench-graph", bench::make_async_default)?;
    let mut rng = SplitMix64::from_time();
    let seed = rng.state();

    // Kernels must not compile during a capture: load `kernels`' modules now.
    let kern = Kernels::get(&dev).map_err(ctx("Kernels::get (compiling the kernels crate)"))?;
    let tiny = TinyImage::compile(&dev)?;
    let scale_src = KernelCache::global()
        .compile(&dev, "elementwise.cu", kernels::ELEMENTWISE_SRC, &["-std=c++17".to_string()])
        .map_err(ctx("compiling the elementwise kernels for the raw side with NVRTC"))?;
    let init: Vec<f32> = (0..TINY_ELEMS).map(|_| rng.f32_in(0.5, 1.5)).collect();
    let px: Vec<f32> = (0..PARAM_ELEMS).map(|_| rng.f32_in(0.5, 1.5)).collect();

    let mut raw = Raw::new(&dev, &tiny, &scale_src.image, &init, &px)?;
    let mut fw = Fw::new(&dev, &tiny, &init, &px)?;
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
        .map_err(ctx("CudaGraph::scope (100 Tiny on 100 buffers)"))?
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
    let raw_params = raw.capture(|rw| rw.pys.iter().try_for_each(|y| rw.enqueue_scale(cfg6, y, 1.0)))?;
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
        .map_err(ctx("CudaGraph::scope (100 scale nodes with record_param)"))?;
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
    let mut report = gpu.report("bench-graph");
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

    report.publish(&correctness, json_path.as_deref())?;
    drop(fw);
    dev.synchronize().map_err(ctx("final device synchronize"))?;
    bench::conclude(correctness)
}

#[cfg(test)]
mod tests {
    use super::*;

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
