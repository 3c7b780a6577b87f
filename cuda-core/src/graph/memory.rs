//! Graph memory: the device's pool for the memory of mem-alloc nodes (usage, high-water marks,
//! trimming).

use crate::driver::result;
use crate::error::Result;
use cudarc::driver::sys;

impl crate::device::Device {
    /// Usage of the device's graph memory pool (memory of mem-alloc nodes), in bytes.
    ///
    /// # Errors
    /// Driver errors reading the attributes.
    pub fn graph_mem_stats(&self) -> Result<crate::memory::PoolStats> {
        use sys::CUgraphMem_attribute::*;
        let get = |attr| result::device_get_graph_mem_attribute(self.cu_device(), attr);
        self.bind()?;
        Ok(crate::memory::PoolStats {
            used_current: get(CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)?,
            used_high: get(CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)?,
            reserved_current: get(CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)?,
            reserved_high: get(CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH)?,
        })
    }

    /// Resets the high-water marks of the graph memory pool.
    ///
    /// # Errors
    /// Driver errors.
    pub fn reset_graph_mem_high(&self) -> Result<()> {
        use sys::CUgraphMem_attribute::*;
        self.bind()?;
        for attr in [CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH] {
            result::device_reset_graph_mem_attribute(self.cu_device(), attr)?;
        }
        Ok(())
    }

    /// Returns unused graph memory to the OS (`cuDeviceGraphMemTrim`).
    ///
    /// # Errors
    /// [`crate::Error::Capture`] while a stream capture is open anywhere in the process (a
    /// device-wide operation, see `Device::synchronize`); driver errors.
    pub fn graph_mem_trim(&self) -> Result<()> {
        self.bind()?;
        crate::driver::device_wide("trimming graph memory while a stream capture is active", || {
            result::device_graph_mem_trim(self.cu_device())
        })
    }
}
