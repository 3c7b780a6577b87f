//! The completion engine: one library-owned thread per device that learns when awaited GPU work
//! has finished, and wakes the waiting futures from there.
//!
//! A future that is still pending after its first poll hands what marks the end of its work — an
//! event, or a stream progress mark ([`cuda_core::progress`]) under
//! [`CompletionPolicy::marks`](crate::scheduling::CompletionPolicy::marks) — and its
//! [`Completion`] to the engine of its device. The engine's threads (`cuda-async-completion`,
//! two per device by default, started on first use, each watching the streams hashed to it)
//! check the pending ops in each sweep — one `cuEventQuery` per event, one atomic load per mark,
//! and only the oldest unfinished op of each stream, since a stream's work finishes in order —
//! and complete those that finished, in a batch. **Wakers therefore run on this thread, never inside a CUDA driver callback**: a waker
//! (or the task it runs inline) may call CUDA, drop buffers, or block briefly without deadlocking
//! the driver. No host-function callback is queued on the stream at all.
//!
//! **No hang on a fault.** A mark is written by the GPU only if the work before it succeeded. While
//! marks are pending, the engine queries a private stream of the device every millisecond: after
//! a fault (a sticky error of the context) that query fails, and every pending mark is completed
//! with its error. An event whose query fails completes its op with that error's code.
//!
//! While ops are pending the thread polls continuously (yielding between sweeps) for a short
//! while after the last completion, then backs off to sleeps of growing length
//! ([`crate::scheduling::CompletionPolicy`]); with nothing pending it parks on a condition
//! variable, and only then does handing it an op cost a notify.

use crate::completion::Completion;
use crate::scheduling::{completion_policy, MAX_ENGINES};
use cuda_core::{PooledEvent, ProgressMark, Stream};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// What tells the engine that an op's work is done.
pub(crate) enum Wait {
    /// A stream progress mark: checked with one load per sweep. A mark is never reached if the
    /// work faulted, so the engine's fault probe covers it (see [`Engine::probe`]).
    Mark(ProgressMark),
    /// An event behind the work, queried each sweep (the default).
    Event(PooledEvent),
}

impl Wait {
    /// `Ok(true)` once done, `Err(code)` if the work failed (events only).
    pub(crate) fn poll(&self) -> Result<bool, u32> {
        match self {
            Wait::Mark(m) => Ok(m.is_reached()),
            Wait::Event(e) => e.query().map_err(|err| error_code(&err)),
        }
    }
}

struct Pending {
    wait: Wait,
    completion: Arc<Completion>,
    /// The stream the work was queued on (kept alive, so its handle names it while pending).
    stream: Stream,
}

/// New work for one engine thread, and whether that thread is asleep on [`Shard::wake`].
#[derive(Default)]
struct Inbox {
    ops: Vec<Pending>,
    /// Set by the engine thread (under the lock) just before it waits on the condition variable,
    /// cleared when it wakes. [`watch`] notifies only when it is set: a notify is a system call,
    /// and the engine re-checks the inbox under the same lock before every wait, so skipping it
    /// while the thread is awake cannot lose a wake-up.
    sleeping: bool,
}

/// One engine thread's share of a device's pending ops: all ops of a stream go to the same shard.
#[derive(Default)]
struct Shard {
    inbox: Mutex<Inbox>,
    wake: Condvar,
}

impl Shard {
    fn lock(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The completion engine of one device: up to [`MAX_ENGINES`] threads, each watching the ops of
/// the streams hashed to it, and the state the first-poll spin policy reads.
pub(crate) struct Engine {
    shards: [Shard; MAX_ENGINES],
    /// Whether each shard's thread is running (`false`: it could not be started).
    started: [OnceLock<bool>; MAX_ENGINES],
    /// Ops handed to this engine and not yet completed (read by the first-poll spin policy).
    pending: AtomicUsize,
    /// How long the last uncontended await on this device took from submission to completion,
    /// in nanoseconds (0: none yet). The first-poll spin policy's prediction.
    solo_ns: AtomicU64,
    /// A private stream of the device, queried every [`PROBE_EVERY`] while marks are pending: a
    /// fault (a sticky error of the context) is reported by every later driver call, this query
    /// included, and completes every pending mark with that error instead of leaving it waiting
    /// for a write that will never happen. Without it (its creation failed) ops wait on events.
    probe: Option<Stream>,
}

/// A partial sweep stops after finding this many streams with unfinished work.
const PARTIAL_MISSES: usize = 4;
/// The longest time between two sweeps that check every pending op.
const FULL_SWEEP_EVERY: Duration = Duration::from_micros(50);

/// How often the engine checks the device for a fault while progress marks are pending.
const PROBE_EVERY: Duration = Duration::from_millis(1);

impl Engine {
    /// Awaited ops of this device handed to the engine and not completed yet.
    pub(crate) fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// The duration of the last uncontended await on this device, if one was recorded.
    pub(crate) fn predicted(&self) -> Option<Duration> {
        match self.solo_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// Whether ops of this device may wait on progress marks (the fault probe exists).
    pub(crate) fn uses_marks(&self) -> bool {
        self.probe.is_some()
    }

    /// Records how long an await that had the device to itself took (the next prediction).
    pub(crate) fn record_solo(&self, took: Duration) {
        self.solo_ns.store((took.as_nanos() as u64).max(1), Ordering::Relaxed);
    }

    /// Starts shard `i`'s thread unless it runs (or could not start); whether it runs.
    fn start(&'static self, i: usize) -> bool {
        *self.started[i].get_or_init(|| {
            std::thread::Builder::new()
                .name("cuda-async-completion".into())
                .spawn(move || run(self, &self.shards[i]))
                .is_ok()
        })
    }

    /// The shard that watches `stream`'s ops under the current policy (shard 0 if another
    /// shard's thread cannot start).
    fn shard_for(&'static self, stream: &Stream) -> &'static Shard {
        let n = completion_policy().engines.clamp(1, MAX_ENGINES);
        let i = if n == 1 {
            0
        } else {
            let key = stream.raw() as usize as u64;
            (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize % n
        };
        if i != 0 && self.start(i) {
            &self.shards[i]
        } else {
            &self.shards[0]
        }
    }
}

/// Devices with ordinals below this find their engine without taking a lock.
const FAST: usize = 64;

/// The engine of device `ordinal`, started on first use (`None` if its first thread cannot start).
pub(crate) fn engine(ordinal: usize) -> Option<&'static Engine> {
    static FAST_ENGINES: [OnceLock<&'static Engine>; FAST] = [const { OnceLock::new() }; FAST];
    if let Some(e) = FAST_ENGINES.get(ordinal).and_then(OnceLock::get) {
        return Some(e);
    }
    static E: OnceLock<Mutex<HashMap<usize, &'static Engine>>> = OnceLock::new();
    let mut map = E.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = map.get(&ordinal) {
        return Some(e);
    }
    let e: &'static Engine = Box::leak(Box::new(Engine {
        shards: Default::default(),
        started: [const { OnceLock::new() }; MAX_ENGINES],
        pending: AtomicUsize::new(0),
        solo_ns: AtomicU64::new(0),
        probe: cuda_core::Device::new(ordinal).and_then(|d| Stream::new(&d)).ok(),
    }));
    if !e.start(0) {
        return None;
    }
    map.insert(ordinal, e);
    if let Some(slot) = FAST_ENGINES.get(ordinal) {
        // Only ever set here, under the map's lock, right after the engine was created.
        let _ = slot.set(e);
    }
    Some(e)
}

/// Completes `completion` (waking its waker, on an engine thread of the stream's device) once
/// `wait` is done or failed. If the engine cannot be started, waits for an event on this thread
/// (marks are only handed out by a running engine, see [`Engine::uses_marks`]).
pub(crate) fn watch(stream: &Stream, wait: Wait, completion: Arc<Completion>) {
    match (engine(stream.device().ordinal()), wait) {
        (Some(e), wait) => {
            e.pending.fetch_add(1, Ordering::Relaxed);
            let shard = e.shard_for(stream);
            let mut inbox = shard.lock();
            inbox.ops.push(Pending { wait, completion, stream: stream.clone() });
            let asleep = inbox.sleeping;
            drop(inbox);
            if asleep {
                shard.wake.notify_one();
            }
        }
        (None, Wait::Event(event)) => {
            let status = match event.synchronize() {
                Ok(()) => 0,
                Err(err) => error_code(&err),
            };
            completion.complete_with(status);
        }
        (None, Wait::Mark(mark)) => {
            // Unreachable in practice (a mark implies a running engine); never hang: a mark is
            // reached unless the work faulted, and then no status can be learned here.
            while !mark.is_reached() {
                std::thread::sleep(Duration::from_micros(50));
            }
            completion.complete_with(0);
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

/// One engine thread: sweeps its shard's pending ops until the process ends.
fn run(e: &'static Engine, shard: &'static Shard) {
    // Other threads' global-mode captures must not make our event queries fail.
    cuda_core::driver::relax_thread_capture_mode();
    let mut pending: Vec<Pending> = Vec::new();
    // Streams seen with an unfinished op in this sweep: work on one stream finishes in order, so
    // their later ops are not checked until the earlier one is done (one check per stream).
    let mut blocked: Vec<usize> = Vec::new();
    let mut last_progress = Instant::now();
    let mut nap = Duration::from_micros(20);
    let mut last_probe = Instant::now();
    let mut last_full = Instant::now();
    loop {
        {
            let mut inbox = shard.lock();
            while pending.is_empty() && inbox.ops.is_empty() {
                inbox.sleeping = true;
                inbox = shard.wake.wait(inbox).unwrap_or_else(|p| p.into_inner());
                inbox.sleeping = false;
                last_progress = Instant::now();
            }
            pending.append(&mut inbox.ops);
        }
        let before = pending.len();
        let complete = |p: &Pending, status: u32| {
            e.pending.fetch_sub(1, Ordering::Relaxed);
            // A panicking waker must not kill the engine (every other future would hang).
            let _ =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.completion.complete_with(status)));
        };
        let mut marks_left = false;
        blocked.clear();
        // Partial sweeps: `pending` is in hand-over order, close to the order in which the GPU
        // finishes the work, so a sweep stops checking once `PARTIAL_MISSES` streams were found
        // unfinished. A full sweep at least every `FULL_SWEEP_EVERY` bounds the delay of work that
        // finishes out of that order; no op is ever left unchecked for longer.
        let full = last_full.elapsed() >= FULL_SWEEP_EVERY;
        if full {
            last_full = Instant::now();
        }
        pending.retain(|p| {
            let key = p.stream.raw() as usize;
            let status = if blocked.contains(&key) || (!full && blocked.len() >= PARTIAL_MISSES) {
                None
            } else {
                match p.wait.poll() {
                    Ok(false) => {
                        blocked.push(key);
                        None
                    }
                    Ok(true) => Some(0),
                    Err(code) => Some(code),
                }
            };
            match status {
                None => {
                    marks_left |= matches!(p.wait, Wait::Mark(_));
                    true
                }
                Some(status) => {
                    complete(p, status);
                    false
                }
            }
        });
        if marks_left && last_probe.elapsed() >= PROBE_EVERY {
            last_probe = Instant::now();
            if let Some(Err(err)) = e.probe.as_ref().map(Stream::query) {
                // The context faulted: no pending mark will ever be written.
                let code = error_code(&err);
                pending.retain(|p| match p.wait {
                    Wait::Mark(_) => {
                        complete(p, code);
                        false
                    }
                    Wait::Event(_) => true,
                });
            }
        }
        let policy = completion_policy();
        if pending.len() < before {
            last_progress = Instant::now();
            nap = Duration::from_micros(20);
        } else if last_progress.elapsed() < policy.hot {
            std::thread::yield_now();
        } else {
            // Sleep, but wake early for new work.
            let mut inbox = shard.lock();
            if inbox.ops.is_empty() {
                inbox.sleeping = true;
                let (mut inbox, _) = shard.wake.wait_timeout(inbox, nap).unwrap_or_else(|p| p.into_inner());
                inbox.sleeping = false;
            }
            nap = (nap * 2).min(policy.max_nap);
        }
    }
}
