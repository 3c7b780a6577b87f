//! NCCL collectives as ops (feature `nccl`): [`all_reduce`], [`all_gather`], [`reduce_scatter`],
//! [`broadcast`], each on one rank's [`Communicator`] and run on a stream of that rank's device.
//!
//! They are [`GraphNode`]s (when their buffer arguments are), so they can be recorded into CUDA
//! graphs: a graph of a collective keeps its buffers and its communicator group alive, and every
//! rank's graph must be replayed in step with the other ranks' (see [`cuda_core::nccl`]). A
//! collective over several devices completes only once every rank has issued it: run each rank's
//! op from its own thread (or task on its own thread), or use [`cuda_core::nccl::grouped`] to issue
//! all ranks from one thread. A thread that already drove one rank of a group is refused on the
//! others (an error, not a hang).
//!
//! ```no_run
//! # fn main() -> cuda_async::Result<()> {
//! use cuda_async::{nccl, DeviceOpExt};
//! use cuda_core::nccl::{Communicator, ReduceOp};
//! use cuda_core::{Device, DeviceBuffer};
//! let dev = Device::new(0)?;
//! let comm = Communicator::init_all(&[dev])?.remove(0);
//! let s = dev.new_stream()?;
//! let x = DeviceBuffer::from_host(&s, &[1.0f32; 256])?;
//! let mut y = DeviceBuffer::<f32>::zeros(&s, 256)?;
//! nccl::all_reduce(&comm, &x, &mut y, ReduceOp::Sum).sync_on(&s)?;
//! # Ok(()) }
//! ```

use crate::args::{BufferMut, BufferRef, IntoBufferOp};
use crate::{DeviceOp, ExecutionContext, GraphNode, Op, Result};
use cuda_core::nccl::{Collective, Communicator, NcclScalar, ReduceOp};
use std::marker::PhantomData;

/// One rank's part of a collective. See [`collective`].
pub struct CollectiveOp<T, S, D> {
    comm: Communicator,
    kind: Collective,
    send: S,
    recv: D,
    _t: PhantomData<fn() -> T>,
}

/// Rank `comm.rank()`'s part of `kind`, reading `send` and writing `recv` (lengths as
/// [`Collective`] says), yielding `recv`. Must run on a stream of `comm`'s device. Errors when
/// executed: those of [`Communicator::collective`].
///
/// ```no_run
/// # fn main() -> cuda_async::Result<()> {
/// use cuda_async::{memory, nccl, DeviceOpExt};
/// use cuda_core::nccl::{Collective, Communicator};
/// let dev = cuda_core::Device::new(0)?;
/// let comm = Communicator::init_all(&[dev])?.remove(0);
/// let s = dev.new_stream()?;
/// let out = nccl::collective(&comm, Collective::Broadcast { root: 0 }, memory::full(64, 2u32), memory::zeros::<u32>(64))
///     .sync_on(&s)?;
/// assert_eq!(out.to_vec()?, vec![2; 64]);
/// # Ok(()) }
/// ```
pub fn collective<T: NcclScalar, S: IntoBufferOp<T>, D: IntoBufferOp<T>>(
    comm: &Communicator,
    kind: Collective,
    send: S,
    recv: D,
) -> Op<CollectiveOp<T, S::Op, D::Op>>
where
    D::Out: BufferMut<T>,
{
    Op(CollectiveOp {
        comm: comm.clone(),
        kind,
        send: send.into_buffer_op(),
        recv: recv.into_buffer_op(),
        _t: PhantomData,
    })
}

/// All-reduce with `op` (see [`collective`]); a [`GraphNode`] when both arguments are.
///
/// ```no_run
/// # fn main() -> cuda_async::Result<()> {
/// use cuda_async::{nccl, DeviceOpExt};
/// use cuda_core::nccl::{Communicator, ReduceOp};
/// use cuda_core::{Device, DeviceBuffer};
/// let dev = Device::new(0)?;
/// let comm = Communicator::init_all(&[dev])?.remove(0);
/// let s = dev.new_stream()?;
/// let x = DeviceBuffer::from_host(&s, &[1.0f32; 16])?;
/// let mut y = DeviceBuffer::<f32>::zeros(&s, 16)?;
/// nccl::all_reduce(&comm, &x, &mut y, ReduceOp::Sum).sync_on(&s)?;
/// # Ok(()) }
/// ```
pub fn all_reduce<T: NcclScalar, S: IntoBufferOp<T>, D: IntoBufferOp<T>>(
    comm: &Communicator,
    send: S,
    recv: D,
    op: ReduceOp,
) -> Op<CollectiveOp<T, S::Op, D::Op>>
where
    D::Out: BufferMut<T>,
{
    collective(comm, Collective::AllReduce(op), send, recv)
}

/// All-gather: `recv` holds `comm.size()` times `send`'s length (see [`collective`]).
///
/// ```no_run
/// # fn main() -> cuda_async::Result<()> {
/// use cuda_async::{nccl, DeviceOpExt};
/// use cuda_core::nccl::Communicator;
/// use cuda_core::{Device, DeviceBuffer};
/// let dev = Device::new(0)?;
/// let comm = Communicator::init_all(&[dev])?.remove(0);
/// let s = dev.new_stream()?;
/// let x = DeviceBuffer::from_host(&s, &[1.0f32; 16])?;
/// let mut y = DeviceBuffer::<f32>::zeros(&s, 16 * comm.size())?;
/// nccl::all_gather(&comm, &x, &mut y).sync_on(&s)?;
/// # Ok(()) }
/// ```
pub fn all_gather<T: NcclScalar, S: IntoBufferOp<T>, D: IntoBufferOp<T>>(
    comm: &Communicator,
    send: S,
    recv: D,
) -> Op<CollectiveOp<T, S::Op, D::Op>>
where
    D::Out: BufferMut<T>,
{
    collective(comm, Collective::AllGather, send, recv)
}

/// Reduce-scatter: `send` holds `comm.size()` times `recv`'s length (see [`collective`]).
///
/// ```no_run
/// # fn main() -> cuda_async::Result<()> {
/// use cuda_async::{nccl, DeviceOpExt};
/// use cuda_core::nccl::{Communicator, ReduceOp};
/// use cuda_core::{Device, DeviceBuffer};
/// let dev = Device::new(0)?;
/// let comm = Communicator::init_all(&[dev])?.remove(0);
/// let s = dev.new_stream()?;
/// let x = DeviceBuffer::from_host(&s, &[1.0f32; 16])?;
/// let mut y = DeviceBuffer::<f32>::zeros(&s, 16 / comm.size())?;
/// nccl::reduce_scatter(&comm, &x, &mut y, ReduceOp::Sum).sync_on(&s)?;
/// # Ok(()) }
/// ```
pub fn reduce_scatter<T: NcclScalar, S: IntoBufferOp<T>, D: IntoBufferOp<T>>(
    comm: &Communicator,
    send: S,
    recv: D,
    op: ReduceOp,
) -> Op<CollectiveOp<T, S::Op, D::Op>>
where
    D::Out: BufferMut<T>,
{
    collective(comm, Collective::ReduceScatter(op), send, recv)
}

/// Broadcast from rank `root` (see [`collective`]).
///
/// ```no_run
/// # fn main() -> cuda_async::Result<()> {
/// use cuda_async::{nccl, DeviceOpExt};
/// use cuda_core::nccl::Communicator;
/// use cuda_core::{Device, DeviceBuffer};
/// let dev = Device::new(0)?;
/// let comm = Communicator::init_all(&[dev])?.remove(0);
/// let s = dev.new_stream()?;
/// let x = DeviceBuffer::from_host(&s, &[1.0f32; 16])?;
/// let mut y = DeviceBuffer::<f32>::zeros(&s, 16)?;
/// nccl::broadcast(&comm, &x, &mut y, 0).sync_on(&s)?;
/// # Ok(()) }
/// ```
pub fn broadcast<T: NcclScalar, S: IntoBufferOp<T>, D: IntoBufferOp<T>>(
    comm: &Communicator,
    send: S,
    recv: D,
    root: usize,
) -> Op<CollectiveOp<T, S::Op, D::Op>>
where
    D::Out: BufferMut<T>,
{
    collective(comm, Collective::Broadcast { root }, send, recv)
}

impl<T: NcclScalar, S, D> DeviceOp for CollectiveOp<T, S, D>
where
    S: DeviceOp,
    S::Output: BufferRef<T>,
    D: DeviceOp,
    D::Output: BufferMut<T>,
{
    type Output = D::Output;
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<D::Output> {
        let send = self.send.execute(ctx)?;
        let mut recv = self.recv.execute(ctx)?;
        self.comm.collective(ctx.stream(), self.kind, send.buffer(), recv.buffer_mut())?;
        Ok(recv)
    }
}

// SAFETY: executing queues one NCCL collective between existing buffers (the argument ops are
// GraphNodes, so they allocate nothing either) through `Communicator::collective`, which records
// it into the capture with both buffers and the communicator group kept alive by the graph. For
// an initialised communicator NCCL queues only kernels (and, where it needs its proxy, its own
// host nodes) on the stream: no stream-ordered allocation or free, no synchronisation of the
// stream; the persistent resources of a captured collective are owned by the graph (NCCL attaches
// them as CUDA user objects) and released with it.
unsafe impl<T: NcclScalar, S, D> GraphNode for CollectiveOp<T, S, D>
where
    S: GraphNode,
    S::Output: BufferRef<T>,
    D: GraphNode,
    D::Output: BufferMut<T>,
{
}
