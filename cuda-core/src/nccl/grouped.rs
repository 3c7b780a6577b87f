//! One collective on every rank of a group, from one thread (`ncclGroupStart`/`ncclGroupEnd`).
//!
//! NCCL only puts grouped collectives on their streams when the group ends, so [`run`] takes the
//! enqueue locks of every stream and home stream involved at once, queues every rank's waits,
//! issues the group, then records every rank's marks: each rank's part is ordered with its
//! buffers' other uses exactly like a per-rank collective. Grouped collectives are not recorded
//! into graphs: on a capturing stream they are refused with [`Error::Capture`] (capture one rank
//! per thread with the per-rank entry points instead).

use super::collective::{raw_call, Collective, NcclScalar};
use super::comm::Communicator;
use super::result;
use super::ReduceOp;
use crate::error::{Error, Result};
use crate::memory::{Access, DeviceBuffer};
use crate::stream::Stream;
use crate::track::GroupPart;
use std::ffi::c_void;

/// One rank's part of a grouped collective.
#[derive(Debug)]
pub struct Rank<'a, T: NcclScalar> {
    /// The rank's communicator.
    pub comm: &'a Communicator,
    /// A stream of the rank's device.
    pub stream: &'a Stream,
    /// The rank's input.
    pub send: &'a DeviceBuffer<T>,
    /// The rank's output.
    pub recv: &'a mut DeviceBuffer<T>,
}

/// Issues `kind` on every rank of one group at once: `ranks` holds each rank of the group
/// exactly once (in any order). One thread can drive all the devices this way without the hang
/// of issuing the ranks one after another.
///
/// ```no_run
/// use cuda_core::nccl::{grouped, Collective, Communicator, ReduceOp};
/// use cuda_core::{Device, DeviceBuffer};
/// # fn main() -> cuda_core::Result<()> {
/// let devices = Device::all()?;
/// let comms = Communicator::init_all(&devices)?;
/// let streams = devices.iter().map(|d| d.new_stream()).collect::<Result<Vec<_>, _>>()?;
/// let xs = streams.iter().map(|s| DeviceBuffer::from_host(s, &[1.0f32; 1024])).collect::<Result<Vec<_>, _>>()?;
/// let mut ys = streams.iter().map(|s| DeviceBuffer::<f32>::zeros(s, 1024)).collect::<Result<Vec<_>, _>>()?;
/// let mut ranks: Vec<_> = comms
///     .iter()
///     .zip(&streams)
///     .zip(&xs)
///     .zip(ys.iter_mut())
///     .map(|(((comm, stream), send), recv)| grouped::Rank { comm, stream, send, recv })
///     .collect();
/// grouped::run(Collective::AllReduce(ReduceOp::Sum), &mut ranks)?;
/// drop(ranks);
/// assert_eq!(ys[0].to_vec()?, vec![devices.len() as f32; 1024]);
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::InvalidArgument`] unless `ranks` holds every rank of one group exactly once, or for a
/// collective that does not match the ranks' earlier per-rank collectives, or after an earlier
/// NCCL failure of the group; [`Error::LengthMismatch`] for lengths that do not fit `kind` or
/// differ between ranks; [`Error::DeviceMismatch`] for a stream or buffer of another device than
/// its rank's; [`Error::Capture`] if any stream involved is being captured; [`Error::Library`]
/// when NCCL refuses the group (the group is then unusable: later collectives fail).
pub fn run<T: NcclScalar>(kind: Collective, ranks: &mut [Rank<'_, T>]) -> Result<()> {
    let first = ranks
        .first()
        .ok_or_else(|| Error::InvalidArgument("a grouped collective needs at least one rank".into()))?;
    let (n, group) = (first.comm.size(), first.comm.group().clone());
    if ranks.len() != n {
        return Err(Error::InvalidArgument(format!(
            "a grouped collective over a group of {n} ranks was given {} ranks",
            ranks.len()
        )));
    }
    let mut seen = vec![false; n];
    let mut count = None;
    for r in ranks.iter() {
        if !r.comm.same_group(first.comm) {
            return Err(Error::InvalidArgument(
                "a grouped collective mixes communicators of two groups".into(),
            ));
        }
        if std::mem::replace(&mut seen[r.comm.rank()], true) {
            return Err(Error::InvalidArgument(format!("rank {} is listed twice", r.comm.rank())));
        }
        let c = kind.count(n, r.send.len(), r.recv.len())?;
        if let Some(expected) = count.filter(|e| *e != c) {
            return Err(Error::LengthMismatch {
                during: "a grouped NCCL collective: every rank must pass the same lengths",
                expected,
                actual: c,
            });
        }
        count = Some(c);
        r.comm.check_devices(r.stream, r.send, r.recv)?;
    }
    let count = count.unwrap_or(0);
    let all: Vec<usize> = (0..n).collect();
    let desc = kind.desc::<T>(count);
    let calls: Vec<_> = ranks
        .iter()
        .map(|r| {
            let (sp, rp) = (r.send.device_ptr() as *const c_void, r.recv.device_ptr() as *mut c_void);
            (r.comm.raw(), r.stream.raw(), sp, rp)
        })
        .collect();
    let parts: Vec<GroupPart<'_>> = ranks
        .iter()
        .map(|r| (r.stream, vec![(r.send.allocation(), Access::Read), (r.recv.allocation(), Access::Write)]))
        .collect();
    let what = "a grouped NCCL collective on a stream being captured (capture one rank per thread instead)";
    crate::track::ordered_group(&parts, what, || {
        // Every rank's lock (in rank order) before the reservation and across the calls, as in
        // `Communicator::collective`: the order checked is the order called.
        let mut by_rank: Vec<&Communicator> = ranks.iter().map(|r| r.comm).collect();
        by_rank.sort_by_key(|c| c.rank());
        let _one_call_at_a_time: Vec<_> = by_rank.iter().map(|c| c.lock_rank(c.rank())).collect();
        group.matching.reserve(&all, desc)?;
        if count == 0 {
            return Ok(());
        }
        // SAFETY: (all three) the communicators are live (their group is held by `ranks`); every
        // stream and buffer is of its rank's device with the lengths `count` needs (checked above);
        // each `recv` is borrowed mutably, so it aliases nothing; `ordered_group` queued every
        // rank's waits before and records its marks after the group, whose work NCCL puts on the
        // streams at `ncclGroupEnd`. Every issued call is inside the group, which is always ended.
        let started = unsafe { result::group_start() };
        started.inspect_err(|e| group.matching.poison(e))?;
        let mut issued = Ok(());
        for &(comm, stream, sp, rp) in &calls {
            // SAFETY: see above.
            issued = unsafe {
                raw_call::<T>(
                    kind,
                    sp,
                    rp,
                    count,
                    comm,
                    stream as _,
                    "queueing an NCCL collective in a group",
                )
            };
            if issued.is_err() {
                break;
            }
        }
        // SAFETY: closes the group opened above.
        let ended = unsafe { result::group_end() };
        issued.and(ended).inspect_err(|e| group.matching.poison(e))
    })
}

/// [`run`] with [`Collective::AllReduce`].
///
/// ```no_run
/// use cuda_core::nccl::{grouped, ReduceOp};
/// # fn demo(ranks: &mut [grouped::Rank<'_, f32>]) -> cuda_core::Result<()> {
/// grouped::all_reduce(ranks, ReduceOp::Sum)?;
/// # Ok(()) }
/// ```
///
/// # Errors
/// As for [`run`].
pub fn all_reduce<T: NcclScalar>(ranks: &mut [Rank<'_, T>], op: ReduceOp) -> Result<()> {
    run(Collective::AllReduce(op), ranks)
}
