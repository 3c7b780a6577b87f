//! Recording: the capture of a closure into a graph, and the `Scope` it records into.

use super::options::CaptureOptions;
use super::params::{ParamHandle, TunableParam};
use crate::runtime::lock;
use crate::{DeviceError, ExecutionContext, GraphNode, Result};
use cuda_core::{Graph, Stream};
use std::marker::PhantomData;
use std::sync::Arc;

/// The recorder handed to the closure of [`crate::graph::CudaGraph::scope`].
///
/// It accepts only [`GraphNode`] ops (no allocation, free or synchronisation can be recorded), and
/// consumes each one, so a buffer written by one `record` can be read by the next. It is neither
/// `Send` nor `Sync`: it cannot leave the capturing thread, whose capture it belongs to.
///
/// ```compile_fail
/// fn assert_send<T: Send>() {}
/// assert_send::<cuda_async::graph::Scope<'static>>(); // error: `*const ()` cannot be sent
/// ```
pub struct Scope<'s> {
    pub(crate) stream: &'s Stream,
    pub(crate) graph_id: u64,
    /// The capture this scope began ([`Stream::capture_id`]): handles are handed out, and the
    /// graph is taken, only while it is still the one open on the stream.
    pub(crate) capture: u64,
    pub(crate) _not_send: PhantomData<*const ()>,
}

impl Scope<'_> {
    /// Records `op` into the graph and returns its output (handles to the buffers the graph will
    /// read and write on every replay).
    ///
    /// # Errors
    /// The op's errors, e.g. capture refusals of `cuda-core`.
    pub fn record<O: GraphNode>(&mut self, op: O) -> Result<O::Output> {
        op.execute(&ExecutionContext::new(self.stream))
    }

    /// Records `op` and returns, with its output, a handle that changes its tunable kernel
    /// parameter in the instantiated graph without recapture.
    ///
    /// # Errors
    /// [`DeviceError::Misuse`] if the op's last recorded work is not a launch of its kernel;
    /// `cuda_core::Error::Capture` if the scope's capture is no longer the one open on the stream
    /// (the closure ended it); the op's errors; driver errors.
    pub fn record_param<O: TunableParam>(&mut self, op: O) -> Result<(O::Output, ParamHandle<O::Param>)> {
        let expected = O::function(self.stream.device())?;
        self.still_open()?;
        let before = self.stream.last_captured_kernel_node()?;
        let out = self.record(op)?;
        let not_it =
            || DeviceError::Misuse("record_param: the op's last recorded work is not its kernel".into());
        // The node must belong to this scope's capture, whose graph the `CudaGraph` will hold.
        self.still_open()?;
        let node = self.stream.last_captured_kernel_node()?.ok_or_else(not_it)?;
        if Some(node) == before {
            // The op recorded nothing (e.g. empty buffers): the frontier is an earlier node.
            return Err(not_it());
        }
        // SAFETY: the node belongs to the graph being captured, which is alive.
        if !unsafe { node.launches(&expected)? } {
            return Err(not_it());
        }
        // SAFETY: as above.
        let params = Arc::new(unsafe { node.read_params()? });
        Ok((out, ParamHandle { graph_id: self.graph_id, node, params, index: O::INDEX, _p: PhantomData }))
    }
}

impl Scope<'_> {
    /// `Ok` while the capture this scope began is the one open on its stream.
    fn still_open(&self) -> Result<()> {
        if self.stream.capture_id() != Some(self.capture) {
            return Err(cuda_core::Error::Capture(SCOPE_CAPTURE_REPLACED).into());
        }
        Ok(())
    }
}

const SCOPE_CAPTURE_REPLACED: &str =
    "the scope's capture is no longer the one open on its stream (ended inside the closure)";

/// Ends a capture if the closure unwinds, so the stream and context stay usable.
struct EndOnUnwind<'a> {
    stream: &'a Stream,
    armed: bool,
}

impl Drop for EndOnUnwind<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Discard whatever was recorded; the error (if any) cannot be reported from here.
            let _ = self.stream.end_capture();
        }
    }
}

/// Records `f` into a graph on `stream`, with this thread's execution lock held (no nested
/// execution inside `f`). Other threads are not blocked: `cuda-core` refuses their work on `stream`
/// (and on buffers homed on it) while the capture is open.
pub(crate) fn record<R>(
    stream: &Stream,
    options: &CaptureOptions,
    id: u64,
    f: impl FnOnce(&mut Scope<'_>) -> Result<R>,
) -> Result<(Graph, R)> {
    let _guard = lock::acquire("a graph capture started inside another op's execution")?;
    stream.begin_capture(options.mode)?;
    let capture = stream.capture_id().ok_or(cuda_core::Error::Capture(SCOPE_CAPTURE_REPLACED))?;
    let mut end = EndOnUnwind { stream, armed: true };
    let out = f(&mut Scope { stream, graph_id: id, capture, _not_send: PhantomData });
    end.armed = false;
    // A closure that ended the scope's capture (and perhaps began another) must not have the
    // graph of another capture taken for the scope's: its handles name nodes of the first.
    if stream.capture_id() != Some(capture) {
        if stream.capture_id().is_some() {
            let _ = stream.end_capture();
        }
        return Err(cuda_core::Error::Capture(SCOPE_CAPTURE_REPLACED).into());
    }
    let graph = stream.end_capture();
    let out = out?;
    Ok((graph?, out))
}
