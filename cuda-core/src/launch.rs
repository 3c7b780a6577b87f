//! Launching kernels: launch configuration, typed kernel arguments, and `Function::launch`.

use crate::driver::result;
use crate::error::{Error, Result};
use crate::memory::{DeviceBuffer, DeviceRepr};
use crate::module::Function;
use crate::stream::Stream;
use crate::track::{ordered, Access, Allocation, InCapture, KeepAlive};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::Arc;

/// Grid, block and dynamic shared memory of a launch.
///
/// ```
/// use cuda_core::LaunchConfig;
/// // A 2-D launch over a 1024 x 768 image in 16 x 16 tiles, with 4 KiB of dynamic shared memory.
/// let cfg = LaunchConfig { grid: (1024 / 16, 768 / 16, 1), block: (16, 16, 1), shared_mem_bytes: 4096 };
/// assert_eq!(cfg.grid, (64, 48, 1));
/// ```
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
    ///
    /// A launch never runs over part of `n`: where `n` needs more than 2³¹ − 1 blocks (the
    /// hardware's limit for `grid.x`), the grid is larger than the limit (clamped at `u32::MAX`)
    /// and the launch is refused with a driver error. A kernel meant for such sizes takes a
    /// grid-stride loop and a grid of its own choosing.
    ///
    /// ```
    /// use cuda_core::LaunchConfig;
    /// let cfg = LaunchConfig::for_elements(1000, 256);
    /// assert_eq!(cfg.grid, (4, 1, 1)); // ceil(1000 / 256) blocks
    /// assert_eq!(cfg.block, (256, 1, 1));
    /// assert_eq!(LaunchConfig::for_elements(0, 256).grid, (1, 1, 1)); // never an empty grid
    /// // Past the hardware limit the grid stays too large to launch, never too small:
    /// assert_eq!(LaunchConfig::for_elements((1 << 31) + 5, 1).grid.0, (1 << 31) + 5);
    /// assert_eq!(LaunchConfig::for_elements(usize::MAX, 1).grid.0, u32::MAX);
    /// ```
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
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, DeviceBuffer, LaunchConfig};
    /// let dev = Device::new(0)?;
    /// let s = dev.new_stream()?;
    /// let src = r#"extern "C" __global__ void iota(unsigned* out, unsigned n) {
    ///     unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    ///     if (i < n) out[i] = i;
    /// }"#;
    /// let f = dev.compile_module("iota.cu", src, &[])?.function("iota")?;
    /// let mut out = DeviceBuffer::<u32>::zeros(&s, 1000)?;
    /// // SAFETY: the arguments match `iota(unsigned*, unsigned)`; the kernel writes out[i] for i < 1000
    /// // only, through the `&mut` buffer.
    /// unsafe { f.launch(&s, LaunchConfig::for_elements(1000, 256), (&mut out, 1000u32))? };
    /// assert_eq!(out.to_vec()?, (0..1000).collect::<Vec<u32>>());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] for a stream or buffer of another device; [`Error::Capture`] if
    /// another thread is capturing `stream` or a buffer's home stream is being captured; driver
    /// errors (e.g. a configuration the driver rejects).
    pub unsafe fn launch<A: KernelArgs>(&self, stream: &Stream, cfg: LaunchConfig, args: A) -> Result<()> {
        // SAFETY: the caller upholds `launch`'s contract, which is `launch_with`'s.
        unsafe { self.launch_with(stream, cfg, args, false) }
    }

    /// [`Function::launch`] as a *programmatic dependent launch* (compute capability 9.0 and
    /// newer; a plain launch elsewhere): the kernel may start while the kernel queued before it
    /// on `stream` is still running, once every block of that kernel has executed
    /// `griddepcontrol.launch_dependents` (or exited). Its blocks can then prefetch and stage
    /// what does not depend on the earlier kernel and hide the gap between the two. Captured into
    /// a graph, the dependency becomes a programmatic edge. Every other ordering is unchanged:
    /// event waits (including the cross-stream joins of buffer tracking) and non-kernel work
    /// before it are still complete before it starts, and work queued after it starts only after
    /// it completes.
    ///
    /// # Safety
    /// As for [`Function::launch`], and in addition: on every path, the kernel executes
    /// `griddepcontrol.wait` (which returns once the earlier kernel has completed and its writes
    /// are visible) before any load or store of device memory; only L2 prefetches
    /// (`prefetch.global.L2`, which change no value) may come before it. A kernel that touched
    /// memory before the wait could race the earlier kernel.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, DeviceBuffer, LaunchConfig};
    /// let (dev, n) = (Device::new(0)?, 4096u32);
    /// let s = dev.new_stream()?;
    /// let src = r#"extern "C" __global__ void add_one(float* x, unsigned n) {
    /// #if __CUDA_ARCH__ >= 900
    ///     asm volatile("griddepcontrol.wait;" ::: "memory"); // before any load or store
    /// #endif
    ///     unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    ///     if (i < n) x[i] += 1.0f;
    /// }"#;
    /// let f = dev.compile_module("add_one.cu", src, &[])?.function("add_one")?;
    /// let mut x = DeviceBuffer::<f32>::zeros(&s, n as usize)?;
    /// for _ in 0..2 {
    ///     // SAFETY: the arguments match `add_one(float*, unsigned)`; the kernel touches x[i] for
    ///     // i < n only, and only after `griddepcontrol.wait`.
    ///     unsafe { f.launch_overlapped(&s, LaunchConfig::for_elements(n as usize, 256), (&mut x, n))? };
    /// }
    /// assert_eq!(x.to_vec()?, vec![2.0; 4096]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for [`Function::launch`].
    pub unsafe fn launch_overlapped<A: KernelArgs>(
        &self,
        stream: &Stream,
        cfg: LaunchConfig,
        args: A,
    ) -> Result<()> {
        let major = crate::device::DeviceAttribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR;
        let overlap = self.device().attribute(major)? >= 9;
        // SAFETY: the caller upholds `launch_overlapped`'s contract (the kernel waits for the
        // earlier grid before touching memory), which is what `launch_with(.., true)` needs.
        unsafe { self.launch_with(stream, cfg, args, overlap) }
    }

    /// The launch path of [`Function::launch`] (`overlap: false`) and
    /// [`Function::launch_overlapped`] (`overlap: true`).
    ///
    /// # Safety
    /// `launch`'s contract, and with `overlap` also `launch_overlapped`'s.
    unsafe fn launch_with<A: KernelArgs>(
        &self,
        stream: &Stream,
        cfg: LaunchConfig,
        args: A,
        overlap: bool,
    ) -> Result<()> {
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
                if overlap {
                    let mut value = sys::CUlaunchAttributeValue { pad: [0; 64] };
                    value.programmaticStreamSerializationAllowed = 1;
                    let mut attr = sys::CUlaunchAttribute {
                        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                        pad: [0; 4],
                        value,
                    };
                    let config = sys::CUlaunchConfig {
                        gridDimX: g.0,
                        gridDimY: g.1,
                        gridDimZ: g.2,
                        blockDimX: b.0,
                        blockDimY: b.1,
                        blockDimZ: b.2,
                        sharedMemBytes: cfg.shared_mem_bytes,
                        hStream: stream.raw(),
                        attrs: &mut attr,
                        numAttrs: 1,
                    };
                    // SAFETY: as for cuLaunchKernel below; `config` and the one attribute it
                    // points to live across the call; the caller guarantees the kernel waits for
                    // the earlier grid before touching memory (`launch_overlapped`).
                    return unsafe { result::launch_kernel_ex(&config, self.raw(), ptrs) };
                }
                // SAFETY: `ptrs` holds one valid pointer per parameter (KernelArgs contract); the
                // caller guarantees they match the kernel's signature; the stream is live.
                unsafe { result::launch_kernel(self.raw(), g, b, cfg.shared_mem_bytes, stream.raw(), ptrs) }
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
            // Recorded into a capture, the graph also keeps this kernel's module loaded.
            let keep = |k: &mut KeepAlive| {
                k.add_allocs(&homes.iter().flatten().map(|(a, _)| *a).collect::<Vec<_>>());
                k.add_function(self);
            };
            ordered(stream, homes, &[], InCapture::Record, keep, enqueue)
        })
    }
}
