//! Device memory: typed buffers, pinned host buffers, memory pools, and cross-stream ordering.

mod buffer;
mod order;
mod pinned;
mod pool;
mod repr;

pub use buffer::DeviceBuffer;
pub use order::ordered_on;
pub use pinned::PinnedBuffer;
pub use pool::{MemPool, PoolStats};
pub use repr::DeviceRepr;
