//! `bench-graph-build`: explicitly built graphs and device-side loops.
//!
//! 1. A 1,000-kernel chain of the tiny counter kernel built node by node
//!    (`GraphBodyExt::add_op`, and `GraphBody::add_kernel` directly) vs the same chain captured
//!    (`CudaGraph::scope`, which includes instantiate + upload): build time; then instantiate +
//!    upload, and replay time per kernel, of the explicit vs the captured graph.
//! 2. A loop of N = 100 iterations of a small body (the tiny kernel plus a counter step): one
//!    launch of a graph whose WHILE node runs the body until a device-side counter reaches N, vs a
//!    host loop of N replays of a body graph (a) each followed by a synchronize, and (b) each
//!    followed by reading the continue flag back, as a host-driven loop must.
//!
//! The WHILE node must run exactly N iterations every time, and every counter buffer must hold its
//! initial values plus the number of kernels that ran on it.
//!
//! `cargo run --release -p cuda-async-examples --bin bench-graph-build -- --help` lists the options.

use anyhow::{ensure, Result};
use clap::Parser;
use cuda_async::graph::GraphBodyExt;
use cuda_async::{CaptureOptions, CudaGraph, DeviceError, DeviceOpExt};
use cuda_async_examples::bench::tiny::{self, Checker, Counted, TinyFunction, TinyImage, CFG, INC};
use cuda_async_examples::bench::{self, Case, Common};
use cuda_core::{DeviceBuffer, Function, Graph, GraphExec, InstantiateFlags, LaunchConfig, Stream};
use std::cell::{Cell, RefCell};
use std::time::Instant;

/// Explicitly built graphs and WHILE loops.
#[derive(Parser, serde::Serialize)]
struct Args {
    #[command(flatten)]
    #[serde(flatten)]
    common: Common,
}

const CHAIN: usize = 1000;
const LOOP_N: u32 = 100;
const REPLAYS: usize = 50;
const ONE: LaunchConfig = LaunchConfig { grid: (1, 1, 1), block: (1, 1, 1), shared_mem_bytes: 0 };

const STEP_SRC: &str = r#"
extern "C" __global__ void step(unsigned* counter, const unsigned* limit, unsigned* flag) {
    unsigned c = *counter + 1u; *counter = c; *flag = c < *limit ? 1u : 0u;
}
extern "C" __global__ void init(unsigned* counter, const unsigned* limit, unsigned* flag) {
    *counter = 0u; *flag = 0u < *limit ? 1u : 0u;
}
"#;

/// The loop's state: `counter` counts iterations up to `limit`; `flag` says whether to go on.
struct Loop {
    step: Function,
    init: Function,
    counter: DeviceBuffer<u32>,
    limit: DeviceBuffer<u32>,
    flag: DeviceBuffer<u32>,
}

fn main() -> Result<()> {
    let a = Args::parse();
    let (dev, mut run) = bench::start("bench-graph-build", &a, &a.common, true)?;
    kernels::Kernels::get(&dev)?;
    let image = TinyImage::compile(&dev)?;
    let func = image.load(&dev)?;
    let s = Stream::new(&dev)?;
    let init = tiny::init_values(&mut bench::rng_from_time(&mut run.report));
    let (mut by_op, mut by_kernel, mut captured_buf) =
        (Counted::new(&s, &init)?, Counted::new(&s, &init)?, Counted::new(&s, &init)?);

    // 1. Chains.
    let mut capture = || build_secs(|| fw_capture(&s, &func, &mut captured_buf));
    let case = Case::new("1 build 1000-kernel chain: add_op vs capture", "ms", 1, || {
        build_secs(|| chain_by_ops(&s, &func, &mut by_op))
    });
    run.run(case.raw(&mut capture).note(
        "raw column = CudaGraph::scope capture + instantiate + upload; framework column = 1000 x GraphBodyExt::add_op",
    ))?;
    let case = Case::new("1 build 1000-kernel chain: add_kernel vs capture", "ms", 1, || {
        build_secs(|| chain_by_kernels(&s, &func, &mut by_kernel))
    });
    run.run(case.raw(&mut capture).note("framework column = 1000 x unsafe GraphBody::add_kernel"))?;

    let explicit = chain_by_ops(&s, &func, &mut by_op)?;
    let captured = fw_capture(&s, &func, &mut captured_buf)?;
    // Timed: instantiate, upload and wait for the upload; the destruction is left out.
    let instantiate = |g: &Graph| -> Result<f64> {
        let t = Instant::now();
        let _exec = g.instantiate_and_upload(InstantiateFlags::NONE, &s)?;
        s.synchronize()?;
        Ok(t.elapsed().as_secs_f64())
    };
    let case = Case::new("1 instantiate+upload: explicit vs captured", "ms", 1, || instantiate(&explicit));
    let note = "raw column = the captured graph, framework column = the explicitly built one";
    run.run(case.raw(|| instantiate(captured.graph())).note(note))?;
    let (exec_explicit, exec_captured) = (
        explicit.instantiate_and_upload(InstantiateFlags::NONE, &s)?,
        captured.graph().instantiate_and_upload(InstantiateFlags::NONE, &s)?,
    );
    let replays = |exec: &GraphExec, c: &mut Counted| -> Result<()> {
        (0..REPLAYS).try_for_each(|_| exec.launch(&s))?;
        c.launches += (REPLAYS * CHAIN) as u64;
        Ok(s.synchronize()?)
    };
    let case = Case::new("1 replay per kernel: explicit vs captured", "us/kernel", REPLAYS * CHAIN, || {
        replays(&exec_explicit, &mut by_op)
    });
    let note = format!("{REPLAYS} replays of each 1000-kernel graph, then one synchronize");
    run.run(case.raw(|| replays(&exec_captured, &mut captured_buf)).note(note))?;

    // 2. WHILE loop vs host loops.
    let m = dev.compile_module("step.cu", STEP_SRC, &[])?;
    let mut lp = Loop {
        step: m.function("step")?,
        init: m.function("init")?,
        counter: DeviceBuffer::from_host(&s, &[0u32])?,
        limit: DeviceBuffer::from_host(&s, &[LOOP_N])?,
        flag: DeviceBuffer::from_host(&s, &[1u32])?,
    };
    let mut work = Counted::new(&s, &init)?;
    let while_graph = build_while(&s, &func, &mut lp, &mut work.buf)?;
    let body_graph = build_body(&s, &func, &mut lp, &mut work.buf)?;
    let (lp, work_launches) = (RefCell::new(lp), Cell::new(0u64));
    let mut on_device = || -> Result<f64> {
        let t = Instant::now();
        while_graph.launch().sync_on(&s)?;
        let secs = t.elapsed().as_secs_f64();
        let n = lp.borrow().counter.to_vec()?[0];
        ensure!(n == LOOP_N, "the WHILE node ran {n} iterations, not {LOOP_N}");
        work_launches.set(work_launches.get() + u64::from(n));
        Ok(secs)
    };
    let case = Case::new("2 loop of 100: WHILE node vs host replays + sync", "us", 1, &mut on_device);
    let case = case.raw(|| {
        let t = Instant::now();
        (0..LOOP_N).try_for_each(|_| body_graph.launch().sync_on(&s))?;
        work_launches.set(work_launches.get() + u64::from(LOOP_N));
        Ok(t.elapsed().as_secs_f64())
    });
    run.run(case.note("raw column = host loop of 100 body replays, each followed by a synchronize"))?;
    let case = Case::new("2 loop of 100: WHILE node vs host replays + flag read", "us", 1, &mut on_device);
    let case = case.raw(|| {
        let mut lp = lp.borrow_mut();
        lp.counter.copy_from_host(&s, &[0])?;
        s.synchronize()?;
        let (t, mut n) = (Instant::now(), 0u64);
        loop {
            body_graph.launch().sync_on(&s)?;
            n += 1;
            if lp.flag.to_vec()?[0] == 0 {
                break;
            }
        }
        let secs = t.elapsed().as_secs_f64();
        ensure!(
            n == u64::from(LOOP_N) && lp.counter.to_vec()?[0] == LOOP_N,
            "the host loop ran {n} iterations"
        );
        work_launches.set(work_launches.get() + n);
        Ok(secs)
    });
    let note = "raw column = host loop that replays the body and reads the continue flag back each iteration";
    run.run(case.note(note))?;
    work.launches = work_launches.get();

    let mut check = Checker::new(&init);
    let correctness = (|| {
        s.synchronize()?;
        check.counted("chain by add_op", [&by_op])?;
        check.counted("chain by add_kernel (never run)", [&by_kernel])?;
        check.counted("captured chain", [&captured_buf])?;
        check.counted("loop work", [&work])?;
        Ok(format!("{}; the WHILE node ran exactly {LOOP_N} iterations each time", check.summary()))
    })();
    run.report.publish(correctness, a.common.json.as_deref())
}

/// The seconds `build` takes; what it built is dropped afterwards, untimed.
fn build_secs<G>(build: impl FnOnce() -> Result<G>) -> Result<f64> {
    let t = Instant::now();
    let built = build()?;
    let secs = t.elapsed().as_secs_f64();
    drop(built);
    Ok(secs)
}

/// The chain captured (`CudaGraph::scope`: capture, instantiate, upload).
fn fw_capture(s: &Stream, func: &TinyFunction, c: &mut Counted) -> Result<CudaGraph<()>> {
    Ok(CudaGraph::scope(s, |sc| (0..CHAIN).try_for_each(|_| sc.record(c.op(func))))?)
}

/// The chain built node by node with `add_op`.
fn chain_by_ops(s: &Stream, func: &TinyFunction, c: &mut Counted) -> Result<Graph> {
    let mut g = Graph::new(s.device())?;
    let mut b = g.builder();
    let mut prev = vec![];
    for _ in 0..CHAIN {
        prev = vec![b.add_op(c.op(func), &prev)?.1];
    }
    Ok(g)
}

/// The chain built node by node with `add_kernel`.
fn chain_by_kernels(s: &Stream, func: &TinyFunction, c: &mut Counted) -> Result<Graph> {
    let mut g = Graph::new(s.device())?;
    let mut b = g.builder();
    let (mut prev, n) = (vec![], c.buf.len() as u64);
    for _ in 0..CHAIN {
        // SAFETY: `tiny(unsigned long long* x, unsigned int inc, unsigned long long n)` with
        // exactly these argument types; it writes x[0..n) of the `&mut` buffer, which the graph
        // keeps alive.
        prev = vec![unsafe { b.add_kernel(func.function(), CFG, (&mut c.buf, INC, n), &prev) }?];
    }
    Ok(g)
}

/// init → set-conditional → WHILE { tiny; step; set-conditional }.
fn build_while(
    s: &Stream,
    func: &TinyFunction,
    lp: &mut Loop,
    work: &mut DeviceBuffer<u64>,
) -> Result<CudaGraph<()>> {
    let mut g = Graph::new(s.device())?;
    let mut b = g.builder();
    let cond = b.conditional(None)?;
    // SAFETY: init(unsigned* counter, const unsigned* limit, unsigned* flag) on 1-element buffers.
    let i = unsafe { b.add_kernel(&lp.init, ONE, (&mut lp.counter, &lp.limit, &mut lp.flag), &[]) }?;
    let set = b.add_set_conditional(&cond, &lp.flag, &[i])?;
    b.add_while::<DeviceError>(&cond, &[set], |body| {
        let (_, t) = body.add_op(tiny::Tiny { func, buf: &mut *work }, &[])?;
        // SAFETY: step(counter, limit, flag) on 1-element buffers.
        let st = unsafe { body.add_kernel(&lp.step, ONE, (&mut lp.counter, &lp.limit, &mut lp.flag), &[t])? };
        body.add_set_conditional(&cond, &lp.flag, &[st])?;
        Ok(())
    })?;
    Ok(CudaGraph::from_graph(s, g, CaptureOptions::default())?)
}

/// tiny; step — the body alone, for host-driven loops.
fn build_body(
    s: &Stream,
    func: &TinyFunction,
    lp: &mut Loop,
    work: &mut DeviceBuffer<u64>,
) -> Result<CudaGraph<()>> {
    let mut g = Graph::new(s.device())?;
    let mut b = g.builder();
    let (_, t) = b.add_op(tiny::Tiny { func, buf: work }, &[])?;
    // SAFETY: step(counter, limit, flag) on 1-element buffers.
    unsafe { b.add_kernel(&lp.step, ONE, (&mut lp.counter, &lp.limit, &mut lp.flag), &[t]) }?;
    Ok(CudaGraph::from_graph(s, g, CaptureOptions::default())?)
}
