//! `Stream` methods that order work against the uses of buffers: joins between streams and work
//! of other libraries. They live here, with the ordering they use (see `track::order`), rather
//! than with `Stream`'s other public methods in `crate::stream`.

use super::access::Access;
use super::alloc::Allocation;
use super::order::{join_unchecked, ordered_on};
use super::state::{refuse_if_capturing, Locked};
use super::stream::Stream;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::sync::Arc;

impl Stream {
    /// Orders all work queued on `self` after this call behind all work queued on `other` so far.
    /// A no-op when both are the same stream.
    ///
    /// # Errors
    /// [`Error::Capture`] if either stream is being captured (a cross-stream dependency would fork
    /// or break the capture); driver errors.
    pub fn wait_stream(&self, other: &Stream) -> Result<()> {
        if self == other {
            return Ok(());
        }
        let mut locked = Locked::new([self, other]);
        for s in [self, other] {
            refuse_if_capturing(
                locked.state(s),
                "a cross-stream wait involving a stream that is being captured",
            )?;
        }
        join_unchecked(self, other)
    }

    /// Queues work of another CUDA library (cuBLAS, cuBLASLt, NCCL, ...) on this stream, ordered
    /// like a kernel launch with every other use of the buffers whose allocations are in `uses`
    /// (each with how the work touches it), or, while this thread captures the stream, recorded
    /// (the graph keeps the allocations alive). `f` receives the raw stream handle.
    ///
    /// # Errors
    /// [`Error::Capture`] if another thread is capturing the stream or a home stream of `uses` is
    /// being captured from here; the error `f` returns; driver errors of the joins.
    ///
    /// # Safety
    /// `f` must only queue asynchronous work on the given raw stream, and that work must touch
    /// device memory only inside the allocations listed in `uses`, write only those listed as
    /// [`crate::memory::Access::Write`], and write only memory the caller holds exclusively (e.g.
    /// through `&mut DeviceBuffer`). It runs while this crate holds
    /// the enqueue locks of the streams involved: it must not call methods of this crate on streams,
    /// events or buffers (that would deadlock), must not drop buffers, must not synchronise or
    /// block, and must not allocate or free stream-ordered memory on the stream.
    pub unsafe fn enqueue_external<R>(
        &self,
        uses: &[(&Arc<Allocation>, Access)],
        f: impl FnOnce(sys::CUstream) -> Result<R>,
    ) -> Result<R> {
        if let Some((a, _)) = uses.iter().find(|(a, _)| a.home_stream().device() != self.device()) {
            return Err(Error::DeviceMismatch {
                during: "queueing library work with a buffer of another device",
                expected: self.device().ordinal(),
                actual: a.home_stream().device().ordinal(),
            });
        }
        self.device().bind()?;
        let raw = self.raw();
        ordered_on(self, uses, || f(raw))
    }
}
