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
    /// thread is capturing `stream`; driver errors.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.check_device(stream)?;
        self.device().bind()?;
        let mut state = stream.lock();
        state.mode()?; // refuses another thread's capture
        let id = state.capture_id().unwrap_or(0);
        let mut tag = self.lock_tag();
        self.record_unchecked(stream)?;
        *tag = id;
        Ok(())
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

    /// `cuEventRecord` with no checks: for the crate's private events, with the stream's lock held
    /// by the caller, who has checked its capture state.
    pub(crate) fn record_unchecked(&self, stream: &Stream) -> Result<()> {
        // SAFETY: live event and stream of the same context (checked or constructed so).
        unsafe { result::event_record(self.raw(), stream.raw()) }
    }
}
