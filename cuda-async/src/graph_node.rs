//! The `GraphNode` marker: ops that may be recorded into a CUDA graph.

use crate::combinators::{Inspect, JoinAll, Map, Then, Value};
use crate::{DeviceOp, Op};

/// Marks ops whose execution queues only work that a CUDA graph can replay: kernel launches,
/// copies and memsets between **existing** buffers. They never allocate or free device memory on
/// the stream (an allocation recorded into a graph would hand out an address that changes or dies
/// between replays). Graph recording APIs accept only `GraphNode` ops, so an allocating op — also
/// one hidden inside a lazy kernel argument — is refused at compile time.
///
/// # Safety
/// Implementors must queue no stream-ordered allocation or free (`cuMemAllocAsync`,
/// `cuMemFreeAsync`), no synchronisation and no host-blocking call when executed, and must only
/// combine inner ops that are themselves `GraphNode`.
pub unsafe trait GraphNode: DeviceOp {}

// SAFETY: queues nothing at all.
unsafe impl<T: Send> GraphNode for Value<T> {}
// SAFETY: delegates to the inner op, which is a GraphNode.
unsafe impl<T: GraphNode> GraphNode for Op<T> {}
// SAFETY: runs `A`, then the op `F` returns, both GraphNodes; the closure itself runs on the host
// and is given no stream.
unsafe impl<A, F, B> GraphNode for Then<A, F>
where
    A: GraphNode,
    F: FnOnce(A::Output) -> B + Send,
    B: GraphNode,
{
}
// SAFETY: runs the GraphNode `A`; the closure runs on the host and is given no stream.
unsafe impl<A, F, U> GraphNode for Map<A, F>
where
    A: GraphNode,
    F: FnOnce(A::Output) -> U + Send,
    U: Send,
{
}
// SAFETY: as for Map.
unsafe impl<A, F> GraphNode for Inspect<A, F>
where
    A: GraphNode,
    F: FnOnce(&A::Output) + Send,
{
}
// SAFETY: runs GraphNodes in order.
unsafe impl<O: GraphNode> GraphNode for JoinAll<O> {}

macro_rules! tuple_graph_node {
    ($($n:ident),+) => {
        // SAFETY: runs its elements, all GraphNodes, in order.
        unsafe impl<$($n: GraphNode),+> GraphNode for ($($n,)+) {}
    };
}
tuple_graph_node!(A);
tuple_graph_node!(A, B);
tuple_graph_node!(A, B, C);
tuple_graph_node!(A, B, C, D);
tuple_graph_node!(A, B, C, D, E);
tuple_graph_node!(A, B, C, D, E, F);
tuple_graph_node!(A, B, C, D, E, F, G);
tuple_graph_node!(A, B, C, D, E, F, G, H);
tuple_graph_node!(A, B, C, D, E, F, G, H, I);
tuple_graph_node!(A, B, C, D, E, F, G, H, I, J);
