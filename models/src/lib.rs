//! Models built on `cuda-async`, shared by the example programs and the GPU test suite.

pub mod llama;
pub mod mlp;

/// The `half` crate, whose `bf16` is the element type of the Llama weights
/// (`models::llama::DeviceWeights` is `Weights<DeviceBuffer<bf16>>`): the same as
/// `cuda_core::half`, so `use models::half::bf16;` needs no `half` dependency of your own.
pub use cuda_core::half;
