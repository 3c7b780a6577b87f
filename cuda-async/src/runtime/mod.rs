//! The await runtime: how an awaited op runs and completes (tokio's `runtime/` is the model).
//!
//! - `future`: [`DeviceFuture`], the future of an op; its first poll queues the work, spins for a
//!   short, predicted while (`await_spin`), and otherwise hands the op to the completion engine.
//! - `lock`: the per-thread execution lock every entry point takes ([`is_executing`]).
//! - `engine`: library-owned threads per device that check the pending awaited ops and wake their
//!   tasks; `sweep`: how one engine pass checks its pending ops; `policy`: the engine's
//!   [`CompletionPolicy`](crate::scheduling::CompletionPolicy) (public at `cuda_async::scheduling`).
//! - `completion`: the lock-free completion cell shared by a future and the engine (model-checked
//!   with loom: `tests/loom_completion.rs` includes it by path).

pub(crate) mod await_spin;
pub(crate) mod completion;
mod engine;
mod future;
pub(crate) mod lock;
pub(crate) mod policy;
mod sweep;

pub use engine::{early_spin_misses, early_wakes, marks_watched, waker_takeovers};
pub use future::DeviceFuture;
pub(crate) use lock::execute_locked;
pub use lock::is_executing;
