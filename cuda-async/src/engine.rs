//! The completion engine: one library-owned thread per device that learns when awaited GPU work
//! has finished, and wakes the waiting futures from there.
//!
//! A future that is still pending after its first poll hands an event recorded behind its work and
//! its [`Completion`] to the engine of the event's device. The engine thread
//! (`cuda-async-completion`, started on first use) polls the events of every pending op in each
//! sweep and completes those that finished, in a batch. **Wakers therefore run on this thread, never inside a CUDA driver callback**: a waker (or
//! the task it runs inline) may call CUDA, drop buffers, or block briefly without deadlocking the
//! driver. No host-function callback is queued on the stream at all.
//!
//! While ops are pending the thread polls continuously (yielding between sweeps) for a short
//! while after the last completion, then backs off to sleeps of growing length
//! ([`crate::scheduling::CompletionPolicy`]); with nothing pending it parks on a condition
//! variable. An event whose query fails (a faulted kernel, a dead
//! context) completes its op with that error's code.

use crate::completion::Completion;
use crate::scheduling::completion_policy;
use cuda_core::PooledEvent;
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

struct Pending {
    event: PooledEvent,
    completion: Arc<Completion>,
}

struct Engine {
    inbox: Mutex<Vec<Pending>>,
    wake: Condvar,
}

/// The engine of device `ordinal`, started on first use (`None` if its thread cannot start).
fn engine(ordinal: usize) -> Option<&'static Engine> {
    static E: OnceLock<Mutex<HashMap<usize, &'static Engine>>> = OnceLock::new();
    let mut map = E.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = map.get(&ordinal) {
        return Some(e);
    }
    let e: &'static Engine =
        Box::leak(Box::new(Engine { inbox: Mutex::new(Vec::new()), wake: Condvar::new() }));
    std::thread::Builder::new().name("cuda-async-completion".into()).spawn(move || run(e)).ok()?;
    map.insert(ordinal, e);
    Some(e)
}

/// Completes `completion` (waking its waker, on the engine thread of the event's device) once
/// `event` has completed or failed. If the engine thread cannot be started, waits for the event on
/// this thread.
pub(crate) fn watch(event: PooledEvent, completion: Arc<Completion>) {
    match engine(event.device().ordinal()) {
        Some(e) => {
            e.inbox.lock().unwrap_or_else(|p| p.into_inner()).push(Pending { event, completion });
            e.wake.notify_one();
        }
        None => {
            let status = match event.synchronize() {
                Ok(()) => 0,
                Err(err) => error_code(&err),
            };
            completion.complete_with(status);
        }
    }
}

/// The `CUresult` code of a driver error (`CUDA_ERROR_UNKNOWN` for anything else).
pub(crate) fn error_code(e: &cuda_core::Error) -> u32 {
    match e {
        cuda_core::Error::Driver { code, .. } => *code,
        _ => 999,
    }
}

fn run(e: &'static Engine) {
    // Other threads' global-mode captures must not make our event queries fail.
    cuda_core::driver::relax_thread_capture_mode();
    let mut pending: Vec<Pending> = Vec::new();
    let mut last_progress = Instant::now();
    let mut nap = Duration::from_micros(20);
    loop {
        {
            let mut inbox = e.inbox.lock().unwrap_or_else(|p| p.into_inner());
            while pending.is_empty() && inbox.is_empty() {
                inbox = e.wake.wait(inbox).unwrap_or_else(|p| p.into_inner());
                last_progress = Instant::now();
            }
            pending.append(&mut inbox);
        }
        let before = pending.len();
        pending.retain(|p| {
            let status = match p.event.query() {
                Ok(false) => return true,
                Ok(true) => 0,
                Err(err) => error_code(&err),
            };
            // A panicking waker must not kill the engine (every other future would hang).
            let _ =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.completion.complete_with(status)));
            false
        });
        if pending.len() < before {
            last_progress = Instant::now();
            nap = Duration::from_micros(20);
        } else if last_progress.elapsed() < completion_policy().hot {
            std::thread::yield_now();
        } else {
            // Sleep, but wake early for new work.
            let inbox = e.inbox.lock().unwrap_or_else(|p| p.into_inner());
            if inbox.is_empty() {
                let _ = e.wake.wait_timeout(inbox, nap);
            }
            nap = (nap * 2).min(completion_policy().max_nap);
        }
    }
}
