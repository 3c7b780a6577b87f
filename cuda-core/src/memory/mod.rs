//! Device memory: typed buffers, pinned host buffers, memory pools, and cross-stream ordering.

mod access;
mod alloc;
mod buffer;
mod order;
mod pinned;
mod pool;
mod repr;

pub use access::Access;
pub(crate) use alloc::free_after;
pub use alloc::Allocation;
pub use buffer::DeviceBuffer;
pub(crate) use order::ordered_on;
pub(crate) use order::{join_unchecked, ordered, InCapture};
pub use pinned::PinnedBuffer;
pub use pool::{MemPool, PoolStats};
pub use repr::DeviceRepr;
