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
    /// [`DeviceError::Misuse`] if the op's last recorded work is not a launch of its kernel; the
    /// op's errors; driver errors.
    pub fn record_param<O: TunableParam>(&mut self, op: O) -> Result<(O::Output, ParamHandle<O::Param>)> {
        let expected = O::function(self.stream.device())?;
        let before = self.stream.last_captured_kernel_node()?;
        let out = self.record(op)?;
        let not_it =
            || DeviceError::Misuse("record_param: the op's last recorded work is not its kernel".into());
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
    let mut end = EndOnUnwind { stream, armed: true };
    let out = f(&mut Scope { stream, graph_id: id, _not_send: PhantomData });
    end.armed = false;
    let graph = stream.end_capture();
    let out = out?;
    Ok((graph?, out))
}
