//! The execution lock: no op execution may start inside another, and no op execution runs while a
//! graph capture scope is open.
//!
//! **Per thread.** Each thread has a flag that is set while an execution entry point (`sync_on`,
//! `sync`, `async_on`, the first poll of a future) runs an op's `execute`, or while a capture scope
//! runs its closure. An entry point that finds the flag set returns [`DeviceError::Lock`] instead of
//! running. The flag is reset by an RAII guard, so a panic inside execution leaves the thread
//! usable.
//!
//! **Why per thread is enough for plain execution.** Closures inside an op (`then`, `map`,
//! `and_then_with_context`) run on the thread that executes the op, so nesting is always
//! same-thread. Executions on different threads are independent: each enqueues on its own stream,
//! and buffers used on several streams are ordered by `cuda-core`'s home-stream join. A
//! process-wide *exclusive* lock would only serialise unrelated work.
//!
//! **Process-wide for captures.** A read-write lock is taken shared by every execution and
//! exclusively by a capture (`CudaGraph::scope`, `capture`). While a capture records, no other
//! thread's op can enqueue work that would touch the capturing stream or a buffer homed on it (and
//! so drag its stream into the capture or fail); those executions simply wait for the capture to
//! end, which takes microseconds to milliseconds.

use crate::error::{DeviceError, Result};
use std::cell::Cell;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

thread_local! {
    static EXECUTING: Cell<bool> = const { Cell::new(false) };
}

static CAPTURE_LOCK: RwLock<()> = RwLock::new(());

enum Global {
    Shared(#[allow(dead_code)] RwLockReadGuard<'static, ()>),
    Exclusive(#[allow(dead_code)] RwLockWriteGuard<'static, ()>),
}

/// Held while an op executes (or a capture records) on this thread; releases both locks on drop,
/// also during unwinding.
#[must_use]
pub(crate) struct ExecGuard {
    _global: Global,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for ExecGuard {
    fn drop(&mut self) {
        EXECUTING.with(|e| e.set(false));
    }
}

fn enter(entry: &'static str, global: impl FnOnce() -> Global) -> Result<ExecGuard> {
    if EXECUTING.with(|e| e.replace(true)) {
        return Err(DeviceError::Lock(entry));
    }
    // The flag is ours now; the guard resets it even if taking the global lock panicked.
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            EXECUTING.with(|e| e.set(false));
        }
    }
    let reset = Reset;
    let g = global();
    std::mem::forget(reset);
    Ok(ExecGuard { _global: g, _not_send: std::marker::PhantomData })
}

/// Takes the lock for an op execution (`entry` is named in the error), or fails if this thread is
/// already executing. Waits while another thread's capture scope is open.
pub(crate) fn acquire(entry: &'static str) -> Result<ExecGuard> {
    enter(entry, || Global::Shared(CAPTURE_LOCK.read().unwrap_or_else(|e| e.into_inner())))
}

/// Takes the lock for a capture: exclusive against every op execution in the process.
pub(crate) fn acquire_exclusive(entry: &'static str) -> Result<ExecGuard> {
    enter(entry, || Global::Exclusive(CAPTURE_LOCK.write().unwrap_or_else(|e| e.into_inner())))
}

/// Whether this thread is inside an op's execution or a capture scope.
pub fn is_executing() -> bool {
    EXECUTING.with(|e| e.get())
}
