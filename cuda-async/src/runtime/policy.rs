//! The completion engine's policy: how its threads learn of completions and trade CPU time for
//! wake-up latency. Public at `cuda_async::scheduling` (re-exported there, its historical home).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// How the completion engine (library-owned threads per device that check the pending awaited
/// ops and wake their tasks) learns of completions and trades CPU time for wake-up
/// latency.
///
/// ```
/// use cuda_async::scheduling::{completion_policy, set_completion_policy, CompletionPolicy};
/// use std::time::Duration;
/// // Four engine threads, each checking a quarter of the streams, and progress marks.
/// set_completion_policy(CompletionPolicy { engines: 4, marks: true, ..CompletionPolicy::default() });
/// assert_eq!(completion_policy().engines, 4);
/// set_completion_policy(CompletionPolicy::default());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletionPolicy {
    /// After the last completion it saw, the engine polls continuously (yielding between sweeps)
    /// for this long: completions in that window are seen within about a microsecond.
    pub hot: Duration,
    /// Past the hot window it sleeps between sweeps, doubling from 20 µs up to this (new work
    /// wakes it at once).
    pub max_nap: Duration,
    /// Engine threads per device (1 to [`MAX_ENGINES`]; default 2). Each watches the ops of the
    /// streams hashed to it, so more threads check more pending ops per microsecond. Measured
    /// with 64 tasks on 64 streams (`docs/results/completion.md`): one thread is the bottleneck
    /// (1.18x the raw wall time), two match raw threads at 1.15x their CPU, four buy 10% more
    /// throughput for 1.34x the CPU.
    pub engines: usize,
    /// Whether awaited ops end with a stream progress mark ([`cuda_core::progress`]: checked with
    /// one load, no driver call) instead of an event (one `cuEventQuery` per check; the
    /// default). Queuing a mark costs about 1.2 µs of host time against 0.2 µs for an event
    /// record, and under contention from many threads that costs more CPU than the cheaper
    /// checks save (measured: 1.49x the raw CPU per op against 1.15x); marks pay where few
    /// threads submit and many ops are pending.
    pub marks: bool,
}

impl Default for CompletionPolicy {
    fn default() -> Self {
        CompletionPolicy {
            hot: Duration::from_millis(2),
            max_nap: Duration::from_micros(500),
            engines: 2,
            marks: false,
        }
    }
}

/// The most engine threads per device ([`CompletionPolicy::engines`]).
pub const MAX_ENGINES: usize = 8;

static HOT_NS: AtomicU64 = AtomicU64::new(2_000_000);
static MAX_NAP_NS: AtomicU64 = AtomicU64::new(500_000);
static NO_MARKS: AtomicBool = AtomicBool::new(true);
static ENGINES: AtomicUsize = AtomicUsize::new(2);

/// Sets the completion engine's policy (every device's engine; takes effect at its next sweep,
/// and for `engines` and `marks` at the next awaited op). `hot` is at most 1 s, `max_nap` between
/// 20 µs and 10 ms (a longer nap would delay completions noticed after a quiet spell); `engines`
/// is clamped to 1..=[`MAX_ENGINES`] (threads once started keep running).
pub fn set_completion_policy(policy: CompletionPolicy) {
    HOT_NS.store(policy.hot.min(Duration::from_secs(1)).as_nanos() as u64, Ordering::Relaxed);
    let nap = policy.max_nap.clamp(Duration::from_micros(20), Duration::from_millis(10));
    MAX_NAP_NS.store(nap.as_nanos() as u64, Ordering::Relaxed);
    NO_MARKS.store(!policy.marks, Ordering::Relaxed);
    ENGINES.store(policy.engines.clamp(1, MAX_ENGINES), Ordering::Relaxed);
}

/// The completion engine's current policy (see [`set_completion_policy`]).
pub fn completion_policy() -> CompletionPolicy {
    CompletionPolicy {
        hot: Duration::from_nanos(HOT_NS.load(Ordering::Relaxed)),
        max_nap: Duration::from_nanos(MAX_NAP_NS.load(Ordering::Relaxed)),
        engines: ENGINES.load(Ordering::Relaxed),
        marks: !NO_MARKS.load(Ordering::Relaxed),
    }
}
