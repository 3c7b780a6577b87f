//! `bench-core`: the cost of `cuda-core` over raw driver calls, side by side in one process.
//!
//! The same tiny kernel (one CUBIN, compiled once with cuda-core's NVRTC) is launched through raw
//! `cudarc::driver::sys` calls (the baseline: `cuModuleLoadData`, `cuStreamCreate`,
//! `cuMemAlloc_v2`, `cuLaunchKernel`, `cuStreamSynchronize`) and through `cuda-core`
//! (`Module::from_cubin`, `Stream`, `DeviceBuffer`, `Function::launch`, `Stream::synchronize`).
//!
//! - A. launch throughput: N launches back to back, then one synchronize; µs per launch.
//! - B. round trip: launch + synchronize, 2,000 times; µs per round trip.
//! - C. NVRTC through `KernelCache`: cold compile, disk-cache hit, memory hit; ms.
//!
//! A and B repeat R times, alternating which side goes first; the medians are compared
//! (goal: framework / raw ≤ 1.02). Afterwards both buffers are copied back and checked against
//! each other and a host reference.
//!
//! `cargo run --release -p cuda-async-examples --bin bench-core -- [--launches N] [--repeats R]
//! [--roundtrips M] [--warmup W] [--json PATH]`

use cuda_async_examples::bench::{self, ctx, OptSpec, Options, Row, SplitMix64, JSON_OPT};
use cuda_async_examples::raw::{self, TinyFunction, TinyImage, TinyRaw, TINY_CFG, TINY_ELEMS, TINY_SCALE};
use cuda_core::nvrtc::{CacheOrigin, KernelCache};
use cuda_core::{Device, DeviceBuffer, Stream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Goal for A and B: the framework at most 2% slower than raw driver calls.
const MAX_RATIO: f64 = 1.02;
/// Cold/disk/memory compile samples (each with its own unique source).
const COMPILE_SAMPLES: usize = 3;

const SPEC: &[OptSpec] = &[
    OptSpec { name: "--launches", value: "N", help: "launches per repeat for A (default 10000)" },
    OptSpec { name: "--repeats", value: "R", help: "repeats of A and B; medians are reported (default 9)" },
    OptSpec {
        name: "--roundtrips",
        value: "M",
        help: "launch+synchronize round trips per repeat for B (default 2000)",
    },
    OptSpec {
        name: "--warmup",
        value: "W",
        help: "warm-up launches per side before A (default 1000; W/10 before B)",
    },
    JSON_OPT,
];

fn main() -> ExitCode {
    bench::main_with("bench-core", run)
}

/// One side of the comparison: launch the tiny kernel once, synchronize its stream.
trait Side {
    fn launch(&mut self) -> Result<(), String>;
    fn sync(&mut self) -> Result<(), String>;
}

/// The baseline: raw handles with one buffer.
impl Side for TinyRaw {
    #[inline(always)]
    fn launch(&mut self) -> Result<(), String> {
        TinyRaw::launch(self, 0)
    }

    #[inline]
    fn sync(&mut self) -> Result<(), String> {
        TinyRaw::sync(self)
    }
}

struct FrameworkSide {
    // Field order is drop order: the buffer's free is queued on the stream, then the function
    // (and its module) go, then the stream.
    buf: DeviceBuffer<f32>,
    func: TinyFunction,
    stream: Stream,
    launches: u64,
}

impl FrameworkSide {
    fn new(dev: &Device, image: &TinyImage, init: &[f32]) -> Result<FrameworkSide, String> {
        let func = image.load(dev)?;
        let stream = Stream::new(dev).map_err(ctx("Stream::new"))?;
        let buf = DeviceBuffer::from_host(&stream, init).map_err(ctx("DeviceBuffer::from_host"))?;
        stream.synchronize().map_err(ctx("Stream::synchronize"))?;
        Ok(FrameworkSide { buf, func, stream, launches: 0 })
    }
}

impl Side for FrameworkSide {
    #[inline]
    fn launch(&mut self) -> Result<(), String> {
        // SAFETY: `tiny(float* x, float a, unsigned long long n)` (guaranteed by `TinyFunction`)
        // takes exactly (&mut DeviceBuffer<f32>, f32, u64) in this order and layout; it writes x[i]
        // only for i < n = TINY_ELEMS = self.buf.len(), through the `&mut` buffer.
        unsafe {
            self.func.function().launch(
                &self.stream,
                TINY_CFG,
                (&mut self.buf, TINY_SCALE, TINY_ELEMS as u64),
            )
        }
        .map_err(ctx("Function::launch"))?;
        self.launches += 1;
        Ok(())
    }

    #[inline]
    fn sync(&mut self) -> Result<(), String> {
        self.stream.synchronize().map_err(ctx("Stream::synchronize"))
    }
}

// ---------------------------------------------------------------------------------------------
// Measurements
// ---------------------------------------------------------------------------------------------

/// A: `n` launches back to back, then one synchronize; µs per launch.
fn throughput<S: Side>(side: &mut S, n: usize) -> Result<f64, String> {
    side.sync()?; // start from an idle stream
    bench::us_per_iter(side, n, S::launch, S::sync)
}

/// B: `n` times (launch; synchronize); µs per round trip.
fn round_trip<S: Side>(side: &mut S, n: usize) -> Result<f64, String> {
    side.sync()?;
    bench::us_per_iter(
        side,
        n,
        |s| {
            s.launch()?;
            s.sync()
        },
        |_| Ok(()),
    )
}

fn warm_up<S: Side>(side: &mut S, launches: usize, round_trips: usize) -> Result<(), String> {
    for _ in 0..launches {
        side.launch()?;
    }
    side.sync()?;
    for _ in 0..round_trips {
        side.launch()?;
        side.sync()?;
    }
    Ok(())
}

/// A temporary folder, removed on drop (or explicitly, with errors reported, by `remove`).
struct TempDir(Option<PathBuf>);

impl TempDir {
    fn new(tag: u64) -> Result<TempDir, String> {
        let p = std::env::temp_dir().join(format!("bench-core-{}-{tag:016x}", std::process::id()));
        std::fs::create_dir_all(&p).map_err(|e| format!("creating {}: {e}", p.display()))?;
        Ok(TempDir(Some(p)))
    }

    fn path(&self) -> &Path {
        self.0.as_deref().unwrap_or(Path::new(""))
    }

    fn remove(mut self) -> Result<(), String> {
        match self.0.take() {
            Some(p) => std::fs::remove_dir_all(&p).map_err(|e| format!("removing {}: {e}", p.display())),
            None => Ok(()),
        }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

struct CompileTimes {
    cold_ms: Vec<f64>,
    disk_ms: Vec<f64>,
    memory_ms: Vec<f64>,
}

fn expect_origin(got: CacheOrigin, want: CacheOrigin, what: &str) -> Result<(), String> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: expected cache origin {want:?}, got {got:?}"))
    }
}

/// C: for each of `samples` unique sources: a cold compile through a fresh disk cache, a disk hit
/// through a new cache on the same folder, and a memory hit on that second cache.
fn measure_compile(dev: &Device, rng: &mut SplitMix64, samples: usize) -> Result<CompileTimes, String> {
    let dir = TempDir::new(rng.next_u64())?;
    let mut t = CompileTimes { cold_ms: vec![], disk_ms: vec![], memory_ms: vec![] };
    for k in 0..samples {
        // A constant no earlier run can have used, so no cache anywhere can hold this source.
        let salt = rng.next_u64();
        let src = format!(
            "// bench-core cold-compile probe {salt:#018x}\n\
             extern \"C\" __global__ void tiny_{k}(float* x, float a, unsigned long long n) {{\n    \
             unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;\n    \
             if (i < n) x[i] = a * x[i] + (float)({salt}ULL & 0xffULL);\n}}\n"
        );
        let program = format!("bench_cold_{k}.cu");

        let cold_cache = KernelCache::with_dir(dir.path());
        let (cold, ms) =
            bench::time_ms(|| cold_cache.compile(dev, &program, &src, &[])).map_err(ctx("cold compile"))?;
        expect_origin(cold.origin, CacheOrigin::Compiled, "cold compile")?;
        t.cold_ms.push(ms);

        let cache = KernelCache::with_dir(dir.path());
        let (disk, ms) =
            bench::time_ms(|| cache.compile(dev, &program, &src, &[])).map_err(ctx("disk-cache compile"))?;
        expect_origin(disk.origin, CacheOrigin::Disk, "disk-cache hit (was the cache folder writable?)")?;
        if disk.image != cold.image {
            return Err("disk-cache hit returned a different image than the cold compile".into());
        }
        t.disk_ms.push(ms);

        let (mem, ms) = bench::time_ms(|| cache.compile(dev, &program, &src, &[]))
            .map_err(ctx("memory-cache compile"))?;
        expect_origin(mem.origin, CacheOrigin::Memory, "memory-cache hit")?;
        t.memory_ms.push(ms);
    }
    dir.remove()?;
    Ok(t)
}

// ---------------------------------------------------------------------------------------------
// Correctness
// ---------------------------------------------------------------------------------------------

/// Checks both sides' results; returns a one-line summary or what is wrong.
fn check_results(
    init: &[f32],
    raw: &[f32],
    fw: &[f32],
    raw_launches: u64,
    fw_launches: u64,
) -> Result<String, String> {
    if raw_launches != fw_launches {
        return Err(format!("launch counts differ: raw {raw_launches}, framework {fw_launches}"));
    }
    if raw.len() != TINY_ELEMS || fw.len() != TINY_ELEMS {
        return Err(format!("lengths: raw {}, framework {}, expected {TINY_ELEMS}", raw.len(), fw.len()));
    }
    if let Some(i) = raw.iter().chain(fw).position(|v| !v.is_finite()) {
        return Err(format!("non-finite value at index {i} (raw then framework)"));
    }
    if let Some(i) = (0..TINY_ELEMS).find(|&i| raw[i].to_bits() != fw[i].to_bits()) {
        return Err(format!("raw and framework differ at [{i}]: {} vs {}", raw[i], fw[i]));
    }
    if let Some(i) = (0..TINY_ELEMS).find(|&i| fw[i] == init[i]) {
        return Err(format!(
            "value [{i}] = {} still equals its initial value: the kernel did not run",
            fw[i]
        ));
    }
    let expect = raw::tiny_reference(init, fw_launches);
    let max_rel =
        expect.iter().zip(fw).map(|(&e, &g)| ((g as f64 - e as f64) / e as f64).abs()).fold(0.0f64, f64::max);
    if max_rel.is_nan() || max_rel > 1e-3 {
        return Err(format!("results differ from the host reference by up to {max_rel:.3e} (relative)"));
    }
    Ok(format!(
        "ok: {fw_launches} launches per side, raw == framework bit for bit, max relative difference \
         from the host reference {max_rel:.1e}"
    ))
}

// ---------------------------------------------------------------------------------------------
// Main
// ---------------------------------------------------------------------------------------------

fn run() -> Result<(), String> {
    let about = "Compares cuda-core with raw CUDA driver calls (launch, sync, NVRTC).";
    let Some(opts) = Options::from_env_or_usage("bench-core", about, SPEC)? else {
        return Ok(());
    };
    let launches = opts.count_or("--launches", 10_000, 1)?;
    let repeats = opts.count_or("--repeats", 9, 1)?;
    let round_trips = opts.count_or("--roundtrips", 2_000, 1)?;
    let warmup = opts.count_or("--warmup", 1_000, 0)?;
    let json_path = opts.json_path();

    let (dev, gpu) = bench::open_gpu("bench-core", |_| Ok(()))?;
    let mut rng = SplitMix64::from_time();
    let seed = rng.state();

    // One CUBIN for both sides.
    let (image, setup_compile_ms) = bench::time_ms(|| TinyImage::compile(&dev))?;

    let init: Vec<f32> = (0..TINY_ELEMS).map(|_| rng.f32_in(0.5, 1.5)).collect();
    let mut fw = FrameworkSide::new(&dev, &image, &init)?;
    let mut raw = TinyRaw::new(&dev, &image, 1, &init)?;

    // Warm-up: equal counts on both sides keep the final buffers comparable.
    let warmup_rt = warmup / 10;
    println!(
        "warming up ({warmup} launches + {warmup_rt} round trips per side); then {repeats} repeats of \
         A ({launches} launches) and B ({round_trips} round trips)"
    );
    warm_up(&mut raw, warmup, warmup_rt)?;
    warm_up(&mut fw, warmup, warmup_rt)?;

    let (raw_a, fw_a) =
        bench::alternating(repeats, || throughput(&mut raw, launches), || throughput(&mut fw, launches))?;
    let (raw_b, fw_b) = bench::alternating(
        repeats,
        || round_trip(&mut raw, round_trips),
        || round_trip(&mut fw, round_trips),
    )?;

    println!("measuring NVRTC compile through KernelCache ({COMPILE_SAMPLES} unique sources)");
    let compile = measure_compile(&dev, &mut rng, COMPILE_SAMPLES)?;

    // Correctness: both buffers saw the same launches of the same kernel from the same values.
    let raw_out = raw.download(raw.buffer(0))?;
    fw.sync()?;
    let fw_out = fw.buf.to_vec().map_err(ctx("DeviceBuffer::to_vec"))?;
    let correctness = check_results(&init, &raw_out, &fw_out, raw.launches(0), fw.launches);
    raw.close()?;
    drop(fw);
    dev.synchronize().map_err(ctx("final device synchronize"))?;

    let mut report = gpu.report("bench-core");
    report.meta("launches", launches);
    report.meta("repeats", repeats);
    report.meta("roundtrips", round_trips);
    report.meta("warmup", warmup);
    report.meta("seed", format!("{seed:#018x}"));
    report.meta("cubin_bytes", image.bytes().len());
    report.meta("setup_compile_ms", setup_compile_ms);
    report.rows.push(
        Row::compare("A launch throughput", "us/launch", raw_a, fw_a, Some(MAX_RATIO))
            .with_note(format!("{launches} launches then one synchronize, median of {repeats}")),
    );
    report.rows.push(
        Row::compare("B launch + synchronize", "us/round trip", raw_b, fw_b, Some(MAX_RATIO))
            .with_note(format!("{round_trips} round trips, median of {repeats}")),
    );
    report.rows.push(Row::single("C NVRTC cold compile", "ms", compile.cold_ms).with_note(
        "KernelCache::with_dir on an empty folder, unique source (origin Compiled); includes hashing and the disk write",
    ));
    report.rows.push(
        Row::single("C disk-cache hit", "ms", compile.disk_ms)
            .with_note("a new KernelCache::with_dir on the same folder (origin Disk)"),
    );
    report.rows.push(
        Row::single("C memory-cache hit", "ms", compile.memory_ms)
            .with_note("the same cache instance again (origin Memory)"),
    );

    report.publish(&correctness, json_path.as_deref())?;
    bench::conclude(correctness)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_results_catches_mismatch() {
        let init = vec![1.0f32; TINY_ELEMS];
        let out = raw::tiny_reference(&init, 5);
        assert!(check_results(&init, &out, &out, 5, 5).is_ok());
        assert!(check_results(&init, &out, &out, 5, 6).is_err());
        let mut other = out.clone();
        other[3] += 1.0;
        assert!(check_results(&init, &out, &other, 5, 5).is_err());
        assert!(check_results(&init, &init, &init, 5, 5).is_err());
    }
}
