//! The tiny kernel both sides of a comparison launch: a counter, `x[i] += 1` over 32 `u64`s in
//! one block of 32 threads. After `n` launches every value is exactly its initial value plus `n`,
//! so a skipped (or extra) launch shows in the check, however many launches ran.

use anyhow::{ensure, Context, Result};
use cuda_async::{DeviceOp, ExecutionContext, GraphNode};
use cuda_core::nvrtc::{CompiledKernel, KernelCache};
use cuda_core::{CudaModule, Device, DeviceBuffer, Function, LaunchConfig, Stream};
use rand::Rng;

/// The kernel. `n` bounds the index; one block of [`ELEMS`] threads touches at most 32 values.
pub const TINY_SRC: &str = r#"extern "C" __global__ void tiny(unsigned long long* x, unsigned int inc, unsigned long long n) {
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += inc;
}
"#;
/// Values per buffer.
pub const ELEMS: usize = 32;
/// What one launch adds to each value.
pub const INC: u32 = 1;
/// One block of [`ELEMS`] threads.
pub const CFG: LaunchConfig =
    LaunchConfig { grid: (1, 1, 1), block: (ELEMS as u32, 1, 1), shared_mem_bytes: 0 };

/// Random initial values (far from wrapping).
pub fn init_values(rng: &mut impl Rng) -> Vec<u64> {
    (0..ELEMS).map(|_| rng.random_range(0..1u64 << 40)).collect()
}

/// The kernel compiled once (cuda-core's NVRTC) to a CUBIN that both sides load.
pub struct TinyImage(pub CompiledKernel);

impl TinyImage {
    /// Compiles [`TINY_SRC`] for `dev` (memory-only cache).
    pub fn compile(dev: &Device) -> Result<TinyImage> {
        let k = KernelCache::memory_only().compile(dev, "tiny.cu", TINY_SRC, &[]);
        Ok(TinyImage(k.context("compiling the tiny kernel with NVRTC")?))
    }

    /// The CUBIN.
    pub fn bytes(&self) -> &[u8] {
        &self.0.image
    }

    /// Loads it for the framework side (`CudaModule::from_cubin`).
    pub fn load(&self, dev: &Device) -> Result<TinyFunction> {
        let module = CudaModule::from_cubin(dev, self.bytes()).context("CudaModule::from_cubin")?;
        Ok(TinyFunction(module.function("tiny").context("CudaModule::function")?))
    }
}

/// The `tiny` kernel as loaded by [`TinyImage::load`] (so its signature is known).
#[derive(Clone)]
pub struct TinyFunction(Function);

impl TinyFunction {
    /// Queues one launch on `buf` through cuda-core (no op machinery).
    #[inline]
    pub fn launch(&self, stream: &Stream, buf: &mut DeviceBuffer<u64>) -> cuda_core::Result<()> {
        let n = buf.len() as u64;
        // SAFETY: `tiny(unsigned long long* x, unsigned int inc, unsigned long long n)` takes
        // exactly (&mut DeviceBuffer<u64>, u32, u64); it writes x[i] only for i < n = buf.len(),
        // through the exclusive buffer, which `launch` orders and (when capturing) keeps alive.
        unsafe { self.0.launch(stream, CFG, (buf, INC, n)) }
    }

    /// The loaded function.
    pub fn function(&self) -> &Function {
        &self.0
    }
}

/// One launch as a `cuda-async` op and graph node.
pub struct Tiny<'a> {
    pub func: &'a TinyFunction,
    pub buf: &'a mut DeviceBuffer<u64>,
}

impl DeviceOp for Tiny<'_> {
    type Output = ();

    #[inline]
    fn execute(self, ctx: &ExecutionContext<'_>) -> cuda_async::Result<()> {
        Ok(self.func.launch(ctx.stream(), self.buf)?)
    }
}

// SAFETY: `execute` queues exactly one kernel launch on an existing buffer through
// `Function::launch` (which records the buffer with a capture): no allocation, free, host
// callback or synchronisation, so it can be recorded and replayed.
unsafe impl GraphNode for Tiny<'_> {}

/// A framework buffer with the number of launches that ran on it.
pub struct Counted {
    pub buf: DeviceBuffer<u64>,
    pub launches: u64,
}

impl Counted {
    /// A buffer holding `init`, home `stream`, no launches yet.
    pub fn new(stream: &Stream, init: &[u64]) -> Result<Counted> {
        Ok(Counted {
            buf: DeviceBuffer::from_host(stream, init).context("DeviceBuffer::from_host")?,
            launches: 0,
        })
    }

    /// One launch on the buffer, as an op (count it separately).
    pub fn op<'a>(&'a mut self, func: &'a TinyFunction) -> Tiny<'a> {
        Tiny { func, buf: &mut self.buf }
    }
}

/// Checks result buffers: every value must equal its initial value plus the launch count.
pub struct Checker {
    init: Vec<u64>,
    buffers: usize,
    launches: u64,
}

impl Checker {
    /// For buffers that all started as `init`.
    pub fn new(init: &[u64]) -> Checker {
        Checker { init: init.to_vec(), buffers: 0, launches: 0 }
    }

    /// Checks one buffer (`what` names it in errors).
    pub fn check(&mut self, what: &str, got: &[u64], launches: u64) -> Result<()> {
        ensure!(got.len() == self.init.len(), "{what}: {} values, expected {}", got.len(), self.init.len());
        for (i, (&g, &x0)) in got.iter().zip(&self.init).enumerate() {
            let seen = g.wrapping_sub(x0) / u64::from(INC);
            ensure!(seen == launches, "{what}: value [{i}] saw {seen} launches, {launches} were queued");
        }
        self.buffers += 1;
        self.launches += launches;
        Ok(())
    }

    /// Copies framework buffers back and checks them as `{group} {k}`.
    pub fn counted<'b>(&mut self, group: &str, bufs: impl IntoIterator<Item = &'b Counted>) -> Result<()> {
        for (k, c) in bufs.into_iter().enumerate() {
            let got = c.buf.to_vec().context("DeviceBuffer::to_vec")?;
            self.check(&format!("{group} {k}"), &got, c.launches)?;
        }
        Ok(())
    }

    /// What was checked, in words.
    pub fn summary(&self) -> String {
        format!(
            "{} counter buffers, {} launches in all, every value exactly its initial value plus its launch count",
            self.buffers, self.launches
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn checker_detects_one_missing_launch() {
        let init = init_values(&mut rand::rngs::SmallRng::seed_from_u64(1));
        let mut c = Checker::new(&init);
        let after = |n: u64| init.iter().map(|&x| x + n * u64::from(INC)).collect::<Vec<_>>();
        assert!(c.check("t", &after(1_000_000), 1_000_000).is_ok());
        assert!(c.check("t", &after(999_999), 1_000_000).is_err());
        assert!(c.check("t", &after(5), 4).is_err());
        let mut one_off = after(7);
        one_off[31] -= 1;
        assert!(c.check("t", &one_off, 7).is_err());
        assert!(c.check("t", &init[..4], 0).is_err());
        assert!(c.check("t", &init, 0).is_ok());
        assert!(c.summary().starts_with("2 counter buffers, 1000000 launches"));
    }
}
