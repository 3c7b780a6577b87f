//! Device memory: typed buffers, pinned host buffers, memory pools, and cross-stream ordering.
//! The ordering protocol itself lives in `crate::track` (which also defines [`Allocation`],
//! [`Access`] and [`MemPool`], re-exported here); this folder keeps the typed buffers.
//!
//! **Ordering.** Every use of a buffer (a kernel argument, a copy, a memset, a graph replay) is
//! ordered after the earlier uses it conflicts with, whatever stream or thread queued them: a read
//! waits for the last write; a write waits for the last write and every read since; the final,
//! stream-ordered free on the buffer's home stream waits for everything. Uses on the home stream
//! record nothing; a use on another stream records one event behind its work. Readers on several
//! streams therefore run concurrently, and independent buffers never order each other. Each use is
//! one atomic step under the enqueue locks of the streams involved, so no capture can begin or end
//! in the middle of it (see `graph::capture` and `track::access`).

mod buffer;
mod host_alloc;
mod peer_copy;
mod pinned;
mod repr;

pub use crate::track::{Access, Allocation, MemPool, PoolStats};
pub use buffer::DeviceBuffer;
#[doc(hidden)]
pub use peer_copy::PeerCopyOptions;
pub use peer_copy::PeerPath;
pub use pinned::PinnedBuffer;
pub use repr::DeviceRepr;
