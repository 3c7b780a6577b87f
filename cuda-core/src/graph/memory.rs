//! Graph memory: the device's pool for the memory of mem-alloc nodes (usage, high-water marks,
//! trimming).

use crate::error::{check, Result};
use cudarc::driver::sys;

impl crate::Device {
    /// Usage of the device's graph memory pool (memory of mem-alloc nodes), in bytes.
    ///
    /// # Errors
    /// Driver errors reading the attributes.
    pub fn graph_mem_stats(&self) -> Result<crate::PoolStats> {
        use sys::CUgraphMem_attribute::*;
        let get = |attr| -> Result<u64> {
            let mut v = 0u64;
            check(
                // SAFETY: these attributes are cuuint64_t; valid out-pointer and device.
                unsafe {
                    sys::cuDeviceGetGraphMemAttribute(self.cu_device(), attr, (&mut v as *mut u64).cast())
                },
                "reading graph memory usage",
            )?;
            Ok(v)
        };
        self.bind()?;
        Ok(crate::PoolStats {
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
            let mut zero = 0u64;
            check(
                // SAFETY: these attributes take a cuuint64_t that must be 0 (reset).
                unsafe {
                    sys::cuDeviceSetGraphMemAttribute(self.cu_device(), attr, (&mut zero as *mut u64).cast())
                },
                "resetting graph memory high-water marks",
            )?;
        }
        Ok(())
    }

    /// Returns unused graph memory to the OS (`cuDeviceGraphMemTrim`).
    ///
    /// # Errors
    /// Driver errors.
    pub fn graph_mem_trim(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: valid device.
        check(unsafe { sys::cuDeviceGraphMemTrim(self.cu_device()) }, "trimming graph memory")
    }
}
