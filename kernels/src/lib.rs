//! CUDA C kernels compiled at run time by NVRTC, with typed, safe launchers.
//!
//! The sources are embedded in the binary (`include_str!`) and compiled once per device through
//! `cuda-core`'s kernel cache (memory, then disk). Each launcher checks lengths and devices, takes
//! inputs by `&` and outputs by `&mut`, and launches a grid-stride kernel that touches exactly the
//! elements `0..len`, so safe callers cannot cause an out-of-bounds access or a data race.
//!
//! Sizes: the elementwise kernels and the sum take the element count as a 64-bit integer and
//! index and stride in 64 bits over a grid capped at 32 blocks per multiprocessor, so they work on
//! buffers of any length, more than `u32::MAX` elements included. The decoder kernels
//! ([`llama`], [`gemv`]) and [`Kernels::linear`] state their limits in their docs; a size beyond
//! one is refused with [`Error::InvalidArgument`](cuda_core::Error::InvalidArgument) naming the
//! size and the limit, before anything is launched.
//! The fully connected layer [`Kernels::linear`] (lazy form: [`ops::linear`]) checks each of its
//! buffers against a [`LinearShape`] instead and writes exactly its output matrix.
//!
//! Contents:
//! - [`Kernels`] and [`Element`]: the elementwise family and the sum over `f32`/`f64` buffers
//!   (`src/elementwise.rs`), and the fully connected layer [`Kernels::linear`] with its
//!   [`LinearShape`] (`src/linear.rs`);
//! - [`ops`]: the same kernels as lazy `cuda-async` operations;
//! - [`llama`], [`prefill`], [`gemv`], [`sample`]: the bf16 decoder kernels, the chunked-prefill
//!   kernels, the fused small-batch products and the sampler;
//! - [`programs`]: the NVRTC programs every loader compiles.

#![warn(missing_docs)]

mod checks;
mod elementwise;
pub mod gemv;
mod linear;
pub mod llama;
pub mod ops;
pub mod prefill;
pub mod programs;
pub mod sample;

pub use elementwise::{Element, Kernels, TypedKernels, BLOCK, ELEMENTWISE_SRC, REDUCE_SRC};
pub use linear::{LinearLens, LinearShape, LINEAR_SRC};

/// The `half` crate, whose `bf16` is the element type of the decoder kernels ([`llama`],
/// [`gemv`]): the same as `cuda_core::half`.
pub use cuda_core::half;
