//! Events: markers in a stream that the host or other streams can wait on.

use crate::device::Device;
use crate::driver::result;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// A CUDA event, with or without timing. Dropping it never blocks: the driver releases an event
/// that is still pending once it completes.
///
/// An event remembers whether its last record was made inside a stream capture (its *tag*). Such
/// an event has no completion of its own: waiting on it from another stream would fork the capture
/// (refused by `Stream::wait_event`), and [`Event::query`], [`Event::synchronize`] and
/// [`Event::elapsed_ms`] refuse it with [`Error::Capture`] until it is recorded again outside a
/// capture.
///
/// ```no_run
/// # fn main() -> cuda_core::Result<()> {
/// use cuda_core::{Device, DeviceBuffer, Event};
/// let dev = Device::new(0)?;
/// let s = dev.new_stream()?;
/// let mut buf = DeviceBuffer::<f32>::zeros(&s, 1 << 20)?;
/// let done = Event::new(&dev, false)?; // untimed: cheaper to record and wait on
/// buf.fill(&s, 1.0)?;
/// done.record(&s)?; // completes once the fill has
/// done.synchronize()?; // blocks the host until then
/// assert!(done.query()?);
/// # Ok(()) }
/// ```
pub struct Event {
    device: Device,
    raw: sys::CUevent,
    timing: bool,
    /// The capture id of the last record (0: recorded eagerly or never). Held across a record, a
    /// query and the check of a wait, so that a record on another thread cannot come between the
    /// check and the driver call.
    tag: Mutex<u64>,
    /// Threads in [`Event::synchronize`] (counted in under the tag lock, after its check): a
    /// record into a capture is refused while one waits (see [`Event::synchronize`]).
    waiters: AtomicUsize,
}

// SAFETY: CUevent handles may be used from any thread; the driver synchronises access.
unsafe impl Send for Event {}
// SAFETY: as above; `&Event` only exposes driver calls that are thread-safe.
unsafe impl Sync for Event {}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Event({:p}, timing: {})", self.raw, self.timing)
    }
}

/// How many idle events a device's pool keeps; more are destroyed when returned.
const POOL_CAP: usize = 256;

/// An untimed [`Event`] taken from its device's pool, returned to the pool on drop instead of
/// being destroyed. Reuse is safe: a stream wait or query binds to the record that preceded it,
/// so a later re-record by the next user changes nothing for earlier waiters; and an event whose
/// last record was made inside a stream capture is destroyed on drop, never pooled, so no user
/// gets a handle that still belongs to a capture.
///
/// ```no_run
/// # fn main() -> cuda_core::Result<()> {
/// use cuda_core::{CaptureMode, Device, Event};
/// let dev = Device::new(0)?;
/// let (capturing, other) = (dev.new_stream()?, dev.new_stream()?);
/// capturing.begin_capture(CaptureMode::ThreadLocal)?;
/// let ev = Event::pooled(&dev)?;
/// ev.record(&capturing)?; // inside the capture
/// drop(ev); // destroyed, not pooled
/// let fresh = Event::pooled(&dev)?; // never the captured handle
/// fresh.record(&other)?;
/// other.wait_event(&fresh)?; // `other` stays out of the capture
/// capturing.end_capture()?;
/// # Ok(()) }
/// ```
pub struct PooledEvent {
    event: std::mem::ManuallyDrop<Event>,
}

impl std::ops::Deref for PooledEvent {
    type Target = Event;
    fn deref(&self) -> &Event {
        &self.event
    }
}

impl Drop for PooledEvent {
    fn drop(&mut self) {
        // Capture membership travels with the handle: the driver remembers that the last record
        // was made inside a capture, and a wait on the handle would pull the waiting stream into
        // that capture. So an event whose last record was captured (tag != 0) never goes back to
        // the pool, where it would come out looking untouched: it is destroyed instead, and the
        // next `Event::pooled` creates a fresh one.
        let tagged = *self.event.lock_tag() != 0;
        let mut pool = self.event.device.inner().event_pool.lock().unwrap_or_else(|e| e.into_inner());
        if !tagged && pool.len() < POOL_CAP {
            pool.push(self.event.raw);
        } else {
            drop(pool);
            // SAFETY: taken exactly once, here, and `self.event` is not used afterwards.
            unsafe { std::mem::ManuallyDrop::drop(&mut self.event) };
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.device.bind_in_drop() {
            // SAFETY: we own the handle; the driver defers release of a pending event.
            crate::error::note_drop(unsafe { result::event_destroy(self.raw) });
        }
    }
}

impl Event {
    /// Creates an event on `device`. With `timing == false` the event is cheaper to record and
    /// wait on (`CU_EVENT_DISABLE_TIMING`) but [`Event::elapsed_ms`] is an error.
    ///
    /// # Errors
    /// Driver errors creating the event.
    pub fn new(device: &Device, timing: bool) -> Result<Event> {
        device.bind()?;
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT as u32
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
        };
        // SAFETY: context bound.
        let raw = unsafe { result::event_create(flags) }?;
        Ok(Event { device: *device, raw, timing, tag: Mutex::new(0), waiters: AtomicUsize::new(0) })
    }

    /// An untimed event from `device`'s pool (created if the pool is empty). Cheaper than
    /// [`Event::new`] when events are needed per operation.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, Event};
    /// let dev = Device::new(0)?;
    /// let s = dev.new_stream()?;
    /// let ev = Event::pooled(&dev)?; // derefs to `Event`
    /// ev.record(&s)?;
    /// ev.synchronize()?;
    /// drop(ev); // back to the pool, not destroyed
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Driver errors creating an event when the pool is empty.
    pub fn pooled(device: &Device) -> Result<PooledEvent> {
        let reused = device.inner().event_pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let event = match reused {
            Some(raw) => Event {
                device: *device,
                raw,
                timing: false,
                tag: Mutex::new(0),
                waiters: AtomicUsize::new(0),
            },
            None => Event::new(device, false)?,
        };
        Ok(PooledEvent { event: std::mem::ManuallyDrop::new(event) })
    }

    /// The raw handle, valid while `self` lives.
    pub fn raw(&self) -> sys::CUevent {
        self.raw
    }

    /// The device the event belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Whether the event records timestamps.
    pub fn is_timing(&self) -> bool {
        self.timing
    }

    pub(crate) fn lock_tag(&self) -> MutexGuard<'_, u64> {
        self.tag.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The tag lock, after checking that the last record was not made inside a capture.
    fn untagged(&self, what: &'static str) -> Result<MutexGuard<'_, u64>> {
        let tag = self.lock_tag();
        if *tag != 0 {
            return Err(Error::Capture(what));
        }
        Ok(tag)
    }

    /// Whether a thread is in [`Event::synchronize`] on this event. Meaningful with the tag lock
    /// held (no new waiter can be counted in then).
    pub(crate) fn has_waiters(&self) -> bool {
        self.waiters.load(Ordering::Acquire) > 0
    }

    /// Non-blocking: `true` once the recorded work has completed (or if never recorded). The
    /// check and the query are made under the event's tag lock, so no record into a capture on
    /// another thread comes between them (querying a captured event is an error that can break
    /// the capture).
    ///
    /// # Errors
    /// [`Error::Capture`] if the last record was made inside a capture; driver errors (e.g. the
    /// recorded work faulted).
    pub fn query(&self) -> Result<bool> {
        let _tag = self.untagged("querying an event recorded inside a stream capture")?;
        self.device.bind()?;
        // SAFETY: live event.
        unsafe { result::event_query(self.raw) }
    }

    /// Blocks until the recorded work has completed. The wait is made without the event's tag
    /// lock (another thread may record the event meanwhile: the wait binds to the record before
    /// it), but counted in under it, and a record of the event into a capture is refused
    /// ([`Error::Capture`]) while a wait is in flight: waiting on an event whose last record is in
    /// a capture is an error that can break the capture.
    ///
    /// # Errors
    /// [`Error::Capture`] if the last record was made inside a capture; driver errors.
    pub fn synchronize(&self) -> Result<()> {
        let _waiting = {
            let _tag = self.untagged("waiting for an event recorded inside a stream capture")?;
            self.waiters.fetch_add(1, Ordering::Relaxed);
            EventWaiting(&self.waiters)
        };
        self.sync_unchecked()
    }

    /// `cuEventSynchronize` without the tag check (for the crate's private events).
    pub(crate) fn sync_unchecked(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: live event.
        unsafe { result::event_synchronize(self.raw) }
    }

    /// Milliseconds between `start` and `end`, both timing events that have completed.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, DeviceBuffer, Error, Event};
    /// let dev = Device::new(0)?;
    /// let s = dev.new_stream()?;
    /// let mut buf = DeviceBuffer::<u32>::zeros(&s, 1 << 24)?;
    /// let (start, end) = (Event::new(&dev, true)?, Event::new(&dev, true)?);
    /// start.record(&s)?;
    /// buf.fill(&s, 7)?;
    /// end.record(&s)?;
    /// end.synchronize()?;
    /// println!("64 MiB fill: {:.3} ms", Event::elapsed_ms(&start, &end)?);
    /// let untimed = Event::new(&dev, false)?;
    /// assert!(matches!(Event::elapsed_ms(&untimed, &end), Err(Error::InvalidArgument(_))));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless both events time; [`Error::DeviceMismatch`] for events of
    /// two devices; [`Error::Capture`] for an event recorded inside a capture; driver errors (e.g.
    /// an event not yet complete).
    pub fn elapsed_ms(start: &Event, end: &Event) -> Result<f32> {
        if !start.timing || !end.timing {
            return Err(Error::InvalidArgument(
                "elapsed time needs two events created with timing enabled".into(),
            ));
        }
        // Two devices' clocks are not one timeline (and the driver's answer for events of two
        // contexts is not documented): refused.
        if start.device != end.device {
            return Err(Error::DeviceMismatch {
                during: "timing two events of different devices",
                expected: start.device.ordinal(),
                actual: end.device.ordinal(),
            });
        }
        // Both tag locks held across the (non-blocking) call, taken in address order (one lock when
        // both are the same event), so that no record into a capture comes between check and call.
        const WHAT: &str = "timing an event recorded inside a stream capture";
        let (first, second) =
            if std::ptr::from_ref(start) <= std::ptr::from_ref(end) { (start, end) } else { (end, start) };
        let _first = first.untagged(WHAT)?;
        let _second = if std::ptr::eq(first, second) { None } else { Some(second.untagged(WHAT)?) };
        start.device.bind()?;
        // SAFETY: live events.
        unsafe { result::event_elapsed_time(start.raw, end.raw) }
    }
}

/// A thread counted in as waiting in [`Event::synchronize`], until this guard drops (Release; the
/// record path reads the count with Acquire under the tag lock).
struct EventWaiting<'a>(&'a AtomicUsize);

impl Drop for EventWaiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}
