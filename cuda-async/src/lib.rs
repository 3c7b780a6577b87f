//! `cuda-async`: lazy GPU work as composable values that run only when asked and complete as Rust
//! futures. (Filled in by the `cuda-async` issue; the completion core is here already.)

pub(crate) mod completion;
mod sync_shim;
