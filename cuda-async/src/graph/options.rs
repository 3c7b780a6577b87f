//! Options of a capture.

use cuda_core::{CaptureMode, InstantiateFlags};

/// How a graph is captured and instantiated.
///
/// - `mode`: the driver's capture mode. The default is [`CaptureMode::ThreadLocal`]: only the
///   capturing thread's potentially unsafe driver calls are refused, so other threads keep working
///   (ops of other threads wait for the capture anyway, through the execution lock). `Global` also
///   refuses such calls from every other thread; `Relaxed` refuses none.
/// - `flags`: instantiate flags (auto-free-on-launch, device-launch, use-node-priority; `UPLOAD` is
///   implied: every graph is uploaded right after instantiation).
/// - `warmup_runs`: how many times the op is run normally before it is captured (only for
///   [`crate::graph::CudaGraph::capture_fn`], which can build the op again), e.g. so that
///   kernels are compiled and loaded and caches are warm.
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
        CaptureOptions { mode: CaptureMode::ThreadLocal, flags: InstantiateFlags::NONE, warmup_runs: 0 }
    }
}

impl CaptureOptions {
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

    /// Sets the number of warm-up runs.
    pub fn warmup_runs(mut self, n: usize) -> Self {
        self.warmup_runs = n;
        self
    }
}
