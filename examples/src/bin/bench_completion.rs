//! `bench-completion`: the completion engine against fair raw baselines (issue 10), side by side in
//! one process, the same work and the same concurrency on both sides.
//!
//! F1. T (64) tokio tasks, each awaiting K `Tiny` ops on its own stream (`op.on(&stream).await`),
//!     vs T raw OS threads, each doing K × (launch; `cuStreamSynchronize`) on **the same** stream;
//!     wall µs per op (goal: framework throughput ≥ raw, ratio ≤ 1.0) and process CPU µs per op
//!     (goal ≤ 1.2× raw).
//! F2. The same tasks vs T raw threads polling an event instead (launch; record; spin on
//!     `cuEventQuery`) — the other raw way to wait without a blocking call.
//! F3. `.await` of one ~50 µs kernel on a current-thread runtime vs raw launch + synchronize of the
//!     same kernel; µs per round trip (goal: framework ≤ raw + 2 µs).
//!
//! Afterwards every counter of both sides must hold its initial values plus its launch count.

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use cuda_async::DeviceOpExt;
use cuda_async_examples::bench::tiny::{self, Checker, Counted, TinyFunction, TinyImage, CFG, ELEMS, INC};
use cuda_async_examples::bench::{self, Case, Common, Goal};
use cuda_core::{Device, DeviceBuffer, Function, LaunchConfig, Stream};
use cudarc::driver::result as cu;
use cudarc::driver::sys;
use std::ffi::c_void;

/// Compares awaiting through the completion engine with raw threads that block or poll.
#[derive(Parser, serde::Serialize)]
struct Args {
    /// Tasks (and raw threads) for F1 and F2
    #[arg(long, default_value_t = 64, value_parser = bench::at_least_one)]
    tasks: usize,
    /// Awaited ops per task (launches per raw thread) per sample
    #[arg(long, default_value_t = 200, value_parser = bench::at_least_one)]
    task_ops: usize,
    /// Round trips per sample for F3
    #[arg(long, default_value_t = 200, value_parser = bench::at_least_one)]
    roundtrips: usize,
    /// GPU time of the F3 kernel, in microseconds
    #[arg(long, default_value_t = 50)]
    spin_us: u64,
    #[command(flatten)]
    #[serde(flatten)]
    common: Common,
}

const SPIN_SRC: &str = r#"extern "C" __global__ void spin(unsigned long long* x, unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    now = start;
    while (now - start < ns) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    if (threadIdx.x == 0) x[0] += 1;
}
"#;

/// One raw thread's handles: the counter it launches on, its launch count, an event to poll.
struct RawLane {
    stream: sys::CUstream,
    counter: sys::CUdeviceptr,
    launches: u64,
}

// SAFETY: raw handles of the primary context, usable from any thread; each lane is used by one
// thread at a time (moved into it for a sample and back).
unsafe impl Send for RawLane {}

fn launch_tiny(f: sys::CUfunction, lane: &mut RawLane) -> Result<()> {
    let (mut x, mut inc, mut n) = (lane.counter, INC, ELEMS as u64);
    let mut params: [*mut c_void; 3] =
        [(&mut x as *mut u64).cast(), (&mut inc as *mut u32).cast(), (&mut n as *mut u64).cast()];
    let (g, b) = (CFG.grid, CFG.block);
    // SAFETY: `tiny(u64*, u32, u64)` with pointers to values of those types; it writes
    // counter[0..ELEMS], an allocation of ELEMS u64s that lives until the end of `main`.
    unsafe { cu::launch_kernel(f, g, b, 0, lane.stream, &mut params) }.context("cuLaunchKernel")?;
    lane.launches += 1;
    Ok(())
}

/// T raw threads, each `k` × (launch; wait), the wait blocking or polling an event.
fn raw_threads(
    dev: &Device,
    f: sys::CUfunction,
    lanes: &mut Vec<RawLane>,
    k: usize,
    poll: bool,
) -> Result<()> {
    let f = f as usize;
    let results: Vec<Result<RawLane>> = std::thread::scope(|sc| {
        let hs: Vec<_> = std::mem::take(lanes)
            .into_iter()
            .map(|mut lane| {
                sc.spawn(move || -> Result<RawLane> {
                    dev.bind()?;
                    let ev = cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                        .context("cuEventCreate")?;
                    for _ in 0..k {
                        launch_tiny(f as sys::CUfunction, &mut lane)?;
                        if poll {
                            // SAFETY: our live event and stream.
                            unsafe { cu::event::record(ev, lane.stream) }.context("cuEventRecord")?;
                            loop {
                                // SAFETY: our live event.
                                match unsafe { sys::cuEventQuery(ev) } {
                                    sys::CUresult::CUDA_SUCCESS => break,
                                    sys::CUresult::CUDA_ERROR_NOT_READY => std::hint::spin_loop(),
                                    e => return Err(anyhow!("cuEventQuery: {e:?}")),
                                }
                            }
                        } else {
                            // SAFETY: a live stream of the primary context.
                            unsafe { cu::stream::synchronize(lane.stream) }.context("cuStreamSynchronize")?;
                        }
                    }
                    // SAFETY: our event, no longer used.
                    unsafe { cu::event::destroy(ev) }.context("cuEventDestroy")?;
                    Ok(lane)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a raw thread panicked")))).collect()
    });
    for r in results {
        lanes.push(r?);
    }
    Ok(())
}

/// T tokio tasks, each awaiting `k` Tiny ops on its own stream.
fn fw_tasks(
    rt: &tokio::runtime::Runtime,
    func: &TinyFunction,
    tasks: &mut Vec<(Stream, Counted)>,
    k: usize,
) -> Result<()> {
    let hs: Vec<_> = std::mem::take(tasks)
        .into_iter()
        .map(|(s, mut c)| {
            let func = func.clone();
            rt.spawn(async move {
                for _ in 0..k {
                    c.op(&func).on(&s).await?;
                }
                c.launches += k as u64;
                Ok::<_, cuda_async::DeviceError>((s, c))
            })
        })
        .collect();
    let mut first_err = None;
    for h in hs {
        match rt.block_on(h) {
            Ok(Ok(t)) => tasks.push(t),
            Ok(Err(e)) => first_err = first_err.or(Some(anyhow!("an awaited op failed: {e}"))),
            Err(e) => first_err = first_err.or(Some(anyhow!("a task did not finish: {e}"))),
        }
    }
    first_err.map_or(Ok(()), Err)
}

fn main() -> Result<()> {
    let a = Args::parse();
    let (dev, mut run) = bench::start("bench-completion", &a, &a.common, true)?;
    run.report.meta("completion_policy", format!("{:?}", cuda_async::scheduling::completion_policy()));
    run.report.meta("tokio_runtime", "timers only, no I/O driver (bench::runtime)");
    let init = tiny::init_values(&mut bench::rng_from_time(&mut run.report));
    let image = TinyImage::compile(&dev)?;
    let func = image.load(&dev)?;
    // The raw side loads the same CUBIN through cudarc.
    dev.bind()?;
    let (raw_module, raw_tiny) = raw_load(image.bytes(), "tiny")?;

    let (t, k) = (a.tasks, a.task_ops);
    let streams: Vec<Stream> = (0..t).map(|_| Stream::new(&dev)).collect::<Result<_, _>>()?;
    let mut tasks: Vec<(Stream, Counted)> =
        streams.iter().map(|s| Ok((s.clone(), Counted::new(s, &init)?))).collect::<Result<_>>()?;
    let mut lanes: Vec<RawLane> = streams
        .iter()
        .map(|s| {
            // SAFETY: a fresh allocation of ELEMS u64s, freed at the end of `main`.
            let counter = unsafe { cu::malloc_sync(ELEMS * 8) }.context("cuMemAlloc")?;
            // SAFETY: `init` has ELEMS u64s; the destination was just allocated with that size.
            unsafe { cu::memcpy_htod_sync(counter, &init) }.context("cuMemcpyHtoD")?;
            Ok(RawLane { stream: s.raw(), counter, launches: 0 })
        })
        .collect::<Result<_>>()?;
    let rt = bench::runtime(true, None)?;
    dev.synchronize()?;

    use cuda_async::scheduling::{set_await_spin_policy, set_completion_policy, AwaitSpin, CompletionPolicy};
    use std::time::Duration;
    // F1 and F2 with the default policies; then F1 with one knob changed at a time, to show where
    // the framework's CPU time goes: the spin of earlier versions (5 us on every first poll,
    // however many ops are pending), progress marks against events, 1, 2 or 4 engine threads,
    // and a tokio runtime with 4 workers instead of one per core.
    let rt4 = bench::runtime(true, Some(4))?;
    let always_spin = AwaitSpin { busy: 0, adaptive_max: Duration::ZERO, ..AwaitSpin::default() };
    let policy =
        |marks: bool, engines: usize| CompletionPolicy { marks, engines, ..CompletionPolicy::default() };
    let spin = AwaitSpin::default();
    let dflt = (spin, CompletionPolicy::default());
    for (poll, (spin, completion), workers, label) in [
        (false, dflt, 0, ""),
        (true, dflt, 0, ""),
        (false, (always_spin, CompletionPolicy::default()), 0, ", always spinning 5 us"),
        (false, (spin, policy(false, 1)), 0, ", events, 1 engine thread"),
        (false, (spin, policy(false, 2)), 0, ", events, 2 engine threads"),
        (false, (spin, policy(false, 4)), 0, ", events, 4 engine threads"),
        (false, (spin, policy(true, 1)), 0, ", marks, 1 engine thread"),
        (false, (spin, policy(true, 2)), 0, ", marks, 2 engine threads"),
        (false, dflt, 4, ", 4 tokio workers"),
    ] {
        set_await_spin_policy(spin);
        set_completion_policy(completion);
        let rt = if workers == 4 { &rt4 } else { &rt };
        let name = if poll {
            format!("F2 {t} tasks vs {t} raw threads polling events{label}")
        } else {
            format!("F1 {t} tasks vs {t} raw threads, launch + synchronize{label}")
        };
        let mut split = ThreadCpu::default();
        let case = Case::new(name, "us wall/op", t * k, || {
            let before = ThreadCpu::read();
            fw_tasks(rt, &func, &mut tasks, k)?;
            split.add_since(&before, t * k);
            Ok(())
        });
        let case = case.raw(|| raw_threads(&dev, raw_tiny, &mut lanes, k, poll)).goal(Goal::MaxRatio(1.0));
        let row = run.run(case)?;
        let (cf, cr) = (row.framework_cpu.unwrap_or(f64::NAN), row.raw_cpu.unwrap_or(f64::NAN));
        let note = format!(
            "{spin:?}; {completion:?}; each task awaits Tiny.on(its own stream); each raw thread {} on the \
             same stream; throughput framework {:.0} ops/s vs raw {:.0} ops/s; CPU per op {cf:.2} vs {cr:.2} us \
             = {:.3}x (goal <= 1.2x: {}); framework CPU by thread (mean over samples): {}",
            if poll { "launches, records an event and spins on cuEventQuery" } else { "launches and calls cuStreamSynchronize" },
            1e6 / row.framework,
            1e6 / row.raw.unwrap_or(f64::NAN),
            cf / cr,
            if cf / cr <= 1.2 { "met" } else { "MISSED" },
            split.summary()
        );
        run.report.rows.last_mut().expect("just run").note = note;
    }
    set_completion_policy(CompletionPolicy::default());
    set_await_spin_policy(AwaitSpin::default());

    // F3: one ~50 µs kernel, awaited vs raw launch + synchronize.
    let spin_img = cuda_core::nvrtc::KernelCache::memory_only().compile(&dev, "spin.cu", SPIN_SRC, &[])?;
    let spin_fn: Function = cuda_core::CudaModule::from_cubin(&dev, &spin_img.image)?.function("spin")?;
    let (raw_spin_mod, raw_spin) = raw_load(&spin_img.image, "spin")?;
    let s = Stream::new(&dev)?;
    let mut spin_buf = DeviceBuffer::<u64>::zeros(&s, 1)?;
    let raw_stream = cu::stream::create(cu::stream::StreamKind::NonBlocking).context("cuStreamCreate")?;
    // SAFETY: a fresh 8-byte allocation, freed at the end.
    let raw_spin_buf = unsafe { cu::malloc_sync(8) }.context("cuMemAlloc")?;
    // SAFETY: writes the 8 bytes just allocated.
    unsafe { cu::memset_d8_sync(raw_spin_buf, 0, 8) }.context("cuMemset")?;
    let ns = a.spin_us * 1000;
    let one = LaunchConfig { grid: (1, 1, 1), block: (32, 1, 1), shared_mem_bytes: 0 };
    let (mut fw_spins, mut raw_spins) = (0u64, 0u64);
    let rt1 = bench::runtime(false, None)?;
    let n = a.roundtrips;
    let no_prediction = AwaitSpin { adaptive_max: std::time::Duration::ZERO, ..AwaitSpin::default() };
    for (policy, label) in [(AwaitSpin::default(), ""), (no_prediction, ", no predicted spin (hand-off)")] {
        set_await_spin_policy(policy);
        let case = Case::new(format!("F3 await a {} us kernel{label}", a.spin_us), "us/iter", n, || {
            rt1.block_on(async {
                for _ in 0..n {
                    SpinOp { f: &spin_fn, buf: &mut spin_buf, ns, cfg: one }.into_op().on(&s).await?;
                }
                Ok::<_, anyhow::Error>(())
            })?;
            fw_spins += n as u64;
            Ok(())
        });
        let case = case.raw(|| {
            for _ in 0..n {
                let (mut x, mut t) = (raw_spin_buf, ns);
                let mut params: [*mut c_void; 2] = [(&mut x as *mut u64).cast(), (&mut t as *mut u64).cast()];
                // SAFETY: `spin(u64*, u64)` with pointers to values of those types; it writes x[0] of
                // our 8-byte allocation.
                unsafe { cu::launch_kernel(raw_spin, (1, 1, 1), (32, 1, 1), 0, raw_stream, &mut params) }
                    .context("cuLaunchKernel")?;
                // SAFETY: our live stream.
                unsafe { cu::stream::synchronize(raw_stream) }.context("cuStreamSynchronize")?;
            }
            raw_spins += n as u64;
            Ok(())
        });
        run.run(case.goal(Goal::MaxExtra(2.0)).note(format!(
            "spin policy {policy:?}; current-thread tokio runtime, op.on(&stream).await (first-poll spin, then the \
             completion engine) vs cuLaunchKernel + cuStreamSynchronize of the same kernel; goal: framework <= raw + 2 us"
        )))?;
    }
    set_await_spin_policy(AwaitSpin::default());

    // C0 (diagnostic): the host cost of one call of each way to mark the end of work, on one
    // thread, 500 calls between synchronizations (not timed), median of 9 batches.
    let host_cost = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        let mut per = Vec::new();
        for _ in 0..10 {
            let t0 = std::time::Instant::now();
            for _ in 0..500 {
                f()?;
            }
            per.push(t0.elapsed().as_secs_f64() * 1e6 / 500.0);
            // SAFETY: our live stream.
            unsafe { cu::stream::synchronize(raw_stream) }.context("cuStreamSynchronize")?;
        }
        per.remove(0);
        per.sort_by(f64::total_cmp);
        Ok(per[per.len() / 2])
    };
    let ev = cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).context("cuEventCreate")?;
    // SAFETY: a fresh 8-byte allocation (the target of the timed writes), freed below.
    let target = unsafe { cu::malloc_sync(8) }.context("cuMemAlloc")?;
    // SAFETY: our live event and stream.
    let record = host_cost(&mut || unsafe { cu::event::record(ev, raw_stream) }.context("cuEventRecord"))?;
    let write = host_cost(&mut || {
        // SAFETY: our live stream; an 8-byte aligned device allocation of 8 bytes.
        let r = unsafe { sys::cuStreamWriteValue64_v2(raw_stream, target, 7, 0) };
        anyhow::ensure!(r == sys::CUresult::CUDA_SUCCESS, "cuStreamWriteValue64: {r:?}");
        Ok(())
    })?;
    let mark = host_cost(&mut || {
        s.mark_progress()?;
        Ok(())
    })?;
    // SAFETY: our event and allocation, idle (the stream was synchronized).
    unsafe {
        cu::event::destroy(ev).context("cuEventDestroy")?;
        cu::free_sync(target).context("cuMemFree")?;
    }
    run.report.meta(
        "c0_host_cost_us",
        format!(
            "cuEventRecord {record:.3}, cuStreamWriteValue64 {write:.3}, Stream::mark_progress {mark:.3}"
        ),
    );
    s.synchronize()?;

    let mut check = Checker::new(&init);
    let correctness = (|| -> Result<String> {
        dev.synchronize()?;
        let fw: Vec<&Counted> = tasks.iter().map(|(_, c)| c).collect();
        check.counted("framework task", fw)?;
        for (i, lane) in lanes.iter().enumerate() {
            let mut got = vec![0u64; ELEMS];
            // SAFETY: the counter holds ELEMS u64s; no work is in flight (device synchronized).
            unsafe { cu::memcpy_dtoh_sync(&mut got, lane.counter) }.context("cuMemcpyDtoH")?;
            check.check(&format!("raw thread {i}"), &got, lane.launches)?;
        }
        let fw_spin = spin_buf.to_vec()?[0];
        let mut raw_spin_v = [0u64];
        // SAFETY: 8 bytes, no work in flight.
        unsafe { cu::memcpy_dtoh_sync(&mut raw_spin_v, raw_spin_buf) }.context("cuMemcpyDtoH")?;
        anyhow::ensure!(fw_spin == fw_spins && raw_spin_v[0] == raw_spins, "F3: a spin kernel was skipped");
        Ok(format!("{}; F3: {fw_spins} + {raw_spins} spin kernels all ran", check.summary()))
    })();
    for lane in &lanes {
        // SAFETY: our allocation, no work in flight.
        let _ = unsafe { cu::free_sync(lane.counter) };
    }
    // SAFETY: our handles, no work in flight.
    unsafe {
        let _ = cu::free_sync(raw_spin_buf);
        let _ = cu::stream::destroy(raw_stream);
        let _ = cu::module::unload(raw_module);
        let _ = cu::module::unload(raw_spin_mod);
    }
    run.report.publish(correctness, a.common.json.as_deref())
}

/// Loads a CUBIN (copied to 8-byte-aligned memory) and looks up `name`, through cudarc.
fn raw_load(image: &[u8], name: &str) -> Result<(sys::CUmodule, sys::CUfunction)> {
    let mut aligned = vec![0u64; image.len().div_ceil(8)];
    // SAFETY: `aligned` has at least image.len() bytes; the ranges do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(image.as_ptr(), aligned.as_mut_ptr().cast::<u8>(), image.len()) };
    // SAFETY: a complete CUBIN image in aligned memory that lives across the call.
    let module = unsafe { cu::module::load_data(aligned.as_ptr().cast()) }.context("cuModuleLoadData")?;
    let cname = std::ffi::CString::new(name)?;
    // SAFETY: a live module; a NUL-terminated name.
    let f = unsafe { cu::module::get_function(module, cname) }.context("cuModuleGetFunction")?;
    Ok((module, f))
}

/// CPU time per thread name (from `/proc/self/task/*/schedstat`, nanoseconds), to split the
/// framework's CPU per op between the completion engine, the tokio workers and the rest.
#[derive(Default)]
struct ThreadCpu {
    ns: std::collections::BTreeMap<String, u64>,
    ops: usize,
}

impl ThreadCpu {
    /// Run time of every live thread of this process, by thread name (empty where /proc is not).
    fn read() -> ThreadCpu {
        let mut ns = std::collections::BTreeMap::new();
        for task in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
            let p = task.path();
            let name = std::fs::read_to_string(p.join("comm")).unwrap_or_default().trim().to_string();
            let run: u64 = std::fs::read_to_string(p.join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
                .unwrap_or(0);
            *ns.entry(name).or_insert(0) += run;
        }
        ThreadCpu { ns, ops: 0 }
    }

    /// Adds the run time threads spent since `before` (threads that ended meanwhile are lost).
    fn add_since(&mut self, before: &ThreadCpu, ops: usize) {
        for (name, now) in Self::read().ns {
            let d = now.saturating_sub(before.ns.get(&name).copied().unwrap_or(0));
            *self.ns.entry(name).or_insert(0) += d;
        }
        self.ops += ops;
    }

    fn summary(&self) -> String {
        let ops = self.ops.max(1) as f64;
        let parts: Vec<String> = self
            .ns
            .iter()
            .filter(|(_, &ns)| ns as f64 / ops >= 0.05e3)
            .map(|(name, &ns)| format!("{name} {:.2} us/op", ns as f64 / 1e3 / ops))
            .collect();
        parts.join(", ")
    }
}

/// One launch of the spin kernel as an op.
struct SpinOp<'a> {
    f: &'a Function,
    buf: &'a mut DeviceBuffer<u64>,
    ns: u64,
    cfg: LaunchConfig,
}

impl cuda_async::DeviceOp for SpinOp<'_> {
    type Output = ();
    fn execute(self, ctx: &cuda_async::ExecutionContext<'_>) -> cuda_async::Result<()> {
        // SAFETY: `spin(u64*, u64)`; it writes x[0] of the 1-element exclusive buffer.
        unsafe { self.f.launch(ctx.stream(), self.cfg, (self.buf, self.ns))? };
        Ok(())
    }
}
