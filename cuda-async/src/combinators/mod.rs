//! Op constructors and combinators, one concept per module.

mod boxed;
mod join;
mod map;
mod shared;
mod then;
mod value;

pub use boxed::BoxedOp;
pub use join::{join_all, JoinAll, TupleOutput};
pub use map::{AndThenWithContext, Inspect, Map};
pub(crate) use shared::unzip;
pub use shared::{Shared, UnzipLeft, UnzipRight};
pub use then::Then;
pub use value::{value, Value};
