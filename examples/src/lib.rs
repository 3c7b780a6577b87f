//! Shared helpers for the examples and benchmark programs.

pub mod bench;
pub mod mlp;
pub mod raw;
