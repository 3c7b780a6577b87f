//! Run-time compilation of CUDA C with NVRTC, and the kernel cache.
//!
//! NVRTC is not part of the driver: `libnvrtc.so` comes with the CUDA toolkit or the
//! `nvidia-cuda-nvrtc` Python wheel. Without it, compiling fails with [`crate::error::Error::NvrtcMissing`]
//! and everything else keeps working.

mod cache;
mod compile;
mod result;

pub use cache::{CacheOrigin, CompiledKernel, KernelCache};
pub use compile::{compile_cubin, nvrtc_version};

use crate::device::Device;
use crate::error::Result;
use crate::module::CudaModule;

impl Device {
    /// Compiles `source` for this device through the global [`KernelCache`] and loads it.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::nvrtc::{CacheOrigin, KernelCache};
    /// const SRC: &str = r#"extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }"#;
    /// let dev = cuda_core::Device::new(0)?;
    /// let k = dev.compile_module("k.cu", SRC, &["--use_fast_math".to_string()])?.function("k")?;
    /// // The same source and options again: served from the process's memory cache.
    /// let again = KernelCache::global().compile(&dev, "k.cu", SRC, &["--use_fast_math".to_string()])?;
    /// assert_eq!(again.origin, CacheOrigin::Memory);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`crate::nvrtc::compile_cubin`] and [`CudaModule::from_cubin`].
    pub fn compile_module(&self, program: &str, source: &str, options: &[String]) -> Result<CudaModule> {
        let compiled = KernelCache::global().compile(self, program, source, options)?;
        CudaModule::from_cubin(self, &compiled.image)
    }
}
