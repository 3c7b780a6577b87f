//! The elementwise family: typed `f32`/`f64` kernels over whole buffers ([`Kernels::fill`],
//! [`Kernels::scale`], [`Kernels::scale_by`], [`Kernels::axpy`], [`Kernels::add`],
//! [`Kernels::mul`]) and the sum ([`Kernels::sum`]), loaded together with the fully connected
//! layer ([`Kernels::linear`], whose launcher has its own file).
//!
//! Sizes: these kernels take the element count as a 64-bit integer and index and stride in 64
//! bits over a grid capped at 32 blocks per multiprocessor, so they work on buffers of any
//! length, more than `u32::MAX` elements included.

use crate::{checks, programs};
use cuda_core::{Device, DeviceBuffer, DeviceRepr, Error, Function, LaunchConfig, PerDevice, Result, Stream};

/// CUDA C source of the elementwise kernels.
pub const ELEMENTWISE_SRC: &str = include_str!("../cuda/elementwise.cu");
/// CUDA C source of the reduction kernels.
pub const REDUCE_SRC: &str = include_str!("../cuda/reduce.cu");

/// Threads per block of every launcher.
pub const BLOCK: u32 = 256;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// Element types the kernels are instantiated for: `f32` and `f64`.
pub trait Element: DeviceRepr + sealed::Sealed {
    /// Selects this type's kernels.
    fn kernels(k: &Kernels) -> &TypedKernels;
}
impl Element for f32 {
    fn kernels(k: &Kernels) -> &TypedKernels {
        &k.f32
    }
}
impl Element for f64 {
    fn kernels(k: &Kernels) -> &TypedKernels {
        &k.f64
    }
}

/// The kernels of one element type.
pub struct TypedKernels {
    pub(crate) fill: Function,
    pub(crate) scale: Function,
    scale_by: Function,
    pub(crate) axpy: Function,
    add: Function,
    mul: Function,
    sum: Function,
    pub(crate) linear: Function,
}

/// All kernels, loaded on one device.
pub struct Kernels {
    device: Device,
    max_blocks: u32,
    f32: TypedKernels,
    f64: TypedKernels,
}

impl TypedKernels {
    fn load(
        ew: &cuda_core::CudaModule,
        red: &cuda_core::CudaModule,
        lin: &cuda_core::CudaModule,
        s: &str,
    ) -> Result<Self> {
        Ok(TypedKernels {
            fill: ew.function(&format!("fill_{s}"))?,
            scale: ew.function(&format!("scale_{s}"))?,
            scale_by: ew.function(&format!("scale_by_{s}"))?,
            axpy: ew.function(&format!("axpy_{s}"))?,
            add: ew.function(&format!("add_{s}"))?,
            mul: ew.function(&format!("mul_{s}"))?,
            sum: red.function(&format!("sum_{s}"))?,
            linear: lin.function(&format!("linear_{s}"))?,
        })
    }
}

impl Kernels {
    /// The kernels on `device`, compiled (or read from the cache) and loaded on first use, then
    /// kept for the life of the process.
    pub fn get(device: &Device) -> Result<&'static Kernels> {
        static LOADED: PerDevice<Kernels> = PerDevice::new();
        LOADED.get_or_try_init(device, || {
            let compile = |p: programs::Program| device.compile_module(p.name, &p.source, &p.options);
            let ew = compile(programs::elementwise())?;
            let red = compile(programs::reduce())?;
            let lin = compile(programs::linear())?;
            let sms = device.multiprocessor_count()?;
            Ok(Kernels {
                device: *device,
                max_blocks: sms.saturating_mul(32).max(1),
                f32: TypedKernels::load(&ew, &red, &lin, "f32")?,
                f64: TypedKernels::load(&ew, &red, &lin, "f64")?,
            })
        })
    }

    /// The device these kernels are loaded on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The launch configuration used for `n` elements: 256-thread blocks, a grid capped at 32
    /// blocks per multiprocessor (the kernels' 64-bit grid-stride loops cover the rest, so any
    /// `n` a buffer can hold works, including more than `u32::MAX` elements).
    pub fn config(&self, n: usize) -> LaunchConfig {
        checks::grid_stride(n, BLOCK, self.max_blocks)
    }

    pub(crate) fn check(&self, stream: &Stream, during: &'static str, lens: &[usize]) -> Result<usize> {
        if stream.device() != &self.device {
            return Err(Error::DeviceMismatch {
                during,
                expected: self.device.ordinal(),
                actual: stream.device().ordinal(),
            });
        }
        let n = lens[0];
        if let Some(&bad) = lens.iter().find(|&&l| l != n) {
            return Err(Error::LengthMismatch { during, expected: n, actual: bad });
        }
        Ok(n)
    }

    // `fill`, `scale` and `axpy` launch their kernel even for no elements (one block whose threads
    // find nothing to do): they are the `TunableParam` ops, whose last queued work must be their
    // own launch, so that `Scope::record_param` hands out a handle to *their* kernel node. Found by
    // review: `scale(&empty, a, scale(&p, 3.0, &mut q))` recorded nothing of its own, and the
    // handle set the inner op's factor. The other ops skip the launch.

    /// `out[i] = value` for every element.
    pub fn fill<T: Element>(&self, stream: &Stream, out: &mut DeviceBuffer<T>, value: T) -> Result<()> {
        let n = self.check(stream, "fill kernel", &[out.len()])?;
        // No early return for no elements: see the note above `fill`.
        // SAFETY: matches `fill_<T>(T* out, T value, unsigned long long n)`; the kernel writes
        // exactly out[0..n] and `out` is borrowed mutably.
        unsafe { T::kernels(self).fill.launch(stream, self.config(n.max(1)), (out, value, n as u64)) }
    }

    /// `out[i] = alpha * x[i]`.
    pub fn scale<T: Element>(
        &self,
        stream: &Stream,
        x: &DeviceBuffer<T>,
        alpha: T,
        out: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let n = self.check(stream, "scale kernel", &[x.len(), out.len()])?;
        // No early return for no elements: see the note above `fill`.
        // SAFETY: matches `scale_<T>(const T* x, T alpha, T* out, n)`; reads x[0..n], writes
        // out[0..n]; `out` is exclusive and cannot alias `x` (borrow rules).
        unsafe { T::kernels(self).scale.launch(stream, self.config(n.max(1)), (x, alpha, out, n as u64)) }
    }

    /// `out[i] = alpha[0] * x[i]`, with the factor read from device memory when the kernel runs
    /// (so a captured graph follows changes to it). `alpha` must hold exactly one element.
    pub fn scale_by<T: Element>(
        &self,
        stream: &Stream,
        x: &DeviceBuffer<T>,
        alpha: &DeviceBuffer<T>,
        out: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        self.check(stream, "scale_by kernel", &[1, alpha.len()])?;
        let n = self.check(stream, "scale_by kernel", &[x.len(), out.len()])?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: matches `scale_by_<T>(const T* x, const T* alpha, T* out, n)`; reads alpha[0]
        // (length checked) and x[0..n], writes out[0..n]; `out` is exclusive.
        unsafe { T::kernels(self).scale_by.launch(stream, self.config(n), (x, alpha, out, n as u64)) }
    }

    /// `y[i] = alpha * x[i] + y[i]`.
    pub fn axpy<T: Element>(
        &self,
        stream: &Stream,
        alpha: T,
        x: &DeviceBuffer<T>,
        y: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let n = self.check(stream, "axpy kernel", &[x.len(), y.len()])?;
        // No early return for no elements: see the note above `fill`.
        // SAFETY: matches `axpy_<T>(T alpha, const T* x, T* y, n)`; in-bounds, `y` exclusive.
        unsafe { T::kernels(self).axpy.launch(stream, self.config(n.max(1)), (alpha, x, y, n as u64)) }
    }

    /// `out[i] = a[i] + b[i]`.
    pub fn add<T: Element>(
        &self,
        stream: &Stream,
        a: &DeviceBuffer<T>,
        b: &DeviceBuffer<T>,
        out: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        self.binary(stream, "add kernel", &T::kernels(self).add, a, b, out)
    }

    /// `out[i] = a[i] * b[i]`.
    pub fn mul<T: Element>(
        &self,
        stream: &Stream,
        a: &DeviceBuffer<T>,
        b: &DeviceBuffer<T>,
        out: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        self.binary(stream, "mul kernel", &T::kernels(self).mul, a, b, out)
    }

    fn binary<T: Element>(
        &self,
        stream: &Stream,
        during: &'static str,
        f: &Function,
        a: &DeviceBuffer<T>,
        b: &DeviceBuffer<T>,
        out: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        let n = self.check(stream, during, &[a.len(), b.len(), out.len()])?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: matches `<op>_<T>(const T* a, const T* b, T* out, n)`; in-bounds, `out` exclusive.
        unsafe { f.launch(stream, self.config(n), (a, b, out, n as u64)) }
    }

    /// `out[0] = sum(x)`, accumulated in `f64`. `out` must hold exactly one element.
    pub fn sum<T: Element>(
        &self,
        stream: &Stream,
        x: &DeviceBuffer<T>,
        out: &mut DeviceBuffer<f64>,
    ) -> Result<()> {
        self.check(stream, "sum kernel", &[1, out.len()])?;
        let n = x.len();
        out.memset_zero(stream)?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: matches `sum_<T>(const T* x, double* out, n)`; reads x[0..n], adds into out[0]
        // (zeroed above on the same stream); block size 256 is a multiple of 32.
        unsafe { T::kernels(self).sum.launch(stream, self.config(n), (x, out, n as u64)) }
    }
}
