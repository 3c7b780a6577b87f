//! Recording events on streams. `Event::record` is here, with streams, because it reads the
//! stream's capture state (an event recorded inside a capture is tagged with it); events
//! themselves sit below streams.

use super::Stream;
use crate::driver::result;
use crate::error::{Error, Result};
use crate::event::Event;

impl Event {
    /// Captures the work queued on `stream` so far: the event completes when that work has.
    ///
    /// Recorded on a stream that is being captured (by this thread), the event marks a point in the
    /// capture instead and is tagged with it (see the type docs).
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] for a stream of another device; [`Error::Capture`] if another
    /// thread is capturing `stream`, or if `stream` is being captured while another thread waits
    /// on this event ([`Event::synchronize`]); driver errors.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.check_device(stream)?;
        self.device().bind()?;
        let mut state = stream.lock();
        state.mode()?; // refuses another thread's capture
        self.record_locked(stream)
    }

    fn check_device(&self, stream: &Stream) -> Result<()> {
        if stream.device() != self.device() {
            return Err(Error::DeviceMismatch {
                during: "recording an event",
                expected: self.device().ordinal(),
                actual: stream.device().ordinal(),
            });
        }
        Ok(())
    }

    /// `cuEventRecord` for the crate's own records, with the stream's enqueue lock held by the
    /// caller, who has checked whose capture it is. The event's capture membership (its tag) is
    /// set here from the stream's capture, under the event's tag lock, for every record: however
    /// the caller got here, an event recorded inside a capture is known as such, so no wait can
    /// fork the capture through it and it is never recycled (`PooledEvent`'s drop).
    pub(crate) fn record_locked(&self, stream: &Stream) -> Result<()> {
        let mut tag = self.lock_tag();
        // A thread waiting on this event (`Event::synchronize`, outside the tag lock) would meet
        // a record inside a capture: refused while one waits.
        if stream.capture_tag() != 0 && self.has_waiters() {
            return Err(Error::Capture(
                "recording an event into a stream capture while another thread waits on it",
            ));
        }
        // SAFETY: live event and stream of the same context (checked or constructed so).
        unsafe { result::event_record(self.raw(), stream.raw()) }?;
        *tag = stream.capture_tag();
        Ok(())
    }
}
