//! Launching kernels: launch configuration, typed kernel arguments, and `Function::launch`.

use crate::error::{check, Error, Result};
use crate::memory::{ordered_on, Access, Allocation, DeviceBuffer, DeviceRepr};
use crate::module::Function;
use crate::stream::Stream;
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::Arc;

/// Grid, block and dynamic shared memory of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in the grid (x, y, z).
    pub grid: (u32, u32, u32),
    /// Threads per block (x, y, z).
    pub block: (u32, u32, u32),
    /// Bytes of dynamic shared memory per block.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// A 1-D launch with `block` threads per block and enough blocks to cover `n` elements (at
    /// least one block).
    pub fn for_elements(n: usize, block: u32) -> LaunchConfig {
        let block = block.max(1);
        let blocks = n.div_ceil(block as usize).clamp(1, u32::MAX as usize) as u32;
        LaunchConfig { grid: (blocks, 1, 1), block: (block, 1, 1), shared_mem_bytes: 0 }
    }
}

/// One kernel parameter.
///
/// # Safety
/// `param_ptr` must point to a value laid out exactly as the kernel's C parameter, valid for as
/// long as `self` is borrowed; `allocation` must return the allocation of any device memory the
/// parameter refers to (it is used for cross-stream ordering and kept alive by graphs), and
/// `access` must be [`Access::Write`] unless the kernel only reads that memory.
pub unsafe trait KernelParam {
    /// Pointer to the parameter's bytes, as `cuLaunchKernel`'s `kernelParams` wants.
    fn param_ptr(&self) -> *mut c_void;
    /// The allocation the parameter refers to, if any.
    fn allocation(&self) -> Option<&Arc<Allocation>> {
        None
    }
    /// How the kernel may touch that allocation: reads are ordered only after the last write, so
    /// readers on several streams run concurrently.
    fn access(&self) -> Access {
        Access::Write
    }
}

// SAFETY: a DeviceRepr scalar is passed by value; the pointer is to the value itself.
unsafe impl<T: DeviceRepr> KernelParam for T {
    #[inline]
    fn param_ptr(&self) -> *mut c_void {
        self as *const T as *mut c_void
    }
}

// SAFETY: the kernel receives the CUdeviceptr stored inside the buffer; the home stream is the
// buffer's. A shared borrow is a read (`Function::launch`'s contract: writes only through `&mut`).
unsafe impl<T: DeviceRepr> KernelParam for &DeviceBuffer<T> {
    #[inline]
    fn param_ptr(&self) -> *mut c_void {
        buffer_ptr_field(self)
    }
    #[inline]
    fn allocation(&self) -> Option<&Arc<Allocation>> {
        Some(DeviceBuffer::allocation(self))
    }
    #[inline]
    fn access(&self) -> Access {
        Access::Read
    }
}

// SAFETY: as for `&DeviceBuffer`.
unsafe impl<T: DeviceRepr> KernelParam for &mut DeviceBuffer<T> {
    #[inline]
    fn param_ptr(&self) -> *mut c_void {
        buffer_ptr_field(self)
    }
    #[inline]
    fn allocation(&self) -> Option<&Arc<Allocation>> {
        Some(DeviceBuffer::allocation(self))
    }
}

fn buffer_ptr_field<T: DeviceRepr>(b: &DeviceBuffer<T>) -> *mut c_void {
    b.device_ptr_ref() as *const sys::CUdeviceptr as *mut c_void
}

/// A full argument list: tuples of [`KernelParam`]s, up to 12.
///
/// # Safety
/// `with_params` must pass one pointer per parameter, each valid during the call, and the
/// allocations of all device memory referred to.
pub unsafe trait KernelArgs {
    /// Calls `f` with the parameter pointers and the allocations of referenced memory.
    fn with_params<R>(
        &self,
        f: impl FnOnce(&mut [*mut c_void], &[Option<(&Arc<Allocation>, Access)>]) -> R,
    ) -> R;
}

macro_rules! impl_args {
    ($($n:ident),*) => {
        // SAFETY: one pointer per tuple element, each borrowed from `self` for the call.
        unsafe impl<$($n: KernelParam),*> KernelArgs for ($($n,)*) {
            #[allow(non_snake_case)]
            #[inline]
            fn with_params<R>(&self, f: impl FnOnce(&mut [*mut c_void], &[Option<(&Arc<Allocation>, Access)>]) -> R) -> R {
                let ($($n,)*) = self;
                let mut ptrs = [$($n.param_ptr()),*];
                let homes = [$($n.allocation().map(|a| (a, $n.access()))),*];
                f(&mut ptrs, &homes)
            }
        }
    };
}
impl_args!(A);
impl_args!(A, B);
impl_args!(A, B, C);
impl_args!(A, B, C, D);
impl_args!(A, B, C, D, E);
impl_args!(A, B, C, D, E, F);
impl_args!(A, B, C, D, E, F, G);
impl_args!(A, B, C, D, E, F, G, H);
impl_args!(A, B, C, D, E, F, G, H, I);
impl_args!(A, B, C, D, E, F, G, H, I, J);
impl_args!(A, B, C, D, E, F, G, H, I, J, K);
impl_args!(A, B, C, D, E, F, G, H, I, J, K, L);

impl Function {
    /// Queues the kernel on `stream` with `args`.
    ///
    /// The launch is ordered after the earlier conflicting uses of every buffer passed (a
    /// `&DeviceBuffer` argument is a read, `&mut` a write; see [`crate::memory`]), on whatever
    /// stream they ran, and their free after the launch. A configuration the driver rejects is an
    /// error, not a crash.
    ///
    /// While `stream` is being captured, the launch is recorded instead, and the buffers passed are
    /// kept alive by the graph for as long as it can be replayed.
    ///
    /// # Safety
    /// The argument list must match the kernel's C signature in number, order and layout, and the
    /// kernel must access only memory it is given, within bounds: writes only through `&mut`
    /// buffers, no out-of-range indices. Device memory passed other than as a `DeviceBuffer` (raw
    /// addresses) must stay valid for the launch and, if captured, for every replay. The typed
    /// launchers of the `kernels` crate uphold this.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] for a stream or buffer of another device; [`Error::Capture`] if
    /// another thread is capturing `stream` or a buffer's home stream is being captured; driver
    /// errors (e.g. a configuration the driver rejects).
    pub unsafe fn launch<A: KernelArgs>(&self, stream: &Stream, cfg: LaunchConfig, args: A) -> Result<()> {
        if stream.device() != self.device() {
            return Err(Error::DeviceMismatch {
                during: "launching a kernel",
                expected: self.device().ordinal(),
                actual: stream.device().ordinal(),
            });
        }
        args.with_params(|ptrs, homes| {
            let enqueue = || {
                let (g, b) = (cfg.grid, cfg.block);
                // SAFETY: `ptrs` holds one valid pointer per parameter (KernelArgs contract); the
                // caller guarantees they match the kernel's signature; the stream is live.
                let res = unsafe {
                    sys::cuLaunchKernel(
                        self.raw(),
                        g.0,
                        g.1,
                        g.2,
                        b.0,
                        b.1,
                        b.2,
                        cfg.shared_mem_bytes,
                        stream.raw(),
                        ptrs.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                };
                check(res, "launching a kernel")
            };
            self.device().bind()?;
            if homes.iter().flatten().any(|(a, _)| a.home_stream().device() != stream.device()) {
                return Err(Error::DeviceMismatch {
                    during: "launching a kernel with a buffer of another device",
                    expected: stream.device().ordinal(),
                    actual: homes
                        .iter()
                        .flatten()
                        .map(|(a, _)| a.home_stream().device().ordinal())
                        .find(|&o| o != stream.device().ordinal())
                        .unwrap_or(0),
                });
            }
            ordered_on(stream, homes, enqueue)
        })
    }
}
