//! `bench-graph`: the cost of `cuda-async`'s CUDA graphs (`CudaGraph::scope`, replays as ops,
//! `.await` of a replay, parameter handles) over the same graphs captured and launched through raw
//! driver calls (cudarc's `result` layer: `cuStreamBeginCapture` / `cuLaunchKernel` /
//! `cuStreamEndCapture` / `cuGraphInstantiateWithFlags` / `cuGraphUpload` / `cuGraphLaunch`), side
//! by side in one process. Graphs are linear chains of the tiny counter kernel on one buffer unless
//! said otherwise.
//!
//! 1. Replay of graphs of 10, 100 and 1,000 kernels: M/N (M = 100,000 kernels) replays queued back
//!    to back, then one synchronize; µs per kernel (goal ≤ 1.02× raw).
//! 2. Host cost of one launch call of the 10-kernel graph: the call alone, median over C (10,000)
//!    calls, an untimed synchronize every E (100); µs per call (goal ≤ raw + 0.3 µs).
//! 3. Capture + instantiate + upload of a 1,000-node graph (destruction untimed); ms per graph
//!    (goal ≤ 1.2×).
//! 4. 100 kernels (one per buffer): `graph.launch().sync_on(&s)` vs the same 100 `Tiny`s run
//!    eagerly as `join_all(..).sync_on(&s)`; µs per round trip (goal: speedup ≥ 2.5×, i.e. ratio
//!    graph / eager ≤ 0.4).
//! 5. `graph.launch().on(&s).await` of a 1-kernel graph on a current-thread tokio runtime vs
//!    `cuGraphLaunch` + `cuStreamSynchronize`; µs per round trip (goal ≤ 1.25×).
//! 6. Kernel-parameter updates: a graph of 100 `kernels::ops::scale(&x, a, &mut y_i)` nodes
//!    recorded with `record_param`, `graph.set_param(&h, v)` for every handle, S (100) sweeps, vs
//!    `cuGraphExecKernelNodeSetParams_v2` with cached node parameters on the same graph captured
//!    raw; µs per node (goal ≤ 1.5 µs per node, absolute).
//!
//! Afterwards every counter buffer of both sides must hold its initial values plus the number of
//! kernels that ran on it, and for 6 every output must equal `v_i * x` after setting distinct
//! factors and replaying once (both sides).
//!
//! `cargo run --release -p cuda-async-examples --bin bench-graph -- --help` lists the options.

use anyhow::{ensure, Context, Result};
use clap::Parser;
use cuda_async::{CudaGraph, DeviceOpExt};
use cuda_async_examples::bench::raw::{param, Raw, RawGraph};
use cuda_async_examples::bench::tiny::{self, Checker, Counted, TinyFunction, TinyImage};
use cuda_async_examples::bench::{self, median, Case, Common, Goal, Row};
use cuda_core::nvrtc::KernelCache;
use cuda_core::{DeviceBuffer, Stream};
use cudarc::driver::sys;
use kernels::Kernels;
use rand::Rng;
use std::time::Instant;

/// Compares cuda-async CUDA graphs (scope, replay, .await, parameter handles) with raw CUDA driver
/// graph calls.
#[derive(Parser, serde::Serialize)]
struct Args {
    /// Kernels per sample for 1: M/N replays of the N-kernel graph
    #[arg(long, default_value_t = 100_000, value_parser = bench::at_least_one)]
    replay_kernels: usize,
    /// Timed launch calls per sample for 2
    #[arg(long, default_value_t = 10_000, value_parser = bench::at_least_one)]
    calls: usize,
    /// Synchronize (untimed) after every E launch calls in 2
    #[arg(long, default_value_t = 100, value_parser = bench::at_least_one)]
    sync_every: usize,
    /// Captures per sample for 3
    #[arg(long, default_value_t = 10, value_parser = bench::at_least_one)]
    captures: usize,
    /// Kernels per captured graph in 3
    #[arg(long, default_value_t = 1_000, value_parser = bench::at_least_one)]
    capture_nodes: usize,
    /// Round trips per sample for 4
    #[arg(long, default_value_t = 500, value_parser = bench::at_least_one)]
    iters: usize,
    /// Awaited round trips per sample for 5
    #[arg(long, default_value_t = 2_000, value_parser = bench::at_least_one)]
    roundtrips: usize,
    /// Sweeps over all 100 parameter handles per sample for 6
    #[arg(long, default_value_t = 100, value_parser = bench::at_least_one)]
    sweeps: usize,
    #[command(flatten)]
    #[serde(flatten)]
    common: Common,
}

/// Graph sizes of 1; 2 launches the first.
const SIZES: [usize; 3] = [10, 100, 1000];
/// Raw counter buffers: one per size, then one for 3 and one for 5.
const CAPTURE: usize = SIZES.len();
const SINGLE: usize = SIZES.len() + 1;
/// Kernels (and buffers) of 4; nodes (and outputs of `PARAM_ELEMS` floats) of 6.
const WIDE: usize = 100;
const PARAM_NODES: usize = 100;
const PARAM_ELEMS: usize = 256;

fn main() -> Result<()> {
    let a = Args::parse();
    let (dev, mut run) = bench::start("bench-graph", &a, &a.common, true)?;
    run.report
        .meta("capture_mode", "ThreadLocal, instantiate flags 0, upload after instantiate (both sides)");
    let mut rng = bench::rng_from_time(&mut run.report);
    // Kernels must not compile during a capture: load `kernels`' modules now.
    let kern = Kernels::get(&dev).context("Kernels::get")?;
    let image = TinyImage::compile(&dev)?;
    let func = image.load(&dev)?;
    let stream = Stream::new(&dev)?;
    let init = tiny::init_values(&mut rng);
    let px: Vec<f32> = (0..PARAM_ELEMS).map(|_| rng.random_range(0.5..1.5)).collect();

    let mut raw = Raw::new(&dev, &image, SINGLE + 1, &init)?;
    let elementwise = KernelCache::global()
        .compile(&dev, "elementwise.cu", kernels::ELEMENTWISE_SRC, &["-std=c++17".to_string()])
        .context("compiling the elementwise kernels for the raw side")?;
    let scale = raw.load(&elementwise.image, "scale_f32")?;
    let rpx = raw.upload(&px)?;
    let rpys = (0..PARAM_NODES).map(|_| raw.upload(&[0f32; PARAM_ELEMS])).collect::<Result<Vec<_>>>()?;

    let counted = |n: usize| (0..n).map(|_| Counted::new(&stream, &init)).collect::<Result<Vec<_>>>();
    let (mut sized, mut wide) = (counted(SIZES.len())?, counted(WIDE)?);
    let (mut capture, mut single) = (Counted::new(&stream, &init)?, Counted::new(&stream, &init)?);
    let fpx = DeviceBuffer::from_host(&stream, &px)?;
    let mut fpys =
        (0..PARAM_NODES).map(|_| DeviceBuffer::zeros(&stream, PARAM_ELEMS)).collect::<Result<Vec<_>, _>>()?;
    stream.synchronize()?;

    // 1. Replay throughput.
    let mut graphs = Vec::new();
    for (i, &n) in SIZES.iter().enumerate() {
        let fg = fw_chain(&stream, &func, &mut sized[i], n)?;
        let nodes = fg.graph().node_count()?;
        ensure!(nodes == n, "the framework graph of {n} Tiny has {nodes} nodes");
        let rg = raw.capture(|| (0..n).try_for_each(|_| raw.enqueue(i)))?;
        let (replays, c) = ((a.replay_kernels / n).max(1), &mut sized[i]);
        let case = Case::new(format!("1 replay, {n}-kernel graph"), "us/kernel", replays * n, || {
            for _ in 0..replays {
                // SAFETY: the output is `()`; the buffer is read back only by `to_vec`, which
                // waits for its home stream.
                unsafe { fg.launch().async_on(&stream) }?;
            }
            c.launches += (replays * n) as u64;
            Ok(stream.synchronize()?)
        });
        let case = case.raw(|| {
            for _ in 0..replays {
                // SAFETY: a live graph of ours over our live buffer.
                unsafe { raw.replay(&rg) }?;
            }
            raw.launches[i] += (replays * n) as u64;
            raw.sync()
        });
        let note = format!(
            "{replays} replays queued back to back then one synchronize; framework: unsafe \
             graph.launch().async_on(&s); raw: cuGraphLaunch"
        );
        run.run(case.goal(Goal::MaxRatio(1.02)).note(note))?;
        graphs.push((fg, rg));
    }

    // 2. Host cost of one launch call.
    let (calls, every, n2) = (a.calls, a.sync_every, SIZES[0]);
    let (fg, rg) = (&graphs[0].0, graphs[0].1);
    let c = &mut sized[0];
    let case = Case::new(format!("2 launch call, {n2}-kernel graph"), "us/call", calls, || {
        // SAFETY: as in 1.
        let secs = per_call(
            calls,
            every,
            || Ok(unsafe { fg.launch().async_on(&stream) }?),
            || Ok(stream.synchronize()?),
        );
        c.launches += (calls * n2) as u64;
        secs
    });
    let case = case.raw(|| {
        // SAFETY: as in 1.
        let secs = per_call(calls, every, || unsafe { raw.replay(&rg) }, || raw.sync());
        raw.launches[0] += (calls * n2) as u64;
        secs
    });
    let row = run.run(case.goal(Goal::MaxExtra(0.3)))?;
    let diff2 = row.framework - row.raw.unwrap_or(f64::NAN);
    run.report.rows.last_mut().expect("just run").note = format!(
        "host time of the call only, median of {calls} calls per sample, untimed synchronize every {every}; \
         framework - raw = {diff2:.3} us (goal <= 0.3 us; the ratio goal is (raw + 0.3) / raw)"
    );
    run.report.meta("m2_framework_minus_raw_us", diff2);

    // 3. Capture + instantiate + upload.
    let (captures, nodes) = (a.captures, a.capture_nodes);
    let case =
        Case::new(format!("3 capture+instantiate+upload, {nodes} nodes"), "ms/graph", captures, || {
            let mut secs = 0.0;
            for _ in 0..captures {
                let t = Instant::now();
                let g = fw_chain(&stream, &func, &mut capture, nodes)?;
                secs += t.elapsed().as_secs_f64();
                stream.synchronize()?;
                drop(g);
            }
            Ok(secs)
        });
    let case = case.raw(|| {
        let mut secs = 0.0;
        for _ in 0..captures {
            let t = Instant::now();
            let g = raw.capture(|| (0..nodes).try_for_each(|_| raw.enqueue(CAPTURE)))?;
            secs += t.elapsed().as_secs_f64();
            raw.sync()?;
            raw.destroy(g)?;
        }
        Ok(secs)
    });
    let note = format!(
        "CudaGraph::scope recording {nodes} Tiny vs cuStreamBeginCapture_v2 + {nodes} cuLaunchKernel + \
         cuStreamEndCapture + cuGraphInstantiateWithFlags + cuGraphUpload; destruction untimed; {captures} per sample"
    );
    run.run(case.goal(Goal::MaxRatio(1.2)).note(note))?;

    // 4. Graph replay vs eager ops (raw column: eager).
    let fw_wide = CudaGraph::scope(&stream, |sc| wide.iter_mut().try_for_each(|c| sc.record(c.op(&func))))?;
    let (iters, mut rounds) = (a.iters, 0u64);
    let case = Case::new(format!("4 {WIDE} kernels: graph vs eager"), "us/iter", iters, || {
        for _ in 0..iters {
            fw_wide.launch().sync_on(&stream)?;
        }
        rounds += iters as u64;
        Ok(())
    });
    let case = case.raw(|| {
        for _ in 0..iters {
            cuda_async::join_all(wide.iter_mut().map(|c| c.op(&func))).sync_on(&stream)?;
        }
        wide.iter_mut().for_each(|c| c.launches += iters as u64);
        Ok(())
    });
    let row = run.run(case.goal(Goal::MaxRatio(0.4)))?;
    let speedup = row.raw.unwrap_or(f64::NAN) / row.framework;
    run.report.rows.last_mut().expect("just run").note = format!(
        "raw column = eager join_all of {WIDE} Tiny .sync_on(&s); framework column = graph.launch().sync_on(&s) of \
         the same {WIDE} Tiny captured; speedup eager/graph = {speedup:.2}x (goal >= 2.5x, i.e. ratio <= 0.4)"
    );
    run.report.meta("m4_speedup_eager_over_graph", speedup);
    run.report.meta("tokio_runtime", "timers only, no I/O driver (bench::runtime)");
    wide.iter_mut().for_each(|c| c.launches += rounds);

    // 5. .await of a replay.
    let rt = bench::runtime(false, None)?;
    let fw_one = fw_chain(&stream, &func, &mut single, 1)?;
    let raw_one = raw.capture(|| raw.enqueue(SINGLE))?;
    let m = a.roundtrips;
    let case = Case::new("5 await replay, 1-kernel graph", "us/iter", m, || {
        rt.block_on(async {
            for _ in 0..m {
                fw_one.launch().on(&stream).await?;
            }
            Ok::<_, anyhow::Error>(())
        })?;
        single.launches += m as u64;
        Ok(())
    });
    let case = case.raw(|| {
        for _ in 0..m {
            // SAFETY: a live graph of ours over our live buffer.
            unsafe { raw.replay(&raw_one) }?;
            raw.sync()?;
        }
        raw.launches[SINGLE] += m as u64;
        Ok(())
    });
    let note = "graph.launch().on(&s).await on a current-thread tokio runtime vs cuGraphLaunch + cuStreamSynchronize";
    run.run(case.goal(Goal::MaxRatio(1.25)).note(note))?;

    // 6. Parameter updates through handles.
    let cfg = kern.config(PARAM_ELEMS);
    let raw_params = raw.capture(|| {
        rpys.iter().try_for_each(|&y| {
            let (mut x, mut v, mut o, mut n) = (rpx, 1.0f32, y, PARAM_ELEMS as u64);
            // SAFETY: `scale_f32(const float* x, float alpha, float* out, unsigned long long n)`
            // gets pointers to values of those types; it reads x[0..n] and writes out[0..n] of our
            // buffers of n floats, which outlive the graph.
            unsafe {
                raw.launch_kernel(
                    scale,
                    cfg,
                    &mut [param(&mut x), param(&mut v), param(&mut o), param(&mut n)],
                )
            }
        })
    })?;
    let raw_nodes = param_nodes(raw_params, scale)?;
    let mut fw_params = CudaGraph::scope(&stream, |sc| {
        fpys.iter_mut()
            .map(|y| Ok(sc.record_param(kernels::ops::scale(&fpx, 1.0f32, y))?.1))
            .collect::<Result<Vec<_>, cuda_async::DeviceError>>()
    })?;
    let handles = fw_params.take_output().context("the graph of 6 has no output")?;
    ensure!(
        handles.len() == PARAM_NODES && raw_nodes.len() == PARAM_NODES,
        "6: expected {PARAM_NODES} nodes"
    );
    let s = a.sweeps;
    let case =
        Case::new(format!("6 set_param, {PARAM_NODES} scale nodes"), "us/node", s * PARAM_NODES, || {
            for k in 0..s {
                handles.iter().try_for_each(|h| fw_params.set_param(h, sweep_factor(k)))?;
            }
            Ok(())
        });
    let case = case.raw(|| {
        (0..s).try_for_each(|k| raw_nodes.iter().try_for_each(|p| set_alpha(raw_params, p, sweep_factor(k))))
    });
    let note = "diagnostic: graph.set_param(&h, v) vs cuGraphExecKernelNodeSetParams_v2 with parameters cached after capture";
    let samples = run.run(case.note(note))?.framework_samples.clone();
    run.report.rows.push(Row::budget("6 set_param vs budget", "us/node", samples, 1.5).with_note(
        "absolute goal: framework <= 1.5 us per node; the raw column holds the budget, not a measurement",
    ));

    // Correctness: 6 (distinct factors, one replay, compare), then the counters.
    let mut check = Checker::new(&init);
    let correctness = (|| {
        for (i, h) in handles.iter().enumerate() {
            fw_params.set_param(h, check_factor(i))?;
        }
        fw_params.launch().sync_on(&stream)?;
        for (i, y) in fpys.iter().enumerate() {
            check_scaled(&format!("framework output {i} of 6"), &px, check_factor(i), &y.to_vec()?)?;
        }
        for p in &raw_nodes {
            let i =
                rpys.iter().position(|&y| y == p.out).context("a raw node of 6 writes an unknown buffer")?;
            set_alpha(raw_params, p, check_factor(i))?;
        }
        // SAFETY: a live graph of ours over our live buffers.
        unsafe { raw.replay(&raw_params) }?;
        for (i, &y) in rpys.iter().enumerate() {
            check_scaled(
                &format!("raw output {i} of 6"),
                &px,
                check_factor(i),
                &raw.download::<f32>(y, PARAM_ELEMS)?,
            )?;
        }
        stream.synchronize()?;
        check.counted("framework sized", &sized)?;
        check.counted("framework capture", [&capture])?;
        check.counted("framework wide", &wide)?;
        check.counted("framework single", [&single])?;
        raw.check(&mut check)?;
        Ok(format!(
            "{}; {PARAM_NODES} outputs per side equal v_i * x after setting distinct factors",
            check.summary()
        ))
    })();
    stream.synchronize()?;
    drop((graphs, fw_wide, fw_one, fw_params));
    raw.close()?;
    run.report.publish(correctness, a.common.json.as_deref())
}

/// `calls` timed calls of `call`, with an untimed `sync` after every `every` and at the end: the
/// median seconds per call, times `calls` (the runner divides by the units).
fn per_call(
    calls: usize,
    every: usize,
    mut call: impl FnMut() -> Result<()>,
    sync: impl Fn() -> Result<()>,
) -> Result<f64> {
    let mut samples = Vec::with_capacity(calls);
    for i in 1..=calls {
        let t = Instant::now();
        let r = call();
        samples.push(t.elapsed().as_secs_f64());
        r?;
        if i % every == 0 {
            sync()?;
        }
    }
    sync()?;
    Ok(median(&samples) * calls as f64)
}

/// Records `n` launches on `c`'s buffer into a new graph (capture, instantiate, upload).
fn fw_chain(stream: &Stream, func: &TinyFunction, c: &mut Counted, n: usize) -> Result<CudaGraph<()>> {
    Ok(CudaGraph::scope(stream, |sc| (0..n).try_for_each(|_| sc.record(c.op(func))))?)
}

/// A kernel node of the raw graph of 6, with its parameters as read once after capture.
struct ParamNode {
    node: sys::CUgraphNode,
    base: sys::CUDA_KERNEL_NODE_PARAMS,
    x: sys::CUdeviceptr,
    out: sys::CUdeviceptr,
    n: u64,
}

/// The nodes of `g` (all launches of `scale`), with their parameters.
fn param_nodes(g: RawGraph, scale: sys::CUfunction) -> Result<Vec<ParamNode>> {
    let mut count = 0usize;
    // SAFETY: our live graph; a null array asks for the count, then `nodes` has room for it.
    unsafe { sys::cuGraphGetNodes(g.graph, std::ptr::null_mut(), &mut count) }.result()?;
    let mut nodes = vec![std::ptr::null_mut(); count];
    // SAFETY: as above; `nodes` has room for `count` nodes.
    unsafe { sys::cuGraphGetNodes(g.graph, nodes.as_mut_ptr(), &mut count) }.result()?;
    nodes.truncate(count);
    nodes
        .into_iter()
        .map(|node| {
            // SAFETY: zeroes are a valid value of this plain C struct, which the driver fills for
            // a live node of our graph (an error for a node that is not a kernel node).
            let mut base: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
            // SAFETY: a live node of our graph; valid out-pointer.
            unsafe { sys::cuGraphKernelNodeGetParams_v2(node, &mut base) }.result()?;
            ensure!(
                base.func == scale && !base.kernelParams.is_null(),
                "a raw node of 6 is not a scale launch"
            );
            // SAFETY: the node launches `scale_f32(const float*, float, float*, unsigned long
            // long)`: its parameter array, owned by the live graph, holds four pointers to values
            // of those types; we copy three out.
            let (x, out, n) = unsafe {
                let p = base.kernelParams;
                (
                    *(*p as *const sys::CUdeviceptr),
                    *(*p.add(2) as *const sys::CUdeviceptr),
                    *(*p.add(3) as *const u64),
                )
            };
            (base.kernelParams, base.extra) = (std::ptr::null_mut(), std::ptr::null_mut());
            Ok(ParamNode { node, base, x, out, n })
        })
        .collect()
}

/// Sets the factor of node `p` of `g` (`cuGraphExecKernelNodeSetParams_v2`, cached parameters).
fn set_alpha(g: RawGraph, p: &ParamNode, alpha: f32) -> Result<()> {
    let (mut x, mut a, mut o, mut n) = (p.x, alpha, p.out, p.n);
    let mut ptrs = [param(&mut x), param(&mut a), param(&mut o), param(&mut n)];
    let mut params = p.base;
    params.kernelParams = ptrs.as_mut_ptr();
    // SAFETY: a live executable and a kernel node of its graph; the array points to four live
    // values of the kernel's types, and only the factor differs from the captured ones. The driver
    // copies the values during the call.
    unsafe { sys::cuGraphExecKernelNodeSetParams_v2(g.exec, p.node, &params) }.result()?;
    Ok(())
}

/// The factor of sweep `s` (changes every sweep, so every update changes the value).
fn sweep_factor(s: usize) -> f32 {
    1.0 + (s % 8) as f32 * 0.125
}

/// The distinct factor of node `i` for the check (exact in binary).
fn check_factor(i: usize) -> f32 {
    1.0 + i as f32 / 64.0
}

/// Checks `got == v * x` elementwise (relative 1e-6).
fn check_scaled(what: &str, x: &[f32], v: f32, got: &[f32]) -> Result<()> {
    ensure!(got.len() == x.len(), "{what}: {} values, expected {}", got.len(), x.len());
    for (i, (&xi, &g)) in x.iter().zip(got).enumerate() {
        ensure!(
            g.is_finite() && ((g - v * xi) / (v * xi)).abs() <= 1e-6,
            "{what}: [{i}] = {g}, expected {v} * {xi}"
        );
    }
    Ok(())
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
}
