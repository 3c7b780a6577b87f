//! Values that change per replay without recapture: device scalars and kernel-parameter handles.

use crate::args::{BufferRef, IntoBufferOp};
use crate::combinators::{value, Value};
use crate::{GraphNode, Op, Result};
use cuda_core::{Device, DeviceBuffer, DeviceRepr, Function, KernelNode, KernelNodeParams, Stream};
use std::marker::PhantomData;
use std::sync::Arc;

/// A single value in device memory that kernels read through a pointer. A graph that captured a
/// kernel reading it sees the new value on every replay after [`DeviceScalar::set`], with no
/// recapture. `set` is an ordinary buffer write: ordered after replays already queued and before
/// replays queued later, on any stream (the home-stream join).
pub struct DeviceScalar<T: DeviceRepr> {
    buf: DeviceBuffer<T>,
}

impl<T: DeviceRepr> DeviceScalar<T> {
    /// A scalar on `stream` (its home stream) holding `value`.
    ///
    /// # Errors
    /// Allocation and copy errors (e.g. [`cuda_core::Error::Capture`] on a capturing stream).
    ///
    /// ```no_run
    /// # fn main() -> cuda_async::Result<()> {
    /// let s = cuda_core::Stream::new(&cuda_core::Device::new(0)?)?;
    /// let mut step = cuda_async::DeviceScalar::new(&s, 0u32)?;
    /// step.set(41)?; // seen by every replay queued after this
    /// assert_eq!(step.get()?, 41);
    /// # Ok(()) }
    /// ```
    pub fn new(stream: &Stream, value: T) -> Result<Self> {
        Ok(DeviceScalar { buf: DeviceBuffer::from_host(stream, &[value])? })
    }

    /// Queues a write of `value` (a 1-element copy on the home stream); returns once staged.
    ///
    /// # Errors
    /// Copy errors (e.g. the home stream is being captured).
    pub fn set(&mut self, value: T) -> Result<()> {
        let home = self.buf.home_stream().clone();
        Ok(self.buf.copy_from_host(&home, &[value])?)
    }

    /// Reads the value (blocking, ordered after every queued write and replay that uses it).
    ///
    /// # Errors
    /// Copy errors; errors of the GPU work the read waits for.
    pub fn get(&self) -> Result<T> {
        let mut v = [self.buf_zero()];
        self.buf.copy_to_host(self.buf.home_stream(), &mut v)?;
        Ok(v[0])
    }

    fn buf_zero(&self) -> T {
        // SAFETY: DeviceRepr types are valid for every bit pattern, all-zero included.
        unsafe { std::mem::zeroed() }
    }

    /// The 1-element buffer behind the scalar.
    pub fn buffer(&self) -> &DeviceBuffer<T> {
        &self.buf
    }
}

impl<T: DeviceRepr> BufferRef<T> for &DeviceScalar<T> {
    fn buffer(&self) -> &DeviceBuffer<T> {
        &self.buf
    }
}

impl<'a, T: DeviceRepr> IntoBufferOp<T> for &'a DeviceScalar<T> {
    type Out = &'a DeviceScalar<T>;
    type Op = Op<Value<&'a DeviceScalar<T>>>;
    fn into_buffer_op(self) -> Self::Op {
        value(self)
    }
}

/// An op that launches one kernel as its last work and has one scalar kernel parameter that may
/// take any value without affecting memory safety (a factor, a fill value — never a length or a
/// pointer). Recording it with [`crate::graph::Scope::record_param`] returns a handle that changes
/// that parameter in the instantiated graph.
///
/// # Safety
/// [`TunableParam::function`] must return the kernel the op launches, whose parameter `INDEX` has
/// type `Param`, and every value of `Param` must be safe for that kernel. The op's last queued
/// work must be that launch **every time it executes**, also for empty buffers (launch a grid
/// that does nothing rather than skip the launch): `record_param` takes the last recorded kernel
/// node as the op's. It refuses a frontier that did not change or that launches another kernel,
/// but an argument op that launched the same kernel would otherwise be taken for the op (found by
/// review: `scale(&empty, a, scale(&p, 3.0, &mut q))` handed out the inner op's node, a wrong
/// result).
pub unsafe trait TunableParam: GraphNode {
    /// The parameter's type.
    type Param: DeviceRepr;
    /// The parameter's position in the kernel's signature.
    const INDEX: usize;
    /// The kernel this op launches on `device`.
    fn function(device: &Device) -> Result<Function>;
}

// SAFETY: delegates to the wrapped op.
unsafe impl<T: TunableParam> TunableParam for Op<T> {
    type Param = T::Param;
    const INDEX: usize = T::INDEX;
    fn function(device: &Device) -> Result<Function> {
        T::function(device)
    }
}

/// Changes one scalar kernel parameter of an instantiated graph (see
/// [`crate::graph::CudaGraph::set_param`]). Tied to the graph (and the capture) it came from; using
/// it with another graph, or after a recapture, is an error.
///
/// Setting a parameter restores the node's other parameters to their recorded values (one driver
/// call per update; the node's parameter list is read once, at record time).
#[derive(Clone)]
pub struct ParamHandle<P> {
    pub(crate) graph_id: u64,
    pub(crate) node: KernelNode,
    pub(crate) params: Arc<KernelNodeParams>,
    pub(crate) index: usize,
    pub(crate) _p: PhantomData<fn(P)>,
}

impl<P> std::fmt::Debug for ParamHandle<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParamHandle").field("graph_id", &self.graph_id).field("index", &self.index).finish()
    }
}
