//! `bench-async`: the cost of `cuda-async` (ops, `sync_on`, `.await`, combinators) over the same
//! work through raw driver calls (cudarc's `result` layer), side by side in one process. Both
//! sides launch the tiny counter kernel; the framework through a small custom op, `Tiny`.
//!
//! 1. `Tiny.sync_on(&stream)` vs raw launch + synchronize; µs per round trip (goal ≤ 1.10×).
//! 2. One op of L (1,000) kernels, `join_all` of L `Tiny`s each on its own buffer, built and run
//!    by one `sync_on`, vs L raw launches + one synchronize; µs per kernel (goal ≤ 1.05×; the
//!    framework time includes building the op tree).
//! 3. `.await` of one `Tiny` on a current-thread tokio runtime, (a) `op.on(&stream).await`, (b)
//!    the default policy's `Op::new(op).await`, vs raw launch + synchronize (goal ≤ 1.25×).
//! 4. T (64) tokio tasks × K (1,000) awaited `Tiny`s on the multi-thread runtime (default policy:
//!    round robin over 4 streams) vs one thread doing the same T·K raw round trips; wall µs per op
//!    (goal: throughput ≥ 0.9× raw, i.e. time ≤ 1.111×) and process CPU per op. 4b: the tasks use
//!    `op.on(buffer's home stream)` instead (diagnostic).
//! 5. Host cost of composing (building and dropping, not running) `join_all` of L `Tiny`s and a
//!    boxed `.then` chain of 100; ns per op (framework only).
//!
//! Afterwards every buffer of both sides must hold its initial values plus its launch count.
//!
//! `cargo run --release -p cuda-async-examples --bin bench-async -- --help` lists the options.

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use cuda_async::combinators::BoxedOp;
use cuda_async::{DeviceOpExt, Op};
use cuda_async_examples::bench::raw::Raw;
use cuda_async_examples::bench::tiny::{self, Checker, Counted, TinyFunction, TinyImage};
use cuda_async_examples::bench::{self, Case, Common, Goal};
use cuda_core::{Device, Stream};
use std::ops::Range;
use tokio::runtime::Runtime;

/// Compares cuda-async (ops, sync_on, .await, combinators) with raw CUDA driver calls.
#[derive(Parser, serde::Serialize)]
struct Args {
    /// Round trips per sample for 1 and 3
    #[arg(long, default_value_t = 2_000, value_parser = bench::at_least_one)]
    roundtrips: usize,
    /// Kernels in the one-op chain of 2 and the tree of 5
    #[arg(long, default_value_t = 1_000, value_parser = bench::at_least_one)]
    chain: usize,
    /// Chains per sample for 2
    #[arg(long, default_value_t = 10, value_parser = bench::at_least_one)]
    chains: usize,
    /// Tokio tasks for 4
    #[arg(long, default_value_t = 64, value_parser = bench::at_least_one)]
    tasks: usize,
    /// Awaited ops per task for 4
    #[arg(long, default_value_t = 1_000, value_parser = bench::at_least_one)]
    task_ops: usize,
    /// Tree builds per sample for 5
    #[arg(long, default_value_t = 1_000, value_parser = bench::at_least_one)]
    compose_builds: usize,
    #[command(flatten)]
    #[serde(flatten)]
    common: Common,
}

/// Length of the boxed `.then` chain of 5.
const THEN_LEN: usize = 100;

fn main() -> Result<()> {
    let a = Args::parse();
    let (dev, mut run) = bench::start("bench-async", &a, &a.common, true)?;
    let workers = std::env::var("TOKIO_WORKER_THREADS").ok().and_then(|v| v.parse().ok());
    let workers: Option<usize> =
        workers.or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()));
    run.report.meta("tokio_worker_threads", workers);
    run.report.meta("default_policy", "StreamPoolRoundRobin, 4 streams");
    run.report.meta("tokio_runtime", "timers only, no I/O driver (bench::runtime)");
    let init = tiny::init_values(&mut bench::rng_from_time(&mut run.report));
    let image = TinyImage::compile(&dev)?;
    let func = image.load(&dev)?;
    let stream = Stream::new(&dev)?;

    // Raw buffers: one for 1 and 3, `chain` for 2, `tasks` for 4.
    let (chain_bufs, task_bufs) = (1..1 + a.chain, 1 + a.chain..1 + a.chain + a.tasks);
    let mut raw = Raw::new(&dev, &image, task_bufs.end, &init)?;
    // Framework buffers: `single` and `chain` live on `stream`; `pooled` and `tasks` are allocated
    // the way a user of the default policy would (`memory::from_host(..).sync()`), so their home
    // is a pool stream.
    let mut single = Counted::new(&stream, &init)?;
    let mut chain = (0..a.chain).map(|_| Counted::new(&stream, &init)).collect::<Result<Vec<_>>>()?;
    let pooled = || Ok(Counted { buf: cuda_async::memory::from_host(&init).sync()?, launches: 0 });
    let mut pooled_one: Counted = pooled()?;
    let mut tasks = (0..a.tasks).map(|_| pooled()).collect::<Result<Vec<_>>>()?;
    dev.synchronize()?;

    let rt1 = bench::runtime(false, None)?;
    let rt_multi = bench::runtime(true, None)?;
    let n = a.roundtrips;

    let case = Case::new("1 sync_on round trip", "us/iter", n, || {
        for _ in 0..n {
            single.op(&func).sync_on(&stream)?;
        }
        single.launches += n as u64;
        Ok(())
    });
    let note = format!("Tiny.sync_on(&stream) vs cuLaunchKernel + cuStreamSynchronize, {n} per sample");
    run.run(case.raw(|| raw_round_trips(&mut raw, 0..1, n)).goal(Goal::MaxRatio(1.10)).note(note))?;

    let (l, c) = (a.chain, a.chains);
    let case = Case::new(format!("2 {l}-kernel op, one sync_on"), "us/kernel", l * c, || {
        for _ in 0..c {
            cuda_async::join_all(chain.iter_mut().map(|b| b.op(&func))).sync_on(&stream)?;
        }
        chain.iter_mut().for_each(|b| b.launches += c as u64);
        Ok(())
    });
    let case = case.raw(|| {
        for _ in 0..c {
            chain_bufs.clone().try_for_each(|k| raw.launch(k))?;
            raw.sync()?;
        }
        Ok(())
    });
    let note = format!(
        "join_all of {l} Tiny (own buffer each) built and run by one sync_on, vs {l} raw launches + one \
         synchronize; {c} chains per sample; framework time includes building the tree"
    );
    // The framework's back-to-back launch cost, to estimate in 4 what scheduling + completion add.
    let launch_us = run.run(case.goal(Goal::MaxRatio(1.05)).note(note))?.framework;

    let case = Case::new("3a await op.on(&stream)", "us/iter", n, || {
        rt1.block_on(async {
            for _ in 0..n {
                single.op(&func).on(&stream).await?;
            }
            single.launches += n as u64;
            Ok::<_, anyhow::Error>(())
        })
    });
    let note =
        "current-thread tokio runtime; first-poll spin, then the completion engine; vs raw launch + synchronize";
    run.run(case.raw(|| raw_round_trips(&mut raw, 0..1, n)).goal(Goal::MaxRatio(1.25)).note(note))?;

    let case = Case::new("3b await op (default policy)", "us/iter", n, || {
        rt1.block_on(async {
            for _ in 0..n {
                Op::new(pooled_one.op(&func)).await?;
            }
            pooled_one.launches += n as u64;
            Ok::<_, anyhow::Error>(())
        })
    });
    let note = "Op::new(Tiny).await: round robin over the 4 pool streams while the buffer's home is one of \
                them, so 3 of 4 launches are joined to the home stream with events";
    run.run(case.raw(|| raw_round_trips(&mut raw, 0..1, n)).goal(Goal::MaxRatio(1.25)).note(note))?;

    let (t, k) = (a.tasks, a.task_ops);
    for on_home in [false, true] {
        let name = if on_home {
            "4b same, op.on(home stream)".into()
        } else {
            format!("4 {t}x{k} awaited ops (default policy)")
        };
        let case =
            Case::new(name, "us wall/op", t * k, || fw_tasks(&rt_multi, &dev, &func, &mut tasks, k, on_home));
        let case = case.raw(|| raw_round_trips(&mut raw, task_bufs.clone(), k));
        let case = if on_home { case } else { case.goal(Goal::MaxRatio(1.111)) };
        let row = run.run(case)?;
        let (thr_raw, thr_fw) = (1e6 / row.raw.unwrap_or(f64::NAN), 1e6 / row.framework);
        let cpu_fw = row.framework_cpu.unwrap_or(f64::NAN);
        let note = format!(
            "throughput raw {thr_raw:.0} ops/s, framework {thr_fw:.0} ops/s ({:.3}x{}); raw: one thread, launch + \
             synchronize each; CPU = process user+sys (all threads: tokio workers, the completion engine) \
             per op; framework CPU/op minus its back-to-back launch cost from 2 ({launch_us:.2} us) = {:.2} us/op \
             for per-op scheduling + completion",
            thr_fw / thr_raw,
            if on_home { "; diagnostic: each task awaits Tiny.on(its buffer's home stream)" } else { "; goal >= 0.9x" },
            cpu_fw - launch_us
        );
        run.report.rows.last_mut().expect("just run").note = note;
    }
    let b = a.compose_builds;
    let note = format!("build + drop unexecuted, {b} builds per sample");
    let case = Case::new(format!("5 compose join_all({l})"), "ns/op", b * l, || {
        for _ in 0..b {
            drop(std::hint::black_box(cuda_async::join_all(chain.iter_mut().map(|c| c.op(&func)))));
        }
        Ok(())
    });
    run.run(case.note(note))?;
    let then_len = THEN_LEN.min(l);
    let case = Case::new(format!("5 compose boxed .then chain({then_len})"), "ns/op", b * then_len, || {
        for _ in 0..b {
            drop(std::hint::black_box(then_chain(&func, &mut chain[..then_len])));
        }
        Ok(())
    });
    let note = format!(
        "value(()).boxed() then {then_len} x .then(|()| Tiny).boxed(); build + drop unexecuted, {b} builds"
    );
    run.run(case.note(note))?;
    // Run the chain once, so that what was composed is known to work.
    then_chain(&func, &mut chain[..then_len]).sync_on(&stream)?;
    chain[..then_len].iter_mut().for_each(|c| c.launches += 1);

    let mut check = Checker::new(&init);
    let correctness = (|| {
        dev.synchronize()?;
        check.counted("framework single", [&single])?;
        check.counted("framework pooled", [&pooled_one])?;
        check.counted("framework chain", &chain)?;
        check.counted("framework task", &tasks)?;
        raw.check(&mut check)?;
        Ok(check.summary())
    })();
    raw.close()?;
    run.report.publish(correctness, a.common.json.as_deref())
}

/// Raw: for each buffer of `bufs` in turn, `n` times (launch; synchronize).
fn raw_round_trips(raw: &mut Raw, bufs: Range<usize>, n: usize) -> Result<()> {
    for k in bufs {
        for _ in 0..n {
            raw.launch(k)?;
            raw.sync()?;
        }
    }
    Ok(())
}

/// `value(()).then(|()| Tiny).then(|()| Tiny)...`, one `Tiny` per buffer, each step boxed.
fn then_chain<'a>(func: &'a TinyFunction, bufs: &'a mut [Counted]) -> Op<BoxedOp<'a, ()>> {
    let mut op = cuda_async::value(()).boxed();
    for c in bufs {
        let tiny = c.op(func);
        op = op.then(move |()| tiny).boxed();
    }
    op
}

/// 4: one task per buffer on the multi-thread runtime, `ops` awaited `Tiny`s each, by the default
/// policy or on the buffer's home stream; the buffers come back in order.
fn fw_tasks(
    rt: &Runtime,
    dev: &Device,
    func: &TinyFunction,
    bufs: &mut Vec<Counted>,
    ops: usize,
    on_home: bool,
) -> Result<()> {
    dev.synchronize()?;
    let handles: Vec<_> = std::mem::take(bufs)
        .into_iter()
        .map(|mut c| {
            let func = func.clone();
            rt.spawn(async move {
                let home = c.buf.home_stream().clone();
                for _ in 0..ops {
                    if on_home {
                        c.op(&func).on(&home).await?;
                    } else {
                        Op::new(c.op(&func)).await?;
                    }
                }
                c.launches += ops as u64;
                Ok::<_, cuda_async::DeviceError>(c)
            })
        })
        .collect();
    let mut first_err = None;
    for r in rt.block_on(futures_join(handles)) {
        match r {
            Ok(Ok(c)) => bufs.push(c),
            Ok(Err(e)) => first_err = first_err.or(Some(anyhow!("a task's awaited op failed: {e}"))),
            Err(e) => first_err = first_err.or(Some(anyhow!("a task did not finish: {e}"))),
        }
    }
    first_err.map_or(Ok(()), Err).context("4: tasks")
}

/// Awaits every handle in order.
async fn futures_join<T>(handles: Vec<tokio::task::JoinHandle<T>>) -> Vec<Result<T, tokio::task::JoinError>> {
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await);
    }
    out
}
