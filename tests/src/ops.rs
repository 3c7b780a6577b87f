//! Test-only kernels and ops: a kernel that runs for a chosen time then writes, and an add-scalar
//! kernel, wrapped as `DeviceOp`s over any buffer argument (both are `GraphNode`s: they can be recorded
//! into a CUDA graph).

use cuda_async::{BufferMut, DeviceOp, ExecutionContext, Result};
use cuda_core::{Device, Function, LaunchConfig};

/// CUDA C of the test kernels.
pub const SRC: &str = r#"
extern "C" __global__ void spin_write(float* out, unsigned long long n, unsigned long long ns, float v) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    now = start;
    while (now - start < ns) {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    }
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = v;
}
extern "C" __global__ void add_scalar(float* x, unsigned long long n, float v) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        x[i] += v;
}
"#;

/// The loaded test kernels of one device.
pub struct TestKernels {
    spin_write: Function,
    add_scalar: Function,
}

/// The test kernels on `device`, compiled once.
pub fn test_kernels(device: &Device) -> cuda_core::Result<&'static TestKernels> {
    static K: cuda_core::PerDevice<TestKernels> = cuda_core::PerDevice::new();
    K.get_or_try_init(device, || {
        let m = device.compile_module("test_ops.cu", SRC, &[])?;
        Ok(TestKernels { spin_write: m.function("spin_write")?, add_scalar: m.function("add_scalar")? })
    })
}

fn cfg(n: usize) -> LaunchConfig {
    let mut c = LaunchConfig::for_elements(n, 256);
    c.grid.0 = c.grid.0.min(1024);
    c
}

/// Spins on the GPU for `ns` nanoseconds, then sets every element of `buf` to `v`; yields `buf`.
pub struct SpinWrite<B> {
    /// The buffer written.
    pub buf: B,
    /// How long to spin first.
    pub ns: u64,
    /// The value written.
    pub v: f32,
}

impl<B: BufferMut<f32>> DeviceOp for SpinWrite<B> {
    type Output = B;
    fn execute(mut self, ctx: &ExecutionContext<'_>) -> Result<B> {
        let k = test_kernels(ctx.device())?;
        let b = self.buf.buffer_mut();
        let n = b.len();
        // SAFETY: matches spin_write(float*, u64, u64, float); writes out[0..n] only; `b` is
        // borrowed mutably.
        unsafe { k.spin_write.launch(ctx.stream(), cfg(n), (b, n as u64, self.ns, self.v))? };
        Ok(self.buf)
    }
}

/// Adds `v` to every element of `buf`; yields `buf`.
pub struct AddScalar<B> {
    /// The buffer updated in place.
    pub buf: B,
    /// The value added.
    pub v: f32,
}

impl<B: BufferMut<f32>> DeviceOp for AddScalar<B> {
    type Output = B;
    fn execute(mut self, ctx: &ExecutionContext<'_>) -> Result<B> {
        let k = test_kernels(ctx.device())?;
        let b = self.buf.buffer_mut();
        let n = b.len();
        // SAFETY: matches add_scalar(float*, u64, float); touches x[0..n] only; `b` is exclusive.
        unsafe { k.add_scalar.launch(ctx.stream(), cfg(n), (b, n as u64, self.v))? };
        Ok(self.buf)
    }
}

// SAFETY: one kernel launch over the existing buffer `buf` (not a lazy op: nothing else runs); it
// allocates, frees and synchronises nothing, so it may be recorded into a graph.
unsafe impl<B: BufferMut<f32>> cuda_async::GraphNode for SpinWrite<B> {}

// SAFETY: as for `SpinWrite`: one kernel launch over an existing buffer.
unsafe impl<B: BufferMut<f32>> cuda_async::GraphNode for AddScalar<B> {}
