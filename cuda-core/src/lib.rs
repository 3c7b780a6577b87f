//! `cuda-core`: a safe, idiomatic layer over the CUDA driver API.
//!
//! - [`Device`]: devices, attributes, and automatic binding of the primary context on whichever
//!   thread uses a device, stream or buffer.
//! - [`Stream`], [`Event`]: ordering, synchronisation and timing.
//! - [`memory`]: [`DeviceBuffer`] (stream-ordered allocation and free), [`PinnedBuffer`],
//!   [`MemPool`], and cross-stream ordering of buffer uses.
//! - [`CudaModule`], [`Function`], [`nvrtc`]: loading PTX/CUBIN, compiling CUDA C at run time with a
//!   memory and disk cache, and typed kernel launches.
//! - [`interop`]: cudarc slices, streams and raw device pointers as this crate's types and back.
//! - [`graph`]: raw graph handles (capture, instantiate, upload, launch).
//! - Several devices: [`Device::all`], peer access ([`Device::enable_peer_access`]) and copies
//!   between devices ([`DeviceBuffer::copy_from_peer`]), ordered on both sides; NCCL collectives
//!   (`nccl`, feature `nccl`).
//!
//! The driver is loaded at run time, so this crate builds without any CUDA installation; on a
//! machine with no driver every entry point returns [`Error::NoDriver`]. All raw driver calls of the
//! workspace live in this crate. No function panics on a driver failure: each returns [`Error`].

//! ```no_run
//! # fn main() -> cuda_core::Result<()> {
//! use cuda_core::{Device, DeviceBuffer, Event, LaunchConfig, Stream};
//! let dev = Device::new(0)?;
//! let s = Stream::new(&dev)?;
//! let x = DeviceBuffer::from_host(&s, &[1.0f32, 2.0, 3.0])?;
//! let mut y = DeviceBuffer::<f32>::zeros(&s, 3)?;
//! let m = dev.compile_module(
//!     "scale.cu",
//!     r#"extern "C" __global__ void scale(float* y, const float* x, unsigned n) {
//!         unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
//!         if (i < n) y[i] = 2.0f * x[i];
//!     }"#,
//!     &[],
//! )?;
//! let f = m.function("scale")?;
//! let (start, end) = (Event::new(&dev, true)?, Event::new(&dev, true)?);
//! start.record(&s)?;
//! // SAFETY: the arguments match `scale(float*, const float*, unsigned)`; the kernel touches
//! // y[0..3] and x[0..3] only.
//! unsafe { f.launch(&s, LaunchConfig::for_elements(3, 128), (&mut y, &x, 3u32))? };
//! end.record(&s)?;
//! assert_eq!(y.to_vec()?, vec![2.0, 4.0, 6.0]); // ordered after the launch
//! println!("{} ms", Event::elapsed_ms(&start, &end)?);
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

#[cfg(feature = "cublas")]
pub mod blas;
mod catch;
pub mod device;
pub mod driver;
pub mod error;
pub mod event;
pub mod graph;
pub mod interop;
pub mod launch;
pub mod memory;
pub mod module;
mod module_image;
#[cfg(feature = "nccl")]
pub mod nccl;
pub mod nvrtc;
mod peer;
mod per_device;
pub mod progress;
pub mod stream;
mod track;
mod zeroed;

pub use device::{Device, DeviceAttribute};
pub use driver::{device_count, driver_version, gpu_available, MIN_DRIVER_CUDA_VERSION};
pub use error::{drop_errors, Error, Result};
pub use event::{Event, PooledEvent};
pub use graph::{
    CaptureMode, CaptureStatus, Conditional, ConditionalKind, ExecUpdate, Graph, GraphBody, GraphExec,
    GraphMem, InstantiateFlags, KernelNode, KernelNodeParams, Node, NodeType,
};
/// The `half` crate, whose `bf16` and `f16` are [`DeviceRepr`] element types (and the types of
/// the bf16/f16 products in [`blas`]): `use cuda_core::half::bf16;` needs no `half` dependency of
/// your own, and can never pick a version other than the one these impls are for.
pub use half;
pub use launch::{KernelArgs, KernelParam, LaunchConfig};
pub use memory::{Allocation, DeviceBuffer, DeviceRepr, MemPool, PeerPath, PinnedBuffer, PoolStats};
pub use module::{CudaModule, Function, FunctionAttribute};
pub use per_device::PerDevice;
pub use progress::ProgressMark;
pub use stream::Stream;
