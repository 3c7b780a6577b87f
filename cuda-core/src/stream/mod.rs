//! Streams: ordered queues of device work.
//!
//! **Drop:** dropping the last handle to a stream calls `cuStreamDestroy`, which returns at once;
//! the driver releases the stream after the work already queued on it has finished. Dropping a
//! stream therefore never blocks and never cancels queued work. Buffers keep their allocation
//! stream alive (they hold a handle), so stream-ordered frees always have a live stream.
//!
//! **The enqueue lock.** Every stream has one mutex, held by every operation of this crate that
//! queues work on the stream, waits on it, or changes its capture state (see `track::state`,
//! and `graph::capture` for the rules).
//! The check "is this stream being captured, and by whom" and the enqueue that depends on it are
//! therefore one atomic step: no other thread can begin or end a capture in between.

use crate::device::Device;
use crate::driver::result;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::track::state::{self, StreamState};
use crate::track::stream::StreamInner;
use cudarc::driver::sys;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, OnceLock};

mod progress;
mod record;

pub use crate::track::Stream;

impl Device {
    /// The range of stream priorities `(least, greatest)`; numerically lower is higher priority
    /// (e.g. `(0, -5)`).
    ///
    /// # Errors
    /// Driver errors.
    pub fn stream_priority_range(&self) -> Result<(i32, i32)> {
        self.bind()?;
        // SAFETY: context bound.
        unsafe { result::ctx_get_stream_priority_range() }
    }

    /// Creates a new non-blocking stream with the default priority.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// let dev = cuda_core::Device::new(0)?;
    /// let s = dev.new_stream()?;
    /// assert_eq!(s.device(), &dev);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`Stream::new`].
    pub fn new_stream(&self) -> Result<Stream> {
        Stream::new(self)
    }
}

impl Stream {
    /// Creates a non-blocking stream with the default priority.
    ///
    /// # Errors
    /// Driver errors creating the stream.
    pub fn new(device: &Device) -> Result<Stream> {
        Self::with_priority(device, 0)
    }

    /// Creates a non-blocking stream with `priority`, which must lie in
    /// [`Device::stream_priority_range`] (an error otherwise, rather than the driver's silent clamp).
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, Stream};
    /// let dev = Device::new(0)?;
    /// let (_least, greatest) = dev.stream_priority_range()?;
    /// let urgent = Stream::with_priority(&dev, greatest)?; // scheduled ahead of default-priority work
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a priority outside [`Device::stream_priority_range`]; driver
    /// errors.
    pub fn with_priority(device: &Device, priority: i32) -> Result<Stream> {
        device.bind()?;
        if priority != 0 {
            let (least, greatest) = device.stream_priority_range()?;
            if priority > least || priority < greatest {
                return Err(Error::InvalidArgument(format!(
                    "stream priority {priority} outside the device's range [{greatest}, {least}]"
                )));
            }
        }
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: context bound.
        let raw = unsafe { result::stream_create_with_priority(flags, priority) }?;
        Ok(Stream {
            inner: Arc::new(StreamInner {
                device: *device,
                raw,
                state: Mutex::new(StreamState::default()),
                progress: OnceLock::new(),
                capture_id: AtomicU64::new(0),
                waiters: AtomicUsize::new(0),
            }),
        })
    }

    /// The device this stream belongs to.
    #[inline]
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The raw handle. Valid as long as any clone of this `Stream` lives.
    #[inline]
    pub fn raw(&self) -> sys::CUstream {
        self.inner.raw
    }

    /// Blocks the calling thread until all work queued on this stream has finished, and reports
    /// any asynchronous error of that work.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, DeviceBuffer};
    /// let s = Device::new(0)?.new_stream()?;
    /// let mut buf = DeviceBuffer::<u8>::zeros(&s, 64 << 20)?;
    /// buf.fill(&s, 0xff)?; // returns before the memset has run
    /// s.synchronize()?; // now it has; a fault of the queued work would be reported here
    /// assert!(s.query()?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Capture`] if the stream is being captured (nothing would ever complete); a driver
    /// error of the work (e.g. a kernel fault).
    pub fn synchronize(&self) -> Result<()> {
        // Checked under the lock, waited for outside it (other threads may keep queueing work),
        // counted in as a waiter so that no capture begins meanwhile (`Waiting`).
        let _waiting = {
            let st = self.lock();
            state::refuse_if_capturing(&st, "synchronizing a stream that is being captured")?;
            self.waiting_locked()
        };
        self.sync_unchecked()
    }

    /// `cuStreamSynchronize` without the capture check (callers have made it).
    pub(crate) fn sync_unchecked(&self) -> Result<()> {
        self.inner.device.bind()?;
        // SAFETY: live stream handle; context bound.
        unsafe { result::stream_synchronize(self.raw()) }
    }

    /// [`Stream::sync_unchecked`] for the wait of a blocking copy whose host memory the driver
    /// may still be reading or writing: made with the calling thread's capture interaction mode
    /// relaxed for the one call (`cuThreadExchangeStreamCaptureMode`, restored after it). **Why:**
    /// while the calling thread captures *another* stream (thread-local mode), the driver refuses
    /// the thread's "potentially unsafe" calls, synchronisations included; the copy on this
    /// (uncaptured) stream would already be queued, and a failed wait would hand the caller's
    /// memory back while the copy still uses it. Relaxed, the wait is made: it concerns no
    /// captured work (the caller counted in as a waiter, so this stream is not being captured).
    /// Also the wait of every rare path that queued work but could not record the event that
    /// tracks it (`track::order`, pinned transfers, graph launches): a failed wait there would
    /// likewise let memory go while the queued work still uses it (found by review).
    pub(crate) fn sync_for_copy(&self) -> Result<()> {
        self.inner.device.bind()?;
        let relaxed = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        let previous = result::thread_exchange_stream_capture_mode(relaxed);
        // SAFETY: live stream handle; context bound.
        let done = unsafe { result::stream_synchronize(self.raw()) };
        if let Ok(mode) = previous {
            let _ = result::thread_exchange_stream_capture_mode(mode);
        }
        done
    }

    /// Non-blocking: `true` if all queued work has finished, `false` if some is still running.
    ///
    /// # Errors
    /// [`Error::Capture`] while the stream is being captured (a query would invalidate the
    /// capture); a driver error of the work.
    pub fn query(&self) -> Result<bool> {
        let _waiting = {
            let st = self.lock();
            state::refuse_if_capturing(&st, "querying a stream that is being captured")?;
            self.waiting_locked()
        };
        self.inner.device.bind()?;
        // SAFETY: live stream handle; context bound.
        unsafe { result::stream_query(self.raw()) }
    }

    /// Makes all work queued on this stream after this call wait until `event` has completed.
    /// Does not block the host.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, Event};
    /// let dev = Device::new(0)?;
    /// let (producer, consumer) = (dev.new_stream()?, dev.new_stream()?);
    /// // ... queue work on `producer` ...
    /// let ready = Event::pooled(&dev)?;
    /// ready.record(&producer)?;
    /// consumer.wait_event(&ready)?; // later work on `consumer` runs after it; the host never blocks
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Capture`] when the wait would join two worlds that must stay apart: `event` was
    /// last recorded inside a stream capture and this stream is not that capture's stream (the wait
    /// would fork the capture onto this stream, behind the keep-alive bookkeeping), or this stream
    /// is being captured and `event` was not recorded in its capture. Also when another thread is
    /// capturing this stream.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{CaptureMode, Device, Error, Event, Stream};
    /// let dev = Device::new(0)?;
    /// let (capturing, other) = (Stream::new(&dev)?, Stream::new(&dev)?);
    /// capturing.begin_capture(CaptureMode::ThreadLocal)?;
    /// let ev = Event::new(&dev, false)?;
    /// ev.record(&capturing)?;
    /// // Forking the capture onto `other` is refused:
    /// assert!(matches!(other.wait_event(&ev), Err(Error::Capture(_))));
    /// capturing.end_capture()?;
    /// # Ok(()) }
    /// ```
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        let state = self.lock();
        let tag = event.lock_tag();
        state::check_wait(&state, *tag)?;
        self.wait_tag_held(event)
    }

    /// `cuStreamWaitEvent` for the crate's own waits (the caller holds this stream's enqueue lock
    /// and has checked whose capture it is). Capture membership is still checked here, at the one
    /// place every wait goes through: under the event's tag lock (so no record can slip in
    /// between), a wait that would join this stream to a capture it is not part of — an event
    /// recorded inside a capture, waited on by another stream — is refused, whatever the caller
    /// believed about the event.
    pub(crate) fn wait_unchecked(&self, event: &Event) -> Result<()> {
        let tag = event.lock_tag();
        if *tag != 0 && *tag != self.capture_tag() {
            return Err(Error::Capture(
                "waiting on an event recorded inside a stream capture would fork the capture onto this stream",
            ));
        }
        self.wait_tag_held(event)
    }

    /// The raw wait, with the event's tag lock held by the caller.
    fn wait_tag_held(&self, event: &Event) -> Result<()> {
        self.inner.device.bind()?;
        // SAFETY: live stream and event handles; context bound.
        unsafe { result::stream_wait_event(self.raw(), event.raw(), "making a stream wait on an event") }
    }
}
