//! `cuda-async`: GPU work as lazy values that compose, run only when asked, and complete as Rust
//! futures — with no way for safe code to race the GPU or free memory it still uses.
//!
//! - [`DeviceOp`]: a lazy description of GPU work; [`Op`] wraps every op so that `.await` works.
//! - Entry points ([`DeviceOpExt`]): `sync_on(&stream)`, `sync()`, `unsafe async_on(&stream)`,
//!   `schedule(&policy)`, `on(&stream)` and `.await`.
//! - Combinators: [`value`], `then`, `map`, `inspect`, `and_then_with_context`, [`zip!`],
//!   [`join_all`], `shared`, `boxed`, `unzip`, `first`, `last`.
//! - Scheduling: [`SchedulingPolicy`], [`StreamPoolRoundRobin`] (default), [`SingleStream`], and the
//!   default device and policy ([`scheduling`]).
//! - Your own kernels as typed lazy ops ([`kernel`]): from CUDA C, PTX or a cubin, vouched for
//!   once with `unsafe`, launched safely.
//! - Memory ops ([`memory`], with copies between devices: `memory::copy_peer`) and buffer
//!   arguments ([`args`]); the [`GraphNode`] marker.
//! - NCCL collectives as ops (`nccl`, feature `nccl`), recordable into graphs.
//! - CUDA graphs ([`graph`]): [`CudaGraph::scope`] (with options: [`CaptureOptions`]'s
//!   `scope`), `op.graph_on(&s)`,
//!   replays as ops, updates, parameter handles, [`DeviceScalar`], the [`Module`] trait and
//!   [`Replicas`] (many tasks, one `&self`, for [`Replicable`] modules).
//!
//! See `docs/guide.md` for the safety argument.

#![warn(missing_docs)]

pub mod args;
pub mod combinators;
mod context;
mod error;
mod ext;
pub mod graph;
mod graph_node;
pub mod kernel;
pub mod memory;
#[cfg(feature = "nccl")]
pub mod nccl;
mod op;
mod runtime;
pub mod scheduling;
pub mod staging;
mod sync_shim;

pub use args::{BufferMut, BufferRef, IntoBufferOp};
pub use combinators::{join_all, join_concurrent, value};
pub use context::ExecutionContext;
pub use error::{DeviceError, Result};
pub use ext::{DeviceOpExt, FirstFn, LastFn};
pub use graph::{
    CaptureOptions, CudaGraph, DeviceScalar, GraphBodyExt, GraphPool, Module, RecapturePath, Replicable,
    Replicas, TunableParam,
};
pub use graph_node::GraphNode;
pub use op::{DeviceOp, Op};
pub use runtime::is_executing;
pub use runtime::DeviceFuture;
#[doc(hidden)]
pub use runtime::{early_spin_misses, early_wakes, marks_watched, waker_takeovers};
pub use scheduling::{SchedulingPolicy, SingleStream, StreamPoolRoundRobin};
