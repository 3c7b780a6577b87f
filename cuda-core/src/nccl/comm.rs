//! `Communicator`: one rank of a group of NCCL communicators created together in this process.

use super::matching::Matching;
use super::{load, result};
use crate::device::Device;
use crate::error::{Error, Result};
use cudarc::nccl::sys;
use std::sync::{Arc, Mutex, MutexGuard};

/// The communicators of one [`Communicator::init_all`], destroyed together.
pub(super) struct Group {
    comms: Vec<sys::ncclComm_t>,
    devices: Vec<Device>,
    /// One lock per rank, held around every NCCL call on its communicator: NCCL's calls are
    /// re-entrant but not thread-safe on one communicator, and handles are shared across threads.
    locks: Vec<Mutex<()>>,
    pub(super) matching: Matching,
}

// SAFETY: NCCL communicators may be used from any thread, one call at a time: every call on a
// communicator is made under its rank's lock (`Group::lock`), and NCCL is re-entrant across
// communicators. The handles are only destroyed by `Drop`, when no other owner is left.
unsafe impl Send for Group {}
// SAFETY: as above; the handles are immutable after creation, the rest is behind a mutex.
unsafe impl Sync for Group {}

impl Drop for Group {
    fn drop(&mut self) {
        // Finalize all ranks together (it may synchronise the ranks, so one thread finalising them
        // one by one could wait forever), then destroy each. Finalize waits for the queued work.
        // Errors cannot be returned from a drop and are ignored: the communicators are gone either
        // way.
        // SAFETY: the handles are live and owned by this group; nothing else uses them any more
        // (every handle, and every graph that recorded a collective, held this group).
        unsafe {
            let _ = result::group_start();
            for &c in &self.comms {
                let _ = result::comm_finalize(c);
            }
            let _ = result::group_end();
            for &c in &self.comms {
                let _ = result::comm_destroy(c);
            }
        }
    }
}

/// One rank of a group of NCCL communicators (see [`crate::nccl`]): the communicator of one
/// device. Cheap to clone (a handle); the group is destroyed once every handle and every graph
/// that recorded one of its collectives is gone.
#[derive(Clone)]
pub struct Communicator {
    group: Arc<Group>,
    rank: usize,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Communicator(rank {} of {} on device {})", self.rank, self.size(), self.device().ordinal())
    }
}

impl Communicator {
    /// Creates one communicator per device of `devices` (`ncclCommInitAll`): rank `i` works on
    /// `devices[i]`. The devices must be distinct.
    ///
    /// ```no_run
    /// use cuda_core::nccl::Communicator;
    /// use cuda_core::Device;
    /// # fn main() -> cuda_core::Result<()> {
    /// let comms = Communicator::init_all(&Device::all()?)?;
    /// for c in &comms {
    ///     println!("rank {} of {} on device {}", c.rank(), c.size(), c.device().ordinal());
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::LibraryMissing`] without `libnccl`; [`Error::Library`] for an NCCL older than
    /// [`super::MIN_NCCL_VERSION`] or when NCCL fails to create the communicators;
    /// [`Error::InvalidArgument`] for an empty list, a device listed twice, or one of
    /// [`super::POLICY_VARS`] (`NCCL_NVLS_ENABLE`, `NCCL_GRAPH_REGISTER`, `NCCL_RUNTIME_CONNECT`)
    /// not set to `0` in the environment, or `NCCL_GRAPH_MIXING_SUPPORT` not set to `1`
    /// (see the module docs); [`Error::Capture`] while a stream capture is open in the process.
    pub fn init_all(devices: &[Device]) -> Result<Vec<Communicator>> {
        if devices.is_empty() {
            return Err(Error::InvalidArgument(
                "an NCCL communicator group needs at least one device".into(),
            ));
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].contains(d) {
                return Err(Error::InvalidArgument(format!(
                    "device {} is listed twice: NCCL does not support two ranks on one device",
                    d.ordinal()
                )));
            }
        }
        let n = i32::try_from(devices.len())
            .map_err(|_| Error::InvalidArgument(format!("{} devices", devices.len())))?;
        load()?;
        let ordinals: Vec<i32> = devices.iter().map(|d| d.ordinal() as i32).collect();
        let mut comms = vec![std::ptr::null_mut(); devices.len()];
        // With connection on first use off (the policy), creating the communicators connects the
        // ranks, enabling peer access between their devices: a device-wide operation, refused
        // while a capture is open anywhere, like `Device::enable_peer_access` (found by review).
        crate::driver::device_wide("creating NCCL communicators while a stream capture is active", || {
            // SAFETY: `comms` has room for `n` handles and `ordinals` holds `n` valid, distinct
            // device ordinals (opened devices, whose primary contexts NCCL's runtime calls use).
            unsafe { result::comm_init_all(&mut comms, n, &ordinals) }
        })?;
        // NCCL may register destructors of its own at the first communicator (after its load):
        // the reaper's exit drain is registered once more so that it runs before them.
        static AFTER_FIRST_INIT: std::sync::Once = std::sync::Once::new();
        AFTER_FIRST_INIT.call_once(crate::track::reaper::drain_before_exit);
        let locks = devices.iter().map(|_| Mutex::new(())).collect();
        let matching = Matching::new(devices.len());
        let group = Arc::new(Group { comms, devices: devices.to_vec(), locks, matching });
        Ok((0..devices.len()).map(|rank| Communicator { group: group.clone(), rank }).collect())
    }

    /// This communicator's rank in its group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks of its group.
    pub fn size(&self) -> usize {
        self.group.comms.len()
    }

    /// The device this rank works on.
    pub fn device(&self) -> &Device {
        &self.group.devices[self.rank]
    }

    /// Whether `other` belongs to the same group (created by the same [`Communicator::init_all`]).
    pub fn same_group(&self, other: &Communicator) -> bool {
        Arc::ptr_eq(&self.group, &other.group)
    }

    /// The raw handle, valid as long as any handle of the group lives.
    pub fn raw(&self) -> sys::ncclComm_t {
        self.group.comms[self.rank]
    }

    /// Takes the lock of rank `rank`'s communicator (see [`Group`]); several are taken in rank
    /// order.
    pub(super) fn lock_rank(&self, rank: usize) -> MutexGuard<'_, ()> {
        self.group.locks[rank].lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn group(&self) -> &Arc<Group> {
        &self.group
    }
}
