//! Run-time compilation of CUDA C with NVRTC, and the kernel cache.
//!
//! NVRTC is not part of the driver: `libnvrtc.so` comes with the CUDA toolkit or the
//! `nvidia-cuda-nvrtc` Python wheel. Without it, compiling fails with [`crate::Error::NvrtcMissing`]
//! and everything else keeps working.

mod cache;
mod compile;

pub use cache::{CacheOrigin, CompiledKernel, KernelCache};
pub use compile::{compile_cubin, nvrtc_version};

use crate::device::Device;
use crate::error::Result;
use crate::module::CudaModule;

impl Device {
    /// Compiles `source` for this device through the global [`KernelCache`] and loads it.
    ///
    /// # Errors
    /// As for [`crate::nvrtc::compile_cubin`] and [`CudaModule::from_cubin`].
    pub fn compile_module(&self, program: &str, source: &str, options: &[String]) -> Result<CudaModule> {
        let compiled = KernelCache::global().compile(self, program, source, options)?;
        CudaModule::from_cubin(self, &compiled.image)
    }
}
