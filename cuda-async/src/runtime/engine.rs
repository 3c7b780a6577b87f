//! The completion engine: library-owned threads (per device) that learn when awaited GPU work has
//! finished, and wake the waiting futures from there.
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
//! with that error. An event whose query fails completes its op with the query's error. Either
//! way the future gets the typed [`cuda_core::Error`] as detected (the driver's code and name, and
//! the call that found it), never a number rebuilt into an error.
//!
//! While ops are pending the thread polls continuously (yielding between sweeps) for a short
//! while after the last completion, then backs off to sleeps of growing length
//! ([`crate::scheduling::CompletionPolicy`]); with nothing pending it parks on a condition
//! variable, and only then does handing it an op cost a notify.

use super::completion::Completion;
use super::policy::{completion_policy, MAX_ENGINES};
use super::sweep::sweep;
use cuda_core::{PooledEvent, ProgressMark, Stream};
use std::collections::HashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::task::Waker;
use std::time::{Duration, Instant};

/// The completion of an awaited op: its failure is the driver error that found the work failed.
pub(crate) type OpCompletion = Completion<cuda_core::Error>;

/// What tells the engine that an op's work is done.
pub(crate) enum Wait {
    /// A stream progress mark: checked with one load per sweep. A mark is never reached if the
    /// work faulted, so the engine's fault probe covers it (see [`Engine::probe`]).
    Mark(ProgressMark),
    /// An event behind the work, queried each sweep (the default).
    Event(PooledEvent),
}

impl Wait {
    /// `Ok(true)` once done, `Err` with the query's error if the work failed (events only).
    pub(crate) fn poll(&self) -> Result<bool, cuda_core::Error> {
        match self {
            Wait::Mark(m) => Ok(m.is_reached()),
            Wait::Event(e) => e.query(),
        }
    }
}

struct Pending {
    wait: Wait,
    completion: Arc<OpCompletion>,
    /// The handle of the stream the work was queued on, for the partial sweeps' per-stream rule.
    /// Only the handle: holding the stream would make the engine thread drop its last handle,
    /// which must happen on the thread that owns any capture still open on it. A handle reused by
    /// a new stream can only delay a partial sweep's check, never skip a full one.
    stream: usize,
    /// An early wake (see [`AwaitSpin::early_wake`](crate::scheduling::AwaitSpin::early_wake)):
    /// the task's waker, woken once at this instant if the op is still pending then.
    alarm: Option<Alarm>,
}

/// User code a sweep owes, run by [`run_wakers`] one item at a time under the watchdog's eye and
/// with panics caught, never inside the sweep (which holds the shard's state).
enum Owed {
    /// An early wake that is due.
    Wake(Waker),
    /// A completed op: its task's waker (if one is owed), then its record to drop. The record can
    /// hold the last handle of a user waker — an early-wake alarm that never fired (the op ended
    /// before it), or the waker left in the op's completion slot — and dropping a waker runs the
    /// user's `Drop`. Found by review: the sweep dropped it in place, and a `Drop` that panicked
    /// ended the shard's thread outside the watchdog's view, so every later await of the shard
    /// hung (`gpu_wakers::a_waker_whose_drop_panics_does_not_stop_the_engine`).
    Done(Option<Waker>, Pending),
}

/// A waker to wake at an instant (an early wake, shortly before an op's predicted end).
pub(crate) struct Alarm {
    pub(crate) at: Instant,
    pub(crate) waker: Waker,
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
    /// The ops being watched and the wakers owed, held by the shard's thread while it sweeps and
    /// released while it runs a waker or sleeps: a thread that takes the shard over (see
    /// [`Shard::in_waker`]) carries on from here.
    work: Mutex<Work>,
    /// When the shard's thread entered a user waker (nanoseconds since [`epoch`], never 0), or 0
    /// while it runs none. A waker is user code: one that blocks (sleeps, or waits for another op
    /// of this very shard) would stop the shard from completing anything. The engine's watchdog
    /// claims a waker that has run longer than [`STALL`] (compare-and-swap to 0) and starts a new
    /// thread for the shard; the stuck thread sees its claim gone when the waker returns (its own
    /// swap fails) and ends. Exactly one of the two swaps succeeds, so a shard never has two
    /// sweeping threads for long, and never none.
    in_waker: AtomicU64,
}

/// A shard's sweeping state (see [`Shard::work`]).
struct Work {
    pending: Vec<Pending>,
    /// Scratch space of the partial sweeps (see `runtime::sweep`).
    blocked: Vec<usize>,
    /// What the sweeps owe (wakers of completed ops and due alarms, and completed ops' records to
    /// drop), run in order after the sweep that queued them (see [`Owed`]).
    wakers: VecDeque<Owed>,
    last_progress: Instant,
    nap: Duration,
    last_probe: Instant,
    last_full: Instant,
}

impl Default for Work {
    fn default() -> Work {
        let now = Instant::now();
        Work {
            pending: Vec::new(),
            blocked: Vec::new(),
            wakers: VecDeque::new(),
            last_progress: now,
            nap: Duration::from_micros(20),
            last_probe: now,
            last_full: now,
        }
    }
}

impl Shard {
    fn lock(&self) -> MutexGuard<'_, Inbox> {
        self.inbox.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn work(&self) -> MutexGuard<'_, Work> {
        self.work.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// How long a waker may run on an engine thread before the watchdog gives its shard to a new
/// thread.
const STALL: Duration = Duration::from_millis(1);

/// The engine's clock: [`Shard::in_waker`] holds nanoseconds since this instant, plus one.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ns() -> u64 {
    epoch().elapsed().as_nanos() as u64 + 1
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
    probe: OnceLock<Option<Stream>>,
    /// The device's ordinal (for making the probe).
    ordinal: usize,
}

/// The longest time between two sweeps that check every pending op (see [`super::sweep`]).
const FULL_SWEEP_EVERY: Duration = Duration::from_micros(50);

/// How often the engine checks the device for a fault while progress marks are pending.
const PROBE_EVERY: Duration = Duration::from_millis(1);

/// How long before an early-wake alarm a napping engine thread stops sleeping and stays hot
/// (yields) until the alarm is due. A timed sleep ends late by the kernel's timer slack (50 µs by
/// default on Linux) plus the wake-up latency; an alarm fired that late misses its op's end when the
/// lead ([`AwaitSpin::early_wake`](crate::scheduling::AwaitSpin::early_wake), 100 µs) is no
/// longer. On the H100 with 3 ms ops (longer than the 2 ms hot window, so the engine naps) beside
/// sanitizer processes, 3 of 5 alarms fired in time without this margin; with it the test passed
/// alone (4 of 5). Under racecheck, which slows every driver call, 2 or 3 of 5 still do.
const ALARM_MARGIN: Duration = Duration::from_micros(150);

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

    /// Whether ops of this device may wait on progress marks: the fault probe exists (made on the
    /// first call, i.e. only once marks are asked for; creating a stream can take a while when
    /// the device is busy, and the default path must not pay for it).
    pub(crate) fn uses_marks(&self) -> bool {
        self.probe
            .get_or_init(|| cuda_core::Device::new(self.ordinal).and_then(|d| Stream::new(&d)).ok())
            .is_some()
    }

    /// Records how long an await that had the device to itself took (the next prediction).
    pub(crate) fn record_solo(&self, took: Duration) {
        self.solo_ns.store((took.as_nanos() as u64).max(1), Ordering::Relaxed);
    }

    /// Starts shard `i`'s thread unless it runs (or could not start); whether it runs.
    fn start(&'static self, i: usize) -> bool {
        *self.started[i].get_or_init(|| {
            let ok = spawn_shard(self, &self.shards[i]);
            if ok {
                watchdog::watch_shard(self, &self.shards[i]);
            }
            ok
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
    // Made once per device and kept even if its first thread cannot start (then every call
    // answers `None` without making another engine).
    let e: &'static Engine = map.entry(ordinal).or_insert_with(|| {
        Box::leak(Box::new(Engine {
            shards: Default::default(),
            started: [const { OnceLock::new() }; MAX_ENGINES],
            pending: AtomicUsize::new(0),
            solo_ns: AtomicU64::new(0),
            probe: OnceLock::new(),
            ordinal,
        }))
    });
    if !e.start(0) {
        return None;
    }
    if let Some(slot) = FAST_ENGINES.get(ordinal) {
        // Only ever set here, under the map's lock, once the engine's first thread runs.
        let _ = slot.set(e);
    }
    Some(e)
}

/// Completes `completion` (waking its waker, on an engine thread of the stream's device) once
/// `wait` is done or failed. If the engine cannot be started, or when called on an engine thread,
/// waits for the event on this thread (marks are only used off engine threads with a running
/// engine, see [`Engine::uses_marks`]). `engine` is what [`engine()`] returned for the stream's
/// device (looked up once per await by the caller).
pub(crate) fn watch(
    engine: Option<&'static Engine>,
    stream: &Stream,
    wait: Wait,
    completion: Arc<OpCompletion>,
    alarm: Option<Alarm>,
) {
    // On an engine thread (a waker that runs a task inline and awaits again), handing the op to
    // an engine could mean handing it to this very thread, which is busy: wait here instead.
    let engine = engine.filter(|_| !on_engine_thread());
    match (engine, wait) {
        (Some(e), wait) => {
            e.pending.fetch_add(1, Ordering::Relaxed);
            let shard = e.shard_for(stream);
            let mut inbox = shard.lock();
            if matches!(wait, Wait::Mark(_)) {
                MARKS_WATCHED.fetch_add(1, Ordering::Relaxed);
            }
            inbox.ops.push(Pending { wait, completion, stream: stream.raw() as usize, alarm });
            let asleep = inbox.sleeping;
            drop(inbox);
            if asleep {
                shard.wake.notify_one();
            }
        }
        (None, Wait::Event(event)) => match event.synchronize() {
            Ok(()) => completion.complete(),
            Err(err) => completion.fail(err),
        },
        (None, Wait::Mark(_)) => {
            // Unreachable: marks are only handed out while an engine runs. Never wait on a mark
            // without the engine's fault probe (a faulted stream never writes it): fail instead.
            completion.fail(cuda_core::Error::InvalidArgument(
                "an awaited op's progress mark could not be watched: no completion engine runs".into(),
            ));
        }
    }
}

/// Progress marks handed to an engine since the process started (a test hook: whether the mark
/// path was taken).
static MARKS_WATCHED: AtomicU64 = AtomicU64::new(0);

/// How many awaited ops were handed to an engine with a progress mark (not an event) so far.
#[doc(hidden)]
pub fn marks_watched() -> u64 {
    MARKS_WATCHED.load(Ordering::Relaxed)
}

/// Early wakes fired since the process started (a test hook: see
/// [`AwaitSpin::early_wake`](crate::scheduling::AwaitSpin::early_wake)).
static EARLY_WAKES: AtomicU64 = AtomicU64::new(0);

/// How many early wakes the completion engine has fired so far (a test hook).
#[doc(hidden)]
pub fn early_wakes() -> u64 {
    EARLY_WAKES.load(Ordering::Relaxed)
}

/// Early-woken polls whose spin window ended before the work did (counted by the future).
pub(crate) static EARLY_SPIN_MISSES: AtomicU64 = AtomicU64::new(0);

/// How many early-woken polls gave up spinning because the work outlasted the window (the
/// prediction was short); the engine completed those ops as usual (a diagnostic hook).
#[doc(hidden)]
pub fn early_spin_misses() -> u64 {
    EARLY_SPIN_MISSES.load(Ordering::Relaxed)
}

thread_local! {
    /// Set on engine threads: a waker that runs a task inline there and awaits again must not
    /// hand its op to the engine it is blocking.
    static ON_ENGINE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is an engine thread (see `ON_ENGINE`).
pub(crate) fn on_engine_thread() -> bool {
    ON_ENGINE.with(|f| f.get())
}

/// Starts a thread sweeping `shard` (at first use, or to take over from a thread stuck in a
/// waker); whether it started.
fn spawn_shard(e: &'static Engine, shard: &'static Shard) -> bool {
    std::thread::Builder::new().name("cuda-async-completion".into()).spawn(move || run(e, shard)).is_ok()
}

/// One engine thread: sweeps its shard's pending ops until the process ends, or until the
/// watchdog gave the shard to a new thread while this one was stuck in a waker.
fn run(e: &'static Engine, shard: &'static Shard) {
    // Other threads' global-mode captures must not make our event queries fail.
    cuda_core::driver::relax_thread_capture_mode();
    ON_ENGINE.with(|f| f.set(true));
    loop {
        let mut guard = shard.work();
        let work = &mut *guard;
        {
            let mut inbox = shard.lock();
            while work.pending.is_empty() && work.wakers.is_empty() && inbox.ops.is_empty() {
                inbox.sleeping = true;
                inbox = shard.wake.wait(inbox).unwrap_or_else(|p| p.into_inner());
                inbox.sleeping = false;
                work.last_progress = Instant::now();
            }
            work.pending.append(&mut inbox.ops);
        }
        let before = work.pending.len();
        let wakers = &mut work.wakers;
        // Completes the op at once (a poll sees `Ready` from here on) and queues its waker and
        // its record, run and dropped below once the sweep is over and the shard's state is
        // released (see `Owed::Done`).
        let mut complete = |p: Pending, outcome: Result<(), cuda_core::Error>| {
            e.pending.fetch_sub(1, Ordering::Relaxed);
            let w = p.completion.complete_deferred(outcome.err());
            wakers.push_back(Owed::Done(w, p));
        };
        let full = work.last_full.elapsed() >= FULL_SWEEP_EVERY;
        if full {
            work.last_full = Instant::now();
        }
        let check = |p: &Pending| match p.wait.poll() {
            Ok(false) => None,
            Ok(true) => Some(Ok(())),
            Err(err) => Some(Err(err)),
        };
        sweep(&mut work.pending, full, &mut work.blocked, |p| p.stream, check, &mut complete);
        let marks_left = work.pending.iter().any(|p| matches!(p.wait, Wait::Mark(_)));
        if marks_left && work.last_probe.elapsed() >= PROBE_EVERY {
            work.last_probe = Instant::now();
            if let Some(Err(err)) = e.probe.get().and_then(Option::as_ref).map(Stream::query) {
                // The context faulted: no pending mark will ever be written. Marks already reached
                // (their work finished before the fault) still succeed.
                // Every unreached mark fails with the probe's error (a clone each: one waiter per op).
                let marks: Vec<Pending> =
                    work.pending.extract_if(.., |p| matches!(p.wait, Wait::Mark(_))).collect();
                for p in marks {
                    let reached = matches!(&p.wait, Wait::Mark(m) if m.is_reached());
                    complete(p, if reached { Ok(()) } else { Err(err.clone()) });
                }
            }
        }
        // Early wakes that are due: the op is still pending, its task wants to be polled now
        // (it spins for the last stretch). Each fires once.
        let now = Instant::now();
        let mut next_alarm: Option<Instant> = None;
        for p in work.pending.iter_mut() {
            match p.alarm.as_ref().map(|a| a.at) {
                Some(at) if at <= now => {
                    if let Some(a) = p.alarm.take() {
                        EARLY_WAKES.fetch_add(1, Ordering::Relaxed);
                        work.wakers.push_back(Owed::Wake(a.waker));
                        // The woken task now spins for the op's last stretch: stay hot (no nap)
                        // so that its completion is seen within the spin window.
                        work.last_progress = now;
                        work.nap = Duration::from_micros(20);
                    }
                }
                Some(at) => next_alarm = Some(next_alarm.map_or(at, |n| n.min(at))),
                None => {}
            }
        }
        let progressed = work.pending.len() < before;
        if progressed {
            work.last_progress = Instant::now();
            work.nap = Duration::from_micros(20);
        }
        let (last_progress, nap) = (work.last_progress, work.nap);
        let owed = !work.wakers.is_empty();
        drop(guard);
        if owed {
            if !run_wakers(shard) {
                return; // the shard is another thread's now
            }
            continue;
        }
        let policy = completion_policy();
        if progressed {
            continue;
        }
        // An alarm due within the margin: stay hot until it (a timed sleep could end too late).
        let alarm_near =
            next_alarm.is_some_and(|at| at.saturating_duration_since(Instant::now()) <= ALARM_MARGIN);
        if alarm_near || last_progress.elapsed() < policy.hot {
            std::thread::yield_now();
        } else {
            // Sleep, but wake early for new work, and the margin before an alarm.
            let nap = next_alarm.map_or(nap, |at| {
                nap.min(at.saturating_duration_since(Instant::now()).saturating_sub(ALARM_MARGIN))
            });
            let mut inbox = shard.lock();
            if inbox.ops.is_empty() && !nap.is_zero() {
                inbox.sleeping = true;
                let (mut inbox, _) = shard.wake.wait_timeout(inbox, nap).unwrap_or_else(|p| p.into_inner());
                inbox.sleeping = false;
            }
            let mut work = shard.work();
            work.nap = (work.nap * 2).min(policy.max_nap);
        }
    }
}

/// Runs the wakers `shard` owes, one at a time, each under the watchdog's eye (see
/// [`Shard::in_waker`]). Returns `false` if the watchdog gave the shard to a new thread while a
/// waker ran here: the calling thread must then end without touching the shard again.
fn run_wakers(shard: &'static Shard) -> bool {
    loop {
        let Some(owed) = shard.work().wakers.pop_front() else {
            return true;
        };
        let since = now_ns();
        shard.in_waker.store(since, Ordering::SeqCst);
        match owed {
            Owed::Wake(waker) => guarded(|| waker.wake()),
            Owed::Done(waker, record) => {
                if let Some(waker) = waker {
                    guarded(|| waker.wake());
                }
                // Apart from the wake: a drop that panics while a wake's panic unwinds would
                // abort the process.
                guarded(move || drop(record));
            }
        }
        loop {
            match shard.in_waker.compare_exchange(since, 0, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => break,
                // The watchdog is starting a new thread for the shard: wait for the outcome.
                Err(CLAIMED) => std::thread::yield_now(),
                // Handed over: a new thread sweeps the shard (and runs the wakers still owed).
                // Let any thread parked on the shard look again, then end.
                Err(_) => {
                    shard.wake.notify_all();
                    return false;
                }
            }
        }
    }
}

/// Runs user code (a wake, or a drop of a waker) on an engine thread: a panic must not kill the
/// engine (every other future would hang), nor a panic payload whose own `Drop` panics (dropped
/// outside the catch, it would unwind out of this thread; the watchdog would then hand the shard
/// over, but only after its threshold).
fn guarded(f: impl FnOnce()) {
    if let Err(payload) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        if let Err(again) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(payload))) {
            std::mem::forget(again);
        }
    }
}

/// [`Shard::in_waker`] while the watchdog starts a new thread for a shard whose waker it claimed
/// (never a timestamp: `now_ns` would need 584 years to reach it).
const CLAIMED: u64 = u64::MAX;

/// The engine's watchdog: one thread per process that gives a shard whose thread is stuck in a
/// user waker to a new thread (see [`Shard::in_waker`]).
mod watchdog {
    use super::{epoch, now_ns, spawn_shard, Engine, Shard, CLAIMED, STALL};
    use std::sync::atomic::Ordering;
    use std::sync::{Mutex, OnceLock};
    use std::time::Duration;

    /// The shards watched (every shard whose first thread started).
    static SHARDS: Mutex<Vec<(&'static Engine, &'static Shard)>> = Mutex::new(Vec::new());

    /// How often the watchdog looks while awaited ops are pending, and while none are.
    const BUSY_TICK: Duration = STALL;
    const IDLE_TICK: Duration = Duration::from_millis(10);

    /// Adds `shard` to the watched set (starting the watchdog on first use).
    pub(super) fn watch_shard(e: &'static Engine, shard: &'static Shard) {
        SHARDS.lock().unwrap_or_else(|p| p.into_inner()).push((e, shard));
        static STARTED: OnceLock<bool> = OnceLock::new();
        STARTED.get_or_init(|| {
            let _ = epoch();
            std::thread::Builder::new().name("cuda-async-watchdog".into()).spawn(run).is_ok()
        });
    }

    fn run() {
        loop {
            let shards: Vec<_> = SHARDS.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let mut busy = false;
            for (e, shard) in shards {
                busy |= e.pending() > 0;
                let since = shard.in_waker.load(Ordering::SeqCst);
                if since == 0 || now_ns().saturating_sub(since) < STALL.as_nanos() as u64 {
                    busy |= since != 0;
                    continue;
                }
                // Claim the stuck waker; if it returned meanwhile, its thread keeps the shard.
                // While claimed, the stuck thread (if its waker returns) waits for the outcome.
                if shard.in_waker.compare_exchange(since, CLAIMED, Ordering::SeqCst, Ordering::SeqCst).is_ok()
                {
                    if spawn_shard(e, shard) {
                        TAKEOVERS.fetch_add(1, Ordering::Relaxed);
                        // Handed over (the new thread may already have stamped a waker of its own).
                        let _ =
                            shard.in_waker.compare_exchange(CLAIMED, 0, Ordering::SeqCst, Ordering::SeqCst);
                    } else {
                        // No thread could be started: the stuck one keeps the shard.
                        shard.in_waker.store(since, Ordering::SeqCst);
                    }
                }
            }
            std::thread::sleep(if busy { BUSY_TICK } else { IDLE_TICK });
        }
    }

    /// How many times a shard was given to a new thread because a waker blocked (a test hook).
    pub(super) static TAKEOVERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
}

/// How many times the completion engine gave a shard to a new thread because a user waker ran
/// longer than its stall limit (1 ms) on an engine thread (a test hook).
#[doc(hidden)]
pub fn waker_takeovers() -> u64 {
    watchdog::TAKEOVERS.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use std::task::Wake;

    /// A panic payload whose own `Drop` panics.
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("the payload's Drop panics too");
        }
    }
    struct Throws;
    impl Wake for Throws {
        fn wake(self: Arc<Self>) {
            std::panic::panic_any(Bomb);
        }
    }
    struct Counts(AtomicUsize);
    impl Wake for Counts {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Found by review: a waker that panics with a payload whose `Drop` panics unwound out of
    /// `run_wakers` (the payload was dropped outside the catch), ending the shard's thread with
    /// the wakers after it still owed.
    #[test]
    fn a_waker_panicking_with_a_panicking_payload_does_not_end_the_shards_thread() {
        let shard: &'static Shard = Box::leak(Box::default());
        let counts = Arc::new(Counts(AtomicUsize::new(0)));
        {
            let mut w = shard.work();
            w.wakers.push_back(Owed::Wake(Arc::new(Throws).into()));
            w.wakers.push_back(Owed::Wake(counts.clone().into()));
        }
        let r = std::panic::catch_unwind(|| run_wakers(shard));
        assert!(matches!(r, Ok(true)), "run_wakers unwound or gave the shard away");
        assert_eq!(counts.0.load(Ordering::SeqCst), 1, "the waker after it ran");
        assert_eq!(shard.in_waker.load(Ordering::SeqCst), 0);
    }
}
