//! Models built on `cuda-async`, shared by the example programs and the GPU test suite.

pub mod llama;
pub mod mlp;
