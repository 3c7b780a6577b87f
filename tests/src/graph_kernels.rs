//! Test kernels for explicitly built graphs: a WHILE-loop step, a loop initialiser, and raw
//! pointer copies for graph-owned memory.

use cuda_core::{Device, Function};

/// CUDA C of the kernels.
pub const SRC: &str = r#"
extern "C" __global__ void loop_init(const unsigned* limit, unsigned* flag) {
    if (threadIdx.x == 0 && blockIdx.x == 0) *flag = 0u < *limit ? 1u : 0u;
}
// One block: every thread adds 1 to its elements of acc; then thread 0 counts the iteration and
// decides whether the loop goes on.
extern "C" __global__ void loop_step(unsigned* counter, const unsigned* limit, unsigned* flag, float* acc, unsigned long long n) {
    for (unsigned long long i = threadIdx.x; i < n; i += blockDim.x) acc[i] += 1.0f;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned c = *counter + 1u;
        *counter = c;
        *flag = c < *limit ? 1u : 0u;
    }
}
extern "C" __global__ void copy_raw(const float* src, float* dst, unsigned long long n) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}
extern "C" __global__ void iota_raw(float* dst, unsigned long long n, float base) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        dst[i] = base + (float)i;
}
"#;

/// The loaded kernels of one device.
pub struct GraphKernels {
    /// `loop_init(const unsigned* limit, unsigned* flag)`
    pub loop_init: Function,
    /// `loop_step(unsigned* counter, const unsigned* limit, unsigned* flag, float* acc, u64 n)`
    pub loop_step: Function,
    /// `copy_raw(const float* src, float* dst, u64 n)`
    pub copy_raw: Function,
    /// `iota_raw(float* dst, u64 n, float base)`
    pub iota_raw: Function,
}

/// The kernels on `device`, compiled once.
pub fn graph_kernels(device: &Device) -> cuda_core::Result<&'static GraphKernels> {
    static K: cuda_core::PerDevice<GraphKernels> = cuda_core::PerDevice::new();
    K.get_or_try_init(device, || {
        let m = device.compile_module("graph_kernels.cu", SRC, &[])?;
        Ok(GraphKernels {
            loop_init: m.function("loop_init")?,
            loop_step: m.function("loop_step")?,
            copy_raw: m.function("copy_raw")?,
            iota_raw: m.function("iota_raw")?,
        })
    })
}
