//! `bench-async`: the cost of `cuda-async` (ops, `sync_on`, `.await`, combinators) over the same
//! work done through raw driver calls, side by side in one process.
//!
//! One tiny kernel (`x[i] = 0.999f * x[i] + 1.0f` over 32 floats, one block of 32 threads) is
//! compiled once with cuda-core's NVRTC and loaded twice: with raw `cuModuleLoadData` for the
//! baseline (raw `cuLaunchKernel`, `cuStreamSynchronize`, `cuMemAlloc_v2` buffers), and with
//! `Module::from_cubin` for the framework, where a small custom op, [`Tiny`], launches it from
//! `DeviceOp::execute` on the context's stream.
//!
//! 1. `Tiny.sync_on(&stream)` vs raw launch + synchronize; µs per round trip (goal ≤ 1.10×).
//! 2. One op of L (1,000) tiny kernels, `join_all` of L `Tiny`s each on its own buffer, built and
//!    run with one `sync_on`, vs L raw launches (L buffers) + one synchronize; µs per kernel
//!    (goal ≤ 1.05×). The framework time includes building the op tree.
//! 3. `.await` of one `Tiny` on a current-thread tokio runtime, (a) `op.on(&stream).await` and
//!    (b) the default policy's `Op::new(op).await`, vs raw launch + synchronize; µs per round trip
//!    (goal ≤ 1.25×).
//! 4. T (64) tokio tasks × K (1,000) awaited `Tiny`s each on the default multi-thread runtime
//!    (default policy: round robin over 4 streams), vs one thread doing the same T·K raw
//!    launch + synchronize round trips; wall µs per op (goal: throughput ≥ 0.9× raw, i.e. time
//!    ≤ 1.111× raw) and process CPU time per op (getrusage, all threads). 4b: the same tasks with
//!    `op.on(buffer's home stream)` instead of the default policy (diagnostic, no goal).
//! 5. Host cost of composing (building and dropping, not executing) `join_all` of L `Tiny`s and a
//!    boxed `.then` chain of 100; ns per op (framework only).
//!
//! Every measurement warms up, then repeats R times rotating which side goes first; medians are
//! compared. Afterwards every buffer of both sides is copied back and checked against a host
//! reference for the number of launches it saw.
//!
//! `cargo run --release -p cuda-async-examples --bin bench-async -- [--repeats R] [--roundtrips N]
//! [--chain L] [--chains C] [--tasks T] [--task-ops K] [--compose-builds B] [--warmup W]
//! [--json PATH]`

use cuda_async::combinators::BoxedOp;
use cuda_async::{DeviceError, DeviceOpExt, Op};
use cuda_async_examples::bench::{self, ctx, Json, OptSpec, Options, Row, SplitMix64, JSON_OPT};
use cuda_async_examples::raw::{Counted, Tiny, TinyChecker, TinyFunction, TinyImage, TinyRaw, TINY_ELEMS};
use cuda_core::{Device, DeviceBuffer, Stream};
use std::cell::RefCell;
use std::ops::Range;
use std::process::ExitCode;
use std::time::Instant;
use tokio::runtime::Runtime;

/// Length of the boxed `.then` chain of measurement 5.
const THEN_LEN: usize = 100;

const GOAL_SYNC_ON: f64 = 1.10;
const GOAL_CHAIN: f64 = 1.05;
const GOAL_AWAIT: f64 = 1.25;
/// Throughput ≥ 0.9× raw, expressed as time per op ≤ 1.111× raw (1/0.9 = 1.1111…; 1.111 is
/// stricter by 0.01%).
const GOAL_TASKS: f64 = 1.111;

const SPEC: &[OptSpec] = &[
    OptSpec {
        name: "--repeats",
        value: "R",
        help: "repeats of every measurement; medians are reported (default 9)",
    },
    OptSpec { name: "--roundtrips", value: "N", help: "round trips per repeat for 1 and 3 (default 2000)" },
    OptSpec {
        name: "--chain",
        value: "L",
        help: "kernels in the one-op chain of 2 and the tree of 5 (default 1000)",
    },
    OptSpec { name: "--chains", value: "C", help: "chains per repeat for 2 (default 10)" },
    OptSpec { name: "--tasks", value: "T", help: "tokio tasks for 4 (default 64)" },
    OptSpec { name: "--task-ops", value: "K", help: "awaited ops per task for 4 (default 1000)" },
    OptSpec { name: "--compose-builds", value: "B", help: "tree builds per repeat for 5 (default 1000)" },
    OptSpec { name: "--warmup", value: "W", help: "warm-up round trips per side for 1 and 3 (default 200)" },
    JSON_OPT,
];

fn main() -> ExitCode {
    bench::main_with("bench-async", run)
}

// ---------------------------------------------------------------------------------------------
// The framework side
// ---------------------------------------------------------------------------------------------

/// The framework side's state. Field order is drop order: the buffers' frees are queued first,
/// then the function (and its module) go, then the stream.
struct Fw {
    /// Home: `stream`. Used by 1 and 3a.
    single: Counted,
    /// Home: a stream of the default policy's pool. Used by 3b.
    pooled: Counted,
    /// Home: `stream`. Used by 2 and 5.
    chain: Vec<Counted>,
    /// Homes: streams of the default policy's pool, round robin. Used by 4.
    tasks: Vec<Counted>,
    func: TinyFunction,
    stream: Stream,
}

impl Fw {
    fn new(dev: &Device, image: &TinyImage, init: &[f32], chain: usize, tasks: usize) -> Result<Fw, String> {
        let func = image.load(dev)?;
        let stream = Stream::new(dev).map_err(ctx("Stream::new"))?;
        let on_stream = |what: &'static str| {
            DeviceBuffer::from_host(&stream, init)
                .map(Counted::new)
                .map_err(move |e| format!("DeviceBuffer::from_host ({what}): {e}"))
        };
        // Allocated the way a user of the default policy would: an allocation op run by `.sync()`,
        // whose buffer's home is the pool stream the policy picked.
        let pooled = || {
            cuda_async::memory::from_host(init)
                .sync()
                .map(Counted::new)
                .map_err(ctx("memory::from_host(..).sync()"))
        };
        let single = on_stream("single")?;
        let chain = (0..chain).map(|_| on_stream("chain")).collect::<Result<Vec<_>, _>>()?;
        let pooled_one = pooled()?;
        let tasks = (0..tasks).map(|_| pooled()).collect::<Result<Vec<_>, _>>()?;
        dev.synchronize().map_err(ctx("device synchronize after the uploads"))?;
        Ok(Fw { single, pooled: pooled_one, chain, tasks, func, stream })
    }
}

// ---------------------------------------------------------------------------------------------
// Raw driver side
// ---------------------------------------------------------------------------------------------

/// Indices of the raw side's buffers: one for 1 and 3, `chain` for 2, `tasks` for 4.
struct RawLayout {
    single: usize,
    chain: Range<usize>,
    tasks: Range<usize>,
}

impl RawLayout {
    fn new(chain: usize, tasks: usize) -> RawLayout {
        RawLayout { single: 0, chain: 1..1 + chain, tasks: 1 + chain..1 + chain + tasks }
    }
    fn len(&self) -> usize {
        self.tasks.end
    }
}

// ---------------------------------------------------------------------------------------------
// 1 and 3: round trips
// ---------------------------------------------------------------------------------------------

/// Raw: `n` times (launch; synchronize); µs per round trip.
fn raw_round_trips(raw: &mut TinyRaw, k: usize, n: usize) -> Result<f64, String> {
    raw.sync()?;
    let t = Instant::now();
    for _ in 0..n {
        raw.launch(k)?;
        raw.sync()?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// 1: `n` times `Tiny.sync_on(&stream)`; µs per round trip.
fn fw_sync_on(func: &TinyFunction, stream: &Stream, c: &mut Counted, n: usize) -> Result<f64, String> {
    stream.synchronize().map_err(ctx("Stream::synchronize"))?;
    let t = Instant::now();
    for _ in 0..n {
        Tiny { func, buf: &mut c.buf }.sync_on(stream).map_err(ctx("Tiny.sync_on"))?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / n as f64;
    c.launches += n as u64;
    Ok(us)
}

/// 3a: `n` times `Tiny.on(&stream).await` inside `rt.block_on`; µs per round trip.
fn fw_await_on(
    rt: &Runtime,
    func: &TinyFunction,
    stream: &Stream,
    c: &mut Counted,
    n: usize,
) -> Result<f64, String> {
    stream.synchronize().map_err(ctx("Stream::synchronize"))?;
    let buf = &mut c.buf;
    let us = rt
        .block_on(async {
            let t = Instant::now();
            for _ in 0..n {
                Tiny { func, buf: &mut *buf }.on(stream).await?;
            }
            Ok::<f64, DeviceError>(t.elapsed().as_secs_f64() * 1e6 / n as f64)
        })
        .map_err(ctx("awaiting Tiny.on(&stream)"))?;
    c.launches += n as u64;
    Ok(us)
}

/// 3b: `n` times `Op::new(Tiny).await` (default policy) inside `rt.block_on`; µs per round trip.
fn fw_await_default(
    rt: &Runtime,
    dev: &Device,
    func: &TinyFunction,
    c: &mut Counted,
    n: usize,
) -> Result<f64, String> {
    dev.synchronize().map_err(ctx("Device::synchronize"))?;
    let buf = &mut c.buf;
    let us = rt
        .block_on(async {
            let t = Instant::now();
            for _ in 0..n {
                Op::new(Tiny { func, buf: &mut *buf }).await?;
            }
            Ok::<f64, DeviceError>(t.elapsed().as_secs_f64() * 1e6 / n as f64)
        })
        .map_err(ctx("awaiting Op::new(Tiny) with the default policy"))?;
    c.launches += n as u64;
    Ok(us)
}

// ---------------------------------------------------------------------------------------------
// 2 and 5: one op of many kernels
// ---------------------------------------------------------------------------------------------

/// Raw: `chains` times (one launch on each buffer of `range`; synchronize); µs per kernel.
fn raw_chains(raw: &mut TinyRaw, range: Range<usize>, chains: usize) -> Result<f64, String> {
    raw.sync()?;
    let t = Instant::now();
    for _ in 0..chains {
        for k in range.clone() {
            raw.launch(k)?;
        }
        raw.sync()?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / (chains * range.len()).max(1) as f64)
}

/// 2: `chains` times (build `join_all` of one `Tiny` per buffer; `sync_on`); µs per kernel.
fn fw_chains(
    func: &TinyFunction,
    stream: &Stream,
    bufs: &mut [Counted],
    chains: usize,
) -> Result<f64, String> {
    stream.synchronize().map_err(ctx("Stream::synchronize"))?;
    let t = Instant::now();
    for _ in 0..chains {
        cuda_async::join_all(bufs.iter_mut().map(|c| Tiny { func, buf: &mut c.buf }))
            .sync_on(stream)
            .map_err(ctx("join_all(Tiny..).sync_on"))?;
    }
    let us = t.elapsed().as_secs_f64() * 1e6 / (chains * bufs.len()).max(1) as f64;
    for c in bufs {
        c.launches += chains as u64;
    }
    Ok(us)
}

/// 5: `builds` times build `join_all` of one `Tiny` per buffer and drop it unexecuted; ns per op.
fn compose_join_all(func: &TinyFunction, bufs: &mut [Counted], builds: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..builds {
        let op = cuda_async::join_all(bufs.iter_mut().map(|c| Tiny { func, buf: &mut c.buf }));
        drop(std::hint::black_box(op));
    }
    t.elapsed().as_secs_f64() * 1e9 / (builds * bufs.len()).max(1) as f64
}

/// A chain `value(()).then(|()| Tiny).then(|()| Tiny)...`, one `Tiny` per buffer, each step boxed
/// so that the type stays fixed.
fn then_chain<'a>(func: &'a TinyFunction, bufs: &'a mut [Counted]) -> Op<BoxedOp<'a, ()>> {
    let mut op = cuda_async::value(()).boxed();
    for c in bufs {
        let tiny = Tiny { func, buf: &mut c.buf };
        op = op.then(move |()| tiny).boxed();
    }
    op
}

/// 5: `builds` times build [`then_chain`] and drop it unexecuted; ns per op.
fn compose_then(func: &TinyFunction, bufs: &mut [Counted], builds: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..builds {
        drop(std::hint::black_box(then_chain(func, bufs)));
    }
    t.elapsed().as_secs_f64() * 1e9 / (builds * bufs.len()).max(1) as f64
}

// ---------------------------------------------------------------------------------------------
// 4: many tasks
// ---------------------------------------------------------------------------------------------

/// Wall µs per op and process CPU µs per op of one side of 4.
#[derive(Debug, Clone, Copy)]
struct TaskSample {
    wall_us: f64,
    cpu_us: f64,
}

/// Raw: one thread, `ops` round trips (launch; synchronize) on each buffer of `range` in turn.
fn raw_tasks(raw: &mut TinyRaw, range: Range<usize>, ops: usize) -> Result<TaskSample, String> {
    raw.sync()?;
    let total = (range.len() * ops).max(1) as f64;
    let cpu0 = bench::process_cpu_seconds()?;
    let t = Instant::now();
    for k in range {
        for _ in 0..ops {
            raw.launch(k)?;
            raw.sync()?;
        }
    }
    let wall = t.elapsed().as_secs_f64();
    let cpu = bench::process_cpu_seconds()? - cpu0;
    Ok(TaskSample { wall_us: wall * 1e6 / total, cpu_us: cpu * 1e6 / total })
}

/// One task of 4: `ops` awaited `Tiny`s on its own buffer, by the default policy or on the buffer's
/// home stream. Gives the buffer back.
async fn fw_task(
    func: TinyFunction,
    mut c: Counted,
    ops: usize,
    on_home: bool,
) -> cuda_async::Result<Counted> {
    let home = c.buf.home_stream().clone();
    for _ in 0..ops {
        let op = Tiny { func: &func, buf: &mut c.buf };
        if on_home {
            op.on(&home).await?;
        } else {
            Op::new(op).await?;
        }
    }
    c.launches += ops as u64;
    Ok(c)
}

/// Framework: one task per buffer of `bufs` on the multi-thread runtime, `ops` awaited ops each;
/// the buffers come back in order.
fn fw_tasks(
    rt: &Runtime,
    dev: &Device,
    func: &TinyFunction,
    bufs: &mut Vec<Counted>,
    ops: usize,
    on_home: bool,
) -> Result<TaskSample, String> {
    dev.synchronize().map_err(ctx("Device::synchronize"))?;
    let total = (bufs.len() * ops).max(1) as f64;
    let taken = std::mem::take(bufs);
    let cpu0 = bench::process_cpu_seconds()?;
    let t = Instant::now();
    let handles: Vec<_> =
        taken.into_iter().map(|c| rt.spawn(fw_task(func.clone(), c, ops, on_home))).collect();
    let results = rt.block_on(async {
        let mut out = Vec::with_capacity(handles.len());
        for h in handles {
            out.push(h.await);
        }
        out
    });
    let wall = t.elapsed().as_secs_f64();
    let cpu = bench::process_cpu_seconds()? - cpu0;
    let mut first_err = None;
    for r in results {
        match r {
            Ok(Ok(c)) => bufs.push(c),
            Ok(Err(e)) => {
                first_err.get_or_insert_with(|| format!("a task's awaited op failed: {e}"));
            }
            Err(e) => {
                first_err.get_or_insert_with(|| format!("a task did not finish: {e}"));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(TaskSample { wall_us: wall * 1e6 / total, cpu_us: cpu * 1e6 / total }),
    }
}

// ---------------------------------------------------------------------------------------------
// Correctness
// ---------------------------------------------------------------------------------------------

/// Copies every buffer of both sides back and checks it; returns a one-line summary.
fn check_all(init: &[f32], fw: &Fw, raw: &TinyRaw, dev: &Device) -> Result<String, String> {
    dev.synchronize().map_err(ctx("final device synchronize"))?;
    let mut c = TinyChecker::new(init);
    c.check_counted("framework single", [&fw.single])?;
    c.check_counted("framework pooled", [&fw.pooled])?;
    c.check_counted("framework chain", &fw.chain)?;
    c.check_counted("framework task", &fw.tasks)?;
    c.check_raw(raw)?;
    Ok(format!(
        "ok: {} buffers, {} launches in all, every buffer finite, changed, and within \
         {:.1e} (relative) of the host reference for its launch count",
        c.buffers, c.launches, c.worst
    ))
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

struct Params {
    repeats: usize,
    round_trips: usize,
    chain: usize,
    chains: usize,
    tasks: usize,
    task_ops: usize,
    builds: usize,
    warmup: usize,
}

fn run() -> Result<(), String> {
    let about = "Compares cuda-async (ops, sync_on, .await, combinators) with raw CUDA driver calls.";
    let Some(opts) = Options::from_env_or_usage("bench-async", about, SPEC)? else {
        return Ok(());
    };
    let p = Params {
        repeats: opts.count_or("--repeats", 9, 1)?,
        round_trips: opts.count_or("--roundtrips", 2_000, 1)?,
        chain: opts.count_or("--chain", 1_000, 1)?,
        chains: opts.count_or("--chains", 10, 1)?,
        tasks: opts.count_or("--tasks", 64, 1)?,
        task_ops: opts.count_or("--task-ops", 1_000, 1)?,
        builds: opts.count_or("--compose-builds", 1_000, 1)?,
        warmup: opts.count_or("--warmup", 200, 0)?,
    };
    let json_path = opts.json_path();

    let (dev, gpu) = bench::open_gpu("bench-async", bench::make_async_default)?;
    let mut rng = SplitMix64::from_time();
    let seed = rng.state();

    let image = TinyImage::compile(&dev)?;
    let init: Vec<f32> = (0..TINY_ELEMS).map(|_| rng.f32_in(0.5, 1.5)).collect();

    let layout = RawLayout::new(p.chain, p.tasks);
    let mut raw = TinyRaw::new(&dev, &image, layout.len(), &init)?;
    let mut fw = Fw::new(&dev, &image, &init, p.chain, p.tasks)?;

    let rt_current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("building the current-thread tokio runtime: {e}"))?;
    let rt_multi = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("building the multi-thread tokio runtime: {e}"))?;
    let workers = std::env::var("TOKIO_WORKER_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()));

    let r = p.repeats;
    let Fw { single, pooled, chain, tasks, func, stream } = &mut fw;
    let (func, stream) = (&*func, &*stream);

    // 1. sync_on round trip.
    println!("1: sync_on round trips ({} per repeat, {r} repeats, {} warm-up)", p.round_trips, p.warmup);
    raw_round_trips(&mut raw, layout.single, p.warmup.max(1))?;
    fw_sync_on(func, stream, single, p.warmup.max(1))?;
    let (raw1, fw1) = bench::alternating(
        r,
        || raw_round_trips(&mut raw, layout.single, p.round_trips),
        || fw_sync_on(func, stream, single, p.round_trips),
    )?;

    // 2. one op of `chain` kernels.
    println!("2: {} chains of {} kernels per repeat as one join_all op", p.chains, p.chain);
    raw_chains(&mut raw, layout.chain.clone(), 2)?;
    fw_chains(func, stream, chain, 2)?;
    let (raw2, fw2) = bench::alternating(
        r,
        || raw_chains(&mut raw, layout.chain.clone(), p.chains),
        || fw_chains(func, stream, chain, p.chains),
    )?;

    // The framework's back-to-back launch cost (no completion per op), to estimate in 4 the CPU that
    // the per-op scheduling and completion machinery adds.
    let launch_us = bench::median(&fw2);

    // 3. .await on a current-thread runtime.
    println!("3: awaited round trips on a current-thread runtime ({} per repeat)", p.round_trips);
    raw_round_trips(&mut raw, layout.single, p.warmup.max(1))?;
    fw_await_on(&rt_current, func, stream, single, p.warmup.max(1))?;
    fw_await_default(&rt_current, &dev, func, pooled, p.warmup.max(1))?;
    let s3 = {
        let mut a = || raw_round_trips(&mut raw, layout.single, p.round_trips);
        let mut b = || fw_await_on(&rt_current, func, stream, single, p.round_trips);
        let mut c = || fw_await_default(&rt_current, &dev, func, pooled, p.round_trips);
        bench::rotating(r, &mut [&mut a, &mut b, &mut c])?
    };
    let [raw3, fw3a, fw3b]: [Vec<f64>; 3] =
        s3.try_into().map_err(|_| "internal: wrong number of sample sets for 3".to_string())?;

    // 4. many tasks × many awaited ops.
    println!(
        "4: {} tasks x {} awaited ops on a multi-thread runtime ({} workers) vs one raw thread",
        p.tasks,
        p.task_ops,
        workers.map_or("default".to_string(), |w| w.to_string())
    );
    let warm4 = (p.task_ops / 10).max(1);
    raw_tasks(&mut raw, layout.tasks.clone(), warm4)?;
    fw_tasks(&rt_multi, &dev, func, tasks, warm4, false)?;
    fw_tasks(&rt_multi, &dev, func, tasks, warm4, true)?;
    let (mut raw4, mut fw4, mut fw4h) = (Vec::new(), Vec::new(), Vec::new());
    {
        // Both framework variants use the task buffers, one at a time.
        let task_bufs = RefCell::new(std::mem::take(tasks));
        let mut a = || {
            let s = raw_tasks(&mut raw, layout.tasks.clone(), p.task_ops)?;
            raw4.push(s);
            Ok::<f64, String>(s.wall_us)
        };
        let mut b = || {
            let s = fw_tasks(&rt_multi, &dev, func, &mut task_bufs.borrow_mut(), p.task_ops, false)?;
            fw4.push(s);
            Ok::<f64, String>(s.wall_us)
        };
        let mut c = || {
            let s = fw_tasks(&rt_multi, &dev, func, &mut task_bufs.borrow_mut(), p.task_ops, true)?;
            fw4h.push(s);
            Ok::<f64, String>(s.wall_us)
        };
        let res = bench::rotating(r, &mut [&mut a, &mut b, &mut c]);
        *tasks = task_bufs.into_inner();
        res?;
    }
    let wall = |v: &[TaskSample]| v.iter().map(|s| s.wall_us).collect::<Vec<_>>();
    let cpu = |v: &[TaskSample]| v.iter().map(|s| s.cpu_us).collect::<Vec<_>>();

    // 5. composing without executing.
    let then_len = THEN_LEN.min(chain.len());
    println!(
        "5: composing join_all({}) and a boxed .then chain({then_len}), {} builds per repeat",
        p.chain, p.builds
    );
    compose_join_all(func, chain, p.builds);
    compose_then(func, &mut chain[..then_len], p.builds);
    let (mut fw5a, mut fw5b) = (Vec::with_capacity(r), Vec::with_capacity(r));
    for _ in 0..r {
        fw5a.push(compose_join_all(func, chain, p.builds));
        fw5b.push(compose_then(func, &mut chain[..then_len], p.builds));
    }
    // Run the .then chain once, so that what was composed is known to work.
    then_chain(func, &mut chain[..then_len]).sync_on(stream).map_err(ctx("then chain .sync_on"))?;
    for c in &mut chain[..then_len] {
        c.launches += 1;
    }

    // Correctness, then release the raw handles.
    let correctness = check_all(&init, &fw, &raw, &dev);
    raw.close()?;

    let mut report = gpu.report("bench-async");
    report.meta("repeats", r);
    report.meta("roundtrips", p.round_trips);
    report.meta("chain", p.chain);
    report.meta("chains", p.chains);
    report.meta("tasks", p.tasks);
    report.meta("task_ops", p.task_ops);
    report.meta("compose_builds", p.builds);
    report.meta("warmup", p.warmup);
    report.meta("tokio_worker_threads", workers);
    report.meta("default_policy", "StreamPoolRoundRobin, 4 streams");
    report.meta("seed", format!("{seed:#018x}"));

    report.rows.push(
        Row::compare("1 sync_on round trip", "us/iter", raw1, fw1, Some(GOAL_SYNC_ON)).with_note(format!(
            "Tiny.sync_on(&stream) vs cuLaunchKernel + cuStreamSynchronize, {} per repeat",
            p.round_trips
        )),
    );
    report.rows.push(
        Row::compare(
            &format!("2 {}-kernel op, one sync_on", p.chain),
            "us/kernel",
            raw2,
            fw2,
            Some(GOAL_CHAIN),
        )
        .with_note(format!(
            "join_all of {} Tiny (own buffer each) built and run by one sync_on, vs {} raw launches + one \
                 synchronize; {} chains per repeat; framework time includes building the tree",
            p.chain, p.chain, p.chains
        )),
    );
    report.rows.push(
        Row::compare("3a await op.on(&stream)", "us/iter", raw3.clone(), fw3a, Some(GOAL_AWAIT)).with_note(
            "current-thread tokio runtime; completion by stream callback + waker; vs raw launch + synchronize",
        ),
    );
    report.rows.push(
        Row::compare("3b await op (default policy)", "us/iter", raw3, fw3b, Some(GOAL_AWAIT)).with_note(
            "Op::new(Tiny).await: round robin over the 4 pool streams while the buffer's home is one of them, so \
             3 of 4 launches are joined to the home stream with events",
        ),
    );
    let ops4 = (p.tasks * p.task_ops) as f64;
    let thr = |v: &[TaskSample]| 1e6 / bench::median(&wall(v));
    let (thr_raw, thr_fw, thr_fwh) = (thr(&raw4), thr(&fw4), thr(&fw4h));
    let (cpu_raw, cpu_fw, cpu_fwh) =
        (bench::median(&cpu(&raw4)), bench::median(&cpu(&fw4)), bench::median(&cpu(&fw4h)));
    report.rows.push(
        Row::compare(
            &format!("4 {}x{} awaited ops (default policy)", p.tasks, p.task_ops),
            "us wall/op",
            wall(&raw4),
            wall(&fw4),
            Some(GOAL_TASKS),
        )
        .with_note(format!(
            "throughput raw {thr_raw:.0} ops/s, framework {thr_fw:.0} ops/s ({:.3}x; goal >= 0.9x, i.e. time \
             <= 1.111x); {ops4} ops per side per repeat; raw: one thread, launch + synchronize each",
            thr_fw / thr_raw
        )),
    );
    report.rows.push(
        Row::compare("4 CPU time (default policy)", "us CPU/op", cpu(&raw4), cpu(&fw4), None).with_note(
            format!(
                "process user+sys CPU (getrusage, all threads incl. tokio workers and the driver's callback \
             thread) / ops; raw cuStreamSynchronize spin-waits; framework CPU/op minus its own back-to-back \
             launch cost from 2 ({launch_us:.2} us) = {:.2} us/op for per-op scheduling + completion",
                cpu_fw - launch_us
            ),
        ),
    );
    report.rows.push(
        Row::compare("4b same, op.on(home stream)", "us wall/op", wall(&raw4), wall(&fw4h), None).with_note(
            format!(
                "diagnostic: each task awaits Tiny.on(its buffer's home stream), so no cross-stream joins; \
                 {thr_fwh:.0} ops/s ({:.3}x raw)",
                thr_fwh / thr_raw
            ),
        ),
    );
    report.rows.push(
        Row::compare("4b CPU time, op.on(home stream)", "us CPU/op", cpu(&raw4), cpu(&fw4h), None)
            .with_note(format!("minus the framework launch cost from 2: {:.2} us/op", cpu_fwh - launch_us)),
    );
    report.rows.push(
        Row::single(&format!("5 compose join_all({})", p.chain), "ns/op", fw5a)
            .with_note(format!("build + drop unexecuted, {} builds per repeat", p.builds)),
    );
    report.rows.push(
        Row::single(&format!("5 compose boxed .then chain({then_len})"), "ns/op", fw5b).with_note(format!(
            "value(()).boxed() then {then_len} x .then(|()| Tiny).boxed(); build + drop unexecuted, {} builds \
             per repeat",
            p.builds
        )),
    );
    report.meta(
        "m4_throughput_ops_per_s",
        Json::Obj(vec![
            ("raw".into(), thr_raw.into()),
            ("framework_default_policy".into(), thr_fw.into()),
            ("framework_on_home_stream".into(), thr_fwh.into()),
        ]),
    );
    report.meta(
        "m4_cpu_us_per_op",
        Json::Obj(vec![
            ("raw".into(), cpu_raw.into()),
            ("framework_default_policy".into(), cpu_fw.into()),
            ("framework_on_home_stream".into(), cpu_fwh.into()),
            ("framework_launch_only_us_from_2".into(), launch_us.into()),
            ("framework_completion_machinery_default_policy".into(), (cpu_fw - launch_us).into()),
            ("framework_completion_machinery_on_home_stream".into(), (cpu_fwh - launch_us).into()),
        ]),
    );

    report.publish(&correctness, json_path.as_deref())?;
    drop(fw);
    dev.synchronize().map_err(ctx("final device synchronize"))?;
    bench::conclude(correctness)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_layout_is_disjoint() {
        let l = RawLayout::new(1000, 64);
        assert_eq!(l.single, 0);
        assert_eq!(l.chain, 1..1001);
        assert_eq!(l.tasks, 1001..1065);
        assert_eq!(l.len(), 1065);
    }
}
