//! The execution context an op runs in.

use cuda_core::{Device, Stream};

/// Where an op's work is queued: one stream (and its device). Handed to
/// [`DeviceOp::execute`](crate::DeviceOp::execute) by the execution entry points (`sync_on`, `sync`,
/// `.await`, ...), which hold the execution lock while it is alive; safe code cannot build one.
#[derive(Debug)]
pub struct ExecutionContext<'a> {
    stream: &'a Stream,
}

impl<'a> ExecutionContext<'a> {
    pub(crate) fn new(stream: &'a Stream) -> Self {
        ExecutionContext { stream }
    }

    /// The stream the op's work goes to.
    #[inline]
    pub fn stream(&self) -> &'a Stream {
        self.stream
    }

    /// The device of that stream.
    #[inline]
    pub fn device(&self) -> &'a Device {
        self.stream.device()
    }
}
