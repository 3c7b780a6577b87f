//! The collectives: element types, reduction operators, shapes, and the per-rank entry points.

use super::comm::Communicator;
use super::matching::Desc;
use super::result;
use crate::error::{Error, Result};
use crate::memory::{Access, DeviceBuffer, DeviceRepr};
use crate::stream::Stream;
use crate::track::InCapture;
use cudarc::nccl::sys;
use std::ffi::c_void;
use std::sync::Arc;

mod sealed {
    pub trait Sealed {}
}

/// Element types NCCL can move and reduce.
pub trait NcclScalar: DeviceRepr + sealed::Sealed {
    /// NCCL's name of this type.
    const DATA_TYPE: sys::ncclDataType_t;
}

macro_rules! scalar {
    ($($t:ty => $v:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl NcclScalar for $t {
            const DATA_TYPE: sys::ncclDataType_t = sys::ncclDataType_t::$v;
        }
    )*};
}
scalar!(
    f32 => ncclFloat32, f64 => ncclFloat64, half::f16 => ncclFloat16, half::bf16 => ncclBfloat16,
    i8 => ncclInt8, u8 => ncclUint8, i32 => ncclInt32, u32 => ncclUint32, i64 => ncclInt64,
    u64 => ncclUint64
);

/// A reduction operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Mean (sum divided by the number of ranks).
    Avg,
}

impl ReduceOp {
    fn raw(self) -> sys::ncclRedOp_t {
        match self {
            ReduceOp::Sum => sys::ncclRedOp_t::ncclSum,
            ReduceOp::Prod => sys::ncclRedOp_t::ncclProd,
            ReduceOp::Max => sys::ncclRedOp_t::ncclMax,
            ReduceOp::Min => sys::ncclRedOp_t::ncclMin,
            ReduceOp::Avg => sys::ncclRedOp_t::ncclAvg,
        }
    }
}

/// A collective and its parameters. With `n` ranks, the lengths (in elements) must be:
/// - `AllReduce`: `recv == send`;
/// - `AllGather`: `recv == n * send` (rank `r`'s input lands at `recv[r * send..]`);
/// - `ReduceScatter`: `send == n * recv` (rank `r` gets the reduction of block `r`);
/// - `Broadcast`: `recv == send`; only the root's `send` is read, every rank's `recv` is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    /// Every rank gets the element-wise reduction of all ranks' inputs.
    AllReduce(ReduceOp),
    /// Every rank gets the concatenation of all ranks' inputs, in rank order.
    AllGather,
    /// Rank `r` gets block `r` of the element-wise reduction.
    ReduceScatter(ReduceOp),
    /// Every rank gets the root's input.
    Broadcast {
        /// The rank whose input is sent.
        root: usize,
    },
}

impl Collective {
    /// Checks the lengths for `n` ranks and returns NCCL's count argument.
    pub(super) fn count(self, n: usize, send: usize, recv: usize) -> Result<usize> {
        let times = |a: usize| {
            a.checked_mul(n)
                .ok_or_else(|| Error::InvalidArgument(format!("{a} elements * {n} ranks overflow")))
        };
        let (expected, actual, count, during) = match self {
            Collective::AllReduce(_) => {
                (send, recv, send, "an NCCL all-reduce: recv must be as long as send")
            }
            Collective::AllGather => {
                (times(send)?, recv, send, "an NCCL all-gather: recv must hold ranks * send")
            }
            Collective::ReduceScatter(_) => {
                (times(recv)?, send, recv, "an NCCL reduce-scatter: send must hold ranks * recv")
            }
            Collective::Broadcast { root } => {
                if root >= n {
                    return Err(Error::InvalidArgument(format!(
                        "broadcast root {root} of a group of {n} ranks"
                    )));
                }
                (send, recv, send, "an NCCL broadcast: recv must be as long as send")
            }
        };
        if expected != actual {
            return Err(Error::LengthMismatch { during, expected, actual });
        }
        Ok(count)
    }

    pub(super) fn desc<T: NcclScalar>(self, count: usize) -> Desc {
        Desc { kind: self, dtype: T::DATA_TYPE as u32, count }
    }
}

/// Queues one collective with raw pointers.
///
/// # Safety
/// `comm` is a live communicator of the device whose stream `stream` is; `send` and `recv` are
/// device allocations of that device holding the lengths [`Collective::count`] checked for
/// `count`, `recv` not aliasing `send`; the caller orders their other uses.
pub(super) unsafe fn raw_call<T: NcclScalar>(
    kind: Collective,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    comm: sys::ncclComm_t,
    stream: sys::cudaStream_t,
    during: &'static str,
) -> Result<()> {
    let dtype = T::DATA_TYPE;
    // SAFETY: (every arm) the caller's contract; the root was checked against the group's size,
    // which fits an i32 (checked at creation).
    unsafe {
        match kind {
            Collective::AllReduce(op) => {
                result::all_reduce(send, recv, count, dtype, op.raw(), comm, stream, during)
            }
            Collective::AllGather => result::all_gather(send, recv, count, dtype, comm, stream, during),
            Collective::ReduceScatter(op) => {
                result::reduce_scatter(send, recv, count, dtype, op.raw(), comm, stream, during)
            }
            Collective::Broadcast { root } => {
                result::broadcast(send, recv, count, dtype, root as i32, comm, stream, during)
            }
        }
    }
}

impl Communicator {
    /// Checks that `stream`, `send` and `recv` are on this communicator's device.
    pub(super) fn check_devices<T: NcclScalar>(
        &self,
        stream: &Stream,
        send: &DeviceBuffer<T>,
        recv: &DeviceBuffer<T>,
    ) -> Result<()> {
        for (during, d) in [
            ("an NCCL collective on a stream of another device than its communicator's", stream.device()),
            ("an NCCL collective with an input of another device than its communicator's", send.device()),
            ("an NCCL collective with an output of another device than its communicator's", recv.device()),
        ] {
            if d != self.device() {
                return Err(Error::DeviceMismatch {
                    during,
                    expected: self.device().ordinal(),
                    actual: d.ordinal(),
                });
            }
        }
        Ok(())
    }

    /// Queues `kind` on `stream` (a stream of this communicator's device), reading `send` and
    /// writing `recv`: the common entry point of [`Communicator::all_reduce`] and the others. On
    /// a stream this thread captures, the collective is recorded, and the graph keeps both buffers
    /// and this communicator's group alive.
    ///
    /// ```no_run
    /// use cuda_core::nccl::{Collective, Communicator, ReduceOp};
    /// use cuda_core::{Device, DeviceBuffer};
    /// # fn main() -> cuda_core::Result<()> {
    /// let dev = Device::new(0)?;
    /// let comm = Communicator::init_all(&[dev])?.remove(0);
    /// let s = dev.new_stream()?;
    /// let x = DeviceBuffer::from_host(&s, &[1.0f32; 4])?;
    /// let mut y = DeviceBuffer::<f32>::zeros(&s, 4)?;
    /// comm.collective(&s, Collective::ReduceScatter(ReduceOp::Sum), &x, &mut y)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::LengthMismatch`] for lengths that do not fit `kind` (see [`Collective`]);
    /// [`Error::DeviceMismatch`] for a stream or buffer of another device; [`Error::InvalidArgument`]
    /// for a collective that does not match the other ranks' at the same position, for a thread
    /// that already drove another rank of the group, or after an earlier NCCL failure of the group;
    /// [`Error::Capture`] as for any enqueue; [`Error::Library`] when NCCL refuses the call.
    pub fn collective<T: NcclScalar>(
        &self,
        stream: &Stream,
        kind: Collective,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let count = kind.count(self.size(), send.len(), recv.len())?;
        self.check_devices(stream, send, recv)?;
        self.group().matching.claim_thread(self.rank())?;
        let desc = kind.desc::<T>(count);
        let (sp, rp) = (send.device_ptr() as *const c_void, recv.device_ptr() as *mut c_void);
        let uses = [(send.allocation(), Access::Read), (recv.allocation(), Access::Write)];
        let group = self.group().clone();
        let keep = |k: &mut crate::track::KeepAlive| {
            k.add_alloc(send.allocation());
            k.add_alloc(recv.allocation());
            // Replays use the communicator: the graph keeps the group (all its ranks) alive.
            k.add_extra(group.clone() as Arc<dyn std::any::Any + Send + Sync>);
        };
        let (comm, rank) = (self.raw(), self.rank());
        stream.device().bind()?;
        crate::track::ordered(stream, &uses, &[], InCapture::Record, keep, || {
            // The rank's lock before the reservation and across the call: NCCL pairs collectives
            // in the order they are called, so the order checked must be the order called (found
            // by review: two threads driving one rank could reserve in one order and call in the
            // other, pairing collectives of different sizes).
            let _one_call_at_a_time = self.lock_rank(rank);
            self.group().matching.reserve(&[rank], desc)?;
            if count == 0 {
                return Ok(());
            }
            stream.device().bind()?;
            // SAFETY: `comm` is this live communicator (its group outlives the call, and a graph
            // recording it keeps the group); stream and buffers are of its device (checked) with
            // the lengths `count` needs (checked); `recv` is borrowed mutably, so it aliases
            // nothing; `ordered` orders the buffers' other uses and records the call's. NCCL
            // allocates nothing on the stream for an initialised communicator and calls nothing of
            // this crate.
            let res = unsafe {
                raw_call::<T>(kind, sp, rp, count, comm, stream.raw() as _, "queueing an NCCL collective")
            };
            res.inspect_err(|e| self.group().matching.poison(e))
        })
    }

    /// All-reduce: `recv[i] = op(send[i] of every rank)`. See [`Communicator::collective`].
    ///
    /// ```no_run
    /// use cuda_core::nccl::{Communicator, ReduceOp};
    /// use cuda_core::{Device, DeviceBuffer};
    /// # fn main() -> cuda_core::Result<()> {
    /// let dev = Device::new(0)?;
    /// let comm = Communicator::init_all(&[dev])?.remove(0);
    /// let s = dev.new_stream()?;
    /// let x = DeviceBuffer::from_host(&s, &[half::bf16::ONE; 8])?;
    /// let mut y = DeviceBuffer::<half::bf16>::zeros(&s, 8)?;
    /// comm.all_reduce(&s, &x, &mut y, ReduceOp::Sum)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`Communicator::collective`].
    pub fn all_reduce<T: NcclScalar>(
        &self,
        stream: &Stream,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.collective(stream, Collective::AllReduce(op), send, recv)
    }

    /// All-gather: `recv` (`size() * send.len()` elements) gets every rank's `send` in rank order.
    /// See [`Communicator::collective`].
    ///
    /// ```no_run
    /// use cuda_core::nccl::Communicator;
    /// use cuda_core::{Device, DeviceBuffer};
    /// # fn main() -> cuda_core::Result<()> {
    /// let dev = Device::new(0)?;
    /// let comm = Communicator::init_all(&[dev])?.remove(0);
    /// let s = dev.new_stream()?;
    /// let x = DeviceBuffer::from_host(&s, &[1.0f32; 8])?;
    /// let mut y = DeviceBuffer::<f32>::zeros(&s, 8 * comm.size())?;
    /// comm.all_gather(&s, &x, &mut y)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`Communicator::collective`].
    pub fn all_gather<T: NcclScalar>(
        &self,
        stream: &Stream,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        self.collective(stream, Collective::AllGather, send, recv)
    }

    /// Reduce-scatter: `send` holds `size()` blocks of `recv.len()` elements; this rank gets block
    /// `rank()` of the reduction. See [`Communicator::collective`].
    ///
    /// ```no_run
    /// use cuda_core::nccl::{Communicator, ReduceOp};
    /// use cuda_core::{Device, DeviceBuffer};
    /// # fn main() -> cuda_core::Result<()> {
    /// let dev = Device::new(0)?;
    /// let comm = Communicator::init_all(&[dev])?.remove(0);
    /// let s = dev.new_stream()?;
    /// let x = DeviceBuffer::from_host(&s, &[1.0f32; 8])?;
    /// let mut y = DeviceBuffer::<f32>::zeros(&s, 8 / comm.size())?;
    /// comm.reduce_scatter(&s, &x, &mut y, ReduceOp::Sum)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`Communicator::collective`].
    pub fn reduce_scatter<T: NcclScalar>(
        &self,
        stream: &Stream,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        op: ReduceOp,
    ) -> Result<()> {
        self.collective(stream, Collective::ReduceScatter(op), send, recv)
    }

    /// Broadcast: every rank's `recv` gets rank `root`'s `send` (read on the root only). See
    /// [`Communicator::collective`].
    ///
    /// ```no_run
    /// use cuda_core::nccl::Communicator;
    /// use cuda_core::{Device, DeviceBuffer};
    /// # fn main() -> cuda_core::Result<()> {
    /// let dev = Device::new(0)?;
    /// let comm = Communicator::init_all(&[dev])?.remove(0);
    /// let s = dev.new_stream()?;
    /// let x = DeviceBuffer::from_host(&s, &[3u32; 8])?;
    /// let mut y = DeviceBuffer::<u32>::zeros(&s, 8)?;
    /// comm.broadcast(&s, &x, &mut y, 0)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a root outside the group; as for [`Communicator::collective`].
    pub fn broadcast<T: NcclScalar>(
        &self,
        stream: &Stream,
        send: &DeviceBuffer<T>,
        recv: &mut DeviceBuffer<T>,
        root: usize,
    ) -> Result<()> {
        self.collective(stream, Collective::Broadcast { root }, send, recv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes() {
        let sum = ReduceOp::Sum;
        assert_eq!(Collective::AllReduce(sum).count(2, 10, 10).unwrap(), 10);
        assert!(Collective::AllReduce(sum).count(2, 10, 9).is_err());
        assert_eq!(Collective::AllGather.count(3, 4, 12).unwrap(), 4);
        assert!(Collective::AllGather.count(3, 4, 4).is_err());
        assert_eq!(Collective::ReduceScatter(sum).count(2, 8, 4).unwrap(), 4);
        assert!(Collective::ReduceScatter(sum).count(2, 7, 4).is_err());
        assert_eq!(Collective::Broadcast { root: 1 }.count(2, 5, 5).unwrap(), 5);
        assert!(Collective::Broadcast { root: 2 }.count(2, 5, 5).is_err());
        assert!(Collective::AllGather.count(2, usize::MAX, 0).is_err());
    }
}
