//! A Llama-style decoder in bf16 (RMSNorm, rotary embeddings with Llama 3 scaling, grouped-query
//! attention over a KV cache, SwiGLU MLP, tied or untied embeddings), with weights in Hugging
//! Face's safetensors layout, GEMMs on cuBLAS and the rest on this workspace's NVRTC kernels
//! ([`kernels::llama`]). One decode step of a batch is one CUDA graph replay; graphs are captured
//! per batch-size bucket into a cache with a memory budget ([`LlamaModel`]).
//!
//! Prompts are fed either one token per step (each step appends one position per row), so a
//! request's prompt can ride along other requests' decode steps (continuous batching), or in
//! chunks ([`LlamaModel::prefill`]): one graph replay per chunk-size bucket, GEMMs over all the
//! chunk's rows and a causal attention over the cache.

mod config;
mod model;
mod sampling;
mod step;
mod weights;

pub use config::{Llama3Rope, LlamaConfig};
pub use model::{BucketInfo, LlamaModel, ModelOptions, PrefillBuffers, PrefillSeq, Row};
pub use sampling::Sampling;
pub use step::{KvCache, StepBuffers};
pub use weights::{
    write_random_safetensors, DeviceWeights, Elements, HostWeights, Layer, LoadError, Weights,
};
