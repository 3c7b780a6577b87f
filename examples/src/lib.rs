//! Shared helpers for the examples and benchmark programs.

pub mod bench;
