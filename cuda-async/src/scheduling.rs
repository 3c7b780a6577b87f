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
use std::sync::atomic::{AtomicUsize, Ordering};
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
    let replaced = policies().write().unwrap_or_else(|e| e.into_inner()).insert(ordinal, policy);
    // Dropped after the write lock (a separate statement): a user policy's `Drop` that reached
    // the scheduler would otherwise wait for a read lock under its own thread's write lock
    // (found by review: a hang).
    drop(replaced);
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

pub use crate::runtime::await_spin::{
    await_spin, await_spin_policy, set_await_spin, set_await_spin_policy, AwaitSpin,
};

/// The default [`AwaitSpin::base`]: the spin of a first poll with no usable prediction.
pub const DEFAULT_AWAIT_SPIN: Duration = Duration::from_micros(5);

pub use crate::runtime::policy::{completion_policy, set_completion_policy, CompletionPolicy, MAX_ENGINES};
