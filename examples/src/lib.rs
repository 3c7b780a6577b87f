//! Shared pieces of the example and benchmark programs (the models are in the `models` crate).

pub mod bench;
pub mod load;
