//! Op constructors and combinators: one combinator per module, each with all its impls
//! (`DeviceOp`, `GraphNode`) beside it.

mod and_then_with_context;
mod boxed;
mod concurrent;
mod inspect;
mod join_all;
mod map;
mod shared;
mod then;
mod unzip;
mod value;
mod zip;

pub use and_then_with_context::AndThenWithContext;
pub use boxed::BoxedOp;
pub use concurrent::{join_concurrent, JoinConcurrent, ZipConcurrent};
pub use inspect::Inspect;
pub use join_all::{join_all, JoinAll};
pub use map::Map;
pub use shared::Shared;
pub use then::Then;
pub(crate) use unzip::unzip;
pub use unzip::{UnzipLeft, UnzipRight};
pub use value::{value, Value};
pub use zip::TupleOutput;
