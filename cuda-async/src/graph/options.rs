//! Options of a capture, and the capture with options (`CaptureOptions::scope`,
//! `CaptureOptions::record_fn`), as `std::thread::Builder` is to `std::thread::spawn`.

use super::{record, CudaGraph, Scope, NEXT_ID};
use crate::runtime::execute_locked;
use crate::{DeviceError, GraphNode, Result};
use cuda_core::{CaptureMode, InstantiateFlags, Stream};
use std::sync::atomic::Ordering;

/// How a graph is captured and instantiated: a builder whose [`scope`](CaptureOptions::scope)
/// captures with these options ([`CudaGraph::scope`] is `CaptureOptions::new().scope`).
///
/// - `mode`: the driver's capture mode. The default is [`CaptureMode::ThreadLocal`]: only the
///   capturing thread's potentially unsafe driver calls are refused, so other threads keep working
///   (ops of other threads wait for the capture anyway, through the execution lock). `Global` also
///   refuses such calls from every other thread; `Relaxed` refuses none.
/// - `flags`: instantiate flags (auto-free-on-launch, device-launch, use-node-priority; `UPLOAD` is
///   implied: every graph is uploaded right after instantiation).
/// - `warmup_runs`: how many times the op is run normally before it is captured (only for
///   [`CaptureOptions::record_fn`], which can build the op again), e.g. so that kernels are
///   compiled and loaded and caches are warm.
///
/// ```no_run
/// # fn main() -> cuda_async::Result<()> {
/// use cuda_async::{memory, CaptureOptions, DeviceOpExt};
/// use cuda_core::{CaptureMode, Device, DeviceBuffer, InstantiateFlags, Stream};
/// let s = Stream::new(&Device::new(0)?)?;
/// let (src, dst) = (DeviceBuffer::filled(&s, 64, 1u32)?, DeviceBuffer::zeros(&s, 64)?);
/// let graph = CaptureOptions::new()
///     .mode(CaptureMode::Global)
///     .flags(InstantiateFlags::USE_NODE_PRIORITY)
///     .scope(&s, |scope| scope.record(memory::copy(&src, dst)))?;
/// graph.launch().sync_on(&s)?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureOptions {
    /// The capture mode.
    pub mode: CaptureMode,
    /// Instantiate flags.
    pub flags: InstantiateFlags,
    /// Normal runs before the capture.
    pub warmup_runs: usize,
}

impl Default for CaptureOptions {
    fn default() -> Self {
        CaptureOptions::new()
    }
}

impl CaptureOptions {
    /// The default options: thread-local capture mode, no instantiate flags, no warm-up runs.
    pub const fn new() -> Self {
        CaptureOptions { mode: CaptureMode::ThreadLocal, flags: InstantiateFlags::NONE, warmup_runs: 0 }
    }

    /// Sets the capture mode.
    pub fn mode(mut self, mode: CaptureMode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets the instantiate flags.
    pub fn flags(mut self, flags: InstantiateFlags) -> Self {
        self.flags = flags;
        self
    }

    /// Sets the number of warm-up runs (used by [`CaptureOptions::record_fn`]).
    pub fn warmup_runs(mut self, n: usize) -> Self {
        self.warmup_runs = n;
        self
    }

    /// [`CudaGraph::scope`] with these options: captures everything `f` records into one graph on
    /// `stream`, then instantiates and uploads it with these flags. A closure runs once, so it
    /// cannot be warmed up: use [`CaptureOptions::record_fn`] for warm-up runs.
    ///
    /// # Errors
    /// [`DeviceError::Misuse`] if `warmup_runs > 0` (nothing is run or captured); otherwise as for
    /// [`CudaGraph::scope`].
    pub fn scope<T>(
        self,
        stream: &Stream,
        f: impl FnOnce(&mut Scope<'_>) -> Result<T>,
    ) -> Result<CudaGraph<T>> {
        if self.warmup_runs > 0 {
            return Err(DeviceError::Misuse(
                "warm-up runs need an op that can be built again: use CaptureOptions::record_fn".into(),
            ));
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let (graph, output) = record(stream, &self, id, f)?;
        CudaGraph::build(stream, self, graph, output, id)
    }

    /// Runs `make()` normally `warmup_runs` times on `stream` (waiting for each), then records
    /// `make()` into a graph as [`CaptureOptions::scope`] does.
    ///
    /// # Errors
    /// Errors of the warm-up runs; otherwise as for [`CudaGraph::scope`].
    ///
    /// ```no_run
    /// # fn demo<O: cuda_async::GraphNode>(s: &cuda_core::Stream, make: impl FnMut() -> O) -> cuda_async::Result<()>
    /// # where O::Output: Sync {
    /// use cuda_async::{CaptureOptions, DeviceOpExt};
    /// // `make` builds the op: it runs three times, then a fourth build is recorded.
    /// let graph = CaptureOptions::new().warmup_runs(3).record_fn(s, make)?;
    /// graph.launch().sync_on(s)?;
    /// # Ok(()) }
    /// ```
    pub fn record_fn<O: GraphNode>(
        self,
        stream: &Stream,
        mut make: impl FnMut() -> O,
    ) -> Result<CudaGraph<O::Output>> {
        for _ in 0..self.warmup_runs {
            execute_locked(make(), stream, "CaptureOptions::record_fn inside another op's execution")?;
            stream.synchronize()?;
        }
        CaptureOptions { warmup_runs: 0, ..self }.scope(stream, |s| s.record(make()))
    }
}
