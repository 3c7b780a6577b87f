//! Deferred drops: values released only once the GPU has passed a point in a stream.
//!
//! Executable graphs own host-node closures and events that a queued replay will still use, but
//! that are not freed stream-ordered the way device memory is. When such a graph is dropped or
//! updated while a replay may still be queued, what it kept goes here with an event recorded
//! behind its last replay. A library-owned thread (`cuda-core-reaper`) waits for each event in
//! turn and only then drops the value. The dropping thread never blocks, and no value is ever
//! dropped inside a driver callback.
//!
//! **Process exit.** Returning from `main` (or `std::process::exit`) runs the C `atexit`
//! handlers and the loaded libraries' destructors while other threads still run: a deferred drop
//! that calls into a library (a communicator kept by a graph ends with `ncclCommDestroy`) could
//! run on this thread while that library tears itself down. So a handler registered with `atexit`
//! ([`drain_before_exit`]) first waits, for at most [`EXIT_DRAIN_BOUND`], until every queued value
//! has been dropped; what is still queued after that is forgotten, not dropped (the process is
//! ending; the operating system takes its memory back). Handlers run in the reverse order of
//! registration, so the handler is registered again after each library this crate loads later
//! (NCCL), ahead of that library's destructors. The drain does not wait on the reaper thread
//! itself (a dropped value whose `Drop` calls `std::process::exit`), nor in a child made by
//! `fork` (which inherits the queue count but not the thread).

use crate::event::PooledEvent;
use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Type-erased on purpose: the values are genuinely heterogeneous — graphs' keep-alive sets, staging
/// buffers of copies between devices, and the foreign owners of wrapped memory (any user type, see
/// `crate::interop`) — and are only ever dropped.
type Item = (Arc<PooledEvent>, Box<dyn Any + Send>);

/// Values handed to the reaper thread and not yet dropped (or forgotten).
static QUEUED: AtomicUsize = AtomicUsize::new(0);

/// Set once the process is exiting and the drain's bound has passed: the reaper forgets what is
/// left instead of dropping it.
static ABANDON: AtomicBool = AtomicBool::new(false);

/// How long process exit waits for the queued drops (each waits for its event first: a replay
/// still running, or a GPU that hangs, must not hold the exit for ever).
pub(crate) const EXIT_DRAIN_BOUND: Duration = Duration::from_secs(20);

/// The process that started the reaper thread (0: not started). A child made by `fork` inherits
/// the queue count but not the thread: its exit must not wait for drops that nobody will make.
static REAPER_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

thread_local! {
    /// Set on the reaper thread: an exit called from there (a dropped value's `Drop` calling
    /// `std::process::exit`) must not wait for the very drop it is part of.
    static ON_REAPER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the exit drain should wait for the queue: only in the process whose reaper thread
/// exists, and not on that thread itself.
fn drain_waits() -> bool {
    REAPER_PID.load(Ordering::Acquire) == std::process::id() && !ON_REAPER.with(|c| c.get())
}

fn sender() -> Option<Sender<Item>> {
    static TX: OnceLock<Option<Mutex<Sender<Item>>>> = OnceLock::new();
    let tx = TX.get_or_init(|| {
        let (tx, rx) = channel::<Item>();
        let started = std::thread::Builder::new()
            .name("cuda-core-reaper".into())
            .spawn(move || {
                // Exempt this thread from other threads' global-mode captures: its event waits are
                // on events no capture records into.
                crate::driver::relax_thread_capture_mode();
                ON_REAPER.with(|c| c.set(true));
                for (event, item) in rx {
                    // If the wait fails the context is unusable and nothing will run any more:
                    // dropping is safe either way.
                    let _ = event.sync_unchecked();
                    if ABANDON.load(Ordering::Acquire) {
                        std::mem::forget(item);
                    } else {
                        drop(item);
                    }
                    drop(event);
                    QUEUED.fetch_sub(1, Ordering::AcqRel);
                }
            })
            .ok()
            .map(|_| Mutex::new(tx));
        if started.is_some() {
            REAPER_PID.store(std::process::id(), Ordering::Release);
            drain_before_exit();
        }
        started
    });
    tx.as_ref().map(|m| m.lock().unwrap_or_else(|e| e.into_inner()).clone())
}

/// Drops `item` once `event` has completed, on the reaper thread. If that thread cannot be
/// started, waits for the event here instead (blocking) and drops the item.
pub(crate) fn drop_after(event: Arc<PooledEvent>, item: Box<dyn Any + Send>) {
    match sender() {
        Some(tx) => {
            QUEUED.fetch_add(1, Ordering::AcqRel);
            if let Err(std::sync::mpsc::SendError((event, item))) = tx.send((event, item)) {
                QUEUED.fetch_sub(1, Ordering::AcqRel);
                let _ = event.sync_unchecked();
                drop(item);
            }
        }
        None => {
            let _ = event.sync_unchecked();
            drop(item);
        }
    }
}

/// Registers the exit drain (see the module docs) with the C `atexit`: once when the reaper
/// thread starts, and again after a library is loaded whose destructors must run after it. A
/// second run of the handler finds nothing queued and returns at once.
pub(crate) fn drain_before_exit() {
    #[cfg(unix)]
    {
        extern "C" fn drain() {
            let start = std::time::Instant::now();
            while drain_waits() && QUEUED.load(Ordering::Acquire) > 0 && start.elapsed() < EXIT_DRAIN_BOUND {
                std::thread::sleep(Duration::from_millis(1));
            }
            ABANDON.store(true, Ordering::Release);
        }
        // SAFETY: `drain` is a plain `extern "C" fn()` that never unwinds (it only loads atomics
        // and sleeps); registering it has no other precondition. A failed registration (only on
        // memory exhaustion) leaves exit as it was without the drain.
        let _ = unsafe { libc::atexit(drain) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drain_waits_only_in_the_reapers_process_and_never_on_its_thread() {
        REAPER_PID.store(std::process::id(), Ordering::Release);
        assert!(drain_waits(), "an ordinary thread of the reaper's process waits");
        let on_reaper = std::thread::spawn(|| {
            ON_REAPER.with(|c| c.set(true));
            drain_waits()
        });
        assert!(!on_reaper.join().unwrap(), "the reaper thread itself never waits");
        // As in a child made by fork: another pid than the one that started the thread.
        REAPER_PID.store(std::process::id().wrapping_add(1), Ordering::Release);
        assert!(!drain_waits(), "a forked child does not wait");
        REAPER_PID.store(0, Ordering::Release);
    }
}
