//! The execution lock: no op execution may start inside another.
//!
//! **Per thread.** Each thread has a flag that is set while an execution entry point (`sync_on`,
//! `sync`, `async_on`, the first poll of a future) runs an op's `execute`. An entry point that finds
//! the flag set returns [`DeviceError::Lock`] instead of running. The flag is reset by an RAII guard,
//! so a panic inside execution leaves the thread usable.
//!
//! **Why per thread is enough.** Closures inside an op (`then`, `map`, `and_then_with_context`)
//! run on the thread that executes the op, so nesting is always same-thread. Executions on
//! different threads are independent: each enqueues on its own stream, and buffers used on several
//! streams are ordered by `cuda-core`'s home-stream join. A process-wide lock would only serialise
//! unrelated work. Graph capture scopes (the graphs module) additionally take a process-wide lock
//! against all executions, since a global-mode capture must not see another thread's work.

use crate::error::{DeviceError, Result};
use std::cell::Cell;

thread_local! {
    static EXECUTING: Cell<bool> = const { Cell::new(false) };
}

/// Held while an op executes on this thread; releases the lock on drop (also during unwinding).
#[must_use]
pub(crate) struct ExecGuard {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for ExecGuard {
    fn drop(&mut self) {
        EXECUTING.with(|e| e.set(false));
    }
}

/// Takes the lock for `entry` (named in the error), or fails if this thread is already executing.
pub(crate) fn acquire(entry: &'static str) -> Result<ExecGuard> {
    EXECUTING.with(|e| {
        if e.replace(true) {
            Err(DeviceError::Lock(entry))
        } else {
            Ok(ExecGuard { _not_send: std::marker::PhantomData })
        }
    })
}

/// Whether this thread is inside an op's execution.
pub fn is_executing() -> bool {
    EXECUTING.with(|e| e.get())
}
