//! Tuples of ops (`zip!`): a tuple of ops is an op yielding the tuple of their outputs.
//!
//! Joined ops are executed in order on the one stream of the context, so they never race each
//! other; the stream runs them back to back.

use crate::{DeviceOp, ExecutionContext, GraphNode, Result};

macro_rules! tuple_op {
    ($($n:ident),+) => {
        /// A tuple of ops is an op yielding the tuple of their outputs, run in order.
        impl<$($n: DeviceOp),+> DeviceOp for ($($n,)+) {
            type Output = ($($n::Output,)+);
            #[allow(non_snake_case)]
            #[inline]
            fn execute(self, ctx: &ExecutionContext<'_>) -> Result<Self::Output> {
                let ($($n,)+) = self;
                Ok(($($n.execute(ctx)?,)+))
            }
        }
    };
}
tuple_op!(A);
tuple_op!(A, B);
tuple_op!(A, B, C);
tuple_op!(A, B, C, D);
tuple_op!(A, B, C, D, E);
tuple_op!(A, B, C, D, E, F);
tuple_op!(A, B, C, D, E, F, G);
tuple_op!(A, B, C, D, E, F, G, H);
tuple_op!(A, B, C, D, E, F, G, H, I);
tuple_op!(A, B, C, D, E, F, G, H, I, J);

/// Joins up to 10 ops into one op yielding the tuple of their outputs:
/// `zip!(a, b, c).sync()? == (a_out, b_out, c_out)`.
///
/// ```no_run
/// # fn main() -> cuda_async::Result<()> {
/// use cuda_async::{memory, zip, DeviceOpExt};
/// let (a, b) = zip!(memory::zeros::<f32>(8), memory::ones::<f32>(8)).sync()?;
/// assert_eq!((a.len(), b.len()), (8, 8));
/// # Ok(()) }
/// ```
#[macro_export]
macro_rules! zip {
    ($($op:expr),+ $(,)?) => {
        $crate::Op::new(($($op,)+))
    };
}

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

/// Access to the first and last element of tuple outputs (for [`crate::DeviceOpExt::first`] and
/// [`crate::DeviceOpExt::last`]).
pub trait TupleOutput {
    /// The first element's type.
    type First;
    /// The last element's type.
    type Last;
    /// Takes the first element.
    fn first(self) -> Self::First;
    /// Takes the last element.
    fn last(self) -> Self::Last;
}

macro_rules! tuple_output {
    ($f:ident $(, $n:ident)* ; $l:ident) => {
        impl<$f $(, $n)*> TupleOutput for ($f, $($n,)*) {
            type First = $f;
            type Last = $l;
            #[allow(non_snake_case, unused_variables)]
            fn first(self) -> $f {
                let ($f, $($n,)*) = self;
                $f
            }
            #[allow(non_snake_case, unused_variables)]
            fn last(self) -> $l {
                let ($f, $($n,)*) = self;
                $l
            }
        }
    };
}
tuple_output!(A; A);
tuple_output!(A, B; B);
tuple_output!(A, B, C; C);
tuple_output!(A, B, C, D; D);
tuple_output!(A, B, C, D, E; E);
tuple_output!(A, B, C, D, E, F; F);
tuple_output!(A, B, C, D, E, F, G; G);
tuple_output!(A, B, C, D, E, F, G, H; H);
