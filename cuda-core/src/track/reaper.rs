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
//! (NCCL, and after its first communicator, whose function-local statics register destructors of
//! their own), ahead of that library's destructors; only the first run waits. A drop already
//! running when the bound passes is not stopped, and a value handed over after that is forgotten. The drain does not wait on the reaper thread
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
/// No event: drop as soon as the reaper thread gets to it ([`drop_elsewhere`]).
type Item = (Option<Arc<PooledEvent>>, Box<dyn Any + Send>);

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
/// exists (`reaper_pid`, 0 if none), not on that thread itself, and only once (`abandoned`: an
/// earlier run of the handler already waited out its bound).
fn drain_waits(reaper_pid: u32, pid: u32, on_reaper: bool, abandoned: bool) -> bool {
    reaper_pid == pid && !on_reaper && !abandoned
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
                    if let Some(event) = &event {
                        let _ = event.sync_unchecked();
                    }
                    release(item);
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

/// Releases one value on the reaper thread, its event complete: forgotten once the process is
/// past the exit drain's bound (`ABANDON`), else dropped. A value whose `Drop` panics (a user's
/// host-node closure or foreign owner) must not end the thread: unwinding out of its loop would
/// drop the channel's receiver, freeing every queued value at once, before its replay completed.
/// The panic is reported by the panic hook; the value is gone either way, and so is a panic
/// payload whose own `Drop` panics (see [`crate::catch::catch_all`]).
fn release(item: Box<dyn Any + Send>) {
    if ABANDON.load(Ordering::Acquire) {
        std::mem::forget(item);
    } else {
        crate::catch::catch_all(move || drop(item));
    }
}

/// Drops `item` once `event` has completed, on the reaper thread. If that thread cannot be
/// started, waits for the event here instead (blocking) and drops the item.
pub(crate) fn drop_after(event: Arc<PooledEvent>, item: Box<dyn Any + Send>) {
    hand_over(Some(event), item, false);
}

/// Drops `item` once `event` has completed (if given), on the reaper thread, for a value whose drop
/// the calling thread must not run (a page-locked buffer dropped by a thread that has a capture
/// open: see `driver::this_thread_captures`). If that thread cannot be started (or the process is
/// past the exit drain), the value is forgotten (leaked), never dropped here.
pub(crate) fn drop_elsewhere(event: Option<Arc<PooledEvent>>, item: Box<dyn Any + Send>) {
    hand_over(event, item, true);
}

fn hand_over(event: Option<Arc<PooledEvent>>, item: Box<dyn Any + Send>, never_here: bool) {
    if ABANDON.load(Ordering::Acquire) {
        // The process is exiting and the drain's bound has passed: the libraries may be tearing
        // down, so the value is forgotten, not dropped (the operating system takes it back).
        std::mem::forget(item);
        return;
    }
    let here = |event: Option<Arc<PooledEvent>>, item: Box<dyn Any + Send>| {
        if never_here {
            std::mem::forget(item);
            return;
        }
        if let Some(event) = event {
            let _ = event.sync_unchecked();
        }
        drop(item);
    };
    match sender() {
        Some(tx) => {
            QUEUED.fetch_add(1, Ordering::AcqRel);
            if let Err(std::sync::mpsc::SendError((event, item))) = tx.send((event, item)) {
                QUEUED.fetch_sub(1, Ordering::AcqRel);
                here(event, item);
            }
        }
        None => here(event, item),
    }
}

/// Registers the exit drain (see the module docs) with the C `atexit`: once when the reaper
/// thread starts, and again after a library is loaded whose destructors must run after it. The
/// first run to execute waits (at most [`EXIT_DRAIN_BOUND`]) and then sets `ABANDON`; every later
/// run returns at once, so the exit waits one bound in all.
pub(crate) fn drain_before_exit() {
    #[cfg(unix)]
    {
        extern "C" fn drain() {
            let waits = drain_waits(
                REAPER_PID.load(Ordering::Acquire),
                std::process::id(),
                ON_REAPER.with(|c| c.get()),
                ABANDON.load(Ordering::Acquire),
            );
            let start = std::time::Instant::now();
            while waits && QUEUED.load(Ordering::Acquire) > 0 && start.elapsed() < EXIT_DRAIN_BOUND {
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
    fn a_panicking_drop_does_not_unwind_out_of_release() {
        struct Panics(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Panics {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
                panic!("a kept value's Drop panics");
            }
        }
        let dropped = Arc::new(AtomicBool::new(false));
        release(Box::new(Panics(dropped.clone())));
        assert!(dropped.load(Ordering::SeqCst), "the value was dropped");
        let plain = Arc::new(AtomicBool::new(false));
        release(Box::new(Panics(plain.clone())));
        assert!(plain.load(Ordering::SeqCst), "and the next one too");
    }

    /// Found by review: a kept value whose `Drop` panics with a payload whose own `Drop` panics
    /// (`panic_any(Bomb)`) unwound out of `release` (the payload was dropped outside the catch),
    /// out of the reaper's loop, freeing every queued value before its work completed.
    #[test]
    fn a_panic_payload_whose_drop_panics_does_not_unwind_out_of_release() {
        struct Bomb;
        impl Drop for Bomb {
            fn drop(&mut self) {
                panic!("the payload's Drop panics too");
            }
        }
        struct ThrowsBomb(Arc<AtomicBool>);
        impl Drop for ThrowsBomb {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
                std::panic::panic_any(Bomb);
            }
        }
        let dropped = Arc::new(AtomicBool::new(false));
        let d = dropped.clone();
        let outer = std::panic::catch_unwind(move || release(Box::new(ThrowsBomb(d))));
        assert!(dropped.load(Ordering::SeqCst), "the value was dropped");
        assert!(outer.is_ok(), "release() unwound");
    }

    #[test]
    fn the_drain_waits_once_only_in_the_reapers_process_and_never_on_its_thread() {
        assert!(drain_waits(42, 42, false, false), "an ordinary thread of the reaper's process waits");
        assert!(!drain_waits(42, 42, true, false), "the reaper thread itself never waits");
        assert!(!drain_waits(42, 43, false, false), "a forked child (another pid) does not wait");
        assert!(!drain_waits(0, 42, false, false), "no reaper thread: nothing to wait for");
        assert!(!drain_waits(42, 42, false, true), "a second run of the handler does not wait again");
    }
}
