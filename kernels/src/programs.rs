//! Every NVRTC program of this crate — name, whole source and options — in one list: the loaders
//! ([`crate::Kernels::get`], [`crate::llama::LlamaKernels::get`], [`crate::gemv::Gemv::get`],
//! [`crate::sample::Sampler::get`]) compile exactly these, and the `nvrtc_kernels` suite compiles
//! each of them with NVRTC for the H100's architecture on a machine without a GPU (NVRTC needs no
//! driver), so a kernel that does not compile fails CI, not the GPU host.
//!
//! ```
//! let names: Vec<_> = kernels::programs::all().iter().map(|p| p.name).collect();
//! assert!(names.contains(&"llama.cu") && names.contains(&"sample.cu"));
//! ```

use crate::gemv::GEMV_SRC;
use crate::llama::{BF16_SRC, LLAMA_SRC, PREFILL_SRC};
use crate::sample::SAMPLE_SRC;
use crate::{ELEMENTWISE_SRC, LINEAR_SRC, REDUCE_SRC};
use std::borrow::Cow;

/// One NVRTC program: what [`cuda_core::Device::compile_module`] is given.
#[derive(Debug, Clone)]
pub struct Program {
    /// The program's name in NVRTC's diagnostics (and the kernel cache's key).
    pub name: &'static str,
    /// The whole source (headers such as `bf16.cuh` prepended).
    pub source: Cow<'static, str>,
    /// NVRTC options besides the target architecture.
    pub options: Vec<String>,
}

fn program(name: &'static str, source: Cow<'static, str>) -> Program {
    Program { name, source, options: vec!["-std=c++17".into()] }
}

/// The elementwise kernels (fill, scale, axpy, add, mul).
pub fn elementwise() -> Program {
    program("elementwise.cu", Cow::Borrowed(ELEMENTWISE_SRC))
}

/// The sums.
pub fn reduce() -> Program {
    program("reduce.cu", Cow::Borrowed(REDUCE_SRC))
}

/// The fully connected layer.
pub fn linear() -> Program {
    program("linear.cu", Cow::Borrowed(LINEAR_SRC))
}

/// The decoder's kernels, the chunked-prefill kernels included.
pub fn llama() -> Program {
    program("llama.cu", Cow::Owned(format!("{BF16_SRC}{LLAMA_SRC}{PREFILL_SRC}")))
}

/// The fused small-batch bf16 products.
pub fn gemv() -> Program {
    program("gemv.cu", Cow::Owned(format!("{BF16_SRC}{GEMV_SRC}")))
}

/// The per-row sampler.
pub fn sample() -> Program {
    program("sample.cu", Cow::Borrowed(SAMPLE_SRC))
}

/// Every program of the crate.
pub fn all() -> Vec<Program> {
    vec![elementwise(), reduce(), linear(), llama(), gemv(), sample()]
}
