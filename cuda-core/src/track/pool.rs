//! `MemPool`: the driver's stream-ordered memory pools.

use crate::device::Device;
use crate::driver::result;
use crate::error::Result;
use cudarc::driver::sys;
use std::sync::Arc;

struct PoolInner {
    device: Device,
    raw: sys::CUmemoryPool,
    owned: bool,
}

// SAFETY: memory pool handles may be used from any thread; the driver synchronises them.
unsafe impl Send for PoolInner {}
// SAFETY: as above.
unsafe impl Sync for PoolInner {}

impl Drop for PoolInner {
    fn drop(&mut self) {
        if self.owned && self.device.bind_in_drop() {
            // Never while a capture is open (the driver crashed on a pool destroyed during a
            // global-mode capture on another thread: `driver::device_wide`); the pool is leaked
            // then (a drop cannot wait or fail).
            let raw = self.raw;
            crate::error::note_drop(crate::driver::device_wide(
                "destroying a memory pool while a stream capture is active",
                // SAFETY: we created the pool and no buffer holds it any more (buffers keep a
                // clone). The driver defers the release while frees are still pending.
                || unsafe { result::mem_pool_destroy(raw) },
            ));
        }
    }
}

/// A stream-ordered memory pool. Buffers allocated from it keep it alive. Cloning gives another
/// handle to the same pool.
///
/// ```no_run
/// # fn main() -> cuda_core::Result<()> {
/// use cuda_core::{Device, DeviceBuffer, MemPool};
/// let dev = Device::new(0)?;
/// let s = dev.new_stream()?;
/// let pool = MemPool::new(&dev)?;
/// pool.set_release_threshold(u64::MAX)?; // keep freed memory cached for reuse
/// // SAFETY: the fill below writes every element before anything reads the buffer.
/// let mut buf = unsafe { DeviceBuffer::<f32>::uninit_in(&pool, &s, 1 << 20)? };
/// buf.fill(&s, 0.0)?;
/// s.synchronize()?;
/// assert!(pool.stats()?.used_current >= 4 << 20);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MemPool {
    inner: Arc<PoolInner>,
}

impl std::fmt::Debug for MemPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemPool({:p} on device {})", self.inner.raw, self.inner.device.ordinal())
    }
}

/// Usage figures of a pool, in bytes.
///
/// ```no_run
/// # fn main() -> cuda_core::Result<()> {
/// use cuda_core::{Device, DeviceBuffer, MemPool};
/// let dev = Device::new(0)?;
/// let s = dev.new_stream()?;
/// let pool = MemPool::device_default(&dev)?; // where plain allocations come from
/// let before = pool.stats()?;
/// let buf = DeviceBuffer::<u8>::zeros(&s, 1 << 20)?;
/// s.synchronize()?;
/// let now = pool.stats()?;
/// assert!(now.used_current >= before.used_current + (1 << 20));
/// assert!(now.used_high >= now.used_current && now.reserved_current >= now.used_current);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Memory handed out to live allocations now.
    pub used_current: u64,
    /// High-water mark of `used_current` since creation or the last reset.
    pub used_high: u64,
    /// Memory the pool holds from the device now (used or cached).
    pub reserved_current: u64,
    /// High-water mark of `reserved_current`.
    pub reserved_high: u64,
}

impl MemPool {
    /// Creates a new pool of device memory on `device`.
    ///
    /// # Errors
    /// [`crate::Error::Capture`] while a stream capture is open anywhere in the process (pools
    /// are created, trimmed and destroyed only when none is: see `Device::synchronize`); driver
    /// errors creating the pool.
    pub fn new(device: &Device) -> Result<MemPool> {
        device.bind()?;
        let mut props: sys::CUmemPoolProps = crate::zeroed::Zeroable::zeroed();
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = device.ordinal() as i32;
        // A device-wide change, never overlapping a capture (see `driver::device_wide`).
        let raw =
            crate::driver::device_wide("creating a memory pool while a stream capture is active", || {
                result::mem_pool_create(&props)
            })?;
        Ok(MemPool { inner: Arc::new(PoolInner { device: *device, raw, owned: true }) })
    }

    /// The device's default pool (the one plain allocations use). Not destroyed on drop.
    ///
    /// # Errors
    /// Driver errors.
    pub fn device_default(device: &Device) -> Result<MemPool> {
        device.bind()?;
        let raw = result::device_get_default_mem_pool(device.cu_device())?;
        Ok(MemPool { inner: Arc::new(PoolInner { device: *device, raw, owned: false }) })
    }

    /// The raw handle, valid while any clone lives.
    pub fn raw(&self) -> sys::CUmemoryPool {
        self.inner.raw
    }

    /// The device the pool allocates on.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    fn set_u64(&self, attr: sys::CUmemPool_attribute, v: u64, during: &'static str) -> Result<()> {
        self.inner.device.bind()?;
        // SAFETY: live pool; callers pass attributes of type cuuint64_t only.
        unsafe { result::mem_pool_set_attribute_u64(self.raw(), attr, v, during) }
    }

    fn get_u64(&self, attr: sys::CUmemPool_attribute) -> Result<u64> {
        self.inner.device.bind()?;
        // SAFETY: live pool; callers pass attributes of type cuuint64_t only.
        unsafe { result::mem_pool_get_attribute_u64(self.raw(), attr) }
    }

    /// Memory the pool may keep cached (not returned to the device) at a synchronize.
    /// `u64::MAX` keeps everything, which makes stream-ordered allocation nearly free.
    ///
    /// # Errors
    /// Driver errors.
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        use sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD as A;
        self.set_u64(A, bytes, "setting a pool's release threshold")
    }

    /// The current release threshold in bytes.
    ///
    /// # Errors
    /// Driver errors.
    pub fn release_threshold(&self) -> Result<u64> {
        self.get_u64(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
    }

    /// Returns cached memory to the device until at most `keep_bytes` stay reserved (memory in
    /// use is never released).
    ///
    /// # Errors
    /// [`crate::Error::Capture`] while a stream capture is open anywhere in the process; driver
    /// errors.
    pub fn trim_to(&self, keep_bytes: usize) -> Result<()> {
        self.inner.device.bind()?;
        crate::driver::device_wide("trimming a memory pool while a stream capture is active", || {
            // SAFETY: live pool.
            unsafe { result::mem_pool_trim_to(self.raw(), keep_bytes) }
        })
    }

    /// Used and reserved bytes, current and high-water marks.
    ///
    /// # Errors
    /// Driver errors reading the attributes.
    pub fn stats(&self) -> Result<PoolStats> {
        use sys::CUmemPool_attribute::*;
        Ok(PoolStats {
            used_current: self.get_u64(CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
            used_high: self.get_u64(CU_MEMPOOL_ATTR_USED_MEM_HIGH)?,
            reserved_current: self.get_u64(CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
            reserved_high: self.get_u64(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
        })
    }

    /// Resets both high-water marks to the current values.
    ///
    /// # Errors
    /// Driver errors.
    pub fn reset_high_water_marks(&self) -> Result<()> {
        use sys::CUmemPool_attribute::*;
        self.set_u64(CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0, "resetting a pool's high-water mark")?;
        self.set_u64(CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH, 0, "resetting a pool's high-water mark")
    }
}
