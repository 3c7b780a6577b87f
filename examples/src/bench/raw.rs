//! The raw baseline: the same work through cudarc's thin `result` layer over the driver API
//! (`cuModuleLoadData`, `cuStreamCreate`, `cuMemAlloc`, `cuLaunchKernel`, stream capture,
//! `cuGraphLaunch`...), with no framework in between. [`Raw`] owns every handle it creates and
//! releases them all in [`Raw::close`] (errors reported) or on drop. It always loads the tiny
//! counter kernel and keeps its counter buffers with the number of launches queued on each.

use crate::bench::tiny::{Checker, TinyImage, CFG, ELEMS, INC};
use anyhow::{Context, Result};
use cuda_core::{Device, DeviceRepr, LaunchConfig};
use cudarc::driver::result as cu;
use cudarc::driver::sys;
use std::cell::RefCell;
use std::ffi::{c_void, CString};

/// A kernel parameter for `cuLaunchKernel`: a pointer to the value.
#[inline(always)]
pub fn param<T>(v: &mut T) -> *mut c_void {
    (v as *mut T).cast()
}

/// A captured, instantiated and uploaded graph.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RawGraph {
    pub graph: sys::CUgraph,
    pub exec: sys::CUgraphExec,
}

/// Driver handles in a device's primary context: one non-blocking stream, modules, buffers and
/// graphs; the tiny kernel and its counter buffers.
pub struct Raw {
    dev: Device,
    stream: sys::CUstream,
    modules: Vec<sys::CUmodule>,
    bufs: Vec<sys::CUdeviceptr>,
    graphs: RefCell<Vec<RawGraph>>,
    tiny: sys::CUfunction,
    counters: Vec<sys::CUdeviceptr>,
    /// Launches queued on each counter buffer.
    pub launches: Vec<u64>,
}

impl Raw {
    /// Binds `dev`'s primary context, creates a non-blocking stream in it, loads the tiny kernel
    /// and allocates `counters` buffers holding `init`.
    pub fn new(dev: &Device, image: &TinyImage, counters: usize, init: &[u64]) -> Result<Raw> {
        dev.bind().context("binding the primary context for the raw side")?;
        let stream = cu::stream::create(cu::stream::StreamKind::NonBlocking).context("cuStreamCreate")?;
        let (modules, bufs, graphs, tiny) = (vec![], vec![], RefCell::default(), std::ptr::null_mut());
        let mut raw =
            Raw { dev: *dev, stream, modules, bufs, graphs, tiny, counters: vec![], launches: vec![] };
        raw.tiny = raw.load(image.bytes(), "tiny")?;
        raw.counters = (0..counters).map(|_| raw.upload(init)).collect::<Result<_>>()?;
        raw.launches = vec![0; counters];
        Ok(raw)
    }

    /// Loads a CUBIN and looks up kernel `name`, valid until [`Raw::close`].
    pub fn load(&mut self, image: &[u8], name: &str) -> Result<sys::CUfunction> {
        // The driver reads the image in place and may assume ELF alignment: copy it into u64s.
        let mut aligned = vec![0u64; image.len().div_ceil(8)];
        for (w, c) in aligned.iter_mut().zip(image.chunks(8)) {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            *w = u64::from_ne_bytes(b);
        }
        // SAFETY: the complete CUBIN at an 8-byte aligned address, alive across the call.
        let module = unsafe { cu::module::load_data(aligned.as_ptr().cast()) }.context("cuModuleLoadData")?;
        self.modules.push(module);
        // SAFETY: a live module of ours.
        unsafe { cu::module::get_function(module, CString::new(name)?) }.context("cuModuleGetFunction")
    }

    /// Allocates a buffer holding `data` (`cuMemAlloc`; with `CUDA_ASYNC_BENCH_RAW_POOL` set, from
    /// the stream-ordered pool like the framework's, to separate allocator effects) and waits for
    /// the copy. Freed by [`Raw::close`].
    pub fn upload<T: DeviceRepr>(&mut self, data: &[T]) -> Result<sys::CUdeviceptr> {
        let bytes = std::mem::size_of_val(data);
        // SAFETY: plain allocations in the current context; the legacy stream is synchronized
        // before the pooled one is used elsewhere; `data` holds `bytes` bytes.
        unsafe {
            let ptr = if std::env::var_os("CUDA_ASYNC_BENCH_RAW_POOL").is_some() {
                cu::malloc_async(cu::stream::null(), bytes).context("cuMemAllocAsync")?
            } else {
                cu::malloc_sync(bytes).context("cuMemAlloc")?
            };
            self.bufs.push(ptr);
            cu::memcpy_htod_sync(ptr, data).context("cuMemcpyHtoD")?;
            // Pageable copies run on the legacy stream, which our stream does not wait for.
            cu::ctx::synchronize().context("cuCtxSynchronize")?;
            Ok(ptr)
        }
    }

    /// Waits for the stream, then copies `len` values of buffer `ptr` back.
    pub fn download<T: DeviceRepr + Default>(&self, ptr: sys::CUdeviceptr, len: usize) -> Result<Vec<T>> {
        self.dev.bind()?;
        self.sync()?;
        let mut out = vec![T::default(); len];
        // SAFETY: `ptr` is one of our live buffers of at least `len` values of `T`.
        unsafe { cu::memcpy_dtoh_sync(&mut out, ptr) }.context("cuMemcpyDtoH")?;
        Ok(out)
    }

    /// Queues `f` on the stream (`cuLaunchKernel`).
    ///
    /// # Safety
    /// `f` is a function of [`Raw::load`]; `params` point to live values of the kernel's parameter
    /// types, in order; the kernel accesses only live buffers, within bounds.
    #[inline(always)]
    pub unsafe fn launch_kernel(
        &self,
        f: sys::CUfunction,
        cfg: LaunchConfig,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        // SAFETY: the caller's contract; our live stream.
        unsafe { cu::launch_kernel(f, cfg.grid, cfg.block, cfg.shared_mem_bytes, self.stream, params) }
            .context("cuLaunchKernel")
    }

    /// Waits for the stream.
    #[inline]
    pub fn sync(&self) -> Result<()> {
        // SAFETY: our live stream.
        unsafe { cu::stream::synchronize(self.stream) }.context("cuStreamSynchronize")
    }

    /// Captures what `record` queues on the stream (thread-local mode, like the framework's
    /// default), instantiates it (no flags) and uploads it (not waited for).
    pub fn capture(&self, record: impl FnOnce() -> Result<()>) -> Result<RawGraph> {
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: our live stream; capture is always ended, even if `record` fails.
        unsafe { cu::stream::begin_capture(self.stream, mode) }.context("cuStreamBeginCapture")?;
        let recorded = record();
        // SAFETY: the capturing stream.
        let graph = unsafe { cu::stream::end_capture(self.stream) }.context("cuStreamEndCapture")?;
        self.graphs.borrow_mut().push(RawGraph { graph, exec: std::ptr::null_mut() });
        recorded?;
        // SAFETY: our live graph; our live stream.
        let exec = unsafe { cu::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) }
            .context("cuGraphInstantiateWithFlags")?;
        let g = RawGraph { graph, exec };
        *self.graphs.borrow_mut().last_mut().expect("pushed above") = g;
        // SAFETY: our live executable graph and stream.
        unsafe { cu::graph::upload(exec, self.stream) }.context("cuGraphUpload")?;
        Ok(g)
    }

    /// Queues one replay of `g` (`cuGraphLaunch`).
    ///
    /// # Safety
    /// `g` is a live graph of ours (not destroyed) whose nodes use only our live buffers.
    #[inline(always)]
    pub unsafe fn replay(&self, g: &RawGraph) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { cu::graph::launch(g.exec, self.stream) }.context("cuGraphLaunch")
    }

    /// Destroys `g` now (the driver defers it past in-flight replays).
    pub fn destroy(&self, g: RawGraph) -> Result<()> {
        self.graphs.borrow_mut().retain(|x| *x != g);
        destroy_graph(g)
    }

    fn release(&mut self) -> Result<()> {
        let mut first: Result<()> = Ok(());
        let mut keep = |r: Result<()>| {
            if first.is_ok() {
                first = r;
            }
        };
        keep(self.dev.bind().context("binding the primary context to release raw handles"));
        if !self.stream.is_null() {
            keep(self.sync());
        }
        // Each handle below is ours and released once (the lists are emptied); the stream has been
        // synchronized, so nothing in flight uses them.
        for g in self.graphs.take() {
            keep(destroy_graph(g));
        }
        for p in std::mem::take(&mut self.bufs) {
            // SAFETY: our allocation, freed once, with no work in flight (see above).
            keep(unsafe { cu::free_sync(p) }.context("cuMemFree"));
        }
        if !self.stream.is_null() {
            let stream = std::mem::replace(&mut self.stream, std::ptr::null_mut());
            // SAFETY: our stream, destroyed once (nulled above), synchronized.
            keep(unsafe { cu::stream::destroy(stream) }.context("cuStreamDestroy"));
        }
        for m in std::mem::take(&mut self.modules) {
            // SAFETY: our module, unloaded once; no kernel of it is in flight (synchronized).
            keep(unsafe { cu::module::unload(m) }.context("cuModuleUnload"));
        }
        first
    }

    /// Synchronizes and releases everything, reporting the first failure.
    pub fn close(mut self) -> Result<()> {
        self.release()
    }
}

fn destroy_graph(g: RawGraph) -> Result<()> {
    // SAFETY: our graph handles, destroyed once; executables are independent of their graph.
    unsafe {
        if !g.exec.is_null() {
            cu::graph::exec_destroy(g.exec).context("cuGraphExecDestroy")?;
        }
        cu::graph::destroy(g.graph).context("cuGraphDestroy")
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.release();
    }
}

impl Raw {
    /// Queues one launch on counter buffer `k` without counting it (for captures: count replays).
    #[inline(always)]
    pub fn enqueue(&self, k: usize) -> Result<()> {
        let (mut x, mut inc, mut n) = (self.counters[k], INC, ELEMS as u64);
        // SAFETY: `tiny(unsigned long long*, unsigned int, unsigned long long)` gets pointers to
        // values of those types; it writes x[i] for i < n = ELEMS, the size of buffer k, which
        // lives until `close` (after the stream is synchronized and the graphs are gone).
        unsafe { self.launch_kernel(self.tiny, CFG, &mut [param(&mut x), param(&mut inc), param(&mut n)]) }
    }

    /// Queues one launch on counter buffer `k` and counts it.
    #[inline(always)]
    pub fn launch(&mut self, k: usize) -> Result<()> {
        self.enqueue(k)?;
        self.launches[k] += 1;
        Ok(())
    }

    /// Checks every counter buffer as `raw {k}`.
    pub fn check(&self, c: &mut Checker) -> Result<()> {
        for (k, (&p, &n)) in self.counters.iter().zip(&self.launches).enumerate() {
            c.check(&format!("raw {k}"), &self.download::<u64>(p, ELEMS)?, n)?;
        }
        Ok(())
    }
}
