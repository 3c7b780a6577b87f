//! A thin result layer over the raw driver calls, modelled on cudarc's `driver::result`: one small
//! function per driver call this crate makes, which passes the out-parameters, checks the
//! `CUresult` and returns the value or an [`Error::Driver`](crate::error::Error::Driver) naming
//! what was being done. The rest of the crate calls these instead of `sys::cu*` directly, so the
//! out-parameter + check pattern lives here only.
//!
//! Conventions:
//! - A function takes a `during` argument where callers describe the call differently; otherwise
//!   the description is fixed here.
//! - A function is `unsafe` when the caller must uphold something the driver cannot check (live
//!   handles, valid pointers, a current context); its `# Safety` section says what.
//! - Every function needs the driver library to be loaded, which every caller has established
//!   through `driver::init` (directly or by holding a `Device`).
//! - Functions for drop paths return `Result<()>` like the others; the callers hand it to
//!   `error::note_drop`, which counts it exactly as a raw code used to be counted.

mod context;
mod graph;
mod graph_nodes;
mod memory;
mod module;
mod stream;

pub(crate) use context::*;
pub(crate) use graph::*;
pub(crate) use graph_nodes::*;
pub(crate) use memory::*;
pub(crate) use module::*;
pub(crate) use stream::*;
