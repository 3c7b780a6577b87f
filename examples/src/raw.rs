//! The tiny kernel that both sides of the benchmark comparisons launch, and the raw CUDA driver
//! baseline they are compared with.
//!
//! - The kernel: [`TINY_SRC`] (`x[i] = 0.999f * x[i] + 1.0f` over 32 floats, one block of 32
//!   threads), compiled once into a [`TinyImage`] and loaded by each side; the host reference for a
//!   number of launches ([`tiny_reference`]) and a checker for result buffers ([`TinyChecker`]).
//! - The framework side: [`TinyFunction`] (the kernel loaded with `Module::from_cubin`), [`Tiny`]
//!   (one launch as a `cuda-async` op and graph node) and [`Counted`] (a buffer with the number of
//!   kernels that ran on it).
//! - The raw side: small owned driver handles ([`RawModule`], [`RawStream`], [`RawBuffer`],
//!   [`RawGraph`]) that release themselves on drop, or with errors reported by an explicit
//!   `close` (`destroy` for graphs); [`TinyRaw`], the baseline for the tiny kernel built from
//!   them; [`launch_kernel`] and [`ck`], driver results as messages with the driver's name and
//!   description of the error.
//!
//! Everything returns `Result<_, String>`, like [`crate::bench`].

use crate::bench::ctx;
use cuda_async::{DeviceOp, ExecutionContext, GraphNode};
use cuda_core::nvrtc::{CompiledKernel, KernelCache};
use cuda_core::{Device, DeviceBuffer, Function, LaunchConfig, Module};
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::{c_void, CStr};

// ---------------------------------------------------------------------------------------------
// The tiny kernel
// ---------------------------------------------------------------------------------------------

/// The kernel both sides launch. One block of 32 threads over 32 floats.
pub const TINY_SRC: &str = r#"extern "C" __global__ void tiny(float* x, float a, unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = a * x[i] + 1.0f;
}
"#;
/// The kernel's name in [`TINY_SRC`].
pub const TINY_KERNEL: &CStr = c"tiny";
/// Floats per buffer.
pub const TINY_ELEMS: usize = 32;
/// `x <- a*x + 1` with `a < 1` converges to `1 / (1 - a)` = 1000: values stay finite for any number
/// of launches.
pub const TINY_SCALE: f32 = 0.999;
/// One block of [`TINY_ELEMS`] threads.
pub const TINY_CFG: LaunchConfig =
    LaunchConfig { grid: (1, 1, 1), block: (TINY_ELEMS as u32, 1, 1), shared_mem_bytes: 0 };

/// The tiny kernel compiled to a CUBIN with cuda-core's NVRTC, for both sides to load.
pub struct TinyImage(CompiledKernel);

impl TinyImage {
    /// Compiles [`TINY_SRC`] for `dev` (through a memory-only `KernelCache`).
    pub fn compile(dev: &Device) -> Result<TinyImage, String> {
        KernelCache::memory_only()
            .compile(dev, "tiny.cu", TINY_SRC, &[])
            .map(TinyImage)
            .map_err(ctx("compiling the tiny kernel with NVRTC"))
    }

    /// The CUBIN bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.0.image
    }

    /// Loads the image for the framework side (`Module::from_cubin`) and looks up the kernel.
    pub fn load(&self, dev: &Device) -> Result<TinyFunction, String> {
        let module = Module::from_cubin(dev, self.bytes()).map_err(ctx("Module::from_cubin"))?;
        module.function("tiny").map(TinyFunction).map_err(ctx("Module::function"))
    }
}

/// The `tiny` kernel as loaded by [`TinyImage::load`] (the only way to make one), so its signature
/// is known to be `tiny(float* x, float a, unsigned long long n)`.
#[derive(Clone)]
pub struct TinyFunction(Function);

impl TinyFunction {
    /// The loaded function.
    #[inline]
    pub fn function(&self) -> &Function {
        &self.0
    }
}

/// `x <- fma(a, x, 1)` `launches` times on the host (stops early at the fixed point).
pub fn tiny_reference(init: &[f32], launches: u64) -> Vec<f32> {
    init.iter()
        .map(|&x0| {
            let mut x = x0;
            for _ in 0..launches {
                let next = TINY_SCALE.mul_add(x, 1.0);
                if next == x {
                    break;
                }
                x = next;
            }
            x
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The framework side's op
// ---------------------------------------------------------------------------------------------

/// One launch of the tiny kernel on a buffer, as a `cuda-async` op (and graph node).
pub struct Tiny<'a> {
    /// The kernel.
    pub func: &'a TinyFunction,
    /// The buffer it updates (its first [`TINY_ELEMS`] floats at most).
    pub buf: &'a mut DeviceBuffer<f32>,
}

impl DeviceOp for Tiny<'_> {
    type Output = ();

    #[inline]
    fn execute(self, ctx: &ExecutionContext<'_>) -> cuda_async::Result<()> {
        let n = self.buf.len() as u64;
        // SAFETY: `tiny(float* x, float a, unsigned long long n)` (guaranteed by `TinyFunction`)
        // takes exactly (&mut DeviceBuffer<f32>, f32, u64) in this order and layout. It writes x[i]
        // only for i < n = self.buf.len() (and i < 32, the block size), through the exclusive
        // `&mut` buffer; `Function::launch` orders the launch after the buffer's earlier uses if
        // its home stream is not ctx.stream(), and while capturing records the buffer's allocation
        // so that the graph keeps it alive.
        unsafe { self.func.function().launch(ctx.stream(), TINY_CFG, (self.buf, TINY_SCALE, n)) }?;
        Ok(())
    }
}

// SAFETY: `execute` queues exactly one kernel launch on an existing buffer, through
// `Function::launch` (which records the buffer with the capture): it allocates nothing, frees
// nothing, adds no host callback and does not synchronise, so it can be recorded and replayed.
unsafe impl GraphNode for Tiny<'_> {}

/// A framework buffer with the number of kernels that have run on it (for the correctness check).
pub struct Counted {
    /// The buffer.
    pub buf: DeviceBuffer<f32>,
    /// Kernels that have run on it.
    pub launches: u64,
}

impl Counted {
    /// `buf`, with no launches yet.
    pub fn new(buf: DeviceBuffer<f32>) -> Counted {
        Counted { buf, launches: 0 }
    }
}

// ---------------------------------------------------------------------------------------------
// Correctness
// ---------------------------------------------------------------------------------------------

/// Checks tiny-kernel result buffers against the host reference for their launch counts
/// (computed once per count) and tallies what it checked.
pub struct TinyChecker<'a> {
    init: &'a [f32],
    refs: HashMap<u64, Vec<f32>>,
    /// Buffers checked.
    pub buffers: usize,
    /// Launches over all the buffers checked.
    pub launches: u64,
    /// The largest relative difference from the host reference.
    pub worst: f64,
}

impl<'a> TinyChecker<'a> {
    /// A checker for buffers that all started as `init`.
    pub fn new(init: &'a [f32]) -> TinyChecker<'a> {
        TinyChecker { init, refs: HashMap::new(), buffers: 0, launches: 0, worst: 0.0 }
    }

    /// Checks one buffer, named `what` in errors: finite, changed (if launched), and within 1e-3
    /// (relative) of the host reference for `launches`.
    pub fn check(&mut self, what: &str, got: &[f32], launches: u64) -> Result<(), String> {
        let init = self.init;
        if got.len() != init.len() {
            return Err(format!("{what}: {} values, expected {}", got.len(), init.len()));
        }
        if let Some(i) = got.iter().position(|v| !v.is_finite()) {
            return Err(format!("{what}: non-finite value {} at [{i}]", got[i]));
        }
        if launches > 0 {
            if let Some(i) = (0..got.len()).find(|&i| got[i] == init[i]) {
                return Err(format!(
                    "{what}: value [{i}] = {} still equals its initial value after {launches} launches",
                    got[i]
                ));
            }
        }
        let expect = self.refs.entry(launches).or_insert_with(|| tiny_reference(init, launches));
        let max_rel = expect
            .iter()
            .zip(got)
            .map(|(&e, &g)| ((g as f64 - e as f64) / e as f64).abs())
            .fold(0.0f64, f64::max);
        if max_rel.is_nan() || max_rel > 1e-3 {
            return Err(format!(
                "{what}: differs from the host reference for {launches} launches by up to {max_rel:.3e} (relative)"
            ));
        }
        self.worst = self.worst.max(max_rel);
        self.buffers += 1;
        self.launches += launches;
        Ok(())
    }

    /// Copies each framework buffer back and checks it as `{group} buffer {k}`.
    pub fn check_counted<'b>(
        &mut self,
        group: &str,
        bufs: impl IntoIterator<Item = &'b Counted>,
    ) -> Result<(), String> {
        for (k, c) in bufs.into_iter().enumerate() {
            let got = c.buf.to_vec().map_err(ctx("DeviceBuffer::to_vec"))?;
            self.check(&format!("{group} buffer {k}"), &got, c.launches)?;
        }
        Ok(())
    }

    /// Copies each buffer of the raw side back and checks it as `raw buffer {k}`.
    pub fn check_raw(&mut self, raw: &TinyRaw) -> Result<(), String> {
        for k in 0..raw.buffer_count() {
            let got = raw.download(raw.buffer(k))?;
            self.check(&format!("raw buffer {k}"), &got, raw.launches(k))?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Raw driver calls
// ---------------------------------------------------------------------------------------------

/// `Ok` for `CUDA_SUCCESS`, else a message with the driver's name and description of the error.
#[inline]
pub fn ck(r: sys::CUresult, what: &'static str) -> Result<(), String> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(raw_error(r, what))
    }
}

#[cold]
fn raw_error(r: sys::CUresult, what: &'static str) -> String {
    let mut p: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: only reached with the result of a raw driver call that returned, so the driver
    // library is loaded (raw calls happen only after `Device::new` succeeded). cuGetErrorString
    // stores a pointer to a static NUL-terminated string, or leaves ours null for an unknown code;
    // we check both.
    let desc = unsafe {
        if sys::cuGetErrorString(r, &mut p) == sys::CUresult::CUDA_SUCCESS && !p.is_null() {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        } else {
            "no description".to_string()
        }
    };
    format!("{what} failed: {r:?} ({}): {desc}", r as u32)
}

/// The first error of a sequence of release steps that all run regardless.
#[derive(Debug, Default)]
pub struct FirstError(Option<String>);

impl FirstError {
    /// Keeps `r`'s error if it is the first.
    pub fn keep(&mut self, r: Result<(), String>) {
        if let Err(e) = r {
            self.0.get_or_insert(e);
        }
    }

    /// `Err` with the first error kept, else `Ok`.
    pub fn result(self) -> Result<(), String> {
        self.0.map_or(Ok(()), Err)
    }
}

/// Waits for all work of the current context (`cuCtxSynchronize`).
pub fn ctx_synchronize() -> Result<(), String> {
    // SAFETY: no arguments; acts on the current context (an error if there is none).
    ck(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
}

/// Queues `func` on `stream` with `cfg` and the kernel parameters `params` (`cuLaunchKernel`, no
/// extra options); `what` names the call in an error.
///
/// # Safety
/// `func` is a live function of a module of the current context; `params` holds one pointer per
/// kernel parameter, in order, each to a live value of that parameter's type; and the kernel
/// accesses only memory that is allocated, within bounds, and stays allocated until the launch has
/// completed (for every replay, when `stream` is being captured).
#[inline]
pub unsafe fn launch_kernel(
    func: sys::CUfunction,
    cfg: LaunchConfig,
    stream: &RawStream,
    params: &mut [*mut c_void],
    what: &'static str,
) -> Result<(), String> {
    let (g, b) = (cfg.grid, cfg.block);
    // SAFETY: the caller's contract: live function of the current context, one pointer per
    // parameter to a value of its type, accesses within live allocations; `stream` is live.
    ck(
        unsafe {
            sys::cuLaunchKernel(
                func,
                g.0,
                g.1,
                g.2,
                b.0,
                b.1,
                b.2,
                cfg.shared_mem_bytes,
                stream.as_raw(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        },
        what,
    )
}

// ---------------------------------------------------------------------------------------------
// Owned raw handles
// ---------------------------------------------------------------------------------------------

/// `Drop` through the types' own idempotent `close`: only does something on an early error (the
/// explicit `close` is the one that reports errors).
macro_rules! drop_by_close {
    ($($t:ty),*) => {
        $(impl Drop for $t {
            fn drop(&mut self) {
                let _ = self.close();
            }
        })*
    };
}

drop_by_close!(RawModule, RawStream, RawBuffer, TinyRaw);

/// Releases the handle in `slot` once: nothing to do if it holds `gone`; otherwise binds `dev`'s
/// primary context, puts `gone` in the slot and passes the handle to `release`.
fn release_once<H: Copy + PartialEq>(
    dev: &Device,
    slot: &mut H,
    gone: H,
    release: impl FnOnce(H) -> Result<(), String>,
) -> Result<(), String> {
    if *slot == gone {
        return Ok(());
    }
    dev.bind().map_err(ctx("binding the primary context to release raw handles"))?;
    release(std::mem::replace(slot, gone))
}

/// A module loaded with `cuModuleLoadData` into a device's primary context; unloaded on drop (or,
/// with errors reported, by [`RawModule::close`]).
pub struct RawModule {
    dev: Device,
    raw: sys::CUmodule,
}

impl RawModule {
    /// Binds `dev`'s primary context and loads `image` (a CUBIN) into it.
    pub fn load(dev: &Device, image: &[u8]) -> Result<RawModule, String> {
        dev.bind().map_err(ctx("binding the primary context for the raw side"))?;
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
        let mut m = RawModule { dev: *dev, raw: std::ptr::null_mut() };
        // SAFETY: `aligned` holds the complete CUBIN (its ELF header gives the size) at an 8-byte
        // aligned address and lives across the call; the context is current; valid out-pointer.
        ck(unsafe { sys::cuModuleLoadData(&mut m.raw, aligned.as_ptr().cast()) }, "cuModuleLoadData")?;
        Ok(m)
    }

    /// The kernel `name`; valid until the module is unloaded.
    pub fn function(&self, name: &CStr) -> Result<sys::CUfunction, String> {
        let mut func: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: live module, NUL-terminated name, valid out-pointer.
        ck(unsafe { sys::cuModuleGetFunction(&mut func, self.raw, name.as_ptr()) }, "cuModuleGetFunction")?;
        Ok(func)
    }

    /// Unloads the module; every launch of its kernels must have completed and every graph that
    /// uses them must be gone. Idempotent.
    pub fn close(&mut self) -> Result<(), String> {
        release_once(&self.dev, &mut self.raw, std::ptr::null_mut(), |m| {
            // SAFETY: our module, released once; its owner has waited for every launch of its
            // kernels and destroyed the graphs that use them.
            ck(unsafe { sys::cuModuleUnload(m) }, "cuModuleUnload")
        })
    }
}

/// A non-blocking stream of a device's primary context; destroyed on drop (or, with errors
/// reported, by [`RawStream::close`]).
pub struct RawStream {
    dev: Device,
    raw: sys::CUstream,
}

impl RawStream {
    /// Binds `dev`'s primary context and creates a non-blocking stream in it.
    pub fn non_blocking(dev: &Device) -> Result<RawStream, String> {
        dev.bind().map_err(ctx("binding the primary context for the raw side"))?;
        let mut s = RawStream { dev: *dev, raw: std::ptr::null_mut() };
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: valid out-pointer; the context is current.
        ck(unsafe { sys::cuStreamCreate(&mut s.raw, flags) }, "cuStreamCreate")?;
        Ok(s)
    }

    /// The driver handle (null once closed).
    #[inline]
    pub fn as_raw(&self) -> sys::CUstream {
        self.raw
    }

    /// Waits until the stream's work has completed (not to be called once closed).
    #[inline]
    pub fn sync(&self) -> Result<(), String> {
        // SAFETY: our live stream of the current context (a closed one is null: the driver takes
        // that as the legacy stream, no memory is involved).
        ck(unsafe { sys::cuStreamSynchronize(self.raw) }, "cuStreamSynchronize")
    }

    /// Destroys the stream (the driver lets queued work finish first). Idempotent.
    pub fn close(&mut self) -> Result<(), String> {
        release_once(&self.dev, &mut self.raw, std::ptr::null_mut(), |s| {
            // SAFETY: our stream, released once; nothing uses it afterwards (its slot is cleared).
            ck(unsafe { sys::cuStreamDestroy_v2(s) }, "cuStreamDestroy_v2")
        })
    }
}

/// A `cuMemAlloc_v2` allocation of floats in a device's primary context; freed on drop (or, with
/// errors reported, by [`RawBuffer::close`]).
pub struct RawBuffer {
    dev: Device,
    ptr: sys::CUdeviceptr,
    len: usize,
}

impl RawBuffer {
    /// Binds `dev`'s primary context, allocates room for `data` and copies `data` into it. The copy
    /// is pageable and on the legacy stream: before non-blocking streams use the buffer, wait for
    /// it ([`ctx_synchronize`]).
    pub fn from_host(dev: &Device, data: &[f32]) -> Result<RawBuffer, String> {
        dev.bind().map_err(ctx("binding the primary context for the raw side"))?;
        let bytes = std::mem::size_of_val(data);
        let mut b = RawBuffer { dev: *dev, ptr: 0, len: data.len() };
        if std::env::var_os("CUDA_ASYNC_BENCH_RAW_POOL").is_some() {
            // Diagnostic: take the raw side's memory from the stream-ordered pool too (as the
            // framework does), to separate allocator effects from framework overhead.
            // SAFETY: valid out-pointer; the context is current; the legacy stream is synchronized
            // right after, so the allocation is ready for any stream.
            ck(unsafe { sys::cuMemAllocAsync(&mut b.ptr, bytes, std::ptr::null_mut()) }, "cuMemAllocAsync")?;
            // SAFETY: the legacy stream of the current context.
            ck(unsafe { sys::cuStreamSynchronize(std::ptr::null_mut()) }, "cuStreamSynchronize")?;
        } else {
            // SAFETY: valid out-pointer; the context is current.
            ck(unsafe { sys::cuMemAlloc_v2(&mut b.ptr, bytes) }, "cuMemAlloc_v2")?;
        }
        // SAFETY: `b.ptr` is our allocation of `bytes` bytes; `data` is a live slice of that size.
        ck(unsafe { sys::cuMemcpyHtoD_v2(b.ptr, data.as_ptr().cast(), bytes) }, "cuMemcpyHtoD_v2")?;
        Ok(b)
    }

    /// The device address (0 once closed).
    #[inline]
    pub fn ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// Copies the buffer back with a synchronous copy, which does not wait for other streams:
    /// synchronize the streams that write it first.
    pub fn to_host(&self) -> Result<Vec<f32>, String> {
        if self.ptr == 0 {
            return Err("copying back a closed raw buffer".into());
        }
        let mut out = vec![0f32; self.len];
        // SAFETY: `out` holds `len` floats; `ptr` is our live allocation of `len` floats.
        ck(
            unsafe {
                sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), self.ptr, std::mem::size_of_val(&out[..]))
            },
            "cuMemcpyDtoH_v2",
        )?;
        Ok(out)
    }

    /// Frees the allocation; the streams that use it must have been synchronized. Idempotent.
    pub fn close(&mut self) -> Result<(), String> {
        release_once(&self.dev, &mut self.ptr, 0, |p| {
            // SAFETY: our allocation, released once; its owner has synchronized the streams that
            // used it.
            ck(unsafe { sys::cuMemFree_v2(p) }, "cuMemFree_v2")
        })
    }
}

/// A raw graph and its executable, destroyed on drop (or, with errors reported, by
/// [`RawGraph::destroy`]).
pub struct RawGraph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

impl RawGraph {
    /// Captures what `record` queues on `stream` into a graph (thread-local mode, like the
    /// framework's default), instantiates it (no flags) and uploads it on the stream (not waited
    /// for).
    pub fn capture(
        stream: &RawStream,
        record: impl FnOnce() -> Result<(), String>,
    ) -> Result<RawGraph, String> {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: a live stream of the current context.
        ck(unsafe { sys::cuStreamBeginCapture_v2(stream.as_raw(), mode) }, "cuStreamBeginCapture_v2")?;
        let recorded = record();
        let mut g = RawGraph { graph: std::ptr::null_mut(), exec: std::ptr::null_mut() };
        // SAFETY: the capturing stream; valid out-pointer. Always called, so the stream leaves
        // capture mode even if `record` failed.
        let ended =
            ck(unsafe { sys::cuStreamEndCapture(stream.as_raw(), &mut g.graph) }, "cuStreamEndCapture");
        recorded?;
        ended?;
        // SAFETY: our live graph; valid out-pointer.
        ck(
            unsafe { sys::cuGraphInstantiateWithFlags(&mut g.exec, g.graph, 0) },
            "cuGraphInstantiateWithFlags",
        )?;
        // SAFETY: our live executable graph and a live stream.
        ck(unsafe { sys::cuGraphUpload(g.exec, stream.as_raw()) }, "cuGraphUpload")?;
        Ok(g)
    }

    /// The graph (null once destroyed).
    pub fn graph(&self) -> sys::CUgraph {
        self.graph
    }

    /// The executable graph (null once destroyed).
    pub fn exec(&self) -> sys::CUgraphExec {
        self.exec
    }

    /// Queues one replay on `stream` (`cuGraphLaunch`).
    ///
    /// # Safety
    /// The graph has not been destroyed, and every buffer its nodes use stays allocated until the
    /// replay has completed.
    #[inline]
    pub unsafe fn launch(&self, stream: &RawStream) -> Result<(), String> {
        // SAFETY: live executable graph (the caller's contract) and stream; the caller keeps every
        // buffer its nodes use allocated until the replay has completed.
        ck(unsafe { sys::cuGraphLaunch(self.exec, stream.as_raw()) }, "cuGraphLaunch")
    }

    /// Destroys both handles, reporting the first failure. Idempotent.
    pub fn destroy(&mut self) -> Result<(), String> {
        let mut first = FirstError::default();
        if !self.exec.is_null() {
            // SAFETY: our executable graph; the driver defers destruction past in-flight launches.
            first.keep(ck(unsafe { sys::cuGraphExecDestroy(self.exec) }, "cuGraphExecDestroy"));
            self.exec = std::ptr::null_mut();
        }
        if !self.graph.is_null() {
            // SAFETY: our graph; executables made from it are independent of it.
            first.keep(ck(unsafe { sys::cuGraphDestroy(self.graph) }, "cuGraphDestroy"));
            self.graph = std::ptr::null_mut();
        }
        first.result()
    }
}

impl Drop for RawGraph {
    fn drop(&mut self) {
        let _ = self.destroy();
    }
}

// ---------------------------------------------------------------------------------------------
// The raw baseline for the tiny kernel
// ---------------------------------------------------------------------------------------------

/// The baseline: the tiny kernel loaded with `cuModuleLoadData`, a non-blocking stream, and
/// buffers of [`TINY_ELEMS`] floats with the number of launches each has seen. Every launch is on
/// the one stream, which [`TinyRaw::close`] (also run on drop) synchronizes before releasing
/// anything.
pub struct TinyRaw {
    bufs: Vec<RawBuffer>,
    launches: Vec<u64>,
    stream: RawStream,
    func: sys::CUfunction,
    module: RawModule,
    dev: Device,
}

impl TinyRaw {
    /// Loads `image` in `dev`'s primary context, looks up the kernel, creates a non-blocking
    /// stream, allocates `nbufs` buffers and uploads `init` into each. On error, whatever was
    /// created is released.
    pub fn new(dev: &Device, image: &TinyImage, nbufs: usize, init: &[f32]) -> Result<TinyRaw, String> {
        if init.len() != TINY_ELEMS {
            return Err(format!("raw upload: expected {TINY_ELEMS} floats, got {}", init.len()));
        }
        let module = RawModule::load(dev, image.bytes())?;
        let func = module.function(TINY_KERNEL)?;
        let stream = RawStream::non_blocking(dev)?;
        let mut side = TinyRaw {
            bufs: Vec::with_capacity(nbufs),
            launches: vec![0; nbufs],
            stream,
            func,
            module,
            dev: *dev,
        };
        for _ in 0..nbufs {
            side.bufs.push(RawBuffer::from_host(dev, init)?);
        }
        // Pageable host-to-device copies may return before the DMA has finished, and they run on
        // the legacy stream, which our non-blocking stream does not wait for: wait for the context.
        ctx_synchronize()?;
        Ok(side)
    }

    /// Queues one launch on buffer `k` without counting it (while the stream is being captured,
    /// the launch is only recorded: count the replays with [`TinyRaw::add_launches`]).
    #[inline(always)]
    pub fn enqueue(&self, k: usize) -> Result<(), String> {
        let mut x = self.bufs[k].ptr();
        let mut a = TINY_SCALE;
        let mut n = TINY_ELEMS as u64;
        let mut params: [*mut c_void; 3] = [
            (&mut x as *mut sys::CUdeviceptr).cast(),
            (&mut a as *mut f32).cast(),
            (&mut n as *mut u64).cast(),
        ];
        // SAFETY: `params` points to three live locals laid out as the kernel's
        // (float*, float, unsigned long long); the kernel writes x[i] only for i < n = TINY_ELEMS,
        // the size of buffer k, which stays allocated until `close` has synchronized the stream
        // (and, for captures, the owner destroys its graphs before `close`); live function and
        // stream of the current context.
        unsafe { launch_kernel(self.func, TINY_CFG, &self.stream, &mut params, "cuLaunchKernel") }
    }

    /// Queues one launch on buffer `k` and counts it.
    #[inline(always)]
    pub fn launch(&mut self, k: usize) -> Result<(), String> {
        self.enqueue(k)?;
        self.launches[k] += 1;
        Ok(())
    }

    /// Adds `n` launches to buffer `k`'s count (replays of captured launches).
    #[inline]
    pub fn add_launches(&mut self, k: usize, n: u64) {
        self.launches[k] += n;
    }

    /// The launches counted on buffer `k`.
    pub fn launches(&self, k: usize) -> u64 {
        self.launches[k]
    }

    /// How many buffers there are.
    pub fn buffer_count(&self) -> usize {
        self.bufs.len()
    }

    /// Buffer `k`.
    pub fn buffer(&self, k: usize) -> &RawBuffer {
        &self.bufs[k]
    }

    /// The stream every launch goes to.
    #[inline]
    pub fn stream(&self) -> &RawStream {
        &self.stream
    }

    /// Waits for the stream.
    #[inline]
    pub fn sync(&self) -> Result<(), String> {
        self.stream.sync()
    }

    /// Waits for the stream, then copies `buf` (written only by work on this stream) back.
    pub fn download(&self, buf: &RawBuffer) -> Result<Vec<f32>, String> {
        self.dev.bind().map_err(ctx("binding the primary context"))?;
        self.sync()?;
        buf.to_host()
    }

    /// Synchronizes and releases every handle, reporting the first failure (but releasing the
    /// rest regardless). Idempotent. Graphs that use the kernel must be destroyed before.
    pub fn close(&mut self) -> Result<(), String> {
        self.dev.bind().map_err(ctx("binding the primary context to release raw handles"))?;
        let mut first = FirstError::default();
        if !self.stream.as_raw().is_null() {
            first.keep(self.stream.sync());
        }
        for mut b in self.bufs.drain(..) {
            first.keep(b.close());
        }
        first.keep(self.stream.close());
        first.keep(self.module.close());
        self.func = std::ptr::null_mut();
        first.result()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_reference_converges_and_stays_finite() {
        let init = [0.5f32, 1.0, 1.4999];
        assert_eq!(tiny_reference(&init, 1)[1], TINY_SCALE.mul_add(1.0, 1.0));
        let far = tiny_reference(&init, 10_000_000);
        assert!(far.iter().all(|v| v.is_finite() && (*v - 1000.0).abs() < 1.0));
    }

    #[test]
    fn checker_catches_problems_and_tallies() {
        let init = vec![1.0f32; TINY_ELEMS];
        let mut c = TinyChecker::new(&init);
        let out = tiny_reference(&init, 5);
        assert!(c.check("t", &out, 5).is_ok());
        assert!(c.check("t", &out, 50).is_err());
        assert!(c.check("t", &init, 5).is_err());
        assert!(c.check("t", &init, 0).is_ok());
        let mut bad = out.clone();
        bad[3] = f32::NAN;
        assert!(c.check("t", &bad, 5).is_err());
        assert!(c.check("t", &out[..4], 5).is_err());
        assert_eq!((c.buffers, c.launches), (2, 5));
        assert!(c.worst < 1e-6);
    }

    #[test]
    fn first_error_keeps_the_first() {
        let mut f = FirstError::default();
        f.keep(Ok(()));
        f.keep(Err("a".into()));
        f.keep(Err("b".into()));
        assert_eq!(f.result(), Err("a".to_string()));
        assert_eq!(FirstError::default().result(), Ok(()));
    }
}
