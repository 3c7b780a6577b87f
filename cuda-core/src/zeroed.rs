//! All-zero values of the driver's parameter structs, with the argument for each stated once.

use cudarc::driver::sys;

/// A driver struct for which the all-zero bit pattern is a valid value (integers, pointers,
/// unions of those, and enums whose discriminant 0 exists), to be filled in by us or the driver.
///
/// # Safety
/// Implement only for types whose every field is valid when all-zero.
pub(crate) unsafe trait Zeroable: Sized {
    /// The all-zero value.
    fn zeroed() -> Self {
        // SAFETY: the implementor guarantees all-zero is a valid value.
        unsafe { std::mem::zeroed() }
    }
}

// SAFETY: integers and pointers only (no enums).
unsafe impl Zeroable for sys::CUDA_KERNEL_NODE_PARAMS {}
// SAFETY: `type_` (CUgraphNodeType) has a 0 variant (KERNEL); the rest is a union of plain data.
unsafe impl Zeroable for sys::CUgraphNodeParams {}
// SAFETY: the pool-property enums have 0 variants (INVALID / NONE); the rest are integers and
// pointers.
unsafe impl Zeroable for sys::CUDA_MEM_ALLOC_NODE_PARAMS {}
// SAFETY: `result` (CUgraphExecUpdateResult) has a 0 variant (SUCCESS); the rest are handles.
unsafe impl Zeroable for sys::CUgraphExecUpdateResultInfo {}
// SAFETY: the enums have 0 variants (INVALID / NONE); the rest are integers and pointers.
unsafe impl Zeroable for sys::CUmemPoolProps {}
