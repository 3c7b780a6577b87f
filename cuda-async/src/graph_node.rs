//! The `GraphNode` marker: ops that may be recorded into a CUDA graph.

use crate::{DeviceOp, Op};

/// Marks ops whose execution queues only work that a CUDA graph can replay: kernel launches,
/// copies and memsets between **existing** buffers. They never allocate or free device memory on
/// the stream (an allocation recorded into a graph would hand out an address that changes or dies
/// between replays). Graph recording APIs accept only `GraphNode` ops, so an allocating op — also
/// one hidden inside a lazy kernel argument — is refused at compile time.
///
/// What the marker does not cover: user closures. `map`, `then` and `inspect` of a `GraphNode` op
/// are `GraphNode`s, and their closures may drop a buffer, create one or synchronise. Those are
/// refused or made safe at run time by `cuda-core`, whatever the op's type:
/// - a free on a stream being captured is deferred until the capture ends;
/// - a synchronisation during a capture is refused;
/// - a stream-ordered allocation on a stream being captured is refused.
///
/// The marker is the compile-time part for the ops themselves. Those run-time rules are the
/// barrier, and unsafe code must not rely on the marker alone.
///
/// # Safety
/// Implementors must queue no stream-ordered allocation or free (`cuMemAllocAsync`,
/// `cuMemFreeAsync`), no synchronisation and no host-blocking call themselves when executed
/// (closures the user passes to combinators are not the implementor's to vouch for: see above),
/// and must only combine inner ops that are themselves `GraphNode`.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be recorded into a CUDA graph: it is not a `GraphNode`",
    label = "this op may allocate, free or synchronise (or wraps one that does), which a graph cannot replay",
    note = "allocate buffers before the capture and pass them in (`&buf`, `&mut buf`); allocating ops such as `zeros`, `from_host`, `to_host` and `dup` are not GraphNodes",
    note = "a typed launcher is a GraphNode only when every argument op is one"
)]
pub unsafe trait GraphNode: DeviceOp {}

// SAFETY: delegates to the inner op, which is a GraphNode.
unsafe impl<T: GraphNode> GraphNode for Op<T> {}
