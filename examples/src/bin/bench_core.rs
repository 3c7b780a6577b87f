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

use cuda_async_examples::bench::{self, Json, OptSpec, Options, Report, Row, SplitMix64, JSON_OPT};
use cuda_core::nvrtc::{CacheOrigin, KernelCache};
use cuda_core::{Device, DeviceBuffer, Error, Function, LaunchConfig, Module, Stream};
use cudarc::driver::sys;
use std::ffi::{c_void, CStr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The kernel both sides launch. One block of 32 threads over 32 floats.
const SRC: &str = r#"extern "C" __global__ void tiny(float* x, float a, unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = a * x[i] + 1.0f;
}
"#;
const KERNEL: &CStr = c"tiny";
const ELEMS: usize = 32;
/// `x <- a*x + 1` with `a < 1` converges to `1 / (1 - a)` = 1000, so the values stay finite for
/// any number of launches.
const SCALE: f32 = 0.999;
const CFG: LaunchConfig = LaunchConfig { grid: (1, 1, 1), block: (ELEMS as u32, 1, 1), shared_mem_bytes: 0 };
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
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench-core: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Turns a cuda-core error into a message naming what was being done.
fn ctx(what: &'static str) -> impl FnOnce(Error) -> String {
    move |e| format!("{what}: {e}")
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

/// One side of the comparison: launch the tiny kernel once, synchronize its stream.
trait Side {
    fn launch(&mut self) -> Result<(), String>;
    fn sync(&mut self) -> Result<(), String>;
}

/// The baseline: raw handles, created and destroyed by hand.
struct RawSide {
    dev: Device,
    module: sys::CUmodule,
    func: sys::CUfunction,
    stream: sys::CUstream,
    dptr: sys::CUdeviceptr,
    launches: u64,
}

impl RawSide {
    /// Loads `image` as a module in the device's primary context, looks up the kernel, creates a
    /// non-blocking stream and allocates the buffer. On error, whatever was created is released
    /// (by `Drop`).
    fn new(dev: &Device, image: &[u8]) -> Result<RawSide, String> {
        dev.bind().map_err(ctx("binding the primary context for the raw side"))?;
        let mut side = RawSide {
            dev: *dev,
            module: std::ptr::null_mut(),
            func: std::ptr::null_mut(),
            stream: std::ptr::null_mut(),
            dptr: 0,
            launches: 0,
        };
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
        // SAFETY: `aligned` holds the complete CUBIN (its ELF header gives the size) at an 8-byte
        // aligned address and lives across the call; the context is current; valid out-pointer.
        ck(unsafe { sys::cuModuleLoadData(&mut side.module, aligned.as_ptr().cast()) }, "cuModuleLoadData")?;
        // SAFETY: live module, NUL-terminated name, valid out-pointer.
        ck(
            unsafe { sys::cuModuleGetFunction(&mut side.func, side.module, KERNEL.as_ptr()) },
            "cuModuleGetFunction",
        )?;
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: valid out-pointer; the context is current.
        ck(unsafe { sys::cuStreamCreate(&mut side.stream, flags) }, "cuStreamCreate")?;
        // SAFETY: valid out-pointer; the context is current.
        ck(
            unsafe { sys::cuMemAlloc_v2(&mut side.dptr, ELEMS * std::mem::size_of::<f32>()) },
            "cuMemAlloc_v2",
        )?;
        Ok(side)
    }

    /// Copies `data` (ELEMS floats) into the buffer and waits until the copy has landed.
    fn upload(&mut self, data: &[f32]) -> Result<(), String> {
        if data.len() != ELEMS {
            return Err(format!("raw upload: expected {ELEMS} floats, got {}", data.len()));
        }
        self.dev.bind().map_err(ctx("binding the primary context"))?;
        // SAFETY: `dptr` is our allocation of ELEMS floats; `data` is a live slice of ELEMS floats.
        ck(
            unsafe { sys::cuMemcpyHtoD_v2(self.dptr, data.as_ptr().cast(), std::mem::size_of_val(data)) },
            "cuMemcpyHtoD_v2",
        )?;
        // A pageable host-to-device copy may return before the DMA has finished, and it runs on
        // the legacy stream, which our non-blocking stream does not wait for: wait for the context.
        // SAFETY: the context is current.
        ck(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
    }

    /// Waits for the stream, then copies the buffer back.
    fn download(&mut self) -> Result<Vec<f32>, String> {
        self.sync()?;
        let mut out = vec![0f32; ELEMS];
        // SAFETY: `out` holds ELEMS floats; `dptr` is our allocation of ELEMS floats; the kernels
        // that write it (on our stream) have completed (synchronized above). Synchronous copy.
        ck(
            unsafe {
                sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.dptr, std::mem::size_of_val(&out[..]))
            },
            "cuMemcpyDtoH_v2",
        )?;
        Ok(out)
    }

    /// Synchronizes and releases every handle, reporting the first failure (but releasing the
    /// rest regardless). Idempotent: released handles are cleared.
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
        if self.dptr != 0 {
            // SAFETY: our allocation; the only stream that used it has been synchronized above.
            keep(ck(unsafe { sys::cuMemFree_v2(self.dptr) }, "cuMemFree_v2"));
            self.dptr = 0;
        }
        if !self.stream.is_null() {
            // SAFETY: our stream; nothing uses it afterwards (cleared below).
            keep(ck(unsafe { sys::cuStreamDestroy_v2(self.stream) }, "cuStreamDestroy_v2"));
            self.stream = std::ptr::null_mut();
        }
        if !self.module.is_null() {
            // SAFETY: our module; every launch of its kernel was on our stream, synchronized above,
            // and the function handle is cleared with it.
            keep(ck(unsafe { sys::cuModuleUnload(self.module) }, "cuModuleUnload"));
            self.module = std::ptr::null_mut();
            self.func = std::ptr::null_mut();
        }
        first
    }
}

impl Drop for RawSide {
    fn drop(&mut self) {
        // Only reached with live handles on an early error; the explicit close() reports errors.
        let _ = self.close();
    }
}

impl Side for RawSide {
    #[inline]
    fn launch(&mut self) -> Result<(), String> {
        let mut x = self.dptr;
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
        // size of our allocation; live function and stream of the current context.
        ck(
            unsafe {
                sys::cuLaunchKernel(
                    self.func,
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
        )?;
        self.launches += 1;
        Ok(())
    }

    #[inline]
    fn sync(&mut self) -> Result<(), String> {
        // SAFETY: our live stream of the current context.
        ck(unsafe { sys::cuStreamSynchronize(self.stream) }, "cuStreamSynchronize")
    }
}

// ---------------------------------------------------------------------------------------------
// Framework side
// ---------------------------------------------------------------------------------------------

struct FrameworkSide {
    // Field order is drop order: the buffer's free is queued on the stream, then the function
    // (and its module) go, then the stream.
    buf: DeviceBuffer<f32>,
    func: Function,
    stream: Stream,
    launches: u64,
}

impl FrameworkSide {
    fn new(dev: &Device, image: &[u8], init: &[f32]) -> Result<FrameworkSide, String> {
        let module = Module::from_cubin(dev, image).map_err(ctx("Module::from_cubin"))?;
        let func = module.function("tiny").map_err(ctx("Module::function"))?;
        let stream = Stream::new(dev).map_err(ctx("Stream::new"))?;
        let buf = DeviceBuffer::from_host(&stream, init).map_err(ctx("DeviceBuffer::from_host"))?;
        stream.synchronize().map_err(ctx("Stream::synchronize"))?;
        Ok(FrameworkSide { buf, func, stream, launches: 0 })
    }
}

impl Side for FrameworkSide {
    #[inline]
    fn launch(&mut self) -> Result<(), String> {
        // SAFETY: `tiny(float* x, float a, unsigned long long n)` takes exactly
        // (&mut DeviceBuffer<f32>, f32, u64) in this order and layout; it writes x[i] only for
        // i < n = ELEMS = self.buf.len(), through the `&mut` buffer.
        unsafe { self.func.launch(&self.stream, CFG, (&mut self.buf, SCALE, ELEMS as u64)) }
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
    if raw.len() != ELEMS || fw.len() != ELEMS {
        return Err(format!("lengths: raw {}, framework {}, expected {ELEMS}", raw.len(), fw.len()));
    }
    if let Some(i) = raw.iter().chain(fw).position(|v| !v.is_finite()) {
        return Err(format!("non-finite value at index {i} (raw then framework)"));
    }
    if let Some(i) = (0..ELEMS).find(|&i| raw[i].to_bits() != fw[i].to_bits()) {
        return Err(format!("raw and framework differ at [{i}]: {} vs {}", raw[i], fw[i]));
    }
    if let Some(i) = (0..ELEMS).find(|&i| fw[i] == init[i]) {
        return Err(format!(
            "value [{i}] = {} still equals its initial value: the kernel did not run",
            fw[i]
        ));
    }
    let expect = host_reference(init, fw_launches);
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

/// The NVIDIA kernel module's version (e.g. `580.65.06`), from `/proc/driver/nvidia/version`.
fn kernel_module_version() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    parse_module_version(text.lines().next()?)
}

/// The first token of the form `digits.digits[.digits...]` in the first line of
/// `/proc/driver/nvidia/version`, whose wording varies ("NVIDIA UNIX x86_64 Kernel Module  580.65.06
/// ..." or "NVIDIA UNIX Open Kernel Module for x86_64  580.65.06 ...").
fn parse_module_version(line: &str) -> Option<String> {
    line.split_whitespace()
        .find(|t| {
            t.contains('.') && t.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_string)
}

fn run() -> Result<(), String> {
    let opts = Options::from_env(SPEC)?;
    if opts.help_requested() {
        print!(
            "{}",
            bench::usage(
                "bench-core",
                "Compares cuda-core with raw CUDA driver calls (launch, sync, NVRTC).",
                SPEC
            )
        );
        return Ok(());
    }
    let launches = opts.count_or("--launches", 10_000, 1)?;
    let repeats = opts.count_or("--repeats", 9, 1)?;
    let round_trips = opts.count_or("--roundtrips", 2_000, 1)?;
    let warmup = opts.count_or("--warmup", 1_000, 0)?;
    let json_path = opts.get("--json").map(PathBuf::from);

    // Classify "no GPU here" clearly before anything else touches the driver.
    match cuda_core::gpu_available() {
        Ok(_) => {}
        Err(e @ Error::NoDriver { .. }) => return Err(format!("no CUDA driver: {e}")),
        Err(e @ Error::NoDevice { .. }) => return Err(format!("no CUDA device: {e}")),
        Err(e) => return Err(format!("the CUDA driver is unusable: {e}")),
    }
    let dev = Device::new(0).map_err(ctx("opening device 0"))?;
    let (drv_major, drv_minor) = cuda_core::driver_version().map_err(ctx("reading the driver version"))?;
    let arch = dev.sm_arch().map_err(ctx("reading the compute capability"))?;
    let (nvrtc_major, nvrtc_minor) = cuda_core::nvrtc::nvrtc_version().map_err(ctx("loading NVRTC"))?;
    let mut rng = SplitMix64::from_time();
    let seed = rng.state();
    println!(
        "bench-core: {} ({arch}), driver CUDA {drv_major}.{drv_minor}, NVRTC {nvrtc_major}.{nvrtc_minor}",
        dev.name()
    );

    // One CUBIN for both sides.
    let (compiled, setup_compile_ms) =
        bench::time_ms(|| KernelCache::memory_only().compile(&dev, "tiny.cu", SRC, &[]))
            .map_err(ctx("compiling the tiny kernel with NVRTC"))?;
    let image: &[u8] = &compiled.image;

    let init: Vec<f32> = (0..ELEMS).map(|_| rng.f32_in(0.5, 1.5)).collect();
    let mut fw = FrameworkSide::new(&dev, image, &init)?;
    let mut raw = RawSide::new(&dev, image)?;
    raw.upload(&init)?;

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
    let raw_out = raw.download()?;
    fw.sync()?;
    let fw_out = fw.buf.to_vec().map_err(ctx("DeviceBuffer::to_vec"))?;
    let correctness = check_results(&init, &raw_out, &fw_out, raw.launches, fw.launches);
    raw.close()?;
    drop(fw);
    dev.synchronize().map_err(ctx("final device synchronize"))?;

    let mut report = Report::new("bench-core");
    report.meta("date_utc", bench::utc_now());
    report.meta("gpu", dev.name());
    report.meta("arch", arch.as_str());
    report.meta("driver_cuda_version", format!("{drv_major}.{drv_minor}"));
    report.meta("nvidia_kernel_module", kernel_module_version());
    report.meta("nvrtc_version", format!("{nvrtc_major}.{nvrtc_minor}"));
    report.meta("launches", launches);
    report.meta("repeats", repeats);
    report.meta("roundtrips", round_trips);
    report.meta("warmup", warmup);
    report.meta("seed", format!("{seed:#018x}"));
    report.meta("cubin_bytes", image.len());
    report.meta("setup_compile_ms", setup_compile_ms);
    report.meta(
        "correctness",
        match &correctness {
            Ok(s) => Json::from(s.as_str()),
            Err(e) => Json::from(format!("FAILED: {e}")),
        },
    );
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

    print!("{}", report.table());
    println!("goals met: {}", if report.all_met() { "yes" } else { "NO" });
    if let Some(p) = &json_path {
        report.write_json(p)?;
        println!("wrote {}", p.display());
    }
    correctness.map(|s| println!("correctness: {s}")).map_err(|e| format!("correctness check failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_version_formats() {
        let closed =
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 06:54:38 UTC 2025";
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U16-I2-C04-12-4)  Thu Oct 30 2025";
        assert_eq!(parse_module_version(closed).as_deref(), Some("580.65.06"));
        assert_eq!(parse_module_version(open).as_deref(), Some("580.159.04"));
        assert_eq!(parse_module_version("no version here 1. .2"), None);
    }

    #[test]
    fn host_reference_converges_and_stays_finite() {
        let init = [0.5f32, 1.0, 1.4999];
        let r = host_reference(&init, 1);
        assert_eq!(r[1], SCALE.mul_add(1.0, 1.0));
        let far = host_reference(&init, 10_000_000);
        assert!(far.iter().all(|v| v.is_finite() && (*v - 1000.0).abs() < 1.0));
    }

    #[test]
    fn check_results_catches_mismatch() {
        let init = vec![1.0f32; ELEMS];
        let out = host_reference(&init, 5);
        assert!(check_results(&init, &out, &out, 5, 5).is_ok());
        assert!(check_results(&init, &out, &out, 5, 6).is_err());
        let mut other = out.clone();
        other[3] += 1.0;
        assert!(check_results(&init, &out, &other, 5, 5).is_err());
        assert!(check_results(&init, &init, &init, 5, 5).is_err());
    }
}
