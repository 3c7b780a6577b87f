//! `DeviceError`: everything that can go wrong when building or running ops.

use std::sync::Arc;

/// The error type of `cuda-async`. No operation of this crate panics on a driver failure; each
/// returns one of these.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DeviceError {
    /// A driver, NVRTC or argument error from `cuda-core` (it names the CUDA error and what was
    /// being done).
    #[error(transparent)]
    Core(#[from] cuda_core::Error),
    /// A scheduling policy could not provide a stream (e.g. a pool of size 0).
    #[error("scheduling error: {0}")]
    Scheduling(String),
    /// The API was used in a way it does not allow (a parameter handle of another graph, warm-up
    /// runs without a re-buildable op, a future polled after completion, ...). Nothing was queued.
    #[error("misuse: {0}")]
    Misuse(String),
    /// An op was executed from inside another op's execution on the same thread (e.g. `sync_on`
    /// inside a `then` closure), or while a graph capture scope holds the execution lock.
    #[error("execution lock violation: {0}")]
    Lock(&'static str),
    /// Lengths or shapes of op arguments do not agree.
    #[error("shape mismatch in {op}: {detail}")]
    Shape {
        /// The op that checked.
        op: &'static str,
        /// What disagreed.
        detail: String,
    },
    /// The GPU work of an awaited op failed asynchronously. Holds the driver error exactly as the
    /// completion engine (the library threads that complete awaited ops) or the awaiting thread
    /// detected it: the event query or synchronisation that reported the failure, or, for work
    /// waited on through a progress mark, the query of the device's context that found its sticky
    /// fault, each naming what it was doing.
    #[error("GPU work failed asynchronously: {0}")]
    Async(cuda_core::Error),
    /// A shared op's producer failed; every consumer gets this.
    #[error("shared op failed: {0}")]
    Shared(Arc<DeviceError>),
}

/// `Result` with [`DeviceError`].
pub type Result<T, E = DeviceError> = std::result::Result<T, E>;

impl DeviceError {
    /// A shape error for `op`.
    pub fn shape(op: &'static str, detail: impl Into<String>) -> Self {
        DeviceError::Shape { op, detail: detail.into() }
    }
}
