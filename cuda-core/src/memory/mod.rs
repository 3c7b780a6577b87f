//! Device memory: typed buffers, pinned host buffers, memory pools, and cross-stream ordering.

mod alloc;
mod buffer;
mod order;
mod pinned;
mod pool;
mod repr;

pub(crate) use alloc::free_async;
pub use alloc::Allocation;
pub use buffer::DeviceBuffer;
pub(crate) use order::join_homes;
pub use order::ordered_on;
pub use pinned::PinnedBuffer;
pub use pool::{MemPool, PoolStats};
pub use repr::DeviceRepr;
