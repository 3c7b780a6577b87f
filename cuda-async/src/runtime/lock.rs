//! The execution lock: no op execution may start inside another on the same thread, and no op
//! execution runs inside a graph capture scope.
//!
//! **Per thread, and only per thread.** Each thread has a flag that is set while an execution
//! entry point (`sync_on`, `sync`, `async_on`, the first poll of a future) runs an op's `execute`,
//! or while a capture scope runs its closure. An entry point that finds the flag set returns
//! [`DeviceError::Lock`] instead of running. The flag is reset by an RAII guard, so a panic inside
//! execution leaves the thread usable.
//!
//! **Why per thread is enough.** Closures inside an op (`then`, `map`, `and_then_with_context`)
//! run on the thread that executes the op, so nesting is always same-thread. Executions on
//! different threads are independent: each enqueues on its own stream, buffers used on several
//! streams are ordered by `cuda-core`'s home-stream join, and captures are protected by
//! `cuda-core`'s per-stream enqueue lock, which refuses (with an error, never a wait) another
//! thread's work on a capturing stream or on a buffer homed on one. There is deliberately no
//! process-wide lock: a capture scope that waits for another thread's `sync_on` must not deadlock.

use crate::context::ExecutionContext;
use crate::error::{DeviceError, Result};
use crate::op::DeviceOp;
use cuda_core::Stream;
use std::cell::Cell;

thread_local! {
    static EXECUTING: Cell<bool> = const { Cell::new(false) };
}

/// Held while an op executes (or a capture records) on this thread; resets the flag on drop, also
/// during unwinding. Not `Send`: it belongs to the thread whose flag it set.
#[must_use]
pub(crate) struct ExecGuard {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for ExecGuard {
    fn drop(&mut self) {
        EXECUTING.with(|e| e.set(false));
    }
}

/// Takes the lock for an op execution or a capture (`entry` is named in the error), or fails if
/// this thread is already executing. Never waits.
pub(crate) fn acquire(entry: &'static str) -> Result<ExecGuard> {
    if EXECUTING.with(|e| e.replace(true)) {
        return Err(DeviceError::Lock(entry));
    }
    Ok(ExecGuard { _not_send: std::marker::PhantomData })
}

/// Whether this thread is inside an op's execution or a capture scope.
pub fn is_executing() -> bool {
    EXECUTING.with(|e| e.get())
}

/// Runs `op` on `stream` under the execution lock, without waiting.
#[inline]
pub(crate) fn execute_locked<O: DeviceOp>(op: O, stream: &Stream, entry: &'static str) -> Result<O::Output> {
    let _guard = acquire(entry)?;
    op.execute(&ExecutionContext::new(stream))
}
