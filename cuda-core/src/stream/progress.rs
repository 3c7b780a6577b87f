//! `Stream::mark_progress`: queuing the write of a stream's progress counter (see
//! [`crate::progress`]).

use super::Stream;
use crate::error::{Error, Result};
use crate::progress::{ProgressMark, Slot};
use crate::track::state;

impl Stream {
    /// Queues a write of this stream's next progress number and returns the [`ProgressMark`] that
    /// is reached once all work queued on the stream before this call has completed. Checking the
    /// mark is one atomic load (no driver call); see [`crate::progress`] for why it can be
    /// trusted, and why a mark alone cannot report a fault.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, Stream};
    /// let s = Stream::new(&Device::new(0)?)?;
    /// let mark = s.mark_progress()?; // nothing queued before it: reached almost at once
    /// s.synchronize()?;
    /// assert!(mark.is_reached());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Capture`] while the stream is being captured (a captured write would be replayed
    /// with an old number); [`Error::InvalidArgument`] where the device cannot write values from a
    /// stream; driver errors.
    pub fn mark_progress(&self) -> Result<ProgressMark> {
        let slot = match self.inner.progress.get() {
            Some(slot) => slot,
            None => {
                // A racing thread's slot wins; ours goes back to the pool.
                let _ = self.inner.progress.set(Slot::new(&self.inner.device)?);
                self.inner.progress.get().ok_or(Error::InvalidArgument("progress slot missing".into()))?
            }
        };
        self.inner.device.bind()?;
        let guard = self.lock();
        state::refuse_if_capturing(&guard, "marking progress on a stream that is being captured")?;
        // SAFETY: our live stream, its context bound, its enqueue lock held and not capturing.
        unsafe { slot.issue(self.inner.raw) }
    }
}
