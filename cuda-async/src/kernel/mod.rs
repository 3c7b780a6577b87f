//! Your own kernels as lazy ops: from CUDA C (NVRTC, cached), PTX or a cubin/fatbin, to a typed
//! [`DeviceOp`](crate::DeviceOp) with declared inputs, outputs, scalars and a launch shape.
//!
//! - [`Kernel`]: the code and the kernel's name, loaded once per device.
//! - [`Kernel::vouch`] — the one `unsafe` step: you state the kernel's signature
//!   (`(inputs.., outputs.., scalars..)`) and vouch that it reads only the declared inputs and
//!   writes only the declared outputs, within the lengths that your check function accepts. It
//!   gives a [`Launcher`], whose [`Launcher::op`] builds each launch safely.
//! - [`KernelOp`]: the general form under it, a launch closure over executed buffers (what the
//!   `kernels` crate builds its ops on); its constructor is where that promise is made.
//!
//! Every op built here, when executed, runs its argument ops **in argument order** (inputs, then
//! outputs) on the context's stream; checks devices, then lengths, before launching anything;
//! launches on the context's stream, ordered after the earlier conflicting uses of each buffer on
//! any stream (inputs are reads, outputs writes) and kept alive by graphs that recorded it; and
//! yields the output handles. It is a [`GraphNode`](crate::GraphNode) exactly when every argument
//! op is one (a lazily allocating argument such as `memory::zeros(n)` makes it none).
//!
//! Load (or compile) the kernel before recording a graph — execute one launch, or call
//! [`Kernel::function`] — so that compilation stays out of the recording.
//!
//! Inputs are any [`IntoBufferOp`](crate::IntoBufferOp); outputs must yield a
//! [`BufferMut`](crate::BufferMut), so a shared buffer cannot be written:
//!
//! ```compile_fail,E0277
//! # use cuda_async::kernel::Launcher;
//! # use cuda_core::DeviceBuffer;
//! # use std::sync::Arc;
//! # fn f(k: &Launcher<(f32,), (f32,), (u64,)>, x: &DeviceBuffer<f32>, y: Arc<DeviceBuffer<f32>>) {
//! // error[E0277]: the trait bound `Arc<DeviceBuffer<f32>>: BufferMut<f32>` is not satisfied
//! let op = k.op((x,), (y,), (4u64,));
//! # }
//! ```
//!
//! See `docs/own-kernels.md` for a walk-through and the `own-kernel` example.

/// The guide chapter `docs/own-kernels.md`, doctested (its GPU parts are `no_run`).
#[cfg(doctest)]
#[doc = include_str!("../../../docs/own-kernels.md")]
pub struct OwnKernelsGuide;

mod args;
mod op;
mod source;
mod typed;

pub use args::{Elems, InputBufs, IntoInputs, IntoOutputs, OutputBufs, Scalars};
pub use op::{KernelOp, LaunchFn};
pub use source::Kernel;
pub use typed::{Check, LaunchOp, LaunchOpOf, Launcher, Lens};
