//! Several devices: enumeration and peer access.
//!
//! [`Device::count`] and [`Device::all`] enumerate the devices; [`Device::can_access_peer`] asks
//! the driver whether one device can map another's memory, and [`Device::enable_peer_access`]
//! turns that on (idempotently: a second call, from any thread, is a no-op).
//!
//! Peer access is what `cuCtxEnablePeerAccess` gives: direct copies between the two devices
//! (`cuMemcpyPeerAsync` over NVLink or PCIe without a host bounce). It does **not** let kernels of
//! one device use buffers of another: this crate keeps refusing every cross-device kernel launch,
//! library call and copy with [`Error::DeviceMismatch`](crate::error::Error::DeviceMismatch), except the explicit peer copy
//! ([`crate::memory::DeviceBuffer::copy_from_peer`]), which orders both buffers' uses across the devices.
//! The buffers of this crate come from stream-ordered memory pools, whose accessibility from other
//! devices is governed by `cuMemPoolSetAccess`, never changed here.

use crate::device::Device;
use crate::driver::result;
use crate::error::Result;
use std::collections::HashSet;
use std::sync::Mutex;

/// The `(from, to)` ordinal pairs whose peer access this process has enabled.
static ENABLED: Mutex<Option<HashSet<(usize, usize)>>> = Mutex::new(None);

impl Device {
    /// The number of CUDA devices (the same as [`crate::driver::device_count`]).
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// println!("{} device(s)", cuda_core::Device::count()?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::NoDriver`](crate::error::Error::NoDriver) without a driver; [`Error::NoDevice`](crate::error::Error::NoDevice) when the driver reports none;
    /// driver errors of `cuInit`.
    pub fn count() -> Result<usize> {
        crate::driver::device_count()
    }

    /// Opens every device, in ordinal order.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// for d in cuda_core::Device::all()? {
    ///     println!("{}: {}", d.ordinal(), d.name());
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`Device::count`] and [`Device::new`].
    pub fn all() -> Result<Vec<Device>> {
        (0..Self::count()?).map(Device::new).collect()
    }

    /// Whether this device can map `peer`'s memory (`cuDeviceCanAccessPeer`). `false` for the
    /// device itself (a device needs no peer access to its own memory).
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::Device;
    /// let (a, b) = (Device::new(0)?, Device::new(1)?);
    /// if a.can_access_peer(&b)? {
    ///     a.enable_peer_access(&b)?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Driver errors.
    pub fn can_access_peer(&self, peer: &Device) -> Result<bool> {
        if self == peer {
            return Ok(false);
        }
        result::device_can_access_peer(self.cu_device(), peer.cu_device())
    }

    /// Lets this device's context access `peer`'s memory (`cuCtxEnablePeerAccess`). Idempotent:
    /// `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED` (also from code outside this crate) is success. A
    /// no-op for the device itself.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::Device;
    /// let (a, b) = (Device::new(0)?, Device::new(1)?);
    /// a.enable_peer_access(&b)?;
    /// a.enable_peer_access(&b)?; // again: still Ok
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Driver`](crate::error::Error::Driver) with `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED` when
    /// [`Device::can_access_peer`] is `false`, `CUDA_ERROR_TOO_MANY_PEERS` past the hardware limit;
    /// other driver errors.
    pub fn enable_peer_access(&self, peer: &Device) -> Result<()> {
        if self == peer {
            return Ok(());
        }
        let key = (self.ordinal(), peer.ordinal());
        let mut enabled = ENABLED.lock().unwrap_or_else(|e| e.into_inner());
        if enabled.get_or_insert_with(HashSet::new).contains(&key) {
            return Ok(());
        }
        self.bind()?;
        // A device-wide change: never while a capture is open (see `driver::device_wide`).
        crate::driver::device_wide("enabling peer access while a stream capture is active", || {
            // SAFETY: this device's primary context is current; `peer`'s primary context is
            // retained for the process.
            unsafe { result::ctx_enable_peer_access(peer.cu_context()) }
        })?;
        enabled.get_or_insert_with(HashSet::new).insert(key);
        Ok(())
    }

    /// Whether [`Device::enable_peer_access`] succeeded for `self -> peer` in this process.
    pub(crate) fn peer_access_enabled(&self, peer: &Device) -> bool {
        let enabled = ENABLED.lock().unwrap_or_else(|e| e.into_inner());
        enabled.as_ref().is_some_and(|s| s.contains(&(self.ordinal(), peer.ordinal())))
    }
}
