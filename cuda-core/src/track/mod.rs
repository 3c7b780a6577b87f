//! The ordering protocol, in one place: which use of memory waits for which, what a capture keeps,
//! and when the last free may run. Every rule that makes safe code unable to race the GPU, replay
//! into freed memory or lose work into another thread's graph is implemented in this folder; the
//! layers above (`memory`'s typed buffers, `graph`, `launch`, `nccl`, `interop`, `stream`'s public
//! methods) only call into it.
//!
//! **The enqueue lock** (`stream`, `state`). Every stream has one mutex, taken by every operation
//! of this crate that queues work on the stream, waits on it, or begins or ends its capture; the
//! capture state lives behind it. Locks of several streams are taken in increasing stream-id order
//! (`state::Locked`) and are never held while blocking on the GPU or dropping an allocation.
//!
//! **Which use waits for which** (`access`, `order`). Every allocation has a *home stream*, where
//! it was allocated and will be freed. A read waits for the last write; a write waits for the last
//! write and every read since. Uses on the home stream are ordered by the stream itself and record
//! nothing; a use on another stream records one event behind its work (a *mark*). Each use — the
//! waits before, the work, the marks after — is one atomic step under the locks of the stream it
//! runs on and of every home stream involved, so no capture can begin or end in the middle of it.
//! Serial streams (graph pools) are joined both ways around a replay. Waits are only ever on events
//! behind work already queued, so they form no cycle on the GPU.
//!
//! **What a capture keeps** (`keep`, `state`, and `crate::graph::capture` for the rules that begin
//! and end captures). While a stream is captured by this thread, a use is recorded into the
//! capture's [`KeepAlive`] set instead of waited for and marked: every allocation the recorded work
//! touches, the kernels (and so modules) it launches, the events of its event nodes, the serial
//! streams it joins, and host values that must outlive every replay. The set moves into the graph
//! at the end of the capture and into every executable graph made from it; each replay is ordered
//! as a write of each allocation it keeps. Work on a stream another thread captures, or a use of a
//! buffer whose home stream is captured from another stream, is refused.
//!
//! **The last free** (`alloc`, `state`, `reaper`). The last owner of an allocation (a buffer, or a
//! graph's keep-alive set) frees it stream-ordered on its home stream, after waiting for every mark
//! of another stream; if the home stream is being captured at that moment, the free is deferred to
//! the end of the capture (a free is never recorded). Values that are not stream-ordered (host-node
//! closures, events, foreign owners of wrapped memory) are dropped by the reaper thread once an
//! event behind their last use has completed.
//!
//! **`stream_ops`**: the `Stream` methods that order work against buffer uses
//! ([`Stream::wait_stream`], [`Stream::enqueue_external`]).

mod access;
mod alloc;
mod keep;
pub(crate) mod order;
mod pool;
pub(crate) mod reaper;
pub(crate) mod state;
pub(crate) mod stream;
mod stream_ops;

pub use access::Access;
pub use alloc::Allocation;
pub(crate) use keep::KeepAlive;
pub(crate) use order::{ordered, InCapture};
#[cfg(feature = "nccl")]
pub(crate) use order::{ordered_group, GroupPart};
pub use pool::{MemPool, PoolStats};
pub use stream::Stream;
