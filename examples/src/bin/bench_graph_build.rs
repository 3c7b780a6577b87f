//! `bench-graph-build`: explicitly built graphs and device-side loops.
//!
//! 1. A 1,000-kernel chain of the tiny kernel built node by node (`GraphBodyExt::add_op`, and
//!    `GraphBody::add_kernel` directly) vs the same chain captured (`CudaGraph::scope`): build time,
//!    instantiate + upload time, and replay time per kernel.
//! 2. A loop of N = 100 iterations of a small body (the tiny kernel plus a counter step): one
//!    launch of a graph whose WHILE node runs the body until a device-side counter reaches N, vs a
//!    host loop of N replays of a body graph (a) each followed by a synchronize, and (b) each
//!    followed by reading the continue flag back, as a host-driven loop must.
//!
//! `cargo run --release -p cuda-async-examples --bin bench-graph-build -- [--repeats R] [--json PATH]`

use cuda_async::graph::GraphBodyExt;
use cuda_async::{CaptureOptions, CudaGraph, DeviceOpExt};
use cuda_async_examples::bench::{self, ctx, OptSpec, Row, JSON_OPT};
use cuda_async_examples::raw::{
    tiny_reference, Tiny, TinyFunction, TinyImage, TINY_CFG, TINY_ELEMS, TINY_SCALE,
};
use cuda_core::{Device, DeviceBuffer, Function, Graph, InstantiateFlags, LaunchConfig, Stream};
use std::process::ExitCode;
use std::time::Instant;

const SPEC: &[OptSpec] =
    &[OptSpec { name: "--repeats", value: "R", help: "repeats of each measurement (default 9)" }, JSON_OPT];
const CHAIN: usize = 1000;
const LOOP_N: u32 = 100;
const REPLAYS: usize = 50;

const STEP_SRC: &str = r#"
extern "C" __global__ void step(unsigned* counter, const unsigned* limit, unsigned* flag) {
    unsigned c = *counter + 1u; *counter = c; *flag = c < *limit ? 1u : 0u;
}
extern "C" __global__ void init(unsigned* counter, const unsigned* limit, unsigned* flag) {
    *counter = 0u; *flag = 0u < *limit ? 1u : 0u;
}
"#;

fn main() -> ExitCode {
    bench::main_with("bench-graph-build", run)
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

struct Loop {
    step: Function,
    init: Function,
    counter: DeviceBuffer<u32>,
    limit: DeviceBuffer<u32>,
    flag: DeviceBuffer<u32>,
}

const ONE: LaunchConfig = LaunchConfig { grid: (1, 1, 1), block: (1, 1, 1), shared_mem_bytes: 0 };

fn run() -> Result<(), String> {
    let Some(opts) =
        bench::Options::from_env_or_usage("bench-graph-build", "explicit graphs and WHILE loops", SPEC)?
    else {
        return Ok(());
    };
    let repeats: usize = opts.get_or("--repeats", 9)?;
    let (dev, gpu) = bench::open_gpu("bench-graph-build", bench::make_async_default)?;
    kernels::Kernels::get(&dev).map_err(ctx("loading kernels"))?;
    let image = TinyImage::compile(&dev)?;
    let func = image.load(&dev)?;
    let s = Stream::new(&dev).map_err(ctx("Stream::new"))?;
    let init: Vec<f32> = (0..TINY_ELEMS).map(|i| i as f32 * 0.25 - 3.0).collect();
    let mut report = gpu.report("bench-graph-build");
    let mut checks = Vec::new();

    // 1. Chains.
    let mut bufs: Vec<DeviceBuffer<f32>> = (0..3)
        .map(|_| DeviceBuffer::from_host(&s, &init))
        .collect::<Result<_, _>>()
        .map_err(ctx("buffers"))?;
    let (mut build_op, mut build_raw, mut build_cap) = (vec![], vec![], vec![]);
    let (mut inst_exp, mut inst_cap, mut rep_exp, mut rep_cap) = (vec![], vec![], vec![], vec![]);
    let mut launches = [0u64; 3];
    for r in 0..repeats {
        let t = Instant::now();
        let explicit = chain_by_ops(&dev, &func, &mut bufs[0])?;
        build_op.push(ms_since(t));
        let t = Instant::now();
        let _explicit_raw = chain_by_kernels(&dev, &func, &mut bufs[1])?;
        build_raw.push(ms_since(t));
        let t = Instant::now();
        let captured = CudaGraph::scope(&s, |sc| {
            for _ in 0..CHAIN {
                sc.record(Tiny { func: &func, buf: &mut bufs[2] })?;
            }
            Ok(())
        })
        .map_err(ctx("capturing the chain"))?;
        build_cap.push(ms_since(t));
        let order: [&Graph; 2] = [&explicit, captured.graph()];
        let mut inst = [0.0; 2];
        let mut execs = Vec::new();
        for (i, g) in order.iter().enumerate() {
            let t = Instant::now();
            let e = g.instantiate_and_upload(InstantiateFlags::NONE, &s).map_err(ctx("instantiate"))?;
            s.synchronize().map_err(ctx("sync"))?;
            inst[i] = ms_since(t);
            execs.push(e);
        }
        inst_exp.push(inst[0]);
        inst_cap.push(inst[1]);
        let mut rep = [0.0; 2];
        for k in 0..2 {
            let i = if r % 2 == 0 { k } else { 1 - k };
            let t = Instant::now();
            for _ in 0..REPLAYS {
                execs[i].launch(&s).map_err(ctx("replay"))?;
            }
            s.synchronize().map_err(ctx("sync"))?;
            rep[i] = t.elapsed().as_secs_f64() * 1e6 / (REPLAYS * CHAIN) as f64;
        }
        rep_exp.push(rep[0]);
        rep_cap.push(rep[1]);
        launches[0] += (REPLAYS * CHAIN) as u64;
        launches[2] += (REPLAYS * CHAIN) as u64;
    }
    let b0 = bufs[0].to_vec().map_err(ctx("read"))?;
    let b2 = bufs[2].to_vec().map_err(ctx("read"))?;
    checks.push(b0 == tiny_reference(&init, launches[0]) && b2 == tiny_reference(&init, launches[2]));
    report.rows.push(Row::compare("1 build 1000-kernel chain: add_op vs capture", "ms", build_cap.clone(), build_op, None)
        .with_note("raw column = CudaGraph::scope capture + instantiate + upload; framework column = 1000 x GraphBodyExt::add_op (each op recorded once)"));
    report.rows.push(
        Row::compare("1 build 1000-kernel chain: add_kernel vs capture", "ms", build_cap, build_raw, None)
            .with_note("framework column = 1000 x unsafe GraphBody::add_kernel"),
    );
    report.rows.push(
        Row::compare("1 instantiate+upload: explicit vs captured", "ms", inst_cap, inst_exp, None)
            .with_note("raw column = the captured graph, framework column = the explicitly built one"),
    );
    report.rows.push(
        Row::compare("1 replay per kernel: explicit vs captured", "us/kernel", rep_cap, rep_exp, None)
            .with_note(format!("{REPLAYS} replays of each 1000-kernel graph, then one synchronize")),
    );

    // 2. WHILE loop vs host loops.
    let m = dev.compile_module("step.cu", STEP_SRC, &[]).map_err(ctx("compiling step"))?;
    let mut lp = Loop {
        step: m.function("step").map_err(ctx("step"))?,
        init: m.function("init").map_err(ctx("init"))?,
        counter: DeviceBuffer::from_host(&s, &[0u32]).map_err(ctx("counter"))?,
        limit: DeviceBuffer::from_host(&s, &[LOOP_N]).map_err(ctx("limit"))?,
        flag: DeviceBuffer::from_host(&s, &[1u32]).map_err(ctx("flag"))?,
    };
    let mut work = DeviceBuffer::from_host(&s, &init).map_err(ctx("work"))?;
    let while_graph = build_while(&dev, &s, &func, &mut lp, &mut work)?;
    let body_graph = build_body(&s, &func, &mut lp, &mut work)?;
    let mut work_launches = 0u64;
    let (mut dev_loop, mut host_sync, mut host_read) = (vec![], vec![], vec![]);
    for _ in 0..repeats + 1 {
        let t = Instant::now();
        while_graph.launch().sync_on(&s).map_err(ctx("WHILE graph"))?;
        dev_loop.push(t.elapsed().as_secs_f64() * 1e6);
        work_launches += LOOP_N as u64;
        let counted = lp.counter.to_vec().map_err(ctx("counter"))?[0];
        checks.push(counted == LOOP_N);
        lp.counter.copy_from_host(&s, &[0]).map_err(ctx("reset"))?;
        s.synchronize().map_err(ctx("sync"))?;
        let t = Instant::now();
        for _ in 0..LOOP_N {
            body_graph.launch().sync_on(&s).map_err(ctx("body replay"))?;
        }
        host_sync.push(t.elapsed().as_secs_f64() * 1e6);
        lp.counter.copy_from_host(&s, &[0]).map_err(ctx("reset"))?;
        s.synchronize().map_err(ctx("sync"))?;
        let t = Instant::now();
        loop {
            body_graph.launch().sync_on(&s).map_err(ctx("body replay"))?;
            if lp.flag.to_vec().map_err(ctx("flag"))?[0] == 0 {
                break;
            }
        }
        host_read.push(t.elapsed().as_secs_f64() * 1e6);
        work_launches += 2 * LOOP_N as u64;
        checks.push(lp.counter.to_vec().map_err(ctx("counter"))?[0] == LOOP_N);
    }
    // The first sample of each includes one-time costs.
    let (dev_loop, host_sync, host_read) =
        (dev_loop[1..].to_vec(), host_sync[1..].to_vec(), host_read[1..].to_vec());
    report.rows.push(
        Row::compare(
            "2 loop of 100: WHILE node vs host replays + sync",
            "us",
            host_sync,
            dev_loop.clone(),
            None,
        )
        .with_note("raw column = host loop of 100 body replays, each followed by a synchronize"),
    );
    report.rows.push(
        Row::compare(
            "2 loop of 100: WHILE node vs host replays + flag read",
            "us",
            host_read,
            dev_loop,
            None,
        )
        .with_note(
            "raw column = host loop that replays the body and reads the continue flag back each iteration",
        ),
    );
    let wv = work.to_vec().map_err(ctx("read"))?;
    checks.push(wv == tiny_reference(&init, work_launches));
    let ok = checks.iter().all(|&c| c);
    let correctness = if ok {
        Ok(format!("ok: chains and loops match the host reference; the WHILE node ran exactly {LOOP_N} iterations each time"))
    } else {
        Err(format!("mismatch in {} of {} checks", checks.iter().filter(|c| !**c).count(), checks.len()))
    };
    report.publish(&correctness, opts.json_path().as_deref())?;
    bench::conclude(correctness)
}

fn chain_by_ops(dev: &Device, func: &TinyFunction, buf: &mut DeviceBuffer<f32>) -> Result<Graph, String> {
    let mut g = Graph::new(dev).map_err(ctx("Graph::new"))?;
    let mut b = g.builder();
    let mut prev = vec![];
    for _ in 0..CHAIN {
        let (_, n) = b.add_op(Tiny { func, buf: &mut *buf }, &prev).map_err(ctx("add_op"))?;
        prev = vec![n];
    }
    Ok(g)
}

fn chain_by_kernels(dev: &Device, func: &TinyFunction, buf: &mut DeviceBuffer<f32>) -> Result<Graph, String> {
    let mut g = Graph::new(dev).map_err(ctx("Graph::new"))?;
    let mut b = g.builder();
    let mut prev = vec![];
    for _ in 0..CHAIN {
        // SAFETY: `tiny(float* x, float a, u64 n)` with exactly these argument types; it writes
        // x[0..n) of the `&mut` buffer, which the graph keeps alive.
        let n = unsafe {
            b.add_kernel(func.function(), TINY_CFG, (&mut *buf, TINY_SCALE, TINY_ELEMS as u64), &prev)
        }
        .map_err(ctx("add_kernel"))?;
        prev = vec![n];
    }
    Ok(g)
}

/// init → set-conditional → WHILE { tiny; step; set-conditional }.
fn build_while(
    dev: &Device,
    s: &Stream,
    func: &TinyFunction,
    lp: &mut Loop,
    work: &mut DeviceBuffer<f32>,
) -> Result<CudaGraph<()>, String> {
    let mut g = Graph::new(dev).map_err(ctx("Graph::new"))?;
    {
        let mut b = g.builder();
        let cond = b.conditional(None).map_err(ctx("conditional"))?;
        // SAFETY: init(unsigned* counter, const unsigned* limit, unsigned* flag), 1-element buffers.
        let i = unsafe { b.add_kernel(&lp.init, ONE, (&mut lp.counter, &lp.limit, &mut lp.flag), &[]) }
            .map_err(ctx("init"))?;
        let set = b.add_set_conditional(&cond, &lp.flag, &[i]).map_err(ctx("set"))?;
        b.add_while::<cuda_async::DeviceError>(&cond, &[set], |body| {
            let (_, t) = body.add_op(Tiny { func, buf: &mut *work }, &[])?;
            // SAFETY: step(counter, limit, flag), 1-element buffers.
            let st =
                unsafe { body.add_kernel(&lp.step, ONE, (&mut lp.counter, &lp.limit, &mut lp.flag), &[t])? };
            body.add_set_conditional(&cond, &lp.flag, &[st])?;
            Ok(())
        })
        .map_err(ctx("WHILE"))?;
    }
    CudaGraph::from_graph(s, g, CaptureOptions::default()).map_err(ctx("instantiate WHILE"))
}

/// tiny; step — the body alone, for host-driven loops.
fn build_body(
    s: &Stream,
    func: &TinyFunction,
    lp: &mut Loop,
    work: &mut DeviceBuffer<f32>,
) -> Result<CudaGraph<()>, String> {
    let mut g = Graph::new(s.device()).map_err(ctx("Graph::new"))?;
    {
        let mut b = g.builder();
        let (_, t) = b.add_op(Tiny { func, buf: &mut *work }, &[]).map_err(ctx("add_op"))?;
        // SAFETY: step(counter, limit, flag), 1-element buffers.
        unsafe { b.add_kernel(&lp.step, ONE, (&mut lp.counter, &lp.limit, &mut lp.flag), &[t]) }
            .map_err(ctx("step"))?;
    }
    CudaGraph::from_graph(s, g, CaptureOptions::default()).map_err(ctx("instantiate body"))
}
