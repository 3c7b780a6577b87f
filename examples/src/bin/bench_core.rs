//! `bench-core`: the cost of `cuda-core` over raw driver calls (cudarc's `result` layer), side by
//! side in one process, on the tiny counter kernel (one CUBIN, compiled once, loaded by both).
//!
//! - A. launch throughput: N launches back to back, then one synchronize; µs per launch.
//! - B. round trip: launch + synchronize, M times; µs per round trip.
//! - C. NVRTC through `KernelCache`: cold compile, disk-cache hit, memory hit; ms (framework only).
//!
//! A and B: goal framework / raw ≤ 1.02. Afterwards both buffers must hold exactly their initial
//! values plus the number of launches queued on them.
//!
//! `cargo run --release -p cuda-async-examples --bin bench-core -- --help` lists the options.

use anyhow::{ensure, Context, Result};
use clap::Parser;
use cuda_async_examples::bench::raw::Raw;
use cuda_async_examples::bench::tiny::{self, Checker, Counted, TinyImage};
use cuda_async_examples::bench::{self, Case, Common, Goal, Row};
use cuda_core::nvrtc::{CacheOrigin, KernelCache};
use cuda_core::{Device, Stream};
use rand::Rng;
use std::sync::Arc;
use std::time::Instant;

/// Compares cuda-core with raw CUDA driver calls (launch, synchronize, NVRTC).
#[derive(Parser, serde::Serialize)]
struct Args {
    /// Launches per sample for A
    #[arg(long, default_value_t = 10_000, value_parser = bench::at_least_one)]
    launches: usize,
    /// Launch + synchronize round trips per sample for B
    #[arg(long, default_value_t = 2_000, value_parser = bench::at_least_one)]
    roundtrips: usize,
    #[command(flatten)]
    #[serde(flatten)]
    common: Common,
}

/// Cold / disk / memory compile samples (each with its own unique source).
const COMPILE_SAMPLES: usize = 3;

fn main() -> Result<()> {
    let args = Args::parse();
    let (dev, mut run) = bench::start("bench-core", &args, &args.common, false)?;
    let mut rng = bench::rng_from_time(&mut run.report);
    let t = Instant::now();
    let image = TinyImage::compile(&dev)?;
    run.report.meta("setup_compile_ms", t.elapsed().as_secs_f64() * 1e3);
    run.report.meta("cubin_bytes", image.bytes().len());
    let init = tiny::init_values(&mut rng);
    let func = image.load(&dev)?;
    let stream = Stream::new(&dev)?;
    let mut fw = Counted::new(&stream, &init)?;
    let mut raw = Raw::new(&dev, &image, 1, &init)?;

    let n = args.launches;
    let case = Case::new("A launch throughput", "us/launch", n, || {
        for _ in 0..n {
            func.launch(&stream, &mut fw.buf)?;
        }
        fw.launches += n as u64;
        Ok(stream.synchronize()?)
    });
    run.run(
        case.raw(|| {
            (0..n).try_for_each(|_| raw.launch(0))?;
            raw.sync()
        })
        .goal(Goal::MaxRatio(1.02))
        .note(format!("{n} launches then one synchronize")),
    )?;

    let m = args.roundtrips;
    let case = Case::new("B launch + synchronize", "us/round trip", m, || {
        for _ in 0..m {
            func.launch(&stream, &mut fw.buf)?;
            stream.synchronize()?;
        }
        fw.launches += m as u64;
        Ok(())
    });
    let case = case.raw(|| (0..m).try_for_each(|_| raw.launch(0).and_then(|()| raw.sync())));
    run.run(case.goal(Goal::MaxRatio(1.02)).note(format!("{m} round trips")))?;

    println!("C: NVRTC compile through KernelCache ({COMPILE_SAMPLES} unique sources)");
    let [cold, disk, memory] = compile_times(&dev, &mut rng)?;
    run.report.rows.extend([
        Row::new("C NVRTC cold compile", "ms", vec![], cold, Goal::None).with_note(
            "KernelCache::with_dir on an empty folder, unique source (origin Compiled); includes hashing and the disk write",
        ),
        Row::new("C disk-cache hit", "ms", vec![], disk, Goal::None)
            .with_note("a new KernelCache::with_dir on the same folder (origin Disk)"),
        Row::new("C memory-cache hit", "ms", vec![], memory, Goal::None)
            .with_note("the same cache instance again (origin Memory)"),
    ]);

    let mut check = Checker::new(&init);
    let correctness = (|| {
        stream.synchronize()?;
        check.counted("framework", [&fw])?;
        raw.check(&mut check)?;
        Ok(check.summary())
    })();
    raw.close()?;
    run.report.publish(correctness, args.common.json.as_deref())
}

/// C: for each unique source, a cold compile through a fresh disk cache, a disk hit through a new
/// cache on the same folder, and a memory hit on that second cache; ms each.
fn compile_times(dev: &Device, rng: &mut impl Rng) -> Result<[Vec<f64>; 3]> {
    let dir = tempfile::tempdir().context("creating a temporary cache folder")?;
    let mut out: [Vec<f64>; 3] = Default::default();
    for k in 0..COMPILE_SAMPLES {
        // A constant no earlier run can have used, so no cache anywhere holds this source.
        let salt: u64 = rng.random();
        let src = format!(
            "// bench-core cold-compile probe {salt:#018x}\n{}",
            tiny::TINY_SRC.replace("tiny", &format!("tiny_{k}"))
        );
        let program = format!("bench_cold_{k}.cu");
        let time = |cache: &KernelCache, want: CacheOrigin| -> Result<(f64, Arc<Vec<u8>>)> {
            let t = Instant::now();
            let got = cache.compile(dev, &program, &src, &[]).context("compiling through KernelCache")?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            ensure!(got.origin == want, "expected cache origin {want:?}, got {:?}", got.origin);
            Ok((ms, got.image))
        };
        let (cold_ms, cold) = time(&KernelCache::with_dir(dir.path()), CacheOrigin::Compiled)?;
        let cache = KernelCache::with_dir(dir.path());
        let (disk_ms, disk) = time(&cache, CacheOrigin::Disk)?;
        ensure!(disk == cold, "the disk-cache hit returned another image than the cold compile");
        let (memory_ms, _) = time(&cache, CacheOrigin::Memory)?;
        for (v, ms) in out.iter_mut().zip([cold_ms, disk_ms, memory_ms]) {
            v.push(ms);
        }
    }
    dir.close().context("removing the temporary cache folder")?;
    Ok(out)
}
