//! Choosing the stream each op runs on.
//!
//! A [`SchedulingPolicy`] hands out streams of one device. [`StreamPoolRoundRobin`] (the default,
//! 4 streams) cycles through a pool; [`SingleStream`] always returns one stream. `.sync()` and
//! `.await` use the policy of the *default device*; both are settable at run time, per device.
//!
//! **No races across streams.** Ops scheduled on different streams may run concurrently. Two ops
//! that touch the same buffer are still ordered: every buffer has a home stream, and `cuda-core`
//! joins any use on another stream to it with events (the other stream waits for the home stream
//! before the use; the home stream waits for the use after it). Writes need `&mut` or ownership,
//! so a write and another access can never be enqueued at the same time. Therefore scheduling can
//! change *when* work runs, never *what* it computes.

use crate::error::{DeviceError, Result};
use cuda_core::{Device, Stream};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

/// Decides the stream for each op. Implementations must be thread-safe.
pub trait SchedulingPolicy: Send + Sync {
    /// The device whose streams this policy hands out.
    fn device(&self) -> &Device;
    /// The stream for the next op.
    fn next_stream(&self) -> Result<Stream>;
}

/// Cycles through a fixed pool of streams.
pub struct StreamPoolRoundRobin {
    device: Device,
    streams: Vec<Stream>,
    next: AtomicUsize,
}

/// The size of the pool the default policy creates.
pub const DEFAULT_POOL_SIZE: usize = 4;

impl StreamPoolRoundRobin {
    /// A pool of `size` new non-blocking streams on `device`. A size of 0 is an error.
    pub fn new(device: &Device, size: usize) -> Result<Self> {
        if size == 0 {
            return Err(DeviceError::Scheduling("a stream pool needs at least one stream".into()));
        }
        let streams = (0..size).map(|_| Stream::new(device)).collect::<Result<Vec<_>, _>>()?;
        Ok(StreamPoolRoundRobin { device: *device, streams, next: AtomicUsize::new(0) })
    }

    /// The pool's streams, in the order they are handed out.
    pub fn streams(&self) -> &[Stream] {
        &self.streams
    }
}

impl SchedulingPolicy for StreamPoolRoundRobin {
    fn device(&self) -> &Device {
        &self.device
    }
    #[inline]
    fn next_stream(&self) -> Result<Stream> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.streams.len();
        Ok(self.streams[i].clone())
    }
}

/// Always the same stream: every op runs in submission order.
pub struct SingleStream {
    stream: Stream,
}

impl SingleStream {
    /// A policy that always returns `stream`.
    pub fn new(stream: Stream) -> Self {
        SingleStream { stream }
    }
}

impl SchedulingPolicy for SingleStream {
    fn device(&self) -> &Device {
        self.stream.device()
    }
    #[inline]
    fn next_stream(&self) -> Result<Stream> {
        Ok(self.stream.clone())
    }
}

static DEFAULT_DEVICE: AtomicUsize = AtomicUsize::new(0);

fn policies() -> &'static RwLock<HashMap<usize, Arc<dyn SchedulingPolicy>>> {
    static P: OnceLock<RwLock<HashMap<usize, Arc<dyn SchedulingPolicy>>>> = OnceLock::new();
    P.get_or_init(Default::default)
}

/// Makes device `ordinal` the one `.sync()` and `.await` use. An invalid ordinal is an error and
/// changes nothing.
pub fn set_default_device(ordinal: usize) -> Result<()> {
    Device::new(ordinal)?;
    DEFAULT_DEVICE.store(ordinal, Ordering::Release);
    Ok(())
}

/// The device `.sync()` and `.await` use (device 0 unless changed).
pub fn default_device() -> Result<Device> {
    Ok(Device::new(DEFAULT_DEVICE.load(Ordering::Acquire))?)
}

/// Sets the policy for the policy's own device. `.sync()` and `.await` use it whenever that device
/// is the default device.
pub fn set_policy(policy: Arc<dyn SchedulingPolicy>) {
    let ordinal = policy.device().ordinal();
    policies().write().unwrap_or_else(|e| e.into_inner()).insert(ordinal, policy);
}

/// The policy of device `ordinal`, created on first use as a [`StreamPoolRoundRobin`] of
/// [`DEFAULT_POOL_SIZE`] streams.
pub fn policy_for(ordinal: usize) -> Result<Arc<dyn SchedulingPolicy>> {
    if let Some(p) = policies().read().unwrap_or_else(|e| e.into_inner()).get(&ordinal) {
        return Ok(p.clone());
    }
    let device = Device::new(ordinal)?;
    let mut map = policies().write().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = map.get(&ordinal) {
        return Ok(p.clone());
    }
    let p: Arc<dyn SchedulingPolicy> = Arc::new(StreamPoolRoundRobin::new(&device, DEFAULT_POOL_SIZE)?);
    map.insert(ordinal, p.clone());
    Ok(p)
}

/// The policy `.sync()` and `.await` use: that of the default device.
pub fn default_policy() -> Result<Arc<dyn SchedulingPolicy>> {
    policy_for(DEFAULT_DEVICE.load(Ordering::Acquire))
}

pub use crate::await_spin::{
    await_spin, await_spin_policy, set_await_spin, set_await_spin_policy, AwaitSpin,
};

/// The default [`AwaitSpin::base`]: the spin of a first poll with no usable prediction.
pub const DEFAULT_AWAIT_SPIN: Duration = Duration::from_micros(5);

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
